"""A sweep: the grid of trials, each in its own child process, its outcome in the store.

Resuming is the default: a finished trial (done, failed, out of memory) is never run again
unless asked (`overwrite`, `retry_failed`); a trial left `running` by a sweep that died is
run again. One failed trial never stops the sweep.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

from catsdogs import config
from catsdogs.prepare import require_prepared, versions, write_json_atomic
from catsdogs.store import Store
from catsdogs.trial import PROGRESS_PREFIX, TrialConfig, looks_like_oom


def plan(optimizers, batch_sizes, datasets, seeds: int, epochs: int, data_dir: Path,
         **protocol) -> list[TrialConfig]:
    """The grid, seed-major: every cell gets its first seed before any gets its second,
    so a sweep stopped early still covers the whole figure."""
    manifest = require_prepared(Path(data_dir))
    size = manifest["params"]["size"]
    grid = []
    for seed, dataset, opt, bs in itertools.product(range(seeds), datasets, optimizers, batch_sizes):
        cfg = TrialConfig(optimizer=opt, batch_size=int(bs), dataset=dataset, seed=seed, epochs=epochs,
                          image_size=size, data=manifest["fingerprint"][dataset], **protocol)
        cfg.check()
        grid.append(cfg)
    return list(dict.fromkeys(grid))  # the same trial asked twice runs once


def store_path(out: Path) -> Path:
    return Path(out) / config.STORE_FILE


def describe(grid: list[TrialConfig], out: Path) -> list[str]:
    """One line per planned trial with its status in the store, if it has one."""
    status = {}
    if store_path(out).exists():
        with Store(store_path(out)) as store:
            status = {c.key(): (store.get(c.key()) or {}).get("status") for c in grid}
    lines = [f"{c.key()}  {status.get(c.key()) or 'new':8}  {c.label()}" for c in grid]
    return [*lines, f"{len(grid)} trials"]


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the sweep dies, even by kill -9, so no
    orphan trial runs on while the next sweep runs it again."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_child(cfg: TrialConfig, data_dir: Path, workdir: Path, on_epoch=None, env=None,
              on_start=None) -> dict:
    """Run one trial in a fresh Python process; always return a record with a status."""
    key = cfg.key()
    workdir.mkdir(parents=True, exist_ok=True)
    spec, result, log = (workdir / f"{key}.spec.json", workdir / f"{key}.result.json",
                         workdir / f"{key}.log")
    result.unlink(missing_ok=True)
    write_json_atomic(spec, {"config": asdict(cfg), "data_dir": str(Path(data_dir).resolve())})
    child_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "catsdogs.trial", str(spec), str(result)],
            stdout=subprocess.PIPE, stderr=log_file, text=True, env=child_env,
            start_new_session=True,  # Ctrl-C reaches the sweep, which stops the child itself
            preexec_fn=_die_with_parent)
        if on_start:
            on_start(proc)
        try:
            for line in proc.stdout:
                if line.startswith(PROGRESS_PREFIX):
                    if on_epoch:
                        on_epoch(json.loads(line[len(PROGRESS_PREFIX):]))
                else:
                    log_file.write(line)
            rc = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if result.exists():
        record = json.loads(result.read_text())
        if record.get("traceback"):
            record["error"] = f"{record.get('error', '')}\n{record.pop('traceback')}"
        return record
    tail = log.read_text(errors="replace")[-4000:]
    killed = rc < 0 and -rc == signal.SIGKILL
    status = "oom" if killed or looks_like_oom(tail) else "failed"
    why = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
    return {"status": status, "error": f"trial process {why} without a result"
                                       f"{' (likely out of memory)' if killed else ''}: {last}\n{tail}"}


def _stop(proc: subprocess.Popen) -> None:
    if hasattr(proc, "cancel"):  # a trial run elsewhere (ray_backend.RemoteTrial): cancel it
        proc.cancel()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def slot_env(slot: int, workers: int) -> dict:
    """What a child in worker slot `slot` of `workers` sees: its own GPU, or its share of cores."""
    gpus = visible_gpus()
    if gpus:
        return {"CUDA_VISIBLE_DEVICES": gpus[slot % len(gpus)]} if workers > 1 else {}
    if workers == 1:
        return {}
    threads = max(1, (os.cpu_count() or 1) // workers)  # N trainers on N x fewer threads, not N x all
    return {"TF_NUM_INTRAOP_THREADS": str(threads), "TF_NUM_INTEROP_THREADS": "1"}


def visible_gpus() -> list[str]:
    """NVIDIA GPU ids this process may use, without importing TensorFlow in the sweep process."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


class _Board:
    """What the workers share: counts for the progress lines and the ETA, all under one lock."""

    def __init__(self, total: int, finished: int, workers: int, log):
        self.lock = threading.Lock()
        self.total, self.finished, self.workers, self.log = total, finished, workers, log
        self.durations: list[float] = []
        self.base, self.started = finished, 0
        self.attempted: set[str] = set()  # each trial runs at most once per invocation
        self.procs: dict[int, subprocess.Popen] = {}
        self.stop = threading.Event()

    def eta(self) -> str:
        if not self.durations:
            return ""
        left = self.total - self.finished
        mean = sum(self.durations) / len(self.durations)
        return f", ETA {_fmt_seconds(mean * left / min(self.workers, max(left, 1)))}"


def run_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path, *,
              overwrite: bool = False, retry_failed: bool = False, log=print,
              sweep_config: dict | None = None, child_env: dict | None = None,
              workers: int = 1, runner=None) -> dict:
    """Run every trial of `grid` not finished yet, up to `workers` at once; return status counts.

    `runner(cfg, data_dir, workdir, on_epoch, env, on_start)` runs one trial and returns its
    record; the default runs a local child process. Whatever runs the trial, only this process
    writes the store, one transaction per outcome."""
    out = Path(out)
    sweep_dir = out / name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    manifest = require_prepared(Path(data_dir))
    resolved = {
        "name": name, **(sweep_config or {}), "data_dir": str(Path(data_dir).resolve()),
        "data": {k: manifest[k] for k in ("params", "source", "fingerprint", "counts")},
        "trials": [asdict(c) for c in grid], "versions": versions(),
    }
    write_json_atomic(sweep_dir / "sweep.json", resolved)
    with Store(store_path(out)) as store:
        keys = store.register_sweep(name, resolved, [asdict(c) for c in grid], overwrite=overwrite)
        csv_path = store.export_csv(name, sweep_dir / "results.csv")
        counts = store.counts(keys)
    total = len(keys)
    already = sum(counts[s] for s in ("done", "failed", "oom"))
    if already:
        log(f"Sweep {name}: {already} of {total} trials already finished, resuming.")
    log(f"Sweep {name}: {total} trials, {workers} at a time; results in {store_path(out)} and {csv_path}")
    board = _Board(total, already, workers, log)
    by_key = {c.key(): c for c in grid}
    work = dict(keys=keys, by_key=by_key, data_dir=data_dir, out=out, name=name, board=board,
                retry_failed=retry_failed, child_env=child_env or {}, runner=runner or run_child)
    # Each worker sets its event when it ends. Waiting on events rather than Thread.join:
    # a join cut short by Ctrl-C can leave the thread looking finished when it is not.
    ended = [threading.Event() for _ in range(max(1, workers))]
    threads = [threading.Thread(target=_worker, args=(slot, ended[slot]), kwargs=work, daemon=True)
               for slot in range(max(1, workers))]
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        for t in threads:
            t.start()
        for e in ended:
            while not e.wait(0.2):  # short waits, so Ctrl-C reaches this thread at once
                pass
    except KeyboardInterrupt:
        board.stop.set()
        with board.lock:
            running = list(board.procs.values())
        for proc in running:
            _stop(proc)
        for e in ended:
            e.wait()
        with Store(store_path(out)) as store:
            counts = store.counts(keys)
        log(f"Interrupted: {counts['done']} of {total} trials done; run the same command again to resume.")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    with Store(store_path(out)) as store:
        counts = store.counts(keys)
    log(f"Sweep {name} finished: {counts['done']} done, {counts['failed']} failed, "
        f"{counts['oom']} out of memory, of {total}.")
    return counts


def _worker(slot: int, ended: threading.Event, **work) -> None:
    try:
        _work(slot, **work)
    finally:
        ended.set()


def _work(slot: int, *, keys, by_key, data_dir, out, name, board: _Board, retry_failed,
          child_env, runner) -> None:
    """Claim, run, record; until nothing is left or the sweep is stopped."""
    tag = f"[w{slot}] " if board.workers > 1 else ""
    with Store(store_path(out)) as store:
        while not board.stop.is_set():
            with board.lock:
                row = store.claim([k for k in keys if k not in board.attempted], retry_failed=retry_failed)
                if row is None:
                    return
                board.attempted.add(row["key"])
                board.started += 1
                position = board.base + board.started
                eta = board.eta()
            cfg = by_key[row["key"]]
            board.log(f"{tag}[{min(position, board.total)}/{board.total}] {cfg.label()}{eta}")
            t0 = time.time()

            def on_start(proc, slot=slot):
                with board.lock:
                    board.procs[slot] = proc
                if board.stop.is_set():  # stopped between the claim and the start
                    _stop(proc)

            try:
                record = runner(cfg, data_dir, out / ".work", on_epoch=_epoch_logger(board.log, tag),
                                env={**slot_env(slot, board.workers), **child_env}, on_start=on_start)
            finally:
                with board.lock:
                    board.procs.pop(slot, None)
            if board.stop.is_set() or record.get("status") == "lost":
                store.release(row["key"])  # interrupted or lost with its worker: to be run again
                if record.get("status") == "lost":
                    board.log(f"{tag}    lost: {record.get('error', '')}; left pending")
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
        log(f"{tag}    epoch {e['epoch']}/{e['epochs']}: loss {e['loss']:.4f} acc {e['accuracy']:.3f}{val} "
            f"({e['seconds']:.1f} s)")
    return on_epoch


def _outcome_line(record: dict, seconds: float) -> str:
    if record["status"] == "done":
        return (f"    done: test accuracy {record['test_accuracy']:.4f}, "
                f"{record['images_per_second']:.0f} images/s, {seconds:.0f} s")
    first = (record.get("error") or "").splitlines()[0] if record.get("error") else ""
    return f"    {record['status']}: {first}"
