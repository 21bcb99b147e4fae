"""The results store shared by several sweeps at once: opening it together, a trial another live
sweep runs, and a reader's consistent snapshot."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from catsdogs import plans
from catsdogs.messages import TrialRecord
from catsdogs.plans import trials
from catsdogs.schema import Status, TrialConfig
from catsdogs.store import Store
from catsdogs.training import sweep


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px)."""
    return prepared_data(32, (24, 8, 8))


def grid_of(data_dir: Path, batch_sizes=(8, 16), name: str = "s") -> list[TrialConfig]:
    return trials(plans.with_overrides(plans.command_line_plan(), {"seeds": 1, "name": name},
                                       {"opt": ["adam"], "batch_size": list(batch_sizes), "epochs": 1}),
                  data_dir, "tensorflow")


def register(store: Store, grid: list[TrialConfig], name: str = "s") -> list[str]:
    return store.register_sweep(name, {}, [asdict(c) for c in grid])


class InstantSlot:
    """A sweep slot whose trials end done at once: for what a sweep decides, not what it trains."""

    def __init__(self, *args):
        pass

    def shapes(self) -> set[str]:
        return set()

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None) -> TrialRecord:
        return TrialRecord(status=Status.DONE, test_accuracy=0.5, images_per_second=100.0)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def _open_and_register(folder: str, barrier, name: str, stores: int) -> None:
    for i in range(stores):
        barrier.wait(timeout=60)  # every process opens the same new store in the same instant
        with Store(Path(folder) / f"{i}" / "results.sqlite") as store:
            store.register_sweep(name, {}, [asdict(TrialConfig("adam", 8, "standard", 0))])


@pytest.mark.slow
def test_processes_opening_a_new_store_together_each_wait_their_turn(tmp_path):
    # given 6 processes that open a new store at once (creating it, switching it to WAL), 20 times
    n, stores = 6, 20
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_open_and_register, args=(str(tmp_path), barrier, f"s{i}", stores), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.exitcode is None:
            p.kill()
    # then none of them failed, and every sweep is in every store
    assert [p.exitcode for p in procs] == [0] * n
    for i in range(stores):
        with Store(tmp_path / f"{i}" / "results.sqlite") as store:
            assert store.sweeps() == sorted(f"s{j}" for j in range(n))


def test_a_trial_run_by_another_live_sweep_is_named_with_its_pid(data_dir, tmp_path):
    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    with Store(path) as other, Store(path) as mine:
        keys = register(other, grid)
        # given another sweep (a store connection that owns its claim) running the first trial
        claimed = other.claim(keys)
        # then this one sees it running elsewhere, under that sweep's process id
        assert mine.running_elsewhere(keys) == [os.getpid()]
        assert other.running_elsewhere(keys) == []  # not elsewhere for the sweep running it
        assert claimed["key"] == keys[0]
    # and once that sweep is gone, its trial is no longer running anywhere
    with Store(path) as mine:
        assert mine.running_elsewhere(keys) == []


def test_a_sweep_that_ends_while_another_runs_a_trial_counts_it_neither_way(data_dir, tmp_path):
    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    lines: list[str] = []
    with Store(path) as other:
        keys = register(other, grid)
        other.claim(keys)  # given another live sweep running the first trial
        # when this sweep runs the rest and ends first
        counts = sweep.run_sweep("s", grid, data_dir, tmp_path, log=lines.append, slots=InstantSlot)
        # then it says so, and it is a success, not a failure
        assert counts[Status.DONE] == 1 and counts[sweep.RUNNING_ELSEWHERE] == 1
        assert f"1 done, 0 failed, 0 out of memory, 1 running in another sweep (pid {os.getpid()}), of 2" \
            in lines[-1]
        assert sweep.succeeded(counts, len(grid))
        # and when the other sweep finishes its trial first, this one finds everything done
        other.finish(keys[0], TrialRecord(status=Status.DONE, test_accuracy=0.5))
    counts = sweep.run_sweep("s", grid, data_dir, tmp_path, log=lines.append, slots=InstantSlot)
    assert counts[Status.DONE] == 2 and counts[sweep.RUNNING_ELSEWHERE] == 0
    # while a failed trial still fails the sweep
    assert not sweep.succeeded({Status.DONE: 1, Status.FAILED: 1, sweep.RUNNING_ELSEWHERE: 0}, 2)


def test_a_reader_sees_one_snapshot_while_a_sweep_writes(data_dir, tmp_path):
    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    with Store(path) as writer, Store(path) as reader:
        keys = register(writer, grid)
        with reader.snapshot():
            # given a reader that has begun reading
            before = [t["status"] for t in reader.trials("s")]
            # when a sweep finishes a trial meanwhile
            writer.claim(keys)
            writer.finish(keys[0], TrialRecord(status=Status.DONE, test_accuracy=0.5))
            # then the reader still sees the store as it began
            assert [t["status"] for t in reader.trials("s")] == before == [Status.PENDING] * 2
        # and its next snapshot sees the trial done
        assert reader.get(keys[0])["status"] == Status.DONE


@pytest.mark.slow
def test_two_sweeps_started_together_split_the_trials_and_both_succeed(data_dir, tmp_path):
    # given two `catsdogs sweep` commands started at the same moment on one new store
    cmd = [sys.executable, "-m", "catsdogs", "sweep", "--data-dir", str(data_dir), "--out", str(tmp_path),
           "--name", "s", "--opt", "adam", "--batch-size", "8", "16", "32", "--seeds", "2", "--epochs", "1"]
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    # then neither fails or prints a traceback, whichever finishes first
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
        assert "Traceback" not in out
    # and every trial ran exactly once, between them
    with Store(tmp_path / "results.sqlite") as store:
        rows = store.trials("s")
    assert len(rows) == 6 and {r["status"] for r in rows} == {Status.DONE}
    assert [r["attempts"] for r in rows] == [1] * 6
