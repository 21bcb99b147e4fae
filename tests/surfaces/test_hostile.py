"""No traceback, ever: every hostile input a one-line answer, exit 2 for a bad option or plan value
and exit 1 for anything else (docs/usage.md, "Exit codes"), with the store and the data left as
they were. One table of hostile invocations over every command: a damaged store, the filesystem,
numbers beyond any bound, files that are not what they claim; each case fails only if a command
breaks that promise. Nothing here trains: every case is refused before a worker starts."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs import store as store_module
from catsdogs.cli import cli
from catsdogs.errors import CatsdogsError
from catsdogs.messages import TrialRecord
from catsdogs.schema import Status, TrialConfig
from catsdogs.store import Store, StoreError
from catsdogs.training.sweep import SweepSettings

SIZE = 32
HUGE = "99999999999999999999"  # beyond 64 bits
TRAIN = ["--opt", "adam", "--batch-size", "8", "--seeds", "1", "--epochs", "1"]


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


# --- what each case starts from ---------------------------------------------------------------------


def random_store(tmp: Path) -> Path:
    """An --out whose results.sqlite is 36 KiB of random bytes."""
    out = tmp / "out"
    out.mkdir()
    (out / "results.sqlite").write_bytes(os.urandom(36864))
    return out


def empty_store(tmp: Path) -> Path:
    """An --out whose results store holds no sweep."""
    out = tmp / "empty"
    out.mkdir()
    Store(out / "results.sqlite").close()
    return out


def truncated_store(tmp: Path) -> Path:
    """An --out whose store of 200 trials lost the second half of its file."""
    out = tmp / "out"
    with Store(out / "results.sqlite") as store:
        store.register_sweep("s", {}, [asdict(TrialConfig("adam", 8, "standard", seed)) for seed in range(200)])
    db = sqlite3.connect(out / "results.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything into the file itself
    db.close()
    whole = (out / "results.sqlite").read_bytes()
    (out / "results.sqlite").write_bytes(whole[: len(whole) // 2])
    for extra in ("results.sqlite-wal", "results.sqlite-shm"):
        (out / extra).unlink(missing_ok=True)
    return out


def a_file(tmp: Path) -> Path:
    """A file where a folder is wanted: `afile/sub` cannot be made."""
    (tmp / "afile").write_text("not a folder")
    return tmp / "afile" / "sub"


def users_file(tmp: Path) -> Path:
    """A text file of the user's, which no export may replace."""
    (tmp / "notes.txt").write_text("mine")
    return tmp / "notes.txt"


def plan_file(tmp: Path, content: bytes) -> Path:
    path = tmp / "plan.toml"
    path.write_bytes(content)
    return path


UTF16_PLAN = '[grids.g]\nopt = ["adam"]\nbatch_size = [8]\n'.encode("utf-16")  # PowerShell's `>` writes this
BINARY_PLAN = bytes(range(256)) * 4


def damaged_manifest(tmp: Path, data_dir: Path, manifest) -> Path:
    """A copy of the prepared data whose manifest.json is valid JSON of another shape."""
    copy = tmp / "data"
    shutil.copytree(data_dir, copy)
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (copy / "manifest.json").write_text(text)
    return copy


def with_fingerprint(data_dir: Path, fingerprint) -> dict:
    manifest = json.loads((data_dir / "manifest.json").read_text())
    return {**manifest, "fingerprint": fingerprint}


# --- the table ---------------------------------------------------------------------------------------
# (id, the arguments, given tmp and the data folder; the exit code; words of the one line)

CASES = [
    # a store that is not one, or is damaged: said, never overwritten (exit 1)
    ("report-random-store", lambda t, d: ["report", "--name", "s", "--out", random_store(t)], 1,
     "is not a catsdogs results store, or it is damaged (file is not a database)"),
    ("sweep-random-store", lambda t, d: ["sweep", "--data-dir", d, "--out", random_store(t), *TRAIN], 1,
     "is not a catsdogs results store"),
    ("report-truncated-store", lambda t, d: ["report", "--name", "s", "--out", truncated_store(t)], 1,
     "database disk image is malformed"),
    ("sweep-truncated-store", lambda t, d: ["sweep", "--data-dir", d, "--out", truncated_store(t), *TRAIN], 1,
     "database disk image is malformed"),
    # a folder that is a file (exit 1, naming the path)
    ("sweep-out-is-a-file", lambda t, d: ["sweep", "--data-dir", d, "--out", a_file(t), *TRAIN], 1,
     "afile/sub/sweep: Not a directory"),
    ("profile-out-is-a-file", lambda t, d: ["profile", "--data-dir", d, "--out", a_file(t), "--batch-size", "4"], 1,
     "afile/sub/profile: Not a directory"),
    ("find-out-is-a-file", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", a_file(t)], 1,
     "afile/sub/find-batch-size: Not a directory"),
    ("prepare-data-is-a-file", lambda t, d: ["prepare", "--source", "synthetic", "--data-dir", a_file(t)], 1,
     "afile/sub: Not a directory"),
    ("reproduce-data-is-a-file", lambda t, d: ["reproduce", "--config", "quick", "--data-dir", a_file(t),
                                               "--out", t / "out"], 1, "afile/sub: Not a directory"),
    ("report-out-is-a-file", lambda t, d: ["report", "--out", a_file(t)], 1, "no results store at"),
    # whole numbers beyond 64 bits, where they are parsed (exit 2)
    ("sweep-huge-batch", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--batch-size", HUGE, "--dry-run"], 2,
     "Invalid value for '--batch-size': must be at most 1,048,576"),
    ("plan-huge-batch", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--config",
                                      plan_file(t, f"[grids.g]\nopt = 'adam'\nbatch_size = {HUGE}\n".encode())], 2,
     "[grids.g] batch_size: must be at most 1,048,576"),
    ("plan-large-batch", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--config",
                                       plan_file(t, b"[grids.g]\nopt = 'adam'\nbatch_size = 9999999999\n")], 2,
     "batch_size: must be at most 1,048,576"),
    ("profile-huge-batch", lambda t, d: ["profile", "--data-dir", d, "--out", t, "--batch-size", HUGE,
                                        "--memory-limit", "1GiB"], 2, "must be at most 1,048,576"),
    ("find-huge-start", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--start", HUGE], 2,
     "Invalid value for '--start': must be at most 1,048,576"),
    ("prepare-huge-per-class", lambda t, d: ["prepare", "--source", "synthetic", "--data-dir", t / "d",
                                             "--per-class", HUGE], 2, "must be at most 100,000"),
    ("prepare-huge-seed", lambda t, d: ["prepare", "--source", "synthetic", "--data-dir", t / "d", "--seed", HUGE], 2,
     "Invalid value for '--seed': must be at most 4,294,967,295"),
    ("sweep-huge-workers", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--workers", HUGE, "--dry-run"], 2,
     "Invalid value for '--workers': must be at most 1,024"),
    # values that would exhaust the machine or never end (exit 2)
    ("sweep-seeds", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--seeds", "100000000", "--dry-run"], 2,
     "Invalid value for '--seeds': must be at most 1,000"),
    ("sweep-trials", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--seeds", "1000", "--batch-size",
                                   *map(str, range(1, 120)), "--dry-run"], 2, "more than the 100,000 a sweep may hold"),
    ("sweep-target-ci", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--target-ci", "200", "--dry-run"], 2,
     "Invalid value for '--target-ci': must be at most 50 points"),
    ("find-memory-above-machine", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--memory-limit",
                                                "99999999999999999999999GiB"], 2, "more than this machine's memory"),
    ("find-memory-below-batch-1", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t,
                                                "--memory-limit", "1B"], 2, "below what batch size 1 needs"),
    ("profile-memory-below-batch-1", lambda t, d: ["profile", "--data-dir", d, "--out", t, "--memory-limit", "1B"], 2,
     "below what batch size 1 needs at 32 px"),
    ("profile-min-seconds-nan", lambda t, d: ["profile", "--data-dir", d, "--out", t, "--min-seconds", "nan"], 2,
     "Invalid value for '--min-seconds': must be a finite number"),
    ("profile-min-seconds-inf", lambda t, d: ["profile", "--data-dir", d, "--out", t, "--min-seconds", "inf"], 2,
     "Invalid value for '--min-seconds': must be a finite number"),
    ("sweep-lr-inf", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--lr", "inf", "--dry-run"], 2,
     "Invalid value for '--lr': must be a number, got inf"),
    # a plan file that is not UTF-8 text (exit 2)
    ("sweep-utf16-plan", lambda t, d: ["sweep", "--data-dir", d, "--config", plan_file(t, UTF16_PLAN)], 2,
     "a plan is TOML text in UTF-8, and this file is not (it is UTF-16"),
    ("plans-utf16-plan", lambda t, d: ["plans", plan_file(t, UTF16_PLAN)], 2, "a plan is TOML text in UTF-8"),
    ("reproduce-binary-plan", lambda t, d: ["reproduce", "--config", plan_file(t, BINARY_PLAN)], 2,
     "a plan is TOML text in UTF-8"),
    # a manifest.json that is JSON but not a manifest: no finished prepare (exit 1)
    ("sweep-manifest-null", lambda t, d: ["sweep", "--data-dir", damaged_manifest(t, d, "null"), "--out", t, *TRAIN],
     1, "holds no finished prepared data set"),
    ("sweep-manifest-list", lambda t, d: ["sweep", "--data-dir", damaged_manifest(t, d, [1, 2, 3]), "--out", t,
                                          *TRAIN], 1, "holds no finished prepared data set"),
    ("profile-manifest-fingerprint", lambda t, d: ["profile", "--out", t, "--data-dir",
                                                   damaged_manifest(t, d, with_fingerprint(d, 12345))], 1,
     "holds no finished prepared data set"),
    # a learning rate to scale from that is not there, a find-batch-size result that is a folder (exit 2)
    ("find-from-store-none", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--from-store", t / "no"],
     2, "Invalid value for '--from-store': no results store at"),
    ("find-from-store-untuned", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--from-store",
                                              empty_store(t)], 2,
     "Invalid value for '--from-store': no sweep in"),
    ("report-find-result-a-folder", lambda t, d: ["report", "--out", t, "--find-batch-size", t], 2,
     "Invalid value for '--find-batch-size'"),
    # the newer surfaces (issue 47): --export-store, --until, --eval-every, --model, --data, --loss (exit 2)
    ("report-export-over-a-users-file", lambda t, d: ["report", "--name", "s", "--out", empty_store(t),
                                                      "--export-store", users_file(t)], 2,
     "exists and is not a store copy catsdogs wrote"),
    ("report-export-empty-name", lambda t, d: ["report", "--name", "s", "--out", empty_store(t),
                                               "--export-store", ""], 2, "--export-store needs a file name"),
    ("sweep-until-twice", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--until", "val_loss=0.5", "--until",
                                        "val_loss=0.4", "--dry-run"], 2, "--until given 2 times"),
    ("sweep-until-no-value", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--until", "val_loss", "--dry-run"],
     2, "Invalid value for '--until': must be METRIC=VALUE"),
    ("sweep-until-nan", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--until", "val_loss=nan", "--dry-run"],
     2, "Invalid value for '--until': a val_loss target must be a positive number"),
    ("sweep-eval-every-0", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--until", "val_loss=0.5",
                                         "--eval-every", "0", "--dry-run"], 2, "Invalid value for '--eval-every'"),
    ("find-model-neither-form", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--model", "a b"], 2,
     "Invalid value for '--model': 'a b' is neither a saved model"),
    ("find-data-without-model", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--data", t], 2,
     "Invalid value for '--data': a folder of images for your own model: give --model too"),
    ("find-loss-unknown", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--loss", "nope"], 2,
     "Invalid value for '--loss'"),
    ("find-seed-twice", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--seed", "1", "--seed", "2"], 2,
     "--seed given 2 times (1, 2)"),
    # the race's settings out of bounds, or without the race (exit 2, before any probe)
    ("find-race-budget-zero", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race",
                                            "--race-budget", "0"], 2, "Invalid value for '--race-budget'"),
    ("find-race-budget-nan", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race",
                                           "--race-budget", "nan"], 2, "Invalid value for '--race-budget'"),
    ("find-race-budget-20-digits", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race",
                                                 "--race-budget", "12345678901234567890"], 2, "must be at most 31,536,000 (a year)"),
    ("find-race-until-unknown-metric", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race",
                                                     "--until", "val_auc=0.9"], 2, "unknown metric 'val_auc'"),
    ("find-until-without-race", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--until",
                                              "val_loss=0.5"], 2, "give --race"),
    ("find-ray-address-without-ray", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race",
                                                   "--ray-address", "auto"], 2, "Invalid value for '--ray-address'"),
    ("find-runner-unknown", lambda t, d: ["find-batch-size", "--data-dir", d, "--out", t, "--race", "--runner",
                                          "slurm"], 2, "Invalid value for '--runner'"),
    # a batch size no step can train on: refused before the sweep starts (exit 2)
    ("sweep-batch-above-split", lambda t, d: ["sweep", "--data-dir", d, "--out", t, "--opt", "adam",
                                              "--batch-size", "64", "--seeds", "1"], 2,
     "batch size 64 is larger than the 48 training images"),
]


def answer(result) -> list[str]:
    """The output's error: its one `Error:` line and what follows it, at most one line more (what
    to do); [] when the output has no error line, or more than one, or more after it. What a
    command printed before it failed (a stage's heading) comes before it."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    at = [i for i, ln in enumerate(lines) if ln.startswith("Error:")]
    return lines[at[0]:] if len(at) == 1 and len(lines) - at[0] <= 2 else []


def files_of(*folders: Path) -> dict[str, bytes]:
    """Every file under the folders, by path, with its bytes (the lock files aside)."""
    return {str(p): p.read_bytes() for folder in folders if folder.is_dir() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


@pytest.mark.parametrize("name, make, code, words", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_invocation_is_one_line_with_its_exit_code_and_changes_nothing(
        name, make, code, words, data_dir, tmp_path, monkeypatch):
    # given a hostile command line (and what it names), and what is on disk before it runs
    monkeypatch.chdir(tmp_path)
    args = [str(a) for a in make(tmp_path, data_dir)]
    before = files_of(tmp_path, data_dir)
    # when it runs
    result = CliRunner().invoke(cli, args)
    # then it ends in one line (and what to do, on a second), with its exit code, and no traceback
    assert result.exit_code == code, result.output
    assert not result.exception or isinstance(result.exception, SystemExit), repr(result.exception)
    assert answer(result) and words in answer(result)[0], result.output
    assert "Traceback" not in result.output
    # and every file there before is there still, as it was
    after = files_of(tmp_path, data_dir)
    assert {p: b for p, b in after.items() if p in before} == before


def test_a_read_only_disk_is_one_line_naming_the_path(data_dir, tmp_path, monkeypatch):
    # given a folder every write under which fails as on a read-only mount
    ro = tmp_path / "ro"
    mkdir = Path.mkdir

    def read_only_mkdir(self, *args, **kwargs):
        if str(self).startswith(str(ro)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only_mkdir)
    for args in (["sweep", "--data-dir", data_dir, "--out", ro, *TRAIN], ["prepare", "--source", "synthetic",
                 "--data-dir", ro], ["profile", "--data-dir", data_dir, "--out", ro], ["find-batch-size", "--data-dir",
                 data_dir, "--out", ro]):
        # when a command writes there, then one line names the path and the cause, exit 1
        result = CliRunner().invoke(cli, [str(a) for a in args])
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert result.exit_code == 1 and len(lines) == 1, result.output
        assert lines[0].startswith(f"Error: {ro}") and "Read-only file system" in lines[0]


def test_a_disk_full_when_opening_the_store_is_one_line_with_what_to_do(data_dir, tmp_path, monkeypatch):
    # given a store whose every write fails as on a full disk
    def full(self):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(Store, "transaction", full)
    result = CliRunner().invoke(cli, ["sweep", "--data-dir", str(data_dir), "--out", str(tmp_path), *TRAIN])
    # then the sweep stops before any trial, in one line and what to do on a second, exit 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert lines[-2].startswith("Error: cannot use the results store") and "database or disk is full" in lines[-2]
    assert "run the same command again to resume" in lines[-1]


class CountingSlot:
    """A sweep slot whose trials end done at once, counting what it ran."""

    ran: list[str] = []

    def __init__(self, *args):
        pass

    def shapes(self) -> set[str]:
        return set()

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None) -> TrialRecord:
        CountingSlot.ran.append(cfg.key())
        return TrialRecord(status=Status.DONE, test_accuracy=0.5, images_per_second=100.0)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_disk_that_fills_mid_sweep_loses_no_finished_trial(data_dir, tmp_path, monkeypatch):
    from catsdogs.plans import grid_configs
    from catsdogs.training.sweep import run_sweep

    grid = grid_configs(["adam"], [8, 16, 32, 48], ["standard"], 1, 1, image_size=SIZE,
                        fingerprints={"standard": "f"}, backend="tensorflow")
    finish = Store.finish.__wrapped__  # the write itself, under the store's guard
    written: list[str] = []

    def fills_after_two(self, key, record):
        if len(written) == 2:
            raise sqlite3.OperationalError("database or disk is full")
        written.append(key)
        return finish(self, key, record)

    # given a sweep whose third outcome finds the disk full
    monkeypatch.setattr(Store, "finish", store_module._guarded(fills_after_two))
    CountingSlot.ran = []
    with pytest.raises(StoreError, match="database or disk is full") as raised:
        run_sweep("s", grid, data_dir, tmp_path, SweepSettings(slots=CountingSlot, log=lambda *a: None))
    # then the sweep stops there with one error (a CatsdogsError: one line at the command line)
    assert isinstance(raised.value, CatsdogsError) and "resume" in raised.value.hint
    with Store(tmp_path / "results.sqlite") as store:
        statuses = {t["key"]: t["status"] for t in store.trials("s")}
    assert [statuses[k] for k in written] == [Status.DONE, Status.DONE]
    # when the same sweep runs again, with room on the disk, then the two finished are not run again
    monkeypatch.setattr(Store, "finish", store_module._guarded(finish))
    CountingSlot.ran = []
    counts = run_sweep("s", grid, data_dir, tmp_path, SweepSettings(slots=CountingSlot, log=lambda *a: None))
    assert counts[Status.DONE] == 4 and not set(CountingSlot.ran) & set(written) and len(CountingSlot.ran) == 2


def test_bare_catsdogs_prints_what_it_does_and_exits_0():
    result = CliRunner().invoke(cli, [])
    assert result.exit_code == 0 and "Error" not in result.output
    assert result.output.startswith("Usage:") and "find-batch-size" in result.output


def test_a_killed_worker_is_reported_without_an_unrelated_log_line():
    from catsdogs.runtime.worker import _last_error_line

    # the line an error reports itself by is quoted; a progress line or a driver's notice is not
    assert _last_error_line("x\nTraceback (most recent call last):\n  File a\nModuleNotFoundError: No module "
                            "named 'nonesuch'\n") == "ModuleNotFoundError: No module named 'nonesuch'"
    assert _last_error_line("epoch 3/5\ncuInit: CUDA error\n") == ""

