"""The template process: a fork server (`python -m catsdogs.runtime.fork_server FD ENTRY`) that
imports, once, what a worker imports before its framework starts (TensorFlow's, for the worker's
entry) and the entry's module ("module:function", named), then forks a child running the entry for
every request on socket FD: the request's environment and folder, its stdin, stdout and stderr as
descriptors, a session of its own, death with the server, the server's file pages mapped again
(so a child's resident memory is a fresh process's: catsdogs.runtime.template says why). It reaps
its children and sends their exit statuses back. The parent's side is catsdogs.runtime.template.
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
import sys
import traceback

import numpy as np

from catsdogs.runtime.spawner import die_with_parent

MESSAGE_BYTES = 1 << 20  # a request: the worker's environment, as JSON
MADV_POPULATE_READ = 22  # linux/mman.h: map a range's pages, as reading each would


WORKER_ENTRY = "catsdogs.training.child"  # the worker process's module (run as `python -m`), named, not imported
WORKER_MAIN = f"{WORKER_ENTRY}:main"


def _import_framework() -> None:
    """What a worker imports before its framework starts (catsdogs.training.child.main), and
    nothing that starts it: TensorFlow and Keras; or, on JAX, Keras and JAX with TensorFlow kept
    out as a JAX worker keeps it (jax_process.before_import), its XLA flags and compilation cache
    left to the child's start (read when JAX's backend starts, and set after the import)."""
    from catsdogs.runtime import backends, skipped_imports

    backend = backends.current()
    if backend.NAME not in ("tensorflow", "jax"):
        raise RuntimeError(f"a template serves TensorFlow's and JAX's workers, not {backend.NAME}'s")
    if backend.NAME == "jax":
        from catsdogs.runtime.backends import jax_process

        jax_process.before_import()
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", backend.LOG_LEVEL)
    with skipped_imports.skipping(backend.NAME):
        import keras  # noqa: F401

        if backend.NAME == "jax":
            import jax  # noqa: F401

            if jax_process.backend_started():  # (by a sitecustomize, say): threads a fork would not carry
                raise RuntimeError("JAX's backend started as Python did, before a template could fork workers")
        else:
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


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), *sys.argv[2:3]))
