"""What every result records about where it came from: versions, backend, device, host."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
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


# --- the host's memory and GPUs, as every backend reads them ------------------------------------


def reset_peak_rss() -> None:
    """Start a new high-water mark of this process's resident set (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mb() -> float:
    """This process's peak resident set since the last reset (VmHWM), else since it started."""
    hwm = proc_status_kb("VmHWM")
    return hwm / 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def host_memory_bytes() -> int | None:
    """The host's physical memory (None where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def cpu_description() -> str:
    """The device a CPU-only backend computes on, as results record it."""
    return f"CPU: {cpu_name()} ({os.cpu_count()} cores)"


def nvml_visible_handle(pynvml):
    """NVML's handle of the first GPU this process may use. NVML numbers GPUs physically, so the
    first CUDA_VISIBLE_DEVICES entry (an index or a UUID) is the device a framework calls GPU 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(visible)
    return pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
