"""JAX's validation, ours against Keras's: what a race-like trial spends evaluating, either way.

Runs race-like trials (SGD at 0.05 until `--until`, `--eval-every 256`, at most 12 epochs, stopped
at chance) in this one JAX process, alternating, seed by seed, between the two ways a trial
validates: Keras's (fit validates each epoch, the curve calls `model.evaluate` between a save and a
restore of fit's running metrics: catsdogs up to 0.41.0) and ours (backends.jax.evaluate: a jitted
`test_step` over the model's variables, by the epoch timer and the curve). Prints per way the
median milliseconds an evaluation (the curve's seconds over its points after the start), a trial's
seconds besides training, and whether every trial's weights digest is the same both ways. At a
small image size the forward passes cost little, as on a GPU, and what remains is each way's own.

    python benchmarks/bench_evaluation.py --data-dir /tmp/t16 --batch-size 64     # 16 px
    python benchmarks/bench_evaluation.py --data-dir /tmp/b/data --batch-size 64  # 64 px
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ["KERAS_BACKEND"] = "jax"  # (before catsdogs starts the backend: ours is JAX's)

from harness import table  # noqa: E402

from catsdogs.manifest import load_manifest  # noqa: E402
from catsdogs.runtime import backends  # noqa: E402
from catsdogs.runtime.backends import jax as jax_backend  # noqa: E402
from catsdogs.runtime.backends import keras_evaluate  # noqa: E402
from catsdogs.schema import TrialConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="a prepared folder")
    ap.add_argument("--batch-size", type=int, default=64, help="the trials' batch size (default 64)")
    ap.add_argument("--seeds", type=int, default=8, help="seeds, each run both ways (default 8)")
    ap.add_argument("--until", default="val_loss=0.6", help="the trials' target (default val_loss=0.6)")
    args = ap.parse_args()
    backend = backends.current()
    backend.start()
    from catsdogs.training import engine  # (imports Keras: after the backend's start)

    data = load_manifest(args.data_dir)
    ways = {"keras": (True, lambda model, batches, cache=None: keras_evaluate(model, batches)),
            "ours": (jax_backend.FIT_VALIDATES, jax_backend.evaluate)}

    def trial(seed: int):
        cfg = TrialConfig("sgd", args.batch_size, "standard", seed, epochs=12, image_size=data["params"]["size"],
                          data=data["fingerprint"]["standard"], lr=0.05, until=args.until, eval_every=256,
                          stop_at_chance=True, backend="jax", **backends.process_settings())
        return engine.run_trial(cfg, args.data_dir)

    trial(args.seeds)  # the step compiled, Keras's way's and ours (not measured)
    runs: dict[str, list] = {way: [] for way in ways}
    for seed in range(args.seeds):
        for way in (("keras", "ours") if seed % 2 == 0 else ("ours", "keras")):
            jax_backend.FIT_VALIDATES, jax_backend.evaluate = ways[way]
            r = trial(seed)
            runs[way].append((1000 * r.eval_seconds / max(1, len(r.curve) - 1), r.wall_seconds - r.train_seconds,
                              len(r.curve), r.weights_digest))
    rows = [[way, f"{statistics.median(x[0] for x in rs):.1f}", f"{statistics.median(x[1] for x in rs):.3f}",
             statistics.median(x[2] for x in rs)] for way, rs in runs.items()]
    print(f"{data['params']['size']} px, batch {args.batch_size}, {args.seeds} seeds a way:")
    print(table(["way", "ms an evaluation", "s a trial besides training", "points a trial"], rows))
    same = sum(a[3] == b[3] for a, b in zip(runs["keras"], runs["ours"], strict=True))
    print(f"weights digests the same: {same} of {args.seeds}")
    return 0 if same == args.seeds else 1


if __name__ == "__main__":
    sys.exit(main())
