"""The race's oracle: which batch sizes and rates race to a target, on which seeds, each capped
where, and what the race decides. Pure, as the memory search is (catsdogs.measure.search): it
decides what to try and reads what came back, apart from what runs the trials (tested on
simulated devices, tests/measure/test_race.py); nothing here imports a framework.

- **Sizes** (`race_sizes`): those that fit under the margin, less the dominated, beyond the step
  times' between-run spread: a size for which a larger one is no slower a step (it takes as many
  steps at most, each no dearer), or a smaller one is no slower per image (it needs no more images
  to the target, at no lower a throughput), or another one is predicted more than CAP times
  faster, beyond the same spread, wherever B_noise lies in its interval (`slower_throughout`). Then thinned to a factor-2 grid of at most MOST_SIZES,
  the throughput's peak kept.
- **Rates** (`race_rates`): each size's rate by the optimizer's rule and the factor-2 set around it
  (RATE_FACTORS); a winner at its set's edge steps that way, again while it wins (`Race.extend_edge`);
  the new rate climbs the rungs alone (2, 6, 18 seeds), left behind where it is beaten (a rate too
  high, short of the target on its first 2 seeds: 2 trials), where it raced on the last rung's 18
  seeds at once.
- **Seeds** (`Race`): every arm runs the same seeds; successive halving by rungs (SEEDS_PER_RUNG:
  n, then 3n, then 9n seeds), the better half of the arms (KEEP) kept from one rung to the next by
  the geometric mean of their times (simulated with the critical plan's spreads, n = 1 and a third
  kept missed 1.25 times the best in 13-40% of races where arms lie 1.1-1.4 times apart:
  tests/measure/test_race.py; 9 arms kept, then 3, as often within 1.25 at 0.72-0.90 times the
  trial-seconds, but a real Adam race whose rates sat 10 times below the best then left behind the
  arm whose edge led to them: docs/results.md, 0.39.0); a trial is capped at CAP times the best time on its seed so
  far, and a trial that hits its cap is right-censored there (its time is at least the cap).
  Whatever its rank, an arm is left behind at a rung where it is beaten (`Race.beaten`): it
  reached the target on none of the rung's seeds, or, from CLEAR_SEEDS seeds on, its interval
  against the leader lies wholly above TIE. Halving alone kept such arms wherever fewer arms than
  the better half had reached the target (0.31.0 on this CPU: batch 1,200 at three rates through
  the first rung, censored on every seed, 16-18 trials more each race); simulated, the answer is
  as often within 1.25 times the best (benchmarks/bench_race_oracle.py), at up to 16% fewer
  trial-seconds.
- **The decision** (`Race.decision`): the leader is the arm of least geometric-mean time (the
  median of a time spread log-normally, not its mean: both are said); every other arm's time
  against the leader's as paired log-differences over their common seeds, with the 95% interval
  fixed in advance (LEVEL); the arms it cannot tell from the leader are those whose interval
  reaches below TIE times the leader's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

MOST_SIZES = 8  # the race's sizes, at most: a factor-2 grid, plus the throughput's peak
RATE_FACTORS = (0.5, 1.0, 2.0)  # each size's rates: the rule's, half and twice it
SEEDS_PER_RUNG = (2, 6, 18)  # seeds an arm has run by the end of each rung (n, 3n, 9n with n = 2)
KEEP = 1 / 2  # the share of arms a rung keeps, the best by the geometric mean of their times
CAP = 3.0  # a trial stops at this many times the best time on its seed so far, censored there
TIE = 1.25  # an arm within this factor of the leader's time is not told from it
LEVEL = 0.95  # the decision's interval, fixed before the race
CLEAR_SEEDS = 6  # from this many seeds on, an arm whose interval lies wholly above TIE is left behind at a rung
EDGE_STEPS = 3  # a winner at its rates' edge steps that way again while it wins, this many times at most
T_QUANTILES = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
               10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # Student's t, 97.5%, by degrees of freedom


@dataclass(frozen=True, order=True)
class Arm:
    """One contender: a batch size at a learning rate."""

    batch_size: int
    lr: float

    def __str__(self) -> str:
        return f"{self.batch_size} at {self.lr:.3g}"


@dataclass(frozen=True)
class Trial:
    """An arm's run on one seed. Its cap is asked when it starts (`Race.cap_for(seed)`): the seed's
    best time so far, which the trials run before it on that seed set."""

    arm: Arm
    seed: int


@dataclass(frozen=True)
class Outcome:
    """What a trial came to: its steady time to the target (steps x the steady step time), or, when
    `censored`, the time at which it stopped short of it (its time is at least that)."""

    arm: Arm
    seed: int
    seconds: float
    censored: bool = False


def race_sizes(step_seconds: dict[int, float], spread: float = 0.2, most: int = MOST_SIZES,
               interval: tuple[float, float | None] | None = None) -> list[int]:
    """The batch sizes that race, of those measured (`step_seconds`: each size that fits under the
    margin, its steady seconds a step): the dominated dropped, beyond the between-run `spread` of
    step times (a share); thinned to a factor-2 grid of at most `most`, the peak of throughput kept;
    then, with B_noise's `interval` (low, high or None where open above), those `slower_throughout`
    it than another size by more than CAP times 1 + `spread` left out (after the thinning: a
    hopeless size gone never makes room for one the grid had thinned out, which would add arms)."""
    sizes = sorted(b for b, t in step_seconds.items() if t and t > 0)
    slack = 1.0 + spread

    def dominated(b: int) -> bool:
        t = step_seconds[b]
        larger = any(c > b and step_seconds[c] * slack <= t for c in sizes)  # clearly no slower a step
        smaller = any(c < b and t / b >= step_seconds[c] / c * slack for c in sizes)  # clearly no faster an image
        return larger or smaller

    def hopeless(b: int) -> bool:
        return interval is not None and any(slower_throughout(b, c, step_seconds, interval, CAP * slack)
                                            for c in sizes)

    kept = [b for b in sizes if not dominated(b)] or sizes
    peak = max(sizes, key=lambda b: b / step_seconds[b])
    grid: list[int] = []
    for b in kept:  # a factor-2 grid: each kept size at least twice the last one taken
        if not grid or b >= 2 * grid[-1]:
            grid.append(b)
    while len(grid) > most:  # too many: every other one, from the smallest, until they fit
        grid = grid[::2]
    raced = set(grid) | {peak}
    # the hopeless last, so that leaving one out never brings back a size the thinning took
    return sorted({b for b in raced if not hopeless(b)} or raced)


def slower_throughout(b: int, c: int, step_seconds: dict[int, float], interval: tuple[float, float | None],
                      factor: float) -> bool:
    """Whether size `b`'s predicted time to a target, (1 + B_noise/b) steps times its step time, is
    more than `factor` times size `c`'s wherever B_noise lies in `interval` (low, high or None where
    open above). Their ratio is monotone in B_noise, so its ends decide; without a high end, its
    limit: the ratio of their times per image. A size that slow in the case most favourable to it
    would be capped (CAP) in every trial: racing it costs trials and cannot change the answer
    (on the H200, B_noise 5 to 787, batch size 1's
    predicted 4.5 times 16's at best, its trials took 8-16 times as long in steady training)."""
    low, high = interval
    def ratio(n: float) -> float:
        return (1 + n / b) * step_seconds[b] / ((1 + n / c) * step_seconds[c])
    far = (step_seconds[b] / b) / (step_seconds[c] / c)
    return min(ratio(max(0.0, low)), far if high is None else ratio(high)) > factor


def race_rates(rate: float, factors: tuple[float, ...] = RATE_FACTORS) -> list[float]:
    """A size's rates: the rule's `rate` and the factor-2 set around it."""
    return [rate * f for f in factors]


@dataclass
class Race:
    """Successive halving over `arms`, on the same seeds for each (`seeds`: the seed of each slot,
    SEEDS_PER_RUNG[-1] of them at least)."""

    arms: list[Arm]
    seeds: list[int] = field(default_factory=lambda: list(range(SEEDS_PER_RUNG[-1])))
    rungs: tuple[int, ...] = SEEDS_PER_RUNG
    keep: float = KEEP
    cap: float = CAP
    outcomes: dict[tuple[Arm, int], Outcome] = field(default_factory=dict)
    rung: int = 0  # the rung being run
    alive: list[Arm] = field(default_factory=list)  # the arms still racing
    dropped: dict[Arm, int] = field(default_factory=dict)  # an arm left behind, and the rung it was left at
    edge_steps: int = 0  # the rates added at an edge so far (extend_edge)
    stepping: Arm | None = None  # the rate added at an edge, while it climbs the rungs

    def __post_init__(self):
        if not self.arms:
            raise ValueError("a race needs at least one arm")
        if len(self.seeds) < self.rungs[-1]:
            raise ValueError(f"{self.rungs[-1]} seeds are needed, got {len(self.seeds)}")
        self.alive = self.alive or sorted(set(self.arms))

    def copy(self) -> Race:
        """The race as it stands, apart from this one's later rungs."""
        return replace(self, arms=list(self.arms), seeds=list(self.seeds), outcomes=dict(self.outcomes),
                       alive=list(self.alive), dropped=dict(self.dropped))

    @property
    def finished(self) -> bool:
        return self.rung >= len(self.rungs)

    def rung_seeds(self, rung: int | None = None) -> list[int]:
        return self.seeds[:self.rungs[self.rung if rung is None else rung]]

    def next_trials(self) -> list[Trial]:
        """The current rung's trials not run yet, seed by seed (each seed's arms together, so that a
        seed's best time caps the rest: the runner asks `cap_for(seed)` as each starts)."""
        if self.finished:
            return []
        return [Trial(arm, seed) for seed in self.rung_seeds() for arm in self.alive
                if (arm, seed) not in self.outcomes]

    def cap_for(self, seed: int) -> float | None:
        """CAP times the best finished time on `seed`; None before any finished."""
        done = [o.seconds for (_, s), o in self.outcomes.items() if s == seed and not o.censored]
        return self.cap * min(done) if done else None

    def record(self, outcome: Outcome) -> None:
        if outcome.seconds is None or not math.isfinite(outcome.seconds) or outcome.seconds <= 0:
            raise ValueError(f"a trial's time is a positive number of seconds, got {outcome.seconds!r}")
        self.outcomes[(outcome.arm, outcome.seed)] = outcome

    def advance(self) -> list[Arm]:
        """End the current rung (its trials all recorded): keep the best KEEP of its arms (at least
        one), and move to the next rung; the arms left behind, returned."""
        if self.finished:
            raise ValueError("the race is over: no rung to end")
        missing = self.next_trials()
        if missing:
            raise ValueError(f"{len(missing)} trials of rung {self.rung + 1} have not run")
        seeds = self.rung_seeds()
        ranked = sorted(self.alive, key=lambda a: (self.log_time(a, seeds), a))
        if self.stepping is not None:  # an edge's rate alone climbs: left behind only where beaten
            step = self.stepping
            beaten = self.beaten(step, next(a for a in ranked if a != step), seeds)  # (against the fastest of the rest)
            if beaten:
                self.dropped[step] = self.rung
                self.alive = sorted(a for a in self.alive if a != step)
            self.rung = len(self.rungs) if beaten else self.rung + 1
            if self.finished:
                self.stepping = None
            return [step] if beaten else []
        if self.rung == len(self.rungs) - 1:  # the last rung leaves none behind: the decision reads them all
            left = []
        else:
            keep = max(1, math.ceil(len(ranked) * self.keep))
            kept = ([a for a in ranked if not self.beaten(a, ranked[0], seeds)] or ranked)[:keep]
            left = [a for a in ranked if a not in kept]
        for arm in left:
            self.dropped[arm] = self.rung
        self.alive = sorted(a for a in ranked if a not in left)
        self.rung += 1
        return left

    def beaten(self, arm: Arm, lead: Arm, seeds: list[int]) -> bool:
        """Whether `arm` is out of the race whatever its rank: it reached the target on none of `seeds`
        (censored on each, it is at least CAP times the best there), or, over at least CLEAR_SEEDS of
        them, its paired interval against `lead` lies wholly above TIE (the decision could not tie
        it; a censored time is a lower bound, so its true interval lies higher still)."""
        if all(self.outcomes[(arm, s)].censored for s in seeds):
            return True
        if arm == lead or len(seeds) < CLEAR_SEEDS:
            return False
        diffs = [math.log(self.outcomes[(arm, s)].seconds / self.outcomes[(lead, s)].seconds) for s in seeds]
        return _interval(diffs)[0] > math.log(TIE)

    def log_time(self, arm: Arm, seeds: list[int] | None = None) -> float:
        """The mean log time of `arm` over `seeds` (its runs so far): a censored run at its cap."""
        times = [self.outcomes[(arm, s)].seconds for s in (seeds or self.seeds) if (arm, s) in self.outcomes]
        return statistics.fmean(math.log(t) for t in times) if times else math.inf

    def leader(self) -> Arm:
        seeds = self.rung_seeds(min(self.rung, len(self.rungs) - 1))
        return min(self.alive, key=lambda a: (self.log_time(a, seeds), a))

    def extend_edge(self, rates_of: dict[int, list[float]]) -> Arm | None:
        """Where the leader's rate is at an edge of its size's rates (`rates_of`) and it is faster than
        its neighbour rate there, the next rate that way (half the least, twice the most), which then
        climbs the rungs alone (`stepping`: `advance` leaves it behind where beaten, and cuts no other
        arm); None where it is not (a tie steps nowhere), after EDGE_STEPS, or where
        the step was taken already. The arm is added to those racing: called again after it has
        raced, the race steps on while the new rate wins (an anchor 10 times off the best rate, as
        Adam's was on this CPU, needs three)."""
        lead = self.leader()
        rates = sorted(rates_of.get(lead.batch_size, [lead.lr]))
        if len(rates) < 2 or lead.lr not in (rates[0], rates[-1]) or self.edge_steps >= EDGE_STEPS:
            return None
        inner = Arm(lead.batch_size, rates[1] if lead.lr == rates[0] else rates[-2])
        both = [s for s in self.seeds if (inner, s) in self.outcomes and (lead, s) in self.outcomes]
        step = Arm(lead.batch_size, lead.lr / 2 if lead.lr == rates[0] else lead.lr * 2)
        if step in self.arms or (both and self.log_time(lead, both) >= self.log_time(inner, both)):
            return None
        self.edge_steps += 1
        rates_of[lead.batch_size] = sorted([*rates, step.lr])
        self.arms.append(step)
        self.alive = sorted({*self.alive, step})
        if self.finished:  # it climbs the rungs alone, from the first, left behind where beaten (`advance`)
            self.rung, self.stepping = 0, step
        return step

    def decision(self, tie: float = TIE) -> dict:
        """The leader, its time with an interval, every arm's ratio to it with an interval (paired
        log-differences over their common seeds; a censored run's time is its cap, a lower bound,
        so an arm censored anywhere is slower than its ratio says), and the arms it cannot tell
        from it: those that ran every seed the leader did, none censored, whose interval reaches
        below TIE times the leader's."""
        lead = self.leader()
        seeds = [s for s in self.seeds if (lead, s) in self.outcomes]
        lead_logs = {s: math.log(self.outcomes[(lead, s)].seconds) for s in seeds}
        rows = []
        for arm in sorted(set(self.arms)):
            common = [s for s in seeds if (arm, s) in self.outcomes]
            diffs = [math.log(self.outcomes[(arm, s)].seconds) - lead_logs[s] for s in common]
            low, mid, high = _interval(diffs)
            censored = sum(self.outcomes[(arm, s)].censored for s in common)
            rows.append({"batch_size": arm.batch_size, "lr": arm.lr, "seeds": len(common), "censored": censored,
                         "ratio": math.exp(mid) if diffs else None,
                         "ratio_low": math.exp(low) if diffs else None,
                         "ratio_high": math.exp(high) if diffs and math.isfinite(high) else None,
                         "left_at_rung": self.dropped.get(arm)})
        times = [self.outcomes[(lead, s)].seconds for s in seeds]
        low, mid, high = _interval([math.log(t) for t in times])
        finished = [a for a in self.alive if all((a, s) in self.outcomes for s in seeds)]
        mean_arm = min(finished, key=lambda a: (statistics.fmean(self.outcomes[(a, s)].seconds for s in seeds), a))
        tied = [r for r in rows if (r["batch_size"], r["lr"]) != (lead.batch_size, lead.lr) and r["seeds"] == len(seeds)
                and not r["censored"] and r["ratio_low"] is not None and r["ratio_low"] < tie]
        return {"batch_size": lead.batch_size, "lr": lead.lr, "seconds": math.exp(mid),
                "seconds_low": math.exp(low), "seconds_high": math.exp(high) if math.isfinite(high) else None,
                "seeds": len(seeds), "censored": sum(self.outcomes[(lead, s)].censored for s in seeds),
                "criterion": "median", "mean_leader": {"batch_size": mean_arm.batch_size, "lr": mean_arm.lr},
                "tied": [{"batch_size": r["batch_size"], "lr": r["lr"]} for r in tied], "arms": rows}


def against_prediction(decision: dict, predicted: int) -> dict:
    """The prediction's recommended size held against the race's answer: it agrees where it is the
    leader's size or one the race cannot tell from it; else its best arm's time over the leader's,
    where it raced."""
    tied = {t["batch_size"] for t in decision["tied"]} | {decision["batch_size"]}
    rows = [r for r in decision["arms"] if r["batch_size"] == predicted and r["ratio"] is not None]
    best = min(rows, key=lambda r: r["ratio"]) if rows else None
    return {"batch_size": predicted, "agrees": predicted in tied, "raced": bool(rows),
            "ratio": best["ratio"] if best else None, "seeds": best["seeds"] if best else None}


def _interval(values: list[float]) -> tuple[float, float, float]:
    """(low, mean, high) of `values`' mean at LEVEL by Student's t; an open interval from one value."""
    if not values:
        return -math.inf, math.nan, math.inf
    mean = statistics.fmean(values)
    if len(values) < 2:
        return -math.inf, mean, math.inf
    df = len(values) - 1
    q = T_QUANTILES.get(df) or T_QUANTILES[max(k for k in T_QUANTILES if k <= df)]
    half = q * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean, mean + half
