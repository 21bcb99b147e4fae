"""A sweep's slot on this machine (catsdogs.training.sweep.Slot): one worker process kept from
trial to trial, a fresh one for a trial of other process settings or a distribution strategy,
and a trial out of memory in a reused worker run again in a fresh one.

On a GPU its worker answers each trial before the weights' digest is hashed, and hashes it while
the next trial trains (TrialTask.defer_digest): the slot keeps the digests as they come (`digest`),
and the sweep records the trial once its digest is in.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from catsdogs.host import usable_cores, visible_gpus
from catsdogs.messages import TrialRecord, TrialTask
from catsdogs.runtime import backends
from catsdogs.runtime.worker import CPUS_ENV, Worker
from catsdogs.schema import Status


def needs_fresh_worker(cfg) -> bool:
    """A distribution strategy sets devices up before the framework starts: a trial of one runs
    in a worker of its own."""
    return cfg.strategy != "none"


def slot_env(slot: int, workers: int) -> dict:
    """What worker slot `slot` of `workers` sees: its own GPU, or its share of the cores (its
    threads, and the cores themselves: pinned, so two workers never fight over one)."""
    gpus = visible_gpus()
    if gpus:
        return {"CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)]} if workers > 1 else {}
    if workers == 1:
        return {}
    cores = usable_cores()
    share = max(1, len(cores) // workers)  # N trainers on N x fewer threads, not N x all
    mine = cores[(slot * share) % len(cores):][:share]
    return {**backends.current().process_env(threads=share), CPUS_ENV: ",".join(map(str, mine))}


class LocalSlot:
    """A sweep's slot on this machine (catsdogs.training.sweep.Slot): a worker process kept from
    trial to trial while their process settings agree, a fresh one for a trial that needs one."""

    def __init__(self, slot: int, workers: int, workdir: Path, isolate: bool = False, env: dict | None = None,
                 defer_digest: bool | None = None):
        self.env = {**slot_env(slot, workers), **(env or {})}
        # the weights' digest delivered while the next trial runs (TrialTask.defer_digest): on a GPU
        # worker by default (None), whose host's cores are idle while the GPU trains
        self.defer_digest = defer_digest
        self.log_path = Path(workdir) / f"worker-{slot}.log"
        self.settings = backends.process_env_for()  # the kept worker's process settings
        self.digests: dict = {}  # digests owed for trials answered without them, from any of its workers
        self.worker = self._worker(self.settings)  # the kept one, for trials that share it
        self.running = self.worker  # the one running the current trial (what stop() ends)
        self.isolate = isolate

    def shapes(self) -> set[str]:
        return self.worker.shapes if self.worker.alive else set()

    def _worker(self, settings: dict, extra: dict | None = None) -> Worker:
        return Worker(self.log_path, {**self.env, **settings, **(extra or {})}, digests=self.digests)

    def run(self, cfg, data_dir: Path, on_epoch=None, noise_sampling: dict | None = None,
            eval_every: int | None = None, user: dict | None = None) -> TrialRecord:
        task = TrialTask(cfg, str(Path(data_dir).resolve()), noise_sampling, eval_every, user=user)
        settings = backends.process_env_for(cfg.deterministic, cfg.tf32)
        if not (self.isolate or needs_fresh_worker(cfg)):
            if settings != self.settings:  # a process runs one setting: another gets its own worker
                self.worker.close()
                self.settings = settings
                self.worker = self._worker(settings)
            self.running = self.worker
            reused = self.worker.alive and self.worker.tasks > 0
            if self.defer_digest or (self.defer_digest is None and self.worker.device == "gpu"):
                task = replace(task, defer_digest=True)
            record = self.worker.run(task, on_progress=on_epoch)
            if record.status == Status.OOM and reused:
                # A reused worker holds what its earlier trials' allocators kept (see
                # catsdogs.measure.prober): out of memory there is only an answer for a fresh one.
                record = self.worker.run(task, on_progress=on_epoch)
            return record
        # A process of its own, started for this trial and ended with it; the kept worker is
        # ended too, so the trial has the machine (all GPUs, for mirrored) to itself.
        self.worker.close()
        self.running = self._worker(settings, backends.current().strategy_env(cfg.strategy))
        try:
            return self.running.run(task, on_progress=on_epoch)
        finally:
            self.running.close()

    def digest(self, key: str) -> tuple[str | None, str | None]:
        """(digest, error) of trial `key`, answered with its digest pending: waited for from its
        worker (which hashes it while running the next trial); an error where the worker ended
        without sending it."""
        if key not in self.digests and self.worker.alive:
            self.worker.wait_digest(key)
        return self.digests.pop(key, (None, "its worker ended before it sent the weights' digest"))

    def stop(self) -> None:
        """From another thread (Ctrl-C): end the trial now; run() returns it as lost."""
        self.running.kill()

    def close(self) -> None:
        self.running.close()
        self.worker.close()
