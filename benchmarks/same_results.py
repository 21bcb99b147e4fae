"""Did a change change a result? This checkout against an older one, trial by trial and report by report.

For each Keras backend asked for, runs the same plan with the old checkout (a `git worktree`, on
PYTHONPATH) and with this one into two fresh --out folders over one prepared data folder, and
compares every trial by its key: the weights' digest, the history (timings left out) and the
steps exactly, the test accuracy and loss to TEST_TOLERANCE. Then reports the old store twice, with the old code and with
this one, each on its own copy, and compares results.md and summary.csv line by line.

The default plan, written here, touches every part of the report a refactor might move: the
article's first figure, a tuned learning rate (three rates a batch size), the gradient noise scale
at every epoch, the critical batch size's claim and the collapses; 40 px, 2 epochs, 2 seeds.

    git worktree add /tmp/old-catsdogs 45ed307
    python benchmarks/same_results.py --old /tmp/old-catsdogs
    python benchmarks/same_results.py --old /tmp/old-catsdogs --plan quick --backends tensorflow
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

PLAN = """name = "same-results"
description = "every part of the report, small: the article's figure, a tuned rate, the noise scale"
seeds = 2
epochs = 2
noise_scale = true
data_dir = "data/same-results"

[prepare]
source = "synthetic"
per_class = 60
split = "40,10,10"
size = 40

[grids.article]
opt = ["sgd", "adam"]
batch_size = [8, 16, 32]

[grids.tuned]
opt = ["adam"]
batch_size = [8, 32]
lr = [0.0003, 0.001, 0.003]
"""


def run(checkout: Path, args: list[str], backend: str, cwd: Path) -> float:
    """`python -m catsdogs ARGS` with `checkout` first on the path; its wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "KERAS_BACKEND": backend, "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "catsdogs", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: catsdogs {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def outcomes(store: Path) -> dict[str, tuple]:
    """Each trial's result by key, without its timings: (status, digest, steps, history, test accuracy, test loss)."""
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    out = {}
    for r in db.execute("SELECT * FROM trials"):
        history = [{k: v for k, v in row.items() if "seconds" not in k} for row in json.loads(r["history"] or "[]")]
        out[r["key"]] = (r["status"], r["weights_digest"], r["steps"], json.dumps(history, sort_keys=True),
                         r["test_accuracy"], r["test_loss"])  # (the exact parts first: `alike`)
    db.close()
    return out


TEST_TOLERANCE = 1e-6  # test accuracy and loss: since 0.35.0 from one pass (an exact share, a float32 mean
# summed in another order), where earlier versions stored evaluate's float32 figures


def alike(old: tuple, new: tuple) -> bool:
    """The same trial's result: digest, steps and history exactly; the test figures to TEST_TOLERANCE."""
    return old[:4] == new[:4] and all(
        x == y or (x is not None and y is not None and abs(x - y) <= TEST_TOLERANCE * max(1.0, abs(x)))
        for x, y in zip(old[4:], new[4:], strict=True))


def report_lines(checkout: Path, name: str, store_dir: Path, copy: Path, cwd: Path) -> dict[str, list[str]]:
    """results.md and summary.csv of sweep `name`, reported by `checkout` from a copy of `store_dir`."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    for f in store_dir.iterdir():
        if f.is_file():
            shutil.copy2(f, copy / f.name)
    run(checkout, ["report", "--name", name, "--out", str(copy)], "tensorflow", cwd)
    return {f: (copy / name / f).read_text().splitlines() for f in ("results.md", "summary.csv")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the older checkout (a git worktree)")
    ap.add_argument("--plan", default=None, help="a built-in plan's name or a TOML file [the plan written here]")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"], help="[tensorflow jax]")
    ap.add_argument("--work", type=Path, default=None, help="where the runs go [a temporary folder]")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="same-results-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = args.plan
    if plan is None:
        (work / "same-results.toml").write_text(PLAN)
        plan = str(work / "same-results.toml")
    name = Path(plan).stem if plan.endswith(".toml") else plan
    old, new = args.old.resolve(), HERE
    print(f"plan {name}; old {old}; new {new}; in {work}", flush=True)
    failures = 0
    for backend in args.backends:
        outs = {"old": work / f"{backend}-old", "new": work / f"{backend}-new"}
        seconds = {}
        for side, checkout in (("old", old), ("new", new)):
            shutil.rmtree(outs[side], ignore_errors=True)
            seconds[side] = run(checkout, ["reproduce", "--config", plan, "--out", str(outs[side]), "--quiet"],
                                backend, work)
        a, b = outcomes(outs["old"] / "results.sqlite"), outcomes(outs["new"] / "results.sqlite")
        same = sum(1 for k in a if k in b and alike(a[k], b[k]))
        differ = sorted(k for k in a if k in b and not alike(a[k], b[k]))
        print(f"{backend}: {len(a)} trials old, {len(b)} new, {len(set(a) & set(b))} of the same keys; "
              f"{same} alike (digest, history, steps exactly; test figures to {TEST_TOLERANCE:g}), {len(differ)} differ; "
              f"{sum(1 for v in b.values() if v[0] == 'done')} done; wall {seconds['old']:.0f} s old, "
              f"{seconds['new']:.0f} s new", flush=True)
        failures += len(differ) + len(set(a) ^ set(b))
        if backend == args.backends[0]:
            old_report = report_lines(old, name, outs["old"], work / "report-old", work)
            new_report = report_lines(new, name, outs["old"], work / "report-new", work)
            for f, lines in old_report.items():
                changed = [(i + 1, x, y) for i, (x, y) in enumerate(zip(lines, new_report[f], strict=False)) if x != y]
                extra = abs(len(lines) - len(new_report[f]))
                print(f"report of the old store, {f}: {len(lines)} lines old, {len(new_report[f])} new; "
                      f"{len(changed)} differ, {extra} only on one side")
                for i, x, y in changed[:10]:
                    print(f"  line {i}:\n    old: {x[:200]}\n    new: {y[:200]}")
    print("the same results" if failures == 0 else f"{failures} trials differ or are missing")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
