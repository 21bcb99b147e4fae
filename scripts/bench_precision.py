"""What mixed precision does to speed and memory on this machine, side by side.

Profiles the article's model at a few batch sizes under float32 and mixed_bfloat16 (and,
with --fp16, mixed_float16), alternating the two in rounds so that both see the same machine
load, each probe in a fresh process. Prints per batch size the median images/s and peak memory
of each precision and their ratios.

    python scripts/bench_precision.py --data-dir data/beyond --batch-sizes 32 128 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from catsdogs.measure.profile import profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=Path("data"))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--fp16", action="store_true", help="also mixed_float16")
    args = ap.parse_args()
    precisions = ["float32", "mixed_bfloat16"] + (["mixed_float16"] if args.fp16 else [])
    runs: dict = {(p, b): [] for p in precisions for b in args.batch_sizes}
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            for p in precisions if r % 2 == 0 else reversed(precisions):
                rows = profile(f"{p}-{r}", args.batch_sizes, args.data_dir, Path(out), precision=p,
                               steps=args.steps, measure_peak=False, log=lambda *a: None)
                for row in rows:
                    runs[(p, row["batch_size"])].append(row)
    print(f"{'batch':>5} {'precision':>15} {'images/s':>10} {'peak MB':>9} {'speed x':>8} {'memory x':>9}")
    for b in args.batch_sizes:
        base = runs[("float32", b)]
        base_ips = statistics.median(r["images_per_second"] for r in base if r["status"] == "done")
        base_mem = statistics.median(r["peak_memory_mb"] for r in base if r["status"] == "done")
        for p in precisions:
            done = [r for r in runs[(p, b)] if r["status"] == "done"]
            if not done:
                print(f"{b:>5} {p:>15} {'(no run finished)':>20}")
                continue
            ips = statistics.median(r["images_per_second"] for r in done)
            mem = statistics.median(r["peak_memory_mb"] for r in done)
            print(f"{b:>5} {p:>15} {ips:>10.1f} {mem:>9.0f} {ips / base_ips:>8.2f} {mem / base_mem:>9.2f}")
    print(f"medians of {args.rounds} rounds, {args.steps} timed steps each; peak memory: "
          f"{done[0].get('memory_kind')}; device: {done[0].get('device')}")


if __name__ == "__main__":
    main()
