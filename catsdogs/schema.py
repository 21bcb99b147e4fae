"""The trial schema: every field of a trial, its default, its allowed values, and the one
vocabulary of outcomes. TensorFlow-free, so the report, the store and the CLI import it freely.

Vocabulary (used by every command):
- a **study** is what a command runs: a sweep (trials that train and test), a profile or a
  batch-size search (probes that time a few training steps);
- a **trial** is one configuration trained and tested (`TrialConfig`), a **probe** a few
  training steps of one; both run in a **worker** (catsdogs.worker) and end in one **status**.

Everything else is derived from the dataclass below: the sweep's command-line options
(`cli.protocol_options`), the store's columns (`store.CONFIG_COLUMNS`), the report's protocol
defaults (`report.PROTOCOL_DEFAULTS`) and the keys a plan's grid may vary
(`plans.GRID_KEYS`). tests/test_schema.py fails when one of them falls behind.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields

from catsdogs import config

# --- outcomes --------------------------------------------------------------------------------
# Every status a trial or a probe can have, with its meaning. A study never stops for one
# trial's failure: it records the status and goes on.
STATUSES = {
    "pending": "planned, not run yet (or given back: interrupted, or its worker was lost)",
    "running": "claimed by a live sweep process; a dead owner's running trials run again",
    "done": "finished: trained and tested (a trial), or its steps timed under the cap (a probe)",
    "failed": "raised an error or its worker crashed; the error is recorded",
    "oom": "ran out of memory: the device's, the host's, or a probe's --memory-limit",
}
FINISHED = ("done", "failed", "oom")  # a sweep does not run these again unless asked
# Not a status a row ever has: what a runner returns when a trial's worker was lost through no
# fault of the trial (killed from outside, a Ray node gone); the sweep makes it pending again.
LOST = "lost"

# --- allowed values ------------------------------------------------------------------------
DEFAULT_LR = {"sgd": 0.01, "adam": 0.001}  # Keras' defaults: what optimizer="sgd"/"adam" gives
OPTIMIZERS = tuple(DEFAULT_LR)
DATASETS = config.DATASETS
LR_SCALINGS = ("none", "linear", "sqrt")
BUDGETS = ("epochs", "steps")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored")
BACKENDS = ("tensorflow", "jax")  # Keras's backends catsdogs runs on; chosen by KERAS_BACKEND


def _protocol(help: str, choices: tuple | None = None, multiple: bool = False):
    """Metadata of a protocol field: a sweep option beyond the article, off by default;
    `multiple`: the option takes several values, and the sweep crosses them with its grid."""
    return {"protocol": True, "help": help, "choices": choices, "multiple": multiple}


# Fields added after trials were first stored: left out of a trial's key while at their default,
# so a store written before them resumes with the same keys.
KEY_OMITS_DEFAULT = ("backend",)


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
    # Not an option: the Keras backend the trial ran on (KERAS_BACKEND, catsdogs.backends). Part
    # of the identity, so two backends' results never share a cell.
    backend: str = field(default="tensorflow", metadata={"choices": BACKENDS})

    def key(self) -> str:
        d = asdict(self)
        for name in KEY_OMITS_DEFAULT:
            if d[name] == default(name):
                del d[name]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def shape(self) -> tuple:
        """What a compiled training step depends on: every field but the seed, the data set and
        its fingerprint, and the number of epochs. Trials of one shape share a worker's step."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self)
                     if f.name not in ("seed", "dataset", "data", "epochs"))

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
        """One-line ValueErrors for values no trial can run with."""
        for f, value in ((f, getattr(self, f.name)) for f in fields(self)):
            allowed = allowed_values(f.name)
            if allowed and value not in allowed:
                raise ValueError(f"unknown {f.name} {value!r}; choose from {', '.join(allowed)}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"learning rate must be positive, got {self.lr}")
        if self.accumulate < 1 or self.base_batch_size < 1 or self.warmup_epochs < 0:
            raise ValueError("accumulate and base batch size must be >= 1, warm-up >= 0")


# --- derived views -------------------------------------------------------------------------


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
    annotation = str(_field(name).type)
    return int if annotation.startswith("int") else float if annotation.startswith("float") else str


def sql_columns() -> dict[str, str]:
    """The store's configuration columns: every field, typed."""
    sql = {int: "INTEGER", float: "REAL", str: "TEXT"}
    return {f.name: sql[python_type(f.name)] for f in fields(TrialConfig)}


def option_help(name: str) -> str:
    return _field(name).metadata["help"]


# --- arithmetic every backend shares ------------------------------------------------------


def learning_rate(cfg: TrialConfig) -> float:
    base = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    ratio = cfg.batch_size * cfg.accumulate / cfg.base_batch_size  # the effective batch counts
    return base * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]


def plan_steps(cfg: TrialConfig, n_train: int) -> tuple[int, int]:
    """(batches per Keras epoch, Keras epochs). The article: n_train // batch_size per epoch.

    With the steps budget every batch size makes the updates the base batch size makes in
    the configured epochs: the same number of epochs, each of n_train // base_batch_size
    updates, the data repeated (and reshuffled) as often as that needs."""
    if cfg.budget == "steps":
        per_epoch = (n_train // cfg.base_batch_size) * cfg.accumulate
    else:
        per_epoch = n_train // cfg.batch_size
    return per_epoch, cfg.epochs
