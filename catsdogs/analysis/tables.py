"""A sweep's trials sorted into the report's figures, as tables: pure functions, no I/O.

A **table** is one figure's data: {"name", "title", "xlabel", "series", "rows", "article",
"setting", "keys"}, its rows one per (series, x) cell (`Cell`, as a dict), its series in the
order of their trials' data (rows.trial_order: SGD before Adam, the article's protocol first),
never of their labels. One function per figure (`optimizers_table`, ...) and the collapse table;
catsdogs.analysis.summary makes them all, with the learning rate tuned per batch size
(catsdogs.analysis.tuning), the claims and the noise scale.

Accuracies are fractions (0..1) here and in summary.csv; the figures and results.md show
percentages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields

from catsdogs.analysis.rows import (
    BACKEND_NAMES,
    OPTIMIZER_NAMES,
    accuracy,
    is_article_protocol,
    mean_of,
    protocol_label,
    protocol_of,
    setting_of,
    trial_order,
    validation_accuracy,
    without_accumulate,
)
from catsdogs.analysis.rows import (
    field as field_of,
)
from catsdogs.schema import UNFINISHED, Status, process_words
from catsdogs.stats import mean_ci, wilson

# What the article reports, read from its text (docs/protocol.md, "The two figures"): each value is
# one training run, so it has no spread. "About 62%" etc., as fractions of the 400 test images.
# Keyed by (optimizer, dataset, batch size); all with the article's protocol, 5 epochs.
ARTICLE_ACCURACY: dict[tuple[str, str, int], float] = {
    ("sgd", "standard", 16): 0.62,  # "SGD about 62% at batch size 16"
    ("adam", "standard", 64): 0.67,  # "Adam still about 67% around batch size 64"
    ("adam", "augmented", 128): 0.58,  # "with augmented data, 58% at batch size 128"
    ("adam", "augmented", 256): 0.575,  # "... and 57.5% at 256"
}
FIGURE_TITLES = {
    "optimizers": "Test accuracy vs batch size: SGD and Adam, standard data",
    "augmentation": "Test accuracy vs batch size: standard and augmented data, Adam",
    "protocols": "Test accuracy vs batch size by training protocol",
    "accumulation": "Test accuracy vs effective batch size: plain and accumulated batches",
    "tuned": "Test accuracy vs batch size, the learning rate tuned per batch size on validation accuracy",
    "collapse": "Collapse rate vs batch size: runs whose model predicts one class for every test image",
}
BATCH_LABEL = "batch size (log2 scale)"
EFFECTIVE_BATCH_LABEL = "effective batch size = batch size × accumulation steps (log2 scale)"


def _csv(**metadata):
    """A cell field that is a column of summary.csv."""
    return field(default=None, metadata={"csv": True, **metadata})


@dataclass
class Cell:
    """One (series, x) cell of a figure: who is in it, how each trial ended, and the statistics
    over its finished seeds. The fields marked csv are summary.csv's columns, in this order."""

    series: str | None = _csv()
    optimizer: str | None = _csv()
    dataset: str | None = _csv()
    protocol: str | None = _csv()
    epochs: int | None = _csv()
    image_size: int | None = _csv()
    batch_size: int | None = _csv()
    accumulate: int | None = _csv()
    effective_batch_size: int | None = _csv()
    n_done: int = _csv()
    mean: float | None = _csv()
    ci_low: float | None = _csv()
    ci_high: float | None = _csv()
    ci_half_width: float | None = _csv()
    sd: float | None = _csv()
    t: float | None = _csv()
    n_failed: int = _csv()  # a trial marked done without an accuracy counts here, never dropped
    n_oom: int = _csv()
    n_pending: int = _csv()
    n_interrupted: int = _csv()  # running when its sweep process died: the next sweep runs it again
    n_running: int = _csv()
    article: float | None = _csv()  # the article's value for the cell, if it reports one
    # collapses: the trained model predicts one class for every test image (recorded since 0.5.0)
    n_collapse_known: int = _csv()
    n_collapsed: int = _csv()
    collapse_rate: float | None = _csv()
    collapse_ci_low: float | None = _csv()
    collapse_ci_high: float | None = _csv()
    not_collapsed_mean: float | None = _csv()
    val_mean: float | None = _csv()
    lr: float | None = _csv()  # the learning rate a tuned cell trained with
    accuracies: list | None = _csv()  # each finished seed's, by seed
    seeds: list | None = _csv()
    x: int | None = None  # where the cell is drawn: its batch size, or its effective batch size
    n_trials: int = 0
    errors: list | None = None
    n_not_collapsed: int = 0
    not_collapsed_ci_low: float | None = None
    not_collapsed_ci_high: float | None = None
    dead_units: float | None = None  # the mean share of dead Dense(128) units after training


CELL_CSV_COLUMNS = [f.name for f in fields(Cell) if f.metadata.get("csv")]

Series = tuple[tuple, str]  # (order, label): a series' place among the others, and its name


def cells(trials: Iterable[dict], series_of: Callable[[dict], Series | None],
          x_of: Callable[[dict], int] | None = None,
          article: Callable[[dict], float | None] | None = None) -> list[dict]:
    """One row (a Cell, as a dict) per (series, x) cell.

    series_of(trial): the trial's series as (order, label), or None to leave it out; x_of(trial):
    its x (the batch size unless told); article(trial): the article's value for its cell, if any.
    Rows come in the order of their series (the least order among its trials), then of x."""
    x_of = x_of or (lambda t: int(field_of(t, "batch_size")))
    groups: dict[tuple[str, int], list[dict]] = {}
    order: dict[str, tuple] = {}
    for t in trials:
        s = series_of(t)
        if s is not None:
            key, label = s
            order[label] = min(order.get(label, key), key)
            groups.setdefault((label, x_of(t)), []).append(t)
    return [_cell(label, x, members, article)
            for (label, x), members in sorted(groups.items(), key=lambda kv: (order[kv[0][0]], kv[0][1]))]


def _cell(label: str, x: int, members: list[dict], article) -> dict:
    first = members[0]
    p = protocol_of(first)
    status = [m["status"] for m in members]
    finished = [m for m in members if m["status"] == Status.DONE and accuracy(m) is not None]
    finished.sort(key=lambda m: (field_of(m, "seed", 0), m.get("key") or ""))
    no_accuracy = sum(1 for m in members if m["status"] == Status.DONE and accuracy(m) is None)
    stats = mean_ci(accuracy(m) for m in finished)
    known = [m for m in finished if m.get("collapsed") is not None]
    collapsed = sum(int(m["collapsed"]) for m in known)
    rate = wilson(collapsed, len(known))
    kept = mean_ci(accuracy(m) for m in known if not m["collapsed"])
    batch_size = int(field_of(first, "batch_size"))
    return asdict(Cell(
        series=label, x=x, optimizer=field_of(first, "optimizer"), dataset=field_of(first, "dataset"),
        protocol=protocol_label(p), epochs=field_of(first, "epochs"), image_size=field_of(first, "image_size"),
        batch_size=batch_size, accumulate=p["accumulate"], effective_batch_size=batch_size * p["accumulate"],
        n_trials=len(members), n_done=stats["n"],
        n_failed=status.count(Status.FAILED) + no_accuracy, n_oom=status.count(Status.OOM),
        n_pending=status.count(Status.PENDING), n_interrupted=status.count(Status.INTERRUPTED),
        n_running=status.count(Status.RUNNING),
        mean=stats["mean"], sd=stats["sd"], t=stats["t"], ci_low=stats["ci_low"], ci_high=stats["ci_high"],
        ci_half_width=stats["ci_half_width"],
        accuracies=[accuracy(m) for m in finished], seeds=[field_of(m, "seed") for m in finished],
        errors=[m.get("error") for m in members
                if m["status"] in (Status.FAILED, Status.OOM) and m.get("error")],
        article=article(first) if article else None,
        n_collapse_known=rate["n"], n_collapsed=collapsed, collapse_rate=rate["rate"],
        collapse_ci_low=rate["ci_low"], collapse_ci_high=rate["ci_high"],
        n_not_collapsed=kept["n"], not_collapsed_mean=kept["mean"],
        not_collapsed_ci_low=kept["ci_low"], not_collapsed_ci_high=kept["ci_high"],
        dead_units=mean_of(m.get("dead_units") for m in known),
        val_mean=mean_of(validation_accuracy(m) for m in finished)))


def article_value(trial: dict) -> float | None:
    """What the article reports for the trial's cell (under its protocol), if anything."""
    if not is_article_protocol(trial):
        return None
    return ARTICLE_ACCURACY.get((field_of(trial, "optimizer"), field_of(trial, "dataset"),
                                 int(field_of(trial, "batch_size"))))


def context_suffixer(trials: list[dict]) -> Callable[[dict], str]:
    """Labels gain ", 3 epochs" (or px, data, backend) only where the figure mixes several of
    them: trials that differ in these never share a cell."""
    varying = [k for k in ("epochs", "image_size", "backend", "deterministic", "tf32")
               if len({setting_of(t, k) for t in trials}) > 1]
    # Each data set has its own fingerprint; only two fingerprints of one data set are worth a label.
    if any(len({field_of(t, "data") for t in trials if field_of(t, "dataset") == d}) > 1
           for d in {field_of(t, "dataset") for t in trials}):
        varying.append("data")
    units = {"epochs": lambda v: f"{v} epochs", "image_size": lambda v: f"{v} px",
             "data": lambda v: f"data {str(v)[:8]}", "backend": lambda v: BACKEND_NAMES.get(v, v),
             "deterministic": lambda v: process_words(v, None, defaults=True)[0],
             "tf32": lambda v: process_words(True, v, defaults=True)[1]}

    def suffix(t: dict) -> str:
        return "".join(", " + units[k](setting_of(t, k)) for k in varying)
    return suffix


def setting(trials: list[dict]) -> str:
    """What all of a figure's trials share, for its subtitle: "5 epochs, 200 px, Keras on JAX"
    (a figure that mixes backends names each series' backend instead: `context_suffixer`)."""
    bits = []
    for key, unit in (("epochs", "epochs"), ("image_size", "px")):
        values = {field_of(t, key) for t in trials}
        if len(values) == 1 and None not in values:
            bits.append(f"{values.pop()} {unit}")
    backends = {setting_of(t, "backend") for t in trials}
    if len(backends) == 1:
        backend = backends.pop()
        bits.append(f"Keras on {BACKEND_NAMES.get(backend, backend)}")
    for name in ("deterministic", "tf32"):  # named when off their defaults, and shared by all
        values = {setting_of(t, name) for t in trials}
        if len(values) == 1:
            value = values.pop()
            bits += process_words(value, None) if name == "deterministic" else process_words(True, value)
    return ", ".join(bits)


def _table(name: str, title: str, trials: list[dict], series_of, xlabel: str = BATCH_LABEL,
           x_of=None, article=None) -> dict:
    rows = cells(trials, series_of, x_of=x_of, article=article)
    members = [t for t in trials if series_of(t) is not None]
    return {"name": name, "title": title, "xlabel": xlabel, "series": list(dict.fromkeys(r["series"] for r in rows)),
            "rows": rows, "article": [{"series": r["series"], "x": r["x"], "value": r["article"]}
                                      for r in rows if r["article"] is not None],
            "setting": setting(members), "keys": {t.get("key") for t in members}}


def _name(trial: dict) -> str:
    o = field_of(trial, "optimizer")
    return OPTIMIZER_NAMES.get(o, o)


def _combos_text(combos) -> str:
    """"SGD, standard data; Adam, augmented data": the (optimizer, data set) pairs a figure holds,
    in the order of their data."""
    shown = sorted(combos, key=lambda c: trial_order({"optimizer": c[0], "dataset": c[1]}))
    return "; ".join(f"{OPTIMIZER_NAMES.get(o, o)}, {d} data" for o, d in shown)


# --- the figures ------------------------------------------------------------------------------------
# Each takes every trial of a sweep and gives its figure's table, or None when the sweep has no
# trial for it; catsdogs.analysis.summary makes them all.


def optimizers_table(trials: list[dict]) -> dict | None:
    """The article's first figure: its protocol, standard data, a series per optimizer."""
    std = [t for t in trials if is_article_protocol(t) and field_of(t, "dataset") == "standard"]
    if not std:
        return None
    sfx = context_suffixer(std)

    def by_optimizer(t):
        if not (is_article_protocol(t) and field_of(t, "dataset") == "standard"):
            return None
        return trial_order(t), _name(t) + sfx(t)
    return _table("optimizers", FIGURE_TITLES["optimizers"], std, by_optimizer, article=article_value)


def augmentation_table(trials: list[dict]) -> dict | None:
    """The article's second figure: its protocol, Adam, a series per data set (only when there
    are augmented trials to compare)."""
    adam = [t for t in trials if is_article_protocol(t) and field_of(t, "optimizer") == "adam"]
    if not any(field_of(t, "dataset") == "augmented" for t in adam):
        return None
    sfx = context_suffixer(adam)

    def by_dataset(t):
        if not (is_article_protocol(t) and field_of(t, "optimizer") == "adam"):
            return None
        return trial_order(t), f"{field_of(t, 'dataset')} data" + sfx(t)
    return _table("augmentation", FIGURE_TITLES["augmentation"], adam, by_dataset, article=article_value)


def protocols_table(trials: list[dict]) -> dict | None:
    """Beyond the article: other protocols, without accumulation, for each optimizer and data set
    that has a variant."""
    plain = [t for t in trials if protocol_of(t)["accumulate"] == 1]
    combos = {(field_of(t, "optimizer"), field_of(t, "dataset")) for t in plain if not is_article_protocol(t)}
    if not combos:
        return None
    chosen = [t for t in plain if (field_of(t, "optimizer"), field_of(t, "dataset")) in combos]
    sfx = context_suffixer(chosen)
    many = len(combos) > 1

    def by_protocol(t):
        combo = (field_of(t, "optimizer"), field_of(t, "dataset"))
        if protocol_of(t)["accumulate"] != 1 or combo not in combos:
            return None
        prefix = f"{_name(t)}, {combo[1]}: " if many else ""
        return trial_order(t), prefix + protocol_label(protocol_of(t)) + sfx(t)
    return _table("protocols", f"{FIGURE_TITLES['protocols']} ({_combos_text(combos)})", chosen,
                  by_protocol, article=article_value)


def accumulation_table(trials: list[dict]) -> dict | None:
    """Beyond the article: gradient accumulation against the plain batch it stands for, x the
    effective batch size, where accumulated trials exist."""
    def group_of(t):
        return field_of(t, "optimizer"), field_of(t, "dataset"), tuple(without_accumulate(protocol_of(t)).items())
    groups = {group_of(t) for t in trials if protocol_of(t)["accumulate"] > 1}
    if not groups:
        return None
    chosen = [t for t in trials if group_of(t) in groups]
    sfx = context_suffixer(chosen)
    many_combos = len({g[:2] for g in groups}) > 1

    def by_accumulation(t):
        g = group_of(t)
        if g not in groups:
            return None
        p = protocol_of(t)
        rest = protocol_label(dict(g[2]), accumulate=False)
        prefix = f"{_name(t)}, {g[1]}: " if many_combos else ""
        prefix += "" if rest == "article protocol" else f"{rest}: "
        what = "plain batches" if p["accumulate"] == 1 else f"gradient accumulation ×{p['accumulate']}"
        return trial_order(t, dict(g[2])) + (p["accumulate"],), prefix + what + sfx(t)
    combos_text = _combos_text({g[:2] for g in groups})
    return _table("accumulation", f"{FIGURE_TITLES['accumulation']} ({combos_text})", chosen, by_accumulation,
                  xlabel=EFFECTIVE_BATCH_LABEL,
                  x_of=lambda t: int(field_of(t, "batch_size")) * protocol_of(t)["accumulate"], article=article_value)


# --- collapses, and a table's counts ---------------------------------------------------------------


def collapse_table(trials: list[dict]) -> dict:
    """Collapse rate per cell (optimizer, data set, protocol; by batch size) over the trials whose
    collapse was recorded, as rows of `cells` (collapse_rate and its Wilson interval): the
    article's protocol first."""
    known = [t for t in trials if t.get("collapsed") is not None and t["status"] == Status.DONE]
    sfx = context_suffixer(known)

    def by_setting(t):
        if t.get("collapsed") is None:
            return None
        rest = protocol_label(protocol_of(t))
        label = f"{_name(t)}, {field_of(t, 'dataset')}" + ("" if rest == "article protocol" else f", {rest}")
        return (not is_article_protocol(t), *trial_order(t)), label + sfx(t)
    return _table("collapse", FIGURE_TITLES["collapse"], known, by_setting)


def status_counts(rows: list[dict]) -> dict[str, int]:
    """Totals over a table's rows: done, failed, oom, pending, running."""
    return {k: sum(r[f"n_{k}"] for r in rows) for k in (Status.DONE, *UNFINISHED)}


def incomplete_note(rows: list[dict]) -> str:
    """'incomplete: 3 pending, 1 interrupted, 1 running', or '' when nothing is left to run."""
    c = status_counts(rows)
    left = [f"{c[k]} {k}" for k in (Status.PENDING, Status.INTERRUPTED, Status.RUNNING) if c[k]]
    return f"incomplete: {', '.join(left)}" if left else ""


def problems(row: dict) -> str:
    """'1 failed, 2 oom': the cell's trials that did not finish well."""
    return ", ".join(f"{row[f'n_{k}']} {k}" for k in (Status.FAILED, Status.OOM) if row[f"n_{k}"])
