"""Plans: what a study runs, written as TOML; the one format of `reproduce --config` and
`sweep --config`.

The format is documented once, in the README ("Plans"); this module is its only reader. The
built-in plans ship beside this file (catsdogs/plans/*.toml, read with importlib.resources), so
an installed catsdogs needs no checkout: `--config quick` names one, `--config my.toml` (any value
with a '/' or ending in '.toml') is a file. Every unknown key and every bad value is a one-line
PlanError naming the plan and the key, before anything runs.

Loading (`load`), the command line's overrides (`with_overrides`) and the trials a plan stands for
(`trials`, `count`) are separate functions over a plain dict, so `sweep` and `reproduce` share all
of it: a plan given to `sweep` runs exactly the trials `reproduce` would, on data already prepared.
"""

from __future__ import annotations

import importlib.resources
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from catsdogs import config, schema
from catsdogs.errors import CatsdogsError
from catsdogs.schema import PROTOCOL_FIELDS

# The keys of each part of a plan, with what each may hold (README, "Plans").
TOP_KEYS = ("name", "description", "duration", "note", "seeds", "epochs", "target_ci", "max_seeds",
            "data_dir", "prepare", "grids")
PREPARE_KEYS = ("source", "sha256", "verify", "per_class", "split", "size", "seed")
GRID_KEYS = ("opt", "batch_size", "dataset", "epochs", *PROTOCOL_FIELDS)
DEFAULT_PLAN = "article"  # what `catsdogs reproduce` runs: the article's case study, in full


class PlanError(CatsdogsError):
    """A plan that cannot run: `key` is the offending key (None for the whole plan)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


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
            return str(path), path.read_text()
        except FileNotFoundError:
            raise PlanError(f"no such file: {value}") from None
        except OSError as e:
            raise PlanError(f"cannot read {value}: {e.strerror}") from None
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

    def fail(key: str, message: str, section: str = ""):
        raise PlanError(f"{origin}: {section}{key}: {message}", key=key)

    _unknown(plan, TOP_KEYS, origin, "")
    for key, value in plan.items():
        message = _top_value_problem(key, value)
        if message:
            fail(key, message)
    if "max_seeds" in plan and "target_ci" not in plan:
        raise PlanError(f"{origin}: max_seeds caps adaptive seeds: give target_ci too", key="max_seeds")
    if plan.get("max_seeds", math.inf) < plan.get("seeds", config.SEEDS):
        fail("max_seeds", f"{plan['max_seeds']} is below the {plan.get('seeds', config.SEEDS)} seeds every cell starts with")
    prepare = plan.get("prepare", {})
    _unknown(prepare, PREPARE_KEYS, origin, "[prepare] ")
    for key, value in prepare.items():
        message = _prepare_value_problem(key, value)
        if message:
            fail(key, message, "[prepare] ")
    grids = plan.get("grids")
    if not grids:
        raise PlanError(f"{origin}: no [grids.NAME] section: nothing to train")
    for gname, grid in grids.items():
        section = f"[grids.{gname}] "
        if not isinstance(grid, dict):
            fail(gname, "must be a table ([grids.NAME] with opt, batch_size, ...)", "grids.")
        _unknown(grid, GRID_KEYS, origin, section)
        try:
            check_grid(grid, required=True)
        except PlanError as e:
            fail(e.key, str(e), section)


def check_grid(grid: dict, required: bool = False) -> None:
    """A grid's values (each a value or a list of values): a PlanError whose key is the bad one.

    `sweep` checks its command-line values with this too, so both say the same thing."""
    for key in ("opt", "batch_size") if required else ():
        if key not in grid:
            raise PlanError("is missing: every grid says which optimizers and batch sizes", key=key)
    for key, value in grid.items():
        if key == "epochs" and isinstance(value, list):
            raise PlanError("takes one value (a grid per number of epochs)", key=key)
        values = value if isinstance(value, list) else [value]
        if not values and key in ("opt", "batch_size", "dataset"):
            raise PlanError("needs at least one value", key=key)
        for v in values:
            message = _grid_value_problem(key, v)
            if message:
                raise PlanError(message, key=key)


def _unknown(table: dict, known: tuple, origin: str, section: str) -> None:
    bad = [k for k in table if k not in known]
    if bad:
        raise PlanError(f"{origin}: {section}unknown key {bad[0]!r}; known: {', '.join(known)}", key=bad[0])


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _top_value_problem(key: str, v) -> str | None:
    if key in ("seeds", "epochs", "max_seeds") and not (_is_int(v) and v >= 1):
        return f"must be a whole number >= 1, got {v!r}"
    if key == "target_ci" and not (_is_number(v) and v > 0):
        return f"must be a positive number of points, got {v!r}"
    if key in ("name", "description", "duration", "note", "data_dir") and not isinstance(v, str):
        return f"must be a string, got {v!r}"
    if key == "name" and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", v):
        return f"{v!r}: use letters, digits, '.', '_' and '-' (it names a folder)"
    if key in ("prepare", "grids") and not isinstance(v, dict):
        return f"must be a table ([{key}] ...), got {v!r}"
    return None


def _prepare_value_problem(key: str, v) -> str | None:
    if key in ("per_class", "size") and not (_is_int(v) and v >= 1):
        return f"must be a whole number >= 1, got {v!r}"
    if key == "seed" and not (_is_int(v) and v >= 0):
        return f"must be a whole number >= 0, got {v!r}"
    if key == "verify" and not isinstance(v, bool):
        return f"must be true or false, got {v!r}"
    if key == "sha256" and not (isinstance(v, str) and re.fullmatch(r"[0-9a-fA-F]{64}", v)):
        return f"must be 64 hexadecimal digits, got {v!r}"
    if key == "source" and not isinstance(v, str):
        return f"must be a string (URL, .zip, folder or 'synthetic'), got {v!r}"
    if key == "split":
        from catsdogs.prepare import parse_split

        if isinstance(v, list) and all(_is_int(p) for p in v):
            v = ",".join(map(str, v))
        if not isinstance(v, str):
            return f"must be three counts train,validation,test like \"600,200,200\", got {v!r}"
        try:
            parse_split(v)
        except ValueError as e:
            return str(e)
    return None


def _grid_value_problem(key: str, v) -> str | None:
    if key == "opt":
        return None if v in schema.OPTIMIZERS else f"unknown optimizer {v!r}; choose from {', '.join(schema.OPTIMIZERS)}"
    if key == "dataset":
        return None if v in schema.DATASETS else f"unknown dataset {v!r}; choose from {', '.join(schema.DATASETS)}"
    if key == "batch_size":
        return None if _is_int(v) and v >= 1 else f"batch sizes must be whole numbers >= 1, got {v!r}"
    if key == "epochs":
        return None if _is_int(v) and v >= 1 else f"must be a whole number >= 1, got {v!r}"
    kind = schema.python_type(key)
    if (kind is int and not _is_int(v)) or (kind is float and not _is_number(v)) or (kind is str and not isinstance(v, str)):
        return f"must be {'a whole number' if kind is int else 'a number' if kind is float else 'a string'}, got {v!r}"
    try:
        schema.TrialConfig("adam", 32, "standard", 0, **{key: v}).check()
    except ValueError as e:
        return str(e)
    return None


# --- the command line's values ------------------------------------------------------------------


def with_overrides(plan: Plan, top: dict, grid: dict) -> Plan:
    """The plan with the command line's values in place: `top` replaces top-level keys (seeds,
    name, target_ci, ...); `grid` replaces its keys in every grid (`--opt adam` runs every grid
    with Adam alone; `--epochs 1` shortens every trial). The result is checked again."""
    settings = {**plan.settings, **top}
    settings["grids"] = {g: {**values, **grid} for g, values in plan.settings["grids"].items()}
    if "epochs" in grid:
        settings["epochs"] = grid["epochs"]
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


def adaptive(plan: Plan) -> tuple[float | None, int | None]:
    """(target_ci, max_seeds): adaptive seeds when the plan sets a target."""
    target = plan.settings.get("target_ci")
    return target, (plan.settings.get("max_seeds", config.MAX_SEEDS) if target is not None else None)


# --- the trials a plan stands for ---------------------------------------------------------------


def trials(plan: Plan, data_dir: Path) -> list:
    """Every trial of every grid on the prepared data in `data_dir`, for this process's Keras
    backend (the workers'), each once (a trial two grids share runs once)."""
    from catsdogs import backends
    from catsdogs.manifest import require_prepared

    manifest = require_prepared(Path(data_dir))
    return _configs(plan, plan.settings.get("seeds", config.SEEDS), image_size=manifest["params"]["size"],
                    fingerprints=manifest["fingerprint"], backend=backends.check())


def count(plan: Plan, seeds: int | None = None) -> int:
    """How many trials the plan starts with (or has with `seeds` seeds), without prepared data:
    each data set's name stands in for its fingerprint."""
    return len(_configs(plan, seeds or plan.settings.get("seeds", config.SEEDS),
                        image_size=plan.settings.get("prepare", {}).get("size", config.IMAGE_SIZE),
                        fingerprints={d: d for d in schema.DATASETS}, backend=schema.default("backend")))


def _configs(plan: Plan, seeds: int, **identity) -> list:
    from catsdogs.sweep import grid_configs

    out = []
    for grid in plan.settings["grids"].values():
        out += grid_configs(as_list(grid["opt"]), as_list(grid["batch_size"]),
                            as_list(grid.get("dataset", "standard")), seeds,
                            grid.get("epochs", plan.settings.get("epochs", config.EPOCHS)), **identity,
                            **{k: as_list(grid[k]) for k in PROTOCOL_FIELDS if k in grid})
    return list(dict.fromkeys(out))


def as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]
