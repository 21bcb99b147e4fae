"""The Ray runner: a sweep's trials on Ray, `catsdogs sweep --runner ray` (the `catsdogs[ray]` extra).

Each sweep slot holds one Ray actor, a worker: a process that imports the framework once and
runs trial after trial with the engine, keeping decoded data and compiled training steps as a
local worker (catsdogs.runtime.worker) does. An actor asks for one GPU where the cluster has GPUs
(all of a node's GPUs for `--strategy mirrored`), else for `num_cpus_per_trial` CPU cores (by
default 1, or this machine's share when `--workers` is given), with the framework's thread
pools sized to match. The sweep process is the Ray driver: it claims trials and writes every
outcome to its own store exactly as with the local runner, so resuming, `report` and
`reproduce` work unchanged; nothing is written on the other nodes but Ray's own logs.

Where the actors run: the cluster at `address`, else $RAY_ADDRESS (e.g. "auto" on a node of a
cluster started with `ray start`, or "ray://head:10001" with Ray Client, which needs
`ray[client]`), else a local Ray started for the sweep on this machine's cores and GPUs, which
stops when the sweep process ends (a driver killed with kill -9 takes its actors with it).

On a cluster every node needs catsdogs and its dependencies installed, and **the prepared data
at the same absolute path as on the driver**: a shared filesystem (NFS, a mounted bucket), or the
same `catsdogs prepare` on every node. The path is sent as it is; the trial checks the data's
fingerprint against the one the sweep was planned with, so a node with other data (or none)
fails the trial loudly (its record names the node) rather than recording a result trained on
the wrong images. An actor starts in the sweep's current folder where that folder exists on its
node, first on its Python path, as a local worker does: a user's model by function
(`--model my_models:small`) imports from there on this machine, and elsewhere from the node's own
folder of that path or its installed packages.

What comes back, and what becomes of the actor:
- the trial's record (messages.TrialRecord, from `engine.run_task`), as a local worker gives it; one that is not `done`
  (an exception in the trial, `failed` or `oom`) ends the actor, and the slot's next trial
  gets a fresh one, as locally;
- an actor killed by Ray's memory monitor: `oom`, as a killed worker is locally;
- an actor or node lost mid-trial (crash, kill, node down): the slot runs the trial again on a
  fresh actor, up to MAX_RETRIES times; lost every time, the slot returns a record whose status
  is `lost` and the sweep gives the trial back to pending, to be run by the next run of the same
  command. Never a half result: a record exists only when the trial's function returned one.

Per-epoch progress does not stream back from an actor: the sweep logs each trial's start and
end only. The framework's output goes to Ray's worker logs (/tmp/ray/session_latest/logs on
each node), not to the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import time
from pathlib import Path

from catsdogs import host
from catsdogs.errors import CatsdogsError
from catsdogs.messages import TrialRecord, TrialTask
from catsdogs.runtime import backends
from catsdogs.schema import Status
from catsdogs.training.local_slot import needs_fresh_worker

INSTALL_HINT = "install the extra: pip install 'catsdogs[ray]'"
MAX_RETRIES = 2  # runs again, on a fresh actor, of a trial whose actor or node was lost

# What the local runner sets to place a child on this machine (its GPU, its share of the
# cores); Ray places tasks itself, so these are dropped from what the sweep passes.
_PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "CATSDOGS_CPUS")


def import_ray():
    """The `ray` module, or a one-line CatsdogsError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise CatsdogsError(f"--runner ray needs Ray, which is not installed; {INSTALL_HINT}") from None
    return ray


def init_ray(address: str | None = None):
    """Connect to the cluster at `address` or $RAY_ADDRESS, else start a local Ray; quietly.

    An already initialized Ray (this process's earlier sweep) is used as it is."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        where = f"connect to the Ray cluster at {address}" if address else "start a local Ray"
        raise CatsdogsError(f"cannot {where}: {_first_line(e)}") from None
    return ray


def cluster_plan(ray, num_cpus_per_trial: int | None = None, workers: int | None = None) -> dict:
    """What one actor asks for, and how many the cluster runs at once: its GPUs, else its
    CPUs // CPUs per actor (node by node). Without GPUs an actor asks for `num_cpus_per_trial`
    cores; left out, 1, or with `workers` given (an explicit --workers), the cluster's cores //
    workers, so that one worker on two cores trains on both."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    node_gpus = [int(r.get("GPU", 0)) for r in nodes]
    node_cpus = [int(r.get("CPU", 0)) for r in nodes]
    use_gpus = sum(node_gpus) > 0
    if num_cpus_per_trial is None:
        share = sum(node_cpus) // workers if workers and not use_gpus else 1
        num_cpus_per_trial = max(1, min(share, max(node_cpus, default=1)))
    cpus = int(num_cpus_per_trial)
    if cpus < 1:
        raise CatsdogsError(f"a trial needs at least one CPU, got {num_cpus_per_trial}")
    if use_gpus:
        concurrency = sum(node_gpus)
    else:
        if cpus > max(node_cpus, default=0):
            raise CatsdogsError(f"a trial asks for {cpus} CPUs but no node of the Ray cluster has that "
                                f"many (nodes: {node_cpus or 'none alive'})")
        concurrency = sum(c // cpus for c in node_cpus)
    concurrency = max(1, concurrency)
    return {"use_gpus": use_gpus, "cpus": cpus, "node_gpus": node_gpus, "concurrency": concurrency,
            "description": (f"Ray: {len(nodes)} node(s), {sum(node_cpus)} CPUs, {sum(node_gpus)} GPUs; "
                            f"each worker on {'1 GPU' if use_gpus else f'{cpus} CPU(s)'}, "
                            f"{concurrency} at once")}


class TrialActor:
    """A worker as a Ray actor: the framework imported once, the engine's caches kept."""

    def __init__(self, env: dict, cwd: str | None = None):
        os.environ.update(env)  # before the framework starts: its thread pools are sized once
        if cwd and os.path.isdir(cwd):  # the sweep's folder, as a local worker has it (fork_server._move_to): a
            os.chdir(cwd)  # user's model module there imports (Ray's workers start in its session folder)
            sys.path.insert(0, cwd)
        from catsdogs.runtime import backends

        backends.current().start()

    def run(self, fn, task: TrialTask) -> dict:
        from catsdogs.training import steps

        return {"record": fn(task), "shapes": steps.STEPS.shapes()}


def _run_in_worker(task: TrialTask) -> TrialRecord:
    """What an actor runs for a trial; always a record. Passed to the actor with each trial,
    looked up on this module at the call, so a test can replace it."""
    from catsdogs.training import engine

    record = engine.run_task(task)
    if record.traceback:
        record.error = f"{record.error or ''}\n{record.traceback}(Ray worker on {platform.node()})"
        record.traceback = None
    return record


class RaySlot:
    """One sweep slot on Ray: an actor, kept between trials, replaced after any that is not done."""

    def __init__(self, ray, plan: dict, env: dict | None = None, isolate: bool = False,
                 max_retries: int | None = None):
        self.ray, self.plan, self.isolate = ray, plan, isolate
        self.max_retries = MAX_RETRIES if max_retries is None else max_retries  # (read when made, not defined)
        self.env = {k: v for k, v in (env or {}).items() if k not in _PLACEMENT_VARS}
        self.actor = None
        self._settings: dict | None = None  # the actor's process settings
        self._shapes: set[str] = set()
        self._stopped = False

    def shapes(self) -> set[str]:
        return self._shapes if self.actor is not None else set()

    def _new_actor(self, cfg):
        backend = backends.current()
        # The backend by name: an actor's process may not see this process's KERAS_BACKEND or
        # keras.json (Ray started by an earlier sweep, another node)
        self._settings = backends.process_env_for(cfg.deterministic, cfg.tf32)
        env = {**backend.process_env(), **self.env, **self._settings, **backend.strategy_env(cfg.strategy),
               "KERAS_BACKEND": backend.NAME}
        if self.plan["use_gpus"]:
            gpus = max(self.plan["node_gpus"]) if cfg.strategy == "mirrored" else 1
            options = {"num_gpus": gpus, "num_cpus": self.plan["cpus"]}
        else:
            options = {"num_cpus": self.plan["cpus"]}
            env.update(backend.process_env(threads=self.plan["cpus"]))
        malloc = host.malloc_vars(env)
        if malloc:  # glibc reads them as a process starts: Ray starts the actor's process with them
            options["runtime_env"] = {"env_vars": malloc}
        cls = self.ray.remote(max_restarts=0, max_task_retries=0)(TrialActor)
        return cls.options(name=f"catsdogs worker {id(self)}-{time.monotonic_ns()}", **options).remote(env, os.getcwd())

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling: dict | None = None,
            eval_every: int | None = None, user: dict | None = None) -> TrialRecord:
        task = TrialTask(cfg, str(Path(data_dir).resolve()), noise_sampling, eval_every, user=user)
        fresh = self.isolate or needs_fresh_worker(cfg)  # an actor started for it, ended with it
        if self.actor is not None and self._settings != backends.process_env_for(cfg.deterministic, cfg.tf32):
            self.close()  # an actor's process runs one setting: another gets its own
        record = TrialRecord(status=Status.LOST)
        for attempt in range(1 + self.max_retries):
            if self.actor is not None and fresh:
                self.close()
            if self.actor is None:
                self.actor = self._new_actor(cfg)
            try:
                out = self.ray.get(self.actor.run.remote(_run_in_worker, task))
            except Exception as exc:  # noqa: BLE001 - every way an actor call can end becomes a record
                record = outcome_of_error(exc, self.ray)
                self.close()
                if record.status == Status.LOST and not self._stopped and attempt < self.max_retries:
                    continue  # the actor or its node was lost: again, on a fresh actor
                return record
            record, self._shapes = out["record"], set(out["shapes"])
            if record.status != Status.DONE or fresh:
                self.close()  # isolation: the next trial gets a fresh actor
            return record
        return record

    def digest(self, key: str) -> tuple[str | None, str | None]:
        """Never asked: an actor's trials come with their digest (its digest is not deferred)."""
        return None, "a Ray slot delivers each trial with its digest"

    def stop(self) -> None:
        """From another thread (Ctrl-C): end the running trial now; run() returns it lost."""
        self._stopped = True
        self.close()

    def close(self) -> None:
        actor, self.actor, self._shapes = self.actor, None, set()
        if actor is not None:
            with contextlib.suppress(Exception):  # already dead, or Ray already gone
                self.ray.kill(actor)


def make_slots(address: str | None = None, workers: int | None = None, isolate: bool = False,
               num_cpus_per_trial: int | None = None, log=print, env: dict | None = None):
    """Initialize Ray; `(make_slot, workers)`: a factory of RaySlots for sweep.run_sweep, and how
    many to run: `workers` given caps the cluster's concurrency, left out (None) it is used."""
    ray = init_ray(address)
    plan = cluster_plan(ray, num_cpus_per_trial, workers)
    log(plan["description"] + (f"; --workers {workers}" if workers else ""))
    if workers and workers > plan["concurrency"]:
        log(f"Note: {workers} workers but the cluster runs {plan['concurrency']} at once now; "
            "the others wait in Ray's queue.")

    def make_slot(index: int, n: int, workdir=None) -> RaySlot:
        return RaySlot(ray, plan, env=env, isolate=isolate)

    return make_slot, workers or plan["concurrency"]


def outcome_of_error(exc: BaseException, ray) -> TrialRecord:
    """The record for a task that ended with an exception from Ray rather than a record."""
    ex = ray.exceptions
    if isinstance(exc, ex.OutOfMemoryError):  # Ray's memory monitor killed it: oom, as locally
        return TrialRecord(status=Status.OOM, error=f"killed by Ray's memory monitor: {_first_line(exc)}\n{exc}")
    if isinstance(exc, ex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is None or _is_system_error(cause, ex):
            return _lost(cause or exc)
        # the task's code raised outside the trial's own guard, e.g. catsdogs missing on a node
        return TrialRecord(status=Status.FAILED, error=f"{type(cause).__name__}: {cause}\n{exc}"[:12000])
    return _lost(exc)  # a lost or killed actor, a lost node, or anything else from Ray


def _is_system_error(exc: BaseException, ex) -> bool:
    system = (ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError, ex.RaySystemError,
              ex.LocalRayletDiedError, ex.TaskCancelledError, ex.TaskUnschedulableError,
              ex.RayActorError)
    return isinstance(exc, system)


def _lost(exc: BaseException) -> TrialRecord:
    why = _first_line(exc)
    return TrialRecord(status=Status.LOST,
                       error=type(exc).__name__ + (f": {why}" if why != type(exc).__name__ else ""))


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
