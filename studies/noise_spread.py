"""How steady is find-batch-size's noise scale? Its measurement, at several samplings, over pairs of seeds.

find-batch-size decides with B_simple measured over epochs 2-3 of two short runs at batch 32
(catsdogs.measure.noise_run.measure_noise_scale). Its spread from one pair of seeds to the
next has two parts: the trajectories differ (another seed, other weights) and each measurement
samples few images. The second shrinks with the large batch B_b of each pair: |G|^2 comes from
the B_b (B_b - 1) off-diagonal products of the pair's Gram matrix, so for the same images a larger
B_b gives many more products (catsdogs.gradient_noise). For each sampling (PAIRS x B_b), this runs
the measurement over `--runs` pairs of seeds (0-1, 2-3, ...: every sampling sees the same
trajectories, since measuring changes nothing a trial trains) and prints each run's B_simple and
interval, how many resolved (bounded above), and the spread (largest over smallest value).

    python studies/noise_spread.py --data-dir data/beyond
    KERAS_BACKEND=jax python studies/noise_spread.py --data-dir data/beyond --samplings 32x10 16x50
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from catsdogs.gradient_noise import NoiseSampling, describe
from catsdogs.manifest import require_intact
from catsdogs.measure.noise_run import NOISE_FROM, measure_noise_scale
from catsdogs.measure.settings import FindSettings


def sampling_of(text: str) -> NoiseSampling:
    pairs, large = (int(x) for x in text.lower().split("x"))
    return NoiseSampling(micro=1, micros=large, pairs=pairs, from_epoch=NOISE_FROM)  # as find-batch-size's


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--opt", default="adam", help="optimizer [adam]")
    ap.add_argument("--runs", type=int, default=3, help="pairs of seeds per sampling [3]")
    ap.add_argument("--samplings", nargs="+", default=["32x10", "16x50"],
                    help="PAIRSxLARGE: pairs per measurement and images per pair [32x10 16x50]")
    args = ap.parse_args()
    manifest = require_intact(args.data_dir)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for text in args.samplings:
            sampling = sampling_of(text)
            for run in range(args.runs):
                started = time.perf_counter()
                noise = measure_noise_scale(args.data_dir, manifest, FindSettings(optimizer=args.opt, seed=2 * run),
                                            Path(work), None, lambda line: None, sampling)
                e = noise.estimate if noise else None
                rows.append((text, 2 * run, e, noise.measure_seconds if noise else None,
                             time.perf_counter() - started))
                print(f"{text:>7} seeds {2 * run}-{2 * run + 1}: {describe(e) if e else 'failed'} "
                      f"(measuring {rows[-1][3]} s, {rows[-1][4]:.0f} s in all)", flush=True)
    print(f"\n{'sampling':>8} {'resolved':>9} {'spread':>7}  values")
    for text in args.samplings:
        mine = [r[2] for r in rows if r[0] == text and r[2] is not None]
        values = [e.b_simple for e in mine if e.b_simple]
        bounded = sum(e.high is not None and e.b_simple is not None for e in mine)
        spread = max(values) / min(values) if values else float("nan")
        print(f"{text:>8} {bounded:>4} of {len(mine)} {spread:>7.1f}  " + ", ".join(f"{v:.0f}" for v in values))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
