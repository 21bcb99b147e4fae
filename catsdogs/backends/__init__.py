"""The seam between catsdogs and a Keras backend.

Everything framework-specific (input pipelines, the fused optimizer update, determinism,
memory queries, out-of-memory classification, distribution, thread settings, the device's
matmul peak) lives in one module per backend here; the engine, the worker and profile call
only what `current()` returns. The backend is Keras's own choice: `KERAS_BACKEND`, else
TensorFlow, Keras's default. Importing this package imports no framework.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from catsdogs.errors import CatsdogsError
from catsdogs.schema import BACKENDS

SUPPORTED = BACKENDS
DEFAULT = "tensorflow"


def name() -> str:
    """The backend this process uses (and its workers will): Keras's convention."""
    return os.environ.get("KERAS_BACKEND", DEFAULT).strip().lower() or DEFAULT


def check(backend: str | None = None) -> str:
    """The backend's name, or a one-line CatsdogsError naming the supported ones."""
    backend = backend or name()
    if backend not in SUPPORTED:
        raise CatsdogsError(f"KERAS_BACKEND={backend} is not supported by catsdogs; "
                            f"use {' or '.join(SUPPORTED)}")
    return backend


def current() -> ModuleType:
    """The backend module (catsdogs.backends.tensorflow, ...), or a one-line CatsdogsError when
    its framework is not installed."""
    backend = check()
    module = importlib.import_module(f"catsdogs.backends.{backend}")
    if sys.modules.get(backend) is None and importlib.util.find_spec(backend) is None:
        install = {"jax": "pip install 'catsdogs[jax]'", "tensorflow": "pip install tensorflow"}[backend]
        raise CatsdogsError(f"KERAS_BACKEND={backend} needs {backend}, which is not installed: {install}")
    return module


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
