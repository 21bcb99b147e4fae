"""Benchmark find-batch-size's whole answer: noise scale, prediction, memory search, speed and the
recommendation, end to end, as a user runs it.

Runs `catsdogs find-batch-size --memory-limit CAP` on prepared data once per `--seeds` value
per backend, the backends alternating (TensorFlow, JAX, TensorFlow, ...) so that a busy machine
weighs on both alike, each run a fresh command in a fresh --out. Prints each run's wall time and
CPU time (the machine's busy seconds meanwhile, every core: `machine_cpu_seconds`; on two cores the
wall time's floor is half of it) with where it went (the JSON's "seconds": the noise scale's short runs, the memory model, the probes
with their workers' starts), its probes and how many ran in a fresh worker, and its answer: the
largest that fits, the noise scale and whether it was resolved, the recommendation. Then per
backend the median time against the target (at most 60 s at 64 px under 2 GiB on this CPU, the
machine otherwise idle) and how far apart the recommendations of the runs whose noise scale was
resolved lie (the target: within a factor of 2).

With `--old CHECKOUT` (a `git worktree` of an earlier version), each run of this checkout
alternates with the same run of the old one (same backend, seed and options), and the summary
adds each side's median and the ratios pair by pair.

    python benchmarks/bench_find.py --data-dir data/beyond
    python benchmarks/bench_find.py --data-dir data/beyond --backends tensorflow --seeds 0
    git worktree add /tmp/old-catsdogs 72e0589
    python benchmarks/bench_find.py --data-dir data/beyond --backends tensorflow --opt sgd --seeds 0 1 2 --old /tmp/old-catsdogs
    python benchmarks/bench_find.py --backends tensorflow --memory-limit 1GiB --old /tmp/old-catsdogs \
        --extra "--model small.keras --data pics --max 16 --no-noise-scale"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, alternate

TARGET = 60.0  # seconds, the whole answer


def machine_cpu_seconds() -> float:
    """The seconds every core of this machine has been busy (user, nice, system, interrupts; not
    idle, waiting on I/O or stolen), from /proc/stat. A run's workers start from a spawner and a
    template that nothing waits for, so no rusage holds their time: the machine's does (with
    whatever else runs, which these benchmarks want to be nothing)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields[i] for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


def run_once(backend: str, data_dir: Path, cap: str, seed: int, out: Path, opt: list[str], checkout: Path = HERE) -> dict:
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(checkout)}
    started, cpu = time.perf_counter(), machine_cpu_seconds()
    proc = subprocess.run([sys.executable, "-m", "catsdogs", "find-batch-size", "--data-dir", str(data_dir.resolve()),
                           "--memory-limit", cap, "--out", str(out), "--name", "bench", "--seed", str(seed), *opt],
                          env=env, capture_output=True, text=True, cwd=checkout)
    wall = time.perf_counter() - started
    cpu = machine_cpu_seconds() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"find-batch-size failed on {backend} (exit {proc.returncode}): {proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    summary = json.loads((out / "bench" / "find_batch_size.json").read_text())
    rec, noise = summary.get("recommendation") or {}, summary.get("noise_scale") or {}
    return {"backend": backend, "seed": seed, "wall": wall, "cpu": cpu, **summary["seconds"], "probes_n": len(summary["probes"]),
            "fresh": sum(p.get("worker") in ("fresh", "retried") for p in summary["probes"]),
            "largest": summary["largest_fitting"], "recommended": rec.get("batch_size"),
            "resolved": rec.get("statistics") == "resolved", "b_simple": noise.get("b_simple"),
            "low": noise.get("low"), "high": noise.get("high")}


def noise_text(r: dict) -> str:
    """B_simple and its interval as the command prints it: "25 (13-425)", "158 (28-inf)", "above 40"."""
    if r["b_simple"] is None:
        return f"above {r['low'] or 0:.0f}"
    high = "inf" if r["high"] is None else f"{r['high']:.0f}"
    return f"{r['b_simple']:.0f} ({r['low'] or 0:.0f}-{high})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--memory-limit", default="2GiB", help="[2GiB]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 2, 4],
                    help="find-batch-size's --seed, one run each per backend [0 2 4]")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], help="[tensorflow jax]")
    ap.add_argument("--opt", choices=["sgd", "adam"], help="find-batch-size's --opt [its default]")
    ap.add_argument("--old", type=Path, help="an older checkout, each run alternating with the same run of it")
    ap.add_argument("--extra", default="", help='more find-batch-size options, quoted: like "--model PATH.keras '
                                                '--data DIR --max 16 --no-noise-scale" (a user\'s model) [none]')
    args = ap.parse_args()
    try:
        extra = shlex.split(args.extra)
    except ValueError as e:  # an unclosed quote
        ap.error(f"--extra: {e}")
    opt = (["--opt", args.opt] if args.opt else []) + extra
    sides = {"new": HERE, **({"old": args.old.resolve()} if args.old else {})}
    rows = []
    print(f"{'side':>4} {'backend':>10} {'seed':>4} {'wall':>6} {'cpu':>6} {'noise':>6} {'model':>6} {'probes':>7} {'n':>3} "
          f"{'fresh':>5} {'largest':>7}  {'B_simple (95%)':<18} {'rec':>5}")
    def one(side: str, backend: str, turn: int) -> dict:
        seed = args.seeds[turn]
        with tempfile.TemporaryDirectory() as out:
            r = {"side": side, **run_once(backend, args.data_dir, args.memory_limit, seed, Path(out), opt, sides[side])}
        rows.append(r)
        print(f"{side:>4} {backend:>10} {seed:>4} {r['wall']:>6.1f} {r['cpu']:>6.1f} {r['noise_scale'] or 0:>6.1f} "
              f"{r['prediction']:>6.1f} {r['probes']:>7.1f} {r['probes_n']:>3} {r['fresh']:>5} {r['largest']:>7}  "
              f"{noise_text(r):<18} {r['recommended']!s:>5}{'' if r['resolved'] else ' (unresolved)'}", flush=True)
        return r

    # the backends alternating, seed after seed; with --old each run beside the old one's
    alternate({f"{side} {b}": (lambda turn, b=b, side=side: one(side, b, turn)) for b in args.backends for side in sides},
              len(args.seeds), log=lambda line: None)
    print()
    if args.old:
        for backend in args.backends:
            new, old = ([r["wall"] for r in rows if r["backend"] == backend and r["side"] == side] for side in ("new", "old"))
            ratios = [n / o for n, o in zip(new, old, strict=True)]
            print(f"{backend}: this checkout against {args.old}: medians {statistics.median(new):.1f} against "
                  f"{statistics.median(old):.1f} s; pair by pair " + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" (median {statistics.median(ratios):.2f})")
    for backend in args.backends:
        mine = [r for r in rows if r["backend"] == backend and r["side"] == "new"]
        median = statistics.median(r["wall"] for r in mine)
        resolved = [r["recommended"] for r in mine if r["resolved"] and r["recommended"]]
        apart = max(resolved) / min(resolved) if len(resolved) > 1 else None
        print(f"{backend}: median {median:.1f} s over {len(mine)} runs (target <= {TARGET:.0f} s): "
              f"{'met' if median <= TARGET else 'missed'}; recommendations of the {len(resolved)} resolved runs "
              f"{resolved}: " + ("fewer than two, not judged" if apart is None else
                                 f"a factor {apart:.1f} apart ({'met' if apart <= 2 else 'missed'}, at most 2)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
