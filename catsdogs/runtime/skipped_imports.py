"""A worker's start without the optional modules its framework only tries to import.

Keras and TensorFlow try modules that neither declares as a dependency, for features a worker
never uses: JAX (TensorFlow Lite's converter, Keras's Orbax checkpoint), matplotlib (Keras's image
galleries) and IPython (Keras's file editor, to detect a notebook). Each import sits in
`try: ... except ImportError`, as it must: both frameworks run where these are not installed.
Where they are installed they cost every worker's start a share of its import (docs/performance.md,
"Measurements behind the code's choices"); find-batch-size starts up to seven workers, the test
suite hundreds.

`skipping()` makes those imports fail as they would where the module is not installed: an import
of one of SKIPPED (and its submodules) by a module of Keras or TensorFlow, and by no other; never
the backend itself (JAX's worker imports JAX). It is undone once the framework is imported, so
that a user's model imports any of them as usual.

Not where a worker's resident memory is the measurement: a probe's on the CPU stands for a
training process of the user's, which imports them all (a TensorFlow worker's runtime baseline
is far larger with them). catsdogs.measure.prober starts its CPU workers with ENV=0, unless its
own environment sets ENV=1: a training process that imports none of them (the test suite sets
it: its searches check what the search does, and each probe's worker starts sooner).
"""

from __future__ import annotations

import contextlib
import os
import sys

ENV = "CATSDOGS_SKIP_OPTIONAL_IMPORTS"  # "0": a worker imports what its framework tries, as any process
SKIPPED = ("jax", "matplotlib", "IPython")  # optional to both frameworks, unused by a worker
FRAMEWORKS = ("keras", "tensorflow")  # the importers whose tries are skipped


class _Skipper:
    """A finder ahead of every other: ModuleNotFoundError for a skipped module not yet imported,
    imported by a framework's module (the nearest frame outside the import machinery)."""

    def __init__(self, skipped: tuple[str, ...], frameworks: tuple[str, ...]):
        self.skipped, self.frameworks = skipped, frameworks
        self.skips: list[tuple[str, str]] = []  # (module, importer), as they happened

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in self.skipped or top in sys.modules:
            return None
        importer = _importer()
        if importer.partition(".")[0] not in self.frameworks:
            return None
        self.skips.append((name, importer))
        raise ModuleNotFoundError(f"No module named {name!r} (skipped while the worker starts)", name=name)


def _importer() -> str:
    """The module whose code runs the import under way: the nearest frame outside importlib."""
    frame = sys._getframe(2)
    while frame is not None:
        if not frame.f_code.co_filename.startswith("<frozen"):
            return frame.f_globals.get("__name__", "")
        frame = frame.f_back
    return ""


def for_measurement() -> dict:
    """The environment a worker whose resident memory is the measurement starts with (a CPU
    probe's): ENV=0, every optional import made, unless this process's own environment says
    ENV=1 (a training process that imports none of them). {} then: the worker inherits the 1."""
    return {} if os.environ.get(ENV, "").strip() == "1" else {ENV: "0"}


@contextlib.contextmanager
def skipping(backend: str, skipped: tuple[str, ...] = SKIPPED, frameworks: tuple[str, ...] = FRAMEWORKS):
    """Within: the imports of `skipped` by the `frameworks`' modules fail, but `backend`'s own (its
    name, as catsdogs.runtime.backends names it). Yields the finder, whose `skips` lists what was
    skipped: (module, importer). Nothing is skipped where this process's ENV is "0"."""
    if os.environ.get(ENV, "1").strip() == "0":
        skipped = ()
    finder = _Skipper(tuple(m for m in skipped if m != backend), frameworks)
    sys.meta_path.insert(0, finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
