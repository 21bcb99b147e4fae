"""Beyond the article: learning-rate scaling, equal-update budgets, accumulation, precision.

Each option is off by default (the article's protocol) and is part of the trial's identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from catsdogs.schema import Status, TrialConfig, plan_steps
from catsdogs.store import CSV_COLUMNS

SIZE = 32


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    return prepared_data(SIZE, (32, 4, 4))


def config(**kw) -> TrialConfig:
    base = dict(optimizer="adam", batch_size=16, dataset="standard", seed=0, epochs=1, image_size=SIZE)
    return TrialConfig(**{**base, **kw})


def trial(data_dir, **kw):
    """One trial, trained here, in this process's engine (its compiled step kept, as a worker keeps it)."""
    from catsdogs.training.engine import run_trial

    return run_trial(config(**kw), data_dir)


def kept_step(cfg: TrialConfig, n_train: int):
    """The compiled step the engine kept for a trial it ran: its model and optimizer."""
    from catsdogs.runtime import backends
    from catsdogs.training import steps

    step, reused = steps.STEPS.get(cfg, plan_steps(cfg, n_train)[0], backends.current())
    assert reused, "the trial's step was not kept"
    return step


def test_defaults_are_the_articles_protocol():
    cfg = TrialConfig("adam", 64, "standard", 0)
    assert (cfg.lr, cfg.lr_scaling, cfg.budget, cfg.accumulate, cfg.precision, cfg.strategy,
            cfg.warmup_epochs) == (None, "none", "epochs", 1, "float32", "none", 0.0)
    # and every option is a column of the results CSV
    assert {"lr", "lr_scaling", "budget", "accumulate", "precision", "strategy"} <= set(CSV_COLUMNS)


@pytest.mark.parametrize("change", [{"lr": 0.01}, {"lr_scaling": "linear"}, {"budget": "steps"},
                                    {"accumulate": 2}, {"precision": "mixed_bfloat16"},
                                    {"warmup_epochs": 1.0}, {"strategy": "mirrored"}])
def test_every_option_changes_the_trial_key(change):
    assert TrialConfig("adam", 64, "standard", 0).key() != TrialConfig("adam", 64, "standard", 0, **change).key()


@pytest.mark.slow
def test_gradient_accumulation_updates_once_per_n_batches(data_dir):
    # given 64 training images, batches of 8, accumulation over 4 batches
    r = trial(data_dir, batch_size=8, accumulate=4)
    # then 8 batches were seen but the weights changed twice (an effective batch of 32)
    assert r.batches == 8 and r.steps == 2


@pytest.mark.slow
def test_accumulated_small_batches_match_the_large_batch_they_stand_for(data_dir):
    # SGD on a mean loss: 2 x 16 accumulated is one update on the mean gradient of 32 images,
    # the same as one batch of 32, up to float rounding; the first update starts equal
    big = trial(data_dir, optimizer="sgd", batch_size=32, epochs=1)
    acc = trial(data_dir, optimizer="sgd", batch_size=16, accumulate=2, epochs=1)
    assert big.steps == acc.steps == 2
    assert acc.history[0]["loss"] == pytest.approx(big.history[0]["loss"], rel=0.05)


@pytest.mark.slow
def test_the_steps_budget_gives_every_batch_size_the_base_updates(data_dir):
    # base batch size 8 on 64 images: 8 updates per epoch, whatever the batch size
    small = trial(data_dir, batch_size=8, budget="steps", base_batch_size=8)
    large = trial(data_dir, batch_size=32, budget="steps", base_batch_size=8)
    assert small.steps == large.steps == 8
    # while the article's budget gives the large batch a quarter of them
    assert trial(data_dir, batch_size=32).steps == 2


@pytest.mark.slow
def test_the_optimizer_trains_with_the_scaled_learning_rate_the_record_names(data_dir):
    import keras

    # given SGD at batch 32 with linear scaling from a base batch of 8: 0.01 x 32 / 8
    r = trial(data_dir, optimizer="sgd", batch_size=32, lr_scaling="linear", base_batch_size=8)
    used = kept_step(config(optimizer="sgd", batch_size=32, lr_scaling="linear", base_batch_size=8), r.n_train)
    # then the optimizer that trained it has that rate, and the record says so
    assert float(keras.ops.convert_to_numpy(used.model.optimizer.learning_rate)) == pytest.approx(0.04)
    assert r.learning_rate == pytest.approx(0.04)
    # and an explicit rate is the optimizer's too
    r = trial(data_dir, lr=0.003)
    used = kept_step(config(lr=0.003), r.n_train)
    assert float(keras.ops.convert_to_numpy(used.model.optimizer.learning_rate)) == pytest.approx(0.003)
    assert r.learning_rate == 0.003


@pytest.mark.slow
def test_bfloat16_mixed_precision_trains_in_bfloat16_with_a_float32_output(data_dir):
    import math

    # given the mixed bfloat16 policy, when a trial trains
    r = trial(data_dir, precision="mixed_bfloat16")
    assert r.status == Status.DONE and r.steps == 4 and math.isfinite(r.test_loss)
    # then its hidden layers computed in bfloat16 (weights kept in float32), and its logit is float32
    model = kept_step(config(precision="mixed_bfloat16"), r.n_train).model
    conv, dense, logit = (layer for layer in model.layers if layer.weights)
    assert conv.dtype_policy.compute_dtype == dense.dtype_policy.compute_dtype == "bfloat16"
    assert conv.dtype_policy.variable_dtype == "float32"
    assert logit.dtype_policy.compute_dtype == "float32" and model.outputs[0].dtype == "float32"


@pytest.mark.slow
def test_mirrored_strategy_splits_the_global_batch_over_two_cpu_replicas(data_dir, tmp_path):
    from catsdogs.training.local_slot import LocalSlot

    # given no GPU, two logical CPU devices stand in for two GPUs (a worker of its own:
    # TensorFlow fixes its devices when it starts; CATSDOGS_LOGICAL_CPUS defaults to 2)
    cfg = TrialConfig("adam", 16, "standard", 0, epochs=1, image_size=SIZE, strategy="mirrored")
    slot = LocalSlot(0, 1, tmp_path)
    try:
        r = slot.run(cfg, data_dir)
        mirrored_worker = slot.running
        # when a plain trial follows it in the same slot
        plain = slot.run(TrialConfig("adam", 16, "standard", 0, epochs=1, image_size=SIZE), data_dir)
        plain_worker = slot.running
    finally:
        slot.close()
    # then one trial trains on both replicas, the batch of 16 being the global batch
    assert r.status == Status.DONE, r.error
    assert r.replicas == 2 and r.steps == 64 // 16
    assert mirrored_worker.env["CATSDOGS_LOGICAL_CPUS"] == "2"
    # and the plain trial ran in the slot's own worker, started without the logical devices
    assert plain.status == Status.DONE and plain.replicas == 1
    assert plain_worker is slot.worker and "CATSDOGS_LOGICAL_CPUS" not in plain_worker.env


def test_the_fused_adam_update_equals_keras_adam():
    import keras
    import numpy as np

    from catsdogs.runtime.backends.tensorflow import adam_class

    # given the same weights and gradients, when both optimizers take three steps
    rng = np.random.default_rng(0)
    w0, grads = rng.normal(size=(50, 7)), [rng.normal(size=(50, 7)) for _ in range(3)]
    out = []
    for cls in (keras.optimizers.Adam, adam_class(fused=True)):
        w = keras.Variable(w0.astype("float32"))
        opt = cls(learning_rate=0.01)
        for g in grads:
            opt.apply_gradients([(keras.ops.convert_to_tensor(g.astype("float32")), w)])
        out.append(np.asarray(w))
    # then the weights agree to float32 rounding
    np.testing.assert_allclose(out[0], out[1], rtol=0, atol=1e-6)
    assert not np.allclose(out[0], w0)
