"""The report's figures: accuracy and collapse rate against batch size, the noise scale over
training, each from a table.

Plot functions take a matplotlib axis and a table (catsdogs.analysis.tables) and return the
artists they drew; `make_figure`, `make_collapse_figure` and `make_noise_figure` build a whole
`Figure` (no pyplot, no global state). Batch size is on a log2 axis (catsdogs.plotting).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullLocator

from catsdogs.analysis.tables import BATCH_LABEL, incomplete_note, problems, status_counts
from catsdogs.plotting import batch_axis
from catsdogs.schema import Status
from catsdogs.stats import LEVEL

ARTICLE_LABEL = "article (single run)"


def plot_accuracy(ax, table: dict, dodge: float = 0.12, spread: float = 0.09) -> dict:
    """Draw a table's accuracy (%) against x on a log2 axis: per series the seeds, the mean and
    its CI, in the table's order of series.

    Each series is shifted by `dodge` octaves from its neighbours so that intervals do not hide
    each other; each seed's point by up to ±spread/2 octaves within its cell. Cells with failed
    or out-of-memory trials get a note in the series colour at the bottom of the axis
    ("1 oom"); the table's article points ({"series", "x", "value"}) are stars; in the
    accumulation table, accumulated cells are labelled "batch×steps" ("32×8") above their
    interval. Returns the artists: {series: {"mean", "seeds", "ci", "notes", "shift"}, "article":
    PathCollection or None, "legend"}."""
    rows = table["rows"]
    series = list(table.get("series") or dict.fromkeys(r["series"] for r in rows))
    article = [a for a in table.get("article") or [] if a["series"] in series]
    label_accumulated = table.get("name") == "accumulation"
    xs = sorted({r["x"] for r in rows} | {a["x"] for a in article})
    k = len(series)
    colors = {s: f"C{i % 10}" for i, s in enumerate(series)}
    shifts = {s: 2 ** ((i - (k - 1) / 2) * dodge) for i, s in enumerate(series)}
    out: dict = {}
    for i, s in enumerate(series):
        srows = sorted((r for r in rows if r["series"] == s), key=lambda r: r["x"])
        shift, color = shifts[s], colors[s]
        done = [r for r in srows if r["n_done"]]
        (mean,) = ax.plot([r["x"] * shift for r in done], [100 * r["mean"] for r in done],
                          "-o", color=color, markersize=6, linewidth=1.8, label=s, zorder=4)
        px, py = _seed_points(done, shift, spread)
        seeds = ax.scatter(px, py, s=18, color=color, alpha=0.45, linewidths=0, zorder=3)
        with_ci = [r for r in done if r["ci_low"] is not None]
        ci = None
        if with_ci:
            ci = ax.errorbar([r["x"] * shift for r in with_ci], [100 * r["mean"] for r in with_ci],
                             # drawn clipped to 0..100%: a t interval on 2 seeds can pass both
                             yerr=[[100 * (r["mean"] - max(r["ci_low"], 0.0)) for r in with_ci],
                                   [100 * (min(r["ci_high"], 1.0) - r["mean"]) for r in with_ci]],
                             fmt="none", ecolor=color, elinewidth=1.4, capsize=4, zorder=3)
        if label_accumulated:
            _label_accumulated(ax, done, shift, color)
        notes = _problem_notes(ax, srows, shift, color, 0.03 + 0.065 * i)
        out[s] = {"mean": mean, "seeds": seeds, "ci": ci, "notes": notes, "shift": shift}
    out["article"] = None
    if article:
        out["article"] = ax.scatter([a["x"] * shifts[a["series"]] for a in article],
                                    [100 * a["value"] for a in article], marker="*", s=190,
                                    c=[colors[a["series"]] for a in article], edgecolors="black",
                                    linewidths=0.9, zorder=7, label=ARTICLE_LABEL)
    ax.axhline(50, color="0.55", linestyle=":", linewidth=1, zorder=1)
    batch_axis(ax, xs, table.get("xlabel", BATCH_LABEL))
    ax.set_ylabel("test accuracy (%)")
    ax.margins(y=0.18)
    ax.autoscale_view()
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, -2.0), min(high, 104.0))  # accuracy lives in 0..100; notes sit below 0
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(True, axis="x", alpha=0.15)
    out["legend"] = _accuracy_legend(ax, [out[s]["mean"] for s in series], out["article"])
    return out


def _seed_points(done: list[dict], shift: float, spread: float) -> tuple[list[float], list[float]]:
    """Each finished seed's (x, accuracy %), spread by up to ±spread/2 octaves within its cell."""
    px, py = [], []
    for r in done:
        n = len(r["accuracies"])
        for j, acc in enumerate(r["accuracies"]):
            offset = (j / (n - 1) - 0.5) * spread if n > 1 else 0.0
            px.append(r["x"] * shift * 2 ** offset)
            py.append(100 * acc)
    return px, py


def _label_accumulated(ax, done: list[dict], shift: float, color: str) -> None:
    """"32×8" above each accumulated cell's interval."""
    for r in done:
        if r["accumulate"] > 1:
            top = max([r["ci_high"] or r["mean"], *r["accuracies"]])
            ax.annotate(f"{r['batch_size']}×{r['accumulate']}", (r["x"] * shift, 100 * top),
                        xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                        fontsize=8, color=color, zorder=6,
                        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.75})


def _problem_notes(ax, rows: list[dict], shift: float, color: str, height: float) -> list:
    """"1 oom" at the bottom of the axis (at `height`, a share of it) under each cell with trials
    that did not finish well."""
    notes = []
    for r in rows:
        text = problems(r)
        if text:
            notes.append(ax.text(r["x"] * shift, height, text, color=color, transform=ax.get_xaxis_transform(),
                                 ha="center", va="bottom", fontsize=8, fontweight="bold", zorder=6,
                                 bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": color,
                                       "linewidth": 0.8}))
    return notes


def _accuracy_legend(ax, means: list, article):
    handles = list(means)
    handles.append(Line2D([], [], linestyle="none", marker="o", color="0.4", alpha=0.5,
                          markersize=5, label="each seed"))
    handles.append(Line2D([], [], linestyle="none", marker="|", color="0.2", markersize=14,
                          markeredgewidth=1.4, label=f"{LEVEL:.0%} CI (Student t on the seeds)"))
    if article is not None:
        handles.append(article)
    handles.append(Line2D([], [], linestyle=":", color="0.55", label="chance (50%)"))
    return ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     fontsize=9, frameon=False)


def plot_collapse(ax, table: dict, dodge: float = 0.12) -> dict:
    """Draw each cell's collapse rate (%) against batch size on a log2 axis, with its Wilson 95%
    interval and "k/n" beside it; one colour per series. Returns {series: {"rate", "ci"}, "legend"}."""
    series = list(table.get("series") or dict.fromkeys(r["series"] for r in table["rows"]))
    rows = [r for r in table["rows"] if r["n_collapse_known"]]
    xs = sorted({r["x"] for r in rows})
    k = len(series)
    out: dict = {}
    for i, s in enumerate(series):
        mine = sorted((r for r in rows if r["series"] == s), key=lambda r: r["x"])
        shift, color = 2 ** ((i - (k - 1) / 2) * dodge), f"C{i % 10}"
        x = [r["x"] * shift for r in mine]
        y = [100 * r["collapse_rate"] for r in mine]
        (rate,) = ax.plot(x, y, "-o", color=color, markersize=6, linewidth=1.8, label=s, zorder=4)
        ci = ax.errorbar(x, y, yerr=[[100 * (r["collapse_rate"] - r["collapse_ci_low"]) for r in mine],
                                     [100 * (r["collapse_ci_high"] - r["collapse_rate"]) for r in mine]],
                         fmt="none", ecolor=color, elinewidth=1.2, capsize=3, zorder=3)
        for r, xi, yi in zip(mine, x, y, strict=True):
            ax.annotate(f"{r['n_collapsed']}/{r['n_collapse_known']}", (xi, yi), xytext=(4, 2 + 8 * i),
                        textcoords="offset points", fontsize=7.5, color=color, zorder=5)
        out[s] = {"rate": rate, "ci": ci}
    batch_axis(ax, xs, BATCH_LABEL)
    ax.set_ylim(-4, 104)
    ax.set_ylabel("runs that collapsed (%)")
    ax.grid(True, axis="y", alpha=0.3)
    handles = [out[s]["rate"] for s in series if s in out]
    handles.append(Line2D([], [], linestyle="none", marker="|", color="0.2", markersize=14,
                          markeredgewidth=1.2, label=f"{LEVEL:.0%} CI (Wilson); k/n runs"))
    out["legend"] = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                              borderaxespad=0.0, fontsize=9, frameon=False)
    return out


def make_collapse_figure(table: dict, note: str | None = None) -> tuple[Figure, dict]:
    fig = Figure(figsize=(9.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    artists = plot_collapse(ax, table)
    bits = [b for b in (note, table.get("setting"), "a collapse: one class predicted for all test images") if b]
    ax.set_title(table["title"] + "\n" + " · ".join(bits), fontsize=10.5, loc="left")
    return fig, artists


def figure_title(table: dict, note: str | None = None) -> str:
    """The title, and a second line: the note, what is drawn, and whether trials are missing."""
    c = status_counts(table["rows"])
    ns = sorted({r["n_done"] for r in table["rows"] if r["n_done"]})
    seeds = (f"{ns[0]} seeds per point" if len(ns) == 1 else
             f"{ns[0]}-{ns[-1]} seeds per point" if ns else "no finished trial yet")
    if ns == [1]:
        seeds = "1 seed per point: no interval"
    bits = [b for b in (note, table.get("setting"), f"mean and {LEVEL:.0%} CI, {seeds}",
                        incomplete_note(table["rows"])) if b]
    if c[Status.FAILED] or c[Status.OOM]:
        bits.append(", ".join(f"{c[k]} {k}" for k in (Status.FAILED, Status.OOM) if c[k]) + " (marked at the bottom)")
    return table["title"] + "\n" + " · ".join(bits)


def make_figure(table: dict, note: str | None = None) -> tuple[Figure, dict]:
    """A whole figure for one table (matplotlib Figure; no pyplot, no global state)."""
    width = 10.5 if max((len(s) for s in table["series"]), default=0) > 28 else 9.5
    fig = Figure(figsize=(width, 5.0), layout="constrained")
    ax = fig.add_subplot()
    artists = plot_accuracy(ax, table)
    if table["name"] == "tuned":  # the learning rate each tuned point trained with
        for r in table["rows"]:
            if r.get("lr") is not None and r["n_done"] and "tuned" in r["series"]:
                edge = "\n(grid edge)" if r.get("lr_edge") else ""  # the optimum may lie outside the grid
                ax.annotate(f"lr {r['lr']:g}{edge}", (r["x"] * artists[r["series"]]["shift"], 100 * r["mean"]),
                            xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7.5,
                            color=artists[r["series"]]["mean"].get_color(), zorder=6)
    ax.set_title(figure_title(table, note), fontsize=10.5, loc="left")
    return fig, artists


def plot_noise(ax, group: dict, batch_sizes: list[int], dodge: float = 0.06) -> dict:
    """Draw one panel of the noise table (catsdogs.analysis.critical.noise_table): per series (a
    batch size, and its learning rate where several were run) B_simple against the epoch, pooled
    over its seeds, with its 95% interval (an arrow where it is unbounded above), on a log2 axis
    that also marks the sweep's batch sizes (dotted), so a series reads against the batch sizes
    trained: below the line a larger batch buys nearly linear speed-ups, above it little. Where
    the noise dominated (a lower bound only), an open triangle at the bound. Returns {series:
    {"line", "ci", "bounds"}, "legend"}."""
    series = group["series"]
    k = len(series)
    out: dict = {}
    values: list[float] = list(batch_sizes)
    for s in series:
        values += [v for p in s["points"] for v in (p.b_simple, p.low, p.high) if v]
    top = 2 ** np.ceil(np.log2(max(values)))  # where an interval open above is drawn to
    for i, s in enumerate(series):
        color = f"C{i % 10}"
        shift = (i - (k - 1) / 2) * dodge
        shown = [p for p in s["points"] if p.b_simple is not None]
        (line,) = ax.plot([p.epoch + shift for p in shown], [p.b_simple for p in shown], "-o", color=color,
                          markersize=5, linewidth=1.6, label=s["label"], zorder=4)
        ci = None
        if shown:
            ci = ax.errorbar([p.epoch + shift for p in shown], [p.b_simple for p in shown],
                             yerr=[[p.b_simple - p.low for p in shown],
                                   [(p.high if p.high is not None else top) - p.b_simple for p in shown]],
                             fmt="none", ecolor=color, elinewidth=1.1, capsize=3, zorder=3)
            for p in shown:
                if p.high is None:  # unbounded above
                    ax.annotate("", (p.epoch + shift, top * 1.15), (p.epoch + shift, top),
                                arrowprops={"arrowstyle": "->", "color": color, "lw": 1.1}, zorder=3)
        bound = [p for p in s["points"] if p.b_simple is None and p.low]
        bounds = ax.scatter([p.epoch + shift for p in bound], [p.low for p in bound], marker="^", s=40,
                            facecolors="none", edgecolors=color, linewidths=1.2, zorder=5) if bound else None
        out[s["label"]] = {"line": line, "ci": ci, "bounds": bounds}
    for b in batch_sizes:
        ax.axhline(b, color="0.55", linestyle=":", linewidth=0.9, zorder=1)
        ax.annotate(f"batch {b}", (1.0, b), xycoords=("axes fraction", "data"), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7.5, color="0.4")
    ax.set_yscale("log", base=2)
    ticks = [2**e for e in range(int(np.floor(np.log2(min(values)))), int(np.log2(top)) + 1)]
    ax.set_yticks(ticks, labels=[f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(ticks[0] / 1.2, top * 1.25)
    ax.set_xticks(sorted({p.epoch for s in series for p in s["points"]}))
    ax.set_xlabel("epoch (0: before the first update)")
    ax.set_ylabel("B_simple (log2 scale)")
    ax.set_title(group["label"], fontsize=10, loc="left")
    ax.grid(True, axis="y", alpha=0.25)
    handles = [out[s["label"]]["line"] for s in series]
    handles.append(Line2D([], [], linestyle="none", marker="|", color="0.2", markersize=12, markeredgewidth=1.2,
                          label=f"{LEVEL:.0%} CI (Fieller; pooled over seeds)"))
    if any(o["bounds"] is not None for o in out.values()):
        handles.append(Line2D([], [], linestyle="none", marker="^", markerfacecolor="none", color="0.3",
                              label="noise dominated: a lower bound"))
    handles.append(Line2D([], [], linestyle=":", color="0.55", label="the sweep's batch sizes"))
    out["legend"] = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.09, 1.0), borderaxespad=0.0,
                              fontsize=8.5, frameon=False)
    return out


def make_noise_figure(table: dict, note: str | None = None) -> tuple[Figure, list[dict]]:
    """The noise table's figure: one panel per group (optimizer, data set, protocol), or where a
    group has several learning rates, its default rate's and its tuned one's (table["panels"])."""
    groups = table["panels"]
    fig = Figure(figsize=(10.5, 0.9 + 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    artists = [plot_noise(ax, g, table["batch_sizes"]) for ax, g in zip(axes, groups, strict=True)]
    sampling = "; ".join(f"{pairs} pairs of {small} and {large} images" for small, large, pairs in table["sampling"])
    bits = [b for b in (note, f"McCandlish et al. (2018): B_simple = tr(Σ)/|G|², from {sampling}, drawn with "
                        "replacement") if b]
    fig.suptitle(table["title"] + "\n" + " · ".join(bits), x=0.01, ha="left", fontsize=10.5)
    return fig, artists


# --- the critical batch size, measured (catsdogs.analysis.to_target) ----------------------------------


def plot_steps_examples(ax, table: dict, color: str = "C0") -> dict:
    """The paper's form (McCandlish et al. 2018, figure 1): per batch size, the steps to the target
    against the examples to it (S(B) and E(B) = B S(B)), log-log, each point labelled with its
    batch size; the fitted curve (S/S_min - 1)(E/E_min - 1) = 1 and B_crit marked on it, where
    S = 2 S_min and E = 2 E_min. Returns {"points", "curve", "b_crit"}."""
    rows = [r for r in table["rows"] if np.isfinite(r["steps"]) and r["steps"] > 0]
    points = ax.scatter([r["examples"] for r in rows], [r["steps"] for r in rows], color=color, zorder=4,
                        label=f"{table['label']}: median over seeds")
    for r in rows:
        ax.annotate(f"{r['batch_size']}", (r["examples"], r["steps"]), xytext=(4, 3), textcoords="offset points",
                    fontsize=7.5, color=color)
    fit, curve, mark = table["fit"], None, None
    if fit is not None and fit.b_crit is not None and rows:
        sizes = np.geomspace(min(r["batch_size"] for r in rows) / 4, max(r["batch_size"] for r in rows) * 4, 200)
        steps = fit.s_min + fit.e_min / sizes
        (curve,) = ax.plot(steps * sizes, steps, "-", color=color, alpha=0.6, linewidth=1.3,
                           label="fit: S = S_min (1 + B_crit/B)")
        mark = ax.scatter([2 * fit.e_min], [2 * fit.s_min], marker="*", s=140, color=color, edgecolors="black",
                          linewidths=0.6, zorder=5, label=f"B_crit {fit.describe()}")
    _log_axes_or_say_why(ax, bool(rows), x=True)
    ax.set_xlabel("training images to the target (log)")
    ax.set_ylabel("optimizer steps to the target (log)")
    ax.grid(True, which="major", alpha=0.25)
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    return {"points": points, "curve": curve, "b_crit": mark}


def plot_steps(ax, table: dict, color: str = "C0") -> dict:
    """S(B) against batch size (log2), with the fitted S = S_min + E_min/B; a batch size whose best
    median did not reach the target as an open marker at the top, labelled so; each chosen learning
    rate written by its point (an edge choice marked *). Returns {"points", "fit", "missed"}."""
    rows = table["rows"]
    reached = [r for r in rows if np.isfinite(r["steps"]) and r["steps"] > 0]
    missed = [r for r in rows if not np.isfinite(r["steps"])]
    points = ax.scatter([r["batch_size"] for r in reached], [r["steps"] for r in reached], color=color, zorder=4,
                        label="S(B): steps at the best learning rate")
    for r in reached:
        ax.annotate(f"lr {r['lr']:g}{'*' if r['edge'] else ''}", (r["batch_size"], r["steps"]), xytext=(0, 6),
                    textcoords="offset points", ha="center", fontsize=7, color="0.3")
    top = max([r["steps"] for r in reached], default=1.0) * 1.35
    missed_art = ax.scatter([r["batch_size"] for r in missed], [top] * len(missed), marker="^", facecolors="none",
                            edgecolors=color, s=50, zorder=4, label="not reached") if missed else None
    fit, line = table["fit"], None
    if fit is not None:
        sizes = np.geomspace(min(r["batch_size"] for r in rows), max(r["batch_size"] for r in rows), 100)
        (line,) = ax.plot(sizes, fit.s_min + fit.e_min / sizes, "-", color=color, alpha=0.6, linewidth=1.3,
                          label="fit: S_min + E_min/B")
    batch_axis(ax, [r["batch_size"] for r in rows])
    if _log_axes_or_say_why(ax, bool(reached or missed)):
        ax.set_ylim(top=top * (1.25 if missed else 1.0))  # room for the labels above the points
    ax.set_ylabel("optimizer steps to the target (log)")
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(loc="upper right", fontsize=8, frameon=False)
    return {"points": points, "fit": line, "missed": missed_art}


def _log_axes_or_say_why(ax, drawn: bool, x: bool = False) -> bool:
    """A log y axis (and x, with `x`) labelled in plain numbers when something positive was drawn;
    else a log axis would have nothing to scale (every target met at the start, or never), so the
    panel says so. Returns `drawn`."""
    if not drawn:
        ax.text(0.5, 0.5, "no batch size reached the target after an update\n(met at the start, or never)",
                transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.4")
        return False
    ax.set_yscale("log")
    if x:
        ax.set_xscale("log")
    _plain_numbers(*((ax.xaxis,) if x else ()), ax.yaxis)
    return True


def _plain_numbers(*axes) -> None:
    """A log axis labelled 40, 100, 3000 rather than 4×10¹, 10², 3×10³."""
    for axis in axes:
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "1235" else ""))


def make_critical_figure(tables: list[dict], note: str | None = None) -> tuple[Figure, list[dict]]:
    """Per series of a sweep run until a target: the paper's form (steps against examples) and S(B)."""
    fig = Figure(figsize=(11, 0.9 + 3.8 * len(tables)), layout="constrained")
    axes = fig.subplots(len(tables), 2, squeeze=False)
    artists = []
    for (left, right), table in zip(axes, tables, strict=True):
        artists.append({"paper": plot_steps_examples(left, table), "steps": plot_steps(right, table)})
        left.set_title(f"{table['label']} · {table['target'].describe()}", fontsize=10, loc="left")
    bits = [b for b in (note, "* lr at the edge of its grid") if b]
    fig.suptitle("The critical batch size, measured: steps to a target by batch size\n" + " · ".join(bits),
                 x=0.01, ha="left", fontsize=10.5)
    return fig, artists


# --- time to the target: measured, and find-batch-size's prediction (catsdogs.analysis.time_to_target) ---


def plot_time_to_target(ax, comparison: dict, color: str = "C0") -> dict:
    """Measured T(B) / T(best) against batch size (log2) and the predicted one beside it, the
    measured best starred and the recommended ringed. Returns {"measured", "predicted", "best",
    "recommended"}."""
    rows = comparison["rows"]
    measured = [r for r in rows if r["relative"] is not None and np.isfinite(r["relative"])]
    predicted = [r for r in rows if r["predicted_relative"] is not None]
    (m_line,) = ax.plot([r["batch_size"] for r in measured], [r["relative"] for r in measured], "o-", color=color,
                        label="measured: S(B) × seconds per step")
    (p_line,) = ax.plot([r["batch_size"] for r in predicted], [r["predicted_relative"] for r in predicted], "s--",
                        color="0.4", markersize=4, label="predicted: (1 + B_noise/B) × probe's step time")
    by = {r["batch_size"]: r for r in measured}
    best = rec = None
    if comparison["best"] in by:
        r = by[comparison["best"]]
        best = ax.scatter([r["batch_size"]], [r["relative"]], marker="*", s=180, color=color, edgecolors="black",
                          linewidths=0.6, zorder=5, label=f"measured best: {r['batch_size']}")
    if comparison["recommended"] in by:
        r = by[comparison["recommended"]]
        rec = ax.scatter([r["batch_size"]], [r["relative"]], marker="o", s=220, facecolors="none", edgecolors="C3",
                         linewidths=1.6, zorder=6, label=f"recommended: {r['batch_size']}")
    batch_axis(ax, [r["batch_size"] for r in rows])
    _log_axes_or_say_why(ax, bool(measured or predicted))
    ax.set_ylabel("time to the target / the best's (log)")
    ax.grid(True, axis="y", alpha=0.25)
    ax.legend(loc="upper center", fontsize=8, frameon=False)
    return {"measured": m_line, "predicted": p_line, "best": best, "recommended": rec}


def make_time_figure(comparisons: list[dict], note: str | None = None) -> tuple[Figure, list[dict]]:
    """One panel per comparison of measured and predicted time to the target."""
    cols = min(2, len(comparisons))
    rows = -(-len(comparisons) // cols)
    fig = Figure(figsize=(6.2 * cols, 0.6 + 4.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    artists = []
    for ax, c in zip(axes[:len(comparisons)], comparisons, strict=True):
        artists.append(plot_time_to_target(ax, c))
        ratio = "" if c["ratio"] is None else f"T(rec)/T(best) {c['ratio']:.2f}, {c['verdict']}"
        result = Path(c["path"]).parent.name  # find-batch-size's --name: which result this panel holds
        ax.set_title(f"{c['label']} · {c['context']}\nagainst {result}: {ratio}", fontsize=9, loc="left")
    for ax in axes[len(comparisons):]:
        ax.set_visible(False)
    fig.suptitle("Time to the target by batch size, measured and predicted" + (f" · {note}" if note else ""),
                 x=0.01, ha="left", fontsize=10.5)
    return fig, artists
