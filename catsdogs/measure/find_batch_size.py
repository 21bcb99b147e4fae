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
spread. Not on a GPU, whose synced timers are steady: two calls on the H200 a session apart
measured 16,081 and 16,112 images/s at batch 64, 34,905 and 34,964 at 1,024 (docs/gpu.md).

The prediction comes first (catsdogs.measure.memory_prediction), after the batch-size-1 probe (the
calibration) and before the search; on a GPU the search's own probes carry it on (`probe_run.ProbeRun.guess`).
The statistics come before both (catsdogs.measure.noise_run): the gradient noise scale's
rounded-down value is probed on the search's way up ("critical"), in the worker of the small
sizes (on the CPU, when it lies below the search's start, first in the retime's worker rather than
a fresh one of its own), so the recommendation (catsdogs.goodput: the least predicted time to a
target) has a probe at the statistics' limit. `measure_noise=False` (--no-noise-scale) skips it.

Time: a probe in a reused worker takes a fraction of a second and a compilation, one in a fresh
worker seconds more (most of it importing the framework). So the first probe's worker imports,
and XLA's plan compiles, while the noise scale's short runs train; the search probes the
prediction rather than doubling past it (catsdogs.measure.search.around_guess), and goes straight
to its bound from three quarters of it; on the CPU the next fresh worker imports while the probes
run, stopped while their steps are timed (catsdogs.measure.prober). The summary says where the time went ("seconds").
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from catsdogs import config, goodput
from catsdogs.data import folder as folder_data
from catsdogs.errors import CatsdogsError, Interrupted, SettingError
from catsdogs.files import write_json_atomic
from catsdogs.host import host_memory_available, versions
from catsdogs.manifest import require_intact
from catsdogs.measure import model_check
from catsdogs.measure.common import check_memory_floor, format_bytes, write_csv
from catsdogs.measure.find_summary import opening_line, summary_lines, time_lines
from catsdogs.measure.memory_prediction import (
    CALIBRATION_BATCH,
    BackgroundPlan,
    by_line,
    predict_first,
    prediction_record,
)
from catsdogs.measure.noise_run import NoiseRun, measure_noise_scale, user_noise_sampling
from catsdogs.measure.probe_run import ProbeRun
from catsdogs.measure.search import (
    RESOLUTION_SHARE,
    RSS_RESOLUTION_SHARE,
    apply_margin,
    confirm,
    critical_probe,
    search,
)
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import ProbeRecord, columns
from catsdogs.recommendation import fastest, hand_off, recommend
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker
from catsdogs.schema import Status, default

HOST_CAP_FRACTION = 0.9
PROBE_COLUMNS = columns(ProbeRecord, "search")  # find_batch_size.csv, and each probe in the .json


def find_batch_size(settings: FindSettings, data_dir: Path, out: Path = Path(config.DEFAULT_OUT),
                    log: Callable[[str], None] = print, arrays: tuple | None = None) -> dict:
    """Measure the noise scale, predict, search, recommend; write OUT/NAME/find_batch_size.json and
    .csv; return the summary (what the .json holds). `arrays`: a user's model's images and labels
    as numpy arrays (x, y) instead of a folder (the Python API's).

    Raises SettingError for impossible settings, CatsdogsError when the data is not prepared or
    when not even batch size 1 fits (after writing the records)."""
    settings.check()
    folder = Path(out) / settings.name
    work = folder / ".work"
    env = settings.environment()
    settings, manifest, size, user, probe_data, shared = _model_and_data(settings, data_dir, work, env, log, arrays)
    bound = SearchBound.of(settings, manifest, probe_data)
    folder.mkdir(parents=True, exist_ok=True)
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
    run = ProbeRun(settings, data_dir, work, cpu_cap, env, log, probe_data)
    # XLA's plan (JAX, the article's model) compiles in a worker of its own while the noise scale trains
    plan = BackgroundPlan.start(settings, manifest, user, data_dir, work, env, bound.batch_size)
    try:
        # The statistics first, in a worker of its own that ends before any probe runs (the first
        # probe's worker imports its framework meanwhile): the probes' memory is not touched, and
        # the search can then probe the critical batch size on its way up.
        noise_run = _noise_scale(run, bound, data_dir, manifest, user, probe_data, shared) if settings.measure_noise \
            else None
        waiting = time.perf_counter()
        planned = plan.result(log) if plan else None  # before the calibration: no compilation beside its timing
        plan_wait = time.perf_counter() - waiting
        if run.prober.spares:  # without the noise scale's wait too: the two import side by side
            run.prober.prestart(fresh_before_search(user, manifest))
        calib = run.probe(CALIBRATION_BATCH, "calibrate")
        predicting = time.perf_counter()
        pred = predict_first(run, calib, manifest, size, planned, log, user)
        predict_seconds = plan_wait + time.perf_counter() - predicting
        result, safe, margin_failed = _search(run, noise_run, pred, bound)
    except KeyboardInterrupt:
        keep_interrupted(folder, settings, run.probes, log)
    finally:
        run.close()  # (a plan still compiling is not waited for: its worker ends with this process)
        if shared:  # (where the noise scale was not measured after all)
            shared.close()
        if probe_data and probe_data.decoded:  # the folder's decoded copy: the workers are done with it
            Path(probe_data.decoded).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # ... and the work folder, empty unless a log was kept
                work.rmdir()
    anchor = settings.anchor or short_run_anchor(noise_run.rate_test if noise_run else None)
    summary = _answer(result, run.probes, safe, replace(settings, anchor=anchor),
                      noise_run.estimate if noise_run else None, bound.stopped_by(result))
    summary.update(margin_failed=margin_failed, noise_scale=noise_run.as_json() if noise_run else None,
                   settings=settings.recorded(size, cpu_cap, data_dir,
                                              manifest["fingerprint"][settings.dataset] if manifest else None),
                   search_bound=bound.as_json(), backend=backends.name(), host=platform.node(),
                   prediction=prediction_record(pred, calib, run, result, size),
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
        raise _nothing_fits(run.probes[0], settings, folder)
    return summary


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


def _noise_scale(run: ProbeRun, bound: SearchBound, data_dir: Path, manifest: dict | None, user,
                 probe_data: model_check.ProbeData | None, worker: Worker | None = None) -> NoiseRun | None:
    """The noise scale's short runs (noise_run; in `worker`, where a user's model was checked), or
    None, said, where they cannot measure one: a user's model on random images (no signal), or
    fewer training images than their batch."""
    settings, log, base = run.settings, run.log, default("base_batch_size")
    why = None
    if user and not probe_data.real:
        why = ("it needs real images (random ones carry no signal to measure): give --data DIR, or prepared data "
               "of the model's input size; the recommendation is speed's within memory.")
    elif bound.train_images is not None and bound.train_images < base:
        why = (f"its short runs train at batch size {base}, more than the {bound.train_images:,} training images; "
               "the recommendation is speed's within memory and the data.")
    if why:
        log(f"Noise scale: not measured: {why}")
        if worker:  # the model's check, which passed, ran in it: nothing of its log to keep
            worker.close()
            worker.log_path.unlink(missing_ok=True)
        return None
    run.prober.prestart(fresh_before_search(user, manifest))
    return measure_noise_scale(data_dir, manifest, settings, run.work, run.env, log, probe_data=probe_data,
                               sampling=user_noise_sampling(bool(user.batch_norm)) if user else None, worker=worker)


def fresh_before_search(user, manifest: dict | None) -> int:
    """The fresh workers the probes before the search take: the calibration's, and where the
    prediction is a line through two probes (memory_prediction.by_line), its second's, run aside:
    launched together, they import while the noise scale trains, where the second started when
    asked (4 s of a 24 s run)."""
    return 2 if by_line(user, manifest) else 1


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


def _answer(result, probes: list[ProbeRecord], safe: int | None, settings: FindSettings, estimate,
            stopped_by: str) -> dict:
    """The measured answer, the margin's size, the fastest and the recommendation with its
    learning rate (catsdogs.recommendation), as find_batch_size.json holds them."""
    summary: dict = {"largest_fitting": result.largest_fit, "first_not_fitting": result.first_failure,
                     "reached_max": result.reached_max, "stopped_by": stopped_by,
                     "noise_scale": None}  # the caller's, in this place
    if result.largest_fit is None:
        return summary
    summary["margin_batch_size"] = safe
    summary["fastest"] = fastest(probes, result.largest_fit)  # none above the answer (a prediction probe may be)
    rec = recommend(probes, safe, settings.optimizer, estimate, settings.anchor,
                    bound_by=stopped_by if safe == result.largest_fit else None) if safe is not None else None
    if rec:
        summary["recommendation"] = rec
    summary["hand_off"] = hand_off(rec["batch_size"] if rec else safe, result.largest_fit, safe,
                                   settings.effective_batch)
    return summary


def short_run_anchor(test: dict | None) -> dict | None:
    """The learning-rate anchor the noise scale's short runs give (noise_run.rate_test), in the
    form a store's tuned rates take (recommendation.anchor_at); None when none was chosen."""
    if not test or test.get("chosen") is None:
        return None
    b = test["batch_size"]
    grid = ", ".join(f"{r:g}" for r in test["rates"])
    return {"kind": "short-run", "rates": {b: test["chosen"]}, "edges": [b] if test["edge"] else [],
            "said": f"the best of the noise scale's short runs at {grid} (the least final loss after "
                    f"{test['epochs']} epochs at batch size {b})"}


def _search(run: ProbeRun, noise_run: NoiseRun | None, pred: dict | None, bound: SearchBound):
    """The search up to the bound, then the margin's size confirmed and the critical batch size
    probed: (the search's result, the margin's size, the sizes that failed their confirmation)."""
    s = run.settings
    estimate = noise_run.estimate if noise_run else None
    early = critical_probe(estimate, safe=None)
    run.prediction = pred
    rss = bool(run.probes) and run.probes[0].memory_kind == "cpu-rss"  # the calibration's: a resident set's noise
    fresh_from = run.prober.fresh_from
    if rss and fresh_from is not None and (bound.batch_size is None or bound.batch_size >= fresh_from):
        run.prober.prestart()  # the first fresh probe near the limit: its import while the way up runs
    result = search(lambda b: run.probe_on_the_way(b, early), mode=s.mode, start=s.start,
                    max_batch=bound.batch_size, resolution=s.resolution,
                    guess=run.guess if pred and s.mode == "binsearch" else None,
                    share=RSS_RESOLUTION_SHARE if rss else RESOLUTION_SHARE)
    safe, margin_failed = None, []
    if result.largest_fit is not None:
        largest = next(p for p in reversed(run.probes) if p.batch_size == result.largest_fit)
        if bound.stopped_by(result) in ("data", "max") and room_beyond_margin(largest, s.margin):
            safe = result.largest_fit  # memory never bound, nor came near: no margin to take against it
        else:  # the margin's size must pass itself: down the margin's grid until one does
            safe, margin_failed = confirm(lambda b: run.probe(b, "confirm").status,
                                          apply_margin(result.largest_fit, s.margin))
    critical = critical_probe(estimate, safe)  # the statistics' limit, so the recommendation can stand on it
    if critical is not None and any(p.batch_size == critical for p in run.probes):
        critical = None  # probed on the search's way up
    if safe is None or any(p.memory_kind and p.memory_kind.startswith("gpu") for p in run.probes):
        if critical is not None:
            run.probe(critical, "critical")
        return result, safe, margin_failed
    # On the CPU the sizes the answer could fall on are timed again in a fresh worker: an unprobed
    # critical size (below the search's start, say) is timed there first, rather than in a fresh
    # worker of its own (seconds of import), as are the gaps beside the choice
    timed = set(goodput.contested(run.probes, safe, estimate)) | set(goodput.between(run.probes, safe, estimate))
    if len(timed) > 1 or critical is not None:
        if critical is not None:
            timed.add(critical)
        run.retime(sorted(timed), first={critical: "critical"} if critical is not None else None)
    return result, safe, margin_failed


def room_beyond_margin(probe: ProbeRecord, margin: float) -> bool:
    """Whether the probe's peak left more room under its cap than the margin would take: then a
    size that fitted at a bound memory did not set needs no margin against memory."""
    cap = probe.memory_cap_mb or probe.device_memory_limit_mb
    return bool(cap and probe.peak_memory_mb is not None and probe.peak_memory_mb <= (1 - margin) * cap)


@dataclass(frozen=True)
class SearchBound:
    """The largest batch size the search probes, and why: --max when given, else the training
    split (the prepared data's, or the training part of a --data folder), since no batch larger
    than the data can be trained on them; None where neither says (a user's model on random
    images, no --max): then memory alone stops the search."""

    batch_size: int | None
    by: str | None  # "max" or "data"
    train_images: int | None

    @classmethod
    def of(cls, settings: FindSettings, manifest: dict | None, probe_data: model_check.ProbeData | None) -> SearchBound:
        if probe_data is not None and probe_data.own:
            train = folder_data.train_count(probe_data.count or 0) or None
        elif manifest:
            train = sum(manifest["counts"][settings.dataset]["train"].values())
        else:
            train = None
        if settings.max_batch is not None:
            return cls(settings.max_batch, "max", train)
        return cls(train, "data" if train else None, train)

    def stopped_by(self, result) -> str:
        """What ended the search: "data" or "max" (every size up to the bound fit), "memory" (a
        size ran out of it), or "failures" (sizes failed for another reason)."""
        if result.reached_max:
            return self.by or "max"
        if result.first_failure is not None and result.statuses.get(result.first_failure) == Status.OOM:
            return "memory"
        return "memory" if result.largest_fit is None and Status.OOM in result.statuses.values() else "failures"

    def as_json(self) -> dict:
        return {"batch_size": self.batch_size, "by": self.by, "train_images": self.train_images}


def _seconds(started: float, noise_run: NoiseRun | None, predict_seconds: float, probes: list[ProbeRecord]) -> dict:
    """Where the command's time went: the noise scale's short runs, the memory model's prediction,
    the probes (each with its worker's start), and the whole answer."""
    return {"noise_scale": noise_run.seconds if noise_run else None, "prediction": round(predict_seconds, 2),
            "probes": round(sum(p.wall_seconds or 0.0 for p in probes), 2),
            "total": round(time.perf_counter() - started, 2)}


def _model_and_data(settings: FindSettings, data_dir: Path, work: Path, env: dict, log, arrays=None):
    """(the settings with the model's canonical reference, the prepared data's manifest or None,
    the image size, the user's model's ModelInfo or None, what its probes run on or None, the
    worker it was checked in or None): a user's model is built and checked in a worker first
    (catsdogs.measure.model_check), kept for the noise scale's short runs where they are to train
    (one start fewer)."""
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
    except BaseException:
        if shared:
            shared.close()
        raise
    log(f"Your {model_check.describe(user)}; on {probe_data.said}.")
    return replace(settings, model=ref), probe_data.manifest, user.input_shape[0], user, probe_data, shared
