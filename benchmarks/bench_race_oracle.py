"""The race's oracle with and without leaving beaten arms behind: how often its answer is within 1.25
times the best, and what its trials cost, on simulated devices (no training: pure, seconds).

Races catsdogs.measure.race.Race as find-batch-size does (the sizes race.race_sizes keeps, three
rates each, a rate's edge extended) on tests/fakes.py's RaceDevice: the critical plan's per-seed
spreads (log sd 0.38-1.12 by size, 70% of a seed's luck shared by its arms), the H200's step
times and a CPU's (step time growing as B^0.85), B_noise small to large. Each race twice on the
same device (tests/measure/test_race.py's run_race): as it is (`Race`), and with `Race.beaten`
switched off (halving alone, 0.31.0). A trial costs its capped time plus a fixed cost of 1.5 times the best arm's time (this CPU's race:
1.0-1.6 s of compilation, evaluations and data against a leader's 0.7-0.9 s). Prints per device the
share within 1.25, the median trial-seconds (in units of the best arm's time) and trials.

    python benchmarks/bench_race_oracle.py --races 500
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness import HERE, table

sys.path[:0] = [str(HERE), str(HERE / "tests"), str(HERE / "tests" / "measure")]

FIXED = 1.5  # a trial's fixed cost, in the best arm's times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=500, help="simulated races per device and oracle")
    args = ap.parse_args()
    from fakes import RaceDevice
    from test_race import CPU_STEPS, H200_STEPS, LOG_SD, run_race

    from catsdogs.measure.race import Race, race_rates, race_sizes

    class HalvingAlone(Race):
        def beaten(self, arm, lead, seeds) -> bool:
            return False

    devices = [("H200, B_noise 8", H200_STEPS, 8.0), ("H200, B_noise 64", H200_STEPS, 64.0),
               ("CPU, B_noise 8", CPU_STEPS, 8.0), ("CPU, B_noise 32", CPU_STEPS, 32.0),
               ("CPU, B_noise 200", CPU_STEPS, 200.0)]
    rows = []
    for name, steps, b_noise in devices:
        sizes = race_sizes(steps, spread=0.2)
        got = {}
        for oracle in (HalvingAlone, Race):
            hits, costs, counts = 0, [], []
            for n in range(args.races):
                device = RaceDevice(steps, b_noise=b_noise, log_sd=LOG_SD, seed=n, shared=0.7)
                every = [(b, lr) for b in sizes for lr in race_rates(device.rule_rate(b), (0.25, 0.5, 1.0, 2.0, 4.0))]
                best = min(device.median_seconds(b, lr) for b, lr in every)
                race = run_race(device, sizes, race_class=oracle)
                lead = race.leader()
                hits += device.median_seconds(lead.batch_size, lead.lr) <= 1.25 * best
                costs.append(sum(o.seconds + FIXED * best for o in race.outcomes.values()) / best)  # (each trial once)
                counts.append(len(race.outcomes))
            got[oracle] = (hits / args.races, statistics.median(costs), statistics.median(counts))
        (p0, c0, n0), (p1, c1, n1) = got[HalvingAlone], got[Race]
        rows.append([name, f"{p0:.3f}", f"{p1:.3f}", f"{c0:.0f}", f"{c1:.0f}", f"{c1 / c0:.2f}x", f"{n0:.0f}", f"{n1:.0f}"])
        print(f"{name}: within 1.25 {p0:.3f} -> {p1:.3f}; trial-seconds {c0:.0f} -> {c1:.0f} ({c1 / c0:.2f}x)", flush=True)
    print()
    print(table(["device", "within 1.25, halving alone", "as it is", "trial-seconds (best's times), halving alone",
                 "as it is", "ratio", "trials, halving alone", "as it is"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
