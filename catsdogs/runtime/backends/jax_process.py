"""How a JAX worker process starts: the first half of catsdogs.runtime.backends.jax, which gives
these functions as its own (the Backend protocol's `start`, `process_env`, `strategy_env`,
`running_settings`, `compile_counts`).

- TensorFlow kept out: `start` makes `import tensorflow` fail as if it were not installed
  (`_NoTensorFlow`), so Keras's own optional uses of it stay off and a JAX process behaves as on
  the GPU machine, which has none.
- The process's settings (backends.process_settings, read before JAX starts): XLA's
  `--xla_gpu_deterministic_ops` exactly when deterministic, whatever the parent's XLA_FLAGS held;
  TF32 through `jax_default_matmul_precision`. Read back (`running_settings`): what holds.
- The persistent compilation cache (backends.compile_cache_dir), configured before JAX starts,
  its thresholds at zero; the process's compilations and the cache's loads counted
  (`compile_counts`).
- On the CPU, glibc's malloc told to back its large blocks with transparent huge pages
  (`MALLOC_ENV`, glibc's `malloc.hugetlb` tunable): XLA:CPU allocates a step's large buffers afresh
  at every step, which glibc maps and unmaps, so the kernel faulted in and zeroed every 4 KiB page
  again (10 million page faults in 24 s of steps at batch 256, 40% of the CPU time in the kernel).
  In 2 MiB pages the step runs about as fast as with 0.36.0's settings (one arena, no mmap, no
  trimming: the blocks kept in the heap), and its peak stays what the buffers need: kept in one
  heap, the freed blocks left holes a step's next buffers did not fit, and about one process in
  three peaked 40-70% above the rest (benchmarks/bench_malloc.py), past the probe that had said
  the size fits. Where glibc is older than 2.35 or the kernel's huge pages are `never`, the
  tunable does nothing: glibc's defaults, slower, the same peaks (under `always` the kernel gives
  them without it). A trial's record says which (`huge_pages`, `glibc`: catsdogs.host.environment).
- On the CPU, Keras's 2x2 max-pooling with a gradient that avoids XLA:CPU's scalar
  select-and-scatter (catsdogs.runtime.backends.jax_pool): the same numbers, a 1.5x faster step;
  and its convolution of three channels into 32 filters (the article's first layer) computed
  on a fourth channel of zeros (catsdogs.runtime.backends.jax_conv): XLA:CPU's own runs that shape
  on a slow path; the step 0.7-0.8x, an evaluation 0.6x, the sums in another order.

Imports JAX only inside `start`, after everything it reads at start-up is set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

from catsdogs import host
from catsdogs.runtime.backends import jax_conv, jax_pool

LOGICAL_CPUS_ENV = "CATSDOGS_LOGICAL_CPUS"  # mirrored on a CPU: this many host devices
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"
# glibc's malloc in a CPU worker (read when the process starts, so set at its launch): its mapped
# blocks and heap asked into transparent huge pages (glibc 2.35 on, where the kernel's mode is
# `madvise`; under `always` they come without asking), mapped and unmapped as by default, so a
# freed block leaves no hole behind
MALLOC_TUNABLE = host.HUGE_PAGE_TUNABLE
MALLOC_ENV = {"GLIBC_TUNABLES": MALLOC_TUNABLE}


def _xla_flags(*extra: str, deterministic: bool = True, flags: str | None = None) -> str:
    """XLA_FLAGS as the user set them, plus ours (a flag the user set is left as they set it), with
    XLA's deterministic-ops flag exactly when `deterministic`: that one is the trial's, a user's
    value of it is replaced."""
    name = DETERMINISTIC_FLAG.split("=")[0]
    given = [f for f in (os.environ.get("XLA_FLAGS", "") if flags is None else flags).split()
             if f.split("=")[0] != name]  # the trial's setting, whatever the user's says
    names = {f.split("=")[0] for f in given}
    wanted = [*extra, DETERMINISTIC_FLAG] if deterministic else list(extra)
    return " ".join([*given, *(f for f in wanted if f.split("=")[0] not in names)])


def process_env(threads: int | None = None) -> dict[str, str]:
    """Environment for a worker process, read by JAX when it starts, and on a host without an
    NVIDIA device by glibc's malloc (`malloc_env`). (Threads: XLA's CPU thread pool follows the
    worker's CPU affinity, which catsdogs.training.child sets. Determinism and TF32: `start`,
    from the worker's settings.)"""
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "TF_CPP_MIN_LOG_LEVEL": "2",  # XLA's C++ logging reads TensorFlow's variable
            **(malloc_env(os.environ) if not host.nvidia_devices() else {})}


def malloc_env(environ) -> dict[str, str]:
    """MALLOC_ENV, unless `environ` already says how glibc's malloc should behave (a MALLOC_*
    variable, or glibc.malloc tunables): a user's choice is left whole, not mixed with ours. A
    tunable of another part of glibc's is kept beside ours."""
    others = environ.get("GLIBC_TUNABLES", "")
    if any(k.startswith("MALLOC_") for k in environ) or "glibc.malloc" in others:
        return {}
    return {"GLIBC_TUNABLES": f"{others}:{MALLOC_TUNABLE}" if others else MALLOC_TUNABLE}


def strategy_env(strategy: str) -> dict[str, str]:
    """Environment for a worker started for a trial of this distribution strategy."""
    if strategy == "mirrored":
        n = os.environ.get(LOGICAL_CPUS_ENV, "2")  # host devices; a GPU machine uses its GPUs
        return {LOGICAL_CPUS_ENV: n,
                "XLA_FLAGS": _xla_flags(f"{HOST_DEVICES_FLAG}={n}", deterministic=False)}  # `start` decides
    return {}


class _NoTensorFlow:
    """A meta-path finder under which `import tensorflow` raises ModuleNotFoundError, as where
    it is not installed. (Not `sys.modules["tensorflow"] = None`: Keras takes a name present in
    sys.modules for an imported TensorFlow.)"""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {name!r} (catsdogs runs on JAX)", name=name)
        return None


def _block_tensorflow() -> None:
    if "tensorflow" not in sys.modules and not any(isinstance(f, _NoTensorFlow) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoTensorFlow())


RUNNING: dict = {}  # the settings this process runs with, once `start` has set them


def start() -> str:
    """Once per process, before any op: TensorFlow kept out; the process's settings (determinism,
    TF32: backends.process_settings) and the compilation cache set before JAX starts; 'gpu' or
    'cpu'. JAX imported and not started (a template's child: catsdogs.runtime.template; or a
    sitecustomize's import) takes them all the same: XLA reads its flags as JAX's backend starts, and
    the cache's settings go to jax.config (`_apply_cache`), JAX having read the environment's at its
    import. A process whose JAX had started keeps the flags it started with, and says so
    (`running_settings`)."""
    from catsdogs.runtime.backends import compile_cache_dir, process_settings

    _block_tensorflow()  # (in every process, JAX started or not: Keras's optional uses of it stay off)
    settings = process_settings()
    unstarted = "jax" in sys.modules and not backend_started()  # imported, not started: a template's child, say
    if "jax" not in sys.modules or unstarted:  # (XLA reads its flags as JAX's backend starts)
        before_import()
        os.environ["XLA_FLAGS"] = _xla_flags(deterministic=settings["deterministic"])
        _configure_cache(compile_cache_dir())
    import jax

    if unstarted:  # JAX read its cache's settings when it was imported
        _apply_cache(jax, compile_cache_dir())

    # the trial's setting, also over a JAX_DEFAULT_MATMUL_PRECISION of the user's (None: JAX's default)
    jax.config.update("jax_default_matmul_precision",
                      None if settings["tf32"] is None else "tensorfloat32" if settings["tf32"] else "highest")
    _count_compilations()
    if jax.default_backend() == "cpu":  # XLA:CPU's slow paths: select-and-scatter, an RGB convolution
        jax_pool.install()
        jax_conv.install()
    precision = jax.config.jax_default_matmul_precision  # read back: what the process really runs with
    RUNNING.update(deterministic=DETERMINISTIC_FLAG in os.environ.get("XLA_FLAGS", "").split(),
                   tf32={"tensorfloat32": True, "highest": False}.get(precision) if precision else None)
    return "gpu" if jax.default_backend() == "gpu" else "cpu"


def before_import() -> None:
    """What a JAX worker sets before JAX is imported: TensorFlow kept out, the process's
    environment (`process_env`, but malloc's: read at a process's start, too late here). A
    template (catsdogs.runtime.fork_server) sets it before its import too."""
    _block_tensorflow()
    for key, value in process_env().items():
        if key not in MALLOC_ENV:
            os.environ.setdefault(key, value)


def backend_started() -> bool:
    """Whether JAX's backends have started in this process (a template's child's have not)."""
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", None))


def running_settings() -> dict:
    """{"deterministic", "tf32"}: what this process runs with (after `start`)."""
    return dict(RUNNING)


# The persistent cache keeps every entry, however small or quick to compile (JAX's defaults keep
# only compilations of over a second, which a CPU's small steps rarely are): JAX's config names,
# each read at import from the variable of its name in capitals
CACHE_KEEPS_ALL = {"jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": 0}


def _configure_cache(folder) -> None:
    """Before JAX is imported: its persistent compilation cache in `folder` (None: off), keeping
    every entry (CACHE_KEEPS_ALL), in the environment JAX reads as it is imported."""
    if folder is None:
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
        return
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    os.environ.update({name.upper(): str(value) for name, value in CACHE_KEEPS_ALL.items()})


def _apply_cache(jax, folder) -> None:
    """`_configure_cache`'s settings given to a JAX imported before them (a template's child),
    which read the environment's as it was imported: before any compilation, they hold."""
    jax.config.update("jax_compilation_cache_dir", None if folder is None else str(folder))
    if folder is not None:
        for name, value in CACHE_KEEPS_ALL.items():
            jax.config.update(name, value)


COMPILATIONS = {"backend_compiles": 0, "cache_hits": 0}  # this process's, since `start`
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch's
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


@functools.cache
def _count_compilations() -> None:
    """Count XLA compilations with jax.monitoring. The backend-compile event times
    `compile_or_get_cached`, so it fires for a persistent-cache hit too (a load, not a compile):
    compilations are those events less the hits."""
    import jax

    def on_duration(event, duration, **kwargs):
        if event == BACKEND_COMPILE_EVENT:
            COMPILATIONS["backend_compiles"] += 1

    def on_event(event, **kwargs):
        if event == CACHE_HIT_EVENT:
            COMPILATIONS["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)


def compile_counts() -> dict:
    """{"compiles", "cache_hits"}: this process's XLA compilations and persistent-cache loads so far."""
    return {"compiles": COMPILATIONS["backend_compiles"] - COMPILATIONS["cache_hits"],
            "cache_hits": COMPILATIONS["cache_hits"]}


