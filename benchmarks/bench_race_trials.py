"""Benchmark the race's kind of trial: what a trial trained to a target costs besides its training.

A race (`find-batch-size --race`) runs about 150 trials, each trained until a validation target
with its curve evaluated every 256 images, and on a GPU their time besides the training was
almost all of the race's (docs/gpu.md, 2026-11-28: 0.16-0.88 s a trial against 0.04-0.10 s of
training). This runs such trials as `catsdogs sweep` (SGD until val_loss 0.49, at most 12 epochs,
`--eval-every 256`, the batch sizes and rate given, seeds 0..N-1) with this checkout and with
`--old`, A B A B, each into a fresh store over one prepared data folder, and prints per batch size
the median over trials of wall seconds less training seconds, of the curve's evaluation seconds,
and the steps to the target on each side (which must agree: the trials train the same).

    python benchmarks/bench_race_trials.py --data-dir /tmp/b/data --old /tmp/catsdogs-old
    KERAS_BACKEND=jax python benchmarks/bench_race_trials.py --data-dir D --old OLD --batch-size 16 1200
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from harness import HERE, alternate, run_catsdogs, table

from catsdogs.store import Store, store_path


def sweep(checkout: Path, data: Path, out: Path, args) -> dict:
    """One sweep of the race's kind of trial; {(batch size, seed): its figures} from its store."""
    run_catsdogs(["sweep", "--data-dir", data, "--out", out, "--name", "race-trials", "--opt", "sgd",
                  "--batch-size", *args.batch_size, "--lr", args.lr, "--seeds", args.seeds,
                  "--until", "val_loss=0.49", "--max-epochs", 12, "--eval-every", 256], checkout)
    with Store(store_path(out), read_only=True) as store:
        rows = store.trials("race-trials")
    return {(r["config"]["batch_size"], r["config"]["seed"]): {
        "besides": r["wall_seconds"] - r["train_seconds"], "eval": r.get("eval_seconds") or 0.0,
        "steps": r.get("steps_to_target"), "reused": bool(r.get("step_reused"))} for r in rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (the critical plan's 64 px)")
    ap.add_argument("--old", type=Path, required=True, help="a checkout of the catsdogs to compare with")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[16, 256, 1200], help="[16 256 1200]")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD's rate for every trial [0.05]")
    ap.add_argument("--seeds", type=int, default=3, help="seeds a batch size, each run [3]")
    ap.add_argument("--repeats", type=int, default=2, help="runs a side, alternating [2]")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-race-trials-"))
    sides = {"new": HERE, "old": args.old.resolve()}
    found = alternate({s: (lambda r, s=s: sweep(sides[s], args.data_dir, work / f"{s}-{r}", args)) for s in sides},
                      args.repeats)
    rows = []
    for b in args.batch_size:
        med = {}
        for s in sides:
            trials = [t for run in found[s] for (size, _), t in run.items() if size == b and t["reused"]]
            med[s] = (statistics.median(t["besides"] for t in trials), statistics.median(t["eval"] for t in trials))
        same = all(new[k]["steps"] == old[k]["steps"] for new, old in zip(found["new"], found["old"], strict=True)
                   for k in new if k[0] == b and k in old)
        rows.append([b, f"{med['new'][0]:.3f}", f"{med['old'][0]:.3f}", f"{med['new'][0] / med['old'][0]:.2f}",
                     f"{med['new'][1]:.3f}", f"{med['old'][1]:.3f}", "yes" if same else "NO"])
    print(f"\n{os.environ.get('KERAS_BACKEND', 'tensorflow')}: per trial that reused its step, medians over "
          f"{args.repeats} runs x {args.seeds} seeds (seconds)")
    print(table(["batch", "besides training (new)", "(old)", "new/old", "evaluations (new)", "(old)",
                 "same steps to the target"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
