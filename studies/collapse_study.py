"""What makes the article's model collapse: its Dense(128) layer, update by update.

Trains one trial's configuration (the sweep's model, optimizer, loss and batch order; Keras on
TensorFlow) one batch at a time and, after every update, looks at the model on the 400 test
images: the share of Dense(128) ReLU units that are dead (output 0 for every image), how far one
update moved the units' pre-activations against how much they vary between images, the share
predicted Dog, and the spread of the logit. Prints one line per update for each trial asked.

    python studies/collapse_study.py --data-dir data/beyond --opt adam --batch-size 16 128 --seed 0
    python studies/collapse_study.py --data-dir data/beyond --batch-size 128 --warmup-epochs 1

What it showed (synthetic data, 64 px; README, "Why large batches collapse"): the first Adam
update moves every unit's pre-activation by many times its spread between images, the same way
for every image, so a unit comes out of it dead for all images or alive for all; at small batch
sizes ... (see the README for the numbers).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def study(data_dir: Path, optimizer: str, batch_size: int, seed: int, warmup_epochs: float, every: int) -> None:
    import keras
    import numpy as np

    from catsdogs.data import loading as data
    from catsdogs.manifest import require_prepared
    from catsdogs.schema import TrialConfig, plan_steps
    from catsdogs.training.model import build_model, loss_and_metrics
    from catsdogs.training.steps import inspection_model, make_optimizer

    manifest = require_prepared(data_dir)
    splits = data.load_dataset(data_dir, "standard")
    train, test = splits["train"], splits["test"]
    cfg = TrialConfig(optimizer, batch_size, "standard", seed, image_size=manifest["params"]["size"],
                      warmup_epochs=warmup_epochs)
    per_epoch, epochs = plan_steps(cfg, len(train))
    keras.utils.set_random_seed(seed)
    model = build_model(cfg.image_size)
    loss, metrics = loss_and_metrics()
    model.compile(optimizer=make_optimizer(cfg, per_epoch, _TensorFlow), loss=loss, metrics=metrics)
    hidden_layer = model.layers[-2]
    pre = keras.Model(model.inputs, model.layers[-3].output)  # the Flatten output: Dense(128)'s input
    inspect = inspection_model(model)
    schedule = data.batch_schedule(len(train), batch_size, seed, per_epoch * epochs)

    def look():
        flat = pre.predict(test.images, batch_size=200, verbose=0)
        w, b = (v.numpy() for v in hidden_layer.weights)
        z = flat @ w + b  # pre-activations, (images, units)
        hidden, logits = inspect.predict(test.images, batch_size=200, verbose=0)
        return z, float((hidden.max(axis=0) <= 0).mean()), float((logits > 0).mean()), float(logits.std())

    z0, dead, dog, spread = look()
    print(f"\n{optimizer} batch {batch_size} seed {seed}" + (f" warm-up {warmup_epochs:g} epochs" if warmup_epochs else "")
          + f": {per_epoch * epochs} updates; the Dense(128) layer's input has {z0.shape and pre.output.shape[-1]} "
          f"features, mean {float(pre.predict(test.images[:50], verbose=0).mean()):.3f}")
    print(" update  dead units  moved (median |Δz| / sd of z between images)  Dog share  logit sd")
    print(f" {0:6d}  {dead:9.0%}  {'':>44}  {dog:9.0%}  {spread:8.3f}")
    previous = z0
    for step, idx in enumerate(schedule, 1):
        model.train_on_batch(train.images[idx], train.labels[idx])
        if step % every and step > 5 and step != len(schedule):
            continue
        z, dead, dog, spread = look()
        moved = np.abs((z - previous).mean(axis=0))  # each unit's shift, common to all images
        ratio = float(np.median(moved / (previous.std(axis=0) + 1e-12)))
        print(f" {step:6d}  {dead:9.0%}  {ratio:44.1f}  {dog:9.0%}  {spread:8.3f}")
        previous = z
    acc = model.evaluate(test.images, test.labels, batch_size=200, verbose=0)[1]
    print(f" test accuracy {acc:.3f}")


class _TensorFlow:
    """The parts of catsdogs.runtime.backends.tensorflow make_optimizer needs (Keras's own optimizers)."""

    @staticmethod
    def optimizer_class(name: str, strategy: str):
        import keras

        return {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}[name]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, required=True, help="prepared data (catsdogs prepare)")
    p.add_argument("--opt", default="adam", choices=["adam", "sgd"])
    p.add_argument("--batch-size", type=int, nargs="+", default=[16, 128])
    p.add_argument("--seed", type=int, nargs="+", default=[0])
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--every", type=int, default=5, help="print every N updates after the first 5")
    a = p.parse_args()
    for bs in a.batch_size:
        for seed in a.seed:
            study(a.data_dir, a.opt, bs, seed, a.warmup_epochs, a.every)


if __name__ == "__main__":
    main()
