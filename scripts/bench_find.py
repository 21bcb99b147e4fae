"""Benchmark find-batch-size's whole answer: noise scale, prediction, memory search, speed and the
recommendation, end to end, as a user runs it.

Runs `catsdogs find-batch-size --memory-limit CAP` on prepared data `--runs` times per backend,
the backends alternating (TensorFlow, JAX, TensorFlow, ...) so that a busy machine weighs on
both alike, each run a fresh command in a fresh --out. Prints each run's wall time with where it
went (the JSON's "seconds": the noise scale's short runs, the memory model, the probes with their
workers' starts), its probes and how many ran in a fresh worker, and its answer; then the median
per backend against the target (the issue's: at most 60 s at 64 px under 2 GiB on this CPU, the
machine otherwise idle).

    python scripts/bench_find.py --data-dir data/beyond
    python scripts/bench_find.py --data-dir data/beyond --backends tensorflow --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 60.0  # seconds, the whole answer


def run_once(backend: str, data_dir: Path, cap: str, seed: int, out: Path) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "catsdogs", "find-batch-size", "--data-dir", str(data_dir),
                           "--memory-limit", cap, "--out", str(out), "--name", "bench", "--seed", str(seed)],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"find-batch-size failed on {backend} (exit {proc.returncode}): {proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    summary = json.loads((out / "bench" / "find_batch_size.json").read_text())
    return {"backend": backend, "wall": wall, **summary["seconds"], "probes_n": len(summary["probes"]),
            "fresh": sum(p.get("worker") in ("fresh", "retried") for p in summary["probes"]),
            "largest": summary["largest_fitting"], "recommended": (summary.get("recommendation") or {}).get("batch_size")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--memory-limit", default="2GiB", help="[2GiB]")
    ap.add_argument("--runs", type=int, default=3, help="runs per backend [3]")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], help="[tensorflow jax]")
    ap.add_argument("--seed", type=int, default=0, help="find-batch-size's --seed [0]")
    args = ap.parse_args()
    rows = []
    print(f"{'backend':>10} {'wall':>6} {'noise':>6} {'model':>6} {'probes':>7} {'n':>3} {'fresh':>5} "
          f"{'largest':>7} {'rec':>5}")
    for _ in range(args.runs):
        for backend in args.backends:
            with tempfile.TemporaryDirectory() as out:
                r = run_once(backend, args.data_dir, args.memory_limit, args.seed, Path(out))
            rows.append(r)
            print(f"{backend:>10} {r['wall']:>6.1f} {r['noise_scale'] or 0:>6.1f} {r['prediction']:>6.1f} "
                  f"{r['probes']:>7.1f} {r['probes_n']:>3} {r['fresh']:>5} {r['largest']:>7} {r['recommended']!s:>5}",
                  flush=True)
    print()
    for backend in args.backends:
        walls = [r["wall"] for r in rows if r["backend"] == backend]
        median = statistics.median(walls)
        print(f"{backend}: median {median:.1f} s over {len(walls)} runs (target <= {TARGET:.0f} s): "
              f"{'met' if median <= TARGET else 'missed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
