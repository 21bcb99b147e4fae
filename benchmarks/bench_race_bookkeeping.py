"""What a race's own bookkeeping costs: the race run with trials that train nothing.

A race (`find-batch-size --race`) is a sweep that grows wave by wave: each wave registers the race's
trials so far, writes the sweep's record, and records each finished trial into the store and the
sweep's results.csv. On a GPU a race trial trains for 0.04-0.10 s (docs/gpu.md), so what the run
spends around its trials is a share of the race. This runs catsdogs.measure.race_run.run_race as
tests/measure/test_race_run.py does, on tests/fakes.py's RaceSlot (each trial an instant: its
steps to the target drawn from RaceDevice), on the H200's recorded step times (docs/gpu.md) with
the critical plan's seed spreads, from 0.25.0's prediction of 128, in a fresh --out each time:
everything measured is the race's own Python, the store and the files. With `--old CHECKOUT` (a
`git worktree` of an earlier commit) the same races alternate with that checkout's, A B A B, and
the answers must agree (the bookkeeping decides nothing).

    python benchmarks/bench_race_bookkeeping.py --data-dir /tmp/b/data
    git worktree add /tmp/catsdogs-0.41.0 95d31a0
    python benchmarks/bench_race_bookkeeping.py --data-dir /tmp/b/data --old /tmp/catsdogs-0.41.0 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from harness import HERE, alternate_checkouts, run_snippet, table

# One race, printed as JSON on its last line: run with a checkout's catsdogs first on the path and
# this checkout's tests/ (the fakes) after it.
RACE = r"""
import json, sys, tempfile, time
from pathlib import Path
sys.path.append(sys.argv[1])
from fakes import RaceDevice, RaceSlot
from catsdogs.manifest import require_prepared
from catsdogs.measure.race_run import run_race
from catsdogs.measure.settings import FindSettings
steps = {4: 0.0037, 8: 0.0074, 16: 0.0099, 32: 0.0145, 64: 0.0133, 128: 0.0117}  # the H200's, docs/gpu.md
device = RaceDevice(steps, b_noise=float(sys.argv[3]), log_sd={b: 0.38 + 0.74 * (4 / b) ** 0.5 for b in steps})
rec = {"batch_size": 128, "statistics": "open above", "b_noise": None,
       "table": [{"batch_size": b, "step_seconds": t} for b, t in steps.items()]}
anchor = {"kind": "short-run", "rates": {32: 0.01}, "edges": [], "said": "the benchmark's anchor"}
data = Path(sys.argv[2])
manifest = require_prepared(data)
n_train = sum(manifest["counts"]["standard"]["train"].values())
settings = FindSettings(name="bench", optimizer="sgd", race=True, until="val_loss=0.5")
with tempfile.TemporaryDirectory() as out:
    started = time.perf_counter()
    record = run_race(settings, data, Path(out), manifest, 32, rec, anchor, lambda line: None,
                      slots=lambda i, n, workdir: RaceSlot(device, n_train, fixed=0.52))
    seconds = time.perf_counter() - started
d = record["decision"]
print(json.dumps({"seconds": seconds, "trials": record["trials"], "answer": [d["batch_size"], d["lr"]]}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="a prepared folder (its counts set the epochs)")
    ap.add_argument("--old", type=Path, help="an earlier checkout, alternated with this one")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--b-noise", type=float, nargs="+", default=[8.0, 64.0],
                    help="the simulated devices' B_noise: a small size best, and 128 (default 8 64)")
    args = ap.parse_args()
    sides = {"this": HERE, **({"old": args.old.resolve()} if args.old else {})}
    rows, agree = [], True
    for b_noise in args.b_noise:
        def one(checkout: Path, b_noise=b_noise) -> dict:
            return run_snippet(RACE, [HERE / "tests", args.data_dir.resolve(), b_noise], checkout, "tensorflow",
                               what="the race")
        runs = alternate_checkouts(sides, "tensorflow", one, args.repeats)
        answers = {json.dumps(r["answer"]) for side in runs.values() for r in side}
        agree &= len(answers) == 1
        for side, results in runs.items():
            seconds = statistics.median(r["seconds"] for r in results)
            trials = results[0]["trials"]
            rows.append([f"{b_noise:g}", side, f"{seconds:.2f}", trials, f"{1000 * seconds / trials:.1f}",
                         results[0]["answer"]])
        if args.old:
            this, old = (statistics.median(r["seconds"] for r in runs[s]) for s in ("this", "old"))
            rows.append([f"{b_noise:g}", "this / old", f"{this / old:.2f}x", "", "", ""])
    print(table(["B_noise", "side", "race seconds (median)", "trials", "ms a trial", "answer (batch, rate)"], rows))
    print("answers the same on every run:", "yes" if agree else "NO")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
