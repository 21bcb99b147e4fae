"""A lead, not built: the race's edge stepped the way most sizes' best rates point, not only where
the leader's own rate lies at its set's edge. On the simulated devices of tests/measure/test_race.py.

catsdogs.measure.race steps a rate past the edge only where the leader's rate is at its size's
edge and beats its neighbour. Where the anchor puts every rate far below the best and the rate
surface is flat within a set (Adam on seed 1 of this CPU: docs/results.md, "Tried and dropped
(2026-11-29, with 0.38.0)"), the leader can sit in the middle or at the wrong edge of its rates
while most sizes' best rates sit at their top edges. `Vote` then steps the leader's size the way
two or more sizes' votes point (+1 for a size whose best rate is its top one, -1 its bottom one).
Prints per device, best rate over the rule's and oracle the share of races within 1.25 times the
best, the median and 90th-percentile ratios, and the trial-seconds in the best arm's times
(race_keep.simulate's races).

    python studies/race_edge_vote.py --races 200 --rate-cost 0.1 --best-factor 1 8 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE / "tests"), str(HERE / "tests" / "measure")]

VOTES = 2  # the net votes that step the leader's size


def voting():
    from catsdogs.measure.race import EDGE_STEPS, Arm, Race

    class Vote(Race):
        def extend_edge(self, rates_of):
            got = super().extend_edge(rates_of)
            if got is not None or self.edge_steps >= EDGE_STEPS:
                return got
            votes = 0
            for b, rates in rates_of.items():
                arms = [Arm(b, r) for r in sorted(rates)]
                common = [s for s in self.seeds if all((a, s) in self.outcomes for a in arms)]
                if len(common) >= 2:
                    best = min(arms, key=lambda a: self.log_time(a, common))
                    votes += (best == arms[-1]) - (best == arms[0])
            lead = self.leader()
            rates = sorted(rates_of[lead.batch_size])
            step = Arm(lead.batch_size, rates[-1] * 2 if votes > 0 else rates[0] / 2)
            if abs(votes) < VOTES or step in self.arms:
                return None
            self.edge_steps += 1
            rates_of[lead.batch_size] = sorted([*rates, step.lr])
            self.arms.append(step)
            self.alive = sorted({*self.alive, step})
            if self.finished:
                self.rung, self.stepping = 0, step
            return step

    return Vote


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--races", type=int, default=200, help="simulated races per device and oracle")
    ap.add_argument("--rate-cost", type=float, default=None, help="the device's cost of a factor-2 rate error")
    ap.add_argument("--best-factor", type=float, nargs="+", default=[1.0, 8.0, 12.0], help="the best rate over the rule's")
    args = ap.parse_args()
    from race_keep import rows
    from test_race import CPU_STEPS, H200_STEPS

    from catsdogs.measure.race import Race

    oracles = {"as it is": Race, "vote": voting()}
    devices = [("CPU, B_noise 8", CPU_STEPS, 8.0), ("CPU, B_noise 32", CPU_STEPS, 32.0), ("H200, B_noise 8", H200_STEPS, 8.0)]
    print("| device | best rate / rule's | oracle | within 1.25 | median ratio | 90th percentile | trial-seconds |")
    print("|---|---|---|---|---|---|---|")
    for name, factor, label, ratios, costs, _ in rows(oracles, devices, args.races, args.best_factor, args.rate_cost):
        hits = sum(r <= 1.25 for r in ratios)
        print(f"| {name} | {factor:g} | {label} | {hits / args.races:.3f} | {statistics.median(ratios):.2f} | "
              f"{sorted(ratios)[int(0.9 * args.races)]:.2f} | {statistics.median(costs):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
