"""The machine, as catsdogs reads it: every /proc and NVML read in one place, framework-free,
and what every result records of where it came from.

Memory (the host's size and what is available, a process's resident set and its high-water
mark, the kernel's out-of-memory kills), the CPU's name, the NVIDIA GPUs this process may use,
and the NVML sampler that watches a GPU's utilization while a probe runs. Each read returns None
(or nothing) where the machine cannot answer: a missing /proc, no NVML, no GPU. Provenance:
the versions of what computes a result (`versions`), and a trial's whole environment
(`environment`: those, its backend, device, host and process settings).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import resource
import statistics
import subprocess
import threading
from importlib import metadata
from pathlib import Path

from catsdogs.version import __version__

# --- /proc ---------------------------------------------------------------------------------------


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


def process_alive(pid: int) -> bool:
    """Whether process `pid` is still there (signal 0 checks, and sends nothing); another user's
    process is there too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def rss_mb() -> float | None:
    """This process's resident set now, in MiB."""
    kb = proc_status_kb("VmRSS")
    return None if kb is None else kb / 1024


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


def host_memory_available() -> int | None:
    """The memory the kernel could give now without swapping (MemAvailable), in bytes."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def oom_kills() -> int | None:
    """The kernel's count of processes its OOM killer ended (None where it cannot be read)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# oneDNN's instruction sets (TensorFlow's CPU kernels), lowest first, as ONEDNN_MAX_CPU_ISA names
# them, each with the /proc/cpuinfo flags it needs: oneDNN dispatches to the highest this CPU has,
# no higher than ONEDNN_MAX_CPU_ISA where set, and its convolutions' kernels, scratch and layouts
# differ by it (so does the memory a step takes: issue 65).
ONEDNN_ISAS = (("SSE41", ("sse4_1",)), ("AVX", ("avx",)), ("AVX2", ("avx2", "fma")),
               ("AVX2_VNNI", ("avx2", "fma", "avx_vnni")),
               ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
               ("AVX512_CORE_VNNI", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")),
               ("AVX512_CORE_BF16", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16")),
               ("AVX512_CORE_FP16", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                                     "avx512_fp16")),
               ("AVX512_CORE_AMX", ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                                    "amx_tile", "amx_int8", "amx_bf16")))


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo's first "flags" line); none where it cannot be read."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def onednn_isa(flags: set[str], cap: str | None = None) -> str | None:
    """The instruction set oneDNN dispatches to on a CPU of `flags`: the highest of ONEDNN_ISAS it
    has, no higher than `cap` (ONEDNN_MAX_CPU_ISA's value; "ALL" or an unknown name caps nothing);
    None where it has none of them (not an x86 CPU, or flags unread)."""
    names = [name for name, _ in ONEDNN_ISAS]
    top = names.index(cap.upper()) if cap and cap.upper() in names else len(names) - 1
    have = [name for name, needs in ONEDNN_ISAS[:top + 1] if set(needs) <= flags]
    return have[-1] if have else None


def cpu_record(env: dict | None = None) -> dict:
    """The CPU a result was measured on, as find_batch_size.json records it: its model, its cores,
    the instruction set oneDNN dispatches to there (`onednn_isa`) and ONEDNN_MAX_CPU_ISA where the
    workers' environment (`env`, else this process's) sets it."""
    cap = (env or {}).get("ONEDNN_MAX_CPU_ISA", os.environ.get("ONEDNN_MAX_CPU_ISA"))
    return {"model": cpu_name(), "cores": len(usable_cores()), "onednn_isa": onednn_isa(cpu_flags(), cap),
            "onednn_max_cpu_isa": cap}


def cpu_description() -> str:
    """The device a CPU-only backend computes on, as results record it."""
    return f"CPU: {cpu_name()} ({os.cpu_count()} cores)"


def usable_cores() -> list[int]:
    """The cores this process may run on (its CPU affinity), in order."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# --- NVIDIA GPUs ---------------------------------------------------------------------------------


def nvidia_devices() -> bool:
    """Whether this host has an NVIDIA device node (/dev/nvidia0, ...), without starting anything."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def visible_gpus() -> list[str]:
    """NVIDIA GPU ids this process may use, without importing a framework."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


def nvml_visible_handle(pynvml):
    """NVML's handle of the first GPU this process may use. NVML numbers GPUs physically, so the
    first CUDA_VISIBLE_DEVICES entry (an index or a UUID) is the device a framework calls GPU 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(visible)
    return pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)


def gpu_total_bytes() -> int | None:
    """The first visible GPU's memory, from NVML, without starting a framework (None: no NVML
    or no GPU)."""
    try:
        import pynvml  # nvidia-ml-py: the optional extra `nvml`
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(nvml_visible_handle(pynvml)).total)
    except Exception:  # noqa: BLE001 - no driver, no device
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


class NvmlSampler:
    """GPU utilization and memory used, sampled by NVML in a background thread.

    Optional: without nvidia-ml-py, or without an NVIDIA GPU, `start()` returns False and
    `stats()` returns {}. The GPU is the first this process may use (`nvml_visible_handle`)."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.util: list[float] = []
        self.memory: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def start(self) -> bool:
        try:
            import pynvml
        except ImportError:
            return False
        try:
            pynvml.nvmlInit()
            self._handle = nvml_visible_handle(pynvml)
        except Exception:  # noqa: BLE001 - no driver, no device: NVML numbers are optional
            return False
        self._nvml = pynvml
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self.memory.append(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20)
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
        self._thread = None
        return self.stats()

    def stats(self) -> dict:
        if not self.util:
            return {}
        return {"nvml_gpu_util_mean_percent": statistics.fmean(self.util),
                "nvml_gpu_util_max_percent": max(self.util),
                "nvml_memory_used_mb": max(self.memory) if self.memory else None,
                "nvml_samples": len(self.util)}


# --- provenance: what every result records about where it came from --------------------------------


def versions() -> dict:
    """The versions of what computes a result; no framework is imported to find them."""
    return dict(_versions())


@functools.cache
def _versions() -> dict:
    """Read once a process (8 ms through importlib.metadata: a race's every wave asked again)."""
    out = {"python": platform.python_version(), "catsdogs": __version__}
    for pkg in ("pillow", "numpy", "tensorflow", "keras", "jax"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    return out


def environment(backend) -> dict:
    """A trial's environment: catsdogs, the backend and its versions, Python, device, host, the
    process settings the backend runs with, and glibc's malloc settings where the process started
    with any (`malloc_settings`: they move a CPU step's time, not what it computes); with the
    huge-page tunable, what decides whether it took: the kernel's mode (`huge_pages`) and glibc's
    version (2.35 on reads it)."""
    malloc = malloc_settings()
    took = {}
    if malloc and HUGE_PAGE_TUNABLE in malloc:
        took = {"huge_pages": huge_pages(), "glibc": platform.libc_ver()[1] or None}
    return {"catsdogs": __version__, **backend.versions(), "python": platform.python_version(),
            "device": backend.device_description(), "host": platform.node(), "cores": len(usable_cores()),
            **backend.running_settings(), **({"malloc": malloc} if malloc else {}),
            **{k: v for k, v in took.items() if v}}


HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"  # (catsdogs.runtime.backends.jax_process sets it)
HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # the kernel's mode for them


def huge_pages(path: Path | None = None) -> str | None:
    """The kernel's transparent huge pages mode (always, madvise or never: the word in brackets).
    glibc's malloc.hugetlb=1 asks for them by madvise: under `madvise` it takes, under `always`
    they come without it, under `never` not at all. None where the kernel does not say."""
    try:
        text = (path or HUGE_PAGES).read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def start_environ() -> dict[str, str]:
    """This process's environment as it started (/proc/self/environ), which is what glibc read:
    a variable set in os.environ later (a Ray actor's, given after its process started) is not in
    it. os.environ where /proc cannot say."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return dict(os.environ)
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def malloc_vars(environ) -> dict[str, str]:
    """The variables of `environ` that set glibc's malloc: MALLOC_* and GLIBC_TUNABLES."""
    return {k: v for k, v in environ.items() if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"}


def malloc_settings(environ=None) -> str | None:
    """The MALLOC_* variables and GLIBC_TUNABLES of `environ` (by default this process's as it
    started: what glibc's malloc read, `start_environ`), as `NAME=value` words in name order; None
    where there are none."""
    words = [f"{k}={v}" for k, v in sorted(malloc_vars(start_environ() if environ is None else environ).items())]
    return " ".join(words) or None
