"""The largest batch size that fits in memory, the fastest one, and which to train with.

Every probe is a few training steps of the article's model at one batch size: the sweep's own
training step (catsdogs.training.engine.run_probe), run by catsdogs.measure.prober. A probe that does not
fit ends its worker, so one out-of-memory cannot poison the next probe (TensorFlow keeps device
memory after an out-of-memory error, and a process killed for memory takes nothing else with
it); a worker is reused only while the batch sizes grow, since its memory only grows. Each
probe ends done (it fits), oom or failed (schema.Status).

The search (`search`, pure: it takes any probe function):
- `power`: double from `start` until a probe does not fit (or `max` is reached; `max` itself is
  probed when the doubling would pass it). If `start` does not fit, halve instead, down to 1.
- `binsearch`: `power`, then bisect between the last size that fit and the first that did
  not, until the gap is at most `resolution`; by default 8, or an eighth of the size that
  fits when that is smaller (so 4 still bisects towards 7): memory varies by a few MiB from
  run to run, so a finer answer would be noise, and the answer with a margin is rounded to a
  multiple of 8 anyway.
- A probe that fails for another reason than memory does not stop the search: while doubling
  the search steps over it (two failed sizes in a row end the doubling), and while bisecting
  it counts as an upper bound, so the answer is always a size that actually ran.

The memory cap: on a GPU its memory (or `--memory-limit` as a logical device); on the CPU
`--memory-limit` caps each probe's peak resident memory (see catsdogs.measure.profile: the parent
watches VmHWM and kills a probe that goes over), and without it 90% of the memory available
when the search starts. "Fits" means the probe's peak memory stayed under the cap.

The prediction comes first: after the batch-size-1 probe (the calibration) and before the search,
so it uses no probe above its calibration. On TensorFlow the step's allocations replayed through
a model of its BFC allocator (catsdogs.training.costs.predict_max_batch_size: on the CPU, the pages its
growing regions have had written), arithmetic in this process; on JAX, whose
compiler fuses ops and assigns buffers itself, XLA's own plan of the step
(costs.predict_max_batch_size_planned), compiled at a few batch sizes in a worker of its own.
Either way this process imports no framework. The prediction then sets which probes need a fresh
worker: every probe at or above FRESH_SHARE of the predicted limit (catsdogs.measure.prober says
why a reused worker cannot answer near the limit), and any that ran out of memory in a reused one.

The margin: `margin` (e.g. 0.1) takes that fraction off the largest size that fits, then
rounds down to a multiple of 8 (GPU kernels and tensor cores like multiples of 8), or to a
power of two below 8. That size is probed too if it was not already ("confirm").

The statistics: before the search, the gradient noise scale B_simple (catsdogs.noise) is measured
on a short run, the data's first epoch at the base batch size (32), in a worker of its own that
ends before any probe starts: the critical batch size, beyond which a larger batch buys few steps
(McCandlish et al. 2018). One epoch in is early, and B_simple grows as training goes on
(several-fold, in the paper; on this model's chaotic first epoch it varies from seed to seed), so
this is a cautious estimate. When it lies below the margin's size, the search also probes it,
rounded down as the margin's size is ("critical"), so the recommendation has a probe at the
statistics' limit. `noise_scale=False` (--no-noise-scale) skips it.

The recommendation (`recommend`) joins the three limits: of the sizes that fit and are no larger
than the margin's (memory) and, when the noise scale was measured as a number, no larger than it
(statistics), the fastest (images/s of the probes' median step; speed); a smaller size within 5%
of it wins, being as fast within the probes' noise and kinder to generalization. It names the
limit that binds: statistics when the critical batch size rules out the size memory and speed
alone would pick, memory when that size is the largest the margin allows (a larger batch might
be faster still), else speed (throughput peaked below both). A noise scale that is only a lower
bound rules nothing out. Its learning rate: with the noise scale measured, the paper's rule,
eps(B) = eps(32) (1 + B_noise/32) / (1 + B_noise/B), from the optimizer's Keras default at the base
batch size (32); linear in B well below B_noise, where it agrees with the linear scaling rule,
and flat well above it, where the linear rule would overshoot. Without it, the linear scaling
rule, as a trial's `--lr-scaling linear` does (schema.learning_rate): the Keras default (SGD
0.01, Adam 0.001) times batch size / 32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from catsdogs import config, noise
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.files import write_json_atomic
from catsdogs.host import host_memory_available
from catsdogs.messages import (
    MemoryPlanTask,
    ProbeRecord,
    ProbeTask,
    TrialRecord,
    TrialTask,
    columns,
)
from catsdogs.schema import Status, TrialConfig, default, learning_rate
from catsdogs.training import backends

MODES = ("power", "binsearch")
DEFAULT_START = 8
DEFAULT_STEPS = 3  # timed steps per probe, after one warm-up step: the peak comes in the first
DEFAULT_WARMUP = 1
DEFAULT_MARGIN = 0.1
DEFAULT_RESOLUTION = 8  # the bisection's final gap, or an eighth of the answer when smaller
CALIBRATION_BATCH = 1  # the tiny probe the memory model's runtime baseline comes from
MAX_FAILED_IN_A_ROW = 2
TIE = 0.05  # throughputs within 5% are the same, for the recommendation
HOST_CAP_FRACTION = 0.9
FRESH_SHARE = 0.8  # probes at or above this share of the predicted limit run in a fresh worker

PROBE_COLUMNS = columns(ProbeRecord, "search")  # find_batch_size.csv, and each probe in the .json


# --- pure parts ----------------------------------------------------------------------------------


@dataclass
class SearchResult:
    largest_fit: int | None  # the largest size that fit (None: not even 1)
    first_failure: int | None  # the smallest size above it that did not (None: never failed)
    order: list[int] = field(default_factory=list)  # batch sizes in the order probed
    statuses: dict[int, str] = field(default_factory=dict)
    reached_max: bool = False  # the search stopped at `max` with everything fitting


def effective_resolution(resolution: int | None, largest_fit: int) -> int:
    """The gap the bisection stops at: `resolution` when given; by default DEFAULT_RESOLUTION
    or an eighth of the size that fits, whichever is smaller, and at least 1."""
    if resolution is not None:
        return int(resolution)
    return max(1, min(DEFAULT_RESOLUTION, largest_fit // 8))


def search(probe: Callable[[int], str], mode: str = "binsearch", start: int = DEFAULT_START,
           max_batch: int | None = None, resolution: int | None = None) -> SearchResult:
    """Find the largest batch size for which `probe(batch_size)` says done (it fits).

    `probe` returns a status, done (fits), oom or failed, and is called at most once per batch size."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    if start < 1 or (max_batch is not None and max_batch < 1) or (resolution is not None and resolution < 1):
        raise ValueError("start, max and resolution must be >= 1")
    res = SearchResult(None, None)

    def ask(b: int) -> str:
        if b not in res.statuses:
            res.order.append(b)
            res.statuses[b] = probe(b)
        return res.statuses[b]

    b = min(start, max_batch) if max_batch is not None else start
    lo = hi = None
    if ask(b) == Status.DONE:
        lo = b
    else:  # the start is too large: halve until something fits
        hi = b
        while b > 1:
            b //= 2
            if ask(b) == Status.DONE:
                lo = b
                break
            hi = b
    if lo is None:
        return res
    if hi is None:  # double until out of memory, `max`, or failures in a row
        b, failed_run = lo, []
        while max_batch is None or b < max_batch:
            b = b * 2 if max_batch is None else min(b * 2, max_batch)
            status = ask(b)
            if status == Status.DONE:
                lo, failed_run = b, []
            elif status == Status.OOM:
                hi = failed_run[0] if failed_run else b
                break
            else:
                failed_run.append(b)
                if len(failed_run) >= MAX_FAILED_IN_A_ROW:
                    hi = failed_run[0]
                    break
        else:
            res.reached_max = not failed_run
            if failed_run:
                hi = failed_run[0]
    if mode == "binsearch" and hi is not None:
        while hi - lo > effective_resolution(resolution, lo):
            mid = (lo + hi) // 2
            if ask(mid) == Status.DONE:
                lo = mid
            else:
                hi = mid
    res.largest_fit, res.first_failure = lo, hi
    return res


def apply_margin(largest: int, margin: float) -> int:
    """`largest` less the fraction `margin`, rounded down to a multiple of 8 (a power of two
    below 8). margin 0 returns `largest` itself, unrounded; never less than 1."""
    if not 0 <= margin < 1:
        raise SettingError(f"margin must be in [0, 1), got {margin}", "margin")
    if largest < 1:
        raise ValueError(f"nothing to take a margin off: {largest}")
    if margin == 0:
        return largest
    target = math.floor(largest * (1 - margin) + 1e-9)
    if target >= 8:
        return target // 8 * 8
    return 2 ** int(math.log2(target)) if target >= 1 else 1


def round_batch(value: float) -> int:
    """A batch size at or below `value`, as the margin's is rounded: a multiple of 8, or a power
    of two below 8; at least 1."""
    whole = max(1, math.floor(value + 1e-9))
    return whole // 8 * 8 if whole >= 8 else 2 ** int(math.log2(whole))


def critical_probe(measured: dict | None, safe: int | None) -> int | None:
    """The batch size to probe at the critical batch size (rounded down), when the noise scale is
    a number below the memory limit's size; None otherwise."""
    if not measured or measured.get("b_simple") is None or safe is None:
        return None
    size = round_batch(measured["b_simple"])
    return size if size < safe else None


def linear_scaled_lr(optimizer: str, batch_size: int) -> float:
    """The linear scaling rule from the optimizer's Keras default at the base batch size: the
    learning rate a trial with `--lr-scaling linear` trains with."""
    return learning_rate(TrialConfig(optimizer, batch_size, "standard", 0, lr_scaling="linear"))


def fastest(probes: list[ProbeRecord]) -> ProbeRecord | None:
    """The fastest of `probes`; a smaller one within TIE of it wins."""
    if not probes:
        return None
    best = max(p.images_per_second for p in probes)
    return min((p for p in probes if p.images_per_second >= (1 - TIE) * best), key=lambda p: p.batch_size)


def recommend(probes: list[ProbeRecord], safe: int, critical: float | None = None) -> tuple[ProbeRecord | None, str | None]:
    """(the recommended probe, the limit that binds: "memory", "speed" or "statistics").

    Of the probes that fit with batch size <= safe (memory) and <= `critical` (statistics: the
    critical batch size, when known as a number), the fastest (speed); a smaller one within TIE
    of it wins. When the critical batch size is below every fitting size, the smallest fits."""
    fits = [p for p in probes if p.status == Status.DONE and p.batch_size <= safe and p.images_per_second]
    if not fits:
        return None, None
    by_speed = fastest(fits)
    if critical is not None and by_speed.batch_size > critical:
        within = [p for p in fits if p.batch_size <= critical]
        return (fastest(within) if within else min(fits, key=lambda p: p.batch_size)), "statistics"
    largest = max(p.batch_size for p in fits)
    return by_speed, ("memory" if by_speed.batch_size == largest else "speed")


def fresh_threshold(predicted_max: int) -> int:
    """The smallest batch size that gets a fresh worker, given the predicted largest that fits."""
    return max(1, math.ceil(FRESH_SHARE * predicted_max))


def percent_apart(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


# --- the search, probing for real ------------------------------------------------------------------


METHODS = {"bfc": "the step replayed through TensorFlow's allocator", "xla": "XLA's memory plan"}


def _probe_line(p: ProbeRecord) -> str:
    worker = {"fresh": "", "reused": "", "retried": " (out of memory in a reused worker; again in a fresh one)"}
    parts = [f"{p.phase:<9} batch size {p.batch_size:>5}: {p.status}{worker.get(p.worker or '', '')}"]
    if p.peak_memory_mb is not None:
        cap = f" of {p.memory_cap_mb:.0f}" if p.memory_cap_mb else ""
        parts.append(f"peak {p.peak_memory_mb:.0f}{cap} MiB")
    if p.status == Status.DONE and p.images_per_second:
        parts.append(f"{p.images_per_second:.1f} images/s")
    if p.status == Status.FAILED and p.error:
        parts.append(p.error.splitlines()[0][:200])
    return ", ".join(parts)


def find_batch_size(name: str, data_dir: Path, out: Path = Path(config.DEFAULT_OUT), *,
                    mode: str = "binsearch", start: int = DEFAULT_START, max_batch: int | None = None,
                    margin: float = DEFAULT_MARGIN, optimizer: str = "adam", dataset: str = "standard",
                    precision: str = "float32", steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                    memory_cap_bytes: int | None = None, resolution: int | None = None,
                    isolate: bool = False, noise_scale: bool = True, deterministic: bool = True,
                    tf32: bool | None = None, worker_env: dict | None = None,
                    log: Callable[[str], None] = print) -> dict:
    """Search, predict, measure the noise scale, recommend; write OUT/NAME/find_batch_size.json and
    .csv; return the summary.

    Raises SettingError for impossible settings, CatsdogsError when the data is not prepared or
    when not even batch size 1 fits (after writing the records). `isolate`: a fresh worker
    process for every probe; `deterministic`, `tf32`: every worker's process settings;
    `worker_env`: more of their environment (the compile cache)."""
    from catsdogs.host import versions
    from catsdogs.manifest import require_prepared
    from catsdogs.measure import profile as prof
    from catsdogs.measure.prober import Prober

    prof.check_settings([start], optimizer, dataset, precision, steps, warmup)
    if mode not in MODES:
        raise SettingError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}", "mode")
    if max_batch is not None and max_batch < 1:
        raise SettingError(f"--max must be >= 1, got {max_batch}", "max")
    if resolution is not None and resolution < 1:
        raise SettingError(f"resolution must be >= 1, got {resolution}", "resolution")
    apply_margin(1, margin)  # validates the margin
    manifest = require_prepared(Path(data_dir))
    size = manifest["params"]["size"]
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    work = folder / ".work"
    cpu_cap = None
    if memory_cap_bytes is None:
        avail = host_memory_available()
        cpu_cap = int(HOST_CAP_FRACTION * avail) if avail else None
    settings = {"name": name, "mode": mode, "start": start, "max": max_batch, "margin": margin,
                "optimizer": optimizer, "dataset": dataset, "precision": precision, "steps": steps,
                "warmup": warmup, "resolution": resolution, "memory_cap_bytes": memory_cap_bytes,
                "noise_scale": noise_scale, "deterministic": deterministic, "tf32": tf32,
                "cpu_cap_bytes_default": cpu_cap, "image_size": size,
                "data_dir": str(Path(data_dir).resolve())}
    cap_text = (f"each probe capped at {prof.format_bytes(memory_cap_bytes)}" if memory_cap_bytes else
                "on a GPU its memory is the cap; on the CPU "
                + (f"{prof.format_bytes(cpu_cap)} (90% of the memory available now)" if cpu_cap else "no cap"))
    log(f"Find batch size {name}: {mode} from {start}{f' up to {max_batch}' if max_batch else ''}, "
        f"{optimizer}, {dataset} data ({size} px), {precision}; {cap_text}" + prof.settings_note(deterministic, tf32))
    env = {**(worker_env or {}), **backends.process_env_for(deterministic, tf32)}  # every worker's

    probes: list[ProbeRecord] = []

    def run(bs: int, phase: str) -> ProbeRecord:
        for p in probes:
            if p.batch_size == bs:
                return p
        task = ProbeTask(bs, str(Path(data_dir).resolve()), optimizer=optimizer, dataset=dataset,
                         precision=precision, steps=steps, warmup=warmup, deterministic=deterministic, tf32=tf32)
        p = prober.run(task)
        p.order, p.phase = len(probes) + 1, phase
        probes.append(p)
        log(_probe_line(p))
        return p

    # The statistics first, in a worker of its own that ends before any probe starts: the probes'
    # memory is not touched, and the search can then probe the critical batch size itself.
    measured = (measure_noise_scale(data_dir, manifest, optimizer, dataset, precision, work, log, env=env)
                if noise_scale else None)
    prober = Prober(work, memory_cap_bytes, cpu_cap_bytes=cpu_cap, isolate=isolate, env=env)
    pred = None
    try:
        calib = run(CALIBRATION_BATCH, "calibrate")
        cap_mb = calib.memory_cap_mb or calib.device_memory_limit_mb
        if calib.status == Status.DONE and calib.peak_memory_mb and cap_mb:
            train_images = sum(manifest["counts"][dataset]["train"].values())
            pred = _predict(calib, cap_mb, data_dir, work, size, train_images, optimizer, dataset, precision,
                            warmup + steps, log, env)
        if pred:
            prober.fresh_from = fresh_threshold(pred["max_batch_size"])
            log(f"Predicted before the search: {pred['max_batch_size']} ({METHODS[pred['method']]}); "
                f"probes of {prober.fresh_from} and above run in a fresh worker.")
        result = search(lambda b: run(b, "search").status, mode=mode, start=start,
                        max_batch=max_batch, resolution=resolution)
        safe = apply_margin(result.largest_fit, margin) if result.largest_fit is not None else None
        if safe is not None and safe not in {p.batch_size for p in probes}:
            run(safe, "confirm")
        critical = critical_probe(measured, safe)
        if critical is not None and critical not in {p.batch_size for p in probes}:
            run(critical, "critical")  # the statistics' limit, so the recommendation can stand on it
    finally:
        prober.close()
    summary = _decide(result, probes, safe, optimizer, measured)
    summary["settings"] = settings
    summary["prediction"] = None
    if pred:
        for p in probes:
            p.predicted_peak_mb = _predicted_peak_bytes(pred, p.batch_size, settings) / 2**20
        summary["prediction"] = {**pred, "calibration_batch_size": CALIBRATION_BATCH,
                                 "calibration_peak_mb": calib.peak_memory_mb, "fresh_from": prober.fresh_from}
        if result.largest_fit:
            summary["prediction"]["percent_apart"] = percent_apart(pred["max_batch_size"], result.largest_fit)
    summary["memory_fraction"] = calib.memory_fraction

    summary["probes"] = [p.view("search") for p in probes]
    summary["versions"] = versions()
    _write(folder, summary)
    for line in summary_lines(summary):
        log(line)
    if result.largest_fit is None:
        first = probes[0]
        raise CatsdogsError(
            f"no batch size fits: batch size {first.batch_size} already {first.status}"
            f"{': ' + first.error.splitlines()[0] if first.error else ''} "
            f"(records in {folder / 'find_batch_size.json'})")
    return summary


def _decide(result: SearchResult, probes: list[ProbeRecord], safe: int | None, optimizer: str,
            measured: dict | None) -> dict:
    """The measured answer, the margin's size, the fastest, the noise scale, the recommendation."""
    summary: dict = {"largest_fitting": result.largest_fit,
                     "first_not_fitting": result.first_failure, "reached_max": result.reached_max,
                     "noise_scale": measured}
    if result.largest_fit is None:
        return summary
    summary["margin_batch_size"] = safe
    fits = [p for p in probes if p.status == Status.DONE and p.images_per_second]
    top = max(fits, key=lambda p: p.images_per_second) if fits else None
    summary["fastest"] = {"batch_size": top.batch_size, "images_per_second": top.images_per_second} if top else None
    critical = (measured or {}).get("b_simple")
    rec, binding = recommend(probes, safe, critical)
    if rec:
        base = default("base_batch_size")
        base_lr = linear_scaled_lr(optimizer, base)
        lr = (noise.paper_learning_rate(base_lr, base, rec.batch_size, critical) if critical
              else linear_scaled_lr(optimizer, rec.batch_size))
        summary["recommendation"] = {
            "batch_size": rec.batch_size, "images_per_second": rec.images_per_second, "binding": binding,
            "learning_rate": lr, "learning_rate_rule": "paper" if critical else "linear",
            "linear_learning_rate": linear_scaled_lr(optimizer, rec.batch_size),
            "base_learning_rate": base_lr, "base_batch_size": base}
    return summary


def noise_settings() -> noise.NoiseSettings:
    """find-batch-size's measurement: eight times a sweep's pairs, for a narrow interval: it is
    the one measurement the recommendation rests on."""
    return noise.NoiseSettings(pairs=NOISE_PAIRS)


NOISE_PAIRS = 8 * config.NOISE_PAIRS


def measure_noise_scale(data_dir: Path, manifest: dict, optimizer: str, dataset: str, precision: str, work: Path,
                        log: Callable[[str], None], env: dict | None = None) -> dict | None:
    """B_simple after the data's first epoch at the base batch size, trained as a sweep's trial is
    (seed 0), in a worker of its own; with the measurement's wall time (worker start included).
    None, said in the log, when the short run failed."""
    import time

    from catsdogs.training.worker import run_isolated

    base = default("base_batch_size")
    cfg = TrialConfig(optimizer, base, dataset, 0, epochs=1, image_size=manifest["params"]["size"],
                      data=manifest["fingerprint"][dataset], precision=precision, backend=backends.name(),
                      **backends.process_settings(env or {}))
    log(f"Noise scale: one epoch at batch size {base}, then B_simple from {NOISE_PAIRS} pairs of "
        f"{config.NOISE_MICRO} and {config.NOISE_MICRO * config.NOISE_MICROS} images ...")
    started = time.perf_counter()
    log_path = work / "noise-scale.log"
    record: TrialRecord = run_isolated(TrialTask(cfg, str(Path(data_dir).resolve()), noise_settings().as_dict()),
                                       log_path, env)
    seconds = time.perf_counter() - started
    if record.status != Status.DONE or not record.history:
        log(f"Noise scale not measured: the short run {record.status}: {_first_line(record.error)} "
            f"(log: {log_path})")
        return None
    log_path.unlink(missing_ok=True)
    last = record.history[-1]
    return {"b_simple": last["noise_scale"], "low": last["noise_scale_low"], "high": last["noise_scale_high"],
            "gradient_sq": last["noise_gradient_sq"], "trace": last["noise_trace"], "epochs": 1,
            "batch_size": base, "initial": record.initial_noise, "pairs": NOISE_PAIRS,
            "small": config.NOISE_MICRO, "large": config.NOISE_MICRO * config.NOISE_MICROS,
            "measure_seconds": record.noise_seconds, "seconds": round(seconds, 2)}


def _write(folder: Path, summary: dict) -> None:
    from catsdogs.measure.profile import write_csv

    write_json_atomic(folder / "find_batch_size.json", summary, indent=2)
    write_csv(summary["probes"], folder / "find_batch_size.csv", PROBE_COLUMNS)


def _first_line(text) -> str:
    return next(iter(str(text or "").splitlines()), "") or "no reason given"


def _predict(calib: ProbeRecord, cap_mb: float, data_dir: Path, work: Path, size: int, train_images: int,
             optimizer: str, dataset: str, precision: str, steps: int, log, env: dict) -> dict | None:
    """The backend's memory model's answer, calibrated on the batch-1 probe: XLA's plan where the
    backend's compiler states one (JAX), compiled in a worker of its own; else TensorFlow's step
    replayed through BFC. None when the plan could not be made (said in the log)."""
    from catsdogs.training.worker import run_isolated

    cap_bytes, peak_bytes = cap_mb * 2**20, calib.peak_memory_mb * 2**20
    if backends.current().compiled_step_bytes is None:
        from catsdogs.training.costs import predict_max_batch_size

        device = "cpu" if calib.memory_kind == "cpu-rss" else "gpu"
        return {**predict_max_batch_size(cap_bytes, CALIBRATION_BATCH, peak_bytes, size, optimizer, precision,
                                         train_images=train_images, device=device, steps=steps),
                "train_images": train_images, "device": device, "steps": steps}
    log_path = work / "memory-plan.log"
    settings = backends.process_settings(env)
    task = MemoryPlanTask(str(data_dir), optimizer, dataset, precision, cap_bytes, CALIBRATION_BATCH, peak_bytes,
                          **settings)
    plan = run_isolated(task, log_path, env)
    if plan.status != Status.DONE:
        log(f"XLA's memory plan failed: {_first_line(plan.error)} (log: {log_path})")
        return None
    log_path.unlink(missing_ok=True)
    pred = {k: v for k, v in plan.as_dict().items() if k not in ("status", "error", "traceback")}
    pred["planned_bytes"] = {int(b): v for b, v in pred["planned_bytes"].items()}
    return pred


def _predicted_peak_bytes(pred: dict, batch: int, s: dict) -> float:
    """A probe's peak by the prediction: the BFC replay's, or the line of XLA's plan."""
    if pred["method"] == "bfc":
        from catsdogs.training.costs import predicted_peak_bytes

        return predicted_peak_bytes(batch, pred["baseline_bytes"], s["image_size"], s["optimizer"], s["precision"],
                                    pred["train_images"], pred["device"], pred["steps"])
    return pred["baseline_bytes"] + pred["state_bytes"] + pred["per_image_bytes"] * batch


def _linear_rule_note(rec: dict, b_noise: float) -> str:
    """How the linear scaling rule compares with the paper's, and why."""
    if rec["batch_size"] > b_noise:
        return ", too large: above the critical batch size a larger batch no longer takes larger steps."
    if abs(rec["learning_rate"] / rec["linear_learning_rate"] - 1) <= 0.2:
        return ", close to it, as it should be well below the critical batch size."
    return (f", which holds only when both batch sizes ({rec['batch_size']} and {rec['base_batch_size']}) are well "
            "below the critical batch size, as they are not here.")


def summary_lines(summary: dict) -> list[str]:
    """The end of the command's output: measured, predicted, margin, fastest, recommendation."""
    s = summary["settings"]
    lines = []
    largest = summary["largest_fitting"]
    probes = summary["probes"]
    cap_mb = next((p.get("memory_cap_mb") or p.get("device_memory_limit_mb") for p in probes
                   if p.get("memory_cap_mb") or p.get("device_memory_limit_mb")), None)
    under = f" under {cap_mb:.0f} MiB" if cap_mb else ""
    if largest is None:
        lines.append(f"No batch size fits{under}.")
    else:
        nxt = summary["first_not_fitting"]
        why = (f"; {nxt} did not" if nxt else
               f"; every size up to --max {s['max']} fit" if summary["reached_max"] else "")
        lines.append(f"Largest batch size that fits{under}: {largest} (measured{why}).")
    fraction = summary.get("memory_fraction")
    if fraction and cap_mb:
        lines.append(f"That limit is XLA's: {fraction:.0%} of the GPU's memory (XLA_CLIENT_MEM_FRACTION, 75% by "
                     f"default, with preallocation off too); a training run gets the same unless it sets it.")
    pred = summary.get("prediction")
    if pred:
        apart = f" ({pred['percent_apart']:+.1f}% from the measured {largest})" if "percent_apart" in pred else ""
        if pred.get("method") == "xla":
            lines.append(
                f"XLA's memory plan predicts {pred['max_batch_size']}{apart}: "
                f"{pred['per_image_bytes'] / 2**20:.2f} MiB per image, {pred['state_bytes'] / 2**20:.0f} MiB "
                f"batch-independent, as compiled at batch sizes {', '.join(map(str, pred['planned_bytes']))}; "
                f"{pred['baseline_bytes'] / 2**20:.0f} MiB runtime baseline "
                f"(from the batch-size-{pred['calibration_batch_size']} probe).")
        else:
            written = " written" if pred.get("device") == "cpu" else ""
            lines.append(
                f"The step replayed through TensorFlow's allocator predicts {pred['max_batch_size']}{apart}: "
                f"{pred['per_image_bytes'] / 2**20:.2f} MiB{written} per image up to it, "
                f"{pred['state_bytes'] / 2**20:.0f} MiB of weights, gradients and {s['optimizer']} slots, "
                f"{pred['baseline_bytes'] / 2**20:.0f} MiB runtime baseline "
                f"(from the batch-size-{pred['calibration_batch_size']} probe).")
    if largest is None:
        return lines
    if summary.get("fastest"):
        f = summary["fastest"]
        lines.append(f"Fastest that fits: {f['batch_size']} at {f['images_per_second']:.1f} images/s "
                     f"(median of {s['steps']} steps per probe).")
    if s["margin"]:
        lines.append(f"With a {s['margin']:.0%} margin: {summary['margin_batch_size']}.")
    measured = summary.get("noise_scale")
    if measured:
        shown = noise.describe(measured)
        lines.append(f"Critical batch size (the gradient noise scale B_simple after one epoch at batch size "
                     f"{measured['batch_size']}): {shown}; measured in {measured['seconds']:.0f} s. It grows as "
                     "training goes on, so this early value is a cautious one.")
    elif s.get("noise_scale"):
        lines.append("Critical batch size: not measured (the short run failed; see above).")
    rec = summary.get("recommendation")
    if not rec:
        lines.append("No recommendation: no size at or below the margin's fit with a throughput measured.")
        return lines
    why = {"memory": f"memory binds: it is the largest size the {s['margin']:.0%} margin allows, and the fastest",
           "speed": "speed binds: throughput peaked below the memory limit"
                    + (" and the critical batch size" if measured and measured.get("b_simple") else ""),
           "statistics": "statistics binds: a larger batch would be faster but is above the critical batch "
                         "size, where it buys few steps"}[rec["binding"]]
    lines.append(f"Recommendation: batch size {rec['batch_size']}, {rec['images_per_second']:.1f} images/s ({why}).")
    if rec["learning_rate_rule"] == "paper":
        b_noise = measured["b_simple"]
        lines.append(
            f"Learning rate {rec['learning_rate']:.3g}: the paper's rule, {s['optimizer']}'s default "
            f"{rec['base_learning_rate']:g} at batch size {rec['base_batch_size']} x (1 + {b_noise:.0f}/"
            f"{rec['base_batch_size']}) / (1 + {b_noise:.0f}/{rec['batch_size']}); the linear scaling rule "
            f"would give {rec['linear_learning_rate']:.3g}" + _linear_rule_note(rec, b_noise))
    else:
        lines.append(
            f"Learning rate {rec['learning_rate']:.3g} ({s['optimizer']}'s default {rec['base_learning_rate']:g} "
            f"x {rec['batch_size']}/{rec['base_batch_size']}, the linear scaling rule"
            + ("; the noise scale is only a lower bound, so the paper's rule cannot be applied)." if measured else ")."))
        lines.append("The linear scaling rule holds only below the critical batch size: check the accuracy, "
                     "and consider a learning-rate warm-up at large batch sizes.")
    return lines
