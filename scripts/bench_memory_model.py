"""How well does the analytic memory model predict the largest batch size that fits?

For each memory cap, runs `find_batch_size` (binary search, every probe a fresh child under the
cap) on the article's model at the size the data was prepared at, and prints the measured
largest batch size beside the one the model predicts (its runtime baseline calibrated by the
batch-size-1 probe), and how far apart they are. Target: within 15%.

    catsdogs prepare --source synthetic --data-dir /tmp/pdata200 --per-class 300 --split 200,50,50
    python scripts/bench_memory_model.py --data-dir /tmp/pdata200 --caps 3GiB 4GiB 6GiB

On the CPU the cap is on each probe's peak resident memory (see catsdogs.measure.profile), so the
caps must leave room above the runtime's own ~1-2 GiB; on a GPU it is a logical device's
memory limit. Takes a few minutes per cap on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from catsdogs.measure.find_batch_size import find_batch_size
from catsdogs.measure.profile import format_bytes, parse_memory

TARGET_PERCENT = 15.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--caps", nargs="+", default=["3GiB", "4GiB", "6GiB"])
    ap.add_argument("--opt", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--start", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--resolution", type=int, default=None)
    ap.add_argument("--out", type=Path, default=Path("outputs/bench_memory_model"))
    ap.add_argument("--verbose", action="store_true", help="Print every probe.")
    args = ap.parse_args(argv)

    rows = []
    for text in args.caps:
        cap = parse_memory(text)
        t0 = time.time()
        log = print if args.verbose else (lambda line: None)
        print(f"cap {format_bytes(cap)}: searching ...", flush=True)
        s = find_batch_size(f"cap-{text}", args.data_dir, args.out, mode="binsearch", start=args.start,
                            margin=0.0, optimizer=args.opt, precision=args.precision, steps=args.steps,
                            memory_cap_bytes=cap, resolution=args.resolution, log=log)
        pred = s["prediction"]
        probes = s["probes"]
        for p in probes:
            if p.get("peak_memory_mb") is not None:
                model = p.get("predicted_peak_mb")
                print(f"    bs {p['batch_size']:>5} {p['status']:<6} measured peak {p['peak_memory_mb']:7.0f} MiB"
                      + (f", model {model:7.0f} MiB ({model - p['peak_memory_mb']:+.0f})" if model else ""))
        rows.append({"cap": format_bytes(cap), "measured": s["largest_fitting"],
                     "not_fitting": s["first_not_fitting"], "predicted": pred["max_batch_size"],
                     "apart": pred.get("percent_apart"), "per_image_mib": pred["per_image_bytes"] / 2**20,
                     "baseline_mib": pred["baseline_bytes"] / 2**20,
                     "calibration_mib": pred["calibration_peak_mb"], "probes": len(probes),
                     "seconds": time.time() - t0})

    size = s["settings"]["image_size"]
    print(f"\nArticle's model at {size} px, {args.opt}, {args.precision}; device: {probes[0].get('device')}")
    print(f"{'cap':>9} {'measured':>9} {'next':>6} {'predicted':>10} {'apart':>8} "
          f"{'MiB/image':>10} {'baseline':>9} {'bs-1 peak':>10} {'probes':>7} {'time':>6}")
    ok = True
    for r in rows:
        apart = f"{r['apart']:+.1f}%" if r["apart"] is not None else "n/a"
        ok &= r["apart"] is not None and abs(r["apart"]) <= TARGET_PERCENT
        print(f"{r['cap']:>9} {r['measured']!s:>9} {r['not_fitting']!s:>6} {r['predicted']:>10} {apart:>8} "
              f"{r['per_image_mib']:>10.2f} {r['baseline_mib']:>8.0f}M {r['calibration_mib']:>9.0f}M "
              f"{r['probes']:>7} {r['seconds']:>5.0f}s")
    print(f"\nwithin {TARGET_PERCENT:.0f}% at every cap: {'yes' if ok else 'no'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
