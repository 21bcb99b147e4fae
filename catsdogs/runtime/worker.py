"""The parent's handle on a worker: a long-lived process that runs trials and probes, one task at
a time (its side: catsdogs.training.child, which starts the framework once and runs each task
with the engine), and the one way to run them.

`Worker` is the parent's handle on one. The rules of isolation:
- A task whose outcome is not `done` ends its worker: the next task gets a fresh process, so
  an out-of-memory error or a crash never leaks into another result. One exception: a probe
  out of memory whose worker shows it recovered in place (its device allocator's bytes in use
  back to what they were before the probe: JAX on a GPU; ProbeRecord.keeps_worker).
- A worker that dies mid-task (a crash, the OOM killer, a kill from outside) is a recorded
  outcome of that task: `oom` when the kernel's OOM killer struck (its counter in
  /proc/vmstat went up) or a memory cap was crossed, else `failed`, with the signal or exit
  code and the log's last line.
- Workers die with their parent, even one killed with kill -9 (PR_SET_PDEATHSIG, armed from a
  thread that lives as long as the parent: `_Spawner`), so no orphan trial runs on while the
  next sweep runs it again; Ctrl-C stops them (`kill`).
- `isolate`: a fresh worker for every task, the engine's old one-process-per-trial behaviour.
- A sweep runs its trials in slots (catsdogs.training.sweep.Slot); the local runner's,
  catsdogs.training.local_slot.LocalSlot, keeps one worker from trial to trial.
- Memory caps (profile, find-batch-size): the worker resets its resident set's high-water
  mark when a task starts, and the parent watches it (VmHWM) and kills the worker the moment
  it goes over the cap. A worker's memory only grows (allocators keep what they freed), so
  catsdogs.measure.prober reuses a worker only for a probe larger than every one it has run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from catsdogs import messages
from catsdogs.errors import CatsdogsError
from catsdogs.host import oom_kills, proc_status_kb
from catsdogs.messages import Task
from catsdogs.runtime import backends, template
from catsdogs.runtime.fork_server import WORKER_ENTRY
from catsdogs.runtime.spawner import SPAWNER, die_with_parent
from catsdogs.schema import Status

WATCH_INTERVAL = 0.02  # seconds between two looks at a capped worker's peak memory
MEMORY_CAP_ENV = "CATSDOGS_MEMORY_CAP_BYTES"  # a GPU's logical device size, read at start
CPUS_ENV = "CATSDOGS_CPUS"  # the cores a worker is pinned to, like "0,1"


# --- the parent's handle ----------------------------------------------------------------------


class WorkerDied(Exception):
    """The worker process ended before it answered."""


class WorkerUnfit(CatsdogsError):
    """A worker that cannot run what it was started for, whatever the task (its framework was
    started with other settings): every task would fail alike, so the work stops, in one line."""


class Worker:
    """One worker process: start it, hand it tasks one at a time, stop it."""

    def __init__(self, log_path: Path, env: dict | None = None, digests: dict | None = None):
        self.log_path = Path(log_path)
        # the digests of trials answered with theirs pending (TrialTask.defer_digest), by trial key:
        # (digest, error), as `digest` messages bring them
        self.digests = digests if digests is not None else {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **backends.current().process_env(),
                    **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.tasks = 0  # tasks this process has run
        self.largest_batch = 0  # the largest probe it has run
        self.shapes: set[str] = set()  # the compiled steps it keeps (engine.StepCache)
        self.device: str | None = None  # 'cpu' or 'gpu', as the worker found it
        self._stopped = False  # we ended it (Ctrl-C, a cap): its death is ours, not a crash
        self.ready = False  # its `ready` came: launched and started
        self.frozen: int | None = None  # what its start imported, left out of the collector's passes

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process and wait for its `ready`. WorkerDied if it ends first, WorkerUnfit if
        it cannot run what it was started for; a Ctrl-C while it starts ends it at once."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it: it starts its framework while this one goes
        on (`wait_ready`, or the first `run`, waits for it). Forked from a template that has
        imported the framework where one applies (catsdogs.runtime.template: the first such
        launch waits for the template's import), else a fresh process that imports it."""
        self._stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)  # here, not before: a handle writes nothing
        with open(self.log_path, "a") as log:  # the child has its own copy of the descriptor
            self.proc = template.launch(self.env, log) or SPAWNER.popen(
                [sys.executable, "-m", WORKER_ENTRY], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, env=self.env, bufsize=1,
                start_new_session=True,  # Ctrl-C reaches the parent, which stops the worker
                preexec_fn=die_with_parent)
        if self._stopped:  # stopped (Ctrl-C) while the process was being made
            self.kill()
        self.tasks, self.largest_batch, self.shapes, self.ready = 0, 0, set(), False

    def wait_ready(self) -> None:
        """Wait for a launched process's `ready` (see `start`)."""
        try:
            msg = self._expect("ready", "unfit")
        except WorkerDied:
            raise
        except BaseException:  # Ctrl-C in the handshake: the worker ends now, not when this process does
            self.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            raise
        if msg["type"] == "unfit":
            self.close()
            raise WorkerUnfit(msg["error"])
        self.device, self.ready = msg.get("device"), True
        self.frozen = msg.get("frozen")  # objects of its start the collector's passes leave out

    def _expect(self, *kinds: str, on_message=None) -> dict:
        """Read messages until one of `kinds`; WorkerDied when the channel closes first. A digest
        delivered for an earlier trial is kept (`digests`), whatever is awaited."""
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("type") == "digest":
                self._keep_digest(msg)
            if msg.get("type") in kinds:
                return msg
            if on_message:
                on_message(msg)
        self.proc.wait()
        raise WorkerDied()

    def _keep_digest(self, msg: dict) -> None:
        d = msg.get("payload") or {}
        self.digests[d.get("key")] = (d.get("digest"), d.get("error"))

    def wait_digest(self, key: str) -> None:
        """Wait until the digest of trial `key` (answered with its digest pending) has come, or
        the worker has ended."""
        with contextlib.suppress(WorkerDied, OSError, ValueError):
            while key not in self.digests and self.proc is not None:
                self._expect("digest")

    def run(self, task: Task, on_progress=None, memory_cap_bytes: int | None = None):
        """Run `task` in this worker (started if needed); always its record, with a status.

        A worker that died, or whose task did not end done, is gone afterwards."""
        if not self.alive or not self.ready:
            self.start_or_record()
            if not self.alive:
                return self._death_record(task, kills_before=None, cap=None, hwm=None)
        kills_before = oom_kills()
        watcher = _Watcher(self, memory_cap_bytes) if memory_cap_bytes and self.device == "cpu" else None
        try:
            self.proc.stdin.write(messages.encode(task) + "\n")
            self.proc.stdin.flush()
            self._expect("started")
            if watcher:
                watcher.start()
            msg = self._expect("result", on_message=lambda m: on_progress and m.get("type") == "progress"
                               and on_progress(m["payload"]))
        except (WorkerDied, BrokenPipeError, OSError):
            if watcher:
                watcher.stop()
            record = self._death_record(task, kills_before, watcher.cap_bytes if watcher else None,
                                        watcher.killed_at_kb if watcher else None)
            self.close()
            return record
        if watcher:
            watcher.stop()
        record = task.RECORD.from_dict(msg["record"])
        if record.traceback:
            record.error, record.traceback = f"{record.error or ''}\n{record.traceback}", None
        self.tasks += 1
        self.largest_batch = max(self.largest_batch, int(getattr(task, "batch_size", 0) or 0))
        self.shapes = set(msg.get("shapes") or [])
        if not record.keeps_worker():
            self.close()  # isolation: the next task gets a fresh process
        return record

    def start_or_record(self) -> None:
        """Start it (or, launched, wait for it); a death is left for the caller to record."""
        try:
            if self.alive and not self.ready:
                self.wait_ready()
            else:
                self.start()
        except WorkerDied:
            pass

    def _death_record(self, task: Task, kills_before, cap, hwm):
        """The record of a task whose worker ended without answering: its status says why."""
        rc = self.proc.poll() if self.proc else None
        if rc is None and self.proc is not None:
            rc = self.proc.wait()
        tail = ""
        with contextlib.suppress(OSError):
            tail = self.log_path.read_text(errors="replace")[-4000:]
        if hwm is not None:  # only probes run under a watched cap
            return task.RECORD(status=Status.OOM, peak_memory_mb=hwm / 1024, memory_kind="cpu-rss",
                               error=f"stopped: peak resident memory {hwm / 1024:.0f} MiB went over the "
                                     f"{cap / 2**20:.0f} MiB cap")
        if self._stopped:
            return task.RECORD(status=Status.LOST, error="stopped by the sweep")
        signum = -rc if rc is not None and rc < 0 else None
        why = (f"killed by signal {signum} ({signal.Signals(signum).name})" if signum
               else f"exited with code {rc}")
        kills_after = oom_kills()
        if signum == signal.SIGKILL and kills_before is not None and kills_after is not None:
            status = Status.OOM if kills_after > kills_before else Status.FAILED
            cause = " by the kernel's OOM killer" if status == Status.OOM else " (not by the OOM killer)"
        elif signum == signal.SIGKILL:
            status, cause = Status.OOM, " (likely out of memory)"
        else:
            oom = any(m in tail for m in backends.current().OOM_MARKERS)
            status, cause = (Status.OOM if oom else Status.FAILED), ""
        # A killed worker's log ends wherever it was cut off (a CUDA probe's message, a progress
        # line): only an error the process itself reported says why it ended.
        said = "" if signum else _last_error_line(tail)
        return task.RECORD(status=status, error=f"worker process {why}{cause} without a result"
                                                f"{': ' + said if said else ''}\n(log: {self.log_path})")

    def pause(self, paused: bool) -> None:
        """Stop the process where it is (SIGSTOP), or let it go on (SIGCONT): a spare importing
        its framework beside a probe's timed steps (catsdogs.measure.prober)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):  # TypeError: never forked
                os.kill(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def kill(self) -> None:
        """Stop the worker now (Ctrl-C, a memory cap); safe from any thread."""
        self._stopped = True
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):  # TypeError: never forked
                os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """End the worker: stdin closed (it exits), killed if it lingers."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        with contextlib.suppress(OSError, ValueError):  # what it said on its way out: digests still owed
            for line in self.proc.stdout:
                with contextlib.suppress(ValueError):
                    msg = json.loads(line)
                    if msg.get("type") == "digest":
                        self._keep_digest(msg)
        with contextlib.suppress(OSError):
            self.proc.stdout.close()
        self.proc = None


def _last_error_line(log_tail: str) -> str:
    """The last line of a worker's log that reads as an error it reported (an exception's
    "Name: message", Python's or the framework's), or ""."""
    for line in reversed(log_tail.splitlines()):
        line = line.strip()
        if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", line) or "Error:" in line or "error:" in line:
            return line
    return ""


class _Watcher:
    """Kills a worker whose resident set's high-water mark goes over a cap (CPU only: a GPU
    enforces its cap itself, as a logical device of that size)."""

    def __init__(self, worker: Worker, cap_bytes: int):
        self.worker, self.cap_bytes = worker, cap_bytes
        self.killed_at_kb: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        pid = self.worker.proc.pid
        while not self._stop.is_set():
            hwm = proc_status_kb("VmHWM", pid)
            if hwm is None:
                return
            if hwm * 1024 > self.cap_bytes:
                self.killed_at_kb = hwm
                self.worker.kill()
                return
            self._stop.wait(WATCH_INTERVAL)


def run_isolated(task: Task, log_path: Path, env: dict | None = None, on_progress=None,
                 memory_cap_bytes: int | None = None):
    """One task in a fresh worker that ends with it."""
    worker = Worker(log_path, env)
    try:
        return worker.run(task, on_progress, memory_cap_bytes)
    finally:
        worker.close()


def run_together(workers: list[Worker], tasks: list[tuple]) -> dict:
    """`tasks`, (key, task) pairs, run at once in `workers`, each worker taking the next task as
    it ends one (a worker launched and not ready is waited for by its first task); {key: record}.
    Every task still runs as `Worker.run` runs it, so its record is what one worker running them
    in turn would answer. An error in one is raised here once the others ended their tasks; Ctrl-C
    stops every worker and is raised at once."""
    pending, records, errors = list(tasks), {}, []
    lock = threading.Lock()

    def serve(worker: Worker) -> None:
        while True:
            with lock:
                if not pending or errors:
                    return
                key, task = pending.pop(0)
            try:
                records[key] = worker.run(task)
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=serve, args=(w,), name=f"catsdogs-run-{n}", daemon=True)
               for n, w in enumerate(workers[:max(1, len(tasks))])]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)  # (a join without a timeout would hold Ctrl-C off until it returned)
    except BaseException:
        for worker in workers:
            worker.kill()
        for thread in threads:
            if thread.is_alive():
                thread.join(5)
        raise
    if errors:  # (the other workers ended the tasks they had, and took no more)
        raise errors[0]
    return records
