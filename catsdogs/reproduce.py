"""The whole article in one call: prepare -> the grids of both figures -> report.

A plan is a TOML file (configs/article.toml is the article's full protocol):

    name = "article"          # the sweep; outputs go to OUT/NAME/
    data_dir = "data/quick"   # optional: where this plan's images go (--data-dir wins)
    seeds = 3
    epochs = 5
    [prepare]                 # catsdogs prepare's options
    source = "synthetic"
    ...
    [grids.optimizers]        # each grid: sweep options; lists are crossed
    opt = ["sgd", "adam"]
    batch_size = [16, 32, 64, 128]
    dataset = ["standard"]

All grids go into one sweep, so a trial two grids share (the Adam / standard points of the
article's two figures) runs once.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from catsdogs import config
from catsdogs.errors import CatsdogsError
from catsdogs.schema import PROTOCOL_FIELDS

PLAN_KEYS = {"name", "seeds", "epochs", "note", "data_dir", "prepare", "grids", "target_ci", "max_seeds"}
PREPARE_KEYS = {"source", "sha256", "verify", "per_class", "split", "size", "seed"}
GRID_KEYS = {"opt", "batch_size", "dataset", "epochs", *PROTOCOL_FIELDS}


def default_plan_path() -> Path:
    """configs/article.toml of this checkout (the package sits beside configs/)."""
    return Path(__file__).resolve().parent.parent / "configs" / "article.toml"


def read_toml(path: Path) -> dict:
    """A TOML file as a dict; an unreadable or invalid file is a one-line CatsdogsError."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise CatsdogsError(f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise CatsdogsError(f"{path} is not valid TOML: {e}") from None


def load_plan(path: Path) -> dict:
    plan = read_toml(path)
    check_plan(plan, str(path))
    return plan


def check_plan(plan: dict, where: str) -> None:
    def unknown(keys, allowed, section):
        bad = sorted(set(keys) - allowed)
        if bad:
            raise CatsdogsError(f"{where}: unknown key {bad[0]!r} in {section}; known: {', '.join(sorted(allowed))}")

    unknown(plan, PLAN_KEYS, "the top level")
    if "max_seeds" in plan and "target_ci" not in plan:
        raise CatsdogsError(f"{where}: max_seeds caps adaptive seeds: give target_ci too")
    for key, kind in (("seeds", int), ("epochs", int), ("max_seeds", int), ("target_ci", (int, float))):
        value = plan.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value <= 0):
            raise CatsdogsError(f"{where}: {key} must be a positive number, got {value!r}")
    unknown(plan.get("prepare", {}), PREPARE_KEYS, "[prepare]")
    grids = plan.get("grids") or {}
    if not grids:
        raise CatsdogsError(f"{where}: no [grids.NAME] section: nothing to train")
    for gname, grid in grids.items():
        unknown(grid, GRID_KEYS, f"[grids.{gname}]")
        for key in ("opt", "batch_size"):
            if key not in grid:
                raise CatsdogsError(f"{where}: [grids.{gname}] needs {key!r}")


def _as_list(v) -> list:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def plan_trials(plan: dict, data_dir: Path, seeds: int | None = None) -> list:
    """Every trial of every grid, in grid order, each once."""
    from catsdogs.sweep import plan as sweep_plan

    trials = []
    seeds = seeds if seeds is not None else plan.get("seeds", config.SEEDS)
    for grid in plan["grids"].values():
        protocol_lists = {k: _as_list(grid[k]) for k in PROTOCOL_FIELDS if k in grid}
        for combo in itertools.product(*protocol_lists.values()):
            protocol = dict(zip(protocol_lists, combo, strict=True))
            try:
                trials += sweep_plan(_as_list(grid["opt"]), _as_list(grid["batch_size"]),
                                     _as_list(grid.get("dataset", "standard")), seeds,
                                     grid.get("epochs", plan.get("epochs", config.EPOCHS)), data_dir, **protocol)
            except ValueError as e:
                raise CatsdogsError(f"bad grid: {e}") from None
    return list(dict.fromkeys(trials))


def reproduce(plan: dict, *, data_dir: Path, out: Path, name: str | None = None, seeds: int | None = None,
              target_ci: float | None = None, max_seeds: int | None = None, source: str | None = None,
              workers: int = 1, isolate: bool = False, overwrite: bool = False, log=print,
              progress: bool = False, slots=None) -> dict:
    """prepare -> sweep (all grids, shared trials once) -> report; resumable like sweep."""
    from catsdogs.prepare import prepare
    from catsdogs.report import report
    from catsdogs.sweep import run_adaptive_sweep, run_sweep

    p = dict(plan.get("prepare", {}))
    source = source or p.get("source", config.ARCHIVE_URL)
    split = p.get("split", config.SPLIT)
    if isinstance(split, str):
        from catsdogs.prepare import parse_split

        split = parse_split(split)
    sha256 = None if p.get("verify") is False else p.get("sha256", config.ARCHIVE_SHA256)
    log("== prepare")
    manifest = prepare(source=source, data_dir=data_dir, sha256=sha256,
                       per_class=p.get("per_class", config.PER_CLASS), split=tuple(split),
                       size=p.get("size", config.IMAGE_SIZE), seed=p.get("seed", config.SEED),
                       log=log, progress=progress)
    name = name or plan.get("name", "article")
    trials = plan_trials(plan, data_dir, seeds)
    log(f"== sweep {name}: {len(trials)} trials")
    run = dict(overwrite=overwrite, log=log, workers=workers, isolate=isolate,
               sweep_config={"plan": plan, "seeds": seeds}, slots=slots)
    if target_ci is None:
        counts = run_sweep(name, trials, data_dir, out, **run)
        n_trials = len(trials)
    else:
        counts = run_adaptive_sweep(name, trials, data_dir, out, target_ci=target_ci,
                                    max_seeds=max_seeds or config.MAX_SEEDS, **run)
        n_trials = counts["trials"]  # with every seed the rounds added
    note = plan.get("note") or ("synthetic data" if manifest["source"]["kind"] == "synthetic" else None)
    log("== report")
    paths = report(name, out, note=note, log=log)
    return {"counts": counts, "report": paths, "trials": n_trials}
