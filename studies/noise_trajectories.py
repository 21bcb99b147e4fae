"""Why do find-batch-size's noise scales differ from seed to seed? The trajectories, epoch by epoch.

find-batch-size pools B_simple over epochs 2-3 of two seeds (catsdogs.measure.noise_run).
studies/noise_spread.py showed that its spread between pairs of seeds is not the sampling's.
This looks at the trajectories themselves: `--seeds` short runs at batch 32, each measured after
every epoch with find-batch-size's sampling (pairs of 1 and 25 images), printing per seed and
epoch the training loss, B_simple, |G|^2 and tr(Sigma); then each seed's epochs 2-3 pooled, and
the geometric mean of those per-seed values over every window of `--window` consecutive seeds
(how far a decision pooled per seed over that many seeds would still move).

    python studies/noise_trajectories.py --data-dir data/beyond
    KERAS_BACKEND=jax python studies/noise_trajectories.py --data-dir data/beyond --seeds 4
"""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import replace
from pathlib import Path

from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling, pool
from catsdogs.manifest import require_intact
from catsdogs.measure.noise_run import NOISE_FROM, NOISE_LARGE, NOISE_PAIRS
from catsdogs.messages import TrialTask
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker
from catsdogs.schema import Status, TrialConfig


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--opt", default="adam", help="optimizer [adam]")
    ap.add_argument("--seeds", type=int, default=6, help="seeds 0 .. N-1 [6]")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run [4]")
    ap.add_argument("--window", type=int, default=4, help="seeds per geometric mean [4]")
    args = ap.parse_args()
    manifest = require_intact(args.data_dir)
    sampling = NoiseSampling(micro=1, micros=NOISE_LARGE, pairs=NOISE_PAIRS, from_epoch=1)
    per_seed: dict[int, float | None] = {}
    print(f"{'seed':>4} {'epoch':>5} {'loss':>7} {'B_simple':>9} {'|G|^2':>9} {'tr(Sigma)':>10}")
    with tempfile.TemporaryDirectory() as work:
        worker = Worker(Path(work) / "worker.log")
        try:
            for seed in range(args.seeds):
                cfg = TrialConfig(args.opt, 32, "standard", seed, epochs=args.epochs,
                                  image_size=manifest["params"]["size"], data=manifest["fingerprint"]["standard"],
                                  backend=backends.name(), **backends.process_settings({}))
                record = worker.run(TrialTask(cfg, str(args.data_dir.resolve()), sampling.as_dict()))
                if record.status != Status.DONE:
                    print(f"seed {seed}: {record.status}: {record.error}")
                    continue
                kept = []
                for row in record.history or []:
                    m = NoiseEstimate.from_record(row)
                    if m is None:
                        continue
                    m = replace(m, small=sampling.micro, large=sampling.large)
                    kept += [m] if NOISE_FROM <= m.epoch <= NOISE_FROM + 1 else []
                    print(f"{seed:>4} {m.epoch:>5} {row.get('loss', float('nan')):>7.3f} {fmt(m.b_simple):>9} "
                          f"{fmt(m.gradient_sq):>9} {fmt(m.trace):>10}", flush=True)
                pooled = pool(kept)
                per_seed[seed] = pooled.b_simple if pooled else None
        finally:
            worker.close()
    print(f"\nper seed, epochs {NOISE_FROM}-{NOISE_FROM + 1} pooled: "
          + ", ".join(f"{s}: {fmt(v)}" for s, v in per_seed.items()))
    seeds = sorted(per_seed)
    for start in range(0, len(seeds) - args.window + 1):
        window = [per_seed[s] for s in seeds[start:start + args.window]]
        if all(v and v > 0 for v in window):
            mean = math.exp(sum(math.log(v) for v in window) / len(window))
            print(f"seeds {seeds[start]}-{seeds[start + args.window - 1]}: geometric mean {mean:.3g}")
        else:
            print(f"seeds {seeds[start]}-{seeds[start + args.window - 1]}: a seed unresolved (no geometric mean)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
