"""A trial's test figures and its collapse diagnosis from one pass over the test set: what
`model.evaluate` and a second pass of the diagnosis gave, read off the hidden layer's pass."""

from __future__ import annotations

from types import SimpleNamespace

import keras
import numpy as np
import pytest

from catsdogs.data.loading import Split
from catsdogs.runtime import backends
from catsdogs.training import diagnosis, steps
from catsdogs.training.diagnosis import diagnose
from catsdogs.training.model import build_model, loss_and_metrics


def compiled_step(size: int = 16, seed: int = 0, user: bool = False, spread: float = 1.0) -> SimpleNamespace:
    """The article's model compiled as a trial's step is, its weights drawn for `seed` (the logit's
    kernel times `spread`: a trained model's logits lie far from 0 on both sides); the inspection
    model beside it unless it stands for a user's model."""
    keras.utils.set_random_seed(seed)
    model = build_model(size)
    kernel, bias = model.layers[-1].get_weights()
    model.layers[-1].set_weights([kernel * spread, bias])
    loss, metrics = loss_and_metrics()
    model.compile(optimizer="sgd", loss=loss, metrics=metrics)
    return SimpleNamespace(model=model, loss=loss, inspect=None if user else steps.inspection_model(model),
                           backend=backends.current(), compiled={})


def a_test_set(size: int, n: int, seed: int):
    """Random images and labels, batched as a trial's test set is (the last batch partial)."""
    rng = np.random.default_rng(seed)
    split = Split(rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), rng.integers(0, 2, n).astype(np.float32),
                  [f"{i}.png" for i in range(n)])
    return backends.current().eval_batches(split, 100), split.labels


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("seed,n,spread", [(0, 250, 1.0), (1, 37, 30.0), (2, 400, 30.0)])
def test_one_pass_gives_evaluates_loss_and_accuracy_and_the_diagnosis_of_a_second_pass(seed, n, spread, precision):
    # given the article's model under a precision policy, with its weights for a seed (as drawn, or with
    # logits spread far on both sides, as a trained model's), and a test set whose last batch is partial
    keras.mixed_precision.set_dtype_policy(precision)
    try:
        step = compiled_step(seed=seed, spread=spread)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    batches, labels = a_test_set(16, n, seed)
    # when its test figures and diagnosis come from one pass
    loss, accuracy, diagnosed = diagnosis.test_and_diagnose(step, batches, labels)
    # then they are what evaluate and the diagnosis's own pass give: the loss to float32's rounding
    # (its sum taken in another order), the accuracy to the image
    evaluated_loss, evaluated_accuracy = step.model.evaluate(batches, verbose=0)
    assert loss == pytest.approx(evaluated_loss, rel=1e-5)
    assert round(accuracy * n) == round(evaluated_accuracy * n)
    assert diagnosed == diagnose(step, batches)
    assert set(diagnosed) >= {"dog_share", "dead_units", "logit_abs", "logit_sd", "collapsed"}


def test_a_collapsed_model_is_said_so_and_its_accuracy_is_the_share_of_its_one_class():
    # given a model whose last layer is its bias alone, far positive: it calls every image a Dog
    step = compiled_step()
    kernel, bias = step.model.layers[-1].get_weights()
    step.model.layers[-1].set_weights([np.zeros_like(kernel), np.full_like(bias, 5.0)])
    batches, labels = a_test_set(16, 120, 3)
    # when tested and diagnosed in one pass
    loss, accuracy, diagnosed = diagnosis.test_and_diagnose(step, batches, labels)
    # then it is a collapse, its accuracy the share of Dogs, its loss the cross-entropy of logit 5
    assert diagnosed["collapsed"] == 1 and diagnosed["dog_share"] == 1.0 and diagnosed["logit_sd"] == 0.0
    assert accuracy == pytest.approx(labels.mean())
    dogs = labels.mean()
    assert loss == pytest.approx(dogs * np.log1p(np.exp(-5.0)) + (1 - dogs) * (5.0 + np.log1p(np.exp(-5.0))), rel=1e-5)


def test_a_users_model_is_evaluated_and_has_no_diagnosis():
    # given a model with no hidden layer of the article's to read (a user's)
    step = compiled_step(user=True)
    batches, labels = a_test_set(16, 60, 4)
    # when tested
    loss, accuracy, diagnosed = diagnosis.test_and_diagnose(step, batches, labels)
    # then its figures are evaluate's and there is no diagnosis
    assert (loss, accuracy) == pytest.approx(tuple(step.model.evaluate(batches, verbose=0)))
    assert diagnosed == {}


def test_the_loss_is_not_divided_by_a_distribution_strategys_replicas(monkeypatch):
    # given the trial's test run in the scope of a tf.distribute strategy of two replicas (where a
    # Keras loss object's own reduction divides by them: the trainer multiplies back, a caller must not)
    if backends.name() != "tensorflow":
        pytest.skip("tf.distribute's replicas scale a loss on TensorFlow only")
    import tensorflow as tf

    step = compiled_step(seed=5)
    batches, labels = a_test_set(16, 90, 5)
    alone, _, _ = diagnosis.test_and_diagnose(step, batches, labels)
    real = tf.distribute.get_strategy

    class TwoReplicas:  # the strategy in scope, as two replicas would have it
        num_replicas_in_sync = 2

        def __getattr__(self, name):
            return getattr(real(), name)

    monkeypatch.setattr(tf.distribute, "get_strategy", TwoReplicas)
    # when tested there
    loss, _, _ = diagnosis.test_and_diagnose(step, batches, labels)
    # then the loss is the mean over the test images, as on one replica
    assert loss == pytest.approx(alone, rel=1e-6)


def test_the_model_as_it_starts_is_diagnosed_once_per_seed_however_the_seeds_interleave(monkeypatch):
    # given a worker that diagnoses the model as it starts by one pass over the test set (counted)
    diagnosis._INITIAL.clear()
    passes = []
    monkeypatch.setattr(diagnosis, "diagnose", lambda step, batches, prefix="": passes.append(1) or {"initial_x": 1})
    step = SimpleNamespace(user=None)

    def trial(seed):
        return SimpleNamespace(image_size=64, precision="float32", seed=seed, data="f", dataset="standard")

    # when a race's trials run an arm at a time, so the seed changes at every trial: 3 arms x seeds 0-5
    for _ in range(3):
        for seed in range(6):
            assert diagnosis.initial_diagnosis(step, trial(seed), None) == {"initial_x": 1}
    # then each seed's start is diagnosed once, not once a trial (18 passes before)
    assert len(passes) == 6
    # and no more than MOST_INITIAL are kept: the oldest goes first, and is diagnosed again when asked
    for seed in range(6, diagnosis.MOST_INITIAL + 1):
        diagnosis.initial_diagnosis(step, trial(seed), None)
    assert len(diagnosis._INITIAL) == diagnosis.MOST_INITIAL and len(passes) == diagnosis.MOST_INITIAL + 1
    diagnosis.initial_diagnosis(step, trial(0), None)
    assert len(passes) == diagnosis.MOST_INITIAL + 2
    diagnosis._INITIAL.clear()
