"""Shared fixtures: a small synthetic PetImages archive, and a local HTTP file server.

Both are generic: the archive fixture knows nothing about how a test uses it, and the server
serves whatever bytes a test hands it (a 404 for anything else).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from catsdogs.data.synthetic import make_synthetic_archive
from catsdogs.runtime.skipped_imports import ENV as SKIP_OPTIONAL_IMPORTS

SMALL_N_VALID = 24  # valid images per class in the session archive: small, but every kind fits

# What runs in this process (trials in-process, pipelines) runs on TensorFlow, whatever the shell
# says; a test that wants JAX asks for it (`keras_backend`) and gets it in its workers.
os.environ["KERAS_BACKEND"] = "tensorflow"
# A probe's worker on the CPU imports what its framework tries, as the user's training process would
# (its resident memory is the measurement): 1.3 s of CPU a worker more, for a baseline 150 MiB
# higher. The suite's searches check what a search does, not the baseline: they skip them, as a
# user's environment may say to (catsdogs.runtime.skipped_imports; the default is tested with
# the variable removed, test_find_batch_size's spares test).
os.environ[SKIP_OPTIONAL_IMPORTS] = "1"


@dataclass(frozen=True)
class SyntheticArchive:
    """A synthetic archive on disk, what it holds, and the same tree already extracted."""

    path: Path  # the .zip
    n_valid: int  # images per class that decode
    kinds: dict[str, str]  # member name -> kind, for the odd, bad and non-.jpg members
    sha256: str
    pets: Path  # the extracted PetImages folder (read-only by convention)

    def members_of_kind(self, *kinds: str) -> list[str]:
        return sorted(name for name, kind in self.kinds.items() if kind in kinds)


def build_synthetic_archive(root: Path, n_valid: int, seed: int = 0) -> SyntheticArchive:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"synthetic-{n_valid}-{seed}.zip"
    kinds = make_synthetic_archive(path, n_valid, seed=seed)
    extracted = root / "extracted"
    with zipfile.ZipFile(path) as zf:
        zf.extractall(extracted)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return SyntheticArchive(path, n_valid, kinds, sha, extracted / "PetImages")


@pytest.fixture(scope="session")
def small_archive(tmp_path_factory: pytest.TempPathFactory) -> SyntheticArchive:
    """One small synthetic archive per test session (do not modify its files)."""
    return build_synthetic_archive(tmp_path_factory.mktemp("small-archive"), SMALL_N_VALID)


def pytest_collection_modifyitems(items: list) -> None:
    """The tests that train or spawn processes first, each tier in file order: pytest-xdist hands
    the two test processes tests as they finish, so the suite ends with quick ones, a fraction of
    a second each, and neither process waits long for the other. In file order the user-model
    modules' end-to-end runs came last, and one process ran them alone for 40 s of a 430 s suite.
    (The tests sharing an expensive module fixture are an xdist_group, run together whatever the
    order; a data set's fixture is the session's `prepared_data`, made once.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


# --- small prepared data sets, shared by every test module that trains ------------------------


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory: pytest.TempPathFactory):
    """prepared_data(size, split=(24, 8, 8)) -> a data dir prepared from the synthetic source.

    Prepared once per (size, split) per session; tests only read it."""
    from catsdogs.data.prepare import prepare

    made: dict = {}

    def get(size: int, split: tuple[int, int, int] = (24, 8, 8)) -> Path:
        if (size, split) not in made:
            d = tmp_path_factory.mktemp(f"data-{size}px")
            prepare(source="synthetic", data_dir=d, per_class=sum(split), split=split, size=size,
                    log=lambda *a: None, progress=False)
            made[(size, split)] = d
        return made[(size, split)]

    return get


# --- the Keras backends -------------------------------------------------------------------------


@pytest.fixture(params=["tensorflow", "jax"])
def keras_backend(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each Keras backend catsdogs runs on, as KERAS_BACKEND (which the workers inherit); a
    backend whose framework is not installed is skipped (CI installs both)."""
    if importlib.util.find_spec(request.param) is None:
        pytest.skip(f"{request.param} is not installed (pip install -e '.[jax]')")
    monkeypatch.setenv("KERAS_BACKEND", request.param)
    return request.param


@pytest.fixture
def brief_probes(monkeypatch: pytest.MonkeyPatch) -> str:
    """find-batch-size's probes timed for at least 0.02 s, not 0.3 (search.DEFAULT_MIN_SECONDS,
    which FindSettings reads when made): for a test of what a search does and answers, not of how
    steady its step times are. The timed loop runs as ever (its batches repeated to the minimum);
    a run of a user's small model took 11 s (16 s of CPU) where it took 18 (23). And the profile's
    matmul peak timed for 0.1 s a timing, not 1 (profile.PEAK_SECONDS): 6 s of CPU where it took 11.
    Returns the first for a process of its own: a line of Python to run before the code under test."""
    from catsdogs.measure import profile, search

    least = 0.02
    monkeypatch.setattr(search, "DEFAULT_MIN_SECONDS", least)
    monkeypatch.setattr(profile, "PEAK_SECONDS", 0.1)
    return f"import catsdogs.measure.search; catsdogs.measure.search.DEFAULT_MIN_SECONDS = {least}"


@pytest.fixture
def launched_workers(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every catsdogs worker launched in this process during the test (Worker.launch), in order:
    what ran in which, and whether it has ended."""
    from catsdogs.runtime.worker import Worker

    launched: list = []
    launch = Worker.launch

    def recording(self) -> None:
        launched.append(self)
        launch(self)

    monkeypatch.setattr(Worker, "launch", recording)
    return launched


@pytest.fixture
def a_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`a_project(text)`: the current directory becomes a user's project holding my_models.py of
    `text` (model functions, for --model my_models:NAME), importable here and in workers."""

    def make(text: str) -> Path:
        (tmp_path / "my_models.py").write_text(text)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        return tmp_path

    return make


# --- a local HTTP file server ------------------------------------------------------------------


@dataclass
class FileServer:
    """Serves `files` ({url path: bytes}) on 127.0.0.1; 404 for any other path."""

    base_url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)  # every path asked for, in order

    def serve(self, path: str, data: bytes) -> str:
        """Publish `data` at `path` (like "/archive.zip"); return its full URL."""
        path = "/" + path.lstrip("/")
        self.files[path] = data
        return self.base_url + path


class _FileHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        state: FileServer = self.server.state  # type: ignore[attr-defined]
        state.requests.append(self.path)
        body = state.files.get(self.path)
        if body is None:
            self._reply(404, b"not found")
        else:
            self._reply(200, body)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client hung up: not our problem
            pass

    def log_message(self, format: str, *args) -> None:  # keep pytest output clean
        pass


@pytest.fixture
def file_server(monkeypatch: pytest.MonkeyPatch):
    """A ThreadingHTTPServer on 127.0.0.1 (port 0) in a thread, torn down after the test."""
    # A proxy from the environment would intercept requests meant for 127.0.0.1.
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FileHandler)
    host, port = httpd.server_address[:2]
    state = FileServer(base_url=f"http://{host}:{port}")
    httpd.state = state  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def float32_policy_after_each_test():
    """A trial run in this process sets Keras's global dtype policy to its precision, as a worker
    does for its process: put float32 back after each test, so the next one's models are built as
    it expects whatever ran before it. (Only where a test has imported Keras.)"""
    yield
    import sys

    if "keras" in sys.modules:
        sys.modules["keras"].mixed_precision.set_dtype_policy("float32")

