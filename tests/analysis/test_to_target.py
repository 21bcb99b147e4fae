"""The critical batch size measured from a sweep run until a target (catsdogs.analysis.to_target):
S(B) the best median over learning rates, a missed target counted as never reached, the paper's
fit, B_simple at the target clustered by seed, and the claim's thresholds. Rows are made by hand,
as the store gives them: nothing trains here."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest

from catsdogs import gradient_noise
from catsdogs.analysis import to_target
from catsdogs.analysis.critical_fit import CriticalFit
from catsdogs.analysis.markdown import markdown
from catsdogs.analysis.plots import make_critical_figure
from catsdogs.analysis.summary import summarize
from catsdogs.schema import Status, TrialConfig

S_MIN, B_CRIT = 100.0, 16.0


def paper_steps(b: int) -> float:
    return S_MIN * (1 + B_CRIT / b)


def noise_record(b_simple: float) -> dict:
    """A measurement of eight pairs whose ratio of means is b_simple, as a history row holds it."""
    return gradient_noise.from_pairs([0.9, 1.1] * 4, [0.9 * b_simple, 1.1 * b_simple] * 4, floor=10,
                                     small=1, large=10).to_record()


def row(bs: int, lr: float, seed: int, steps: float | None, noise: float | None = None, until="val_loss=0.49") -> dict:
    """A finished trial run until `until`: `steps` to it (None: not reached), B_simple where it stopped."""
    cfg = TrialConfig("sgd", bs, "standard", seed, epochs=12, image_size=64, data="d", lr=lr, until=until,
                      eval_every=256)
    last = {"epoch": 3, "loss": 0.5, "accuracy": 0.8, "val_loss": 0.48, **(noise_record(noise) if noise else {})}
    return {"key": cfg.key(), "config": asdict(cfg), **asdict(cfg), "status": Status.DONE, "test_accuracy": 0.8,
            "history": [last], "target_reached": int(steps is not None), "steps_to_target": steps,
            "examples_to_target": steps * bs if steps is not None else None}


def study(batch_sizes=(4, 8, 16, 32, 64, 128), seeds=3, noise=(12.0, 16.0, 20.0)) -> list[dict]:
    """Three rates per batch size: the middle reaches the target in the paper's steps, the low
    one in twice as many, the high one never; B_simple at the target of the smallest's seeds."""
    out = []
    for b in batch_sizes:
        for s in range(seeds):
            n = noise[s] if b == min(batch_sizes) else None
            out += [row(b, 0.05, s, 2 * paper_steps(b), n), row(b, 0.1, s, paper_steps(b) * (1 + 0.01 * (s - 1)), n),
                    row(b, 0.2, s, None, n)]
    return out


def test_s_of_b_is_the_best_median_over_rates_and_the_fit_finds_the_papers_parameters():
    (table,) = to_target.tables(study())
    # then each batch size chose its middle rate, the one that reached the target soonest
    assert [(r["batch_size"], r["lr"], r["edge"]) for r in table["rows"]] == [
        (b, 0.1, False) for b in (4, 8, 16, 32, 64, 128)]
    assert [r["steps"] for r in table["rows"]] == pytest.approx([paper_steps(b) for b in (4, 8, 16, 32, 64, 128)])
    assert table["rows"][0]["examples"] == pytest.approx(4 * paper_steps(4))
    # and the fit gives back S_min and B_crit
    assert table["fit"].s_min == pytest.approx(S_MIN, rel=0.02) and table["fit"].b_crit == pytest.approx(B_CRIT, rel=0.05)
    assert table["fit"].low == pytest.approx(B_CRIT) == table["fit"].high  # the medians lie on the curve
    assert table["target"].describe() == "val_loss <= 0.49"


def test_a_seed_that_missed_counts_as_never_reaching_it_and_a_missed_median_leaves_the_fit():
    trials = study()
    # given batch 128 where two of three seeds of every rate missed the target
    trials = [t for t in trials if t["batch_size"] != 128]
    trials += [row(128, lr, s, 50.0 if s == 0 else None) for lr in (0.05, 0.1, 0.2) for s in range(3)]
    (table,) = to_target.tables(trials)
    last = table["rows"][-1]
    # then its best median is not reached (one seed's 50 steps do not make a median), and it is out of the fit
    assert last["batch_size"] == 128 and math.isinf(last["steps"]) and last["reached"] == 1
    assert [b for b, _ in table["fit"].points] == [4, 8, 16, 32, 64]
    # and a rate whose median seed reached the target beats one whose median seed did not
    trials = [row(8, 0.05, s, 900.0) for s in range(3)] + [row(8, 0.1, s, 10.0 if s == 0 else None) for s in range(3)]
    (only,) = to_target.tables(trials)
    assert only["rows"][0]["lr"] == 0.05 and only["rows"][0]["edge"]  # the lowest of its two rates: an edge
    assert only["fit"] is None and only["why_no_fit"].startswith("0 batch sizes can enter the fit (the target reached "
                                                                 "after an update at a rate inside its grid): it needs 3")


def test_b_simple_at_the_target_is_clustered_by_seed():
    (table,) = to_target.tables(study(noise=(12.0, 16.0, 20.0)))
    noise = table["noise"]
    # then it is the ratio of the seeds' means, with an interval over the 3 seeds (2 degrees of freedom)
    assert noise.b_simple == pytest.approx(16.0) and noise.pairs == 3 and noise.measurements == 6
    assert noise.low < 16.0 < noise.high
    wide = gradient_noise.from_pairs([0.9, 1.1] * 12, [x for v in (12.0, 16.0, 20.0) for x in (0.9 * v, 1.1 * v)] * 4,
                                     floor=10)
    assert noise.high - noise.low > wide.high - wide.low  # wider than 24 pairs taken as independent


@pytest.mark.parametrize("noise, fit, verdict", [
    ((16.0, 12.0, 21.0), (16.0, 12.0, 21.0), "agrees"),  # ratio 1, interval well inside [1/3, 3]
    ((160.0, 140.0, 180.0), (16.0, 14.0, 18.0), "disagrees"),  # ratio 10, wholly above 3
    ((1.0, 0.9, 1.1), (16.0, 14.0, 18.0), "disagrees"),  # ratio 1/16, wholly below 1/3
    ((40.0, 20.0, 80.0), (16.0, 12.0, 21.0), "unsettled"),  # ratio 2.5, its interval crosses 3
    ((16.0, 12.0, None), (16.0, 12.0, 21.0), "unsettled"),  # open above: never agrees
])
def test_the_claim_agrees_within_a_factor_of_3_disagrees_wholly_outside_and_else_is_unsettled(noise, fit, verdict):
    estimate = gradient_noise.NoiseEstimate(noise[0], noise[1], noise[2], 1.0, noise[0], 8)
    critical = CriticalFit(100.0, 100.0 * fit[0], fit[0], fit[1], fit[2], 4, ())
    c = to_target.claim(critical, estimate)
    assert c["verdict"] == verdict
    assert c["ratio"] == pytest.approx(noise[0] / fit[0])
    assert c["low"] <= c["ratio"] and (c["high"] is None or c["high"] >= c["ratio"])


def test_the_claim_is_not_run_without_a_fit_or_a_measurement_and_says_which():
    estimate = gradient_noise.NoiseEstimate(16.0, 12.0, 21.0, 1.0, 16.0, 8)
    assert "fit needs 3" in to_target.claim(None, estimate, "2 batch sizes reached the target: the fit needs 3")["why"]
    critical = CriticalFit(100.0, 1600.0, 16.0, 12.0, 21.0, 4, ())
    assert "--noise-scale" in to_target.claim(critical, None)["why"]
    bound = gradient_noise.NoiseEstimate(None, 40.0, None, -1.0, 1.0, 8)
    assert "lower bound" in to_target.claim(critical, bound)["why"]


def test_the_report_gives_trials_run_until_a_target_their_own_section_and_figure_only():
    trials = study()
    summary = summarize(trials)
    # then the section and the figure are there, and no accuracy figure or claim takes these trials
    assert len(summary["to_target"]) == 1 and summary["figures"] == [] and summary["unused"] == []
    text = markdown("critical", summary)
    assert "## The critical batch size, measured" in text and "B_crit 16" in text
    assert "The noise scale predicts B_crit: **agrees, B_simple/B_crit 1.00" in text
    fig, artists = make_critical_figure(summary["to_target"])
    assert artists[0]["paper"]["b_crit"] is not None and artists[0]["steps"]["fit"] is not None
    # and a sweep without a target has no such section
    assert "measured" not in markdown("s", summarize([]))


def test_steps_that_do_not_fall_with_the_batch_give_no_b_crit_and_no_crash():
    # given steps that barely change from batch 4 to 32 (the fit's E_min comes out negative)
    trials = [row(b, 0.1, s, steps) for b, steps in ((4, 100.0), (8, 105.0), (16, 112.0), (32, 118.0)) for s in range(3)]
    trials = [{**t, "history": [{**t["history"][0], **noise_record(20.0)}]} for t in trials]
    (table,) = to_target.tables(trials)
    assert table["fit"].b_crit is None and table["fit"].describe().startswith("below 4")
    assert table["claim"]["verdict"] == "not run" and "do not fall" in table["claim"]["why"]
    markdown("s", summarize(trials))
    make_critical_figure(summarize(trials)["to_target"])


def test_a_target_met_before_the_first_update_is_out_of_the_fit_and_said_so():
    trials = study()
    trials = [t for t in trials if t["batch_size"] != 4] + [row(4, lr, s, 0.0) for lr in (0.05, 0.1) for s in range(3)]
    (table,) = to_target.tables(trials)
    assert 4 not in [b for b, _ in table["fit"].points] and "before its first update" in table["why_no_fit"]
    make_critical_figure([table])


def test_a_sweep_where_every_target_was_met_at_the_start_still_draws_its_figure_saying_so(tmp_path):
    # given trials that all met the target before their first update (0 steps: nothing to put on a log axis)
    (table,) = to_target.tables([row(b, 0.1, s, 0.0) for b in (4, 8) for s in range(2)])
    fig, (art,) = make_critical_figure([table])
    # then the figure is drawn (it used to fail on its log axes) and says why it is empty
    fig.savefig(tmp_path / "f.png")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("no batch size reached the target after an update" in t for t in texts)
    assert art["paper"]["curve"] is None and art["steps"]["fit"] is None


def test_a_step_of_an_accumulated_trial_is_its_effective_batch():
    # given batch 8 accumulated 4 times: each step an update of 32 images
    trials = [{**t, "accumulate": 4, "config": {**t["config"], "accumulate": 4}} for t in study()]
    (table,) = to_target.tables(trials)
    assert [r["batch_size"] for r in table["rows"]] == [16, 32, 64, 128, 256, 512]
    assert table["fit"].b_crit == pytest.approx(4 * B_CRIT, rel=0.05)  # the paper's curve at 4x the batch


def test_a_batch_size_whose_chosen_rate_lies_at_its_grids_edge_leaves_the_fit_and_is_named():
    trials = [t for t in study() if t["batch_size"] != 4]
    # given batch 4 whose lowest rate reached the target soonest: its best may lie below the grid
    trials += [row(4, 0.05, s, paper_steps(4)) for s in range(3)]
    trials += [row(4, 0.1, s, 2 * paper_steps(4)) for s in range(3)]
    (table,) = to_target.tables(trials)
    first = table["rows"][0]
    assert (first["batch_size"], first["lr"], first["edge"]) == (4, 0.05, True)
    # then the fit leaves it out and says why, and the interior batch sizes give back the paper's B_crit
    assert [b for b, _ in table["fit"].points] == [8, 16, 32, 64, 128]
    assert "batch size 4 out of the fit: the chosen rate lies at its grid's edge" in table["why_no_fit"]
    assert table["fit"].b_crit == pytest.approx(B_CRIT, rel=0.05)


def test_s_of_b_is_read_partly_off_seeds_that_did_not_choose_its_rate():
    # given batch 8 whose two rates tie on the median but differ seed by seed
    trials = [row(8, 0.05, s, v) for s, v in enumerate((100.0, 300.0, 200.0))]
    trials += [row(8, 0.1, s, v) for s, v in enumerate((300.0, 100.0, 200.0))]
    (table,) = to_target.tables(trials)
    r = table["rows"][0]
    # then on the same seeds S is the chosen rate's median, 200; held out, each seed is read at the rate
    # the other two chose: seed 0 at 0.1 (150 against 250), where it took 300; seed 1 at 0.05, 300;
    # seed 2 at 0.05 (a tie, the lower rate), 200: their median 300. S is the geometric mean of the two
    assert r["steps_same_seeds"] == 200.0
    assert r["steps_held_out"] == 300.0 and r["steps"] == pytest.approx((200.0 * 300.0) ** 0.5)
