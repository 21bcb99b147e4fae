"""Where every worker process is started: from one thread that lives as long as this process, and
armed to die with it (catsdogs.runtime.worker says why both)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading


def die_with_parent() -> None:
    """In the child, before exec: be killed when the parent dies, even by kill -9."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Spawner:
    """Forks every worker from one thread that lives as long as this process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process. A
    worker started from a sweep slot's thread would be killed the moment that thread ends,
    as the adaptive rounds' kept workers would be (the next round's first trial would meet a dead
    worker, or, racing the kill, be recorded as failed: CHANGELOG, 0.7.2)."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):  # a child forked from this process has no spawner thread
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="catsdogs-spawner", daemon=True)
                self._thread.start()
        done: dict = {}
        ready = threading.Event()
        self._requests.put((args, kwargs, done, ready))
        ready.wait()
        if "error" in done:
            raise done["error"]
        return done["proc"]

    def _loop(self) -> None:
        while True:
            args, kwargs, done, ready = self._requests.get()
            try:
                done["proc"] = subprocess.Popen(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done["error"] = e
            ready.set()


SPAWNER = _Spawner()
