"""Which batch size reaches a target soonest (catsdogs.goodput): the predicted time to a
target from the probes' step times and the noise scale, its fallback when the statistics are not
resolved, the near-best set, the learning-rate rules, and a margin's size that must pass itself
(catsdogs.measure.search.confirm). Pure functions with made-up probes: nothing trains here."""

from __future__ import annotations

import math

import pytest

from catsdogs import goodput
from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.measure.search import confirm
from catsdogs.messages import ProbeRecord


def probes_of(step_seconds: dict[int, float], status: dict[int, str] | None = None) -> list[ProbeRecord]:
    return [ProbeRecord(batch_size=b, status=(status or {}).get(b, "done"), images_per_second=b / t)
            for b, t in step_seconds.items()]


def noise(value, low, high) -> NoiseEstimate:
    return NoiseEstimate(value, low, high, gradient_sq=1.0, trace=value or low, pairs=64, small=1, large=10)


# a device whose step time is flat up to batch 64 and then grows as the square root of the batch:
# it saturates there, yet every larger batch is still a little faster per image
SATURATING = {b: 0.01 * max(1.0, b / 64) ** 0.5 for b in (8, 16, 32, 64, 128, 256)}
# one whose throughput per image peaks at 64: beyond it a step takes more than proportionally longer
PEAKED = {b: 0.01 * max(1.0, b / 64) ** 1.5 for b in (8, 16, 32, 64, 128, 256)}


def test_the_optimum_is_where_the_steps_saved_stop_paying_for_the_step_time():
    # given the saturating device and B_noise 64: T(B) = (1 + 64/B) t(B), least at B = 64
    chosen = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(64.0, 40.0, 100.0))
    times = {r["batch_size"]: r["relative_time"] for r in chosen["table"]}
    assert chosen["batch_size"] == 64 and times[64] == 1.0
    assert times[8] == pytest.approx(9 / 2) and times[256] == pytest.approx(1.25 * 2 / 2)
    assert chosen["table"][0]["relative_steps"] == pytest.approx(9.0)
    # and it is statistics that keeps it below 128 and 256, which are faster per image
    assert chosen["binding"] == "statistics" and chosen["statistics"] == "resolved"


def test_with_flat_step_times_the_largest_that_fits_wins_and_memory_binds():
    flat = {b: 0.01 for b in (8, 16, 32, 64, 128)}
    chosen = goodput.choose(probes_of(flat), safe=128, estimate=noise(64.0, 40.0, 100.0))
    assert chosen["batch_size"] == 128 and chosen["binding"] == "memory"


def test_throughput_that_peaks_below_the_memory_limit_lets_speed_bind():
    # given a large B_noise (the steps fall almost as fast as the batch grows) and throughput per
    # image that peaks at 64
    chosen = goodput.choose(probes_of(PEAKED), safe=256, estimate=noise(1000.0, 800.0, 1200.0))
    assert chosen["batch_size"] == 64 and chosen["binding"] == "speed"
    # while a small B_noise, where a larger batch saves no steps, keeps the saturating device at 64 too
    small = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(2.0, 1.0, 3.0))
    assert small["batch_size"] == 64 and small["binding"] == "statistics"


@pytest.mark.parametrize("estimate", [None, noise(None, 30.0, None), noise(40.0, 10.0, None), noise(None, None, None)],
                         ids=["not-measured", "lower-bound", "open-above", "undetermined"])
def test_unresolved_statistics_fall_back_to_speed_within_memory_and_say_so(estimate):
    # given the noise scale missing, a lower bound, or an interval open above: it could be anything large
    chosen = goodput.choose(probes_of(PEAKED), safe=128, estimate=estimate)
    # then the choice is speed's (the fastest per image within memory), never a size below it from statistics
    assert chosen["statistics"] == "unresolved" and chosen["b_noise"] is None
    assert chosen["batch_size"] == 64 and chosen["binding"] == "speed"
    assert all(r["relative_steps"] == 1.0 for r in chosen["table"])


def test_the_near_best_set_widens_over_b_noises_interval():
    chosen = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(64.0, 16.0, 256.0))
    # at B_noise 64: 64 and 128 (1.06) are within 10%; at 16 only 64; at 256, 128 (1.06) and 256
    assert chosen["near_best"] == [64, 128]
    assert chosen["near_best_interval"] == [64, 128, 256]


def test_only_sizes_whose_last_probe_passed_and_within_the_margin_are_candidates():
    probes = probes_of(SATURATING)
    probes.append(ProbeRecord(batch_size=64, status="oom"))  # 64 probed again (a confirmation) and failed
    chosen = goodput.choose(probes, safe=128, estimate=noise(64.0, 40.0, 100.0))
    assert chosen["batch_size"] != 64 and 64 not in [r["batch_size"] for r in chosen["table"]]
    assert max(r["batch_size"] for r in chosen["table"]) == 128  # 256 is above the margin's size
    assert goodput.choose([ProbeRecord(batch_size=8, status="oom")], safe=8, estimate=None) is None


def test_step_time_between_probes_is_interpolated_on_log_log_axes_and_never_extrapolated():
    table = {8: 0.01, 32: 0.04}
    assert goodput.step_seconds_at(16, table) == pytest.approx(0.02)  # a power law between them: exact
    assert goodput.step_seconds_at(8, table) == 0.01
    assert goodput.step_seconds_at(4, table) is None and goodput.step_seconds_at(64, table) is None


def test_a_margins_size_that_fails_its_confirmation_moves_down_until_one_passes():
    # given peak memory that is not monotonic: 752 fitted in the search, 672 and 664 do not, 656 does
    answers = {672: "oom", 664: "oom", 656: "done"}
    asked: list[int] = []

    def probe(b: int) -> str:
        asked.append(b)
        return answers.get(b, "done")
    size, failed = confirm(probe, 672)
    assert (size, failed, asked) == (656, [672, 664], [672, 664, 656])
    # and it gives up after a few sizes rather than walk down to 1
    size, failed = confirm(lambda b: "oom", 64, most=3)
    assert size is None and failed == [64, 56, 48]
    assert math.isclose(confirm(lambda b: "done", 8)[0], 8)
