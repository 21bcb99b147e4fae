"""Which batch size reaches a target soonest (catsdogs.goodput): the predicted time to a
target from the probes' step times and the noise scale, the least worst case over its interval
(open ones included), ties and the middle of them, the fallback when not even a lower end was
measured, and a margin's size that must pass itself
(catsdogs.measure.search.confirm). Pure functions with made-up probes: nothing trains here."""

from __future__ import annotations

import math
import random

import pytest

from catsdogs import goodput
from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.measure.probe_run import ProbeRun
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
# docs/results.md's TensorFlow run at 64 px under 2 GiB (0.14.0, seed 0): images/s by batch size
TF_RUN = {b: b / v for b, v in {1: 116.5, 8: 735.4, 16: 1123.0, 32: 1578.7, 64: 1933.8, 128: 2203.3,
                                256: 2375.0, 512: 2415.4, 640: 2385.2}.items()}


def test_the_optimum_is_where_the_steps_saved_stop_paying_for_the_step_time():
    # given the saturating device and B_noise 64 known exactly: T(B) = (1 + 64/B) t(B), least at B = 64
    chosen = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(64.0, 64.0, 64.0))
    times = {r["batch_size"]: r["relative_time"] for r in chosen["table"]}
    assert chosen["batch_size"] == 64 and times[64] == 1.0 and chosen["worst_case"] == 1.0
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


def test_sizes_within_ten_percent_of_the_least_worst_case_are_a_tie_and_the_middle_one_wins():
    # given B_noise 2 on the saturating device: 32 takes 3% longer than 64 (2/32 against 2/64 of a step)
    small = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(2.0, 2.0, 2.0))
    worst = {r["batch_size"]: r["worst_case"] for r in small["table"]}
    assert worst[64] == 1.0 and worst[32] == pytest.approx((1 + 2 / 32) / (1 + 2 / 64))
    # then 16, 32 and 64 cannot be told apart (all within 10%), and the middle one is chosen: noise
    # moves the set at its edges
    assert small["near_best"] == [16, 32, 64] and small["batch_size"] == 32
    assert goodput.decide({8: 1.0, 16: 1.0, 32: 1.0, 64: 1.0}, (0.0, 0.0))["batch_size"] == 16  # the lower middle
    assert worst[8] > 1.1 and worst[128] > 1.1  # 8 takes 21% more steps, 128's step 41% longer: no tie


def test_a_noisy_probe_widens_the_tie_to_its_step_times_spread():
    # given a probe of 128 whose timed steps scatter widely: half their interquartile range 30% of the median
    probes = probes_of(SATURATING)
    for p in probes:
        median = p.batch_size / p.images_per_second
        scatter = 0.6 if p.batch_size == 128 else 0.0
        p.step_times_s = [median * (1 + scatter * k) for k in (-1, -0.5, 0, 0.5, 1)]
    chosen = goodput.choose(probes, safe=256, estimate=noise(1000.0, 1000.0, 1000.0))
    spread = {r["batch_size"]: r["step_spread"] for r in chosen["table"]}
    assert spread[128] == pytest.approx(0.3) and spread[256] == 0.0
    # then 128, 27% slower to a target than 256 at B_noise 1,000, lies within 10% plus that spread of
    # the least: a tie, the smaller chosen, where with quiet steps it is not
    worst = {r["batch_size"]: r["worst_case"] for r in chosen["table"]}
    assert 1.1 < worst[128] <= 1.4 and 128 in chosen["near_best"] and chosen["batch_size"] == 128
    quiet = goodput.choose(probes_of(SATURATING), safe=256, estimate=noise(1000.0, 1000.0, 1000.0))
    assert 128 not in quiet["near_best"] and quiet["batch_size"] == 256


def test_a_size_timed_again_widens_the_tie_by_its_runs_spread_not_its_steps_alone():
    # given 128 timed three times (as find-batch-size's retime does on a CPU) at throughputs 20%
    # either side of their median, each run's own steps quiet (4% apart)
    probes = probes_of(SATURATING)
    t128 = SATURATING[128]
    for ips in (0.8 * 128 / t128, 1.2 * 128 / t128):
        probes.append(ProbeRecord(batch_size=128, status="done", images_per_second=ips, phase="retime"))
    for p in probes:
        median = p.batch_size / p.images_per_second
        p.step_times_s = [median * (1 + 0.04 * k) for k in (-1, -0.5, 0, 0.5, 1)]
    chosen = goodput.choose(probes, safe=256, estimate=noise(1000.0, 1000.0, 1000.0))
    # when chosen: then 128's spread is its runs' (0.2), not its steps' (0.02), and 128, 27% slower
    # to the target than 256, is tied with it; 256, timed once, keeps its steps' spread
    spread = {r["batch_size"]: r["step_spread"] for r in chosen["table"]}
    assert spread[128] == pytest.approx(0.2) and spread[256] == pytest.approx(0.02)
    assert 128 in chosen["near_best"]
    # and the same probes timed once each (the retimes left out) do not tie 128
    once = goodput.choose([p for p in probes if p.phase != "retime"], safe=256, estimate=noise(1000.0, 1000.0, 1000.0))
    assert 128 not in once["near_best"]


def test_the_worst_case_over_an_interval_is_exact_against_a_dense_scan():
    # given random step times and intervals, some open above
    rng = random.Random(0)
    for _ in range(60):
        sizes = sorted(rng.sample([1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512], rng.randint(2, 7)))
        steps = {b: 0.001 * b ** rng.uniform(0.1, 1.2) * rng.uniform(0.8, 1.2) for b in sizes}
        low = rng.uniform(0.5, 200)
        high = rng.choice([math.inf, low * rng.uniform(1, 50)])
        worst = goodput.worst_cases(steps, low, high)
        top = high if math.isfinite(high) else 1e9
        scan = [low * (top / low) ** (k / 3000) for k in range(3001)] + ([math.inf] if math.isinf(high) else [])
        dense = {b: max(goodput.regret(steps, x)[b] for x in scan) for b in sizes}
        # then the exact worst case is never below what a scan finds, and the scan comes close to it
        for b in sizes:
            assert worst[b] >= dense[b] - 1e-9 and worst[b] <= dense[b] * 1.003


def test_an_interval_open_above_is_priced_over_its_whole_range_not_read_as_infinity():
    # given docs/results.md's TensorFlow run (0.14.0, 64 px, 2 GiB): B_simple 50 (20 to unbounded),
    # throughputs as probed, 640 the margin's size
    estimate = noise(50.0, 20.0, None)
    chosen = goodput.choose(probes_of(TF_RUN), safe=640, estimate=estimate)
    worst = {r["batch_size"]: r["worst_case"] for r in chosen["table"]}
    # then 512, the fastest per image and 0.15.0's answer, is priced at its worst (B_noise 20): 6.9x
    assert chosen["fastest_per_image"] == 512 and worst[512] == pytest.approx(6.87, abs=0.01)
    assert goodput.regret(TF_RUN, 50.0)[512] == pytest.approx(4.48, abs=0.01)
    # and 64, whose worst case (1.36x) is the least, is recommended, the interval recorded open
    assert chosen["batch_size"] == 64 and worst[64] == pytest.approx(1.36, abs=0.01)
    assert chosen["statistics"] == "open above" and chosen["interval"] == [20.0, None]
    assert chosen["fastest_worst_case"] == worst[512] and chosen["binding"] == "statistics"
    # and a lower bound alone ("above 20") is the same interval
    bound = goodput.choose(probes_of(TF_RUN), safe=640, estimate=noise(None, 20.0, None))
    assert bound["batch_size"] == 64 and bound["b_noise"] is None


@pytest.mark.parametrize("estimate", [None, noise(None, None, None)], ids=["not-measured", "undetermined"])
def test_statistics_without_even_a_lower_end_fall_back_to_speed_and_say_what_that_risks(estimate):
    chosen = goodput.choose(probes_of(PEAKED), safe=128, estimate=estimate)
    # then the choice is speed's (the fastest per image within memory) and no steps enter the table
    assert chosen["statistics"] == "unresolved" and chosen["b_noise"] is None and chosen["interval"] is None
    assert chosen["batch_size"] == 64 and chosen["binding"] == "speed"
    assert all(r["relative_steps"] == 1.0 for r in chosen["table"])
    # and what it risks: its time against the best should B_noise be as small as the base batch size
    assert chosen["risk"]["b_noise"] == 32 and chosen["risk"]["relative_time"] == pytest.approx(
        goodput.regret(PEAKED, 32.0)[64])


def test_step_time_noise_within_the_measured_spread_moves_the_answer_only_among_ties():
    # given the TF run's throughputs measured again and again, each size's median step off by up to
    # 4%, and each probe's timed steps scattered as much (half their interquartile range 4%)
    rng = random.Random(1)

    def measured(steps: dict[int, float]) -> list[ProbeRecord]:
        probes = probes_of(steps)
        for p in probes:
            median = p.batch_size / p.images_per_second
            p.step_times_s = [median * (1 + 0.08 * k) for k in (-1, -0.5, 0, 0.5, 1)]
        return probes
    for estimate in (noise(50.0, 20.0, None), noise(28.0, 17.0, 79.0)):
        quiet = goodput.choose(measured(TF_RUN), safe=640, estimate=estimate)
        answers = {goodput.choose(measured({b: t * rng.uniform(0.96, 1.04) for b, t in TF_RUN.items()}),
                                  safe=640, estimate=estimate)["batch_size"] for _ in range(30)}
        # then every answer is one of the sizes the noiseless run said it cannot tell apart
        assert answers <= set(quiet["near_best"]) and quiet["batch_size"] in answers


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


def test_a_size_timed_again_counts_by_its_median_and_a_failed_retime_says_nothing_of_its_memory():
    # given 16 probed in the search at an unlucky 500 images/s, then timed again at 900 and 1,000,
    # and 32 whose retime lost its worker
    probes = [ProbeRecord(batch_size=16, status="done", images_per_second=500.0, phase="search", step_times_s=[0.032] * 4),
              ProbeRecord(batch_size=32, status="done", images_per_second=1000.0, phase="search"),
              ProbeRecord(batch_size=16, status="done", images_per_second=900.0, phase="retime", step_times_s=[0.018] * 4),
              ProbeRecord(batch_size=32, status="failed", phase="retime"),
              ProbeRecord(batch_size=16, status="done", images_per_second=1000.0, phase="retime", step_times_s=[0.016] * 4)]
    passed = goodput.passed(probes)
    # then 16 is one record at the median of its three, its step times all of theirs, and 32 still passed
    assert passed[16].images_per_second == 900.0 and len(passed[16].step_times_s) == 12
    assert passed[32].images_per_second == 1000.0
    # and the sizes timed again are the 5 nearest the least worst case's size (the saturating device
    # at B_noise 64: 64), whatever their own probe said, if within 3 times the least (below, 8 is 3.3 times)
    assert goodput.contested(probes_of(SATURATING), 256, noise(64.0, 64.0, 64.0), timeable=ProbeRun.can_retime) == [16, 32, 64, 128, 256]
    assert goodput.contested(probes_of({8: 0.01, 16: 0.01, 32: 0.01}), 32, noise(100.0, 100.0, 100.0), timeable=ProbeRun.can_retime) == [16, 32]
    # but not a size whose peak came within a quarter of its cap: a timing worker keeps every size's step
    crowded = probes_of(SATURATING)
    for p in crowded:
        p.peak_memory_mb, p.memory_cap_mb = 100.0 + p.batch_size * 3, 1000.0  # 256: 868 of 1000 MiB
    assert goodput.contested(crowded, 256, noise(64.0, 64.0, 64.0), timeable=ProbeRun.can_retime) == [16, 32, 64, 128]


# JAX's run at 64 px (docs/results.md, seed 0): images/s by batch size, the search's doubling from 8
JAX_RUN = {b: b / v for b, v in {1: 155.0, 8: 234.0, 16: 258.0, 32: 269.0, 64: 266.0, 96: 317.0, 128: 325.0,
                                 256: 319.0, 312: 336.0}.items()}


def test_a_gap_wider_than_twice_beside_the_choice_is_filled_before_the_decision():
    # given JAX's probes, which doubled from 8 after the calibration's 1: nothing between 1 and 8
    probes = probes_of(JAX_RUN)
    # when B_noise is bounded below only (102, 13 to unbounded) or hardly at all (0 to unbounded)
    for estimate in (noise(102.0, 12.7, None), noise(43.0, 1e-4, None)):
        # then the sizes that halve the gap beside the choice are timed before it decides: 2 and 4
        assert goodput.between(probes, 312, estimate, timeable=ProbeRun.can_retime) == [2, 4]
    # and once 4 is measured (the critical plan's fastest to the target: 305 images/s) it is the answer
    filled = probes + [ProbeRecord(batch_size=4, status="done", images_per_second=305.0, phase="between"),
                       ProbeRecord(batch_size=2, status="done", images_per_second=240.0, phase="between")]
    assert goodput.choose(filled, 312, noise(102.0, 12.7, None))["batch_size"] == 4
    assert goodput.between(filled, 312, noise(102.0, 12.7, None), timeable=ProbeRun.can_retime) == []  # nothing left to fill


def test_the_gaps_filled_are_the_few_nearest_the_choice_within_its_contest_and_below_the_margin():
    # given a search started at 64 (--start 64): 1, then 64 to 512, a device flat in step time to 64
    probes = probes_of({b: 0.01 * max(1.0, b / 64) for b in (1, 64, 128, 256, 512)})
    # when B_noise is large (the larger sizes contest it), the gap 1..64's three sizes nearest 64 come first
    assert goodput.between(probes, 512, noise(400.0, 300.0, 500.0), timeable=ProbeRun.can_retime) == [8, 16, 32]
    # and a gap far from the choice, its two sides beyond 3 times the least worst case, is left alone
    # (the saturating device at B_noise 64: 8 is 3.3 times the least, 1 more)
    far = probes_of({1: 0.01, **SATURATING})
    assert goodput.between(far, 256, noise(64.0, 64.0, 64.0), timeable=ProbeRun.can_retime) == []
    # and a size above the margin's is never filled: the candidates stop there
    assert all(b <= 64 for b in goodput.between(probes, 64, noise(400.0, 300.0, 500.0), timeable=ProbeRun.can_retime))
    # and a gap is filled only below a size whose peak left a quarter of its cap free: the retime's
    # worker, where the gap's sizes are timed, keeps every size's step
    for p in probes:
        p.peak_memory_mb, p.memory_cap_mb = 100.0 + 3 * p.batch_size, 1000.0  # 64: 292 of 1000 MiB
    assert goodput.between(probes, 512, noise(400.0, 300.0, 500.0), timeable=ProbeRun.can_retime) == [8, 16, 32]
    probes[1].peak_memory_mb = 800.0  # 64 crowded: 800 of 1000 MiB
    assert goodput.between(probes, 512, noise(400.0, 300.0, 500.0), timeable=ProbeRun.can_retime) == []


def test_a_size_first_timed_between_that_failed_is_no_candidate_and_is_not_tried_again():
    # given 4 timed in the retime's worker, which lost it
    probes = probes_of(JAX_RUN) + [ProbeRecord(batch_size=4, status="failed", phase="between")]
    # then 4 is not a candidate (its worker held other sizes' steps: it says nothing of 4's memory)
    assert 4 not in goodput.passed(probes)
    # and the gap's fill does not ask for it again
    assert goodput.between(probes, 312, noise(102.0, 12.7, None), timeable=ProbeRun.can_retime) == [2]


# --- the near-best set's middle, on a log scale: probes added near the limit do not carry it ----
def test_probes_added_near_the_limit_do_not_move_the_choice_of_a_tied_set():
    # given sizes equally fast per image (all tied with speed's choice), 64 to 1,024
    sizes = [64, 128, 256, 512, 1024]
    before = goodput.decide({b: 0.001 * b for b in sizes}, None)["batch_size"]
    # when the search adds three probes near its limit
    after = goodput.decide({b: 0.001 * b for b in [*sizes, 1056, 1088, 1120]}, None)["batch_size"]
    # then the choice stays at the set's middle on a log scale (by count it moved from 256 to 512)
    assert before == after == 256


def test_the_log_middle_is_the_size_nearest_the_geometric_mean_the_smaller_of_two():
    assert goodput.log_middle([16, 24, 32, 512]) == 32 and goodput.log_middle([8, 32]) == 8
    assert goodput.log_middle([40]) == 40
