"""The learning-rate range test (Smith 2017, "Cyclical learning rates", section 3.3): one short
run from a seed's initial weights whose learning rate grows geometrically at every step, the
training loss recorded at each. Where the loss falls fastest the rate is doing its work; where it
stops falling the rate is too large. catsdogs.recommendation reads the rate to anchor at from
the losses (`recommendation.range_test_rate`); this module only runs it, inside a worker, with the
trial's own model, optimizer implementation, precision and input pipeline.

Keras's fit reports the epoch's running mean of the loss after each batch, so a batch's own loss
is the difference of two running sums. The run stops at the first loss that is not finite, or
that exceeds DIVERGED times the least so far: the rates beyond it have nothing to say.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import keras

from catsdogs.messages import RangeTestRecord, RangeTestTask
from catsdogs.schema import Status, TrialConfig
from catsdogs.training import backends, steps, user_model
from catsdogs.training.model import build_model, loss_and_metrics

DIVERGED = 4.0  # a loss this many times the least so far ends the run


def run_range_test(task: RangeTestTask) -> RangeTestRecord:
    """The losses of a run from `task.low` to `task.high` over `task.steps` steps at `task.batch_size`."""
    backend = backends.current()
    backend.start()
    started = time.perf_counter()
    manifest, splits = steps.DATA.load(Path(task.data_dir), task.dataset)
    size = manifest["params"]["size"]
    cfg = TrialConfig(task.optimizer, task.batch_size, task.dataset, task.seed, epochs=1, image_size=size,
                      data=manifest["fingerprint"][task.dataset], precision=task.precision, backend=backend.NAME,
                      deterministic=task.deterministic, tf32=task.tf32)
    cfg.check()
    backends.check_settings(cfg, backend.running_settings())
    keras.mixed_precision.set_dtype_policy(cfg.precision)
    keras.utils.set_random_seed(cfg.seed)
    strategy = backend.distribution(cfg.strategy)
    growth = (task.high / task.low) ** (1.0 / max(1, task.steps - 1))
    with strategy.scope():
        if task.model:
            model = user_model.build(task.model)
            loss, _ = user_model.loss_and_metrics(user_model.choose_loss(model, task.loss))
        else:
            model = build_model(size)
            loss, _ = loss_and_metrics()
        schedule = keras.optimizers.schedules.ExponentialDecay(task.low, decay_steps=1, decay_rate=growth)
        model.compile(optimizer=backend.optimizer_class(cfg.optimizer, cfg.strategy)(learning_rate=schedule), loss=loss)
        train = steps.as_model_input(splits["train"], model)
        batches = backend.train_batches(train, cfg.batch_size, cfg.seed, task.steps, cross_epochs=True)
        recorder = LossRecorder()
        model.fit(batches, epochs=1, steps_per_epoch=task.steps, callbacks=[recorder], shuffle=False, verbose=0)
    losses = recorder.losses
    return RangeTestRecord(status=Status.DONE, learning_rates=[task.low * growth**k for k in range(len(losses))],
                           losses=losses, seconds=round(time.perf_counter() - started, 3))


class LossRecorder(keras.callbacks.Callback):
    """Each batch's own training loss (from fit's running mean), until the loss diverges."""

    def __init__(self):
        super().__init__()
        self.losses: list[float] = []
        self._sum = 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float((logs or {}).get("loss", math.nan))
        total = mean * (batch + 1)
        value = total - self._sum
        self._sum = total
        self.losses.append(value)
        if not math.isfinite(value) or value > DIVERGED * min(self.losses):
            self.model.stop_training = True
