"""The validation curve (`--eval-every`) and training until a target (`--until`), run by real
workers: the curve changes nothing the trial trains, on either backend; a target stops the trial
at the evaluation that reaches it, exactly where the same trial's curve first reaches it; a target
never reached is recorded so, and the trial is the whole trial."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from catsdogs.manifest import require_prepared
from catsdogs.runtime import backends
from catsdogs.schema import Status, TrialConfig
from catsdogs.training.local_slot import LocalSlot

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("curve")]  # (one process: curved_alone is shared)

SIZE = 32
BATCH = 8
EVERY = 16  # images between evaluations: every 2 steps of batch 8; 48 training images, 6 steps an epoch


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


def trial(data_dir: Path, **kw) -> TrialConfig:
    return TrialConfig(**{"optimizer": "adam", "batch_size": BATCH, "dataset": "standard", "seed": 3, "epochs": 3,
                          "image_size": SIZE, "data": require_prepared(data_dir)["fingerprint"]["standard"],
                          "backend": backends.name(), **kw})


def run(cfgs_and_every: list[tuple[TrialConfig, int | None]], data_dir: Path, workdir: Path) -> list:
    """Each trial in a fresh worker of its own, with the curve every so many images (or none)."""
    records = []
    for i, (cfg, every) in enumerate(cfgs_and_every):
        slot = LocalSlot(0, 1, workdir / str(i), isolate=True)
        try:
            records.append(slot.run(cfg, data_dir, eval_every=every))
        finally:
            slot.close()
    assert all(r.status == Status.DONE for r in records), [r.error for r in records]
    return records


@pytest.fixture(scope="module")
def curved_alone():
    """curved_alone(data_dir, workdir) -> the trial with its curve every 16 images, alone in a fresh
    worker: run once a backend in this process, for the two tests that compare with it."""
    made: dict = {}

    def get(data_dir: Path, workdir: Path):
        if backends.name() not in made:
            (made[backends.name()],) = run([(trial(data_dir), EVERY)], data_dir, workdir)
        return made[backends.name()]

    return get


def trained(record) -> tuple:
    """What a trial trained to: its weights, test results, per-epoch losses and accuracies, updates."""
    history = [{k: v for k, v in row.items() if "seconds" not in k} for row in record.history]
    return record.weights_digest, record.test_accuracy, record.test_loss, history, record.steps


def test_the_curve_changes_nothing_the_trial_trains_and_is_evaluated_every_n_images(keras_backend, data_dir,
                                                                                   tmp_path, curved_alone):
    # given one trial, run without a curve and with one every 16 training images, each alone
    (plain,) = run([(trial(data_dir), None)], data_dir, tmp_path)
    curved = curved_alone(data_dir, tmp_path / "curved")
    # then it trained exactly as without it: weights, test results, every epoch's logs, updates
    assert trained(curved) == trained(plain)
    assert plain.curve is None and plain.target_reached is None
    # and the curve has a point at the start and every 16 images after, through the last step
    assert [p["examples"] for p in curved.curve] == list(range(0, 3 * 48 + 1, EVERY))
    assert [p["step"] for p in curved.curve] == [p["examples"] // BATCH for p in curved.curve]
    clocks = [p["train_seconds"] for p in curved.curve]
    assert clocks[0] == 0 and clocks == sorted(clocks)
    # and at each epoch's end its point is fit's own validation of those weights, taken from the
    # epoch's logs rather than evaluated twice: the same figures as the epoch's row
    ends = [p for p in curved.curve if p["examples"] and p["examples"] % 48 == 0]
    assert [(p["val_loss"], p["val_accuracy"]) for p in ends] == \
        [(row["val_loss"], row["val_accuracy"]) for row in curved.history]
    # and its time is counted apart, in no epoch's clock
    assert curved.eval_seconds > 0
    assert curved.fit_seconds >= sum(row["seconds"] for row in curved.history) + 0.5 * curved.eval_seconds


def test_a_target_stops_the_trial_where_its_curve_first_reaches_it(keras_backend, data_dir, tmp_path, curved_alone):
    # given a trial's curve, and a target on val_loss that the curve first reaches mid-epoch, at an
    # evaluation whose loss is below every point before it
    free = curved_alone(data_dir, tmp_path / "free")
    losses = [p["val_loss"] for p in free.curve]
    first = next(i for i in range(2, len(losses)) if losses[i] < min(losses[:i]) and (i * EVERY // BATCH) % 6)
    value = (losses[first] + min(losses[:first])) / 2
    # when the same trial trains until that target, and then, in the same worker, the trial without one
    slot = LocalSlot(0, 1, tmp_path / "kept")
    try:
        stopped = slot.run(trial(data_dir, until=f"val_loss={value!r}", eval_every=EVERY), data_dir)
        again = slot.run(trial(data_dir), data_dir, eval_every=EVERY)
    finally:
        slot.close()
    assert stopped.status == again.status == Status.DONE, (stopped.error, again.error)
    # then it stopped at that evaluation: the same curve up to there, and no step more
    assert stopped.curve == [{**p, "train_seconds": q["train_seconds"]} for p, q in
                             zip(free.curve[:first + 1], stopped.curve, strict=True)]
    assert stopped.steps == free.curve[first]["step"] and stopped.batches == stopped.steps
    # its steps to the target interpolated between the evaluations around the crossing
    before, at = free.curve[first - 1], free.curve[first]
    fraction = (before["val_loss"] - value) / (before["val_loss"] - at["val_loss"])
    assert stopped.target_reached == 1
    assert stopped.steps_to_target == pytest.approx(before["step"] + fraction * (at["step"] - before["step"]), abs=1e-3)
    assert stopped.examples_to_target == pytest.approx(stopped.steps_to_target * BATCH, abs=0.1)
    # the epoch it ended is in its history, with the batches it ran and its last validation
    assert stopped.history[-1]["batches"] == stopped.steps % 6
    assert stopped.history[-1]["val_loss"] == at["val_loss"] and stopped.val_accuracy == at["val_accuracy"]
    assert stopped.weights_digest != free.weights_digest
    # and a fit that a target ended leaves nothing behind: the worker's next trial, reusing its step,
    # trains as the trial alone in a fresh worker did
    assert again.step_reused and trained(again) == trained(free)
    assert [{**p, "train_seconds": 0} for p in again.curve] == [{**p, "train_seconds": 0} for p in free.curve]


def test_a_step_cap_stops_a_trial_short_of_its_target_within_an_epoch(keras_backend, data_dir, tmp_path,
                                                                       curved_alone):
    # given a trial's curve (6 steps an epoch, an evaluation every 2), and the same trial to a
    # target it never reaches, capped at step 8: in its second epoch
    free = curved_alone(data_dir, tmp_path / "free")
    (capped,) = run([(trial(data_dir, until="val_loss=0.001", eval_every=EVERY, max_steps=8), None)], data_dir,
                    tmp_path / "capped")
    # then it trained 8 steps, the second epoch's 2 in its history, short of the target
    assert capped.steps == capped.batches == 8 and capped.target_reached == 0
    assert len(capped.history) == 2 and capped.history[-1]["batches"] == 2
    # and its curve is the uncapped trial's up to there: the cap changes nothing before it
    assert [{**p, "train_seconds": 0} for p in capped.curve] == [{**p, "train_seconds": 0} for p in free.curve
                                                                 if p["step"] <= 8]


def test_a_target_never_reached_is_recorded_so_and_the_trial_runs_its_epochs(data_dir, tmp_path):
    cfg = trial(data_dir, until="val_loss=0.001", eval_every=EVERY, epochs=2)
    (plain, missed) = run([(replace(cfg, until=None, eval_every=None), None), (cfg, None)], data_dir, tmp_path)
    assert missed.target_reached == 0
    assert (missed.steps_to_target, missed.examples_to_target, missed.seconds_to_target) == (None, None, None)
    assert trained(missed) == trained(plain)  # every epoch, as the trial without a target


def test_the_final_weights_are_evaluated_even_off_an_update_boundary(data_dir, tmp_path):
    # given 6 batches an epoch, accumulated 4 to an update: the last batch ends no update
    (r,) = run([(trial(data_dir, accumulate=4, epochs=1), EVERY)], data_dir, tmp_path)
    # then the curve's last point is the end of training all the same
    assert r.curve[-1]["examples"] == 48 and r.curve[-1]["val_loss"] == pytest.approx(r.history[-1]["val_loss"], rel=1e-4)


def test_a_trial_that_sits_at_chance_stops_an_epoch_in_when_asked_and_trains_on_when_not(data_dir, tmp_path):
    # given Adam at a rate high enough that the model collapses to one constant output (a validation
    # loss of ln 2: chance), to a target it never reaches, for 6 epochs of 6 steps; once stopping at
    # chance, once not
    cfg = trial(data_dir, until="val_loss=0.001", eval_every=EVERY, epochs=6, lr=0.03)
    (stopped, plain) = run([(replace(cfg, stop_at_chance=True), None), (cfg, None)], data_dir, tmp_path)
    # then the trial asked to stops once an epoch of its points sat flat at chance, its last point saying so
    assert stopped.curve[-1].get("stuck") is True and stopped.target_reached == 0
    assert stopped.steps < 36 and not any(p.get("stuck") for p in stopped.curve[:-1])
    # and its curve is the other's up to there, which trained all 36 steps, never marked stuck
    assert plain.steps == 36 and not any(p.get("stuck") for p in plain.curve)
    assert [{**p, "train_seconds": 0} for p in stopped.curve[:-1]] == \
        [{**p, "train_seconds": 0} for p in plain.curve[:len(stopped.curve) - 1]]
