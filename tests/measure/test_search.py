"""The batch-size search and its recommendation (catsdogs.measure.search): pure functions, tested
with a fake device and made-up probes, in a process that never imports a framework."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest
from fakes import FakeDevice

from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.measure import search as search_module
from catsdogs.measure.search import (
    RESOLUTION_SHARE,
    RSS_RESOLUTION_SHARE,
    apply_margin,
    effective_resolution,
    last_doubling_size,
    search,
)


def test_the_search_runs_without_a_framework():
    # given a fresh interpreter that imports the search and runs one
    code = ("import sys; from catsdogs.measure.search import search; "
            "r = search(lambda b: 'done' if b <= 100 else 'oom', start=8, resolution=1); "
            "print(r.largest_fit, sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # then it found the limit, and no framework was loaded
    assert out.stdout.split() == ["100", "[]"]


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


# --- the search, with a fake probe ---------------------------------------------------------------


@pytest.mark.parametrize("start, max_batch, aim", [
    (8, None, 731), (8, 4096, 300), (8, 600, 731), (32, 4096, 124), (100, None, 110), (8, None, 10), (1, 64, 1000),
])
def test_the_last_size_the_doubling_probes_before_its_aim_is_the_one_the_search_probes(start, max_batch, aim):
    # given a device on which the sizes up to `aim` fit, searched with `aim` predicted
    asked: list[int] = []
    search(lambda b: asked.append(b) or ("done" if b <= aim else "oom"), start=start, max_batch=max_batch, guess=aim)
    # then the doubling's last size before the guess, where it probes the guess below the bound, is
    # what the replay's check probes (memory_prediction.check_replay), 0.4 to 0.8 of the guess
    aimed = aim in asked and (max_batch is None or aim < max_batch)
    doubling = asked[:asked.index(aim)] if aimed else []
    expected = doubling[-1] if doubling and doubling[-1] < 0.8 * aim else None
    assert last_doubling_size(start, max_batch, aim) == expected
    if expected is not None and expected > start:
        assert 0.4 * aim <= expected < 0.8 * aim


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


def test_a_guess_within_5_percent_brackets_the_limit_and_saves_the_probes_above_the_doubling():
    # given a device that fits up to 616 and a prediction of 640 (4% high)
    dev = FakeDevice(616)
    r = search(dev, start=8, guess=640)
    # then the doubling stops at 256 (512 would pass 80% of 640), the guess is probed, then the size
    # it is 5% above (610), and it bisects the 30 between them once: 625 does not fit, 15 is within 3% of 610
    assert dev.calls == [8, 16, 32, 64, 128, 256, 640, 610, 625]
    assert (r.largest_fit, r.first_failure) == (610, 625)
    # so 3 probes past the doubling, where doubling on to 1,024 and bisecting back takes 7
    unguided = FakeDevice(616)
    search(unguided, start=8)
    assert unguided.calls[6:] == [512, 1024, 768, 640, 576, 608, 624]


def test_a_guess_9_percent_low_gallops_past_it_instead_of_doubling():
    # given TensorFlow's limit at 64 px under 2 GiB (804) and its prediction (731, 9% low)
    dev = FakeDevice(804)
    r = search(dev, start=8, guess=731)
    # then the search gallops from the guess by 5%, then 10% of it, and bisects the bracket once
    assert dev.calls[7:] == [731, 768, 805, 786]
    assert (r.largest_fit, r.first_failure) == (786, 805)
    # so 2 probes past 768 (+5%), where doubling on from it probes 1,536 and bisects back: 6
    doubled = FakeDevice(804)
    search(doubled, start=768, resolution=24)
    assert doubled.calls[1:] == [1536, 1152, 960, 864, 816, 792]
    # and a guess far above the limit gallops down from it, then bisects above the doubling's last fit
    high = FakeDevice(616)
    r = search(high, start=8, guess=731)
    assert high.calls[7:11] == [731, 697, 657, 584]
    assert r.largest_fit <= 616 < r.first_failure <= 657


def test_a_limit_10_to_15_percent_above_the_guess_costs_the_probe_of_15_percent_not_20_and_a_bisection():
    # given TensorFlow's limit as it came out in another run (805 fitted, 841 did not) and its prediction, 731
    dev = FakeDevice(830)
    # when the search gallops above the guess on a resident set's resolution
    r = search(dev, start=8, guess=731, share=RSS_RESOLUTION_SHARE)
    # then it steps 5%, 10%, then 15% of the guess: the bracket (805, 841) is within 5%, no bisection
    assert dev.calls[7:] == [731, 768, 805, 841]
    assert (r.largest_fit, r.first_failure) == (805, 841)
    # and a limit past 20% still gallops on, doubling its steps from there
    far = FakeDevice(1000)
    search(far, start=8, guess=731, share=RSS_RESOLUTION_SHARE)
    assert far.calls[7:13] == [731, 768, 805, 841, 878, 1024]


@pytest.mark.parametrize("limit, guess", [(616, 731), (616, 500), (616, 300), (40, 900), (5000, 64), (100, 100)])
def test_any_guess_finds_the_same_limit_as_no_guess(limit, guess):
    # a prediction far off, low or high, costs probes, never the answer
    for resolution in (1, None):
        dev = FakeDevice(limit)
        r = search(dev, start=8, guess=guess, resolution=resolution)
        plain = search(FakeDevice(limit), start=8, resolution=resolution)
        assert r.largest_fit <= limit < r.first_failure
        assert r.first_failure - r.largest_fit <= effective_resolution(resolution, r.largest_fit)
        assert (resolution != 1) or (r.largest_fit, plain.largest_fit) == (limit, limit)
        assert len(dev.calls) == len(set(dev.calls))
    # and a --max below the guess is respected: the guess is capped at it
    capped = FakeDevice(limit)
    r = search(capped, start=8, guess=guess, max_batch=min(limit, 64))
    assert max(capped.calls) <= min(limit, 64) and r.largest_fit == min(limit, 64) and r.reached_max


def test_a_size_that_failed_below_the_guess_is_stepped_over_as_when_doubling():
    # given a device that fits up to 400 but fails (not memory) at 128, and a guess of 300
    dev = FakeDevice(400, failing={128})
    r = search(dev, start=8, guess=300)
    # then 300 and 315 fit above the failed 128: the search doubles on and bisects to the true limit
    assert r.largest_fit <= 400 < r.first_failure and r.first_failure - r.largest_fit <= 8
    # and with --max at 315, everything up to it fitted but 128: it reached --max
    capped = search(FakeDevice(400, failing={128}), start=8, guess=300, max_batch=315)
    assert (capped.largest_fit, capped.first_failure, capped.reached_max) == (315, None, True)
    # and a failure below a guess that does not fit is stepped over when the gallop down finds a
    # size above it that fits (360, above the failed 256)
    low = search(FakeDevice(400, failing={256}), start=8, guess=600)
    assert low.order[:11] == [8, 16, 32, 64, 128, 256, 600, 572, 540, 480, 360]
    assert low.largest_fit <= 400 < low.first_failure
    # while it bounds the bisection, as when doubling, when nothing down to the doubling's last fit did
    bounded = search(FakeDevice(100, failing={128}), start=8, guess=300)
    assert bounded.order[:10] == [8, 16, 32, 64, 128, 300, 286, 270, 240, 180]
    assert bounded.largest_fit <= 100 < bounded.first_failure <= 128


def test_on_a_resident_set_a_guess_up_to_5_percent_high_costs_one_probe_below_it_and_no_bisection():
    # given JAX's prediction on the CPU, 0-5% above the measured limit (997 against 947 at 64 px)
    rng = random.Random(1)
    for _ in range(300):
        guess = rng.randint(100, 20000)
        limit = rng.randint(math.ceil(guess / 1.05), guess - 1)
        dev = FakeDevice(limit)
        # when the search aims at it on a resident set's resolution
        r = search(dev, start=8, guess=guess, share=RSS_RESOLUTION_SHARE)
        # then after the guess exactly one size is probed, the one the guess is 5% above, and it is the answer
        after = dev.calls[dev.calls.index(guess) + 1:]
        assert after == [math.ceil(guess / 1.05)], (guess, limit, after)
        assert r.first_failure == guess and r.largest_fit <= limit
        assert r.first_failure - r.largest_fit <= effective_resolution(None, r.largest_fit, RSS_RESOLUTION_SHARE)


def test_on_a_resident_set_the_bisection_stops_at_5_percent_where_3_would_bisect_its_noise():
    # given a device whose limit is 786, and the search's bracket after the gallop: 768 fits, 805 does not
    # (37 images apart: 4.8% of 768, as TensorFlow's CPU left it at 64 px under 2 GiB)
    def ran(share: float):
        return search(FakeDevice(786), start=8, guess=731, share=share)
    # when the share is a resident set's, 5%, then the bracket is the answer: no probe of 786
    rss = ran(RSS_RESOLUTION_SHARE)
    assert (rss.largest_fit, rss.first_failure) == (768, 805) and 786 not in rss.order
    # and at the exact peaks' 3% (a GPU's allocator) it bisects on, one probe more
    exact = ran(RESOLUTION_SHARE)
    assert exact.order == rss.order + [786] and exact.largest_fit == 786
    assert effective_resolution(None, 768, RSS_RESOLUTION_SHARE) == 39 and effective_resolution(None, 768) == 24


def test_default_resolution_is_3_percent_at_least_8_and_at_most_an_eighth_of_the_answer():
    assert effective_resolution(None, 1000) == 30
    assert effective_resolution(None, 800) == 24
    assert effective_resolution(None, 200) == 8
    assert effective_resolution(None, 32) == 4
    assert effective_resolution(None, 4) == 1
    assert effective_resolution(16, 4) == 16
    for limit in (5, 7, 13, 37, 100, 1000, 4000):
        r = search(FakeDevice(limit), start=1)
        assert r.largest_fit <= limit < r.first_failure
        gap = max(1, min(max(8, math.ceil(0.03 * r.largest_fit)), r.largest_fit // 8))
        assert r.first_failure - r.largest_fit <= gap


def test_a_start_that_does_not_fit_is_halved():
    dev = FakeDevice(100)
    r = search(dev, start=512, resolution=1)
    assert dev.calls[:4] == [512, 256, 128, 64]
    assert r.largest_fit == 100


def test_nothing_fits():
    dev = FakeDevice(0)
    r = search(dev, start=8)
    assert r.largest_fit is None and dev.calls == [8, 4, 2, 1]


def test_max_is_probed_when_doubling_would_pass_it_or_come_within_a_quarter_of_it():
    dev = FakeDevice(1000)
    r = search(dev, start=8, max_batch=300)
    # 256 would be within a quarter below 300: the doubling goes straight to 300 from 128
    assert dev.calls == [8, 16, 32, 64, 128, 300]
    assert r.largest_fit == 300 and r.first_failure is None and r.reached_max
    dev = FakeDevice(1000)
    search(dev, start=8, max_batch=400)  # 256 is not within a quarter of 400: probed, then 400
    assert dev.calls == [8, 16, 32, 64, 128, 256, 400]
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


@pytest.mark.parametrize("value, expected", [(3.3, 2), (7.9, 4), (8.0, 8), (50.4, 48), (0.4, 1)])
def test_a_critical_batch_size_is_rounded_down_as_the_margins_size_is(value, expected):
    assert search_module.round_batch(value) == expected


def noise_scale(b_simple, low, high=None) -> NoiseEstimate:
    return NoiseEstimate(b_simple, low, high, gradient_sq=1.0, trace=b_simple or low, pairs=64, small=1, large=10)


def test_the_critical_batch_size_is_probed_only_below_the_memory_limit():
    assert search_module.critical_probe(noise_scale(50.4, 30.0, 90.0), safe=656) == 48
    assert search_module.critical_probe(noise_scale(900.0, 600.0, 1200.0), safe=656) is None  # memory binds first
    assert search_module.critical_probe(noise_scale(900.0, 600.0, 1200.0), safe=None) == 896  # not known yet: any
    # open above: the worst case over the interval still weighs sizes near the estimate, so it is probed
    assert search_module.critical_probe(noise_scale(50.4, 30.0), safe=656) == 48
    assert search_module.critical_probe(noise_scale(None, 30.0), safe=656) == 24  # a bound alone: at the bound
    assert search_module.critical_probe(noise_scale(None, None), safe=656) is None  # undetermined
    assert search_module.critical_probe(None, safe=656) is None


def test_a_ceiling_from_the_allocators_words_keeps_the_bisection_below_it_and_ends_it_within_the_gap():
    # given a device that fits up to 1,864, as its allocator's words say once a size has failed
    asked: list[int] = []

    def probe(b: int) -> str:
        asked.append(b)
        return "done" if b <= 1864 else "oom"

    def ceiling() -> int | None:
        return 1864 if any(b > 1864 for b in asked) else None

    # when it searches from 8 with and without the ceiling
    plain = search(probe, start=8, max_batch=4096)
    plain_order, asked = list(asked), []
    held = search(probe, start=8, max_batch=4096, ceiling=ceiling)
    # then with it no size above 1,864 is probed after 2,048 failed, the ceiling itself is, and the
    # search ends there, sooner than without (which probed 1,920 and 1,888 out of memory)
    after = held.order[held.order.index(2048) + 1:]
    assert max(after) == 1864 and held.largest_fit == 1864 and held.ceiling == 1864
    assert plain.ceiling is None and len(held.order) < len(plain_order)
    assert sum(held.statuses[b] == "oom" for b in held.order) == 1
    # and a ceiling that proves high (the device fits less) only bounds the probes: the bisection goes on
    asked = []
    low = search(lambda b: (asked.append(b), "done" if b <= 1800 else "oom")[1], start=8, max_batch=4096,
                 ceiling=ceiling)
    assert low.ceiling is None and 1800 - low.largest_fit <= effective_resolution(None, low.largest_fit)


def test_a_ceiling_below_a_size_that_fitted_is_ignored_and_the_probes_decide():
    # given allocator words that bound the pool at 1,850 when 1,855 has already fitted
    lo, hi, top = search_module.bisect(lambda b: "done" if b <= 1900 else "oom", 1855, 1948, lambda fit: 55,
                                       ceiling=lambda: 1850)
    # then the bisection goes on by its probes, to within its gap of 1,900, and says no ceiling ended it
    assert top is None and 1900 - lo <= 55 and lo <= 1900 < hi


def test_a_size_probed_before_the_search_bounds_the_gallop_from_where_the_doubling_ends():
    # given a device whose limit is 260, a prediction of 300 (its doubling ends at 128), and 256
    # probed before the search (the replay's check), which fitted
    asked: list[int] = []

    def probe(b: int) -> str:
        asked.append(b)
        return "done" if b <= 260 else "oom"

    res = search(probe, start=8, guess=300, known=(256,), resolution=1)
    # then the gallop down from 300 stops at 256, not at 128: no size between them is probed, and
    # the answer lies in between
    after = asked[asked.index(300):]
    assert all(b > 256 for b in after) and res.largest_fit == 260
    # and where the known size ran out of memory, no guess is probed: the search bisects up to it
    asked.clear()
    res = search(lambda b: asked.append(b) or ("done" if b <= 200 else "oom"), start=8, guess=300, known=(256,),
                 resolution=1)
    assert 300 not in asked and res.largest_fit == 200 and res.first_failure == 201
    assert all(128 < b < 256 for b in asked[asked.index(256) + 1:])
