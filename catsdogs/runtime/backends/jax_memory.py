"""The memory side of Keras on JAX: the second half of catsdogs.runtime.backends.jax, which gives
these functions as its own (the Backend protocol's `reset_peak_memory`, `peak_memory`,
`memory_budget_bytes`, `compiled_step_bytes`, and `memory_fraction`).

On a GPU, XLA's allocator peak (`memory_stats()["peak_bytes_in_use"]`), which JAX cannot reset: the
worker's peak since it started (`memory_kind` "gpu-worker"). On the CPU, the resident set's
high-water mark, as with TensorFlow. XLA's plan of a training step (`compiled_step_bytes`) is
find-batch-size's memory model on this backend.

Imports JAX inside each function: loaded before its worker's process has started JAX.
"""

from __future__ import annotations

import contextlib
import os

from catsdogs.host import host_memory_bytes, peak_rss_mb, reset_peak_rss


def reset_peak_memory() -> None:
    """Start a new peak where one can be started: the resident set's high-water mark. (XLA's
    device allocator has no reset: a GPU peak is the worker's since it started.)"""
    reset_peak_rss()


def device_stats() -> dict:
    """XLA's allocator statistics for the first device; {} on the CPU."""
    import jax

    if jax.default_backend() == "cpu":
        return {}
    with contextlib.suppress(Exception):
        return jax.devices()[0].memory_stats() or {}
    return {}


DEFAULT_MEMORY_FRACTION = 0.75  # jaxlib's, when neither variable below is set


def memory_fraction() -> float:
    """The share of the GPU's memory XLA's allocator may use, as jaxlib reads it at start-up
    (xla_client.generate_pjrt_gpu_plugin_options): XLA_CLIENT_MEM_FRACTION, else the older
    XLA_PYTHON_CLIENT_MEM_FRACTION, else 75%. It is the allocator's limit whether or not it
    preallocates (XLA_PYTHON_CLIENT_PREALLOCATE=false only stops it taking the memory up front)."""
    text = os.environ.get("XLA_CLIENT_MEM_FRACTION") or os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    return float(text) if text else DEFAULT_MEMORY_FRACTION


def peak_memory() -> dict:
    """{'peak_memory_mb', 'memory_kind', 'allocator_peak_mb'?, 'device_memory_limit_mb'?,
    'memory_fraction'?}: on a GPU XLA's allocator peak since the worker started ('gpu-worker'),
    its limit and its share of the GPU; on the CPU the peak resident set since the last reset
    (VmHWM)."""
    stats = device_stats()
    if stats:
        out = {"memory_kind": "gpu-worker", "memory_fraction": memory_fraction()}
        if "peak_bytes_in_use" in stats:
            out["peak_memory_mb"] = out["allocator_peak_mb"] = stats["peak_bytes_in_use"] / 2**20
        if "bytes_limit" in stats:
            out["device_memory_limit_mb"] = stats["bytes_limit"] / 2**20
        return out
    return {"peak_memory_mb": peak_rss_mb(), "memory_kind": "cpu-rss"}


def memory_budget_bytes() -> int | None:
    """What the memory that holds a model is: the GPU's (XLA's limit) or the host's."""
    stats = device_stats()
    if stats:
        return int(stats["bytes_limit"]) if "bytes_limit" in stats else None
    return host_memory_bytes()


def compiled_step_bytes(model, batch_size: int) -> int:
    """The memory XLA plans for one training step of `model` at this batch size, from its buffer
    assignment: the step's arguments (weights, optimizer state, the batch), its outputs that do
    not reuse a donated argument, and its temporaries. Compiled, never run (on a GPU compiling
    autotunes, whose scratch memory is not in the plan).

    The memory model of this backend: XLA fuses ops and assigns buffers itself, so which
    tensors live at the peak is the compiler's choice, not the layers' (catsdogs.training.model's
    per-tensor accounting is TensorFlow's). Uses two Keras internals, the ones `fit` uses to
    build the model's metrics and to gather its state. The batch is of the model's own input."""
    import jax
    import jax.numpy as jnp

    images = model.inputs[0]  # the article's model: (size, size, 3) uint8; a user's, its own
    batch = (jax.ShapeDtypeStruct((batch_size, *images.shape[1:]), images.dtype),
             jax.ShapeDtypeStruct((batch_size,), jnp.float32))
    model._symbolic_build(data_batch=batch)
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    plan = jax.jit(model.train_step, donate_argnums=0).lower(state, batch).compile().memory_analysis()
    return int(plan.argument_size_in_bytes + plan.output_size_in_bytes - plan.alias_size_in_bytes
               + plan.temp_size_in_bytes)
