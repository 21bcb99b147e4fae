"""What `report --tensorboard` costs on a large store: the first export, an export of the unchanged
store (which must write no event file), and one after a single trial changed.

Builds a store of `--trials` finished trials (5 epochs of history each, the article's grid of
optimizers x batch sizes x data sets x seeds repeated to that count) in a temporary folder, then
times catsdogs.analysis.tensorboard_export.export three times, alternating nothing (each export
is a different situation), and prints the seconds and the event files each wrote.

    python benchmarks/bench_tensorboard.py --trials 140
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

from harness import table

from catsdogs.analysis import tensorboard_export
from catsdogs.analysis.rows import load_trials
from catsdogs.messages import TrialRecord
from catsdogs.store import Store


def configs(n: int) -> list[dict]:
    grid = itertools.product(("sgd", "adam"), (16, 32, 64, 128, 256, 512, 1024), ("standard", "augmented"), range(100))
    return [{"optimizer": o, "batch_size": b, "dataset": d, "seed": s, "epochs": 5, "image_size": 200, "data": "fp",
             "lr": None, "lr_scaling": "none", "base_batch_size": 32, "warmup_epochs": 0.0, "budget": "epochs",
             "accumulate": 1, "precision": "float32", "strategy": "none", "backend": "tensorflow"}
            for o, b, d, s in sorted(grid, key=lambda c: c[3])[:n]]


def finish(store: Store, key: str, accuracy: float) -> None:
    history = [{"loss": 0.7 - 0.02 * e, "accuracy": 0.5 + 0.03 * e, "val_loss": 0.69 - 0.01 * e,
                "val_accuracy": 0.5 + 0.02 * e, "seconds": 10.0} for e in range(5)]
    store.claim([key])
    store.finish(key, TrialRecord(status="done", test_accuracy=accuracy, train_seconds=50.0, history=history))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=140, help="Trials in the store (the article's sweep: 140).")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path, folder = Path(tmp) / "results.sqlite", Path(tmp) / "tb"
        with Store(path) as store:
            keys = store.register_sweep("big", {}, configs(args.trials))
            for i, key in enumerate(keys[:-1]):
                finish(store, key, 0.6 + 0.001 * i)

        rows = []

        def timed(label: str) -> None:
            started = time.perf_counter()
            result = tensorboard_export.export(load_trials(path, "big"), folder)
            files = len(list(folder.rglob("events.out.tfevents.*")))
            rows.append((label, f"{time.perf_counter() - started:.2f}", result["written"], result["unchanged"], files))

        timed(f"first export ({len(keys)} trials)")
        before = {p: p.stat().st_mtime_ns for p in folder.rglob("events.out.tfevents.*")}
        timed("unchanged store")
        same = before == {p: p.stat().st_mtime_ns for p in folder.rglob("events.out.tfevents.*")}
        with Store(path) as store:
            finish(store, keys[-1], 0.7)
        timed("one trial finished since")
    print(table(("export", "seconds", "written", "unchanged", "event files"), rows))
    print(f"no event file written again by the unchanged store's export: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
