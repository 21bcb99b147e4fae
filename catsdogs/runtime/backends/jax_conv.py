"""Keras's 2-D convolution on JAX, for the shape where XLA:CPU's own is slow: three input channels
into 32 filters (the article's first layer) computed on a fourth channel of zeros in the forward pass.

XLA:CPU runs a convolution of three input channels into 32 filters on a slow path: at batch 32 and
64 px, 7.1-11.6 ms, where one, two or four input channels into 32 filters took 0.9-2.2 ms, and
three into 64 filters 2.9-4.3 (`python benchmarks/bench_jax_conv.py --grid`, jaxlib 0.10.2, this
project's 2-core CPU; no other shape of its grid gained 20% from padding). With the images and
the kernel given a fourth channel of zeros, the same convolution took 2.5-4.0 ms, and it adds only
exact zeros to each sum. The sums are taken in another order, so a result can differ from XLA's
own in its last bits (within 1e-6: tests/runtime/test_jax_conv.py): every trial of a seed still
gets the same numbers as every other, but not those of catsdogs 0.42.0 or of a GPU, and a trial's
path drifts from 0.42.0's as training carries those bits on (one epoch of SGD: validation losses
up to 3e-3 apart).

Only the forward pass is padded. Padded, the kernel's gradient was slower than XLA's own at batch
64 (a first look by hand), so the backward pass is XLA's own rule for the unpadded convolution
(`jax.vjp` of Keras's function), from the residuals JAX's own keeps: the input and the kernel.
The article's trials (`bench_jax_conv.py --data-dir <64 px>`): a training step 0.75x, 0.61x and
0.85x at batch 8, 16 and 64; a validation 0.63-0.67x.

The JAX backend installs it beside jax_pool, in catsdogs's own worker processes and only on the
CPU. Any other convolution (another channel or filter count, grouped, 1-D or 3-D, channels first,
an integer input) goes to Keras's own function unchanged. A new jaxlib may move the slow path:
`--grid` says where it is.
"""

from __future__ import annotations

import functools

from catsdogs.runtime.backends import jax_pool

MARK = "_catsdogs_conv"  # set on the installed function, so installing twice wraps once
SLOW = frozenset({(3, 32)})  # (input channels, filters) that XLA:CPU runs slowly (--grid)
PADDED_CHANNELS = 4


def handles(inputs, kernel, data_format) -> bool:
    """Whether `conv_padded` is used for this call of Keras's `conv`: a 2-D convolution of a
    channels-last float array whose (input channels, filters) is in SLOW, not grouped."""
    shape, kernel_shape = getattr(inputs, "shape", ()), getattr(kernel, "shape", ())
    return (len(shape) == 4 and len(kernel_shape) == 4 and data_format == "channels_last"
            and "float" in str(getattr(inputs, "dtype", "")) and kernel_shape[2] == shape[3]
            and (shape[3], kernel_shape[3]) in SLOW)


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def conv_padded(stock, inputs, kernel, strides, padding, data_format, dilation_rate):
    """Keras's `stock(inputs, kernel, ...)`, computed on inputs and kernel padded with zero channels
    to PADDED_CHANNELS; its gradient JAX's own rule for `stock`."""
    from keras.src.backend.jax.core import convert_to_tensor

    kernel = convert_to_tensor(kernel)
    inputs = convert_to_tensor(inputs, dtype=kernel.dtype)
    settings = tuple(_hashable(v) for v in (strides, padding, data_format, dilation_rate))
    return _padded(stock, settings)(inputs, kernel)


@functools.cache
def _padded(stock, settings):
    import jax
    import jax.numpy as jnp

    def unpadded(x, k):
        return stock(x, k, *settings)

    @jax.custom_vjp
    def conv(x, k):
        extra = PADDED_CHANNELS - x.shape[-1]
        return stock(jnp.pad(x, ((0, 0),) * 3 + ((0, extra),)), jnp.pad(k, ((0, 0),) * 2 + ((0, extra), (0, 0))),
                     *settings)

    def forward(x, k):
        return conv(x, k), (x, k)

    def backward(residuals, grad):
        return jax.vjp(unpadded, *residuals)[1](grad)

    conv.defvjp(forward, backward)
    return conv


def install() -> bool:
    """Route Keras's JAX `conv` through `conv_padded` where it `handles` the arguments, Keras's own
    function otherwise; False where this Keras has no such function to route."""
    def wrap(stock, standardize):
        def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
            data_format = standardize(data_format)
            if handles(inputs, kernel, data_format):
                return conv_padded(stock, inputs, kernel, strides, padding, data_format, dilation_rate)
            return stock(inputs, kernel, strides, padding, data_format, dilation_rate)
        return conv

    return jax_pool.route("conv", MARK, wrap)
