"""Where the images come from: a source (URL, .zip, extracted folder, or "synthetic") made into a
PetImages folder on disk, verified, and said where it came from.

    URL        -> data/downloads/NAME (catsdogs.data.download: resumable, verified SHA-256)
    .zip       -> verified, then safely and atomically extracted to data/extracted/<sha>/PetImages
    folder     -> used where it lies (its PetImages/Cat and /Dog checked)
    synthetic  -> a generated archive (catsdogs.data.synthetic), then as a .zip

Extraction refuses a member that would land outside its folder or is a symbolic link, and
extracts into a temporary folder renamed when complete, so a killed prepare leaves nothing that
looks extracted.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from catsdogs import config
from catsdogs.data.download import download, sha256_of
from catsdogs.data.synthetic import make_synthetic_archive
from catsdogs.errors import ArchiveError, ChecksumError, DownloadError, SettingError


def synthetic_valid_count(per_class: int) -> int:
    # A few more valid images than needed, so the seeded choice is a choice.
    return per_class + max(10, per_class // 10)


# The second line of every failed download: each other way in, all three offline.
WITHOUT_DOWNLOAD = ("Without the download: --source FILE.zip (the archive, fetched some other way), "
                    "--source FOLDER (it extracted), or --source synthetic (a generated stand-in; "
                    "`catsdogs reproduce --config quick` runs the whole article on it).")


def source_kind(source: str) -> str:
    """'synthetic', 'url' (http or https) or 'path' (a .zip or an extracted folder)."""
    if source == "synthetic":
        return "synthetic"
    return "url" if re.match(r"^https?://", source) else "path"


def check_source(source: str) -> str:
    """A source prepare can read: 'synthetic', a URL, or a file or folder that exists."""
    if source_kind(source) == "path" and not Path(source).expanduser().exists():
        raise SettingError(f"no such file or folder: {source}", "source")
    return source


def resolve_source(src: str, sha256: str | None, per_class: int, data_dir: Path, log,
                   progress: bool) -> tuple[Path, dict]:
    """The PetImages folder of `src`, verified against `sha256` where one is given, and a
    description of where it came from (the manifest's "source")."""
    downloads = data_dir / "downloads"
    if source_kind(src) == "synthetic":
        n_valid = synthetic_valid_count(per_class)
        archive = downloads / f"synthetic-{n_valid}.zip"
        if not archive.exists():
            downloads.mkdir(parents=True, exist_ok=True)
            log(f"Generating a synthetic PetImages archive ({n_valid} valid images per class) ...")
            make_synthetic_archive(archive, n_valid)
        pets, sha = extract_archive(archive, data_dir, None, log)
        return pets, {"kind": "synthetic", "n_valid": n_valid, "sha256": sha}
    if source_kind(src) == "url":
        name = PurePosixPath(src.split("?")[0]).name or "archive.zip"
        expected_size = config.ARCHIVE_SIZE if src == config.ARCHIVE_URL else None
        try:
            archive = download(src, downloads / name, sha256=sha256,
                               expected_size=expected_size, progress=progress, log=log)
        except ChecksumError:
            raise
        except DownloadError as e:
            e.hint = WITHOUT_DOWNLOAD
            raise
        pets, sha = extract_archive(archive, data_dir, sha256, log)
        return pets, {"kind": "url", "url": src, "sha256": sha}
    path = Path(src).expanduser()
    if path.is_dir():
        pets = path if (path / "Cat").is_dir() else path / "PetImages"
        check_layout(pets, f"--source {src}")
        return pets, {"kind": "folder", "path": str(path.resolve()), "sha256": None}
    pets, sha = extract_archive(path, data_dir, sha256, log)  # a file: prepare checked it exists
    return pets, {"kind": "zip", "path": str(path.resolve()), "sha256": sha}


def check_layout(pets: Path, what: str) -> None:
    missing = [c for c in config.CLASSES if not (pets / c).is_dir()]
    if missing:
        raise ArchiveError(f"{what} has no PetImages/{'/, PetImages/'.join(missing)}/ folder")


def safe_members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """Every member, after making sure none can land outside the target folder."""
    members = zf.infolist()
    for m in members:
        name = m.filename.replace("\\", "/")
        parts = PurePosixPath(name).parts
        if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            raise ArchiveError(f"unsafe path in archive, refusing to extract: {m.filename!r}")
        if (m.external_attr >> 16) & 0o170000 == 0o120000:
            raise ArchiveError(f"symbolic link in archive, refusing to extract: {m.filename!r}")
    return members


def extract_archive(archive: Path, data_dir: Path, sha256: str | None, log) -> tuple[Path, str]:
    """Verify (when a hash is given), then extract to a temporary folder renamed when complete."""
    actual = sha256_of(archive)
    if sha256 and actual.lower() != sha256.lower():
        raise ArchiveError(
            f"{archive} has SHA-256 {actual}, expected {sha256} (pass the right --sha256, or --no-verify)"
        )
    final = data_dir / "extracted" / actual[:16]
    pets = final / "PetImages"
    if pets.is_dir():
        return pets, actual
    if not zipfile.is_zipfile(archive):
        raise ArchiveError(f"{archive} is not a zip archive")
    tmp = final.parent / f".tmp-{actual[:16]}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            members = safe_members(zf)
            log(f"Extracting {len(members):,} members of {archive.name} ...")
            zf.extractall(tmp, members)
        check_layout(tmp / "PetImages", str(archive))
        if final.exists():  # a half-finished older attempt without PetImages
            shutil.rmtree(final)
        os.replace(tmp, final)
    except zipfile.BadZipFile as e:
        raise ArchiveError(f"{archive} is not a readable zip archive: {e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return pets, actual
