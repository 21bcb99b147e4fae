"""The report of one sweep: its figures and tables, from the results store and nothing else.

    rows (loading a sweep's trials) -> summary (pure: every table once: tables' figures and
    collapses, tuning, claims, critical's noise scale) -> plots (figures from tables) and
    markdown (results.md, summary.csv) -> report (writing)

`report(name, out)` writes OUT/NAME/figures/*.png|svg, OUT/NAME/results.md and
OUT/NAME/summary.csv, each atomically. Nothing in catsdogs.analysis imports Keras, TensorFlow,
JAX or catsdogs.training: a report is made on any machine that has the store
(tests/architecture/test_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from catsdogs import config
from catsdogs.analysis import tensorboard_export, to_target
from catsdogs.analysis.markdown import csv_text, markdown
from catsdogs.analysis.plots import (
    make_collapse_figure,
    make_critical_figure,
    make_figure,
    make_noise_figure,
    make_time_figure,
)
from catsdogs.analysis.rows import data_source_kind, load_trials, sweep_config
from catsdogs.analysis.summary import summarize
from catsdogs.analysis.tables import status_counts
from catsdogs.analysis.time_to_target import load_find_results
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.files import new_or_ours, write_text_atomic
from catsdogs.plotting import save_figure
from catsdogs.schema import UNFINISHED, Status
from catsdogs.store import Store, is_store_copy, store_path


def report(name: str, out: Path | str = config.DEFAULT_OUT, note: str | None = None,
           log: Callable[[str], None] = print, find_results: list[Path] | None = None,
           tensorboard: bool = False) -> dict:
    """Write the figures and tables of sweep `name` from OUT/results.sqlite; return the paths:
    {"figures": {figure: {"png": path, "svg": path}}, "results_md": path, "summary_csv": path}.
    Trials run until a target are held against find-batch-size's results: `find_results`, else
    every OUT/*/find_batch_size.json (catsdogs.analysis.time_to_target). `tensorboard`: every
    trial as a TensorBoard run too (catsdogs.analysis.tensorboard_export), the hint first when
    the tensorboard package is missing."""
    if tensorboard:
        tensorboard_export.check_installed()
    out = Path(out)
    trials = load_trials(store_path(out), name)
    recorded = sweep_config(store_path(out), name)
    if note is None and data_source_kind(recorded) == "synthetic":
        note = "synthetic data"  # a figure from the stand-in data set always says so
    found = load_find_results(out, find_results) if any(to_target.has_target(t) for t in trials) else []
    summary = summarize(trials, recorded, found)
    folder = out / name
    paths: dict = {"figures": {}}
    for table in summary["figures"]:
        fig, _ = make_figure(table, note)
        paths["figures"][table["name"]] = save_figure(fig, folder / "figures" / table["name"])
        c = status_counts(table["rows"])
        extra = "".join(f", {c[k]} {k}" for k in UNFINISHED if c[k])
        log(f"{table['name']}: {len(table['rows'])} cells, {c[Status.DONE]} trials done{extra} -> "
            f"{paths['figures'][table['name']]['png']} (and .svg)")
    if summary["collapse"]["rows"]:
        fig, _ = make_collapse_figure(summary["collapse"], note)
        paths["figures"]["collapse"] = save_figure(fig, folder / "figures" / "collapse")
        log(f"collapse: {len(summary['collapse']['rows'])} cells -> {paths['figures']['collapse']['png']} (and .svg)")
    noise_table = summary["noise"]
    if noise_table["panels"]:
        fig, _ = make_noise_figure(noise_table, note)
        paths["figures"]["noise"] = save_figure(fig, folder / "figures" / "noise")
        log(f"noise: {noise_table['measured']} of {noise_table['done']} finished trials measured -> "
            f"{paths['figures']['noise']['png']} (and .svg)")
    if noise_table["measured"] and noise_table["missing"]:
        log(f"noise: {len(noise_table['missing'])} cells lack the measurement (results.md says how to get it)")
    if summary["to_target"]:
        fig, _ = make_critical_figure(summary["to_target"], note)
        paths["figures"]["critical_measured"] = save_figure(fig, folder / "figures" / "critical_measured")
        for t in summary["to_target"]:
            c = t["claim"]
            log(f"critical batch size measured ({t['label']}, {t['target'].describe()}): B_crit "
                f"{t['fit'].describe() if t['fit'] else 'not fitted'}; the noise scale's prediction {c['verdict']}")
    timed = summary["time_to_target"]
    if timed["rows"]:
        fig, _ = make_time_figure(timed["rows"], note)
        paths["figures"]["time_to_target"] = save_figure(fig, folder / "figures" / "time_to_target")
        for c in timed["rows"]:
            ratio = f"T(recommended {c['recommended']})/T(best {c['best']}) {c['ratio']:.2f}" if c["ratio"] is not None else c["why"]
            log(f"time to the target ({c['label']}, {c['context']}) against {c['path']}: {ratio}, {c['verdict']}")
    for path in timed["unmatched"]:
        log(f"time to the target: {path} matches no series of {name!r} (another model, optimizer, data, size or backend)")
    for ctx in summary["claims"]:
        verdicts = [r["verdict"] for r in ctx["results"]]
        log(f"claims ({ctx['context']}): " + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)))
    for ctx in summary["critical"]:
        log(f"critical batch size ({ctx['context']}): "
            + "; ".join(f"{r['series']}: {r['verdict_text']}" for r in ctx["results"]))
    if not paths["figures"]:  # none drawn: the article's, nor the collapse, noise or critical ones
        log(f"no figure: none of the {len(trials)} trials of {name!r} belongs to one")
    if summary["unused"]:
        log(f"{len(summary['unused'])} trials are in no figure (listed in results.md)")
    paths["results_md"] = write_text_atomic(folder / "results.md", markdown(name, summary, note))
    paths["summary_csv"] = write_text_atomic(folder / "summary.csv", csv_text(summary))
    log(f"tables: {paths['results_md']}, {paths['summary_csv']}")
    if tensorboard:
        paths["tensorboard"] = tensorboard_export.export_trials(trials, folder / "tensorboard", log)
    return paths


def export_store(out: Path | str, path: Path | str, log: Callable[[str], None] = print) -> Path:
    """OUT/results.sqlite, with what its write-ahead log holds, copied to one self-contained SQLite
    file at `path` (catsdogs.store.Store.export_copy); the store itself is only read."""
    source, path = store_path(out), Path(path)
    if not source.is_file():
        raise CatsdogsError(f"no results store at {source}: run `catsdogs sweep` first (or give the --out it used)")
    if path.resolve() in {source.resolve(), *(source.with_name(source.name + x).resolve() for x in ("-wal", "-shm"))}:
        raise SettingError(f"--export-store {path} is the store itself: give another file", "export_store")
    path = new_or_ours(path, "--export-store", is_store_copy, "a store copy")
    with Store(source, read_only=True) as store:
        store.export_copy(path)
    log(f"store: {source} (with its write-ahead log) copied to {path}")
    return path
