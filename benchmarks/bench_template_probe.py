"""Benchmark a probe in a worker forked from a template (catsdogs.runtime.template) against one in
a fresh process: what it measures must not move, only the worker's start.

Each round runs, at every `--sizes` batch size, one probe in a fresh worker of each kind, the
kinds in turn (their order alternating from round to round), each worker started as
find-batch-size's prober starts a CPU probe's (its memory cap, no compilation cache, every
optional import made: `Prober`'s environment) and ended after its probe. Prints per size and kind
the medians of the worker's start (launch to ready), the resident memory before the model
(`baseline_rss_mb`) and the probe's peak (`peak_memory_mb`), and the forked kind's differences;
a template serves TensorFlow's workers since 0.26.0, JAX's since 0.45.0.

    KERAS_BACKEND=jax python benchmarks/bench_template_probe.py --data-dir /tmp/b/data
    KERAS_BACKEND=tensorflow python benchmarks/bench_template_probe.py --data-dir /tmp/b/data --sizes 1 256
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import table

from catsdogs.measure.prober import Prober
from catsdogs.messages import ProbeTask
from catsdogs.runtime import backends, template
from catsdogs.runtime.worker import MEMORY_CAP_ENV, Worker

KINDS = {"forked": {}, "fresh": {template.ENV: "0"}}


def probe(env: dict, size: int, data_dir: Path, work: Path) -> dict:
    """One probe of `size` in a worker of `env` started for it: its start, baseline and peak."""
    worker = Worker(work / f"w{size}.log", env)
    try:
        started = time.perf_counter()
        worker.start()
        start = time.perf_counter() - started
        kind = type(worker.proc).__name__
        record = worker.run(ProbeTask(size, str(data_dir.resolve()), "sgd", "standard", "float32", steps=3, warmup=1,
                                      min_seconds=0.3), memory_cap_bytes=int(env[MEMORY_CAP_ENV]))
    finally:
        worker.close()
    if record.status != "done":
        raise SystemExit(f"batch size {size}: {record.status}: {record.error}")
    return {"start": start, "kind": kind, "baseline": record.baseline_rss_mb, "peak": record.peak_memory_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data/beyond"), help="prepared data [data/beyond]")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 512], help="batch sizes [1 64 512]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds [3]")
    ap.add_argument("--memory-limit-mb", type=int, default=4096, help="the probes' cap, in MiB [4096]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        prober_env = Prober(Path(work), args.memory_limit_mb * 2**20)._env  # a CPU probe's worker's
        results: dict[tuple[str, int], list[dict]] = {}
        for r in range(args.rounds):
            for size in args.sizes:
                for kind in (KINDS if r % 2 == 0 else list(reversed(list(KINDS)))):
                    result = probe({**prober_env, **KINDS[kind]}, size, args.data_dir, Path(work))
                    results.setdefault((kind, size), []).append(result)
                    print(f"round {r + 1}, batch {size}, {kind} ({result['kind']}): start {result['start']:.2f} s, "
                          f"baseline {result['baseline']:.1f} MiB, peak {result['peak']:.1f} MiB", flush=True)
    rows = []
    for size in args.sizes:
        med = {kind: {k: statistics.median(x[k] for x in results[kind, size]) for k in ("start", "baseline", "peak")}
               for kind in KINDS}
        for kind in KINDS:
            rows.append([size, kind, f"{med[kind]['start']:.2f}", f"{med[kind]['baseline']:.1f}", f"{med[kind]['peak']:.1f}"])
        rows.append([size, "forked - fresh", f"{med['forked']['start'] - med['fresh']['start']:+.2f}",
                     f"{med['forked']['baseline'] - med['fresh']['baseline']:+.1f}",
                     f"{med['forked']['peak'] - med['fresh']['peak']:+.1f}"])
    print(f"\n{backends.name()}, {args.rounds} rounds, medians:\n")
    print(table(["batch", "worker", "start s", "baseline MiB", "peak MiB"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
