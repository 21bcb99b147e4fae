"""The Ray runner: a sweep's trials on Ray actors on a local Ray, results in the same store.

Skipped where Ray is not installed (`pip install 'catsdogs[ray]'`). One local Ray serves the
whole module (started by the first sweep, about 10 s), and is shut down at its end.
"""

from __future__ import annotations

import csv
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one local Ray, in one test process

from click.testing import CliRunner  # noqa: E402

from catsdogs.cli import cli  # noqa: E402
from catsdogs.schema import Status, TrialConfig  # noqa: E402
from catsdogs.store import Store  # noqa: E402
from catsdogs.training import ray_runner  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """A local Ray for this module, whatever RAY_ADDRESS says; shut down at the end."""
    saved = os.environ.pop("RAY_ADDRESS", None)
    try:
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


def ray_sweep(data_dir, out, name, *extra):
    seeds = [] if "--seeds" in extra else ["--seeds", "1"]  # (an option given twice is refused)
    return ["sweep", "--runner", "ray", "--data-dir", str(data_dir), "--out", str(out), "--name", name,
            "--opt", "adam", "--epochs", "1", *seeds, *extra]


def csv_rows(out: Path, name: str) -> list[dict]:
    with open(out / name / "results.csv") as f:
        return list(csv.DictReader(f))


def by_batch_size(out: Path, name: str) -> dict[int, dict]:
    with Store(out / "results.sqlite") as store:
        return {t["batch_size"]: t for t in store.trials(name)}


# --- without a cluster ------------------------------------------------------------------------


def test_without_ray_the_runner_is_a_one_line_error(data_dir, tmp_path, monkeypatch):
    # given Ray cannot be imported
    monkeypatch.setitem(sys.modules, "ray", None)
    # when a sweep asks for the ray runner
    result = CliRunner().invoke(cli, ray_sweep(data_dir, tmp_path, "n", "--batch-size", "8"))
    # then one line says how to install it, and nothing ran
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines == ["Error: --runner ray needs Ray, which is not installed; "
                     "install the extra: pip install 'catsdogs[ray]'"]
    assert not (tmp_path / "results.sqlite").exists()


def test_without_ray_a_race_on_ray_is_one_line_before_any_probe(data_dir, tmp_path, monkeypatch):
    # given Ray cannot be imported
    monkeypatch.setitem(sys.modules, "ray", None)
    # when find-batch-size is asked to race on Ray
    result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(tmp_path),
                                      "--race", "--runner", "ray"])
    # then one line says how to install it, before any probe or file
    assert result.exit_code == 1
    assert [ln for ln in result.output.splitlines() if ln.strip()] == [
        "Error: --runner ray needs Ray, which is not installed; install the extra: pip install 'catsdogs[ray]'"]
    assert not list(tmp_path.iterdir())


def test_how_ray_errors_become_records():
    ex = ray.exceptions
    # a lost worker, a dead node, a cancelled task: lost, to be run again
    assert ray_runner.outcome_of_error(ex.WorkerCrashedError(), ray).status == Status.LOST
    assert ray_runner.outcome_of_error(ex.NodeDiedError("node 1.2.3.4 died"), ray).status == Status.LOST
    assert ray_runner.outcome_of_error(ex.TaskCancelledError(), ray).status == Status.LOST
    # killed by Ray's memory monitor: out of memory, as a killed child process is locally
    assert ray_runner.outcome_of_error(ex.OutOfMemoryError("memory used 96%"), ray).status == Status.OOM
    # the task's code raised (outside the trial's own guard): failed, with the error
    failed = ray_runner.outcome_of_error(ex.RayTaskError("f", "Traceback ...", ImportError("no catsdogs")), ray)
    assert failed.status == Status.FAILED and "ImportError: no catsdogs" in failed.error
    # a task error caused by a system failure: lost
    crashed = ex.RayTaskError("f", "Traceback ...", ex.WorkerCrashedError())
    assert ray_runner.outcome_of_error(crashed, ray).status == Status.LOST


# --- on a local Ray -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_on_local_ray_records_every_trial_and_its_actors_keep_their_compiled_steps(data_dir, tmp_path):
    # when a sweep of two batch sizes and two seeds runs on a local Ray on this machine's cores
    args = ray_sweep(data_dir, tmp_path, "r", "--batch-size", "8", "16", "--seeds", "2")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # then Ray ran them (as many at once as the cores allow) and the sweep recorded every one
    assert "Ray: 1 node(s)" in result.output
    workers = max(1, os.cpu_count() or 1)
    assert f"{workers} at a time" in result.output
    table = csv_rows(tmp_path, "r")
    assert len(table) == 4 and {r["status"] for r in table} == {"done"}
    assert all(0 <= float(r["test_accuracy"]) <= 1 and int(r["steps"]) > 0 for r in table)
    with Store(tmp_path / "results.sqlite") as store:
        trials = {(t["batch_size"], t["seed"]): t for t in store.trials("r")}
    assert [t["attempts"] for t in trials.values()] == [1] * 4
    assert all(t["history"] and t["env"]["tensorflow"] for t in trials.values())
    # and the actors lived on: the first slot free for seed 1 claimed the shape its actor had
    # compiled, and reused it
    assert not any(trials[(b, 0)]["step_reused"] for b in (8, 16))
    assert sum(bool(trials[(b, 1)]["step_reused"]) for b in (8, 16)) >= 1
    # when the same command runs again, then nothing is trained again
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "4 of 4 trials already finished" in again.output
    with Store(tmp_path / "results.sqlite") as store:
        assert [t["attempts"] for t in store.trials("r")] == [1] * 4


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_find_batch_sizes_race_runs_its_trials_on_local_ray_and_answers_as_a_local_race(data_dir, tmp_path):
    import catsdogs
    from catsdogs.measure.race_run import sweep_name

    # given a race to a target the untrained model reaches at its first evaluation (a race in seconds)
    lines: list = []
    call = dict(data_dir=data_dir, out=tmp_path, max_batch_size=8, noise_scale=False, optimizer="sgd", race=True,
                until="val_loss=50", log=lines.append)
    # when find_batch_size races on a local Ray
    advice = catsdogs.find_batch_size(**call, race_runner="ray")
    # then Ray's actors ran the race's trials, and the answer is the race's measured fastest
    assert any(line.startswith("Ray: 1 node(s)") for line in lines)
    race = advice.result.race
    assert race["decision"] is not None and advice.batch_size == race["decision"]["batch_size"]
    with Store(tmp_path / "results.sqlite", read_only=True) as store:
        rows = store.trials(sweep_name("find-batch-size"))
    assert len(rows) == race["trials"] and all(r["status"] == "done" and r["env"] for r in rows)
    # and the same race locally continues from the store: the runner is no part of what a trial is
    again: list = []
    catsdogs.find_batch_size(**{**call, "log": again.append})
    assert any("continuing the race" in line for line in again) and not any(line.startswith("[") for line in again)


USER_MODELS = """
import keras
from keras import layers


def small():  # two classes of 16 px images, logits
    return keras.Sequential([keras.Input((16, 16, 3)), layers.Rescaling(1 / 255),
                             layers.Conv2D(4, 3, activation="relu"), layers.GlobalAveragePooling2D(),
                             layers.Dense(2)], name="small")
"""


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_a_users_model_races_on_local_ray_from_the_users_project_and_folder(a_project, tmp_path):
    import numpy as np
    from PIL import Image

    import catsdogs
    from catsdogs.measure.race_run import sweep_name

    # given a user's project (my_models.py in the current directory) and folder of two classes of 16 px images
    project = a_project(USER_MODELS)
    rng = np.random.default_rng(0)
    for label, name in enumerate(("ant", "bee")):
        (project / "pics" / name).mkdir(parents=True)
        for i in range(30):
            pixels = np.clip(rng.normal(70 + 100 * label, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(project / "pics" / name / f"{i}.png")
    # when its model races on a local Ray, to a target the untrained model reaches at its first evaluation
    lines: list = []
    advice = catsdogs.find_batch_size("my_models:small", project / "pics", data_dir=tmp_path / "none",
                                      out=tmp_path / "out", max_batch_size=8, noise_scale=False, optimizer="sgd",
                                      memory_limit="1GiB", race=True, until="val_loss=50", race_runner="ray",
                                      log=lines.append)
    # then Ray's actors imported the user's module and trained its model: every trial keyed by it, done
    race = advice.result.race
    assert race["decision"] is not None and advice.batch_size == race["decision"]["batch_size"]
    with Store(tmp_path / "out" / "results.sqlite", read_only=True) as store:
        rows = store.trials(sweep_name("find-batch-size"))
    identity = f"my_models:small@{advice.result.model['architecture']}"
    assert rows and all(r["status"] == "done" and r["config"]["model"] == identity for r in rows), \
        [r["error"] for r in rows if r["status"] != "done"][:1]
    assert len(rows) == race["trials"]


@pytest.mark.slow
def test_a_sweep_on_local_ray_trains_on_jax_when_keras_backend_says_so(data_dir, tmp_path, monkeypatch):
    # given KERAS_BACKEND=jax in the sweep's process (Ray may have been started under TensorFlow)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    # when a sweep of four trials runs on the local Ray
    result = CliRunner().invoke(cli, ray_sweep(data_dir, tmp_path, "j", "--batch-size", "8", "16", "--seeds", "2"))
    assert result.exit_code == 0, result.output
    # then every trial trained on JAX, and says so
    with Store(tmp_path / "results.sqlite") as store:
        trials = store.trials("j")
    assert len(trials) == 4 and {t["status"] for t in trials} == {Status.DONE}
    assert {t["backend"] for t in trials} == {"jax"}
    assert all(t["env"]["backend"] == "jax" and "jax" in t["env"] for t in trials)
    # and on a CPU host each actor's process started with malloc's blocks in huge pages (glibc reads
    # it at the start: Ray's runtime_env, not the actor's os.environ), as its record says
    from catsdogs import host
    from catsdogs.runtime.backends import jax_process

    mine = None if host.nvidia_devices() else host.malloc_settings(jax_process.malloc_env(os.environ) or os.environ)
    assert {t["env"].get("malloc") for t in trials} == {mine}


@pytest.mark.slow
def test_a_lost_worker_never_leaves_a_half_result(data_dir, tmp_path, monkeypatch):
    real = ray_runner._run_in_worker
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    # given a trial function that kills its own actor's process: the bs=8 trial's first
    # attempt only, the bs=16 trial's every attempt (a node that keeps dying). Defined here, it
    # travels to the actors by value; the attempt files are all that the test shares with them.
    def dies(task):
        log = attempts / f"bs{task.config.batch_size}"
        with open(log, "a") as f:
            f.write("attempt\n")
        if task.config.batch_size == 16 or len(log.read_text().splitlines()) == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(task)

    monkeypatch.setattr(ray_runner, "_run_in_worker", dies)
    monkeypatch.setattr(ray_runner, "MAX_RETRIES", 1)  # one retry shows it as two would: an actor's start fewer
    # when the sweep runs, its trials one after the other (one slot: the bs=8 trial's second actor
    # goes on to the bs=16 trial, an actor's start fewer than a slot each)
    one_slot = ("--workers", "1")
    result = CliRunner().invoke(cli, ray_sweep(data_dir, tmp_path, "lost", "--batch-size", "8", "16", *one_slot))
    # then the slot ran the bs=8 trial again on a new actor, and it is done, once, in the store
    assert result.exit_code == 1, result.output
    trials = by_batch_size(tmp_path, "lost")
    assert (attempts / "bs8").read_text().count("attempt") == 2
    assert trials[8]["status"] == "done" and trials[8]["attempts"] == 1
    # and the bs=16 trial, lost after every retry, is pending again with no result at all
    assert (attempts / "bs16").read_text().count("attempt") == 1 + ray_runner.MAX_RETRIES
    assert "lost: ActorDiedError" in result.output and "left pending" in result.output
    lost = trials[16]
    assert lost["status"] == "pending" and lost["attempts"] == 0
    assert lost["test_accuracy"] is None and lost["history"] is None and lost["finished_at"] is None

    # when the same command runs again with workers that live
    monkeypatch.setattr(ray_runner, "_run_in_worker", real)
    again = CliRunner().invoke(cli, ray_sweep(data_dir, tmp_path, "lost", "--batch-size", "8", "16", *one_slot))
    # then only the lost trial runs, and now every trial is done
    assert again.exit_code == 0, again.output
    assert "1 of 2 trials already finished" in again.output
    trials = by_batch_size(tmp_path, "lost")
    assert {t["status"] for t in trials.values()} == {"done"}
    assert trials[8]["attempts"] == 1 and trials[16]["attempts"] == 1
    assert {r["status"] for r in csv_rows(tmp_path, "lost")} == {"done"}


@pytest.mark.slow
def test_a_stopped_trial_comes_back_lost(data_dir, tmp_path, monkeypatch):
    started = tmp_path / "started"

    # given a trial that would run for a long time, and says when it has begun
    def sleeps(task):
        import time

        started.write_text("running")
        time.sleep(120)

    monkeypatch.setattr(ray_runner, "_run_in_worker", sleeps)
    make_slot, concurrency = ray_runner.make_slots(log=lambda *_: None)
    assert concurrency >= 1
    slot = make_slot(0, 1)

    def stop_once_running():
        while not started.exists():
            threading.Event().wait(0.1)
        slot.stop()

    # when the sweep stops it (Ctrl-C) while it runs, which kills its actor
    threading.Thread(target=stop_once_running, daemon=True).start()
    record = slot.run(TrialConfig("adam", 8, "standard", 0, epochs=1, image_size=SIZE), data_dir)
    # then the slot returns at once, the trial lost (given back), never a result
    assert record.status == Status.LOST and "Actor" in record.error
