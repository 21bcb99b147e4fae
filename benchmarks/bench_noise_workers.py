"""Benchmark find-batch-size's noise scale with its short runs one at a time against several at
once (catsdogs.measure.noise_run.noise_workers), alternating.

Each round measures the noise scale on prepared data as find-batch-size does
(`measure_noise_scale`: the rate test's three runs of seed --seed, then the three seeds left at the
rate chosen, 2 epochs each at batch size 32), once with one worker and once with --workers, the
order alternating from round to round, each in fresh workers (one worker started first, so that
TensorFlow's template imports in neither side's time). Prints each side's wall time (the
workers' starts included), their medians and ratio, and whether the answers agree: the rate
test's losses, the rate chosen and the seeds that trained to the last bit (the runs train as they
would alone, so they must), B_simple and its parts within a relative 1e-6 (TensorFlow's
measurement moves in its eighth digit from one run to the next on either side: the largest
difference within a side and across them is printed).

    KERAS_BACKEND=jax python benchmarks/bench_noise_workers.py --data-dir data/beyond
    python benchmarks/bench_noise_workers.py --data-dir data/beyond --opt adam --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import table

from catsdogs.manifest import require_prepared
from catsdogs.measure import noise_run
from catsdogs.measure.settings import FindSettings
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker


def measure(data_dir: Path, manifest: dict, settings: FindSettings, workers: int) -> tuple[float, dict]:
    """The noise scale with `workers` short runs at once: (wall seconds, what find_batch_size.json keeps)."""
    noise_run.noise_workers = lambda user, n=workers: n
    with tempfile.TemporaryDirectory() as work:
        started = time.perf_counter()
        run = noise_run.measure_noise_scale(data_dir, manifest, settings, Path(work), None, lambda line: None)
        seconds = time.perf_counter() - started
    if run is None:
        raise SystemExit(f"the noise scale was not measured with {workers} worker(s)")
    return seconds, run.as_json()


ESTIMATE = ("b_simple", "low", "high", "gradient_sq", "trace")


def answer(saved: dict) -> tuple:
    """What must not move with the workers, to the last bit: the rate test's losses, the rate
    chosen, the seeds that trained."""
    test = saved.get("rate_test") or {}
    return tuple(test.get("losses") or ()), test.get("chosen"), saved["lr"], tuple(saved["trained_seeds"])


def apart(a: dict, b: dict) -> float:
    """The largest relative difference between two runs' estimates (B_simple and its parts)."""
    return max((abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k])) for k in ESTIMATE
                if a[k] is not None and b[k] is not None and a[k] != b[k]), default=0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--opt", choices=["sgd", "adam"], default="sgd", help="the optimizer [sgd]")
    ap.add_argument("--seed", type=int, default=0, help="the noise scale's first seed [0]")
    ap.add_argument("--workers", type=int, default=noise_run.NOISE_WORKERS,
                    help=f"short runs at once on the other side [{noise_run.NOISE_WORKERS}]")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each side once a round [2]")
    args = ap.parse_args()
    manifest = require_prepared(args.data_dir)
    settings = FindSettings(optimizer=args.opt, seed=args.seed)
    with tempfile.TemporaryDirectory() as work:  # TensorFlow's template imports now, in no side's time
        first = Worker(Path(work) / "first.log")
        first.start()
        first.close()
    sides = {1: [], args.workers: []}
    answers, estimates = {}, {}
    for r in range(args.rounds):
        for workers in (sides if r % 2 == 0 else reversed(list(sides))):
            seconds, saved = measure(args.data_dir, manifest, settings, workers)
            sides[workers].append(seconds)
            answers.setdefault(workers, []).append(answer(saved))
            estimates.setdefault(workers, []).append(saved)
            print(f"round {r + 1}: {workers} at once: {seconds:.1f} s, B_simple {saved['b_simple']:.2f} at "
                  f"lr {saved['lr']:g}", flush=True)
    one, many = statistics.median(sides[1]), statistics.median(sides[args.workers])
    within = max((apart(a, b) for runs in estimates.values() for a in runs for b in runs), default=0.0)
    across = max((apart(a, b) for a in estimates[1] for b in estimates[args.workers]), default=0.0)
    same = len({a for runs in answers.values() for a in runs}) == 1 and across <= 1e-6
    print(f"\n{backends.name()}, {args.opt}, seed {args.seed}, {args.rounds} rounds:\n")
    print(table(["short runs at once", "seconds", "median"],
                [[w, ", ".join(f"{s:.1f}" for s in sides[w]), f"{statistics.median(sides[w]):.1f}"] for w in sides]))
    print(f"\n{args.workers} at once against one: {many / one:.2f}x; the same losses, rate and seeds in every round, "
          f"the estimates apart by at most {across:.1e} across the sides and {within:.1e} within one: "
          f"{'the same answer' if same else 'NOT the same answer'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
