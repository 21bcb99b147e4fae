"""How many arms the race should keep from one rung to the next: halving (catsdogs.measure.race's
KEEP, a half) against fewer, on the simulated devices of tests/measure/test_race.py. Tried for
0.39.0 and dropped (docs/results.md, "Tried and dropped (2026-11-29, with 0.38.0)").

Each variant keeps the best `most[rung]` arms of a rung, but never more than half of them nor
fewer than a third ("9, 3": 9 arms after the first rung, 3 after the second). Rates sit at the
optimizer's rule (`--best-factor 1`) or the best rate lies that many times above it (an anchor
that far off, as Adam's was on seed 1 of this CPU), with `--rate-cost` the price of a factor-2
error (tests/fakes.py's RaceDevice: 0.35; Adam's surface on this CPU is flatter, about 0.1).
Prints, per device and variant, the share of races within 1.25 times the best arm's time, the
median answer's ratio, and the trial-seconds in the best arm's times (a trial's fixed cost 1.5 of them).

    python studies/race_keep.py --races 600
    python studies/race_keep.py --races 200 --rate-cost 0.1 --best-factor 1 8 12
    python studies/race_keep.py --races 300 --rungs 2,6,12 2,4,12   # seeds a rung, not arms kept
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE / "tests"), str(HERE / "tests" / "measure")]

FIXED = 1.5  # a trial's fixed cost, in the best arm's times (as benchmarks/bench_race_oracle.py)


def keeping(most: tuple[int, ...]):
    """A Race that keeps `most[rung]` arms, within a third and half of a rung's."""
    from catsdogs.measure.race import Race

    class Kept(Race):
        def advance(self):
            n = len(self.alive)
            m = most[min(self.rung, len(most) - 1)]
            self.keep = max(1, min(math.ceil(n / 2), max(math.ceil(n / 3), m))) / n - 1e-9 if n else self.keep
            return super().advance()

    return Kept


def seeding(rungs: tuple[int, ...]):
    """A Race whose rungs end at `rungs` seeds an arm (the race's own: SEEDS_PER_RUNG, 2, 6, 18)."""
    from catsdogs.measure.race import Race

    class Seeded(Race):
        def __init__(self, arms, **kwargs):
            super().__init__(arms, **{"rungs": rungs, "seeds": list(range(rungs[-1])), **kwargs})

    return Seeded


def simulate(oracle, steps: dict[int, float], b_noise: float, races: int, factor: float = 1.0,
             rate_cost: float | None = None) -> tuple[list[float], list[float], list[int]]:
    """`races` races of `oracle` on RaceDevice (`steps`, B_noise, the best rate `factor` times the
    rule's, `rate_cost` a factor-2 rate error's price where given): each answer's true time over
    the best arm's, each race's trial-seconds in the best arm's times, each race's trials."""
    from fakes import RaceDevice
    from test_race import LOG_SD, run_race

    from catsdogs.measure.race import race_sizes

    sizes = race_sizes(steps, spread=0.2)
    ratios, costs, counts = [], [], []
    for n in range(races):
        device = RaceDevice(steps, b_noise=b_noise, log_sd=LOG_SD, seed=n, shared=0.7,
                            best_factor=dict.fromkeys(steps, factor))
        if rate_cost is not None:
            device.RATE_COST = rate_cost
        best = min(device.median_seconds(b, device.rule_rate(b) * f) for b in sizes for f in (0.25, 0.5, 1, 2, 4, 8, 16))
        race = run_race(device, sizes, race_class=oracle)
        lead = race.leader()
        ratios.append(device.median_seconds(lead.batch_size, lead.lr) / best)
        costs.append(sum(o.seconds + FIXED * best for o in race.outcomes.values()) / best)
        counts.append(len(race.outcomes))
    return ratios, costs, counts


def rows(oracles: dict, devices: list[tuple], races: int, factors: list[float], rate_cost: float | None):
    """Each device's races under each oracle at each best-rate factor: (device, factor, oracle's label,
    ratios, trial-seconds, trials) as `simulate` gives them, in the order a table prints them."""
    for name, steps, b_noise in devices:
        for factor in factors:
            for label, oracle in oracles.items():
                yield name, factor, label, *simulate(oracle, steps, b_noise, races, factor, rate_cost)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=600, help="simulated races per device and variant")
    ap.add_argument("--rate-cost", type=float, default=None, help="the device's cost of a factor-2 rate error")
    ap.add_argument("--best-factor", type=float, nargs="+", default=[1.0], help="the best rate over the rule's")
    ap.add_argument("--rungs", nargs="+", default=None, metavar="N,N,N",
                    help="compare seeds a rung instead of arms kept: halving over these, e.g. 2,6,12 2,4,12")
    args = ap.parse_args()
    from test_race import CPU_STEPS, H200_STEPS

    from catsdogs.measure.race import Race

    variants = {"halving": Race, "9, 3": keeping((9, 3)), "9, then half": keeping((9, 10**6)),
                "a third": keeping((0,))}
    if args.rungs:
        variants = {"halving, 2, 6, 18": Race} | {f"halving, {r.replace(',', ', ')}": seeding(
            tuple(int(n) for n in r.split(","))) for r in args.rungs}
    devices = [("H200, B_noise 8", H200_STEPS, 8.0), ("H200, B_noise 64", H200_STEPS, 64.0),
               ("CPU, B_noise 8", CPU_STEPS, 8.0), ("CPU, B_noise 32", CPU_STEPS, 32.0),
               ("CPU, B_noise 200", CPU_STEPS, 200.0)]
    print("| device | best rate / rule's | variant | within 1.25 | median ratio | trial-seconds | trials |")
    print("|---|---|---|---|---|---|---|")
    for name, factor, label, ratios, costs, counts in rows(variants, devices, args.races, args.best_factor, args.rate_cost):
        hits = sum(r <= 1.25 for r in ratios)
        print(f"| {name} | {factor:g} | {label} | {hits / args.races:.3f} | {statistics.median(ratios):.2f} | "
              f"{statistics.median(costs):.0f} | {statistics.median(counts):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
