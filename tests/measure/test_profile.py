"""profile: a real run at tiny sizes (CSV, figures, progress), the figures' series, out of memory
under a cap, and the command's usage errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs.cli import cli
from catsdogs.measure import figures
from catsdogs.measure import profile as prof
from catsdogs.measure.figures import (
    THESIS_BATCH_SIZES,
    THESIS_GPU_MEMORY_MB,
    THESIS_GPU_USAGE_PERCENT,
    THESIS_LABEL,
    make_figure,
)
from catsdogs.measure.profile import PROFILE_COLUMNS, read_table

SIZE = 64
BATCHES = (2, 64)  # 64 is more than the 48 training images: batches repeat them


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (64 px, 24 training images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


@pytest.fixture(scope="module")
def profiled(data_dir, tmp_path_factory):
    """When: profiling batch sizes 2 and 64, 1 warm-up and 2 timed steps each."""
    out = tmp_path_factory.mktemp("out")
    lines: list[str] = []
    rows = prof.profile("p", BATCHES, data_dir, out, steps=2, warmup=1, peak_seconds=0.2, log=lines.append)
    return {"rows": rows, "out": out, "lines": lines}


def by_label(lines, label):
    return next(ln for ln in lines if ln.get_label() == label)


@pytest.mark.slow
@pytest.mark.xdist_group("profiled")
def test_profile_writes_one_csv_row_per_batch_size_with_every_measure(profiled):
    with open(profiled["out"] / "p" / "profile.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == PROFILE_COLUMNS
        raw = list(reader)
    assert [int(r["batch_size"]) for r in raw] == list(BATCHES)
    table = read_table(profiled["out"] / "p" / "profile.csv")
    for row in table:
        assert row["status"] == "done", row["error"]
        assert row["step_time_median_s"] > 0 and row["step_time_mean_s"] > 0
        assert row["images_per_second"] == pytest.approx(row["batch_size"] / row["step_time_median_s"], rel=1e-4)
        assert row["flops_per_second"] > 0 and row["peak_flops_per_second"] > 0
        assert row["mfu_percent"] == pytest.approx(
            100 * row["flops_per_second"] / row["peak_flops_per_second"], rel=1e-4)
        assert row["memory_kind"] in ("cpu-rss", "gpu")
        assert row["peak_memory_mb"] > 0
        if row["memory_kind"] == "cpu-rss":  # the runtime and data before the model, and above it
            assert 0 < row["baseline_rss_mb"] < row["peak_memory_mb"]
            assert row["memory_above_baseline_mb"] == pytest.approx(
                row["peak_memory_mb"] - row["baseline_rss_mb"], abs=0.01)
            assert row["nvml_gpu_util_mean_percent"] is None  # no GPU: the NVML columns stay empty
        assert row["device"] and row["precision"] == "float32" and row["optimizer"] == "adam"
        assert (row["steps"], row["warmup"], row["image_size"]) == (2, 1, SIZE)
    assert (profiled["out"] / "p" / "profile.json").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("profiled")
def test_profile_reports_one_line_per_batch_size_and_writes_three_figures(profiled):
    per_size = [ln for ln in profiled["lines"] if ln.startswith("batch size")]
    assert len(per_size) == len(BATCHES)
    assert "images/s" in per_size[0] and "MFU" in per_size[0]
    assert any(ln.startswith("matmul peak:") for ln in profiled["lines"])
    figures = profiled["out"] / "p" / "figures"
    for kind in ("throughput", "memory", "utilization"):
        for ext in ("png", "svg"):
            assert (figures / f"{kind}.{ext}").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.xdist_group("profiled")
def test_the_figures_draw_the_table_and_the_thesis_reference(profiled):
    rows = profiled["rows"]
    fig, art = make_figure("throughput", rows)
    ax = fig.axes[0]
    assert list(art["throughput"].get_xdata()) == list(BATCHES)
    assert list(art["throughput"].get_ydata()) == [r["images_per_second"] for r in rows]
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in BATCHES]

    fig, art = make_figure("memory", rows)
    ax = fig.axes[0]
    assert list(art["peak"].get_ydata()) == [r["peak_memory_mb"] for r in rows]
    if rows[0]["memory_kind"] == "cpu-rss":
        assert list(art["baseline"].get_ydata()) == [r["baseline_rss_mb"] for r in rows]
        if rows[0]["allocator_peak_mb"] is not None:
            assert list(art["allocator"].get_ydata()) == [r["allocator_peak_mb"] for r in rows]
    ref = by_label(ax.get_lines(), THESIS_LABEL)  # MiB and MB: the same axis
    assert list(ref.get_xdata()) == list(THESIS_BATCH_SIZES)
    assert list(ref.get_ydata()) == list(THESIS_GPU_MEMORY_MB)
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(b) for b in sorted({*BATCHES, *THESIS_BATCH_SIZES})]

    fig, art = make_figure("utilization", rows)
    ax = fig.axes[0]
    assert list(art["mfu"].get_ydata()) == [r["mfu_percent"] for r in rows]
    ref = by_label(ax.get_lines(), THESIS_LABEL)
    assert list(ref.get_ydata()) == list(THESIS_GPU_USAGE_PERCENT)
    assert THESIS_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]


def test_figures_of_a_gpu_table_with_nvml_and_an_out_of_memory_row():
    table = [
        {"batch_size": 256, "status": "done", "images_per_second": 900.0, "peak_memory_mb": 3000.0,
         "memory_kind": "gpu", "mfu_percent": 30.0, "nvml_gpu_util_mean_percent": 80.0,
         "nvml_memory_used_mb": 3500.0, "device": "1 x H100"},
        {"batch_size": 512, "status": "done", "images_per_second": 1000.0, "peak_memory_mb": 5800.0,
         "memory_kind": "gpu", "mfu_percent": 33.0, "nvml_gpu_util_mean_percent": 90.0,
         "nvml_memory_used_mb": 6400.0, "device": "1 x H100"},
        {"batch_size": 1024, "status": "oom", "memory_kind": "gpu", "device": "1 x H100",
         "error": "ResourceExhaustedError: OOM when allocating"},
    ]
    fig, art = make_figure("memory", table)
    ax = fig.axes[0]
    assert list(art["nvml"].get_ydata()) == [3500.0, 6400.0]
    assert "baseline" not in art  # no resident-set baseline on a GPU
    oom = by_label(ax.get_lines(), "out of memory")
    assert list(oom.get_xdata()) == [1024]
    fig, art = make_figure("utilization", table)
    assert list(art["nvml"].get_ydata()) == [80.0, 90.0]
    fig, art = make_figure("throughput", table)
    assert list(art["throughput"].get_xdata()) == [256, 512]  # the oom row has no throughput


def test_a_reference_in_other_units_goes_on_a_secondary_axis():
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()
    target, line = figures._reference(ax, THESIS_GPU_USAGE_PERCENT, "%", "images/s", "thesis GPU usage (%)")
    assert target is not ax and line in target.get_lines() and line not in ax.get_lines()
    target, line = figures._reference(ax, THESIS_GPU_MEMORY_MB, "MiB", "MiB", "memory")
    assert target is ax


@pytest.mark.slow
def test_out_of_memory_under_a_cap_is_a_recorded_outcome(data_dir, tmp_path):
    lines: list[str] = []
    # when a batch size is profiled under a cap below the runtime's own size (CPU: resident set)
    rows = prof.profile("capped", [4], data_dir, tmp_path, steps=1, warmup=0, measure_peak=False,
                        memory_cap_bytes=200 * 2**20, log=lines.append)
    if rows[0]["memory_kind"] == "gpu":
        pytest.skip("a 200 MiB cap on the CPU's resident set only")
    # then it is out of memory, with its peak and the cap it went over, in the table and the log
    (row,) = rows
    assert row["status"] == "oom" and "200 MiB cap" in row["error"], row
    assert row["peak_memory_mb"] > 200 and row["memory_cap_mb"] == 200
    assert (row["batch_size"], row["optimizer"], row["precision"], row["image_size"]) == (4, "adam", "float32", SIZE)
    assert read_table(tmp_path / "capped" / "profile.csv")[0]["status"] == "oom"
    assert any(ln.startswith("batch size     4: oom") for ln in lines)


def test_impossible_settings_are_refused_before_any_probe(data_dir, tmp_path):
    for kwargs, message in [({"batch_sizes": [0]}, "batch size must be at least 1"),
                            ({"batch_sizes": []}, "at least one batch size"),
                            ({"optimizer": "adagrad"}, "unknown optimizer"),
                            ({"precision": "fp8"}, "unknown precision"),
                            ({"steps": 0}, "steps must be >= 1")]:
        args = {"batch_sizes": [4], **kwargs}
        with pytest.raises(ValueError, match=message):
            prof.profile("x", args.pop("batch_sizes"), data_dir, tmp_path, **args)
    assert not (tmp_path / "x").exists()


# --- the command ------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "Invalid value for '--batch-size': must be at least 1, got 0"),
    (["--batch-size", "4", "-8"], "must be at least 1, got -8"),
    (["--steps", "0"], "Invalid value for '--steps': must be at least 1, got 0"),
    (["--memory-limit", "lots"], "not a memory size"),
    (["--precision", "fp8"], "--precision"),
])
def test_bad_profile_options_are_one_line_usage_errors(data_dir, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["profile", "--data-dir", str(data_dir), "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]


def test_the_profile_command_takes_variadic_batch_sizes():
    # given the batch sizes written after one --batch-size, and a cap with its unit
    command = cli.commands["profile"]
    ctx = command.make_context("profile", ["--batch-size", "4", "8", "--memory-limit", "200MiB", "--steps", "1"])
    # then the command has them as several values, the cap in bytes
    assert ctx.params["batch_size"] == (4, 8) and ctx.params["memory_limit"] == 200 * 2**20
    assert ctx.params["steps"] == 1
