"""Recorded devices, replayed: find-batch-size's real search, prober and recommendation run against
a fake worker whose probes answer from a table measured on a real device, on a simulated clock.

A `RecordedDevice` holds what one device measured for the article's model (peak memory and
images/s by batch size, the allocator's limit, XLA's memory plan) and what its work costs in time
(a worker's start, a step's compilation by batch size, the noise scale's short runs). `replay()`
puts it under catsdogs.measure.find_batch_size: the prober's workers, the memory plan's worker and
the noise scale's runs become the device's, and every one of them advances one `Clock`. Nothing
else is faked: the search, the prober's choice of workers, the prediction, the margin, the
confirmation and the recommendation are catsdogs' own.

Between recorded batch sizes the peak is interpolated on a line (and extended past the largest
by its last segment's slope), the throughput on log-log axes (flat past either end), a probe's
compilation on a line between the costs each device recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.messages import MemoryPlan, MemoryPlanTask, ProbeRecord

MiB = 2**20


@dataclass(frozen=True)
class RecordedDevice:
    name: str
    kind: str  # "gpu" or "cpu"
    backend: str
    image_size: int
    train_images: int
    limit_mb: float  # what "fits" is held to: the allocator's limit (GPU) or the cap (CPU)
    peaks_mb: dict  # batch size -> peak memory (MiB), as measured
    images_per_second: dict  # batch size -> images/s, as measured
    plan_mb: tuple[float, float]  # XLA's plan of a step: (batch-independent MiB, MiB an image)
    start_seconds: float  # a worker's start (imports, the framework)
    # a probe's cost besides its steps (its step built and compiled: XLA's autotuning grows with the
    # batch) by batch size, as measured: on a line between them, past the largest at the last slope
    compile_seconds: dict
    noise: NoiseEstimate  # the noise scale find-batch-size measured there
    noise_seconds: float  # ... and the time its short runs took
    # XLA's pool in a worker its probes grew (JAX on a GPU, preallocation off), as its out-of-memory
    # probes said: {"buffer_mb_per_image", "largest_free_mb", "in_use_mb", "pool_mb"}; a size whose
    # step's buffer exceeds the largest free block fails with those words (None: the peak alone binds)
    pool: dict | None = None
    oom_seconds: float | None = None  # an out-of-memory probe's cost (None: as a probe of its size)

    def peak(self, batch: int) -> float:
        """MiB at `batch`: linear between recorded sizes, past the largest at the last slope."""
        sizes = sorted(self.peaks_mb)
        if batch in self.peaks_mb:
            return float(self.peaks_mb[batch])
        lo = max((b for b in sizes if b < batch), default=sizes[0])
        hi = next((b for b in sizes if b > batch), None)
        if hi is None:  # past the largest: its last segment's slope
            lo, hi = sizes[-2], sizes[-1]
        slope = (self.peaks_mb[hi] - self.peaks_mb[lo]) / (hi - lo)
        return self.peaks_mb[lo] + slope * (batch - lo)

    def fits(self, batch: int) -> bool:
        in_pool = self.pool is None or self.pool["buffer_mb_per_image"] * batch <= self.pool["largest_free_mb"]
        return self.peak(batch) <= self.limit_mb and in_pool

    def oom_words(self, batch: int) -> tuple[str, dict | None]:
        """An out-of-memory probe's error and allocator counters, as XLA words them on the device."""
        if self.pool is None:
            return "out of memory (replayed)", None
        asked = self.pool["buffer_mb_per_image"] * batch / 1024
        stats = {"bytes_limit": int(self.limit_mb * MiB), "bytes_in_use": int(self.pool["in_use_mb"] * MiB),
                 "largest_free_block_bytes": int(self.pool["largest_free_mb"] * MiB),
                 "pool_bytes": int(self.pool["pool_mb"] * MiB)}
        return (f"JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate {asked:.2f}GiB "
                f"with allocator GPU_0_bfc on device 0. [executable_name='jit_train_step']"), stats

    def limit(self) -> int:
        """The largest batch size that fits: the replay's answer to find."""
        b = 1
        while self.fits(b * 2):
            b *= 2
        lo, hi = b, b * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits(mid) else (lo, mid)
        return lo

    def ips(self, batch: int) -> float:
        sizes = sorted(self.images_per_second)
        if batch <= sizes[0]:
            return float(self.images_per_second[sizes[0]])
        if batch >= sizes[-1]:
            return float(self.images_per_second[sizes[-1]])
        hi = next(b for b in sizes if b >= batch)
        lo = max(b for b in sizes if b <= batch)
        if lo == hi:
            return float(self.images_per_second[lo])
        f = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return math.exp(math.log(self.images_per_second[lo])
                        + f * (math.log(self.images_per_second[hi]) - math.log(self.images_per_second[lo])))

    def compile_time(self, batch: int) -> float:
        sizes = sorted(self.compile_seconds)
        lo = max((b for b in sizes if b <= batch), default=sizes[0])
        hi = next((b for b in sizes if b > batch), None)
        if hi is None:
            lo, hi = sizes[-2], sizes[-1]
        slope = (self.compile_seconds[hi] - self.compile_seconds[lo]) / (hi - lo)
        return max(0.0, self.compile_seconds[lo] + slope * (batch - lo))

    def plan_bytes(self, batch: int) -> int:
        state, per_image = self.plan_mb
        return int((state + per_image * batch) * MiB)


# --- the recorded devices --------------------------------------------------------------------------

# NVIDIA H200, Keras 3.15 on JAX 0.11, the article's model at 200 px, Adam, determinism off, TF32
# on. Memory and speed from catsdogs 0.15.0 (../shared/GPU.md, "catsdogs 0.15.0 on an H200"): the
# peaks and images/s of `find-batch-size --max 1024` (2,048 from the run without --max), XLA's 75%
# share of the GPU (107,368 MiB). XLA's plan: 22.09 MiB an image, 469 MiB batch-independent. Costs:
# a worker's imports 7.2 s (a trial in a fresh process there); each probe's wall less its timed
# steps in find-batch-size's first GPU run with its defaults (docs/gpu.md, 2026-11-26, 0.16.0:
# 1.5 to 3.1 s at 2 to 256, 7.7 s at 512, 14.2 s at 1,200, the first probe 4.4 s with the data's
# decoding), and 48 s near 4,800 (each of 0.15.0's two plan compilations there). The noise scale:
# B_simple 3 (2 to 4), measured in 15 s.
H200 = RecordedDevice(
    name="H200", kind="gpu", backend="jax", image_size=200, train_images=1200, limit_mb=107_368.0,
    peaks_mb={1: 828, 2: 1025, 8: 1246, 16: 1289, 32: 1532, 64: 2218, 128: 3668, 256: 6569, 512: 19029,
              920: 33550, 1024: 23993, 2048: 64262},
    images_per_second={1: 573, 2: 1038, 8: 3575, 16: 6152, 32: 10557, 64: 16497, 128: 23583, 256: 28013,
                       512: 32180, 920: 34832, 1024: 35393, 2048: 35875},
    plan_mb=(469.0, 22.09), start_seconds=7.2,
    compile_seconds={1: 4.4, 2: 3.1, 8: 2.8, 16: 1.6, 32: 1.9, 64: 1.7, 128: 1.5, 256: 1.6, 512: 7.7, 1200: 14.2,
                     4800: 48.0},
    noise=NoiseEstimate(3.0, 2.0, 4.0, gradient_sq=1.0, trace=3.0, pairs=64, small=1, large=25),
    noise_seconds=15.0)

# The same H200 past the data (`scripts/h100.sh find-limit`, --max 4096, catsdogs 0.29.0, 2026-11-28,
# docs/gpu.md): its probes' peaks, images/s and wall seconds (1.4-2.1 s up to 1,024, 16.7-20.8 s from
# 1,536 up), and its three out-of-memory probes, 30.6-32.9 s each, whose words were the same: one
# buffer of 22.43 MiB an image asked, the largest free block 41,830 MiB, about 1,250 MiB in use. The
# pool's size was not recorded (0.29.0 kept no pool_bytes): at its cap, 107,368 MiB, is what its
# largest free block says (gpu_pool: regions of 2 ... 32,768 MiB, then the 41,834 the cap left).
# XLA's plan as that run compiled it: 22.54 MiB an image, 469 MiB batch-independent. The noise
# scale's figures are the race stage's (they do not bear on memory).
H200_POOL = RecordedDevice(
    name="H200 pool", kind="gpu", backend="jax", image_size=200, train_images=1200, limit_mb=107_368.0,
    peaks_mb={1: 828, 8: 1107, 16: 1289, 32: 1532, 56: 2105, 64: 2218, 128: 3668, 256: 6569, 512: 12370,
              1024: 23993},
    images_per_second={1: 547, 8: 3558, 16: 6258, 32: 10777, 56: 14886, 64: 15942, 128: 21317, 256: 27756,
                       512: 31349, 1024: 34925, 1536: 35828, 1664: 35488, 1792: 35552, 1856: 35652},
    plan_mb=(469.0, 22.545), start_seconds=7.2,
    compile_seconds={1: 3.9, 8: 1.7, 16: 1.7, 32: 1.6, 64: 1.4, 128: 1.6, 256: 1.6, 512: 1.6, 1024: 2.1,
                     1536: 16.7, 1664: 16.9, 1792: 20.7, 1856: 20.8},
    noise=NoiseEstimate(62.0, 5.0, 787.0, gradient_sq=1.0, trace=62.0, pairs=64, small=1, large=25),
    noise_seconds=15.0,
    pool={"buffer_mb_per_image": 22.43, "largest_free_mb": 41_830.0, "in_use_mb": 1_250.0, "pool_mb": 107_368.0},
    oom_seconds=31.0)

# This project's 2-core CPU, catsdogs 0.15.0 on JAX 0.10, the beyond plan's data (64 px, 1,200
# training images), Adam, `find-batch-size --memory-limit 2GiB` (2026-11-26): each probe's peak
# resident memory and images/s as that run measured them (1, and 296 to 346, in fresh workers; 8
# to 256 in one reused worker). XLA's plan: 4.31 MiB an image, 64 MiB batch-independent. Costs: a
# worker's start 3.5 s; compilation 1.2 s + 3.5 ms an image (256 took 5.6 s with its 4 steps, 8
# took 1.6 s). The noise scale: B_simple 15 (11 to 30), 42 s.
CPU_64PX = RecordedDevice(
    name="CPU 64 px", kind="cpu", backend="jax", image_size=64, train_images=1200, limit_mb=2048.0,
    peaks_mb={1: 560, 8: 668, 16: 687, 32: 756, 64: 923, 128: 1192, 256: 1771, 296: 1849, 328: 1992,
              337: 2024, 346: 2050},
    images_per_second={1: 119.1, 8: 203.4, 16: 229.0, 32: 263.3, 64: 249.4, 128: 295.3, 256: 290.3,
                       296: 292.6, 328: 277.4, 337: 281.4},
    plan_mb=(64.0, 4.31), start_seconds=3.5, compile_seconds={1: 1.2, 1000: 4.7},
    noise=NoiseEstimate(15.0, 11.0, 30.0, gradient_sq=1.0, trace=15.0, pairs=64, small=1, large=25),
    noise_seconds=42.0)


# --- the replay --------------------------------------------------------------------------------


@dataclass
class Clock:
    """Simulated seconds, and where they went."""

    now: float = 0.0
    spent: dict = field(default_factory=dict)  # "probes", "plan", "noise" -> seconds
    probe_sizes: list = field(default_factory=list)  # every probe run, in order

    def advance(self, seconds: float, what: str) -> None:
        self.now += seconds
        self.spent[what] = self.spent.get(what, 0.0) + seconds


class ReplayWorker:
    """A worker on the recorded device: ready `start_seconds` after its launch on the clock;
    each new batch size compiles, then runs its warm-up and timed steps. Out of memory ends it,
    as the real worker ends after a probe that did not end done, unless the device recovers in
    the same process (a GPU's JAX: its allocator's bytes back to what they were)."""

    device: RecordedDevice
    clock: Clock
    started: list = []

    def __init__(self, log_path, env=None):
        self.log_path, self.tasks, self.largest_batch = Path(log_path), 0, 0
        self.alive = self.ready = False
        self.device_kind = None
        self.launched_at: float | None = None
        ReplayWorker.started.append(self)

    @property
    def device(self):  # the Worker's "device": 'gpu' or 'cpu', once started
        return self.device_kind

    def launch(self):
        self.alive, self.ready, self.launched_at = True, False, self.clock.now

    def start_or_record(self):
        if not self.alive:
            self.launch()
        self._wait_ready("probes")

    def _wait_ready(self, what: str):
        if not self.ready:
            self.clock.advance(max(0.0, self.launched_at + type(self).device.start_seconds - self.clock.now), what)
            self.ready, self.device_kind = True, type(self).device.kind

    def run(self, task, memory_cap_bytes=None, on_progress=None):
        if not self.alive:
            self.launch()
        self._wait_ready("probes")
        d, b = type(self).device, task.batch_size
        self.clock.probe_sizes.append(b)
        self.tasks += 1
        self.largest_batch = max(self.largest_batch, b)
        cap_mb = memory_cap_bytes / MiB if memory_cap_bytes else d.limit_mb
        peak = d.peak(b)
        if peak > min(cap_mb, d.limit_mb) or not d.fits(b):
            self.clock.advance(d.oom_seconds or d.compile_time(b), "probes")
            recovers = d.kind == "gpu" and d.backend == "jax"
            if not recovers:
                self.alive = False
            extra = {"residue_mb": 0.0 if recovers else None} if "residue_mb" in ProbeRecord.__dataclass_fields__ else {}
            error, stats = d.oom_words(b)
            if "allocator_stats" in ProbeRecord.__dataclass_fields__:
                extra["allocator_stats"] = stats
            return ProbeRecord(batch_size=b, status="oom", peak_memory_mb=min(peak, cap_mb),
                               memory_kind="gpu-worker" if d.kind == "gpu" else "cpu-rss", error=error, **extra)
        self.clock.advance(d.compile_time(b), "probes")
        steps = (task.warmup or 0) + task.steps
        step = b / d.ips(b)
        timed = max(task.steps, math.ceil((task.min_seconds or 0.0) / step))  # repeated to min_seconds
        self.clock.advance(step * ((task.warmup or 0) + timed), "probes")
        del steps
        extra = {"device_memory_limit_mb": d.limit_mb, "memory_fraction": 0.75} if d.kind == "gpu" else {}
        return ProbeRecord(batch_size=b, status="done", peak_memory_mb=peak,
                           memory_kind="gpu-worker" if d.kind == "gpu" else "cpu-rss",
                           images_per_second=d.ips(b), step_time_median_s=step, timed_steps=timed, **extra)

    def pause(self, paused):
        """A spare's import stopped for a probe's timed steps: the clock runs its start on regardless."""

    def kill(self):
        self.alive = False

    def close(self):
        self.alive = False


def replay(monkeypatch, device: RecordedDevice) -> Clock:
    """Put find-batch-size on `device`; the clock every simulated second lands on."""
    from catsdogs.measure import find_batch_size as findbs
    from catsdogs.measure import memory_prediction, prober
    from catsdogs.measure.noise_run import NoiseRun

    clock = Clock()
    worker = type("DeviceWorker", (ReplayWorker,), {"device": device, "clock": clock})
    worker.started = []
    monkeypatch.setenv("KERAS_BACKEND", device.backend)
    monkeypatch.setattr(prober, "Worker", worker)
    monkeypatch.setattr(prober, "visible_gpus", lambda: ["0"] if device.kind == "gpu" else [])
    manifest = {"params": {"size": device.image_size}, "fingerprint": {"standard": f"replay-{device.name}"},
                "counts": {"standard": {"train": {"cat": device.train_images // 2,
                                                  "dog": device.train_images - device.train_images // 2}}}}
    monkeypatch.setattr(findbs, "require_intact", lambda data_dir: manifest)

    def noise_scale(*args, **kwargs):
        clock.advance(device.noise_seconds, "noise")
        return NoiseRun(device.noise, batch_size=32, epochs=3, measure_seconds=device.noise_seconds / 3,
                        seconds=device.noise_seconds, seeds=[0, 1], from_epoch=2)

    monkeypatch.setattr(findbs, "measure_noise_scale", noise_scale)

    def plan(task, log_path, env=None, **kwargs):
        assert isinstance(task, MemoryPlanTask)
        sizes = getattr(task, "batch_sizes", None)
        if sizes is not None:  # compiled at these sizes, in a worker beside the noise scale's runs: its
            # seconds are its own, off the clock (the test holds them against the noise scale's)
            seconds = device.start_seconds + sum(device.compile_time(b) for b in sizes)
            clock.spent["plan"] = seconds
            return MemoryPlan(status="done", planned_bytes={b: device.plan_bytes(b) for b in sizes},
                              seconds=seconds)
        from catsdogs.training.costs import (
            predict_max_batch_size_planned,  # 0.15.0's: solved in the worker
        )

        compiled: list[int] = []

        def at(b):
            compiled.append(b)
            return device.plan_bytes(b)

        out = predict_max_batch_size_planned(at, task.cap_bytes, task.calibration_batch,
                                             task.calibration_peak_bytes)
        clock.advance(device.start_seconds + sum(device.compile_time(b) for b in compiled), "plan")
        return MemoryPlan(status="done", **out)

    monkeypatch.setattr(memory_prediction, "run_isolated", plan)
    return clock
