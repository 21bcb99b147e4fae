"""The learning rate tuned per batch size: where a sweep ran several learning rates at a batch
size, the one with the best mean validation accuracy, and the test accuracy it gives (never chosen
by test accuracy: the test set only reports). Pure functions of trial rows, no I/O.

A choice is made within a **tuning group**: an optimizer, a data set, the rest of the protocol,
and the context (rows.context_of: epochs, image size, backend, process settings), so trials that
never share a cell never share a choice either. The table (`tune_learning_rates`) is a figure's
table (catsdogs.analysis.tables), and its "chosen" trials are what the noise-scale panels and the
critical-batch-size claim read (catsdogs.analysis.critical): made once, in the summary.
"""

from __future__ import annotations

import math

from catsdogs.analysis.rows import (
    OPTIMIZER_NAMES,
    accuracy,
    context_label,
    context_of,
    learning_rate_of,
    mean_of,
    protocol_label,
    protocol_of,
    trial_order,
    validation_accuracy,
)
from catsdogs.analysis.rows import field as field_of
from catsdogs.analysis.tables import BATCH_LABEL, FIGURE_TITLES, cells, setting
from catsdogs.schema import DEFAULT_LR, Status
from catsdogs.stats import welch


def _tuning_group(trial: dict) -> tuple:
    """What one learning-rate choice is made within: all but the learning rate and seed."""
    p = dict(protocol_of(trial), lr=None)
    return (field_of(trial, "optimizer"), field_of(trial, "dataset"), tuple(p.items()), context_of(trial))


def tune_learning_rates(trials: list[dict], n_test: int | None = None) -> dict:
    """For each batch size, the learning rate with the best mean *validation* accuracy over its
    seeds, and that choice's *test* accuracy. Groups with one learning rate at every batch size
    are left out: nothing to choose.

    A table like the figures' (rows from `cells`), with two series per group: the tuned choice
    ("Adam, lr tuned per batch size") and, where it was run, the optimizer's default ("Adam,
    default lr 0.001"); plus "choices": one row per (group, batch size, learning rate) with
    its seeds' mean validation and test accuracy and whether it was chosen; "chosen": per tuned
    series and batch size, the keys of the chosen rate's trials; and "drops": per group, the best
    batch size and the first larger one clearly below it (Welch's interval, floored by the binomial
    sd of `n_test` test images: catsdogs.stats.welch)."""
    plain = [t for t in trials if protocol_of(t)["accumulate"] == 1]
    lrs: dict[tuple, set] = {}
    for t in plain:
        lrs.setdefault((_tuning_group(t), int(field_of(t, "batch_size"))), set()).add(learning_rate_of(t))
    groups = sorted({g for (g, _), v in lrs.items() if len(v) > 1},
                    key=lambda g: (trial_order({"optimizer": g[0], "dataset": g[1]}, dict(g[2])), str(g[3])))
    label_of = _labels(groups)
    choices: list[dict] = []
    members: dict[str, list[dict]] = {}  # by series; a default-rate trial may be in both of its group's
    chosen: dict[tuple[str, int], tuple] = {}  # (tuned series, batch size) -> (its rate, its grid edge)
    chosen_keys: dict[str, dict[int, list[str]]] = {}  # tuned series -> batch size -> the chosen trials' keys
    for g in groups:
        tuned, default_rate = label_of[g]
        in_group = [t for t in plain if _tuning_group(t) == g]
        for bs in sorted({int(field_of(t, "batch_size")) for t in in_group}):
            by_lr: dict[float, list[dict]] = {}
            for t in in_group:
                if int(field_of(t, "batch_size")) == bs:
                    by_lr.setdefault(learning_rate_of(t), []).append(t)
            best, edge = _choose(by_lr, g[0], tuned, bs, choices)
            if best is not None:
                chosen[(tuned, bs)] = (best, edge)
                chosen_keys.setdefault(tuned, {})[bs] = [t.get("key") for t in by_lr[best]]
                members.setdefault(tuned, []).extend(by_lr[best])
            members.setdefault(default_rate, []).extend(by_lr.get(DEFAULT_LR[g[0]], []))
    # every tuned series, then every default-rate one, each in its group's order
    order = [label_of[g][0] for g in groups] + [label_of[g][1] for g in groups]
    rows = [r for i, s in enumerate(order) for r in cells(members.get(s, []), lambda t, i=i, s=s: ((i,), s))]
    for r in rows:
        r["lr"], r["lr_edge"] = chosen.get((r["series"], r["x"]), (None, None))
    keys = {t.get("key") for ts in members.values() for t in ts}
    tuned_trials = [t for g in groups for t in members.get(label_of[g][0], [])]
    return {"name": "tuned", "title": FIGURE_TITLES["tuned"], "xlabel": BATCH_LABEL,
            "series": list(dict.fromkeys(r["series"] for r in rows)), "rows": rows, "article": [],
            "setting": setting(tuned_trials), "keys": keys, "choices": choices, "chosen": chosen_keys,
            "drops": [_drop(rows, label_of[g][0], n_test) for g in groups]}


def _labels(groups: list[tuple]) -> dict[tuple, tuple[str, str]]:
    """Each group's two series names, (tuned, default rate): the data set where the figure has two,
    the protocol where it is not the article's, the context where the figure has several."""
    many_data = len({g[1] for g in groups}) > 1
    many_contexts = len({g[3] for g in groups}) > 1
    out = {}
    for g in groups:
        rest = protocol_label(dict(g[2]))
        prefix = (OPTIMIZER_NAMES.get(g[0], g[0]) + (f", {g[1]} data" if many_data else "")
                  + ("" if rest == "article protocol" else f", {rest}"))
        context = f" ({context_label(g[3], True)})" if many_contexts else ""
        out[g] = (f"{prefix}, lr tuned per batch size{context}", f"{prefix}, default lr {DEFAULT_LR[g[0]]:g}{context}")
    return out


def _choose(by_lr: dict[float, list[dict]], optimizer: str, series: str, batch_size: int,
            choices: list[dict]) -> tuple[float | None, str | None]:
    """(the rate chosen at one batch size, its grid edge), every rate tried added to `choices`."""
    done = {lr: [t for t in ts if t["status"] == Status.DONE and accuracy(t) is not None]
            for lr, ts in by_lr.items()}
    scored = {lr: mean_of(validation_accuracy(t) for t in ts) for lr, ts in done.items()}
    scored = {lr: v for lr, v in scored.items() if v is not None}
    # ties go to the learning rate nearer the optimizer's default (log scale)
    best = max(scored, key=lambda lr: (scored[lr], -abs(math.log(lr / DEFAULT_LR[optimizer]))), default=None)
    edge = grid_edge(best, sorted(by_lr))
    for lr in sorted(by_lr):
        choices.append({"series": series, "batch_size": batch_size, "lr": lr, "n_done": len(done[lr]),
                        "val_mean": scored.get(lr), "test_mean": mean_of(accuracy(t) for t in done[lr]),
                        "chosen": lr == best, "edge": edge if lr == best else None})
    return best, edge


def grid_edge(chosen: float | None, grid: list[float]) -> str | None:
    """"lowest" or "highest" when the chosen rate sits on that edge of a grid of 2 or more rates:
    the optimum may lie outside the grid. None when it is interior (or nothing was chosen)."""
    if chosen is None or len(grid) < 2:
        return None
    return "lowest" if chosen == min(grid) else "highest" if chosen == max(grid) else None


def _drop(rows: list[dict], series: str, n_test: int | None = None) -> dict:
    """The tuned series' best batch size and the first larger one whose mean is clearly below it
    (Welch interval of the difference below 0), or None if none is."""
    mine = sorted((r for r in rows if r["series"] == series and r["n_done"]), key=lambda r: r["x"])
    if not mine:
        return {"series": series, "best": None, "drop_from": None, "diff": None}
    best = max(mine, key=lambda r: r["mean"])
    for r in mine:
        if r["x"] > best["x"]:
            w = welch(r["accuracies"], best["accuracies"], n_test=n_test)
            if w["ci_high"] is not None and w["ci_high"] < 0:
                return {"series": series, "best": best["x"], "drop_from": r["x"], "diff": w}
    return {"series": series, "best": best["x"], "drop_from": None, "diff": None}
