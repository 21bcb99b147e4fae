"""A trial's clocks and the callbacks fit runs: `EpochTimer`, which times each epoch's training
and validation (and validates, where fit does not: Backend.FIT_VALIDATES), and `FitCallbacks`,
the list fit calls them through. Runs inside a worker, beside catsdogs.training.engine.
"""

from __future__ import annotations

import contextlib
import time

import keras

from catsdogs.training.curve import VAL


class FitCallbacks(keras.callbacks.CallbackList):
    """Keras's CallbackList for a trial's fit, without its per-step batch-end calls, which none of a
    trial's callbacks (the timer, the curve, Keras's History) listens to. Keras hands every step's
    logs to a thread that turns them into Python floats (a device-to-host copy a step on a GPU),
    then calls each callback's no-op hook. Where steps are as short as a GPU's small batches' (JAX
    at 16 px, batch 8, on this CPU) a step took 1.20 ms against 1.67 (benchmarks/
    bench_fit_callbacks.py); at 64 px the difference is within the noise. A callback that listens
    to batch ends is refused (TypeError): it would never be called."""

    def __init__(self, callbacks: list, **kwargs):
        for c in callbacks:
            if any(getattr(type(c), hook) is not getattr(keras.callbacks.Callback, hook)
                   for hook in ("on_train_batch_end", "on_batch_end")):
                raise TypeError(f"{type(c).__name__} listens to batch ends, which FitCallbacks does not call")
        super().__init__(callbacks, **kwargs)

    def on_train_batch_end(self, batch, logs=None):
        pass

    def on_batch_end(self, batch, logs=None):
        pass


class EpochTimer(keras.callbacks.Callback):
    """Times the training and validation parts of each epoch, reporting each (`on_epoch(row)`).
    The end of training is stamped after `wait_for_steps(model)`: a backend that dispatches steps
    asynchronously (JAX) would otherwise have its training end when the last step was queued.
    `after_epoch(epoch)` (1-based) runs once the epoch's clock has stopped, so its time is in
    neither `train_seconds` nor `seconds`, and its fields join the epoch's row: at `on_epoch_end`
    Keras's JAX trainer has put the weights back on the model, so they can be read. What runs
    inside `outside_training()` (the curve's evaluations mid-epoch) is in neither clock either.
    `validate()`, where fit does not validate (Backend.FIT_VALIDATES), runs once training's clock
    has stopped, in the epoch's `seconds`, its figures in the epoch's logs."""

    def __init__(self, n_epochs: int, on_epoch=None, wait_for_steps=lambda model: None, after_epoch=None, validate=None):
        super().__init__()
        self.n_epochs, self.on_epoch, self.wait_for_steps, self.after_epoch = n_epochs, on_epoch, wait_for_steps, after_epoch
        self.validate = validate  # () -> the epoch's (val_loss, val_accuracy), where fit does not validate
        self.epochs: list[dict] = []
        self.t0: float | None = None  # the running epoch's start (None between epochs)
        self.outside = 0.0  # the running epoch's seconds outside training

    def on_epoch_begin(self, epoch, logs=None):
        self.t0, self.t_train, self.outside = time.perf_counter(), None, 0.0

    def on_test_begin(self, logs=None):  # validation starts: training of the epoch is over
        if self.t_train is None:
            self.wait_for_steps(self.model)
            self.t_train = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self.t_train is None:  # fit did not validate: training ends with the epoch
            self.wait_for_steps(self.model)
            if self.validate is not None:  # ... and the validation comes now, in the epoch's logs
                self.t_train = time.perf_counter()
                logs.update(zip(VAL, self.validate(), strict=True))
        end = time.perf_counter()
        self._close({"epoch": epoch + 1, "train_seconds": (self.t_train or end) - self.t0 - self.outside,
                     "seconds": end - self.t0 - self.outside}, logs)

    @property
    def finished_train_seconds(self) -> float:
        """Training seconds of the finished epochs."""
        return sum(e["train_seconds"] for e in self.epochs)

    def train_seconds_so_far(self, now: float | None = None) -> float:
        """Training seconds of the finished epochs, and of the running one up to `now`."""
        running = (now or time.perf_counter()) - self.t0 - self.outside if self.t0 is not None else 0.0
        return self.finished_train_seconds + running

    @contextlib.contextmanager
    def outside_training(self):
        """Stop the running epoch's clocks while the block runs, once the steps dispatched so far
        have run (they are training); yields the training seconds so far."""
        self.wait_for_steps(self.model)
        paused = time.perf_counter()
        try:
            yield self.train_seconds_so_far(paused)
        finally:
            self.outside += time.perf_counter() - paused

    def end_partial(self, train_seconds: float, batches: int, logs: dict) -> None:
        """The epoch a target ended after `batches` batches, at `train_seconds` of training in all."""
        seconds = train_seconds - self.finished_train_seconds
        self._close({"epoch": len(self.epochs) + 1, **logs, "train_seconds": seconds, "seconds": seconds,
                     "batches": batches}, logs)  # no History row for it: its logs are the timer's

    def _close(self, row: dict, logs) -> None:
        self.t0 = None
        if self.after_epoch:
            row.update(self.after_epoch(row["epoch"]))
        self.epochs.append(row)
        if self.on_epoch:
            self.on_epoch({**row, "epochs": self.n_epochs, **{k: float(v) for k, v in (logs or {}).items()}})
