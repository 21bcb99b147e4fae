"""The race's oracle (catsdogs.measure.race) on simulated devices: which sizes race, successive
halving on the same seeds with capped, censored trials, a winner at its rates' edge, and how often
the answer is within 1.25 times the best's time. Pure: nothing trains here."""

from __future__ import annotations

import collections
import math

import pytest
from fakes import RaceDevice

from catsdogs.measure.race import Arm, Outcome, Race, race_rates, race_sizes, slower_throughout

# docs/gpu.md, the H200's critical check (0.25.0): seconds a step by batch size
H200_STEPS = {4: 0.0037, 8: 0.0074, 16: 0.0099, 32: 0.0145, 64: 0.0133, 128: 0.0117}
# the per-seed spread of steps to the target, log sd by batch size (the critical plan's: 0.38-1.12)
LOG_SD = {4: 1.12, 8: 0.9, 16: 0.7, 32: 0.55, 64: 0.45, 128: 0.38, 256: 0.38, 512: 0.38}
CPU_STEPS = {b: 0.004 * b ** 0.85 for b in (4, 8, 16, 32, 64, 128, 256, 512)}  # a CPU: step time grows with B


def run_race(device: RaceDevice, sizes: list[int], seeds=None, race_class: type[Race] = Race) -> Race:
    """Every rung, then a rate's edge, as race_run does, each trial on `device` (its outcomes: every
    trial run, once). `race_class`: the oracle (benchmarks/bench_race_oracle.py races a variant)."""
    rates = {b: race_rates(device.rule_rate(b)) for b in sizes}
    race = race_class([Arm(b, lr) for b in sizes for lr in rates[b]], **({"seeds": seeds} if seeds else {}))
    while True:
        while not race.finished:
            for trial in race.next_trials():
                seconds, censored = device.run(trial.arm.batch_size, trial.arm.lr, trial.seed, race.cap_for(trial.seed))
                race.record(Outcome(trial.arm, trial.seed, seconds, censored))
            race.advance()
        if race.extend_edge(rates) is None:
            return race


def test_the_sizes_that_race_are_the_undominated_on_a_factor_2_grid_with_the_throughputs_peak():
    # given the H200's step times, flat in the batch size (128's step faster than 32's)
    sizes = race_sizes(H200_STEPS, spread=0.2)
    # then 32 is dropped (128 is clearly no slower a step, and takes no more steps), the rest kept,
    # and the throughput's peak (128) is among them
    assert sizes == [4, 8, 16, 64, 128]
    # and on a CPU, whose step time grows with the batch, none is dominated: a factor-2 grid of at
    # most 8, whatever the number measured
    many = {b: 0.001 * b ** 0.9 for b in range(4, 1025, 4)}
    thinned = race_sizes(many, spread=0.2)
    assert len(thinned) <= 9 and all(b >= 2 * a for a, b in zip(thinned, thinned[1:], strict=False) if b != max(many))
    assert max(many) in thinned  # the throughput's peak
    # and a size clearly slower per image than a smaller one (5 at twice 4's step) is dropped
    assert race_sizes({4: 0.01, 5: 0.02, 8: 0.015}, spread=0.2) == [4, 8]


def test_a_size_predicted_more_than_the_cap_slower_wherever_b_noise_lies_does_not_race():
    # given the H200 race's probes at 64 px (images/s) and its noise scale's interval, 5 to 787
    ips = {1: 730.5, 8: 6250.9, 16: 11443.8, 32: 22824.2, 56: 36035.1, 64: 41368.2, 128: 71290.0, 256: 117600.3,
           512: 166929.9, 1200: 221421.9}
    steps = {b: b / v for b, v in ips.items()}
    # then batch size 1 is left out: even at B_noise 5, the case most favourable to it, its
    # predicted time is 4.5 times 16's, beyond the race's cap (3, times the steps' spread)
    assert slower_throughout(1, 16, steps, (5.0, 787.0), 3.0) and not slower_throughout(1, 16, steps, (0.0, 787.0), 3.0)
    assert 1 not in race_sizes(steps, spread=0.2, interval=(5.0, 787.0))
    assert 1 in race_sizes(steps, spread=0.2)  # (without the interval, as before)
    # and leaving it out brings back no size the factor-2 grid had thinned out (8, 32 and 512 here,
    # which would make 8 sizes of 5): fewer arms, never more
    assert race_sizes(steps, spread=0.2) == [1, 16, 64, 256, 1200]
    assert race_sizes(steps, spread=0.2, interval=(5.0, 787.0)) == [16, 64, 256, 1200]
    # and where B_noise may be 0 (the interval 0.00001 to unbounded of the H200's find) nothing is
    # left out for it: at B_noise 0 every size takes the same steps, and 1's are no dearer than 16's
    assert race_sizes(steps, spread=0.2, interval=(1e-5, None)) == race_sizes(steps, spread=0.2)
    # and open above, the far end is the time per image: 1200 is never hopeless against 16
    assert not slower_throughout(1200, 16, steps, (5.0, None), 3.0)


def test_each_rung_keeps_the_best_third_on_the_same_seeds_and_caps_at_three_times_the_seeds_best():
    # given nine arms whose times are known on every seed, the arm of size b always b seconds, raced
    # on rungs of 1, 3 and 9 seeds keeping a third
    arms = [Arm(b, 0.01) for b in (1, 2, 3, 4, 5, 6, 7, 8, 9)]
    race = Race(arms, seeds=list(range(9)), rungs=(1, 3, 9), keep=1 / 3)
    seen = []
    while not race.finished:
        trials = race.next_trials()
        seen.append(trials)
        for t in trials:
            cap = race.cap_for(t.seed)
            seconds = float(t.arm.batch_size)
            race.record(Outcome(t.arm, t.seed, min(seconds, cap) if cap else seconds, bool(cap and seconds > cap)))
        race.advance()
    # then the first rung runs every arm on seed 0, the next the best third (3) on seeds 0-2, the
    # last the best of those (1) on seeds 0-8, every arm on the same seeds as the others
    assert [len(t) for t in seen] == [9, 3 * 2, 1 * 6]
    assert {t.seed for t in seen[1]} == {1, 2} and {t.arm.batch_size for t in seen[1]} == {1, 2, 3}
    assert race.leader() == Arm(1, 0.01)
    # and a trial is capped at 3 times the best finished time on its seed: those of 4 and above
    # stopped at 3 s, censored
    censored = {a.batch_size for (a, s), o in race.outcomes.items() if o.censored}
    assert censored == {4, 5, 6, 7, 8, 9}
    assert all(o.seconds == 3.0 for o in race.outcomes.values() if o.censored)


def test_an_arm_that_reached_the_target_on_no_seed_of_a_rung_is_left_behind_though_the_better_half_has_room():
    # given four arms of which only the first reaches the target in time on both seeds of the first
    # rung (the others, 5 s, are capped at 3 times its 1 s and censored), halving keeping two
    arms = [Arm(b, 0.01) for b in (1, 2, 3, 4)]
    race = Race(arms, seeds=list(range(6)), rungs=(2, 6), keep=1 / 2)
    for t in race.next_trials():
        cap = race.cap_for(t.seed)
        seconds = 1.0 if t.arm.batch_size == 1 else 5.0
        race.record(Outcome(t.arm, t.seed, min(seconds, cap) if cap else seconds, bool(cap and seconds > cap)))
    left = race.advance()
    # then the three censored arms are all left behind: none takes the second place halving had
    assert race.alive == [Arm(1, 0.01)] and sorted(left) == [Arm(2, 0.01), Arm(3, 0.01), Arm(4, 0.01)]
    assert {t.arm for t in race.next_trials()} == {Arm(1, 0.01)}


@pytest.mark.parametrize("seeds, left_behind", [(6, True), (2, False)], ids=["six-seeds", "two-seeds"])
def test_from_six_seeds_an_arm_clearly_slower_than_the_leader_is_left_behind(seeds, left_behind):
    # given a leader, an arm 5% slower and one twice as slow on every seed (a few percent of spread),
    # halving keeping them all
    times = {8: 1.0, 16: 1.05, 32: 2.0}
    race = Race([Arm(b, 0.01) for b in times], seeds=list(range(18)), rungs=(seeds, 18), keep=1.0)
    for t in race.next_trials():
        race.record(Outcome(t.arm, t.seed, times[t.arm.batch_size] * (1 + 0.03 * (t.seed % 3))))
    race.advance()
    # then over six seeds the slow arm's interval lies wholly above 1.25 times the leader's: it is
    # left behind; over two it is not told apart yet and races on, as is the close arm either way
    assert (Arm(32, 0.01) not in race.alive) is left_behind
    assert Arm(16, 0.01) in race.alive and Arm(8, 0.01) in race.alive


def test_a_winner_at_its_rates_edge_races_one_more_rate_that_way():
    # given a device whose size 16 is best at 4 times its rule's rate, beyond the set (half, once, twice)
    device = RaceDevice(H200_STEPS, b_noise=8.0, log_sd={b: 0.05 for b in H200_STEPS}, best_factor={16: 4.0})
    device.step_seconds = {**H200_STEPS, 16: 0.004}  # and 16 far the fastest
    race = run_race(device, [8, 16, 64])
    decided = race.decision()
    # then the winner at twice the rule's rate is raced at four times, on the same seeds, and wins
    assert decided["batch_size"] == 16 and decided["lr"] == pytest.approx(4 * device.rule_rate(16))
    assert Arm(16, 8 * device.rule_rate(16)) in race.arms  # ... and one more step, which lost


def test_an_edges_rate_climbs_the_rungs_alone_and_is_left_behind_where_beaten():
    # given the same device: 16 best at 4 times its rule's rate, 8 times it a factor 1.4 slower
    device = RaceDevice(H200_STEPS, b_noise=8.0, log_sd={b: 0.05 for b in H200_STEPS}, best_factor={16: 4.0})
    device.step_seconds = {**H200_STEPS, 16: 0.004}
    # when raced
    race = run_race(device, [8, 16, 64])
    ran = collections.Counter(arm for arm, _ in race.outcomes)
    # then the winning step ran every seed, and the losing one only the rungs' seeds up to where
    # its interval lay wholly above 1.25 times the leader's (6 seeds), not the last rung's 18
    assert ran[Arm(16, 4 * device.rule_rate(16))] == 18
    assert ran[Arm(16, 8 * device.rule_rate(16))] == 6
    assert race.dropped[Arm(16, 8 * device.rule_rate(16))] == 1 and race.stepping is None and race.finished
    # and the finalists of the last rung were never cut by the steps' rungs
    assert {a for a, n in ran.items() if n == 18} <= set(race.alive)


def test_the_decision_gives_the_leaders_time_with_an_interval_and_the_arms_it_cannot_tell_from_it():
    # given two arms 5% apart and one twice as slow, on 9 seeds with a spread of 20%
    device = RaceDevice({8: 1.0, 16: 1.05, 32: 2.0}, b_noise=0.0, log_sd={8: 0.2, 16: 0.2, 32: 0.2}, seed=1)
    race = Race([Arm(b, device.rule_rate(b)) for b in (8, 16, 32)], keep=1.0)
    while not race.finished:
        for t in race.next_trials():
            race.record(Outcome(t.arm, t.seed, *device.run(t.arm.batch_size, t.arm.lr, t.seed, None)))
        race.advance()
    decided = race.decision()
    # then the leader's time has an interval around it, the close arm is tied with it, the slow
    # one is not, and the criterion (the median's) is said beside the mean's leader
    assert decided["seconds_low"] < decided["seconds"] < decided["seconds_high"]
    assert [t["batch_size"] for t in decided["tied"]] == [{8: 16, 16: 8}[decided["batch_size"]]]
    slow = next(r for r in decided["arms"] if r["batch_size"] == 32)
    assert slow["ratio_low"] > 1.25 and decided["criterion"] == "median" and decided["mean_leader"]


def test_bad_times_are_refused_and_a_rung_with_trials_missing_does_not_end():
    race = Race([Arm(8, 0.01), Arm(16, 0.01)], rungs=(1,), seeds=[0])
    with pytest.raises(ValueError, match="positive number of seconds"):
        race.record(Outcome(Arm(8, 0.01), 0, math.nan))
    race.record(Outcome(Arm(8, 0.01), 0, 1.0))
    with pytest.raises(ValueError, match="have not run"):
        race.advance()
    race.record(Outcome(Arm(16, 0.01), 0, 2.0))
    race.advance()
    with pytest.raises(ValueError, match="the race is over"):
        race.advance()
    with pytest.raises(ValueError, match="at least one arm"):
        Race([])


def test_an_arm_censored_or_short_of_the_leaders_seeds_is_never_tied_with_it():
    # given a race whose arm 16 was capped on a seed (censored) and whose arm 32 ran one seed only
    race = Race([Arm(8, 0.01), Arm(16, 0.01), Arm(32, 0.01)], rungs=(1, 3), seeds=[0, 1, 2])
    for arm, seed, seconds, censored in ((Arm(8, 0.01), 0, 1.0, False), (Arm(16, 0.01), 0, 1.1, False),
                                         (Arm(32, 0.01), 0, 1.05, False)):
        race.record(Outcome(arm, seed, seconds, censored))
    race.advance()  # keeps the better half: 8 and 32
    race.alive = [Arm(8, 0.01), Arm(16, 0.01)]  # (16 kept instead, to race it censored)
    for seed in (1, 2):
        race.record(Outcome(Arm(8, 0.01), seed, 1.0))
        race.record(Outcome(Arm(16, 0.01), seed, 3.0 if seed == 1 else 1.1, seed == 1))
    race.advance()
    decided = race.decision()
    # then neither is said to tie the leader: one was censored, the other never met its seeds
    assert decided["batch_size"] == 8 and decided["tied"] == []
    # and an arm just added (a rate's edge) with no run yet breaks no decision
    race.arms.append(Arm(8, 0.02))
    race.alive.append(Arm(8, 0.02))
    assert race.decision()["batch_size"] == 8


@pytest.mark.parametrize("steps, b_noise", [(H200_STEPS, 8.0), (H200_STEPS, 64.0), (CPU_STEPS, 32.0)],
                         ids=["h200-small-noise", "h200-large-noise", "cpu"])
def test_with_the_measured_spreads_the_race_is_within_1_25_times_the_best_in_90_percent_of_races(steps, b_noise):
    # given a simulated device with a known best arm, seeds spread as the critical plan's were (log
    # sd 0.38-1.12 by size), 70% of a seed's luck shared by its arms (one seed: the same initial
    # weights and data; an assumption, which the critical plan's store can measure), arms 1.1 to
    # 1.4 times apart where B_noise is small
    hits, runs = 0, 200
    for n in range(runs):
        device = RaceDevice(steps, b_noise=b_noise, log_sd=LOG_SD, seed=n, shared=0.7)
        sizes = race_sizes(steps, spread=0.2)
        race = run_race(device, sizes)
        lead = race.leader()
        best = min(device.median_seconds(b, lr) for b in sizes for lr in race_rates(device.rule_rate(b)) +
                   [device.rule_rate(b) * f for f in (0.25, 4.0)])
        hits += device.median_seconds(lead.batch_size, lead.lr) <= 1.25 * best
    # then the answer's true time is within 1.25 times the best's in at least 90% of the races
    assert hits / runs >= 0.90, hits / runs
