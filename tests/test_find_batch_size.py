"""find-batch-size: the pure parts (memory sizes, margin, search, memory model, recommendation),
a real search under a small memory cap on the CPU, and the command's usage errors."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs.cli import cli
from catsdogs.measure import find_batch_size as findbs
from catsdogs.measure.find_batch_size import (
    PROBE_COLUMNS,
    apply_margin,
    effective_resolution,
    linear_scaled_lr,
    recommend,
    search,
)
from catsdogs.measure.profile import format_bytes, parse_memory
from catsdogs.messages import ProbeRecord, ProbeTask
from catsdogs.model import (
    activation_bytes_per_image,
    activation_moments,
    parameter_count,
    peak_moment,
    predict_max_batch_size,
    state_bytes,
)
from catsdogs.training.worker import run_isolated

SIZE = 64


# --- memory sizes --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 * 2**30), ("4 GiB", 4 * 2**30), ("4gib", 4 * 2**30), ("1.5GiB", 3 * 2**29),
    ("512MiB", 512 * 2**20), ("64KiB", 64 * 1024), ("1TiB", 2**40),
    ("4GB", 4 * 10**9), ("1.5 GB", 1_500_000_000), ("512MB", 512 * 10**6), ("10KB", 10_000),
    ("800M", 800 * 2**20), ("2G", 2 * 2**30), ("100B", 100), (".5GiB", 2**29),
])
def test_memory_sizes_parse_with_binary_and_decimal_units(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text, message", [
    ("4", "has no unit"), ("4096", "has no unit"), ("4XB", "unknown unit 'XB'"), ("GiB", "not a memory size"),
    ("", "not a memory size"), ("-1GiB", "not a memory size"), ("0GiB", "must be positive"),
    ("four GiB", "not a memory size"),
])
def test_bad_memory_sizes_say_why(text, message):
    with pytest.raises(ValueError, match=message):
        parse_memory(text)


def test_format_bytes():
    assert format_bytes(4 * 2**30) == "4 GiB"
    assert format_bytes(1536 * 2**20) == "1.5 GiB"
    assert format_bytes(300 * 2**20) == "300 MiB"


# --- margin and learning rate ----------------------------------------------------------------------


@pytest.mark.parametrize("largest, margin, expected", [
    (200, 0.1, 176),  # 180 -> multiple of 8
    (100, 0.1, 88),  # 90 -> 88
    (64, 0.1, 56),  # 57.6 -> 57 -> 56
    (256, 0.25, 192),
    (96, 0.0, 96),  # no margin: the largest itself, unrounded
    (93, 0.0, 93),
    (9, 0.1, 8),  # 8.1 -> 8
    (7, 0.1, 4),  # 6.3 -> below 8: a power of two
    (3, 0.1, 2),
    (1, 0.5, 1),  # never below 1
])
def test_margin_rounds_down_to_a_multiple_of_8_or_a_power_of_two(largest, margin, expected):
    got = apply_margin(largest, margin)
    assert got == expected
    assert got <= largest


@pytest.mark.parametrize("margin", [-0.1, 1.0, 1.5])
def test_a_margin_outside_0_1_is_refused(margin):
    with pytest.raises(ValueError, match="margin"):
        apply_margin(100, margin)


def test_linear_scaling_rule_from_keras_defaults_at_32():
    assert linear_scaled_lr("adam", 32) == pytest.approx(0.001)
    assert linear_scaled_lr("adam", 64) == pytest.approx(0.002)
    assert linear_scaled_lr("sgd", 8) == pytest.approx(0.0025)
    assert linear_scaled_lr("sgd", 256) == pytest.approx(0.08)


# --- the search, with a fake probe ---------------------------------------------------------------


class FakeDevice:
    """Fits up to `limit`; `failing` sizes fail for another reason; counts every probe."""

    def __init__(self, limit: int, failing=()):
        self.limit, self.failing, self.calls = limit, set(failing), []

    def __call__(self, b: int) -> str:
        self.calls.append(b)
        if b in self.failing:
            return "failed"
        return "done" if b <= self.limit else "oom"


def test_power_mode_doubles_until_out_of_memory():
    dev = FakeDevice(100)
    r = search(dev, mode="power", start=8)
    assert dev.calls == [8, 16, 32, 64, 128]
    assert (r.largest_fit, r.first_failure) == (64, 128)


def test_binsearch_bisects_between_the_last_fit_and_the_first_failure():
    dev = FakeDevice(100)
    r = search(dev, mode="binsearch", start=8)
    assert dev.calls[:5] == [8, 16, 32, 64, 128]
    assert dev.calls[5] == 96  # the middle of 64 and 128
    assert r.largest_fit <= 100 < r.first_failure
    assert r.first_failure - r.largest_fit <= 8
    assert r.statuses[r.largest_fit] == "done" and r.statuses[r.first_failure] == "oom"


def test_binsearch_with_resolution_1_finds_the_exact_limit_for_any_limit_and_start():
    rng = random.Random(0)
    for _ in range(300):
        limit, start = rng.randint(1, 5000), rng.choice([1, 2, 3, 8, 16, 100, 4096, 10000])
        dev = FakeDevice(limit)
        r = search(dev, mode="binsearch", start=start, resolution=1)
        assert (r.largest_fit, r.first_failure) == (limit, limit + 1), (limit, start)
        assert len(dev.calls) == len(set(dev.calls)), "a batch size was probed twice"


def test_default_resolution_is_8_or_an_eighth_of_the_answer():
    assert effective_resolution(None, 1000) == 8
    assert effective_resolution(None, 32) == 4
    assert effective_resolution(None, 4) == 1
    assert effective_resolution(16, 4) == 16
    for limit in (5, 7, 13, 37, 100, 1000):
        r = search(FakeDevice(limit), start=1)
        assert r.largest_fit <= limit < r.first_failure
        assert r.first_failure - r.largest_fit <= max(1, min(8, r.largest_fit // 8))


def test_a_start_that_does_not_fit_is_halved():
    dev = FakeDevice(100)
    r = search(dev, start=512, resolution=1)
    assert dev.calls[:4] == [512, 256, 128, 64]
    assert r.largest_fit == 100


def test_nothing_fits():
    dev = FakeDevice(0)
    r = search(dev, start=8)
    assert r.largest_fit is None and dev.calls == [8, 4, 2, 1]


def test_max_is_probed_when_doubling_would_pass_it():
    dev = FakeDevice(1000)
    r = search(dev, start=8, max_batch=300)
    assert dev.calls == [8, 16, 32, 64, 128, 256, 300]
    assert r.largest_fit == 300 and r.first_failure is None and r.reached_max
    dev = FakeDevice(280)
    r = search(dev, start=8, max_batch=300, resolution=1)
    assert (r.largest_fit, r.first_failure) == (280, 281)


def test_a_failed_probe_does_not_stop_the_search():
    dev = FakeDevice(100, failing={32})  # while doubling: stepped over
    r = search(dev, start=8, resolution=1)
    assert dev.calls[:5] == [8, 16, 32, 64, 128]
    assert r.largest_fit == 100 and r.statuses[32] == "failed"
    dev = FakeDevice(100, failing={96})  # while bisecting: an upper bound, the answer ran
    r = search(dev, start=8, resolution=1)
    assert r.largest_fit == 95 and r.statuses[95] == "done"
    dev = FakeDevice(100, failing={32, 64})  # two in a row end the doubling
    r = search(dev, start=8, resolution=1)
    assert 128 not in dev.calls and r.largest_fit == 31 and r.first_failure == 32


def test_a_bad_mode_or_start_is_refused():
    with pytest.raises(ValueError, match="unknown mode"):
        search(FakeDevice(10), mode="linear")
    with pytest.raises(ValueError, match=">= 1"):
        search(FakeDevice(10), start=0)


def test_recommendation_is_the_fastest_at_or_below_the_margin_smaller_on_a_tie():
    probes = [ProbeRecord(batch_size=b, status=s, images_per_second=ips) for b, s, ips in [
        (8, "done", 50.0), (16, "done", 90.0), (32, "done", 100.0), (64, "done", 98.0),
        (128, "done", 120.0), (256, "oom", None)]]
    assert recommend(probes, safe=64).batch_size == 32  # 64 is within 5% of 32: the smaller
    assert recommend(probes, safe=128).batch_size == 128
    assert recommend(probes, safe=16).batch_size == 16
    assert recommend(probes, safe=4) is None


# --- the analytic memory model -------------------------------------------------------------------


def test_memory_model_arithmetic_at_200px():
    moments = activation_moments(200)
    full, half = 200 * 200 * 32 * 4, 100 * 100 * 32 * 4  # a 32-channel float32 map, before/after pooling
    assert sum(moments["forward: relu"].values()) == 120_000 + 480_000 + 2 * full
    assert sum(moments["backward: max-pool gradient"].values()) == 120_000 + 480_000 + 2 * full + 2 * half
    assert sum(moments["backward: relu gradient"].values()) == 120_000 + 480_000 + 3 * full
    assert peak_moment(200) == peak_moment(64) == "backward: relu gradient"
    per = activation_bytes_per_image(200)
    assert per["input_uint8"] == 120_000 and per["rescaled_input"] == 480_000
    assert per["relu_output"] == per["grad_relu_output"] == per["grad_conv_output"] == full
    assert per["host_input_batches"] == 0
    assert sum(per.values()) == 15_960_000
    assert activation_bytes_per_image(200, host_batches=2)["host_input_batches"] == 240_000
    half_precision = activation_bytes_per_image(200, "mixed_float16")
    assert half_precision["input_uint8"] == 120_000 and half_precision["relu_output"] == full // 2
    p = parameter_count(200)
    assert sum(state_bytes(200, "adam").values()) == 16 * p  # weights, gradients, m, v
    assert sum(state_bytes(200, "sgd").values()) == 8 * p
    assert sum(state_bytes(200, "sgd", "mixed_float16").values()) == 10 * p


def test_prediction_recovers_the_baseline_from_the_calibration_probe():
    per = sum(activation_bytes_per_image(64, host_batches=2).values())
    state = sum(state_bytes(64, "adam").values())
    baseline = 700 * 2**20
    peak1 = baseline + state + per  # what a batch-1 probe would measure
    cap = baseline + state + 100 * per + per // 2
    pred = predict_max_batch_size(cap, 1, peak1, 64, "adam", host_batches=2)
    assert pred["max_batch_size"] == 100
    assert pred["baseline_bytes"] == pytest.approx(baseline)
    assert pred["per_image_bytes"] == per and pred["state_bytes"] == state
    assert predict_max_batch_size(peak1 - 1, 1, peak1, 64, "adam", host_batches=2)["max_batch_size"] == 0


# --- a real search under a small cap, on the CPU ---------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (64 px, 24 training images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


@pytest.mark.slow
def test_a_search_under_a_small_cap_finds_a_size_that_fits_and_one_above_that_does_not(keras_backend, data_dir, tmp_path):
    # The runtime's own footprint differs from machine to machine: measure it, cap a little above.
    base = run_isolated(ProbeTask(1, str(data_dir), "adam", "standard", "float32", steps=1, warmup=0),
                        tmp_path / "w.log")
    assert base.status == "done", base.error
    if base.memory_kind != "cpu-rss":
        pytest.skip("the memory cap stands in for device memory on the CPU only")
    cap_mb = base.peak_memory_mb + 55
    # The search starts near its answer (the search itself is tested above, with fake probes):
    # 55 MiB is about 19 more 64 px images on TensorFlow (2.8 MiB each), 14 on JAX (3.8 MiB).
    start = {"tensorflow": 16, "jax": 8}[keras_backend]
    resolution = start // 2
    lines: list[str] = []
    s = findbs.find_batch_size("fbs", data_dir, tmp_path, start=start, margin=0.0, steps=1, warmup=0,
                               memory_cap_bytes=int(cap_mb * 2**20), resolution=resolution, log=lines.append)
    probes = s["probes"]
    by_size = {p["batch_size"]: p for p in probes}
    largest, above = s["largest_fitting"], s["first_not_fitting"]
    # the found batch size ran under the cap; the next size up (by the resolution) did not
    assert largest is not None and above is not None and 0 < above - largest <= resolution
    assert by_size[largest]["status"] == "done" and by_size[largest]["peak_memory_mb"] <= cap_mb
    assert by_size[above]["status"] == "oom" and by_size[above]["peak_memory_mb"] > cap_mb
    for p in probes:  # it fits (done) means exactly: peak resident memory under the cap
        assert p["status"] in ("done", "oom"), p.get("error")
        assert (p["peak_memory_mb"] <= cap_mb) == (p["status"] == "done"), p
    # a probe ran out of memory, was recorded, and the search went on
    first_oom = next(i for i, p in enumerate(probes) if p["status"] == "oom")
    assert first_oom < len(probes) - 1
    assert "over the" in probes[first_oom]["error"]
    # the records on disk
    saved = json.loads((tmp_path / "fbs" / "find_batch_size.json").read_text())
    assert [p["batch_size"] for p in saved["probes"]] == [p["batch_size"] for p in probes]
    with open(tmp_path / "fbs" / "find_batch_size.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == PROBE_COLUMNS
        assert [int(r["batch_size"]) for r in reader] == [p["batch_size"] for p in probes]
    # the prediction and the recommendation
    assert probes[0]["phase"] == "calibrate" and probes[0]["batch_size"] == 1
    assert s["prediction"]["max_batch_size"] > 0 and "percent_apart" in s["prediction"]
    rec = s["recommendation"]
    assert by_size[rec["batch_size"]]["status"] == "done" and rec["batch_size"] <= largest
    assert rec["learning_rate"] == pytest.approx(0.001 * rec["batch_size"] / 32)
    text = "\n".join(lines)
    assert f"Largest batch size that fits under {cap_mb:.0f} MiB: {largest}" in text
    model = {"tensorflow": "Analytic memory model predicts", "jax": "XLA's memory plan predicts"}
    assert model[keras_backend] in text and "Recommendation: batch size" in text
    assert {p["backend"] for p in probes} == {keras_backend}
    assert "heuristic" in text


# --- the command ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--memory-limit", "4"], "has no unit"),
    (["--memory-limit", "4XB"], "unknown unit"),
    (["--margin", "1.5"], "--margin"),
    (["--mode", "linear"], "--mode"),
    (["--start", "0"], "--start"),
    (["--opt", "adamw"], "--opt"),
    (["--name", "../x"], "--name"),
])
def test_bad_find_batch_size_options_are_one_line_usage_errors(data_dir, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out",
                                      str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]
    assert not (tmp_path / "find-batch-size").exists()


def test_find_batch_size_on_unprepared_data_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "catsdogs prepare" in result.output


@pytest.mark.slow
def test_a_cap_below_the_runtime_is_an_error_with_the_records_written(data_dir, tmp_path):
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(tmp_path),
                                      "--memory-limit", "200MiB", "--start", "1", "--name", "tiny"])
    assert result.exit_code == 1, result.output
    assert "no batch size fits" in result.output
    saved = json.loads((tmp_path / "tiny" / "find_batch_size.json").read_text())
    assert [p["status"] for p in saved["probes"]] == ["oom"]
