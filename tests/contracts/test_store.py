"""The results store shared by several sweeps at once: opening it together, a trial another live
sweep runs, and a reader's consistent snapshot."""

from __future__ import annotations

import csv
import io
import multiprocessing
import os
import sqlite3
import stat
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs import plans
from catsdogs.cli import cli
from catsdogs.messages import TrialRecord
from catsdogs.plans import trials
from catsdogs.schema import Status, TrialConfig
from catsdogs.store import CSV_COLUMNS, Store, StoreError
from catsdogs.training import sweep


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px)."""
    return prepared_data(32, (24, 8, 8))


def grid_of(data_dir: Path, batch_sizes=(8, 16), name: str = "s") -> list[TrialConfig]:
    return trials(plans.with_overrides(plans.Plan({"grids": {"sweep": {}}}, "the command line"), {"seeds": 1, "name": name},
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

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None) -> TrialRecord:
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
        counts = sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lines.append, slots=InstantSlot))
        # then it says so, and it is a success, not a failure
        assert counts[Status.DONE] == 1 and counts[sweep.RUNNING_ELSEWHERE] == 1
        assert f"1 done, 0 failed, 0 out of memory, 1 running in another sweep (pid {os.getpid()}), of 2" \
            in lines[-1]
        assert sweep.succeeded(counts, len(grid))
        # and when the other sweep finishes its trial first, this one finds everything done
        other.finish(keys[0], TrialRecord(status=Status.DONE, test_accuracy=0.5))
    counts = sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lines.append, slots=InstantSlot))
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


# --- the store tells the truth (issue 32) -------------------------------------------------------


class FailingSlot(InstantSlot):
    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None) -> TrialRecord:
        return TrialRecord(status=Status.FAILED, error="RuntimeError: the environment was wrong")


def test_a_sweep_whose_trials_failed_says_so_again_and_names_retry_failed(data_dir, tmp_path):
    # given a sweep whose trials failed
    grid = grid_of(data_dir)
    first: list[str] = []
    sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=first.append, slots=FailingSlot))
    assert "--retry-failed" in first[-1]
    # when it runs again
    again: list[str] = []
    counts = sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=again.append, slots=InstantSlot))
    # then it says they failed and are not run again, and how to run them again
    assert "2 of 2 trials already finished (2 of them failed or ran out of memory, and are not run again: " \
           "the same command with --retry-failed runs them again)" in again[0]
    assert counts[Status.FAILED] == 2
    # and with --retry-failed they run, and nothing more is suggested
    retried: list[str] = []
    counts = sweep.run_sweep("s", grid, data_dir, tmp_path,
                             sweep.SweepSettings(log=retried.append, slots=InstantSlot, retry_failed=True))
    assert counts[Status.DONE] == 2 and not any("--retry-failed" in line for line in retried)
    # and none of them is said to have finished already (they had failed)
    assert retried[0] == "Sweep s: 2 of 2 trials failed or ran out of memory before, and run again, as asked."
    assert not any("already finished" in line for line in retried)


CLAIM_AND_DIE = """
import os, sys
from catsdogs.store import CSV_COLUMNS, Store, StoreError
from catsdogs.training.sweep import SweepSettings
store = Store(sys.argv[1])
store.claim([sys.argv[2]])
os.kill(os.getpid(), 9)
"""


def killed_while_running(path: Path, key: str) -> None:
    """A sweep process that claimed trial `key` and was killed with kill -9."""
    subprocess.run([sys.executable, "-c", CLAIM_AND_DIE, str(path), key], check=False)


def test_a_trial_whose_sweep_was_killed_shows_as_interrupted_to_readers(data_dir, tmp_path):
    # given a trial left running by a sweep that is gone (its owner token names no live process:
    # the lock a live sweep holds on its token's file is released when it dies)
    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    with Store(path) as store:
        keys = register(store, grid)
        with store.transaction() as db:
            db.execute("UPDATE trials SET status='running', owner='999999-deadbeef0000' WHERE key=?", (keys[0],))
    # when the dry run and the report read the store, then they show it interrupted
    lines = sweep.describe(grid, tmp_path)
    assert lines[0].split()[:2] == [keys[0], "interrupted"] and lines[1].split()[1] == "pending"
    from catsdogs.analysis.rows import load_trials
    assert [t["status"] for t in load_trials(path, "s")] == [Status.INTERRUPTED, Status.PENDING]
    # and the next sweep runs it again
    counts = sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
    assert counts[Status.DONE] == 2


def test_the_report_reads_the_store_without_changing_it(data_dir, tmp_path):
    # given a store with a finished sweep
    grid = grid_of(data_dir)
    sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
    path = tmp_path / "results.sqlite"
    wal = tmp_path / "results.sqlite-wal"
    before, log_before = path.read_bytes(), wal.read_bytes() if wal.exists() else b""
    # when the report runs
    from catsdogs.analysis import report as rp
    rp.report("s", tmp_path, log=lambda _: None)
    # then the store and its log hold what they held, byte for byte (SQLite may open an empty
    # log, and its shared-memory index, beside a store in WAL mode that it reads)
    assert path.read_bytes() == before
    assert (wal.read_bytes() if wal.exists() else b"") == log_before


def test_a_sqlite_file_that_is_not_a_store_is_refused_and_left_unchanged(tmp_path):
    # given another program's SQLite database where the store would be
    path = tmp_path / "results.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        db.execute("INSERT INTO notes(text) VALUES ('mine')")
    db.close()
    before = path.read_bytes()
    # when the report, or a sweep, opens it
    result = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--name", "s"])
    # then one line says what it is, and the file is as it was
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: {path} is not a catsdogs results store (no sweep_trials, sweeps, trials table)")
    for read_only in (True, False):
        with pytest.raises(StoreError, match="not a catsdogs results store"):
            Store(path, read_only=read_only)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as db:
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["notes"]
    db.close()


@pytest.mark.slow
def test_export_store_writes_one_file_with_the_trials_only_the_wal_held(data_dir, tmp_path):
    # given a store whose last finished trial lives only in its write-ahead log (the sweep was killed)
    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    with Store(path) as store:
        keys = register(store, grid)
        store.claim(keys)
        store.finish(keys[0], TrialRecord(status=Status.DONE, test_accuracy=0.5))
    killed_while_running(path, keys[1])
    assert (tmp_path / "results.sqlite-wal").stat().st_size > 0
    # when it is exported
    copy = tmp_path / "elsewhere" / "copy.sqlite"
    copy.parent.mkdir()
    result = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--name", "s", "--export-store", str(copy)])
    assert result.exit_code == 0, result.output
    # then the copy alone has every trial as the store had it, and no log beside it
    assert sorted(p.name for p in copy.parent.iterdir()) == ["copy.sqlite"]
    with Store(copy, read_only=True) as exported:
        assert [t["status"] for t in exported.trials("s")] == [Status.DONE, Status.INTERRUPTED]
    assert not (copy.parent / "copy.sqlite-wal").exists()
    # and exporting onto the store itself is refused
    bad = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--name", "s", "--export-store", str(path)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_a_sweeps_csv_has_a_shared_trial_that_another_sweep_finished_after_it_ended(data_dir, tmp_path):
    import csv

    grid = grid_of(data_dir)
    path = tmp_path / "results.sqlite"
    with Store(path) as other:
        # given sweep "b" (another live process: its own store connection) running the trial it
        # shares with sweep "a"
        (shared,) = register(other, grid[1:], name="b")
        assert other.claim([shared])["key"] == shared
        # when "a" ends first, and "b" finishes the shared trial after
        sweep.run_sweep("a", grid, data_dir, tmp_path, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
        with open(tmp_path / "a" / "results.csv") as f:
            assert [r["status"] for r in csv.DictReader(f)] == ["done", "running"]
        sweep.record_outcome(other, tmp_path, shared, TrialRecord(status=Status.DONE, test_accuracy=0.5))
    # then "a"'s CSV has it done, as the store does, and so has "b"'s
    for name, statuses in (("a", ["done", "done"]), ("b", ["done"])):
        with open(tmp_path / name / "results.csv") as f:
            assert [r["status"] for r in csv.DictReader(f)] == statuses


def test_an_export_that_cannot_be_written_names_the_copy_not_the_store(data_dir, tmp_path):
    # given a store, and a copy to be written where no file can be made (/proc)
    grid = grid_of(data_dir)
    sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
    before = (tmp_path / "results.sqlite").read_bytes()
    result = CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--name", "s",
                                      "--export-store", "/proc/catsdogs-copy.sqlite"])
    # then one line names the copy, exit 1, and the store is as it was
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: cannot write the copy /proc/catsdogs-copy.sqlite")
    assert (tmp_path / "results.sqlite").read_bytes() == before


def test_an_export_never_replaces_what_catsdogs_did_not_write(data_dir, tmp_path):
    # given a store, a text file of the user's, a link to it, a FIFO standing in for a device
    # (/dev/null as root was turned into a regular file), and an earlier export
    grid = grid_of(data_dir)
    sweep.run_sweep("s", grid, data_dir, tmp_path, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    link = tmp_path / "link.sqlite"
    link.symlink_to(notes)
    fifo = tmp_path / "device"
    os.mkfifo(fifo)
    earlier = tmp_path / "copy.sqlite"

    def export(target: str):
        return CliRunner().invoke(cli, ["report", "--out", str(tmp_path), "--name", "s", "--export-store", target])

    assert export(str(earlier)).exit_code == 0
    # when each is given to --export-store, and an empty name
    for target, said in ((notes, "is not a store copy catsdogs wrote"), (link, "is a symbolic link"),
                         (fifo, "is not a regular file"),
                         ("", "needs a file name")):
        result = export(str(target))
        # then each is refused in one line, a usage error, and left as it was
        assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, (target, result.output)
    assert notes.read_text() == "mine" and link.is_symlink() and stat.S_ISFIFO(fifo.stat().st_mode)
    # and so is another --out's live store (WAL mode: a sweep may be writing it)
    other = tmp_path / "other"
    sweep.run_sweep("s", grid, data_dir, other, sweep.SweepSettings(log=lambda _: None, slots=InstantSlot))
    live = export(str(other / "results.sqlite"))
    assert live.exit_code == 2 and "is not a store copy catsdogs wrote" in live.output
    # and a copy catsdogs wrote is replaced
    assert export(str(earlier)).exit_code == 0



def test_a_csv_that_cannot_be_written_is_a_warning_and_the_result_is_stored(data_dir, tmp_path):
    grid = grid_of(data_dir)
    with Store(tmp_path / "results.sqlite") as store:
        # given a trial of sweep "s" finishing, and a file standing where the sweep's CSV folder goes
        (key,) = register(store, grid[:1], name="s")
        store.claim([key])
        (tmp_path / "s").write_text("not a folder")
        lines: list[str] = []
        # when its outcome is recorded
        sweep.record_outcome(store, tmp_path, key, TrialRecord(status=Status.DONE, test_accuracy=0.5), lines.append)
        # then the store holds it, and the CSV's failure is one warning, not the sweep's end
        assert [t["status"] for t in store.trials("s")] == [Status.DONE]
    assert len(lines) == 1 and lines[0].startswith(f"Warning: {tmp_path / 's' / 'results.csv'} not written")
    assert lines[0].endswith("the result is in the store, and the sweep goes on")


def test_a_sweeps_csv_is_every_trials_columns_as_the_store_shows_them(data_dir, tmp_path):
    # given a sweep's trials in every state a reader sees: done (with its history, which the CSV
    # leaves out), failed with an error CSV must quote, left running by a dead sweep, and pending
    grid = grid_of(data_dir, batch_sizes=(4, 8, 16, 32))
    path = tmp_path / "results.sqlite"
    with Store(path) as store:
        keys = register(store, grid)
        for key, record in zip(keys[:2], (
                TrialRecord(status=Status.DONE, test_accuracy=0.625, images_per_second=123.456789, steps=7,
                            history=[{"epoch": 1, "loss": 0.69}], env={"keras": "3"}),
                TrialRecord(status=Status.FAILED, error='a "quoted", comma\nand a second line')), strict=True):
            store.claim([key])
            store.finish(key, record)
        with store.transaction() as db:
            db.execute("UPDATE trials SET status='running', owner='999999-deadbeef0000' WHERE key=?", (keys[2],))
        # when it is exported
        store.export_csv("s", tmp_path / "s" / "results.csv")
        # then the file is each trial's CSV columns, as `trials` decodes and shows them, in the sweep's order
        expected = io.StringIO()
        writer = csv.DictWriter(expected, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: t.get(k) for k in CSV_COLUMNS} for t in store.trials("s"))
    assert (tmp_path / "s" / "results.csv").read_text() == expected.getvalue()
    rows = list(csv.DictReader(io.StringIO(expected.getvalue())))
    assert [r["status"] for r in rows] == ["done", "failed", "interrupted", "pending"]
    assert rows[1]["error"] == 'a "quoted", comma\nand a second line' and rows[0]["images_per_second"] == "123.456789"
