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


def run_child(cfg: TrialConfig, data_dir: Path, workdir: Path, on_epoch=None, env=None) -> dict:
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


def run_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path, *,
              overwrite: bool = False, retry_failed: bool = False, log=print,
              sweep_config: dict | None = None, child_env: dict | None = None) -> dict:
    """Run every trial of `grid` not finished yet; return the status counts."""
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
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    with Store(store_path(out)) as store:
        keys = store.register_sweep(name, resolved, [asdict(c) for c in grid], overwrite=overwrite)
        by_key = {c.key(): c for c in grid}
        csv_path = store.export_csv(name, sweep_dir / "results.csv")
        counts = store.counts(keys)
        total = len(keys)
        already = sum(counts[s] for s in ("done", "failed", "oom"))
        if already:
            log(f"Sweep {name}: {already} of {total} trials already finished, resuming.")
        log(f"Sweep {name}: {total} trials; results in {store.path} and {csv_path}")
        durations: list[float] = []
        attempted: set[str] = set()  # each trial runs at most once per invocation, retried or not
        current = None
        try:
            while (row := store.claim([k for k in keys if k not in attempted],
                                      retry_failed=retry_failed)) is not None:
                current = row["key"]
                attempted.add(current)
                cfg = by_key[current]
                finished = sum(store.counts(keys)[s] for s in ("done", "failed", "oom"))
                left = total - finished
                eta = f", ETA {_fmt_seconds(sum(durations) / len(durations) * left)}" if durations else ""
                log(f"[{finished + 1}/{total}] {cfg.label()}{eta}")
                t0 = time.time()
                record = run_child(cfg, data_dir, out / ".work", on_epoch=_epoch_logger(log), env=child_env)
                durations.append(time.time() - t0)
                store.finish(current, record)
                current = None
                store.export_csv(name, sweep_dir / "results.csv")
                log(_outcome_line(record, durations[-1]))
        except KeyboardInterrupt:
            if current:
                store.release(current)
            counts = store.counts(keys)
            log(f"Interrupted: {counts['done']} of {total} trials done; run the same command again to resume.")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        counts = store.counts(keys)
    log(f"Sweep {name} finished: {counts['done']} done, {counts['failed']} failed, "
        f"{counts['oom']} out of memory, of {total}.")
    return counts


def _epoch_logger(log):
    def on_epoch(e):
        val = f" val_acc {e['val_accuracy']:.3f}" if "val_accuracy" in e else ""
        log(f"    epoch {e['epoch']}/{e['epochs']}: loss {e['loss']:.4f} acc {e['accuracy']:.3f}{val} "
            f"({e['seconds']:.1f} s)")
    return on_epoch


def _outcome_line(record: dict, seconds: float) -> str:
    if record["status"] == "done":
        return (f"    done: test accuracy {record['test_accuracy']:.4f}, "
                f"{record['images_per_second']:.0f} images/s, {seconds:.0f} s")
    first = (record.get("error") or "").splitlines()[0] if record.get("error") else ""
    return f"    {record['status']}: {first}"
