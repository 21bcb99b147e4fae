"""Per-example gradient dot products without the gradients (catsdogs.runtime.backends.per_example): on
each backend, the Gram matrix the noise scale is measured from equals the one of per-example
gradients formed the plain way, by the framework's own autodiff of the model's own loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHECK = r"""
import json, os, sys
import numpy as np
import keras
from catsdogs.training.model import build_model, loss_and_metrics
from catsdogs.runtime import backends

backend = backends.current()
backend.start()
keras.utils.set_random_seed(3)
model = build_model(24)
rng = np.random.default_rng(0)
# a model some way into training: weights that are not the initial ones
for w in model.trainable_variables:
    w.assign(w.value + 0.05 * rng.standard_normal(w.shape).astype("float32"))
images = rng.integers(0, 256, (8, 24, 24, 3), dtype=np.uint8)
labels = rng.integers(0, 2, 8).astype("float32")
gram = backend.per_example_gram(model, images, labels, block=4)  # two blocks of 4

loss = loss_and_metrics()[0]
if backend.NAME == "jax":
    import jax
    values = [v.value for v in model.trainable_variables]
    rest = [v.value for v in model.non_trainable_variables]
    def one(tv, x, y):
        logits, _ = model.stateless_call(tv, rest, x[None], training=True)
        return loss(y[None], logits)
    grads = jax.vmap(jax.grad(one), in_axes=(None, 0, 0))(values, images, labels)
    flat = np.concatenate([np.asarray(g).reshape(8, -1) for g in grads], axis=1)
else:
    import tensorflow as tf
    rows = []
    for i in range(8):
        with tf.GradientTape() as tape:
            value = loss(labels[i:i + 1], model(images[i:i + 1], training=True))
        rows.append(np.concatenate([g.numpy().ravel() for g in tape.gradient(value, model.trainable_variables)]))
    flat = np.stack(rows)
flat = flat.astype(np.float64)
reference = np.stack([flat[:4] @ flat[:4].T, flat[4:] @ flat[4:].T])
print(json.dumps({"gram": gram.tolist(), "reference": reference.tolist()}))
"""


@pytest.mark.slow
def test_the_gram_matrix_equals_per_example_autodiff_on_each_backend(keras_backend):
    import numpy as np

    # given the article's model at some weights and 8 images, on each backend
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERAS_BACKEND": keras_backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    gram, reference = np.array(got["gram"]), np.array(got["reference"])
    # then every dot product of two examples' gradients, within each block, is autodiff's
    assert gram.shape == (2, 4, 4)
    assert np.allclose(gram, reference, rtol=1e-4, atol=1e-6 * np.abs(reference).max())
    assert np.allclose(gram, np.transpose(gram, (0, 2, 1)))
    assert (np.diagonal(gram, axis1=1, axis2=2) > 0).all()


def test_a_model_measured_is_freed_with_the_cache_its_caller_keeps():
    import gc
    import weakref

    import numpy as np

    from catsdogs.runtime.backends import tensorflow as tf_backend
    from catsdogs.training.model import build_model

    # given a model whose Gram matrix was computed, its compiled function kept in the caller's cache
    model = build_model(16)
    cache: dict = {}
    images = np.zeros((4, 16, 16, 3), np.uint8)
    gram = tf_backend.per_example_gram(model, images, np.zeros(4, np.float32), block=2, cache=cache)
    assert gram.shape == (2, 2, 2) and list(cache) == [2]
    # when the caller lets go of the model and its cache (a step the worker no longer keeps)
    gone = weakref.ref(model)
    del model, cache
    gc.collect()
    # then nothing of catsdogs' keeps the model alive
    assert gone() is None


@pytest.mark.parametrize("regularizer", ["kernel_regularizer", "bias_regularizer", "activity_regularizer"])
def test_a_regularized_layer_is_refused_rather_than_its_loss_term_left_out(regularizer):
    import keras

    from catsdogs.runtime.backends.per_example import tapped_layers

    # given the article's kind of model with one Dense layer regularized
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(4, activation="relu", name="hidden", **{regularizer: "l2"}),
                              keras.layers.Dense(1)])
    # then the per-example dot products refuse it, naming the layer and the regularizer
    with pytest.raises(ValueError, match=f"layer hidden has a {regularizer}, whose loss term"):
        tapped_layers(model)
    # and without the regularizer the same model is measured
    plain = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(4), keras.layers.Dense(1)])
    assert len(tapped_layers(plain)) == 2
