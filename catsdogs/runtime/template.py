"""Worker processes forked from a template that has imported TensorFlow, on a CPU.

A TensorFlow worker's start is mostly importing TensorFlow and Keras, at every fresh worker.
Importing starts none of TensorFlow's threads, so a process that has only imported it can be
forked: the child is what a fresh worker would be after its imports, in milliseconds. A fork maps
none of the shared libraries' file pages again (a child's resident set after a first op would be
far below a fresh worker's, and a probe's memory not a training process's), so the template lists
its own (/proc/self/pagemap) and each child maps them before anything else (MADV_POPULATE_READ,
Linux 5.14): its resident set then a fresh worker's. Where the kernel lacks it, workers start
fresh.

A template (`python -m catsdogs.runtime.template FD ENTRY`) imports what a worker imports before its
framework starts, and the entry's module ("module:function", named, never imported here), then forks a child for every request on socket FD (the worker's environment
and folder; its stdin, stdout and stderr as descriptors). The child takes them, a session of its
own and death with the template (which dies with catsdogs: catsdogs.runtime.spawner), and runs
the worker process (catsdogs.training.child) as `python -m` would run it. The template reaps its
children and sends their exit statuses back; `TemplateChild` answers what `Worker` asks of
`subprocess.Popen`. Where it applies (`usable`): TensorFlow on Linux on a host without an NVIDIA
device, unless CATSDOGS_WORKER_TEMPLATE=0 (JAX reads its XLA flags and cache settings at import,
each worker's own). One template serves the workers that agree with it in what an import reads
(`import_key`). docs/performance.md, "The trial engine", gives the measurements.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

import numpy as np

from catsdogs.runtime.spawner import SPAWNER, die_with_parent

ENV = "CATSDOGS_WORKER_TEMPLATE"  # "0": every worker a fresh process
# What an import may read from the environment: a template serves only workers that agree with
# it on these (the rest is set in the child, after the fork, before anything reads it)
IMPORT_PREFIXES = ("TF_", "KERAS_", "PYTHON", "LD_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "CUDA_", "XLA_",
                   "JAX_", "NVIDIA_", "CATSDOGS_SKIP_OPTIONAL_IMPORTS", "HOME", "XDG_")
MAX_TEMPLATES = 2  # a template holds a framework's import in memory (about 0.6 GiB)
MESSAGE_BYTES = 1 << 20  # a request: the worker's environment, as JSON
MADV_POPULATE_READ = 22  # linux/mman.h: map a range's pages, as reading each would


def usable(env: dict) -> bool:
    """Whether a worker of this environment may come from a template."""
    return (env.get(ENV, "1").strip() != "0" and sys.platform == "linux" and hasattr(socket, "send_fds")
            and _backend(env) == "tensorflow" and not _nvidia_devices())


def _backend(env: dict) -> str | None:
    """The worker's backend: its KERAS_BACKEND, else Keras's configured one (None: none that
    catsdogs runs, which the worker itself will say)."""
    if "KERAS_BACKEND" in env:
        return env["KERAS_BACKEND"]
    from catsdogs.errors import CatsdogsError
    from catsdogs.runtime import backends

    try:
        return backends.check()
    except CatsdogsError:
        return None


def _nvidia_devices() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def import_key(env: dict) -> tuple:
    """The part of an environment that importing the framework may read."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_PREFIXES)))


# --- the template process ----------------------------------------------------------------------


WORKER_ENTRY = "catsdogs.training.child"  # the worker process's module (run as `python -m`), named, not imported
WORKER_MAIN = f"{WORKER_ENTRY}:main"


def _import_framework() -> None:
    """What a TensorFlow worker imports before its framework starts (catsdogs.training.child.main),
    and nothing that starts it."""
    from catsdogs.runtime import backends, skipped_imports

    backend = backends.current()
    if backend.NAME != "tensorflow":
        raise RuntimeError(f"a template serves TensorFlow's workers, not {backend.NAME}'s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", backend.LOG_LEVEL)
    with skipped_imports.skipping(backend.NAME):
        import keras  # noqa: F401
        import tensorflow  # noqa: F401


def mapped_file_pages() -> list[tuple[int, int]]:
    """(address, length) of every run of pages this process has mapped from files, as its page
    tables hold them (/proc/self/pagemap's present bit)."""
    page = os.sysconf("SC_PAGE_SIZE")
    ranges = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(low // page * 8)
            entries = np.frombuffer(pagemap.read((high - low) // page * 8), dtype=np.uint64)
            present = (entries >> np.uint64(63)).astype(np.int8)
            edges = np.diff(np.concatenate(([0], present, [0])))
            for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
                ranges.append((low + int(start) * page, int(end - start) * page))
    return ranges


def populate(ranges: list[tuple[int, int]]) -> None:
    """Map these pages into this process's page tables (OSError where the kernel cannot)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in ranges:
        if libc.madvise(address, length, MADV_POPULATE_READ) != 0:
            errno = ctypes.get_errno()
            if errno != 12:  # ENOMEM: the range is no longer mapped (a library let go)
                raise OSError(errno, f"madvise(MADV_POPULATE_READ): {os.strerror(errno)}")


def serve(fd: int, entry: str = WORKER_MAIN) -> int:
    """The template's loop: fork a child running `entry` ("module:function", its return value the
    exit status) for each request; report exits. Only the worker's entry imports the framework."""
    sock = socket.socket(fileno=fd)
    try:
        if entry == WORKER_MAIN:
            _import_framework()
        importlib.import_module(entry.partition(":")[0])  # the entry's code, loaded once for every child
        pages = mapped_file_pages()
        populate(pages[:1])  # the kernel can (Linux 5.14 on), or no child could match a fresh worker
    except BaseException as e:  # noqa: BLE001 - said to the parent, which starts fresh workers
        _send(sock, {"failed": f"{type(e).__name__}: {e}"})
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    _send(sock, {"ready": os.getpid()})
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        if sock in readable:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 3)
            if not data:  # the parent closed its end (it ended, or let this template go)
                break
            request = json.loads(data)
            settled_r, settled_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(settled_r)
                _child(request, fds, entry, pages, settled_w)
            os.close(settled_w)
            os.read(settled_r, 1)  # its session made (a kill of its group reaches it), or it ended
            os.close(settled_r)
            for f in fds:
                os.close(f)
            _send(sock, {"spawned": pid, "id": request["id"]})
        _reap(sock)
    return 0


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):  # the parent is gone: its children die with this process
        sock.send(json.dumps(message).encode())


def _move_to(cwd: str) -> None:
    """The worker's folder, where a fresh `python -m` started in it would be: its current
    folder, and first on sys.path (where a user's model module may lie)."""
    started_in = os.getcwd()
    os.chdir(cwd)
    if sys.path and sys.path[0] == started_in:
        sys.path[0] = cwd
    importlib.invalidate_caches()


def _exit_status(value) -> int:
    """The status `sys.exit(value)` ends a process with: None 0, a number itself, anything else
    said on stderr and 1. (An int always: os._exit of anything else raises, and the child would
    go on in the template's loop.)"""
    if value is None or isinstance(value, int):
        return value or 0
    print(value, file=sys.stderr)
    return 1


def _child(request: dict, fds: list[int], entry: str, pages: list[tuple[int, int]], settled: int) -> None:
    """In the forked child: a session of its own, death with the template, the request's
    descriptors as stdin, stdout and stderr, the template's file pages mapped again, the request's
    environment; then the worker. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        template = os.getppid()
        os.setsid()
        die_with_parent()
        if os.getppid() != template:  # the template ended before the signal was armed
            os._exit(1)
        os.write(settled, b"1")  # the template may say it is here: its group can be killed
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2:
                with contextlib.suppress(OSError):
                    os.close(fd)
        populate(pages)
        os.environ.clear()
        os.environ.update(request["env"])
        _move_to(request["cwd"])
        random.seed()  # a fresh process's draws, not the template's (every child would share them)
        np.random.seed()
        module, _, function = entry.partition(":")
        __import__(module)
        sys.argv = [sys.modules[module].__file__]  # as `python -m module` would have it
        code = _exit_status(getattr(sys.modules[module], function)())
    except SystemExit as e:
        code = _exit_status(e.code)
    except BaseException:  # noqa: BLE001 - into the worker's log, as a fresh process's would go
        traceback.print_exc()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


# --- the parent's side -------------------------------------------------------------------------


class TemplateChild:
    """A worker forked by a template: the parts of subprocess.Popen a Worker uses."""

    def __init__(self, template: Template, env: dict, stderr):
        self.args = ["catsdogs.runtime.template", template.pid]
        self.template = template
        self.returncode: int | None = None
        self._pid: int | None = None
        self._spawned = threading.Event()
        self._exited = threading.Event()
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        self.stdin = open(stdin_w, "w", buffering=1)  # noqa: SIM115 - closed by Worker.close
        self.stdout = open(stdout_r)  # noqa: SIM115
        try:
            template.request(self, env, [stdin_r, stdout_w, stderr.fileno()])
        except OSError:
            self.stdin.close()
            self.stdout.close()
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)

    @property
    def pid(self) -> int | None:
        """The child's pid, once the template has forked it (None: it never did)."""
        self._spawned.wait()
        return self._pid

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _spawn(self, pid: int | None) -> None:
        self._pid = pid
        self._spawned.set()
        if pid is None:
            self._exit(-signal.SIGKILL)

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


class Template:
    """The parent's handle on a template: requests forks, hears of exits."""

    def __init__(self, env: dict, entry: str = WORKER_MAIN):
        """Start the template and wait until it has imported (or failed: `failed` says why)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = SPAWNER.popen([sys.executable, "-m", "catsdogs.runtime.template", str(theirs.fileno()), entry],
                                  pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True,  # a terminal's Ctrl-C is the parent's to handle
                                  preexec_fn=die_with_parent)
        theirs.close()
        self.pid = self.proc.pid
        self.sock = ours
        self.failed: str | None = None
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, TemplateChild] = {}  # requested, not yet forked
        self._children: dict[int, TemplateChild] = {}  # forked, not yet exited
        self._ended = threading.Event()
        self._ready = threading.Event()
        threading.Thread(target=self._listen, name="catsdogs-template", daemon=True).start()
        self._ready.wait()
        if self._ended.is_set() and not self.failed:
            self.failed = f"the template process ended ({self.proc.poll()}) before it was ready"

    @property
    def alive(self) -> bool:
        return not self._ended.is_set()

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._waiting and not self._children

    def request(self, child: TemplateChild, env: dict, fds: list[int]) -> None:
        with self._lock:
            if self._ended.is_set():
                raise OSError("the worker template has ended")
            self._next += 1
            self._waiting[self._next] = child
            request = {"id": self._next, "env": env, "cwd": os.getcwd()}
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _listen(self) -> None:
        try:
            while True:
                data = self.sock.recv(MESSAGE_BYTES)
                if not data:
                    break
                self._hear(json.loads(data))
        except OSError:
            pass
        with self._lock:  # the template ended: its children die with it (their parent-death signal)
            self._ended.set()
            self._ready.set()
            waiting, children = list(self._waiting.values()), list(self._children.values())
            self._waiting.clear()
            self._children.clear()
        for child in waiting:
            child._spawn(None)
        for child in children:
            child._exit(-signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def _hear(self, msg: dict) -> None:
        if "failed" in msg:
            self.failed = msg["failed"]
        elif "ready" in msg:
            self._ready.set()
        elif "spawned" in msg:
            with self._lock:
                child = self._waiting.pop(msg["id"])
                self._children[msg["spawned"]] = child
            child._spawn(msg["spawned"])
        elif "exited" in msg:
            with self._lock:
                child = self._children.pop(msg["exited"], None)
            if child is not None:
                child._exit(msg["code"])


_TEMPLATES: dict[tuple, Template] = {}
_TEMPLATES_LOCK = threading.Lock()


def _forget_templates() -> None:  # a forked copy of this process has none of their threads
    global _TEMPLATES_LOCK
    _TEMPLATES.clear()
    _TEMPLATES_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_templates)


def launch(env: dict, stderr) -> TemplateChild | None:
    """A worker of environment `env` forked from its template (started the first time), its stderr
    `stderr`; None where a template does not apply (`usable`) or has failed: a fresh process then."""
    if not usable(env):
        return None
    return launch_from(import_key(env), env, stderr, WORKER_MAIN)


def launch_from(key: tuple, env: dict, stderr, entry: str) -> TemplateChild | None:
    """A child running `entry`, forked by the template of `key` (started and registered the first
    time; at most MAX_TEMPLATES, an idle one let go to make room); None where it failed."""
    with _TEMPLATES_LOCK:  # held while a new template imports: a second launch would import too
        template = _TEMPLATES.get(key)
        if template is not None and not template.alive and not template.failed:
            del _TEMPLATES[key]  # it ended (killed from outside): a new one
            template = None
        if template is None:
            if len(_TEMPLATES) >= MAX_TEMPLATES:
                idle = [k for k, t in _TEMPLATES.items() if t.idle]
                if not idle:
                    return None
                _TEMPLATES.pop(idle[0]).close()
            template = _TEMPLATES[key] = Template(env, entry)
        if template.failed:
            return None  # it could not import: fresh workers say why in their logs
        try:
            return TemplateChild(template, env, stderr)
        except OSError:
            return None


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), *sys.argv[2:3]))
