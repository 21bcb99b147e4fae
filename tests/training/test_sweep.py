"""The trainer: one trial, the grid, the store, resuming, failures, and the sweep command."""

from __future__ import annotations

import csv
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs.cli import cli
from catsdogs.schema import Status, TrialConfig, learning_rate, plan_steps
from catsdogs.store import CSV_COLUMNS, Store
from catsdogs.training import sweep as sweep_module
from catsdogs.training.sweep import SweepSettings

SIZE = 32
FAST = ["--epochs", "1", "--seeds", "1"]


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


def sweep_args(data_dir, out, name="s", *extra):
    return ["sweep", "--data-dir", str(data_dir), "--out", str(out), "--name", name, *FAST, *extra]


def rows(out: Path, name: str) -> list[dict]:
    with open(out / name / "results.csv") as f:
        return list(csv.DictReader(f))


# --- one trial ------------------------------------------------------------------------------


def test_article_model_has_40961153_parameters_at_200px():
    # given the article's model at its input size, built but not trained
    from catsdogs.training.costs import parameter_count
    from catsdogs.training.model import build_model

    model = build_model(200)
    # then its parameter count is the article's, layer by layer
    assert model.count_params() == 40_961_153 == parameter_count(200)
    assert [layer.count_params() for layer in model.layers] == [0, 896, 0, 0, 40_960_128, 129]
    assert model.output_shape == (None, 1)


@pytest.mark.slow
def test_same_trial_twice_gives_the_same_test_accuracy(data_dir):
    from catsdogs.training.engine import run_trial

    # given one configuration, when it is trained twice in the same process
    cfg = TrialConfig("adam", 8, "standard", seed=3, epochs=2, image_size=SIZE)
    a, b = run_trial(cfg, data_dir), run_trial(cfg, data_dir)
    # then every number of the result is the same
    assert a.test_accuracy == b.test_accuracy
    assert a.test_loss == b.test_loss
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    # and the article's protocol holds: 48 // 8 = 6 updates per epoch, all 16 test images
    assert a.steps == 2 * 6 and a.n_test == 16 and a.n_validation == 16
    assert {"loss", "accuracy", "val_loss", "val_accuracy", "seconds"} <= set(a.history[0])
    assert a.peak_memory_mb > 0 and a.env["tensorflow"] and a.env["device"]


@pytest.mark.slow
def test_different_seed_gives_a_different_trial(data_dir):
    from catsdogs.training.engine import run_trial

    a = run_trial(TrialConfig("sgd", 16, "standard", seed=0, epochs=1, image_size=SIZE), data_dir)
    b = run_trial(TrialConfig("sgd", 16, "standard", seed=1, epochs=1, image_size=SIZE), data_dir)
    assert a.history[0]["loss"] != b.history[0]["loss"]


def test_protocol_arithmetic():
    # the article: n // batch size steps per epoch, the Keras default learning rates
    cfg = TrialConfig("sgd", 256, "standard", 0)
    assert plan_steps(cfg, 1200) == (4, 5) and learning_rate(cfg) == 0.01
    # the steps budget gives every batch size the base batch size's updates
    assert plan_steps(TrialConfig("adam", 256, "standard", 0, budget="steps"), 1200) == (37, 5)
    # linear scaling from the base batch size 32
    assert learning_rate(TrialConfig("adam", 256, "standard", 0, lr_scaling="linear")) == pytest.approx(0.008)
    # the key names the configuration: equal configs, equal keys; any change, another key
    assert TrialConfig("adam", 32, "standard", 0).key() == TrialConfig("adam", 32, "standard", 0).key()
    assert TrialConfig("adam", 32, "standard", 0).key() != TrialConfig("adam", 32, "standard", 1).key()


# --- the sweep ------------------------------------------------------------------------------

GRID_PLAN = """seeds = 1
epochs = 1
[grids.grid]
opt = ["adam", "sgd"]
batch_size = [8, 16]
"""


@pytest.mark.slow
def test_adamw_trains_in_a_sweep_on_either_backend_with_its_keras_default_rate(keras_backend, data_dir, tmp_path):
    # given AdamW, one row of catsdogs.optimizers' table (Keras's own AdamW), in a sweep
    result = CliRunner().invoke(cli, sweep_args(data_dir, tmp_path, "aw", "--opt", "adamw", "--batch-size", "8"))
    # then its trial trains on this backend, with Keras's default rate, and is recorded as AdamW's
    assert result.exit_code == 0, result.output
    (row,) = rows(tmp_path, "aw")
    assert (row["optimizer"], row["status"], row["backend"]) == ("adamw", "done", keras_backend)
    assert float(row["learning_rate"]) == pytest.approx(0.001) and int(row["steps"]) > 0


@pytest.fixture(scope="module")
def swept(data_dir, tmp_path_factory):
    """When: `catsdogs sweep` runs a plan of Adam and SGD at batch sizes 8 and 16; then the same
    sweep, through the library, gets a fifth trial that fails in its worker: SGD at a batch size
    larger than the training set, which the command refuses before it starts (so the trial stands
    for any failure inside a worker), run last by the worker that ran the others."""
    from catsdogs.plans import load, trials
    from catsdogs.training.sweep import run_sweep

    out = tmp_path_factory.mktemp("swept")
    plan = out / "grid.toml"
    plan.write_text(GRID_PLAN)
    args = ["sweep", "--config", str(plan), "--data-dir", str(data_dir), "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    planned = trials(load(str(plan)), data_dir, "tensorflow")
    too_large = replace(planned[-1], optimizer="sgd", batch_size=64)
    lines: list[str] = []
    counts = run_sweep("grid", [*planned, too_large], data_dir, out, SweepSettings(log=lines.append))
    return {"out": out, "args": args, "result": result, "counts": counts, "lines": lines}


@pytest.mark.slow
@pytest.mark.xdist_group("swept")
def test_sweep_of_2_optimizers_by_2_batch_sizes_gives_4_done_rows(swept):
    out = swept["out"]
    # then the command ran them all, and the CSV has a row per trial: the 4 cells done, with the promised columns
    assert swept["result"].exit_code == 0, swept["result"].output
    table = [r for r in rows(out, "grid") if r["batch_size"] != "64"]
    assert len(table) == 4 and {r["status"] for r in table} == {"done"}
    assert {(r["optimizer"], r["batch_size"]) for r in table} == {
        ("adam", "8"), ("adam", "16"), ("sgd", "8"), ("sgd", "16")}
    assert list(table[0]) == CSV_COLUMNS
    assert all(0 <= float(r["test_accuracy"]) <= 1 and int(r["steps"]) > 0 for r in table)
    assert {r["backend"] for r in table} == {"tensorflow"}  # the default; on JAX: test_reproduce
    assert (out / "grid" / "sweep.json").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("swept")
def test_a_failing_trial_is_recorded_and_the_others_finish(swept):
    # then the sweep went on, counted the failure (the command's exit code 1), and recorded the error text
    assert not sweep_module.succeeded(swept["counts"], 5)
    assert "4 done, 1 failed, 0 out of memory, of 5" in "\n".join(swept["lines"])
    table = {(r["optimizer"], r["batch_size"]): r for r in rows(swept["out"], "grid")}
    assert table[("sgd", "64")]["status"] == "failed"
    assert "larger than the 48 training images" in table[("sgd", "64")]["error"]
    with Store(swept["out"] / "results.sqlite") as store:
        failed = next(t for t in store.trials("grid") if t["status"] == Status.FAILED)
        assert "Traceback" in failed["error"]  # the full error text is kept in the store


@pytest.mark.slow
@pytest.mark.xdist_group("swept")
def test_a_trial_records_validation_accuracy_and_its_models_collapse_diagnostics(swept):
    with Store(swept["out"] / "results.sqlite") as store:
        trial = next(t for t in store.trials("grid") if t["optimizer"] == "adam" and t["batch_size"] == 8)
    row = next(r for r in rows(swept["out"], "grid") if r["optimizer"] == "adam" and r["batch_size"] == "8")
    # then the validation accuracy is the last epoch's, and the collapse flag agrees with the dog share
    assert float(row["val_accuracy"]) == pytest.approx(trial["history"][-1]["val_accuracy"])
    assert trial["collapsed"] == int(trial["dog_share"] in (0.0, 1.0))
    # the test accuracy and the dog share describe the same predictions: with 8 cats and 8 dogs,
    # predicting every image Dog (or Cat) is exactly 50% accurate
    if trial["collapsed"]:
        assert trial["test_accuracy"] == pytest.approx(0.5)
    for k in ("dead_units", "initial_dead_units", "dog_share", "initial_dog_share"):
        assert 0 <= trial[k] <= 1, k
    assert trial["initial_logit_abs"] > 0 and trial["logit_sd"] >= 0


@pytest.mark.slow
@pytest.mark.xdist_group("swept")
def test_the_same_sweep_again_resumes_and_a_shared_trial_runs_once(swept, data_dir):
    out = swept["out"]
    # when the same command runs again, then nothing is trained again (the failure stays failed)
    again = CliRunner().invoke(cli, swept["args"])
    assert again.exit_code == 0 and "4 of 4 trials already finished" in again.output
    assert "epoch 1/1" not in again.output
    with Store(out / "results.sqlite") as store:
        assert [t["attempts"] for t in store.trials("grid")] == [1] * 5
    # when another sweep names a trial this one ran, then it is the same trial, already done
    other = CliRunner().invoke(cli, sweep_args(data_dir, out, "other", "--opt", "adam", "--batch-size", "8"))
    assert other.exit_code == 0, other.output
    assert "1 of 1 trials already finished" in other.output and "epoch 1/1" not in other.output
    with Store(out / "results.sqlite") as store:
        assert len(store.trials()) == 5 and len(store.trials("other")) == 1
        assert store.trials("other")[0]["attempts"] == 1


# --- processes: kill -9 and Ctrl-C --------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_killed_with_kill_9_resumes_without_repeating_finished_trials(data_dir, tmp_path):
    cmd = [sys.executable, "-m", "catsdogs", *sweep_args(data_dir, tmp_path, "k", "--opt", "adam", "sgd",
                                                         "--batch-size", "8", "16")]
    db = tmp_path / "results.sqlite"
    # given a sweep running in the background, killed with SIGKILL once one trial is done
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    done_first = []
    while time.time() < deadline and not done_first:
        time.sleep(0.2)
        if db.exists():
            try:
                done_first = _done_rows(db)
            except sqlite3.OperationalError:
                pass
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert done_first, "no trial finished in time"
    assert workers, "the sweep ran no worker process"

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    # then its worker processes died with it (PR_SET_PDEATHSIG): none runs on
    deadline = time.time() + 10
    while any(alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if alive(pid)]
    # when the same command runs again
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    # then every trial is done, and those done before the kill were not run again
    after = {key: (finished, attempts) for key, finished, attempts in _done_rows(db)}
    assert len(after) == 4
    for key, finished, attempts in done_first:
        assert after[key] == (finished, attempts) and attempts == 1


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _done_rows(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT key, finished_at, attempts FROM trials WHERE status='done'").fetchall()


@pytest.mark.slow
def test_a_worker_started_from_a_thread_outlives_that_thread(tmp_path):
    import threading

    from catsdogs.messages import PeakTask
    from catsdogs.runtime.worker import Worker

    # given a worker started from a thread that then ends, as a sweep slot's thread ends between
    # two adaptive rounds that keep their workers
    worker = Worker(tmp_path / "worker.log")
    starter = threading.Thread(target=worker.start)
    starter.start()
    starter.join()
    time.sleep(1.0)  # time for a kill tied to that thread to land
    try:
        # then the worker is alive and runs the next task
        assert worker.alive, f"the worker died with the thread that started it: {worker.proc.poll()}"
        record = worker.run(PeakTask("float32", seconds=0.01, matmul_size=32))
        assert record.status == Status.DONE
    finally:
        worker.close()


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_gives_the_trial_back(data_dir, tmp_path):
    cmd = [sys.executable, "-m", "catsdogs", *sweep_args(data_dir, tmp_path, "c", "--opt", "adam",
                                                         "--batch-size", "8")]
    # As from a terminal: SIGINT at its default, even where the suite itself was started in the
    # background (a shell without job control starts background jobs with SIGINT ignored, and a
    # Python started so ignores Ctrl-C for good)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:  # wait until the trial is running
        if line.startswith("[1/1]"):
            break
    else:
        pytest.fail("the sweep ended before its trial started")
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130
    assert "run the same command again to resume" in out and "Traceback" not in out
    assert out.count("Interrupted") == 1 and out.rstrip().endswith("run the same command again to resume.")
    with Store(tmp_path / "results.sqlite") as store:
        assert [t["status"] for t in store.trials("c")] == ["pending"]


# --- the command line -----------------------------------------------------------------------


def _planned(output: str) -> set[str]:
    return {line.split(None, 2)[2] for line in output.splitlines() if len(line.split()) > 2 and "bs=" in line}


def test_variadic_and_repeated_options_parse_the_same(data_dir, tmp_path):
    base = ["sweep", "--data-dir", str(data_dir), "--out", str(tmp_path), "--dry-run"]
    a = CliRunner().invoke(cli, [*base, "--opt", "adam", "sgd", "--batch-size", "16", "32", "--seeds", "2"])
    b = CliRunner().invoke(cli, [*base, "--opt", "adam", "--opt", "sgd", "--batch-size", "16",
                                 "--batch-size", "32", "--seeds", "2"])
    assert a.exit_code == b.exit_code == 0
    assert _planned(a.output) == _planned(b.output) and "8 trials" in a.output


def test_the_default_sweep_is_the_articles_first_figure(data_dir, tmp_path):
    result = CliRunner().invoke(cli, ["sweep", "--opt", "adam", "sgd", "--data-dir", str(data_dir),
                                      "--out", str(tmp_path), "--dry-run"])
    planned = _planned(result.output)
    # 2 optimizers x 4 batch sizes x 3 seeds, standard data, 5 epochs
    assert "24 trials" in result.output and len(planned) == 24
    assert {p.split()[1] for p in planned} == {"bs=16", "bs=32", "bs=64", "bs=128"}
    assert all("standard" in p and "epochs" not in p for p in planned)


def test_a_dry_run_says_when_a_run_would_refuse_a_batch_larger_than_the_training_split(data_dir, tmp_path):
    # given data with 48 training images and a batch size of 64 in the grid
    base = ["sweep", "--opt", "adam", "--batch-size", "16", "64", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    # when it is listed with --dry-run
    listed = CliRunner().invoke(cli, [*base, "--dry-run"])
    # then every trial is listed (2 sizes x 3 seeds), and the run's refusal is said, in one line
    assert listed.exit_code == 0 and "6 trials" in listed.output
    refusal = [line for line in listed.output.splitlines() if line.startswith("A run would stop")]
    assert len(refusal) == 1 and "batch size 64 is larger than the 48 training images" in refusal[0]
    # and a dry run of a grid that fits says nothing of the kind
    fits = CliRunner().invoke(cli, ["sweep", "--opt", "adam", "--batch-size", "16", "--data-dir", str(data_dir),
                                    "--out", str(tmp_path), "--dry-run"])
    assert fits.exit_code == 0 and "A run would stop" not in fits.output


def test_a_plan_is_read_and_the_command_line_wins(data_dir, tmp_path):
    # given a plan with one grid
    cfg = tmp_path / "c.toml"
    cfg.write_text('seeds = 1\nepochs = 2\n[grids.g]\nopt = ["sgd"]\nbatch_size = [8, 16, 32]\n')
    # when swept with a batch size of the command line's
    result = CliRunner().invoke(cli, ["sweep", "--config", str(cfg), "--batch-size", "64",
                                      "--data-dir", str(data_dir), "--out", str(tmp_path), "--dry-run"])
    # then the command line's value replaced the grid's, the rest is the plan's
    assert result.exit_code == 0, result.output
    assert _planned(result.output) == {"sgd bs=64 standard seed=0 epochs=2"}


def test_a_plan_runs_the_same_trials_with_sweep_as_with_reproduce(data_dir, tmp_path):
    # given the quick plan, on data already prepared
    from catsdogs.plans import load, trials

    result = CliRunner().invoke(cli, ["sweep", "--config", "quick", "--data-dir", str(data_dir),
                                      "--out", str(tmp_path), "--dry-run"])
    # then sweep plans every trial of both its grids, each once, under the plan's name
    assert result.exit_code == 0, result.output
    keys = [line.split()[0] for line in result.output.splitlines() if " bs=" in line]
    assert keys == [t.key() for t in trials(load("quick"), data_dir, "tensorflow")] and len(keys) == 24


@pytest.mark.parametrize("args, message", [
    (["--opt", "adagrad"], "Invalid value for '--opt': unknown optimizer 'adagrad'"),
    (["--dataset", "cats"], "Invalid value for '--dataset': unknown dataset 'cats'"),
    (["--batch-size", "0"], "Invalid value for '--batch-size': batch sizes must be whole numbers >= 1"),
    (["--batch-size", "16", "-4"], "batch sizes must be whole numbers >= 1"),
    (["--precision", "fp8"], "Invalid value for '--precision'"),
    (["--workers", "0"], "Invalid value for '--workers': must be at least 1, got 0"),
    (["--workers", "2", "--strategy", "mirrored"], "Invalid value for '--workers': --strategy mirrored uses "
                                                    "every GPU for one trial"),
    (["--name", "../up"], "Invalid value for '--name': '../up': use letters"),
])
def test_bad_sweep_options_are_one_line_usage_errors(data_dir, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["sweep", "--data-dir", str(data_dir), "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0]
    assert "Traceback" not in result.output


def test_an_unprepared_data_dir_is_exit_1_in_one_line_saying_how_to_prepare(tmp_path):
    # a missing data folder is not a bad option: exit 1 (docs/usage.md, "Exit codes")
    result = CliRunner().invoke(cli, ["sweep", "--opt", "adam", "--data-dir", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "catsdogs prepare" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_batch_size_larger_than_the_training_split_is_refused_before_the_sweep(data_dir, tmp_path):
    # given data with 48 training images a data set; when a sweep asks for batch size 64
    result = CliRunner().invoke(cli, ["sweep", "--opt", "adam", "--batch-size", "16", "64", "--seeds", "1",
                                      "--data-dir", str(data_dir), "--out", str(tmp_path)])
    # then a usage error names it, and nothing was planned or run
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "batch size 64 is larger than the 48 training images" in lines[0]
    assert not (tmp_path / "results.sqlite").exists()


def test_a_bad_config_key_is_a_usage_error(data_dir, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('optimizer = ["sgd"]\n')
    result = CliRunner().invoke(cli, ["sweep", "--config", str(cfg), "--data-dir", str(data_dir)])
    assert result.exit_code == 2 and "unknown key 'optimizer'" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_where_trials_run_is_the_runner_and_the_old_option_name_says_so(data_dir, tmp_path):
    # given the option's 0.6.0 name, `--backend`, which 0.7 took with a notice and 0.8 no longer takes
    base = ["sweep", "--data-dir", str(data_dir), "--out", str(tmp_path), "--dry-run"]
    old = CliRunner().invoke(cli, [*base, "--backend", "ray"])
    new = CliRunner().invoke(cli, [*base, "--runner", "local"])
    # then it is a one-line usage error that says what to write instead, and runs nothing
    assert new.exit_code == 0 and old.exit_code == 2
    lines = [ln for ln in old.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--backend ray is now --runner ray" in lines[0]
    # and the help names --runner, and the backend only as Keras's
    help_text = CliRunner().invoke(cli, ["sweep", "--help"]).output
    assert "--runner [local|ray]" in help_text and "--backend" not in help_text


class ReusedWorkerRunsOutOfMemory:
    """A worker whose trials run out of memory once it has run one before (what an allocator
    kept from earlier trials can do), and fit in a fresh process."""

    device = "cpu"  # as a worker on the CPU says it is

    def __init__(self, log_path, env=None, digests=None):
        self.log_path, self.tasks, self.alive, self.starts = Path(log_path), 0, False, 0

    def run(self, task, on_progress=None, memory_cap_bytes=None):
        from catsdogs.messages import TrialRecord

        if not self.alive:
            self.alive, self.tasks, self.starts = True, 0, self.starts + 1
        self.tasks += 1
        if self.tasks > 1:
            self.alive = False  # as the real worker: gone after a trial that did not end done
            return TrialRecord(status=Status.OOM, error="ResourceExhaustedError: OOM when allocating")
        return TrialRecord(status=Status.DONE)

    def close(self):
        self.alive = False


def test_a_trial_out_of_memory_in_a_reused_worker_runs_again_in_a_fresh_one(monkeypatch, tmp_path):
    from catsdogs.training import local_slot

    monkeypatch.setattr(local_slot, "Worker", ReusedWorkerRunsOutOfMemory)
    slot = local_slot.LocalSlot(0, 1, tmp_path)
    # given a slot whose worker has run a trial
    assert slot.run(TrialConfig("adam", 8, "standard", 0), tmp_path).status == Status.DONE
    # when the next trial runs out of memory there, then it is run again in a fresh worker
    record = slot.run(TrialConfig("adam", 64, "standard", 0), tmp_path)
    assert record.status == Status.DONE and slot.worker.starts == 2


def test_both_runners_slots_are_slots_as_the_sweep_calls_them(tmp_path):
    import inspect

    from catsdogs.training.local_slot import LocalSlot
    from catsdogs.training.ray_runner import RaySlot
    from catsdogs.training.sweep import Slot

    # given the sweep's Slot protocol, and the local and the Ray runner's slots
    wanted = {name: inspect.signature(getattr(Slot, name)) for name in ("shapes", "run", "digest", "stop", "close")}
    for slot_class in (LocalSlot, RaySlot):
        # then each has every method, taking what the sweep passes by the names it passes them
        for name, sig in wanted.items():
            got = inspect.signature(getattr(slot_class, name))
            assert list(got.parameters) == list(sig.parameters), (slot_class.__name__, name)
    # and an unstarted local slot is one at run time too (no worker starts until it runs a trial)
    slot = LocalSlot(0, 1, tmp_path)
    assert isinstance(slot, Slot) and not slot.worker.alive


@pytest.mark.slow
def test_digests_hashed_while_the_next_trial_trains_are_the_same_and_every_trial_is_recorded(data_dir, tmp_path):
    from catsdogs.plans import load, trials
    from catsdogs.training.local_slot import LocalSlot
    from catsdogs.training.sweep import run_sweep

    # given the four trials of a plan, swept once as on the CPU (each digest before its record) and
    # once as on a GPU (each trial answered at once, its digest hashed while the next one trains)
    plan = tmp_path / "grid.toml"
    plan.write_text(GRID_PLAN)
    grid = trials(load(str(plan)), data_dir, "tensorflow")
    # the last trial fails in its worker (a batch larger than the training set), which ends the
    # worker while the trial before it still owes its digest
    failing = replace(grid[-1], optimizer="sgd", batch_size=64)
    found = {}
    for defer in (False, True):
        out = tmp_path / f"defer-{defer}"
        lines: list[str] = []
        slots = lambda i, n, workdir, defer=defer: LocalSlot(i, n, workdir, defer_digest=defer)  # noqa: E731
        counts = run_sweep("grid", [*grid, failing], data_dir, out, SweepSettings(log=lines.append, slots=slots))
        assert (counts[Status.DONE], counts[Status.FAILED]) == (len(grid), 1), lines
        with Store(out / "results.sqlite", read_only=True) as store:
            found[defer] = {c.key(): store.get(c.key())["weights_digest"] for c in grid}
        if defer:  # each recorded after the next one started (the last at the end) is named in its outcome line
            assert sum(": done: test accuracy" in ln for ln in lines) == len(grid), lines
    # then every trial is recorded, done, with the same digest either way: the last one's came as
    # its worker ended
    assert found[True] == found[False] and all(found[True].values())
