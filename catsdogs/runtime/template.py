"""Worker processes forked from a template that has imported the framework, on a CPU.

A worker's start is mostly importing Keras and TensorFlow (or JAX), at every fresh worker.
Importing starts neither framework (no thread of TensorFlow's, no backend of JAX's), so a process
that has only imported it can be forked: the child is what a fresh worker would be after its
imports, in milliseconds. A fork maps none of the shared libraries' file pages again (a child's
resident set after a first op would be far below a fresh worker's, and a probe's memory not a
training process's), so the template lists its own (/proc/self/pagemap) and each child maps them
before anything else (MADV_POPULATE_READ, Linux 5.14): its resident set then a fresh worker's.
Where the kernel lacks it, workers start fresh.

This module is the parent's side; the template process is catsdogs.runtime.fork_server, a fork
server that runs an entry it is given by name (the worker's: catsdogs.training.child, as `python
-m` would run it), its children dying with it (and it with catsdogs: catsdogs.runtime.spawner).
`Template` is the parent's handle on one, `TemplateChild` answers what `Worker` asks of
`subprocess.Popen`; every wait on a template is bounded (ANSWER_SECONDS, READY_SECONDS, and a
child's end read from the kernel where its template cannot say it): a template that does not
answer is let go, said, and workers start fresh. Where it applies (`usable`): TensorFlow or JAX
on Linux on a host without an NVIDIA device, unless CATSDOGS_WORKER_TEMPLATE=0 (JAX's child sets
its XLA flags, which XLA reads as JAX's backend starts, and gives JAX its compilation cache's
settings, which JAX read from the template's environment at import: jax_process.start). One
template serves the workers that agree with it in what an import reads (`import_key`).
docs/performance.md, "The trial engine", gives the measurements.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from catsdogs import host
from catsdogs.runtime.fork_server import MESSAGE_BYTES, WORKER_MAIN
from catsdogs.runtime.spawner import SPAWNER, die_with_parent

ENV = "CATSDOGS_WORKER_TEMPLATE"  # "0": every worker a fresh process
# What an import may read from the environment: a template serves only workers that agree with
# it on these (the rest is set in the child, after the fork, before anything reads it); and what
# glibc's malloc reads as a process starts (GLIBC_, MALLOC_): the template's are its children's
IMPORT_PREFIXES = ("TF_", "KERAS_", "PYTHON", "LD_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "CUDA_", "XLA_",
                   "JAX_", "NVIDIA_", "CATSDOGS_SKIP_OPTIONAL_IMPORTS", "HOME", "XDG_", "GLIBC_", "MALLOC_")
MAX_TEMPLATES = 2  # a template holds a framework's import in memory (about 0.6 GiB)
ANSWER_SECONDS = 30.0  # a template that has not forked a requested worker by then is let go
READY_SECONDS = 120.0  # ... or has not imported the framework by then
LOOK_SECONDS = 1.0  # how often a wait for a child's end asks the kernel too (a stopped template says nothing)


def usable(env: dict) -> bool:
    """Whether a worker of this environment may come from a template."""
    return (env.get(ENV, "1").strip() != "0" and sys.platform == "linux" and hasattr(socket, "send_fds")
            and _backend(env) in ("tensorflow", "jax") and not host.nvidia_devices())


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


def import_key(env: dict) -> tuple:
    """The part of an environment that importing the framework may read."""
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_PREFIXES)))


# --- the parent's side -------------------------------------------------------------------------


class TemplateChild:
    """A worker forked by a template: the parts of subprocess.Popen a Worker uses."""

    def __init__(self, template: Template, env: dict, stderr):
        self.args = ["catsdogs.runtime.fork_server", template.pid]
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
        """The child's pid, once the template has forked it (None: it never did, or the template did
        not answer within ANSWER_SECONDS: stopped, say; it is then let go, and workers start fresh)."""
        if not self._spawned.wait(ANSWER_SECONDS):
            self.template.give_up("did not fork a worker")
            self._spawn(None)
        return self._pid

    def poll(self) -> int | None:
        if not self._exited.is_set():
            self._seen_exit()
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        """The child's exit status, as the template reports it, or as the kernel shows it where the
        template cannot (stopped: its child a zombie it has not reaped); TimeoutExpired after
        `timeout` (None: no limit, but the kernel is asked every LOOK_SECONDS)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._exited.wait(LOOK_SECONDS if deadline is None else
                                    max(0.0, min(LOOK_SECONDS, deadline - time.monotonic()))):
            if self._seen_exit():
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _seen_exit(self) -> bool:
        """Whether the kernel shows the child ended (a zombie its stopped template has not reaped:
        its exit status read from /proc), recorded as its exit where so."""
        if not self._spawned.is_set() or self._pid is None:
            return False
        try:
            fields = Path(f"/proc/{self._pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return False  # reaped (the template's word is on its way) or never ours to read
        if fields[0] != "Z" or len(fields) < 50:
            return False
        self._exit(os.waitstatus_to_exitcode(int(fields[49])))
        return True

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
        self.proc = SPAWNER.popen([sys.executable, "-m", "catsdogs.runtime.fork_server", str(theirs.fileno()), entry],
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
        if not self._ready.wait(READY_SECONDS):
            self.give_up(f"was not ready within {READY_SECONDS:.0f} s")
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

    def give_up(self, what: str) -> None:
        """A template that does not answer (stopped, say): said once, ended with its children, and
        never asked again (`failed`: workers start fresh)."""
        if not self.failed:
            self.failed = f"the worker template (pid {self.pid}) {what} within the time allowed"
            print(f"catsdogs: {self.failed}: workers start fresh from now on", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # its children die with it (their parent-death signal)
        self.close()

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


def release_all() -> int:
    """Let every template go and wait for its process to end (a Python call's end: its process keeps
    none between calls); the number let go. A template with workers still running keeps them
    until it ends with them."""
    with _TEMPLATES_LOCK:
        made = list(_TEMPLATES.values())
        _TEMPLATES.clear()
    for made_one in made:
        made_one.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            made_one.proc.wait(timeout=10)
    return len(made)


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
