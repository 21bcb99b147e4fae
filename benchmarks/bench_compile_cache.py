"""Benchmark JAX's persistent compilation cache: a plan run twice, each time into a fresh --out
(so it trains everything again), with a cache that starts empty; and once with the cache off.

Each trial records the XLA compilations it made and the cache's loads (`compiles`,
`compile_cache_hits`: jax.monitoring's backend-compile events, less the loads, which fire that
event too). The target: the second run compiles at most 10% of what the first compiled.

    KERAS_BACKEND=jax python benchmarks/bench_compile_cache.py               # the quick plan
    KERAS_BACKEND=jax python benchmarks/bench_compile_cache.py --config article-64px --keep /tmp/cc
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from harness import run_catsdogs, table

TARGET = 0.10


def run(work: Path, out: str, config: str, cache: Path | None) -> dict:
    env = {"KERAS_BACKEND": "jax", "CATSDOGS_COMPILE_CACHE": str(cache) if cache else "off"}
    wall = run_catsdogs(["reproduce", "--config", config, "--data-dir", work / "data", "--out", work / out, "--quiet"],
                        env=env)  # (the data in the work folder, as a run from there would put them)
    with sqlite3.connect(work / out / "results.sqlite") as db:
        compiles, hits, trials = db.execute("SELECT sum(compiles), sum(compile_cache_hits), count(*) FROM trials").fetchone()
    return {"run": out, "wall": wall, "compiles": compiles or 0, "hits": hits or 0, "trials": trials}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="quick", help="the plan [quick]")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it [a temp dir]")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="catsdogs-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "jax-cache"
    shutil.rmtree(cache, ignore_errors=True)
    try:
        rows = [run(work, "cold", args.config, cache), run(work, "warm", args.config, cache),
                run(work, "no-cache", args.config, None)]
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"plan {args.config}, KERAS_BACKEND=jax; each run into a fresh --out")
    print(table(("run", "trials", "XLA compilations", "cache loads", "wall s"),
                [(r["run"], r["trials"], r["compiles"], r["hits"], f"{r['wall']:.1f}") for r in rows]))
    cold, warm = rows[0]["compiles"], rows[1]["compiles"]
    share = warm / cold if cold else 0.0
    print(f"\nThe warm run compiled {100 * share:.0f}% of what the cold run compiled "
          f"(target at most {100 * TARGET:.0f}%: {'met' if share <= TARGET else 'NOT met'}).")
    return 0 if share <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
