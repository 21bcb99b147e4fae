"""The statistics of the claims, collapses and the tuned learning rate, on constructed stores whose
answers are known: a clear difference is supported, a reversed one contradicted, two seeds
unsettled, a missing cell not run, a cell of collapses has rate 1, and the learning rate is
chosen by validation accuracy, never by test accuracy."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from test_report import config as report_config

from catsdogs import stats
from catsdogs.analysis import claims, plots, tuning
from catsdogs.analysis import report as rp
from catsdogs.analysis.rows import load_trials
from catsdogs.analysis.summary import summarize
from catsdogs.cli import cli
from catsdogs.messages import TrialRecord
from catsdogs.store import Store

T_975_DF4 = 2.776  # Student t, 0.975 quantile, 4 degrees of freedom (any statistics table)


def config(optimizer="adam", batch_size=32, dataset="standard", seed=0, **protocol) -> dict:
    return report_config(optimizer, batch_size, dataset, seed, **{"image_size": 64, **protocol})


def build_store(out: Path, name: str, trials: list[tuple[dict, dict]]) -> Path:
    """A store holding sweep `name`: each (config, record) finished with that record."""
    with Store(out / "results.sqlite") as store:
        keys = store.register_sweep(name, {}, [c for c, _ in trials])
        for key, (_, record) in zip(keys, trials, strict=True):
            assert store.claim([key])["key"] == key
            assert store.finish(key, TrialRecord(status="done", **record))
    return out


def cell(optimizer, batch_size, accuracies, dataset="standard", **extra) -> list[tuple[dict, dict]]:
    return [(config(optimizer, batch_size, dataset, seed=s), {"test_accuracy": a, **extra})
            for s, a in enumerate(accuracies)]


def verdicts(out: Path, name: str) -> dict[str, dict]:
    summary = summarize(load_trials(out / "results.sqlite", name))
    (context,) = summary["claims"]
    return {r["claim"].id: r for r in context["results"]}


# --- the statistics ---------------------------------------------------------------------------


def test_given_equal_spreads_and_sizes_when_welch_then_it_is_the_student_interval_with_4_df():
    # given two samples of 3 with variance 1 each: se = sqrt(2/3), Welch df = 4 exactly
    w = stats.welch([1, 2, 3], [4, 5, 6])
    assert w["diff"] == pytest.approx(-3.0) and w["df"] == 4
    assert w["se"] == pytest.approx((2 / 3) ** 0.5)
    half = T_975_DF4 * (2 / 3) ** 0.5
    assert w["ci_low"] == pytest.approx(-3 - half, abs=2e-3) and w["ci_high"] == pytest.approx(-3 + half, abs=2e-3)


def test_given_unequal_spreads_when_welch_then_df_falls_towards_the_noisier_sample():
    # given one tight sample and one wide one, then df is near the wide sample's n - 1, rounded down
    w = stats.welch([0.80, 0.80, 0.81, 0.80, 0.81], [0.5, 0.9, 0.5, 0.9, 0.7])
    assert w["df"] == 4
    # and one seed on a side gives a difference but no interval
    one = stats.welch([0.8], [0.7, 0.75])
    assert one["diff"] == pytest.approx(0.075) and one["ci_low"] is None


def test_given_seeds_that_agree_exactly_when_welch_with_a_test_set_then_the_interval_is_never_narrower_than_its_noise():
    # given two cells whose 3 seeds all collapsed to exactly 50% on 400 test images
    a, b = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
    # then without the test set's size Welch's interval is a point, and with it the binomial floor:
    # each side's sd at least sqrt(0.25 / 400) = 2.5 points, so se = sqrt(2 * 0.025² / 3)
    assert stats.welch(a, b)["ci_low"] == stats.welch(a, b)["ci_high"] == 0
    w = stats.welch(a, b, n_test=400)
    assert w["se"] == pytest.approx((2 * 0.025**2 / 3) ** 0.5) and w["df"] == 4
    assert w["ci_low"] == pytest.approx(-T_975_DF4 * w["se"], abs=1e-3) and w["ci_high"] == -w["ci_low"]
    # and a spread wider than the floor is Welch's own
    wide = [0.4, 0.5, 0.6]
    assert stats.welch(wide, wide, n_test=400)["se"] == stats.welch(wide, wide)["se"]


def test_given_two_cells_collapsed_at_50_percent_when_a_claim_compares_them_then_it_is_not_settled():
    # given the claim "Adam at 16 is no more than 5 points below Adam at 32" on seeds that agree exactly
    claim = next(c for c in claims.CLAIMS if c.kind == "above" and c.threshold == -5)
    acc = {claim.cell: [0.5, 0.5], **{other: [0.5, 0.5] for other in claim.versus}}
    # then with the 400 test images' floor, two seeds each leave it open (±10.8 points: t = 4.30 on 2 df)
    assert claims.evaluate(claim, acc)["verdict"] == claims.SUPPORTED  # a zero-width interval would settle it
    assert claims.evaluate(claim, acc, n_test=400)["verdict"] == claims.UNSETTLED


def test_given_known_counts_when_wilson_then_matches_the_published_bounds():
    # Wilson 95% bounds (Newcombe 1998, table I): 0/10 -> 0-0.2775, 3/10 -> 0.1078-0.6032
    assert stats.wilson(0, 10)["ci_low"] == 0 and stats.wilson(0, 10)["ci_high"] == pytest.approx(0.2775, abs=1e-4)
    w = stats.wilson(3, 10)
    assert (w["ci_low"], w["ci_high"]) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    assert stats.wilson(10, 10)["ci_high"] == 1 and stats.wilson(10, 10)["ci_low"] == pytest.approx(0.7225, abs=1e-4)
    assert stats.wilson(0, 0)["rate"] is None


# --- claims -----------------------------------------------------------------------------------


def test_given_a_clear_difference_when_claims_then_supported(tmp_path):
    # given SGD clearly better at 16 than at 32, 5 seeds each
    build_store(tmp_path, "s", cell("sgd", 16, [0.80, 0.81, 0.82, 0.80, 0.81])
                + cell("sgd", 32, [0.70, 0.71, 0.69, 0.70, 0.72]))
    result = verdicts(tmp_path, "s")["sgd-falls"]
    # then "SGD falls from 16 to 32" is supported, with the difference and its interval
    assert result["verdict"] == claims.SUPPORTED
    assert result["diff"] == pytest.approx(-10.4, abs=0.01) and result["ci_high"] < 0


def test_given_a_reversed_difference_when_claims_then_contradicted(tmp_path):
    # given SGD clearly *better* at 32 than at 16
    build_store(tmp_path, "s", cell("sgd", 16, [0.70, 0.71, 0.69, 0.70, 0.72])
                + cell("sgd", 32, [0.80, 0.81, 0.82, 0.80, 0.81]))
    result = verdicts(tmp_path, "s")["sgd-falls"]
    assert result["verdict"] == claims.CONTRADICTED and result["ci_low"] > 0


def test_given_two_seeds_each_when_claims_then_unsettled_with_2_seeds(tmp_path):
    # given 2 seeds a cell, 3 points apart on average with the spread of real runs
    build_store(tmp_path, "s", cell("sgd", 16, [0.70, 0.76]) + cell("sgd", 32, [0.69, 0.71]))
    result = verdicts(tmp_path, "s")["sgd-falls"]
    assert result["verdict"] == claims.UNSETTLED
    assert result["verdict_text"] == "unsettled with 2 seeds"
    assert result["ci_low"] < 0 < result["ci_high"]


def test_given_missing_cells_when_claims_then_not_run_rows_name_them(tmp_path):
    # given a sweep of SGD alone
    build_store(tmp_path, "s", cell("sgd", 16, [0.7, 0.72]) + cell("sgd", 32, [0.6, 0.62]))
    results = verdicts(tmp_path, "s")
    # then every Adam claim is "not run", naming the cells it lacks
    assert results["adam-drop-128"]["verdict"] == claims.NOT_RUN
    assert "Adam at 128" in results["adam-drop-128"]["verdict_text"]
    assert results["sgd-best-16"]["verdict"] == claims.NOT_RUN  # 64 and 128 were not run


def test_given_a_rival_clearly_better_when_best_claim_then_contradicted_and_the_rival_shown(tmp_path):
    adam = (cell("adam", 16, [0.85, 0.86, 0.85, 0.84]) + cell("adam", 32, [0.80, 0.82, 0.81, 0.80])
            + cell("adam", 64, [0.75, 0.76, 0.74, 0.75]) + cell("adam", 128, [0.6, 0.5, 0.7, 0.5]))
    build_store(tmp_path, "s", adam)
    results = verdicts(tmp_path, "s")
    # then "64 is Adam's optimum" is contradicted, shown against 16 (the strongest rival)
    assert results["adam-best-64"]["verdict"] == claims.CONTRADICTED
    assert results["adam-best-64"]["versus"] == ("adam", "standard", 16)
    # and "Adam still good at 64" (within 5 points of 16) is contradicted too: 10 points below
    assert results["adam-good-64"]["verdict"] == claims.CONTRADICTED


def test_given_claims_when_report_then_results_md_has_the_table_and_a_sentence_each(tmp_path):
    build_store(tmp_path, "s", cell("sgd", 16, [0.80, 0.81, 0.82]) + cell("sgd", 32, [0.70, 0.71, 0.69]))
    result = CliRunner().invoke(cli, ["report", "--name", "s", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "claims (5 epochs, 64 px): 1 supported, 7 not run" in result.output
    md = (tmp_path / "s" / "results.md").read_text()
    assert "## The article's claims" in md
    for claim in claims.CLAIMS:
        assert f"- *{claim.says}*:" in md  # one plain sentence per claim
    assert "SGD at 32 is 11.0 points below SGD at 16" in md and "**supported**" in md


# --- collapses --------------------------------------------------------------------------------


def test_given_a_cell_of_collapses_when_summarized_then_rate_1_and_no_surviving_accuracy(tmp_path):
    collapsed = {"collapsed": 1, "dead_units": 1.0, "dog_share": 0.0}
    build_store(tmp_path, "s", cell("adam", 256, [0.5, 0.5, 0.5], **collapsed)
                + [(config("adam", 128, seed=s), {"test_accuracy": a, "collapsed": c, "dead_units": 0.5})
                   for s, (a, c) in enumerate([(0.5, 1), (0.8, 0), (0.84, 0), (0.5, 1)])])
    table = summarize(load_trials(tmp_path / "results.sqlite", "s"))["collapse"]
    at = {r["x"]: r for r in table["rows"]}
    assert at[256]["collapse_rate"] == 1 and at[256]["n_collapsed"] == 3 and at[256]["collapse_ci_high"] == 1
    assert at[256]["n_not_collapsed"] == 0 and at[256]["not_collapsed_mean"] is None
    # and a mixed cell: rate 1/2, the survivors' mean apart
    assert at[128]["collapse_rate"] == 0.5 and at[128]["not_collapsed_mean"] == pytest.approx(0.82)
    # when reported, then the collapse figure and its table are written
    rp.report("s", tmp_path, log=lambda *a: None)
    assert (tmp_path / "s" / "figures" / "collapse.png").stat().st_size > 0
    assert "| Adam, standard | 256 | 3 | 3 | 100 |" in (tmp_path / "s" / "results.md").read_text()


def test_given_rows_when_plot_collapse_then_rates_and_wilson_bars_are_drawn():
    from matplotlib.figure import Figure

    rows = [{"series": "Adam, standard", "x": x, "n_collapse_known": 4, "n_collapsed": k,
             "collapse_rate": k / 4, **{f"collapse_ci_{s}": v for s, v in zip(
                 ("low", "high"), (stats.wilson(k, 4)["ci_low"], stats.wilson(k, 4)["ci_high"]), strict=True)}}
            for x, k in ((64, 0), (128, 2), (256, 4))]
    ax = Figure().add_subplot()
    artists = plots.plot_collapse(ax, {"rows": rows})
    assert list(artists["Adam, standard"]["rate"].get_ydata()) == [0, 50, 100]
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.texts] == ["0/4", "2/4", "4/4"]


# --- the learning rate tuned per batch size ----------------------------------------------------


def test_given_several_learning_rates_when_tuned_then_chosen_by_validation_not_test(tmp_path):
    def lr_cell(bs, lr, val, test):
        return [(config("adam", bs, seed=s, lr=lr), {"test_accuracy": test + 0.01 * s, "val_accuracy": val})
                for s in range(3)]
    # given at 16: the default has the better *test* accuracy, 0.002 the better validation accuracy
    trials = lr_cell(16, None, 0.80, 0.85) + lr_cell(16, 0.002, 0.85, 0.70)
    # and at 128: only a larger learning rate trains (validation 0.75 against 0.5)
    trials += lr_cell(128, None, 0.50, 0.50) + lr_cell(128, 0.004, 0.75, 0.76)
    build_store(tmp_path, "s", trials)
    table = next(t for t in summarize(load_trials(tmp_path / "results.sqlite", "s"))["figures"]
                 if t["name"] == "tuned")
    tuned = {r["x"]: r for r in table["rows"] if r["series"] == "Adam, lr tuned per batch size"}
    # then the tuned curve has 0.002 at 16 (reporting its test accuracy) and 0.004 at 128
    assert tuned[16]["lr"] == 0.002 and tuned[16]["mean"] == pytest.approx(0.71)
    assert tuned[128]["lr"] == 0.004 and tuned[128]["mean"] == pytest.approx(0.77)
    default = {r["x"]: r for r in table["rows"] if r["series"] == "Adam, default lr 0.001"}
    assert default[16]["mean"] == pytest.approx(0.86)
    # and every candidate is listed with its validation and test means, one chosen per batch size
    assert sum(c["chosen"] for c in table["choices"]) == 2 and len(table["choices"]) == 4
    # and no drop: 128 is above 16 on the tuned curve
    assert table["drops"] == [{"series": "Adam, lr tuned per batch size", "best": 128, "drop_from": None,
                               "diff": None}]
    rp.report("s", tmp_path, log=lambda *a: None)
    assert (tmp_path / "s" / "figures" / "tuned.png").exists()


def test_a_tuned_choice_on_the_edge_of_its_grid_is_marked_in_the_table_and_the_figure(tmp_path):
    def lr_cell(bs, lr, val):
        return [(config("adam", bs, seed=s, lr=lr), {"test_accuracy": val, "val_accuracy": val}) for s in range(2)]
    # given three rates at each batch size: at 16 the middle one is best, at 128 the highest
    trials = lr_cell(16, 0.0005, 0.70) + lr_cell(16, None, 0.80) + lr_cell(16, 0.002, 0.75)
    trials += lr_cell(128, 0.0005, 0.60) + lr_cell(128, None, 0.65) + lr_cell(128, 0.002, 0.75)
    build_store(tmp_path, "s", trials)
    table = next(t for t in summarize(load_trials(tmp_path / "results.sqlite", "s"))["figures"]
                 if t["name"] == "tuned")
    # then the choice at 128 is marked as the highest rate tried, the one at 16 is not
    chosen = {c["batch_size"]: c for c in table["choices"] if c["chosen"]}
    assert chosen[16]["edge"] is None and chosen[128]["edge"] == "highest"
    tuned = {r["x"]: r for r in table["rows"] if r["series"] == "Adam, lr tuned per batch size"}
    assert tuned[16]["lr_edge"] is None and tuned[128]["lr_edge"] == "highest"
    # and the report says so in its table and on the figure
    rp.report("s", tmp_path, log=lambda *a: None)
    md = (tmp_path / "s" / "results.md").read_text()
    assert md.count("at the edge of the grid, widen it") == 1
    assert "1 of the choices sit at the edge of their grid" in md
    fig, _ = plots.make_figure(table)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "lr 0.002\n(grid edge)" in labels and "lr 0.001" in labels


def test_two_backends_never_share_a_tuned_choice(tmp_path):
    def lr_cell(bs, lr, val, backend):
        return [(config("adam", bs, seed=s, lr=lr, backend=backend), {"test_accuracy": val, "val_accuracy": val})
                for s in range(2)]
    # given the same grid on TensorFlow, where 0.002 validates best, and on JAX, where the default does
    trials = [*lr_cell(16, None, 0.70, "tensorflow"), *lr_cell(16, 0.002, 0.80, "tensorflow"),
              *lr_cell(16, None, 0.90, "jax"), *lr_cell(16, 0.002, 0.60, "jax")]
    build_store(tmp_path, "s", trials)
    table = next(t for t in summarize(load_trials(tmp_path / "results.sqlite", "s"))["figures"]
                 if t["name"] == "tuned")
    # then each backend has its own tuned series, its own choice, named by its context
    tuned = {r["series"]: r for r in table["rows"] if "tuned" in r["series"]}
    assert {s: r["lr"] for s, r in tuned.items()} == {
        "Adam, lr tuned per batch size (5 epochs, 64 px, TensorFlow)": 0.002,
        "Adam, lr tuned per batch size (5 epochs, 64 px, JAX)": 0.001}
    assert all(r["n_done"] == 2 for r in tuned.values())


def test_the_edge_of_a_grid():
    assert tuning.grid_edge(0.01, [0.001, 0.003, 0.01]) == "highest"
    assert tuning.grid_edge(0.001, [0.001, 0.003, 0.01]) == "lowest"
    assert tuning.grid_edge(0.003, [0.001, 0.003, 0.01]) is None
    assert tuning.grid_edge(0.001, [0.001]) is None  # one rate: no grid to be on the edge of
    assert tuning.grid_edge(None, [0.001, 0.01]) is None


def test_given_one_learning_rate_when_summarized_then_no_tuned_figure(tmp_path):
    build_store(tmp_path, "s", cell("adam", 16, [0.8, 0.82]) + cell("adam", 32, [0.8, 0.81]))
    names = [t["name"] for t in summarize(load_trials(tmp_path / "results.sqlite", "s"))["figures"]]
    assert "tuned" not in names
