"""Keras 3 on JAX: every JAX-specific call catsdogs makes (`KERAS_BACKEND=jax`).

The same functions as backends.tensorflow (the `Backend` protocol of catsdogs.runtime.backends),
so the engine cannot tell them apart. Where JAX differs, the choice is made here:

- Starting a worker process (catsdogs.runtime.backends.jax_process, whose `start`,
  `process_env`, `strategy_env`, `running_settings` and `compile_counts` this module gives as its
  own): TensorFlow kept out, so a JAX process behaves as on the GPU machine, which has none;
  determinism as XLA's `--xla_gpu_deterministic_ops` exactly when deterministic (on the CPU
  XLA's kernels are deterministic already); TF32 through `jax_default_matmul_precision`
  ("tensorfloat32" or "highest"; unset, JAX's default, which is TF32 on Ampere and later); JAX's
  persistent compilation cache, and every compilation counted.
- The input pipeline: the decoded uint8 images are copied to the device once per data set and
  each batch is gathered there by one jitted op, so only indices cross from the host. JAX
  dispatches asynchronously, so the next batch's gather is queued while a step runs: the
  prefetch is free. A data set larger than its share of device memory stays on the host and
  each batch is gathered there (Keras's JAX trainer copies it one batch ahead).
- Memory (catsdogs.runtime.backends.jax_memory, whose functions this module gives as its own):
  XLA's allocator peak on a GPU, which JAX cannot reset (`memory_kind` "gpu-worker": exact for a
  probe that raised it, an upper bound for a trial); the resident set's high-water mark on the
  CPU. Preallocation is off, so XLA takes device memory as it needs it and NVML's "memory used"
  means something. After an out-of-memory the allocator's bytes in use come back
  (`device_bytes_in_use`), so a probe can fail and the next run in the same worker.
- Data parallelism: `--strategy mirrored` becomes `keras.distribution.DataParallel` over every
  visible device; on a CPU, over `CATSDOGS_LOGICAL_CPUS` host devices XLA is told to make.
- Adam: Keras's own. XLA compiles the whole update into a few fused loops, which is what the
  fused TensorFlow kernel buys on that backend.

JAX is imported inside each function, never at the top: this module is loaded before its
worker's process has started JAX with its settings (`start`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import weakref

from catsdogs.host import (
    cpu_description,
    gpu_total_bytes,
)
from catsdogs.optimizers import OPTIMIZERS
from catsdogs.runtime.backends import has_depthwise, matmul_rate, seed_states
from catsdogs.runtime.backends.jax_memory import compiled_step_bytes as compiled_step_bytes
from catsdogs.runtime.backends.jax_memory import device_stats, memory_budget_bytes
from catsdogs.runtime.backends.jax_memory import memory_fraction as memory_fraction
from catsdogs.runtime.backends.jax_memory import peak_memory as peak_memory
from catsdogs.runtime.backends.jax_memory import reset_peak_memory as reset_peak_memory
from catsdogs.runtime.backends.jax_process import HOST_DEVICES_FLAG, LOGICAL_CPUS_ENV, start
from catsdogs.runtime.backends.jax_process import compile_counts as compile_counts
from catsdogs.runtime.backends.jax_process import process_env as process_env
from catsdogs.runtime.backends.jax_process import running_settings as running_settings
from catsdogs.runtime.backends.jax_process import strategy_env as strategy_env
from catsdogs.schema import Status

NAME = "jax"
DEVICE_DATA_SHARE = 0.25  # a data set stays on the device when it takes at most this share of it


def setup_device(memory_cap_bytes: int | None) -> str:
    """Before JAX starts: a GPU memory cap becomes XLA's memory fraction (of the GPU's memory, as
    NVML reports it); 'gpu' or 'cpu'. On a CPU the parent watches the cap (catsdogs.runtime.worker)."""
    capped = False
    if memory_cap_bytes and "jax" not in sys.modules:
        total = gpu_total_bytes()
        if total:
            fraction = min(1.0, memory_cap_bytes / total)
            os.environ.pop("XLA_CLIENT_MEM_FRACTION", None)  # jaxlib refuses both at once
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:.4f}"
            capped = True
    kind = start()
    if kind == "gpu" and memory_cap_bytes and not capped:
        from catsdogs.errors import CatsdogsError

        raise CatsdogsError("--memory-limit on a GPU under JAX becomes XLA's memory fraction, which needs "
                            "the GPU's size from NVML: pip install nvidia-ml-py (the nvml extra)")
    return kind


def device_description() -> str:
    import jax

    devices = jax.devices()
    if jax.default_backend() != "cpu":
        return f"{len(devices)} x {devices[0].device_kind}"
    return cpu_description()


def versions() -> dict:
    import jax
    import jaxlib
    import keras

    return {"backend": NAME, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "keras": keras.__version__}


# --- input pipelines -------------------------------------------------------------------------

_ON_DEVICE: dict[int, tuple] = {}  # id(split.images) -> (images, labels) on the device


def _device_arrays(split):
    """The split's images and labels on the device, copied once per decoded data set (dropped
    when the data set is); None when they would take more than their share of device memory."""
    import jax

    key = id(split.images)
    if key not in _ON_DEVICE:
        limit = memory_budget_bytes()
        if jax.default_backend() != "cpu" and limit and split.images.nbytes > DEVICE_DATA_SHARE * limit:
            return None
        _ON_DEVICE[key] = (jax.device_put(split.images), jax.device_put(split.labels))
        weakref.finalize(split.images, _ON_DEVICE.pop, key, None)
    return _ON_DEVICE[key]


@functools.cache
def _gather():
    """One jitted op per batch: row i of the schedule, then those images and labels."""
    import jax

    def gather(images, labels, schedule, i):
        idx = jax.lax.dynamic_index_in_dim(schedule, i, keepdims=False)
        return images[idx], labels[idx]

    return jax.jit(gather)


def train_batches(split, batch_size: int, seed: int, n_batches: int, cross_epochs: bool = False,
                  prefetch: int = 2):
    """The batches of loading.batch_schedule(), in order, as a Keras PyDataset. (`prefetch` is
    TensorFlow's: here asynchronous dispatch queues the next gather while a step runs.)"""
    import jax
    import keras

    from catsdogs.data.loading import batch_schedule

    schedule = batch_schedule(len(split), batch_size, seed, n_batches, cross_epochs).astype("int32")
    on_device = _device_arrays(split)
    gather = _gather()

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=1, use_multiprocessing=False)
            self.schedule = jax.device_put(schedule) if on_device else schedule

        def __len__(self):
            return len(schedule)

        def __getitem__(self, i):
            if on_device:
                return gather(*on_device, self.schedule, i)
            return split.images[schedule[i]], split.labels[schedule[i]]

    return Batches()


def eval_batches(split, batch_size: int):
    """Every image once, in order, the last batch partial: accuracy over the whole split."""
    import keras

    arrays = _device_arrays(split) or (split.images, split.labels)
    n = len(split)

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=1, use_multiprocessing=False)

        def __len__(self):
            return -(-n // batch_size)

        def __getitem__(self, i):
            a, b = i * batch_size, min(n, (i + 1) * batch_size)
            return arrays[0][a:b], arrays[1][a:b]

    return Batches()


# --- the optimizer and the distribution strategy -----------------------------------------------


def optimizer_class(name: str, strategy: str):
    """Keras's own: XLA fuses Adam's element-wise update itself (TensorFlow's backend swaps in a
    fused kernel)."""
    import keras

    return getattr(keras.optimizers, OPTIMIZERS[name].keras_class)


class Distribution:
    """What the engine needs of a strategy: a scope to build and train in, and the replicas."""

    def __init__(self, distribution=None, replicas: int = 1):
        self.distribution, self.num_replicas_in_sync = distribution, replicas

    def scope(self):
        return self.distribution.scope() if self.distribution else contextlib.nullcontext()


def distribution(strategy: str) -> Distribution:
    """'none': no distribution; 'mirrored': keras.distribution.DataParallel over every device of
    JAX's default backend (each GPU, or the host devices XLA_FLAGS asked for)."""
    if strategy != "mirrored":
        return Distribution()
    import jax
    import keras

    devices = jax.devices()
    if len(devices) < 2 and jax.default_backend() == "cpu":
        n = os.environ.get(LOGICAL_CPUS_ENV, "2")
        raise RuntimeError(f"--strategy mirrored on the CPU needs {n} host devices, made before JAX "
                           f"starts: run it in a worker started with XLA_FLAGS={HOST_DEVICES_FLAG}={n}")
    return Distribution(keras.distribution.DataParallel(devices=devices), len(devices))


def weight_values(model) -> list:
    """Each weight's value as it is now: a copy of its JAX array on the device, dispatched, not
    waited for. Not the array itself: Keras's trainer donates the weights' buffers to the steps
    it runs next (evaluate's too), which deletes them."""
    import jax.numpy as jnp

    return [jnp.copy(v.value) for v in model.weights]


def seed(seed: int) -> None:
    """keras.utils.set_random_seed: on JAX it clears nothing compiled."""
    import keras

    keras.utils.set_random_seed(seed)


def wait_for_steps(model) -> None:
    """Return when every dispatched training step has run: JAX dispatches asynchronously, so a
    timer stamped without waiting measures the dispatch, not the training. Waits on the weights,
    which the last step wrote (Keras has put them back on the model by the time training ends)."""
    import jax

    jax.block_until_ready([v.value for v in model.trainable_variables])


def sync_weights(model) -> None:
    """Mid-epoch, inside fit: Keras's JAX trainer holds the state apart from the model while it
    trains (the model's variables are emptied); `jax_state_sync` puts it back and marks it so,
    and fit's next step takes the state up from the model again (the trainer's own protocol for
    callbacks that read the model)."""
    model.jax_state_sync()


# Keras's fit validates each epoch through `evaluate` and its epoch iterator, callbacks and state
# handling: 4-5 ms a pass on this CPU besides the forward passes, more than a large batch's step on a
# GPU, where a race trial at batch 256 validates every step. Here the timer validates (`evaluate`).
FIT_VALIDATES = False


def evaluate(model, batches, cache: dict | None = None) -> tuple[float, float]:
    """(loss, accuracy) of `model` over `batches` (eval_batches'), as `model.evaluate` gives them,
    bit for bit: Keras's own stateless `test_step`, run by a jitted function of ours over the
    model's variables as they are, from metrics at zero as `evaluate` resets them (catsdogs compiles
    every model with a loss tracker and one accuracy, each a mean). It reads the weights and
    changes nothing: not the model, not fit's running metrics, not the buffers fit donates to its
    next step (its arguments are not donated). Inside fit, mid-epoch, after `sync_weights`. A
    data-parallel trial (keras.distribution set): `keras_evaluate`."""
    import jax
    import jax.numpy as jnp
    from keras import distribution

    if distribution.distribution() is not None:  # a data-parallel trial's: Keras's own shards it
        from catsdogs.runtime.backends import keras_evaluate

        return keras_evaluate(model, batches)
    cache = {} if cache is None else cache
    if "evaluate" not in cache:
        cache["evaluate"] = jax.jit(model.test_step)
    step = cache["evaluate"]
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [jnp.zeros(v.shape, v.dtype) for v in model.metrics_variables])
    logs = None
    for i in range(len(batches)):
        logs, state = step(state, batches[i])
    return float(logs["loss"]), float(logs["accuracy"])


# --- the gradient noise scale ------------------------------------------------------------------

def per_example_gram(model, images, labels, block: int, cache: dict | None = None):
    """The per-example gradient Gram matrix of the loss at the model's current weights, within
    each block of `block` consecutive examples: numpy (n // block, block, block), float64.

    catsdogs.runtime.backends.per_example does the arithmetic (the model's own layers, "ghost" dot
    products); here JAX differentiates it, on the variables' values passed in through a
    StatelessScope, in one jitted function per model and block size, kept in `cache` (the
    caller's: catsdogs.training.engine keeps it with the model's step, so it goes with it; a cache
    that held the model would keep it alive). Pure: nothing is written back, and the trainer's
    train_step, metrics and iteration counter are not touched. Read it between epochs only: during
    `fit` Keras's JAX trainer holds the weights itself and the variables are stale."""
    import numpy as np

    functions = {} if cache is None else cache
    if block not in functions:
        functions[block] = _gram_function(model, block)
    gram = functions[block]([v.value for v in model.trainable_variables],
                            [v.value for v in model.non_trainable_variables], images, labels)
    return np.asarray(gram, np.float64)


def _gram_function(model, block: int):
    import jax
    import jax.numpy as jnp
    import keras

    from catsdogs.runtime.backends import per_example

    tapped = per_example.tapped_layers(model)

    def gram(trainable, non_trainable, images, labels):
        mapping = [*zip(model.trainable_variables, trainable, strict=True),
                   *zip(model.non_trainable_variables, non_trainable, strict=True)]
        with keras.StatelessScope(state_mapping=mapping):
            taps = [jnp.zeros(shape) for shape in per_example.tap_shapes(model, images.shape[0])]
            deltas, inputs = jax.grad(lambda t: per_example.forward(model, images, labels, t), has_aux=True)(taps)
            return per_example.gram_blocks(tapped, inputs, deltas, block)

    return jax.jit(gram)



def micro_gradient_gram(model, loss, images, labels, micro: int, micros: int, cache: dict | None = None):
    """Gram matrices of micro-batch gradients (the two-batch estimator: engine.noise_estimate_at),
    numpy (pairs, micros, micros): each `micro` consecutive examples' gradient of `loss` (plus the
    model's own losses) in training mode, stateless, with its own dropout masks (seed_states), by
    `vmap` (in turn for a depthwise model: has_depthwise); one jitted function a shape in `cache`."""
    import numpy as np

    functions = {} if cache is None else cache
    key = ("micro", micro, micros)  # apart from per_example_gram's keys (ints)
    if key not in functions:
        functions[key] = _micro_gram_function(model, loss, micro, micros)
    return np.asarray(functions[key]([v.value for v in model.trainable_variables],
                                     [v.value for v in model.non_trainable_variables], images, labels), np.float64)


def _micro_gram_function(model, loss, micro: int, micros: int):
    import jax
    import jax.numpy as jnp

    seeds, batched = seed_states(model), not has_depthwise(model)

    def gradient(trainable, non_trainable, x, y, i):
        non_trainable = [v + jnp.stack([0, i]).astype(v.dtype) if k in seeds else v  # micro-batch i's own masks
                         for k, v in enumerate(non_trainable)]

        def loss_of(values):
            predicted, _, losses = model.stateless_call(values, non_trainable, x, training=True, return_losses=True)
            return loss(y, predicted) + sum(losses, jnp.float32(0))

        return jnp.concatenate([jnp.ravel(g).astype(jnp.float32) for g in jax.grad(loss_of)(trainable)])

    def gram(trainable, non_trainable, images, labels):
        xs, ys = images.reshape(-1, micro, *images.shape[1:]), labels.reshape(-1, micro)
        index = jnp.arange(xs.shape[0])
        vectors = (jax.vmap(gradient, in_axes=(None, None, 0, 0, 0))(trainable, non_trainable, xs, ys, index) if batched
                   else jax.lax.map(lambda a: gradient(trainable, non_trainable, *a), (xs, ys, index)))
        vectors = vectors.reshape(-1, micros, vectors.shape[-1])
        return jnp.einsum("pid,pjd->pij", vectors, vectors)

    return jax.jit(gram)


# --- memory (what the step takes and what the device holds: jax_memory) --------------------------


def device_bytes_in_use() -> int | None:
    """XLA's GPU allocator's bytes in use besides the data sets copied to the device
    (`_device_arrays`); None on the CPU, whose out-of-memory is a kill. After a probe out of
    memory has let go of its step, what it held is back (docs/gpu.md); catsdogs checks it at
    every out-of-memory (training.probes.run_probe: ProbeRecord.residue_mb)."""
    stats = device_stats()
    if "bytes_in_use" not in stats:
        return None
    data = sum(a.nbytes for arrays in _ON_DEVICE.values() for a in arrays)
    return int(stats["bytes_in_use"]) - int(data)


# --- errors ------------------------------------------------------------------------------------

# XLA's out-of-memory texts. On the H100 a batch far too large did not fail to allocate but in
# XLA's GEMM/convolution autotuner, whose every candidate failed for want of scratch memory:
# "NOT_FOUND: Failed to get configs for: ... All configs failed during profiling or were
# excluded" (../shared/GPU.md); the same process then trained a normal trial.
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "Failed to get configs",
               "All configs failed during profiling", "std::bad_alloc", "MemoryError",
               "Cannot allocate memory")


def classify_error(exc: BaseException) -> str:
    """'oom' for running out of memory (device or host), else 'failed'."""
    if isinstance(exc, MemoryError):
        return Status.OOM
    return Status.OOM if any(m in str(exc) for m in OOM_MARKERS) else Status.FAILED


# --- the device's matmul peak -------------------------------------------------------------------


def matmul_peak(dtype: str, n: int | None = None, seconds: float = 1.0, repeats: int = 3) -> dict:
    """FLOP/s of a loop of n x n matrix products in `dtype`: the best of `repeats` timings of as
    many products as fill about `seconds`, each product dispatched (asynchronously) by one jitted
    call and the last one waited for."""
    import jax
    import jax.numpy as jnp

    gpu = jax.default_backend() != "cpu"
    n = n or (8192 if gpu else 2048)
    a = jax.random.normal(jax.random.key(1), (n, n), "float32").astype(dtype)
    b = jax.random.normal(jax.random.key(2), (n, n), "float32").astype(dtype)
    matmul = jax.jit(jnp.matmul)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        c = None
        for _ in range(k):
            c = matmul(a, b)
        c.block_until_ready()
        return time.perf_counter() - t0

    return matmul_rate(run, n, dtype, seconds, repeats)
