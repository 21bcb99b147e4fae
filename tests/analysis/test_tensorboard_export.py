"""TensorBoard from the store (issue 36): every trial a run in the HParams dashboard's format, read
back with TensorBoard's own event reader; an unchanged store writes nothing again."""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest

from catsdogs.analysis import tensorboard_export
from catsdogs.analysis.rows import load_trials
from catsdogs.errors import CatsdogsError
from catsdogs.messages import TrialRecord
from catsdogs.store import Store

pytest.importorskip("tensorboard")


def config(optimizer: str, batch_size: int, seed: int) -> dict:
    return {"optimizer": optimizer, "batch_size": batch_size, "dataset": "standard", "seed": seed, "epochs": 2,
            "image_size": 64, "data": "fp", "lr": None, "lr_scaling": "none", "base_batch_size": 32,
            "warmup_epochs": 0.0, "budget": "epochs", "accumulate": 1, "precision": "float32", "strategy": "none",
            "backend": "tensorflow"}


HISTORY = [{"loss": 0.69, "accuracy": 0.52, "val_loss": 0.68, "val_accuracy": 0.55, "seconds": 1.0},
           {"loss": 0.61, "accuracy": 0.66, "val_loss": 0.64, "val_accuracy": 0.63, "seconds": 1.0,
            "noise_scale": 41.5}]


CURVE = [{"step": 0, "examples": 0, "train_seconds": 0.0, "val_loss": 0.70, "val_accuracy": 0.5},
         {"step": 8, "examples": 256, "train_seconds": 0.4, "val_loss": 0.66, "val_accuracy": 0.6}]


@pytest.fixture
def store(tmp_path) -> Path:
    """Given: a sweep of three trials: Adam done with two epochs' history (run to a target), SGD out of memory,
    one pending."""
    path = tmp_path / "results.sqlite"
    with Store(path) as s:
        until = {"until": "val_loss=0.49", "eval_every": 256}  # the first trial runs to a target
        keys = s.register_sweep("grid", {}, [config("adam", 32, 0) | until, config("sgd", 64, 0), config("sgd", 32, 1)])
        s.claim([keys[0]])
        s.finish(keys[0], TrialRecord(status="done", test_accuracy=0.64, test_loss=0.63, train_seconds=2.0,
                                      images_per_second=600.0, collapsed=0, learning_rate=0.001, history=HISTORY,
                                      curve=CURVE, steps_to_target=96.0))
        s.claim([keys[1]])
        s.finish(keys[1], TrialRecord(status="oom", error="ResourceExhaustedError: OOM"))
    return path


def read(run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run))
    acc.Reload()
    return acc


def test_every_trial_is_a_run_with_its_hyperparameters_scalars_and_status(store, tmp_path):
    from tensorboard.plugins.hparams import api_pb2, metadata

    # when the sweep is exported
    trials = load_trials(store, "grid")
    out = tmp_path / "tb"
    result = tensorboard_export.export(trials, out)
    # then every trial has its run, whatever its status, and the experiment has one of its own
    assert result == {"written": 3, "unchanged": 0, "runs": 3}
    runs = {t["key"]: out / tensorboard_export.run_name(t) for t in trials}
    assert all(run.is_dir() for run in runs.values()) and (out / tensorboard_export.EXPERIMENT).is_dir()
    done, oom, pending = (read(runs[t["key"]]) for t in trials)
    # and TensorBoard's reader finds the done trial's hyperparameters, its epochs and its final metrics
    content = done.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["optimizer"].string_value == "adam" and start.hparams["batch_size"].number_value == 32
    assert start.hparams["learning_rate"].number_value == pytest.approx(0.001)
    assert [(e.step, round(e.value, 4)) for e in done.Scalars("epoch/val_accuracy")] == [(1, 0.55), (2, 0.63)]
    assert [e.value for e in done.Scalars("epoch/noise_scale")] == [pytest.approx(41.5)]
    assert done.Scalars("test_accuracy")[0].value == pytest.approx(0.64)
    # and what tells trials run to a target apart: their epochs, and the steps they took to it
    assert start.hparams["epochs"].number_value == 2 and done.Scalars("steps_to_target")[0].value == 96.0
    assert start.hparams["until"].string_value == "val_loss=0.49" and start.hparams["eval_every"].number_value == 256
    # and its --eval-every curve by training images seen
    assert [(e.step, round(e.value, 4)) for e in done.Scalars("curve/val_loss")] == [(0, 0.70), (256, 0.66)]
    # and each session ends with its status: done a success, out of memory a failure, pending running
    statuses = [metadata.parse_session_end_info_plugin_data(
        acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_END_INFO_TAG]).status
        for acc in (done, oom, pending)]
    assert statuses == [api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]
    # and the experiment lists the hyperparameters with their values, and the metrics
    experiment = metadata.parse_experiment_plugin_data(
        read(out / tensorboard_export.EXPERIMENT).PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG])
    infos = {i.name: i for i in experiment.hparam_infos}
    assert list(infos["optimizer"].domain_discrete) == ["adam", "sgd"]
    assert {m.name.tag for m in experiment.metric_infos} >= {"test_accuracy", "epoch/val_accuracy", "steps_to_target"}
    assert {"epochs", "until", "eval_every"} <= set(infos)


def test_an_unchanged_store_writes_no_event_file_again_and_a_changed_trial_only_its_own(store, tmp_path):
    out = tmp_path / "tb"
    tensorboard_export.export(load_trials(store, "grid"), out)
    files = {p: p.stat().st_mtime_ns for p in out.rglob("events.out.tfevents.*")}
    # when exported again, nothing changed
    again = tensorboard_export.export(load_trials(store, "grid"), out)
    # then no event file is written
    assert again == {"written": 0, "unchanged": 3, "runs": 3}
    assert {p: p.stat().st_mtime_ns for p in out.rglob("events.out.tfevents.*")} == files
    # when the pending trial finishes, then only its run (and the experiment) is written again
    with Store(store) as s:
        key = load_trials(store, "grid")[2]["key"]
        s.claim([key])
        s.finish(key, TrialRecord(status="failed", error="ValueError: boom"))
    assert tensorboard_export.export(load_trials(store, "grid"), out)["written"] == 1
    assert not list(out.glob(".*.tmp")) and not list(out.glob(".*.old"))


@pytest.fixture
def without_tensorboard(monkeypatch) -> None:
    """Given: the tensorboard package cannot be imported (as where the extra is not installed)."""
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)


def test_without_the_tensorboard_package_a_one_line_hint_names_the_extra(without_tensorboard, tmp_path):
    with pytest.raises(CatsdogsError, match=r"pip install 'catsdogs\[tensorboard\]'"):
        tensorboard_export.export([], tmp_path / "tb")


def test_report_tensorboard_without_the_package_is_one_line_exit_1_before_any_figure(store, without_tensorboard):
    from click.testing import CliRunner

    from catsdogs.cli import cli

    result = CliRunner().invoke(cli, ["report", "--name", "grid", "--out", str(store.parent), "--tensorboard"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: {tensorboard_export.HINT}"]
    assert not (store.parent / "grid" / "figures").exists()


def test_report_tensorboard_writes_the_runs_and_says_so(store, tmp_path):
    from click.testing import CliRunner

    from catsdogs.cli import cli

    # when `report --tensorboard` runs twice on the store
    args = ["report", "--name", "grid", "--out", str(store.parent), "--tensorboard"]
    first, second = (CliRunner().invoke(cli, args) for _ in range(2))
    # then the first writes every trial, the second none, each saying where
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    folder = store.parent / "grid" / "tensorboard"
    assert f"TensorBoard: 3 trials, 3 written, 0 unchanged, in {folder}" in first.output
    assert "TensorBoard: 3 trials, 0 written, 3 unchanged" in second.output


@pytest.mark.slow
def test_tensorboard_itself_serves_every_trial_in_its_hparams_dashboard(store, tmp_path):
    import json
    import re
    import subprocess
    import sys
    import time
    import urllib.request

    # given the sweep exported, and TensorBoard started on it
    out = tmp_path / "tb"
    tensorboard_export.export(load_trials(store, "grid"), out)
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(out), "--host", "127.0.0.1",
                               "--port", "0", "--reload_interval", "1"], stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in server.stderr:
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
                break
        assert port, "TensorBoard did not say where it serves"
        request = {"experimentName": "", "startIndex": 0, "sliceSize": 100, "colParams": [],
                   "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]}
        groups, deadline = [], time.time() + 60
        while len(groups) < 3 and time.time() < deadline:  # it loads the runs in the background
            time.sleep(1)
            ask = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/session_groups",
                                         data=json.dumps(request).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
            with urllib.request.urlopen(ask, timeout=10) as reply:
                groups = json.loads(reply.read()).get("sessionGroups", [])
        ask = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/experiment",
                                     data=json.dumps({"experimentName": ""}).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-XSRF-Protected": "1"})
        with urllib.request.urlopen(ask, timeout=10) as reply:
            experiment = json.loads(reply.read())
    finally:
        server.terminate()
        server.wait(timeout=30)
    # then its experiment has the sweep's hyperparameters
    assert {"optimizer", "batch_size", "seed"} <= {h["name"] for h in experiment["hparamInfos"]}
    # then its HParams API lists every trial, each with its hyperparameters and its session's status
    by_optimizer = sorted((g["hparams"]["optimizer"], g["hparams"]["batch_size"], g["sessions"][0]["status"])
                          for g in groups)
    assert by_optimizer == [("adam", 32, "STATUS_SUCCESS"), ("sgd", 32, "STATUS_RUNNING"),
                            ("sgd", 64, "STATUS_FAILURE")]


@pytest.mark.slow
def test_sweep_tensorboard_exports_each_trial_as_it_finishes(prepared_data, tmp_path):
    from click.testing import CliRunner

    from catsdogs.cli import cli

    # given a plan of two one-epoch trials on a small prepared data set
    data_dir = prepared_data(32, (24, 8, 8))
    plan = tmp_path / "two.toml"
    plan.write_text('seeds = 1\nepochs = 1\n[grids.two]\nopt = ["adam"]\nbatch_size = [8, 16]\n')
    out = tmp_path / "out"
    # when it is swept with --tensorboard
    result = CliRunner().invoke(cli, ["sweep", "--config", str(plan), "--data-dir", str(data_dir), "--out", str(out),
                                      "--tensorboard"])
    assert result.exit_code == 0, result.output
    # then after each trial the export ran, writing what had changed: the first trial, then the second
    exports = [line for line in result.output.splitlines() if line.startswith("TensorBoard: ")]
    assert [e.split(", in ")[0] for e in exports] == ["TensorBoard: 2 trials, 2 written, 0 unchanged",
                                                       "TensorBoard: 2 trials, 1 written, 1 unchanged"]
    # and both runs end done, read back by TensorBoard's reader
    from tensorboard.plugins.hparams import api_pb2, metadata

    runs = [p for p in (out / "two" / "tensorboard").iterdir() if p.is_dir() and p.name != tensorboard_export.EXPERIMENT]
    statuses = [metadata.parse_session_end_info_plugin_data(
        read(run).PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_END_INFO_TAG]).status for run in runs]
    assert statuses == [api_pb2.STATUS_SUCCESS] * 2


@pytest.mark.slow
def test_exporting_loads_no_framework_where_tensorflow_is_installed(store, tmp_path):
    import subprocess
    import sys

    # when a fresh interpreter exports the sweep (TensorBoard's writer would import TensorFlow if let)
    code = ("import sys; from pathlib import Path; from catsdogs.analysis import tensorboard_export as t; "
            "from catsdogs.analysis.rows import load_trials; "
            f"t.export(load_trials(Path({str(store)!r}), 'grid'), Path({str(tmp_path / 'tb')!r})); "
            "print(sorted(m for m in ('tensorflow', 'jax', 'keras', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # then it wrote the runs and no framework was loaded
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert len(list((tmp_path / "tb").rglob("events.out.tfevents.*"))) == 4


def _export_from_process(store: Path, out: Path, start) -> None:
    start.wait()
    tensorboard_export.export(load_trials(store, "grid"), out)


@pytest.mark.slow
def test_exports_started_together_never_collide_and_each_run_holds_one_session(store, tmp_path):
    import multiprocessing

    # given four processes exporting the same sweep into one folder at the same moment (two
    # `report --tensorboard`, or a report beside `sweep --tensorboard`)
    out = tmp_path / "tb"
    context = multiprocessing.get_context("fork")
    start = context.Event()
    procs = [context.Process(target=_export_from_process, args=(store, out, start)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
    # then every one succeeded, each run holds one event file (its session logged once), and no
    # temporary folder is left
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    runs = [d for d in out.iterdir() if d.is_dir()]
    assert len(runs) == 4 and all(len(list(d.glob("events.out.tfevents.*"))) == 1 for d in runs)
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_a_run_left_with_two_sessions_is_written_again(store, tmp_path):
    # given an export, and a run holding a second event file (two exports of 0.17.0 raced there)
    out = tmp_path / "tb"
    tensorboard_export.export(load_trials(store, "grid"), out)
    run = next(d for d in out.iterdir() if d.is_dir() and d.name.startswith("adam"))
    (run / "events.out.tfevents.0.twice").write_bytes(next(run.glob("events.out.tfevents.*")).read_bytes())
    # when exported again, nothing changed in the store
    result = tensorboard_export.export(load_trials(store, "grid"), out)
    # then that run alone is written again, with one event file
    assert result["written"] == 1 and len(list(run.glob("events.out.tfevents.*"))) == 1


def test_a_failed_export_is_said_and_the_sweep_goes_on(store, tmp_path):
    # given `sweep --tensorboard` whose folder cannot be made (a file stands where it goes)
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "tensorboard").write_text("not a folder")
    lines: list[str] = []
    on_finished = tensorboard_export.live(True, tmp_path, "grid", lines.append)
    # when a trial finishes and the export runs
    on_finished()
    # then nothing is raised into the sweep, and one warning says how to export again
    assert len(lines) == 1 and lines[0].startswith("Warning: TensorBoard export to")
    assert "the sweep goes on" in lines[0] and "--tensorboard` exports it again" in lines[0]


def test_an_export_killed_mid_way_leaves_nothing_the_next_one_keeps(store, tmp_path):
    # given an export, and the temporary folders of one killed mid-way (kill -9: no clean-up ran)
    out = tmp_path / "tb"
    tensorboard_export.export(load_trials(store, "grid"), out)
    (out / ".adam_run.123-abcd.tmp").mkdir()
    (out / ".adam_run.123-abcd.tmp" / "events.out.tfevents.1.x").write_bytes(b"half")
    (out / ".sgd_run.123-abcd.old").mkdir()
    # when exported again
    tensorboard_export.export(load_trials(store, "grid"), out)
    # then they are gone (TensorBoard would show them as runs)
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".old"))]


def test_a_run_of_an_older_export_format_is_written_again(store, tmp_path, monkeypatch):
    # given an export made by the format before this one
    out = tmp_path / "tb"
    monkeypatch.setattr(tensorboard_export, "EXPORT_FORMAT", tensorboard_export.EXPORT_FORMAT - 1)
    tensorboard_export.export(load_trials(store, "grid"), out)
    monkeypatch.undo()
    # then this format writes every run again (to gain what it added), and the next export none
    assert tensorboard_export.export(load_trials(store, "grid"), out)["written"] == 3
    assert tensorboard_export.export(load_trials(store, "grid"), out)["written"] == 0
