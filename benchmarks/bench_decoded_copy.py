"""A find-batch-size probe's data in a fresh worker: the JPEGs decoded, or the parent's decoded copy read.

The prepared data set decoded from its JPEGs (loading.load_dataset, what each fresh worker did up
to 0.43.0) against read from the parent's decoded copy (loading.save_decoded, load_decoded:
0.44.0's probe_run.DecodedCopy), alternating (A B, B A ...), `--rounds` times each, in this
process (no framework): the medians and their ranges, and the copy's size.

    python benchmarks/bench_decoded_copy.py --data-dir /tmp/b/data --rounds 5
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


if __name__ == "__main__":
    main()
