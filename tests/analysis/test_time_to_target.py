"""Time to the target, measured from a sweep run until a target and held against find-batch-size's
prediction (catsdogs.analysis.time_to_target), and the tuned learning rates a store gives
find-batch-size to scale from (catsdogs.analysis.anchor). Stores are built by hand: nothing trains."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_claims import build_store

from catsdogs.analysis import time_to_target, to_target
from catsdogs.analysis.anchor import tuned_anchor
from catsdogs.analysis.markdown import markdown
from catsdogs.analysis.plots import make_time_figure
from catsdogs.analysis.report import report
from catsdogs.analysis.rows import load_trials
from catsdogs.analysis.summary import summarize
from catsdogs.cli import cli
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.recommendation import anchor_at
from catsdogs.schema import TrialConfig

S_MIN, B_CRIT = 100.0, 16.0
SIZES = (4, 8, 16, 32, 64, 128)


def steps(b: int) -> float:
    return S_MIN * (1 + B_CRIT / b)


def device_step(b: float) -> float:
    """Seconds per step of a device flat up to 32 and proportional to the batch beyond."""
    return 0.01 * max(1.0, b / 32)


def trial(bs: int, lr: float, seed: int, reached: float | None, step_seconds: float = None, opt="sgd",
          until="val_loss=0.49") -> tuple[dict, dict]:
    """(config, record) of a finished trial run until `until`, `reached` steps to it (None: missed),
    trained `reached` (or 300) updates at `step_seconds` each."""
    cfg = TrialConfig(opt, bs, "standard", seed, epochs=12, image_size=64, data="d", lr=lr, until=until,
                      eval_every=256)
    trained = math.ceil(reached) if reached else 300
    seconds = trained * (step_seconds if step_seconds is not None else device_step(bs))
    return asdict(cfg), {"test_accuracy": 0.8, "target_reached": int(reached is not None), "steps_to_target": reached,
                         "examples_to_target": reached * bs if reached else None, "steps": trained,
                         "train_seconds": seconds, "history": [{"epoch": 1, "loss": 0.5, "val_loss": 0.48}]}


def critical_study(opt="sgd") -> list[tuple[dict, dict]]:
    """Per batch size a rate that reaches the target in the paper's steps and one in twice as many."""
    return [t for b in SIZES for s in range(3)
            for t in (trial(b, 0.1, s, steps(b), opt=opt), trial(b, 0.05, s, 2 * steps(b), opt=opt))]


def found(b_noise: float | None, step=device_step, probed=(1, 8, 16, 32, 64, 128, 256), opt="sgd",
          path="fbs.json", backend="tensorflow", data="d") -> dict:
    """find-batch-size's result as its JSON holds it: its table of probes' step times and B_noise."""
    table = [{"batch_size": b, "step_seconds": step(b), "images_per_second": b / step(b)} for b in probed]
    return {"path": path, "backend": backend,
            "settings": {"optimizer": opt, "dataset": "standard", "image_size": 64, "precision": "float32",
                         "data_fingerprint": data},
            "recommendation": {"batch_size": 48, "b_noise": b_noise, "statistics": "resolved" if b_noise else
                               "unresolved", "table": table}}


def tables(out: Path, name="crit") -> list[dict]:
    return to_target.tables(load_trials(out / "results.sqlite", name))


# --- measured against predicted -----------------------------------------------------------------


def test_measured_time_is_steps_times_the_trials_own_step_time_and_a_right_prediction_meets_the_target(tmp_path):
    # given a sweep whose S(B) follows the paper with B_crit 16 on a device flat up to 32, and
    # find-batch-size's probes of the same device with B_noise 16
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    (c,) = time_to_target.comparisons([table], [found(16.0)])["rows"]
    by = {r["batch_size"]: r for r in c["rows"]}
    # then measured T(B) = S(B) t_step(B): 5.0, 3.0, 2.0, 1.5, 2.5 and 4.5 s, least at 32
    assert [by[b]["seconds"] for b in SIZES] == pytest.approx([5.0, 3.0, 2.0, 1.5, 2.5, 4.5], rel=1e-3)
    assert c["best"] == 32 and by[32]["relative"] == 1.0
    # and the prediction, batch 4 interpolated between the probes of 1 and 8, picks 32 too: met
    assert by[4]["predicted_step_seconds"] == pytest.approx(0.01)
    assert c["recommended"] == 32 and c["ratio"] == pytest.approx(1.0) and c["verdict"] == "met"
    assert c["cause"] is None


def test_a_miss_is_reported_with_its_cause_split_into_steps_and_step_time(tmp_path):
    # given probes that saw no slow-down up to 256 (flat) where the trials' steps slowed beyond 32
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    (c,) = time_to_target.comparisons([table], [found(16.0, step=lambda b: 0.01)])["rows"]
    # then the prediction picks the largest, 128, which measured 4.5 s against 32's 1.5 s: missed
    assert c["recommended"] == 128 and c["best"] == 32
    assert c["ratio"] == pytest.approx(3.0, rel=1e-3) and c["verdict"] == "missed"
    # and the cause: the steps as predicted (0.75 both ways), the step time off (1.00 predicted, 4.00 measured)
    assert c["cause"] == ("steps S(128)/S(32): predicted 0.75, measured 0.75; "
                          "step time t(128)/t(32): predicted 1.00, measured 4.00")


def test_the_choice_among_the_sweeps_sizes_ties_as_wide_as_find_batch_sizes_step_time_spreads(tmp_path):
    # given the paper's S(B) with B_crit 16 on a device flat up to 32, and find-batch-size's probes
    # of it whose step times spread by half either way (its table's step_spread)
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    noisy = found(16.0)
    for row in noisy["recommendation"]["table"]:
        row["step_spread"] = 0.5
    # when compared
    (c,) = time_to_target.comparisons([table], [noisy])["rows"]
    (quiet,) = time_to_target.comparisons([table], [found(16.0)])["rows"]
    # then find-batch-size's rule ties 8 to 64 (within 10% plus both spreads, 2.1 times, of 32's
    # least) and takes their middle on a log scale, 16, as find-batch-size itself would have; with
    # no spread it takes 32
    assert c["recommended"] == 16 and c["ratio"] == pytest.approx(2.0 / 1.5, rel=1e-3)
    assert quiet["recommended"] == 32


def test_a_step_time_spread_between_probed_sizes_is_the_larger_of_its_two_ends():
    # given spreads measured at 8 and 32: then 16, between them, takes the larger; a probed size
    # its own; one outside the probes none
    from catsdogs import goodput

    assert goodput.spread_at(16, {8: 0.05, 32: 0.2}) == 0.2
    assert goodput.spread_at(8, {8: 0.05, 32: 0.2}) == 0.05
    assert goodput.spread_at(64, {8: 0.05, 32: 0.2}) == 0.0


def test_an_unresolved_noise_scale_predicts_by_speed_alone_and_is_judged_all_the_same(tmp_path):
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    (c,) = time_to_target.comparisons([table], [found(None)])["rows"]
    # then speed alone (t/B) is flat from 32 up: a tie of 32, 64 and 128, which goes to its middle, 64;
    # the study's steps fall by less than half from 32 to 64, so 64 takes 1.67 times the best: a miss,
    # judged all the same, its cause in numbers
    assert c["recommended"] == 64 and c["best"] == 32 and c["ratio"] == pytest.approx(5 / 3)
    assert c["verdict"] == "missed" and c["cause"].startswith("steps S(64)/S(32): predicted 0.50, measured 0.83")
    assert c["rows"][0]["predicted_relative"] == pytest.approx(8.0)


def test_a_result_of_another_model_optimizer_backend_or_data_matches_no_series_and_is_listed(tmp_path):
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    user = found(16.0, path="mine")  # a user's model (--model) on the sweep's own data, size and optimizer
    user["settings"] = {**user["settings"], "model": "mymodels:build"}
    others = [found(16.0, opt="adam", path="a"), found(16.0, backend="jax", path="b"), found(16.0, data="x", path="c"),
              {**found(16.0, path="old"), "backend": None}, user]  # a result from before 0.13.0 records no backend
    compared = time_to_target.comparisons([table], others)
    assert compared["rows"] == [] and compared["unmatched"] == ["a", "b", "c", "old", "mine"]


def test_a_users_race_is_held_against_its_own_result_and_never_the_articles_or_an_edited_models(tmp_path):
    # given a race of a user's model on its folder: trials keyed by the model, on the folder's data and its split
    race = [({**c, "model": "my_models:small@abc", "data": "f00+validation"}, r) for c, r in critical_study()]
    (table,) = tables(build_store(tmp_path, "mine-race", race), "mine-race")
    # and its own find-batch-size result, the same model's after an edit, and the article's on the same folder
    results = []
    for path, architecture in (("mine", "abc"), ("edited", "abd")):
        result = found(16.0, path=path, data="f00")
        result["settings"] = {**result["settings"], "model": "my_models:small"}
        result["model"] = {"model": "my_models:small", "kind": "function", "name": "small", "architecture": architecture}
        results.append(result)
    results.append(found(16.0, path="article", data="f00"))
    # when held against the race's series
    compared = time_to_target.comparisons([table], results)
    # then only its own result is
    assert [c["path"] for c in compared["rows"]] == ["mine"] and compared["unmatched"] == ["edited", "article"]


def test_a_target_met_before_the_first_update_has_no_time_and_is_never_the_best(tmp_path):
    # given batch 128 whose trials met the target at once (0 steps) and found a flat device
    trials = [t for t in critical_study() if t[0]["batch_size"] != 128]
    trials += [trial(128, lr, s, 0.0) for lr in (0.05, 0.1) for s in range(3)]
    (table,) = tables(build_store(tmp_path, "crit", trials))
    (c,) = time_to_target.comparisons([table], [found(16.0, step=lambda b: 0.01)])["rows"]
    # then it has no measured time (not 0 s), the best is 32, and the prediction's 128 is a miss said so
    assert math.isinf(c["rows"][-1]["seconds"]) and c["best"] == 32 and c["recommended"] == 128
    assert c["verdict"] == "missed" and c["cause"] == "batch size 128 has no measured time to the target " \
                                                       "(no steps, or no step time)"


def test_an_unmatched_result_alone_is_listed_without_a_figure(tmp_path):
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    text = "\n".join(time_to_target.markdown(time_to_target.comparisons([table], [found(16.0, opt="adam")])))
    assert "match no series" in text and "figures/time_to_target.png" not in text


def test_probes_that_cover_none_of_the_sweeps_sizes_leave_it_not_judged(tmp_path):
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    (c,) = time_to_target.comparisons([table], [found(16.0, probed=(256, 512))])["rows"]
    assert c["verdict"] == "not judged" and "cover none" in c["why"] and c["ratio"] is None


def test_the_report_finds_the_result_under_out_draws_the_figure_and_states_the_ratio(tmp_path):
    # given a critical sweep and find-batch-size's JSON where `find-batch-size --out OUT` writes it
    out = build_store(tmp_path, "crit", critical_study())
    (out / "find-batch-size").mkdir()
    (out / "find-batch-size" / "find_batch_size.json").write_text(json.dumps(found(16.0, path=None)))
    lines = []
    paths = report("crit", out, log=lines.append)
    # then the figure, the section and a line of the log
    assert Path(paths["figures"]["time_to_target"]["png"]).is_file()
    text = Path(paths["results_md"]).read_text()
    assert "## Time to the target: measured, and find-batch-size's prediction" in text
    assert "| 32 **best** *recommended* | 150 | 0.0100 | 1.5 | 1.00 | 1.00 |" in text
    assert any("T(recommended 32)/T(best 32) 1.00, met" in line for line in lines)
    # and figures drawn (the measured critical batch size's too) are never said to be none
    assert "critical_measured" in paths["figures"] and not any(line.startswith("no figure") for line in lines)


def test_the_figure_has_a_panel_per_comparison_with_best_and_recommended_marked(tmp_path):
    (table,) = tables(build_store(tmp_path, "crit", critical_study()))
    compared = time_to_target.comparisons([table], [found(16.0, step=lambda b: 0.01)])
    fig, (art,) = make_time_figure(compared["rows"])
    assert len(fig.axes) == 1 and art["best"] is not None and art["recommended"] is not None
    assert list(art["measured"].get_xdata()) == list(SIZES)
    text = markdown("crit", summarize(load_trials(tmp_path / "results.sqlite", "crit"),
                                      found=[found(16.0, step=lambda b: 0.01)]))
    assert "T(recommended)/T(best) 3.00, **missed** (at most 1.25); steps S(128)/S(32)" in text


def test_a_given_result_that_cannot_be_read_is_an_error_and_one_found_under_out_is_skipped(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CatsdogsError, match="cannot read find-batch-size's result .*bad.json"):
        time_to_target.load_find_results(tmp_path, [bad])
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "find_batch_size.json").write_text("[1, 2]")
    assert time_to_target.load_find_results(tmp_path) == []
    # and on the command line a missing one is a usage error, exit 2
    res = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--find-batch-size", str(tmp_path / "no.json")])
    assert res.exit_code == 2 and "does not exist" in res.output


# --- the learning rate's anchor -------------------------------------------------------------------


def tuned_study() -> list[tuple[dict, dict]]:
    """The tuned plan's kind: three rates at 32 and 128, validation accuracy best at 0.02 and 0.1."""
    out = []
    for b, best in ((32, 0.02), (128, 0.1)):
        for lr in (0.01, 0.02, 0.05, 0.1):
            for s in range(2):
                cfg = TrialConfig("sgd", b, "standard", s, epochs=5, image_size=64, data="d", lr=lr)
                out.append((asdict(cfg), {"test_accuracy": 0.8, "val_accuracy": 0.9 if lr == best else 0.7,
                                          "history": [{"epoch": 5, "val_accuracy": 0.9 if lr == best else 0.7}]}))
    return out


def test_the_anchor_prefers_a_critical_sweep_and_takes_each_batch_sizes_chosen_rate(tmp_path):
    # given a store with a tuned sweep and a critical one for SGD
    build_store(tmp_path, "tuned", tuned_study())
    build_store(tmp_path, "crit", critical_study())
    anchor = tuned_anchor(tmp_path, "sgd", "standard", 64)
    # then the critical one, its rate that reached the target soonest at every batch size
    assert anchor["sweep"] == "crit" and anchor["kind"] == "critical"
    assert anchor["rates"] == {b: 0.1 for b in SIZES} and anchor["edges"] == list(SIZES)
    # and with only the tuned one, the rate of the best validation accuracy at each batch size
    alone = tmp_path / "alone"
    alone.mkdir()
    build_store(alone, "tuned", tuned_study())
    assert tuned_anchor(alone, "sgd", "standard", 64)["rates"] == {32: 0.02, 128: 0.1}


@pytest.mark.parametrize("args, message", [
    (("adam", "standard", 64), "no sweep in .* tunes the learning rate of adam on standard data at 64 px"),
    (("sgd", "standard", 128), "no sweep in .* tunes the learning rate of sgd on standard data at 128 px"),
])
def test_a_store_without_tuned_rates_for_the_search_is_a_setting_error(tmp_path, args, message):
    build_store(tmp_path, "crit", critical_study())
    with pytest.raises(SettingError, match=message):
        tuned_anchor(tmp_path, *args)
    with pytest.raises(SettingError, match="no results store at"):
        tuned_anchor(tmp_path / "nowhere", "sgd", "standard", 64)


def test_the_rate_is_scaled_from_the_tuned_batch_size_nearest_the_recommendation():
    anchor = {"kind": "critical", "sweep": "crit", "rates": {"8": 0.03, "32": 0.05, "128": 0.1}, "edges": [128]}
    # 48 is nearer 32 than 128 on a log scale; 100 nearer 128, which sits at its grid's edge
    assert anchor_at(48, "sgd", anchor)[:2] == (32, 0.05)
    base, lr, said = anchor_at(100, "sgd", anchor)
    assert (base, lr) == (128, 0.1) and said.startswith("the tuned rate of the critical sweep 'crit' (at its grid")
    assert anchor_at(48, "adam", None) == (32, 0.001, "Keras's default")


def test_trials_to_a_target_capped_apart_share_one_context_and_fixed_epochs_keep_theirs():
    from catsdogs.analysis.rows import context_label, context_of

    # given two trials to one target capped at 3 and 12 epochs (a race's), and two of fixed epochs
    to_target = [{"config": {"epochs": e, "image_size": 64, "until": "val_loss=0.49"}} for e in (3, 12)]
    fixed = [{"config": {"epochs": e, "image_size": 64}} for e in (3, 12)]
    # then the first two are one context, said "to the target"; the fixed ones stay apart
    assert context_of(to_target[0]) == context_of(to_target[1])
    assert context_label(context_of(to_target[0]), False).startswith("to the target, 64 px")
    assert context_of(fixed[0]) != context_of(fixed[1])
