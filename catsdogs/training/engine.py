"""The engine: what a worker runs. A task comes in as a typed message and ends in its typed record
(catsdogs.messages); a task's exception is its record's status (`failed`, or `oom`), never the
worker's end (`run_task`).

A trial (`run_trial`) trains the article's model on its configuration and tests it: the step
the worker keeps for its shape (catsdogs.training.steps, reset to the trial's starting state:
results bit-identical to a fresh process), its epochs timed by `EpochTimer` (catsdogs.training.timer),
the gradient noise scale measured between them when asked (`noise_estimate_at`, outside every clock), the trained
weights named by their digest. A probe, the matmul peak and the memory plan are
catsdogs.training.probes'.

The engine runs inside a worker process (catsdogs.training.child) once its backend has started,
so Keras is imported here at the top.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace
from pathlib import Path

import keras
import numpy as np

from catsdogs import config, gradient_noise, targets
from catsdogs.data import folder as folder_data
from catsdogs.data import loading
from catsdogs.errors import CatsdogsError
from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling
from catsdogs.host import environment
from catsdogs.messages import (
    MemoryPlanTask,
    ModelCheckTask,
    PeakTask,
    ProbeTask,
    Task,
    TrialRecord,
    TrialTask,
)
from catsdogs.runtime import backends
from catsdogs.schema import Status, TrialConfig, learning_rate, plan_steps
from catsdogs.training import steps
from catsdogs.training.curve import Curve, TrainingStopped
from catsdogs.training.diagnosis import initial_diagnosis, test_and_diagnose
from catsdogs.training.probes import run_memory_plan, run_model_check, run_peak, run_probe
from catsdogs.training.timer import EpochTimer, FitCallbacks


def run_task(task: Task, emit=lambda kind, payload: None):
    """Run one task with its handler (`HANDLERS`); always return its record with a status: a task's
    exception is its outcome (failed, or oom), never the worker's end. `emit("progress", row)`
    reports a trial's epochs, and when a probe's timed steps run (run_probe). A task of a type with
    no handler is a TypeError: a message this engine does not know, never run as another kind."""
    handler = HANDLERS.get(type(task))
    if handler is None:
        raise TypeError(f"the engine has no handler for a {type(task).__name__}")
    try:
        return handler(task, emit)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded status
        return task.RECORD(**backends.failure_fields(exc))


def _run_trial_task(task: TrialTask, emit) -> TrialRecord:
    sampling = NoiseSampling(**task.noise_sampling) if task.noise_sampling else None
    key = task.config.key()
    on_digest = (lambda value, error: emit("digest", {"key": key, "digest": value, "error": error})
                 ) if task.defer_digest else None
    return run_trial(task.config, Path(task.data_dir), on_epoch=lambda row: emit("progress", row),
                     noise_sampling=sampling, eval_every=task.eval_every, user=task.user,
                     on_digest=on_digest, decoded=task.decoded)


# Each task type's handler, (task, emit) -> its record: one entry a kind of messages.TASKS
HANDLERS = {
    TrialTask: _run_trial_task,
    ProbeTask: run_probe,
    PeakTask: lambda task, emit: run_peak(task),
    MemoryPlanTask: lambda task, emit: run_memory_plan(task),
    ModelCheckTask: lambda task, emit: run_model_check(task),
}


# --- a trial -----------------------------------------------------------------------------------


def run_trial(cfg: TrialConfig, data_dir: Path, on_epoch=None, noise_sampling: NoiseSampling | None = None,
              eval_every: int | None = None, user: dict | None = None, on_digest=None,
              decoded: str | None = None) -> TrialRecord:
    """Train and test one configuration; return its record (status done). `user`: a user's model
    trained instead of the article's (TrialTask.user), on its folder's images or the prepared data
    (`_start`); its record has no collapse diagnosis (that reads the article's hidden layer). With
    `noise_sampling`, the gradient noise scale is measured at the start and at each epoch's end
    (`noise_estimate_at`), outside the epochs' clocks and without touching what the trial trains
    with. With `eval_every`
    (or the trial's own, with a target), the validation curve (catsdogs.training.curve), and a
    trial with a target stops at the evaluation that reaches it. With `on_digest`, the record comes
    without its weights' digest (`digest_pending`) and `on_digest(digest, error)` gets it from the
    digest's thread once hashed (`DIGESTS` holds that thread until then). `decoded`: the prepared
    data decoded by the parent (TrialTask.decoded), read where it holds their fingerprint."""
    cfg.check()
    started = time.time()
    backend = backends.current()
    compiled_before, (train, val, test) = _start(cfg, Path(data_dir), backend, user, decoded)
    per_epoch, epochs = plan_steps(cfg, len(train))
    built = time.time()
    step, reused = steps.STEPS.get(cfg, per_epoch, backend, user=(user["model"], user["loss"]) if user else None)
    setup_seconds = time.time() - built
    model = step.model
    train, val, test = (steps.as_model_input(split, model) for split in (train, val, test))

    train_ds = backend.train_batches(train, cfg.batch_size, cfg.seed, n_batches=per_epoch * epochs,
                                     cross_epochs=cfg.budget == "steps")
    evaluate_at = eval_batch_size()
    val_ds = backend.eval_batches(val, evaluate_at) if len(val) else None
    test_ds = backend.eval_batches(test, evaluate_at)

    def measure(epoch: int) -> NoiseEstimate:
        return noise_estimate_at(step, train, noise_sampling, cfg.seed, epoch, backend)

    def measure_after(epoch: int) -> dict:
        return measure(epoch).to_record() if noise_sampling.measures(epoch) else {}

    validate = None if val_ds is None or backend.FIT_VALIDATES else \
        (lambda: backend.evaluate(model, val_ds, step.compiled))  # (JAX: the timer validates each epoch)
    timer = EpochTimer(epochs, on_epoch, backend.wait_for_steps, after_epoch=measure_after if noise_sampling else None,
                       validate=validate)
    curve = _curve(cfg, cfg.eval_every if cfg.until else eval_every, per_epoch, epochs, val_ds, timer, backend,
                   start_key=(step.user, cfg.image_size, cfg.precision, cfg.seed, cfg.data, cfg.dataset),
                   compiled=step.compiled)
    with step.strategy.scope():  # JAX's trainer reads its distribution when fit runs
        initial = initial_diagnosis(step, cfg, test_ds)  # the model as it starts (changes nothing)
        initial_noise = measure(0) if noise_sampling and noise_sampling.measures(0) else None
        fit_started = time.time()
        hist = _fit(model, train_ds, val_ds if backend.FIT_VALIDATES else None, epochs, per_epoch, timer, curve)
        fit_seconds = time.time() - fit_started
        digest_started = time.perf_counter()
        digest = start_weights_digest(model, then=on_digest)  # hashed while the trial evaluates and tests
        digest_seconds = time.perf_counter() - digest_started
        test_loss, test_acc, final = test_and_diagnose(step, test_ds, test.labels)  # one pass over the test set

    updates = int(keras.ops.convert_to_numpy(model.optimizer.iterations))  # Keras counts updates, not batches
    batches = sum(e.get("batches", per_epoch) for e in timer.epochs)  # what fit ran: full batches only
    history = _history(hist, timer)
    memory = backend.peak_memory()
    waited = time.perf_counter()
    digest_value = digest() if on_digest is None else None
    digest_seconds += time.perf_counter() - waited
    return TrialRecord(digest_pending=on_digest is not None or None,
        status=Status.DONE, test_accuracy=float(test_acc), test_loss=float(test_loss),
        val_accuracy=history[-1].get("val_accuracy") if history else _last(curve, "val_accuracy"),
        **final, **initial, history=history, **_noise_fields(noise_sampling, initial_noise, history), **_curve_fields(curve, cfg),
        steps=updates, batches=batches, learning_rate=learning_rate(cfg),
        n_train=len(train), n_validation=len(val), n_test=len(test),
        **_timings(timer, cfg.batch_size, batches, fit_seconds, setup_seconds),
        step_reused=reused, **_compiled_since(backend, compiled_before),
        peak_memory_mb=round(memory["peak_memory_mb"], 1), memory_kind=memory["memory_kind"],
        replicas=step.strategy.num_replicas_in_sync, weights_digest=digest_value,
        digest_seconds=round(digest_seconds, 4), wall_seconds=round(time.time() - started, 3),
        env=environment(backend))


def eval_batch_size() -> int:
    """The batch size every trial validates and tests at, whatever it trains at (its validation
    curve too): config.EVAL_BATCH_SIZE. Evaluation changes no weight and each image's prediction is
    its own, so accuracies are the same at any batch size (a loss's mean differs in float32
    rounding only), while a small training batch would make evaluation pay Keras's per-step
    overhead many times over. One size for all also makes the model as it starts evaluate alike in
    every trial of a seed (`initial_diagnosis`), and a model handed in as a user's alike to the
    built-in one."""
    return config.EVAL_BATCH_SIZE


def _curve(cfg: TrialConfig, every: int | None, per_epoch: int, epochs: int, val_ds, timer: EpochTimer,
           backend, start_key: tuple | None = None, compiled: dict | None = None) -> Curve | None:
    """The trial's validation curve every `every` training images, stopping at its target if it has one."""
    if not every:
        return None
    if val_ds is None:  # (no validation split)
        raise CatsdogsError("--eval-every evaluates the validation split, and this data set has none: "
                            "prepare it with a validation share (--split)")
    target = targets.parse(cfg.until) if cfg.until else None
    capped = cfg.max_steps if cfg.max_steps and cfg.max_steps < per_epoch * epochs else None  # (else: the epochs end it)
    return Curve(every, cfg.batch_size, cfg.accumulate, per_epoch, val_ds, timer, backend, target, epochs=epochs,
                 start_key=start_key, stop_at=capped, compiled=compiled, stop_at_chance=cfg.stop_at_chance)


def _fit(model, train_ds, val_ds, epochs: int, per_epoch: int, timer: EpochTimer, curve: Curve | None):
    """Keras's fit, with the curve beside the timer; the history of its full epochs (None when a
    target was met before the first step). A target or a step cap met mid-epoch ends fit there (TrainingStopped):
    the partial epoch joins the timer's epochs, with its running loss and accuracy, the last
    point's validation figures, and the noise scale where it is measured."""
    if curve is not None and curve.start(model):
        return None
    callbacks = FitCallbacks([timer] if curve is None else [timer, curve], add_history=True, model=model,
                             epochs=epochs, steps=per_epoch)  # (the timer closes an epoch first)
    try:
        return model.fit(train_ds, validation_data=val_ds, epochs=epochs, steps_per_epoch=per_epoch,
                         callbacks=callbacks, shuffle=False, verbose=0)  # the dataset shuffles
    except TrainingStopped:
        point = curve.points[-1]
        timer.end_partial(point["train_seconds"], curve.stopped_at - len(timer.epochs) * per_epoch,
                          {**_running_metrics(model), "val_loss": point["val_loss"],
                           "val_accuracy": point["val_accuracy"]})
        return model.history


def _running_metrics(model) -> dict:
    """The compiled metrics' values now: mid-epoch, the epoch's running loss and accuracy."""
    return {k: float(v) for k, v in model.get_metrics_result().items()}


def _last(curve: Curve | None, key: str):
    return curve.points[-1][key] if curve and curve.points else None


def _curve_fields(curve: Curve | None, cfg: TrialConfig) -> dict:
    if curve is None:
        return {}
    return {"curve": curve.points, "eval_seconds": round(curve.seconds, 4),
            **targets.record_fields(curve.points, cfg.until)}


def _start(cfg: TrialConfig, data_dir: Path, backend, user: dict | None = None,
           decoded: str | None = None) -> tuple[dict | None, tuple]:
    """Every check a trial passes before anything is built, its backend started on the way:
    (the backend's compile counts before the trial, the (train, validation, test) splits)."""
    if cfg.backend != backend.NAME:
        raise CatsdogsError(f"this trial was planned for KERAS_BACKEND={cfg.backend}, and this worker "
                            f"runs {backend.NAME}: run the sweep with KERAS_BACKEND={cfg.backend}")
    backend.start()
    backends.check_settings(cfg, backend.running_settings())
    compiled_before = backend.compile_counts()
    if user and user.get("data_folder"):  # a user's folder: a fixed tenth of it tests, no validation
        images = steps.DATA.load_folder(user["data_folder"], user["input_spec"])
        if user.get("validation"):  # a race's trial: a tenth of the rest validates too (its target's)
            splits = dict(zip(("train", "validation", "test"), folder_data.race_splits(images), strict=True))
        else:
            train, test = folder_data.holdout(images)
            splits = {"train": train, "validation": loading.Split(train.images[:0], train.labels[:0], []), "test": test}
    else:
        manifest, splits = steps.DATA.load(data_dir, cfg.dataset, expect=cfg.data, decoded=decoded)
        if manifest["params"]["size"] != cfg.image_size:
            raise CatsdogsError(f"data in {data_dir} is {manifest['params']['size']} px, trial wants {cfg.image_size}")
    train = splits["train"]
    if len(train) // cfg.batch_size == 0:
        raise CatsdogsError(f"batch size {cfg.batch_size} is larger than the {len(train)} training "
                            "images: not one full batch to train on")
    return compiled_before, (train, splits["validation"], splits["test"])


def _history(hist, timer: EpochTimer) -> list[dict]:
    """Per epoch: what fit logged (loss, accuracy, val_loss, val_accuracy), the timer's clocks,
    and the noise scale where it was measured; an epoch a target ended is the timer's alone."""
    logged = hist.history if hist is not None else {}
    history = []
    for i, clocks in enumerate(timer.epochs):
        row = {k: float(v[i]) for k, v in logged.items() if i < len(v)}
        row.update(clocks)
        history.append(row)
    return history


def _noise_fields(sampling: NoiseSampling | None, initial: NoiseEstimate | None, history: list[dict]) -> dict:
    """The record's noise scale: the start's estimate in full (None when the sampling starts
    later), the last epoch's in the store's columns (NoiseEstimate.to_record's names), and the
    time every measurement took."""
    if sampling is None:
        return {}
    last = NoiseEstimate.from_record(history[-1], initial) if history else None
    columns = {k: v for k, v in last.to_record().items() if k in RECORD_COLUMNS} if last else {}
    seconds = (initial.seconds if initial else 0.0) + sum(h.get("noise_seconds") or 0 for h in history)
    return {"initial_noise": initial.as_dict() if initial else None, **dict.fromkeys(RECORD_COLUMNS), **columns,
            "noise_seconds": round(seconds, 4)}


# The last measurement's fields that are columns of the trial's own row (the rest stay in its history).
RECORD_COLUMNS = ("noise_scale", "noise_scale_low", "noise_scale_high")


def _timings(timer: EpochTimer, batch_size: int, batches: int, fit_seconds: float, setup_seconds: float) -> dict:
    train_seconds = timer.finished_train_seconds
    return {"train_seconds": round(train_seconds, 4), "fit_seconds": round(fit_seconds, 4),
            "setup_seconds": round(setup_seconds, 4),
            "images_per_second": batches * batch_size / train_seconds if train_seconds else None}


def _compiled_since(backend, before: dict | None) -> dict:
    """The XLA compilations and compile-cache loads since `before` (nothing where there are none)."""
    if before is None:
        return {}
    after = backend.compile_counts()
    return {"compiles": after["compiles"] - before["compiles"],
            "compile_cache_hits": after["cache_hits"] - before["cache_hits"]}


# --- the weights' digest ---------------------------------------------------------------------------


def weights_digest(model) -> str:
    """BLAKE2b of every weight's bytes, in order: names the trained model exactly."""
    return start_weights_digest(model)()


DIGESTS: list[threading.Thread] = []  # digests still being hashed for a trial already answered (`then`)


def start_weights_digest(model, then=None):
    """Begin the weights digest off the trial's critical path; return the function that waits for
    it and gives it. With `then`, the thread also calls `then(digest, None)` when done (or
    `then(None, error)`), and stays in DIGESTS until it has: the worker waits for them before it
    ends.

    The weights are taken here, as the values they hold now (backends.*.weight_values: a device
    copy on JAX, whose trainer donates the weights' own buffers to the next step it runs; a read
    on TensorFlow, which a later assignment leaves as it was), never the variables themselves.
    A thread copies each to the host once and hashes it where it lies (hashlib releases the GIL
    for large buffers; no second copy), while the trial evaluates and tests. The value is the
    same as hashing each weight's bytes in order, as catsdogs always has (tests/training/test_engine.py)."""
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
        if then is not None:
            error = box.get("error")
            then(box.get("digest"), f"{type(error).__name__}: {error}" if error else None)

    thread = threading.Thread(target=digest, name="weights-digest", daemon=True)
    if then is not None:
        DIGESTS[:] = [t for t in DIGESTS if t.is_alive()] + [thread]
    thread.start()

    def result() -> str:
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["digest"]

    return result


# --- the gradient noise scale -----------------------------------------------------------------

# Images whose per-example gradients one call of the noise measurement holds: enough for an
# efficient batch, few enough that 200 px activations and conv windows stay within a few GB.
GRAM_EXAMPLES = 128


def noise_estimate_at(step: steps.TrainingStep, split, sampling: NoiseSampling, seed: int, epoch: int,
                  backend) -> NoiseEstimate:
    """B_simple at the model's current weights (catsdogs.gradient_noise): `sampling.pairs` large
    batches drawn with replacement from the training split by the noise's own generator (seed,
    epoch); each one's per-example gradient Gram matrix from the backend
    (catsdogs.runtime.backends.per_example), up to GRAM_EXAMPLES images a call, gives its micro-batches'
    and its own squared norms. Nothing the trial trains with moves: not its batches, weights,
    optimizer, metrics or random state. The estimate knows its epoch and how long it took.

    A user's model has layers the per-example products do not cover: there each micro-batch's
    ordinary gradient is formed (backend.micro_gradient_gram: the paper's two-batch estimator, a
    gradient computation per micro-batch), and the Gram matrix of the micro-batches' gradients
    gives the same two squared norms. With BatchNormalization a micro-batch's gradient depends on
    its other examples: its micro-batches hold at least 2, and 8 where the model has it (noise_run.user_noise_sampling)."""
    started = time.perf_counter()
    indices = gradient_noise.draw(len(split), sampling, seed, epoch).reshape(sampling.pairs, sampling.large)
    per_call = max(d for d in range(1, sampling.pairs + 1)  # equal calls: one compiled shape
                   if sampling.pairs % d == 0 and d * sampling.large <= max(GRAM_EXAMPLES, sampling.large))
    chunks = [indices[i:i + per_call].ravel() for i in range(0, sampling.pairs, per_call)]
    if step.user:  # any model: the two-batch estimator on ordinary gradients, each micro-batch a unit
        grams = [backend.micro_gradient_gram(step.model, step.loss, split.images[chunk], split.labels[chunk],
                                             sampling.micro, sampling.micros, cache=step.compiled)
                 for chunk in chunks]
        small, large = gradient_noise.norms_from_gram(np.concatenate(grams), 1)
    else:
        grams = [backend.per_example_gram(step.model, split.images[chunk], split.labels[chunk], sampling.large,
                                          cache=step.compiled) for chunk in chunks]
        small, large = gradient_noise.norms_from_gram(np.concatenate(grams), sampling.micro)
    estimate = gradient_noise.estimate(small, large, sampling.micro, sampling.large, epoch=epoch)
    return replace(estimate, seconds=round(time.perf_counter() - started, 4))
