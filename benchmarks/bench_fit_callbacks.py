"""A training step with fit's callbacks as Keras calls them and as a trial does (`FitCallbacks`).

Runs one-epoch trials (SGD at 0.05) in this one process on the backend KERAS_BACKEND names,
alternating seed by seed between Keras's CallbackList (every step's logs handed to a thread that
turns them into floats for no callback that reads them: catsdogs up to 0.41.0) and the trial's
own (catsdogs.training.timer.FitCallbacks), and prints each way's median milliseconds a step and
whether the trials' weights and validation losses are the same. It shows where steps are short:
a small image size on this CPU, as on a GPU.

    KERAS_BACKEND=jax python benchmarks/bench_fit_callbacks.py --data-dir /tmp/t16 --batch-size 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from harness import table

from catsdogs.manifest import load_manifest
from catsdogs.runtime import backends
from catsdogs.schema import TrialConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="a prepared folder")
    ap.add_argument("--batch-size", type=int, default=8, help="the trials' batch size (default 8)")
    ap.add_argument("--seeds", type=int, default=6, help="seeds, each run both ways (default 6)")
    args = ap.parse_args()
    backend = backends.current()
    backend.start()
    import keras

    from catsdogs.training import engine  # (imports Keras: after the backend's start)

    data = load_manifest(args.data_dir)
    ways = {"keras": keras.callbacks.CallbackList, "trial's": engine.FitCallbacks}

    def trial(seed: int):
        cfg = TrialConfig("sgd", args.batch_size, "standard", seed, epochs=1, image_size=data["params"]["size"],
                          data=data["fingerprint"]["standard"], lr=0.05, backend=backend.NAME,
                          **backends.process_settings())
        return engine.run_trial(cfg, args.data_dir)

    trial(args.seeds)  # the step compiled (not measured)
    runs: dict[str, list] = {way: [] for way in ways}
    for seed in range(args.seeds):
        for way in (("keras", "trial's") if seed % 2 == 0 else ("trial's", "keras")):
            engine.FitCallbacks = ways[way]
            r = trial(seed)
            runs[way].append((1000 * r.train_seconds / r.batches, r.weights_digest, [h.get("val_loss") for h in r.history]))
    print(f"{backend.NAME}, {data['params']['size']} px, batch {args.batch_size}, {args.seeds} seeds a way:")
    print(table(["callbacks", "ms a step (median)"], [[w, f"{statistics.median(x[0] for x in rs):.2f}"]
                                                      for w, rs in runs.items()]))
    same = sum(a[1:] == b[1:] for a, b in zip(runs["keras"], runs["trial's"], strict=True))
    print(f"weights and validation losses the same: {same} of {args.seeds}")
    return 0 if same == args.seeds else 1


if __name__ == "__main__":
    sys.exit(main())
