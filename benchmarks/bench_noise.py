"""Benchmark `sweep --noise-scale`: what recording the gradient noise scale costs a trial.

On prepared data (the article-64px plan's 64 px synthetic images by default: 1,200 training
images), each batch size trains the article's trial (5 epochs) in one long-lived worker, as a
sweep does, without and with the recording, alternating which comes first from seed to seed.
Each recorded trial says what its measurements cost (`noise_seconds`, outside every epoch's
clock) beside its training time (`train_seconds`); the pairs also give the wall-time difference,
and must have the same weights digest (the recording changes nothing the trial trains). Per batch
size it prints the medians over seeds; the first recorded trial of a shape is shown apart, since
it compiles the measurement's function (JAX) or traces it (TensorFlow).

    python benchmarks/bench_noise.py --data-dir data/beyond
    KERAS_BACKEND=jax python benchmarks/bench_noise.py --data-dir data/beyond --seeds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import median_of, table, trial_pair

from catsdogs import config
from catsdogs.gradient_noise import NoiseSampling
from catsdogs.manifest import require_prepared
from catsdogs.runtime import backends
from catsdogs.schema import TrialConfig
from catsdogs.training.local_slot import LocalSlot

TARGET = 0.15  # the recording's share of a trial's training time, at most (batch sizes 16 and above)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--opt", default="adam", help="optimizer [adam]")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[16, 32, 64, 128], help="[16 32 64 128]")
    ap.add_argument("--seeds", type=int, default=3, help="trials of each kind per batch size [3]")
    ap.add_argument("--epochs", type=int, default=config.EPOCHS, help=f"[{config.EPOCHS}]")
    args = ap.parse_args()
    manifest = require_prepared(args.data_dir)
    sampling = NoiseSampling()
    backend = backends.name()
    print(f"{backend}, {manifest['params']['size']} px, {args.opt}, {args.epochs} epochs; measurement: "
          f"{sampling.pairs} pairs of {sampling.micro} and {sampling.large} images, at the start and after "
          "each epoch", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        slot = LocalSlot(0, 1, Path(work))
        try:
            for bs in args.batch_size:
                first_recorded = True
                for seed in range(args.seeds):
                    cfg = TrialConfig(args.opt, bs, "standard", seed, epochs=args.epochs,
                                      image_size=manifest["params"]["size"],
                                      data=manifest["fingerprint"]["standard"], backend=backend)
                    got = trial_pair(slot, cfg, args.data_dir, seed, noise_sampling=sampling.as_dict())
                    on, off = got[True], got[False]
                    rows.append({"bs": bs, "seed": seed, "first": first_recorded, "noise": on.noise_seconds,
                                 "train_on": on.train_seconds, "train_off": off.train_seconds,
                                 "wall_on": on.wall_seconds, "wall_off": off.wall_seconds,
                                 "same": on.weights_digest == off.weights_digest,
                                 "b_simple": on.noise_scale, "low": on.noise_scale_low})
                    first_recorded = False
                    print(f"  batch {bs:>4} seed {seed}: noise {on.noise_seconds:.2f} s, training "
                          f"{on.train_seconds:.2f} s (without: {off.train_seconds:.2f} s), wall "
                          f"{on.wall_seconds:.2f} vs {off.wall_seconds:.2f} s, same weights {rows[-1]['same']}",
                          flush=True)
        finally:
            slot.close()
    print()
    worst, lines = 0.0, []
    for bs in args.batch_size:
        mine = [r for r in rows if r["bs"] == bs]
        steady = [r for r in mine if not r["first"]] or mine
        share = median_of(steady, lambda r: r["noise"] / r["train_off"])
        worst = max(worst, share) if bs >= 16 else worst
        first = next(r for r in mine if r["first"])
        lines.append([bs, len(mine), f"{median_of(mine, 'train_off'):.2f}", f"{median_of(steady, 'noise'):.2f}",
                      f"{100 * share:.1f}%", f"{median_of(mine, 'wall_on'):.2f} / {median_of(mine, 'wall_off'):.2f}",
                      f"{first['noise']:.2f}", all(r["same"] for r in mine)])
    print(table(["batch size", "trials", "training s (without)", "measuring s", "measuring / training",
                 "wall s with / without", "first of its shape: measuring s", "same weights"], lines))
    print(f"\nThe largest median share at batch sizes 16 and above: {100 * worst:.1f}% "
          f"(target at most {100 * TARGET:.0f}%: {'met' if worst <= TARGET else 'NOT met'}).")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
