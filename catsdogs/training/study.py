"""A sweep study: a plan (or the command line's grid, as one) run to the end, the one way `catsdogs
sweep` and `catsdogs reproduce` both train.

`run_plan` turns the plan into its trials on the prepared data (catsdogs.plans), places them (the
local runner's worker processes, or Ray actors: catsdogs.training.ray_runner) and runs them in
one sweep under the plan's name (catsdogs.training.sweep): once, or with a target interval in
adaptive rounds (`run_adaptive_sweep`), each round adding a seed to every cell still wider than
the target (catsdogs.seeds decides which). The resolved plan is recorded with the sweep.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from catsdogs import config, plans
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.manifest import require_prepared, test_images
from catsdogs.plans import Plan
from catsdogs.runtime import backends
from catsdogs.schema import TrialConfig
from catsdogs.seeds import next_seeds
from catsdogs.store import Store, store_path
from catsdogs.training.sweep import (
    SlotFactory,
    SweepSettings,
    check_workers,
    describe,
    make_slots,
    run_sweep,
    runner_slots,
)


def run_plan(plan: Plan, data_dir: Path, out: Path, *, runner: str = "local", workers: int | None = None,
             isolate: bool = False, ray_address: str | None = None, worker_env: dict | None = None,
             slots: SlotFactory | None = None, overwrite: bool = False, retry_failed: bool = False,
             dry_run: bool = False, log=print, on_finished=None) -> dict:
    """Run every trial of the plan's grids not finished yet, in one sweep named as the plan; return
    the status counts, with "trials": how many the sweep ended with (adaptive rounds add some).

    `runner`: "local" (worker processes here) or "ray" (actors on the cluster at `ray_address`);
    `workers`: trials at once (None: one here, what the cluster runs at once on Ray); `isolate`: a
    fresh worker per trial; `worker_env`: more of the workers' environment; `slots`: a factory of
    the slots trials run in (catsdogs.training.sweep.Slot), instead of the runner's. `dry_run`:
    log the planned trials and their status in the store, run nothing. `on_finished()`: after each
    trial's outcome is stored (sweep.run_sweep)."""
    trials = plans.trials(plan, data_dir, backends.check())
    check_workers(trials, workers or 1)
    if dry_run:
        for line in describe(trials, out):
            log(line)
        try:  # listed all the same, so a plan can be read on data too small to run it
            plans.check_fit(trials, data_dir)
        except SettingError as e:
            log(f"A run would stop before its first trial: {e}")
        return {"trials": len(trials), "dry_run": True}
    plans.check_fit(trials, data_dir)
    slots, workers = runner_slots(runner, slots, workers, ray_address=ray_address, isolate=isolate, env=worker_env,
                                  log=log)
    target_ci, max_seeds = plan.adaptive
    settings = SweepSettings(overwrite=overwrite, retry_failed=retry_failed, log=log, workers=workers,
                             isolate=isolate, slots=slots, worker_env=worker_env,
                             noise_sampling=plan.noise_sampling, eval_every=plan.eval_every,
                             on_finished=on_finished, sweep_config={"plan": plan.settings, "plan_origin": plan.origin})
    if target_ci is None:
        return {**run_sweep(plan.name, trials, data_dir, out, settings), "trials": len(trials)}
    return run_adaptive_sweep(plan.name, trials, data_dir, out, settings, target_ci=target_ci, max_seeds=max_seeds)


def run_adaptive_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path,
                       settings: SweepSettings | None = None, *, target_ci: float,
                       max_seeds: int = config.MAX_SEEDS) -> dict:
    """Run `grid`, then keep adding one seed to every cell whose interval is still wider than
    ±target_ci points, round after round (seed-major, as every sweep), until each cell meets it or
    has max_seeds seeds. Resumable: the rounds are decided from the store, so the same command
    again finds the same cells, runs what is left, and goes on. The status counts, "trials" and
    each cell's state ("cells"). `settings`: how the trials run (run_sweep's)."""
    settings = settings or SweepSettings()
    log = settings.log
    seeds_run = _seeds_in_store(name, grid, out)
    if seeds_run > max_seeds:
        raise CatsdogsError(f"sweep {name!r} already has seeds 0-{seeds_run - 1} of these cells: "
                            f"--max-seeds must be at least {seeds_run}")
    sweep_config = {**(settings.sweep_config or {}), "adaptive": {"target_ci": target_ci, "max_seeds": max_seeds}}
    n_test = test_images(require_prepared(Path(data_dir))["counts"])  # for the binomial floor
    # One set of slots for every round: their workers keep their decoded data and compiled steps
    kept = make_slots(out, settings)
    try:
        round_no = 1
        while True:
            counts = run_sweep(name, grid, data_dir, out, replace(settings, overwrite=settings.overwrite and round_no == 1,
                                                                  sweep_config=sweep_config), kept=kept)
            with Store(store_path(out)) as store:
                rows = {c.key(): store.get(c.key()) or {} for c in grid}
            step = next_seeds(grid, rows, target_ci, max_seeds, n_test=n_test)
            states = [c["state"] for c in step["cells"].values()]
            summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
            if not step["add"]:
                log(f"Adaptive seeds: every cell is done ({summary}; target ±{target_ci:g} points, "
                    f"at most {max_seeds} seeds).")
                return {**counts, "cells": step["cells"], "trials": len(grid)}
            round_no += 1
            log(f"Adaptive seeds, round {round_no}: {len(step['add'])} cells wider than ±{target_ci:g} "
                f"points get another seed ({summary}).")
            grid = grid + step["add"]
    finally:
        for slot in kept:
            slot.close()


def _seeds_in_store(name: str, grid: list[TrialConfig], out: Path) -> int:
    """The most seeds any of the grid's cells has in sweep `name` of the store (0 if none)."""
    if not store_path(out).exists():
        return 0
    cells = {c.cell() for c in grid}
    with Store(store_path(out)) as store:
        if name not in store.sweeps():
            return 0
        seeds = [t["seed"] + 1 for t in store.trials(name)
                 if TrialConfig.from_dict(t["config"]).cell() in cells]
    return max(seeds, default=0)
