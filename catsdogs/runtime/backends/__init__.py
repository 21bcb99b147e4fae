"""The seam between catsdogs and a Keras backend.

Everything framework-specific (input pipelines, the fused optimizer update, determinism,
memory queries, out-of-memory classification, distribution, thread settings, the device's
matmul peak) lives in one module per backend here (`tensorflow`, `jax`); the engine, the worker
and the prober call only what `current()` returns, and only the names of the `Backend`
protocol, which each module provides (tests/runtime/test_backends.py checks them). The backend is
Keras's own choice: `KERAS_BACKEND`, else the "backend" of Keras's keras.json, else TensorFlow.
Importing this package, or a backend's module, imports no framework: a backend's `start`
imports it, once the worker's settings are in place.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from catsdogs.errors import CatsdogsError
from catsdogs.schema import BACKENDS, Status, process_words

SUPPORTED = BACKENDS
DEFAULT = "tensorflow"
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")  # the names Keras 3 takes, exactly

# A worker process is started with its settings in these variables, read by the backend's
# `start` before the framework starts (schema.PROCESS_FIELDS: a trial runs only in a worker of
# its own settings).
DETERMINISTIC_ENV = "CATSDOGS_DETERMINISTIC"  # "0": no deterministic kernels; else deterministic
TF32_ENV = "CATSDOGS_TF32"  # "1": TF32 allowed, "0": forbidden, unset or "": the framework's default
COMPILE_CACHE_ENV = "CATSDOGS_COMPILE_CACHE"  # JAX's persistent compilation cache: a folder, or "off"


@runtime_checkable
class Backend(Protocol):
    """What catsdogs asks of a Keras backend: a module (backends.tensorflow, backends.jax) whose
    functions are these methods, `self` aside. A worker calls `setup_device` and `start` once,
    before anything else; every other call comes after."""

    NAME: str  # KERAS_BACKEND's name for it
    OOM_MARKERS: tuple[str, ...]  # texts of its out-of-memory errors, in a dead worker's log too
    # XLA's planned bytes of a training step (model, batch size, image size), without running it;
    # None where the compiler states no plan (TensorFlow: catsdogs.training.costs models it)
    compiled_step_bytes: Callable[[Any, int], int] | None

    # --- a worker process, before and as the framework starts
    def process_env(self, threads: int | None = None) -> dict[str, str]:
        """Environment for a worker process, read by the framework when it starts."""

    def strategy_env(self, strategy: str) -> dict[str, str]:
        """Environment for a worker started for a trial of this distribution strategy."""

    def setup_device(self, memory_cap_bytes: int | None) -> str:
        """Before the framework touches the GPU: a cap as its memory limit; 'gpu' or 'cpu'."""

    def start(self) -> str:
        """Once per process: the process's settings (`process_settings`) applied; 'gpu' or 'cpu'."""

    def running_settings(self) -> dict:
        """{"deterministic", "tf32"}: what the process runs with, read back after `start`."""

    def compile_counts(self) -> dict | None:
        """{"compiles", "cache_hits"} so far (XLA's), or None where nothing is compiled."""

    def device_description(self) -> str: ...

    def versions(self) -> dict: ...

    # --- training
    def seed(self, seed: int) -> None:
        """Seed what a trial draws from, as keras.utils.set_random_seed does, keeping every compiled
        function ready to run (a trial's reset and a step's build call it)."""

    def train_batches(self, split, batch_size: int, seed: int, n_batches: int, cross_epochs: bool = False,
                      prefetch: int = 2):
        """The batches of catsdogs.data.loading.batch_schedule, in order, ready for `fit`."""

    def eval_batches(self, split, batch_size: int):
        """Every image once, in order, the last batch partial."""

    def optimizer_class(self, name: str, strategy: str) -> type: ...

    def distribution(self, strategy: str):
        """The strategy's scope and replica count (`scope()`, `num_replicas_in_sync`)."""

    def weight_values(self, model) -> list:
        """Each weight's value as it is now, which no later step changes (the weights' digest)."""

    def wait_for_steps(self, model) -> None:
        """Return when every dispatched training step has run."""

    FIT_VALIDATES: bool  # Keras's fit validates each epoch; else the engine's timer does, with `evaluate`

    def evaluate(self, model, batches, cache: dict | None = None) -> tuple[float, float]:
        """(loss, accuracy) over `batches` as `model.evaluate` gives them, inside fit too (fit's
        running metrics left as they were); `cache` keeps what it compiles (the step's)."""

    def sync_weights(self, model) -> None:
        """Mid-epoch, inside fit: put the state the running fit holds back on the model's
        variables, so they can be read or evaluated (and fit takes them up again from there)."""

    def per_example_gram(self, model, images, labels, block: int, cache: dict | None = None):
        """Per-example gradient Gram matrices, block by block (catsdogs.runtime.backends.per_example)."""

    def micro_gradient_gram(self, model, loss, images, labels, micro: int, micros: int, cache: dict | None = None):
        """Micro-batch gradients' Gram matrices, large batch by large batch (any model: the
        two-batch estimator, catsdogs.training.engine.noise_estimate_at)."""

    # --- memory, errors, the device's peak
    def reset_peak_memory(self) -> None: ...

    def peak_memory(self) -> dict:
        """{"peak_memory_mb", "memory_kind", ...}: the peak since the last reset."""

    def memory_budget_bytes(self) -> int | None:
        """The memory that holds a model: the GPU's, else the host's."""

    def device_bytes_in_use(self) -> int | None:
        """The device allocator's bytes in use now, besides the data sets kept on the device; None
        where it is not counted, or an out-of-memory is not shown to leave it as it was (then a
        probe out of memory ends its worker)."""

    def classify_error(self, exc: BaseException) -> str:
        """'oom' for running out of memory, else 'failed' (a schema.Status)."""

    def matmul_peak(self, dtype: str, n: int | None = None, seconds: float = 1.0, repeats: int = 3) -> dict:
        """FLOP/s of n x n matrix products in `dtype` (matmul_rate)."""


def process_env_for(deterministic: bool = True, tf32: bool | None = None) -> dict[str, str]:
    """The environment that starts a worker with these settings."""
    return {DETERMINISTIC_ENV: "1" if deterministic else "0", TF32_ENV: "" if tf32 is None else str(int(tf32))}


def process_settings(environ=None) -> dict:
    """{"deterministic": bool, "tf32": bool | None}: what a process started with `environ` (this
    process's by default) runs with."""
    environ = os.environ if environ is None else environ
    tf32 = environ.get(TF32_ENV, "").strip()
    return {"deterministic": environ.get(DETERMINISTIC_ENV, "1").strip() != "0",
            "tf32": None if tf32 == "" else tf32 == "1"}


def settings_of(cfg) -> dict:
    """A trial's process settings, as `process_settings` gives them."""
    return {"deterministic": bool(cfg.deterministic), "tf32": cfg.tf32}


def check_settings(cfg, running: dict) -> None:
    """A CatsdogsError when `cfg` was planned for other process settings than `running`."""
    wanted = settings_of(cfg)
    if wanted != running:
        raise CatsdogsError(f"this trial was planned for {describe_settings(wanted)}, and this worker runs "
                            f"{describe_settings(running)}: a worker of its own settings must run it")


def describe_settings(settings: dict) -> str:
    return ", ".join(process_words(settings["deterministic"], settings["tf32"], defaults=True))


def compile_cache_dir(environ=None) -> Path | None:
    """JAX's persistent compilation cache for catsdogs' workers: $CATSDOGS_COMPILE_CACHE, else
    catsdogs/jax-compilation under the user's cache folder ($XDG_CACHE_HOME, else ~/.cache);
    None when it is "off"."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(COMPILE_CACHE_ENV, "").strip()
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "catsdogs" / "jax-compilation"


def name() -> str:
    """The backend this process uses (and its workers will), chosen as Keras chooses it."""
    return _choice()[0]


def _choice() -> tuple[str, str]:
    """(backend, what chose it): KERAS_BACKEND, else keras.json in $KERAS_HOME (default ~/.keras,
    or /tmp/.keras where the home folder is read-only), else Keras's default. As Keras reads them:
    the name exactly as written ("JAX" or " jax" is no backend to Keras, and so none to us), an
    empty KERAS_BACKEND as none."""
    env = os.environ.get("KERAS_BACKEND", "")
    if env:
        return env, "KERAS_BACKEND"
    home = os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~") if os.access(os.path.expanduser("~"), os.W_OK) else "/tmp", ".keras")
    path = Path(home) / "keras.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        chosen = str(json.loads(path.read_text()).get("backend", ""))
        if chosen:
            return chosen, str(path)
    return DEFAULT, "Keras's default"


def describe() -> str:
    """"Keras 3.15.1 on tensorflow 2.21.0 (KERAS_BACKEND)", without importing either; says so
    where Keras or the backend is missing or the backend is not one catsdogs runs on."""
    backend, chosen_by = _choice()

    def version(pkg: str) -> str | None:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(pkg)
        return None

    keras = f"Keras {version('keras')}" if version("keras") else "Keras not installed"
    framework = version(backend)
    if backend not in SUPPORTED:
        where = f"{backend}, which catsdogs does not run on (use {' or '.join(SUPPORTED)})"
    else:
        where = f"{backend} {framework}" if framework else f"{backend}, not installed"
    return f"{keras} on {where} (backend from {chosen_by})"


def check(backend: str | None = None) -> str:
    """The backend's name, or a one-line CatsdogsError naming the supported ones (and, for a name
    Keras itself would refuse, the names it takes): asked before any trial is recorded."""
    chosen_by = "KERAS_BACKEND"
    if backend is None:
        backend, chosen_by = _choice()
    if backend not in SUPPORTED:
        what = "KERAS_BACKEND" if chosen_by == "KERAS_BACKEND" else f"the backend in {chosen_by}"
        if backend not in KERAS_BACKENDS:
            raise CatsdogsError(f"{what} is {backend!r}, which is not a backend name Keras accepts (exactly one of "
                                f"{', '.join(KERAS_BACKENDS)}, in lower case); catsdogs runs on "
                                f"{' or '.join(SUPPORTED)}: e.g. KERAS_BACKEND={SUPPORTED[1]}")
        raise CatsdogsError(f"KERAS_BACKEND={backend} is not supported by catsdogs; "
                            f"use {' or '.join(SUPPORTED)}")
    return backend


def keras_evaluate(model, batches, cache: dict | None = None) -> tuple[float, float]:
    """(loss, accuracy): `model.evaluate` (which compiles and keeps its own: no `cache`), inside fit
    too. It resets the metrics fit is accumulating the epoch's loss and accuracy in: they are saved
    before and put back after, so the epoch's logs are as without it. TensorFlow's `evaluate`."""
    import keras

    variables = list(model.metrics_variables)
    running = [keras.ops.convert_to_numpy(v.value) for v in variables]
    loss, accuracy = model.evaluate(batches, verbose=0)
    for variable, value in zip(variables, running, strict=True):
        variable.assign(value)
    return float(loss), float(accuracy)


def current() -> Backend:
    """The backend module (catsdogs.runtime.backends.tensorflow, ...), or a one-line
    CatsdogsError when its framework is not installed."""
    backend = check()
    module = importlib.import_module(f"{__name__}.{backend}")
    if sys.modules.get(backend) is None and importlib.util.find_spec(backend) is None:
        install = {"jax": "pip install 'catsdogs[jax]'", "tensorflow": "pip install tensorflow"}[backend]
        raise CatsdogsError(f"KERAS_BACKEND={backend} needs {backend}, which is not installed: {install}")
    return cast(Backend, module)


def seed_states(model) -> set[int]:
    """The positions, among the model's non-trainable variables, of its random seed states
    (keras.random.SeedGenerator's: a Dropout's). A stateless call does not move them, so every
    micro-batch of a measurement would draw the same masks: the dropout noise then common to all
    of them would read as signal. Each micro-batch moves them on by its index instead."""
    return {k for k, v in enumerate(model.non_trainable_variables) if v.path.endswith("seed_generator_state")}


def has_depthwise(model) -> bool:
    """Whether the model (its nested models too) has a depthwise convolution. JAX's `vmap` makes
    its kernel's gradient over many micro-batches one grouped convolution of every micro-batch's
    channels: 43 GB for keras.applications' MobileNet at 32 px. Such a model's micro-batches go one
    after another (backends.jax.micro_gradient_gram; 3.3x slower for a small ResNet)."""
    for layer in getattr(model, "layers", []):
        if type(layer).__name__ in ("DepthwiseConv2D", "SeparableConv2D") or has_depthwise(layer):
            return True
    return False


def matmul_rate(run, n: int, dtype: str, seconds: float, repeats: int) -> dict:
    """A backend's matmul peak from `run(k)`, which times k n x n products in `dtype` and waits for
    them: the best of `repeats` timings of as many products as fill about `seconds`, after a
    warm-up (kernels chosen or compiled and autotuned, memory allocated)."""
    run(2)
    one = max(run(1), 1e-6)
    k = max(1, min(10_000, int(seconds / one)))
    best = min(run(k) for _ in range(repeats))
    return {"peak_flops_per_second": 2.0 * n**3 * k / best, "matmul_size": n, "matmul_dtype": dtype,
            "matmuls": k}


def failure_fields(exc: BaseException, backend=None) -> dict:
    """What the record of a task that raised says: its status as the backend classifies the error
    (oom, or failed), the error in a line and its traceback (the worker folds it into the error)."""
    status = Status.FAILED
    try:
        status = Status((backend or current()).classify_error(exc))
    except Exception:  # noqa: BLE001 - the backend itself failed to load: failed
        pass
    return {"status": status, "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
            "traceback": traceback.format_exc()[-8000:]}
