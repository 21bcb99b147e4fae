"""One whole trial on each Keras backend, side by side: TensorFlow against JAX on this machine.

Each run is the command a user types, `catsdogs sweep` of one trial (Adam, batch 32, the
article's protocol) in a fresh process and a fresh --out, over one prepared data set, the
backends alternating (A B A B) so that a machine whose speed drifts treats both alike. Prints
each run, then the medians and the ratio JAX / TensorFlow of the command's wall time, of `fit`
(training and validation, compilation included) and of the training steps alone.

    python scripts/bench_backends.py --data-dir /tmp/b200 --repeats 2
    (prepare it first: catsdogs prepare --source synthetic --data-dir /tmp/b200)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from catsdogs.store import Store

BACKENDS = ("tensorflow", "jax")


def one_trial(backend: str, data_dir: Path, epochs: int, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "catsdogs", "sweep", "--data-dir", str(data_dir), "--out", out,
               "--opt", "adam", "--batch-size", str(batch_size), "--seeds", "1", "--epochs", str(epochs)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "KERAS_BACKEND": backend})
        wall = time.perf_counter() - t0
        with Store(Path(out) / "results.sqlite") as store:
            (trial,) = store.trials()
    assert trial["status"] == "done", trial.get("error")
    return {"backend": backend, "command_s": wall, "fit_s": trial["fit_seconds"],
            "train_s": trial["train_seconds"], "setup_s": trial["setup_seconds"],
            "accuracy": trial["test_accuracy"], "device": trial["env"]["device"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()
    runs = []
    for r in range(a.repeats):
        for backend in BACKENDS:
            run = one_trial(backend, a.data_dir, a.epochs, a.batch_size)
            runs.append(run)
            print(f"repeat {r + 1} {backend:10s} command {run['command_s']:6.1f} s  fit {run['fit_s']:6.1f} s  "
                  f"train steps {run['train_s']:6.1f} s  build {run['setup_s']:5.1f} s  "
                  f"test accuracy {run['accuracy']:.4f}", flush=True)
    print(f"\n{runs[0]['device']}; Adam, batch {a.batch_size}, {a.epochs} epochs; medians of {a.repeats}:")
    medians = {b: {k: statistics.median(x[k] for x in runs if x["backend"] == b)
                   for k in ("command_s", "fit_s", "train_s", "setup_s")} for b in BACKENDS}
    print(f"{'':12s}{'tensorflow':>12s}{'jax':>12s}{'jax / tf':>10s}")
    for k in ("command_s", "fit_s", "train_s", "setup_s"):
        tf, jx = medians["tensorflow"][k], medians["jax"][k]
        print(f"{k:12s}{tf:12.1f}{jx:12.1f}{jx / tf if tf else float('nan'):10.2f}")


if __name__ == "__main__":
    main()
