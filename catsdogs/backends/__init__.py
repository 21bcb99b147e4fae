"""The seam between catsdogs and a Keras backend.

Everything framework-specific (input pipelines, the fused optimizer update, determinism,
memory queries, out-of-memory classification, distribution, thread settings, the device's
matmul peak) lives in one module per backend here; the engine, the worker and profile call
only what `current()` returns. The backend is Keras's own choice: `KERAS_BACKEND`, else
TensorFlow, Keras's default. Importing this package imports no framework.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from catsdogs.errors import CatsdogsError

SUPPORTED = ("tensorflow",)
DEFAULT = "tensorflow"


def name() -> str:
    """The backend this process uses (and its workers will): Keras's convention."""
    return os.environ.get("KERAS_BACKEND", DEFAULT).strip().lower() or DEFAULT


def check(backend: str | None = None) -> str:
    """The backend's name, or a one-line CatsdogsError naming the supported ones."""
    backend = backend or name()
    if backend not in SUPPORTED:
        raise CatsdogsError(f"KERAS_BACKEND={backend} is not supported by catsdogs yet; "
                            f"use {' or '.join(SUPPORTED)}")
    return backend


def current() -> ModuleType:
    """The backend module (catsdogs.backends.tensorflow, ...)."""
    return importlib.import_module(f"catsdogs.backends.{check()}")
