"""The whole test suite's time, two commits side by side: issue 45's measure of the test loop.

Each commit is checked out once into a git worktree of its own (in a temporary folder, removed
at the end), and its suite runs there as the README says (`python -m pytest`, that checkout's
catsdogs first on the path, its own pytest settings: two processes), the commits in turn (A B A B,
`--repeats` rounds), nothing else running. Each run's wall time, the CPU of the processes it
waited for (pytest's and everything they started and reaped: Ray's daemons are not among them)
and its last line are printed; then each side's median and the ratio of the medians.

    python benchmarks/bench_suite.py                          # 0.6.0 (bf83e8c) against HEAD, one round
    python benchmarks/bench_suite.py --base bf83e8c --head main --repeats 2

A run takes 5-7 minutes on two cores. Commits, not the working tree: commit what is measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, alternate, cpu_seconds, spread, table

BASE = "bf83e8c"  # catsdogs 0.6.0: the reference


def checkout(rev: str, into: Path) -> Path:
    """`rev` checked out, detached, into a new worktree under `into`."""
    path = into / rev.replace("/", "_")
    made = subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "--quiet", str(path), rev],
                          capture_output=True, text=True)
    if made.returncode != 0:
        said = (made.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
        raise SystemExit(f"bench_suite.py: cannot check out {rev!r}: {said}")
    return path


def run_suite(tree: Path) -> dict:
    """One run of `tree`'s whole suite: wall and CPU seconds, and pytest's last line."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cpu, started = cpu_seconds(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-2000:])
        raise SystemExit(f"{tree.name}: the suite failed (exit {proc.returncode}): {last}")
    print(f"    {tree.name}: {wall:.1f} s, {cpu:.0f} s of CPU: {last}", flush=True)
    return {"wall": wall, "cpu": cpu, "last": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=BASE, help="the reference commit (default: 0.6.0, %(default)s)")
    parser.add_argument("--head", default="HEAD", help="the commit measured against it (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of A B (default: %(default)s)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    with tempfile.TemporaryDirectory(prefix="catsdogs-suites-") as tmp:
        trees = {}
        try:
            for rev in (args.base, args.head):
                trees[rev] = checkout(rev, Path(tmp))
            results = alternate({rev: (lambda turn, t=tree: run_suite(t)) for rev, tree in trees.items()},
                                args.repeats)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(tree)], check=False)
    base = spread(r["wall"] for r in results[args.base])[0]
    rows = []
    for rev, runs in results.items():
        wall, least, most = spread(r["wall"] for r in runs)
        cpu = spread(r["cpu"] for r in runs)[0]
        rows.append((rev, len(runs), f"{wall:.1f} ({least:.1f}-{most:.1f})", f"{cpu:.0f}", f"{wall / base:.2f}",
                     runs[-1]["last"]))
    print(table(["commit", "runs", "wall s, median (range)", "CPU s", "x base", "pytest's last line"], rows))


if __name__ == "__main__":
    main()
