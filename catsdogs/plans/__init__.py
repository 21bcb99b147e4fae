"""Plans: what a study runs, written as TOML; the one format of `reproduce --config` and
`sweep --config`.

The format is documented once, in docs/usage.md ("Plans"); this module is its only reader. The
built-in plans ship beside this file (catsdogs/plans/*.toml, read with importlib.resources), so
an installed catsdogs needs no checkout: `--config quick` names one, `--config my.toml` (any value
with a '/' or ending in '.toml') is a file. Every unknown key and every bad value is a one-line
PlanError naming the plan and the key, before anything runs.

Loading (`load`), the command line's overrides (`with_overrides`) and the trials a plan stands for
(`trials`, `count`) are separate functions over a plain dict, so `sweep` and `reproduce` share all
of it: a plan given to `sweep` runs exactly the trials `reproduce` would, on data already prepared.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import itertools
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from catsdogs import config, schema, targets
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.gradient_noise import NoiseSampling
from catsdogs.manifest import load_manifest, require_intact, require_prepared
from catsdogs.schema import PROTOCOL_FIELDS, TrialConfig
from catsdogs.seeds import check_adaptive

# The keys of each part of a plan, with what each may hold (docs/usage.md, "Plans"). A grid's keys
# are `sweep`'s grid options by their names (`opt` is --opt), so the command line can replace them.
TOP_KEYS = ("name", "description", "duration", "note", "seeds", "epochs", "max_epochs", "target_ci", "max_seeds",
            "noise_scale", "eval_every", "deterministic", "tf32", "data_dir", "prepare", "grids")
PREPARE_KEYS = ("source", "sha256", "verify", "per_class", "split", "size", "seed")
GRID_KEYS = ("opt", "batch_size", "dataset", "epochs", *PROTOCOL_FIELDS)
DEFAULT_PLAN = "article"  # what `catsdogs reproduce` runs: the article's case study, in full


class PlanError(SettingError):
    """A plan that cannot run, said with where: `origin: [section] key: reason`. `key` is the
    offending key (None for the whole plan), `reason` the message without where."""

    def __init__(self, message: str, key: str | None = None, reason: str | None = None):
        super().__init__(message, key)
        self.reason = reason or message


@dataclass(frozen=True)
class Plan:
    """A checked plan: its settings (the TOML's content) and where it came from."""

    settings: dict
    origin: str  # "plan 'quick'" or the file's path, for messages and for the results' record
    text: str = ""  # the TOML as written (`catsdogs plans NAME` prints it)
    ref: str | None = None  # what --config was given (a name or a path); None: the command line

    @property
    def name(self) -> str:
        return self.settings["name"]

    @property
    def noise_sampling(self) -> NoiseSampling | None:
        """How each trial's gradient noise scale is measured, when the plan asks for it
        (`noise_scale = true`; `--noise-scale`); None when it does not."""
        return NoiseSampling() if self.settings.get("noise_scale") else None

    @property
    def eval_every(self) -> int | None:
        """Training images between validation evaluations (`eval_every`; --eval-every), None: no curve."""
        return self.settings.get("eval_every")

    @property
    def adaptive(self) -> tuple[float | None, int | None]:
        """(target_ci, max_seeds): adaptive seeds when the plan sets a target."""
        target = self.settings.get("target_ci")
        return target, (self.settings.get("max_seeds", config.MAX_SEEDS) if target is not None else None)


# --- finding and reading -------------------------------------------------------------------------


def _builtin_dir():
    return importlib.resources.files(__name__)


def names() -> list[str]:
    """The built-in plans' names, sorted."""
    return sorted(p.name[:-5] for p in _builtin_dir().iterdir() if p.name.endswith(".toml"))


def is_path(value: str) -> bool:
    """A value with a '/' (or the platform's separator) or a .toml ending is a file; else a name."""
    return value.endswith(".toml") or "/" in value or (sys.platform == "win32" and "\\" in value)


def text_of(value: str) -> tuple[str, str]:
    """(origin, TOML text) of a built-in plan's name or a file's path; a PlanError if neither."""
    if is_path(value):
        path = Path(value).expanduser()
        try:
            return str(path), path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PlanError(f"no such file: {value}") from None
        except OSError as e:
            raise PlanError(f"cannot read {value}: {e.strerror}") from None
        except UnicodeDecodeError:
            utf16 = path.read_bytes()[:2] in (b"\xff\xfe", b"\xfe\xff")
            why = (" (it is UTF-16, as PowerShell's `>` writes: `catsdogs plans quick | Out-File -Encoding utf8 "
                   "my.toml` writes UTF-8)" if utf16 else "")
            raise PlanError(f"{value} is not a plan: a plan is TOML text in UTF-8, and this file is not{why}") from None
    known = names()
    if value not in known:
        hint = f" (the file? give its path: ./{value})" if Path(value).is_file() else " (or a .toml file's path)"
        raise PlanError(f"no plan named {value!r}; plans: {', '.join(known)}{hint}")
    return f"plan {value!r}", (_builtin_dir() / f"{value}.toml").read_text()


def load(value: str) -> Plan:
    """The plan a `--config` value names, read and checked; `name` defaults to the file's stem."""
    origin, text = text_of(value)
    settings = parse(text, origin)
    settings.setdefault("name", Path(value).stem if is_path(value) else value)
    check(settings, origin)
    return Plan(settings, origin, text, value)


def parse(text: str, origin: str) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"{origin} is not valid TOML: {e}") from None


# --- checking -----------------------------------------------------------------------------------


def check(plan: dict, origin: str) -> None:
    """Every key known and every value usable, or a one-line PlanError naming origin and key."""
    _unknown(plan, TOP_KEYS, origin, "")
    for key, value in plan.items():
        with _located(origin):
            _check_top_value(key, value)
    with _located(origin):
        check_adaptive(plan.get("target_ci"), plan.get("max_seeds"), plan.get("seeds", config.SEEDS))
    prepare = plan.get("prepare", {})
    _unknown(prepare, PREPARE_KEYS, origin, "[prepare] ")
    for key, value in prepare.items():
        with _located(origin, "[prepare] "):
            _check_prepare_value(key, value)
    grids = plan.get("grids")
    if not grids:
        raise PlanError(f"{origin}: no [grids.NAME] section: nothing to train")
    for gname, grid in grids.items():
        if not isinstance(grid, dict):
            raise PlanError(f"{origin}: grids.{gname}: must be a table ([grids.NAME] with opt, batch_size, ...)",
                            key=gname)
        _unknown(grid, GRID_KEYS, origin, f"[grids.{gname}] ")
        with _located(origin, f"[grids.{gname}] "):
            check_grid(grid, required=True)
    with _located(origin):
        check_size(plan)
        targets.check_plan(plan)


def check_size(plan: dict) -> None:
    """A plan no larger than a sweep may be (schema.MAX_TRIALS), counted before any trial is made:
    its cells times the seeds each starts with, and with adaptive seeds times the most it may get."""
    cells = sum(math.prod(max(1, len(as_list(grid[k]))) for k in ("opt", "batch_size", "dataset", *PROTOCOL_FIELDS)
                          if k in grid)
                for grid in plan["grids"].values())
    seeds = plan.get("max_seeds", config.MAX_SEEDS) if plan.get("target_ci") is not None else plan.get("seeds", config.SEEDS)
    if cells * seeds > schema.MAX_TRIALS:
        why = "at most, with adaptive seeds" if plan.get("target_ci") is not None else "as planned"
        raise SettingError(f"{cells:,} cells x {seeds:,} seeds is {cells * seeds:,} trials ({why}), more than the "
                           f"{schema.MAX_TRIALS:,} a sweep may hold (months of training): give fewer values or seeds",
                           "max_seeds" if plan.get("target_ci") is not None else "seeds")


@contextlib.contextmanager
def _located(origin: str, section: str = ""):
    """A SettingError raised inside becomes a PlanError saying where: `origin: [section] key: ...`."""
    try:
        yield
    except PlanError:
        raise
    except SettingError as e:
        raise PlanError(f"{origin}: {section}{e.key}: {e}", key=e.key, reason=str(e)) from None


def check_grid(grid: dict, required: bool = False) -> None:
    """A grid's values (each a value or a list of values): a SettingError whose key is the bad one.

    `sweep` checks its command-line values with this too, so both say the same thing."""
    for key in ("opt", "batch_size") if required else ():
        if key not in grid:
            raise SettingError("is missing: every grid says which optimizers and batch sizes", key)
    for key, value in grid.items():
        if key == "epochs" and isinstance(value, list):
            raise SettingError("takes one value (a grid per number of epochs)", key)
        values = value if isinstance(value, list) else [value]
        if not values and key in ("opt", "batch_size", "dataset"):
            raise SettingError("needs at least one value", key)
        for v in values:
            _check_grid_value(key, v)


def _unknown(table: dict, known: tuple, origin: str, section: str) -> None:
    bad = [k for k in table if k not in known]
    if bad:
        raise PlanError(f"{origin}: {section}unknown key {bad[0]!r}; known: {', '.join(known)}", key=bad[0])


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _check_top_value(key: str, v) -> None:
    if key in ("seeds", "epochs", "max_seeds", "max_epochs", "eval_every") and not (_is_int(v) and v >= 1):
        raise SettingError(f"must be a whole number >= 1, got {v!r}", key)
    if key in ("seeds", "epochs", "max_seeds", "max_epochs", "eval_every"):
        schema.check_at_most(v, key)
    if key in ("name", "description", "duration", "note", "data_dir") and not isinstance(v, str):
        raise SettingError(f"must be a string, got {v!r}", key)
    if key == "name":
        schema.check_run_name(v)
    if key in ("noise_scale", "deterministic", "tf32") and not isinstance(v, bool):
        raise SettingError(f"must be true or false, got {v!r}", key)
    if key in ("prepare", "grids") and not isinstance(v, dict):
        raise SettingError(f"must be a table ([{key}] ...), got {v!r}", key)


def _check_prepare_value(key: str, v) -> None:
    if key in ("per_class", "size") and not (_is_int(v) and v >= 1):
        raise SettingError(f"must be a whole number >= 1, got {v!r}", key)
    if key == "per_class":
        schema.check_at_most(v, key)
    if key == "size" and v > 2048:
        raise SettingError(f"must be between 8 and 2048 pixels, got {v}", key)
    if key == "seed" and not (_is_int(v) and v >= 0):
        raise SettingError(f"must be a whole number >= 0, got {v!r}", key)
    if key == "seed":
        schema.check_at_most(v, key)
    if key == "verify" and not isinstance(v, bool):
        raise SettingError(f"must be true or false, got {v!r}", key)
    if key == "sha256":
        schema.check_sha256(v)
    if key == "source" and not isinstance(v, str):
        raise SettingError(f"must be a string (URL, .zip, folder or 'synthetic'), got {v!r}", key)
    if key == "split":
        schema.parse_split(v)


def _check_grid_value(key: str, v) -> None:
    if key == "opt":
        if v not in schema.OPTIMIZERS:
            raise SettingError(f"unknown optimizer {v!r}; choose from {', '.join(schema.OPTIMIZERS)}", key)
    elif key == "dataset":
        if v not in schema.DATASETS:
            raise SettingError(f"unknown dataset {v!r}; choose from {', '.join(schema.DATASETS)}", key)
    elif key == "batch_size":
        if not (_is_int(v) and v >= 1):
            raise SettingError(f"batch sizes must be whole numbers >= 1, got {v!r}", key)
        schema.check_at_most(v, key)
    elif key == "until":
        targets.parse(v)
    elif key == "epochs":
        if not (_is_int(v) and v >= 1):
            raise SettingError(f"must be a whole number >= 1, got {v!r}", key)
        schema.check_at_most(v, key)
    else:
        kind = schema.python_type(key)
        if (kind is int and not _is_int(v)) or (kind is float and not _is_number(v)) \
                or (kind is str and not isinstance(v, str)):
            what = {int: "a whole number", float: "a number"}.get(kind, "a string")
            raise SettingError(f"must be {what}, got {v!r}", key)
        try:
            schema.TrialConfig("adam", 32, "standard", 0, **{key: v}).check()
        except SettingError as e:
            raise SettingError(str(e), key) from None


# --- the command line's values ------------------------------------------------------------------


def with_overrides(plan: Plan, top: dict, grid: dict) -> Plan:
    """The plan with the command line's values in place: `top` replaces top-level keys (seeds,
    name, target_ci, ...); `grid` replaces its keys in every grid (`--opt adam` runs every grid
    with Adam alone; `--epochs 1` shortens every trial). The result is checked again."""
    settings = {**plan.settings, **top}
    settings["grids"] = {g: {**values, **grid} for g, values in plan.settings["grids"].items()}
    if "epochs" in grid:
        settings["epochs"] = grid["epochs"]
        settings.pop("max_epochs", None)  # the command line's cap wins over the plan's
    if "max_epochs" in top:
        settings.pop("epochs", None)
        settings["grids"] = {g: {k: v for k, v in values.items() if k != "epochs"}
                             for g, values in settings["grids"].items()}
    check(settings, plan.origin)
    return Plan(settings, plan.origin, plan.text, plan.ref)


def data_dir(plan: Plan, explicit: Path | None) -> Path:
    """--data-dir, else $CATSDOGS_DATA_DIR, else the plan's data_dir, else ./data: a plan at
    other image sizes keeps its images apart."""
    if explicit is not None:
        return Path(explicit)
    if not os.environ.get(config.DATA_DIR_ENV) and plan.settings.get("data_dir"):
        return Path(plan.settings["data_dir"])
    return config.default_data_dir()


def prepare_command(plan: Plan, data_dir: Path) -> str:
    """The `catsdogs prepare` command that prepares what the plan's [prepare] asks for in data_dir."""
    options = [f"--data-dir {data_dir}"]
    for key, value in plan.settings.get("prepare", {}).items():
        if key == "verify":
            options += [] if value else ["--no-verify"]
        else:
            value = ",".join(map(str, value)) if isinstance(value, list) else value
            options.append(f"--{key.replace('_', '-')} {value}")
    return "catsdogs prepare " + " ".join(options)


def listing() -> list[str]:
    """`catsdogs plans`: each built-in plan's name and description, its trials (a range for an
    adaptive plan) and how long it takes, then how to run or print one."""
    lines = []
    for name in names():
        plan = load(name)
        n = count(plan)
        target, most = plan.adaptive
        trials = f"{n} trials" if target is None else f"{n}-{count(plan, seeds=most)} trials"
        lines.append(f"{name:<14}{plan.settings.get('description', '')}")
        lines.append(f"{'':<14}{trials}; {plan.settings.get('duration', 'duration not measured')}")
    lines.append(f"Run one: catsdogs reproduce --config NAME (default: {DEFAULT_PLAN}); print one: catsdogs plans NAME")
    return lines


# --- the trials a plan stands for ---------------------------------------------------------------


def trials(plan: Plan, data_dir: Path, backend: str) -> list[TrialConfig]:
    """Every trial of every grid on the prepared data in `data_dir`, for the Keras `backend` the
    workers run on, each once (a trial two grids share runs once). Unprepared data is an error
    that says how to prepare what the plan asks for, and so is a prepared file changed since
    (exit 1)."""
    manifest = load_manifest(Path(data_dir))
    if manifest is None:
        also = f" (or `catsdogs reproduce --config {plan.ref}`, which prepares and trains)" if plan.ref else ""
        raise CatsdogsError(f"{data_dir} holds no finished prepared data set: run "
                            f"`{prepare_command(plan, data_dir)}` first{also}")
    require_intact(Path(data_dir))  # else trials would train on other data under its fingerprint
    return configs(plan, plan.settings.get("seeds", config.SEEDS), image_size=manifest["params"]["size"],
                   fingerprints=manifest["fingerprint"], backend=backend, **process_settings(plan))


def check_fit(grid: list[TrialConfig], data_dir: Path) -> None:
    """A SettingError (a bad option, exit 2) for a trial no step of which can train on the data:
    a batch size larger than its data set's training split (with the steps budget, the base batch
    size too, which counts its steps). Asked before a sweep starts, so none is recorded as failed."""
    manifest = require_prepared(Path(data_dir))
    for c in grid:
        n_train = sum(manifest["counts"][c.dataset]["train"].values())
        base = c.base_batch_size if c.budget == "steps" else None
        for key, size in (("batch_size", c.batch_size), ("base_batch_size", base)):
            if size is not None and size > n_train:
                raise SettingError(f"{key.replace('_', ' ')} {size} is larger than the {n_train} training images "
                                   f"of the {c.dataset} data in {data_dir}: not one full batch to train on", key)


def process_settings(plan: Plan) -> dict:
    """The plan's process settings (schema.PROCESS_FIELDS), each trial's: `deterministic`
    (--deterministic; default true) and `tf32` (--tf32; default: the framework's)."""
    return {name: plan.settings.get(name, schema.default(name)) for name in schema.PROCESS_FIELDS}


def count(plan: Plan, seeds: int | None = None) -> int:
    """How many trials the plan starts with (or has with `seeds` seeds), without prepared data:
    each data set's name stands in for its fingerprint."""
    return len(configs(plan, seeds or plan.settings.get("seeds", config.SEEDS),
                        image_size=plan.settings.get("prepare", {}).get("size", config.IMAGE_SIZE),
                        fingerprints={d: d for d in schema.DATASETS}, backend=schema.default("backend")))


def configs(plan: Plan, seeds: int, **identity) -> list[TrialConfig]:
    """The plan's trials with `seeds` seeds each and the given identity (image size, data
    fingerprints by data set, backend), each once."""
    out = []
    for grid in plan.settings["grids"].values():
        epochs = grid.get("epochs", plan.settings.get("max_epochs", plan.settings.get("epochs", config.EPOCHS)))
        out += grid_configs(as_list(grid["opt"]), as_list(grid["batch_size"]),
                            as_list(grid.get("dataset", "standard")), seeds, epochs, **identity,
                            eval_every=plan.settings.get("eval_every"),
                            **{k: as_list(grid[k]) for k in PROTOCOL_FIELDS if k in grid})
    return list(dict.fromkeys(out))


def grid_configs(optimizers, batch_sizes, datasets, seeds: int | range, epochs: int, *, image_size: int,
                 fingerprints: dict, backend: str, deterministic: bool = True, tf32: bool | None = None,
                 eval_every: int | None = None, **protocol) -> list[TrialConfig]:
    """One grid's trials, seed-major: every cell gets its first seed before any gets its second,
    so a sweep stopped early still covers the whole figure. `seeds`: how many (0..N-1), or
    which. A protocol value given as a list (several learning rates) is crossed with the grid;
    a learning rate equal to the optimizer's default is that default (the same trial).
    `fingerprints`: each data set's (the manifest's), part of every trial's identity; `backend`:
    the workers'. `eval_every`: the evaluations a trial with a target (`until`) stops at, its
    identity; a trial without one keeps None (its curve is the sweep's measurement)."""
    seeds = range(seeds) if isinstance(seeds, int) else seeds
    grid = []
    for seed, p, dataset, opt, bs in itertools.product(seeds, protocol_combinations(protocol), datasets,
                                                       optimizers, batch_sizes):
        p = {**p, "lr": schema.normalized_lr(opt, p["lr"])} if "lr" in p else p
        if p.get("until") is not None:  # one spelling a target, and the evaluations it is checked at
            p = {**p, "until": targets.canonical(p["until"]), "eval_every": eval_every}
        cfg = TrialConfig(optimizer=opt, batch_size=int(bs), dataset=dataset, seed=seed, epochs=epochs,
                          image_size=image_size, data=fingerprints[dataset], backend=backend,
                          deterministic=deterministic, tf32=tf32, **p)
        cfg.check()
        grid.append(cfg)
    return list(dict.fromkeys(grid))  # the same trial asked twice runs once


def protocol_combinations(protocol: dict) -> list[dict]:
    """Protocol settings, one dict per combination of the values given as lists or tuples
    (an empty list: the field's default)."""
    lists = {k: (list(v) or [schema.default(k)]) if isinstance(v, (list, tuple)) else [v]
             for k, v in protocol.items()}
    return [dict(zip(lists, combo, strict=True)) for combo in itertools.product(*lists.values())]


def as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]
