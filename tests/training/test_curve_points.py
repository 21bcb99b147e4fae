"""The validation curve's points at an epoch's end (catsdogs.training.curve): fit has just validated
the same weights on the same batches, so the point takes the epoch's logs and evaluates nothing
again. In-process, with a stand-in model: no training here."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from catsdogs.training.curve import Curve, TrainingStopped


def evaluating(**fields) -> SimpleNamespace:
    """A backend whose `evaluate` is the stand-in model's own, and `fields`."""
    return SimpleNamespace(evaluate=lambda model, batches, cache=None: tuple(model.evaluate(batches)), **fields)


class NoEvaluate:
    """A model whose evaluation must not run."""
    metrics_variables: list = []

    def evaluate(self, *args, **kwargs):
        raise AssertionError("evaluated again")


def curve(model) -> Curve:
    timer = SimpleNamespace(train_seconds_so_far=lambda now=None: 1.5)
    c = Curve(every=256, batch_size=1200, accumulate=1, per_epoch=1, val_batches=None, timer=timer, backend=evaluating(),
              epochs=12)
    c.set_model(model)
    c.points.append({"examples": 0})
    return c


def test_an_epochs_end_takes_fits_own_validation_from_its_logs_and_evaluates_nothing_again():
    # given a curve due at every step of a batch of 1,200 (one step an epoch)
    c = curve(NoEvaluate())
    # when an epoch ends with fit's validation in its logs
    c.on_epoch_end(0, {"loss": 0.7, "accuracy": 0.5, "val_loss": 0.61, "val_accuracy": 0.7})
    # then the point is those figures, at that step, with the training seconds so far
    assert c.points[-1] == {"step": 1, "examples": 1200, "train_seconds": 1.5, "val_loss": 0.61, "val_accuracy": 0.7}


def test_without_fits_validation_in_the_logs_the_curve_evaluates_itself():
    # given a model that evaluates to (0.5, 0.8), and an epoch's end whose logs hold no validation
    model = SimpleNamespace(metrics_variables=[], evaluate=lambda *a, **k: (0.5, 0.8))
    c = curve(model)
    c.on_epoch_end(0, {"loss": 0.7, "accuracy": 0.5})
    # then the point is its own evaluation's
    assert (c.points[-1]["val_loss"], c.points[-1]["val_accuracy"]) == (0.5, 0.8)


def test_the_model_as_it_starts_is_evaluated_once_per_seed_in_a_worker():
    from catsdogs.training import curve as curve_module

    # given a worker's first trial of a seed, whose model as it starts evaluates to (0.69, 0.5)
    curve_module._STARTS.clear()
    calls = []
    model = SimpleNamespace(metrics_variables=[], evaluate=lambda *a, **k: calls.append(1) or (0.69, 0.5))
    first = curve(model)
    first.points.clear()
    first.start_key = ("article", 64, "float32", 3, "data", "standard")
    first.start(model)
    # when a later trial of the same seed (another optimizer or batch size: the same weights) starts
    later = curve(NoEvaluate())
    later.points.clear()
    later.start_key = first.start_key
    later.start(later.model)
    # then its first point is the first trial's, evaluated once
    assert later.points == first.points == [{"step": 0, "examples": 0, "train_seconds": 0.0, "val_loss": 0.69,
                                              "val_accuracy": 0.5}]
    assert len(calls) == 1
    # and another seed evaluates its own
    other = curve(model)
    other.points.clear()
    other.start_key = first.start_key[:3] + (4,) + first.start_key[4:]
    other.start(model)
    assert len(calls) == 2


def test_a_step_cap_evaluates_there_and_stops_training_short_of_the_target():
    # given a curve every 256 images at batch 1 (1,200 steps an epoch) capped at step 300, whose
    # model never reaches its target
    from catsdogs.targets import parse

    evaluated = []
    model = SimpleNamespace(metrics_variables=[], evaluate=lambda *a, **k: evaluated.append(1) or (0.69, 0.5))
    timer = SimpleNamespace(outside_training=lambda: contextlib.nullcontext(2.0))
    c = Curve(every=256, batch_size=1, accumulate=1, per_epoch=1200, val_batches=None, timer=timer,
              backend=evaluating(sync_weights=lambda m: None), target=parse("val_loss=0.1"), epochs=1, stop_at=300)
    c.set_model(model)
    c.points.append({"examples": 0})
    c.next_at = 256
    # when fit runs its steps: evaluated at 256 (due), then not again before the cap
    c.on_epoch_begin(0)
    for batch in range(300):
        c.on_train_batch_begin(batch)
    assert [p["examples"] for p in c.points] == [0, 256] and c.stopped_at is None
    # then at step 300 the curve evaluates the weights there and ends training, the target unreached
    with pytest.raises(TrainingStopped):
        c.on_train_batch_begin(300)
    assert c.points[-1]["step"] == 300 and c.stopped_at == 300 and not c.reached and len(evaluated) == 2


def chance_curve(values, stop_at_chance=True, per_epoch=10, batch_size=32):
    """A curve every 64 images at batch 32 (320 images an epoch), its model evaluating to `values`
    in turn (after its start at (0.78, 0.5)), stopping at chance if asked; fit run for 3 epochs."""
    from catsdogs.targets import parse

    results = iter(values)
    model = SimpleNamespace(metrics_variables=[], evaluate=lambda *a, **k: next(results))
    timer = SimpleNamespace(outside_training=lambda: contextlib.nullcontext(2.0), train_seconds_so_far=lambda: 2.0)
    c = Curve(every=64, batch_size=batch_size, accumulate=1, per_epoch=per_epoch, val_batches=None, timer=timer,
              backend=evaluating(sync_weights=lambda m: None), target=parse("val_loss=0.5"), epochs=3,
              stop_at_chance=stop_at_chance)
    c.set_model(model)
    c.points.append({"step": 0, "examples": 0, "val_loss": 0.78, "val_accuracy": 0.5})
    c.next_at = 64
    return c


def run_steps(c, epochs=3, per_epoch=10):
    """fit's mid-epoch hooks (the epoch ends' evaluations left out); the step it stopped at, or None."""
    for epoch in range(epochs):
        c.on_epoch_begin(epoch)
        for batch in range(per_epoch):
            try:
                c.on_train_batch_begin(batch)
            except TrainingStopped:
                return c.stopped_at
    return None


def test_a_model_sitting_at_chance_for_an_epoch_stops_there_its_last_point_saying_so():
    # given a model whose validation loss falls to ln 2 and stays, its accuracy at 0.5 as it started
    c = chance_curve([(0.75, 0.5)] + [(0.6931, 0.5), (0.6934, 0.5), (0.6929, 0.5)] * 10)
    # when trained, evaluated every 2 steps (64 images)
    stopped = run_steps(c)
    # then it stops once its flat points span an epoch (10 steps: 4 to 14), not before
    assert stopped == 14 and c.points[-1]["stuck"] is True and c.stuck
    assert [p["step"] for p in c.points] == [0, 2, 4, 6, 8, 10, 12, 14]


@pytest.mark.parametrize("values, why", [
    ([(0.6931, 0.5), (0.68, 0.55), (0.66, 0.6)] * 10, "its loss moves"),
    ([(0.6931, 0.5), (0.6931, 0.6), (0.6931, 0.6)] * 10, "its accuracy left chance"),
])
def test_a_model_that_learns_is_never_stopped_as_stuck(values, why):
    # given a model that learns (or whose loss is flat while its accuracy rose)
    c = chance_curve(values)
    # when trained for 3 epochs, then it is never stopped
    assert run_steps(c) is None and not any(p.get("stuck") for p in c.points), why


def test_a_trial_not_asked_to_stop_at_chance_trains_on():
    # given the stuck model of above, in a trial without stop_at_chance (a sweep's, not the race's)
    c = chance_curve([(0.6931, 0.5)] * 30, stop_at_chance=False)
    # then it trains every step
    assert run_steps(c) is None and not c.stuck


def test_at_an_epochs_end_a_stuck_model_stops_fit():
    # given a batch of 320 (one step an epoch), its model at chance from its first epoch on
    c = chance_curve([], per_epoch=1, batch_size=320)
    c.model.stop_training = False
    logs = {"val_loss": 0.6931, "val_accuracy": 0.5}
    # when its epochs end: at its third point (two epochs: an epoch's span, and three points), it stops
    for epoch in range(2):
        c.on_epoch_end(epoch, logs)
        assert not c.model.stop_training
    c.on_epoch_end(2, logs)
    assert c.model.stop_training and c.points[-1]["stuck"] and c.stopped_at == 3
