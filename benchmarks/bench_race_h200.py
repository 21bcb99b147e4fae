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

`--sizes` instead races the 64 px race's own probes of 2026-11-28 (docs/gpu.md: images/s at 1 to
1,200, B_noise 5 to 787) as find-batch-size planned it, with B_noise's interval (0.30.0: hopeless
sizes left out) and without (0.29.0), a true B_noise of 20 (the critical batch size measured there
was 18), the same fixed cost: the sizes raced, the trials and simulated seconds, the answers.
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
    ap.add_argument("--sizes", action="store_true", help="the 64 px race's sizes with and without the interval")
    args = ap.parse_args()
    if args.sizes:
        return sizes(args.seeds)
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


# the 64 px race's probes on the H200 (2026-11-28, race.log): images/s by batch size; B_noise's interval
RACE_64PX_IPS = {1: 730.5, 8: 6250.9, 16: 11443.8, 32: 22824.2, 56: 36035.1, 64: 41368.2, 128: 71290.0,
                 256: 117600.3, 512: 166929.9, 1200: 221421.9}
RACE_64PX_INTERVAL = [4.96, 787.3]


def sizes(seeds: int) -> int:
    """The race planned on RACE_64PX_IPS with and without B_noise's interval, simulated (see --sizes)."""
    from fakes import RaceDevice, RaceSlot
    from test_race_run import ANCHOR, H200_FIXED, true_best

    from catsdogs.data.prepare import prepare
    from catsdogs.manifest import require_prepared
    from catsdogs.measure.race_run import run_race, sweep_name
    from catsdogs.measure.settings import FindSettings
    from catsdogs.store import Store, store_path

    data = Path(tempfile.mkdtemp(prefix="race-h200-data-"))
    prepare(source="synthetic", data_dir=data, per_class=616, split=(600, 8, 8), size=32, log=lambda *a: None,
            progress=False)
    steps = {b: b / v for b, v in RACE_64PX_IPS.items()}
    print("| B_noise's interval | sizes raced | seed | answer | T(answer)/T(best) | trials | simulated seconds |")
    print("|---|---|---|---|---|---|---|")
    for interval in (None, RACE_64PX_INTERVAL):
        runs = []
        for seed in range(seeds):
            device = RaceDevice(steps, b_noise=20.0, log_sd={b: 0.38 + 0.74 * (4 / b) ** 0.5 for b in steps}, seed=seed)
            rec = {"batch_size": 128, "statistics": "resolved", "b_noise": 62.0,
                   "table": [{"batch_size": b, "step_seconds": t} for b, t in steps.items()],
                   **({"interval": interval} if interval else {})}
            out = Path(tempfile.mkdtemp(prefix="race-h200-"))
            record = run_race(FindSettings(name="sizes", optimizer="sgd", race=True, until="val_loss=0.5", seed=seed),
                              data, out, require_prepared(data), 32, rec, ANCHOR, lambda line: None,
                              slots=lambda i, n, w, d=device: RaceSlot(d, 1200, fixed=H200_FIXED))
            with Store(store_path(out), read_only=True) as store:
                seconds = sum(t["wall_seconds"] for t in store.trials(sweep_name("sizes")))
            answer, best = true_best(device, record)
            runs.append((record["trials"], seconds))
            print(f"| {interval or 'none (0.29.0)'} | {', '.join(map(str, record['sizes']))} | {seed} | "
                  f"{record['decision']['batch_size']} | {answer / best:.2f} | {record['trials']} | {seconds:.0f} |")
        print(f"| {interval or 'none (0.29.0)'} | median | | | | {statistics.median(r[0] for r in runs):.0f} | "
              f"{statistics.median(r[1] for r in runs):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
