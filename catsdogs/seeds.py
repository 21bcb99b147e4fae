"""Adaptive seeds: which cells of a sweep get another seed, decided from the store alone.

A **cell** is a trial's configuration but for its seed: the trials one interval of test
accuracy is taken over. `sweep --target-ci W` adds seed n to every cell whose 95% interval is
still wider than ±W points, round after round; the report lists the cells that stopped at
--max-seeds. The oracle of an adaptive sweep: it decides what to run next, from the store alone,
apart from what runs trials. Framework-free: the sweep (training) and the report (analysis) both
ask it.

No cell is settled by agreement alone. Seeds that agree exactly have a zero-width interval, and
bimodal cells (seeds at 50% and at 85%) often start that way. So the interval's per-seed standard
deviation is never taken below the test set's own sampling noise: the binomial standard deviation
of an accuracy p measured on the cell's n test images, sqrt(p(1-p)/n), with p kept within
[0.1, 0.9] (a cell at 0% or 100% still has noise left to find). With 400 test images that is
2.5 points at p = 0.5, so a cell whose seeds agree meets a ±5 target at 4 seeds, not at 2.

The floored width is a stopping guard, not a confidence interval: every seed is tested on the
same test images, so their test-set noise is shared, not independent, and more seeds do not
average it away as t·floor/√n assumes. It keeps a sweep from calling a cell settled on seeds
that merely agree; the report's intervals (catsdogs.stats) are what to read a cell's
uncertainty from.
"""

from __future__ import annotations

import math
from dataclasses import replace

from catsdogs.errors import SettingError
from catsdogs.schema import TARGET_CI_MAX, Status, TrialConfig, check_number
from catsdogs.stats import LEVEL, binomial_sd, mean_ci, t_quantile


def sd_floor(accuracy: float, n_test: int) -> float:
    """The binomial standard deviation of an accuracy measured on n_test images (a fraction)."""
    return binomial_sd(accuracy, n_test)


def interval(accuracies: list[float], n_test: int | None = None) -> dict:
    """{"half_width": points or None below 2 seeds, "floored": whether the binomial floor on the
    per-seed sd decided it}: the 95% Student-t half-width over the seeds, as the stopping rule
    reads it (floored: a guard, not an interval; see the module's note)."""
    stats = mean_ci(accuracies)
    if stats["ci_half_width"] is None:
        return {"half_width": None, "floored": False}
    floor = sd_floor(stats["mean"], n_test) if n_test else 0.0
    if stats["sd"] >= floor:
        return {"half_width": 100 * stats["ci_half_width"], "floored": False}
    n = stats["n"]
    return {"half_width": 100 * t_quantile((1 + LEVEL) / 2, n - 1) * floor / math.sqrt(n), "floored": True}


def next_seeds(grid: list[TrialConfig], rows: dict[str, dict], target_ci: float, max_seeds: int,
               n_test: int | None = None) -> dict:
    """Which cells get one more seed, and why the others do not.

    rows: the store's rows by key. A cell gets seed n (its seeds being 0..n-1) while its interval's
    half-width is above `target_ci` points (or it has fewer than 2 finished seeds) and n is below
    `max_seeds`; not after its latest trial failed or ran out of memory (another seed would too).
    `n_test`: the test images each accuracy was measured on, for the binomial floor (None: no
    floor, as catsdogs 0.7.0 decided). Returns {"add": [TrialConfig], "cells": {cell: {"seeds",
    "half_width", "floored", "state"}}}, state one of met, max-seeds, stopped (failed / oom) or more."""
    by_cell: dict[TrialConfig, list[TrialConfig]] = {}
    for cfg in grid:
        by_cell.setdefault(cfg.cell(), []).append(cfg)
    add, cells = [], {}
    for cell, members in by_cell.items():
        members.sort(key=lambda c: c.seed)
        done = [rows[c.key()] for c in members if (rows.get(c.key()) or {}).get("status") == Status.DONE]
        ci = interval([r["test_accuracy"] for r in done if r.get("test_accuracy") is not None], n_test)
        half = ci["half_width"]
        last = (rows.get(members[-1].key()) or {}).get("status")
        n = members[-1].seed + 1
        if half is not None and half <= target_ci:
            state = "met"
        elif last in (Status.FAILED, Status.OOM):
            state = f"stopped ({last})"
        elif n >= max_seeds:
            state = "max-seeds"
        else:
            state = "more"
            add.append(replace(members[-1], seed=n))
        cells[cell] = {"seeds": n, "half_width": half, "floored": ci["floored"], "state": state}
    return {"add": add, "cells": cells}


def check_adaptive(target_ci: float | None, max_seeds: int | None, seeds: int) -> None:
    """Adaptive seeds: a positive target of points; a cap that needs a target and is no lower
    than the seeds every cell starts with."""
    if max_seeds is not None and target_ci is None:
        raise SettingError("caps adaptive seeds, which need a target: give target_ci (--target-ci) too",
                           "max_seeds")
    number = isinstance(target_ci, (int, float)) and not isinstance(target_ci, bool)
    if target_ci is not None and not (number and math.isfinite(target_ci) and target_ci > 0):
        shown = f"{target_ci:g}" if number else repr(target_ci)
        raise SettingError(f"must be a positive number of points, got {shown}", "target_ci")
    if target_ci is not None and target_ci > TARGET_CI_MAX:
        raise SettingError(f"must be at most {TARGET_CI_MAX:g} points (an interval wider than ±{TARGET_CI_MAX:g} "
                           f"points says nothing about an accuracy), got {target_ci:g}", "target_ci")
    if max_seeds is not None:
        check_number(max_seeds, "max_seeds")
    if max_seeds is not None and max_seeds < seeds:
        raise SettingError(f"{max_seeds} is below the {seeds} seeds every cell starts with", "max_seeds")
