"""A sweep: the grid of trials, run by workers, each outcome in the store.

Each of the sweep's `workers` slots (`Slot`) holds one worker that runs trial after trial,
reusing decoded data and compiled training steps: a process on this machine (the local runner,
catsdogs.training.local_slot.LocalSlot) or a Ray actor (catsdogs.training.ray_runner.RaySlot). A trial
that does not end done takes its worker with it and the slot starts a fresh one. A slot claims, among the trials of the lowest seed still
pending, first those whose shape its worker has compiled: the order stays seed-major (a sweep
stopped early still covers the whole figure) while steps are reused. `isolate` gives every trial
a fresh worker (one process per trial). Only this process writes the store.

Resuming is the default: a finished trial (done, failed, out of memory) is never run again
unless asked (`overwrite`, `retry_failed`); a trial left `running` by a sweep that died is
run again. One failed trial never stops the sweep. A plan's grids, and adaptive rounds of seeds,
are catsdogs.training.study's: it runs them through `run_sweep`.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from catsdogs.errors import Interrupted, SettingError, os_error_line
from catsdogs.files import write_json_atomic
from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling
from catsdogs.host import versions
from catsdogs.manifest import require_prepared
from catsdogs.messages import TrialRecord
from catsdogs.schema import FIELD_NAMES, FINISHED, Status, TrialConfig
from catsdogs.store import Store, store_path
from catsdogs.training.local_slot import LocalSlot


@runtime_checkable
class Slot(Protocol):
    """One place where a sweep runs trials, one at a time, keeping its worker between them: a
    worker process on this machine (catsdogs.training.local_slot.LocalSlot) or a Ray actor
    (catsdogs.training.ray_runner.RaySlot). The sweep claims a trial from the store, hands it to
    a slot and records what comes back; only the sweep's own process writes the store."""

    def shapes(self) -> set[str]:
        """The trial shapes (`repr(TrialConfig.shape())`) whose compiled steps the slot's worker
        keeps: the slot claims those first."""

    def run(self, cfg: TrialConfig, data_dir: Path, on_epoch: Callable[[dict], None] | None = None,
            noise_sampling: dict | None = None, eval_every: int | None = None, user: dict | None = None) -> TrialRecord:
        """Run one trial (recording its noise scale as `noise_sampling`, NoiseSampling.as_dict(),
        says, and its validation curve every `eval_every` training images; `user`: a user's model
        trained instead of the article's, messages.TrialTask.user), reporting each epoch's
        row to `on_epoch`; always its record: done, failed or oom, or lost (its worker lost through
        no fault of the trial: the sweep gives it back)."""

    def digest(self, key: str) -> tuple[str | None, str | None]:
        """(weights digest, error) of trial `key`, which `run` answered with its digest pending
        (`digest_pending`: a GPU worker hashes it while the next trial trains); waits for it."""

    def stop(self) -> None:
        """From another thread (Ctrl-C): end the running trial now; `run` returns it lost."""

    def close(self) -> None:
        """End the slot's worker."""


SlotFactory = Callable[[int, int, Path], Slot]  # (index, workers, workdir) -> the slot

def check_workers(grid: list[TrialConfig], workers: int) -> None:
    """A mirrored trial uses every GPU: it runs with one worker at a time."""
    if workers > 1 and any(c.strategy == "mirrored" for c in grid):
        raise SettingError("--strategy mirrored uses every GPU for one trial: use it with --workers 1", "workers")


def describe(grid: list[TrialConfig], out: Path) -> list[str]:
    """One line per planned trial with its status in the store, if it has one."""
    status = {}
    if store_path(out).exists():
        with Store(store_path(out), read_only=True) as store:
            status = {c.key(): (store.get(c.key()) or {}).get("status") for c in grid}
    lines = [f"{c.key()}  {status.get(c.key()) or 'new':8}  {c.label()}" for c in grid]
    return [*lines, f"{len(grid)} trials"]


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
        self.stop = threading.Event()  # Ctrl-C: end every trial now, give the running ones back
        self.halt = threading.Event()  # a slot failed (a full disk, a damaged store): claim nothing more
        self.error: BaseException | None = None  # the first slot's failure, raised in the sweep's thread

    def eta(self) -> str:
        if not self.durations:
            return ""
        left = self.total - self.finished
        mean = sum(self.durations) / len(self.durations)
        return f", ETA {_fmt_seconds(mean * left / min(self.workers, max(left, 1)))}"


@dataclass(frozen=True)
class SweepSettings:
    """How a sweep runs its trials, not which (that is its grid's TrialConfigs): one object, from
    the plan's settings and the run's options (catsdogs.training.study.run_plan)."""

    overwrite: bool = False  # run finished trials again
    retry_failed: bool = False  # run failed and out-of-memory trials again
    workers: int = 1  # trials at once
    isolate: bool = False  # a fresh worker per trial
    worker_env: dict | None = None  # more of the workers' environment
    slots: SlotFactory | None = None  # `slots(index, workers, workdir)` makes slot `index`; None: LocalSlots
    noise_sampling: NoiseSampling | None = None  # record each trial's gradient noise scale, sampled so
    eval_every: int | None = None  # record each trial's validation curve every so many training images
    # a user's model, trained in every trial instead of the article's (messages.TrialTask.user:
    # find-batch-size --race --model); its trials carry its identity (TrialConfig.model)
    user: dict | None = None
    sweep_config: dict | None = None  # more of what sweep.json and the store record of the sweep
    log: Callable[[str], None] = print
    on_finished: Callable[[], None] | None = None  # after each trial's outcome is in the store


def run_sweep(name: str, grid: list[TrialConfig], data_dir: Path, out: Path,
              settings: SweepSettings | None = None, *, kept: list[Slot] | None = None) -> dict:
    """Run every trial of `grid` not finished yet, up to `settings.workers` at once; return status
    counts. `on_finished()`: called after each trial's outcome is in the store (from the slot's
    thread; the CLI's `sweep --tensorboard` exports the sweep then: training imports no analysis).

    `noise_sampling` and `eval_every` are not part of a trial's identity: trials already finished
    are not run again for them. `kept`: slots made by the caller (`make_slots`), used and left open,
    so their workers' decoded data and compiled steps serve the caller's next call too (the
    adaptive rounds). Whatever runs the trials, only this process writes the store, one
    transaction per outcome."""
    s = settings = settings or SweepSettings()
    overwrite, retry_failed, log, workers, isolate = s.overwrite, s.retry_failed, s.log, s.workers, s.isolate
    noise_sampling, eval_every, on_finished, user = s.noise_sampling, s.eval_every, s.on_finished, s.user
    sweep_config = s.sweep_config
    out = Path(out)
    sweep_dir = out / name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    # asdict's, without its deep copy of every field (each a number, a string or None): a race's
    # every wave registers its every trial so far
    configs = [{field: getattr(c, field) for field in FIELD_NAMES} for c in grid]
    resolved = {
        "name": name, **(sweep_config or {}), "data_dir": str(Path(data_dir).resolve()),
        "noise_scale": noise_sampling.as_dict() if noise_sampling else None, "eval_every": eval_every,
        "data": _data_record(data_dir, user), **({"user_model": user} if user else {}),
        "trials": configs, "versions": versions(),
    }
    write_json_atomic(sweep_dir / "sweep.json", resolved)
    with Store(store_path(out)) as store:
        keys = store.register_sweep(name, resolved, configs, overwrite=overwrite)
        csv_path = store.export_csv(name, sweep_dir / "results.csv")
        counts = store.counts(keys)
    total = len(keys)
    already = _say_finished(name, counts, total, retry_failed, log)
    how = "a fresh worker process per trial" if isolate else "long-lived worker processes"
    log(f"Sweep {name}: {total} trials, {workers} at a time in {how}; results in {store_path(out)} "
        f"and {csv_path}")
    board = _Board(total, already, workers, log)
    runners = kept if kept is not None else make_slots(out, settings)
    by_key = {c.key(): c for c in grid}
    work = dict(keys=keys, by_key=by_key, shape_of={k: repr(c.shape()) for k, c in by_key.items()}, data_dir=data_dir, out=out, name=name,
                board=board, retry_failed=retry_failed,
                noise_sampling=noise_sampling.as_dict() if noise_sampling else None, eval_every=eval_every,
                on_finished=on_finished, user=user)
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
        raise Interrupted() from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if kept is None:  # kept slots are the caller's to close
            for runner in runners:
                runner.close()
    if board.error is not None:  # every finished trial is in the store: only the failed write is not
        raise board.error
    return _ended(name, keys, out, log)


def runner_slots(runner: str, slots: SlotFactory | None, workers: int | None, *, ray_address: str | None = None,
                 isolate: bool = False, env: dict | None = None, log=print) -> tuple[SlotFactory | None, int]:
    """(the slots trials run in, how many at once): for runner "ray", Ray's actors on the cluster at
    `ray_address` (catsdogs.training.ray_runner, imported only then), as many as it runs at once
    unless `workers` caps it; else `slots` (None: LocalSlots) and `workers` (None: 1)."""
    if runner == "ray":
        from catsdogs.training import ray_runner  # Ray is an extra: imported only when asked for

        return ray_runner.make_slots(ray_address, workers=workers, isolate=isolate, log=log, env=env)
    return slots, workers or 1


def _data_record(data_dir: Path, user: dict | None) -> dict:
    """What the sweep trains on, as sweep.json and the store record it: the prepared data's
    manifest, or a user's folder of images (a race of a user's model on its own images)."""
    if user and user.get("data_folder"):  # (the user's folder, and the decoded copy its trials read)
        return {"folder": user.get("images", user["data_folder"]), "decoded": user["data_folder"],
                "input_spec": user.get("input_spec")}
    manifest = require_prepared(Path(data_dir))
    return {k: manifest[k] for k in ("params", "source", "fingerprint", "counts")}


def _ended(name: str, keys: list[str], out: Path, log) -> dict:
    """The sweep's status counts, said in one line, once its slots have stopped."""
    with Store(store_path(out)) as store:
        counts = store.counts(keys)
        elsewhere = store.running_elsewhere(keys)
    total = len(keys)
    # A trial another live sweep is running is neither failed nor left to do: it counts neither way.
    counts[RUNNING_ELSEWHERE] = len(elsewhere)
    running = (f", {len(elsewhere)} running in another sweep (pid {', '.join(map(str, sorted(set(elsewhere))))})"
               if elsewhere else "")
    again = f" ({RETRY_HINT})" if counts[Status.FAILED] + counts[Status.OOM] else ""
    log(f"Sweep {name} finished: {counts[Status.DONE]} done, {counts[Status.FAILED]} failed, "
        f"{counts[Status.OOM]} out of memory{running}, of {total}.{again}")
    return counts


RUNNING_ELSEWHERE = "running_elsewhere"  # counts' key: trials another live sweep is running
RETRY_HINT = "the same command with --retry-failed runs them again"


def make_slots(out: Path, settings: SweepSettings) -> list[Slot]:
    """The slots a sweep runs its trials in: `settings.slots(index, workers, workdir)` each, else LocalSlots."""
    workers = max(1, settings.workers)
    make_slot = settings.slots or (lambda i, n, workdir: LocalSlot(i, n, workdir, isolate=settings.isolate,
                                                                     env=settings.worker_env))
    return [make_slot(i, workers, Path(out) / ".work") for i in range(workers)]


def succeeded(counts: dict, total: int) -> bool:
    """A sweep's exit status: every trial done, or being run by another live sweep; any failed,
    out-of-memory or left-over trial makes it a failure (exit code 1)."""
    return counts[Status.DONE] + counts.get(RUNNING_ELSEWHERE, 0) == total


def claim_order(keys: list[str], by_key: dict[str, TrialConfig], shapes: set[str],
                shape_of: dict[str, str] | None = None) -> list[str]:
    """The order a slot claims in: seed-major, and within a seed the trials whose compiled step
    the slot's worker keeps first, then the rest in the grid's order. `shape_of`: each key's
    `repr(shape())`, made once per sweep (a slot orders what is left at every claim)."""
    position = {k: i for i, k in enumerate(keys)}
    shape_of = shape_of or {k: repr(by_key[k].shape()) for k in keys}
    return sorted(keys, key=lambda k: (by_key[k].seed, shape_of[k] not in shapes, position[k]))


def _slot_thread(runner: Slot, slot: int, ended: threading.Event, **work) -> None:
    board: _Board = work["board"]
    try:
        _work(runner, slot, **work)
    except Exception as exc:  # noqa: BLE001 - raised again in the sweep's own thread (run_sweep)
        with board.lock:
            board.error = board.error or exc
        board.halt.set()  # the other slots finish and record the trial they run, then claim nothing
    finally:
        ended.set()


def _say_finished(name: str, counts: dict, total: int, retry_failed: bool, log) -> int:
    """The trials a resumed sweep will not run again, said (those that failed or ran out of memory
    either run again, as asked, or are named with how to run them): their count."""
    failed = counts[Status.FAILED] + counts[Status.OOM]
    retried = failed if retry_failed else 0  # run again: not finished here
    already = sum(counts[s] for s in FINISHED) - retried
    if retried:
        log(f"Sweep {name}: {retried} of {total} trials failed or ran out of memory before, and run again, as asked.")
    if already:
        why = (f" ({failed} of them failed or ran out of memory, and are not run again: {RETRY_HINT})"
               if failed and not retry_failed else "")
        log(f"Sweep {name}: {already} of {total} trials already finished{why}, resuming.")
    return already


def _work(runner: Slot, slot: int, *, keys, by_key, shape_of, data_dir, out, name, board: _Board, retry_failed,
          noise_sampling, eval_every, on_finished=None, user=None) -> None:
    """Claim, run, record; until nothing is left or the sweep is stopped. A trial answered with
    its weights' digest still being hashed (a GPU worker's: Slot.digest) is held, and recorded
    once the digest comes, which it does while the next trial runs."""
    tag = f"[w{slot}] " if board.workers > 1 else ""
    held: tuple | None = None  # (key, record, seconds, label) of the trial whose digest is to come
    with Store(store_path(out)) as store:
        finish = _finisher(runner, store, out, board, tag, on_finished)
        try:
            while not (board.stop.is_set() or board.halt.is_set()):
                with board.lock:
                    left = [k for k in keys if k not in board.attempted]
                    row = store.claim(claim_order(left, by_key, runner.shapes(), shape_of), retry_failed=retry_failed)
                    if row is None:
                        return
                    board.attempted.add(row["key"])
                    board.started += 1
                    position = board.base + board.started
                    eta = board.eta()
                cfg = by_key[row["key"]]
                board.log(f"{tag}[{min(position, board.total)}/{board.total}] {cfg.label()}{eta}")
                t0 = time.time()
                try:
                    record = runner.run(cfg, data_dir, on_epoch=_epoch_logger(board.log, tag),
                                        noise_sampling=noise_sampling, eval_every=eval_every, user=user)
                except BaseException:  # no outcome of the trial's (a worker unfit for any trial): run it again later
                    store.release(row["key"])
                    raise
                held = finish(held)  # its digest came while this trial ran
                if board.stop.is_set() or record.status == Status.LOST:
                    store.release(row["key"])  # interrupted or lost with its worker: to be run again
                    if record.status == Status.LOST and not board.stop.is_set():
                        board.log(f"{tag}    lost: {record.error or ''}; left pending")
                    continue
                held = finish((row["key"], record, time.time() - t0, cfg.label()), wait=not record.digest_pending)
        finally:
            finish(held)


def _finisher(runner: Slot, store: Store, out: Path, board: _Board, tag: str, on_finished):
    """finish(held, wait=True): record a finished trial, (key, record, seconds, label), once its
    weights' digest is in (waited for from its slot when pending); without `wait`, hold it
    (returned) for a later call. A digest lost with its worker gives the trial back, to be run
    again. A trial recorded after the next one started is named in its outcome line."""
    def finish(held, wait: bool = True):
        if held is None:
            return None
        key, record, seconds, label = held
        late = bool(record.digest_pending)
        if late:
            if not wait:
                return held
            record.weights_digest, error = runner.digest(key)
            record.digest_pending = None
            if record.weights_digest is None:
                store.release(key)
                board.log(f"{tag}    {label}: {record.status}, but its weights' digest was lost ({error}); "
                          "left pending")
                return None
        record_outcome(store, out, key, record, board.log)
        with board.lock:
            board.durations.append(seconds)
            board.finished += 1
        line = _outcome_line(record, seconds)
        board.log(f"{tag}{line.replace('    ', f'    {label}: ', 1) if late else line}")
        if on_finished is not None:
            on_finished()
        return None

    return finish


def record_outcome(store: Store, out: Path, key: str, record: TrialRecord, log=print) -> None:
    """A finished trial into the store, and into the results.csv of every sweep that lists it:
    another sweep sharing the trial may have ended already, and its CSV must have it too. A CSV is
    a side output: one that cannot be written is a warning, and the sweep goes on (the store holds
    the result; `catsdogs report` writes the CSV again)."""
    store.finish(key, record)
    for listed in store.sweeps_of(key):
        try:
            store.export_csv(listed, Path(out) / listed / "results.csv")
        except OSError as exc:
            log(f"Warning: {Path(out) / listed / 'results.csv'} not written ({os_error_line(exc)}); the result is in "
                "the store, and the sweep goes on")


def _epoch_logger(log, tag: str = ""):
    def on_epoch(e):
        val = f" val_acc {e['val_accuracy']:.3f}" if "val_accuracy" in e else ""
        measured = ""
        estimate = NoiseEstimate.from_record(e)
        if estimate:
            measured = f", B_simple {estimate.describe()} in {estimate.seconds:.1f} s"
        train = f"loss {e['loss']:.4f} acc {e['accuracy']:.3f}" if "loss" in e else "no training logs"
        ended = f", target reached after {e['batches']} batches" if "batches" in e else ""
        log(f"{tag}    epoch {e['epoch']}/{e['epochs']}: {train}{val} ({e['seconds']:.1f} s{measured}{ended})")
    return on_epoch


def _target_words(record: TrialRecord) -> str:
    """`, target reached at step 412` (interpolated), `, target not reached`, or nothing."""
    if record.target_reached is None:
        return ""
    return f", target reached at step {record.steps_to_target:.0f}" if record.target_reached \
        else ", target not reached"


def _outcome_line(record: TrialRecord, seconds: float) -> str:
    if record.status == Status.DONE:
        reused = ", step reused" if record.step_reused else ""
        speed = f"{record.images_per_second:.0f} images/s, " if record.images_per_second else ""
        return (f"    done: test accuracy {record.test_accuracy:.4f}, {speed}{seconds:.1f} s{reused}"
                f"{_target_words(record)}")
    first = record.error.splitlines()[0] if record.error else ""
    return f"    {record.status}: {first}"
