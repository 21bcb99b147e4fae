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
    run killed, or stopped before it could delete its own."""
    for path in Path(work).glob(f"*{DECODED_SUFFIX}"):
        pid = path.name.split("-", 1)[0]
        if not pid.isdigit() or not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


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


def holdout(split: Split, share: float = TEST_SHARE) -> tuple[Split, Split]:
    """(train, test): `share` of the images (at least one) held out for testing, the rest to train on."""
    order = np.random.default_rng(0).permutation(len(split))
    n_test = held_out_count(len(split), share)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])

    def take(rows) -> Split:
        return Split(split.images[rows], split.labels[rows], [split.files[i] for i in rows])

    return take(train), take(test)
