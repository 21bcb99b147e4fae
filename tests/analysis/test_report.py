"""The report: figures and tables of a sweep, from a results store built by hand (no training):
loading (rows), cells and figures (tables), drawing (plots), files (report)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from catsdogs import stats
from catsdogs.analysis import plots, tables
from catsdogs.analysis import report as rp
from catsdogs.analysis.rows import load_trials
from catsdogs.analysis.summary import summarize
from catsdogs.errors import CatsdogsError
from catsdogs.messages import TrialRecord
from catsdogs.store import Store

T_975_DF2 = 4.303  # Student t, 0.975 quantile, 2 degrees of freedom (any statistics table)


def config(optimizer="adam", batch_size=32, dataset="standard", seed=0, **protocol) -> dict:
    c = {"optimizer": optimizer, "batch_size": batch_size, "dataset": dataset, "seed": seed,
         "epochs": 5, "image_size": 200, "data": "fp", "lr": None, "lr_scaling": "none",
         "base_batch_size": 32, "warmup_epochs": 0.0, "budget": "epochs", "accumulate": 1,
         "precision": "float32", "strategy": "none"}
    c.update(protocol)
    return c


def build_store(out: Path, name: str, outcomes: list[tuple[dict, str, float | None]]) -> Path:
    """A store holding sweep `name`: each (config, status, accuracy) as a trial in that state."""
    path = out / "results.sqlite"
    with Store(path) as store:
        keys = store.register_sweep(name, {}, [c for c, _, _ in outcomes])
        for key, (_, status, acc) in zip(keys, outcomes, strict=True):
            if status == "pending":
                continue
            assert store.claim([key])["key"] == key
            if status == "running":
                continue
            error = "ResourceExhaustedError: OOM when allocating tensor" if status == "oom" else None
            assert store.finish(key, TrialRecord(status=status, test_accuracy=acc, error=error))
    return path


def rows_of(summary: dict, figure: str) -> list[dict]:
    return next(t["rows"] for t in summary["figures"] if t["name"] == figure)


def row(rows: list[dict], series: str, x: int) -> dict:
    return next(r for r in rows if r["series"] == series and r["x"] == x)


@pytest.fixture
def article_sweep(tmp_path: Path) -> Path:
    """SGD and Adam on standard data, Adam on augmented data; one oom, one pending, 3 seeds."""
    outcomes = []
    for bs, accs in {16: (0.60, 0.70, 0.80), 32: (0.61, 0.63, 0.65)}.items():
        for seed, a in enumerate(accs):
            outcomes.append((config("sgd", bs, seed=seed), "done", a))
            outcomes.append((config("adam", bs, seed=seed), "done", a + 0.02))
    outcomes += [(config("adam", 64, seed=s), "done", 0.66 + 0.01 * s) for s in range(3)]
    outcomes += [(config("sgd", 64, seed=0), "oom", None), (config("sgd", 64, seed=1), "done", 0.55),
                 (config("sgd", 64, seed=2), "pending", None)]
    outcomes += [(config("adam", bs, "augmented", seed=s), "done", 0.55 + 0.01 * s)
                 for bs in (128, 256) for s in range(2)]
    outcomes += [(config("adam", 256, "augmented", seed=2), "failed", None)]
    build_store(tmp_path, "article", outcomes)
    return tmp_path


# --- statistics ---------------------------------------------------------------------------------


def test_given_known_degrees_of_freedom_when_t_quantile_then_matches_the_tables():
    # given: two-sided 95% values from a printed t table, and the normal limit
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 9: 2.262, 29: 2.045, 30: 2.042, 120: 1.980}
    # when / then
    for df, expected in table.items():
        assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)
    assert stats.t_quantile(0.975, 10**6) == pytest.approx(1.95996, abs=1e-4)


def test_given_three_values_when_mean_ci_then_it_is_the_hand_computed_student_interval():
    # given: 0.6, 0.7, 0.8: mean 0.7, sd 0.1
    # when
    s = stats.mean_ci([0.6, 0.7, 0.8])
    # then: half-width t_{0.975,2} * sd / sqrt(3)
    half = T_975_DF2 * 0.1 / math.sqrt(3)
    assert s["mean"] == pytest.approx(0.7)
    assert s["sd"] == pytest.approx(0.1)
    assert s["ci_half_width"] == pytest.approx(half, rel=1e-3)
    assert (s["ci_low"], s["ci_high"]) == (pytest.approx(0.7 - half, rel=1e-3), pytest.approx(0.7 + half, rel=1e-3))


def test_given_one_value_when_mean_ci_then_there_is_a_mean_and_no_interval():
    s = stats.mean_ci([0.55])
    assert s["mean"] == 0.55 and s["ci_low"] is None and s["ci_high"] is None and s["sd"] is None


# --- loading ------------------------------------------------------------------------------------


def test_given_an_unknown_sweep_when_report_then_a_one_line_error_lists_the_sweeps(article_sweep):
    with pytest.raises(CatsdogsError) as e:
        rp.report("nope", article_sweep, log=lambda _: None)
    assert "'nope'" in str(e.value) and "article" in str(e.value) and "\n" not in str(e.value)


def test_given_no_store_when_report_then_catsdogs_error_and_no_store_created(tmp_path):
    with pytest.raises(CatsdogsError, match="no results store"):
        rp.report("any", tmp_path / "empty", log=lambda _: None)
    assert not (tmp_path / "empty" / "results.sqlite").exists()


# --- tables -------------------------------------------------------------------------------------


def test_given_the_article_sweep_when_summarized_then_cells_have_the_right_statistics(article_sweep):
    # given
    trials = load_trials(article_sweep / "results.sqlite", "article")
    # when
    summary = summarize(trials)
    # then: the two article figures, no protocol figures
    assert [t["name"] for t in summary["figures"]] == ["optimizers", "augmentation"]
    opt = rows_of(summary, "optimizers")
    assert [(r["series"], r["x"]) for r in opt] == [
        ("SGD", 16), ("SGD", 32), ("SGD", 64), ("Adam", 16), ("Adam", 32), ("Adam", 64)]
    sgd16 = row(opt, "SGD", 16)
    assert sgd16["n_done"] == 3 and sgd16["accuracies"] == [0.60, 0.70, 0.80]
    assert sgd16["mean"] == pytest.approx(0.7)
    assert sgd16["ci_half_width"] == pytest.approx(T_975_DF2 * 0.1 / math.sqrt(3), rel=1e-3)
    assert sgd16["article"] == 0.62 and row(opt, "Adam", 64)["article"] == 0.67
    # the oom and the pending trial are counted, the done one alone gives a mean, no interval
    sgd64 = row(opt, "SGD", 64)
    assert (sgd64["n_done"], sgd64["n_oom"], sgd64["n_pending"]) == (1, 1, 1)
    assert sgd64["mean"] == pytest.approx(0.55) and sgd64["ci_low"] is None
    aug = rows_of(summary, "augmentation")
    assert {r["series"] for r in aug} == {"standard data", "augmented data"}
    assert row(aug, "augmented data", 256)["n_failed"] == 1
    assert row(aug, "augmented data", 128)["article"] == 0.58
    assert row(aug, "augmented data", 256)["article"] == 0.575
    assert summary["unused"] == []


def test_given_the_article_sweep_when_report_then_every_file_is_written(article_sweep):
    # when
    paths = rp.report("article", article_sweep, note="synthetic data", log=lambda _: None)
    # then: PNG + SVG per figure, results.md, summary.csv, no temporary file left behind
    folder = article_sweep / "article"
    for fig in ("optimizers", "augmentation"):
        for fmt in ("png", "svg"):
            p = folder / "figures" / f"{fig}.{fmt}"
            assert paths["figures"][fig][fmt] == p and p.stat().st_size > 1000
    assert (folder / "figures" / "optimizers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["results_md"] == folder / "results.md"
    assert not list(folder.rglob(".*.tmp"))
    # summary.csv: one row per cell of every figure
    with open(paths["summary_csv"]) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 + 5  # optimizers: 2 x 3 cells; augmentation: 3 + 2
    sgd16 = next(r for r in table if r["figure"] == "optimizers" and r["series"] == "SGD" and r["batch_size"] == "16")
    assert float(sgd16["mean"]) == pytest.approx(0.7)
    assert float(sgd16["ci_high"]) == pytest.approx(0.7 + T_975_DF2 * 0.1 / math.sqrt(3), rel=1e-3)
    assert sgd16["article"] == "0.62" and sgd16["accuracies"] == "0.6;0.7;0.8"
    sgd64 = next(r for r in table if r["series"] == "SGD" and r["batch_size"] == "64")
    assert (sgd64["n_oom"], sgd64["n_pending"], sgd64["ci_low"]) == ("1", "1", "")
    # results.md: a section per figure, the oom counted, the n=1 cell said to have no interval
    md = paths["results_md"].read_text()
    assert "## optimizers" in md and "## augmentation" in md and "synthetic data" in md
    assert "| SGD | 64 | 1 | 55.0 | — (n=1) | — (n=1) | — | 0 | 1 | 1 | 0 | 0 | — |" in md
    assert "| SGD | 16 | 3 | 70.0 | 45.2 | 94.8 | 10.00 | 0 | 0 | 0 | 0 | 0 | 62.0 |" in md
    assert "incomplete: 1 pending" in md and "OOM when allocating" in md


# --- figures ------------------------------------------------------------------------------------


def test_given_the_optimizers_table_when_drawn_then_series_points_intervals_and_labels_are_right(article_sweep):
    # given
    table = summarize(load_trials(article_sweep / "results.sqlite", "article"))["figures"][0]
    # when
    fig, art = plots.make_figure(table, note="synthetic data")
    ax = fig.axes[0]
    # then: x is log2 with the batch sizes as tick labels
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "32", "64"]
    assert list(ax.get_xticks()) == [16, 32, 64]
    # the means: one line per optimizer, y in %, x at the batch sizes (shifted apart a little)
    sgd = art["SGD"]["mean"]
    assert sgd.get_label() == "SGD"
    assert np.allclose(sgd.get_ydata(), [70.0, 63.0, 55.0])
    assert np.allclose(np.log2(sgd.get_xdata()) - np.log2(art["SGD"]["shift"]), [4, 5, 6])
    assert np.allclose(art["Adam"]["mean"].get_ydata(), [72.0, 65.0, 67.0])
    # every seed is a point: 3 + 3 + 1 for SGD, near its cell's x
    offsets = art["SGD"]["seeds"].get_offsets()
    assert len(offsets) == 7
    assert sorted(np.round(offsets[:, 1], 6)) == sorted([60.0, 70, 80, 61, 63, 65, 55])
    assert np.all(np.abs(np.log2(offsets[:, 0]) - np.round(np.log2(offsets[:, 0]))) < 0.25)
    # the interval of SGD at 16: 70 ± 4.303 * 10 / sqrt(3); none for the n=1 cell at 64
    segments = art["SGD"]["ci"].lines[2][0].get_segments()
    assert len(segments) == 2
    low, high = sorted(segments[0][:, 1])
    half = 100 * T_975_DF2 * 0.1 / math.sqrt(3)
    assert (low, high) == (pytest.approx(70 - half, rel=1e-3), pytest.approx(70 + half, rel=1e-3))
    # the oom at SGD 64 is written on the figure
    assert [t.get_text() for t in art["SGD"]["notes"]] == ["1 oom"]
    assert "1 oom" in [t.get_text() for t in ax.texts]
    # the article's points: stars labelled as single runs, at 62% (SGD 16) and 67% (Adam 64)
    stars = art["article"]
    assert stars.get_label() == plots.ARTICLE_LABEL == "article (single run)"
    assert sorted(stars.get_offsets()[:, 1]) == [pytest.approx(62.0), pytest.approx(67.0)]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:2] == ["SGD", "Adam"] and "article (single run)" in legend
    assert any("95% CI" in t for t in legend)
    # the title says what data, the note, and that a trial is still pending
    title = ax.get_title(loc="left")
    assert "SGD and Adam, standard data" in title and "synthetic data" in title
    assert "incomplete: 1 pending" in title and "1 oom" in title
    # and the backend every trial ran on (these rows name none: Keras's default, TensorFlow)
    assert "Keras on TensorFlow" in title


def test_given_rows_when_plot_accuracy_on_any_axis_then_it_draws_there():
    # given: two cells of one series, built by hand
    rows = tables.cells([
        {"key": k, "status": "done", "test_accuracy": a, "optimizer": "adam", "dataset": "standard",
         "batch_size": bs, "seed": s, "config": {}}
        for k, (bs, s, a) in enumerate([(32, 0, 0.6), (32, 1, 0.7), (32, 2, 0.8), (128, 0, 0.5)])
    ], series_of=lambda t: ((), "Adam"))
    ax = Figure().add_subplot()
    # when
    art = plots.plot_accuracy(ax, {"rows": rows})
    # then
    assert np.allclose(art["Adam"]["mean"].get_ydata(), [70.0, 50.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32", "128"]
    assert art["article"] is None


# --- beyond the article -------------------------------------------------------------------------


@pytest.fixture
def protocol_sweep(tmp_path: Path) -> Path:
    """Adam, standard data: the article's protocol, linear scaling, steps budget, both, and
    gradient accumulation (32 x 8) next to plain batch 256."""
    outcomes = []
    for bs in (32, 256):
        for s in range(2):
            outcomes.append((config("adam", bs, seed=s), "done", 0.65 if bs == 32 else 0.55))
            outcomes.append((config("adam", bs, seed=s, lr_scaling="linear"), "done", 0.66))
            outcomes.append((config("adam", bs, seed=s, budget="steps"), "done", 0.64))
            outcomes.append((config("adam", bs, seed=s, lr_scaling="linear", budget="steps"), "done", 0.63))
    outcomes += [(config("adam", 32, seed=s, accumulate=8), "done", 0.58) for s in range(2)]
    build_store(tmp_path, "beyond", outcomes)
    return tmp_path


def test_given_protocol_variants_when_summarized_then_only_the_article_protocol_is_in_its_figures(protocol_sweep):
    # when
    summary = summarize(load_trials(protocol_sweep / "results.sqlite", "beyond"))
    # then: no augmented data, so no augmentation figure; the variants get their own figures
    assert [t["name"] for t in summary["figures"]] == ["optimizers", "protocols", "accumulation"]
    opt = rows_of(summary, "optimizers")
    assert [(r["series"], r["x"], r["n_done"]) for r in opt] == [("Adam", 32, 2), ("Adam", 256, 2)]
    assert [r["mean"] for r in opt] == [pytest.approx(0.65), pytest.approx(0.55)]
    prot = next(t for t in summary["figures"] if t["name"] == "protocols")
    # in the order of their data: the article's protocol, then by option (lr scaling, then budget)
    assert prot["series"] == ["article protocol", "equal updates (steps budget)",
                              "linear lr scaling", "linear lr + equal updates"]
    assert row(prot["rows"], "linear lr scaling", 256)["mean"] == pytest.approx(0.66)
    assert "Adam, standard data" in prot["title"]
    # accumulation: x is the effective batch size; 32 x 8 sits at 256 next to plain 256
    acc = rows_of(summary, "accumulation")
    accumulated = row(acc, "gradient accumulation ×8", 256)
    assert (accumulated["batch_size"], accumulated["accumulate"], accumulated["mean"]) == (32, 8, pytest.approx(0.58))
    assert row(acc, "plain batches", 256)["mean"] == pytest.approx(0.55)
    assert summary["unused"] == []


def test_given_protocol_variants_when_report_then_protocols_figure_has_one_series_each(protocol_sweep):
    # when
    paths = rp.report("beyond", protocol_sweep, log=lambda _: None)
    summary = summarize(load_trials(protocol_sweep / "results.sqlite", "beyond"))
    fig, art = plots.make_figure(next(t for t in summary["figures"] if t["name"] == "protocols"))
    # then
    assert set(paths["figures"]) == {"optimizers", "protocols", "accumulation"}
    assert paths["figures"]["accumulation"]["svg"].exists()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:4] == ["article protocol", "equal updates (steps budget)",
                          "linear lr scaling", "linear lr + equal updates"]
    # side by side: each series shifted to its own x near the batch size
    xs = [art[s]["mean"].get_xdata()[0] for s in legend[:4]]
    assert xs == sorted(xs) and len(set(xs)) == 4 and all(abs(math.log2(x) - 5) < 0.3 for x in xs)
    # accumulation: the accumulated cell says which batch and steps make its effective batch
    acc_fig, _ = plots.make_figure(next(t for t in summary["figures"] if t["name"] == "accumulation"))
    assert "32×8" in [t.get_text() for t in acc_fig.axes[0].texts]
    assert acc_fig.axes[0].get_xlabel().startswith("effective batch size")
    with open(paths["summary_csv"]) as f:
        figures = [r["figure"] for r in csv.DictReader(f)]
    assert figures.count("optimizers") == 2 and figures.count("protocols") == 8
    assert figures.count("accumulation") == 3


def test_given_a_trial_in_no_figure_when_report_then_results_md_lists_it(tmp_path):
    # given: SGD on augmented data is in neither of the article's figures
    build_store(tmp_path, "odd", [(config("adam", 32), "done", 0.6),
                                  (config("sgd", 32, "augmented"), "done", 0.5)])
    # when
    lines = []
    paths = rp.report("odd", tmp_path, log=lines.append)
    # then: said, not dropped silently
    assert "## Not in any figure" in paths["results_md"].read_text()
    assert any("1 trials are in no figure" in line for line in lines)


def test_given_one_backend_the_subtitle_names_it_and_given_two_each_series_does(tmp_path):
    # given Adam on JAX alone, then Adam on both backends in one sweep
    jax_only = [(config("adam", bs, seed=s, backend="jax"), "done", 0.6 + 0.01 * s) for bs in (16, 32) for s in range(2)]
    tf = [(config("adam", bs, seed=s), "done", 0.7) for bs in (16, 32) for s in range(2)]
    build_store(tmp_path / "one", "one", jax_only)
    build_store(tmp_path / "two", "two", jax_only + tf)
    # when each is summarized and drawn
    one = next(t for t in summarize(load_trials(tmp_path / "one" / "results.sqlite", "one"))["figures"]
               if t["name"] == "optimizers")
    two = next(t for t in summarize(load_trials(tmp_path / "two" / "results.sqlite", "two"))["figures"]
               if t["name"] == "optimizers")
    # then one backend is named once, in the subtitle; two are named per series, not in the subtitle
    assert one["setting"] == "5 epochs, 200 px, Keras on JAX" and one["series"] == ["Adam"]
    assert "Keras on" not in two["setting"] and sorted(two["series"]) == ["Adam, JAX", "Adam, TensorFlow"]
    fig, _ = plots.make_figure(one)
    assert "Keras on JAX" in fig.axes[0].get_title(loc="left")
