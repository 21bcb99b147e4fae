"""download(): resume, retry and verification against a real local HTTP server.

The server runs in a thread on 127.0.0.1 and misbehaves on request (``server.mode``),
so each test exercises the real urllib / http.client code paths, not a mock of them.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
import socket
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from catsdogs.data.download import CONNECT_RETRIES, download, sha256_of
from catsdogs.errors import ChecksumError, DownloadError, UnreachableError

FAST = {"progress": False, "backoff": 0.01, "timeout": 5.0}


# --- the payload and the server ------------------------------------------------------------


@pytest.fixture
def payload() -> bytes:
    """The archive the server hands out: a zip of ~300 KB of seeded random bytes.

    The only place the payload is made, so it can be swapped for the project's synthetic
    archive without touching any test.
    """
    noise = random.Random(0).randbytes(300_000)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("PetImages/noise.bin", noise)
    return buffer.getvalue()


@dataclass
class Server:
    """What a test controls and observes: the mode, and the Range header of every request."""

    payload: bytes
    url: str = ""
    mode: str = "normal"  # normal | cut | stall | ignore-range | bad-range | 404 | flaky | down
    ranges: list[str | None] = field(default_factory=list)
    cut_done: bool = False
    failures_left: int = 2  # for "flaky"
    release: threading.Event = field(default_factory=threading.Event)  # ends a "stall"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.payload).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        state: Server = self.server.state
        body = state.payload
        range_header = self.headers.get("Range")
        state.ranges.append(range_header)

        if state.mode == "404":
            return self._reply(404, b"not here")
        if state.mode == "down":
            return self._reply(503, b"try later")
        if state.mode == "flaky" and state.failures_left > 0:
            state.failures_left -= 1
            return self._reply(503, b"try later")
        if state.mode == "ignore-range":
            return self._reply(200, body)
        if state.mode == "cut" and range_header is None and not state.cut_done:
            # Promise the whole body, deliver half, hang up: a dropped connection.
            state.cut_done = True
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._write(body[: len(body) // 2])
            self.close_connection = True
            return None
        if state.mode == "stall" and range_header is None and not state.cut_done:
            # Deliver half, then go silent until the test is over: the client must time out.
            state.cut_done = True
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._write(body[: len(body) // 2])
            state.release.wait(timeout=5)
            self.close_connection = True
            return None

        if range_header is None:
            return self._reply(200, body)
        start = int(re.fullmatch(r"bytes=(\d+)-", range_header).group(1))
        if start >= len(body):
            return self._reply(416, b"", {"Content-Range": f"bytes */{len(body)}"})
        if state.mode == "bad-range":
            start = start // 2  # a server that resumes from somewhere else
        content_range = f"bytes {start}-{len(body) - 1}/{len(body)}"
        return self._reply(206, body[start:], {"Content-Range": content_range})

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._write(body)

    def _write(self, data: bytes) -> None:
        # The client may hang up early on purpose (e.g. a rejected 206); that is not an error.
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def server(payload: bytes, monkeypatch: pytest.MonkeyPatch):
    # A proxy from the environment would intercept requests meant for 127.0.0.1.
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    state = Server(payload=payload)
    httpd.state = state
    host, port = httpd.server_address[:2]
    state.url = f"http://{host}:{port}/kagglecatsanddogs.zip"
    # A short poll interval keeps shutdown (and so every test's teardown) quick.
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield state
    state.release.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "downloads" / "archive.zip"  # parent does not exist yet on purpose


def part_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


# --- the tests -------------------------------------------------------------------------------


def test_given_a_normal_server_when_downloading_then_the_file_is_exact_and_no_part_is_left(
    server: Server, dest: Path
):
    # given: a well-behaved server, and a hash written in upper case
    lines: list[str] = []

    # when
    result = download(
        server.url,
        dest,
        sha256=server.sha256.upper(),
        expected_size=len(server.payload),
        log=lines.append,
        **FAST,
    )

    # then
    assert result == dest
    assert dest.read_bytes() == server.payload
    assert sha256_of(dest) == server.sha256
    assert not part_of(dest).exists()
    assert server.ranges == [None]
    assert any(server.sha256 in line for line in lines)


def test_given_the_connection_drops_midway_when_downloading_then_it_resumes_with_a_range_request(
    server: Server, dest: Path
):
    # given: the first response promises the full body but hangs up after half of it
    server.mode = "cut"
    half = len(server.payload) // 2
    lines: list[str] = []

    # when
    download(server.url, dest, sha256=server.sha256, log=lines.append, **FAST)

    # then: the second request asks for exactly the missing tail, and the result is exact
    assert server.ranges == [None, f"bytes={half}-"]
    assert dest.read_bytes() == server.payload
    assert not part_of(dest).exists()
    assert any("retrying" in line for line in lines)
    assert any(f"Resuming archive.zip.part at byte {half:,}" in line for line in lines)


def test_given_the_server_stalls_midway_when_the_read_times_out_then_it_resumes(
    server: Server, dest: Path
):
    # given: the first response sends half the body and then nothing at all
    server.mode = "stall"
    half = len(server.payload) // 2
    lines: list[str] = []

    # when
    download(server.url, dest, sha256=server.sha256, log=lines.append, **{**FAST, "timeout": 0.3})

    # then: the timeout counted as transient and the retry resumed from the half
    assert server.ranges == [None, f"bytes={half}-"]
    assert dest.read_bytes() == server.payload
    assert any("retrying" in line and "timed out" in line for line in lines)


def test_given_nothing_listening_when_downloading_then_connection_errors_are_retried(
    dest: Path, monkeypatch: pytest.MonkeyPatch
):
    # given: a port that was free a moment ago, so connecting is refused
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/archive.zip"
    lines: list[str] = []

    # when
    with pytest.raises(DownloadError) as caught:
        download(url, dest, sha256=None, retries=2, log=lines.append, **FAST)

    # then: two retries were logged, and the error names the URL and the cause
    assert sum("retrying" in line for line in lines) == 2
    assert url in str(caught.value) and "refused" in str(caught.value).lower()
    assert not dest.exists()


def test_given_a_server_that_ignores_range_when_a_garbage_part_exists_then_it_starts_over(
    server: Server, dest: Path
):
    # given: a leftover .part of garbage, and a server that always answers 200 in full
    server.mode = "ignore-range"
    dest.parent.mkdir(parents=True)
    part_of(dest).write_bytes(b"\xff" * 12_345)
    lines: list[str] = []

    # when
    download(server.url, dest, sha256=server.sha256, log=lines.append, **FAST)

    # then: the resume was asked for, refused, and the garbage did not survive
    assert server.ranges == ["bytes=12345-"]
    assert dest.read_bytes() == server.payload
    assert not part_of(dest).exists()
    assert any("ignored the resume" in line and "starting over" in line for line in lines)


def test_given_a_206_from_the_wrong_offset_when_resuming_then_it_refetches_the_whole_body(
    server: Server, dest: Path
):
    # given: a genuine first 100 KB in the .part, and a server that resumes elsewhere
    server.mode = "bad-range"
    dest.parent.mkdir(parents=True)
    part_of(dest).write_bytes(server.payload[:100_000])
    lines: list[str] = []

    # when
    download(server.url, dest, sha256=server.sha256, log=lines.append, **FAST)

    # then: the mismatched 206 is discarded and the file is fetched again without Range
    assert server.ranges == ["bytes=100000-", None]
    assert dest.read_bytes() == server.payload
    assert any("Content-Range" in line and "starting over" in line for line in lines)


def test_given_a_part_longer_than_the_file_when_the_server_answers_416_then_it_starts_over(
    server: Server, dest: Path
):
    # given: a .part longer than the archive, so the Range cannot be satisfied
    dest.parent.mkdir(parents=True)
    part_of(dest).write_bytes(b"\x00" * (len(server.payload) + 10))

    # when
    download(server.url, dest, sha256=server.sha256, log=lambda _: None, **FAST)

    # then
    assert server.ranges == [f"bytes={len(server.payload) + 10}-", None]
    assert dest.read_bytes() == server.payload


def test_given_a_wrong_hash_when_downloading_then_checksum_error_and_nothing_is_kept(
    server: Server, dest: Path
):
    # given
    wrong = "0" * 64

    # when
    with pytest.raises(ChecksumError) as caught:
        download(server.url, dest, sha256=wrong, log=lambda _: None, **FAST)

    # then: the message names both hashes and the bad bytes are gone
    message = str(caught.value)
    assert "SHA-256 mismatch" in message and wrong in message and server.sha256 in message
    assert "\n" not in message
    assert not dest.exists()
    assert not part_of(dest).exists()


def test_given_a_wrong_expected_size_when_downloading_then_checksum_error_and_nothing_is_kept(
    server: Server, dest: Path
):
    # when
    with pytest.raises(ChecksumError, match="Size mismatch"):
        download(
            server.url,
            dest,
            sha256=None,
            expected_size=len(server.payload) + 1,
            log=lambda _: None,
            **FAST,
        )

    # then
    assert not dest.exists()
    assert not part_of(dest).exists()


def test_given_a_404_when_downloading_then_download_error_at_once_without_retries(
    server: Server, dest: Path
):
    # given
    server.mode = "404"

    # when
    with pytest.raises(DownloadError) as caught:
        download(server.url, dest, sha256=server.sha256, retries=5, log=lambda _: None, **FAST)

    # then
    assert not isinstance(caught.value, ChecksumError)
    assert str(caught.value) == f"HTTP 404 Not Found: {server.url}"
    assert len(server.ranges) == 1
    assert not dest.exists()


def test_given_two_503s_when_downloading_then_it_retries_and_succeeds(server: Server, dest: Path):
    # given
    server.mode = "flaky"
    lines: list[str] = []

    # when
    download(server.url, dest, sha256=server.sha256, retries=5, log=lines.append, **FAST)

    # then
    assert len(server.ranges) == 3
    assert dest.read_bytes() == server.payload
    assert sum("retrying" in line and "503" in line for line in lines) == 2


def test_given_a_server_that_stays_down_when_retries_run_out_then_download_error(
    server: Server, dest: Path
):
    # given
    server.mode = "down"

    # when
    with pytest.raises(DownloadError) as caught:
        download(server.url, dest, sha256=server.sha256, retries=2, log=lambda _: None, **FAST)

    # then: one try plus two retries, and a one-line message with the URL and the cause
    assert len(server.ranges) == 3
    message = str(caught.value)
    assert server.url in message and "503" in message and "2 retries" in message
    assert "\n" not in message and not isinstance(caught.value, UnreachableError)  # it answered
    assert not dest.exists()


def test_given_a_verified_file_in_place_when_downloading_then_no_request_is_made(
    server: Server, dest: Path
):
    # given
    dest.parent.mkdir(parents=True)
    dest.write_bytes(server.payload)
    lines: list[str] = []

    # when
    result = download(server.url, dest, sha256=server.sha256, log=lines.append, **FAST)

    # then
    assert result == dest
    assert server.ranges == []
    assert len(lines) == 1 and "already there" in lines[0]


def test_given_a_wrong_file_in_place_when_downloading_then_checksum_error_and_it_is_untouched(
    server: Server, dest: Path
):
    # given
    dest.parent.mkdir(parents=True)
    dest.write_bytes(b"not the archive")

    # when
    with pytest.raises(ChecksumError) as caught:
        download(server.url, dest, sha256=server.sha256, log=lambda _: None, **FAST)

    # then
    message = str(caught.value)
    assert str(dest) in message and server.sha256 in message and "--sha256" in message
    assert dest.read_bytes() == b"not the archive"
    assert server.ranges == []


def test_given_a_file_when_hashing_it_then_sha256_of_matches_hashlib(tmp_path: Path):
    # given: more than one chunk, so the chunked loop is exercised
    data = random.Random(1).randbytes(3 * (1 << 20) + 17)
    path = tmp_path / "blob"
    path.write_bytes(data)

    # when / then
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()


# --- no network --------------------------------------------------------------------------------


@pytest.fixture
def refusing_url(monkeypatch: pytest.MonkeyPatch):
    """A URL on 127.0.0.1 whose port is bound but never listens: every connection is refused, as
    when there is no network to reach the server over."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # held, so no one else listens there during the test
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/kagglecatsanddogs_5340.zip"


def test_given_no_server_to_reach_when_downloading_then_few_retries_and_an_unreachable_error(
    refusing_url: str, dest: Path
):
    lines: list[str] = []
    # when: five retries allowed
    with pytest.raises(UnreachableError) as caught:
        download(refusing_url, dest, sha256=None, retries=5, log=lines.append, **FAST)
    # then: no attempt ever connected, so only the few connection retries ran, and it says so
    assert sum("retrying" in line for line in lines) == CONNECT_RETRIES < 5
    assert "Cannot reach 127.0.0.1:" in str(caught.value) and "no network?" in str(caught.value)
    assert not dest.exists()


def test_given_no_network_when_the_readmes_first_command_downloads_then_the_error_says_what_to_do(
    refusing_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from types import SimpleNamespace

    from click.testing import CliRunner

    from catsdogs.cli import cli
    from catsdogs.data import download as download_module

    monkeypatch.setattr(download_module, "time", SimpleNamespace(sleep=lambda seconds: None))  # no backoff

    # when reproduce (the README's first command) cannot reach the archive's server
    result = CliRunner().invoke(cli, ["reproduce", "--source", refusing_url, "--data-dir", str(tmp_path / "d"),
                                      "--out", str(tmp_path / "o"), "--quiet"])
    # then it fails (exit 1) with the cause on one line and what to do instead on the next
    assert result.exit_code == 1, result.output
    errors = [ln for ln in result.output.splitlines() if not ln.startswith(("== ", "Download interrupted"))]
    assert len(errors) == 2, result.output
    assert errors[0].startswith("Error: Cannot reach 127.0.0.1:") and "refused" in errors[0]
    for way in ("--source FILE.zip", "--source FOLDER", "--source synthetic", "catsdogs reproduce --config quick"):
        assert way in errors[1]
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
