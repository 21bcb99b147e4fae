"""Adaptive seeds: which cells of a sweep get another seed, decided from the store alone.

A **cell** is a trial's configuration but for its seed: the trials one interval of test
accuracy is taken over. `sweep --target-ci W` adds seed n to every cell whose 95% interval is
still wider than ±W points, round after round; the report lists the cells that stopped at
--max-seeds. The oracle of an adaptive sweep: it decides what to run next, from the store alone,
apart from what runs trials. Framework-free: the sweep (training) and the report (analysis) both
ask it.
"""

from __future__ import annotations

from dataclasses import replace

from catsdogs.schema import Status, TrialConfig
from catsdogs.stats import mean_ci


def half_width_points(accuracies: list[float]) -> float | None:
    """The 95% interval's half-width over the seeds, in percentage points; None below 2 seeds."""
    half = mean_ci(accuracies)["ci_half_width"]
    return None if half is None else 100 * half


def next_seeds(grid: list[TrialConfig], rows: dict[str, dict], target_ci: float, max_seeds: int) -> dict:
    """Which cells get one more seed, and why the others do not.

    rows: the store's rows by key. A cell gets seed n (its seeds being 0..n-1) while its interval's
    half-width is above `target_ci` points (or it has fewer than 2 finished seeds) and n is below
    `max_seeds`; not after its latest trial failed or ran out of memory (another seed would too).
    Returns {"add": [TrialConfig], "cells": {cell: {"seeds", "half_width", "state"}}}, state one
    of met, max-seeds, stopped (failed / oom) or more."""
    by_cell: dict[TrialConfig, list[TrialConfig]] = {}
    for cfg in grid:
        by_cell.setdefault(cfg.cell(), []).append(cfg)
    add, cells = [], {}
    for cell, members in by_cell.items():
        members.sort(key=lambda c: c.seed)
        done = [rows[c.key()] for c in members if (rows.get(c.key()) or {}).get("status") == Status.DONE]
        half = half_width_points([r["test_accuracy"] for r in done if r.get("test_accuracy") is not None])
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
        cells[cell] = {"seeds": n, "half_width": half, "state": state}
    return {"add": add, "cells": cells}
