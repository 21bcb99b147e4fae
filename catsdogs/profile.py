"""Throughput, memory and utilization of the article's model as functions of batch size.

`profile(name, batch_sizes, data_dir, out, ...)` runs, per batch size, a probe in a fresh child
process (`python -m catsdogs.profile SPEC RESULT`): it builds the article's model, warms up, then
times `steps` training steps on batches of the prepared train split (sampled without
replacement within each pass over the split, the split repeated when a batch is larger than it).
Before the probes, one child measures the device's matrix-multiply peak (a loop of large
`tf.matmul`s in the precision policy's compute dtype), against which each probe's achieved
model FLOP/s gives its model FLOPs utilization (MFU). Out of memory is a recorded outcome
(status `oom`), never a crash. Results: OUT/NAME/profile.csv (one row per batch size),
OUT/NAME/profile.json (the same plus settings and the peak) and OUT/NAME/figures/*.png|svg.

Memory. On a GPU the peak is TensorFlow's allocator peak (`get_memory_info`), and NVML's view
(utilization, memory used) is sampled in the background when `nvidia-ml-py` is installed. On the
CPU it is the child's peak resident set (VmHWM), which includes the TensorFlow runtime and the
data held in memory; the resident set just before the model is built is recorded too
(`baseline_rss_mb`), so the increment the model and the batch add is visible, and so is the
peak of TensorFlow's own CPU allocator where it has one (`allocator_peak_mb`: oneDNN builds).

A memory cap (`memory_cap_bytes`) makes the child's memory stand in for a device's. On the CPU
the parent watches the child's peak resident set (VmHWM in /proc/PID/status, every 20 ms) and
kills it the moment it goes over the cap; a child that ends between two looks is judged by its
own final peak (ru_maxrss). So "fits" means exactly "peak resident memory <= cap", whatever the
memory is (tensors, runtime, data, allocator slack), and the kill is ours, never a crash. On a
GPU the cap becomes a logical device's memory limit and TensorFlow's out-of-memory error decides.

What else was measured, and why not (TensorFlow 2.21, Linux x86-64, the 200 px model):
- RLIMIT_AS / RLIMIT_DATA limit virtual memory, which TensorFlow maps far beyond what it
  touches: a batch-1 probe maps 4.0 GiB with 1.7 GiB resident, and RLIMIT_AS = 3 GiB fails it
  (ResourceExhaustedError); at 128 images the data segments are 4.6 GiB for 3.4 GiB resident
  (the allocator's reserved, untouched regions), so RLIMIT_DATA caps a number nobody reads.
- TF_MKL_ALLOC_MAX_BYTES, the limit of TensorFlow's oneDNN CPU allocator, would make the CPU
  fail like a GPU (ResourceExhaustedError), and does at some sizes; at others (176, 200, 256
  images under 3 GiB) oneDNN kernels segfault when an allocation fails.
- cgroups (memory.limit_in_bytes) need root and a writable cgroup tree: not on CI.
One property of the resident set to know: with oneDNN, TensorFlow's CPU allocator is a BFC
allocator that grows its pool by regions of doubling size and keeps them, so peak RSS is a
staircase in batch size, and one batch size near a step can land on either side of it from one
run to the next (200 px, 144 images: 3.6 or 4.4 GiB). The answer near a cap is honest for the
run that measured it, and a margin is wise.

Memory figures are MiB (2**20 bytes), named `_mb` as everywhere in catsdogs.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from catsdogs import config

DEVICE_PREFIX = "@@device "  # the child's first report: which device it runs on
DEFAULT_STEPS = 20
DEFAULT_WARMUP = 2  # the first step traces and compiles, the second may still autotune
WATCH_INTERVAL = 0.02  # seconds between two looks at a capped child's peak memory
STATUSES = ("ok", "oom", "failed")

# The article's "other tables" (PROTOCOL.md): a thesis it cites, another model and data set,
# TensorFlow on a GPU. Drawn as a reference series, never compared number for number.
THESIS_LABEL = "article's thesis table (other model & data, GPU)"
THESIS_BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
THESIS_GPU_USAGE_PERCENT = (5.65, 5.65, 29.01, 30.46, 36.17, 30.67, 24.88, 22.45, 22.14)
THESIS_GPU_MEMORY_MB = (694.274, 665.804, 649.137, 620.909, 694.563, 641.000, 541.333, 535.063, 535.063)

PROFILE_COLUMNS = [
    "batch_size", "status", "step_time_median_s", "step_time_mean_s", "images_per_second",
    "flops_per_second", "peak_flops_per_second", "mfu_percent", "peak_memory_mb", "memory_kind",
    "baseline_rss_mb", "memory_above_baseline_mb", "allocator_peak_mb", "nvml_gpu_util_mean_percent",
    "nvml_gpu_util_max_percent", "nvml_memory_used_mb", "device", "precision", "optimizer",
    "dataset", "image_size", "steps", "warmup", "memory_cap_mb", "error",
]


# --- units -------------------------------------------------------------------------------------

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # bare K/M/G/T: binary, as docker and ulimit


def parse_memory(text: str) -> int:
    """'4GiB' -> 4294967296, '1.5 GB' -> 1500000000, '512MiB', '800M' (binary). Whole bytes.

    A unit is required (a bare '4' is surely not four bytes); ValueError with a one-line reason."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m:
        raise ValueError(f"not a memory size: {text!r} (use a number and a unit, like 4GiB or 512MB)")
    number, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        raise ValueError(f"{text!r} has no unit: write it like 4GiB, 4096MiB or 4GB")
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a memory size must be positive, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    """1.5 GiB, 300 MiB: binary units, as the caps are given."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


# --- the child: one probe, or the matmul peak ----------------------------------------------------


def _status_kb(field: str, pid: int | str = "self") -> int | None:
    """A 'kB' field of /proc/PID/status (VmRSS, VmHWM), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _setup_device(memory_cap_bytes: int | None, report: Callable[[str], None]) -> str:
    """Configure the GPU (before TensorFlow touches it) and tell the parent the device: 'gpu'
    or 'cpu'. With a cap, a GPU gets a logical device of that size; without, memory growth, so
    NVML's 'memory used' shows what is used rather than TensorFlow's up-front reservation."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if memory_cap_bytes:
            tf.config.set_logical_device_configuration(
                gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=memory_cap_bytes // 2**20)])
        else:
            for gpu in gpus:
                with contextlib.suppress(RuntimeError, ValueError):
                    tf.config.experimental.set_memory_growth(gpu, True)
    kind = "gpu" if gpus else "cpu"
    report(DEVICE_PREFIX + json.dumps({"kind": kind}))
    return kind


def compute_dtype(precision: str) -> str:
    return {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[precision]


def measure_matmul_peak(precision: str = "float32", n: int | None = None, seconds: float = 1.0,
                        repeats: int = 3) -> dict:
    """FLOP/s of a loop of n x n matrix products in the policy's compute dtype: the best of
    `repeats` timings of as many products as fill about `seconds`. On a GPU the products are
    queued eagerly and the last one's value is read back, which waits for all of them."""
    import tensorflow as tf

    gpu = bool(tf.config.list_physical_devices("GPU"))
    n = n or (8192 if gpu else 2048)
    dtype = compute_dtype(precision)
    a = tf.random.normal((n, n), dtype="float32")
    b = tf.random.normal((n, n), dtype="float32")
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)

    def run(k: int) -> float:
        t0 = time.perf_counter()
        c = None
        for _ in range(k):
            c = tf.matmul(a, b)
        float(tf.cast(c[0, 0], "float32"))  # wait for every queued product
        return time.perf_counter() - t0

    run(2)  # warm up: kernels chosen, memory allocated
    one = max(run(1), 1e-6)
    k = max(1, min(10_000, int(seconds / one)))
    best = min(run(k) for _ in range(repeats))
    return {"peak_flops_per_second": 2.0 * n**3 * k / best, "matmul_size": n, "matmul_dtype": dtype,
            "matmuls": k}


class NvmlSampler:
    """GPU utilization and memory used, sampled by NVML in a background thread.

    Optional: without nvidia-ml-py, or without an NVIDIA GPU, `start()` returns False and
    `stats()` returns {}. NVML numbers GPUs physically: the first CUDA_VISIBLE_DEVICES entry
    (an index or a UUID) is the device TensorFlow calls GPU:0."""

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
            import pynvml  # nvidia-ml-py: the optional extra `nvml`
        except ImportError:
            return False
        try:
            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if visible.startswith("GPU-") or visible.startswith("MIG-"):
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(visible)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
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


def probe_batches(images, labels, batch_size: int, n_batches: int, seed: int):
    """`n_batches` batches of `batch_size` images, gathered from memory on the host.

    Seeded permutations of the split joined end to end, so a batch larger than the split holds
    every image at least once and some twice or more. One batch is prefetched
    (model.CPU_PIPELINE_BATCHES counts what the pipeline holds)."""
    from catsdogs import data

    split = data.Split(images, labels, [])
    return data.train_batches(split, batch_size, seed, n_batches, cross_epochs=True, prefetch=1)


def run_probe(spec: dict, report: Callable[[str], None] = print) -> dict:
    """In the child: warm up, time `steps` training steps at one batch size, measure memory.

    Returns a record with status 'ok', or 'oom' / 'failed' and the error."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    record: dict = {"batch_size": spec["batch_size"], "precision": spec["precision"],
                    "optimizer": spec["optimizer"], "dataset": spec["dataset"],
                    "steps": spec["steps"], "warmup": spec["warmup"]}
    kind = _setup_device(spec.get("memory_cap_bytes"), report)
    record["memory_kind"] = "gpu" if kind == "gpu" else "cpu-rss"
    sampler = NvmlSampler() if kind == "gpu" else None
    try:
        import keras

        from catsdogs import data
        from catsdogs.model import build_model, train_flops_per_image
        from catsdogs.prepare import require_prepared
        from catsdogs.trial import environment

        record["device"] = environment()["device"]
        manifest = require_prepared(Path(spec["data_dir"]))
        size = manifest["params"]["size"]
        record["image_size"] = size
        split = data.load_split(Path(spec["data_dir"]) / data.FOLDERS[spec["dataset"]]["train"])
        keras.utils.set_random_seed(spec.get("seed", 0))
        keras.mixed_precision.set_dtype_policy(spec["precision"])
        batches = probe_batches(split.images, split.labels, spec["batch_size"],
                                spec["warmup"] + spec["steps"], spec.get("seed", 0))
        record["baseline_rss_mb"] = _rss_mb()  # before the model: runtime + data
        model = build_model(size)
        model.compile(optimizer=spec["optimizer"], loss="binary_crossentropy", metrics=["accuracy"])
        times = []
        for i, (x, y) in enumerate(batches):
            if i == spec["warmup"] and sampler is not None:
                sampler.start()
            t0 = time.perf_counter()
            model.train_on_batch(x, y)  # returns numbers: waits for the step to finish
            if i >= spec["warmup"]:
                times.append(time.perf_counter() - t0)
        nvml = sampler.stop() if sampler is not None else {}
        median, mean = statistics.median(times), statistics.fmean(times)
        flops = train_flops_per_image(size) * spec["batch_size"] / median
        record.update({"status": "ok", "step_time_median_s": median, "step_time_mean_s": mean,
                       "step_times_s": times, "images_per_second": spec["batch_size"] / median,
                       "flops_per_second": flops, **nvml})
    except Exception as exc:  # noqa: BLE001 - out of memory and failures are recorded outcomes
        from catsdogs.trial import classify_error

        if sampler is not None:
            record.update(sampler.stop())
        record.update({"status": classify_error(exc), "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
                       "traceback": traceback.format_exc()[-8000:]})
    record.update(_peak_memory(kind))
    return record


def _peak_memory(kind: str) -> dict:
    """Peak memory; on a GPU also the allocator's limit (the device memory TensorFlow may use)."""
    import tensorflow as tf

    if kind != "gpu":
        out = {"peak_memory_mb": _peak_rss_mb()}
        with contextlib.suppress(Exception):  # oneDNN builds: TensorFlow's own CPU allocator (BFC)
            out["allocator_peak_mb"] = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
        return out
    out = {}
    with contextlib.suppress(Exception):
        out["peak_memory_mb"] = out["allocator_peak_mb"] = (
            tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20)
    with contextlib.suppress(Exception):
        from tensorflow.python.client import device_lib

        limits = [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]
        if limits:
            out["device_memory_limit_mb"] = limits[0] / 2**20
    return out


def run_peak(spec: dict, report: Callable[[str], None] = print) -> dict:
    """In the child: the matmul peak of the device, in the precision's compute dtype."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    _setup_device(spec.get("memory_cap_bytes"), report)
    from catsdogs.trial import environment

    result = measure_matmul_peak(spec["precision"], n=spec.get("matmul_size"),
                                 seconds=spec.get("seconds", 1.0))
    return {"status": "ok", "device": environment()["device"], "precision": spec["precision"], **result}


def _child_main(spec_path: str, result_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())

    def report(line: str) -> None:
        print(line, flush=True)

    try:
        record = (run_peak if spec["kind"] == "peak" else run_probe)(spec, report)
    except Exception as exc:  # noqa: BLE001 - the parent always gets a record
        from catsdogs.trial import classify_error

        record = {"status": classify_error(exc), "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
                  "traceback": traceback.format_exc()[-8000:]}
    tmp = Path(result_path + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, result_path)
    return 0


# --- the parent: a child per probe, its memory watched ------------------------------------------


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the parent dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_child(spec: dict, workdir: Path, memory_cap_bytes: int | None = None,
              on_line: Callable[[str], None] | None = None, cpu_cap_bytes: int | None = None) -> dict:
    """Run one probe (or the peak measurement) in a fresh Python process; always a record.

    With `memory_cap_bytes`, a child that reports running on the CPU is killed as soon as its
    peak resident memory (VmHWM) goes over the cap, and one that finished over it (between two
    looks) is also marked `oom`; its measurements are kept. On a GPU the child enforces the cap
    itself (a logical device of that size). `cpu_cap_bytes` is a cap for the CPU only, used
    when `memory_cap_bytes` is None (a GPU then keeps its whole memory)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"{spec['kind']}-{spec.get('batch_size', 'x')}-{os.getpid()}-{time.monotonic_ns()}"
    spec_path, result, log = workdir / f"{tag}.spec.json", workdir / f"{tag}.result.json", workdir / f"{tag}.log"
    spec = {**spec, "memory_cap_bytes": memory_cap_bytes}
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    state = {"device": None, "hwm_kb": 0, "killed_kb": None}
    stop = threading.Event()

    with open(log, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "catsdogs.profile", str(spec_path), str(result)],
                                stdout=subprocess.PIPE, stderr=log_file, text=True, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent)

        def watch() -> None:
            cap = memory_cap_bytes or cpu_cap_bytes
            cap_kb = cap / 1024 if cap else None
            while not stop.is_set() and proc.poll() is None:
                hwm = _status_kb("VmHWM", proc.pid)
                if hwm:
                    state["hwm_kb"] = max(state["hwm_kb"], hwm)
                    if cap_kb and state["device"] == "cpu" and hwm > cap_kb:
                        state["killed_kb"] = hwm
                        _kill_group(proc, signal.SIGKILL)
                        return
                stop.wait(WATCH_INTERVAL)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            for line in proc.stdout:
                if line.startswith(DEVICE_PREFIX):
                    state["device"] = json.loads(line[len(DEVICE_PREFIX):])["kind"]
                elif on_line:
                    on_line(line.rstrip("\n"))
                else:
                    log_file.write(line)
            rc = proc.wait()
        except BaseException:
            _kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            stop.set()
            watcher.join(timeout=5)

    cap = memory_cap_bytes or (cpu_cap_bytes if state["device"] == "cpu" else None)
    cap_mb = cap / 2**20 if cap else None
    if state["killed_kb"] is not None:
        record = {"status": "oom", "peak_memory_mb": state["killed_kb"] / 1024, "memory_kind": "cpu-rss",
                  "error": f"stopped: peak resident memory {state['killed_kb'] / 1024:.0f} MiB went over "
                           f"the {cap_mb:.0f} MiB cap"}
    elif result.exists():
        record = json.loads(result.read_text())
        if record.get("traceback"):
            record["error"] = f"{record.get('error', '')}\n{record.pop('traceback')}"
        peak = record.get("peak_memory_mb")
        if (cap_mb and record.get("memory_kind") == "cpu-rss" and peak and peak > cap_mb
                and record.get("status") == "ok"):
            record["status"] = "oom"
            record["error"] = (f"finished, but its peak resident memory {peak:.0f} MiB went over the "
                               f"{cap_mb:.0f} MiB cap")
    else:
        tail = log.read_text(errors="replace")[-4000:]
        from catsdogs.trial import looks_like_oom

        killed = rc < 0 and -rc == signal.SIGKILL
        why = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
        record = {"status": "oom" if killed or looks_like_oom(tail) else "failed",
                  "error": f"probe process {why} without a result"
                           f"{' (likely out of memory)' if killed else ''}: {last}"}
        if state["hwm_kb"]:
            record["peak_memory_mb"] = state["hwm_kb"] / 1024
    record.setdefault("batch_size", spec.get("batch_size"))
    record["memory_cap_mb"] = cap_mb
    for path in (spec_path, result):
        path.unlink(missing_ok=True)
    if record["status"] == "ok":
        log.unlink(missing_ok=True)
    else:
        record["log"] = str(log)
    return record


def probe_spec(batch_size: int, data_dir: Path, *, optimizer: str = "adam", dataset: str = "standard",
               precision: str = "float32", steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
               seed: int = 0) -> dict:
    return {"kind": "probe", "batch_size": int(batch_size), "data_dir": str(Path(data_dir).resolve()),
            "optimizer": optimizer, "dataset": dataset, "precision": precision, "steps": int(steps),
            "warmup": int(warmup), "seed": seed}


def check_settings(batch_sizes: Sequence[int], optimizer: str, dataset: str, precision: str,
                   steps: int, warmup: int) -> None:
    """One-line ValueErrors for settings no probe can run with."""
    from catsdogs.trial import DEFAULT_LR, PRECISIONS

    if not batch_sizes:
        raise ValueError("give at least one batch size")
    if any(int(b) < 1 for b in batch_sizes):
        raise ValueError(f"batch sizes must be >= 1, got {', '.join(map(str, batch_sizes))}")
    if optimizer not in DEFAULT_LR:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {', '.join(DEFAULT_LR)}")
    if dataset not in config.DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(config.DATASETS)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if steps < 1 or warmup < 0:
        raise ValueError("steps must be >= 1 and warm-up steps >= 0")


# --- the profile ---------------------------------------------------------------------------------


def profile_row(record: dict, peak: dict | None, settings: dict) -> dict:
    """One CSV row from a probe record and the matmul peak."""
    row = {c: None for c in PROFILE_COLUMNS}
    row.update({k: record.get(k) for k in PROFILE_COLUMNS if k in record})
    for k in ("precision", "optimizer", "dataset", "steps", "warmup", "image_size"):
        if row.get(k) is None:
            row[k] = settings.get(k)
    peak_flops = (peak or {}).get("peak_flops_per_second")
    row["peak_flops_per_second"] = peak_flops
    if row["flops_per_second"] and peak_flops:
        row["mfu_percent"] = 100.0 * row["flops_per_second"] / peak_flops
    if row["peak_memory_mb"] is not None and row["baseline_rss_mb"] is not None \
            and row["memory_kind"] == "cpu-rss":
        row["memory_above_baseline_mb"] = row["peak_memory_mb"] - row["baseline_rss_mb"]
    if row["error"]:
        row["error"] = row["error"].splitlines()[0][:500]
    if not row.get("device"):
        row["device"] = (peak or {}).get("device")
    return row


def write_csv(rows: list[dict], path: Path, columns: Sequence[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k)) for k in columns})
    os.replace(tmp, path)
    return path


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def read_table(path: Path) -> list[dict]:
    """profile.csv back as rows with numbers (empty cells -> None)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v == "":
                    row[k] = None
                elif k in ("batch_size", "steps", "warmup", "image_size"):
                    row[k] = int(v)
                else:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def progress_line(row: dict) -> str:
    bs = f"batch size {row['batch_size']:>5}"
    if row["status"] != "ok":
        return f"{bs}: {row['status']}: {row.get('error') or ''}".rstrip(": ")
    mem = f"peak {row['peak_memory_mb']:.0f} MiB ({row['memory_kind']}"
    if row.get("baseline_rss_mb") is not None and row["memory_kind"] == "cpu-rss":
        mem += f", {row['baseline_rss_mb']:.0f} MiB before the model"
    mem += ")"
    mfu = f", MFU {row['mfu_percent']:.1f}%" if row.get("mfu_percent") is not None else ""
    nvml = (f", NVML util {row['nvml_gpu_util_mean_percent']:.0f}%"
            if row.get("nvml_gpu_util_mean_percent") is not None else "")
    return (f"{bs}: {row['step_time_median_s'] * 1000:.1f} ms/step (median), "
            f"{row['images_per_second']:.1f} images/s, {row['flops_per_second'] / 1e9:.2f} GFLOP/s{mfu}{nvml}, {mem}")


def profile(name: str, batch_sizes: Sequence[int], data_dir: Path, out: Path = Path(config.DEFAULT_OUT), *,
            optimizer: str = "adam", dataset: str = "standard", precision: str = "float32",
            steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP, memory_cap_bytes: int | None = None,
            measure_peak: bool = True, log: Callable[[str], None] = print) -> list[dict]:
    """Profile each batch size in its own child; write OUT/NAME/profile.csv|json and figures.

    Returns the rows (one per batch size, in the order given). Raises CatsdogsError when the
    data is not prepared, ValueError for impossible settings."""
    from catsdogs.prepare import require_prepared, versions

    check_settings(batch_sizes, optimizer, dataset, precision, steps, warmup)
    manifest = require_prepared(Path(data_dir))
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / ".work"
    settings = {"name": name, "batch_sizes": [int(b) for b in batch_sizes], "optimizer": optimizer,
                "dataset": dataset, "precision": precision, "steps": steps, "warmup": warmup,
                "image_size": manifest["params"]["size"], "data_dir": str(Path(data_dir).resolve()),
                "memory_cap_bytes": memory_cap_bytes}
    log(f"Profile {name}: batch sizes {', '.join(map(str, batch_sizes))}; {optimizer}, {dataset} data "
        f"({settings['image_size']} px), {precision}; {warmup} warm-up + {steps} timed steps each")
    peak = None
    if measure_peak:
        peak = run_child({"kind": "peak", "precision": precision}, work, memory_cap_bytes)
        if peak["status"] == "ok":
            log(f"matmul peak: {peak['peak_flops_per_second'] / 1e9:.1f} GFLOP/s "
                f"({peak['matmul_size']}x{peak['matmul_size']} {peak['matmul_dtype']}, {peak['device']})")
        else:
            log(f"matmul peak: {peak['status']}: {(peak.get('error') or '').splitlines()[0]}; no MFU")
            peak = None
    rows = []
    csv_path = folder / "profile.csv"
    for bs in batch_sizes:
        spec = probe_spec(bs, data_dir, optimizer=optimizer, dataset=dataset, precision=precision,
                          steps=steps, warmup=warmup)
        record = run_child(spec, work, memory_cap_bytes)
        row = profile_row(record, peak, settings)
        rows.append(row)
        write_csv(rows, csv_path, PROFILE_COLUMNS)
        log(progress_line(row))
    figures = save_figures(rows, folder / "figures")
    doc = {"settings": settings, "peak": peak, "rows": rows, "versions": versions(),
           "data": {k: manifest[k] for k in ("params", "source", "fingerprint")}}
    tmp = folder / ".profile.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, folder / "profile.json")
    with contextlib.suppress(OSError):
        work.rmdir()  # empty unless a failed probe left its log there
    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    log(f"Profile {name}: {counts['ok']} ok, {counts['oom']} out of memory, {counts['failed']} failed -> "
        f"{csv_path}, {len(figures)} figures in {folder / 'figures'}")
    return rows


# --- figures ---------------------------------------------------------------------------------------


def _batch_axis(ax, sizes: Sequence[int]) -> None:
    """Batch size on a log2 axis, each batch size a labelled tick."""
    from matplotlib.ticker import NullLocator

    sizes = sorted({int(s) for s in sizes})
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes, labels=[str(s) for s in sizes])
        ax.set_xlim(min(sizes) / 2**0.4, max(sizes) * 2**0.4)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size (log2 scale)")
    ax.grid(True, alpha=0.3)


def _series(table: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = sorted((int(r["batch_size"]), float(r[key])) for r in table
                 if r.get("status") == "ok" and r.get(key) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def _mark_oom(ax, table: list[dict]) -> None:
    """Batch sizes that ran out of memory (or failed): a cross on the x axis, labelled."""
    for status, marker, color in (("oom", "x", "tab:red"), ("failed", "X", "0.3")):
        xs = sorted(int(r["batch_size"]) for r in table if r.get("status") == status)
        if xs:
            ax.plot(xs, [0] * len(xs), linestyle="none", marker=marker, color=color, markersize=9,
                    transform=ax.get_xaxis_transform(), clip_on=False, zorder=5,
                    label="out of memory" if status == "oom" else "failed")


def _device_note(table: list[dict]) -> str:
    devices = sorted({str(r["device"]) for r in table if r.get("device")})
    return "; ".join(devices)


def _reference(ax, values: Sequence[float], unit: str, our_unit: str, ylabel: str):
    """The thesis series: on `ax` when the units match, else on a secondary y axis."""
    target = ax
    if unit != our_unit:
        target = ax.twinx()
        target.set_ylabel(ylabel)
    (line,) = target.plot(THESIS_BATCH_SIZES, values, linestyle="--", marker="s", markersize=4,
                          color="0.45", label=THESIS_LABEL, zorder=2)
    return target, line


def _finish_axes(ax, table: list[dict], what: str, ylabel: str, thesis: tuple | None = None,
                 legend_loc: str = "best"):
    """What every profile figure ends with: out-of-memory sizes marked, the thesis series when
    given (as _reference's arguments; the batch axis then spans its sizes too), the log2 batch
    axis, labels and the legend. Returns the thesis line, or None."""
    _mark_oom(ax, table)
    sizes = [r["batch_size"] for r in table]
    line = None
    if thesis is not None:
        _, line = _reference(ax, *thesis)
        sizes += list(THESIS_BATCH_SIZES)
    _batch_axis(ax, sizes)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{what} vs batch size\n{_device_note(table)}", fontsize=10)
    ax.legend(loc=legend_loc, fontsize=8)
    return line


def plot_throughput(ax, table: list[dict]) -> dict:
    """Images per second against batch size (median step time), out-of-memory sizes marked."""
    xs, ys = _series(table, "images_per_second")
    (line,) = ax.plot(xs, ys, marker="o", color="tab:blue", label="images/s (median step)")
    _finish_axes(ax, table, "Throughput", "training throughput (images/s)")
    return {"throughput": line}


def plot_memory(ax, table: list[dict], reference: bool = True) -> dict:
    """Peak memory against batch size; on the CPU also the resident set before the model and
    the peak of TensorFlow's CPU allocator (the tensors alone); NVML's memory used when sampled;
    the thesis's GPU memory (MB) as a reference series, on the same axis (MiB)."""
    out = {}
    kinds = {r.get("memory_kind") for r in table if r.get("memory_kind")}
    what = "GPU, TensorFlow allocator peak" if kinds == {"gpu"} else "process peak RSS" \
        if kinds == {"cpu-rss"} else "peak"
    xs, ys = _series(table, "peak_memory_mb")
    (out["peak"],) = ax.plot(xs, ys, marker="o", color="tab:purple", label=f"peak memory ({what})")
    if kinds == {"cpu-rss"}:
        xs, ys = _series(table, "baseline_rss_mb")
        if ys:
            (out["baseline"],) = ax.plot(xs, ys, linestyle=":", marker=".", color="tab:purple", alpha=0.7,
                                         label="RSS before the model (runtime + data)")
        xs, ys = _series(table, "allocator_peak_mb")
        if ys:
            (out["allocator"],) = ax.plot(xs, ys, linestyle="--", marker=".", color="tab:blue", alpha=0.8,
                                          label="TensorFlow CPU allocator peak (tensors)")
    xs, ys = _series(table, "nvml_memory_used_mb")
    if ys:
        (out["nvml"],) = ax.plot(xs, ys, marker="^", color="tab:green", label="NVML memory used")
    caps = {r.get("memory_cap_mb") for r in table if r.get("memory_cap_mb")}
    if len(caps) == 1:
        out["cap"] = ax.axhline(caps.pop(), color="tab:red", linestyle="-.", linewidth=1, label="memory cap")
    thesis = (THESIS_GPU_MEMORY_MB, "MiB", "MiB", "thesis GPU memory (MB)") if reference else None
    line = _finish_axes(ax, table, "Memory", "memory (MiB)", thesis, legend_loc="upper left")
    if line is not None:
        out["reference"] = line
    return out


def plot_utilization(ax, table: list[dict], reference: bool = True) -> dict:
    """Model FLOPs utilization (% of the measured matmul peak) against batch size; NVML's GPU
    utilization when sampled; the thesis's GPU usage (%) as a reference series."""
    out = {}
    xs, ys = _series(table, "mfu_percent")
    (out["mfu"],) = ax.plot(xs, ys, marker="o", color="tab:orange", label="MFU (% of matmul peak)")
    xs, ys = _series(table, "nvml_gpu_util_mean_percent")
    if ys:
        (out["nvml"],) = ax.plot(xs, ys, marker="^", color="tab:green", label="NVML GPU utilization (mean)")
    thesis = (THESIS_GPU_USAGE_PERCENT, "%", "%", "thesis GPU usage (%)") if reference else None
    line = _finish_axes(ax, table, "Utilization", "utilization (%)", thesis)
    if line is not None:
        out["reference"] = line
    return out


FIGURES = {"throughput": plot_throughput, "memory": plot_memory, "utilization": plot_utilization}


def make_figure(kind: str, table: list[dict]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    artists = FIGURES[kind](ax, table)
    return fig, artists


def save_figures(table: list[dict], folder: Path) -> dict[str, dict[str, Path]]:
    """throughput, memory, utilization: each as PNG and SVG in `folder`."""
    from catsdogs.report import save_figure

    folder.mkdir(parents=True, exist_ok=True)
    return {kind: save_figure(make_figure(kind, table)[0], folder / kind) for kind in FIGURES}


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
