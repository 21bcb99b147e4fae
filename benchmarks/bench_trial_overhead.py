"""What a trial costs besides its training, against another checkout: `reproduce --config quick`.

Runs the quick plan with this checkout and with `--old` (a `git worktree` of an earlier commit),
A B A B, each into a fresh --out over one data folder prepared beforehand, on each backend asked.
Per trial it reads the store: the trial's wall time in its worker (`wall_seconds`) less its
training (`train_seconds`), "the non-training time", and where it went: validation inside fit
(`fit_seconds` - `train_seconds`), the step's reset or build (`setup_seconds`), the wait for the
weights' digest (`digest_seconds`), and the rest (the test evaluation, the collapse diagnosis
before and after, the pipeline, bookkeeping). Prints the medians per side over the trials that
reused a compiled step (the first of each shape compiles, and is shown apart), their ratio, and
whether every trial's weights digest is the same on both sides. `--data DIR` runs a small sweep
(DATA_SWEEP) on a prepared folder instead, its splits as large as they are.

`--split DATA` instead runs the quick plan's trials (seeds 0 to 2) in this process, as a worker
runs them, with a clock on each part of a trial: training, the validation inside fit, fit's own
overhead, the step's reset, the data pipelines, the initial collapse diagnosis, the test
evaluation with the final one (one pass), the digest's wait, and the rest; medians over the
trials that reused a step.

    git worktree add /tmp/catsdogs-0.15.0 53f39ec
    python benchmarks/bench_trial_overhead.py --old /tmp/catsdogs-0.15.0 --repeats 3
    python benchmarks/bench_trial_overhead.py --old /tmp/catsdogs-0.15.0 --backends jax --repeats 2
    python benchmarks/bench_trial_overhead.py --old /tmp/catsdogs-0.34.0 --data /tmp/b/data   # 400 test images
    KERAS_BACKEND=jax python benchmarks/bench_trial_overhead.py --split data/quick
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import HERE, alternate, plan_file, run_catsdogs

PARTS = ("validation", "setup", "digest wait", "rest")
DATA_SWEEP = ("--opt", "sgd", "adam", "--batch-size", "32", "64", "--seeds", "2", "--epochs", "1")  # (with --data)


def trials(store: Path) -> dict[tuple, dict]:
    """{(optimizer, batch size, data set, seed): the trial's clocks and digest} of a finished run."""
    db = sqlite3.connect(store)
    db.row_factory = sqlite3.Row
    rows = db.execute("SELECT * FROM trials WHERE status = 'done'").fetchall()
    out = {}
    for r in rows:
        wall, train, fit = r["wall_seconds"], r["train_seconds"], r["fit_seconds"]
        setup, digest = r["setup_seconds"] or 0.0, r["digest_seconds"] or 0.0
        out[(r["optimizer"], r["batch_size"], r["dataset"], r["seed"])] = {
            "reused": bool(r["step_reused"]), "digest": r["weights_digest"], "non-training": wall - train,
            "validation": fit - train, "setup": setup, "digest wait": digest,
            "rest": wall - fit - setup - digest}
    return out


SPLIT = ("training", "validation", "fit's own", "reset", "pipelines", "initial diagnosis",
         "test and final diagnosis", "digest wait", "rest")  # (one pass over the test set since 0.35.0)


def split(data: Path) -> int:
    """Each part of the quick plan's trials, timed in this process (see the module's docstring)."""
    import itertools

    from catsdogs.manifest import require_prepared
    from catsdogs.runtime import backends
    from catsdogs.schema import TrialConfig

    backend = backends.current()
    backend.setup_device(None)
    backend.start()
    from catsdogs.training import engine, steps

    clocks: dict[str, float] = {}

    def timed(owner, name, part):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clocks[part] = clocks.get(part, 0.0) + time.perf_counter() - t0
        setattr(owner, name, wrapper)

    timed(steps.StepCache, "get", "reset")
    timed(engine, "initial_diagnosis", "initial diagnosis")
    timed(engine, "test_and_diagnose", "test and final diagnosis")
    timed(backend, "train_batches", "pipelines")
    timed(backend, "eval_batches", "pipelines")
    manifest = require_prepared(data)
    grids = [(("sgd", "adam"), (8, 32), ("standard",)), (("adam",), (8, 32, 64), ("standard", "augmented"))]
    configs = list(dict.fromkeys(
        (o, b, d, s) for s in range(3) for opts, sizes, sets in grids for o, b, d in itertools.product(opts, sizes, sets)))
    later = []
    for o, b, d, s in configs:
        clocks.clear()
        cfg = TrialConfig(o, b, d, s, epochs=3, image_size=manifest["params"]["size"], data=manifest["fingerprint"][d],
                          backend=backend.NAME, **backends.process_settings())
        t0 = time.perf_counter()
        r = engine.run_trial(cfg, data)
        wall = time.perf_counter() - t0
        epochs = sum(e["seconds"] for e in r.history)  # each epoch's training and validation (EpochTimer)
        parts = {"training": r.train_seconds, "digest wait": r.digest_seconds, **clocks,
                 "validation": epochs - r.train_seconds, "fit's own": r.fit_seconds - epochs}
        parts["rest"] = wall - sum(parts.values())
        if r.step_reused:
            later.append(parts | {"wall": wall})
    print(f"{backend.NAME}: {len(later)} trials of the quick plan that reused a step, medians (seconds):")
    non_training = statistics.median(p["wall"] - p["training"] for p in later)
    for part in SPLIT:
        share = "" if part == "training" else f" ({statistics.median(p.get(part, 0.0) for p in later) / non_training:.0%} of the non-training)"
        print(f"  {part:>24}: {statistics.median(p.get(part, 0.0) for p in later):.4f}{share}")
    print(f"  {'non-training':>24}: {non_training:.4f}   wall {statistics.median(p['wall'] for p in later):.4f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", type=Path, default=None, metavar="DATA",
                    help="time each part of a trial in this process instead, on the quick plan's prepared DATA")
    ap.add_argument("--old", type=Path, default=None, help="a checkout of the catsdogs to compare with")
    ap.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", type=Path, default=None,
                    help="a prepared data folder: the sweep DATA_SWEEP on it instead of the quick plan on its own data")
    args = ap.parse_args()
    if args.split:
        return split(args.split)
    if args.old is None:
        ap.error("--old CHECKOUT is needed (or --split DATA)")
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    data = args.data or work / "data"
    if args.data is None:
        print(f"preparing the quick plan's data once in {data} ...", flush=True)
        run_catsdogs(["reproduce", "--config", plan_file(HERE, "quick"), "--data-dir", data, "--out", work / "warm",
                      "--quiet"])
    sides = {"new": HERE, "old": args.old.resolve()}

    def quick(backend: str, side: str, r: int) -> dict:
        out = work / f"{backend}-{side}-{r}"
        if args.data is None:
            run_catsdogs(["reproduce", "--config", plan_file(sides[side], "quick"), "--data-dir", data, "--out", out,
                          "--quiet"], sides[side], env={"KERAS_BACKEND": backend})
        else:  # its splits as large as they are (the race's data: 400 test images, where quick has 48)
            run_catsdogs(["sweep", "--data-dir", data, "--out", out, *DATA_SWEEP], sides[side], env={"KERAS_BACKEND": backend})
        return trials(out / "results.sqlite")

    found = alternate({(b, s): (lambda r, b=b, s=s: quick(b, s, r)) for b in args.backends for s in sides},
                      args.repeats)
    print(f"\nPer trial, seconds (medians over {args.repeats} runs of the quick plan; trials that reused a step):")
    print(f"{'backend':>10} {'side':>4} {'non-training':>13} " + " ".join(f"{p:>12}" for p in PARTS)
          + f" {'first of a shape':>17}")
    for backend in args.backends:
        med = {}
        for side in sides:
            runs = found[(backend, side)]
            later = [t for run_ in runs for t in run_.values() if t["reused"]]
            first = [t for run_ in runs for t in run_.values() if not t["reused"]]
            med[side] = statistics.median(t["non-training"] for t in later)
            parts = " ".join(f"{statistics.median(t[p] for t in later):12.4f}" for p in PARTS)
            print(f"{backend:>10} {side:>4} {med[side]:13.4f} {parts} "
                  f"{statistics.median(t['non-training'] for t in first):17.4f}")
        same = [run_new[k]["digest"] == run_old[k]["digest"] for run_new, run_old in
                zip(found[(backend, "new")], found[(backend, "old")], strict=True) for k in run_new if k in run_old]
        print(f"{backend:>10}: new/old {med['new'] / med['old']:.2f} (target <= 0.5); weights digests the same "
              f"on both sides: {sum(same)} of {len(same)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
