"""The trial's callbacks as fit calls them (catsdogs.training.timer.FitCallbacks): every epoch hook
and Keras's History, no batch-end dispatch. In-process, on a tiny model: no trial."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from catsdogs.training.timer import EpochTimer, FitCallbacks


class EpochsAndBatchStarts(keras.callbacks.Callback):
    """Records the hooks a trial's callbacks use: epoch ends and batch starts (the curve's)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(("batch", batch))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(("epoch", epoch, sorted(logs)))


class BatchEnds(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


def a_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.slow  # (it trains: a tiny model, two epochs)
def test_fit_through_the_trials_callbacks_calls_every_hook_a_trial_uses_and_keeps_its_history():
    # given a tiny model and a callback listening to what the timer and the curve listen to
    model, seen = a_model(), EpochsAndBatchStarts()
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 1), "float32")
    timer = EpochTimer(2)
    # when fit runs through FitCallbacks, 2 epochs of 2 steps
    callbacks = FitCallbacks([timer, seen], add_history=True, model=model, epochs=2, steps=2)
    history = model.fit(x, y, batch_size=4, epochs=2, callbacks=callbacks, shuffle=False, verbose=0)
    # then every batch start and epoch end came, the timer timed both epochs, and History has them
    assert [s[:2] for s in seen.seen] == [("batch", 0), ("batch", 1), ("epoch", 0), ("batch", 0), ("batch", 1),
                                          ("epoch", 1)]
    assert [e["epoch"] for e in timer.epochs] == [1, 2] and len(history.history["loss"]) == 2


def test_a_callback_that_listens_to_batch_ends_is_refused():
    # given a callback with its own batch-end hook, which FitCallbacks never calls
    # then it is refused when the list is made, not silently skipped
    with pytest.raises(TypeError, match="BatchEnds listens to batch ends"):
        FitCallbacks([BatchEnds()], add_history=True, model=a_model(), epochs=1, steps=1)


def test_where_fit_does_not_validate_the_timer_does_after_trainings_clock_stops():
    # given a timer that validates each epoch (JAX's: Backend.FIT_VALIDATES is False) in 0.2 s
    import time

    rows, logs, called = [], {"loss": 0.7, "accuracy": 0.5}, []
    timer = EpochTimer(1, rows.append, validate=lambda: called.append(time.perf_counter()) or time.sleep(0.2) or (0.61, 0.75))
    timer.set_model(object())
    # when an epoch ends, fit having validated nothing
    timer.on_epoch_begin(0)
    timer.on_epoch_end(0, logs)
    # then the epoch's logs hold the validation (History and the curve read them there), its
    # seconds the validation's time, and its training seconds none of it
    assert logs["val_loss"] == 0.61 and logs["val_accuracy"] == 0.75 and rows[0]["val_loss"] == 0.61
    assert rows[0]["seconds"] - rows[0]["train_seconds"] >= 0.2 and timer.t_train <= called[0]
