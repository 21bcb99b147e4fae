"""One whole trial on each Keras backend, side by side: TensorFlow against JAX on this machine.

Each run is the command a user types, `catsdogs sweep` of one trial (Adam, batch 32, the
article's protocol) in a fresh process and a fresh --out, over one prepared data set, the
backends alternating (A B A B) so that a machine whose speed drifts treats both alike. Prints
each run, then the medians and the ratio JAX / TensorFlow of the command's wall time, of `fit`
(training and validation, compilation included) and of the training steps alone.

    python benchmarks/bench_backends.py --data-dir /tmp/b200 --repeats 2
    (prepare it first: catsdogs prepare --source synthetic --data-dir /tmp/b200)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import alternate, median_of, table

from catsdogs.store import Store

BACKENDS = ("tensorflow", "jax")
FIGURES = ("command_s", "fit_s", "train_s", "setup_s")


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

    def log(line: str) -> None:
        print(line, flush=True)

    runs = alternate({b: (lambda r, b=b: one_trial(b, a.data_dir, a.epochs, a.batch_size)) for b in BACKENDS},
                     a.repeats, log)
    for backend in BACKENDS:
        for r, run in enumerate(runs[backend]):
            log(f"repeat {r + 1} {backend:10s} command {run['command_s']:6.1f} s  fit {run['fit_s']:6.1f} s  "
                f"train steps {run['train_s']:6.1f} s  build {run['setup_s']:5.1f} s  "
                f"test accuracy {run['accuracy']:.4f}")
    print(f"\n{runs['tensorflow'][0]['device']}; Adam, batch {a.batch_size}, {a.epochs} epochs; medians of {a.repeats}:")
    medians = {b: {k: median_of(runs[b], k) for k in FIGURES} for b in BACKENDS}
    rows = [(k, f"{medians['tensorflow'][k]:.1f}", f"{medians['jax'][k]:.1f}",
             f"{medians['jax'][k] / medians['tensorflow'][k]:.2f}" if medians["tensorflow"][k] else "") for k in FIGURES]
    print(table(("", "tensorflow", "jax", "jax / tf"), rows))


if __name__ == "__main__":
    main()
