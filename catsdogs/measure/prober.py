"""The prober: runs profile's and find-batch-size's probes (and the matmul peak) in workers.

A worker's memory only grows (allocators keep what they freed), so a worker is reused only for a
probe larger than every probe it has run, and replaced after any probe that did not end done.
`memory_cap_bytes` caps every probe (the CPU: the worker's peak resident memory, watched by
catsdogs.training.worker, which kills it the moment it goes over; a GPU: a logical device of that
size); `cpu_cap_bytes` caps only probes that run on the CPU. `isolate`: a worker per probe.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from catsdogs.messages import ProbeRecord, ProbeTask, Task
from catsdogs.schema import Status
from catsdogs.training import backends
from catsdogs.training.worker import MEMORY_CAP_ENV, Worker


class Prober:
    """Probes in workers, each worker reused while the batch sizes grow."""

    def __init__(self, workdir: Path, memory_cap_bytes: int | None = None, cpu_cap_bytes: int | None = None,
                 isolate: bool = False):
        self.workdir = Path(workdir)
        self.memory_cap_bytes, self.cpu_cap_bytes, self.isolate = memory_cap_bytes, cpu_cap_bytes, isolate
        self._env = {MEMORY_CAP_ENV: str(memory_cap_bytes)} if memory_cap_bytes else {}
        self._started = 0
        self.worker: Worker | None = None
        self._clean = True  # every task of the current worker ended done: its log can go

    def _fresh(self) -> Worker:
        self._retire()
        self._started += 1
        self.worker = Worker(self.workdir / f"probe-worker-{os.getpid()}-{self._started}.log", self._env)
        self._clean = True
        return self.worker

    def _retire(self) -> None:
        if self.worker is not None:
            self.worker.close()
            if self._clean:
                self.worker.log_path.unlink(missing_ok=True)
            self.worker = None

    def run(self, task: Task):
        """The task's record; a probe's with the cap it ran under (and the worker's log kept when
        it did not end done)."""
        probe = isinstance(task, ProbeTask)
        worker = self.worker
        if (worker is None or not worker.alive or self.isolate
                or (worker.tasks and probe and task.batch_size <= worker.largest_batch)):
            worker = self._fresh()
        if not worker.alive:
            worker.start_or_record()
        cap = self.memory_cap_bytes or (self.cpu_cap_bytes if worker.device == "cpu" else None)
        record = worker.run(task, memory_cap_bytes=cap)
        if record.status != Status.DONE:
            self._clean = False
        if not probe:
            return record
        return self._as_capped(record, task, cap, worker)

    def _as_capped(self, record: ProbeRecord, task: ProbeTask, cap: int | None, worker: Worker) -> ProbeRecord:
        cap_mb = cap / 2**20 if cap else None
        peak = record.peak_memory_mb
        if (cap_mb and record.memory_kind == "cpu-rss" and peak and peak > cap_mb
                and record.status == Status.DONE):  # over the cap between two looks
            record.status = Status.OOM
            record.error = (f"finished, but its peak resident memory {peak:.0f} MiB went over the "
                            f"{cap_mb:.0f} MiB cap")
            self._clean = False
            worker.close()
        for name in ("batch_size", "optimizer", "dataset", "precision", "steps", "warmup"):
            if getattr(record, name) is None:  # a killed probe's record too
                setattr(record, name, getattr(task, name))
        if record.backend is None:
            record.backend = backends.name()
        record.memory_cap_mb = cap_mb
        if record.status != Status.DONE:
            record.log = str(worker.log_path)
        return record

    def close(self) -> None:
        self._retire()
        with contextlib.suppress(OSError):
            self.workdir.rmdir()  # empty unless a probe that did not end done left its log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
