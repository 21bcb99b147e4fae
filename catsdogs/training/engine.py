"""The engine: the article's model trained and tested (a trial) or timed (a probe).

Both are built by one class (`TrainingStep`): the same model, optimizer
implementation (the backend's), precision, determinism settings and input pipeline, run by the
same `model.fit`. A trial runs its protocol's epochs and tests; a probe runs a few steps and
times each. They differ only in how many steps they run and what they record.

The engine runs inside a worker process (catsdogs.training.worker), which keeps between tasks:
- every prepared data set it has decoded, checked against the manifest's fingerprint before
  each task, so data re-prepared under a worker is decoded again, never used stale;
- the compiled training step of each trial shape it has run (`TrialConfig.shape()`: model,
  optimizer, batch size and protocol; not the seed or the data set), up to a memory budget.
  A trial of a known shape gets the weights a freshly built model of its seed has and zeroed
  optimizer state, so its result is bit-identical to the same trial in a fresh process
  (tests/test_engine.py), without building, compiling and tracing again.

Every task comes in as a typed message and ends in its typed record (catsdogs.messages); a
task's exception is its record's status (`failed`, or `oom`), never the worker's end.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import traceback
from collections import OrderedDict
from pathlib import Path

from catsdogs import noise
from catsdogs.data import loading
from catsdogs.errors import CatsdogsError
from catsdogs.host import NvmlSampler, environment, rss_mb
from catsdogs.manifest import require_prepared
from catsdogs.messages import (
    MemoryPlan,
    MemoryPlanTask,
    PeakRecord,
    PeakTask,
    ProbeRecord,
    ProbeTask,
    Task,
    TrialRecord,
    TrialTask,
)
from catsdogs.schema import Status, TrialConfig, learning_rate, plan_steps
from catsdogs.training import backends
from catsdogs.training.costs import OPTIMIZER_SLOTS, parameter_count, train_flops_per_image
from catsdogs.training.model import build_model, loss_and_metrics

# The compiled steps a worker keeps: at most this share of the memory that holds them (the
# GPU's, else the host's). At 200 px one Adam step holds ~0.66 GB (weights, gradients, two
# slots), so a 24 GiB host keeps 9 of the article's 14 shapes.
STEP_CACHE_SHARE = 0.25
STEP_CACHE_BYTES_ENV = "CATSDOGS_STEP_CACHE_BYTES"  # overrides the share, in bytes (0: no cache)


class DataCache:
    """Decoded data sets by (folder, data set), each with the fingerprint it was decoded at."""

    def __init__(self):
        self._sets: dict[tuple[str, str], tuple[str, dict]] = {}

    def load(self, data_dir: Path, dataset: str, expect: str = "") -> tuple[dict, dict[str, loading.Split]]:
        """(manifest, splits). `expect`: the fingerprint the task was planned on; data that
        changed since is an error, and data that changed since it was cached is decoded again."""
        manifest = require_prepared(Path(data_dir))
        fingerprint = manifest["fingerprint"][dataset]
        if expect and fingerprint != expect:
            raise CatsdogsError(f"the data in {data_dir} changed since this trial was planned "
                                "(re-prepared?): plan the sweep again")
        key = (str(Path(data_dir).resolve()), dataset)
        cached = self._sets.get(key)
        if cached is None or cached[0] != fingerprint:
            self._sets[key] = (fingerprint, loading.load_dataset(Path(data_dir), dataset))
            # a file replaced mid-read: the fingerprint is checked once more after decoding
            if require_prepared(Path(data_dir))["fingerprint"][dataset] != fingerprint:
                del self._sets[key]
                raise CatsdogsError(f"the data in {data_dir} changed while it was being read")
        return manifest, self._sets[key][1]


class TrainingStep:
    """A compiled model of one shape, and how to give it a new trial's starting state."""

    def __init__(self, cfg: TrialConfig, steps_per_epoch: int, backend):
        import keras

        self.shape = shape_of(cfg, steps_per_epoch)
        self.trial_shape = repr(cfg.shape())  # what a sweep knows of it (Worker.shapes)
        self.strategy = backend.distribution(cfg.strategy)
        keras.mixed_precision.set_dtype_policy(cfg.precision)
        keras.utils.set_random_seed(cfg.seed)
        with self.strategy.scope():
            self.model = build_model(cfg.image_size)
            loss, metrics = loss_and_metrics()
            self.model.compile(optimizer=make_optimizer(cfg, steps_per_epoch, backend), loss=loss, metrics=metrics)
            self.model.optimizer.build(self.model.trainable_variables)
            self.inspect = inspection_model(self.model)
        self.gram_functions: dict = {}  # the noise measurement's compiled functions (backends.*.per_example_gram)
        # The optimizer's starting state: zeros (slots, iterations) but for a few scalars.
        self._opt_start = []
        for v in self.model.optimizer.variables:
            value = keras.ops.convert_to_numpy(v)
            self._opt_start.append(value if value.any() else None)
        self.nbytes = step_bytes(cfg)

    def reset(self, cfg: TrialConfig) -> None:
        """The state a freshly built model of `cfg.seed` starts from: its weights (drawn as a
        new process draws them), the optimizer's variables as built."""
        import keras
        import numpy as np

        keras.mixed_precision.set_dtype_policy(cfg.precision)
        keras.utils.set_random_seed(cfg.seed)
        fresh = build_model(cfg.image_size)
        for target, source in zip(self.model.weights, fresh.weights, strict=True):
            target.assign(source.value)
        del fresh
        for v, start in zip(self.model.optimizer.variables, self._opt_start, strict=True):
            v.assign(np.zeros(v.shape, v.dtype) if start is None else start)


def inspection_model(model):
    """The trained model's hidden Dense(128) activations and its logit, from the same weights:
    what `diagnose` reads a collapse from."""
    import keras

    hidden = next(layer for layer in reversed(model.layers[:-1]) if isinstance(layer, keras.layers.Dense))
    return keras.Model(model.inputs, [hidden.output, model.outputs[0]], name="inspect")


def diagnose(step: TrainingStep, batches, prefix: str = "") -> dict:
    """What the model does on every image of `batches` (the test set): whether it predicts one
    class for all of them (a collapse), and why it might.

    - dog_share: the share of images predicted Dog (logit > 0); 0 or 1 is a collapse;
    - dead_units: the share of the Dense(128) layer's ReLU units that output 0 for every image.
      With all 128 dead the logit is the last bias alone, the same for every image, and no
      gradient reaches the layers below: the model cannot leave the collapse;
    - logit_abs: the mean |logit|; a large one at step 0 means saturated sigmoids, a first
      gradient of the largest size, and a first Adam step that can push units dead;
    - logit_sd: how much the logit varies between images (0 for a constant prediction)."""
    import numpy as np

    hidden, logits = step.inspect.predict(batches, verbose=0)
    logits = np.asarray(logits, dtype=np.float64).ravel()
    alive = np.asarray(hidden).reshape(len(logits), -1).max(axis=0) > 0
    share = float((logits > 0).mean())
    out = {"dog_share": share, "dead_units": float(1 - alive.mean()),
           "logit_abs": float(np.abs(logits).mean()), "logit_sd": float(logits.std())}
    if not prefix:
        out["collapsed"] = int(share in (0.0, 1.0))
    return {prefix + k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


def shape_of(cfg: TrialConfig, steps_per_epoch: int) -> tuple:
    """The compiled step's identity; a warm-up schedule's length is compiled into it."""
    return (*cfg.shape(), ("steps_per_epoch", steps_per_epoch if cfg.warmup_epochs else None))


def step_bytes(cfg: TrialConfig) -> int:
    """Memory a kept step holds: weights, gradients and the optimizer's slots, float32."""
    return 4 * parameter_count(cfg.image_size) * (2 + OPTIMIZER_SLOTS[cfg.optimizer])


def make_optimizer(cfg: TrialConfig, steps_per_epoch: int, backend):
    import keras

    lr = learning_rate(cfg)
    warmup = int(round(cfg.warmup_epochs * steps_per_epoch / cfg.accumulate))
    if warmup > 0:
        lr = keras.optimizers.schedules.PolynomialDecay(  # a linear ramp 0 -> lr, then flat
            initial_learning_rate=lr / warmup, decay_steps=warmup, end_learning_rate=lr, power=1.0)
    kwargs = {"learning_rate": lr}
    if cfg.accumulate > 1:
        kwargs["gradient_accumulation_steps"] = cfg.accumulate
    return backend.optimizer_class(cfg.optimizer, cfg.strategy)(**kwargs)


class StepCache:
    """Compiled steps by shape, least recently used first out, within a byte budget."""

    def __init__(self):
        self._steps: OrderedDict[tuple, TrainingStep] = OrderedDict()
        self.budget: int | None = None

    def shapes(self) -> list[str]:
        """The trial shapes (`repr(TrialConfig.shape())`) whose steps are kept."""
        return [step.trial_shape for step in self._steps.values()]

    def get(self, cfg: TrialConfig, steps_per_epoch: int, backend, keep_others: bool = True) -> tuple[TrainingStep, bool]:
        """(step, reused): the shape's kept step reset to `cfg`'s start, or a new one."""
        shape = shape_of(cfg, steps_per_epoch)
        step = self._steps.get(shape)
        if step is not None:
            self._steps.move_to_end(shape)
            step.reset(cfg)
            return step, True
        if not keep_others:
            self.clear()
        budget = self._budget(backend)
        while self._steps and sum(s.nbytes for s in self._steps.values()) + step_bytes(cfg) > budget:
            self._steps.popitem(last=False)
        step = TrainingStep(cfg, steps_per_epoch, backend)
        if step.nbytes <= budget:
            self._steps[shape] = step
        return step, False

    def clear(self) -> None:
        import gc

        self._steps.clear()
        gc.collect()

    def _budget(self, backend) -> int:
        if self.budget is None:
            override = os.environ.get(STEP_CACHE_BYTES_ENV)
            if override is not None:
                self.budget = int(override)
            else:
                total = backend.memory_budget_bytes()
                self.budget = int(STEP_CACHE_SHARE * total) if total else 0
        return self.budget


# One of each per process: a worker's memory of what it has done.
DATA = DataCache()
STEPS = StepCache()


def weights_digest(model) -> str:
    """BLAKE2b of every weight's bytes, in order: names the trained model exactly."""
    return start_weights_digest(model)()


def start_weights_digest(model):
    """Begin the weights digest off the trial's critical path; return the function that waits for
    it and gives it.

    The weights are taken here, as the values they hold now (backends.*.weight_values: a device
    copy on JAX, whose trainer donates the weights' own buffers to the next step it runs; a read
    on TensorFlow, which a later assignment leaves as it was), never the variables themselves.
    A thread copies each to the host once and hashes it where it lies (hashlib releases the GIL
    for large buffers; no second copy), while the trial evaluates and tests. The value is the
    same as hashing each weight's bytes in order, as catsdogs always has (tests/test_engine.py)."""
    import threading

    import keras
    import numpy as np

    values = backends.current().weight_values(model)
    box: dict = {}

    def digest() -> None:
        try:
            h = hashlib.blake2b(digest_size=16)
            for value in values:
                h.update(memoryview(np.ascontiguousarray(keras.ops.convert_to_numpy(value))).cast("B"))
            box["digest"] = h.hexdigest()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            box["error"] = exc

    thread = threading.Thread(target=digest, name="weights-digest", daemon=True)
    thread.start()

    def result() -> str:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["digest"]

    return result


# --- a trial -----------------------------------------------------------------------------------


def run_trial(cfg: TrialConfig, data_dir: Path, on_epoch=None,
              noise_settings: noise.NoiseSettings | None = None) -> TrialRecord:
    """Train and test one configuration; return its record (status done). With `noise_settings`,
    the gradient noise scale is measured at the start and at each epoch's end (`measure_noise`),
    outside the epochs' clocks and without touching what the trial trains with."""
    import keras

    cfg.check()
    started = time.time()
    backend = backends.current()
    if cfg.backend != backend.NAME:
        raise CatsdogsError(f"this trial was planned for KERAS_BACKEND={cfg.backend}, and this worker "
                            f"runs {backend.NAME}: run the sweep with KERAS_BACKEND={cfg.backend}")
    backend.start()
    backends.check_settings(cfg, backend.running_settings())
    compiled_before = backend.compile_counts()
    manifest, splits = DATA.load(Path(data_dir), cfg.dataset, expect=cfg.data)
    if manifest["params"]["size"] != cfg.image_size:
        raise CatsdogsError(f"data in {data_dir} is {manifest['params']['size']} px, trial wants {cfg.image_size}")
    train, val, test = splits["train"], splits["validation"], splits["test"]
    if len(train) // cfg.batch_size == 0:
        raise CatsdogsError(f"batch size {cfg.batch_size} is larger than the {len(train)} training "
                            "images: not one full batch to train on")
    per_epoch, epochs = plan_steps(cfg, len(train))
    built = time.time()
    step, reused = STEPS.get(cfg, per_epoch, backend)
    model = step.model
    setup_seconds = time.time() - built

    train_ds = backend.train_batches(train, cfg.batch_size, cfg.seed, n_batches=per_epoch * epochs,
                                     cross_epochs=cfg.budget == "steps")
    val_ds = backend.eval_batches(val, cfg.batch_size) if len(val) else None
    test_ds = backend.eval_batches(test, cfg.batch_size)
    measure = None
    if noise_settings:
        def measure(epoch: int) -> dict:
            return measure_noise(step, train, noise_settings, cfg.seed, epoch, backend)
    timer = _epoch_timer(epochs, on_epoch, backend.wait_for_steps,
                         after_epoch=(lambda epoch: history_fields(measure(epoch))) if measure else None)
    with step.strategy.scope():  # JAX's trainer reads its distribution when fit runs
        initial = diagnose(step, test_ds, prefix="initial_")  # the model as it starts (changes nothing)
        initial_noise = measure(0) if measure else None
        fit_started = time.time()
        hist = model.fit(train_ds, validation_data=val_ds, epochs=epochs, steps_per_epoch=per_epoch,
                         callbacks=[timer], shuffle=False, verbose=0)  # the dataset shuffles
        fit_seconds = time.time() - fit_started
        digest_started = time.perf_counter()
        digest = start_weights_digest(model)  # hashed while the trial evaluates and tests
        digest_seconds = time.perf_counter() - digest_started
        test_loss, test_acc = model.evaluate(test_ds, verbose=0)
        final = diagnose(step, test_ds)

    batches = per_epoch * len(hist.history["loss"])  # what fit ran: full batches only
    # Keras counts updates, not accumulated batches
    updates = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    history = []
    for i in range(len(hist.history["loss"])):
        row = {k: float(v[i]) for k, v in hist.history.items()}
        row.update(timer.epochs[i])
        history.append(row)
    train_seconds = sum(e["train_seconds"] for e in timer.epochs)
    last_noise = {}
    if initial_noise:
        last = history[-1] if history else {}
        last_noise = {"noise_scale": last.get("noise_scale"), "noise_scale_low": last.get("noise_scale_low"),
                      "noise_scale_high": last.get("noise_scale_high"),
                      "noise_seconds": round(initial_noise["seconds"] + sum(h.get("noise_seconds") or 0
                                                                            for h in history), 4)}
    memory = backend.peak_memory()
    waited = time.perf_counter()
    digest_value = digest()
    digest_seconds += time.perf_counter() - waited
    compiled = {}
    if compiled_before is not None:
        after = backend.compile_counts()
        compiled = {"compiles": after["compiles"] - compiled_before["compiles"],
                    "compile_cache_hits": after["cache_hits"] - compiled_before["cache_hits"]}
    return TrialRecord(
        status=Status.DONE,
        test_accuracy=float(test_acc),
        test_loss=float(test_loss),
        val_accuracy=history[-1].get("val_accuracy") if history else None,
        **final, **initial,
        history=history,
        initial_noise=initial_noise, **last_noise,
        steps=updates,
        batches=batches,
        learning_rate=learning_rate(cfg),
        n_train=len(train), n_validation=len(val), n_test=len(test),
        train_seconds=round(train_seconds, 4),
        fit_seconds=round(fit_seconds, 4),
        setup_seconds=round(setup_seconds, 4),
        step_reused=reused,
        **compiled,
        images_per_second=batches * cfg.batch_size / train_seconds if train_seconds else None,
        peak_memory_mb=round(memory["peak_memory_mb"], 1),
        memory_kind=memory["memory_kind"],
        replicas=step.strategy.num_replicas_in_sync,
        weights_digest=digest_value,
        digest_seconds=round(digest_seconds, 4),
        wall_seconds=round(time.time() - started, 3),
        env=environment(backend),
    )


def _epoch_timer(n_epochs: int, on_epoch, wait_for_steps=lambda model: None, after_epoch=None):
    """A callback timing the training and validation parts of each epoch, reporting each. The
    end of training is stamped after `wait_for_steps(model)`: a backend that dispatches steps
    asynchronously (JAX) would otherwise have its training end when the last step was queued.
    `after_epoch(epoch)` (1-based) runs once the epoch's clock has stopped, so its time is in
    neither `train_seconds` nor `seconds`, and its fields join the epoch's row: at `on_epoch_end`
    Keras's JAX trainer has put the weights back on the model, so they can be read."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[dict] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0, self.t_train = time.perf_counter(), None

        def on_test_begin(self, logs=None):  # validation starts: training of the epoch is over
            if self.t_train is None:
                wait_for_steps(self.model)
                self.t_train = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if self.t_train is None:  # no validation: training ends with the epoch
                wait_for_steps(self.model)
            end = time.perf_counter()
            row = {"epoch": epoch + 1, "train_seconds": (self.t_train or end) - self.t0,
                   "seconds": end - self.t0}
            if after_epoch:
                row.update(after_epoch(epoch + 1))
            self.epochs.append(row)
            if on_epoch:
                on_epoch({**row, "epochs": n_epochs, **{k: float(v) for k, v in (logs or {}).items()}})

    return EpochTimer()


# --- the gradient noise scale -----------------------------------------------------------------


def measure_noise(step: TrainingStep, split, settings: noise.NoiseSettings, seed: int, epoch: int,
                  backend) -> dict:
    """B_simple at the model's current weights (catsdogs.noise): `settings.pairs` large batches
    drawn with replacement from the training split by the noise's own generator (seed, epoch);
    each one's per-example gradient Gram matrix from the backend (catsdogs.training.per_example),
    up to GRAM_EXAMPLES images a call, gives its micro-batches' and its own squared norms.
    Nothing the trial trains with moves: not its batches, weights, optimizer, metrics or random
    state. {"epoch", the estimate's fields, "seconds"}."""
    import numpy as np

    started = time.perf_counter()
    indices = noise.draw(len(split), settings, seed, epoch).reshape(settings.pairs, settings.large)
    per_call = max(d for d in range(1, settings.pairs + 1)  # equal calls: one compiled shape
                   if settings.pairs % d == 0 and d * settings.large <= max(GRAM_EXAMPLES, settings.large))
    grams = [backend.per_example_gram(step.model, split.images[chunk], split.labels[chunk], settings.large,
                                      cache=step.gram_functions)
             for chunk in (indices[i:i + per_call].ravel() for i in range(0, settings.pairs, per_call))]
    small, large = noise.norms_from_gram(np.concatenate(grams), settings.micro)
    estimate = noise.estimate(small, large, settings.micro, settings.large)
    return {"epoch": epoch, **estimate, "seconds": round(time.perf_counter() - started, 4)}


# Images whose per-example gradients one call of the noise measurement holds: enough for an
# efficient batch, few enough that 200 px activations and conv windows stay within a few GB.
GRAM_EXAMPLES = 128


def history_fields(m: dict) -> dict:
    """A measurement as the fields of a trial's history row (its pairs' estimates as two lists,
    which a report pools over seeds: catsdogs.noise.pool)."""
    return {"noise_scale": m["b_simple"], "noise_scale_low": m["low"], "noise_scale_high": m["high"],
            "noise_gradient_sq": m["gradient_sq"], "noise_trace": m["trace"], "noise_seconds": m["seconds"],
            "noise_pair_gradient_sq": m["pair_gradient_sq"], "noise_pair_trace": m["pair_trace"]}


# --- a probe -----------------------------------------------------------------------------------


def run_probe(task: ProbeTask) -> ProbeRecord:
    """Warm up, then time `task.steps` training steps at one batch size; measure memory. Always a
    record: out of memory and failures are its status (oom, failed), with the error.

    The step is the sweep's (`TrainingStep`), fed by the sweep's pipeline: batches of the
    prepared train split, seeded permutations joined end to end (so a batch larger than the
    split holds every image at least once). Only this probe's step is kept in memory."""
    backend = backends.current()
    kind = backend.start()
    record = ProbeRecord(batch_size=task.batch_size, precision=task.precision, optimizer=task.optimizer,
                         dataset=task.dataset, steps=task.steps, warmup=task.warmup)
    sampler = NvmlSampler() if kind == "gpu" else None
    try:
        manifest, splits = DATA.load(Path(task.data_dir), task.dataset)
        size = manifest["params"]["size"]
        cfg = TrialConfig(task.optimizer, int(task.batch_size), task.dataset, task.seed, epochs=1,
                          image_size=size, data=manifest["fingerprint"][task.dataset],
                          precision=task.precision, deterministic=task.deterministic, tf32=task.tf32,
                          backend=backend.NAME)
        cfg.check()
        backends.check_settings(cfg, backend.running_settings())
        record.deterministic, record.tf32 = cfg.deterministic, cfg.tf32
        n = task.warmup + task.steps
        record.image_size, record.device, record.backend = size, backend.device_description(), backend.NAME
        record.baseline_rss_mb = rss_mb()  # before the model: runtime + data
        step, _ = STEPS.get(cfg, n, backend, keep_others=False)
        batches = backend.train_batches(splits["train"], cfg.batch_size, cfg.seed, n, cross_epochs=True)
        min_seconds = task.min_seconds
        if min_seconds is None:
            min_seconds = GPU_MIN_PROBE_SECONDS if kind == "gpu" else 0.0
        timer = _step_timer(task.warmup, sampler.start if sampler else None, task.steps, min_seconds)
        with step.strategy.scope():  # the same batches again until the timed steps last min_seconds
            step.model.fit(batches, epochs=MAX_PROBE_EPOCHS if min_seconds else 1, steps_per_epoch=n,
                           callbacks=[timer], shuffle=False, verbose=0)
        nvml = sampler.stop() if sampler else {}
        times = timer.times
        median, mean = statistics.median(times), statistics.fmean(times)
        _fill(record, status=Status.DONE, step_time_median_s=median, step_time_mean_s=mean,
              step_times_s=times, timed_steps=len(times), timed_seconds=sum(times),
              images_per_second=cfg.batch_size / median,
              flops_per_second=train_flops_per_image(size) * cfg.batch_size / median, **nvml)
    except Exception as exc:  # noqa: BLE001 - out of memory and failures are recorded outcomes
        if sampler:
            _fill(record, **sampler.stop())
        _fill(record, **_failure(exc, backend))
        STEPS.clear()  # whatever the failed step allocated goes back before the next task
    _fill(record, **backend.peak_memory())
    return record


def _fill(record, **values):
    """Set fields of a record (dataclasses.replace would copy it)."""
    for k, v in values.items():
        setattr(record, k, v)


# NVML's utilization is the share of the last sample period (up to a second) in which a kernel
# ran: a probe of a few milliseconds reads a number that means little. On a GPU each probe's timed
# steps last at least this long (the probe's batches repeat as often as that needs).
GPU_MIN_PROBE_SECONDS = 2.0
MAX_PROBE_EPOCHS = 100_000  # a bound only: the step timer stops the probe


def _step_timer(warmup: int, on_timed_start=None, steps: int = 0, min_seconds: float = 0.0):
    """A callback timing each training step after `warmup` untimed ones; the loss is read back
    at each step's end, which waits for the device to finish the step. With `min_seconds`, it
    stops training at the end of the first pass over the batches (an epoch) after which at
    least `steps` steps were timed and they lasted `min_seconds`."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []
            self.step = 0

        def on_epoch_end(self, epoch, logs=None):
            if len(self.times) >= steps and sum(self.times) >= min_seconds:
                self.model.stop_training = True

        def on_train_batch_begin(self, batch, logs=None):
            if self.step == warmup and on_timed_start:
                on_timed_start()
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            float((logs or {}).get("loss", 0.0))  # synchronize
            if self.step >= warmup:
                self.times.append(time.perf_counter() - self.t0)
            self.step += 1

    return StepTimer()


def run_peak(task: PeakTask) -> PeakRecord:
    """The device's matmul peak in the precision's compute dtype."""
    backend = backends.current()
    backend.start()
    dtype = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}[task.precision]
    result = backend.matmul_peak(dtype, n=task.matmul_size, seconds=task.seconds)
    return PeakRecord(status=Status.DONE, device=backend.device_description(), precision=task.precision,
                      **result)


def run_memory_plan(task: MemoryPlanTask) -> MemoryPlan:
    """The largest batch size under `cap_bytes` by the compiler's memory plan (backends whose
    compiler states one: JAX), its baseline from a measured probe (`calibration_peak_bytes` at
    `calibration_batch`). Compiles the probe's step at a few batch sizes; runs nothing."""
    from catsdogs.training.costs import predict_max_batch_size_planned

    backend = backends.current()
    backend.start()
    if backend.compiled_step_bytes is None:
        raise CatsdogsError(f"{backend.NAME} states no memory plan: use catsdogs.training.costs' analytic model")
    manifest = require_prepared(Path(task.data_dir))
    size = manifest["params"]["size"]
    cfg = TrialConfig(task.optimizer, int(task.calibration_batch), task.dataset, 0, epochs=1,
                      image_size=size, data=manifest["fingerprint"][task.dataset],
                      precision=task.precision, deterministic=task.deterministic, tf32=task.tf32,
                      backend=backend.NAME)
    backends.check_settings(cfg, backend.running_settings())
    step, _ = STEPS.get(cfg, 1, backend, keep_others=False)
    with step.strategy.scope():
        prediction = predict_max_batch_size_planned(
            lambda b: backend.compiled_step_bytes(step.model, b, size), task.cap_bytes,
            cfg.batch_size, task.calibration_peak_bytes)
    return MemoryPlan(status=Status.DONE, **prediction)


# --- what a worker calls -------------------------------------------------------------------------


def _failure(exc: BaseException, backend=None) -> dict:
    status = Status.FAILED
    try:
        status = Status((backend or backends.current()).classify_error(exc))
    except Exception:  # noqa: BLE001 - the backend itself failed to load: failed
        pass
    return {"status": status, "error": f"{type(exc).__name__}: {exc}".strip()[:4000],
            "traceback": traceback.format_exc()[-8000:]}


def run_task(task: Task, emit=lambda kind, payload: None):
    """Run one task; always return its record with a status: a task's exception is its outcome
    (failed, or oom), never the worker's end. `emit("progress", row)` reports a trial's epochs."""
    try:
        if isinstance(task, TrialTask):
            settings = noise.NoiseSettings(**task.noise) if task.noise else None
            return run_trial(task.config, Path(task.data_dir), on_epoch=lambda row: emit("progress", row),
                             noise_settings=settings)
        if isinstance(task, ProbeTask):
            return run_probe(task)
        if isinstance(task, PeakTask):
            return run_peak(task)
        return run_memory_plan(task)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        return task.RECORD(**_failure(exc))
