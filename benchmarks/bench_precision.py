"""What mixed precision does to speed and memory on this machine, side by side.

Profiles the article's model at a few batch sizes under float32 and mixed_bfloat16 (and,
with --fp16, mixed_float16), alternating the two in rounds so that both see the same machine
load, each probe in a fresh process. Prints per batch size the median images/s and peak memory
of each precision and their ratios.

    python benchmarks/bench_precision.py --data-dir data/beyond --batch-sizes 32 128 --rounds 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import alternate, median_of, table

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
    with tempfile.TemporaryDirectory() as out:
        def side(p: str):
            return lambda r: profile(f"{p}-{r}", args.batch_sizes, args.data_dir, Path(out), precision=p,
                                     steps=args.steps, measure_peak=False, log=lambda *a: None)
        rounds = alternate({p: side(p) for p in precisions}, args.rounds)
    runs = {(p, row["batch_size"]): [] for p in precisions for row in rounds[p][0]}
    for p in precisions:
        for rows in rounds[p]:
            for row in rows:
                runs[(p, row["batch_size"])].append(row)
    out_rows, last = [], None
    for b in args.batch_sizes:
        base = [r for r in runs[("float32", b)] if r["status"] == "done"]
        for p in precisions:
            done = [r for r in runs[(p, b)] if r["status"] == "done"]
            if not done or not base:
                out_rows.append((b, p, "(no run finished)", "", "", ""))
                continue
            last = done[0]
            ips, mem = median_of(done, "images_per_second"), median_of(done, "peak_memory_mb")
            out_rows.append((b, p, f"{ips:.1f}", f"{mem:.0f}", f"{ips / median_of(base, 'images_per_second'):.2f}",
                             f"{mem / median_of(base, 'peak_memory_mb'):.2f}"))
    print(table(("batch", "precision", "images/s", "peak MB", "speed x", "memory x"), out_rows))
    if last:
        print(f"medians of {args.rounds} rounds, {args.steps} timed steps each; peak memory: "
              f"{last.get('memory_kind')}; device: {last.get('device')}")


if __name__ == "__main__":
    main()
