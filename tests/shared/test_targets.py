"""A target a trial trains until (`--until`) and the evaluations it is checked at (`--eval-every`):
how a target is written, where a curve crosses it, which settings make a trial's identity, and a
one-line error (exit 2) for each bad value."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from catsdogs import plans, targets
from catsdogs.cli import cli
from catsdogs.errors import SettingError
from catsdogs.schema import TrialConfig
from catsdogs.targets import Target, crossing, record_fields


def point(step, loss, acc=0.5, batch=8):
    return {"step": step, "examples": step * batch, "train_seconds": step * 0.1, "val_loss": loss, "val_accuracy": acc}


# --- writing a target ------------------------------------------------------------------------------


def test_a_target_is_a_validation_metric_and_a_value_in_its_range():
    assert targets.parse("val_loss=0.45") == Target("val_loss", 0.45)
    assert targets.parse(" val_accuracy = 0.8 ") == Target("val_accuracy", 0.8)
    # two spellings of one target are one trial
    assert targets.canonical("val_loss=.450") == targets.canonical("val_loss=0.45") == "val_loss=0.45"
    for text, says in (("loss=0.4", "unknown metric 'loss'"), ("val_acc=0.8", "unknown metric"),
                       ("val_accuracy=80", "at most 1"), ("val_accuracy=0", "above 0"),
                       ("val_loss=-1", "positive"), ("val_loss=nan", "positive"), ("val_loss=inf", "positive"),
                       ("val_loss=x", "not a number"), ("val_loss", "METRIC=VALUE"), ("a=b=c", "METRIC=VALUE")):
        with pytest.raises(SettingError, match=says) as e:
            targets.parse(text)
        assert e.value.key == "until"


def test_a_loss_target_is_reached_at_or_below_it_and_an_accuracy_target_at_or_above_it():
    loss, acc = Target("val_loss", 0.5), Target("val_accuracy", 0.8)
    assert loss.reached({"val_loss": 0.5}) and loss.reached({"val_loss": 0.49}) and not loss.reached({"val_loss": 0.51})
    assert acc.reached({"val_accuracy": 0.8}) and not acc.reached({"val_accuracy": 0.79})
    assert not loss.reached({"val_loss": float("nan")}) and not loss.reached({})


# --- where a curve crosses it ----------------------------------------------------------------------


def test_the_crossing_is_interpolated_linearly_in_the_metric_between_the_evaluations_around_it():
    # given a curve whose loss falls from 0.60 (step 20) to 0.40 (step 30), and a target of 0.45
    curve = [point(0, 0.69), point(10, 0.65), point(20, 0.60), point(30, 0.40), point(40, 0.30)]
    at = crossing(curve, Target("val_loss", 0.45))
    # then it crossed three quarters of the way: (0.60 - 0.45) / (0.60 - 0.40) = 0.75
    assert at == pytest.approx({"step": 27.5, "examples": 220.0, "train_seconds": 2.75})


def test_the_first_evaluation_that_reaches_it_decides_even_if_the_curve_comes_back():
    curve = [point(0, 0.69), point(10, 0.44), point(20, 0.60), point(30, 0.40)]
    assert crossing(curve, Target("val_loss", 0.45))["step"] == pytest.approx(10 * (0.69 - 0.45) / (0.69 - 0.44))


def test_a_target_met_before_any_update_crosses_at_step_0_and_one_never_met_does_not_cross():
    curve = [point(0, 0.69), point(10, 0.60)]
    assert crossing(curve, Target("val_loss", 0.7))["step"] == 0
    assert crossing(curve, Target("val_loss", 0.5)) is None
    assert crossing([], Target("val_loss", 0.5)) is None


def test_a_trials_target_columns_say_reached_or_not_and_are_empty_when_not():
    curve = [point(0, 0.69), point(10, 0.40)]
    assert record_fields(curve, "val_loss=0.45") == {
        "target_reached": 1, "steps_to_target": pytest.approx(10 * 0.24 / 0.29, abs=1e-3),
        "examples_to_target": pytest.approx(80 * 0.24 / 0.29, abs=0.1),
        "seconds_to_target": pytest.approx(0.24 / 0.29, abs=1e-4)}
    assert record_fields(curve, "val_loss=0.1") == {"target_reached": 0, "steps_to_target": None,
                                                    "examples_to_target": None, "seconds_to_target": None}
    assert record_fields(curve, None) == {}  # a curve without a target: no target columns


# --- a trial's identity ------------------------------------------------------------------------------


def test_a_target_and_its_evaluations_are_a_trials_identity_and_a_curve_alone_is_not():
    plain = TrialConfig("sgd", 8, "standard", 0)
    target = TrialConfig("sgd", 8, "standard", 0, until="val_loss=0.45", eval_every=64)
    # a target changes the trial, and so do the evaluations it stops at
    assert target.key() != plain.key()
    assert TrialConfig("sgd", 8, "standard", 0, until="val_loss=0.45", eval_every=128).key() != target.key()
    # but not the compiled step it trains with
    assert target.shape() == plain.shape()
    # and a curve without a target is no trial's field: the sweep's measurement
    with pytest.raises(SettingError, match="only with a target") as e:
        TrialConfig("sgd", 8, "standard", 0, eval_every=64).check()
    assert e.value.key == "eval_every"
    with pytest.raises(SettingError, match="give eval_every too"):
        TrialConfig("sgd", 8, "standard", 0, until="val_loss=0.45").check()


def plan_of(tmp_path, text: str) -> plans.Plan:
    path = tmp_path / "p.toml"
    path.write_text(text + '\n[grids.g]\nopt = "sgd"\nbatch_size = [8, 16]\n')
    return plans.load(str(path))


def test_a_plan_gives_its_target_and_cap_to_each_trial_and_its_curve_to_the_sweep(tmp_path):
    plan = plan_of(tmp_path, 'eval_every = 64\nmax_epochs = 30\n[grids.t]\nopt = "sgd"\nbatch_size = 4\n'
                             'until = "val_loss=.45"')
    trials = plans.configs(plan, 1, image_size=32, fingerprints={"standard": "f"}, backend="tensorflow")
    with_target = [t for t in trials if t.until]
    # the grid with a target: its trials carry it (in one spelling), its evaluations and the cap
    assert [(t.batch_size, t.until, t.eval_every, t.epochs) for t in with_target] == [(4, "val_loss=0.45", 64, 30)]
    # the grid without: the cap is its epochs, and the curve is the sweep's measurement only
    assert {(t.until, t.eval_every, t.epochs) for t in trials if not t.until} == {(None, None, 30)}
    assert plan.eval_every == 64


@pytest.mark.parametrize("text, key, says", [
    ('[grids.t]\nopt = "sgd"\nbatch_size = 4\nuntil = "val_loss=0.45"', "until", "give eval_every too"),
    ("max_epochs = 3", "max_epochs", "give until"),
    ('eval_every = 8\nmax_epochs = 3\nepochs = 2\n[grids.t]\nopt = "sgd"\nbatch_size = 4\nuntil = "val_loss=0.45"',
     "max_epochs", "give one"),
    ("eval_every = 0", "eval_every", ">= 1"),
    ('eval_every = 8\n[grids.t]\nopt = "sgd"\nbatch_size = 4\nuntil = "val_accuracy=80"', "until", "at most 1"),
])
def test_a_plan_with_a_target_it_cannot_check_is_refused_naming_the_key(tmp_path, text, key, says):
    with pytest.raises(plans.PlanError, match=says) as e:
        plan_of(tmp_path, text)
    assert e.value.key == key and str(e.value).count("\n") == 0


@pytest.mark.parametrize("args, says", [
    (["--until", "loss=0.4", "--eval-every", "64"], "unknown metric 'loss'"),
    (["--until", "val_accuracy=80", "--eval-every", "64"], "at most 1"),
    (["--until", "val_loss=0.45"], "give eval_every too"),
    (["--eval-every", "0"], "--eval-every"),
    (["--max-epochs", "3"], "give until"),
    (["--until", "val_loss=0.45", "--eval-every", "64", "--max-epochs", "3", "--epochs", "2"], "give one"),
])
def test_a_bad_target_on_the_command_line_is_a_one_line_usage_error(tmp_path, args, says):
    result = CliRunner().invoke(cli, ["sweep", "--dry-run", "--data-dir", str(tmp_path), "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
