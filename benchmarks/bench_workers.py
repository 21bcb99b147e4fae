"""Benchmark `catsdogs sweep --workers`: the same 4-trial sweep with 1 worker and with 2.

On the same prepared synthetic data (64 px, 100 images per class by default: 60/20/20), a
sweep of 2 optimizers x 2 batch sizes x 1 seed, 2 epochs each, runs as `python -m catsdogs sweep`
into a fresh --out folder per run, once with each --workers value (alternating when repeated,
so a change in the machine's load hits both). It prints each run's wall time, the ratio, the
per-trial figures from the results store (a trial's wall and training seconds, images/s), and
what they say about the ratio.

With the local runner, one worker trains on all the cores (TensorFlow's default thread pools);
N workers each get cores // N intra-op threads and one inter-op thread (`worker.slot_env`). With
`--runner ray` the same split comes from the CPUs each Ray actor asks for, and every sweep starts
its own local Ray (about 10 s, counted in its wall time).

    python benchmarks/bench_workers.py                         # local runner, 1 vs 2 workers
    python benchmarks/bench_workers.py --runner ray --repeat 2
    python benchmarks/bench_workers.py --work /tmp/bw --keep   # keep the data and the outputs
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import alternate, median_of, table


def prepare_data(data_dir: Path, size: int, per_class: int) -> None:
    from catsdogs.data.prepare import prepare

    train = per_class * 6 // 10
    val = (per_class - train) // 2
    prepare(source="synthetic", data_dir=data_dir, per_class=per_class,
            split=(train, val, per_class - train - val), size=size, log=lambda *a: None, progress=False)


def run_sweep(data_dir: Path, out: Path, workers: int, epochs: int, runner: str) -> float:
    """One sweep in a fresh process; its wall time in seconds (start-up and Ray start included)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "catsdogs", "sweep", "--data-dir", str(data_dir), "--out", str(out),
           "--name", "bench", "--opt", "adam", "sgd", "--batch-size", "16", "32", "--seeds", "1",
           "--epochs", str(epochs), "--workers", str(workers), "--runner", runner]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray, not a cluster
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    (out / "sweep.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "sweep.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"the sweep with --workers {workers} failed (exit {proc.returncode}):\n"
                 f"{(proc.stdout + proc.stderr)[-3000:]}")
    return wall


def trial_stats(out: Path) -> dict:
    with sqlite3.connect(out / "results.sqlite") as db:
        rows = db.execute("SELECT status, wall_seconds, train_seconds, images_per_second FROM trials").fetchall()
    if len(rows) != 4 or {r[0] for r in rows} != {"done"}:
        sys.exit(f"expected 4 done trials in {out}, got {rows}")
    return {"wall": statistics.mean(r[1] for r in rows), "train": statistics.mean(r[2] for r in rows),
            "ips": statistics.mean(r[3] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=64, help="image side in pixels [64]")
    ap.add_argument("--per-class", type=int, default=100, help="images per class, split 60/20/20 [100]")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per trial [2]")
    ap.add_argument("--runner", choices=["local", "ray"], default="local", help="where the trials run [local]")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each --workers value [1]")
    ap.add_argument("--work", type=Path, default=None, help="folder for the data and outputs [a temp dir]")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-workers-"))
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "data"
    cores = os.cpu_count() or 1
    print(f"{cores} cores, runner {args.runner}; 4 trials (adam, sgd x batch 16, 32), {args.size} px, "
          f"{args.per_class} images/class, {args.epochs} epochs; data in {data_dir}")
    prepare_data(data_dir, args.size, args.per_class)

    def side(workers: int):
        def one(i: int) -> dict:
            out = work / f"out-w{workers}-{i}"
            load = os.getloadavg()[0]
            wall = run_sweep(data_dir, out, workers, args.epochs, args.runner)
            print(f"  --workers {workers}: {wall:6.1f} s   (load average before: {load:.1f})", flush=True)
            return {"sweep": wall, **trial_stats(out)}
        return one

    runs = alternate({1: side(1), 2: side(2)}, args.repeat, log=lambda line: None)  # A B A B
    t1, t2 = median_of(runs[1], "sweep"), median_of(runs[2], "sweep")
    s1 = {k: median_of(runs[1], k) for k in ("wall", "train", "ips")}
    s2 = {k: median_of(runs[2], k) for k in ("wall", "train", "ips")}
    threads2 = max(1, cores // 2)
    print()
    print(f"ratio of wall times (1 worker / 2 workers): {t1 / t2:.2f}x")
    print(table(("--workers", "threads each", "sweep wall s", "a trial's wall s", "its training s", "images/s"),
                [(1, cores, f"{t1:.1f}", f"{s1['wall']:.1f}", f"{s1['train']:.1f}", f"{s1['ips']:.0f}"),
                 (2, threads2, f"{t2:.1f}", f"{s2['wall']:.1f}", f"{s2['train']:.1f}", f"{s2['ips']:.0f}")]))
    print()
    print(explain(t1, t2, s1, s2, cores))
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def explain(t1: float, t2: float, s1: dict, s2: dict, cores: int) -> str:
    fixed = s1["wall"] - s1["train"]  # in the trial but not training: mostly one thread
    start_up = t1 / 4 - s1["wall"]  # per trial, outside run_trial: process start, imports, store
    thread_gain = s2["train"] / s1["train"] if s1["train"] else float("nan")
    lines = [
        "Why this ratio:",
        f"- Most of a trial here is not training: ~{fixed:.0f} s of its {s1['wall']:.0f} s go to "
        "importing TensorFlow, loading the images, building and tracing the model, validation and "
        f"test, and ~{max(start_up, 0):.0f} s more per trial outside it (starting its process, the "
        "sweep's own start-up and bookkeeping); that work is mostly "
        "single-threaded, so one worker leaves a core idle through it, and a second worker "
        "overlaps it with the other trial's.",
        f"- Training itself: {s1['train']:.1f} s per trial on {cores} threads alone against "
        f"{s2['train']:.1f} s on {max(1, cores // 2)} thread beside the other trainer: "
        + (f"the extra thread bought only {thread_gain:.2f}x. At this size the ops (small "
           "convolutions, a dense layer on a small batch) are too small to split well across "
           "threads, and a multi-threaded op waits for its slowest thread, which on a busy "
           "machine is often descheduled; two single-thread trainers keep both cores busy."
           if thread_gain < 1.7 else
           f"here the threads did scale ({thread_gain:.2f}x), so the gain of 2 workers comes "
           "from the overlapped fixed costs above, not from training."),
        "- What keeps it under 2x: the two trainers share memory bandwidth and caches, so each is "
        "slower than it would be alone (compare the per-trial seconds), the sweep ends when its "
        "last trial does, and this machine's cores are shared with other work (see the load "
        "averages: several runs of each setting and their medians are the fair comparison).",
    ]
    if t1 / t2 < 1:
        lines.append("- Here 2 workers were slower: the threads of one trainer did scale, or the "
                     "machine was busy; on a quiet machine, compare again.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
