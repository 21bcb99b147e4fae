"""A sweep's summary: every table its report shows, made once from its trial rows (pure, no I/O).

    trial rows (catsdogs.analysis.rows) -> summarize -> {figures, unused, collapse, claims,
                                                         adaptive, noise, critical}

The figures are catsdogs.analysis.tables'; the learning rate tuned per batch size
(catsdogs.analysis.tuning) is made once here, drawn as a figure, and handed to the noise scale's
table and the critical batch size's claim (catsdogs.analysis.critical), which read its choices.
"""

from __future__ import annotations

from catsdogs import config, seeds
from catsdogs.analysis import claims, critical, time_to_target, to_target
from catsdogs.analysis.tables import (
    accumulation_table,
    augmentation_table,
    collapse_table,
    optimizers_table,
    protocols_table,
)
from catsdogs.analysis.tuning import tune_learning_rates
from catsdogs.manifest import test_images
from catsdogs.schema import TrialConfig


def summarize(trials: list[dict], recorded: dict | None = None, found: list[dict] | None = None) -> dict:
    """Every table of a sweep's report, from its trials, (`recorded`) the sweep's resolved
    configuration as the store holds it (its adaptive seeds, its data's counts) and (`found`)
    find-batch-size's results to hold against the trials run until a target.

    {"figures": [table, ...], "unused": [trial, ...], "collapse": table, "claims": [...],
    "adaptive": its state or None, "noise": the noise scale's table, "critical": [...], "to_target":
    the critical batch size measured, per series of the trials run until a target, "time_to_target":
    those series' measured time to the target against find-batch-size's prediction}. Figures
    without trials are left out: optimizers (article protocol, standard data, by optimizer);
    augmentation (article protocol, Adam, by data set; only with augmented trials); protocols
    (accumulate 1, by protocol, for each optimizer and data set that has a variant); accumulation
    (by accumulation steps, x the effective batch size, where accumulated trials exist); tuned
    (where a cell has several learning rates)."""
    # trials trained until a target are measured by their steps to it, not their accuracy: their
    # own section (catsdogs.analysis.to_target), and no accuracy figure or claim
    targeted = [t for t in trials if to_target.has_target(t)]
    trials = [t for t in trials if not to_target.has_target(t)]
    recorded = recorded or {}
    counts = (recorded.get("data") or {}).get("counts")
    # the test images every accuracy was measured on (each comparison's binomial floor); the
    # article's test split where the store does not record the data's counts
    n_test = test_images(counts) if counts else len(config.CLASSES) * config.SPLIT[2]
    tuned = tune_learning_rates(trials, n_test)
    target_tables = to_target.tables(targeted)
    figures = [table for table in (optimizers_table(trials), augmentation_table(trials), protocols_table(trials),
                                   accumulation_table(trials), tuned if tuned["rows"] else None) if table]
    used = set().union(*(table["keys"] for table in figures)) if figures else set()
    return {"figures": figures, "unused": [t for t in trials if t.get("key") not in used],
            "collapse": collapse_table(trials), "claims": claims.claims_by_context(trials, n_test),
            "adaptive": adaptive_state(trials, recorded.get("adaptive"), test_images(counts) if counts else None),
            "noise": critical.noise_table(trials, tuned),
            "critical": critical.critical_claims_by_context(trials, tuned, n_test),
            "to_target": target_tables, "time_to_target": time_to_target.comparisons(target_tables, found or [])}


def adaptive_state(trials: list[dict], adaptive: dict | None, n_test: int | None = None) -> dict | None:
    """Where each cell of an adaptive-seeds sweep stands ({"target_ci", "max_seeds", "cells"}),
    judged as the sweep judged it: with the binomial floor of `n_test` test images."""
    if not adaptive:
        return None
    grid = [TrialConfig.from_dict(t["config"]) for t in trials if t.get("config")]
    state = seeds.next_seeds(grid, {t["key"]: t for t in trials}, adaptive["target_ci"], adaptive["max_seeds"],
                             n_test=n_test)
    return {**adaptive, "cells": state["cells"]}
