"""A user's images by folder (--data DIR): one subfolder per class, as
`keras.utils.image_dataset_from_directory` reads them, decoded and resized to a model's input once
and held in memory as the prepared data are (catsdogs.data.loading). Nothing here imports a
framework.

`scan` reads the layout alone: the classes (subfolders, sorted by name, hidden ones left out)
and each one's image files (by extension). A folder with fewer than two classes, or a class
without an image file, is a SettingError naming `data`. `load` decodes every file with Pillow
(RGB for 3 channels, greyscale for 1), resized to the model's height x width with bilinear
filtering (Keras's default), into one array: uint8 for a uint8 input, else float32 in 0-255 (what
image_dataset_from_directory gives a model). A file that does not decode is left out and
counted; a class left without any image is a SettingError. `fingerprint` changes when a file is
added, removed or rewritten, so a worker's cached copy is decoded again.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from catsdogs.data.loading import Split
from catsdogs.errors import SettingError
from catsdogs.host import process_alive

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")  # image_dataset_from_directory's (Keras 3)


@dataclass(frozen=True)
class Folder:
    """A folder's classes and each one's image files (relative to the folder), sorted."""

    root: Path
    classes: tuple[str, ...]
    files: dict[str, tuple[str, ...]] = field(hash=False)

    @property
    def count(self) -> int:
        return sum(len(f) for f in self.files.values())


@dataclass
class Loaded:
    """The decoded images (a Split: labels are class indices) and the files left out."""

    split: Split
    undecodable: list[str]


def scan(root: Path) -> Folder:
    """The layout of `root`, or a SettingError naming `data`."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise SettingError(f"{root} is not a folder (expected one subfolder of images per class)", "data")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise SettingError(f"{root} holds {len(classes)} class folder{'s' if len(classes) != 1 else ''}; "
                           "a classifier needs at least 2 (one subfolder of images per class)", "data")
    files = {}
    for c in classes:
        found = sorted(str(p.relative_to(root)) for p in (root / c).rglob("*")
                       if p.is_file() and p.suffix.lower() in EXTENSIONS)
        if not found:
            raise SettingError(f"class folder {c!r} in {root} holds no image file ({', '.join(EXTENSIONS)})", "data")
        files[c] = tuple(found)
    return Folder(root.resolve(), tuple(classes), files)


def fingerprint(folder: Folder) -> str:
    """A digest of every file's name, size and modification time."""
    digest = hashlib.sha256()
    for c in folder.classes:
        for name in folder.files[c]:
            st = (folder.root / name).stat()
            digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def load(folder: Folder, height: int, width: int, channels: int, dtype: str = "uint8") -> Loaded:
    """Every image decoded and resized to height x width x channels; see the module's docstring."""
    if channels not in (1, 3):
        raise SettingError(f"a model's input of {channels} channels cannot be read from images (1 or 3)", "data")
    paths = [(label, name) for label, c in enumerate(folder.classes) for name in folder.files[c]]
    images = np.empty((len(paths), height, width, channels), dtype=np.uint8)
    ok = np.zeros(len(paths), dtype=bool)

    def decode(i: int) -> None:
        try:
            with Image.open(folder.root / paths[i][1]) as img:
                img = eight_bit(img).convert("RGB" if channels == 3 else "L").resize((width, height), Image.BILINEAR)
                images[i] = np.asarray(img).reshape(height, width, channels)
            ok[i] = True
        except Exception:  # noqa: BLE001 - whatever Pillow raises, the file does not decode: counted below
            pass

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(decode, range(len(paths))))
    every_label = np.asarray([label for label, _ in paths])
    for label, c in enumerate(folder.classes):
        if not ok[every_label == label].any():
            raise SettingError(f"no image of class folder {c!r} in {folder.root} decodes", "data")
    kept = np.flatnonzero(ok)
    labels = every_label[kept].astype(np.float32)
    chosen = images[kept] if "int" in dtype else images[kept].astype(np.float32)
    return Loaded(Split(chosen, labels, [paths[i][1] for i in kept]),
                  [paths[i][1] for i in np.flatnonzero(~ok)])


DECODED_SUFFIX = ".decoded.npz"  # a folder decoded once by the parent, read by the workers


def save_decoded(split: Split, path: Path) -> Path:
    """The decoded images (uint8, as `load` gives them), their labels and names, in one file the
    workers read instead of decoding the folder again: the decoder's own memory (a 12,000-pixel
    PNG's, thousands of files' handles) then never counts in a probe's peak. Written whole or not."""
    from catsdogs.files import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, images=split.images, labels=split.labels, files=np.asarray(split.files, dtype=str))
    return path


def remove_orphaned_copies(work: Path) -> None:
    """The decoded copies in `work` whose process (the number their name begins with) is gone: a
    run killed, or stopped before it could delete its own; and the temporaries of copies a killed
    run was writing (files.temporary_sibling's ".NAME.XXXXXXXX.tmp")."""
    for path in [*Path(work).glob(f"*{DECODED_SUFFIX}"), *Path(work).glob(f".*{DECODED_SUFFIX}.*.tmp")]:
        pid = path.name.lstrip(".").split("-", 1)[0]
        if not pid.isdigit() or not process_alive(int(pid)):
            path.unlink(missing_ok=True)


def load_decoded(path: Path, dtype: str = "uint8") -> Split:
    """`save_decoded`'s file as a Split, cast for a model of float input as `load` casts."""
    with np.load(path) as saved:
        images = saved["images"] if "int" in dtype else saved["images"].astype(np.float32)
        return Split(images, saved["labels"], saved["files"].tolist())


def eight_bit(img: Image.Image) -> Image.Image:
    """A 16-bit grey image (Pillow's modes I;16 and I) as 8 bits the way Keras's decode_png gives it,
    its top byte (32,768 -> 128), where Pillow's own conversion clips every value above 255 to white.
    Any other image as it is (Pillow reads 16-bit colour PNGs as 8-bit RGB already)."""
    if not (img.mode.startswith("I;16") or img.mode == "I"):
        return img
    values = np.asarray(img).astype(np.int64)
    return Image.fromarray((np.clip(values, 0, 65535) >> 8).astype(np.uint8), "L")


# A trial on a user's folder (the noise scale's short runs) tests on this share of it, drawn once
# by a fixed seed, so the folder's test images are the same for every seed and backend.
TEST_SHARE = 0.1


def held_out_count(n: int, share: float = TEST_SHARE) -> int:
    """The images of `n` that `holdout` keeps for testing: `share` of them, at least one."""
    return max(1, int(round(share * n)))


def train_count(n: int, share: float = TEST_SHARE) -> int:
    """The images of `n` that `holdout` leaves to train on (none of none)."""
    return max(0, n - held_out_count(n, share)) if n else 0


def race_splits(split: Split) -> tuple[Split, Split, Split]:
    """(train, validation, test) of a user's images for a race, whose target is on a validation
    split a folder lacks: the test tenth `holdout` keeps, then a tenth of the rest for validation."""
    train, test = holdout(split)
    train, validation = holdout(train)
    return train, validation, test


def race_train_count(n: int) -> int:
    """The images of `n` that `race_splits` leaves to train on."""
    return train_count(train_count(n))


def holdout(split: Split, share: float = TEST_SHARE) -> tuple[Split, Split]:
    """(train, test): `share` of the images (at least one) held out for testing, the rest to train on."""
    order = np.random.default_rng(0).permutation(len(split))
    n_test = held_out_count(len(split), share)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])

    def take(rows) -> Split:
        return Split(split.images[rows], split.labels[rows], [split.files[i] for i in rows])

    return take(train), take(test)


def from_arrays(x, y, shape: tuple[int, int, int] | None = None, classes: int | None = None) -> Split:
    """A user's images given as numpy arrays (the Python API's `data=(x, y)`) as the Split a
    folder decodes to: `x` (n, height, width, channels), kept uint8 when it is, else float32 as
    given (the model sees exactly what it would in the user's own `fit`); `y` the class indices
    (n,) or (n, 1). A SettingError naming `data` for arrays no probe could train on: not numeric,
    of two lengths, not four-dimensional, not the model's input `shape`, a non-finite pixel, a
    label that is not a whole number in 0 .. `classes` - 1, or fewer than two classes."""
    try:
        x, y = np.asarray(x), np.asarray(y)
    except Exception as exc:  # noqa: BLE001 - whatever numpy says of a ragged or odd object
        raise SettingError(f"(x, y) do not read as numpy arrays: {exc}", "data") from None
    if x.dtype.kind not in "uif" or y.dtype.kind not in "uif":
        raise SettingError(f"images and labels must be numbers, got {x.dtype} and {y.dtype}", "data")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise SettingError(f"labels must be class indices of shape (n,), got shape {y.shape} (one-hot labels: "
                           "give y.argmax(axis=1))", "data")
    if x.ndim != 4 or len(x) != len(y) or len(x) == 0:
        raise SettingError(f"images of shape (n, height, width, channels) and as many labels, got {x.shape} and "
                           f"{len(y):,} labels", "data")
    if shape is not None and tuple(x.shape[1:]) != tuple(shape):
        raise SettingError(f"images of {' x '.join(map(str, x.shape[1:]))}, the model takes "
                           f"{' x '.join(map(str, shape))}", "data")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise SettingError(f"{int((~np.isfinite(x)).any(axis=(1, 2, 3)).sum()):,} images hold a NaN or "
                           "infinite value", "data")
    bad = y[~np.isfinite(y) | (y != np.round(y)) | (y < 0) | (y >= (classes or np.inf))]
    if bad.size:
        upto = f" in 0 .. {classes - 1} (the model's classes)" if classes else ""
        raise SettingError(f"labels must be whole numbers{upto}, got {bad[0].item()!r}", "data")
    if len(np.unique(y)) < 2:
        raise SettingError("the labels name one class; a classifier needs at least 2", "data")
    images = x if x.dtype == np.uint8 else x.astype(np.float32, copy=False)  # (checked twice: copied once)
    return Split(images, y.astype(np.float32), [f"x[{i}]" for i in range(len(x))])


def save_decoded_copy(split: Split, work: Path, source: str, shape) -> str:
    """The workers' copy of a user's decoded images in the run's work folder (`save_decoded`),
    named by `source` (the folder's fingerprint, the arrays' digest) and the shape (`copy_path`)."""
    return str(save_decoded(split, copy_path(work, f"{source}-{'x'.join(map(str, shape))}")))


def copy_path(work: Path, source: str) -> Path:
    """Where this process writes a decoded copy of `source` in the run's work folder: named by this
    process (two runs of one name never share one), after the copies of runs that are gone are
    removed (`remove_orphaned_copies`). A user's images' (`save_decoded_copy`) and the prepared
    data's (catsdogs.measure.probe_run.DecodedCopy)."""
    remove_orphaned_copies(Path(work))
    return Path(work) / f"{os.getpid()}-{source}{DECODED_SUFFIX}"


def digest(split: Split) -> str:
    """A digest of a Split's pixels and labels: what arrays a result was measured on."""
    h = hashlib.sha256()
    for a in (split.images, split.labels):
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]
