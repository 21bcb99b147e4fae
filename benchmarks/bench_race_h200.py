"""The race's scheduler on the H200's recorded figures: its answer against the known best, and the
seconds its trials would take there, over seeds (issue 62's GPU target: the race at 64 px in at most
90 s; no GPU needed: the trials are simulated).

Runs catsdogs.measure.race_run.run_race, the command's own scheduler and store, on simulated slots
(tests/fakes.py's RaceSlot and RaceDevice) with docs/gpu.md's H200 step times by batch size and a
trial's fixed cost (0.52 s: compilation, evaluations, data), the critical plan's seed spreads, from
0.25.0's prediction (128), where a small size is best (B_noise 8) and where 128 is (B_noise 64).
Prints per seed the answer, its true time over the best's, the trials and their simulated seconds,
fixed costs included, then the medians.

    python benchmarks/bench_race_h200.py --seeds 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from harness import HERE

sys.path[:0] = [str(HERE), str(HERE / "tests"), str(HERE / "tests" / "measure")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=6)
    args = ap.parse_args()
    from test_race_run import H200_FIXED, h200_race, true_best

    from catsdogs.data.prepare import prepare

    data = Path(tempfile.mkdtemp(prefix="race-h200-data-"))
    prepare(source="synthetic", data_dir=data, per_class=616, split=(600, 8, 8), size=32, log=lambda *a: None,
            progress=False)
    print(f"fixed cost a trial {H200_FIXED} s (docs/gpu.md)")
    print("| B_noise | seed | answer | T(answer)/T(best) | trials | simulated seconds |")
    print("|---|---|---|---|---|---|")
    for b_noise in (8.0, 64.0):
        ratios, seconds_all = [], []
        for seed in range(args.seeds):
            device, record, seconds = h200_race(Path(tempfile.mkdtemp(prefix="race-h200-")), data, b_noise, seed)
            answer, best = true_best(device, record)
            d = record["decision"]
            ratios.append(answer / best)
            seconds_all.append(seconds)
            print(f"| {b_noise:g} | {seed} | {d['batch_size']} at {d['lr']:.3g} | {answer / best:.2f} | "
                  f"{record['trials']} | {seconds:.0f} |")
        within = sum(r <= 1.25 for r in ratios)
        print(f"| {b_noise:g} | median | | {statistics.median(ratios):.2f} ({within} of {len(ratios)} within 1.25) | "
              f"| {statistics.median(seconds_all):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
