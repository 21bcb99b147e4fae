"""The report of one sweep: figures and tables, read from the results store and nothing else.

Three layers, each usable alone:

- loading: `load_trials(store_path, name)` returns the sweep's trial rows (dicts, as the store
  gives them);
- pure transformations: `summarize(trials)` sorts the trials into the report's figures, and
  `cells(...)` turns one figure's trials into rows, one per (series, batch size) cell, with the
  mean, the standard deviation and a 95% Student-t confidence interval over the seeds, and the
  count of every trial that did not finish well (failed, oom) or not yet (pending, running);
- drawing: `plot_accuracy(ax, rows, ...)` draws such rows on a matplotlib axis;
  `make_figure(table)` builds a whole figure (matplotlib's `Figure`: no pyplot, no global state).

`report(name, out)` does all three and writes OUT/NAME/figures/*.png|svg, OUT/NAME/results.md
and OUT/NAME/summary.csv, each atomically (a temporary file, then os.replace).

Accuracies are fractions (0..1) in the rows and in summary.csv, percentages in the figures and
in results.md. This module must not import TensorFlow, Keras or the trainer: a report is
made on any machine that has the store.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from catsdogs import claims, config, seeds
from catsdogs.errors import CatsdogsError
from catsdogs.figures import save_figure
from catsdogs.files import write_text_atomic
from catsdogs.schema import DEFAULT_LR, default, protocol_defaults
from catsdogs.stats import LEVEL, mean_ci, t_quantile, welch, wilson  # noqa: F401 - t_quantile: the report's API
from catsdogs.store import Store

# What the article reports, read from its text (docs/protocol.md, "The two figures"): each value is
# one training run, so it has no spread. "About 62%" etc., as fractions of the 400 test images.
# Keyed by (optimizer, dataset, batch size); all with the article's protocol, 5 epochs.
ARTICLE_ACCURACY: dict[tuple[str, str, int], float] = {
    ("sgd", "standard", 16): 0.62,  # "SGD about 62% at batch size 16"
    ("adam", "standard", 64): 0.67,  # "Adam still about 67% around batch size 64"
    ("adam", "augmented", 128): 0.58,  # "with augmented data, 58% at batch size 128"
    ("adam", "augmented", 256): 0.575,  # "... and 57.5% at 256"
}
ARTICLE_LABEL = "article (single run)"

# The protocol columns of the store, and the values TrialConfig gives them by default.
PROTOCOL_DEFAULTS = protocol_defaults()
# The article's protocol: Keras' default learning rate, no scaling or warm-up, n // batch size
# updates per epoch, no accumulation, float32, one device. base_batch_size has no effect under
# it, so it is not part of it.
ARTICLE_PROTOCOL = {
    "lr": None, "lr_scaling": "none", "warmup_epochs": 0.0, "budget": "epochs",
    "accumulate": 1, "precision": "float32", "strategy": "none",
}

OPTIMIZER_NAMES = {"sgd": "SGD", "adam": "Adam"}
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX"}  # where a figure mixes backends
FIGURE_TITLES = {
    "optimizers": "Test accuracy vs batch size: SGD and Adam, standard data",
    "augmentation": "Test accuracy vs batch size: standard and augmented data, Adam",
    "protocols": "Test accuracy vs batch size by training protocol",
    "accumulation": "Test accuracy vs effective batch size: plain and accumulated batches",
    "tuned": "Test accuracy vs batch size, the learning rate tuned per batch size on validation accuracy",
    "collapse": "Collapse rate vs batch size: runs whose model predicts one class for every test image",
}
BATCH_LABEL = "batch size (log scale)"
EFFECTIVE_BATCH_LABEL = "effective batch size = batch size × accumulation steps (log scale)"
NOT_DONE = ("failed", "oom", "pending", "running")

CSV_COLUMNS = [
    "figure", "series", "optimizer", "dataset", "protocol", "epochs", "image_size",
    "batch_size", "accumulate", "effective_batch_size", "n_done", "mean", "ci_low", "ci_high",
    "ci_half_width", "sd", "t", "n_failed", "n_oom", "n_pending", "n_running", "article",
    "n_collapse_known", "n_collapsed", "collapse_rate", "collapse_ci_low", "collapse_ci_high",
    "not_collapsed_mean", "val_mean", "lr", "accuracies", "seeds",
]


# --- loading ---------------------------------------------------------------------------------


def load_trials(store_path: Path | str, name: str) -> list[dict]:
    """Every trial of sweep `name` in the store at `store_path`, in the sweep's order."""
    store_path = Path(store_path)
    if not store_path.is_file():
        raise CatsdogsError(f"no results store at {store_path}: run `catsdogs sweep` first "
                            "(or give the --out it used)")
    with Store(store_path) as store:
        names = store.sweeps()
        if name not in names:
            known = ", ".join(names) if names else "none yet"
            raise CatsdogsError(f"no sweep named {name!r} in {store_path}; sweeps there: {known}")
        return store.trials(name)


def data_source_kind(store_path: Path, name: str) -> str | None:
    """'synthetic', 'url', 'zip' or 'folder': where the sweep's prepared data came from."""
    with Store(store_path) as store:
        cfg = store.sweep_config(name) or {}
    return ((cfg.get("data") or {}).get("source") or {}).get("kind")


# --- one trial's fields ----------------------------------------------------------------------


def field(trial: dict, key: str, default=None):
    """A configuration value: its store column, else the config dict, else `default`."""
    value = trial.get(key)
    if value is None:
        value = (trial.get("config") or {}).get(key)
    return default if value is None else value


def protocol_of(trial: dict) -> dict:
    """The trial's protocol settings, normalized (base_batch_size None where it has no effect)."""
    p = {k: field(trial, k, d) for k, d in PROTOCOL_DEFAULTS.items()}
    p["lr"] = None if p["lr"] is None else float(p["lr"])
    p["warmup_epochs"] = float(p["warmup_epochs"])
    p["accumulate"] = int(p["accumulate"])
    p["base_batch_size"] = int(p["base_batch_size"])
    if p["lr_scaling"] == "none" and p["budget"] == "epochs":
        p["base_batch_size"] = None  # it scales nothing and budgets nothing
    return p


def is_article_protocol(trial: dict) -> bool:
    """True for the article's protocol (ARTICLE_PROTOCOL): the trials of its two figures."""
    p = protocol_of(trial)
    return all(p[k] == v for k, v in ARTICLE_PROTOCOL.items())


def protocol_label(p: dict, accumulate: bool = True) -> str:
    """A readable name: "article protocol", "linear lr scaling", "linear lr + equal updates"."""
    parts: list[tuple[str, str]] = []  # (alone, in a combination)
    if p["lr"] is not None:
        parts.append((f"lr {p['lr']:g}", f"lr {p['lr']:g}"))
    if p["lr_scaling"] == "linear":
        parts.append(("linear lr scaling", "linear lr"))
    elif p["lr_scaling"] != "none":
        parts.append((f"{p['lr_scaling']} lr scaling", f"{p['lr_scaling']} lr"))
    if p["budget"] == "steps":
        parts.append(("equal updates (steps budget)", "equal updates"))
    elif p["budget"] != "epochs":
        parts.append((f"{p['budget']} budget", f"{p['budget']} budget"))
    if p["warmup_epochs"]:
        parts.append((f"{p['warmup_epochs']:g}-epoch warm-up", f"{p['warmup_epochs']:g}-epoch warm-up"))
    if accumulate and p["accumulate"] > 1:
        parts.append((f"gradient accumulation ×{p['accumulate']}", f"accumulation ×{p['accumulate']}"))
    if p["precision"] != "float32":
        name = p["precision"].replace("_", " ")
        parts.append((name, name))
    if p["strategy"] != "none":
        parts.append((f"{p['strategy']} strategy", p["strategy"]))
    if not parts:
        label = "article protocol"
    elif len(parts) == 1:
        label = parts[0][0]
    else:
        label = " + ".join(short for _, short in parts)
    if p.get("base_batch_size") not in (None, PROTOCOL_DEFAULTS["base_batch_size"]):
        label += f", base batch {p['base_batch_size']}"
    return label


def _without_accumulate(p: dict) -> tuple:
    q = dict(p, accumulate=1)
    if q["lr_scaling"] == "none" and q["budget"] == "epochs":
        q["base_batch_size"] = None
    return tuple(q.items())


def _accuracy(trial: dict) -> float | None:
    a = trial.get("test_accuracy")
    return None if a is None else float(a)


def validation_accuracy(trial: dict) -> float | None:
    """The trained model's validation accuracy: its column, else its history's last epoch."""
    v = trial.get("val_accuracy")
    if v is None:
        v = ((trial.get("history") or [{}])[-1] or {}).get("val_accuracy")
    return None if v is None else float(v)


def _mean_of(values: Iterable[float | None]) -> float | None:
    v = [float(x) for x in values if x is not None]
    return sum(v) / len(v) if v else None


# --- pure transformations --------------------------------------------------------------------


def cells(trials: Iterable[dict], series_of: Callable[[dict], str | None],
          x_of: Callable[[dict], int] | None = None, series: list[str] | None = None,
          article: Callable[[dict], float | None] | None = None) -> list[dict]:
    """One row per (series, x) cell: who is in it, how each trial ended, and the statistics.

    series_of(trial): the trial's series label, or None to leave it out; x_of(trial): its x
    (the batch size unless told); article(trial): the article's value for its cell, if any.
    Rows come in the order of `series` (first appearance if not given), then of x."""
    x_of = x_of or (lambda t: int(field(t, "batch_size")))
    groups: dict[tuple[str, int], list[dict]] = {}
    for t in trials:
        s = series_of(t)
        if s is not None:
            groups.setdefault((s, x_of(t)), []).append(t)
    order = list(series or [])
    order += [s for s, _ in groups if s not in order]
    rows = []
    for (s, x), members in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        first = members[0]
        p = protocol_of(first)
        status = [m["status"] for m in members]
        finished = [m for m in members if m["status"] == "done" and _accuracy(m) is not None]
        finished.sort(key=lambda m: (field(m, "seed", 0), m.get("key") or ""))
        # a trial marked done without an accuracy is counted with the failed, never dropped
        no_accuracy = sum(1 for m in members if m["status"] == "done" and _accuracy(m) is None)
        stats = mean_ci(_accuracy(m) for m in finished)
        known = [m for m in finished if m.get("collapsed") is not None]  # recorded since 0.5.0
        collapsed = sum(int(m["collapsed"]) for m in known)
        rate = wilson(collapsed, len(known))
        kept = mean_ci(_accuracy(m) for m in known if not m["collapsed"])
        rows.append({
            "series": s, "x": x,
            "optimizer": field(first, "optimizer"), "dataset": field(first, "dataset"),
            "protocol": protocol_label(p), "epochs": field(first, "epochs"),
            "image_size": field(first, "image_size"),
            "batch_size": int(field(first, "batch_size")), "accumulate": p["accumulate"],
            "effective_batch_size": int(field(first, "batch_size")) * p["accumulate"],
            "n_trials": len(members), "n_done": stats["n"],
            "n_failed": status.count("failed") + no_accuracy, "n_oom": status.count("oom"),
            "n_pending": status.count("pending"), "n_running": status.count("running"),
            "mean": stats["mean"], "sd": stats["sd"], "t": stats["t"],
            "ci_low": stats["ci_low"], "ci_high": stats["ci_high"],
            "ci_half_width": stats["ci_half_width"],
            "accuracies": [_accuracy(m) for m in finished],
            "seeds": [field(m, "seed") for m in finished],
            "errors": [m.get("error") for m in members if m["status"] in ("failed", "oom") and m.get("error")],
            "article": article(first) if article else None,
            # collapses: the trained model predicts one class for every test image
            "n_collapse_known": rate["n"], "n_collapsed": collapsed, "collapse_rate": rate["rate"],
            "collapse_ci_low": rate["ci_low"], "collapse_ci_high": rate["ci_high"],
            "n_not_collapsed": kept["n"], "not_collapsed_mean": kept["mean"],
            "not_collapsed_ci_low": kept["ci_low"], "not_collapsed_ci_high": kept["ci_high"],
            "dead_units": _mean_of(m.get("dead_units") for m in known),
            "val_mean": _mean_of(validation_accuracy(m) for m in finished),
        })
    return rows


def _article_value(trial: dict) -> float | None:
    if not is_article_protocol(trial):
        return None
    return ARTICLE_ACCURACY.get((field(trial, "optimizer"), field(trial, "dataset"),
                                 int(field(trial, "batch_size"))))


def _context_suffixer(trials: list[dict]) -> Callable[[dict], str]:
    """Labels gain ", 3 epochs" (or px, data, backend) only where the figure mixes several of
    them: trials that differ in these never share a cell."""
    varying = [k for k in ("epochs", "image_size", "backend")
               if len({field(t, k, default(k)) for t in trials}) > 1]
    # Each data set has its own fingerprint; only two fingerprints of one data set are worth a label.
    if any(len({field(t, "data") for t in trials if field(t, "dataset") == d}) > 1
           for d in {field(t, "dataset") for t in trials}):
        varying.append("data")
    units = {"epochs": lambda v: f"{v} epochs", "image_size": lambda v: f"{v} px",
             "data": lambda v: f"data {str(v)[:8]}", "backend": lambda v: BACKEND_NAMES.get(v, v)}

    def suffix(t: dict) -> str:
        return "".join(", " + units[k](field(t, k, default(k))) for k in varying)
    return suffix


def _setting(trials: list[dict]) -> str:
    """What all of a figure's trials share, for its subtitle: "5 epochs, 200 px, Keras on JAX"
    (a figure that mixes backends names each series' backend instead: `_context_suffixer`)."""
    bits = []
    for key, unit in (("epochs", "epochs"), ("image_size", "px")):
        values = {field(t, key) for t in trials}
        if len(values) == 1 and None not in values:
            bits.append(f"{values.pop()} {unit}")
    backends = {field(t, "backend", default("backend")) for t in trials}
    if len(backends) == 1:
        backend = backends.pop()
        bits.append(f"Keras on {BACKEND_NAMES.get(backend, backend)}")
    return ", ".join(bits)


def _article_points(rows: list[dict]) -> list[dict]:
    return [{"series": r["series"], "x": r["x"], "value": r["article"]}
            for r in rows if r["article"] is not None]


def _table(name: str, title: str, trials: list[dict], series_of, series: list[str],
           xlabel: str = BATCH_LABEL, x_of=None, article=None) -> dict:
    rows = cells(trials, series_of, x_of=x_of, series=series, article=article)
    present = [s for s in series if any(r["series"] == s for r in rows)]
    present += [r["series"] for r in rows if r["series"] not in present]
    present = list(dict.fromkeys(present))
    members = [t for t in trials if series_of(t) is not None]
    return {"name": name, "title": title, "xlabel": xlabel, "series": present, "rows": rows,
            "article": _article_points(rows), "setting": _setting(members),
            "keys": {t.get("key") for t in members}}


def summarize(trials: list[dict]) -> dict:
    """Sort a sweep's trials into the report's figures.

    Returns {"figures": [table, ...], "unused": [trial, ...]}, a table being {"name", "title",
    "xlabel", "series", "rows", "article", "setting", "keys"}. Figures without trials are left out:
    optimizers (article protocol, standard data, by optimizer); augmentation (article protocol,
    Adam, by data set; only with augmented trials); protocols (accumulate 1, by protocol, for
    each optimizer and data set that has a variant); accumulation (by accumulation steps, x the
    effective batch size, where accumulated trials exist)."""
    trials = list(trials)
    article = [t for t in trials if is_article_protocol(t)]
    tables = []

    # 1. the article's first figure
    std = [t for t in article if field(t, "dataset") == "standard"]
    if std:
        sfx = _context_suffixer(std)
        opts = sorted({field(t, "optimizer") for t in std}, key=lambda o: (o != "sgd", o != "adam", o))
        names = [OPTIMIZER_NAMES.get(o, o) for o in opts]

        def by_optimizer(t):
            if not (is_article_protocol(t) and field(t, "dataset") == "standard"):
                return None
            o = field(t, "optimizer")
            return OPTIMIZER_NAMES.get(o, o) + sfx(t)
        tables.append(_table("optimizers", FIGURE_TITLES["optimizers"], std, by_optimizer, names,
                             article=_article_value))

    # 2. the article's second figure (only when there are augmented trials to compare)
    adam = [t for t in article if field(t, "optimizer") == "adam"]
    if any(field(t, "dataset") == "augmented" for t in adam):
        sfx = _context_suffixer(adam)

        def by_dataset(t):
            if not (is_article_protocol(t) and field(t, "optimizer") == "adam"):
                return None
            return f"{field(t, 'dataset')} data" + sfx(t)
        tables.append(_table("augmentation", FIGURE_TITLES["augmentation"], adam, by_dataset,
                             ["standard data", "augmented data"], article=_article_value))

    # 3. beyond the article: other protocols, without accumulation
    plain = [t for t in trials if protocol_of(t)["accumulate"] == 1]
    combos = sorted({(field(t, "optimizer"), field(t, "dataset")) for t in plain
                     if not is_article_protocol(t)}, key=lambda c: (c != ("adam", "standard"), c))
    if combos:
        chosen = [t for t in plain if (field(t, "optimizer"), field(t, "dataset")) in combos]
        sfx = _context_suffixer(chosen)
        many = len(combos) > 1

        def by_protocol(t):
            combo = (field(t, "optimizer"), field(t, "dataset"))
            if protocol_of(t)["accumulate"] != 1 or combo not in combos:
                return None
            prefix = f"{OPTIMIZER_NAMES.get(combo[0], combo[0])}, {combo[1]}: " if many else ""
            return prefix + protocol_label(protocol_of(t)) + sfx(t)
        labels = sorted({by_protocol(t) for t in chosen},
                        key=lambda s: ("article protocol" not in s, s))
        what = ("; ".join(f"{OPTIMIZER_NAMES.get(o, o)}, {d} data" for o, d in combos))
        tables.append(_table("protocols", f"{FIGURE_TITLES['protocols']} ({what})", chosen,
                             by_protocol, labels, article=_article_value))

    # 4. beyond the article: gradient accumulation against the plain batch it stands for
    groups = {(field(t, "optimizer"), field(t, "dataset"), _without_accumulate(protocol_of(t)))
              for t in trials if protocol_of(t)["accumulate"] > 1}
    if groups:
        chosen = [t for t in trials if (field(t, "optimizer"), field(t, "dataset"),
                                        _without_accumulate(protocol_of(t))) in groups]
        sfx = _context_suffixer(chosen)
        many_combos = len({g[:2] for g in groups}) > 1

        def by_accumulation(t):
            g = (field(t, "optimizer"), field(t, "dataset"), _without_accumulate(protocol_of(t)))
            if g not in groups:
                return None
            p = protocol_of(t)
            rest = protocol_label(dict(g[2]), accumulate=False)
            prefix = f"{OPTIMIZER_NAMES.get(g[0], g[0])}, {g[1]}: " if many_combos else ""
            prefix += "" if rest == "article protocol" else f"{rest}: "
            what = "plain batches" if p["accumulate"] == 1 else f"gradient accumulation ×{p['accumulate']}"
            return prefix + what + sfx(t)
        labels = sorted({by_accumulation(t) for t in chosen},
                        key=lambda s: (s.rpartition(": ")[0], "plain batches" not in s, _accum_steps(s), s))
        combos_text = "; ".join(sorted({f"{OPTIMIZER_NAMES.get(o, o)}, {d} data" for o, d, _ in groups}))
        tables.append(_table("accumulation", f"{FIGURE_TITLES['accumulation']} ({combos_text})", chosen,
                             by_accumulation, labels, xlabel=EFFECTIVE_BATCH_LABEL,
                             x_of=lambda t: int(field(t, "batch_size")) * protocol_of(t)["accumulate"],
                             article=_article_value))

    # 5. beyond the article: the learning rate tuned per batch size on validation accuracy
    tuned = tune_learning_rates(trials)
    if tuned["rows"]:
        tables.append(tuned)

    used = set().union(*(tb["keys"] for tb in tables)) if tables else set()
    return {"figures": tables, "unused": [t for t in trials if t.get("key") not in used],
            "collapse": collapse_table(trials), "claims": claims_by_context(trials)}


def _lr(trial: dict) -> float:
    lr = field(trial, "lr")
    return DEFAULT_LR[field(trial, "optimizer")] if lr is None else float(lr)


def _tuning_group(trial: dict) -> tuple:
    """What one learning-rate choice is made within: all but the learning rate and seed."""
    p = dict(protocol_of(trial), lr=None)
    return (field(trial, "optimizer"), field(trial, "dataset"), tuple(p.items()))


def tune_learning_rates(trials: list[dict]) -> dict:
    """For each batch size, the learning rate with the best mean *validation* accuracy over its
    seeds, and that choice's *test* accuracy (never chosen by test accuracy: the test set only
    reports). Groups (optimizer, data set, the rest of the protocol) with one learning rate at
    every batch size are left out: nothing to choose.

    A table like the figures' (rows from `cells`), with two series per group: the tuned choice
    ("Adam, lr tuned per batch size") and, where it was run, the optimizer's default ("Adam,
    default lr 0.001"); plus "choices": one row per (group, batch size, learning rate) with
    its seeds' mean validation and test accuracy and whether it was chosen, and "drops": per
    group, the best batch size and the first larger one clearly below it."""
    plain = [t for t in trials if protocol_of(t)["accumulate"] == 1]
    lrs: dict[tuple, set] = {}
    for t in plain:
        lrs.setdefault((_tuning_group(t), int(field(t, "batch_size"))), set()).add(_lr(t))
    groups = sorted({g for (g, _), v in lrs.items() if len(v) > 1}, key=lambda g: (g[0] != "sgd", g))
    choices, series = [], []
    members: dict[str, list[dict]] = {}  # by series; a default-rate trial may be in both of its group's
    chosen_lr: dict[tuple[str, int], float] = {}  # (tuned series, batch size) -> the rate it trained with
    many = len({g[1] for g in groups}) > 1  # name the data set only where the figure has two
    label_of: dict[tuple, tuple[str, str]] = {}
    for g in groups:
        name = OPTIMIZER_NAMES.get(g[0], g[0])
        rest = protocol_label(dict(g[2]))
        prefix = name + (f", {g[1]} data" if many else "") + ("" if rest == "article protocol" else f", {rest}")
        label_of[g] = tuned, default_rate = (f"{prefix}, lr tuned per batch size",
                                             f"{prefix}, default lr {DEFAULT_LR[g[0]]:g}")
        series += [tuned, default_rate]
        in_group = [t for t in plain if _tuning_group(t) == g]
        for bs in sorted({int(field(t, "batch_size")) for t in in_group}):
            by_lr: dict[float, list[dict]] = {}
            for t in in_group:
                if int(field(t, "batch_size")) == bs:
                    by_lr.setdefault(_lr(t), []).append(t)
            done = {lr: [t for t in ts if t["status"] == "done" and _accuracy(t) is not None]
                    for lr, ts in by_lr.items()}
            scored = {lr: _mean_of(validation_accuracy(t) for t in ts) for lr, ts in done.items()}
            scored = {lr: v for lr, v in scored.items() if v is not None}
            # ties go to the learning rate nearer the optimizer's default (log scale)
            best = max(scored, key=lambda lr: (scored[lr], -abs(math.log(lr / DEFAULT_LR[g[0]]))), default=None)
            for lr in sorted(by_lr):
                choices.append({"series": tuned, "batch_size": bs, "lr": lr, "n_done": len(done[lr]),
                                "val_mean": scored.get(lr),
                                "test_mean": _mean_of(_accuracy(t) for t in done[lr]), "chosen": lr == best})
            if best is not None:
                chosen_lr[(tuned, bs)] = best
                members.setdefault(tuned, []).extend(by_lr[best])
            members.setdefault(default_rate, []).extend(by_lr.get(DEFAULT_LR[g[0]], []))
    # every tuned series, then every default-rate one
    order = [label_of[g][0] for g in groups] + [label_of[g][1] for g in groups]
    rows = [r for s in order for r in cells(members.get(s, []), lambda t, s=s: s)]
    for r in rows:
        r["lr"] = chosen_lr.get((r["series"], r["x"]))
    present = [s for s in series if any(r["series"] == s for r in rows)]
    keys = {t.get("key") for ts in members.values() for t in ts}
    tuned_trials = [t for g in groups for t in members.get(label_of[g][0], [])]
    return {"name": "tuned", "title": FIGURE_TITLES["tuned"], "xlabel": BATCH_LABEL, "series": present,
            "rows": rows, "article": [], "setting": _setting(tuned_trials), "keys": keys,
            "choices": choices, "drops": [_drop(rows, label_of[g][0]) for g in groups]}


def _drop(rows: list[dict], series: str) -> dict:
    """The tuned series' best batch size and the first larger one whose mean is clearly below it
    (Welch interval of the difference below 0), or None if none is."""
    mine = sorted((r for r in rows if r["series"] == series and r["n_done"]), key=lambda r: r["x"])
    if not mine:
        return {"series": series, "best": None, "drop_from": None, "diff": None}
    best = max(mine, key=lambda r: r["mean"])
    for r in mine:
        if r["x"] > best["x"]:
            w = welch(r["accuracies"], best["accuracies"])
            if w["ci_high"] is not None and w["ci_high"] < 0:
                return {"series": series, "best": best["x"], "drop_from": r["x"], "diff": w}
    return {"series": series, "best": best["x"], "drop_from": None, "diff": None}


def collapse_table(trials: list[dict]) -> dict:
    """Collapse rate per cell (optimizer, data set, protocol; by batch size) over the trials whose
    collapse was recorded, as rows of `cells` (collapse_rate and its Wilson interval)."""
    known = [t for t in trials if t.get("collapsed") is not None and t["status"] == "done"]
    sfx = _context_suffixer(known)

    def by_setting(t):
        if t.get("collapsed") is None:
            return None
        name = OPTIMIZER_NAMES.get(field(t, "optimizer"), field(t, "optimizer"))
        rest = protocol_label(protocol_of(t))
        return f"{name}, {field(t, 'dataset')}" + ("" if rest == "article protocol" else f", {rest}") + sfx(t)
    # the article's protocol first (no third part), SGD before Adam, standard before augmented
    labels = sorted({by_setting(t) for t in known},
                    key=lambda s: (s.count(",") > 1, not s.startswith("SGD"), "augmented" in s, s))
    return _table("collapse", FIGURE_TITLES["collapse"], known, by_setting, labels)


def claims_by_context(trials: list[dict]) -> list[dict]:
    """The article's claims (catsdogs.claims) on the sweep's article-protocol cells, one list per
    context (epochs, image size, backend) the sweep has; [] when it has none."""
    out = []
    contexts = claims.article_cells(trials, field, is_article_protocol)
    for (epochs, size, backend), accuracies in sorted(contexts.items(), key=lambda kv: str(kv[0])):
        label = f"{epochs} epochs, {size} px" + (f", {BACKEND_NAMES.get(backend, backend)}" if len(contexts) > 1 else "")
        out.append({"context": label, "results": claims.evaluate_all(accuracies)})
    return out


def _accum_steps(label: str) -> int:
    m = re.search(r"accumulation ×(\d+)", label)
    return int(m.group(1)) if m else 0


def status_counts(rows: list[dict]) -> dict[str, int]:
    """Totals over a table's rows: done, failed, oom, pending, running."""
    return {k: sum(r[f"n_{k}"] for r in rows) for k in ("done", *NOT_DONE)}


def incomplete_note(rows: list[dict]) -> str:
    """'incomplete: 3 pending, 1 running', or '' when nothing is left to run."""
    c = status_counts(rows)
    left = [f"{c[k]} {k}" for k in ("pending", "running") if c[k]]
    return f"incomplete: {', '.join(left)}" if left else ""


def _problems(row: dict) -> str:
    return ", ".join(f"{row[f'n_{k}']} {k}" for k in ("failed", "oom") if row[f"n_{k}"])


# --- drawing ---------------------------------------------------------------------------------


def plot_accuracy(ax, rows: list[dict], series: list[str] | None = None,
                  article: list[dict] | None = None, xlabel: str = BATCH_LABEL,
                  dodge: float = 0.12, spread: float = 0.09, label_accumulated: bool = False) -> dict:
    """Draw accuracy (%) against x on a log2 axis: per series the seeds, the mean and its CI.

    Each series is shifted by `dodge` octaves from its neighbours so that intervals do not hide
    each other; each seed's point by up to ±spread/2 octaves within its cell. Cells with failed
    or out-of-memory trials get a note in the series colour at the bottom of the axis
    ("1 oom"); `article` points ({"series", "x", "value"}) are stars; with label_accumulated,
    accumulated cells are labelled "batch×steps" ("32×8") above their interval. Returns the artists:
    {series: {"mean", "seeds", "ci", "notes", "shift"}, "article": PathCollection or None}."""
    series = list(series or dict.fromkeys(r["series"] for r in rows))
    article = [a for a in (article or []) if a["series"] in series]
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
        px, py = [], []
        for r in done:
            n = len(r["accuracies"])
            for j, acc in enumerate(r["accuracies"]):
                offset = (j / (n - 1) - 0.5) * spread if n > 1 else 0.0
                px.append(r["x"] * shift * 2 ** offset)
                py.append(100 * acc)
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
            for r in done:
                if r["accumulate"] > 1:
                    top = max([r["ci_high"] or r["mean"], *r["accuracies"]])
                    ax.annotate(f"{r['batch_size']}×{r['accumulate']}", (r["x"] * shift, 100 * top),
                                xytext=(0, 4), textcoords="offset points", ha="center", va="bottom",
                                fontsize=8, color=color, zorder=6,
                                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                                      "edgecolor": "none", "alpha": 0.75})
        notes = []
        for r in srows:
            text = _problems(r)
            if text:
                notes.append(ax.text(r["x"] * shift, 0.03 + 0.065 * i, text, color=color,
                                     transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                                     fontsize=8, fontweight="bold", zorder=6,
                                     bbox={"boxstyle": "round,pad=0.2", "facecolor": "white",
                                           "edgecolor": color, "linewidth": 0.8}))
        out[s] = {"mean": mean, "seeds": seeds, "ci": ci, "notes": notes, "shift": shift}
    out["article"] = None
    if article:
        out["article"] = ax.scatter([a["x"] * shifts[a["series"]] for a in article],
                                    [100 * a["value"] for a in article], marker="*", s=190,
                                    c=[colors[a["series"]] for a in article], edgecolors="black",
                                    linewidths=0.9, zorder=7, label=ARTICLE_LABEL)
    ax.axhline(50, color="0.55", linestyle=":", linewidth=1, zorder=1)
    ax.set_xscale("log", base=2)
    if xs:
        ax.set_xticks(xs, labels=[str(x) for x in xs])
        ax.set_xlim(min(xs) / 2 ** 0.45, max(xs) * 2 ** 0.45)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.margins(y=0.18)
    ax.autoscale_view()
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, -2.0), min(high, 104.0))  # accuracy lives in 0..100; notes sit below 0
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(True, axis="x", alpha=0.15)
    handles = [out[s]["mean"] for s in series]
    handles.append(Line2D([], [], linestyle="none", marker="o", color="0.4", alpha=0.5,
                          markersize=5, label="each seed"))
    handles.append(Line2D([], [], linestyle="none", marker="|", color="0.2", markersize=14,
                          markeredgewidth=1.4, label=f"{LEVEL:.0%} CI (Student t on the seeds)"))
    if out["article"] is not None:
        handles.append(out["article"])
    handles.append(Line2D([], [], linestyle=":", color="0.55", label="chance (50%)"))
    out["legend"] = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                              borderaxespad=0.0, fontsize=9, frameon=False)
    return out


def plot_collapse(ax, rows: list[dict], series: list[str] | None = None, dodge: float = 0.12) -> dict:
    """Draw each cell's collapse rate (%) against batch size on a log2 axis, with its Wilson 95%
    interval and "k/n" beside it; one colour per series. Returns {series: {"rate", "ci"}}."""
    series = list(series or dict.fromkeys(r["series"] for r in rows))
    rows = [r for r in rows if r["n_collapse_known"]]
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
    ax.set_xscale("log", base=2)
    if xs:
        ax.set_xticks(xs, labels=[str(x) for x in xs])
        ax.set_xlim(min(xs) / 2 ** 0.45, max(xs) * 2 ** 0.45)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_ylim(-4, 104)
    ax.set_xlabel(BATCH_LABEL)
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
    artists = plot_collapse(ax, table["rows"], series=table["series"])
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
    if c["failed"] or c["oom"]:
        bits.append(", ".join(f"{c[k]} {k}" for k in ("failed", "oom") if c[k]) + " (marked at the bottom)")
    return table["title"] + "\n" + " · ".join(bits)


def make_figure(table: dict, note: str | None = None) -> tuple[Figure, dict]:
    """A whole figure for one table (matplotlib Figure; no pyplot, no global state)."""
    width = 10.5 if max((len(s) for s in table["series"]), default=0) > 28 else 9.5
    fig = Figure(figsize=(width, 5.0), layout="constrained")
    ax = fig.add_subplot()
    artists = plot_accuracy(ax, table["rows"], series=table["series"], article=table["article"],
                            xlabel=table["xlabel"], label_accumulated=table["name"] == "accumulation")
    if table["name"] == "tuned":  # the learning rate each tuned point trained with
        for r in table["rows"]:
            if r.get("lr") is not None and r["n_done"] and "tuned" in r["series"]:
                ax.annotate(f"lr {r['lr']:g}", (r["x"] * artists[r["series"]]["shift"], 100 * r["mean"]),
                            xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7.5,
                            color=artists[r["series"]]["mean"].get_color(), zorder=6)
    ax.set_title(figure_title(table, note), fontsize=10.5, loc="left")
    return fig, artists


# --- tables ----------------------------------------------------------------------------------


def _pct(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{100 * v:.{digits}f}"


def markdown(name: str, summary: dict, note: str | None = None) -> str:
    """results.md: one section per figure, one row per cell."""
    lines = [f"# Sweep `{name}`: results", ""]
    if note:
        lines += [f"*{note}*", ""]
    lines += [
        f"Test accuracy in %, over the seeds of each cell: the mean, its {LEVEL:.0%} confidence "
        "interval (Student t: mean ± t·sd/√n, t the 0.975 quantile with n − 1 degrees of freedom) "
        "and the sample standard deviation (sd, in points). A cell with one finished seed has no "
        "interval (marked n=1). *article*: the value the article reports (its text, one run). "
        "failed / oom / pending / running: trials of the cell that did not finish, or not yet; "
        "none is dropped.", ""]
    lines += claims_markdown(summary.get("claims") or [])
    if not summary["figures"]:
        lines += ["No figure: the sweep has no trial that any figure shows.", ""]
    for table in summary["figures"]:
        lines += [f"## {table['name']}", "", table["title"] + (f" · {table['setting']}" if table["setting"] else ""), "",
                  f"![{table['name']}](figures/{table['name']}.png)", ""]
        left = incomplete_note(table["rows"])
        if left:
            lines += [f"**{left}.**", ""]
        x_name = "effective batch" if table["name"] == "accumulation" else "batch size"
        head = ["series", x_name, "n done", "mean", "95% CI low", "95% CI high", "sd",
                "failed", "oom", "pending", "running", "article"]
        if table["name"] == "accumulation":
            head.insert(2, "batch × steps")
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
        for r in table["rows"]:
            if r["n_done"] == 1:
                low = high = "— (n=1)"
            else:
                low, high = _pct(r["ci_low"]), _pct(r["ci_high"])
            cols = [r["series"], str(r["x"]), str(r["n_done"]), _pct(r["mean"]), low, high,
                    _pct(r["sd"], 2), *(str(r[f"n_{k}"]) for k in NOT_DONE), _pct(r["article"])]
            if table["name"] == "accumulation":
                cols.insert(2, f"{r['batch_size']} × {r['accumulate']}")
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |")
        if table["name"] == "tuned":
            lines += tuned_markdown(table)
        errors = sorted({e.strip().splitlines()[-1][:160] for r in table["rows"] for e in r["errors"] if e.strip()})
        if errors:
            lines += ["", "Errors of the failed / out-of-memory trials:", ""]
            lines += [f"- `{e}`" for e in errors]
        lines.append("")
    lines += collapse_markdown(summary.get("collapse"))
    lines += adaptive_markdown(summary.get("adaptive"))
    unused = summary["unused"]
    if unused:
        kinds: dict[str, int] = {}
        for t in unused:
            what = (f"{field(t, 'optimizer')}, {field(t, 'dataset')} data, "
                    f"{protocol_label(protocol_of(t))}, status {t['status']}")
            kinds[what] = kinds.get(what, 0) + 1
        lines += ["## Not in any figure", "",
                  f"{len(unused)} trials of this sweep belong to none of the figures above:", ""]
        lines += [f"- {n} × {what}" for what, n in sorted(kinds.items())]
        lines.append("")
    return "\n".join(lines)


def claims_markdown(contexts: list[dict]) -> list[str]:
    if not contexts:
        return []
    lines = ["## The article's claims", "",
             "Each claim of the article compares cells of its protocol. The difference of two cells' mean "
             f"test accuracies (points) has Welch's {LEVEL:.0%} interval (unequal spreads and numbers of "
             "seeds; see catsdogs/stats.py). **supported**: the interval lies wholly on the claimed side; "
             "**contradicted**: wholly on the other; **unsettled**: it straddles the line, so more seeds "
             f"are needed. A \"sharp\" drop is more than {claims.SHARP:g} points; \"still good\" is less than "
             f"{claims.SHARP:g} points below; \"optimal\" is above every other batch size of the optimizer "
             "(shown: against its strongest rival). Seeds: the cell's, then the compared cells'.", ""]
    for ctx in contexts:
        if len(contexts) > 1:
            lines += [f"### {ctx['context']}", ""]
        lines += claims.markdown_table(ctx["results"]) + [""]
        lines += [f"- {claims.sentence(r)}" for r in ctx["results"]] + [""]
    return lines


def tuned_markdown(table: dict) -> list[str]:
    lines = ["", "Every learning rate tried, per batch size: mean validation accuracy (what chooses) and "
             "mean test accuracy (what the figure reports), over finished seeds; ✓ the choice.", "",
             "| series | batch size | lr | n done | validation | test | chosen |", "|---|---|---|---|---|---|---|"]
    for c in table["choices"]:
        lines.append(f"| {c['series']} | {c['batch_size']} | {c['lr']:g} | {c['n_done']} | {_pct(c['val_mean'])} "
                     f"| {_pct(c['test_mean'])} | {'✓' if c['chosen'] else ''} |")
    lines.append("")
    for d in table["drops"]:
        if d["best"] is None:
            continue
        if d["drop_from"] is None:
            lines.append(f"- {d['series']}: best at batch size {d['best']}; no larger batch size is clearly "
                         "below it (every Welch interval of the difference reaches 0).")
        else:
            w = d["diff"]
            lines.append(f"- {d['series']}: best at batch size {d['best']}; the drop remains from "
                         f"{d['drop_from']}: {100 * w['diff']:+.1f} points (95% interval {100 * w['ci_low']:+.1f} "
                         f"to {100 * w['ci_high']:+.1f}).")
    return lines


def collapse_markdown(table: dict | None) -> list[str]:
    if not table or not table["rows"]:
        return []
    lines = ["## Collapses", "", "A run **collapses** when its trained model predicts one class for every "
             "test image (50% accuracy on the balanced test set). Rate: collapsed runs of those recorded, "
             f"with Wilson's {LEVEL:.0%} interval; accuracy of the runs that did not collapse beside it; "
             "dead units: the mean share of the Dense(128) layer's ReLU units that output 0 for every "
             "test image after training.", "", "![collapse](figures/collapse.png)", "",
             "| series | batch size | runs | collapsed | rate % | 95% CI | accuracy, not collapsed | 95% CI | dead units % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        ci = f"{_pct(r['collapse_ci_low'], 0)}–{_pct(r['collapse_ci_high'], 0)}"
        ok_ci = ("—" if r["not_collapsed_ci_low"] is None else
                 f"{_pct(r['not_collapsed_ci_low'])}–{_pct(r['not_collapsed_ci_high'])}")
        lines.append(f"| {r['series']} | {r['x']} | {r['n_collapse_known']} | {r['n_collapsed']} | "
                     f"{_pct(r['collapse_rate'], 0)} | {ci} | {_pct(r['not_collapsed_mean'])} | {ok_ci} | "
                     f"{_pct(r['dead_units'], 0)} |")
    return [*lines, ""]


def adaptive_state(trials: list[dict], adaptive: dict | None) -> dict | None:
    """Where each cell of an adaptive-seeds sweep stands ({"target_ci", "max_seeds", "cells"})."""
    if not adaptive:
        return None
    from catsdogs.schema import TrialConfig

    grid = [TrialConfig.from_dict(t["config"]) for t in trials if t.get("config")]
    state = seeds.next_seeds(grid, {t["key"]: t for t in trials}, adaptive["target_ci"], adaptive["max_seeds"])
    return {**adaptive, "cells": state["cells"]}


def adaptive_markdown(state: dict | None) -> list[str]:
    if not state:
        return []
    cells_ = state["cells"]
    met = sum(1 for c in cells_.values() if c["state"] == "met")
    lines = ["## Adaptive seeds", "", f"Target: every cell's 95% interval within ±{state['target_ci']:g} points, "
             f"with at most {state['max_seeds']} seeds. {met} of {len(cells_)} cells meet it."]
    short = [(cell, c) for cell, c in cells_.items() if c["state"] != "met"]
    if short:
        lines += ["", "Cells that do not meet it:", "", "| cell | seeds | half-width (points) | why |", "|---|---|---|---|"]
        why = {"max-seeds": f"reached --max-seeds ({state['max_seeds']})", "more": "still running (seeds to add)"}
        for cell, c in short:
            half = "—" if c["half_width"] is None else f"{c['half_width']:.1f}"
            lines.append(f"| {cell.label().replace(' seed=0', '')} | {c['seeds']} | {half} | {why.get(c['state'], c['state'])} |")
    return [*lines, ""]


def csv_text(summary: dict) -> str:
    """summary.csv: the rows of every figure, one per cell, with a `figure` column."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for table in summary["figures"]:
        for r in table["rows"]:
            row = {k: r.get(k) for k in CSV_COLUMNS}
            row["figure"] = table["name"]
            row["accuracies"] = ";".join(f"{a:.6g}" for a in r["accuracies"])
            row["seeds"] = ";".join(str(s) for s in r["seeds"])
            for k in ("mean", "ci_low", "ci_high", "ci_half_width", "sd", "t", "article", "collapse_rate",
                      "collapse_ci_low", "collapse_ci_high", "not_collapsed_mean", "val_mean", "lr"):
                row[k] = "" if r.get(k) is None else f"{r[k]:.6g}"
            w.writerow(row)
    return buf.getvalue()


# --- writing ---------------------------------------------------------------------------------


def report(name: str, out: Path | str = config.DEFAULT_OUT, note: str | None = None,
           log: Callable[[str], None] = print) -> dict:
    """Write the figures and tables of sweep `name` from OUT/results.sqlite; return the paths:
    {"figures": {figure: {"png": path, "svg": path}}, "results_md": path, "summary_csv": path}."""
    out = Path(out)
    trials = load_trials(out / config.STORE_FILE, name)
    if note is None and data_source_kind(out / config.STORE_FILE, name) == "synthetic":
        note = "synthetic data"  # a figure from the stand-in data set always says so
    summary = summarize(trials)
    with Store(out / config.STORE_FILE) as store:
        summary["adaptive"] = adaptive_state(trials, (store.sweep_config(name) or {}).get("adaptive"))
    folder = out / name
    paths: dict = {"figures": {}}
    for table in summary["figures"]:
        fig, _ = make_figure(table, note)
        paths["figures"][table["name"]] = save_figure(fig, folder / "figures" / table["name"])
        c = status_counts(table["rows"])
        extra = "".join(f", {c[k]} {k}" for k in NOT_DONE if c[k])
        log(f"{table['name']}: {len(table['rows'])} cells, {c['done']} trials done{extra} -> "
            f"{paths['figures'][table['name']]['png']} (and .svg)")
    if summary["collapse"]["rows"]:
        fig, _ = make_collapse_figure(summary["collapse"], note)
        paths["figures"]["collapse"] = save_figure(fig, folder / "figures" / "collapse")
        log(f"collapse: {len(summary['collapse']['rows'])} cells -> {paths['figures']['collapse']['png']} (and .svg)")
    for ctx in summary["claims"]:
        verdicts = [r["verdict"] for r in ctx["results"]]
        log(f"claims ({ctx['context']}): " + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)))
    if not summary["figures"]:
        log(f"no figure: none of the {len(trials)} trials of {name!r} belongs to one")
    if summary["unused"]:
        log(f"{len(summary['unused'])} trials are in no figure (listed in results.md)")
    paths["results_md"] = write_text_atomic(folder / "results.md", markdown(name, summary, note))
    paths["summary_csv"] = write_text_atomic(folder / "summary.csv", csv_text(summary))
    log(f"tables: {paths['results_md']}, {paths['summary_csv']}")
    return paths
