"""The trial engine against the old one: `reproduce --config quick`, whole command.

Runs the same plan with this checkout's catsdogs (long-lived workers) and with another checkout's
(`--old`, e.g. a `git worktree` of the commit before the engine: one process per trial), A B A B,
each run into a fresh --out over one data folder prepared beforehand (so `prepare` is a no-op on
both sides), and prints medians and their ratio. From the new runs' stores it also prints the
per-trial overhead: a trial's wall time (claimed to recorded) less its `fit` time, for the first
trial of each shape in a worker and for the later ones that reuse its compiled step.

    git worktree add /tmp/old-catsdogs b4d70ad
    python benchmarks/bench_engine.py --old /tmp/old-catsdogs --repeats 3
    python benchmarks/bench_engine.py --old /tmp/old-catsdogs --isolate   # ours with --isolate too
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from harness import HERE, alternate, plan_file, run_catsdogs


def run(checkout: Path, plan: Path, data: Path, out: Path, extra: list[str]) -> float:
    """`reproduce` of `plan` from `checkout` into `out`, quietly: its seconds."""
    return run_catsdogs(["reproduce", "--config", plan, "--data-dir", data, "--out", out, "--quiet", *extra], checkout)


def overheads(store: Path) -> dict[str, list[float]]:
    """Per trial: wall (started -> finished) less fit seconds, by whether its step was reused."""
    db = sqlite3.connect(store)
    out: dict[str, list[float]] = {"first of its shape": [], "step reused": []}
    for started, finished, reused, fit in db.execute(
            "SELECT started_at, finished_at, step_reused, fit_seconds FROM trials WHERE status='done'"):
        if fit is None:
            continue
        out["step reused" if reused else "first of its shape"].append((finished - started) - fit)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="a checkout of catsdogs before the engine")
    ap.add_argument("--plan", default="quick", help="a built-in plan's name, found in each checkout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--isolate", action="store_true", help="also time ours with --isolate")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    data = work / "data"
    print(f"preparing the plan's data once in {data} ...", flush=True)
    run(HERE, plan_file(HERE, args.plan), data, work / "warm", [])  # also warms the file cache
    sides = {"new": (HERE, [])}
    if args.isolate:
        sides["new --isolate"] = (HERE, ["--isolate"])
    sides["old"] = (args.old.resolve(), [])
    stores = []

    def one(side: str, r: int) -> float:
        checkout, extra = sides[side]
        out = work / f"{side.replace(' ', '')}-{r}"
        seconds = run(checkout, plan_file(checkout, args.plan), data, out, extra)
        version = json.loads(sqlite3.connect(out / "results.sqlite").execute(
            "SELECT env FROM trials LIMIT 1").fetchone()[0]).get("catsdogs")
        if side == "new":
            stores.append(out / "results.sqlite")
        print(f"  {side}: catsdogs {version}", flush=True)
        return seconds

    times = alternate({side: (lambda r, side=side: one(side, r)) for side in sides}, args.repeats)
    over = {"first of its shape": [], "step reused": []}
    for store in stores:
        for k, v in overheads(store).items():
            over[k] += v

    print(f"\n`catsdogs reproduce --config {args.plan}`, medians of {args.repeats} alternating runs:")
    med = {s: statistics.median(t) for s, t in times.items()}
    for side, m in med.items():
        print(f"  {side:>14}: {m:6.1f} s   (min {min(times[side]):.1f}, max {max(times[side]):.1f})")
    print(f"  speed-up, new against old: {med['old'] / med['new']:.2f}x   (target >= 3.5x)")
    if "new --isolate" in med:
        print(f"  new against new --isolate: {med['new --isolate'] / med['new']:.2f}x")
    print("Per-trial overhead of the new engine (trial wall time less its fit):")
    for k, v in over.items():
        if v:
            print(f"  {k:>18}: median {statistics.median(v):.2f} s, max {max(v):.2f} s over {len(v)} trials")
    if over["step reused"]:
        print(f"  target <= 1 s after a worker's first trial of a shape: "
              f"{'met' if statistics.median(over['step reused']) <= 1 else 'missed'}")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "overheads": over}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
