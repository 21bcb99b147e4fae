"""A trial's validation curve (`sweep --eval-every N`) and its stop at a target (`--until`).

The curve is a Keras callback beside the engine's EpochTimer. It evaluates the validation split
each time N more training images have been seen, at the first update boundary after (every
batch size is looked at after the same number of images, so a small batch's noisy curve is not
looked at more often per image, which would let it cross a target earlier by chance), and
always at one evaluation batch size (config.EVAL_BATCH_SIZE), whatever the training batch.

Where it runs, and why it changes nothing in training:
- at a step boundary it runs in `on_train_batch_begin`, before the next step: a callback that
  overrides a *batch-end* hook makes Keras turn every step's logs into Python floats, a device
  sync per step that would slow the very training it times. At an epoch's end it runs in
  `on_epoch_end`, after the timer has closed the epoch;
- mid-epoch Keras's JAX trainer holds the weights apart from the model: the backend's
  `sync_weights` puts them back (the trainer's own protocol for callbacks that read the model),
  and fit takes them up again from there at its next step;
- the backend's `evaluate` leaves the metrics fit is accumulating the epoch's loss and accuracy
  in as they were, so the epoch's logs are as without it;
- its time is outside the epoch's clocks (EpochTimer.outside_training, after waiting for the
  steps dispatched so far), as the noise scale's is;
- the first point, the model as it starts, is the same for every trial of a seed (the same
  weights, the same batches: as `diagnosis.initial_diagnosis` says), so a worker evaluates it once
  per seed, model, image size, precision and data;
- at an epoch's end the epoch's validation (fit's own, or the timer's: Backend.FIT_VALIDATES)
  has just validated these weights on the same batches (the trial's validation split at
  config.EVAL_BATCH_SIZE), so the point takes its `val_loss` and `val_accuracy` from the
  epoch's logs instead of evaluating them a second time: at a large batch,
  one or a few steps an epoch, that was every other evaluation of a trial (the race's trials at
  1,200 on 1,200 training images: two a step).

A target ends training at the evaluation that reaches it: at an epoch's end by Keras's own
`stop_training`; mid-epoch by raising TrainingStopped from `on_train_batch_begin` (Keras checks
stop_training only after a step, which would train one more), which the engine catches. The
weights are then exactly those the last point evaluated. A step cap (`stop_at`, a trial's
`max_steps`: the race's cap within an epoch) ends training the same way, after evaluating there:
a batch-1 trial capped at 300 steps no longer trains the rest of its 1,200-step epoch.

A trial that is stuck at chance (`stop_at_chance`, a trial's field: the race's trials) ends the
same way: once its last points over an epoch of images (at least STUCK_POINTS of them) hold a
validation loss flat to within STUCK_LOSS and an accuracy no better than its first point's (the
model as it started, at chance) by more than STUCK_ACCURACY. Such a model predicts one constant:
in 0.32.0's Adam race on this CPU six trials sat at a validation loss of 0.693 (ln 2) and accuracy
0.5 from their 64th step on, and every one stayed there for the rest of its 12 epochs, 117 s of the
race's 632. The last point then says so (`"stuck": True`), and the race counts the trial as
short of its target at its whole cap.
"""

from __future__ import annotations

import time

import keras

from catsdogs.targets import Target

VAL = ("val_loss", "val_accuracy")  # a point's validation figures, as fit's logs name them
_STARTS: dict[tuple, tuple[float, float]] = {}  # the model as it starts, validated: by what decides it
MOST_STARTS = 64  # kept at once (a race interleaves up to 18 seeds)
STUCK_POINTS = 3  # a stuck trial's flat points, at the least (and an epoch of images)
STUCK_LOSS = 1e-3  # their validation losses' range, at the most
STUCK_ACCURACY = 0.02  # their accuracy above the model's as it started, at the most


class TrainingStopped(Exception):
    """Raised inside fit at the step boundary where the curve reached its target, its step cap or
    a stuck model: training ends there."""


class Curve(keras.callbacks.Callback):
    """Evaluates `val_batches` every `every` training images (batch_size each batch, one update
    per `accumulate` batches, `per_epoch` batches an epoch); `points` is the curve, `seconds` its
    time, `stopped_at` the batches trained when a target or the cap (`stop_at` batches, within an
    epoch) stopped training (else None)."""

    def __init__(self, every: int, batch_size: int, accumulate: int, per_epoch: int, val_batches, timer,
                 backend, target: Target | None = None, epochs: int | None = None, start_key: tuple | None = None,
                 stop_at: int | None = None, stop_at_chance: bool = False, compiled: dict | None = None):
        super().__init__()
        self.compiled = compiled  # what the backend's `evaluate` compiles, kept (the step's)
        self.stop_at, self.stop_at_chance = stop_at, stop_at_chance
        self.start_key = start_key  # what decides the model as it starts (None: evaluate it every time)
        self.every, self.batch_size, self.accumulate, self.per_epoch = every, batch_size, accumulate, per_epoch
        self.val_batches, self.timer, self.backend, self.target = val_batches, timer, backend, target
        self.epochs = epochs  # the last epoch's end is always evaluated: the final weights
        self.points: list[dict] = []
        self.seconds = 0.0
        self.next_at = 0  # images seen at which the next evaluation is due
        self.epoch = 0
        self.stopped_at: int | None = None

    @property
    def reached(self) -> bool:
        return bool(self.target and self.points and self.target.reached(self.points[-1]))

    @property
    def stuck(self) -> bool:
        """Whether the points over the last epoch of images say the model sits at chance (above)."""
        if not (self.stop_at_chance and self.points):
            return False
        after, epoch = self.points[1:], self.per_epoch * self.batch_size  # (the start's point is the model untrained)
        spans = [i for i, p in enumerate(after) if after[-1]["examples"] - p["examples"] >= epoch]
        if not spans or len(after) < STUCK_POINTS:
            return False  # (less than an epoch trained since the first point after the start, or fewer points)
        last = after[min(spans[-1], len(after) - STUCK_POINTS):]
        losses = [p["val_loss"] for p in last]
        return (max(losses) - min(losses) <= STUCK_LOSS
                and max(p["val_accuracy"] for p in last) <= self.points[0]["val_accuracy"] + STUCK_ACCURACY)

    def _stop_if_stuck(self) -> bool:
        """Whether to stop as stuck; the last point then says so."""
        if not self.stuck:
            return False
        self.points[-1]["stuck"] = True
        return True

    def start(self, model) -> bool:
        """The first point, before fit: the model as it starts. True when it already meets the target.
        Every trial of a seed starts from the same weights and validates on the same batches, so
        the point is evaluated once per `start_key` in a worker and taken again after that."""
        self.set_model(model)
        known = _STARTS.get(self.start_key) if self.start_key is not None else None
        self._evaluate(0, train_seconds=0.0, logs=None if known is None else dict(zip(VAL, known, strict=True)))
        if self.start_key is not None and known is None:
            if len(_STARTS) >= MOST_STARTS:
                _STARTS.pop(next(iter(_STARTS)))
            _STARTS[self.start_key] = (self.points[-1]["val_loss"], self.points[-1]["val_accuracy"])
        if self.reached:
            self.stopped_at = 0
        return self.reached

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        done = self.epoch * self.per_epoch + batch  # batches trained before this one
        capped = self.stop_at is not None and done >= self.stop_at
        if not (self._due(done) or capped):
            return
        self.backend.sync_weights(self.model)
        with self.timer.outside_training() as train_seconds:
            self._evaluate(done, train_seconds)
        if self.reached or capped or self._stop_if_stuck():
            self.stopped_at = done
            raise TrainingStopped()

    def on_epoch_end(self, epoch, logs=None):
        done = (epoch + 1) * self.per_epoch
        final = epoch + 1 == self.epochs and self.points[-1]["examples"] != done * self.batch_size
        if not (self._due(done) or final):
            return
        self._evaluate(done, self.timer.train_seconds_so_far(), logs)  # the timer has closed the epoch
        if self.reached or self._stop_if_stuck():
            self.stopped_at = done
            self.model.stop_training = True

    def _due(self, done: int) -> bool:
        return done % self.accumulate == 0 and done * self.batch_size >= self.next_at

    def _evaluate(self, done: int, train_seconds: float, logs: dict | None = None) -> None:
        started = time.perf_counter()
        model = self.model
        if logs and all(k in logs for k in VAL):  # the epoch's validation just now, or the start's known one
            val_loss, val_accuracy = (logs[k] for k in VAL)
        else:  # (fit's running metrics left as they are: the backend's `evaluate`)
            val_loss, val_accuracy = self.backend.evaluate(model, self.val_batches, self.compiled)
        examples = done * self.batch_size
        self.points.append({"step": done // self.accumulate, "examples": examples,
                            "train_seconds": round(train_seconds, 4),
                            "val_loss": float(val_loss), "val_accuracy": float(val_accuracy)})
        self.next_at = (examples // self.every + 1) * self.every
        self.seconds += time.perf_counter() - started
