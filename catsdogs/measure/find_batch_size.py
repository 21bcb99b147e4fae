"""The largest batch size that fits in memory, the fastest one, and which to train with: the
batch-size search (catsdogs.measure.search) run on this device, one probe at a time.

Every probe is a few training steps of the article's model at one batch size: the sweep's own
training step (catsdogs.training.probes.run_probe), run by catsdogs.measure.prober. A probe that
does not fit ends its worker, so one out-of-memory cannot poison the next probe (TensorFlow keeps
device memory after an out-of-memory error, and a process killed for memory takes nothing else
with it), unless the worker shows it recovered in place (JAX on a GPU); a worker is reused only
while the batch sizes grow, since its memory only grows. Each probe ends done (it fits), oom or
failed (schema.Status).

The search's bound (`SearchBound`): --max, else the training split, the prepared data's or the
training part of a --data folder. No batch larger than the data can be trained on them, so by
default the search stops there, and says so; --max above it finds the device's limit.

The memory cap: on a GPU its memory (or `--memory-limit` as a logical device); on the CPU
`--memory-limit` caps each probe's peak resident memory (the parent watches VmHWM and kills a
probe that goes over: catsdogs.runtime.worker), and without it 90% of the memory available when
the search starts. "Fits" means the probe's peak memory stayed under the cap. A margin is taken
off the largest size that fits where memory stopped the search or came within the margin of the
cap, and its size confirmed by a probe ("confirm"). Last, the sizes the recommendation could
fall on (goodput.contested) are timed again twice, interleaved ("retime"), on the CPU: on a
shared machine a probe's throughput moved by 20% from one run to the next, more than its own steps
spread. Not on a GPU, whose synced timers are steady from one call to the next (docs/gpu.md).

The prediction comes first (catsdogs.measure.memory_prediction), after the batch-size-1 probe (the
calibration) and before the search; on a GPU the search's own probes carry it on (`probe_run.ProbeRun.guess`).
The statistics come before both (catsdogs.measure.noise_run), but for a cap the user gave, which
batch size 1 is probed against first (`calibrate`): one it does not fit ends the run there, in one
error line, with no noise scale trained for nothing. The gradient noise scale's
rounded-down value is probed on the search's way up ("critical"), in the worker of the small
sizes (on the CPU, when it lies below the search's start, first in the retime's worker rather than
a fresh one of its own), so the recommendation (catsdogs.goodput: the least predicted time to a
target) has a probe at the statistics' limit. `measure_noise=False` (--no-noise-scale) skips it.

Time: a probe in a reused worker takes a fraction of a second and a compilation, one in a fresh
worker seconds more (importing the framework). So the first probe's worker imports, and XLA's plan
compiles, while the noise scale's short runs train; the search probes the prediction rather than
doubling past it (search.around_guess), and goes straight to its bound from three quarters of it;
on the CPU the next fresh worker imports while the probes run, stopped while their steps are timed
(catsdogs.measure.prober). The summary says where the time went. `--race`: then catsdogs.measure.race_run."""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from catsdogs import config, goodput
from catsdogs.errors import CatsdogsError, Interrupted, SettingError
from catsdogs.files import write_json_atomic
from catsdogs.find_result import FindResult
from catsdogs.host import cpu_record, host_memory_available, versions
from catsdogs.manifest import require_intact
from catsdogs.measure import model_check
from catsdogs.measure.common import check_memory_floor, format_bytes, take_claim, write_csv
from catsdogs.measure.find_summary import opening_line, race_lines, summary_lines, time_lines
from catsdogs.measure.memory_prediction import (
    CALIBRATION_BATCH,
    BackgroundPlan,
    fresh_before_search,
    predict_first,
    prediction_record,
)
from catsdogs.measure.noise_run import NoiseRun, measure_noise_scale, user_noise_sampling
from catsdogs.measure.probe_run import ProbeRun
from catsdogs.measure.race_run import run_race
from catsdogs.measure.search import (
    RESOLUTION_SHARE,
    RSS_RESOLUTION_SHARE,
    SearchResult,
    apply_margin,
    confirm,
    critical_probe,
    search,
)
from catsdogs.measure.settings import FindSettings, SearchBound
from catsdogs.messages import CHECK, ProbeRecord, columns
from catsdogs.recommendation import fastest, hand_off, recommend, short_run_anchor
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker
from catsdogs.schema import Status, default

HOST_CAP_FRACTION = 0.9
LOCK = ".running"  # OUT/NAME/.running: the pid of the run writing there
PROBE_COLUMNS = columns(ProbeRecord, "search")  # find_batch_size.csv, and each probe in the .json


def find_batch_size(settings: FindSettings, data_dir: Path, out: Path = Path(config.DEFAULT_OUT),
                    log: Callable[[str], None] = print, arrays: tuple | None = None) -> FindResult:
    """Measure the noise scale, predict, search, recommend; write OUT/NAME/find_batch_size.json and
    .csv; return the result (what the .json holds). `arrays`: a user's model's images and labels
    as numpy arrays (x, y) instead of a folder (the Python API's).

    The phases, in order, over one state (`FindRun`): the model and data checked and the search
    bounded (`begin`), the statistics (`measure_statistics`), the memory model (`predict_memory`),
    the search (`search_memory`), the answer (`answer`). Raises SettingError for impossible
    settings, CatsdogsError when the data is not prepared or when not even batch size 1 fits
    (after writing the records)."""
    run = begin(settings, data_dir, out, log, arrays)
    try:
        return _measure_and_answer(run, log)
    finally:
        if run.probe_data and run.probe_data.decoded:  # the folder's decoded copy: every worker is done with it
            Path(run.probe_data.decoded).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # ... and the work folder, empty unless a log was kept
                (run.folder / ".work").rmdir()
        (run.folder / LOCK).unlink(missing_ok=True)


def _measure_and_answer(run: FindRun, log) -> FindResult:
    """The phases, the answer written (find_batch_size.json and .csv) and said."""
    try:
        if run.settings.memory_cap_bytes is not None:  # a cap of the user's: batch size 1 first (`calibrate`)
            calibrate(run)
            if run.calibration.status != Status.DONE:  # nothing fits: nothing more to measure
                run.search = SearchResult(None, CALIBRATION_BATCH, [CALIBRATION_BATCH],
                                          {CALIBRATION_BATCH: run.calibration.status})
        if not run.search:  # (none where batch size 1 did not fit the user's cap: nothing more to measure)
            run.plan = BackgroundPlan.start(run.settings, run.manifest, run.user, run.data_dir, run.probes.work,
                                            run.probes.env, run.bound.batch_size)
            measure_statistics(run)
            predict_memory(run)
            search_memory(run)
    except KeyboardInterrupt:
        keep_interrupted(run.folder, run.settings, run.probes.probes, log)
    finally:
        end(run)
    result = answer(run)
    write_json_atomic(run.folder / "find_batch_size.json", result.to_dict(), indent=2)
    write_csv(result.probes, run.folder / "find_batch_size.csv", PROBE_COLUMNS)
    if result.largest_fitting is None:  # the error says it all, where to find the records too
        raise _nothing_fits(run.probes.probes[0], run.settings, run.folder)
    for line in summary_lines(result) + time_lines(result):
        log(line)
    if run.settings.race:
        race(run, result)
    return result


def race(run: FindRun, result: FindResult) -> None:
    """The sizes that fit raced to a target (catsdogs.measure.race_run), after the prediction is
    written and said: find_batch_size.json again, with the race's measured answer beside it."""
    if not result.recommendation:
        return run.log("Race: not run: no size passed its probe with a time to race.")
    result.take_race(run_race(run.settings, run.data_dir, run.folder.parent, run.manifest, run.size, result.recommendation,
                              run.anchor, run.log, raced=model_check.Raced.of(run.settings, run.manifest, run.user, run.probe_data)))
    write_json_atomic(run.folder / "find_batch_size.json", result.to_dict(), indent=2)
    for line in race_lines(result.race):
        run.log(line)


@dataclass
class FindRun:
    """What find-batch-size's phases share: its settings and data, then what each phase adds."""

    settings: FindSettings
    data_dir: Path
    folder: Path  # OUT/NAME
    log: Callable[[str], None]
    manifest: dict | None  # the prepared data's (None: a user's model on its own data or random images)
    size: int  # the images' side
    user: model_check.ModelInfo | None  # a user's model, checked
    probe_data: model_check.ProbeData | None  # what a user's model's probes run on
    shared: Worker | None  # the worker a user's model was checked in, kept for the noise scale's runs
    bound: SearchBound
    cpu_cap: int | None  # the CPU's cap without --memory-limit
    started: float
    probes: ProbeRun  # every probe, in the order run
    plan: BackgroundPlan | None = None  # XLA's plan (JAX, the article's model), compiling beside the statistics
    noise: NoiseRun | None = None  # measure_statistics'
    calibration: ProbeRecord | None = None  # predict_memory's ...
    prediction: dict | None = None
    predict_seconds: float = 0.0
    search: SearchResult | None = None  # search_memory's ...
    safe: int | None = None  # the margin's size, confirmed
    margin_failed: list[int] = field(default_factory=list)

    @property
    def anchor(self) -> dict | None:  # the rule's starting rate: a store's tuned one, else the short runs' best
        return self.settings.anchor or short_run_anchor(self.noise.rate_test if self.noise else None)


def begin(settings: FindSettings, data_dir: Path, out: Path, log, arrays) -> FindRun:
    """The settings checked, the model and data made ready, the search's bound and the CPU's cap
    set, the opening lines said; the probes' worker and XLA's plan started."""
    settings.check()
    folder = Path(out) / settings.name
    work = folder / ".work"
    env = settings.environment()
    settings, manifest, size, user, probe_data, shared = _model_and_data(settings, data_dir, work, env, log, arrays)
    bound = SearchBound.of(settings, manifest, probe_data)
    folder.mkdir(parents=True, exist_ok=True)
    take_claim(folder / LOCK, shared)
    cpu_cap = None
    if settings.memory_cap_bytes is None:
        avail = host_memory_available()
        cpu_cap = int(HOST_CAP_FRACTION * avail) if avail else None
    started = time.perf_counter()
    log(opening_line(settings, size, cpu_cap, user, bound))
    if settings.anchor:
        a = settings.anchor
        log(f"Learning rate scaled from {a['store']}: the {a['kind']} sweep {a['sweep']!r}, tuned at batch sizes "
            f"{', '.join(map(str, sorted(int(b) for b in a['rates'])))}.")
    probes = ProbeRun(settings, data_dir, work, cpu_cap, env, log, probe_data)
    return FindRun(settings, Path(data_dir), folder, log, manifest, size, user, probe_data, shared, bound, cpu_cap,
                   started, probes)


def measure_statistics(run: FindRun) -> None:
    """The noise scale's short runs, in workers of their own (on a CPU up to three at once:
    noise_run.noise_workers) that end before any probe runs (the first probe's worker imports its
    framework meanwhile): the probes' memory is not touched, and the search can then probe the
    critical batch size on its way up."""
    if run.settings.measure_noise:
        run.noise = _noise_scale(run)


def predict_memory(run: FindRun) -> None:
    """The calibration probe (batch size 1), then the memory model's prediction from it (XLA's plan,
    awaited before the calibration: no compilation beside its timing)."""
    waiting = time.perf_counter()
    planned = run.plan.result(run.log) if run.plan else None
    plan_wait = time.perf_counter() - waiting
    if run.calibration is None:
        run.probes.start_ahead(fresh_before_search(run.user, run.manifest, run.probes.prober.spares),
                              only_beside=True)
        calibrate(run)
    predicting = time.perf_counter()
    run.prediction = predict_first(run.probes, run.calibration, run.manifest, run.size, planned, run.log, run.user, run.bound.batch_size)
    run.predict_seconds = plan_wait + time.perf_counter() - predicting


def calibrate(run: FindRun) -> None:
    """The probe of batch size 1, which the prediction reads: before the search, or, where the user
    set the cap, before anything else, so that a cap it cannot fit ends the run at once (no noise
    scale trained, no larger size probed)."""
    run.calibration = run.probes.probe(CALIBRATION_BATCH, "calibrate")


def end(run: FindRun) -> None:
    """The workers ended (the folder's decoded copy is let go as the call ends: a race trains on it)."""
    run.probes.close()  # (a plan still compiling is not waited for: its worker ends with this process)
    if run.shared:  # (where the noise scale was not measured after all)
        run.shared.close()


def answer(run: FindRun) -> FindResult:
    """The measured answer, the margin's size, the fastest and the recommendation with its learning
    rate (catsdogs.recommendation), with everything that traces them: find_batch_size.json."""
    settings, result, noise = run.settings, run.search, run.noise
    stopped_by = run.bound.stopped_by(result)
    probes = run.probes.probes
    fits = result.largest_fit is not None
    rec = None
    if fits and run.safe is not None:
        rec = recommend(probes, run.safe, settings.optimizer, noise.estimate if noise else None, run.anchor,
                        bound_by=stopped_by if run.safe == result.largest_fit else None)
    fingerprint = run.manifest["fingerprint"][settings.dataset] if run.manifest else getattr(run.probe_data, "fingerprint", None)
    return FindResult.answered(
        largest_fitting=result.largest_fit, first_not_fitting=result.first_failure, reached_max=result.reached_max,
        stopped_by=stopped_by, noise_scale=noise.as_json() if noise else None,
        margin_batch_size=run.safe if fits else None,
        fastest=fastest(probes, result.largest_fit) if fits else None,  # none above the answer
        recommendation=rec or None,
        hand_off=hand_off(rec["batch_size"] if rec else run.safe, result.largest_fit, run.safe,
                          settings.effective_batch) if fits else None,
        margin_failed=run.margin_failed, pool_ceiling=run.probes.ceiling_record(result),
        settings=settings.recorded(run.size, run.cpu_cap, run.data_dir, fingerprint),
        search_bound=run.bound.as_json(), backend=backends.name(), host=platform.node(), cpu=cpu_record(run.probes.env),
        prediction=prediction_record(run.prediction, run.calibration, run.probes, result, run.size),
        memory_fraction=run.calibration.memory_fraction, probes=[p.view("search") for p in probes],
        versions=versions(), seconds=_seconds(run.started, noise, run.predict_seconds, probes),
        model={**model_check.recorded(run.user), **run.probe_data.record()} if run.user else None)


def _nothing_fits(first: ProbeRecord, settings: FindSettings, folder: Path) -> CatsdogsError:
    """The error where not even the first probe fitted: a usage error naming --memory-limit where
    the user's cap is below what the runtime needs."""
    message = (f"no batch size fits: batch size {first.batch_size} already {first.status}"
               f"{': ' + first.error.splitlines()[0] if first.error else ''} "
               f"(records in {folder / 'find_batch_size.json'})")
    if first.status == Status.OOM and settings.memory_cap_bytes is not None:  # the user's cap, below the runtime
        return SettingError(f"{format_bytes(settings.memory_cap_bytes)} is below what batch size "
                            f"{first.batch_size} needs: {message}", "memory_limit")
    return CatsdogsError(message)


def _noise_scale(run: FindRun) -> NoiseRun | None:
    """The noise scale's short runs (noise_run; in the worker a user's model was checked in), or
    None, said, where they cannot measure one: a user's model on random images (no signal), or
    fewer training images than their batch."""
    settings, log, base = run.settings, run.log, default("base_batch_size")
    user, probe_data, worker = run.user, run.probe_data, run.shared
    why = None
    if user and not probe_data.real:
        why = ("it needs real images (random ones carry no signal to measure): give --data DIR, or prepared data "
               "of the model's input size; the recommendation is speed's within memory.")
    elif run.bound.train_images is not None and run.bound.train_images < base:
        why = (f"its short runs train at batch size {base}, more than the {run.bound.train_images:,} training images; "
               "the recommendation is speed's within memory and the data.")
    if why:
        log(f"Noise scale: not measured: {why}")
        if worker:  # the model's check, which passed, ran in it: nothing of its log to keep
            worker.close()
            worker.log_path.unlink(missing_ok=True)
        return None
    ahead = fresh_before_search(user, run.manifest, run.probes.prober.spares) - (run.calibration is not None)  # (the calibration's: run)
    if ahead:
        run.probes.start_ahead(ahead)
    return measure_noise_scale(run.data_dir, run.manifest, settings, run.probes.work, run.probes.env, log,
                               probe_data=probe_data, sampling=user_noise_sampling(bool(user.batch_norm)) if user
                               else None, worker=worker,
                               decoded=run.probes.decoded.path() if run.probes.decoded else None)


def keep_interrupted(folder: Path, settings: FindSettings, probes: list[ProbeRecord], log) -> None:
    """Ctrl-C: the probes that finished kept, in find_batch_size.json and .csv marked
    "interrupted" with no answer (an older run's of the same name is replaced: never taken for this
    one's, and the report holds no interrupted run against a sweep); then Interrupted."""
    kept = [p.view("search") for p in probes]
    write_json_atomic(folder / "find_batch_size.json", {"interrupted": True, "settings": asdict(settings),
                                                        "probes": kept, "versions": versions()}, indent=2)
    write_csv(kept, folder / "find_batch_size.csv", PROBE_COLUMNS)
    log(f"Interrupted: {len(kept)} finished probe{'s' if len(kept) != 1 else ''} kept in {folder / 'find_batch_size.json'}"
        " (marked interrupted, no answer); the same command runs the search again.")
    raise Interrupted() from None


def search_memory(run: FindRun) -> None:
    """The search up to the bound, then the margin's size confirmed and the critical batch size
    probed; on the CPU the sizes the answer could fall on timed again."""
    s, probes = run.settings, run.probes
    estimate = run.noise.estimate if run.noise else None
    early = critical_probe(estimate, safe=None)
    probes.prediction = run.prediction
    rss = probes.on_resident_sets()
    probes.start_way_up(run.bound.batch_size)
    result = run.search = search(lambda b: probes.probe_on_the_way(b, early), mode=s.mode, start=s.start,
                                 max_batch=run.bound.batch_size, resolution=s.resolution,
                                 guess=probes.guess if run.prediction and s.mode == "binsearch" else None,
                                 share=RSS_RESOLUTION_SHARE if rss else RESOLUTION_SHARE, ceiling=probes.ceiling,
                                 known=tuple(p.batch_size for p in probes.probes if p.phase == CHECK))
    if result.largest_fit is not None:
        largest = next(p for p in reversed(probes.probes) if p.batch_size == result.largest_fit)
        if run.bound.stopped_by(result) in ("data", "max") and room_beyond_margin(largest, s.margin):
            run.safe = result.largest_fit  # memory never bound, nor came near: no margin to take against it
        else:  # the margin's size must pass itself: down the margin's grid until one does
            run.safe, run.margin_failed = confirm(lambda b: probes.probe(b, "confirm").status,
                                                  apply_margin(result.largest_fit, s.margin))
    critical = critical_probe(estimate, run.safe)  # the statistics' limit, so the recommendation can stand on it
    if critical is not None and any(p.batch_size == critical for p in probes.probes):
        critical = None  # probed on the search's way up
    if run.safe is None or probes.on_gpu():
        if critical is not None:
            probes.probe(critical, "critical")
        return
    # On the CPU the sizes the answer could fall on are timed again in a fresh worker: an unprobed
    # critical size (below the search's start, say) is timed there first, rather than in a fresh
    # worker of its own (seconds of import), as are the gaps beside the choice
    timed = set(goodput.contested(probes.probes, run.safe, estimate, timeable=probes.can_retime))
    timed |= set(goodput.between(probes.probes, run.safe, estimate, timeable=probes.can_retime))
    if len(timed) > 1 or critical is not None:
        if critical is not None:
            timed.add(critical)
        probes.retime(sorted(timed), first={critical: "critical"} if critical is not None else None)


def room_beyond_margin(probe: ProbeRecord, margin: float) -> bool:
    """Whether the probe's peak left more room under its cap than the margin would take: then a
    size that fitted at a bound memory did not set needs no margin against memory."""
    cap = probe.memory_cap_mb or probe.device_memory_limit_mb
    return bool(cap and probe.peak_memory_mb is not None and probe.peak_memory_mb <= (1 - margin) * cap)


def _seconds(started: float, noise_run: NoiseRun | None, predict_seconds: float, probes: list[ProbeRecord]) -> dict:
    """Where the command's time went: the noise scale's short runs, the memory model's prediction,
    the probes (each with its worker's start), and the whole answer."""
    return {"noise_scale": noise_run.seconds if noise_run else None, "prediction": round(predict_seconds, 2),
            "probes": round(sum(p.wall_seconds or 0.0 for p in probes), 2),
            "total": round(time.perf_counter() - started, 2)}


def _model_and_data(settings: FindSettings, data_dir: Path, work: Path, env: dict, log, arrays=None):
    """(the settings with the model's canonical reference, the prepared data's manifest or None, the
    image size, the user's model's ModelInfo or None, what its probes run on or None, the worker it
    was checked in or None): a user's model is built and checked in a worker first (model_check),
    kept for the noise scale's short runs where they are to train (one start fewer)."""
    model_check.check_options(settings.model, settings.loss, settings.images, settings.precision)
    if settings.model is None:
        manifest = require_intact(Path(data_dir))
        size = manifest["params"]["size"]
        check_memory_floor(settings.memory_cap_bytes, size, settings.optimizer, settings.precision)
        return settings, manifest, size, None, None, None
    log_path = work / "model-check.log"
    shared = Worker(log_path, env) if settings.measure_noise else None
    try:
        ref, user = model_check.check_user_model(settings.model, settings.loss, log_path, env, shared)
        probe_data = model_check.data_for(user, data_dir, Path(settings.images) if settings.images else None, work,
                                          arrays)
        if settings.race:  # (a race it cannot run refused before any probe)
            model_check.Raced.of(replace(settings, model=ref), probe_data.manifest, user, probe_data)
    except BaseException:
        if shared:
            shared.close()
        raise
    log(f"Your {model_check.describe(user)}; on {probe_data.said}.")
    return replace(settings, model=ref), probe_data.manifest, user.input_shape[0], user, probe_data, shared
