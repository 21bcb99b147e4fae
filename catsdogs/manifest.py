"""The prepared data's manifest: the contract between the data stage and every stage after it.

`catsdogs prepare` (catsdogs.data) writes data/manifest.json last, so it is the mark of a
finished prepare; everything downstream reads it through `require_prepared` and nothing else of
how the data was made: the plans (the trials' data fingerprints), the worker's data cache and the
sweep (training), profile and find-batch-size (measure), the report (analysis: the test split's
size). A trial names the images it trained on by the manifest's fingerprints. Like the schema
and the store, it lives at the package root, shared by the stages and part of none.
"""

from __future__ import annotations

import json
from pathlib import Path

from catsdogs import config
from catsdogs.errors import CatsdogsError
from catsdogs.schema import DATASETS

MANIFEST = "manifest.json"
FORMAT = 1  # bump when the prepared layout or pixels change, so old folders get rebuilt


def count_files(root: Path) -> dict:
    counts: dict = {}
    for dataset in DATASETS:  # the augmented set has no test split: it tests on the standard one
        splits = config.SPLIT_NAMES if dataset == "standard" else config.SPLIT_NAMES[:2]
        for s in splits:
            for c in config.CLASSES:
                d = root / dataset / s / c
                n = sum(1 for p in d.iterdir() if p.suffix == ".jpg") if d.is_dir() else 0
                counts.setdefault(dataset, {}).setdefault(s, {})[c] = n
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
    if count_files(Path(data_dir)) != manifest.get("counts"):
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
