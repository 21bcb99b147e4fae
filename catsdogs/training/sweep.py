"""A sweep: the grid of trials, run by workers, each outcome in the store.

Each of the sweep's `workers` slots holds one worker that runs trial after trial, reusing decoded
data and compiled training steps: a process on this machine (the local runner, `LocalSlot`) or a
Ray actor (catsdogs.training.ray_runner). A trial that does not end done takes its worker with it
and the slot starts a fresh one. A slot claims, among the trials of the lowest seed still
pending, first those whose shape its worker has compiled: the order stays seed-major (a sweep
stopped early still covers the whole figure) while steps are reused. `isolate` gives every trial
a fresh worker (one process per trial). Only this process writes the store.

Resuming is the default: a finished trial (done, failed, out of memory) is never run again
unless asked (`overwrite`, `retry_failed`); a trial left `running` by a sweep that died is
run again. One failed trial never stops the sweep.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

from catsdogs import config
from catsdogs import noise as noise_scale
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.files import write_json_atomic
from catsdogs.host import versions
from catsdogs.manifest import require_prepared, test_images
from catsdogs.messages import TrialRecord, TrialTask
from catsdogs.schema import FINISHED, Status, TrialConfig
from catsdogs.seeds import next_seeds
from catsdogs.store import Store, store_path
from catsdogs.training import backends
from catsdogs.training.worker import Worker, needs_fresh_worker, slot_env


def check_workers(grid: list[TrialConfig], workers: int) -> None:
    """A mirrored trial uses every GPU: it runs with one worker at a time."""
    if workers > 1 and any(c.strategy == "mirrored" for c in grid):
        raise SettingError("--strategy mirrored uses every GPU for one trial: use it with --workers 1", "workers")


def describe(grid: list[TrialConfig], out: Path) -> list[str]:
    """One line per planned trial with its status in the store, if it has one."""
    status = {}
    if store_path(out).exists():
        with Store(store_path(out)) as store:
            status = {c.key(): (store.get(c.key()) or {}).get("status") for c in grid}
    lines = [f"{c.key()}  {status.get(c.key()) or 'new':8}  {c.label()}" for c in grid]
    return [*lines, f"{len(grid)} trials"]


class LocalSlot:
    """One place where a sweep runs trials: a worker process on this machine."""

    def __init__(self, slot: int, workers: int, workdir: Path, isolate: bool = False, env: dict | None = None):
        self.env = {**slot_env(slot, workers), **(env or {})}
        self.log_path = Path(workdir) / f"worker-{slot}.log"
        self.settings = backends.process_env_for()  # the kept worker's process settings
        self.worker = Worker(self.log_path, {**self.env, **self.settings})  # the kept one, for trials that share it
        self.running = self.worker  # the one running the current trial (what stop() ends)
        self.isolate = isolate

    def shapes(self) -> set[str]:
        return self.worker.shapes if self.worker.alive else set()

    def run(self, cfg: TrialConfig, data_dir: Path, on_epoch=None, noise: dict | None = None) -> TrialRecord:
        task = TrialTask(cfg, str(Path(data_dir).resolve()), noise)
        settings = backends.process_env_for(cfg.deterministic, cfg.tf32)
        if not (self.isolate or needs_fresh_worker(cfg)):
            if settings != self.settings:  # a process runs one setting: another gets its own worker
                self.worker.close()
                self.settings = settings
                self.worker = Worker(self.log_path, {**self.env, **settings})
            self.running = self.worker
            reused = self.worker.alive and self.worker.tasks > 0
            record = self.worker.run(task, on_progress=on_epoch)
            if record.status == Status.OOM and reused:
                # A reused worker holds what its earlier trials' allocators kept (see
                # catsdogs.measure.prober): out of memory there is only an answer for a fresh one.
                record = self.worker.run(task, on_progress=on_epoch)
            return record
        # A process of its own, started for this trial and ended with it; the kept worker is
        # ended too, so the trial has the machine (all GPUs, for mirrored) to itself.
        self.worker.close()
        self.running = Worker(self.log_path, {**self.env, **settings, **backends.current().strategy_env(cfg.strategy)})
        try:
            return self.running.run(task, on_progress=on_epoch)
        finally:
            self.running.close()

    def stop(self) -> None:
        """From another thread (Ctrl-C): end the trial now; run() returns it as lost."""
        self.running.kill()

    def close(self) -> None:
        self.running.close()
        self.worker.close()


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


class _Board:
    """What the slots share: counts for the progress lines and the ETA, all under one lock."""

    def __init__(self, total: int, finished: int, workers: int, log):
        self.lock = threading.Lock()
        self.total, self.finished, self.workers, self.log = total, finished, workers, log
        self.durations: list[float] = []
        self.base, self.started = finished, 0
        self.attempted: set[str] = set()  # each trial runs at most once per invocation
        self.stop = threading.Event()

    def eta(self) -> str:
        if not self.durations:
            return ""
        left = self.total - self.finished
        mean = sum(self.durations) / len(self.durations)
        return f", ETA {_fmt_seconds(mean * left / min(self.workers, max(left, 1)))}"


def run_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path, *,
              overwrite: bool = False, retry_failed: bool = False, log=print,
              sweep_config: dict | None = None, worker_env: dict | None = None,
              workers: int = 1, isolate: bool = False, slots=None, kept: list | None = None,
              noise: noise_scale.NoiseSettings | None = None) -> dict:
    """Run every trial of `grid` not finished yet, up to `workers` at once; return status counts.

    `noise`: record each trial's gradient noise scale with these settings (catsdogs.noise). It is
    no part of a trial's identity: trials already finished are not run again for it.
    `slots(index, workers, workdir)` makes the object that runs slot `index`'s trials (its
    `run(cfg, data_dir, on_epoch, noise)` returns a record; `shapes()`, `stop()`, `close()`); by
    default a LocalSlot, a worker process on this machine. `kept`: slots made by the caller
    (`make_slots`), used and left open, so their workers' decoded data and compiled steps serve
    the caller's next call too (the adaptive rounds). Whatever runs the trials, only this
    process writes the store, one transaction per outcome."""
    out = Path(out)
    sweep_dir = out / name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    manifest = require_prepared(Path(data_dir))
    resolved = {
        "name": name, **(sweep_config or {}), "data_dir": str(Path(data_dir).resolve()),
        "noise_scale": noise.as_dict() if noise else None,
        "data": {k: manifest[k] for k in ("params", "source", "fingerprint", "counts")},
        "trials": [asdict(c) for c in grid], "versions": versions(),
    }
    write_json_atomic(sweep_dir / "sweep.json", resolved)
    with Store(store_path(out)) as store:
        keys = store.register_sweep(name, resolved, [asdict(c) for c in grid], overwrite=overwrite)
        csv_path = store.export_csv(name, sweep_dir / "results.csv")
        counts = store.counts(keys)
    total = len(keys)
    already = sum(counts[s] for s in FINISHED)
    if already:
        log(f"Sweep {name}: {already} of {total} trials already finished, resuming.")
    how = "a fresh worker process per trial" if isolate else "long-lived worker processes"
    log(f"Sweep {name}: {total} trials, {workers} at a time in {how}; results in {store_path(out)} "
        f"and {csv_path}")
    board = _Board(total, already, workers, log)
    runners = kept if kept is not None else make_slots(out, workers, isolate, worker_env, slots)
    work = dict(keys=keys, by_key={c.key(): c for c in grid}, data_dir=data_dir, out=out, name=name,
                board=board, retry_failed=retry_failed, noise=noise.as_dict() if noise else None)
    # Each slot's thread sets its event when it ends. Waiting on events rather than
    # Thread.join: a join cut short by Ctrl-C can leave the thread looking finished when it is not.
    ended = [threading.Event() for _ in runners]
    threads = [threading.Thread(target=_slot_thread, args=(runner, i, ended[i]), kwargs=work, daemon=True)
               for i, runner in enumerate(runners)]
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        for t in threads:
            t.start()
        for e in ended:
            while not e.wait(0.2):  # short waits, so Ctrl-C reaches this thread at once
                pass
    except KeyboardInterrupt:
        board.stop.set()
        for runner in runners:
            runner.stop()
        for e in ended:
            e.wait()
        with Store(store_path(out)) as store:
            counts = store.counts(keys)
        log(f"Interrupted: {counts[Status.DONE]} of {total} trials done; run the same command again to resume.")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if kept is None:  # kept slots are the caller's to close
            for runner in runners:
                runner.close()
    with Store(store_path(out)) as store:
        counts = store.counts(keys)
        elsewhere = store.running_elsewhere(keys)
    # A trial another live sweep is running is neither failed nor left to do: it counts neither way.
    counts[RUNNING_ELSEWHERE] = len(elsewhere)
    running = (f", {len(elsewhere)} running in another sweep (pid {', '.join(map(str, sorted(set(elsewhere))))})"
               if elsewhere else "")
    log(f"Sweep {name} finished: {counts[Status.DONE]} done, {counts[Status.FAILED]} failed, "
        f"{counts[Status.OOM]} out of memory{running}, of {total}.")
    return counts


RUNNING_ELSEWHERE = "running_elsewhere"  # counts' key: trials another live sweep is running


def make_slots(out: Path, workers: int = 1, isolate: bool = False, worker_env: dict | None = None,
               slots=None) -> list:
    """The slots a sweep runs its trials in: `slots(index, workers, workdir)` each, else LocalSlots."""
    make_slot = slots or (lambda i, n, workdir: LocalSlot(i, n, workdir, isolate=isolate, env=worker_env))
    return [make_slot(i, max(1, workers), Path(out) / ".work") for i in range(max(1, workers))]


def succeeded(counts: dict, total: int) -> bool:
    """A sweep's exit status: every trial done, or being run by another live sweep; any failed,
    out-of-memory or left-over trial makes it a failure (exit code 1)."""
    return counts[Status.DONE] + counts.get(RUNNING_ELSEWHERE, 0) == total


def claim_order(keys: list[str], by_key: dict[str, TrialConfig], shapes: set[str]) -> list[str]:
    """The order a slot claims in: seed-major, and within a seed the trials whose compiled step
    the slot's worker keeps first, then the rest in the grid's order."""
    position = {k: i for i, k in enumerate(keys)}
    return sorted(keys, key=lambda k: (by_key[k].seed, repr(by_key[k].shape()) not in shapes, position[k]))


def _slot_thread(runner, slot: int, ended: threading.Event, **work) -> None:
    try:
        _work(runner, slot, **work)
    finally:
        ended.set()


def _work(runner, slot: int, *, keys, by_key, data_dir, out, name, board: _Board, retry_failed, noise) -> None:
    """Claim, run, record; until nothing is left or the sweep is stopped."""
    tag = f"[w{slot}] " if board.workers > 1 else ""
    with Store(store_path(out)) as store:
        while not board.stop.is_set():
            with board.lock:
                left = [k for k in keys if k not in board.attempted]
                row = store.claim(claim_order(left, by_key, runner.shapes()), retry_failed=retry_failed)
                if row is None:
                    return
                board.attempted.add(row["key"])
                board.started += 1
                position = board.base + board.started
                eta = board.eta()
            cfg = by_key[row["key"]]
            board.log(f"{tag}[{min(position, board.total)}/{board.total}] {cfg.label()}{eta}")
            t0 = time.time()
            record = runner.run(cfg, data_dir, on_epoch=_epoch_logger(board.log, tag), noise=noise)
            if board.stop.is_set() or record.status == Status.LOST:
                store.release(row["key"])  # interrupted or lost with its worker: to be run again
                if record.status == Status.LOST and not board.stop.is_set():
                    board.log(f"{tag}    lost: {record.error or ''}; left pending")
                continue
            store.finish(row["key"], record)
            with board.lock:
                board.durations.append(time.time() - t0)
                board.finished += 1
                store.export_csv(name, out / name / "results.csv")
            board.log(f"{tag}{_outcome_line(record, time.time() - t0)}")


def _epoch_logger(log, tag: str = ""):
    def on_epoch(e):
        val = f" val_acc {e['val_accuracy']:.3f}" if "val_accuracy" in e else ""
        noise = ""
        if "noise_scale" in e:
            shown = noise_scale.describe({"b_simple": e["noise_scale"], "low": e["noise_scale_low"], "high": e["noise_scale_high"]})
            noise = f", B_simple {shown} in {e['noise_seconds']:.1f} s"
        log(f"{tag}    epoch {e['epoch']}/{e['epochs']}: loss {e['loss']:.4f} acc {e['accuracy']:.3f}{val} "
            f"({e['seconds']:.1f} s{noise})")
    return on_epoch


def _outcome_line(record: TrialRecord, seconds: float) -> str:
    if record.status == Status.DONE:
        reused = ", step reused" if record.step_reused else ""
        return (f"    done: test accuracy {record.test_accuracy:.4f}, "
                f"{record.images_per_second:.0f} images/s, {seconds:.1f} s{reused}")
    first = record.error.splitlines()[0] if record.error else ""
    return f"    {record.status}: {first}"


def run(name: str, grid: list[TrialConfig], data_dir: Path, out: Path, *, target_ci: float | None = None,
        max_seeds: int | None = None, **kwargs) -> dict:
    """`run_sweep`, or with a target `run_adaptive_sweep`: status counts, and under "trials" how
    many trials the sweep ended with (the adaptive rounds add some)."""
    if target_ci is None:
        return {**run_sweep(name, grid, data_dir, out, **kwargs), "trials": len(grid)}
    return run_adaptive_sweep(name, grid, data_dir, out, target_ci=target_ci,
                              max_seeds=max_seeds or config.MAX_SEEDS, **kwargs)


# --- adaptive seeds ----------------------------------------------------------------------------


def run_adaptive_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path, *, target_ci: float,
                       max_seeds: int, overwrite: bool = False, log=print, sweep_config: dict | None = None,
                       **kwargs) -> dict:
    """Run `grid`, then keep adding one seed to every cell whose interval is still wider than
    ±target_ci points, round after round (seed-major, as every sweep), until each cell meets it or
    has max_seeds seeds. Resumable: the rounds are decided from the store, so the same command
    again finds the same cells, runs what is left, and goes on."""
    seeds_run = _seeds_in_store(name, grid, out)
    if seeds_run > max_seeds:
        raise CatsdogsError(f"sweep {name!r} already has seeds 0-{seeds_run - 1} of these cells: "
                            f"--max-seeds must be at least {seeds_run}")
    sweep_config = {**(sweep_config or {}), "adaptive": {"target_ci": target_ci, "max_seeds": max_seeds}}
    n_test = test_images(require_prepared(Path(data_dir))["counts"])  # for the binomial floor
    # One set of slots for every round: their workers keep their decoded data and compiled steps
    kept = make_slots(out, kwargs.get("workers", 1), kwargs.get("isolate", False), kwargs.get("worker_env"),
                      kwargs.get("slots"))
    try:
        round_no = 1
        while True:
            counts = run_sweep(name, grid, data_dir, out, overwrite=overwrite and round_no == 1, log=log,
                               sweep_config=sweep_config, kept=kept, **kwargs)
            with Store(store_path(out)) as store:
                rows = {c.key(): store.get(c.key()) or {} for c in grid}
            step = next_seeds(grid, rows, target_ci, max_seeds, n_test=n_test)
            states = [c["state"] for c in step["cells"].values()]
            summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
            if not step["add"]:
                log(f"Adaptive seeds: every cell is done ({summary}; target ±{target_ci:g} points, "
                    f"at most {max_seeds} seeds).")
                return {**counts, "cells": step["cells"], "trials": len(grid)}
            round_no += 1
            log(f"Adaptive seeds, round {round_no}: {len(step['add'])} cells wider than ±{target_ci:g} "
                f"points get another seed ({summary}).")
            grid = grid + step["add"]
    finally:
        for runner in kept:
            runner.close()


def _seeds_in_store(name: str, grid: list[TrialConfig], out: Path) -> int:
    """The most seeds any of the grid's cells has in sweep `name` of the store (0 if none)."""
    if not store_path(out).exists():
        return 0
    cells = {c.cell() for c in grid}
    with Store(store_path(out)) as store:
        if name not in store.sweeps():
            return 0
        seeds = [t["seed"] + 1 for t in store.trials(name)
                 if TrialConfig.from_dict(t["config"]).cell() in cells]
    return max(seeds, default=0)
