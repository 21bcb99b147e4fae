"""The prober: runs profile's and find-batch-size's probes (and the matmul peak) in workers.

A worker's memory only grows (allocators keep what they freed), so a worker is reused only for a
probe larger than every probe it has run, and replaced after any probe that did not end done.

A reused worker also holds more than a fresh one would at the same batch size: TensorFlow's BFC
pool and XLA's allocator keep the regions earlier, smaller steps grew, and a larger step needs
larger blocks than those regions free: a reused worker's peak at a size lies above a fresh one's
(docs/performance.md, "Measurements behind the code's choices"). A fit in a reused worker is still a fit, but an out-of-memory there says nothing
about a training process, which runs one batch size from its start. So:
- a probe at or above `fresh_from` (find-batch-size: 80% of its predicted limit) gets a fresh
  worker, as does every probe of `isolate`;
- a probe that runs out of memory in a reused worker runs again in a fresh one, and only that
  answer counts (`worker`: "fresh", "reused", or "retried").

**In place** (`in_place`): JAX on a GPU is the exception. Its peak is the allocator's bytes in use,
which retained regions do not inflate, and an out-of-memory there is an exception the process
survives, after which its allocator's bytes in use are back to what they were before the probe
(the worker measures it at every out-of-memory: ProbeRecord.residue_mb). There every probe runs
in the one worker, in any order, none fresh near the limit and none asked again: a fresh worker
costs a start and a compilation anew, seconds on a GPU, for the same answer. The
first out-of-memory that leaves something behind ends it: from then on, the rules above.

`memory_cap_bytes` caps every probe (the CPU: the worker's peak resident memory, watched by
catsdogs.runtime.worker, which kills it the moment it goes over; a GPU: a logical device of that
size); `cpu_cap_bytes` caps only probes that run on the CPU.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from catsdogs.host import proc_status_kb, visible_gpus
from catsdogs.measure import oom
from catsdogs.messages import ProbeRecord, ProbeTask, Task
from catsdogs.runtime import backends, skipped_imports
from catsdogs.runtime.backends import COMPILE_CACHE_ENV
from catsdogs.runtime.worker import MEMORY_CAP_ENV, Worker
from catsdogs.schema import Status


class Prober:
    """Probes in workers, each worker reused while the batch sizes grow."""

    def __init__(self, workdir: Path, memory_cap_bytes: int | None = None, cpu_cap_bytes: int | None = None,
                 isolate: bool = False, fresh_from: int | None = None, env: dict | None = None):
        self.workdir = Path(workdir)
        self.memory_cap_bytes, self.cpu_cap_bytes, self.isolate = memory_cap_bytes, cpu_cap_bytes, isolate
        self.fresh_from = fresh_from  # probes of at least this batch size run in a fresh worker
        # `env`: the workers' process settings (backends.process_env_for) and options
        self._env = {**(env or {}), **({MEMORY_CAP_ENV: str(memory_cap_bytes)} if memory_cap_bytes else {})}
        if not visible_gpus():
            # On a CPU a probe's peak resident memory holds XLA's compiler while it compiles, and
            # nothing of it when the step comes from JAX's compilation cache: probes that compile
            # and probes that load would measure different things. (A GPU's memory holds neither.)
            self._env[COMPILE_CACHE_ENV] = "off"
            # ... and a probe's peak stands for a training process's, which imports what its
            # framework tries: no optional import skipped, unless this process's environment says
            # its training imports none (the test suite's does: its searches check, not measure)
            self._env.update(skipped_imports.for_measurement())
        self._started = 0
        self.worker: Worker | None = None
        self._clean = True  # every task of the current worker ended done: its log can go
        # On the CPU the next fresh worker is on its way where one is to come (`_unused`): a spare
        # that has imported its framework and run nothing is a fresh worker. It imports while
        # probes run and stops (SIGSTOP) while their steps are timed (`_run_once`). Not on a GPU,
        # where a started framework may hold device memory that the probe beside it would then lack.
        self.spares = not visible_gpus()
        self.waiting: list[Worker] = []  # spares launched and not taken yet, the first taken first
        # JAX on a GPU probes in place (the module says why) until an out-of-memory leaves residue
        self.in_place = bool(visible_gpus()) and backends.name() == "jax" and not isolate

    def _new_worker(self) -> Worker:
        self._started += 1
        worker = Worker(self.workdir / f"probe-worker-{os.getpid()}-{self._started}.log", self._env)
        worker.launch()
        return worker

    @property
    def spare(self) -> Worker | None:
        """The next spare to be taken, or None."""
        return self.waiting[0] if self.waiting else None

    def prestart(self, count: int = 1) -> None:
        """Have the next `count` fresh workers launched now (those not launched yet), to import
        their framework while this process waits on other work (find-batch-size's noise scale), or
        while the probes before a limit run (its search's way up: paused while their steps are
        timed): find-batch-size's calibration, and a user's model's prediction probe beside it. On a
        GPU only one, where nothing runs beside it: the noise scale's wait."""
        while len(self.waiting) < (count if self.spares else 1):
            self.waiting.append(self._new_worker())

    def _fresh(self, spare: bool = True) -> Worker:
        """A worker that has run nothing: the spare, or a new one (see `_unused`)."""
        self._retire()
        self.worker, self._clean = self._unused(spare), True
        return self.worker

    def _unused(self, spare: bool = True) -> Worker:
        """The spare, taken, or a new worker. On the CPU, where more fresh workers are to come (every
        probe's with `isolate`; near a limit once `fresh_from` is known), the next spare is
        launched at once (unless not `spare`: the last fresh worker a search needs). It imports
        its framework while this worker's probes run, paused while their steps are timed
        (`_run_once`), so the next fresh probe finds its import done, or under way: on two cores a
        fresh worker's import then costs the wait for what is left of it, not the whole. Nowhere else: a spare no probe takes is an import for nothing, on cores
        that may have other work. A spare that died waiting is replaced."""
        worker = self.waiting.pop(0) if self.waiting else None
        if worker is None or not worker.alive:
            if worker is not None:
                worker.close()
            worker = self._new_worker()
        if self.spares and spare and (self.isolate or self.fresh_from is not None) and not self.waiting:
            self.waiting.append(self._new_worker())
        return worker

    def run_aside(self, task: ProbeTask) -> ProbeRecord:
        """`task` in a fresh worker of its own, ended after it, while the current worker stays
        for the next probes: on the CPU a user's model's prediction probe, larger than the
        search's first sizes, would otherwise retire the calibration's worker, and the search's
        way up need a fresh one more (seconds of import). On a GPU, where two started frameworks
        would share the device's memory, it is a fresh worker's probe as any other."""
        if not self.spares or self.worker is None or not self.worker.alive:
            return self.run(task, fresh=True)
        worker, clean = self._unused(), self._clean
        try:
            record, _ = self._run_once(task, worker=worker)
        finally:
            worker.close()
            self._clean = clean  # the current worker's log is its own tasks' to keep
        if record.status == Status.DONE:
            worker.log_path.unlink(missing_ok=True)
        return record

    def resident_mb(self) -> float | None:
        """The live worker's resident set now, in MiB: what it holds between probes (the compiled
        steps it keeps, its allocators' pools), which the next probe in it adds to. None without a
        live worker, on a GPU, whose memory that is not, or with `isolate` (no worker taken for more)."""
        worker = self.worker
        if worker is None or not worker.alive or worker.device != "cpu" or self.isolate:
            return None
        kb = proc_status_kb("VmRSS", worker.proc.pid)
        return None if kb is None else kb / 1024

    def _retire(self) -> None:
        if self.worker is not None:
            self.worker.close()
            if self._clean:
                self.worker.log_path.unlink(missing_ok=True)
            self.worker = None

    def wants_fresh(self, task: Task) -> bool:
        """Whether `task` needs a worker that has run nothing yet (see the module's docstring)."""
        worker = self.worker
        if worker is None or not worker.alive or self.isolate:
            return True
        if not isinstance(task, ProbeTask) or not worker.tasks or self.in_place:
            return False
        return task.batch_size <= worker.largest_batch or (
            self.fresh_from is not None and task.batch_size >= self.fresh_from)

    def run(self, task: Task, fresh: bool = False, timing: bool = False, spare: bool = True):
        """The task's record; a probe's with the cap it ran under, the worker it ran in (and
        the worker's log kept when it did not end done). `fresh`: in a worker that has run nothing
        (`spare`: the next spare launched, on the CPU). `timing`: a probe run for its
        step time alone, in the live worker whatever it ran before (its memory then says nothing,
        and is not asked)."""
        if timing and self.worker is not None and self.worker.alive:
            return self._run_once(task, worker=self.worker)[0]
        record, reused = self._run_once(task, fresh=fresh, spare=spare)
        if isinstance(task, ProbeTask) and record.status == Status.OOM and record.residue_mb is not None \
                and not record.keeps_worker():
            self.in_place = False  # it left something behind: fresh workers from here on
        if isinstance(task, ProbeTask) and reused and record.status == Status.OOM and not record.keeps_worker():
            self._clean = True  # the answer that counts is the fresh one: the reused one's log goes
            record, _ = self._run_once(task, fresh=True)
            record.worker = "retried"
        if isinstance(task, ProbeTask) and record.status == Status.OOM:
            oom.describe(record)  # the allocator's words and the cause, where known (the answer that counts)
        return record

    def _run_once(self, task: Task, fresh: bool = False, worker: Worker | None = None, spare: bool = True):
        worker = worker or (self._fresh(spare) if fresh or self.wants_fresh(task) else self.worker)
        reused = worker.tasks > 0
        if not worker.alive or not worker.ready:
            worker.start_or_record()
        cap = self.memory_cap_bytes or (self.cpu_cap_bytes if worker.device == "cpu" else None)
        importing = [spare for spare in self.waiting if not spare.ready]

        def on_progress(payload: dict) -> None:  # run_probe says when its timed steps begin and end
            if "timing" in payload:
                for spare in importing:
                    spare.pause(bool(payload["timing"]))

        try:  # an importing spare stops while the probe's steps are timed
            record = worker.run(task, memory_cap_bytes=cap, on_progress=on_progress if importing else None)
        finally:
            for spare in importing:
                spare.pause(False)
        if record.status != Status.DONE:
            self._clean = False
        if not isinstance(task, ProbeTask):
            return record, reused
        record.worker = "reused" if reused else "fresh"
        return self._as_capped(record, task, cap, worker), reused

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
        for name in ("batch_size", "optimizer", "dataset", "precision", "steps", "warmup", "deterministic", "tf32"):
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
        for spare in self.waiting:
            if not spare.ready:
                spare.kill()  # still importing: not worth the wait
            spare.close()
            spare.log_path.unlink(missing_ok=True)
        self.waiting = []
        with contextlib.suppress(OSError):
            self.workdir.rmdir()  # empty unless a probe that did not end done left its log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
