"""Benchmark the training step as `catsdogs profile` times it: this checkout against an older one.

Runs `catsdogs profile --batch-size SIZES` on prepared data with each checkout in turn (A B A B,
`--repeats` rounds), each in a fresh --out, and prints per batch size the median step time of
each side and their ratio, and per side the CPU seconds its commands spent in the kernel and the
minor page faults they took (the command and its workers, from the children's resource usage).
That second pair says where a CPU step's time went when the step itself moved: JAX's workers on
the CPU before 0.36.0 took millions of page faults a profile, glibc mapping and unmapping every
large buffer XLA:CPU allocates afresh at each step (catsdogs.runtime.backends.jax_process).

    git worktree add /tmp/old-catsdogs 9fcf573
    KERAS_BACKEND=jax python benchmarks/bench_step.py --data-dir data/beyond --old /tmp/old-catsdogs
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import tempfile
from pathlib import Path

from harness import HERE, alternate_checkouts, run_catsdogs, table


def profile_once(checkout: Path, data_dir: Path, sizes: list[int], steps: int) -> dict:
    """One `catsdogs profile` from `checkout`: each size's median step (s), the kernel's CPU
    seconds and the minor page faults of the command and everything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as out:
        run_catsdogs(["profile", "--data-dir", data_dir.resolve(), "--batch-size", *sizes, "--steps", steps,
                      "--out", out, "--name", "bench"], checkout)
        with open(Path(out) / "bench" / "profile.csv") as f:
            rows = list(csv.DictReader(f))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"step": {int(r["batch_size"]): float(r["step_time_median_s"]) for r in rows if r["status"] == "done"},
            "sys": after.ru_stime - before.ru_stime, "faults": after.ru_minflt - before.ru_minflt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--old", type=Path, required=True, help="the older checkout (a git worktree)")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[8, 32, 256], help="[8 32 256]")
    ap.add_argument("--steps", type=int, default=10, help="timed steps a batch size [10]")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, the sides alternating [3]")
    args = ap.parse_args()
    if not (args.old / "catsdogs").is_dir():
        raise SystemExit(f"--old {args.old}: no catsdogs checkout there")
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    sides = {"new": HERE, "old": args.old.resolve()}
    got = alternate_checkouts(sides, backend, lambda c: profile_once(c, args.data_dir, args.batch_size, args.steps),
                              args.repeats)
    rows = []
    for bs in args.batch_size:
        new, old = (statistics.median(r["step"][bs] for r in got[s] if bs in r["step"]) for s in ("new", "old"))
        rows.append([bs, f"{new * 1000:.1f}", f"{old * 1000:.1f}", f"{new / old:.2f}x"])
    print(f"\n{backend}, `catsdogs profile`, {args.steps} timed steps a size, medians of {args.repeats} rounds\n")
    print(table(["batch size", "new ms/step", "old ms/step", "new/old"], rows))
    for side in sides:
        print(f"{side}: kernel CPU {statistics.median(r['sys'] for r in got[side]):.1f} s, "
              f"minor page faults {statistics.median(r['faults'] for r in got[side]):,.0f} a command (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
