"""One trial: the article's model trained with one configuration, measured, and recorded.

Run in-process with `run_trial`, or as a child process (`python -m catsdogs.trial SPEC RESULT`),
which is how `sweep` runs it: TensorFlow does not give device memory back after an
out-of-memory error, so every trial gets a fresh process, and a crash stays in that process.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import resource
import sys
import time
import traceback
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from catsdogs import __version__, config

DEFAULT_LR = {"sgd": 0.01, "adam": 0.001}  # Keras' defaults: what optimizer="sgd"/"adam" gives
LR_SCALINGS = ("none", "linear", "sqrt")
BUDGETS = ("epochs", "steps")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored")
PROGRESS_PREFIX = "@@progress "  # how a child trial reports epochs to the sweep on stdout
# The TrialConfig fields beyond the grid's own (optimizer, batch size, data set, seed, epochs):
# the protocol options of `sweep` and the protocol keys a `reproduce` grid may vary.
PROTOCOL_FIELDS = ("lr", "lr_scaling", "base_batch_size", "warmup_epochs", "budget", "accumulate",
                   "precision", "strategy")


@dataclass(frozen=True)
class TrialConfig:
    """Everything that can change a trial's result; its hash is the trial's identity."""

    optimizer: str
    batch_size: int
    dataset: str
    seed: int
    epochs: int = config.EPOCHS
    image_size: int = config.IMAGE_SIZE
    data: str = ""  # fingerprint of the prepared images (manifest.json), so new data = new trials
    lr: float | None = None  # None: the optimizer's Keras default (DEFAULT_LR)
    lr_scaling: str = "none"  # scale lr with batch_size / base_batch_size: none, linear, sqrt
    base_batch_size: int = 32  # the batch size the base lr (and the step budget) belongs to
    warmup_epochs: float = 0.0  # linear warm-up of the lr over this many epochs
    budget: str = "epochs"  # epochs: the article's; steps: base_batch_size's updates for all
    accumulate: int = 1  # gradient accumulation: one update per `accumulate` batches
    precision: str = "float32"
    strategy: str = "none"  # mirrored: data-parallel over the visible GPUs

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        extra = [f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                 if f.name not in ("optimizer", "batch_size", "dataset", "seed", "data", "image_size")
                 and getattr(self, f.name) != f.default]
        return " ".join([self.optimizer, f"bs={self.batch_size}", self.dataset, f"seed={self.seed}", *extra])

    @classmethod
    def from_dict(cls, d: dict) -> TrialConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def check(self) -> None:
        """One-line ValueErrors for values no trial can run with."""
        if self.optimizer not in DEFAULT_LR:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose from {', '.join(DEFAULT_LR)}")
        if self.dataset not in config.DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose from {', '.join(config.DATASETS)}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        for name, value, allowed in (("lr_scaling", self.lr_scaling, LR_SCALINGS),
                                     ("budget", self.budget, BUDGETS),
                                     ("precision", self.precision, PRECISIONS),
                                     ("strategy", self.strategy, STRATEGIES)):
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(allowed)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"learning rate must be positive, got {self.lr}")
        if self.accumulate < 1 or self.base_batch_size < 1 or self.warmup_epochs < 0:
            raise ValueError("accumulate and base batch size must be >= 1, warm-up >= 0")


def learning_rate(cfg: TrialConfig) -> float:
    base = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.optimizer]
    ratio = cfg.batch_size * cfg.accumulate / cfg.base_batch_size  # the effective batch counts
    return base * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]


def plan_steps(cfg: TrialConfig, n_train: int) -> tuple[int, int]:
    """(batches per Keras epoch, Keras epochs). The article: n_train // batch_size per epoch.

    With the steps budget every batch size makes the updates the base batch size makes in
    the configured epochs: the same number of epochs, each of n_train // base_batch_size
    updates, the data repeated (and reshuffled) as often as that needs."""
    if cfg.budget == "steps":
        per_epoch = (n_train // cfg.base_batch_size) * cfg.accumulate
    else:
        per_epoch = n_train // cfg.batch_size
    return per_epoch, cfg.epochs


def environment() -> dict:
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        device = f"{len(gpus)} x {details.get('device_name', 'GPU')}"
    else:
        device = f"CPU: {cpu_name()} ({os.cpu_count()} cores)"
    return {"catsdogs": __version__, "tensorflow": tf.__version__, "keras": keras.__version__,
            "python": platform.python_version(), "device": device, "host": platform.node()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peak_memory_mb() -> tuple[float, str]:
    """Peak device memory on a GPU (TensorFlow's allocator); else this process's peak RSS."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, "gpu"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu-rss"


def _make_optimizer(cfg: TrialConfig, steps_per_epoch: int):
    import keras

    lr = learning_rate(cfg)
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch / cfg.accumulate))
    if warmup > 0:
        lr = keras.optimizers.schedules.PolynomialDecay(  # a linear ramp 0 -> lr, then flat
            initial_learning_rate=lr / warmup, decay_steps=warmup, end_learning_rate=lr, power=1.0)
    kwargs = {"learning_rate": lr}
    if cfg.accumulate > 1:
        kwargs["gradient_accumulation_steps"] = cfg.accumulate
    if cfg.optimizer == "adam" and cfg.strategy == "none":
        return fused_adam_class()(**kwargs)
    cls = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam}[cfg.optimizer]
    return cls(**kwargs)


def fused_adam_class():
    """keras.optimizers.Adam, its dense update done by one fused TensorFlow kernel.

    Keras 3's Adam updates each variable with a dozen element-wise ops, each a full pass over
    the 41M-parameter Dense kernel and its two slots; tf.raw_ops.ResourceApplyAdam does the
    same arithmetic in one pass: a third less CPU per training step here (scripts/bench_trial.py),
    with weights equal to 1e-6 (tests/test_protocol.py). Not used under a distribution
    strategy, whose per-replica variables the kernel would have to be handed one by one."""
    import keras
    import tensorflow as tf

    def handle(v):
        return v.value.handle if isinstance(v, keras.Variable) else v.handle

    class FusedAdam(keras.optimizers.Adam):
        def update_step(self, gradient, variable, learning_rate):
            if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
                return super().update_step(gradient, variable, learning_rate)
            dtype = variable.dtype
            step = tf.cast(self.iterations + 1, dtype)
            b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
            i = self._get_variable_index(variable)
            tf.raw_ops.ResourceApplyAdam(
                var=handle(variable), m=handle(self._momentums[i]), v=handle(self._velocities[i]),
                beta1_power=tf.pow(b1, step), beta2_power=tf.pow(b2, step),
                lr=tf.cast(learning_rate, dtype), beta1=b1, beta2=b2,
                epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))

    return FusedAdam


def run_trial(cfg: TrialConfig, data_dir: Path, on_epoch=None) -> dict:
    """Train and test one configuration; return its record (status 'done')."""
    cfg.check()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.time()
    import keras
    import tensorflow as tf

    from catsdogs import data
    from catsdogs.model import build_model
    from catsdogs.prepare import require_prepared

    manifest = require_prepared(Path(data_dir))
    if cfg.data and manifest["fingerprint"][cfg.dataset] != cfg.data:
        raise RuntimeError(f"the data in {data_dir} changed since this trial was planned (re-prepared?)")
    if manifest["params"]["size"] != cfg.image_size:
        raise RuntimeError(f"data in {data_dir} is {manifest['params']['size']} px, trial wants {cfg.image_size}")

    strategy = _strategy(cfg)  # first: logical devices must be set before TensorFlow starts
    keras.utils.set_random_seed(cfg.seed)
    tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_dtype_policy(cfg.precision)

    splits = data.load_dataset(Path(data_dir), cfg.dataset)
    train, val, test = splits["train"], splits["validation"], splits["test"]
    per_epoch, epochs = plan_steps(cfg, len(train))
    if len(train) // cfg.batch_size == 0:
        raise ValueError(f"batch size {cfg.batch_size} is larger than the {len(train)} training "
                         "images: not one full batch to train on")

    with strategy.scope():
        model = build_model(cfg.image_size)
        model.compile(optimizer=_make_optimizer(cfg, per_epoch), loss="binary_crossentropy",
                      metrics=["accuracy"])
    train_ds = data.train_batches(train, cfg.batch_size, cfg.seed, n_batches=per_epoch * epochs,
                                  cross_epochs=cfg.budget == "steps")
    val_ds = data.eval_batches(val, cfg.batch_size) if len(val) else None
    timer = _epoch_timer(epochs, on_epoch)
    fit_started = time.time()
    hist = model.fit(train_ds, validation_data=val_ds, epochs=epochs, steps_per_epoch=per_epoch,
                     callbacks=[timer], shuffle=False, verbose=0)  # the dataset shuffles
    fit_seconds = time.time() - fit_started
    test_loss, test_acc = model.evaluate(data.eval_batches(test, cfg.batch_size), verbose=0)

    batches = per_epoch * len(hist.history["loss"])  # what fit ran: full batches only
    updates = int(model.optimizer.iterations.numpy())  # Keras counts updates, not accumulated batches
    history = []
    for i in range(len(hist.history["loss"])):
        row = {k: float(v[i]) for k, v in hist.history.items()}
        row.update(timer.epochs[i])
        history.append(row)
    train_seconds = sum(e["train_seconds"] for e in timer.epochs)
    memory, memory_kind = peak_memory_mb()
    return {
        "status": "done",
        "config": asdict(cfg),
        "test_accuracy": float(test_acc),
        "test_loss": float(test_loss),
        "history": history,
        "steps": updates,  # optimizer updates (weights changed)
        "batches": batches,
        "learning_rate": learning_rate(cfg),
        "n_train": len(train), "n_validation": len(val), "n_test": len(test),
        "train_seconds": round(train_seconds, 4),
        "fit_seconds": round(fit_seconds, 4),
        "images_per_second": batches * cfg.batch_size / train_seconds if train_seconds else None,
        "peak_memory_mb": round(memory, 1),
        "memory_kind": memory_kind,
        "replicas": strategy.num_replicas_in_sync,
        "wall_seconds": round(time.time() - started, 3),
        "env": environment(),
    }


def _strategy(cfg: TrialConfig):
    import tensorflow as tf

    if cfg.strategy == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()  # every visible GPU
        # No GPU: mirror over logical CPU devices, CATSDOGS_LOGICAL_CPUS of them (default 2);
        # this is how the strategy is tested without GPUs.
        n = int(os.environ.get("CATSDOGS_LOGICAL_CPUS", "2"))
        cpu = tf.config.list_physical_devices("CPU")[0]
        if len(tf.config.get_logical_device_configuration(cpu) or []) < n:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    return tf.distribute.get_strategy()  # the default: no distribution


def _epoch_timer(n_epochs: int, on_epoch):
    """A callback timing the training and validation parts of each epoch, reporting each."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[dict] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0, self.t_train = time.perf_counter(), None

        def on_test_begin(self, logs=None):  # validation starts: training of the epoch is over
            if self.t_train is None:
                self.t_train = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            end = time.perf_counter()
            row = {"epoch": epoch + 1, "train_seconds": (self.t_train or end) - self.t0,
                   "seconds": end - self.t0}
            self.epochs.append(row)
            if on_epoch:
                on_epoch({**row, "epochs": n_epochs, **{k: float(v) for k, v in (logs or {}).items()}})

    return EpochTimer()


def classify_error(exc: BaseException) -> str:
    """'oom' for running out of memory (device or host), else 'failed'."""
    import tensorflow as tf

    if isinstance(exc, (tf.errors.ResourceExhaustedError, MemoryError)):
        return "oom"
    return "oom" if looks_like_oom(str(exc)) else "failed"


def looks_like_oom(text: str) -> bool:
    markers = ("ResourceExhausted", "OOM when allocating", "out of memory", "std::bad_alloc",
               "MemoryError", "Cannot allocate memory")
    return any(m in text for m in markers)


def _child_main(spec_path: str, result_path: str) -> int:
    """Run the trial in SPEC, write its record (or its error) to RESULT atomically."""
    spec = json.loads(Path(spec_path).read_text())
    cfg = TrialConfig.from_dict(spec["config"])

    def report(row):
        print(PROGRESS_PREFIX + json.dumps(row), flush=True)

    try:
        record = run_trial(cfg, Path(spec["data_dir"]), on_epoch=report)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded trial status
        record = {"status": classify_error(exc), "config": spec["config"],
                  "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
                  "traceback": traceback.format_exc()[-8000:]}
    tmp = Path(result_path + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
