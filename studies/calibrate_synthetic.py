"""Calibrate the synthetic PetImages stand-in: how well does the article's model learn it?

Generates a synthetic archive (catsdogs.data.synthetic) in a temporary folder, then does its own
minimal version of the pipeline, independent of the rest of catsdogs: decode every member
that Pillow can fully load (as RGB), pick a seeded `--per-class` images per class, split them
60/20/20 into train/validation/test, resize each whole image to `--size` squared with nearest
neighbour (aspect ratio not kept) and re-encode it as JPEG quality 75, like the article's
``load_img`` + ``save_img``. It then trains the article's model (Rescaling 1/255, Conv2D 32
3x3 relu he_uniform same, MaxPool 2x2, Flatten, Dense 128 relu he_uniform, Dense 1 sigmoid;
binary cross-entropy; optimizer by name) for `--epochs` epochs, with ``n_train // batch``
steps per epoch (last partial batch dropped) and a reshuffle every epoch, and prints the test
accuracy for every (optimizer, batch size, seed).

Example::

    python studies/calibrate_synthetic.py --size 200 --per-class 1000 \
        --batch-sizes 16,32,128,256 --optimizers adam,sgd --seeds 0,1

What it measured: studies/README.md.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catsdogs.data.synthetic import CLASS_NAMES, ClassSignal, make_synthetic_archive  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _strs(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def load_split(
    archive: Path, per_class: int, size: int, seed: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Decode, choose, split 60/20/20 and resize: {split: (uint8 images, float labels)}."""
    n_train, n_val = int(per_class * 0.6), int(per_class * 0.2)
    out: dict[str, tuple[list, list]] = {s: ([], []) for s in ("train", "validation", "test")}
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(archive) as zf:
        for label, cls in enumerate(CLASS_NAMES):
            names = sorted(
                (
                    n
                    for n in zf.namelist()
                    if n.startswith(f"PetImages/{cls}/") and n.endswith(".jpg")
                ),
                key=lambda n: int(Path(n).stem),
            )
            valid = []
            for name in names:
                try:
                    with Image.open(io.BytesIO(zf.read(name))) as im:
                        im.load()
                        valid.append((name, im.convert("RGB")))
                except (OSError, Image.DecompressionBombError):
                    continue
            if len(valid) < per_class:
                raise SystemExit(f"{cls}: only {len(valid)} valid images, need {per_class}")
            chosen = [valid[i] for i in sorted(rng.choice(len(valid), per_class, replace=False))]
            chosen = [chosen[i] for i in rng.permutation(per_class)]
            for i, (_, im) in enumerate(chosen):
                split = "train" if i < n_train else "validation" if i < n_train + n_val else "test"
                small = im.resize((size, size), Image.NEAREST)
                buf = io.BytesIO()
                small.save(buf, "JPEG", quality=75)
                buf.seek(0)
                out[split][0].append(np.asarray(Image.open(buf).convert("RGB")))
                out[split][1].append(float(label))
    return {s: (np.stack(x), np.array(y, np.float32)) for s, (x, y) in out.items()}


def train_once(data, size: int, optimizer: str, batch: int, epochs: int, seed: int) -> float:
    """The article's model and schedule; returns the test accuracy."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Conv2D(
                32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"
            ),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    x, y = data["train"]
    train = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
        .batch(batch, drop_remainder=True)
    )
    model.fit(train, epochs=epochs, verbose=0)
    xt, yt = data["test"]
    _, acc = model.evaluate(xt, yt, batch_size=100, verbose=0)
    return float(acc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200, help="square image side (default 200)")
    p.add_argument("--per-class", type=int, default=1000, help="images per class, split 60/20/20")
    p.add_argument("--batch-sizes", type=_ints, default=[32], help="comma list (default 32)")
    p.add_argument("--optimizers", type=_strs, default=["adam"], help="comma list: adam,sgd")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=_ints, default=[0], help="training seeds, comma list")
    p.add_argument("--archive-seed", type=int, default=0, help="seed of the synthetic archive")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the choice and split")
    p.add_argument("--hue-sd", type=float, default=None, help="override ClassSignal.hue_sd")
    p.add_argument("--angle-sd", type=float, default=None, help="override ClassSignal.angle_sd")
    p.add_argument("--scale", type=_floats, default=None, help="override ClassSignal.scale: lo,hi")
    p.add_argument("--hue-mean", type=_floats, default=None, help="override ClassSignal.hue_mean")
    args = p.parse_args(argv)

    overrides = {}
    if args.hue_sd is not None:
        overrides["hue_sd"] = args.hue_sd
    if args.angle_sd is not None:
        overrides["angle_sd"] = args.angle_sd
    if args.scale is not None:
        overrides["scale"] = tuple(args.scale)
    if args.hue_mean is not None:
        overrides["hue_mean"] = tuple(args.hue_mean)
    signal = ClassSignal(**overrides)

    n_valid = args.per_class + 100  # a margin, as the real archive has far more than needed
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "synthetic.zip"
        t0 = time.perf_counter()
        make_synthetic_archive(archive, n_valid, seed=args.archive_seed, signal=signal)
        t1 = time.perf_counter()
        data = load_split(archive, args.per_class, args.size, args.split_seed)
        t2 = time.perf_counter()
    print(f"signal {signal}", flush=True)
    print(
        f"archive n_valid={n_valid}: {t1 - t0:.1f} s; prepare {args.size}px: {t2 - t1:.1f} s; "
        f"train {len(data['train'][0])}, test {len(data['test'][0])}",
        flush=True,
    )
    print("size optimizer batch seed test_acc seconds", flush=True)
    for opt in args.optimizers:
        for batch in args.batch_sizes:
            accs = []
            for seed in args.seeds:
                t = time.perf_counter()
                acc = train_once(data, args.size, opt, batch, args.epochs, seed)
                accs.append(acc)
                print(
                    f"{args.size} {opt} {batch} {seed} {acc:.4f} {time.perf_counter() - t:.0f}",
                    flush=True,
                )
            print(
                f"# {args.size} {opt} {batch}: mean {np.mean(accs):.4f} over {len(accs)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
