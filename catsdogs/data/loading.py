"""The input data: prepared folders -> uint8 arrays in memory -> each epoch's batch order.

Each image is decoded once, with Pillow (as Keras 2's flow_from_directory did, so the pixels
the model sees are the article's), and kept as uint8: 200 x 200 x 3 bytes, a quarter of
float32. An epoch is a seeded permutation of the images, cut into full batches (the last
partial batch is dropped, as `steps_per_epoch = n // batch_size` did), each batch gathered from
memory in one op and prefetched, so the device never waits for the host (the backend's
`train_batches`: catsdogs.runtime.backends). Nothing here imports a framework.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from catsdogs import config

# What each dataset trains and validates on; both test on the 400 standard test images.
FOLDERS = {
    "standard": {"train": "standard/train", "validation": "standard/validation", "test": "standard/test"},
    "augmented": {"train": "augmented/train", "validation": "augmented/validation", "test": "standard/test"},
}


@dataclass
class Split:
    images: np.ndarray  # (n, size, size, 3) uint8
    labels: np.ndarray  # (n,) float32, Cat = 0, Dog = 1
    files: list[str]

    def __len__(self) -> int:
        return len(self.labels)


def load_split(folder: Path) -> Split:
    """Every image of folder/{Cat,Dog}, in sorted order, decoded once by Pillow.

    One thread per core (Pillow drops the GIL while decoding), each writing straight into
    one preallocated array: no per-image copies, no stacking."""
    paths, labels = [], []
    for label, cls in enumerate(config.CLASSES):
        files = sorted((folder / cls).glob("*.jpg"))
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise FileNotFoundError(f"no images under {folder}")
    with Image.open(paths[0]) as first:
        width, height = first.size
    images = np.empty((len(paths), height, width, 3), dtype=np.uint8)

    def decode(i: int) -> None:
        with Image.open(paths[i]) as img:
            images[i] = np.asarray(img if img.mode == "RGB" else img.convert("RGB"))

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(decode, range(len(paths))))
    return Split(images, np.asarray(labels, dtype=np.float32), [str(p.relative_to(folder)) for p in paths])


def load_dataset(data_dir: Path, dataset: str) -> dict[str, Split]:
    if dataset not in FOLDERS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(FOLDERS)}")
    return {split: load_split(Path(data_dir) / sub) for split, sub in FOLDERS[dataset].items()}


def save_decoded(splits: dict[str, Split], fingerprint: str, path: Path) -> Path:
    """A data set's splits as decoded here, with the fingerprint they were decoded at, in one file
    that workers read (`load_decoded`) instead of decoding the JPEGs again: find-batch-size's
    fresh workers each decoded the same images (0.50 s at 64 px for 2,000 of them on two cores,
    0.02 s read from here: benchmarks/bench_decoded_copy.py). Written whole or not."""
    from catsdogs.files import atomic_path

    arrays = {"fingerprint": np.asarray(fingerprint)}
    for name, split in splits.items():
        arrays |= {f"{name}.images": split.images, f"{name}.labels": split.labels,
                   f"{name}.files": np.asarray(split.files, dtype=str)}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return Path(path)


def load_decoded(path: Path) -> tuple[str, dict[str, Split]]:
    """`save_decoded`'s file: (the fingerprint, the splits)."""
    with np.load(path) as saved:
        names = sorted({key.rsplit(".", 1)[0] for key in saved.files if key != "fingerprint"})
        splits = {name: Split(saved[f"{name}.images"], saved[f"{name}.labels"], saved[f"{name}.files"].tolist())
                  for name in names}
        return str(saved["fingerprint"]), splits


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the n training images in one epoch: a permutation drawn from the trial's
    seed and the epoch's number alone, so it cannot depend on how often an iterator restarts."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_schedule(n: int, batch_size: int, seed: int, n_batches: int, cross_epochs: bool = False) -> np.ndarray:
    """(n_batches, batch_size) image indices, epoch after epoch.

    The article's protocol: each epoch's order cut into n // batch_size full batches, the
    remainder dropped. With `cross_epochs` (the step budget) the orders are joined first, so a
    batch may span two epochs and nothing but the very end is dropped."""
    if cross_epochs:
        n_epochs = -(-n_batches * batch_size // n)
        flat = np.concatenate([epoch_order(n, seed, e) for e in range(n_epochs)])
        return flat[: n_batches * batch_size].reshape(n_batches, batch_size)
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch size {batch_size} is larger than the {n} images: no full batch per epoch")
    n_epochs = -(-n_batches // per_epoch)
    epochs = [epoch_order(n, seed, e)[: per_epoch * batch_size].reshape(per_epoch, batch_size)
              for e in range(n_epochs)]
    return np.concatenate(epochs)[:n_batches]
