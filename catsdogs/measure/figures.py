"""The profile's three figures: throughput, memory and utilization against batch size.

Plot functions take an axis and a table (rows as profile.csv holds them) and return the artists
they drew; `make_figure` builds a matplotlib `Figure` (no pyplot, no global state). The batch axis
and the files are every figure's (catsdogs.plotting).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from catsdogs.plotting import batch_axis, save_figure
from catsdogs.schema import Status

# The article's "other tables" (docs/protocol.md): a thesis it cites, another model and data set,
# TensorFlow on a GPU. Drawn as a reference series, never compared number for number.
THESIS_LABEL = "article's thesis table (other model & data, GPU)"
THESIS_BATCH_SIZES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
THESIS_GPU_USAGE_PERCENT = (5.65, 5.65, 29.01, 30.46, 36.17, 30.67, 24.88, 22.45, 22.14)
THESIS_GPU_MEMORY_MB = (694.274, 665.804, 649.137, 620.909, 694.563, 641.000, 541.333, 535.063, 535.063)


def _series(table: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = sorted((int(r["batch_size"]), float(r[key])) for r in table
                 if r.get("status") == Status.DONE and r.get(key) is not None)
    return [p[0] for p in pts], [p[1] for p in pts]


def _mark_oom(ax, table: list[dict]) -> None:
    """Batch sizes that ran out of memory (or failed): a cross on the x axis, labelled."""
    for status, marker, color in ((Status.OOM, "x", "tab:red"), (Status.FAILED, "X", "0.3")):
        xs = sorted(int(r["batch_size"]) for r in table if r.get("status") == status)
        if xs:
            ax.plot(xs, [0] * len(xs), linestyle="none", marker=marker, color=color, markersize=9,
                    transform=ax.get_xaxis_transform(), clip_on=False, zorder=5,
                    label="out of memory" if status == Status.OOM else "failed")


def _device_note(table: list[dict]) -> str:
    devices = sorted({str(r["device"]) for r in table if r.get("device")})
    return "; ".join(devices)


def _reference(ax, values: Sequence[float], unit: str, our_unit: str, ylabel: str):
    """The thesis series: on `ax` when the units match, else on a secondary y axis."""
    target = ax
    if unit != our_unit:
        target = ax.twinx()
        target.set_ylabel(ylabel)
    (line,) = target.plot(THESIS_BATCH_SIZES, values, linestyle="--", marker="s", markersize=4,
                          color="0.45", label=THESIS_LABEL, zorder=2)
    return target, line


def _finish_axes(ax, table: list[dict], what: str, ylabel: str, thesis: tuple | None = None,
                 legend_loc: str = "best"):
    """What every profile figure ends with: out-of-memory sizes marked, the thesis series when
    given (as _reference's arguments; the batch axis then spans its sizes too), the log2 batch
    axis, labels and the legend. Returns the thesis line, or None."""
    _mark_oom(ax, table)
    sizes = [r["batch_size"] for r in table]
    line = None
    if thesis is not None:
        _, line = _reference(ax, *thesis)
        sizes += list(THESIS_BATCH_SIZES)
    batch_axis(ax, sizes)
    ax.grid(True, alpha=0.3)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{what} vs batch size\n{_device_note(table)}", fontsize=10)
    ax.legend(loc=legend_loc, fontsize=8)
    return line


def plot_throughput(ax, table: list[dict]) -> dict:
    """Images per second against batch size (median step time), out-of-memory sizes marked."""
    xs, ys = _series(table, "images_per_second")
    (line,) = ax.plot(xs, ys, marker="o", color="tab:blue", label="images/s (median step)")
    _finish_axes(ax, table, "Throughput", "training throughput (images/s)")
    return {"throughput": line}


def plot_memory(ax, table: list[dict], reference: bool = True) -> dict:
    """Peak memory against batch size; on the CPU also the resident set before the model and
    the peak of TensorFlow's CPU allocator (the tensors alone); NVML's memory used when sampled;
    the thesis's GPU memory (MB) as a reference series, on the same axis (MiB)."""
    out = {}
    kinds = {r.get("memory_kind") for r in table if r.get("memory_kind")}
    what = "GPU, TensorFlow allocator peak" if kinds == {"gpu"} else "process peak RSS" \
        if kinds == {"cpu-rss"} else "peak"
    xs, ys = _series(table, "peak_memory_mb")
    (out["peak"],) = ax.plot(xs, ys, marker="o", color="tab:purple", label=f"peak memory ({what})")
    if kinds == {"cpu-rss"}:
        xs, ys = _series(table, "baseline_rss_mb")
        if ys:
            (out["baseline"],) = ax.plot(xs, ys, linestyle=":", marker=".", color="tab:purple", alpha=0.7,
                                         label="RSS before the model (runtime + data)")
        xs, ys = _series(table, "allocator_peak_mb")
        if ys:
            (out["allocator"],) = ax.plot(xs, ys, linestyle="--", marker=".", color="tab:blue", alpha=0.8,
                                          label="TensorFlow CPU allocator peak (tensors)")
    xs, ys = _series(table, "nvml_memory_used_mb")
    if ys:
        (out["nvml"],) = ax.plot(xs, ys, marker="^", color="tab:green", label="NVML memory used")
    caps = {r.get("memory_cap_mb") for r in table if r.get("memory_cap_mb")}
    if len(caps) == 1:
        out["cap"] = ax.axhline(caps.pop(), color="tab:red", linestyle="-.", linewidth=1, label="memory cap")
    thesis = (THESIS_GPU_MEMORY_MB, "MiB", "MiB", "thesis GPU memory (MB)") if reference else None
    line = _finish_axes(ax, table, "Memory", "memory (MiB)", thesis, legend_loc="upper left")
    if line is not None:
        out["reference"] = line
    return out


def plot_utilization(ax, table: list[dict], reference: bool = True) -> dict:
    """Model FLOPs utilization (% of the measured matmul peak) against batch size; NVML's GPU
    utilization when sampled; the thesis's GPU usage (%) as a reference series."""
    out = {}
    xs, ys = _series(table, "mfu_percent")
    (out["mfu"],) = ax.plot(xs, ys, marker="o", color="tab:orange", label="MFU (% of matmul peak)")
    xs, ys = _series(table, "nvml_gpu_util_mean_percent")
    if ys:
        (out["nvml"],) = ax.plot(xs, ys, marker="^", color="tab:green", label="NVML GPU utilization (mean)")
    thesis = (THESIS_GPU_USAGE_PERCENT, "%", "%", "thesis GPU usage (%)") if reference else None
    line = _finish_axes(ax, table, "Utilization", "utilization (%)", thesis)
    if line is not None:
        out["reference"] = line
    return out


FIGURES = {"throughput": plot_throughput, "memory": plot_memory, "utilization": plot_utilization}


def make_figure(kind: str, table: list[dict], reference: bool = True):
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    artists = FIGURES[kind](ax, table) if kind == "throughput" else FIGURES[kind](ax, table, reference=reference)
    return fig, artists


def save_profile_figures(table: list[dict], folder: Path, reference: bool = True) -> dict[str, dict[str, Path]]:
    """throughput, memory, utilization: each as PNG and SVG in `folder` (`reference`: the thesis's
    series beside ours, which are the article's model's: not for a user's)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {kind: save_figure(make_figure(kind, table, reference)[0], folder / kind) for kind in FIGURES}
