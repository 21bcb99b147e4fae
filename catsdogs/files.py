"""Files that are either whole or absent: every result catsdogs writes goes through here.

A reader (another process, a report run while a sweep runs, the next run after a kill -9)
sees the old file or the new one, never half of one: each is written to a temporary name in
the same folder, flushed, then renamed over the target, which POSIX makes atomic.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def temporary_sibling(path: Path) -> Path:
    """A unique hidden name beside `path`: same file system, so the rename is atomic."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


@contextlib.contextmanager
def atomic_path(path: Path | str, fsync: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path | str, write: Callable[[Path], None]) -> Path:
    """write(tmp), then tmp replaces `path`."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def write_text_atomic(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json_atomic(path: Path | str, obj, indent: int | None = 1, fsync: bool = False) -> Path:
    """Strict JSON, atomically (a value that is not finite, NaN or infinity, written as null, which
    every JSON reader takes; Python's NaN is not JSON); `fsync` for the marks of finished work (a
    prepare's manifest)."""
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_text(json.dumps(finite_or_null(obj), indent=indent, default=str, allow_nan=False), encoding="utf-8")
    return Path(path)


def finite_or_null(obj):
    """`obj` with every float that is not finite replaced by None, through dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_null(v) for v in obj]
    return obj


def new_or_ours(path: Path | str, option: str, ours: Callable[[Path], bool], what: str) -> Path:
    """`path` as a file catsdogs may write at a user's word: a new name in an existing folder, or a
    regular file that `ours` recognises as one catsdogs wrote (`what` names it). Anything else (a
    device, a folder, a symbolic link, another program's file) is refused in one line, untouched: a
    rename over it would replace it. A SettingError (a usage error) naming `option`."""
    from catsdogs.errors import SettingError

    path, key = Path(path), option.lstrip("-").replace("-", "_")
    if not str(path).strip() or path.name in ("", ".", ".."):
        raise SettingError(f"{option} needs a file name, got {str(path)!r}", key)
    if path.is_symlink():
        raise SettingError(f"{option} {path} is a symbolic link: give a new file name (catsdogs replaces only "
                           f"{what} it wrote)", key)
    if path.exists():
        if not path.is_file():
            raise SettingError(f"{option} {path} exists and is not a regular file: give a new file name", key)
        if not ours(path):
            raise SettingError(f"{option} {path} exists and is not {what} catsdogs wrote: give a new file name, "
                               "or move it aside", key)
    if not path.parent.is_dir():
        raise SettingError(f"{option} {path}: no folder {path.parent}", key)
    return path

