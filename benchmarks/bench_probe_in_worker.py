"""Benchmark a probe in a reused worker, as find-batch-size's way up runs them: this checkout against
an older one, alternating.

Each round starts one worker per side as the CPU's prober does (CATSDOGS_SKIP_OPTIONAL_IMPORTS=0,
each checkout's own catsdogs on PYTHONPATH) and hands it the probes `--sizes` in turn (the
article's model, SGD, one warm-up step, then at least 3 steps timed for at least 0.3 s), timing
each from the parent's hand-over to its record. Prints per size and side the median wall with its
spread, the median of the timed steps alone (what the probe measures, which should not move), and
the ratio of the medians; the first size of each worker (its data loaded, its first compilation)
is shown apart.

    git worktree add /tmp/old-catsdogs fcc96f3
    python benchmarks/bench_probe_in_worker.py --data-dir data/beyond --old /tmp/old-catsdogs
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import HERE, alternate_checkouts, run_snippet, spread, table

PROBES = """
import json, sys, tempfile, time
from pathlib import Path
from catsdogs.messages import ProbeTask
from catsdogs.runtime.worker import Worker
rows = []
with tempfile.TemporaryDirectory() as work:
    worker = Worker(Path(work) / "w.log", {})
    worker.start()
    for b in map(int, sys.argv[2:]):
        task = ProbeTask(b, sys.argv[1], "sgd", "standard", "float32", 3, 1, min_seconds=0.3)
        started = time.perf_counter()
        record = worker.run(task)
        if record.status != "done":
            raise SystemExit(f"batch size {b}: {record.status}: {record.error}")
        rows.append({"batch_size": b, "wall": time.perf_counter() - started, "timed": record.timed_seconds})
    worker.close()
print(json.dumps(rows))
"""


def probes(checkout: Path, backend: str, data_dir: Path, sizes: list[int]) -> list[dict]:
    return run_snippet(PROBES, [data_dir.resolve(), *sizes], checkout, backend,
                       {"CATSDOGS_SKIP_OPTIONAL_IMPORTS": "0"}, what="the probes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--old", type=Path, required=True, help="an older checkout (a git worktree)")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], help="[tensorflow jax]")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="[8 16 32 64 128]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, the sides alternating in each [3]")
    args = ap.parse_args()
    sides = {"new": HERE, "old": args.old.resolve()}
    rows = []
    for backend in args.backends:
        results = alternate_checkouts(sides, backend, lambda c, b=backend: probes(c, b, args.data_dir, args.sizes),
                                      args.rounds)
        for i, b in enumerate(args.sizes):
            medians = {}
            for side, runs in results.items():
                walls = [run[i]["wall"] for run in runs]
                medians[side], low, high = spread(walls)
                timed, _, _ = spread(run[i]["timed"] for run in runs)
                rows.append([backend, f"{b}{' (first)' if i == 0 else ''}", side, f"{medians[side]:.2f}",
                             f"{low:.2f}-{high:.2f}", f"{timed:.2f}"])
            rows.append([backend, b, "new/old", f"{medians['new'] / medians['old']:.2f}", "", ""])
    print()
    print(table(["backend", "batch", "side", "median wall s", "spread", "timed s"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
