"""A find-batch-size probe's data in a fresh worker: the JPEGs decoded, or the parent's decoded copy read.

The prepared data set decoded from its JPEGs (loading.load_dataset, what each fresh worker did up
to 0.43.0) against read from the parent's decoded copy (loading.save_decoded, load_decoded:
0.44.0's probe_run.DecodedCopy), alternating (A B, B A ...), `--rounds` times each, in this
process (no framework): the medians and their ranges, and the copy's size. With `--workers N`,
then what a fresh worker holds either way: N rounds of a probe at `--batch-size` in a fresh worker
of find-batch-size's prober (its environment, no cap), decoding and reading in turn: the resident
set before the model (`baseline_rss_mb`: the runtime and the data) and the probe's peak, medians.
A probe's peak stands for a training process's, which decodes (a sweep's trial): this says what
reading the copy leaves out.

    python benchmarks/bench_decoded_copy.py --data-dir /tmp/b/data --rounds 5
    KERAS_BACKEND=jax python benchmarks/bench_decoded_copy.py --data-dir /tmp/b/data --rounds 5 --workers 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from catsdogs.data import loading
from catsdogs.manifest import require_prepared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (catsdogs prepare)")
    ap.add_argument("--dataset", default="standard", help="standard or augmented")
    ap.add_argument("--rounds", type=int, default=5, help="timings of each")
    ap.add_argument("--workers", type=int, default=0, help="rounds of fresh workers' probes, each way (0: none)")
    ap.add_argument("--batch-size", type=int, default=64, help="the workers' probe")
    args = ap.parse_args()
    fingerprint = require_prepared(args.data_dir)["fingerprint"][args.dataset]
    seconds: dict[str, list[float]] = {"decoded": [], "read": []}
    with tempfile.TemporaryDirectory() as work:
        copy = loading.save_decoded(loading.load_dataset(args.data_dir, args.dataset), fingerprint,
                                    Path(work) / "copy.decoded.npz")
        for r in range(args.rounds):
            for side in ("decoded", "read") if r % 2 == 0 else ("read", "decoded"):
                started = time.perf_counter()
                if side == "decoded":
                    loading.load_dataset(args.data_dir, args.dataset)
                else:
                    loading.load_decoded(copy)
                seconds[side].append(time.perf_counter() - started)
        size_mb = copy.stat().st_size / 2**20
    for side, values in seconds.items():
        print(f"{side:8s} {statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f}), {args.rounds} times")
    print(f"the copy {size_mb:.1f} MiB; read against decoded: "
          f"{statistics.median(seconds['read']) / statistics.median(seconds['decoded']):.3f}x")
    if args.workers:
        workers(args, fingerprint)


def workers(args, fingerprint: str) -> None:
    """Fresh workers' resident sets and peaks, decoding or reading the copy, in turn."""
    from catsdogs.measure import prober as probers
    from catsdogs.measure.settings import FindSettings
    from catsdogs.messages import ProbeTask
    from catsdogs.runtime import backends

    settings = FindSettings(optimizer="sgd")
    held: dict[str, list[tuple[float, float]]] = {"decoded": [], "read": []}
    with tempfile.TemporaryDirectory() as work, probers.Prober(Path(work), None, env=settings.environment()) as prober:
        copy = loading.save_decoded(loading.load_dataset(args.data_dir, args.dataset), fingerprint,
                                    Path(work) / "copy.decoded.npz")
        for r in range(args.workers):
            for side in ("decoded", "read") if r % 2 == 0 else ("read", "decoded"):
                task = ProbeTask(args.batch_size, str(args.data_dir.resolve()), optimizer="sgd", dataset=args.dataset,
                                 precision="float32", steps=3, warmup=1, min_seconds=settings.min_seconds,
                                 decoded=str(copy) if side == "read" else None)
                rec = prober.run(task, fresh=True, spare=False)
                if rec.status != "done":
                    raise SystemExit(f"the probe ended {rec.status}: {rec.error}")
                held[side].append((rec.baseline_rss_mb, rec.peak_memory_mb))
                print(f"{side:8s} before the model {rec.baseline_rss_mb:,.1f} MiB, peak {rec.peak_memory_mb:,.1f} MiB",
                      flush=True)
    med = {side: (statistics.median(b for b, _ in rows), statistics.median(p for _, p in rows)) for side, rows in held.items()}
    for side, (base, peak) in med.items():
        print(f"{backends.name()} {side:8s}: before the model {base:,.1f} MiB, peak {peak:,.1f} MiB (medians of {args.workers})")
    print(f"reading the copy against decoding: before the model {med['read'][0] - med['decoded'][0]:+,.1f} MiB, "
          f"the peak {med['read'][1] - med['decoded'][1]:+,.1f} MiB")


if __name__ == "__main__":
    main()
