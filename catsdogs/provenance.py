"""What every result records about where it came from: versions, backend, device, host."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path

from catsdogs import __version__


def versions() -> dict:
    """The versions of what computes a result; no framework is imported to find them."""
    out = {"python": platform.python_version(), "catsdogs": __version__}
    for pkg in ("pillow", "numpy", "tensorflow", "keras", "jax"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(backend) -> dict:
    """A trial's environment: catsdogs, the backend and its versions, Python, device, host."""
    return {"catsdogs": __version__, **backend.versions(), "python": platform.python_version(),
            "device": backend.device_description(), "host": platform.node(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def proc_status_kb(field: str, pid: int | str = "self") -> int | None:
    """A 'kB' field of /proc/PID/status (VmRSS, VmHWM), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None
