"""Fetch the archive: resumable, retried, and verified before it is moved into place.

The PetImages archive is ~800 MB on a server that sometimes drops connections, so a
download streams into ``<dest>.part``, picks up where it left off with an HTTP Range
request, retries transient failures with exponential backoff, and only renames the file
to ``dest`` once its size and SHA-256 are right. A half-written or corrupt archive is
therefore never mistaken for the real one.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from catsdogs.errors import ChecksumError, DownloadError, UnreachableError
from catsdogs.version import __version__

# A server that no attempt could connect to (no network, a name that does not resolve, a refused
# port) is tried this many more times, not `retries`: the user is most likely offline, and waiting
# half a minute to be told so helps no one. A connection lost mid-body keeps every retry.
CONNECT_RETRIES = 2
CHUNK_SIZE = 1 << 20  # 1 MiB: large enough to keep syscalls cheap, small enough for a smooth bar
# Some servers refuse urllib's default "Python-urllib/3.x" agent.
USER_AGENT = f"catsdogs/{__version__} (+urllib)"

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class _Retryable(Exception):
    """A failure worth another attempt: HTTP 5xx/429 or a body that ended early."""


class _RangeNotSatisfiable(Exception):
    """The server answered a Range request with 416."""


# Everything here is a property of the network, not of the request, so trying again can
# help. urllib.error.URLError covers refused/unreachable connections and connect
# timeouts; HTTPError (its subclass) never reaches the retry loop because _request turns
# it into DownloadError or _Retryable first.
_TRANSIENT = (
    _Retryable,
    urllib.error.URLError,
    TimeoutError,
    ConnectionError,  # includes ConnectionResetError and http.client.RemoteDisconnected
    http.client.HTTPException,  # includes IncompleteRead
)


def sha256_of(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks so an 800 MB archive never sits in memory."""
    digest = hashlib.sha256()
    _hash_file_into(digest, Path(path))
    return digest.hexdigest()


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None,
    expected_size: int | None = None,
    retries: int = 5,
    backoff: float = 1.0,
    timeout: float = 60.0,
    progress: bool = True,
    log=print,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``; see the module docstring.

    Raises DownloadError when the server refuses (4xx) or the network stays down after
    ``retries`` retries, and ChecksumError when the bytes are not the expected ones.
    """
    dest = Path(dest)
    want_sha = sha256.strip().lower() if sha256 else None

    if dest.exists():
        return _verify_existing(dest, want_sha, log)

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not progress) as bar:
        task = bar.add_task(dest.name, total=expected_size)
        digest, total = _download_with_retries(
            url,
            part,
            retries=retries,
            backoff=backoff,
            timeout=timeout,
            log=log,
            bar=bar,
            task=task,
        )

    _check_size(url, part, expected_size, total)
    if want_sha is not None and digest != want_sha:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"SHA-256 mismatch for {url}: expected {want_sha}, got {digest}")

    os.replace(part, dest)
    log(f"Downloaded {dest} ({dest.stat().st_size:,} bytes, SHA-256 {digest})")
    return dest


def _verify_existing(dest: Path, want_sha: str | None, log) -> Path:
    """An archive already in place is trusted only if its hash matches (or none was asked)."""
    if want_sha is None:
        log(f"{dest} is already there; not downloading it again")
        return dest
    actual = sha256_of(dest)
    if actual != want_sha:
        raise ChecksumError(
            f"{dest} exists but its SHA-256 is {actual}, expected {want_sha}; "
            "delete it or pass the right --sha256"
        )
    log(f"{dest} is already there and its SHA-256 matches")
    return dest


def _download_with_retries(
    url: str,
    part: Path,
    *,
    retries: int,
    backoff: float,
    timeout: float,
    log,
    bar: Progress,
    task: TaskID,
) -> tuple[str, int | None]:
    """Run attempts until one delivers the whole body; return (sha256 hex, total size)."""
    last_error = ""
    connected = False  # whether any attempt reached the server
    for attempt in range(retries + 1):
        try:
            response, offset, total = _open(url, part, timeout, log)
            connected = True
            bar.update(task, total=total, completed=offset)
            digest = _stream(response, part, offset, total, bar, task)
            return digest, total
        except _TRANSIENT as exc:
            last_error = _describe(exc)
            # urlopen wraps every failure to connect in a URLError; anything else came from a server
            connected = connected or not isinstance(exc, urllib.error.URLError)
            allowed = retries if connected else min(retries, CONNECT_RETRIES)
            if attempt >= allowed:
                break
            delay = backoff * 2**attempt
            log(
                f"Download interrupted ({last_error}); retrying in {delay:g}s "
                f"(retry {attempt + 1} of {allowed})"
            )
            time.sleep(delay)
    if not connected:
        host = urllib.parse.urlsplit(url).netloc
        raise UnreachableError(f"Cannot reach {host} (no network?) to download {url}: {last_error}, "
                               f"after {attempt} retries")
    raise DownloadError(f"Could not download {url} after {retries} retries: {last_error}")


def _open(url: str, part: Path, timeout: float, log):
    """Open the response to read next: (response, byte offset it starts at, total or None).

    Resumes from whatever ``part`` holds when the server agrees to; otherwise empties
    ``part`` so the full body is written from byte 0.
    """
    have = part.stat().st_size if part.exists() else 0
    if have == 0:
        response = _request(url, timeout)
        return response, 0, _content_length(response)

    try:
        response = _request(url, timeout, start=have)
    except _RangeNotSatisfiable:
        log(f"Server cannot resume at byte {have:,} (HTTP 416); starting over")
        return _start_over(url, part, timeout)

    if response.status == 206:
        header = response.headers.get("Content-Range")
        span = _parse_content_range(header)
        if span is not None and span[0] == have:
            log(f"Resuming {part.name} at byte {have:,}")
            return response, have, span[2]
        # Appending bytes from any other offset would silently corrupt the file.
        response.close()
        log(
            f"Server answered the resume with Content-Range {header!r}, not bytes {have}-; starting over"
        )
        return _start_over(url, part, timeout)

    # A 200 carries the whole body from byte 0, so what the .part held is discarded.
    log(f"Server ignored the resume request (HTTP {response.status}); starting over")
    _truncate(part)
    return response, 0, _content_length(response)


def _start_over(url: str, part: Path, timeout: float):
    # Truncate before asking, so even if this request fails the next attempt does not
    # try to resume the bytes the server just refused to continue.
    _truncate(part)
    response = _request(url, timeout)
    return response, 0, _content_length(response)


def _request(url: str, timeout: float, *, start: int = 0):
    """urlopen with HTTP errors sorted into permanent (DownloadError) and retryable."""
    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        err.close()  # it holds the open error response
        if err.code == 416 and start:
            raise _RangeNotSatisfiable from None
        message = f"HTTP {err.code} {err.reason}: {url}"
        if err.code == 429 or err.code >= 500:
            raise _Retryable(message) from None
        raise DownloadError(message) from None


def _stream(
    response, part: Path, offset: int, total: int | None, bar: Progress, task: TaskID
) -> str:
    """Write the body to ``part`` from ``offset``; return the SHA-256 of the whole file."""
    digest = hashlib.sha256()
    if offset:
        # The final hash must cover the bytes an earlier attempt already wrote.
        _hash_file_into(digest, part)
    expected = total - offset if total is not None else _content_length(response)

    # read1 returns whatever has arrived (up to a chunk) instead of waiting for a full
    # chunk, so bytes received before a stall are on disk when the read times out and the
    # next attempt resumes after them rather than up to a chunk earlier.
    read = getattr(response, "read1", response.read)
    received = 0
    with response, open(part, "ab" if offset else "wb") as out:
        while chunk := read(CHUNK_SIZE):
            out.write(chunk)
            digest.update(chunk)
            received += len(chunk)
            bar.advance(task, len(chunk))
        # http.client returns b"" rather than raising when a connection closes before
        # Content-Length bytes arrived, so a short body has to be caught here.
        if expected is not None and received < expected:
            raise _Retryable(
                f"connection closed after {offset + received:,} of {offset + expected:,} bytes"
            )
        out.flush()
        os.fsync(out.fileno())  # the rename that follows must not outrun the data
    return digest.hexdigest()


def _check_size(url: str, part: Path, expected_size: int | None, total: int | None) -> None:
    size = part.stat().st_size
    for want, source in ((expected_size, "expected"), (total, "announced by the server")):
        if want is not None and size != want:
            part.unlink(missing_ok=True)
            raise ChecksumError(f"Size mismatch for {url}: {source} {want:,} bytes, got {size:,}")


def _parse_content_range(header: str | None) -> tuple[int, int, int | None] | None:
    """'bytes START-END/TOTAL' -> (start, end, total or None when '*'); None if malformed."""
    match = _CONTENT_RANGE.match(header or "")
    if match is None:
        return None
    start, end, total = match.groups()
    return int(start), int(end), None if total == "*" else int(total)


def _content_length(response) -> int | None:
    value = response.headers.get("Content-Length")
    return int(value) if value and value.strip().isdigit() else None


def _truncate(part: Path) -> None:
    with open(part, "wb"):
        pass


def _hash_file_into(digest, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_SIZE):
            digest.update(chunk)


def _describe(exc: BaseException) -> str:
    """A short, one-line reason for a log line or error message."""
    if isinstance(exc, _Retryable):
        return str(exc)
    if isinstance(exc, urllib.error.URLError):
        # URLError wraps the socket error that actually happened; report that one.
        if not isinstance(exc.reason, BaseException):
            return str(exc.reason)
        exc = exc.reason
    if isinstance(exc, http.client.IncompleteRead):
        return "connection closed before the body was complete"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
