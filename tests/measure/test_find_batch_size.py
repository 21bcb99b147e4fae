"""find-batch-size's phases on a stand-in prober (the prediction, the noise scale, the critical size,
the retime), a real search under a small memory cap on the CPU, and the command's usage errors."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fakes import (
    SIZE,
    LinearProber,
    ResidentProber,
    SqrtSpeedProber,
    UnluckyProber,
    recording_tasks,
)

from catsdogs import recommendation
from catsdogs.cli import cli
from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.measure import find_batch_size as findbs
from catsdogs.measure import noise_run
from catsdogs.measure.common import take_claim
from catsdogs.measure.find_batch_size import PROBE_COLUMNS, FindSettings
from catsdogs.measure.noise_run import NoiseRun
from catsdogs.measure.search import fresh_threshold
from catsdogs.messages import ProbeTask
from catsdogs.runtime.worker import run_isolated


def test_the_prediction_comes_before_the_search_from_the_calibration_probe_alone(data_dir, tmp_path, monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", LinearProber)
    LinearProber.record_extra = {}
    # given a device whose memory is exactly linear in the batch size, under a 1000 MiB cap, searched
    # past the 48 training images (--max) for the device's limit
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, resolution=1, margin=0.0,
                                            measure_noise=False, max_batch=4096), data_dir, tmp_path,
                               log=lines.append).to_dict()
    # then the prediction was stated after the calibration probe and the replay's check, before
    # any search probe
    predicted = s["prediction"]["max_batch_size"]
    at = next(i for i, ln in enumerate(lines) if ln.startswith("Predicted before the search"))
    assert lines[at - 2].startswith("calibrate") and lines[at - 1].startswith("check")
    assert lines[at + 1].startswith("search")
    assert f"{predicted} (the step replayed through TensorFlow's allocator)" in lines[at]
    # and every search probe ran with the fresh threshold at 80% of it; the calibration and the
    # check without
    check = s["prediction"]["check"]["batch_size"]
    assert LinearProber.calls[:2] == [(1, None), (check, None)]
    assert {f for _, f in LinearProber.calls[2:]} == {fresh_threshold(predicted)}
    # and on a device that is what the model says, the search's first probe past the doubling is the
    # prediction, and it fits (the replay's peak is not monotonic in the batch size, as BFC's is not:
    # 5% above it fits too here, so the search goes on from there)
    sizes = [p["batch_size"] for p in s["probes"]]
    first_near = next(p for p in s["probes"] if p["batch_size"] >= fresh_threshold(predicted))
    assert first_near["batch_size"] == predicted and first_near["status"] == "done"
    assert sizes[sizes.index(predicted) + 1] == math.ceil(predicted * 1.05)
    assert s["largest_fitting"] >= predicted
    # and the summary names what the report matches it by (backend, the data's fingerprint) and says
    # where its time went, in the JSON and in its last line
    assert s["backend"] == "tensorflow" and s["settings"]["data_fingerprint"]
    # and the CPU it ran on, with the instruction set oneDNN dispatches to there (issue 65)
    assert set(s["cpu"]) == {"model", "cores", "onednn_isa", "onednn_max_cpu_isa"} and s["cpu"]["cores"] >= 1
    assert set(s["seconds"]) == {"noise_scale", "prediction", "probes", "total"} and s["seconds"]["noise_scale"] is None
    assert all(p["wall_seconds"] is not None for p in s["probes"])
    assert lines[-1].startswith(f"Answered in {s['seconds']['total']:.0f} s: the memory model ")
    assert s["memory_fraction"] is None and not any("XLA's" in ln for ln in lines)


def _search_on(prober_kernel_mb: float, data_dir, tmp_path, monkeypatch, cap_mb: float = 1000.0):
    """find-batch-size under `cap_mb` on a LinearProber whose kernels hold `prober_kernel_mb` more an image."""
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", LinearProber)
    monkeypatch.setattr(LinearProber, "kernel_mb_per_image", prober_kernel_mb)
    LinearProber.record_extra = {}
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=int(cap_mb * 2**20), resolution=1, margin=0.0,
                                            measure_noise=False, max_batch=4096), data_dir, tmp_path,
                               log=lines.append).to_dict()
    return s, lines


def test_the_replay_is_checked_on_the_searchs_way_up_and_stands_where_the_check_agrees(data_dir, tmp_path,
                                                                                    monkeypatch):
    # given a CPU whose kernels hold what the replay says (the development machine's)
    s, lines = _search_on(0.0, data_dir, tmp_path, monkeypatch)
    pred = s["prediction"]
    check = pred["check"]
    # then the check ran once, aside in a worker of its own, at the last size the search's doubling
    # reaches below 80% of the prediction, and the search took its probe as it stood
    assert LinearProber.asides == [check["batch_size"]]
    assert 0.4 * pred["max_batch_size"] <= check["batch_size"] < 0.8 * pred["max_batch_size"]
    assert [b for b, _ in LinearProber.calls].count(check["batch_size"]) == 1
    assert [p["phase"] for p in s["probes"] if p["batch_size"] == check["batch_size"]] == ["check"]
    # and it peaked where the replay says, so the replay stands, and says so
    assert abs(check["apart_mb"]) < check["threshold_mb"] and pred["kernel_bytes_per_image"] == 0.0
    assert check["replay_max_batch_size"] == pred["max_batch_size"]
    assert any(ln.startswith(f"Checked at batch size {check['batch_size']} (a fresh worker)") and
               ln.endswith("the replay stands).") for ln in lines)


@pytest.mark.parametrize("kernel_mb", [0.5, -0.4, 1.0])
def test_kernels_that_hold_more_or_less_than_the_replay_are_measured_by_the_check_and_counted(
        kernel_mb, data_dir, tmp_path, monkeypatch):
    # given another CPU, whose kernels hold kernel_mb more (or less) an image than the replay says
    # (as oneDNN's choice by instruction set may: issue 65)
    s, lines = _search_on(kernel_mb, data_dir, tmp_path, monkeypatch, cap_mb=1500.0)
    pred, measured = s["prediction"], s["largest_fitting"]
    replay_alone = pred["check"]["replay_max_batch_size"]
    # then the replay alone would miss that device's limit by more than 15%
    assert abs(replay_alone - measured) > 0.15 * measured
    # and the check measured the difference, counted it per image, and the prediction lands on the limit
    assert pred["kernel_bytes_per_image"] / 2**20 == pytest.approx(kernel_mb, rel=0.05)
    assert abs(pred["percent_apart"]) <= 2.0
    assert any(f"counted in the prediction (the replay alone: {replay_alone})" in ln for ln in lines)
    # and the search took the check's probe as it stood, wherever the new prediction put its aim
    # (1 MiB more an image: 270, whose doubling ends at 128, below the check's 256): no size between
    # the doubling's last and the check's was probed, and none twice
    check = pred["check"]["batch_size"]
    sizes = [p["batch_size"] for p in s["probes"] if p["phase"] not in ("retime", "between")]  # (timed again)
    assert len(sizes) == len(set(sizes)) and sizes.count(check) == 1
    doubled = max(b for b in sizes if b < check and b & (b - 1) == 0)  # the way up's powers of two
    assert not [b for b in sizes if doubled < b < check]


def test_a_check_out_of_memory_holds_the_prediction_below_it_and_the_search_bisects_up_to_it(
        data_dir, tmp_path, monkeypatch):
    # given a CPU whose kernels hold 3 MiB more an image than the replay says: the check's size does
    # not fit, and its peak is cut at the cap, a bound and no measurement
    s, lines = _search_on(3.0, data_dir, tmp_path, monkeypatch, cap_mb=1500.0)
    pred, check = s["prediction"], s["prediction"]["check"]
    assert check["status"] == "oom" and pred["max_batch_size"] == check["batch_size"] - 1
    assert pred["kernel_bytes_per_image"] == 0.0  # nothing counted from a peak that is not one
    # then the search bisected between the doubling's last size and the check's, and found the device's
    # limit there, without a gallop down from the prediction (at most log2 of the bracket's probes)
    search = [p for p in s["probes"] if p["phase"] == "search"]
    bracket = [p["batch_size"] for p in search if check["batch_size"] // 2 < p["batch_size"] < check["batch_size"]]
    assert 0 < len(bracket) <= math.ceil(math.log2(check["batch_size"] // 2)) and check["batch_size"] - 1 not in bracket
    assert s["first_not_fitting"] - s["largest_fitting"] <= 1  # (resolution 1)
    assert any(ln.startswith(f"Checked at batch size {check['batch_size']} (a fresh worker): out of memory")
               for ln in lines)


def test_xlas_memory_fraction_is_reported_beside_the_limit(data_dir, tmp_path, monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", LinearProber)
    # given probes that ran on a GPU whose allocator may use 75% of it
    LinearProber.record_extra = {"memory_fraction": 0.75}
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, measure_noise=False), data_dir,
                               tmp_path, log=lines.append).to_dict()
    LinearProber.record_extra = {}
    # then the summary records it and says it beside the limit found
    assert s["memory_fraction"] == 0.75
    limit = next(i for i, ln in enumerate(lines) if ln.startswith("Largest batch size that fits"))
    assert lines[limit + 1].startswith("That limit is XLA's: 75% of the GPU's memory")


def test_a_max_that_everything_fit_is_no_limit_to_measure_the_prediction_against(data_dir, tmp_path, monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", LinearProber)
    LinearProber.record_extra = {}
    # given a search stopped by --max 64 with every size fitting, under a cap far above it
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, max_batch=64, measure_noise=False),
                               data_dir, tmp_path, log=lines.append).to_dict()
    # then the prediction is stated, but never "% from the measured 64": 64 is no limit
    assert s["reached_max"] and "percent_apart" not in s["prediction"]
    assert s["stopped_by"] == "max" and s["search_bound"] == {"batch_size": 64, "by": "max", "train_images": 48}
    predicted = next(ln for ln in lines if "predicts" in ln)
    assert "from the measured" not in predicted
    assert any(ln.startswith("Largest batch size that fits") and "every size up to --max 64 fit" in ln for ln in lines)


def test_the_search_is_bounded_by_the_training_split_of_the_prepared_data_or_a_folder_unless_max_says():
    from catsdogs.measure.find_batch_size import SearchBound
    from catsdogs.measure.model_check import ProbeData

    # given the prepared data's 1,200 training images, a folder of 537 images (a tenth held out to
    # test, as a trial on it does), and random images, which bound nothing
    prepared = {"counts": {"standard": {"train": {"Cat": 600, "Dog": 600}}}}
    folder = ProbeData(None, [32, 32, 3, 2, "uint8"], "/images", "537 images", count=537)
    random = ProbeData(None, [32, 32, 3, 2, "uint8"], None, "random images")
    # then the search stops at the training split, which --max replaces (above it too)
    assert SearchBound.of(FindSettings(), prepared, None) == SearchBound(1200, "data", 1200)
    assert SearchBound.of(FindSettings(model="m:f"), None, folder) == SearchBound(483, "data", 483)
    assert SearchBound.of(FindSettings(model="m:f"), None, random) == SearchBound(None, None, None)
    assert SearchBound.of(FindSettings(max_batch=4096), prepared, None) == SearchBound(4096, "max", 1200)


def measured(b_simple, low, high=None) -> NoiseRun:
    estimate = NoiseEstimate(b_simple, low, high, gradient_sq=1.0, trace=b_simple or low, pairs=64, small=1, large=10)
    return NoiseRun(estimate, batch_size=32, measure_seconds=12.0, seconds=20.0)


@pytest.mark.parametrize("optimizer, noise, binding, rule", [
    ("sgd", measured(30.0, 20.0, 45.0), "statistics", "paper"),  # T(B) least near B_noise: statistics binds
    ("adam", measured(30.0, 20.0, 45.0), "statistics", "sqrt"),  # Adam's rule, whatever the noise scale
    ("sgd", measured(None, 900.0), "memory", "paper-low"),  # a lower bound only: open above, the worst case's
])
def test_the_noise_scale_joins_the_recommendation_with_its_learning_rate(data_dir, tmp_path, monkeypatch,
                                                                        optimizer, noise, binding, rule):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", SqrtSpeedProber)
    monkeypatch.setattr(findbs, "measure_noise_scale", lambda *args, **kwargs: noise)
    # given throughput growing as the square root of the batch size up to the memory limit (less its
    # margin), where T(B) = (1 + B_noise/B) sqrt(B) is least at B = B_noise, and a noise scale
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", optimizer=optimizer, memory_cap_bytes=1000 * 2**20,
                                            max_batch=4096), data_dir, tmp_path, log=lines.append).to_dict()
    rec = s["recommendation"]
    text = "\n".join(lines)
    # then the recommendation names the limit that binds, and the learning rate follows its rule
    assert rec["binding"] == binding and rec["learning_rate_rule"] == rule
    assert s["noise_scale"] == noise.as_json()
    base = {"sgd": 0.01, "adam": 0.001}[optimizer]
    b = rec["batch_size"]
    expected = {"paper": base * (1 + 30 / 32) / (1 + 30 / b), "sqrt": base * (b / 32) ** 0.5,
                "paper-low": base * (1 + 900 / 32) / (1 + 900 / b)}  # (open above: the least rate B_noise >= 900 gives)
    assert rec["learning_rate"] == pytest.approx(expected[rule])
    if binding == "statistics":
        # the least worst case over 20 to 45 is at 32, the probed size nearest B_noise; T(B) is flat
        # there, so the sizes within 10% of it tie (16, 24 and 32), and the middle one is recommended
        worst = {r["batch_size"]: r["worst_case"] for r in rec["table"]}
        assert min(worst, key=worst.get) == 32 and rec["near_best"] == [16, 24, 32] and b == 24
        assert "statistics binds" in text and "As good (within 10% of the least worst case" in text
        assert "Critical batch size (the gradient noise scale B_simple after one epoch at batch size 32): 30" in text
    else:
        assert b == s["margin_batch_size"] and "above 900" in text
        assert "The noise scale's interval is open above: the choice holds for B_noise from 900 to any larger" in text


def test_fewer_training_images_than_the_noise_runs_batch_skip_the_noise_scale_and_say_why(prepared_data, tmp_path,
                                                                                         monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", SqrtSpeedProber)

    def no_run(*args, **kwargs):
        raise AssertionError("the noise scale's short runs were started")

    monkeypatch.setattr(findbs, "measure_noise_scale", no_run)
    # given prepared data of 24 training images, fewer than the noise runs' batch of 32
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20), prepared_data(SIZE, (12, 4, 4)),
                               tmp_path, log=lines.append).to_dict()
    # then no short run was started, the output says why, and every size printed is trainable there
    assert any(ln.startswith("Noise scale: not measured: its short runs train at batch size 32, more than the 24 "
                             "training images") for ln in lines)
    assert s["noise_scale"] is None and s["largest_fitting"] <= 24 and s["fastest"]["batch_size"] <= 24
    assert s["recommendation"]["batch_size"] <= 24


def test_with_a_store_s_tuned_rates_the_learning_rate_is_scaled_from_the_nearest_and_says_so(data_dir, tmp_path,
                                                                                              monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", SqrtSpeedProber)
    monkeypatch.setattr(findbs, "measure_noise_scale", lambda *args, **kwargs: measured(30.0, 20.0, 45.0))
    # given tuned rates at 8 and 64 (as --from-store hands them over) and a recommendation of 32
    anchor = {"store": "s", "sweep": "crit", "kind": "critical", "rates": {8: 0.05, 64: 0.2}, "edges": []}
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", optimizer="sgd", memory_cap_bytes=1000 * 2**20, anchor=anchor),
                               data_dir, tmp_path, log=lines.append).to_dict()
    rec = s["recommendation"]
    # then 64, a factor 2 from 32 where 8 is a factor 4, gives the rate, carried to 32 by SGD's rule
    assert rec["batch_size"] == 32 and rec["base_batch_size"] == 64 and rec["base_learning_rate"] == 0.2
    assert rec["learning_rate"] == pytest.approx(0.2 * (1 + 30 / 64) / (1 + 30 / 32))
    assert "anchored at the tuned rate of the critical sweep 'crit': 0.2 at batch size 64" in "\n".join(lines)
    assert s["settings"]["anchor"]["sweep"] == "crit"
    assert lines[1].startswith("Learning rate scaled from s: the critical sweep 'crit', tuned at batch sizes 8, 64")


def test_the_critical_batch_size_is_probed_and_joins_the_choice_when_statistics_binds(data_dir, tmp_path,
                                                                                     monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", SqrtSpeedProber)
    def noise_step(*args, **kwargs):
        args[-1]("Noise scale: measured")  # its log
        return measured(50.4, 30.0, 90.0)

    monkeypatch.setattr(findbs, "measure_noise_scale", noise_step)
    # given a noise scale of 50 and throughput growing as sqrt(B) up to the memory limit (its margin)
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, max_batch=4096), data_dir,
                               tmp_path, log=lines.append).to_dict()
    # then 48, the critical batch size rounded down, is probed on the search's way up, between 32 and
    # 64 (so in the worker of the way up, not a fresh one), and has the least worst case over 30 to 90
    critical = [p for p in s["probes"] if p["phase"] == "critical"]
    assert [p["batch_size"] for p in critical] == [48]
    assert [(p["batch_size"], p["phase"]) for p in s["probes"]][:6] == [
        (1, "calibrate"), (64, "check"), (8, "search"), (16, "search"), (32, "search"), (48, "critical")]
    rec = s["recommendation"]
    worst = {r["batch_size"]: r["worst_case"] for r in rec["table"]}
    assert min(worst, key=worst.get) == 48 and rec["binding"] == "statistics"
    # and of the sizes tied with it (within 10%), the middle one is recommended: 48 itself
    assert rec["near_best"] == [32, 48, 64] and rec["batch_size"] == 48
    assert all(worst[b] <= 1.1 * worst[48] for b in rec["near_best"])
    # and the cap, the user's, was checked by batch size 1 first, then the statistics measured
    # before the search's first probe
    calibrated = next(i for i, ln in enumerate(lines) if ln.startswith("calibrate"))
    first_search = next(i for i, ln in enumerate(lines) if ln.startswith("search"))
    assert calibrated < lines.index("Noise scale: measured") < first_search


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (64 px, 24 training images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


TOLERANCE_PERCENT = 40.0


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_a_search_under_a_cap_brackets_the_limit_and_the_prediction_is_not_off_by_a_factor_of_2(data_dir, tmp_path):
    # On TensorFlow: JAX's memory model (XLA's plan) is held to its 15% by the benchmark
    # (benchmarks/bench_memory_model.py), and the search and the cap's watcher run no framework.
    keras_backend = "tensorflow"
    # The runtime's own footprint differs from machine to machine: measure it, cap above it.
    base = run_isolated(ProbeTask(1, str(data_dir), "adam", "standard", "float32", steps=1, warmup=0),
                        tmp_path / "w.log")
    assert base.status == "done", base.error
    if base.memory_kind != "cpu-rss":
        pytest.skip("the memory cap stands in for device memory on the CPU only")
    # 600 MiB is about 400 more 64 px images on TensorFlow (1.5 MiB each), 140 on JAX (4.3 MiB):
    # room enough that a run's resident memory, which varies by 60-130 MiB with the scheduling of
    # its ops, moves the answer by well under 15%.
    cap_mb = base.peak_memory_mb + 600
    start = {"tensorflow": 256, "jax": 64}[keras_backend]  # near the answer: the search is tested above
    resolution = 32  # 8% of the answer (about 400): a bracket still, two fresh probes fewer than 8
    lines: list[str] = []
    settings = FindSettings("fbs", start=start, margin=0.0, steps=2, warmup=1, memory_cap_bytes=int(cap_mb * 2**20),
                            resolution=resolution, measure_noise=False, max_batch=4096)  # past the 48 images
    s = findbs.find_batch_size(settings, data_dir, tmp_path, log=lines.append).to_dict()
    probes = s["probes"]
    by_size = {p["batch_size"]: p for p in probes if p["phase"] not in ("retime", "between")}
    # sizes timed again were those with room to spare under the cap (a timing worker keeps their
    # steps), and any gap filled there lay below one
    retimed = {p["batch_size"] for p in probes if p["phase"] == "retime"}
    assert all(by_size[b]["peak_memory_mb"] <= 0.75 * cap_mb for b in retimed if b in by_size)
    assert all(any(c > p["batch_size"] and by_size[c]["peak_memory_mb"] <= 0.75 * cap_mb for c in by_size)
               for p in probes if p["phase"] == "between")
    largest, above = s["largest_fitting"], s["first_not_fitting"]
    # the found batch size ran under the cap; the next size up (by the resolution) did not
    assert largest is not None and above is not None and 0 < above - largest <= resolution
    assert by_size[largest]["status"] == "done" and by_size[largest]["peak_memory_mb"] <= cap_mb
    assert by_size[above]["status"] == "oom" and by_size[above]["peak_memory_mb"] > cap_mb
    for p in probes:  # it fits (done) means exactly: peak resident memory under the cap
        assert p["status"] in ("done", "oom"), p.get("error")
        assert (p["peak_memory_mb"] <= cap_mb) == (p["status"] == "done"), p
    # a probe ran out of memory and was recorded so, saying why (whether the search went on after it
    # depends on where the prediction put it: with one within 5%, the bracket may close right there)
    first_oom = next(i for i, p in enumerate(probes) if p["status"] == "oom")
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
    assert abs(s["prediction"]["percent_apart"]) <= TOLERANCE_PERCENT, s["prediction"]
    # probes near the predicted limit ran in fresh workers
    fresh_from = s["prediction"]["fresh_from"]
    assert all(p["worker"] != "reused" for p in probes if p["batch_size"] >= fresh_from and p["phase"] != "retime")
    rec = s["recommendation"]
    assert by_size[rec["batch_size"]]["status"] == "done" and rec["batch_size"] <= largest
    assert rec["learning_rate"] == pytest.approx(0.001 * (rec["batch_size"] / 32) ** 0.5)  # Adam: the square-root rule
    text = "\n".join(lines)
    assert f"Largest batch size that fits under {cap_mb:.0f} MiB: {largest}" in text
    model = {"tensorflow": "The step replayed through TensorFlow's allocator predicts",
             "jax": "XLA's memory plan predicts"}
    assert model[keras_backend] in text and "Recommendation: batch size" in text
    assert {p["backend"] for p in probes} == {keras_backend}
    assert "the square-root rule for Adam" in text and "Predicted time to a target by batch size" in text


@pytest.mark.parametrize("args, message", [
    (["--memory-limit", "4"], "has no unit"),
    (["--memory-limit", "4XB"], "unknown unit"),
    (["--margin", "1.5"], "--margin"),
    (["--mode", "linear"], "--mode"),
    (["--start", "0"], "--start"),
    (["--opt", "adagrad"], "--opt"),
    (["--name", "../x"], "--name"),
    (["--max", "0"], "--max"),
    (["--max", "12345678901234567890"], "--max"),
    (["--start", "16", "--max", "8"], "--max 8 is below --start 16"),
])
def test_bad_find_batch_size_options_are_one_line_usage_errors(data_dir, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out",
                                      str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]
    assert not (tmp_path / "find-batch-size").exists()


def test_find_batch_size_on_unprepared_data_is_exit_1_saying_how_to_prepare(tmp_path):
    # a missing data folder is not a bad option: exit 1 (docs/usage.md, "Exit codes")
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "catsdogs prepare" in result.output


OWN_LINES = ("Find batch size", "calibrate ", "search ", "confirm ", "critical ", "Predicted before the search",
             "Largest batch size", "No batch size fits", "No 10% margin taken", "The step replayed", "XLA's memory plan",
             "That limit is XLA's", "Fastest that fits", "With a ", "Recommendation:", "No recommendation",
             "Noise scale", "Critical batch size", "Learning rate", "Predicted time to a target", "  ",
             "Within ", "Statistics could not be resolved", "The limit is noisy", "Answered in ",
             "The noise scale's interval is open above", "Worst case over", "As good (within", "Tune it",
             "retime ")


@pytest.mark.slow
def test_the_command_prints_only_its_own_lines_on_either_backend(keras_backend, prepared_data, tmp_path,
                                                                brief_probes):
    # given the command as a user runs it (`python -m catsdogs`, its probes timed briefly first), in
    # a process of its own, with a cap (so it predicts), on 32 px images (what it prints does not
    # depend on their size; the short runs train faster)
    env = {**os.environ, "KERAS_BACKEND": keras_backend}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell has it: TensorFlow's C++ logging on
    data_dir = prepared_data(32, (24, 8, 8))
    command = f"{brief_probes}; import runpy; runpy.run_module('catsdogs', run_name='__main__', alter_sys=True)"
    out = subprocess.run([sys.executable, "-c", command, "find-batch-size", "--data-dir", str(data_dir),
                          "--out", str(tmp_path), "--memory-limit", "8GiB", "--start", "1", "--max", "2"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    # then every line, on stdout and stderr, is one of catsdogs' own: no absl, oneDNN or CUDA notice
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert [ln for ln in lines if not ln.startswith(OWN_LINES)] == []
    assert any(ln.startswith("Predicted before the search") for ln in lines)
    # and the noise scale was measured by default, and joined the recommendation
    assert any(ln.startswith("Critical batch size (the gradient noise scale") for ln in lines), lines


@pytest.mark.slow
def test_a_cap_below_the_runtime_ends_the_run_at_batch_size_1_before_the_noise_scale(data_dir, tmp_path):
    # given a cap below what the runtime itself needs, with the noise scale on and the default start
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(tmp_path),
                                      "--memory-limit", "200MiB", "--name", "tiny"])
    # then a usage error naming --memory-limit (exit 2: a value below what batch size 1 needs), in
    # three lines (the opening, batch size 1's probe, the error): no noise scale trained, no larger
    # size probed after batch size 1 did not fit
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) <= 3 and lines[1].startswith("calibrate batch size     1: oom"), lines
    assert "Invalid value for '--memory-limit'" in lines[-1] and "no batch size fits" in lines[-1]
    assert not any(ln.startswith("Noise scale") for ln in lines)
    # and its records written all the same
    saved = json.loads((tmp_path / "tiny" / "find_batch_size.json").read_text())
    assert [p["status"] for p in saved["probes"]] == ["oom"] and saved["noise_scale"] is None


def test_a_probes_least_timed_seconds_are_read_when_the_settings_are_made(monkeypatch):
    from catsdogs.measure import search

    # given find-batch-size's default (what the command line runs with)
    assert FindSettings().min_seconds == search.DEFAULT_MIN_SECONDS == 0.3
    # when the module's default is changed after the settings' class was defined (the suite's
    # brief_probes), then settings made now time their probes so: the end-to-end tests run briefly
    monkeypatch.setattr(search, "DEFAULT_MIN_SECONDS", 0.02)
    assert FindSettings().min_seconds == 0.02 and FindSettings(min_seconds=0.5).min_seconds == 0.5


def test_the_noise_scale_measures_four_seeds_after_epoch_2_each_a_cluster_at_the_rate_one_seed_chose_of_three(
        tmp_path, monkeypatch):
    from catsdogs import gradient_noise
    from catsdogs.messages import TrialRecord

    # given short runs whose B_simple is 400 after their first epoch (the transient) and 20 or 40 after
    # the second, depending on the seed
    runs, workers = [], []

    class OneWorker:  # every short run in one worker, as a sweep's trials share one
        def __init__(self, log_path, env=None):
            self.log_path = log_path
            workers.append(self)

        def launch(self):
            pass

        def run(self, task, fresh=False, timing=False, spare=True):
            return fake_run(task)

        def close(self):
            pass

    def fake_run(task):  # a trial measures only the epochs its sampling asks for
        runs.append((task.config.seed, task.config.epochs, task.config.batch_size, task.config.lr))
        sampling = gradient_noise.NoiseSampling(**task.noise_sampling) if task.noise_sampling else None
        value = {7: 20.0, 8: 40.0, 9: 20.0, 10: 40.0}[task.config.seed]
        val_loss = run_loss.get((task.config.seed, task.config.lr), 0.6)
        rows = [{"epoch": e, "loss": 0.7, "val_loss": val_loss,
                 **(gradient_noise.from_pairs([0.9, 1.1] * 8, [0.9 * v, 1.1 * v] * 8, floor=10,
                                              epoch=e).to_record() if sampling and sampling.measures(e) else {})}
                for e, v in ((1, 400.0), (2, value), (3, value)) if e <= task.config.epochs]
        return TrialRecord(status="done", history=rows, initial_noise=None, noise_seconds=1.0,
                           collapsed=int(collapsing == task.config.seed))

    collapsing = None
    low, mid, high = (0.001 * f for f in (1.0, 3.0, 10.0))  # Adam's default, 3 and 10 times it
    run_loss = {(7, low): 0.62, (7, mid): 0.40, (7, high): 0.55}

    monkeypatch.setattr(noise_run, "Worker", OneWorker)
    monkeypatch.setattr(noise_run, "noise_workers", lambda user: 1)  # one after another (at once: the next test)
    manifest = {"params": {"size": 32}, "fingerprint": {"standard": "f"}}
    lines: list[str] = []
    run = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    # then without a store's tuned rate, seed 7 trained first at Adam's default, 3 and 10 times it,
    # and the least validation loss of the three chose 0.003, inside the grid, as the rule's anchor
    assert runs[:3] == [(7, 2, 32, low), (7, 2, 32, mid), (7, 2, 32, high)]
    saved = run.as_json()
    assert saved["rate_test"]["chosen"] == pytest.approx(0.003) and not saved["rate_test"]["edge"]
    assert saved["rate_test"]["losses"] == [0.62, 0.40, 0.55]
    anchor = recommendation.short_run_anchor(saved["rate_test"])
    assert anchor["rates"] == {32: pytest.approx(0.003)} and "the best of the noise scale's short runs" in anchor["said"]
    # and the noise scale's four runs of 2 epochs at batch 32, seeds 7 to 10, trained at that rate
    # (seed 7's run at it reused), in one worker, and the estimate is the geometric mean of the
    # seeds' values after epoch 2, its interval over the 4 seeds (3 degrees of freedom): each seed
    # weighted alike, one cluster
    assert runs[3:] == [(8, 2, 32, mid), (9, 2, 32, mid), (10, 2, 32, mid)] and saved["lr"] == mid
    assert len(workers) == 1
    # and the measurements' seconds are the four noise runs' (1 s each), not the rate test's others
    assert saved["measure_seconds"] == 4.0
    assert run.estimate.b_simple == pytest.approx((20.0 * 40.0) ** 0.5) and run.estimate.measurements == 4
    spread = gradient_noise.t_quantile(0.975, 3) * float(np.std(np.log([20.0, 40.0] * 2), ddof=1)) / 2
    assert run.estimate.pairs == 4 and run.estimate.high == pytest.approx(run.estimate.b_simple * math.exp(spread))
    # and nothing was measured before epoch 2; the estimate knows its pairs' sizes (1 and 25 images)
    assert (run.estimate.small, run.estimate.large) == (1, noise_run.NOISE_LARGE)
    assert saved["seeds"] == [7, 8, 9, 10] and saved["from_epoch"] == 2 and saved["epochs"] == 2
    assert saved["clustered"] and any("seeds 7, 8, 9, 10; B_simple" in ln for ln in lines)
    # and where seed 7 took off at no rate, seed 8 tries the three; its choice (10 times the default)
    # is the noise runs' rate, seeds 7 and 8's runs at it reused (seed 7's, which did not train, is
    # its noise run all the same, and leaves the estimate as one that did not train)
    runs.clear()
    run_loss.update({(7, low): 0.69, (7, mid): 0.69, (7, high): 0.69, (8, low): 0.6, (8, mid): 0.5, (8, high): 0.4})
    second = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert runs == [(7, 2, 32, low), (7, 2, 32, mid), (7, 2, 32, high), (8, 2, 32, low), (8, 2, 32, mid),
                    (8, 2, 32, high), (9, 2, 32, high), (10, 2, 32, high)]
    assert second.lr == high and second.rate_test["seed"] == 8 and second.trained == [8, 9, 10]
    # and where no rate took off on either seed, the noise runs train at Keras's default, those run reused
    runs.clear()
    run_loss.update({(8, low): 0.69, (8, mid): 0.69, (8, high): 0.69})
    none = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert runs[6:] == [(9, 2, 32, low), (10, 2, 32, low)] and none.lr == low and none.rate_test["chosen"] is None
    run_loss.update({(7, low): 0.62, (7, mid): 0.40, (7, high): 0.55})
    for k in [(8, low), (8, mid), (8, high)]:
        del run_loss[k]
    # and with a store's tuned rate, no extra runs, the noise runs at its rate
    runs.clear()
    tuned = {"store": "s", "sweep": "t", "kind": "tuned", "rates": {32: 0.01}, "edges": []}
    again = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7, anchor=tuned), tmp_path, None,
                                          lines.append)
    assert len(runs) == 4 and again.rate_test is None and {r[3] for r in runs} == {0.01}
    # and a run that collapsed leaves the noise scale (its gradient is not training's)
    collapsing = 8
    fewer = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert fewer.estimate.pairs == 3 and fewer.trained == [7, 9, 10] and fewer.as_json()["trained_seeds"] == [7, 9, 10]
    # and so does one no better than chance (ln 2 for the article's two classes)
    collapsing = None
    run_loss[(9, mid)] = 0.6929
    at_chance = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert at_chance.trained == [7, 8, 10] and at_chance.rate_test["noise_seeds"] == [7, 8, 10]
    # and one that barely left chance (0.673 against ln 2 = 0.693: an SGD run of the H200's, near chance,
    # pooled as trained before), by the anchor's rule: below 0.9 of ln 2 only
    run_loss[(9, mid)] = 0.673
    near_chance = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert near_chance.trained == [7, 8, 10]
    # and when fewer than two trained, all four are pooled, an early value, said
    run_loss.update({(8, mid): 0.7, (9, mid): 0.7, (10, mid): 0.7})  # seed 7 alone trained
    early = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert early.trained == [7, 8, 9, 10] and any("all are pooled, an early value" in ln for ln in lines)
    # and a model whose loss is NaN in every run has no noise scale, and the log says why
    run_loss.update({(seed, lr): math.nan for seed in (7, 8, 9, 10) for lr in (low, mid, high)})
    nan = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lines.append)
    assert nan is None and lines[-1].startswith("Noise scale not measured: the loss was not finite (NaN or infinite) "
                                                "in 4 of the 4 short runs")
    assert FindSettings(seed=7).recorded(32, None, tmp_path)["seed"] == 7
    from catsdogs.errors import SettingError

    with pytest.raises(SettingError):
        FindSettings(seed=-1).check()


def test_the_noise_scales_runs_that_wait_on_no_other_train_at_once_in_workers_of_their_own_to_the_same_answer(
        tmp_path, monkeypatch):
    import threading

    from catsdogs import gradient_noise
    from catsdogs.messages import TrialRecord

    # given workers whose runs each wait until three are in flight (a barrier: a run alone in turn
    # would break it), and the seeds' B_simple 20 or 40 after epoch 2, seed 7 best at the middle rate
    together = threading.Barrier(3, timeout=10)
    launched, ran = [], []

    class Waiting:
        def __init__(self, log_path, env=None):
            self.log_path = log_path
            launched.append(self)

        def launch(self):
            pass

        def run(self, task):
            together.wait()
            c = task.config
            ran.append((c.seed, c.lr, self))
            value = {7: 20.0, 8: 40.0, 9: 20.0, 10: 40.0}[c.seed]
            loss = {0.001: 0.62, 0.003: 0.40, 0.01: 0.55}[c.lr] if c.seed == 7 else 0.5
            row = {"epoch": 2, "loss": 0.6, "val_loss": loss,
                   **gradient_noise.from_pairs([0.9, 1.1] * 8, [0.9 * value, 1.1 * value] * 8, floor=10,
                                               epoch=2).to_record()}
            return TrialRecord(status="done", history=[row], noise_seconds=1.0, collapsed=0)

        def close(self):
            pass

    monkeypatch.setattr(noise_run, "Worker", Waiting)
    monkeypatch.setattr(noise_run, "noise_workers", lambda user: 3)
    manifest = {"params": {"size": 32}, "fingerprint": {"standard": "f"}}
    # when the noise scale is measured
    run = noise_run.measure_noise_scale(tmp_path, manifest, FindSettings(seed=7), tmp_path, None, lambda line: None)
    # then the rate test's three runs trained at once, then the three seeds left at the rate chosen,
    # each round spread over three workers
    assert len(launched) == 3 and not together.broken
    assert {(seed, lr) for seed, lr, _ in ran[:3]} == {(7, 0.001), (7, 0.003), (7, 0.01)}
    assert {(seed, lr) for seed, lr, _ in ran[3:]} == {(8, 0.003), (9, 0.003), (10, 0.003)}
    assert len({id(w) for _, _, w in ran[:3]}) == 3 and len({id(w) for _, _, w in ran[3:]}) == 3
    # and the answer is the one a single worker's runs in turn give: the seeds' geometric mean
    assert run.lr == 0.003 and run.trained == [7, 8, 9, 10]
    assert run.estimate.b_simple == pytest.approx((20.0 * 40.0) ** 0.5) and run.measure_seconds == 4.0


def test_the_noise_scale_trains_one_run_at_a_time_on_a_gpu_for_a_users_model_on_one_core_or_short_of_memory(
        monkeypatch):
    # given a CPU of two cores with memory for every worker
    monkeypatch.setattr(noise_run, "visible_gpus", lambda: [])
    monkeypatch.setattr(noise_run, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(noise_run, "host_memory_available", lambda: 64 * 2**30)
    # then the article's model's runs train NOISE_WORKERS at once, a user's model's one at a time
    assert noise_run.noise_workers(False) == noise_run.NOISE_WORKERS == 3
    assert noise_run.noise_workers(True) == 1
    # and as many as the memory available has room for, at least one
    monkeypatch.setattr(noise_run, "host_memory_available", lambda: 2 * noise_run.NOISE_WORKER_ROOM + 1)
    assert noise_run.noise_workers(False) == 2
    monkeypatch.setattr(noise_run, "host_memory_available", lambda: noise_run.NOISE_WORKER_ROOM // 2)
    assert noise_run.noise_workers(False) == 1
    # and one on a single core, or where a GPU is visible (its memory would be shared)
    monkeypatch.setattr(noise_run, "host_memory_available", lambda: 64 * 2**30)
    monkeypatch.setattr(noise_run, "usable_cores", lambda: [0])
    assert noise_run.noise_workers(False) == 1
    monkeypatch.setattr(noise_run, "usable_cores", lambda: [0, 1])
    monkeypatch.setattr(noise_run, "visible_gpus", lambda: ["0"])
    assert noise_run.noise_workers(False) == 1


def test_the_anchor_tries_the_next_seed_where_no_rate_trained_and_says_when_none_did():
    from catsdogs.messages import TrialRecord

    # given a first seed that collapsed at SGD's default rate and barely moved at 3 and 10 times
    # it (0.675, the loss that had chosen 0.03 by the noise of an untrained run), and a next seed
    # that took off at 10 times it
    learned = noise_run.ANCHOR_LEARNED * math.log(2)
    losses = {(5, 0.03): 0.675, (5, 0.1): 0.693, (6, 0.01): 0.67, (6, 0.03): 0.66, (6, 0.1): 0.38}
    ran = []

    def run(seed, lr):
        ran.append((seed, lr))
        if (seed, lr) == (5, 0.01):
            return TrialRecord(status="done", history=[{"epoch": 2, "val_loss": 0.693}], collapsed=1)
        return TrialRecord(status="done", history=[{"epoch": 2, "val_loss": losses[(seed, lr)]}], collapsed=0)

    rates = [0.01, 0.03, 0.1]
    rounds = noise_run.anchor_rounds(run, rates, [5, 6, 7, 8], learned)
    # then the next seed tried the three rates too, and no third seed (one of its runs trained)
    assert ran == [(5, 0.01), (5, 0.03), (5, 0.1), (6, 0.01), (6, 0.03), (6, 0.1)]
    assert rounds == [{"seed": 5, "losses": [None, 0.675, 0.693]}, {"seed": 6, "losses": [0.67, 0.66, 0.38]}]
    # and its least loss chose 0.1, at the grid's edge, said so in the anchor
    test = noise_run.rate_test(rates, rounds, learned)
    assert (test["chosen"], test["seed"], test["edge"]) == (0.1, 6, True)
    assert recommendation.short_run_anchor(test)["edges"] == [32]
    # and where no run of either seed trained, no rate is chosen, it is said, and the rule keeps
    # Keras's default (a loss at chance ranks no rate)
    losses.update({(6, 0.01): 0.69, (6, 0.03): 0.69, (6, 0.1): 0.69})
    ran.clear()
    lines: list[str] = []
    none = noise_run.rate_test(rates, noise_run.anchor_rounds(run, rates, [5, 6, 7, 8], learned),
                               learned, lines.append)
    assert len(ran) == 3 * noise_run.ANCHOR_SEEDS and none["chosen"] is None and none["seed"] is None
    assert "no short run trained at 0.01, 0.03, 0.1 (seeds 5, 6)" in lines[0]
    assert recommendation.short_run_anchor(none) is None


def test_the_anchor_takes_the_largest_rate_one_seed_cannot_tell_from_the_least_loss():
    # given Adam's seed 1 on the article's model (TensorFlow, 64 px): after 2 epochs at batch 32 the
    # least loss at 0.001 (0.409), 0.01 within 1.2 times it (0.459), 0.003 beyond (0.549)
    learned = noise_run.ANCHOR_LEARNED * math.log(2)
    rates = [0.001, 0.003, 0.01]
    test = noise_run.rate_test(rates, [{"seed": 1, "losses": [0.409, 0.549, 0.459]}], learned)
    # then 0.01 anchors the rule, the least's own rate kept beside it, at the grid's edge
    assert (test["chosen"], test["least"], test["tie"], test["edge"]) == (0.01, 0.001, noise_run.ANCHOR_TIE, True)
    assert recommendation.short_run_anchor(test)["rates"] == {32: 0.01}
    # and a larger rate beyond the tie is not taken over a smaller one within it
    beyond = noise_run.rate_test(rates, [{"seed": 1, "losses": [0.40, 0.45, 0.60]}], learned)
    assert (beyond["chosen"], beyond["least"], beyond["edge"]) == (0.003, 0.001, False)
    # and a run that collapsed or diverged (no loss) is never taken, however large its rate
    collapsed = noise_run.rate_test(rates, [{"seed": 1, "losses": [0.40, 0.41, None]}], learned)
    assert collapsed["chosen"] == 0.003
    # and a user's loss of 0 or below (no ratio to take) ties with its equals alone
    negative = noise_run.rate_test(rates, [{"seed": 1, "losses": [-0.5, -0.45, -0.2]}], learned)
    assert (negative["chosen"], negative["least"]) == (0.001, 0.001)
    zero = noise_run.rate_test(rates, [{"seed": 1, "losses": [0.3, 0.0, 0.0]}], learned)
    assert zero["chosen"] == 0.01


@pytest.mark.parametrize("kind", ["cpu-rss", "gpu-worker"])
def test_the_sizes_the_answer_could_fall_on_are_timed_again_on_the_cpu_so_one_busy_moment_does_not_decide(
        data_dir, tmp_path, monkeypatch, kind):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(findbs, "measure_noise_scale", lambda *args, **kwargs: measured(30.0, 20.0, 45.0))
    settings = FindSettings("fbs", memory_cap_bytes=4000 * 2**20, max_batch=256)  # room: no size near the cap
    monkeypatch.setattr(prober, "Prober", UnluckyProber)
    monkeypatch.setattr(UnluckyProber, "kind", kind)
    monkeypatch.setattr(UnluckyProber, "unlucky", False)
    steady = findbs.find_batch_size(settings, data_dir, tmp_path / "steady", log=lambda line: None).to_dict()
    # given the same device, its first probe of 16 at half speed (a busy moment of the machine)
    monkeypatch.setattr(UnluckyProber, "unlucky", True)
    UnluckyProber.timed = []
    s = findbs.find_batch_size(settings, data_dir, tmp_path / "unlucky", log=lambda line: None).to_dict()
    timed = [(p["batch_size"], p["phase"]) for p in s["probes"] if p["phase"] in ("retime", "between")]
    if kind == "gpu-worker":  # a GPU's synced timers are steady: nothing is timed again
        assert timed == []
        return
    # then on the CPU the 5 sizes nearest the least worst case's are timed twice more, in alternating
    # order, in one fresh worker (the live one's memory not known: LinearProber.resident_mb), 16 among
    # them, and its unlucky probe is outvoted; with them the sizes between the calibration's 1 and the
    # search's 8 (a gap beside the contest), first timed there
    order = [b for b, _ in timed]
    sizes = sorted(set(order))
    between = [b for b, phase in timed if phase == "between"]
    assert between == [4, 2] and order == sorted(sizes, reverse=True) + sizes
    assert 16 in sizes and len(set(sizes) - set(between)) == 5
    assert [timing for b, timing in UnluckyProber.timed[-len(order):]] == [False] + [True] * (len(order) - 1)
    table = {r["batch_size"]: r["images_per_second"] for r in s["recommendation"]["table"]}
    assert table[16] == pytest.approx(100.0 * 16 ** 0.5)  # the median of its three: the two steady ones
    assert s["recommendation"]["batch_size"] == steady["recommendation"]["batch_size"]


@pytest.mark.parametrize("held, per_look, fresh_looks", [
    (600.0, 5.0, []),  # far from the cap: every look in the search's own worker, no start
    (850.0, 0.0, [0]),  # the search's worker holds too much beside the largest step (850 + 63 > 900): one fresh
    (750.0, 60.0, [2]),  # each look's kept step adds 60 MiB: a fresh worker when the next would not fit
])
def test_the_retime_runs_in_the_live_worker_while_its_resident_set_leaves_room_for_the_largest_step(
        tmp_path, monkeypatch, held, per_look, fresh_looks):
    from catsdogs.measure import prober
    from catsdogs.measure.probe_run import ProbeRun

    monkeypatch.setattr(prober, "Prober", ResidentProber)
    monkeypatch.setattr(ResidentProber, "held", held)
    monkeypatch.setattr(ResidentProber, "per_look", 0.0)
    run = ProbeRun(FindSettings("fbs", memory_cap_bytes=1000 * 2**20), tmp_path, tmp_path, None, {}, lambda line: None)
    # given the search's probes of 1, 8 and 64 under a 1000 MiB cap (peaks 501, 508, 564 MiB: the
    # largest step adds 63 MiB to the runtime's)
    for b in (1, 8, 64):
        run.probe(b, "search")
    run.prober.resident = held
    monkeypatch.setattr(ResidentProber, "per_look", per_look)
    LinearProber.calls = []
    # when the sizes 8 and 64 are timed again (64, 8, 8, 64)
    run.retime([8, 64])
    # then a look runs in the live worker, as a timing, while its resident set plus 63 MiB stays within
    # 90% of the cap (900 MiB), else in a fresh worker
    assert [b for b, _, _ in LinearProber.calls] == [64, 8, 8, 64]
    assert [n for n, (_, fresh, _) in enumerate(LinearProber.calls) if fresh] == fresh_looks
    assert all(timing is not fresh for _, fresh, timing in LinearProber.calls)


def test_a_critical_size_below_the_searchs_start_is_timed_in_the_retimes_worker_not_a_fresh_one_of_its_own(
        data_dir, tmp_path, monkeypatch):
    from catsdogs.measure import prober

    calls = []

    class Recording(SqrtSpeedProber):
        def run(self, task, fresh=False, timing=False, spare=True):
            calls.append((task.batch_size, fresh, task.timing_only))
            return super().run(task, fresh, timing)

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", Recording)
    # given a noise scale of 5 (3 to 9), whose size rounded down, 4, lies below the search's start, 8,
    # and a prediction that probed 16 before the search (a user's model's: a line through two probes)
    monkeypatch.setattr(findbs, "measure_noise_scale", lambda *args, **kwargs: measured(5.0, 3.0, 9.0))
    monkeypatch.setattr(findbs, "predict_first", lambda run, *args: run.probe(16, "predict", fresh=True) and None)
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=4000 * 2**20, max_batch=64), data_dir,
                               tmp_path, log=lambda line: None).to_dict()
    # when the search is done (1 and 16, then 8 up to 64) and the CPU's sizes are timed again in a fresh worker
    retime_starts = max(n for n, (b, fresh, timing_only) in enumerate(calls) if fresh)
    # then 4 is probed once for its memory nowhere: it is timed first in that worker, as "critical"
    assert [c for c in calls if c[0] == 4][0] == (4, False, True)
    assert calls.index((4, False, True)) > retime_starts
    phases = [p["phase"] for p in s["probes"] if p["batch_size"] == 4]
    assert phases[0] == "critical" and set(phases[1:]) == {"retime"}
    # and it is a candidate of the choice like any size probed
    assert 4 in {r["batch_size"] for r in s["recommendation"]["table"]}


@pytest.mark.parametrize("kind, share", [("cpu-rss", 0.05), ("gpu-worker", 0.03)])
def test_the_bisections_share_is_a_resident_sets_5_percent_on_the_cpu_and_3_on_exact_peaks(
        data_dir, tmp_path, monkeypatch, kind, share):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", UnluckyProber)
    monkeypatch.setattr(UnluckyProber, "kind", kind)
    monkeypatch.setattr(UnluckyProber, "unlucky", False)
    asked = []
    real = findbs.search
    monkeypatch.setattr(findbs, "search", lambda *args, **kwargs: asked.append(kwargs["share"]) or real(*args, **kwargs))
    # when find-batch-size searches on a device whose calibration measured `kind`
    findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, max_batch=4096, measure_noise=False),
                           data_dir, tmp_path, log=lambda line: None)
    # then the bisection stops at the share of the answer that kind of peak can tell apart
    assert asked == [share]


def test_max_alone_starts_the_search_no_higher_and_a_start_above_a_max_is_refused(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(findbs, "find_batch_size",
                        lambda settings, *a, **k: seen.append(settings) or {"largest_fitting": None})
    # given --max 4 alone (the default --start is 8)
    ok = CliRunner().invoke(cli, ["find-batch-size", "--max", "4", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    # then the search starts at 4, not refused for a --start the user never gave
    assert ok.exit_code == 0, ok.output
    assert FindSettings().start == 8 and (seen[0].start, seen[0].max_batch) == (4, 4)
    # and a --start the user gave above --max is a usage error naming both (checked before any work)
    monkeypatch.undo()
    bad = CliRunner().invoke(cli, ["find-batch-size", "--start", "8", "--max", "4", "--data-dir", str(tmp_path)])
    assert bad.exit_code == 2 and "--max 4 is below --start 8" in bad.output


def test_ctrl_c_keeps_the_finished_probes_marked_interrupted_and_no_older_answer_stands(data_dir, tmp_path,
                                                                                       monkeypatch):
    from catsdogs.analysis.time_to_target import load_find_results
    from catsdogs.errors import CatsdogsError, Interrupted
    from catsdogs.measure import prober

    class CtrlCAt32(SqrtSpeedProber):
        def run(self, task, fresh=False, timing=False, spare=True):
            if task.batch_size == 32:
                raise KeyboardInterrupt
            return super().run(task, fresh, timing)

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", CtrlCAt32)
    # given an earlier run's answer under the same name
    older = tmp_path / "fbs" / "find_batch_size.json"
    older.parent.mkdir()
    older.write_text(json.dumps({"settings": {"optimizer": "adam"}, "recommendation": {"batch_size": 512}}))
    # when a search is stopped by Ctrl-C at batch size 32
    lines: list[str] = []
    with pytest.raises(Interrupted):
        findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, measure_noise=False), data_dir,
                               tmp_path, log=lines.append)
    # then the probes that finished are kept, marked interrupted, without an answer, said so
    saved = json.loads(older.read_text())
    assert saved["interrupted"] and [p["batch_size"] for p in saved["probes"]] == [1, 8, 16]
    assert "recommendation" not in saved and lines[-1].startswith("Interrupted: 3 finished probes kept in")
    # and the report holds no interrupted run against a sweep, nor the older answer it replaced
    assert load_find_results(tmp_path) == []
    with pytest.raises(CatsdogsError, match="interrupted"):
        load_find_results(tmp_path, [older])


def test_an_effective_batch_that_does_not_fit_gets_its_accumulation_plan(data_dir, tmp_path, monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(prober, "Prober", SqrtSpeedProber)
    monkeypatch.setattr(findbs, "measure_noise_scale", lambda *args, **kwargs: measured(30.0, 20.0, 45.0))
    # given a device whose margin's size is well below a recipe's batch of 4,000
    lines: list[str] = []
    s = findbs.find_batch_size(FindSettings("fbs", memory_cap_bytes=1000 * 2**20, max_batch=4096,
                                            effective_batch=4000), data_dir, tmp_path, log=lines.append).to_dict()
    # then the hand-off keeps 4,000 exactly in micro-batches no larger than the margin's size, and says so
    plan, safe = s["hand_off"]["accumulation"], s["margin_batch_size"]
    assert plan["micro_batch_size"] * plan["steps"] == 4000 and plan["micro_batch_size"] <= safe < 4000
    assert s["hand_off"]["batch_size"] == s["recommendation"]["batch_size"]
    assert s["hand_off"]["eval_batch_size"] == s["largest_fitting"] and s["settings"]["effective_batch"] == 4000
    assert f"Effective batch 4,000: accumulate {plan['steps']} micro-batches of {plan['micro_batch_size']:,}" in \
        "\n".join(lines)


def test_an_effective_batch_below_one_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(cli, ["find-batch-size", "--effective-batch", "0", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "'--effective-batch': must be at least 1, got 0" in result.output


def test_a_run_into_the_folder_another_live_run_writes_is_refused_and_a_dead_runs_claim_is_taken(tmp_path):
    from catsdogs.errors import CatsdogsError

    # given a folder claimed by a live process (this test's parent, say) and one by a process gone
    live, gone = tmp_path / "live", tmp_path / "gone"
    live.mkdir()
    gone.mkdir()
    (live / findbs.LOCK).write_text(str(os.getppid()))
    (gone / findbs.LOCK).write_text("999999999")
    # then a run into the first is refused in one line, saying whose it is; into the second, it claims it
    with pytest.raises(CatsdogsError, match=f"another find-batch-size \\(pid {os.getppid()}\\) is writing"):
        take_claim(live / findbs.LOCK, None)
    take_claim(gone / findbs.LOCK, None)
    assert (gone / findbs.LOCK).read_text() == str(os.getpid())
    # and a file of that name catsdogs did not write (other bytes, not UTF-8 either) is refused, kept
    for name, body in (("text", b"mine"), ("binary", b"\xff\xfe")):
        (tmp_path / name).mkdir()
        (tmp_path / name / findbs.LOCK).write_bytes(body)
        with pytest.raises(CatsdogsError, match="is not a claim of catsdogs's"):
            take_claim(tmp_path / name / findbs.LOCK, None)
        assert (tmp_path / name / findbs.LOCK).read_bytes() == body


def test_the_noise_runs_train_at_the_rate_the_rule_anchors_on_at_the_base_batch():
    # given a store's tuned SGD rate at batch 128, the short runs' best at 32, or neither
    tuned = {"store": "s", "sweep": "t", "kind": "tuned", "rates": {128: 0.1}, "edges": []}
    test = {"chosen": 0.03, "batch_size": 32, "rates": [0.01, 0.03, 0.1], "edge": False, "epochs": 2}
    # then the noise runs train at the store's carried to 32 by SGD's rule (linear without a noise
    # scale yet: 0.025), at the short runs' best, or at Keras's default
    assert noise_run.noise_rate(FindSettings(optimizer="sgd", anchor=tuned), None) == pytest.approx(0.025)
    assert noise_run.noise_rate(FindSettings(optimizer="sgd"), test) == pytest.approx(0.03)
    assert noise_run.noise_rate(FindSettings(optimizer="sgd"), {**test, "chosen": None}) == pytest.approx(0.01)


@pytest.mark.parametrize("flags, cap, isa", [
    ({"sse4_1", "avx", "avx2", "fma"}, None, "AVX2"),  # an AMD EPYC of issue 65: AVX2, no AVX-512
    ({"sse4_1", "avx", "avx2", "fma"}, "SSE41", "SSE41"),
    ({"sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}, None,
     "AVX512_CORE_VNNI"),
    ({"sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx2", "AVX2"),
    ({"sse4_1", "avx"}, "ALL", "AVX"),
    (set(), None, None),  # not an x86 CPU, or flags unread
])
def test_the_instruction_set_onednn_dispatches_to_is_the_cpus_highest_under_its_cap(flags, cap, isa):
    from catsdogs import host

    assert host.onednn_isa(flags, cap) == isa


@pytest.mark.parametrize("backend, steps, near_limit_steps", [("jax", 3, 1), ("tensorflow", 3, 3), ("jax", 5, 5)])
def test_near_the_limit_a_jax_probe_on_the_cpu_times_one_step_where_its_peak_is_the_first_steps(
        tmp_path, monkeypatch, backend, steps, near_limit_steps):
    from catsdogs.measure import probe_run
    from catsdogs.measure.probe_run import ProbeRun

    # given find-batch-size's probes on the CPU (resident sets) with --steps `steps`, and the sizes from
    # 800 up run in fresh workers (the prediction's `fresh_from`)
    monkeypatch.setattr(probe_run.backends, "name", lambda: backend)
    run = ProbeRun(FindSettings("fbs", memory_cap_bytes=2048 * 2**20, steps=steps), tmp_path, tmp_path, None, {},
                   lambda line: None)
    tasks = recording_tasks(run)
    run.probe(1, "calibrate")
    run.prober.fresh_from = 800
    # when a size below it, one above it and a retime's look above it run
    run.probe(512, "search")
    run.probe(900, "search")
    run._run(900, "retime", timing=True, timing_only=True)
    # then only the probe of memory near the limit times fewer steps: one on JAX with --steps' default
    # (its steps after the first add 0.44% to the peak), else --steps' own
    assert [t.steps for t in tasks] == [steps, steps, near_limit_steps, steps]
