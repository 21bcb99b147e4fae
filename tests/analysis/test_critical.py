"""The noise scale in a sweep: recorded without changing a trial's identity, summarized over
seeds, drawn, and the paper's critical-batch-size prediction tested as a claim. Rows are made
by hand, as the store gives them: nothing trains here."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from catsdogs import gradient_noise
from catsdogs.analysis import critical
from catsdogs.analysis.markdown import markdown
from catsdogs.analysis.plots import make_noise_figure
from catsdogs.analysis.summary import summarize
from catsdogs.cli import cli
from catsdogs.gradient_noise import pool
from catsdogs.schema import Status, TrialConfig
from catsdogs.training.sweep import SweepSettings


def measured(v) -> gradient_noise.NoiseEstimate:
    """A measurement as a trial makes it: eight pairs whose ratio is v (a number), or whose
    mean |G|^2 is below zero (v = (None, scale): the noise dominated)."""
    if isinstance(v, tuple):
        return gradient_noise.from_pairs([-0.5, 0.3] * 4, [v[1]] * 8, floor=16, small=1, large=16)
    return gradient_noise.from_pairs([0.9, 1.1] * 4, [0.9 * v, 1.1 * v] * 4, floor=16, small=1, large=16)


def row(opt="adam", bs=16, seed=0, acc=0.85, val=(0.7, 0.8, 0.85), noise_at=(20.0, 40.0, 60.0, 80.0),
        lr=None, dataset="standard") -> dict:
    """A finished trial as the store gives it: `val` is its validation accuracy per epoch,
    `noise_at` its B_simple at epochs 0.. (None: not measured; (None, s): the noise dominated)."""
    cfg = TrialConfig(opt, bs, dataset, seed, epochs=len(val), image_size=64, data="d", lr=lr)
    history = [{"epoch": e + 1, "loss": 0.5, "accuracy": v, "val_accuracy": v} for e, v in enumerate(val)]
    t = {"key": cfg.key(), "config": asdict(cfg), "status": Status.DONE, "test_accuracy": acc,
         "val_accuracy": val[-1], "history": history, **asdict(cfg)}
    if noise_at is not None:
        t["initial_noise"] = {**measured(noise_at[0]).as_dict(), "epoch": 0}
        for h, v in zip(history, noise_at[1:], strict=True):
            h.update(measured(v).to_record())
    return t


def cell(bs, accs, **kw) -> list[dict]:
    return [row(bs=bs, seed=s, acc=a, **kw) for s, a in enumerate(accs)]


# --- the table --------------------------------------------------------------------------------------


def test_the_noise_table_pools_each_epoch_over_seeds_each_seed_one_cluster():
    # given two seeds of one cell, the second's B_simple four times the first's at every epoch
    trials = [row(seed=0, noise_at=(10.0, 20.0, 40.0, 80.0)), row(seed=1, noise_at=(40.0, 80.0, 160.0, 320.0))]
    table = summarize(trials)["noise"]
    (group,) = table["groups"]
    (series,) = group["series"]
    # then each epoch's point is the ratio of the two seeds' means (of 8 pairs each) ...
    assert [p.epoch for p in series["points"]] == [0, 1, 2, 3]
    assert [p.b_simple for p in series["points"]] == pytest.approx([25.0, 50.0, 100.0, 200.0])
    # ... with its interval over the 2 seeds (1 degree of freedom), not over 16 pairs as if independent
    assert all(p.pairs == 2 and p.measurements == 2 for p in series["points"])
    by_pairs = pool([m for t in trials for m in critical.measurements(t) if m.epoch == 1], epoch=1)
    wide = series["points"][1]
    assert by_pairs.high is not None and (wide.high is None or wide.high - wide.low > by_pairs.high - by_pairs.low)
    # and a cell of one seed has its pairs to go on
    (single,) = summarize([trials[0]])["noise"]["groups"][0]["series"]
    assert single["points"][1].pairs == 8 and single["points"][1].b_simple == pytest.approx(20.0)
    assert group["label"] == "Adam, standard data" and series["label"] == "batch 16"
    assert table["sampling"] == [(1, 16, 8)] and table["missing"] == []


def test_cells_without_the_measurement_are_listed_with_their_seeds():
    # given one cell measured and one whose trials ran before --noise-scale
    trials = [row(bs=16), row(bs=32, seed=0, noise_at=None), row(bs=32, seed=1, noise_at=None)]
    table = summarize(trials)["noise"]
    # then the unmeasured cell is listed, and results.md says how to measure it
    assert table["missing"] == [{"cell": "Adam, standard data, batch size 32", "seeds": [0, 1]}]
    text = markdown("s", summarize(trials))
    assert "## Noise scale" in text and "Adam, standard data, batch size 32: seeds 0, 1" in text
    assert "--noise-scale --overwrite" in text


def test_a_store_without_any_measurement_reports_no_noise_section():
    trials = [row(bs=16, noise_at=None), row(bs=32, noise_at=None)]
    table = summarize(trials)["noise"]
    assert table["groups"] == [] and table["measured"] == 0
    text = markdown("s", summarize(trials))
    assert "## Noise scale" not in text


def test_the_noise_figure_has_a_panel_per_group_and_marks_the_sweeps_batch_sizes():
    trials = [*cell(16, [0.8, 0.82]), *cell(64, [0.7, 0.75]), row(opt="sgd", bs=16)]
    table = summarize(trials)["noise"]
    fig, artists = make_noise_figure(table)
    axes = fig.get_axes()
    assert len(axes) == 2 == len(artists)
    assert [a.get_title(loc="left") for a in axes] == ["SGD, standard data", "Adam, standard data"]
    # the batch sizes as dotted horizontal lines on the B_simple axis
    marked = sorted({line.get_ydata()[0] for line in axes[1].get_lines() if line.get_linestyle() == ":"})
    assert marked == [16, 64] and axes[1].get_yscale() == "log"


# --- the claim ----------------------------------------------------------------------------------------

# B_0 = 16 reaches the target (within 5 points of its final 0.85 validation accuracy) after epoch 2
# of 3; from there to the end B_simple is 60 then 80, whose pairs pool to 70: E/E_min = (3/2)(1 +
# 16/70) = 1.843, so the limit is 70 x 0.843 = 59: well below it is 29.5 or less, well above 118
# or more.


def test_the_limit_is_read_off_the_smallest_batch_size():
    r = critical.evaluate("Adam", {16: cell(16, [0.85, 0.86, 0.84]), 32: cell(32, [0.85, 0.84, 0.86])}, 3)
    # B_noise: batch 16's B_simple at e* = 2, where it first reaches the target (not pooled with later epochs)
    assert r["b0"] == 16 and r["e_star"] == 2 and r["e_star_range"] == (2, 2) and r["b_noise"] == pytest.approx(60.0)
    assert r["budget_ratio"] == pytest.approx(1.5 * (1 + 16 / 60)) and r["limit"] == pytest.approx(54.0)


def test_held_below_and_lost_above_the_limit_is_supported():
    # given 16 (B_0), 22 well below the limit 59, and 128 well above it
    cells = {16: cell(16, [0.85, 0.86, 0.84]), 22: cell(22, [0.85, 0.84, 0.86]), 128: cell(128, [0.6, 0.62, 0.58])}
    r = critical.evaluate("Adam", cells, 3)
    assert [(t["batch_size"], t["predicted"], t["agrees"]) for t in r["tests"]] == [(22, "held", True),
                                                                                    (128, "lost", True)]
    assert r["verdict"] == "supported"


def test_a_batch_size_well_above_the_limit_that_holds_contradicts_it():
    cells = {16: cell(16, [0.85, 0.86, 0.84]), 22: cell(22, [0.85, 0.84, 0.86]), 128: cell(128, [0.85, 0.84, 0.86])}
    r = critical.evaluate("Adam", cells, 3)
    assert r["tests"][-1]["agrees"] is False and r["verdict"] == "contradicted"


def test_spread_seeds_leave_it_unsettled():
    cells = {16: cell(16, [0.85, 0.86, 0.84]), 22: cell(22, [0.95, 0.5, 0.86]), 128: cell(128, [0.6, 0.62, 0.58])}
    r = critical.evaluate("Adam", cells, 3)
    assert r["tests"][0]["agrees"] is None and r["verdict"] == "unsettled" and r["verdict_text"] == "unsettled with 3 seeds"


def test_no_cell_on_one_side_of_the_limit_is_not_run_with_the_reason():
    # 32 is neither well below 59 (<= 29.5) nor well above it (>= 118); 128 is above
    cells = {16: cell(16, [0.85, 0.86]), 32: cell(32, [0.8, 0.82]), 128: cell(128, [0.6, 0.62])}
    r = critical.evaluate("Adam", cells, 3)
    assert r["verdict"] == "not run" and r["held_up_to"] < 32 < r["lost_from"] <= 128
    assert r["verdict_text"] == (f"not run: no batch size well below the limit {r['limit']:.0f} (well below: "
                                 f"≤ {r['held_up_to']:.0f}; well above: ≥ {r['lost_from']:.0f})")


def test_without_the_measurement_the_claim_is_not_run():
    cells = {16: cell(16, [0.85, 0.86], noise_at=None), 128: cell(128, [0.6, 0.62], noise_at=None)}
    r = critical.evaluate("Adam", cells, 3)
    assert r["verdict"] == "not run" and "not measured at batch size 16" in r["verdict_text"]


def test_a_lower_bound_on_the_noise_scale_predicts_only_what_holds():
    # given B_simple from epoch 2 on only bounded below (the noise dominated)
    bounded = (20.0, 30.0, (None, 40.0), (None, 40.0))
    cells = {16: cell(16, [0.85, 0.86], noise_at=bounded), 22: cell(22, [0.85, 0.84], noise_at=bounded),
             128: cell(128, [0.6, 0.62], noise_at=bounded)}
    r = critical.evaluate("Adam", cells, 3)
    # then the limit is a lower bound, no cell is predicted lost, and the verdict says why
    assert r["limit_is_bound"] and r["b_noise"] > 0
    assert r["limit"] == pytest.approx(1.5 * (r["b_noise"] + 16) - r["b_noise"])
    assert {t["predicted"] for t in r["tests"]} <= {"held"}
    assert r["verdict"] == "not run" and "well above: none, B_noise's interval is open above" in r["verdict_text"]


def test_well_below_and_above_use_the_ends_of_b_noises_interval_clustered_by_seed():
    # given B_0's B_simple at e* = 2 that differs from seed to seed (45, 60, 75), eight pairs each
    base = cell(16, [0.85, 0.86, 0.84])
    for t, v in zip(base, (45.0, 60.0, 75.0), strict=True):
        t["history"][1].update(measured(v).to_record())
    cells = {16: base, 24: cell(24, [0.85, 0.84, 0.86]), 128: cell(128, [0.6, 0.62, 0.58])}
    r = critical.evaluate("Adam", cells, 3)
    # then B_noise's interval is over the 3 seeds' means (2 degrees of freedom), not their 24 pairs
    pooled = gradient_noise.from_pairs([1.0, 1.0, 1.0], [45.0, 60.0, 75.0], floor=16)
    assert r["b_noise"] == pytest.approx(60.0)
    assert r["b_noise_low"] == pytest.approx(pooled.low) and r["b_noise_high"] == pytest.approx(pooled.high)
    as_if_independent = gradient_noise.pool([measured(v) for v in (45.0, 60.0, 75.0)])
    assert pooled.high - pooled.low > as_if_independent.high - as_if_independent.low
    # then "well below" is half the limit at the low end, "well above" twice the limit at the high end
    def limit_at(b):
        return 1.5 * (b + 16) - b
    assert r["held_up_to"] == pytest.approx(limit_at(pooled.low) / 2)
    assert r["lost_from"] == pytest.approx(2 * limit_at(pooled.high))
    assert r["held_up_to"] < r["limit"] / 2 < r["limit"] * 2 < r["lost_from"]
    assert {t["batch_size"] for t in r["tests"]} == {b for b in (24, 128)
                                                     if b <= r["held_up_to"] or b >= r["lost_from"]}


def test_e_star_moves_with_the_seed_and_each_bound_takes_the_side_that_widens_it():
    # given B_0's seeds reaching the target (0.85 - 5 points) at epochs 1, 2 and 3
    base = [row(bs=16, seed=s, acc=0.85, val=val) for s, val in
            enumerate([(0.85, 0.85, 0.85), (0.7, 0.85, 0.85), (0.7, 0.75, 0.85)])]
    cells = {16: base, 24: cell(24, [0.85, 0.84, 0.86]), 128: cell(128, [0.6, 0.62, 0.58])}
    r = critical.evaluate("Adam", cells, 3)
    assert r["e_star_range"] == (1, 3)

    def limit_at(b, e):
        return b * ((3 / e) * (1 + 16 / b) - 1)
    # then "well below" takes the latest seed's e* (the smallest limit), "well above" the earliest's
    assert r["limit"] == pytest.approx(limit_at(r["b_noise"], r["e_star"]))
    assert r["held_up_to"] == pytest.approx(limit_at(r["b_noise_low"], 3) / 2)
    assert r["lost_from"] is None or r["lost_from"] == pytest.approx(2 * limit_at(r["b_noise_high"], 1))


def test_a_one_sided_test_names_the_cells_that_went_the_other_way():
    # given a large B_noise: every batch size well below the limit, and 128 clearly worse
    cells = {16: cell(16, [0.85, 0.86, 0.84], noise_at=(20.0, 1000.0, 1000.0, 1000.0)),
             128: cell(128, [0.6, 0.62, 0.58])}
    r = critical.evaluate("Adam", cells, 3)
    assert r["verdict"] == "not run" and r["tests"][0]["agrees"] is False
    assert r["verdict_text"].endswith("; of those tested, 128 went the other way")


def test_the_claim_joins_the_claims_table_for_the_article_and_the_tuned_series():
    # given article-protocol Adam cells and a tuned grid of two rates per batch size
    trials = [*cell(16, [0.85, 0.86, 0.84]), *cell(22, [0.85, 0.84, 0.86]), *cell(128, [0.6, 0.62, 0.58])]
    for bs in (16, 22, 128):
        trials += [row(bs=bs, seed=s, acc=0.85, lr=0.003, val=(0.7, 0.82, 0.9)) for s in range(3)]
    summary = summarize(trials)
    (ctx,) = summary["critical"]
    series = [r["series"] for r in ctx["results"]]
    assert series == ["Adam, default lr 0.001", "Adam, lr tuned per batch size"]
    text = markdown("s", summary)
    rows = [ln for ln in text.splitlines() if ln.startswith(f"| {critical.SAYS}")]
    # the article's series at one rate is shown, and not run: the model assumes each batch size's best rate
    assert len(rows) == 2 and "not run: one learning rate at every batch size" in rows[0]
    assert ctx["results"][0]["tests"] and ctx["results"][0]["verdict"] == "not run"
    # the tuned series: 3 epochs to reach 0.85 = 0.9 - 5 points, so E/E_min = 1.4 and the limit 16
    assert "limit 16 " in rows[1] or "limit 16 (" in rows[1]


# --- recording, plans and the command line ---------------------------------------------------------


def test_the_plan_key_noise_scale_is_true_or_false(tmp_path):
    from catsdogs import config, plans
    from catsdogs.errors import SettingError

    ok = tmp_path / "ok.toml"
    ok.write_text('noise_scale = true\n[grids.g]\nopt = ["adam"]\nbatch_size = [16]\n')
    settings = plans.load(str(ok)).noise_sampling
    assert (settings.micro, settings.micros, settings.pairs) == (config.NOISE_MICRO, config.NOISE_MICROS,
                                                                 config.NOISE_PAIRS)
    bad = tmp_path / "bad.toml"
    bad.write_text('noise_scale = "yes"\n[grids.g]\nopt = ["adam"]\nbatch_size = [16]\n')
    with pytest.raises(SettingError, match="noise_scale: must be true or false"):
        plans.load(str(bad))


class NoiseSlot:
    """A sweep slot whose trials end done at once, saying which noise settings they were given."""

    runs: list = []

    def __init__(self, *args):
        pass

    def shapes(self):
        return set()

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None):
        from catsdogs.messages import TrialRecord

        NoiseSlot.runs.append((cfg.key(), noise_sampling))
        return TrialRecord(status=Status.DONE, test_accuracy=0.5, images_per_second=1.0,
                           noise_scale=10.0 if noise_sampling else None)

    def stop(self):
        pass

    def close(self):
        pass


def test_noise_scale_reaches_each_trial_but_not_its_key_and_done_trials_are_not_rerun(prepared_data, tmp_path):
    from catsdogs.gradient_noise import NoiseSampling
    from catsdogs.plans import grid_configs
    from catsdogs.training.sweep import run_sweep

    data = prepared_data(32)
    grid = grid_configs(["adam"], [8, 16], ["standard"], 1, 1, image_size=32, fingerprints={"standard": "x"},
                        backend="tensorflow")
    settings = NoiseSampling()
    NoiseSlot.runs = []
    # given a sweep run without the noise scale
    run_sweep("s", grid, data, tmp_path, SweepSettings(slots=NoiseSlot, log=lambda *a: None))
    assert [n for _, n in NoiseSlot.runs] == [None, None]
    # when the same sweep runs again with it
    NoiseSlot.runs = []
    run_sweep("s", grid, data, tmp_path, SweepSettings(slots=NoiseSlot, log=lambda *a: None, noise_sampling=settings))
    # then nothing runs again: the same trials, keyed as before
    assert NoiseSlot.runs == []
    # and with --overwrite every trial runs, given the settings, and the sweep records them
    run_sweep("s", grid, data, tmp_path, SweepSettings(slots=NoiseSlot, log=lambda *a: None, noise_sampling=settings, overwrite=True))
    assert sorted(NoiseSlot.runs) == sorted((c.key(), settings.as_dict()) for c in grid)
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["noise_scale"] == settings.as_dict()


def test_the_sweep_command_passes_noise_scale_to_the_sweep(prepared_data, tmp_path, monkeypatch):
    from catsdogs import plans
    from catsdogs.training import study

    seen = {}

    def fake_run(name, trials, data_dir, out, settings):
        seen["noise"] = settings.noise_sampling
        return {"done": len(trials), "failed": 0, "oom": 0, "pending": 0, "running": 0}

    monkeypatch.setattr(study, "run_sweep", fake_run)
    data = prepared_data(32)
    args = ["sweep", "--data-dir", str(data), "--out", str(tmp_path), "--opt", "adam", "--batch-size", "8"]
    assert CliRunner().invoke(cli, args).exit_code == 0 and seen["noise"] is None
    result = CliRunner().invoke(cli, [*args, "--noise-scale"])
    assert result.exit_code == 0, result.output
    # the same settings as a plan that says noise_scale = true
    plan_file = tmp_path / "p.toml"
    plan_file.write_text('noise_scale = true\n[grids.g]\nopt = ["adam"]\nbatch_size = [8]\n')
    assert seen["noise"] == plans.load(str(plan_file)).noise_sampling


def test_a_group_whose_measured_rates_are_neither_default_nor_chosen_is_still_drawn():
    # given Adam at its default rate, chosen by validation but run before --noise-scale, and at
    # 0.003, measured but not chosen
    default_rate = row(bs=16, acc=0.9, val=(0.7, 0.8, 0.9), noise_at=None)
    other = row(bs=16, acc=0.8, val=(0.6, 0.7, 0.75), lr=0.003)
    table = summarize([default_rate, other])["noise"]
    # then the figure has a panel for it (catsdogs 0.8.0's report raised here), with the measured rate
    assert [p["label"] for p in table["panels"]] == ["Adam, standard data, every learning rate"]
    fig, _ = make_noise_figure(table)
    assert len(fig.get_axes()) == 1


def test_trials_of_two_contexts_are_never_pooled():
    from dataclasses import asdict, replace

    small = row(seed=0, noise_at=(10.0, 10.0, 10.0, 10.0))
    cfg = replace(TrialConfig.from_dict(small["config"]), image_size=32, seed=1)
    other = {**row(seed=1, noise_at=(90.0, 90.0, 90.0, 90.0)), "config": asdict(cfg), "image_size": 32,
             "key": cfg.key()}
    table = summarize([small, other])["noise"]
    # then each context is a group of its own, named by it, each with its own estimate
    labels = sorted(g["label"] for g in table["groups"])
    assert labels == ["Adam, standard data (3 epochs, 32 px, TensorFlow)",
                      "Adam, standard data (3 epochs, 64 px, TensorFlow)"]
    assert sorted(g["series"][0]["points"][0].b_simple for g in table["groups"]) == pytest.approx([10.0, 90.0])


def test_a_rate_that_has_not_finished_makes_no_tuned_series_in_the_claim():
    # given Adam at its default rate finished at three batch sizes, and a second rate still pending
    trials = [*cell(16, [0.85, 0.86]), *cell(32, [0.84, 0.85]), *cell(64, [0.7, 0.72])]
    for bs in (16, 32, 64):
        pending = row(bs=bs, lr=0.003)
        trials.append({**pending, "status": Status.PENDING, "test_accuracy": None})
    summary = summarize(trials)
    # then the claim tests the default rate's series alone, as catsdogs 0.9.0 did: nothing was chosen
    series = [r["series"] for ctx in summary["critical"] for r in ctx["results"]]
    assert series == ["Adam, default lr 0.001"]
