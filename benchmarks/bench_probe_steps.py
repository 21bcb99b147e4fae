"""A probe's peak with one timed step against three, and the time the steps more cost: fresh workers.

find-batch-size decides "fits" by a probe's peak resident memory on the CPU, over its warm-up step
and its timed ones. Near the limit each step lasts seconds, so the fewer the better, if the peak
comes in the first. Each round runs the probe of `--batch-size` once with `--steps 1` and once with
3 timed steps, each in a fresh worker of find-batch-size's own (its prober, its environment, no
cap), in alternating order (A B, B A ...). Prints each run's peak and step times, then per side the
median peak and probe wall, and the peaks' median difference: probe_run.NEAR_LIMIT_STEPS and
FIRST_STEP_PEAK quote it, per backend.

    KERAS_BACKEND=jax python benchmarks/bench_probe_steps.py --data-dir /tmp/b/data --batch-size 900 --rounds 3
    KERAS_BACKEND=tensorflow python benchmarks/bench_probe_steps.py --data-dir /tmp/b/data --batch-size 760 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import table

from catsdogs.measure import prober as probers
from catsdogs.measure.search import DEFAULT_STEPS
from catsdogs.measure.settings import FindSettings
from catsdogs.messages import ProbeTask
from catsdogs.runtime import backends


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (catsdogs prepare)")
    ap.add_argument("--batch-size", type=int, default=900, help="the probe's batch size (near the limit)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each one probe a side")
    ap.add_argument("--opt", default="sgd", help="optimizer")
    args = ap.parse_args()
    settings = FindSettings(optimizer=args.opt)
    peaks: dict[int, list[float]] = {1: [], DEFAULT_STEPS: []}
    walls: dict[int, list[float]] = {1: [], DEFAULT_STEPS: []}
    rows = []
    with tempfile.TemporaryDirectory() as work, probers.Prober(Path(work), None, env=settings.environment()) as prober:
        for r in range(args.rounds):
            for steps in (1, DEFAULT_STEPS) if r % 2 == 0 else (DEFAULT_STEPS, 1):
                task = ProbeTask(args.batch_size, str(args.data_dir.resolve()), optimizer=args.opt, dataset="standard",
                                 precision="float32", steps=steps, warmup=1, min_seconds=settings.min_seconds)
                started = time.perf_counter()
                rec = prober.run(task, fresh=True, spare=False)
                wall = time.perf_counter() - started
                if rec.status != "done":
                    raise SystemExit(f"the probe of {args.batch_size} with {steps} steps ended {rec.status}: {rec.error}")
                peaks[steps].append(rec.peak_memory_mb)
                walls[steps].append(wall)
                rows.append((r, steps, f"{rec.peak_memory_mb:,.1f}", f"{wall:.2f}",
                             " ".join(f"{t:.3f}" for t in rec.step_times_s or [])))
                print(*rows[-1], flush=True)
    print(f"\n{backends.name()}, batch size {args.batch_size}, {args.rounds} rounds, fresh workers:")
    print(table(("round", "timed steps", "peak MiB", "probe s", "step times s"), rows))
    for steps in peaks:
        print(f"{steps} timed step{'s' if steps > 1 else ''}: median peak {statistics.median(peaks[steps]):,.1f} MiB "
              f"({min(peaks[steps]):,.1f}-{max(peaks[steps]):,.1f}), median probe {statistics.median(walls[steps]):.2f} s")
    more = statistics.median(peaks[DEFAULT_STEPS]) - statistics.median(peaks[1])
    print(f"{DEFAULT_STEPS} steps against 1: the median peak {more:+,.1f} MiB "
          f"({100 * more / statistics.median(peaks[1]):+.2f}%), the median probe "
          f"{statistics.median(walls[DEFAULT_STEPS]) - statistics.median(walls[1]):+.2f} s")


if __name__ == "__main__":
    main()
