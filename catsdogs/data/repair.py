"""Prepared files that changed since `prepare` wrote them, made again one by one.

`prepare` (catsdogs.data.prepare) checks every prepared file against the SHA-256 its manifest
records (catsdogs.manifest.changed_files); what changed is rebuilt here from its source image, to
the bytes recorded, and a folder prepared before the manifest recorded them gains them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from catsdogs import config
from catsdogs.data.images import process_and_write
from catsdogs.data.source import resolve_source
from catsdogs.files import write_json_atomic
from catsdogs.manifest import MANIFEST, PrepareParams, file_digests, prepared_files


def repair(manifest: dict, changed: list[str], params: PrepareParams, data_dir: Path, log, progress) -> bool:
    """Make each of the `changed` files again from its source image, as prepare made it; True
    when every one came out with the bytes the manifest records (each then moved into place, one
    atomic rename at a time, so a kill leaves only whole files). False, with nothing moved, when
    one did not: the source or the image library is not what it was, and only a full prepare
    can say what the data now are. A manifest without per-file digests (0.10.0's) cannot be
    repaired."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return False
    pets, _ = resolve_source(params.source, params.sha256, params.per_class, data_dir, log, progress)
    staging = data_dir / f".staging-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        made = []
        for i, rel in enumerate(changed):
            dataset, split, c, name = rel.split("/")
            original = name.removeprefix("augmented_") if dataset == "augmented" else name
            targets = tuple(str(staging / f"{i}{x}") for x in (".std.jpg", ".orig.jpg", ".aug.jpg"))
            status, payload = process_and_write(str(pets / c / original), params.size, config.MAX_IMAGE_PIXELS,
                                                split != "test", targets)  # type: ignore[arg-type]
            if status != "ok":
                return False
            standard, augmented, _ = payload  # the SHA-256s of what it wrote
            copy = name.startswith("augmented_")
            digest = augmented if copy else standard
            if digest is None or digest.hex() != files[rel]:
                return False
            made.append((Path(targets[2] if copy else targets[0]), data_dir / rel))
        for path, final in made:
            os.replace(path, final)
        return True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def record_file_digests(data_dir: Path, manifest: dict) -> None:
    """A manifest of 0.10.0 or older, whose files were just found to match its fingerprints: add
    each file's SHA-256, so later checks name the file that changed."""
    if "files" not in manifest:
        digests = file_digests(data_dir, sorted(prepared_files(data_dir)))
        manifest["files"] = {rel: d.hex() for rel, d in digests.items()}
        write_json_atomic(data_dir / MANIFEST, manifest, fsync=True)
