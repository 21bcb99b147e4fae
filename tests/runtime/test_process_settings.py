"""Determinism and TF32 as recorded choices: part of a trial's identity only off their defaults,
set per worker process before its framework starts, checked by the engine, kept apart by the
slots, named in figures. On a CPU neither changes what trains, so the slow test checks that the
setting reaches the worker and the record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs import host
from catsdogs.analysis.summary import summarize
from catsdogs.analysis.tables import setting
from catsdogs.cli import cli
from catsdogs.errors import CatsdogsError
from catsdogs.runtime import backends
from catsdogs.schema import Status, TrialConfig


def test_the_settings_are_in_a_trials_key_only_off_their_defaults():
    base = TrialConfig("adam", 32, "standard", 0)
    assert TrialConfig("adam", 32, "standard", 0, deterministic=True, tf32=None).key() == base.key()
    others = {TrialConfig("adam", 32, "standard", 0, deterministic=False).key(),
              TrialConfig("adam", 32, "standard", 0, tf32=True).key(),
              TrialConfig("adam", 32, "standard", 0, tf32=False).key()}
    assert len(others) == 3 and base.key() not in others
    # and a trial of other settings is another cell and another compiled step
    off = TrialConfig("adam", 32, "standard", 0, deterministic=False)
    assert off.cell() != base.cell() and off.shape() != base.shape()


@pytest.mark.parametrize("deterministic, tf32", [(True, None), (False, None), (True, True), (False, False)])
def test_a_workers_environment_gives_back_its_settings(deterministic, tf32):
    env = backends.process_env_for(deterministic, tf32)
    assert backends.process_settings(env) == {"deterministic": deterministic, "tf32": tf32}
    assert backends.process_settings({}) == {"deterministic": True, "tf32": None}  # nothing set: the defaults


def test_a_trial_planned_for_other_settings_is_refused_in_one_line():
    cfg = TrialConfig("adam", 32, "standard", 0, deterministic=False)
    with pytest.raises(CatsdogsError) as e:
        backends.check_settings(cfg, {"deterministic": True, "tf32": None})
    assert str(e.value) == ("this trial was planned for non-deterministic, TF32 default, and this worker runs "
                            "deterministic, TF32 default: a worker of its own settings must run it")
    backends.check_settings(cfg, {"deterministic": False, "tf32": None})  # its own: no error


def test_xlas_deterministic_flag_is_set_exactly_when_deterministic(monkeypatch):
    from catsdogs.runtime.backends import jax_process

    # given a parent whose XLA_FLAGS already hold the flag (inherited) and a flag of the user's
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true")
    # then a non-deterministic worker gets the user's flag alone, a deterministic one both, once
    assert jax_process._xla_flags(deterministic=False) == "--xla_dump_to=/tmp/x"
    both = jax_process._xla_flags(deterministic=True).split()
    assert sorted(both) == ["--xla_dump_to=/tmp/x", "--xla_gpu_deterministic_ops=true"]
    monkeypatch.setenv("XLA_FLAGS", "")
    assert jax_process._xla_flags(deterministic=True) == "--xla_gpu_deterministic_ops=true"
    # and a user's own value of that flag gives way to the trial's
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")
    assert jax_process._xla_flags(deterministic=True) == "--xla_gpu_deterministic_ops=true"


def test_a_jax_worker_on_a_cpu_host_starts_with_mallocs_blocks_in_huge_pages(monkeypatch):
    from catsdogs.runtime.backends import jax_process

    # given a host without an NVIDIA device and no malloc setting of the user's
    monkeypatch.setattr(host, "nvidia_devices", lambda: False)
    for key in host.malloc_vars(os.environ):
        monkeypatch.delenv(key)
    # then a JAX worker starts with glibc's malloc in transparent huge pages, and nothing else of malloc's
    env = jax_process.process_env()
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert not [k for k in env if k.startswith("MALLOC_")]  # (0.36.0's one heap: its holes moved the peaks)
    # and on a GPU host (the allocations there are the device's) it starts with glibc's defaults
    monkeypatch.setattr(host, "nvidia_devices", lambda: True)
    assert not set(jax_process.process_env()) & set(jax_process.MALLOC_ENV)


@pytest.mark.parametrize("users", [{"MALLOC_ARENA_MAX": "4"}, {"MALLOC_CHECK_": "3"},
                                   {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}])
def test_a_users_malloc_setting_is_left_whole(users):
    from catsdogs.runtime.backends import jax_process

    # given any malloc setting of the user's, then none of ours is mixed in with it
    assert jax_process.malloc_env(users) == {}


@pytest.mark.parametrize(("users", "started"), [
    ("glibc.pthread.rseq=0", "glibc.pthread.rseq=0:glibc.malloc.hugetlb=1"), ("", "glibc.malloc.hugetlb=1")])
def test_a_tunable_of_another_part_of_glibc_is_kept_beside_ours(users, started):
    from catsdogs.runtime.backends import jax_process

    # given the user's GLIBC_TUNABLES with no malloc tunable (or an empty one)
    # when a JAX worker's malloc settings are made
    env = jax_process.malloc_env({"GLIBC_TUNABLES": users})
    # then the user's tunables are kept, ours beside them
    assert env == {"GLIBC_TUNABLES": started}


def test_the_malloc_settings_recorded_are_those_the_process_started_with_not_set_after(monkeypatch):
    # given this process's environment as it started, and a malloc variable set after the start
    # (as a Ray actor's environment was, which glibc never read)
    started = host.malloc_settings(host.start_environ())
    monkeypatch.setenv("MALLOC_ARENA_MAX", "3")
    # then the settings recorded are still the start's, and the variable set late is not among them
    assert host.malloc_settings() == started
    assert "MALLOC_ARENA_MAX=3" not in (host.malloc_settings() or "")
    # while a given environment is read as given
    assert host.malloc_settings({"MALLOC_ARENA_MAX": "3", "PATH": "/bin"}) == "MALLOC_ARENA_MAX=3"


def test_a_record_with_the_huge_page_tunable_says_the_kernels_huge_page_mode(monkeypatch, tmp_path):
    from catsdogs.runtime.backends import jax_process

    class Backend:  # what host.environment asks of a backend
        def versions(self):
            return {}

        def device_description(self):
            return "CPU"

        def running_settings(self):
            return {}

    # given the kernel's transparent huge pages in each of its modes
    mode = tmp_path / "enabled"
    for text, word in [("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
                       ("always madvise [never]\n", "never")]:
        mode.write_text(text)
        # when the mode is read, then it is the word in brackets
        assert host.huge_pages(mode) == word
    # and a kernel that does not say gives None
    assert host.huge_pages(tmp_path / "absent") is None
    # given a process started with the tunable, on a kernel whose huge pages are off
    mode.write_text("always madvise [never]\n")
    monkeypatch.setattr(host, "HUGE_PAGES", mode)
    monkeypatch.setattr(host, "start_environ", lambda: dict(jax_process.MALLOC_ENV))
    # when its environment is recorded
    env = host.environment(Backend())
    # then the record says the tunable, the mode (under `never` the tunable did nothing) and glibc's version
    assert env["malloc"] == "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" and env["huge_pages"] == "never"
    assert env.get("glibc") == (host.platform.libc_ver()[1] or None)
    # while one started without it (a user's own malloc setting) records neither
    monkeypatch.setattr(host, "start_environ", lambda: {"MALLOC_ARENA_MAX": "2"})
    assert not {"huge_pages", "glibc"} & set(host.environment(Backend()))


@pytest.mark.slow
def test_the_start_environment_is_read_from_proc_and_holds_what_the_process_was_started_with():
    # given the environment a child process is started with
    code = "from catsdogs import host; print(host.start_environ().get('CATSDOGS_PROBE_VAR'))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CATSDOGS_PROBE_VAR": "at-start"},
                         capture_output=True, text=True, check=True).stdout.strip()
    # then the child reads it back as its start environment
    assert out == "at-start"


class RecordingWorker:
    """Stands in for a worker process: notes the settings each one was started with."""

    started: list[dict] = []

    device = "cpu"  # as a worker on the CPU says it is

    def __init__(self, log_path, env=None, digests=None):
        self.env, self.alive, self.tasks = env or {}, False, 0
        RecordingWorker.started.append(backends.process_settings(self.env))

    def run(self, task, on_progress=None, memory_cap_bytes=None):
        from catsdogs.messages import TrialRecord

        self.alive, self.tasks = True, self.tasks + 1
        backends.check_settings(task.config, backends.process_settings(self.env))  # as the engine does
        return TrialRecord(status=Status.DONE)

    def close(self):
        self.alive = False


def test_a_slot_keeps_one_workers_settings_and_starts_another_for_others(monkeypatch, tmp_path):
    from catsdogs.training import local_slot

    monkeypatch.setattr(local_slot, "Worker", RecordingWorker)
    RecordingWorker.started = []
    slot = local_slot.LocalSlot(0, 1, tmp_path)
    on = TrialConfig("adam", 8, "standard", 0)
    off = TrialConfig("adam", 8, "standard", 1, deterministic=False)
    # when trials of both settings run in one slot, in this order
    records = [slot.run(cfg, tmp_path) for cfg in (on, on, off, off, on)]
    # then every one ran in a worker of its own settings, and a worker served its setting's run
    assert all(r.status == Status.DONE for r in records)
    assert [s["deterministic"] for s in RecordingWorker.started] == [True, False, True]


def _row(deterministic: bool, tf32=None, seed: int = 0) -> dict:
    from dataclasses import asdict

    cfg = TrialConfig("adam", 32, "standard", seed, image_size=64, deterministic=deterministic, tf32=tf32)
    stored = {**asdict(cfg), "deterministic": int(deterministic), "tf32": None if tf32 is None else int(tf32)}
    return {"key": cfg.key(), "config": asdict(cfg), "status": Status.DONE, "test_accuracy": 0.8, **stored}


def test_figures_name_the_settings_off_their_defaults_and_never_mix_them():
    # given a sweep run without determinism and with TF32 forbidden
    off = [_row(False, False, seed) for seed in range(2)]
    assert setting(off) == "5 epochs, 64 px, Keras on TensorFlow, non-deterministic, TF32 off"
    assert setting([_row(True)]) == "5 epochs, 64 px, Keras on TensorFlow"
    # and one that mixes both settings: two series, never one cell
    figure = summarize([*off, *(_row(True, None, seed) for seed in range(2))])["figures"][0]
    assert sorted(r["series"] for r in figure["rows"]) == ["Adam, deterministic, TF32 default",
                                                          "Adam, non-deterministic, TF32 off"]


def test_the_sweep_takes_the_settings_from_its_options_and_from_a_plan(prepared_data, tmp_path):
    data = prepared_data(32)
    base = ["sweep", "--data-dir", str(data), "--out", str(tmp_path), "--opt", "adam", "--batch-size", "8",
            "--seeds", "1", "--dry-run"]

    def keys(*extra):
        result = CliRunner().invoke(cli, [*base, *extra])
        assert result.exit_code == 0, result.output
        return result.output.split()[0]

    default = keys()
    assert keys("--deterministic") == default
    assert len({default, keys("--no-deterministic"), keys("--tf32"), keys("--no-tf32")}) == 4
    plan = tmp_path / "p.toml"
    plan.write_text('deterministic = false\n[grids.g]\nopt = ["adam"]\nbatch_size = [8]\n')
    assert keys("--config", str(plan)) == keys("--no-deterministic")
    bad = tmp_path / "bad.toml"
    bad.write_text('tf32 = "yes"\n[grids.g]\nopt = ["adam"]\nbatch_size = [8]\n')
    result = CliRunner().invoke(cli, [*base, "--config", str(bad)])
    assert result.exit_code == 2 and "tf32: must be true or false" in result.output


@pytest.mark.slow
def test_the_settings_reach_the_worker_and_the_record_on_each_backend(keras_backend, prepared_data, tmp_path,
                                                                      monkeypatch):
    from catsdogs.runtime.backends import jax_process
    from catsdogs.store import Store

    for key in host.malloc_vars(os.environ):
        monkeypatch.delenv(key)  # (no malloc setting of the user's: the worker's are catsdogs's own)

    data = prepared_data(32)
    # given a sweep of two trials, one at the defaults and one without determinism and TF32
    args = ["sweep", "--data-dir", str(data), "--out", str(tmp_path), "--opt", "adam", "--batch-size", "8",
            "--seeds", "1", "--epochs", "1", "--name"]
    assert CliRunner().invoke(cli, [*args, "plain"]).exit_code == 0
    result = CliRunner().invoke(cli, [*args, "off", "--no-deterministic", "--no-tf32"])
    assert result.exit_code == 0, result.output
    with Store(Path(tmp_path) / "results.sqlite") as store:
        plain, off = store.trials("plain")[0], store.trials("off")[0]
    # then each worker ran with the trial's settings, as the framework itself reports them
    assert plain["status"] == off["status"] == Status.DONE
    assert (plain["env"]["deterministic"], plain["env"]["tf32"]) == (True, None)
    assert (off["env"]["deterministic"], off["env"]["tf32"]) == (False, False)
    assert (off["deterministic"], off["tf32"]) == (0, 0) and plain["key"] != off["key"]
    # and a JAX worker on a CPU host started with malloc's blocks in huge pages, as its record says
    mine = host.malloc_settings(jax_process.MALLOC_ENV) if keras_backend == "jax" and not host.nvidia_devices() else None
    assert plain["env"].get("malloc") == off["env"].get("malloc") == mine
    # and says whether its huge pages could take: the kernel's mode beside the tunable
    assert plain["env"].get("huge_pages") == (host.huge_pages() if mine else None)


@pytest.mark.slow
def test_a_second_jax_run_into_a_fresh_out_loads_its_steps_from_the_compile_cache(prepared_data, tmp_path,
                                                                                  monkeypatch):
    pytest.importorskip("jax")
    from catsdogs.store import Store

    data = prepared_data(32)
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv(backends.COMPILE_CACHE_ENV, str(tmp_path / "cache"))

    def compiles(out: str, *extra) -> tuple[int, int]:
        args = ["sweep", "--data-dir", str(data), "--out", str(tmp_path / out), "--opt", "adam", "--batch-size",
                "8", "--seeds", "1", "--epochs", "1", *extra]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        with Store(tmp_path / out / "results.sqlite") as store:
            (row,) = store.trials("sweep")
        return row["compiles"], row["compile_cache_hits"]

    # given a first run, which compiles its steps and fills the cache
    cold, _ = compiles("first")
    assert cold > 0 and any((tmp_path / "cache").iterdir())
    # when the same sweep runs into a fresh --out: it trains again, and loads what it compiled
    warm, hits = compiles("second")
    assert 0 <= warm <= 0.1 * cold and hits > 0  # compilations are compile events less loads: never below 0
    # and with the cache off it compiles everything again
    off, none = compiles("third", "--no-compile-cache")
    assert off >= cold and none == 0


@pytest.mark.slow
def test_a_jax_started_before_catsdogs_still_keeps_tensorflow_out(tmp_path):
    # given a Python whose start starts JAX (a sitecustomize), before catsdogs can set it up
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import jax\njax.devices()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()]), "KERAS_BACKEND": "jax"}
    # when a worker's start runs there, then importing TensorFlow fails as where it is not installed
    code = ("from catsdogs.runtime.backends import jax_process\n"
            "assert jax_process.backend_started()\n"
            "jax_process.start()\n"
            "try:\n    import tensorflow\nexcept ModuleNotFoundError as e:\n    print('kept out:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "kept out: No module named 'tensorflow' (catsdogs runs on JAX)" in result.stdout


@pytest.mark.slow
def test_a_framework_started_before_catsdogs_stops_the_sweep_once_and_records_no_failure(prepared_data, tmp_path):
    import os
    import sqlite3
    import subprocess
    import sys

    # given a Python whose start starts JAX (a sitecustomize), before catsdogs can set its flags
    # (JAX imported only takes them: XLA reads them as its backend starts)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import jax\njax.devices()\n")
    env = {**os.environ, "PYTHONPATH": str(site), "KERAS_BACKEND": "jax"}
    out = tmp_path / "out"
    # when a deterministic sweep of several trials runs there
    result = subprocess.run([sys.executable, "-m", "catsdogs", "sweep", "--data-dir", str(prepared_data(32)),
                             "--out", str(out), "--opt", "adam", "sgd", "--batch-size", "8", "--epochs", "1"],
                            env=env, capture_output=True, text=True, timeout=300)
    # then it stops at once, saying why and the way out in one line, and no trial is recorded failed
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.stdout + result.stderr
    assert "runs non-deterministic" in errors[0] and "jax was already imported" in errors[0]
    assert "--no-deterministic" in errors[0]
    with sqlite3.connect(out / "results.sqlite") as db:
        assert db.execute("SELECT status, COUNT(*) FROM trials GROUP BY status").fetchall() == [("pending", 6)]
    db.close()


@pytest.mark.slow
def test_ctrl_c_while_a_worker_starts_ends_it_at_once(tmp_path, monkeypatch):
    from catsdogs.runtime import worker as worker_module

    # given a worker whose parent is interrupted while it waits for the worker's `ready`
    w = worker_module.Worker(tmp_path / "w.log")
    started = []

    def interrupted(self, *kinds, on_message=None):
        started.append(self.proc.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(worker_module.Worker, "_expect", interrupted)
    # when it starts, then the interruption goes on up, and the worker process is already gone
    with pytest.raises(KeyboardInterrupt):
        w.start()
    assert started and w.proc.poll() is not None


def test_the_versions_are_read_once_a_process_and_each_caller_gets_its_own_copy(monkeypatch):
    # given the versions read once (a race's every wave records them)
    first = host.versions()
    # when a caller changes its copy, and the package metadata can no longer be read
    first["keras"] = "changed by a caller"
    monkeypatch.setattr(host.metadata, "version", lambda pkg: (_ for _ in ()).throw(AssertionError("read again")))
    # then the next caller gets the versions as read, without reading them again
    again = host.versions()
    assert again["catsdogs"] == first["catsdogs"] and again.get("keras") != "changed by a caller"
