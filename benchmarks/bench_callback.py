"""What catsdogs.keras.GradientNoiseScale costs a user's `fit`: the article's model trained on
prepared data with and without the callback (its default setting: a measurement every epoch),
alternating (A B A B) in one process, the medians of the epochs' wall time.

Its cost is fixed a measurement (16 pairs of 12 micro-batches of 2 images: 192 small gradients),
while an epoch's grows with the training images: the table gives both, and the share of an epoch
at these data's size. The issue's target: at most 15% of training at 64 px.

    catsdogs prepare --source synthetic --size 64 --data-dir /tmp/d64
    python benchmarks/bench_callback.py --data-dir /tmp/d64 --epochs 3 --repeats 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import alternate, median_of, table

TARGET = 0.15


def fit_once(data_dir: Path, epochs: int, batch_size: int, with_callback: bool, pairs: int | None = None) -> dict:
    import keras

    import catsdogs.keras
    from catsdogs.data import loading
    from catsdogs.training.model import build_model, loss_and_metrics

    splits = loading.load_dataset(data_dir, "standard")
    train = splits["train"]
    keras.utils.set_random_seed(0)
    model = build_model(int(train.images.shape[1]))
    loss, metrics = loss_and_metrics()
    model.compile(optimizer="adam", loss=loss, metrics=metrics)
    noise = (catsdogs.keras.GradientNoiseScale((train.images, train.labels), **({'pairs': pairs} if pairs else {}))
             if with_callback else None)
    epoch_seconds: list[float] = []

    class Clock(keras.callbacks.Callback):  # each epoch's wall time, the callback's measurement in it
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_seconds.append(time.perf_counter() - self.started)

    callbacks = [Clock(), *([noise] if noise else [])]  # the clock first: it stops before the measurement
    started = time.perf_counter()
    model.fit(train.images, train.labels, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=callbacks)
    total = time.perf_counter() - started
    measured = [r["seconds"] for r in noise.history] if noise else []
    return {"total": total, "epoch": sorted(epoch_seconds[1:] or epoch_seconds)[len(epoch_seconds[1:] or epoch_seconds) // 2],
            "measure": sorted(measured)[len(measured) // 2] if measured else 0.0, "images": len(train.labels)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="prepared data (64 px for the issue's target)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=None, help="the callback's pairs a measurement [default: its own]")
    a = ap.parse_args()
    runs = alternate({"without": lambda r: fit_once(a.data_dir, a.epochs, a.batch_size, False),
                      "with": lambda r: fit_once(a.data_dir, a.epochs, a.batch_size, True, a.pairs)}, a.repeats)
    epoch = median_of(runs["without"], "epoch")
    measure = median_of(runs["with"], "measure")
    share = measure / epoch
    print(table(("fit", "whole fit s (median)", "an epoch's training s (median, after the first)",
                 "a measurement s (median)"),
                [(side, f"{median_of(rs, 'total'):.1f}", f"{median_of(rs, 'epoch'):.2f}",
                  f"{median_of(rs, 'measure'):.2f}" if side == "with" else "") for side, rs in runs.items()]))
    print(f"\nA measurement costs {share:.1%} of an epoch of {runs['with'][0]['images']:,} training images at batch "
          f"{a.batch_size} (target at most {TARGET:.0%}: {'met' if share <= TARGET else 'NOT met'} at this size; "
          "the measurement's cost is fixed, an epoch's grows with the images).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
