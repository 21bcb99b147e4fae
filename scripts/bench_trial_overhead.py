"""What a trial costs besides its training, against another checkout: `reproduce --config quick`.

Runs the quick plan with this checkout and with `--old` (a `git worktree` of an earlier commit),
A B A B, each into a fresh --out over one data folder prepared beforehand, on each backend asked.
Per trial it reads the store: the trial's wall time in its worker (`wall_seconds`) less its
training (`train_seconds`), "the non-training time", and where it went: validation inside fit
(`fit_seconds` - `train_seconds`), the step's reset or build (`setup_seconds`), the wait for the
weights' digest (`digest_seconds`), and the rest (the test evaluation, the collapse diagnosis
before and after, the pipeline, bookkeeping). Prints the medians per side over the trials that
reused a compiled step (the first of each shape compiles, and is shown apart), their ratio, and
whether every trial's weights digest is the same on both sides.

    git worktree add /tmp/catsdogs-0.15.0 53f39ec
    python scripts/bench_trial_overhead.py --old /tmp/catsdogs-0.15.0 --repeats 3
    python scripts/bench_trial_overhead.py --old /tmp/catsdogs-0.15.0 --backends jax --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from bench_engine import HERE, plan_path, run

PARTS = ("validation", "setup", "digest wait", "rest")


def trials(store: Path) -> dict[tuple, dict]:
    """{(optimizer, batch size, data set, seed): the trial's clocks and digest} of a finished run."""
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    rows = db.execute("SELECT * FROM trials WHERE status = 'done'").fetchall()
    out = {}
    for r in rows:
        wall, train, fit = r["wall_seconds"], r["train_seconds"], r["fit_seconds"]
        setup, digest = r["setup_seconds"] or 0.0, r["digest_seconds"] or 0.0
        out[(r["optimizer"], r["batch_size"], r["dataset"], r["seed"])] = {
            "reused": bool(r["step_reused"]), "digest": r["weights_digest"], "non-training": wall - train,
            "validation": fit - train, "setup": setup, "digest wait": digest,
            "rest": wall - fit - setup - digest}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="a checkout of the catsdogs to compare with")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    data = work / "data"
    print(f"preparing the quick plan's data once in {data} ...", flush=True)
    run(HERE, plan_path(HERE, "quick"), data, work / "warm", [])
    sides = {"new": HERE, "old": args.old.resolve()}
    found: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.repeats):
        for backend in args.backends:
            os.environ["KERAS_BACKEND"] = backend
            for side, checkout in sides.items():
                out = work / f"{backend}-{side}-{r}"
                seconds = run(checkout, plan_path(checkout, "quick"), data, out, [])
                found.setdefault((backend, side), []).append(trials(out / "results.sqlite"))
                print(f"  round {r + 1}: {backend:>10} {side}: {seconds:5.1f} s", flush=True)
    print(f"\nPer trial, seconds (medians over {args.repeats} runs of the quick plan; trials that reused a step):")
    print(f"{'backend':>10} {'side':>4} {'non-training':>13} " + " ".join(f"{p:>12}" for p in PARTS)
          + f" {'first of a shape':>17}")
    for backend in args.backends:
        med = {}
        for side in sides:
            runs = found[(backend, side)]
            later = [t for run_ in runs for t in run_.values() if t["reused"]]
            first = [t for run_ in runs for t in run_.values() if not t["reused"]]
            med[side] = statistics.median(t["non-training"] for t in later)
            parts = " ".join(f"{statistics.median(t[p] for t in later):12.4f}" for p in PARTS)
            print(f"{backend:>10} {side:>4} {med[side]:13.4f} {parts} "
                  f"{statistics.median(t['non-training'] for t in first):17.4f}")
        same = [run_new[k]["digest"] == run_old[k]["digest"] for run_new, run_old in
                zip(found[(backend, "new")], found[(backend, "old")], strict=True) for k in run_new if k in run_old]
        print(f"{backend:>10}: new/old {med['new'] / med['old']:.2f} (target <= 0.5); weights digests the same "
              f"on both sides: {sum(same)} of {len(same)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
