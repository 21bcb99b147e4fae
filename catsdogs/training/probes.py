"""A probe: a few training steps of the sweep's own step at one batch size, timed; and the two
measurements of the device that profile and find-batch-size add to it (its matmul peak, and the
compiler's memory plan of the step at a few batch sizes).

A probe is built as a trial is (catsdogs.training.steps: the same model, optimizer
implementation, precision, process settings and input pipeline, run by the same `model.fit`), so
what it times is what a sweep trains; it differs only in how many steps it runs and what it
records. Always a record: out of memory and failures are its status (oom, failed), with the error.
Runs inside a worker, after its backend has started (catsdogs.training.child), so Keras is
imported at the top.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import keras
import numpy as np

from catsdogs.data import loading
from catsdogs.errors import CatsdogsError
from catsdogs.host import NvmlSampler, rss_mb
from catsdogs.manifest import require_prepared
from catsdogs.messages import (
    MemoryPlan,
    MemoryPlanTask,
    ModelCheckTask,
    ModelInfo,
    PeakRecord,
    PeakTask,
    ProbeRecord,
    ProbeTask,
)
from catsdogs.model_ref import is_file
from catsdogs.runtime import backends
from catsdogs.schema import Status, TrialConfig
from catsdogs.training import steps, user_model
from catsdogs.training.costs import train_flops_per_image

# NVML's utilization is the share of the last sample period (up to a second) in which a kernel
# ran: a probe of a few milliseconds reads a number that means little. On a GPU each probe's timed
# steps last at least this long (the probe's batches repeat as often as that needs).
GPU_MIN_PROBE_SECONDS = 2.0
MAX_PROBE_EPOCHS = 100_000  # a bound only: the step timer stops the probe


def run_probe(task: ProbeTask, emit=lambda kind, payload: None) -> ProbeRecord:
    """Warm up, then time `task.steps` training steps at one batch size; measure memory.

    The step is the sweep's (`steps.TrainingStep`), fed by the sweep's pipeline: batches of the
    prepared train split, seeded permutations joined end to end (so a batch larger than the
    split holds every image at least once). Only this probe's step is kept in memory.

    Out of memory where the backend counts its device allocator's bytes (JAX on a GPU), the
    record says what the worker still holds beyond what it held before the probe
    (`residue_mb`): nothing, and the worker may run the next probe. A GPU's peak that cannot be
    reset (`memory_kind` gpu-worker) is this probe's only when the probe raised it: one run after
    a larger probe in the same worker has none (None).

    `emit("progress", {"timing": True})` as the timed steps begin, `{"timing": False}` once they
    ended (or failed): the parent pauses a worker that imports beside this one meanwhile
    (catsdogs.measure.prober), so that nothing else runs on the cores while the steps are timed."""
    backend = backends.current()
    kind = backend.start()
    record = ProbeRecord(batch_size=task.batch_size, precision=task.precision, optimizer=task.optimizer,
                         dataset=task.dataset, steps=task.steps, warmup=task.warmup)
    if not task.timing_only:
        steps.STEPS.clear()  # an earlier probe's step goes now, so `before` is what the worker holds between probes
    before, peak_before = backend.device_bytes_in_use(), backend.peak_memory().get("peak_memory_mb")
    sampler = NvmlSampler() if kind == "gpu" else None
    try:
        _timed_steps(task, record, backend, kind, sampler, lambda: emit("progress", {"timing": True}))
    except Exception as exc:  # noqa: BLE001 - out of memory and failures are recorded outcomes
        if sampler:
            _fill(record, **sampler.stop())
        _fill(record, **backends.failure_fields(exc, backend))
        if record.status == Status.OOM:  # the allocator's counters as the failure left them (JAX on a GPU)
            record.allocator_stats = _allocator_stats(backend)
    finally:
        emit("progress", {"timing": False})
    if record.status != Status.DONE:
        steps.STEPS.clear()  # whatever the failed step allocated goes back before the next task
        after = backend.device_bytes_in_use() if record.status == Status.OOM and before is not None else None
        record.residue_mb = round((after - before) / 2**20, 3) if after is not None else None
    memory = backend.peak_memory()
    if memory.get("memory_kind") == "gpu-worker" and peak_before and (memory.get("peak_memory_mb") or 0) <= peak_before:
        memory["peak_memory_mb"] = None  # below an earlier probe's peak in this worker: not this probe's
    _fill(record, **memory)
    return record


def _allocator_stats(backend) -> dict | None:
    """The device allocator's counters (XLA's memory_stats(): bytes in use, its limit, the largest
    free block), numbers only; None where the backend keeps none (TensorFlow, a CPU)."""
    stats = getattr(backend, "device_stats", lambda: {})() or {}
    kept = {k: int(v) for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return kept or None


def _timed_steps(task: ProbeTask, record: ProbeRecord, backend, kind: str, sampler, on_timing) -> None:
    """The probe's training steps, timed, into `record`. Its step and batches live in this frame
    only, so they are gone once it returns or raises."""
    if task.input_spec:  # a user's model: its images (--data), else random ones of its input
        train = (steps.DATA.load_folder(task.data_folder, task.input_spec) if task.data_folder
                 else random_split(*task.input_spec, seed=task.seed))
        splits, fingerprint, size = {"train": train}, "", int(task.input_spec[0])
    else:
        manifest, splits = steps.DATA.load(Path(task.data_dir), task.dataset, decoded=task.decoded)
        size, fingerprint = manifest["params"]["size"], manifest["fingerprint"][task.dataset]
    cfg = TrialConfig(task.optimizer, int(task.batch_size), task.dataset, task.seed, epochs=1,
                      image_size=size, data=fingerprint,
                      precision=task.precision, deterministic=task.deterministic, tf32=task.tf32,
                      backend=backend.NAME)
    cfg.check()
    backends.check_settings(cfg, backend.running_settings())
    record.deterministic, record.tf32 = cfg.deterministic, cfg.tf32
    n = task.warmup + task.steps
    record.image_size, record.device, record.backend = size, backend.device_description(), backend.NAME
    record.baseline_rss_mb = rss_mb()  # before the model: runtime + data
    user = (task.model, task.loss) if task.model else None
    step, _ = steps.STEPS.get(cfg, n, backend, keep_others=task.timing_only, user=user)
    train = steps.as_model_input(splits["train"], step.model)
    batches = backend.train_batches(train, cfg.batch_size, cfg.seed, n, cross_epochs=True)
    min_seconds = task.min_seconds
    if min_seconds is None:
        min_seconds = GPU_MIN_PROBE_SECONDS if kind == "gpu" else 0.0
    def on_timed_start():
        on_timing()
        if sampler:
            sampler.start()

    timer = StepTimer(task.warmup, on_timed_start, task.steps, min_seconds)
    with step.strategy.scope():  # the same batches again until the timed steps last min_seconds
        step.model.fit(batches, epochs=MAX_PROBE_EPOCHS if min_seconds else 1, steps_per_epoch=n,
                       callbacks=[timer], shuffle=False, verbose=0)
    nvml = sampler.stop() if sampler else {}
    times = timer.times
    median, mean = statistics.median(times), statistics.fmean(times)
    _fill(record, status=Status.DONE, step_time_median_s=median, step_time_mean_s=mean,
          step_times_s=times, timed_steps=len(times), timed_seconds=sum(times),
          images_per_second=cfg.batch_size / median, **nvml,
          flops_per_second=(flops * cfg.batch_size / median) if (flops := _flops(step, size)) else None)


def _flops(step: steps.TrainingStep, size: int) -> float | None:
    """A training step's FLOPs an image: the article's model's analytic count, or a user's model's
    by its layers (None where it has one the count does not know)."""
    return user_model.train_flops_per_image(step.model)[0] if step.user else train_flops_per_image(size)


RANDOM_IMAGES = 64  # a random split's images: a larger batch repeats them (as a probe repeats the train split)


def random_split(height: int, width: int, channels: int, classes: int, dtype: str, seed: int = 0) -> loading.Split:
    """Random images of a user's model's input shape and dtype (uint8 in 0-255, floats in [0, 1))
    and labels of its classes: what memory and speed need, which no real image changes."""
    rng = np.random.default_rng(seed)
    shape = (RANDOM_IMAGES, int(height), int(width), int(channels))
    if "int" in dtype:
        images = rng.integers(0, 256, size=shape, dtype=np.uint8)
    else:
        images = rng.random(shape, dtype=np.float32)
    labels = rng.integers(0, int(classes), size=RANDOM_IMAGES).astype(np.float32)
    return loading.Split(images, labels, [f"random-{i}" for i in range(RANDOM_IMAGES)])


def run_model_check(task: ModelCheckTask) -> ModelInfo:
    """Build the user's model, check it, choose its loss, and say what it is."""
    backends.current().start()
    model = user_model.build(task.model)
    info = user_model.describe(model, user_model.choose_loss(model, task.loss))
    digest = user_model.architecture_digest(model, weights=is_file(task.model))
    del model
    return ModelInfo(status=Status.DONE, **info, architecture=digest)


def _fill(record, **values):
    """Set fields of a record (dataclasses.replace would copy it)."""
    for k, v in values.items():
        setattr(record, k, v)


class StepTimer(keras.callbacks.Callback):
    """Times each training step after `warmup` untimed ones; the loss is read back at each step's
    end, which waits for the device to finish the step. With `min_seconds`, it stops training at
    the end of the first pass over the batches (an epoch) after which at least `steps` steps were
    timed and they lasted `min_seconds`. `on_timed_start()`: called as the first timed step begins."""

    def __init__(self, warmup: int, on_timed_start=None, steps: int = 0, min_seconds: float = 0.0):
        super().__init__()
        self.warmup, self.on_timed_start, self.steps, self.min_seconds = warmup, on_timed_start, steps, min_seconds
        self.times: list[float] = []
        self.step = 0

    def on_epoch_end(self, epoch, logs=None):
        if len(self.times) >= self.steps and sum(self.times) >= self.min_seconds:
            self.model.stop_training = True

    def on_train_batch_begin(self, batch, logs=None):
        if self.step == self.warmup and self.on_timed_start:
            self.on_timed_start()
        self.t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        float((logs or {}).get("loss", 0.0))  # synchronize
        if self.step >= self.warmup:
            self.times.append(time.perf_counter() - self.t0)
        self.step += 1


def run_peak(task: PeakTask) -> PeakRecord:
    """The device's matmul peak in the precision's compute dtype."""
    backend = backends.current()
    backend.start()
    dtype = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[task.precision]
    result = backend.matmul_peak(dtype, n=task.matmul_size, seconds=task.seconds)
    return PeakRecord(status=Status.DONE, device=backend.device_description(), precision=task.precision,
                      **result)


def run_memory_plan(task: MemoryPlanTask) -> MemoryPlan:
    """The bytes of the probe's training step by the compiler's memory plan (backends whose
    compiler states one: JAX) at each of `task.batch_sizes`: compiled, never run."""
    backend = backends.current()
    backend.start()
    if backend.compiled_step_bytes is None:
        raise CatsdogsError(f"{backend.NAME} states no memory plan: use catsdogs.training.costs' analytic model")
    started = time.perf_counter()
    manifest = require_prepared(Path(task.data_dir))
    size, fingerprint = manifest["params"]["size"], manifest["fingerprint"][task.dataset]
    cfg = TrialConfig(task.optimizer, int(min(task.batch_sizes)), task.dataset, 0, epochs=1,
                      image_size=size, data=fingerprint,
                      precision=task.precision, deterministic=task.deterministic, tf32=task.tf32,
                      backend=backend.NAME)
    backends.check_settings(cfg, backend.running_settings())
    step, _ = steps.STEPS.get(cfg, 1, backend, keep_others=False)
    with step.strategy.scope():
        planned = {int(b): backend.compiled_step_bytes(step.model, int(b)) for b in task.batch_sizes}
    return MemoryPlan(status=Status.DONE, planned_bytes=planned, seconds=round(time.perf_counter() - started, 3))
