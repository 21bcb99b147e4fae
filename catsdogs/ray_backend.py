"""Run a sweep's trials as Ray tasks: `catsdogs sweep --backend ray` (the `catsdogs[ray]` extra).

Each pending trial becomes one Ray task asking for one GPU where the cluster has GPUs (all of a
node's GPUs for `--strategy mirrored`), else for `num_cpus_per_trial` CPU cores (by default
1, or this machine's share when `--workers` is given), with TensorFlow's thread pools sized to
match. The sweep process is the Ray driver: it claims trials and writes every outcome to its
own store exactly as with the local backend, so resuming, `report` and `reproduce` work
unchanged; nothing is written on the other nodes but Ray's own logs.

Where the tasks run: the cluster at `address`, else $RAY_ADDRESS (e.g. "auto" on a node of a
cluster started with `ray start`, or "ray://head:10001" with Ray Client, which needs
`ray[client]`), else a local Ray started for the sweep on this machine's cores and GPUs, which
stops when the sweep process ends (a driver killed with kill -9 takes its tasks with it).

On a cluster every node needs catsdogs and its dependencies installed, and **the prepared data
at the same absolute path as on the driver**: a shared filesystem (NFS, a mounted bucket), or the
same `catsdogs prepare` on every node. The path is sent as it is; the trial checks the data's
fingerprint against the one the sweep was planned with, so a node with other data (or none)
fails the trial loudly (its record names the node) rather than recording a result trained on
the wrong images.

What comes back:
- the trial's record (`run_trial`), as the local child process gives it;
- an exception inside the trial: a `failed` or `oom` record, classified and worded as the
  child process does (`classify_error`, the error and its traceback);
- a task killed by Ray's memory monitor: `oom`, as a killed child process is locally;
- a worker process or node lost mid-trial (crash, kill, node down): Ray runs the task again
  (`max_retries`); lost again, the runner returns `{"status": "lost"}` and the sweep gives the
  trial back to pending, to be run by the next run of the same command. Never a half result:
  a record exists only when the trial's function returned one.

Per-epoch progress does not stream back from a Ray task: the sweep logs each trial's start and
end only. TensorFlow's output goes to Ray's worker logs (/tmp/ray/session_latest/logs on each
node), not to the terminal. Every task runs in a fresh worker process (`max_calls=1`):
TensorFlow does not give device memory back, and the thread settings must be in place before
TensorFlow starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import traceback
from dataclasses import asdict
from pathlib import Path

from catsdogs.errors import CatsdogsError

INSTALL_HINT = "install the extra: pip install 'catsdogs[ray]'"
MAX_RETRIES = 2  # Ray's re-runs of a task whose worker or node was lost (not of trial errors)

# What the local backend sets to place a child on this machine (its GPU, its share of the
# cores); Ray places tasks itself, so these are dropped from what the sweep passes.
_PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def import_ray():
    """The `ray` module, or a one-line CatsdogsError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise CatsdogsError(f"--backend ray needs Ray, which is not installed; {INSTALL_HINT}") from None
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


def make_ray_runner(address: str | None = None, num_cpus_per_trial: int | None = None, *,
                    workers: int | None = None, max_retries: int = MAX_RETRIES):
    """Initialize Ray; return `(runner, concurrency)`.

    `runner` has the signature `run_sweep` expects and runs one trial as a Ray task, blocking
    until its record comes back. `concurrency` is how many trials the cluster can run at once:
    its GPUs, else its CPUs // CPUs per trial (node by node). Without GPUs a trial asks for
    `num_cpus_per_trial` cores; left out, 1, or with `workers` given (an explicit --workers),
    the cluster's cores // workers, so that one worker on two cores trains on both."""
    ray = init_ray(address)
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
    task = ray.remote(max_calls=1, max_retries=max_retries)(_run_in_worker)

    def runner(cfg, data_dir, workdir=None, on_epoch=None, env=None, on_start=None) -> dict:
        worker_env = {k: v for k, v in (env or {}).items() if k not in _PLACEMENT_VARS}
        if use_gpus:
            gpus = max(node_gpus) if cfg.strategy == "mirrored" else 1
            options = {"num_gpus": gpus, "num_cpus": cpus}
        else:
            options = {"num_cpus": cpus}
            worker_env.update(TF_NUM_INTRAOP_THREADS=str(cpus), TF_NUM_INTEROP_THREADS="1")
        ref = task.options(name=f"catsdogs trial {cfg.key()}", **options).remote(
            asdict(cfg), str(Path(data_dir).resolve()), worker_env)
        if on_start:
            on_start(RemoteTrial(ray, ref))
        try:
            return ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - every way a task can end becomes a record
            return outcome_of_error(exc, ray)

    runner.concurrency = concurrency
    runner.description = (f"Ray: {len(nodes)} node(s), {sum(node_cpus)} CPUs, {sum(node_gpus)} GPUs; "
                          f"each trial on {'1 GPU' if use_gpus else f'{cpus} CPU(s)'}, "
                          f"{concurrency} at once")
    return runner, concurrency


def sweep_runner(address: str | None = None, workers: int | None = None, log=print):
    """For the sweep command: `(runner, workers)`; `workers` given caps the cluster's
    concurrency, left out (None) the cluster's concurrency is used."""
    runner, concurrency = make_ray_runner(address, workers=workers)
    log(runner.description + (f"; --workers {workers}" if workers else ""))
    if workers and workers > concurrency:
        log(f"Note: {workers} workers but the cluster runs {concurrency} trials at once now; "
            "the others wait in Ray's queue.")
    return runner, workers or concurrency


class RemoteTrial:
    """What `on_start` gets for a trial running as a Ray task: `cancel()` stops it (Ctrl-C)."""

    def __init__(self, ray, ref):
        self.ray, self.ref = ray, ref

    def cancel(self) -> None:
        with contextlib.suppress(Exception):  # already finished, or Ray already gone
            self.ray.cancel(self.ref, force=True)


def _run_in_worker(config: dict, data_dir: str, env: dict) -> dict:
    """The Ray task: one trial in a fresh worker process; always a record, as the child gives."""
    os.environ.update(env)  # before TensorFlow starts: its thread pools are sized once
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from catsdogs.trial import TrialConfig, classify_error, run_trial

    try:
        return run_trial(TrialConfig.from_dict(config), Path(data_dir))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded trial status
        error = f"{type(exc).__name__}: {exc}".strip()[:4000]
        return {"status": classify_error(exc), "config": config,
                "error": f"{error}\n{traceback.format_exc()[-8000:]}(Ray worker on {platform.node()})"}


def outcome_of_error(exc: BaseException, ray) -> dict:
    """The record for a task that ended with an exception from Ray rather than a record."""
    ex = ray.exceptions
    if isinstance(exc, ex.OutOfMemoryError):  # Ray's memory monitor killed it: oom, as locally
        return {"status": "oom", "error": f"killed by Ray's memory monitor: {_first_line(exc)}\n{exc}"}
    if isinstance(exc, ex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is None or _is_system_error(cause, ex):
            return _lost(cause or exc)
        # the task's code raised outside the trial's own guard, e.g. catsdogs missing on a node
        return {"status": "failed", "error": f"{type(cause).__name__}: {cause}\n{exc}"[:12000]}
    return _lost(exc)  # a lost worker or node, a cancelled task, or anything else from Ray


def _is_system_error(exc: BaseException, ex) -> bool:
    system = (ex.WorkerCrashedError, ex.NodeDiedError, ex.ObjectLostError, ex.RaySystemError,
              ex.LocalRayletDiedError, ex.TaskCancelledError, ex.TaskUnschedulableError)
    return isinstance(exc, system)


def _lost(exc: BaseException) -> dict:
    why = _first_line(exc)
    return {"status": "lost", "error": type(exc).__name__ + (f": {why}" if why != type(exc).__name__ else "")}


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
