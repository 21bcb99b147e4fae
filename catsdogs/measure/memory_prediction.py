"""find-batch-size's memory model: the largest batch size predicted from the batch-size-1 probe
(the calibration), before the search, so the prediction never leans on the probes it is judged by.

The article's model: on TensorFlow its step replayed through a model of the BFC allocator
(costs.predict_max_batch_size: on the CPU, the pages its growing regions have written),
arithmetic here, checked on the CPU by one fresh probe on the search's way up, which measures what
this CPU's kernels hold beyond it (`check_replay`); on JAX, whose compiler assigns buffers itself, XLA's plan of the step compiled at
a few small batch sizes (`BackgroundPlan`, costs.predict_max_batch_size_planned), never near the
limit, and where the probes share one worker on a GPU held to the largest region its pool can
grow (catsdogs.measure.gpu_pool). Any other model: a line through the calibration and one fresh probe of a fifth of what
its layers' outputs would fit, never above the search's bound (`predict_line`). The prediction then sets which probes need a fresh worker: every
probe at or above search.FRESH_SHARE of it (catsdogs.measure.prober says why a reused worker
cannot answer near the limit, and where it can: JAX on a GPU). This process imports no framework.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from catsdogs.measure import gpu_pool, model_check
from catsdogs.measure.common import first_line
from catsdogs.measure.find_summary import METHODS
from catsdogs.measure.search import fresh_threshold, last_doubling_size, percent_apart
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import CHECK, MemoryPlan, MemoryPlanTask, ProbeRecord
from catsdogs.runtime import backends
from catsdogs.runtime.worker import run_isolated
from catsdogs.schema import Status
from catsdogs.training.costs import (
    line_second_batch,
    plan_batch_sizes,
    predict_max_batch_size,
    predict_max_batch_size_line,
    predict_max_batch_size_planned,
    predicted_peak_bytes,
)

CALIBRATION_BATCH = 1  # the tiny probe the memory model's runtime baseline comes from
# The replay's check (`check_replay`) corrects it where its probe peaks apart from it by more than
# this share of the room the calibration left under the cap. Fresh probes on the development
# machine (any of oneDNN's ISAs) peaked -30 to +90 MiB from the replay below 0.8 of the limit, up
# to 8% of the room at 64 px under 2 GiB and at 40 px under 1 GiB (docs/results.md, "The replay
# checked by one probe"): one probe's difference below a tenth is that spread, not the kernels'.
# What a difference d left alone costs: d/room of the answer where it is an offset, up to
# d/room x answer/size (1.25-2.5 times that) where it grows with the batch; what one probe cannot
# resolve.
CHECK_ROOM_SHARE = 0.1
CHECK_LEAST = 16  # no check below this size: what it adds to batch size 1 is within the peaks' spread


class BackgroundPlan:
    """XLA's memory plan of the article's step (JAX), compiled in a worker of its own at a few
    small batch sizes (costs.plan_batch_sizes: none above 256, none above the search's bound)
    while the noise scale trains: it needs no probe, and on a GPU its worker's start and three
    compilations take about as long as the noise scale's short runs, behind which they hide."""

    def __init__(self, task: MemoryPlanTask, log_path: Path, env: dict):
        self.task, self.log_path, self.env = task, log_path, env
        self.record: MemoryPlan | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.seconds: float | None = None
        self.thread = threading.Thread(target=self._run, name="memory-plan", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, s: FindSettings, manifest: dict | None, user, data_dir: Path, work: Path, env: dict,
              bound: int | None) -> BackgroundPlan | None:
        """The plan, started; None where there is none to make (TensorFlow replays its allocator
        by arithmetic; a user's model gets the line through two probes, unless it is the
        article's, told by its layers)."""
        if (user is not None and not user.article_size) or manifest is None \
                or backends.current().compiled_step_bytes is None:
            return None  # (the article's model handed in as a user's is planned as the article's)
        task = MemoryPlanTask(str(Path(data_dir).resolve()), s.optimizer, s.dataset, s.precision,
                              plan_batch_sizes(CALIBRATION_BATCH, bound), **backends.process_settings(env))
        return cls(task, work / "memory-plan.log", env)

    def _run(self) -> None:
        try:
            self.record = run_isolated(self.task, self.log_path, self.env)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for it
            self.error = exc
        self.seconds = round(time.perf_counter() - self.started, 2)

    def result(self, log) -> dict | None:
        """{batch size: planned bytes}, once the worker has compiled them; None, said, when it failed."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        if self.record.status != Status.DONE:
            log(f"XLA's memory plan failed: {first_line(self.record.error)} (log: {self.log_path})")
            return None
        self.log_path.unlink(missing_ok=True)
        return {int(b): v for b, v in self.record.planned_bytes.items()}


def predict_first(run, calib: ProbeRecord, manifest: dict | None, size: int, planned: dict | None, log,
                  user: model_check.ModelInfo | None = None, bound: int | None = None) -> dict | None:
    """The prediction before any search probe (`run`: the search's probe_run.ProbeRun), from
    the calibration probe: with XLA's plan (JAX),
    or TensorFlow's step replayed through BFC (the article's model, handed in as a user's too, on
    the prepared data), or one fresh probe more (any other model: `predict_line`); the probes it
    puts near the limit get a fresh worker (`bound`: the search's, SearchBound.batch_size, which
    a user's model's second probe never passes). None when there is no cap or the model failed."""
    s = run.settings
    cap_mb = calib.memory_cap_mb or calib.device_memory_limit_mb
    if not (calib.status == Status.DONE and calib.peak_memory_mb and cap_mb):
        return None
    cap_bytes, peak_bytes = cap_mb * 2**20, calib.peak_memory_mb * 2**20
    if by_line(user, manifest):
        pred = predict_line(run, calib, cap_mb, user, log, bound)
    elif planned is not None:
        pred = predict_max_batch_size_planned(planned, cap_bytes, CALIBRATION_BATCH, peak_bytes)
        if pred and calib.memory_kind == "gpu-worker" and run.prober.in_place \
                and gpu_pool.grows({**os.environ, **(run.env or {})}):  # one worker's pool, grown region by region
            pred = gpu_pool.predict_in_pool(pred, cap_bytes)
    elif backends.current().compiled_step_bytes is None:
        train_images = sum(manifest["counts"][s.dataset]["train"].values())
        device = "cpu" if calib.memory_kind == "cpu-rss" else "gpu"
        steps = s.warmup + s.steps
        pred = {**predict_max_batch_size(cap_bytes, CALIBRATION_BATCH, peak_bytes, size, s.optimizer, s.precision,
                                         train_images=train_images, device=device, steps=steps),
                "train_images": train_images, "device": device, "steps": steps}
        if device == "cpu":
            pred = check_replay(run, pred, calib, size, log, bound)
    else:
        pred = None  # XLA's plan failed (said)
    if pred:
        run.prober.fresh_from = fresh_threshold(pred["max_batch_size"])
        near = ("every probe runs in one worker (JAX on a GPU recovers from an out-of-memory in place)"
                if run.prober.in_place else f"probes of {run.prober.fresh_from} and above run in a fresh worker")
        pool = pred.get("pool")
        held = (f", held to the largest region of the worker's pool, {pool['largest_region_bytes'] / 2**20:,.0f} MiB "
                f"(the plan alone: {pool['plan_max_batch_size']})"
                if pool and pool["max_batch_size"] < pool["plan_max_batch_size"] else "")
        log(f"Predicted before the search: {pred['max_batch_size']} ({METHODS[pred['method']]}{held}); {near}.")
    return pred


def check_replay(run, pred: dict, calib: ProbeRecord, size: int, log, bound: int | None = None) -> dict:
    """The replay checked by a second probe, in a fresh worker of its own, at the last size the
    search's doubling would probe (search.last_doubling_size: 0.4 to 0.8 of the prediction); the
    search is handed its outcome (search.search's `known`), so it probes that size no more. oneDNN
    picks its kernels, their scratch and layouts by the CPU's instruction set, and the replay knows
    one machine's: where that probe peaks above (or below) the replay by more than CHECK_ROOM_SHARE
    of the room the calibration left, the difference is counted as bytes per image past batch
    size 1 (`kernel_bytes_per_image`) and the prediction made again with them; a smaller difference
    is the resident set's run-to-run spread, which one probe cannot tell from the kernels', and
    leaves the replay as it was. A probe out of memory there says the replay is at least a quarter
    high: its peak, cut at the cap, is a bound, not a measurement, so the prediction is only held
    below that size and the search bisects up to it. The probe and the difference are recorded
    (`check`) either way."""
    s = run.settings
    batch = last_doubling_size(s.start, bound, pred["max_batch_size"]) if pred["max_batch_size"] else None
    if batch is None or batch < CHECK_LEAST:
        return pred
    probe = run.probe(batch, CHECK, aside=True)  # the calibration's worker kept for the search's way up
    if probe.status == Status.OOM:
        log(f"The replay checked at batch size {batch} (a fresh worker): out of memory, so the replay is more than "
            f"a quarter high; the search bisects below it.")
        return {**pred, "max_batch_size": batch - 1,
                "check": {"batch_size": batch, "status": probe.status, "peak_mb": probe.peak_memory_mb,
                          "replay_max_batch_size": pred["max_batch_size"]}}
    if probe.status != Status.DONE or not probe.peak_memory_mb or probe.peak_memory_mb <= calib.peak_memory_mb:
        said = probe.status if probe.status != Status.DONE else "peaked no higher than batch size 1"
        log(f"The replay was not checked: the probe of {batch} {said}.")
        return {**pred, "check": {"batch_size": batch, "status": probe.status}}
    measured, replayed = probe.peak_memory_mb * 2**20, planned_peak_bytes(pred, batch, s, size)
    calibration = calib.peak_memory_mb * 2**20
    room = pred["cap_bytes"] - calibration
    check = {"batch_size": batch, "status": probe.status, "peak_mb": probe.peak_memory_mb,
             "replayed_mb": replayed / 2**20, "apart_mb": (measured - replayed) / 2**20,
             "threshold_mb": CHECK_ROOM_SHARE * room / 2**20, "replay_max_batch_size": pred["max_batch_size"]}
    if abs(measured - replayed) <= CHECK_ROOM_SHARE * room:
        return {**pred, "check": check}
    kernel = (measured - replayed) / (batch - CALIBRATION_BATCH)  # above -(the replay's slope): peaked above batch 1
    again = predict_max_batch_size(pred["cap_bytes"], CALIBRATION_BATCH, calibration, size,
                                   s.optimizer, s.precision, train_images=pred["train_images"], device="cpu",
                                   steps=pred["steps"], kernel_bytes_per_image=kernel)
    log(f"The replay checked at batch size {batch} (a fresh worker): {probe.peak_memory_mb:,.0f} MiB "
        f"against its {replayed / 2**20:,.0f}, {kernel / 2**20:+.3f} MiB an image as this CPU's kernels run the "
        f"step; the prediction made again with them: {again['max_batch_size']} (the replay alone: {pred['max_batch_size']}).")
    return {**pred, **again, "check": check}


def fresh_before_search(user, manifest: dict | None, on_cpu: bool) -> int:
    """The fresh workers the probes before the search take: the calibration's, and its second's,
    run aside, where the prediction is a line through two probes (`by_line`) or, on the CPU
    (`on_cpu`: the prober's spares run beside), TensorFlow's replay checked by one (`check_replay`,
    which may yet find no size to check): launched together, they import while the noise scale
    trains, where the second started when asked would make the search wait for its import
    (docs/performance.md, "Measurements behind the code's choices")."""
    replayed = on_cpu and manifest is not None and backends.current().compiled_step_bytes is None
    return 2 if by_line(user, manifest) or replayed else 1


def by_line(user: model_check.ModelInfo | None, manifest: dict | None) -> bool:
    """Whether the prediction is a line through two probes (`predict_line`: a user's model), the
    second run aside in a fresh worker of its own; not the article's layers on the prepared data,
    handed in or not, which the article's own memory model predicts."""
    return user is not None and not (user.article_size and manifest)


def predict_line(run, calib: ProbeRecord, cap_mb: float, user: model_check.ModelInfo, log,
                 bound: int | None = None) -> dict | None:
    """A user's model's prediction, either backend: the line through the calibration's peak and a fresh
    probe's (costs.predict_max_batch_size_line says why), that probe never larger than the search's
    `bound` (--max, else the training split: a size the search can never reach is not probed; with
    a 537-image folder and no --max, 0.26.0 probed 5,304). None, said, when that probe gives no
    line (a model too small for its memory to rise above the run-to-run noise within the bound)."""
    cap, first = cap_mb * 2**20, calib.peak_memory_mb * 2**20
    second = line_second_batch(cap, first, user.activation_bytes_per_image or 0.0)
    if bound is not None:
        second = min(second, bound)
    if second <= CALIBRATION_BATCH:
        return None
    probe = run.probe(second, "predict", aside=True)  # the calibration's worker kept for the search's way up
    pred = (predict_max_batch_size_line(cap, CALIBRATION_BATCH, first, second, probe.peak_memory_mb * 2**20)
            if probe.status == Status.DONE and probe.peak_memory_mb else None)
    if pred is None:
        log(f"No prediction before the search: the second memory probe (batch size {second}) "
            f"{'did not fit' if probe.status != Status.DONE else 'peaked no higher than batch size 1'}.")
    return pred


def prediction_record(pred: dict | None, calib: ProbeRecord, run, result, image_size: int) -> dict | None:
    """The prediction as the summary records it, each probe's predicted peak set beside its own."""
    if not pred:
        return None
    for p in run.probes:
        p.predicted_peak_mb = planned_peak_bytes(pred, p.batch_size, run.settings, image_size) / 2**20
    out = {**pred, "calibration_batch_size": CALIBRATION_BATCH, "calibration_peak_mb": calib.peak_memory_mb,
           "fresh_from": None if run.prober.in_place else run.prober.fresh_from, "refined": run.refined}
    if result.largest_fit and not result.reached_max:  # a size --max stopped at is no limit to hold it to
        out["percent_apart"] = percent_apart(pred["max_batch_size"], result.largest_fit)
    return out


def planned_peak_bytes(pred: dict, batch: int, s: FindSettings, image_size: int) -> float:
    """A probe's peak by the prediction: the BFC replay's, or the line of XLA's plan."""
    if pred["method"] == "bfc":
        return predicted_peak_bytes(batch, pred["baseline_bytes"], image_size, s.optimizer, s.precision,
                                    pred["train_images"], pred["device"], pred["steps"],
                                    pred.get("kernel_bytes_per_image", 0.0), CALIBRATION_BATCH)
    return pred["baseline_bytes"] + pred["state_bytes"] + pred["per_image_bytes"] * batch
