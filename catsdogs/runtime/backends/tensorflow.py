"""Keras 3 on TensorFlow: every TensorFlow-specific call catsdogs makes.

The worker's process environment (`process_env`) is set before TensorFlow starts, since
TensorFlow reads its thread counts and allocator choice once, at start-up.

Memory (peaks, the device's budget): catsdogs.runtime.backends.tensorflow_memory, whose functions
this module gives as its own.

The CPU allocator. A training step of the article's model allocates the 41M-parameter Dense
layer's gradient (164 MB at 200 px) and, with Keras's Adam, several temporaries of that size.
TensorFlow's default CPU allocator hands each to glibc, which serves blocks above its mmap
threshold (32 MiB at most) with fresh mmaps and unmaps them on free: every step, the kernel
zeroes and maps hundreds of MB again, and a 200 px trial spent two thirds of its time in the
kernel. TensorFlow's own BFC allocator keeps freed blocks in a pool instead
(`TF_CPU_ALLOCATOR_USE_BFC`); benchmarks/bench_trial.py measures it (`--variants sysalloc` runs
without it) and tests/training/test_engine.py checks that results are identical with and without it.
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref

from catsdogs.host import cpu_description
from catsdogs.optimizers import OPTIMIZERS
from catsdogs.runtime.backends import keras_evaluate as evaluate  # noqa: F401 (the Backend's, Keras's own here)
from catsdogs.runtime.backends import matmul_rate, seed_states
from catsdogs.runtime.backends.tensorflow_memory import compiled_step_bytes as compiled_step_bytes
from catsdogs.runtime.backends.tensorflow_memory import device_bytes_in_use as device_bytes_in_use
from catsdogs.runtime.backends.tensorflow_memory import memory_budget_bytes as memory_budget_bytes
from catsdogs.runtime.backends.tensorflow_memory import peak_memory as peak_memory
from catsdogs.runtime.backends.tensorflow_memory import reset_peak_memory as reset_peak_memory
from catsdogs.schema import Status

NAME = "tensorflow"
LOGICAL_CPUS_ENV = "CATSDOGS_LOGICAL_CPUS"  # mirrored on a CPU: this many logical devices
LOG_LEVEL = "2"  # TensorFlow's C++ logging: warnings and errors only
FIT_VALIDATES = True  # fit's validation of each epoch reuses its pipeline: cheaper than an `evaluate`


def process_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a worker process, read by TensorFlow when it starts."""
    env = {"TF_CPP_MIN_LOG_LEVEL": LOG_LEVEL, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    if threads:
        env.update(TF_NUM_INTRAOP_THREADS=str(threads), TF_NUM_INTEROP_THREADS="1")
    return env


def strategy_env(strategy: str) -> dict[str, str]:
    """Environment for a worker started for a trial of this distribution strategy."""
    if strategy == "mirrored":
        return {LOGICAL_CPUS_ENV: os.environ.get(LOGICAL_CPUS_ENV, "2")}
    return {}


RUNNING: dict = {}  # the settings this process runs with, once `start` has set them


def start() -> str:
    """Once per process, before any op: logical CPU devices where asked; the process's settings
    (backends.process_settings): op determinism on or off, TF32 allowed, forbidden or TensorFlow's
    default (allowed); 'gpu' or 'cpu'."""
    from catsdogs.runtime.backends import process_settings

    settings = process_settings()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", LOG_LEVEL)
    import tensorflow as tf

    n = int(os.environ.get(LOGICAL_CPUS_ENV) or 0)
    if n > 1 and not tf.config.list_physical_devices("GPU"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        with contextlib.suppress(RuntimeError):  # already started: distribution() says so
            if len(tf.config.get_logical_device_configuration(cpu) or []) < n:
                tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    from tensorflow.python.framework import (
        config as tf_config,  # the switch's off side is not public
    )

    if settings["deterministic"]:
        tf.config.experimental.enable_op_determinism()
    else:
        tf_config.disable_op_determinism()
    if settings["tf32"] is not None:
        tf.config.experimental.enable_tensor_float_32_execution(settings["tf32"])
    RUNNING.update(deterministic=tf_config.is_op_determinism_enabled(),  # read back, as the process runs
                   tf32=None if settings["tf32"] is None else tf.config.experimental.tensor_float_32_execution_enabled())
    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def running_settings() -> dict:
    """{"deterministic", "tf32"}: what this process runs with (after `start`)."""
    return dict(RUNNING)


def compile_counts() -> None:
    """XLA compilations: TensorFlow traces graphs but does not compile them with XLA here."""
    return None


def setup_device(memory_cap_bytes: int | None) -> str:
    """Configure the GPU before TensorFlow touches it; 'gpu' or 'cpu'. With a cap, a GPU gets a
    logical device of that size; without, memory growth, so NVML's 'memory used' shows what is
    used rather than TensorFlow's up-front reservation. Only the first call of a process can
    configure anything: later calls leave the devices as they are."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    with contextlib.suppress(RuntimeError, ValueError):  # already initialized: leave it
        if gpus and memory_cap_bytes:
            tf.config.set_logical_device_configuration(
                gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_cap_bytes // 2**20)])
        else:
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
    return "gpu" if gpus else "cpu"


def device_description() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return f"{len(gpus)} x {details.get('device_name', 'GPU')}"
    return cpu_description()


def versions() -> dict:
    import keras
    import tensorflow as tf

    return {"backend": NAME, "tensorflow": tf.__version__, "keras": keras.__version__}


# --- input pipelines -------------------------------------------------------------------------


def train_batches(split, batch_size: int, seed: int, n_batches: int, cross_epochs: bool = False,
                  prefetch: int = 2):
    """The batches of loading.batch_schedule(), each gathered from memory in one op (inline: a
    thread pool would cost more than the copy), `prefetch` of them ready so the device never
    waits for the host. Reading them costs no shuffle buffer and no per-image work."""
    import tensorflow as tf

    from catsdogs.data.loading import batch_schedule

    images, labels = _host_tensors(split)
    schedule = batch_schedule(len(split), batch_size, seed, n_batches, cross_epochs)
    ds = tf.data.Dataset.from_tensor_slices(schedule)
    # not converted by AutoGraph (it has no control flow): a worker's first conversion costs 0.3 s
    ds = ds.map(tf.autograph.experimental.do_not_convert(lambda idx: (tf.gather(images, idx), tf.gather(labels, idx))))
    return fixed_prefetch(ds, prefetch)


# id(split.images) -> (images, labels) as tensors in host memory (at 200 px, 144 MB copied each
# trial before); (id, batch size) -> the split's evaluation dataset. Dropped with their split.
_HOST: dict[int, tuple] = {}
_EVAL: dict[tuple, object] = {}


def _host_tensors(split) -> tuple:
    """The split as tensors in host memory (only batches go to a GPU), once per decoded data set."""
    import tensorflow as tf

    key = id(split.images)
    if key not in _HOST:
        with tf.device("/CPU:0"):
            _HOST[key] = (tf.constant(split.images), tf.constant(split.labels))
        weakref.finalize(split.images, _HOST.pop, key, None)
    return _HOST[key]


def eval_batches(split, batch_size: int):
    """Every image once, in order, the last batch partial: accuracy over the whole split. One
    dataset per split and batch size: a new one each trial would cost Keras a trace."""
    import tensorflow as tf

    key = (id(split.images), int(batch_size))
    if key not in _EVAL:
        ds = tf.data.Dataset.from_tensor_slices(_host_tensors(split))
        _EVAL[key] = fixed_prefetch(ds.batch(batch_size))
        weakref.finalize(split.images, _EVAL.pop, key, None)
    return _EVAL[key]


def fixed_prefetch(ds, batches: int = 2):
    """Prefetch a fixed number of batches, with tf.data's autotuning off.

    The autotuner's background thread wakes ever less often as a pipeline runs, and deleting
    the iterator waits for its next wake-up: at the end of a 5-epoch trial here, 40 seconds of
    doing nothing. One batch in the step and one ready are all a step-bound pipeline needs."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.prefetch(batches).with_options(options)


# --- the optimizer and the distribution strategy -----------------------------------------------


def adam_class(fused: bool):
    """Keras's Adam, or the same Adam with its dense update done by one fused TensorFlow kernel.

    Keras 3's Adam updates each variable with a dozen element-wise ops, each a full pass over
    the 41M-parameter Dense kernel and its two slots; tf.raw_ops.ResourceApplyAdam does the
    same arithmetic in one pass: a third less CPU per training step here (benchmarks/bench_trial.py),
    with weights equal to 1e-6 (tests/contracts/test_protocol.py). Not used under a distribution
    strategy, whose per-replica variables the kernel would have to be handed one by one."""
    import keras
    import tensorflow as tf

    if not fused:
        return keras.optimizers.Adam

    def handle(v):
        return v.value.handle if isinstance(v, keras.Variable) else v.handle

    class FusedAdam(keras.optimizers.Adam):
        def update_step(self, gradient, variable, learning_rate):
            if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            step = tf.cast(self.iterations + 1, dtype)
            b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
            i = self._get_variable_index(variable)
            tf.raw_ops.ResourceApplyAdam(
                var=handle(variable), m=handle(self._momentums[i]), v=handle(self._velocities[i]),
                beta1_power=tf.pow(b1, step), beta2_power=tf.pow(b2, step),
                lr=tf.cast(learning_rate, dtype), beta1=b1, beta2=b2,
                epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))

    return FusedAdam


def optimizer_class(name: str, strategy: str):
    import keras

    if name == "adam":  # Keras's Adam with TensorFlow's fused update (adam_class)
        return adam_class(fused=strategy == "none")
    return getattr(keras.optimizers, OPTIMIZERS[name].keras_class)


def distribution(strategy: str):
    """The tf.distribute strategy of a trial (the default one for 'none')."""
    import tensorflow as tf

    if strategy != "mirrored":
        return tf.distribute.get_strategy()
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()  # every visible GPU
    # No GPU: mirror over logical CPU devices, CATSDOGS_LOGICAL_CPUS of them (default 2); this
    # is how the strategy is tested without GPUs. Logical devices can only be made before
    # TensorFlow starts (`start`), so such a trial gets a worker of its own (strategy_env).
    n = int(os.environ.get(LOGICAL_CPUS_ENV, "2"))
    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or []) < n:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        except RuntimeError:
            raise RuntimeError(f"--strategy mirrored on the CPU needs {n} logical devices, set before "
                               f"TensorFlow starts: run it in a worker started with {LOGICAL_CPUS_ENV}={n}") from None
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def weight_values(model) -> list:
    """Each weight's value as it is now: a read, which a later assignment leaves as it was
    (TensorFlow copies a variable on write while a read of it is held)."""
    return [v.value.read_value() for v in model.weights]


def seed(seed: int) -> None:
    """What keras.utils.set_random_seed sets (Python's, NumPy's and Keras's global generators and
    TensorFlow's global seed), without the clearing of TensorFlow's kernel cache that
    `tf.random.set_seed` adds (TFE_ContextClearCaches, to restart the streams of stateful random
    kernels): after it every compiled function builds its kernels again at its next call, a graph
    optimisation each. A reused step's reset paid it every trial: its first training step, its
    first validation (0.05 s at 40 px here, against 0.006 s after) and its test, 0.1-0.15 s of
    the quick plan's 0.2-0.24 s a trial besides training, and as much inside its training
    (benchmarks/bench_trial_overhead.py --split). A trial of the article's model draws nothing
    from a stateful TensorFlow kernel: Keras's random ops are stateless, seeded from SeedGenerator
    variables a reset puts back, and the batches' order is NumPy's; the weights' digests are those
    a fresh process trains (tests/training/test_engine.py). A user's model, whose own layers may
    call one, is seeded by Keras's set_random_seed instead (steps.TrainingStep._seed). Keras's
    private names are its own set_random_seed's (tests/runtime/test_backends.py holds the two to
    the same draws)."""
    import random

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random import seed_generator
    from keras.src.utils import rng_utils
    from tensorflow.python.eager import context

    global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR, None)
    random.seed(seed)
    np.random.seed(seed)
    ctx = context.context()
    ctx._seed, ctx._rng = seed, random.Random(seed)  # context._set_global_seed, less its clearing


def wait_for_steps(model) -> None:
    """Return when every dispatched training step has run. On a CPU TensorFlow's steps have; on a
    GPU reading the smallest weight back waits for the kernels queued before its update."""
    import math

    min(model.trainable_variables, key=lambda v: math.prod(v.shape)).value.numpy()


def sync_weights(model) -> None:
    """Nothing to do: TensorFlow's fit trains the model's own variables."""


# --- the gradient noise scale ------------------------------------------------------------------

def per_example_gram(model, images, labels, block: int, cache: dict | None = None):
    """The per-example gradient Gram matrix of the loss at the model's current weights, within
    each block of `block` consecutive examples: numpy (n // block, block, block), float64.

    catsdogs.runtime.backends.per_example does the arithmetic (the model's own layers, "ghost" dot
    products); here TensorFlow differentiates it, under a GradientTape, in one tf.function per
    model and block size, kept in `cache` (the caller's: catsdogs.training.engine keeps it with the
    model's step, so it goes with it; a cache that held the model would keep it alive). Pure: no
    variable is assigned, and the trainer's train_step, metrics and iteration counter are not
    touched."""
    import numpy as np
    import tensorflow as tf

    functions = {} if cache is None else cache
    if block not in functions:
        functions[block] = _gram_function(model, block)
    return np.asarray(functions[block](tf.constant(images), tf.constant(labels)).numpy(), np.float64)


def _gram_function(model, block: int):
    import tensorflow as tf

    from catsdogs.runtime.backends import per_example

    tapped = per_example.tapped_layers(model)

    # One trace per batch shape, which stays static (a measurement uses one or two). Its Python
    # branches are on layer types, never on tensors: AutoGraph would convert per_example's
    # functions for nothing (0.7 s of the noise scale's first measurement on this CPU).
    @tf.function(autograph=False)
    def gram(images, labels):
        taps = [tf.zeros(shape) for shape in per_example.tap_shapes(model, images.shape[0])]
        with tf.GradientTape() as tape:
            tape.watch(taps)
            loss, inputs = per_example.forward(model, images, labels, taps)
        return per_example.gram_blocks(tapped, inputs, tape.gradient(loss, taps), block)

    return gram



def micro_gradient_gram(model, loss, images, labels, micro: int, micros: int, cache: dict | None = None):
    """The Gram matrix of micro-batch gradients (the two-batch estimator's, for any model:
    catsdogs.training.micro_gradients): numpy (n // (micro * micros), micros, micros), float64.

    Each micro-batch of `micro` consecutive examples gets its ordinary gradient of `loss` (mean
    over it, plus the model's own losses) at the model's current weights, in training mode
    (BatchNormalization normalizes over the micro-batch), from one tf.function per shape (kept in
    `cache`) called micro-batch by micro-batch: a graph unrolled over a large batch's micro-batches
    would trace a large model that many times. Stateless (the variables' values are passed through
    Keras's `stateless_call`): BatchNormalization's moving statistics and a dropout's seed move in
    no variable; each micro-batch draws its own dropout masks (backends.seed_states)."""
    import numpy as np
    import tensorflow as tf

    functions = {} if cache is None else cache
    key = ("micro", micro)  # apart from per_example_gram's keys (ints)
    if key not in functions:
        functions[key] = _micro_gradient_function(model, loss)
    vectors = tf.stack([functions[key](tf.constant(images[i:i + micro]), tf.constant(labels[i:i + micro]),
                                       tf.constant(i // micro, tf.int64))
                        for i in range(0, len(images), micro)])
    vectors = tf.reshape(vectors, (-1, micros, vectors.shape[-1]))
    return np.asarray(tf.einsum("pid,pjd->pij", vectors, vectors).numpy(), np.float64)


def _micro_gradient_function(model, loss):
    import tensorflow as tf

    seeds = seed_states(model)

    @tf.function
    def gradient(x, y, i):
        trainable = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
        non_trainable = [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables]
        # micro-batch i draws its own dropout masks: its seed states moved on by i
        non_trainable = [tf.cast(tf.cast(v, tf.int64) + tf.stack([tf.constant(0, tf.int64), i]), v.dtype)  # no uint32 add
                         if k in seeds else v for k, v in enumerate(non_trainable)]
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            predicted, _, losses = model.stateless_call(trainable, non_trainable, x, training=True, return_losses=True)
            value = loss(y, predicted) + tf.add_n([tf.constant(0.0), *losses])
        grads = tape.gradient(value, trainable, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in grads], 0)

    return gradient

# --- memory (catsdogs.runtime.backends.tensorflow_memory) -----------------------------------


# --- errors ------------------------------------------------------------------------------------

OOM_MARKERS = ("ResourceExhausted", "OOM when allocating", "out of memory", "std::bad_alloc",
               "MemoryError", "Cannot allocate memory")


def classify_error(exc: BaseException) -> str:
    """'oom' for running out of memory (device or host), else 'failed'."""
    import tensorflow as tf

    if isinstance(exc, (tf.errors.ResourceExhaustedError, MemoryError)):
        return Status.OOM
    return Status.OOM if any(m in str(exc) for m in OOM_MARKERS) else Status.FAILED


# --- the device's matmul peak -------------------------------------------------------------------


def matmul_peak(dtype: str, n: int | None = None, seconds: float = 1.0, repeats: int = 3) -> dict:
    """FLOP/s of a loop of n x n matrix products in `dtype`: the best of `repeats` timings of
    as many products as fill about `seconds`. On a GPU the products are queued eagerly and the
    last one's value is read back, which waits for all of them."""
    import tensorflow as tf

    gpu = bool(tf.config.list_physical_devices("GPU"))
    n = n or (8192 if gpu else 2048)
    a = tf.cast(tf.random.stateless_normal((n, n), seed=[0, 1], dtype="float32"), dtype)
    b = tf.cast(tf.random.stateless_normal((n, n), seed=[0, 2], dtype="float32"), dtype)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        c = None
        for _ in range(k):
            c = tf.matmul(a, b)
        float(tf.cast(c[0, 0], "float32"))  # wait for every queued product
        return time.perf_counter() - t0

    return matmul_rate(run, n, dtype, seconds, repeats)
