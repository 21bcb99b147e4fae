"""Benchmark `sweep --eval-every`: what the validation curve costs a trial.

On prepared data (the critical plan's 64 px synthetic images by default: 1,200 training and 400
validation images), each batch size trains an SGD trial (2 epochs, the `critical` plan's middle
learning rate) in one long-lived worker, as a sweep does, without and with the curve, alternating
which comes first from seed to seed. Each curved trial says what its evaluations cost
(`eval_seconds`, outside every epoch's clock) beside its training time (`train_seconds`); the
pair must have the same weights digest (the curve changes nothing the trial trains), and the
training clock should not move with it. Per batch size it prints the medians over seeds: the
evaluations per epoch, their seconds against the epoch's training seconds, and the first curved
trial of a shape apart (it compiles the evaluation at its batch size).

    python benchmarks/bench_eval_every.py --data-dir data/beyond
    KERAS_BACKEND=jax python benchmarks/bench_eval_every.py --data-dir data/beyond --seeds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness import median_of, table, trial_pair

from catsdogs.manifest import require_prepared
from catsdogs.runtime import backends
from catsdogs.schema import TrialConfig
from catsdogs.training.local_slot import LocalSlot

TARGET = 0.20  # the curve's share of a trial's training time at batch 4, at most (issue 33)
LR = {4: 0.019, 8: 0.033, 16: 0.051, 32: 0.071, 64: 0.088, 128: 0.1}  # the critical plan's predictions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[4, 16, 128], help="[4 16 128]")
    ap.add_argument("--eval-every", type=int, default=256, help="training images between evaluations [256]")
    ap.add_argument("--seeds", type=int, default=3, help="pairs of trials per batch size [3]")
    ap.add_argument("--epochs", type=int, default=2, help="[2]")
    args = ap.parse_args()
    manifest = require_prepared(args.data_dir)
    backend = backends.name()
    print(f"{backend}, {manifest['params']['size']} px, SGD, {args.epochs} epochs; an evaluation of the validation "
          f"split every {args.eval_every} training images", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        slot = LocalSlot(0, 1, Path(work))
        try:
            for bs in args.batch_size:
                for seed in range(args.seeds):
                    cfg = TrialConfig("sgd", bs, "standard", seed, epochs=args.epochs, lr=LR.get(bs, 0.05),
                                      image_size=manifest["params"]["size"],
                                      data=manifest["fingerprint"]["standard"], backend=backend)
                    got = trial_pair(slot, cfg, args.data_dir, seed, eval_every=args.eval_every)
                    on, off = got[True], got[False]
                    rows.append({"bs": bs, "first": seed == 0, "eval": on.eval_seconds, "evals": len(on.curve) - 1,
                                 "train_on": on.train_seconds, "train_off": off.train_seconds,
                                 "same": on.weights_digest == off.weights_digest})
                    print(f"  batch {bs:>4} seed {seed}: {len(on.curve) - 1} evaluations in {on.eval_seconds:.2f} s, "
                          f"training {on.train_seconds:.2f} s (without: {off.train_seconds:.2f} s), "
                          f"same weights {rows[-1]['same']}", flush=True)
        finally:
            slot.close()
    print()
    at_smallest, lines = None, []
    for bs in args.batch_size:
        mine = [r for r in rows if r["bs"] == bs]
        steady = [r for r in mine if not r["first"]] or mine
        share = median_of(steady, lambda r: r["eval"] / r["train_off"])
        at_smallest = share if at_smallest is None else at_smallest
        first = next(r for r in mine if r["first"])
        lines.append([bs, f"{mine[0]['evals'] / args.epochs:.1f}", f"{median_of(mine, 'train_off') / args.epochs:.2f}",
                      f"{median_of(steady, 'eval') / args.epochs:.3f}", f"{100 * share:.1f}%",
                      f"{median_of(mine, lambda r: r['train_on'] / r['train_off']):.3f}", f"{first['eval']:.2f}",
                      all(r["same"] for r in mine)])
    print(table(["batch size", "evaluations / epoch", "training s / epoch (without)", "evaluating s / epoch",
                 "evaluating / training", "training with / without", "first of its shape: evaluating s",
                 "same weights"], lines))
    print(f"\nAt batch {args.batch_size[0]}: {100 * at_smallest:.1f}% (target at most {100 * TARGET:.0f}%: "
          f"{'met' if at_smallest <= TARGET else 'NOT met'}).")
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
