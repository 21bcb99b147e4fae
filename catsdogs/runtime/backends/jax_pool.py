"""Keras's 2x2 max-pooling on JAX, its gradient computed by comparisons instead of select-and-scatter.

Keras on JAX pools with `lax.reduce_window`, which JAX differentiates into XLA's
`select_and_scatter`. XLA:CPU runs that as a scalar loop over every window: in the article's
model at 64 px and batch 64 it took 0.13 s of a 0.25-s training step (TensorFlow's whole step is
about 0.05 s on the same CPU). For the pooling the article's model uses (2x2 windows, stride 2,
valid padding, channels last, even sides) the same gradient is simple to state: each window's
incoming gradient goes to the window's first maximum in row-major order, which is the element
select-and-scatter's `>=` selection picks; the other three get zero. Written as comparisons and
selects, XLA fuses it into a few loops over the tensor: the gradient is bit-for-bit the same, ties
included (tests/runtime/test_jax_pool.py), and the step about 1.5x faster. The forward pass is
Keras's own `reduce_window`; the backward pass keeps only the pooling's input, as JAX's own rule
does, and recomputes the pooled values from it, so the step's memory is unchanged.

The JAX backend installs it in catsdogs's own worker processes (`jax_process.start`) and only
on the CPU: on a GPU select-and-scatter is a fast kernel, and every GPU figure in docs/gpu.md was
measured with it. Any other pooling (another window, stride, padding, layout or an odd side) goes
to Keras's own function unchanged. Forward-mode differentiation (`jax.jvp`) of the pooling is not
supported by a custom gradient; nothing in catsdogs asks for it.
"""

from __future__ import annotations

import functools

MARK = "_catsdogs_pool"  # set on the installed function, so installing twice wraps once


def max_pool_2x2(x):
    """2x2 max pooling, stride 2, valid, of a channels-last (n, h, w, c) float array with even
    h and w; its gradient the one JAX's own rule gives, computed without select-and-scatter."""
    return _pool_2x2()(x)


@functools.cache
def _pool_2x2():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def pooled(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    @jax.custom_vjp
    def pool(x):
        return pooled(x)

    def forward(x):
        return pooled(x), x

    def backward(x, grad):
        n, h, w, c = x.shape
        # (n, h/2, row in window, w/2, [left column's c channels, right column's c channels])
        rows = x.reshape(n, h // 2, 2, w // 2, 2 * c)
        best = pooled(x)
        best2, grad2 = jnp.concatenate([best, best], -1), jnp.concatenate([grad, grad], -1)
        top, bottom = rows[:, :, 0] == best2, rows[:, :, 1] == best2
        top_left, top_right = top[..., :c], top[..., c:] & ~top[..., :c]
        above = top[..., :c] | top[..., c:]
        bottom_left = bottom[..., :c] & ~above
        bottom_right = bottom[..., c:] & ~(above | bottom[..., :c])
        zero = jnp.zeros((), grad.dtype)
        first = [jnp.where(jnp.concatenate(mask, -1), grad2, zero)
                 for mask in ((top_left, top_right), (bottom_left, bottom_right))]
        return (jnp.stack(first, axis=2).reshape(n, h, w, c),)

    pool.defvjp(forward, backward)
    return pool


def handles(inputs, pool_size, strides, padding, data_format) -> bool:
    """Whether `max_pool_2x2` computes Keras's max_pool for these arguments (as the pooling layer
    passes them, already standardized): 2x2, stride 2, valid, channels last, a float array of
    rank 4 with even sides."""
    def two(v):
        return v is not None and tuple(v if isinstance(v, (tuple, list)) else (v, v)) == (2, 2)

    shape = getattr(inputs, "shape", ())
    dtype = str(getattr(inputs, "dtype", ""))
    return (len(shape) == 4 and two(pool_size) and (strides is None or two(strides))
            and str(padding).lower() == "valid" and data_format == "channels_last"
            and "float" in dtype and all(isinstance(s, int) and s % 2 == 0 for s in shape[1:3]))


def route(name: str, mark: str, wrap) -> bool:
    """Put `wrap(stock, standardize_data_format)` in the place of Keras's JAX function `nn.<name>`
    (`stock`), marked with `mark` so that routing twice wraps once: how this module and jax_conv
    install theirs. False where this Keras has no such function to route."""
    try:
        from keras.src import backend as keras_backend
        from keras.src.backend.jax import nn
    except ImportError:  # another layout of Keras's modules: its own function, as before
        return False
    stock = getattr(nn, name, None)
    if stock is None:
        return False
    if getattr(stock, mark, False):
        return True
    routed = functools.wraps(stock)(wrap(stock, keras_backend.standardize_data_format))
    setattr(routed, mark, True)
    setattr(nn, name, routed)
    return True


def install() -> bool:
    """Route Keras's JAX `max_pool` through `max_pool_2x2` where it `handles` the arguments,
    Keras's own function otherwise; False where this Keras has no such function to route."""
    def wrap(stock, standardize):
        def max_pool(inputs, pool_size, strides=None, padding="valid", data_format=None):
            data_format = standardize(data_format)
            if handles(inputs, pool_size, strides, padding, data_format):
                return max_pool_2x2(inputs)
            return stock(inputs, pool_size, strides, padding, data_format)
        return max_pool

    return route("max_pool", MARK, wrap)
