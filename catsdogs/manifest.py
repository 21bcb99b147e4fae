"""The prepared data's manifest: the contract between the data stage and every stage after it.

`catsdogs prepare` (catsdogs.data) writes data/manifest.json last, so it is the mark of a
finished prepare; everything downstream reads it through `require_prepared` and nothing else of
how the data was made: the plans (the trials' data fingerprints), the worker's data cache and the
sweep (training), profile and find-batch-size (measure), the report (analysis: the test split's
size). A trial names the images it trained on by the manifest's fingerprints. Like the schema
and the store, it lives at the package root, shared by the stages and part of none.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from catsdogs import config
from catsdogs.errors import CatsdogsError
from catsdogs.schema import DATASETS

MANIFEST = "manifest.json"
FORMAT = 1  # bump when the prepared layout or pixels change, so old folders get rebuilt
# The folders each data set's fingerprint covers: the augmented set tests on the standard test split.
FINGERPRINT_DIRS = {"standard": ("standard",), "augmented": ("augmented", "standard/test")}


@dataclass(frozen=True)
class PrepareParams:
    """What a prepare was asked for: the manifest's `params`, and what must match for a prepared
    folder to be reused (`key`). Here, beside the manifest, as both the data stage's `prepare` and
    its `repair` read it."""

    source: str  # as given: URL, path, or "synthetic"
    sha256: str | None  # the hash the archive must have; None = verification skipped
    per_class: int
    split: tuple[int, int, int]
    size: int
    seed: int

    def key(self) -> dict:
        """What must match for an existing prepared folder to be reused."""
        d = asdict(self)
        d["split"] = list(self.split)
        d["format"] = FORMAT
        d["augment_scale"] = config.AUGMENT_SCALE
        d["jpeg_quality"] = config.JPEG_QUALITY
        return d


def count_files(root: Path) -> dict:
    """The .jpg files in each class folder of each split of each data set under `root`."""
    counts: dict = {}
    for dataset, s, c in _class_folders():
        d = root / dataset / s / c
        n = sum(1 for p in d.iterdir() if p.suffix == ".jpg") if d.is_dir() else 0
        counts.setdefault(dataset, {}).setdefault(s, {})[c] = n
    return counts


def _class_folders() -> list[tuple[str, str, str]]:
    # the augmented set has no test split: it tests on the standard one
    return [(dataset, s, c) for dataset in DATASETS
            for s in (config.SPLIT_NAMES if dataset == "standard" else config.SPLIT_NAMES[:2])
            for c in config.CLASSES]


# root -> (its class folders' stamps, their counts): load_manifest's count, listed again only
# when a folder changed. Every trial loads the manifest, and listing the article's 5,200 files
# cost it 13 ms here (a race's trial 1-4 s, the H200's median trial 0.62 s).
_COUNTED: dict[str, tuple[tuple, dict]] = {}
RACY_SECONDS = 2.0  # a folder changed this recently is listed every time (below)


def _counted(root: Path) -> dict:
    """count_files(root), from the last count where no class folder changed since. Adding,
    removing or renaming a file sets its folder's modification time; a folder modified within
    RACY_SECONDS of the count is listed again next time, as git treats a racily clean index entry,
    since a change in the same clock tick as the count would leave the time as it was."""
    stamps = []
    for dataset, s, c in _class_folders():
        try:
            st = (root / dataset / s / c).stat()
            stamps.append((st.st_ino, st.st_mtime_ns))
        except OSError:
            stamps.append(None)
    key, stamp = str(root.resolve()), tuple(stamps)
    cached = _COUNTED.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    counts = count_files(root)
    newest = max((t[1] for t in stamps if t is not None), default=0)
    if time.time_ns() - newest > RACY_SECONDS * 1e9:
        _COUNTED[key] = (stamp, counts)
    return counts


def test_images(counts: dict) -> int:
    """How many images every trial's accuracy is measured on, from a manifest's `counts`: the
    standard test split, which both data sets test on (catsdogs.data.loading.FOLDERS)."""
    return sum(counts["standard"]["test"].values())


def load_manifest(data_dir: Path) -> dict | None:
    """The manifest of a finished prepare whose folders are all there, or None: a missing, half
    written or damaged one (not JSON, or JSON of another shape) is no finished prepare, and
    `prepare` rebuilds it."""
    try:
        manifest = json.loads((Path(data_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not well_formed(manifest):
        return None
    if _counted(Path(data_dir)) != manifest.get("counts"):
        return None
    return manifest


def well_formed(manifest) -> bool:
    """Whether a decoded manifest.json has what every reader takes from it: an object, complete
    and of this FORMAT, its parameters (the image size a whole number), its source, and a
    fingerprint (text) for each data set."""
    if not isinstance(manifest, dict) or manifest.get("complete") is not True or manifest.get("format") != FORMAT:
        return False
    params, source, fingerprint = manifest.get("params"), manifest.get("source"), manifest.get("fingerprint")
    return (isinstance(params, dict) and isinstance(params.get("size"), int) and not isinstance(params["size"], bool)
            and isinstance(source, dict) and isinstance(fingerprint, dict)
            and all(isinstance(fingerprint.get(d), str) for d in DATASETS))


def fingerprint_of(digests: dict[str, bytes], dirs) -> str:
    """SHA-256 over the relative path and the SHA-256 of every prepared .jpg under `dirs` (paths
    sorted part by part, as pathlib sorts them): what names the data a trial trained on."""
    h = hashlib.sha256()
    for d in dirs:
        inside = (r for r in digests if r.startswith(d + "/") and r.endswith(".jpg"))
        for rel in sorted(inside, key=lambda r: r.split("/")):
            h.update(rel.encode() + b"\0")
            h.update(digests[rel])
    return h.hexdigest()


def file_digests(data_dir: Path, rels) -> dict[str, bytes]:
    """The SHA-256 of each prepared file (by path relative to `data_dir`), read once per file:
    a standard image and its augmented folder's original are often one file (a hard link)."""
    by_inode: dict[tuple[int, int], bytes] = {}
    out = {}
    for rel in rels:
        path = Path(data_dir) / rel
        try:
            st = path.stat()
            inode = (st.st_dev, st.st_ino)
            if inode not in by_inode:
                with open(path, "rb") as f:
                    by_inode[inode] = hashlib.sha256(f.read()).digest()
            out[rel] = by_inode[inode]
        except OSError:
            out[rel] = b""  # missing or unreadable: matches no digest
    return out


def prepared_files(data_dir: Path) -> list[str]:
    """Every prepared .jpg, as a path relative to `data_dir`."""
    root = Path(data_dir)
    return [os.path.relpath(os.path.join(d, n), root) for name in ("standard", "augmented")
            for d, _, names in os.walk(root / name) for n in names if n.endswith(".jpg")]


def changed_files(data_dir: Path, manifest: dict) -> list[str]:
    """The prepared files whose bytes are no longer those the prepare wrote (by the manifest's
    `files`, each file's SHA-256), in the manifest's order; [] when all match. A manifest written
    before catsdogs recorded `files` (0.10.0 and older) has only its fingerprints to check: then
    the answer is every file of a data set whose fingerprint no longer matches."""
    files = manifest.get("files")
    if isinstance(files, dict):
        now = file_digests(data_dir, files)
        return [rel for rel, digest in files.items() if now[rel].hex() != digest]
    now = file_digests(data_dir, prepared_files(data_dir))
    return sorted(rel for dataset, dirs in FINGERPRINT_DIRS.items()
                  if fingerprint_of(now, dirs) != manifest["fingerprint"][dataset]
                  for rel in now if any(rel.startswith(d + "/") for d in dirs))


def require_intact(data_dir: Path) -> dict:
    """require_prepared(), and every prepared file as the prepare wrote it: a file changed since
    (replaced, edited, damaged) is a one-line CatsdogsError naming it and the fix, so no trial
    trains on other data under the prepared data's fingerprint (docs/usage.md, "Prepared data")."""
    manifest = require_prepared(data_dir)
    changed = changed_files(data_dir, manifest)
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise CatsdogsError(
            f"{Path(data_dir) / changed[0]}{more} changed since `catsdogs prepare` wrote it; "
            f"run `catsdogs prepare --data-dir {data_dir}` with the options it was prepared with "
            "(manifest.json's params) to rebuild what changed")
    return manifest


def require_prepared(data_dir: Path) -> dict:
    """The manifest of a finished prepare in `data_dir`; a one-line CatsdogsError (exit 1: a
    missing or damaged data folder is not a bad option) that says how to make one."""
    manifest = load_manifest(data_dir)
    if manifest is None:
        raise CatsdogsError(
            f"{data_dir} holds no finished prepared data set (no valid {MANIFEST}); "
            f"run `catsdogs prepare --data-dir {data_dir}` first"
        )
    return manifest
