"""Throughput, memory and utilization of the article's model (or a user's, --model) as functions of batch size.

`profile(name, batch_sizes, data_dir, out, ...)` runs one probe per batch size (the sweep's own
training step, warmed up, then `steps` steps timed on batches of the prepared train split:
catsdogs.training.probes.run_probe) in workers (catsdogs.measure.prober: one worker reused while
the batch sizes grow). Before the probes, the device's matrix-multiply peak (a loop of large
matmuls in the precision policy's compute dtype) is measured, against which each probe's achieved
model FLOP/s gives its model FLOPs utilization (MFU). Out of memory is a recorded outcome
(status oom), never a crash. Results: OUT/NAME/profile.csv (one row per batch size: the
"profile" view of messages.ProbeRecord), OUT/NAME/profile.json (the same plus settings and the
peak) and OUT/NAME/figures/*.png|svg (catsdogs.measure.figures).

Memory. On a GPU the peak is the framework's allocator peak, and NVML's view (utilization,
memory used) is sampled while the timed steps run when `nvidia-ml-py` is installed. On the CPU
it is the worker's peak resident set (VmHWM) since the probe started, which includes the runtime
and the data held in memory, and whatever a smaller probe before it in the same worker left in
the allocator's pool; the resident set just before the model is built is recorded too
(`baseline_rss_mb`), and the peak of TensorFlow's own CPU allocator (`allocator_peak_mb`).

A memory cap (`memory_cap_bytes`) makes the worker's memory stand in for a device's: on the CPU
"fits" means exactly "peak resident memory <= cap" (the parent watches it and stops a probe the
moment it goes over); on a GPU the cap becomes a logical device's memory limit. Why the cap is
watched rather than set with rlimits, oneDNN's limit or cgroups: docs/performance.md, "Memory caps
on the CPU". Memory figures are MiB (2**20 bytes), named `_mb` as everywhere in catsdogs.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

from catsdogs import config
from catsdogs.files import write_json_atomic
from catsdogs.host import versions
from catsdogs.manifest import require_intact
from catsdogs.measure import model_check
from catsdogs.measure import prober as probers
from catsdogs.measure.common import check_memory_floor, check_settings, settings_note, write_csv
from catsdogs.measure.figures import save_profile_figures
from catsdogs.messages import PeakRecord, PeakTask, ProbeRecord, ProbeTask, columns
from catsdogs.runtime.backends import process_env_for
from catsdogs.schema import FINISHED, Status

DEFAULT_STEPS = 20
DEFAULT_WARMUP = 2  # the first step traces and compiles, the second may still autotune
PEAK_SECONDS = 1.0  # each of the matmul peak's three timings lasts about this long

PROFILE_COLUMNS = columns(ProbeRecord, "profile")


# --- the profile ---------------------------------------------------------------------------------


def profile_row(record: ProbeRecord, peak: PeakRecord | None, image_size: int | None = None) -> dict:
    """One CSV row (the record's profile view) from a probe's record and the matmul peak; a probe
    whose worker died before it measured anything gets the data's image size."""
    if record.image_size is None:
        record.image_size = image_size
    peak_flops = peak.peak_flops_per_second if peak else None
    record.peak_flops_per_second = peak_flops
    if record.flops_per_second and peak_flops:
        record.mfu_percent = 100.0 * record.flops_per_second / peak_flops
    if record.peak_memory_mb is not None and record.baseline_rss_mb is not None \
            and record.memory_kind == "cpu-rss":
        record.memory_above_baseline_mb = record.peak_memory_mb - record.baseline_rss_mb
    if record.error:
        record.error = record.error.splitlines()[0][:500]
    if not record.device and peak:
        record.device = peak.device
    return record.view("profile")


def read_table(path: Path) -> list[dict]:
    """profile.csv back as rows with numbers (empty cells -> None)."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v == "":
                    row[k] = None
                elif k == "status":
                    row[k] = Status({"ok": "done"}.get(v, v))  # "ok": profiles written before catsdogs 0.3.0
                elif k in ("batch_size", "steps", "warmup", "image_size"):
                    row[k] = int(v)
                else:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def progress_line(row: dict) -> str:
    bs = f"batch size {row['batch_size']:>5}"
    if row["status"] != Status.DONE:
        return f"{bs}: {row['status']}: {row.get('error') or ''}".rstrip(": ")
    mem = f"peak {row['peak_memory_mb']:.0f} MiB ({row['memory_kind']}"
    if row.get("baseline_rss_mb") is not None and row["memory_kind"] == "cpu-rss":
        mem += f", {row['baseline_rss_mb']:.0f} MiB before the model"
    mem += ")"
    mfu = f", MFU {row['mfu_percent']:.1f}%" if row.get("mfu_percent") is not None else ""
    nvml = (f", NVML util {row['nvml_gpu_util_mean_percent']:.0f}% (mean of {row.get('nvml_samples')} samples "
            f"over {row.get('timed_seconds') or 0:.1f} s)"
            if row.get("nvml_gpu_util_mean_percent") is not None else "")
    flops = f", {row['flops_per_second'] / 1e9:.2f} GFLOP/s" if row.get("flops_per_second") is not None else ""
    return (f"{bs}: {row['step_time_median_s'] * 1000:.1f} ms/step (median), "
            f"{row['images_per_second']:.1f} images/s{flops}{mfu}{nvml}, {mem}")


def profile(name: str, batch_sizes: Sequence[int], data_dir: Path, out: Path = Path(config.DEFAULT_OUT), *,
            optimizer: str = "adam", dataset: str = "standard", precision: str = "float32",
            steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP, memory_cap_bytes: int | None = None,
            min_seconds: float | None = None, measure_peak: bool = True, peak_seconds: float | None = None,
            isolate: bool = False, deterministic: bool = True, tf32: bool | None = None,
            worker_env: dict | None = None, model: str | None = None, loss: str = "auto",
            images: Path | None = None, arrays: tuple | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """Profile each batch size (in workers: measure.prober.Prober); write OUT/NAME/profile.csv|json
    and figures. `isolate`: a fresh worker process for each probe; `deterministic`, `tf32`: the
    workers' process settings (the matmul peak too runs under them: TF32 changes it most);
    `worker_env`: more of the workers' environment (the compile cache). `model`: a user's model
    (catsdogs.model_ref; None: the article's), checked in a worker first, with `loss`
    (catsdogs.measure.model_check), on `images` (a folder of class subfolders, --data) or `arrays`
    (the Python API's (x, y), read once into the workers' decoded copy), else the prepared data
    where they fit it, else random images.

    Returns the rows (one per batch size, in the order given). Raises CatsdogsError when the
    data is not prepared, SettingError for impossible settings (a model that cannot be used too)."""
    check_settings(batch_sizes, optimizer, dataset, precision, steps, warmup)
    peak_seconds = PEAK_SECONDS if peak_seconds is None else peak_seconds  # (read when called: tests/conftest.py)
    folder = Path(out) / name
    work = folder / ".work"
    env = {**(worker_env or {}), **process_env_for(deterministic, tf32)}
    user = probe_data = None
    model_check.check_options(model, loss, images, precision)
    if model is not None:
        model, user = model_check.check_user_model(model, loss, work / "model-check.log", env)
        probe_data = model_check.data_for(user, data_dir, images, work, arrays)
        manifest, size = probe_data.manifest, user.input_shape[0]
    else:
        manifest = require_intact(Path(data_dir))
        size = manifest["params"]["size"]
        check_memory_floor(memory_cap_bytes, size, optimizer, precision)
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"name": name, "batch_sizes": [int(b) for b in batch_sizes], "optimizer": optimizer,
                "dataset": dataset, "precision": precision, "steps": steps, "warmup": warmup,
                "image_size": size, "data_dir": str(Path(data_dir).resolve()),
                "memory_cap_bytes": memory_cap_bytes, "min_seconds": min_seconds, "peak_seconds": peak_seconds,
                "deterministic": deterministic, "tf32": tf32}
    what = f"{optimizer}, {dataset} data ({size} px), {precision}"
    if user:
        settings.update(model=model, loss=loss, **probe_data.record())
        what = f"{model_check.describe(user)}; {optimizer}, {precision}, on {probe_data.said}"
    log(f"Profile {name}: batch sizes {', '.join(map(str, batch_sizes))}; {what}; {warmup} warm-up + {steps} "
        "timed steps each" + settings_note(deterministic, tf32))
    prober = probers.Prober(work, memory_cap_bytes, isolate=isolate, env=env)
    try:
        peak, rows = _probe_all(prober, batch_sizes, data_dir, settings, folder / "profile.csv",
                                measure_peak, log, decoded=probe_data.decoded if probe_data else None)
    finally:
        prober.close()
        if probe_data and probe_data.decoded:  # the folder's decoded copy: the probes are done with it
            Path(probe_data.decoded).unlink(missing_ok=True)
    figures = save_profile_figures(rows, folder / "figures", reference=user is None)
    doc = {"settings": settings, "peak": peak and peak.as_dict(), "rows": rows, "versions": versions(),
           "data": {k: manifest[k] for k in ("params", "source", "fingerprint")} if manifest else None}
    if user:
        doc["model"] = model_check.recorded(user)
    write_json_atomic(folder / "profile.json", doc, indent=2)
    counts = {s: sum(r["status"] == s for r in rows) for s in FINISHED}
    log(f"Profile {name}: {counts[Status.DONE]} done, {counts[Status.OOM]} out of memory, {counts[Status.FAILED]} failed -> "
        f"{folder / 'profile.csv'}, {len(figures)} figures in {folder / 'figures'}")
    return rows


def _probe_all(prober, batch_sizes, data_dir, settings: dict, csv_path: Path, measure_peak: bool,
               log, decoded: str | None = None) -> tuple[PeakRecord | None, list[dict]]:
    """The matmul peak, then each batch size's probe; the CSV rewritten after each probe. `decoded`:
    a --data folder's decoded copy, which the probes read in its place (model_check.data_for)."""
    peak = None
    if measure_peak:
        peak = prober.run(PeakTask(settings["precision"], settings["peak_seconds"]))
        if peak.status == Status.DONE:
            log(f"matmul peak: {peak.peak_flops_per_second / 1e9:.1f} GFLOP/s "
                f"({peak.matmul_size}x{peak.matmul_size} {peak.matmul_dtype}, {peak.device})")
        else:
            log(f"matmul peak: {peak.status}: {(peak.error or '').splitlines()[0]}; no MFU")
            peak = None
    rows = []
    for bs in batch_sizes:
        task = ProbeTask(int(bs), str(Path(data_dir).resolve()), optimizer=settings["optimizer"],
                         dataset=settings["dataset"], precision=settings["precision"], steps=settings["steps"],
                         warmup=settings["warmup"], min_seconds=settings.get("min_seconds"),
                         deterministic=settings["deterministic"], tf32=settings["tf32"],
                         model=settings.get("model"), loss=settings.get("loss", "auto"),
                         input_spec=settings.get("input_spec"), data_folder=decoded or settings.get("data_folder"))
        row = profile_row(prober.run(task), peak, settings["image_size"])
        rows.append(row)
        write_csv(rows, csv_path, PROFILE_COLUMNS)
        log(progress_line(row))
    return peak, rows
