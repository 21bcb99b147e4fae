"""Keras's RGB convolution on JAX computed on a fourth channel of zeros
(catsdogs.runtime.backends.jax_conv): XLA's own numbers to the last bit or two, XLA's own kernel
gradient, and every other convolution left to Keras."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
nn = pytest.importorskip("keras.src.backend.jax.nn")

from routed_training import train_routed_and_stock  # noqa: E402

from catsdogs.runtime.backends import jax_conv  # noqa: E402

ARGS = dict(strides=1, padding="same", data_format="channels_last", dilation_rate=1)


def images_and_kernel(shape=(4, 12, 12, 3), filters=32, dtype="float32"):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0, 1, shape), dtype)
    kernel = jnp.asarray(rng.standard_normal((3, 3, shape[-1], filters)) * 0.2, dtype)
    return x, kernel


def ours(x, kernel, **args):
    return jax_conv.conv_padded(nn.conv, x, kernel, **{**ARGS, **args})


@pytest.mark.parametrize("args", [{}, {"padding": "valid"}, {"strides": 2}, {"strides": [2, 1]},
                                  {"dilation_rate": 2}])
def test_the_forward_pass_is_xlas_own_to_its_last_bits(args):
    # given RGB images and a 32-filter kernel
    x, kernel = images_and_kernel()
    # when convolved the padded way and Keras's own way
    padded, stock = ours(x, kernel, **args), nn.conv(x, kernel, **{**ARGS, **args})
    # then the shapes are the same and the values within a few float32 ulps
    assert padded.shape == stock.shape
    np.testing.assert_allclose(np.asarray(padded), np.asarray(stock), rtol=1e-6, atol=1e-6)


def test_the_kernels_gradient_is_xlas_own_bit_for_bit():
    # given a loss whose gradient reaching the convolution's output does not depend on that output
    x, kernel = images_and_kernel()
    weights = jnp.asarray(np.random.default_rng(1).standard_normal((4, 12, 12, 32)), "float32")

    def grads(conv):
        return jax.jit(jax.grad(lambda k, v: jnp.sum(conv(v, k) * weights), argnums=(0, 1)))(kernel, x)

    # when both are differentiated, kernel and input
    (our_kernel, our_input) = grads(lambda v, k: ours(v, k))
    (their_kernel, their_input) = grads(lambda v, k: nn.conv(v, k, **ARGS))
    # then both gradients are JAX's own, element for element
    np.testing.assert_array_equal(np.asarray(our_kernel), np.asarray(their_kernel))
    np.testing.assert_array_equal(np.asarray(our_input), np.asarray(their_input))


def test_per_example_gradients_under_vmap_are_xlas_own():
    # given examples differentiated one at a time (as the noise scale's per-example gradients are)
    x, kernel = images_and_kernel((3, 1, 8, 8, 3))

    def grads(conv):
        return jax.jit(jax.vmap(jax.grad(lambda k, v: jnp.sum(conv(v, k) ** 2)), in_axes=(None, 0)))(kernel, x)

    padded, stock = grads(ours), grads(lambda v, k: nn.conv(v, k, **ARGS))
    # then the gradients agree to float32's precision (the forward's last bits reach them)
    np.testing.assert_allclose(np.asarray(padded), np.asarray(stock), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels, filters", sorted(jax_conv.SLOW))
def test_handles_the_slow_shapes_as_keras_passes_them(channels, filters):
    x, kernel = images_and_kernel((2, 8, 8, channels), filters)
    assert jax_conv.handles(x, kernel, "channels_last")


@pytest.mark.parametrize("shape, filters, data_format", [
    ((2, 8, 8, 3), 64, "channels_last"),  # XLA's own is fast there (2.5 ms against 3.8 padded)
    ((2, 8, 8, 3), 16, "channels_last"),  # within 20% of padded in the grid
    ((2, 8, 8, 1), 32, "channels_last"),
    ((2, 8, 8, 4), 32, "channels_last"),
    ((2, 8, 8, 3), 32, "channels_first"),
    ((2, 8, 3), 32, "channels_last"),  # a 1-D convolution
])
def test_leaves_every_other_convolution_to_keras(shape, filters, data_format):
    x = jnp.zeros(shape)
    kernel = jnp.zeros((3,) * (len(shape) - 2) + (shape[-1], filters))
    assert not jax_conv.handles(x, kernel, data_format)


def test_a_grouped_or_integer_convolution_is_left_to_keras():
    # a grouped convolution: 3 input channels, a kernel of 1 input channel a group
    assert not jax_conv.handles(jnp.zeros((2, 8, 8, 3)), jnp.zeros((3, 3, 1, 32)), "channels_last")
    assert not jax_conv.handles(jnp.zeros((2, 8, 8, 3), jnp.int32), jnp.zeros((3, 3, 3, 32)), "channels_last")


def test_install_routes_keras_conv_once_and_keeps_its_results(monkeypatch: pytest.MonkeyPatch):
    stock = nn.conv
    monkeypatch.setattr(nn, "conv", stock)  # restored after the test
    # when installed twice
    assert jax_conv.install() and jax_conv.install()
    routed = nn.conv
    # then it wraps Keras's function once; the shape it takes gives Keras's results to float32's
    # last bits, the shape it leaves gives them exactly
    assert routed.__wrapped__ is stock
    x, kernel = images_and_kernel()
    np.testing.assert_allclose(np.asarray(routed(x, kernel, 1, "same", "channels_last")),
                               np.asarray(stock(x, kernel, 1, "same", "channels_last")), rtol=1e-6, atol=1e-6)
    x, kernel = images_and_kernel(filters=64)
    np.testing.assert_array_equal(np.asarray(routed(x, kernel, 1, "same", "channels_last")),
                                  np.asarray(stock(x, kernel, 1, "same", "channels_last")))



@pytest.mark.slow
def test_a_jax_worker_trains_the_article_model_with_it_repeatably_and_near_xlas_own():
    # given a JAX process started as a worker is (backend.start) on this CPU
    result = train_routed_and_stock("conv", jax_conv.MARK)
    # then the convolution was installed; three steps give the same weights twice, bit for bit,
    # and weights within float32's last bits of XLA's own
    assert result["backend"] == "jax" and result["installed"] and result["repeatable"]
    assert result["apart"] < 1e-5
