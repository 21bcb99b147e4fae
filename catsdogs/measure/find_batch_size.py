"""The largest batch size that fits in memory, the fastest one, and which to train with: the
batch-size search (catsdogs.measure.search) run on this device, one probe at a time.

Every probe is a few training steps of the article's model at one batch size: the sweep's own
training step (catsdogs.training.probes.run_probe), run by catsdogs.measure.prober. A probe that
does not fit ends its worker, so one out-of-memory cannot poison the next probe (TensorFlow keeps
device memory after an out-of-memory error, and a process killed for memory takes nothing else
with it); a worker is reused only while the batch sizes grow, since its memory only grows. Each
probe ends done (it fits), oom or failed (schema.Status).

The memory cap: on a GPU its memory (or `--memory-limit` as a logical device); on the CPU
`--memory-limit` caps each probe's peak resident memory (the parent watches VmHWM and kills a
probe that goes over: catsdogs.training.worker), and without it 90% of the memory available when
the search starts. "Fits" means the probe's peak memory stayed under the cap.

The prediction comes first, after the batch-size-1 probe (the calibration) and before the search.
The article's model: on TensorFlow its step replayed through a model of the BFC allocator
(costs.predict_max_batch_size: on the CPU, the pages its growing regions have written), arithmetic
here; on JAX, whose compiler assigns buffers itself, XLA's plan of the step compiled in a worker
(costs.predict_max_batch_size_planned). Any other model: a line through the calibration and one
fresh probe of at most a quarter of the answer (`_predict_line`). This process imports no
framework. The prediction then sets which probes need a fresh
worker: every probe at or above search.FRESH_SHARE of the predicted limit (catsdogs.measure.prober
says why a reused worker cannot answer near the limit), and any that ran out of memory in a
reused one. After the search, the margin's size is probed too if it was not already ("confirm").

The statistics: before the search, the gradient noise scale B_simple (catsdogs.gradient_noise) is
measured past the first epoch's transient: two short runs at the base batch size (32), seeds
--seed and the next, trained 3 epochs each in one worker that ends before any probe runs, B_simple
measured after epochs 2 and 3 and pooled (`measure_noise_scale`). Its rounded-down value is probed
on the search's way up ("critical"), in the worker of the small sizes, so the recommendation
(catsdogs.goodput: the least predicted time to a target) has a probe at the statistics' limit.
`measure_noise=False` (--no-noise-scale) skips it.

Time: a probe in a reused worker takes a fraction of a second, one in a fresh worker seconds (on
TensorFlow most of it importing the framework). So the first probe's worker imports while the
noise scale's short runs train, the search probes the prediction rather than doubling past it
(catsdogs.measure.search.around_guess), and on the CPU fresh workers start two at a time
(catsdogs.measure.prober). The summary says where the time went ("seconds").
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from catsdogs import config
from catsdogs.errors import CatsdogsError
from catsdogs.files import write_json_atomic
from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling, pool
from catsdogs.host import host_memory_available, versions
from catsdogs.manifest import require_intact
from catsdogs.measure import model_check
from catsdogs.measure import prober as probers
from catsdogs.measure.common import (
    check_memory_floor,
    format_bytes,
    settings_note,
    write_csv,
)
from catsdogs.measure.find_summary import METHODS, probe_line, summary_lines, time_lines
from catsdogs.measure.search import (
    FindSettings,
    apply_margin,
    confirm,
    critical_probe,
    decide,
    fresh_threshold,
    percent_apart,
    search,
)
from catsdogs.messages import (
    MemoryPlanTask,
    ProbeRecord,
    ProbeTask,
    TrialRecord,
    TrialTask,
    columns,
)
from catsdogs.schema import Status, TrialConfig, default
from catsdogs.training import backends
from catsdogs.training.costs import (
    line_second_batch,
    predict_max_batch_size,
    predict_max_batch_size_line,
    predicted_peak_bytes,
)
from catsdogs.training.worker import Worker, run_isolated

CALIBRATION_BATCH = 1  # the tiny probe the memory model's runtime baseline comes from
HOST_CAP_FRACTION = 0.9
# find-batch-size's noise measurement, the one the recommendation rests on: larger pairs than a
# sweep's, over two short runs, past their first epoch (measure_noise_scale). A pair of 25 images
# gives |G|^2 from 600 products of two examples' gradients where a pair of 10 gives 90: for about
# the same images, intervals a third as wide (docs/results.md, "The noise scale find-batch-size
# decides with"; scripts/noise_spread.py).
NOISE_PAIRS = 2 * config.NOISE_PAIRS  # pairs a measurement: 16, so 64 pooled (2 epochs x 2 seeds)
NOISE_LARGE = 25  # images a pair (each its own micro-batch: B_s 1, B_b 25)
NOISE_EPOCHS = 3  # each short run's epochs: measured after the 2nd and 3rd, past the first's transient
NOISE_FROM = 2  # the first epoch whose measurement counts
NOISE_SEEDS = 2  # short runs, each its own seed: one seed's trajectory is one draw
# A user's model: the two-batch estimator on ordinary gradients (engine.noise_estimate_at), one
# gradient computation per micro-batch. Micro-batches of 2, the fewest BatchNormalization can
# normalize over (a "per-example" gradient is not defined through it), 12 to a pair: 16 pairs of
# 24 images, about the article's measurement's images (16 of 25), for 192 gradients a measurement.
USER_NOISE_MICRO = 2
USER_NOISE_MICROS = 12

PROBE_COLUMNS = columns(ProbeRecord, "search")  # find_batch_size.csv, and each probe in the .json


@dataclass(frozen=True)
class NoiseRun:
    """The noise scale measured before the search: B_simple at the base batch size over epochs
    `from_epoch` to `epochs` of runs at `seeds`, pooled (`estimate`)."""

    estimate: NoiseEstimate
    batch_size: int
    epochs: int = 1
    measure_seconds: float | None = None  # the measurements alone
    seconds: float | None = None  # the whole short run, its worker's start included
    seeds: list[int] | None = None
    from_epoch: int | None = None
    estimator: str | None = None  # a user's model's: "two-batch" (None: the article's per-example products)

    def as_json(self) -> dict:
        """As find_batch_size.json's "noise_scale" holds it."""
        e = self.estimate
        return ({"estimator": self.estimator} if self.estimator else {}) | {"b_simple": e.b_simple, "low": e.low, "high": e.high, "gradient_sq": e.gradient_sq,
                "trace": e.trace, "epochs": self.epochs, "batch_size": self.batch_size, "pairs": e.pairs, "small": e.small,
                "large": e.large, "measure_seconds": self.measure_seconds, "seconds": self.seconds,
                "seeds": self.seeds, "from_epoch": self.from_epoch, "measurements": e.measurements}


def find_batch_size(settings: FindSettings, data_dir: Path, out: Path = Path(config.DEFAULT_OUT),
                    log: Callable[[str], None] = print) -> dict:
    """Measure the noise scale, predict, search, recommend; write OUT/NAME/find_batch_size.json and
    .csv; return the summary (what the .json holds).

    Raises SettingError for impossible settings, CatsdogsError when the data is not prepared or
    when not even batch size 1 fits (after writing the records)."""
    settings.check()
    folder = Path(out) / settings.name
    work = folder / ".work"
    env = settings.environment()
    settings, manifest, size, user, probe_data = _model_and_data(settings, data_dir, work, env, log)
    folder.mkdir(parents=True, exist_ok=True)
    cpu_cap = None
    if settings.memory_cap_bytes is None:
        avail = host_memory_available()
        cpu_cap = int(HOST_CAP_FRACTION * avail) if avail else None
    started = time.perf_counter()
    log(_opening_line(settings, size, cpu_cap, user))
    if settings.anchor:
        a = settings.anchor
        log(f"Learning rate scaled from {a['store']}: the {a['kind']} sweep {a['sweep']!r}, tuned at batch sizes "
            f"{', '.join(map(str, sorted(int(b) for b in a['rates'])))}.")
    run = ProbeRun(settings, data_dir, work, cpu_cap, env, log, probe_data)
    try:
        # The statistics first, in a worker of its own that ends before any probe runs (the first
        # probe's worker imports its framework meanwhile, on the CPU): the probes' memory is not
        # touched, and the search can then probe the critical batch size on its way up.
        noise_run = None
        if settings.measure_noise and user and not probe_data.real:
            log("Noise scale: not measured: it needs real images (random ones carry no signal to measure): give "
                "--data DIR, or prepared data of the model's input size; the recommendation is speed's within memory.")
        elif settings.measure_noise:
            run.prober.prestart()
            noise_run = measure_noise_scale(data_dir, manifest, settings, work, env, log, probe_data=probe_data)
        calib = run.probe(CALIBRATION_BATCH, "calibrate")
        predicting = time.perf_counter()
        pred = _predict_first(run, calib, manifest, size, data_dir, work, env, log, user)
        predict_seconds = time.perf_counter() - predicting
        early = critical_probe(noise_run.estimate if noise_run else None, safe=None)
        result = search(lambda b: run.probe_on_the_way(b, early), mode=settings.mode, start=settings.start,
                        max_batch=settings.max_batch, resolution=settings.resolution,
                        guess=pred["max_batch_size"] if pred and settings.mode == "binsearch" else None)
        safe = apply_margin(result.largest_fit, settings.margin) if result.largest_fit is not None else None
        margin_failed: list[int] = []
        if safe is not None:  # the margin's size must pass itself: down the margin's grid until one does
            safe, margin_failed = confirm(lambda b: run.probe(b, "confirm").status, safe)
        critical = critical_probe(noise_run.estimate if noise_run else None, safe)
        if critical is not None:
            run.probe(critical, "critical")  # the statistics' limit, so the recommendation can stand on it
    finally:
        run.close()
    summary = decide(result, run.probes, safe, settings.optimizer, noise_run.estimate if noise_run else None,
                     settings.anchor)
    summary.update(margin_failed=margin_failed, noise_scale=noise_run.as_json() if noise_run else None,
                   settings=settings.recorded(size, cpu_cap, data_dir,
                                              manifest["fingerprint"][settings.dataset] if manifest else None),
                   backend=backends.name(), host=platform.node(),
                   prediction=_prediction(pred, calib, run, result, size),
                   memory_fraction=calib.memory_fraction,
                   probes=[p.view("search") for p in run.probes], versions=versions(),
                   seconds=_seconds(started, noise_run, predict_seconds, run.probes))
    if user:
        summary["model"] = {**model_check.recorded(user), **probe_data.record()}
    write_json_atomic(folder / "find_batch_size.json", summary, indent=2)
    write_csv(summary["probes"], folder / "find_batch_size.csv", PROBE_COLUMNS)
    for line in summary_lines(summary) + time_lines(summary):
        log(line)
    if result.largest_fit is None:
        first = run.probes[0]
        raise CatsdogsError(
            f"no batch size fits: batch size {first.batch_size} already {first.status}"
            f"{': ' + first.error.splitlines()[0] if first.error else ''} "
            f"(records in {folder / 'find_batch_size.json'})")
    return summary


def _seconds(started: float, noise_run: NoiseRun | None, predict_seconds: float, probes: list[ProbeRecord]) -> dict:
    """Where the command's time went: the noise scale's short runs, the memory model's prediction,
    the probes (each with its worker's start), and the whole answer."""
    return {"noise_scale": noise_run.seconds if noise_run else None, "prediction": round(predict_seconds, 2),
            "probes": round(sum(p.wall_seconds or 0.0 for p in probes), 2),
            "total": round(time.perf_counter() - started, 2)}


def _model_and_data(settings: FindSettings, data_dir: Path, work: Path, env: dict, log):
    """(the settings with the model's canonical reference, the prepared data's manifest or None,
    the image size, the user's model's ModelInfo or None, what its probes run on or None): a
    user's model is built and checked in a worker first (catsdogs.measure.model_check)."""
    model_check.check_options(settings.model, settings.loss, settings.images, settings.precision)
    if settings.model is None:
        manifest = require_intact(Path(data_dir))
        size = manifest["params"]["size"]
        check_memory_floor(settings.memory_cap_bytes, size, settings.optimizer, settings.precision)
        return settings, manifest, size, None, None
    ref, user = model_check.check_user_model(settings.model, settings.loss, work / "model-check.log", env)
    probe_data = model_check.data_for(user, data_dir, Path(settings.images) if settings.images else None)
    log(f"Your {model_check.describe(user)}; on {probe_data.said}.")
    return replace(settings, model=ref), probe_data.manifest, user.input_shape[0], user, probe_data


def _opening_line(s: FindSettings, size: int, cpu_cap: int | None, user=None) -> str:
    cap_text = (f"each probe capped at {format_bytes(s.memory_cap_bytes)}" if s.memory_cap_bytes else
                "on a GPU its memory is the cap; on the CPU "
                + (f"{format_bytes(cpu_cap)} (90% of the memory available now)" if cpu_cap else "no cap"))
    what = f"model {user.name}" if user else f"{s.dataset} data ({size} px)"
    return (f"Find batch size {s.name}: {s.mode} from {s.start}{f' up to {s.max_batch}' if s.max_batch else ''}, "
            f"{s.optimizer}, {what}, {s.precision}; {cap_text}"
            + settings_note(s.deterministic, s.tf32))


class ProbeRun:
    """The search's probes, in the order run: each run once by the prober (catsdogs.measure.prober),
    numbered, named by its phase (calibrate, search, confirm, critical) and logged."""

    def __init__(self, settings: FindSettings, data_dir: Path, work: Path, cpu_cap: int | None, env: dict, log,
                 probe_data: model_check.ProbeData | None = None):
        self.settings, self.data_dir, self.log = settings, Path(data_dir), log
        self.probe_data = probe_data  # a user's model's: its images, or random ones (model_check.data_for)
        self.probes: list[ProbeRecord] = []
        self.prober = probers.Prober(work, settings.memory_cap_bytes, cpu_cap_bytes=cpu_cap, isolate=settings.isolate,
                                     env=env)

    def probe(self, batch_size: int, phase: str, fresh: bool = False) -> ProbeRecord:
        """The probe of `batch_size`: run now (in a fresh worker with `fresh`), or the one already run."""
        for p in self.probes:
            if p.batch_size == batch_size:
                return p
        s = self.settings
        task = ProbeTask(batch_size, str(self.data_dir.resolve()), optimizer=s.optimizer, dataset=s.dataset,
                         precision=s.precision, steps=s.steps, warmup=s.warmup, deterministic=s.deterministic,
                         tf32=s.tf32, min_seconds=s.min_seconds, model=s.model, loss=s.loss,
                         **(self.probe_data.task_fields() if self.probe_data else {}))
        started = time.perf_counter()
        p = self.prober.run(task, fresh=fresh)
        p.order, p.phase, p.wall_seconds = len(self.probes) + 1, phase, round(time.perf_counter() - started, 2)
        self.probes.append(p)
        self.log(probe_line(p))
        return p

    def probe_on_the_way(self, batch_size: int, critical: int | None) -> str:
        """The search's probe of `batch_size`, and before it the critical batch size's, when that
        lies between the largest probed so far and `batch_size`: so it runs in the worker of the
        search's way up, where a probe costs a fraction of a second, not in a fresh one."""
        done = max((p.batch_size for p in self.probes), default=0)
        if critical is not None and done < critical < batch_size:
            self.probe(critical, "critical")
        return self.probe(batch_size, "search").status

    def close(self) -> None:
        self.prober.close()


# --- the statistics ---------------------------------------------------------------------------------


def noise_sampling() -> NoiseSampling:
    """find-batch-size's measurement: NOISE_PAIRS pairs of NOISE_LARGE images, each its own
    micro-batch, after epochs NOISE_FROM on (none before: they would be discarded)."""
    return NoiseSampling(micro=1, micros=NOISE_LARGE, pairs=NOISE_PAIRS, from_epoch=NOISE_FROM)


def user_noise_sampling() -> NoiseSampling:
    """A user's model's measurement: NOISE_PAIRS pairs of USER_NOISE_MICROS micro-batches of
    USER_NOISE_MICRO images (the two-batch estimator), after epochs NOISE_FROM on."""
    return NoiseSampling(micro=USER_NOISE_MICRO, micros=USER_NOISE_MICROS, pairs=NOISE_PAIRS, from_epoch=NOISE_FROM)


def measure_noise_scale(data_dir: Path, manifest: dict | None, settings: FindSettings, work: Path, env: dict | None,
                        log: Callable[[str], None], sampling: NoiseSampling | None = None,
                        probe_data: model_check.ProbeData | None = None) -> NoiseRun | None:
    """B_simple past the first epoch's transient: NOISE_SEEDS short runs at the base batch size
    (seeds `settings.seed` and on), each trained NOISE_EPOCHS epochs as a sweep's trial is, in a
    worker of its own, measured after each epoch from NOISE_FROM on (before it, nothing is
    measured); those measurements, of every seed, pooled into one estimate (gradient_noise.pool: the ratio of means over all their
    pairs). One epoch at one seed moved it from 3 to 296 with the seed and the backend; later
    epochs of two seeds steady it. With the wall time (workers' starts included). None, said in
    the log, when a run failed. `probe_data`: a user's model (settings.model) trains, on its
    folder or the prepared data, and is measured by the two-batch estimator (`user_noise_sampling`)."""
    base = default("base_batch_size")
    user = _user_task_fields(settings, probe_data)
    sampling = sampling or (user_noise_sampling() if user else noise_sampling())
    seeds = list(range(settings.seed, settings.seed + NOISE_SEEDS))
    how = (f"the two-batch estimator on ordinary gradients, {sampling.pairs} pairs of {sampling.micros} micro-batches "
           f"of {sampling.micro} images" if user else f"{sampling.pairs} pairs of {sampling.micro} and {sampling.large} images")
    log(f"Noise scale: {NOISE_EPOCHS} epochs at batch size {base}, seeds {', '.join(map(str, seeds))}; B_simple "
        f"from {how} after epochs {sampling.from_epoch}-{NOISE_EPOCHS}, pooled ...")
    started = time.perf_counter()
    measured, measure_seconds = [], 0.0
    log_path = work / "noise-scale.log"
    worker = Worker(log_path, env)  # one for every seed: a trial trains alike in a fresh worker or a used one
    try:
        for seed in seeds:
            cfg = TrialConfig(settings.optimizer, base, settings.dataset, seed, epochs=NOISE_EPOCHS,
                              image_size=manifest["params"]["size"] if manifest else int(probe_data.input_spec[0]),
                              data=manifest["fingerprint"][settings.dataset] if manifest else "",
                              precision=settings.precision, backend=backends.name(),
                              **backends.process_settings(env or {}))
            task = TrialTask(cfg, str(Path(data_dir).resolve()), sampling.as_dict(), user=user)
            record: TrialRecord = worker.run(task)
            later = [NoiseEstimate.from_record(row) for row in record.history or []]
            later = [replace(m, small=sampling.micro, large=sampling.large) for m in later
                     if m is not None and m.epoch >= sampling.from_epoch]
            if record.status != Status.DONE or not later:
                log(f"Noise scale not measured: the short run at seed {seed} {record.status}: "
                    f"{_first_line(record.error)} (log: {log_path})")
                return None
            measured += later
            measure_seconds += record.noise_seconds or 0.0
    finally:
        worker.close()
    log_path.unlink(missing_ok=True)
    estimate = pool(measured)
    return NoiseRun(estimate, base, NOISE_EPOCHS, round(measure_seconds, 2),
                    round(time.perf_counter() - started, 2), seeds=seeds, from_epoch=sampling.from_epoch,
                    estimator="two-batch" if user else None)


def _user_task_fields(settings: FindSettings, probe_data: model_check.ProbeData | None) -> dict | None:
    """A user's model as a trial trains it (TrialTask.user); None for the article's."""
    if settings.model is None:
        return None
    return {"model": settings.model, "loss": settings.loss, **(probe_data.task_fields() if probe_data else {})}


def _first_line(text) -> str:
    return next(iter(str(text or "").splitlines()), "") or "no reason given"


# --- the memory model's prediction ---------------------------------------------------------------


def _predict_first(run: ProbeRun, calib: ProbeRecord, manifest: dict | None, size: int, data_dir: Path, work: Path,
                   env: dict, log, user: model_check.ModelInfo | None = None) -> dict | None:
    """The prediction before any search probe: from the calibration probe (the article's model,
    handed in as a user's too, on the prepared data), or from it and one fresh probe (any other
    model: `_predict_line`); the probes it puts near the limit get a fresh worker. None when there
    is no cap or the model failed."""
    s = run.settings
    cap_mb = calib.memory_cap_mb or calib.device_memory_limit_mb
    if not (calib.status == Status.DONE and calib.peak_memory_mb and cap_mb):
        return None
    if user is not None and not (user.article_size and manifest):  # the article's layers: its own model, below
        pred = _predict_line(run, calib, cap_mb, user, log)
    else:
        train_images = sum(manifest["counts"][s.dataset]["train"].values())
        pred = _predict(calib, cap_mb, data_dir, work, size, train_images, s, log, env)
    if pred:
        run.prober.fresh_from = fresh_threshold(pred["max_batch_size"])
        log(f"Predicted before the search: {pred['max_batch_size']} ({METHODS[pred['method']]}); "
            f"probes of {run.prober.fresh_from} and above run in a fresh worker.")
    return pred


def _predict_line(run: ProbeRun, calib: ProbeRecord, cap_mb: float, user: model_check.ModelInfo, log) -> dict | None:
    """A user's model's prediction, either backend: the line through the calibration's peak and a fresh
    probe's (costs.predict_max_batch_size_line says why). None, said, when that probe gives no line."""
    cap, first = cap_mb * 2**20, calib.peak_memory_mb * 2**20
    second = line_second_batch(cap, first, user.activation_bytes_per_image or 0.0)
    probe = run.probe(second, "predict", fresh=True)
    pred = (predict_max_batch_size_line(cap, CALIBRATION_BATCH, first, second, probe.peak_memory_mb * 2**20)
            if probe.status == Status.DONE and probe.peak_memory_mb else None)
    if pred is None:
        log(f"No prediction before the search: the second memory probe (batch size {second}) "
            f"{'did not fit' if probe.status != Status.DONE else 'peaked no higher than batch size 1'}.")
    return pred


def _predict(calib: ProbeRecord, cap_mb: float, data_dir: Path, work: Path, size: int, train_images: int | None,
             s: FindSettings, log, env: dict) -> dict | None:
    """The backend's memory model's answer, calibrated on the batch-1 probe: XLA's plan where the
    backend's compiler states one (JAX), compiled in a worker of its own; else
    TensorFlow's step replayed through BFC (the article's model). None when the plan could not be
    made (said in the log)."""
    cap_bytes, peak_bytes = cap_mb * 2**20, calib.peak_memory_mb * 2**20
    steps = s.warmup + s.steps
    if backends.current().compiled_step_bytes is None:
        device = "cpu" if calib.memory_kind == "cpu-rss" else "gpu"
        return {**predict_max_batch_size(cap_bytes, CALIBRATION_BATCH, peak_bytes, size, s.optimizer, s.precision,
                                         train_images=train_images, device=device, steps=steps),
                "train_images": train_images, "device": device, "steps": steps}
    log_path = work / "memory-plan.log"
    task = MemoryPlanTask(str(data_dir), s.optimizer, s.dataset, s.precision, cap_bytes, CALIBRATION_BATCH, peak_bytes,
                          **backends.process_settings(env))
    plan = run_isolated(task, log_path, env)
    if plan.status != Status.DONE:
        log(f"XLA's memory plan failed: {_first_line(plan.error)} (log: {log_path})")
        return None
    log_path.unlink(missing_ok=True)
    pred = {k: v for k, v in plan.as_dict().items() if k not in ("status", "error", "traceback")}
    pred["planned_bytes"] = {int(b): v for b, v in pred["planned_bytes"].items()}
    return pred


def _prediction(pred: dict | None, calib: ProbeRecord, run: ProbeRun, result, image_size: int) -> dict | None:
    """The prediction as the summary records it, each probe's predicted peak set beside its own."""
    if not pred:
        return None
    for p in run.probes:
        p.predicted_peak_mb = _predicted_peak_bytes(pred, p.batch_size, run.settings, image_size) / 2**20
    out = {**pred, "calibration_batch_size": CALIBRATION_BATCH, "calibration_peak_mb": calib.peak_memory_mb,
           "fresh_from": run.prober.fresh_from}
    if result.largest_fit and not result.reached_max:  # a size --max stopped at is no limit to hold it to
        out["percent_apart"] = percent_apart(pred["max_batch_size"], result.largest_fit)
    return out


def _predicted_peak_bytes(pred: dict, batch: int, s: FindSettings, image_size: int) -> float:
    """A probe's peak by the prediction: the BFC replay's, or the line of XLA's plan."""
    if pred["method"] == "bfc":
        return predicted_peak_bytes(batch, pred["baseline_bytes"], image_size, s.optimizer, s.precision,
                                    pred["train_images"], pred["device"], pred["steps"])
    return pred["baseline_bytes"] + pred["state_bytes"] + pred["per_image_bytes"] * batch
