"""Keras's 2x2 max-pooling on JAX with its gradient computed by comparisons
(catsdogs.runtime.backends.jax_pool): the same numbers as JAX's own rule, ties included, and
every other pooling left to Keras."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from routed_training import train_routed_and_stock  # noqa: E402

from catsdogs.runtime.backends import jax_pool  # noqa: E402


def stock_pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def tied_activations(dtype, shape=(3, 8, 10, 5)):
    """ReLU outputs on a coarse grid: most windows hold ties (zeros, equal values)."""
    rng = np.random.default_rng(0)
    x = np.maximum(np.round(rng.standard_normal(shape) * 2) / 2, 0)
    return jnp.asarray(x, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_gradient_is_jax_own_bit_for_bit_with_ties(dtype):
    # given activations where most windows have several maxima
    x = tied_activations(dtype)
    ties = np.mean(np.asarray(x, np.float32) == 0)
    assert ties > 0.3
    weights = jnp.asarray(np.random.default_rng(1).standard_normal((3, 4, 5, 5)), dtype)
    # when both poolings are differentiated through the same loss
    ours, our_grad = jax.value_and_grad(lambda v: jnp.sum(jax_pool.max_pool_2x2(v) * weights))(x)
    theirs, their_grad = jax.value_and_grad(lambda v: jnp.sum(stock_pool(v) * weights))(x)
    # then the values and the gradients are identical, element for element
    np.testing.assert_array_equal(np.asarray(jax_pool.max_pool_2x2(x)), np.asarray(stock_pool(x)))
    np.testing.assert_array_equal(np.asarray(our_grad, np.float32), np.asarray(their_grad, np.float32))
    assert float(ours) == float(theirs)


def test_the_gradient_is_jax_own_under_vmap_and_jit():
    # given a batch of examples differentiated one at a time (as per-example gradients are)
    x = tied_activations("float32", (4, 1, 6, 6, 3))

    def grads(pool):
        return jax.jit(jax.vmap(jax.grad(lambda v: jnp.sum(pool(v) ** 2))))(x)

    # then the custom rule gives JAX's own numbers
    np.testing.assert_array_equal(np.asarray(grads(jax_pool.max_pool_2x2)), np.asarray(grads(stock_pool)))


LAYER_ARGS = dict(pool_size=(2, 2), strides=(2, 2), padding="valid", data_format="channels_last")


@pytest.mark.parametrize("change", [
    {}, {"strides": None}, {"pool_size": 2, "strides": 2},
])
def test_handles_the_article_pooling_as_keras_passes_it(change):
    assert jax_pool.handles(jnp.zeros((2, 8, 8, 3)), **{**LAYER_ARGS, **change})


@pytest.mark.parametrize("change, shape", [
    ({"pool_size": (3, 3), "strides": (3, 3)}, (2, 9, 9, 3)),
    ({"strides": (1, 1)}, (2, 8, 8, 3)),
    ({"padding": "same"}, (2, 8, 8, 3)),
    ({"data_format": "channels_first"}, (2, 8, 8, 3)),
    ({}, (2, 7, 8, 3)),  # an odd side: the last row is dropped by Keras, not handled here
    ({}, (2, 8, 8)),
])
def test_leaves_every_other_pooling_to_keras(change, shape):
    assert not jax_pool.handles(jnp.zeros(shape), **{**LAYER_ARGS, **change})


def test_an_integer_array_is_left_to_keras():
    assert not jax_pool.handles(jnp.zeros((2, 8, 8, 3), jnp.int32), **LAYER_ARGS)


def test_install_routes_keras_max_pool_once_and_keeps_its_results(monkeypatch: pytest.MonkeyPatch):
    nn = pytest.importorskip("keras.src.backend.jax.nn")
    stock = nn.max_pool
    monkeypatch.setattr(nn, "max_pool", stock)  # restored after the test
    # when installed twice
    assert jax_pool.install() and jax_pool.install()
    routed = nn.max_pool
    # then it wraps Keras's function once, and gives its results for the pooling it takes and for one it leaves
    assert routed.__wrapped__ is stock
    x = tied_activations("float32")
    np.testing.assert_array_equal(np.asarray(routed(x, (2, 2), (2, 2), "valid", "channels_last")),
                                  np.asarray(stock(x, (2, 2), (2, 2), "valid", "channels_last")))
    np.testing.assert_array_equal(np.asarray(routed(x, (3, 3), (1, 1), "same", "channels_last")),
                                  np.asarray(stock(x, (3, 3), (1, 1), "same", "channels_last")))



@pytest.mark.slow
def test_a_jax_worker_trains_the_article_model_to_the_same_weights_with_it():
    # given a JAX process started as a worker is (backend.start) on this CPU
    result = train_routed_and_stock("max_pool", jax_pool.MARK)
    # then the pooling was installed, and three steps give the same weights bit for bit
    assert (result["backend"], result["installed"], result["same"]) == ("jax", True, True)
