"""The memory side of Keras on TensorFlow: the second half of catsdogs.runtime.backends.tensorflow,
which gives these functions as its own (the Backend protocol's `reset_peak_memory`,
`peak_memory`, `device_bytes_in_use`, `memory_budget_bytes`, `compiled_step_bytes`).

On a GPU, TensorFlow's allocator peak (reset per task); on the CPU, the peak resident set
(VmHWM), and the CPU allocator's peak where it has one (BFC). Imports TensorFlow inside each
function: loaded before its worker's process has started TensorFlow.
"""

from __future__ import annotations

import contextlib

from catsdogs.host import host_memory_bytes, peak_rss_mb, reset_peak_rss


def reset_peak_memory() -> None:
    """Start a new peak: the allocator's statistics, and on Linux the resident set's
    high-water mark (clear_refs 5), so a worker's next task measures its own peak."""
    import tensorflow as tf

    for device in ("GPU:0", "CPU:0"):
        with contextlib.suppress(Exception):
            tf.config.experimental.reset_memory_stats(device)
    reset_peak_rss()


def peak_memory() -> dict:
    """{'peak_memory_mb', 'memory_kind', 'allocator_peak_mb'?, 'device_memory_limit_mb'?}: on a
    GPU TensorFlow's allocator peak and its limit; on the CPU the peak resident set since the
    last reset (VmHWM), and TensorFlow's CPU allocator peak where it has one (BFC)."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        out = {"memory_kind": "gpu"}
        with contextlib.suppress(Exception):
            out["peak_memory_mb"] = out["allocator_peak_mb"] = (
                tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20)
        with contextlib.suppress(Exception):
            from tensorflow.python.client import device_lib

            limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
            if limits:
                out["device_memory_limit_mb"] = limits[0] / 2**20
        return out
    out = {"peak_memory_mb": peak_rss_mb(), "memory_kind": "cpu-rss"}
    with contextlib.suppress(Exception):
        out["allocator_peak_mb"] = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
    return out


def device_bytes_in_use() -> None:
    """None: TensorFlow keeps device memory after an out-of-memory error (a probe's ends its worker)."""
    return None


def memory_budget_bytes() -> int | None:
    """What the memory that holds a model is: the GPU's (None: unknown) or the host's."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        with contextlib.suppress(Exception):
            from tensorflow.python.client import device_lib

            limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
            return int(limits[0]) if limits else None
        return None
    return host_memory_bytes()


# TensorFlow offers no memory plan before a step runs: catsdogs.training.costs' analytic model (each
# tensor's lifetime in TensorFlow's unfused graph) stands for it. See backends.jax.
compiled_step_bytes = None
