"""find-batch-size's memory model: memory sizes, TensorFlow's step replayed through its allocator
(BFC), XLA's memory fraction."""

from __future__ import annotations

import pytest

from catsdogs.measure.common import format_bytes, parse_memory
from catsdogs.training.costs import (
    bfc_replay,
    parameter_count,
    predict_max_batch_size,
    predicted_peak_bytes,
    state_bytes,
    step_allocations,
    tensor_bytes,
)


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


MiB = 2**20


def test_tensor_sizes_and_state_at_200px():
    t = tensor_bytes(32, 200)
    assert t["input_uint8"] == 32 * 120_000 and t["rescaled_input"] == 4 * t["input_uint8"]
    assert t["full_map"] == 32 * 200 * 200 * 32 * 4 and t["pooled_map"] == t["full_map"] // 4
    assert t["pool_workspace"] == t["pooled_map"] // 4  # one byte per pooled value
    assert t["dense_kernel"] == 4 * 100 * 100 * 32 * 128
    assert tensor_bytes(32, 200, "mixed_float16")["full_map"] == t["full_map"] // 2
    p = parameter_count(200)
    assert sum(state_bytes(200, "adam").values()) == 16 * p  # weights, gradients, m, v
    assert sum(state_bytes(200, "sgd").values()) == 8 * p
    assert sum(state_bytes(200, "sgd", "mixed_float16").values()) == 10 * p


def test_a_step_frees_everything_it_allocates_and_holds_two_full_maps_at_its_peak():
    # given the probe's allocations at one batch size, replayed without the setup's tensors
    events = step_allocations(64, 40, steps=3)
    live: dict[str, int] = {}
    most = 0
    for name, nbytes in events:
        if nbytes:
            assert name not in live, f"{name} allocated twice"
            live[name] = nbytes
        else:
            live.pop(name)
        most = max(most, sum(v for k, v in live.items() if k in ("relu", "grad_relu")))
    # then only the setup's tensors are left, and at the peak two full maps live (oneDNN's fused
    # convolution and ReLU, then max-pooling's gradient)
    assert set(live) <= {"runtime", "train_images", "kernel", "slot0", "slot1"}
    assert most == 2 * tensor_bytes(64, 40)["full_map"]


def test_bfc_grows_its_regions_from_2_mib_doubling_and_never_returns_one():
    # given small tensors, then one of 5 MiB, then more of it
    r = bfc_replay([("a", 1000), ("b", 5 * MiB), ("c", 5 * MiB), ("b", 0), ("c", 0), ("d", 9 * MiB)])
    # then the first region is 2 MiB; 5 MiB needs the next power of two (8), after which the
    # next region doubles (16), and freed chunks stay in their regions (9 MiB needs a new one)
    assert [x // MiB for x in r["regions"]] == [2, 8, 8, 16][:len(r["regions"])]
    assert r["fits"]


def test_bfc_counts_the_pages_ever_written_not_the_regions_and_not_the_peak_in_use():
    # given a 100 MiB tensor freed (its region is 128 MiB), then 60 MiB and 70 MiB, which cannot
    # both go where it was
    r = bfc_replay([("big", 100 * MiB), ("big", 0), ("x", 60 * MiB), ("y", 70 * MiB)])
    # then the first 100 MiB were written, and the 70 MiB tensor wrote a new region too
    assert [x // MiB for x in r["regions"]] == [128, 128]
    assert r["touched_bytes"] == 170 * MiB
    # and in use counts whole chunks: 70 MiB takes its 128 MiB region unsplit (the rest, under
    # the request and under 128 MiB, is not worth a chunk of its own)
    assert r["peak_in_use_bytes"] == (60 + 128) * MiB
    assert sum(r["regions"]) > r["touched_bytes"]
    # and a freed chunk reused by a tensor of the same size writes no new page
    again = bfc_replay([("a", 50 * MiB), ("a", 0), ("b", 50 * MiB)])
    assert again["touched_bytes"] == 50 * MiB


def test_one_fixed_region_refuses_what_does_not_fit():
    assert bfc_replay([("a", 50 * MiB), ("b", 30 * MiB)], region_bytes=100 * MiB)["fits"]
    assert not bfc_replay([("a", 50 * MiB), ("b", 60 * MiB)], region_bytes=100 * MiB)["fits"]
    # a request of over half the free chunk takes all of it (BFC does not split off less than
    # the request), so 60 + 30 in 100 MiB does not fit either
    assert not bfc_replay([("a", 60 * MiB), ("b", 30 * MiB)], region_bytes=100 * MiB)["fits"]


def test_the_prediction_takes_the_runtime_from_the_calibration_probe_and_stops_at_the_cap():
    # given a runtime of 700 MiB and a batch-size-1 probe that measured it plus the replay
    runtime = 700 * MiB
    peak1 = predicted_peak_bytes(1, runtime, 64, train_images=48)
    cap = 1024 * MiB
    pred = predict_max_batch_size(cap, 1, peak1, 64, "adam", train_images=48)
    # then the runtime is recovered, the answer fits under the cap, and one more would not
    assert pred["baseline_bytes"] == pytest.approx(runtime)
    best = pred["max_batch_size"]
    assert predicted_peak_bytes(best, runtime, 64, train_images=48) <= cap
    assert predicted_peak_bytes(best + 1, runtime, 64, train_images=48) > cap
    assert pred["method"] == "bfc"
    assert predict_max_batch_size(peak1 - 1, 1, peak1, 64, "adam", train_images=48)["max_batch_size"] == 0
    # and on a GPU (one region of the device less the runtime) a larger cap allows more
    gpu = predict_max_batch_size(2 * cap, 1, runtime + 50 * MiB, 64, "adam", train_images=48, device="gpu")
    assert gpu["max_batch_size"] > best


def test_kernels_bytes_per_image_past_the_calibration_join_the_replay_and_lower_the_answer():
    # given the replay's prediction at 64 px under 1.5 GiB, and the same with 0.5 MiB an image more
    runtime, cap = 700 * MiB, 1536 * MiB
    peak1 = predicted_peak_bytes(1, runtime, 64, train_images=48)
    alone = predict_max_batch_size(cap, 1, peak1, 64, "adam", train_images=48)
    more = predict_max_batch_size(cap, 1, peak1, 64, "adam", train_images=48, kernel_bytes_per_image=0.5 * MiB)
    # then the runtime is the same (batch size 1 has no image past the calibration's), the answer
    # lower, and it is the largest size whose replayed peak plus those bytes fits
    assert more["baseline_bytes"] == alone["baseline_bytes"] and more["kernel_bytes_per_image"] == 0.5 * MiB
    best = more["max_batch_size"]
    assert best < alone["max_batch_size"]
    peak = lambda b: predicted_peak_bytes(b, runtime, 64, train_images=48, kernel_bytes_per_image=0.5 * MiB)  # noqa: E731
    assert peak(best) <= cap < peak(best + 1)
    assert peak(best) - predicted_peak_bytes(best, runtime, 64, train_images=48) == (best - 1) * 0.5 * MiB


# Recorded on the development machine (0.29.0, docs/results.md "TensorFlow's memory prediction by
# oneDNN's instruction set"), 64 px, Adam, 1,200 training images, 2 GiB: the batch-size-1 probe's
# peak, a fresh probe's at 512, and the limit the search measured, under two of oneDNN's ISAs.
RECORDED_ISAS = {"SSE41": (945.8, 1793.8, 675), "AVX2": (947.2, 1807.8, 638)}


@pytest.mark.parametrize("isa", sorted(RECORDED_ISAS))
def test_the_replay_checked_on_recorded_peaks_of_two_instruction_sets_stands_within_their_spread(isa):
    from types import SimpleNamespace

    from catsdogs.measure.memory_prediction import check_replay
    from catsdogs.measure.settings import FindSettings
    from catsdogs.messages import ProbeRecord

    calib_mb, check_mb, measured = RECORDED_ISAS[isa]
    cap = 2048 * MiB
    # given the replay's prediction from that ISA's calibration, and its probe of 512 as the check
    calib = ProbeRecord(batch_size=1, status="done", peak_memory_mb=calib_mb, memory_kind="cpu-rss")
    pred = {**predict_max_batch_size(cap, 1, calib_mb * MiB, 64, "adam", train_images=1200, steps=4),
            "train_images": 1200, "device": "cpu", "steps": 4}
    asked: list[int] = []
    run = SimpleNamespace(settings=FindSettings("fbs", memory_cap_bytes=cap),
                          probe=lambda b, phase, aside: asked.append(b) or ProbeRecord(
                              batch_size=b, status="done", peak_memory_mb=check_mb, memory_kind="cpu-rss"))
    checked = check_replay(run, pred, calib, 64, log=lambda line: None, bound=1200)
    # then the check probed 512, found it within the run-to-run spread of the replay (51 and 64 MiB
    # above it, a tenth of the room being 110), and the replay stands: within 15% of either limit
    assert asked == [512]
    c = checked["check"]
    assert 0 < c["apart_mb"] < c["threshold_mb"] and c["threshold_mb"] == pytest.approx(0.1 * (2048 - calib_mb))
    assert checked["max_batch_size"] == pred["max_batch_size"] and checked["kernel_bytes_per_image"] == 0.0
    assert abs(checked["max_batch_size"] - measured) <= 0.15 * measured


def test_jax_reads_xlas_memory_fraction_as_jaxlib_does(monkeypatch):
    from catsdogs.runtime.backends import jax as jax_backend

    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert jax_backend.memory_fraction() == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    assert jax_backend.memory_fraction() == 0.5
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.9")
    assert jax_backend.memory_fraction() == 0.9


def test_a_check_that_failed_leaves_the_replay_and_says_it_was_not_checked():
    from types import SimpleNamespace

    from catsdogs.measure.find_summary import _prediction_lines
    from catsdogs.measure.memory_prediction import check_replay
    from catsdogs.measure.settings import FindSettings
    from catsdogs.messages import ProbeRecord

    # given the replay's prediction, and a check probe that failed for another reason than memory
    cap = 2048 * MiB
    calib = ProbeRecord(batch_size=1, status="done", peak_memory_mb=946.0, memory_kind="cpu-rss")
    pred = {**predict_max_batch_size(cap, 1, 946.0 * MiB, 64, "adam", steps=4), "train_images": 1200,
            "device": "cpu", "steps": 4, "calibration_batch_size": 1}
    run = SimpleNamespace(settings=FindSettings("fbs", memory_cap_bytes=cap),
                          probe=lambda b, phase, aside: ProbeRecord(batch_size=b, status="failed", error="crash"))
    said: list[str] = []
    checked = check_replay(run, pred, calib, 64, log=said.append, bound=1200)
    # then the prediction is the replay's, the check's record says what happened, and so do the lines
    assert checked["max_batch_size"] == pred["max_batch_size"] and "kernel_bytes_per_image" in checked
    assert checked["check"] == {"batch_size": 512, "status": "failed"}
    assert said == ["The replay was not checked: the probe of 512 failed."]
    assert _prediction_lines(checked, None, "adam")[-1] == \
        "Its check at batch size 512 did not run to the end (failed): the replay stands."


def test_a_check_that_peaked_below_the_calibration_corrects_nothing():
    from types import SimpleNamespace

    from catsdogs.measure.memory_prediction import check_replay
    from catsdogs.measure.settings import FindSettings
    from catsdogs.messages import ProbeRecord

    # given a check probe at 512 that peaked below batch size 1's (no measurement of a step's
    # kernels: counted, it would take more than the replay's whole slope an image off)
    cap = 2048 * MiB
    calib = ProbeRecord(batch_size=1, status="done", peak_memory_mb=946.0, memory_kind="cpu-rss")
    pred = {**predict_max_batch_size(cap, 1, 946.0 * MiB, 64, "adam", steps=4), "train_images": 1200,
            "device": "cpu", "steps": 4}
    run = SimpleNamespace(settings=FindSettings("fbs", memory_cap_bytes=cap),
                          probe=lambda b, phase, aside: ProbeRecord(batch_size=b, status="done", peak_memory_mb=900.0,
                                                                    memory_kind="cpu-rss"))
    said: list[str] = []
    checked = check_replay(run, pred, calib, 64, log=said.append, bound=1200)
    # then the replay stands, and the line says why
    assert checked["max_batch_size"] == pred["max_batch_size"] and checked["kernel_bytes_per_image"] == 0.0
    assert said == ["The replay was not checked: the probe of 512 peaked no higher than batch size 1."]
