"""The messages that cross a process: the task a worker runs, and the record it answers with.

A worker (catsdogs.runtime.worker, or a Ray actor) reads one task, runs it with the engine and
answers with one record; every record has a `status` (schema.Status) and, when it did not end
`done`, an `error`. Five kinds of task, each with its record type:

    TrialTask       -> TrialRecord    train and test one configuration (a sweep's trial)
    ProbeTask       -> ProbeRecord    time a few training steps at one batch size, measure memory
    PeakTask        -> PeakRecord     the device's matrix-multiply peak (for MFU)
    MemoryPlanTask  -> MemoryPlan     the compiler's memory plan at a few batch sizes (JAX)
    ModelCheckTask  -> ModelInfo      build a user's model (--model) and say what it is

On the wire a task is one JSON line (`encode`, `decode_task`) and a record a JSON object of its
fields (`asdict`, `Record.from_dict`). The results store's columns and every CSV's columns are
derived from the record types' fields (`columns`): a field's metadata says where it goes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from catsdogs.schema import Status, TrialConfig


def _field(default=None, **where):
    """A record field, None until filled. `where`: the outputs that show it, e.g. stored=False
    (not a store column), csv=True (a results.csv column), views=("profile", "search")."""
    return field(default=default, metadata=where)


def columns(record_type, view: str) -> list[str]:
    """The fields of `record_type` that `view` shows, in their declared order: "stored" (every
    field but those marked stored=False), "csv", or a view name of ProbeRecord."""
    out = []
    for f in fields(record_type):
        if view == "stored":
            shown = f.metadata.get("stored", True)
        elif view == "csv":
            shown = f.metadata.get("csv", False)
        else:
            shown = view in f.metadata.get("views", ())
        if shown:
            out.append(f.name)
    return out


class Record:
    """What every record type shares: built from a decoded JSON object, unknown keys ignored."""

    @classmethod
    def from_dict(cls, d: dict):
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        if values.get("status") is not None:
            values["status"] = Status(values["status"])
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)

    def view(self, name: str) -> dict:
        """The fields `name` shows (`columns`), in their declared order."""
        return {k: getattr(self, k) for k in columns(type(self), name)}

    def keeps_worker(self) -> bool:
        """Whether the worker that ran it may run the next task (isolation: only after `done`)."""
        return self.status == Status.DONE


# --- records -------------------------------------------------------------------------------------


@dataclass
class TrialRecord(Record):
    """One trial's outcome. Every field but `n_*` and `traceback` is a column of the results store
    (catsdogs.store); those marked csv are columns of OUT/NAME/results.csv."""

    status: Status = Status.FAILED
    test_accuracy: float | None = _field(csv=True)
    test_loss: float | None = _field(csv=True)
    # the trained model's accuracy on the validation split: what tuning may choose by
    val_accuracy: float | None = _field(csv=True)
    # what the trained model does on the test images (training.diagnosis): a collapse (one class for
    # all), the share it calls Dog, the Dense(128) units that output 0 for all, its logits
    collapsed: int | None = _field(csv=True)
    dog_share: float | None = _field(csv=True)
    dead_units: float | None = _field(csv=True)
    logit_abs: float | None = _field()
    logit_sd: float | None = _field()
    # the same for the model as it started, before its first update
    initial_dog_share: float | None = _field()
    initial_dead_units: float | None = _field(csv=True)
    initial_logit_abs: float | None = _field(csv=True)
    initial_logit_sd: float | None = _field()
    history: list | None = _field()  # per epoch: loss, accuracy, val_loss, val_accuracy, seconds
    # the gradient noise scale B_simple (catsdogs.gradient_noise; sweep --noise-scale), measured after the
    # last epoch: the estimate (None: the noise dominated, low is then a lower bound), its 95%
    # interval (high None: unbounded above); each epoch's is in `history`, the start's here
    noise_scale: float | None = _field(csv=True)
    noise_scale_low: float | None = _field(csv=True)
    noise_scale_high: float | None = _field(csv=True)
    initial_noise: dict | None = _field()  # the measurement before the first update, in full
    noise_seconds: float | None = _field(csv=True)  # time spent measuring it, in no epoch's clock
    # the validation curve (sweep --eval-every; catsdogs.targets): a point per evaluation, the first
    # before any update, each {step, examples, train_seconds, val_loss, val_accuracy}; its time
    curve: list | None = _field()
    eval_seconds: float | None = _field(csv=True)  # in no epoch's clock, as the noise scale's
    # a target (sweep --until): reached (1) or not (0), and the updates, images and training seconds
    # to it, interpolated between the evaluations around it (catsdogs.targets); None when not reached
    target_reached: int | None = _field(csv=True)
    steps_to_target: float | None = _field(csv=True)
    examples_to_target: float | None = _field(csv=True)
    seconds_to_target: float | None = _field(csv=True)
    steps: int | None = _field(csv=True)  # optimizer updates (weights changed)
    batches: int | None = _field()  # batches fit ran (accumulation: several per update)
    learning_rate: float | None = _field(csv=True)
    train_seconds: float | None = _field(csv=True)
    images_per_second: float | None = _field(csv=True)
    peak_memory_mb: float | None = _field(csv=True)
    memory_kind: str | None = _field(csv=True)
    replicas: int | None = _field(csv=True)
    wall_seconds: float | None = _field(csv=True)
    fit_seconds: float | None = _field()
    setup_seconds: float | None = _field()  # building and compiling, or resetting a kept step
    step_reused: bool | None = _field()
    # XLA compilations during the trial (JAX; None on TensorFlow), and the persistent compilation
    # cache's loads, which are not compilations
    compiles: int | None = _field(csv=True)
    compile_cache_hits: int | None = _field(csv=True)
    weights_digest: str | None = _field(csv=True)
    digest_seconds: float | None = _field()  # what the digest added to the trial: its start and its wait
    env: dict | None = _field()  # catsdogs, backend and versions, device, host
    n_train: int | None = _field(stored=False)
    n_validation: int | None = _field(stored=False)
    n_test: int | None = _field(stored=False)
    error: str | None = _field()  # the results.csv shows it last
    traceback: str | None = _field(stored=False)  # the worker folds it into `error`
    digest_pending: bool | None = _field(stored=False)  # weights_digest still to come (TrialTask.defer_digest)


RETIME = "retime"  # the phase of a probe run again for its step time alone
BETWEEN = "between"  # ... and of a size first timed in the retime's worker, between two probed sizes
CHECK = "check"  # ... and of the memory model's check, run aside before the search (memory_prediction.check_replay)
TIMING_PHASES = (RETIME, BETWEEN)  # run beside other sizes' steps: their memory says nothing of the size's


@dataclass
class ProbeRecord(Record):
    """One probe's outcome. The worker fills what it measured; the parent adds the cap, the
    matmul peak's share (profile) and the search's bookkeeping (find-batch-size). Views:
    "profile" is OUT/NAME/profile.csv, "search" the probes of find_batch_size.json and .csv."""

    order: int | None = _field(views=("search",))  # the search's n-th probe
    phase: str | None = _field(views=("search",))  # calibrate, check, predict, search, confirm, critical, retime or between
    wall_seconds: float | None = _field(views=("search",))  # the probe in the parent, a worker's start included
    batch_size: int | None = _field(views=("profile", "search"))
    status: Status = field(default=Status.FAILED, metadata={"views": ("profile", "search")})
    step_time_median_s: float | None = _field(views=("profile", "search"))
    step_time_mean_s: float | None = _field(views=("profile",))
    images_per_second: float | None = _field(views=("profile", "search"))
    flops_per_second: float | None = _field(views=("profile",))
    peak_flops_per_second: float | None = _field(views=("profile",))  # the matmul peak (parent)
    mfu_percent: float | None = _field(views=("profile",))  # model FLOPs utilization (parent)
    peak_memory_mb: float | None = _field(views=("profile", "search"))
    memory_kind: str | None = _field(views=("profile", "search"))
    baseline_rss_mb: float | None = _field(views=("profile", "search"))  # before the model
    memory_above_baseline_mb: float | None = _field(views=("profile",))  # (parent)
    allocator_peak_mb: float | None = _field(views=("profile", "search"))
    nvml_gpu_util_mean_percent: float | None = _field(views=("profile",))
    nvml_gpu_util_max_percent: float | None = _field(views=("profile",))
    nvml_memory_used_mb: float | None = _field(views=("profile",))
    nvml_samples: int | None = _field(views=("profile",))
    timed_steps: int | None = _field(views=("profile",))
    timed_seconds: float | None = _field(views=("profile",))
    device: str | None = _field(views=("profile", "search"))
    backend: str | None = _field(views=("profile", "search"))
    precision: str | None = _field(views=("profile",))
    optimizer: str | None = _field(views=("profile",))
    dataset: str | None = _field(views=("profile",))
    image_size: int | None = _field(views=("profile",))
    deterministic: bool | None = _field(views=("profile", "search"))  # the worker's settings
    tf32: bool | None = _field(views=("profile", "search"))
    steps: int | None = _field(views=("profile",))
    warmup: int | None = _field(views=("profile",))
    memory_cap_mb: float | None = _field(views=("profile", "search"))  # the cap it ran under (parent)
    worker: str | None = _field(views=("profile", "search"))  # fresh, reused or retried (parent; prober)
    predicted_peak_mb: float | None = _field(views=("search",))  # by the memory model (parent)
    device_memory_limit_mb: float | None = _field(views=("search",))
    memory_fraction: float | None = _field(views=("search",))  # XLA's share of the GPU (JAX on a GPU)
    # out of memory where the backend counts its device allocator's bytes (JAX on a GPU): what the
    # worker still held after it, beyond what it held before the probe (0: it recovered in place)
    residue_mb: float | None = _field(views=("search",))
    # out of memory: the device allocator's counters at the failure (the worker's: XLA's
    # memory_stats(); None on the CPU), and what the parent reads from them and the error
    # (catsdogs.measure.oom): the bytes asked, the largest free block, the bytes in use, the cause
    allocator_stats: dict | None = _field()
    oom_asked_mb: float | None = _field(views=("search",))
    oom_largest_free_mb: float | None = _field(views=("search",))
    oom_in_use_mb: float | None = _field(views=("search",))
    oom_pool_mb: float | None = _field(views=("search",))  # the regions grown so far (XLA's pool_bytes)
    oom_cause: str | None = _field(views=("search",))
    step_times_s: list | None = _field()
    error: str | None = _field(views=("profile", "search"))
    log: str | None = _field(views=("search",))  # the worker's log, kept when it did not end done
    traceback: str | None = _field()

    def keeps_worker(self) -> bool:
        """Done, or out of memory with nothing left behind (`residue_mb` within RESIDUE_MB): the
        device recovered in place, so the next probe may run in the same worker."""
        return self.status == Status.DONE or (self.status == Status.OOM and self.residue_mb is not None
                                              and abs(self.residue_mb) <= RESIDUE_MB)


# What a recovered worker may still hold after an out-of-memory (MiB): XLA's allocator counts in
# bytes, and a step's buffers all go when it fails; a few constants (a random key, a schedule)
# may be made again on the way.
RESIDUE_MB = 1.0


@dataclass
class PeakRecord(Record):
    """The device's matmul peak: FLOP/s of n x n products in the precision's compute dtype."""

    status: Status = Status.FAILED
    device: str | None = None
    precision: str | None = None
    peak_flops_per_second: float | None = None
    matmul_size: int | None = None
    matmul_dtype: str | None = None
    matmuls: int | None = None
    error: str | None = None
    traceback: str | None = None


@dataclass
class MemoryPlan(Record):
    """The bytes XLA's plan of a training step takes at each batch size asked
    (costs.predict_max_batch_size_planned turns them into a prediction)."""

    status: Status = Status.FAILED
    planned_bytes: dict | None = None  # batch size -> bytes the compiled step plans
    seconds: float | None = None  # the compilations, in the worker
    error: str | None = None
    traceback: str | None = None


@dataclass
class ModelInfo(Record):
    """A user's model as its worker built it (catsdogs.training.user_model.describe)."""

    status: Status = Status.FAILED
    name: str | None = None
    input_shape: list | None = None  # (height, width, channels)
    input_dtype: str | None = None
    classes: int | None = None
    parameters: int | None = None
    layers: int | None = None
    loss: str | None = None  # binary or sparse-categorical
    from_logits: bool | None = None
    loss_description: str | None = None
    dtype_policy: str | None = None  # its layers' (a saved model keeps its own)
    # a training step's FLOPs an image, counted as the article's are (user_model.train_flops_per_image);
    # None where it has a layer with weights the count does not know
    train_flops_per_image: float | None = None
    flops_unknown: list | None = None  # those layers' kinds
    activation_bytes_per_image: float | None = None  # its layers' outputs, an image's (user_model.activation_bytes)
    article_size: int | None = None  # the image size at which it is the article's model (user_model.article_size)
    batch_norm: bool | None = None  # it has a BatchNormalization layer (the noise scale's micro-batches: noise_run)
    architecture: str | None = None  # a digest of its layers, a saved one's weights too (user_model.architecture_digest)
    source: dict | None = None  # the reference as checked: a file's SHA-256 (parent: model_ref.source)
    error: str | None = None
    traceback: str | None = None


# --- tasks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialTask:
    """Train and test `config` on the prepared data in `data_dir` (an absolute path), recording
    the gradient noise scale as `noise_sampling` (catsdogs.gradient_noise.NoiseSampling, as a
    dict) says, and the validation curve every `eval_every` training images."""

    KIND: ClassVar[str] = "trial"
    RECORD: ClassVar[type] = TrialRecord
    config: TrialConfig
    data_dir: str
    noise_sampling: dict | None = None  # measure the noise scale so (None: not); not the trial's identity
    # evaluate the validation split every so many training images (None: not); not the trial's
    # identity either (a trial with a target has its own, config.eval_every, which wins)
    eval_every: int | None = None
    # a user's model, trained instead of the article's (find-batch-size's noise scale): {"model",
    # "loss", and where its images are not the prepared data, "input_spec" and "data_folder"}
    # as a ProbeTask has them, and for a race's trial on a folder "validation": True (a tenth of
    # its training images held out to validate: folder_data.race_splits) and "images", the folder
    # the sweep records (None: the article's model)
    user: dict | None = None
    # the weights' digest delivered after the record, while the worker runs its next task (a
    # `digest` message): on a GPU the hash of 164 MB held every trial up 0.4 s (catsdogs.runtime.worker)
    defer_digest: bool = False
    # the prepared data set decoded once by the parent (loading.save_decoded), read instead of its
    # JPEGs (find-batch-size's short runs; None: decoded here, as a sweep's trials are); not the
    # trial's identity: the same images either way
    decoded: str | None = None


@dataclass(frozen=True)
class ProbeTask:
    """Warm up, then time `steps` training steps of the sweep's step at `batch_size` (for at least
    `min_seconds`; None: the engine's default for the device)."""

    KIND: ClassVar[str] = "probe"
    RECORD: ClassVar[type] = ProbeRecord
    batch_size: int
    data_dir: str
    optimizer: str
    dataset: str
    precision: str
    steps: int
    warmup: int
    seed: int = 0
    min_seconds: float | None = None
    deterministic: bool = True  # the worker's settings (schema.PROCESS_FIELDS), which it checks
    tf32: bool | None = None
    model: str | None = None  # a user's model (catsdogs.model_ref; None: the article's)
    loss: str = "auto"  # its loss (catsdogs.training.user_model.choose_loss)
    # [height, width, channels, classes, dtype] of a user's model's input (None: the prepared
    # data): its images from `data_folder` (--data), else random ones (training.probes.random_split)
    input_spec: list | None = None
    data_folder: str | None = None
    # the prepared data set decoded once by the parent (loading.save_decoded), read instead of its
    # JPEGs (None: decoded here)
    decoded: str | None = None
    # timed for its step time alone (find-batch-size's retime): the worker keeps its compiled steps
    # of other sizes, and the next such probe of this size reuses this one's
    timing_only: bool = False


@dataclass(frozen=True)
class PeakTask:
    """The matmul peak in `precision`'s compute dtype, over about `seconds`."""

    KIND: ClassVar[str] = "peak"
    RECORD: ClassVar[type] = PeakRecord
    precision: str
    seconds: float
    matmul_size: int | None = None  # None: the backend's size for the device


@dataclass(frozen=True)
class MemoryPlanTask:
    """XLA's plan of the probe's training step, compiled (never run) at each of `batch_sizes`."""

    KIND: ClassVar[str] = "memory"
    RECORD: ClassVar[type] = MemoryPlan
    data_dir: str
    optimizer: str
    dataset: str
    precision: str
    batch_sizes: list
    deterministic: bool = True
    tf32: bool | None = None


@dataclass(frozen=True)
class ModelCheckTask:
    """Build the user's model `model` (catsdogs.model_ref) and say what it is, with `loss`."""

    KIND: ClassVar[str] = "model"
    RECORD: ClassVar[type] = ModelInfo
    model: str
    loss: str = "auto"


TASKS = {t.KIND: t for t in (TrialTask, ProbeTask, PeakTask, MemoryPlanTask, ModelCheckTask)}
Task = TrialTask | ProbeTask | PeakTask | MemoryPlanTask | ModelCheckTask


def encode(task: Task) -> str:
    """One JSON line: the task's kind and its fields (a trial's configuration as a dict)."""
    return json.dumps({"kind": task.KIND, **asdict(task)})


def decode_task(line: str) -> Task:
    d = json.loads(line)
    kind = TASKS[d.pop("kind")]
    if kind is TrialTask:
        d["config"] = TrialConfig.from_dict(d["config"])
    return kind(**d)
