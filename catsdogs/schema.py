"""The vocabulary of catsdogs, and the rules every setting obeys: framework-free, so every stage
imports it.

Words, each for one idea (used by every command, module and document):
- a **study** is what a command runs: a **sweep** (trials that train and test), a **profile** or a
  **batch-size search** (probes that time a few training steps);
- a **trial** is one configuration trained and tested (`TrialConfig`); a **probe** a few training
  steps of one; a **cell** a trial's configuration but for its seed (what one interval of test
  accuracy is taken over);
- a **worker** is a process that runs trials and probes one after another (catsdogs.training);
  a **runner** decides where workers run: `local` (child processes) or `ray` (a Ray cluster);
- the **backend** is Keras's backend, TensorFlow or JAX (`KERAS_BACKEND`), and nothing else;
- every trial and probe ends in one **status** (`Status`, below).

Everything the command line, the plans, the results store and the report know about a trial's
fields comes from `TrialConfig` below: the sweep's options (`cli`), the store's columns
(`store.CONFIG_COLUMNS`), the report's article protocol (`analysis.rows.ARTICLE_PROTOCOL`) and the
keys a plan's grid may vary (`plans.GRID_KEYS`). tests/contracts/test_schema.py fails when one falls behind.
Each rule of a setting is written once, here or in catsdogs.plans, and raises a SettingError that
names the setting by its plan key; the CLI only turns that into its one-line message.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
from dataclasses import MISSING, asdict, dataclass, field, fields

from catsdogs import config, lr_rules, optimizers, targets
from catsdogs.errors import SettingError

# --- statuses ----------------------------------------------------------------------------------


class Status(str, enum.Enum):
    """How a trial or a probe stands. Members are their strings ("done"): they compare equal to
    what the store holds, and print, format and serialize as those strings."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    OOM = "oom"
    LOST = "lost"
    INTERRUPTED = "interrupted"

    __hash__ = str.__hash__  # a member and its string are one dictionary key (Python 3.10 too)

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__

    @property
    def meaning(self) -> str:
        return MEANINGS[self]


MEANINGS = {
    Status.PENDING: "planned, not run yet (or given back: interrupted, or its worker was lost)",
    Status.RUNNING: "claimed by a live sweep process; a dead owner's running trials run again",
    Status.DONE: "finished: trained and tested (a trial), or its steps timed under the cap (a probe)",
    Status.FAILED: "raised an error or its worker crashed; the error is recorded",
    Status.OOM: "ran out of memory: the device's, the host's, or a probe's --memory-limit",
    Status.LOST: "never a stored status: what a runner returns when a trial's worker was lost through "
                 "no fault of the trial (killed from outside, a Ray node gone); the sweep makes it pending again",
    Status.INTERRUPTED: "never a stored status: how the store shows a running trial whose sweep process is gone "
                        "(killed: kill -9, a crash, a reboot); the next sweep runs it again",
}
# the statuses a store's row may have
STORED = tuple(s for s in Status if s not in (Status.LOST, Status.INTERRUPTED))
FINISHED = (Status.DONE, Status.FAILED, Status.OOM)  # a sweep does not run these again unless asked
# what the report counts apart
UNFINISHED = (Status.FAILED, Status.OOM, Status.PENDING, Status.INTERRUPTED, Status.RUNNING)

# --- allowed values ------------------------------------------------------------------------------
OPTIMIZERS = tuple(optimizers.OPTIMIZERS)  # by Keras name, so their Keras defaults (catsdogs.optimizers)
ARTICLE_OPTIMIZERS = optimizers.ARTICLE  # a sweep's default: the article's two
DEFAULT_LR = {name: o.default_lr for name, o in optimizers.OPTIMIZERS.items()}  # what optimizer="sgd" gives
DATASETS = ("standard", "augmented")  # the prepared folders (docs/protocol.md, "Data")
LR_SCALINGS = lr_rules.TRIAL_SCALINGS  # none, linear, sqrt (catsdogs.lr_rules)
BUDGETS = ("epochs", "steps")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored")
BACKENDS = ("tensorflow", "jax")  # Keras's backends catsdogs runs on; chosen by KERAS_BACKEND


DETERMINISTIC_HELP = (
    "Deterministic kernels, so a trial's result is the same to the bit every time [default: on]. "
    "TensorFlow's op determinism; on JAX, XLA's --xla_gpu_deterministic_ops. On a GPU this costs "
    "speed (XLA skips autotuning, and max-pooling's gradient becomes a sorted scatter); on a CPU "
    "both settings train the same. Recorded with every trial and named in figures when off; the "
    "two settings never share a cell, and each runs in worker processes of its own.")
TF32_HELP = (
    "TensorFloat-32 for float32 matrix multiplies and convolutions on Ampere and later GPUs: "
    "--tf32 allows it, --no-tf32 forbids it (JAX's precision 'tensorfloat32' or 'highest'; "
    "TensorFlow's TF32 switch) [default: the framework's, which allows it]. Not --precision, the "
    "mixed-precision policy: the numbers stay float32, only the matrix units' arithmetic changes. "
    "No effect on a CPU. Recorded with every trial; set per worker process.")


# --- bounds ---------------------------------------------------------------------------------
# Every number a study takes has a ceiling, checked where it is parsed (here, catsdogs.plans, the
# CLI): far above any real study, and well below what SQLite's 64-bit integers, a worker's memory
# or a lifetime of training allow, so a typo like 99999999999999999999 is one line, never an
# OverflowError, a machine brought to its knees, or a sweep that cannot end.
LIMITS: dict[str, tuple[float, str]] = {  # the largest value of each, and why
    "batch_size": (2**20, "a million images a step is beyond any device's memory"),
    "base_batch_size": (2**20, "a million images a step is beyond any device's memory"),
    "accumulate": (2**12, "more batches an update than any effective batch needs"),
    "epochs": (10_000, "more epochs than any of this model's trials needs"),
    "max_epochs": (10_000, "more epochs than any of this model's trials needs"),
    "eval_every": (10**9, "a billion images between evaluations is more than any trial trains on"),
    "max_steps": (10**9, "a billion batches is more than any trial trains on"),
    "warmup_epochs": (10_000, "more epochs than any of this model's trials needs"),
    "seed": (2**32 - 1, "Keras seeds NumPy's legacy generator, which takes 32 bits"),
    "seeds": (1_000, "more seeds than any interval needs: ±1 point at 50% on 400 test images takes about 100"),
    "max_seeds": (1_000, "more seeds than any interval needs: ±1 point at 50% on 400 test images takes about 100"),
    "per_class": (100_000, "PetImages holds 12,500 a class, and the synthetic source makes as many as asked"),
    "workers": (1_024, "one worker a GPU or a share of the cores, and no machine has more"),
    "steps": (100_000, "a probe's timing settles within a few dozen steps"),
    "warmup": (10_000, "a probe's warm-up settles within a few steps"),
    "min_seconds": (3_600.0, "an hour of one probe is more than any utilization reading needs"),
}
MAX_TRIALS = 100_000  # trials one sweep may plan (with adaptive seeds, at most): months of training
TARGET_CI_MAX = 50.0  # points: a wider interval than ±50 points says nothing about an accuracy


def check_number(value, key: str, least: float = 1, kind: type = int):
    """`value`, a whole number (kind int) or a finite number (float) from `least` to its limit
    (LIMITS), or a SettingError naming `key` that says what is allowed, and why."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    number = whole or (isinstance(value, float) and math.isfinite(value))
    if not (whole if kind is int else number):
        raise SettingError(f"must be {'a whole number' if kind is int else 'a finite number'}, got {value!r}", key)
    if value < least:
        raise SettingError(f"must be at least {shown(least)}, got {shown(value)}", key)
    check_at_most(value, key)
    return value


def check_at_most(value, key: str) -> None:
    """A SettingError naming `key` when `value` is above its limit (LIMITS), saying why there is one."""
    most, why = LIMITS[key]
    if value > most:
        raise SettingError(f"must be at most {shown(most)}: {why}; got {shown(value)}", key)


def shown(x) -> str:
    """1,048,576 for a whole number, 0.25 or 1e+300 for any other."""
    return f"{int(x):,}" if isinstance(x, int) or (math.isfinite(x) and float(x).is_integer() and abs(x) < 1e15) \
        else f"{x:g}"


def process_words(deterministic: bool, tf32: bool | None, defaults: bool = False) -> list[str]:
    """How a worker's settings read in labels and messages: those off their defaults only
    ("non-deterministic", "TF32 on", "TF32 off"), or with `defaults` both ("deterministic",
    "TF32 default")."""
    words = []
    if defaults or not deterministic:
        words.append("deterministic" if deterministic else "non-deterministic")
    if defaults or tf32 is not None:
        words.append({None: "TF32 default", True: "TF32 on", False: "TF32 off"}[tf32])
    return words


def _protocol(help: str, choices: tuple | None = None, multiple: bool = False):
    """Metadata of a protocol field: a sweep option beyond the article, off by default;
    `multiple`: the option takes several values, and the sweep crosses them with its grid."""
    return {"protocol": True, "help": help, "choices": choices, "multiple": multiple}


# Fields added after trials were first stored: out of a trial's key at their default (old stores resume).
KEY_OMITS_DEFAULT = ("backend", "deterministic", "tf32", "until", "eval_every", "model", "max_steps", "stop_at_chance")
# The fields a worker process is started with and keeps (set before its framework starts): a trial
# runs only in a worker of its own settings (catsdogs.runtime.backends.process_env_for).
PROCESS_FIELDS = ("deterministic", "tf32")


@dataclass(frozen=True)
class TrialConfig:
    """Everything that can change a trial's result; its hash is the trial's identity."""

    optimizer: str
    batch_size: int
    dataset: str
    seed: int
    epochs: int = config.EPOCHS
    image_size: int = config.IMAGE_SIZE
    data: str = ""  # fingerprint of the prepared images (manifest.json), so new data = new trials
    lr: float | None = field(default=None, metadata=_protocol(
        "Learning rates, crossed with the grid: `--lr 0.0005 0.001 0.002`; the report picks the "
        "best per batch size by validation accuracy [default: the optimizer's Keras default, "
        "SGD 0.01, Adam 0.001; a value equal to it is that default, the same trial].",
        multiple=True))
    lr_scaling: str = field(default="none", metadata=_protocol(
        "Scale the learning rate with batch size / --base-batch-size.", LR_SCALINGS))
    base_batch_size: int = field(default=32, metadata=_protocol(
        "Batch size the base learning rate (and the steps budget) belongs to."))
    warmup_epochs: float = field(default=0.0, metadata=_protocol(
        "Linear learning-rate warm-up over this many epochs."))
    budget: str = field(default="epochs", metadata=_protocol(
        "epochs: the article's (n // batch size updates per epoch); steps: every batch size makes "
        "the updates the base batch size makes in --epochs.", BUDGETS))
    accumulate: int = field(default=1, metadata=_protocol(
        "Gradient accumulation: one update per N batches (effective batch N x batch size)."))
    precision: str = field(default="float32", metadata=_protocol(
        "Keras mixed-precision policy.", PRECISIONS))
    strategy: str = field(default="none", metadata=_protocol(
        "mirrored: each trial data-parallel over all visible GPUs (TensorFlow: MirroredStrategy; "
        "JAX: keras.distribution.DataParallel); "
        "the batch size is the global batch, split across replicas.", STRATEGIES))
    until: str | None = field(default=None, metadata=_protocol(targets.UNTIL_HELP))
    # Not options of the article's protocol but of the process that trains it: part of the
    # identity (never two settings in one cell), set per worker process (PROCESS_FIELDS).
    deterministic: bool = field(default=True, metadata={"help": DETERMINISTIC_HELP})
    tf32: bool | None = field(default=None, metadata={"help": TF32_HELP})  # None: the framework's default
    # Not an option: the Keras backend the trial ran on (KERAS_BACKEND, catsdogs.runtime.backends).
    # Part of the identity, so two backends' results never share a cell.
    backend: str = field(default="tensorflow", metadata={"choices": BACKENDS})
    # With a target, the evaluations it is checked at decide where the trial stops: its identity.
    # Without one the curve changes nothing, the sweep's measurement (messages.TrialTask): None here.
    eval_every: int | None = field(default=None, metadata={"help": targets.EVAL_EVERY_HELP})
    # Nor this: a user's model trained instead of the article's (find-batch-size --race --model),
    # REF@DIGEST (model_check.identity), so a trial of one model is never read back as another's.
    model: str | None = field(default=None, metadata={"help": "A user's model, REF@DIGEST (None: the article's)."})
    # Nor this: a trial with a target stops there short of it, within an epoch (the race's cap).
    max_steps: int | None = field(default=None, metadata={"help": "At most this many batches (None: the epochs')."})
    # Nor this: ... or once it sits at chance, learning nothing (catsdogs.training.curve: the race's trials).
    stop_at_chance: bool = field(default=False, metadata={"help": "Stop once stuck at chance (needs until)."})

    def key(self) -> str:
        d = {name: getattr(self, name) for name in FIELD_NAMES}
        for name, omitted in _KEY_OMITTED.items():
            if d[name] == omitted:
                del d[name]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def shape(self) -> tuple:
        """What a compiled training step depends on: every field but the seed, the data set and
        its fingerprint, the number of epochs and a target (where training stops). Trials of one shape
        share a worker's step. Without a warm-up the learning rate is not compiled in either (a
        variable of the optimizer, set at the step's reset): trials at other rates share the step
        (find-batch-size's anchor runs); a warm-up's schedule holds its rates as constants."""
        rate = ("lr", "lr_scaling", "base_batch_size") if not self.warmup_epochs else ()
        return tuple((f.name, getattr(self, f.name)) for f in fields(self)
                     if f.name not in ("seed", "dataset", "data", "epochs", "until", "eval_every", "max_steps",
                                       "stop_at_chance", *rate))

    def cell(self) -> TrialConfig:
        """The trial's cell: its configuration with seed 0, whatever its seed."""
        return TrialConfig(**{**asdict(self), "seed": 0})

    def label(self) -> str:
        extra = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if f.name not in ("optimizer", "batch_size", "dataset", "seed", "data", "image_size")
                 and getattr(self, f.name) != f.default]
        return " ".join([self.optimizer, f"bs={self.batch_size}", self.dataset, f"seed={self.seed}", *extra])

    @classmethod
    def from_dict(cls, d: dict) -> TrialConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def check(self) -> None:
        """A SettingError, naming the field, for a value no trial can run with."""
        for f in fields(self):
            allowed = allowed_values(f.name)
            if allowed and getattr(self, f.name) not in allowed:
                raise SettingError(f"unknown {f.name} {getattr(self, f.name)!r}; choose from "
                                   f"{', '.join(allowed)}", f.name)
        for name, least in (("batch_size", 1), ("epochs", 1), ("accumulate", 1), ("base_batch_size", 1)):
            if getattr(self, name) < least:
                raise SettingError(f"{name.replace('_', ' ')} must be at least {least}, got "
                                   f"{getattr(self, name)}", name)
            check_at_most(getattr(self, name), name)
        check_number(self.seed, "seed", least=0)
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise SettingError(f"learning rate must be positive, got {self.lr}", "lr")
        if not (math.isfinite(self.warmup_epochs) and self.warmup_epochs >= 0):
            raise SettingError(f"warm-up epochs must be >= 0, got {self.warmup_epochs}", "warmup_epochs")
        check_at_most(self.warmup_epochs, "warmup_epochs")
        if self.until is not None or self.eval_every is not None:
            targets.check_trial(self.until, self.eval_every)
            check_number(self.eval_every, "eval_every")
        for name in ("max_steps", "stop_at_chance"):
            if getattr(self, name) not in (None, False) and self.until is None:
                raise SettingError("stops a trial short of its target, and this one has none (until)", name)
        if not isinstance(self.stop_at_chance, bool):
            raise SettingError(f"stop_at_chance is true or false, got {self.stop_at_chance!r}", "stop_at_chance")
        if self.max_steps is not None:
            check_number(self.max_steps, "max_steps")


# --- derived views -------------------------------------------------------------------------

FIELD_NAMES = tuple(f.name for f in fields(TrialConfig))  # read directly: asdict's deep copy cost key() 5-7 times
_KEY_OMITTED = {f.name: f.default for f in fields(TrialConfig) if f.name in KEY_OMITS_DEFAULT}  # at their defaults


def allowed_values(name: str) -> tuple | None:
    """The values a field may take, or None when any value of its type may do."""
    if name == "optimizer":
        return OPTIMIZERS
    if name == "dataset":
        return DATASETS
    return _field(name).metadata.get("choices")


def _field(name: str):
    return next(f for f in fields(TrialConfig) if f.name == name)


# The TrialConfig fields beyond the grid's own (optimizer, batch size, data set, seed, epochs):
# the protocol options of `sweep` and the protocol keys a plan's grid may vary.
PROTOCOL_FIELDS = tuple(f.name for f in fields(TrialConfig) if f.metadata.get("protocol"))


def multiple(name: str) -> bool:
    """True for a protocol field that a sweep takes several values of (crossed with its grid)."""
    return bool(_field(name).metadata.get("multiple"))


def normalized_lr(optimizer: str, lr: float | None) -> float | None:
    """None for the optimizer's Keras default: `--lr 0.001` with Adam is the article's trial."""
    return None if lr is None or float(lr) == DEFAULT_LR[optimizer] else float(lr)


def default(name: str):
    f = _field(name)
    if f.default is MISSING:
        raise KeyError(f"{name} has no default: every trial gives it")
    return f.default


def protocol_defaults() -> dict:
    return {name: default(name) for name in PROTOCOL_FIELDS}


def python_type(name: str) -> type:
    """int, float or str: the field's type, None-able fields by their non-None part."""
    return type_of(_field(name).type)


def type_of(annotation) -> type:
    """int, float, bool, str or dict: what a dataclass field's annotation (a string, with
    `from __future__ import annotations`) holds, without its `| None`; dict for dicts and lists
    (stored as JSON)."""
    text = str(annotation).split("|")[0].strip()
    for kind in (bool, int, float, str):
        if text.startswith(kind.__name__):
            return kind
    return dict


SQL_TYPES = {bool: "INTEGER", int: "INTEGER", float: "REAL", str: "TEXT", dict: "TEXT"}


def sql_columns() -> dict[str, str]:
    """The store's configuration columns: every field, typed."""
    return {f.name: SQL_TYPES[python_type(f.name)] for f in fields(TrialConfig)}


def option_help(name: str) -> str:
    return _field(name).metadata["help"]


# --- the rules of a study's other settings ---------------------------------------------------------
# Each raises a SettingError naming its key; catsdogs.plans (for a plan's keys) and catsdogs.cli
# (for options, exit 2) only say where the value came from.

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a run's name becomes a folder under --out


def check_run_name(name: str, key: str = "name") -> str:
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise SettingError(f"{name!r}: use letters, digits, '.', '_' and '-' (it names a folder)", key)
    return name


def check_sha256(text: str, key: str = "sha256") -> str:
    """64 hexadecimal digits, lower-cased: an empty or mistyped hash must never pass for a
    verified archive (or waste a download)."""
    if not isinstance(text, str) or not re.fullmatch(r"[0-9A-Fa-f]{64}", text.strip()):
        raise SettingError(f"must be 64 hexadecimal digits, got {text!r}", key)
    return text.strip().lower()


def parse_split(text, key: str = "split") -> tuple[int, int, int]:
    """'600,200,200' (or [600, 200, 200]) -> (600, 200, 200): per-class train, validation, test."""
    if isinstance(text, (list, tuple)) and all(isinstance(p, int) and not isinstance(p, bool) for p in text):
        text = ",".join(map(str, text))
    if not isinstance(text, str):
        raise SettingError(f"must be three counts train,validation,test like \"600,200,200\", got {text!r}", key)
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3:
        raise SettingError(f"expected three counts train,validation,test (like 600,200,200), got {text!r}", key)
    try:
        counts = tuple(int(p) for p in parts)
    except ValueError:
        raise SettingError(f"counts must be whole numbers, got {text!r}", key) from None
    if counts[0] < 1 or counts[1] < 0 or counts[2] < 1:
        raise SettingError(f"train and test need at least one image each, validation zero or more, "
                           f"got {text!r}", key)
    return counts  # type: ignore[return-value]


def check_prepare(per_class: int, split: tuple[int, int, int], size: int, seed: int = 0) -> None:
    """The sizes a prepare can make: the split adds up to per_class, the images 8-2048 px."""
    if per_class < 1:
        raise SettingError(f"--per-class must be at least 1, got {per_class}", "per_class")
    check_at_most(per_class, "per_class")
    check_number(seed, "seed", least=0)
    if sum(split) != per_class:
        raise SettingError(f"--split {','.join(map(str, split))} adds up to {sum(split)}, not "
                           f"--per-class {per_class}", "split")
    if not 8 <= size <= 2048:
        raise SettingError(f"--size must be between 8 and 2048 pixels, got {size}", "size")


# --- arithmetic every backend shares ------------------------------------------------------


def learning_rate(cfg: TrialConfig) -> float:
    """The trial's learning rate: its own or the optimizer's default, scaled by the effective
    batch (batch x accumulation) over the base batch size as `lr_scaling` says (linear: the
    linear scaling rule; find-batch-size's recommendation uses it too)."""
    base = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    effective = cfg.batch_size * cfg.accumulate  # the effective batch counts
    return lr_rules.RULES[cfg.lr_scaling].rate(base, cfg.base_batch_size, effective, None)


def plan_steps(cfg: TrialConfig, n_train: int) -> tuple[int, int]:
    """(batches per Keras epoch, Keras epochs). The article: n_train // batch_size per epoch.

    With the steps budget every batch size makes the updates the base batch size makes in
    the configured epochs: the same number of epochs, each of n_train // base_batch_size
    updates, the data repeated (and reshuffled) as often as that needs. With `max_steps`, the
    epochs up to the one the cap falls in (the curve stops training at it: Curve's `stop_at`)."""
    if cfg.budget == "steps":
        per_epoch = (n_train // cfg.base_batch_size) * cfg.accumulate
    else:
        per_epoch = n_train // cfg.batch_size
    if cfg.max_steps and per_epoch:  # (a cap ends training in the epoch it falls in)
        return per_epoch, min(cfg.epochs, -(-cfg.max_steps // per_epoch))
    return per_epoch, cfg.epochs
