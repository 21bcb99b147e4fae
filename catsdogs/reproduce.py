"""The whole article in one call: prepare -> every grid of a plan in one sweep -> report.

A plan (catsdogs.plans; the format is in docs/usage.md, "Plans") says what to prepare and which
grids to train. All grids go into one sweep (catsdogs.training.study.run_plan, as `catsdogs
sweep --config` runs them), so a trial two grids share (the Adam / standard points of the
article's two figures) runs once. Resumable like every sweep.
"""

from __future__ import annotations

from pathlib import Path

from catsdogs import config
from catsdogs.analysis.report import report
from catsdogs.data.prepare import prepare
from catsdogs.plans import Plan, configs
from catsdogs.runtime import backends
from catsdogs.schema import DATASETS, parse_split
from catsdogs.training.study import run_plan
from catsdogs.training.sweep import check_workers


def reproduce(plan: Plan, *, data_dir: Path, out: Path, source: str | None = None, workers: int = 1,
              isolate: bool = False, overwrite: bool = False, log=print, progress: bool = False, slots=None,
              worker_env: dict | None = None) -> dict:
    """prepare -> sweep (all grids, shared trials once) -> report; `source` overrides the plan's.
    {"counts": the sweep's status counts, "trials": how many it ended with, "report": its files}."""
    # What can be told without data is told before the download: the backend, and whether the
    # plan can run with this many workers (the trials as `plans.count` makes them, data aside).
    backend = backends.check()
    check_workers(configs(plan, 1, image_size=config.IMAGE_SIZE, fingerprints={d: d for d in DATASETS},
                          backend=backend), workers)
    p = plan.settings.get("prepare", {})
    sha256 = None if p.get("verify") is False else p.get("sha256", config.ARCHIVE_SHA256)
    log("== prepare")
    manifest = prepare(source=source or p.get("source", config.ARCHIVE_URL), data_dir=data_dir, sha256=sha256,
                       per_class=p.get("per_class", config.PER_CLASS), split=parse_split(p.get("split", config.SPLIT)),
                       size=p.get("size", config.IMAGE_SIZE), seed=p.get("seed", config.SEED),
                       log=log, progress=progress)
    log(f"== sweep {plan.name}")
    counts = run_plan(plan, data_dir, out, workers=workers, isolate=isolate, worker_env=worker_env, slots=slots,
                      overwrite=overwrite, log=log)
    note = plan.settings.get("note") or ("synthetic data" if manifest["source"]["kind"] == "synthetic" else None)
    log("== report")
    paths = report(plan.name, out, note=note, log=log)
    return {"counts": counts, "report": paths, "trials": counts["trials"]}
