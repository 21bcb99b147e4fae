"""Benchmark a worker's start: from its launch to its `ready` (the framework imported and set up),
this checkout against an older one, alternating.

Each round starts `--per-round` workers one after another with each checkout's own catsdogs
(`Worker.start()`, on PYTHONPATH), per backend, and closes each before the next. Prints every
start and, per backend and side, the median with its spread and the ratio of the medians.
`--probe` starts them as the CPU's prober does (CATSDOGS_SKIP_OPTIONAL_IMPORTS=0: a probe's
worker imports what its framework tries, docs/usage.md).

    git worktree add /tmp/old-catsdogs 72e0589
    python benchmarks/bench_worker_start.py --old /tmp/old-catsdogs
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import HERE, alternate_checkouts, run_snippet, spread, table

STARTS = """
import json, sys, tempfile, time
from pathlib import Path
from catsdogs.runtime.worker import Worker
times = []
with tempfile.TemporaryDirectory() as work:
    for i in range(int(sys.argv[1])):
        worker = Worker(Path(work) / f"w{i}.log", {})
        started = time.perf_counter()
        worker.start()
        times.append(time.perf_counter() - started)
        worker.close()
print(json.dumps(times))
"""


def starts(checkout: Path, backend: str, n: int, probe: bool) -> list[float]:
    return run_snippet(STARTS, [n], checkout, backend, {"CATSDOGS_SKIP_OPTIONAL_IMPORTS": "0"} if probe else None,
                       what="the workers' starts")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="an older checkout (a git worktree)")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], help="[tensorflow jax]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the sides alternating in each [3]")
    ap.add_argument("--per-round", type=int, default=3, help="workers started one after another a round [3]")
    ap.add_argument("--probe", action="store_true", help="as the CPU's prober starts them")
    args = ap.parse_args()
    sides = {"new": HERE, "old": args.old.resolve()}
    rows = []
    for backend in args.backends:
        results = alternate_checkouts(sides, backend, lambda c, b=backend: starts(c, b, args.per_round, args.probe),
                                      args.rounds)
        medians = {}
        for side, runs in results.items():
            times = [t for run in runs for t in run]
            print(f"{backend} {side}: " + " ".join(f"{t:.2f}" for t in times))
            medians[side], low, high = spread(times)
            rows.append([backend, side, len(times), f"{medians[side]:.2f}", f"{low:.2f}-{high:.2f}"])
        rows.append([backend, "new/old", "", f"{medians['new'] / medians['old']:.2f}", ""])
    print()
    print(table(["backend", "side", "starts", "median s", "spread"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
