"""What every result records about where it came from: versions, backend, device, host."""

from __future__ import annotations

import contextlib
import platform
from importlib import metadata

from catsdogs import __version__
from catsdogs.host import usable_cores


def versions() -> dict:
    """The versions of what computes a result; no framework is imported to find them."""
    out = {"python": platform.python_version(), "catsdogs": __version__}
    for pkg in ("pillow", "numpy", "tensorflow", "keras", "jax"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def environment(backend) -> dict:
    """A trial's environment: catsdogs, the backend and its versions, Python, device, host."""
    return {"catsdogs": __version__, **backend.versions(), "python": platform.python_version(),
            "device": backend.device_description(), "host": platform.node(), "cores": len(usable_cores()),
            **backend.running_settings()}
