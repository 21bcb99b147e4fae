"""The prober: workers reused while the batch size grows, fresh ones near the limit, spares importing
beside the probes, out-of-memory answered by a fresh worker (or, JAX on a GPU, in place)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fakes import FakeWorker, GpuWorker

from catsdogs.messages import ProbeTask
from catsdogs.runtime import skipped_imports

SIZE = 64


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (64 px, 24 training images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


@pytest.fixture
def fake_workers(monkeypatch):
    from catsdogs.measure import prober

    monkeypatch.setattr(prober, "Worker", FakeWorker)
    monkeypatch.setattr(prober, "visible_gpus", lambda: [])  # the CPU's prober, on any machine
    FakeWorker.started = []
    return FakeWorker


def probe_task(b: int) -> ProbeTask:
    return ProbeTask(b, "data", "adam", "standard", "float32", steps=1, warmup=0)


def test_probes_below_the_fresh_threshold_share_a_worker_and_those_above_get_their_own(fake_workers, tmp_path):
    from catsdogs.measure.prober import Prober

    # given a prober told that probes of 60 and above need a fresh worker
    with Prober(tmp_path, fresh_from=60) as prober:
        # when it probes 8, 16, 32, then 64 and 80
        records = [prober.run(probe_task(b)) for b in (8, 16, 32, 64, 80)]
    # then the small ones ran in one worker, each large one in a worker of its own
    assert [r.worker for r in records] == ["fresh", "reused", "reused", "fresh", "fresh"]
    assert [w.tasks for w in fake_workers.started if w.tasks] == [3, 1, 1]


def test_the_live_workers_resident_set_is_read_on_the_cpu_only_and_never_under_isolate(fake_workers, tmp_path):

    from catsdogs.host import proc_status_kb
    from catsdogs.measure import prober as prober_module

    # given a prober whose live worker is this process (its resident set readable), on the CPU
    with prober_module.Prober(tmp_path) as prober:
        assert prober.resident_mb() is None  # no worker yet
        prober.run(probe_task(8))
        prober.worker.proc = type("Proc", (), {"pid": os.getpid()})()
        # then it reads that process's resident set, in MiB
        held = prober.resident_mb()
        assert held == pytest.approx(proc_status_kb("VmRSS") / 1024, rel=0.2)
        # and on a GPU, whose memory that is not, it says nothing; nor once the worker has ended
        prober.worker.device = "gpu"
        assert prober.resident_mb() is None
        prober.worker.device, prober.worker.alive = "cpu", False
        assert prober.resident_mb() is None
    # and under isolate, where no worker is taken for more, nothing either
    with prober_module.Prober(tmp_path, isolate=True) as prober:
        prober.run(probe_task(8))
        prober.worker.proc = type("Proc", (), {"pid": os.getpid()})()
        assert prober.resident_mb() is None


def test_on_the_cpu_the_next_fresh_worker_imports_beside_the_probes_and_stops_while_their_steps_are_timed(
        fake_workers, tmp_path, monkeypatch):
    from catsdogs.measure import prober as prober_module

    # given a prober on the CPU that needs a fresh worker for every probe, in an environment that
    # says nothing of the optional imports (the suite's says to skip them: conftest.py)
    monkeypatch.delenv(skipped_imports.ENV, raising=False)
    with prober_module.Prober(tmp_path, isolate=True) as prober:
        for b in (8, 16, 32):
            prober.run(probe_task(b))
        # then each probe's worker was the spare launched when the one before took its own, and
        # the last spare ended unused with the prober
        assert [w.tasks for w in fake_workers.started] == [1, 1, 1, 0]
        spare = prober.spare
        # and each spare, still importing while the probe before it ran, was paused for the timed
        # steps and let go after: nothing ran beside a probe's timed steps
        assert [w.pauses[:1] for w in fake_workers.started] == [[], [True], [True], [True]]
        assert not any(w.paused for w in fake_workers.started)
        assert [w.beside_timing for w in fake_workers.started[:3]] == [[], [], []]
    assert spare is fake_workers.started[3] and not spare.alive
    # and every CPU worker imports what its framework tries, as the user's training would: a
    # probe's resident memory is the measurement
    assert {w.env[skipped_imports.ENV] for w in fake_workers.started} == {"0"}
    # unless the environment says to skip them (ENV=1: a training process that imports none)
    monkeypatch.setenv(skipped_imports.ENV, "1")
    fake_workers.started = []
    with prober_module.Prober(tmp_path) as prober:
        prober.run(probe_task(8))
    assert [w.env.get(skipped_imports.ENV) for w in fake_workers.started] == [None]  # (it inherits the 1)
    # while on a GPU, where a started framework may hold the device's memory, no spare is started
    fake_workers.started = []
    monkeypatch.setattr(prober_module, "visible_gpus", lambda: ["0"])
    with prober_module.Prober(tmp_path, isolate=True) as prober:
        for b in (8, 16):
            prober.run(probe_task(b))
    assert [w.tasks for w in fake_workers.started] == [1, 1]


@pytest.mark.slow
def test_a_spare_importing_beside_a_real_probe_is_stopped_for_exactly_its_timed_steps(data_dir, tmp_path):
    from catsdogs.measure.prober import Prober

    # given a prober that knows a limit lies ahead (so a fresh worker launches the next one's),
    # whose worker ran a probe, and a spare launched beside it still importing
    with Prober(tmp_path, fresh_from=10_000) as prober:
        prober.run(ProbeTask(1, str(data_dir), "sgd", "standard", "float32", steps=2, warmup=1))
        spare = prober.spare
        seen = []  # the spare's state (/proc/PID/stat) as the worker says its timed steps begin and end
        spare.pause = lambda paused, pause=spare.pause: (
            pause(paused), seen.append((paused, _state(spare.proc.pid, settled="T" if paused else "RS"))))
        # when the next probe runs in the worker
        record = prober.run(ProbeTask(8, str(data_dir), "sgd", "standard", "float32", steps=2, warmup=1))
        # then the spare was stopped as the timed steps began, and let go on when they ended
        assert record.status == "done", record.error
        assert seen[0] == (True, "T")  # stopped
        assert seen[1][0] is False and seen[1][1] in ("R", "S")  # running, or sleeping on its own
        assert _state(spare.proc.pid) in ("R", "S")


def _state(pid: int, settled: str = "", within: float = 2.0) -> str:
    """The process's state letter (/proc/PID/stat); with `settled`, once it is one of those letters
    or `within` seconds have passed (a signal takes effect soon after kill(), not at once)."""
    deadline = time.monotonic() + within
    while True:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        if not settled or state in settled or time.monotonic() > deadline:
            return state
        time.sleep(0.005)


def test_a_spare_is_launched_only_where_more_fresh_workers_are_to_come(fake_workers, tmp_path):
    from catsdogs.measure.prober import Prober

    # given a prober on the CPU that knows no limit yet, nor isolates its probes
    with Prober(tmp_path) as prober:
        # when its worker runs the way up, and one fresh probe follows (a retime's, say)
        for b in (1, 8, 16):
            prober.run(probe_task(b))
        prober.run(probe_task(4), fresh=True)
        # then no spare was launched: none would have been taken
        assert [w.tasks for w in fake_workers.started] == [3, 1] and prober.spare is None
        # while once a limit is predicted, each fresh probe above it launches the next one's
        prober.fresh_from = 60
        prober.run(probe_task(64))
        assert len(fake_workers.started) == 4 and prober.spare is fake_workers.started[3]


def test_a_probe_aside_leaves_the_current_worker_for_the_way_up_and_the_last_fresh_worker_starts_no_spare(
        fake_workers, tmp_path):
    from catsdogs.measure.prober import Prober

    # given a prober on the CPU whose worker ran the calibration, batch size 1
    with Prober(tmp_path) as prober:
        prober.run(probe_task(1))
        calibration = prober.worker
        # when a user's model's prediction probes 16 aside, then the search goes up from 8
        aside = prober.run_aside(probe_task(16))
        up = [prober.run(probe_task(b)) for b in (8, 16)]
        # then 16 ran in a fresh worker of its own, ended after it, and 8 and 16 in the
        # calibration's worker
        assert aside.worker == "fresh" and [r.worker for r in up] == ["reused", "reused"]
        assert prober.worker is calibration and calibration.tasks == 3
        assert not fake_workers.started[1].alive and fake_workers.started[1].tasks == 1
        # and a fresh worker that asks for no spare (the retime's: the last a search needs) starts alone
        prober.run(probe_task(4), fresh=True, spare=False)
        assert prober.worker is fake_workers.started[2] and prober.spare is None
        assert len(fake_workers.started) == 3


def test_the_calibrations_worker_and_a_probe_asides_are_launched_together_and_taken_in_turn(fake_workers, tmp_path,
                                                                                          monkeypatch):
    from catsdogs.measure import prober as prober_module

    # given a prober on the CPU asked for the two fresh workers the probes before a user's model's
    # search take (memory_prediction.fresh_before_search)
    with prober_module.Prober(tmp_path) as prober:
        prober.prestart(2)
        prober.prestart(2)  # (asked again: none more)
        first, second = fake_workers.started
        # when the calibration runs, then the prediction's probe aside
        prober.run(probe_task(1))
        prober.run_aside(probe_task(16))
        # then the calibration took the first, the probe aside the second, and none more was launched
        assert prober.worker is first and first.tasks == 1 and second.tasks == 1 and not second.alive
        assert len(fake_workers.started) == 2 and prober.spare is None
        # and the second, still importing while the calibration's steps were timed, was paused for them
        assert second.pauses[:2] == [True, False] and not second.paused
    # while on a GPU only one is launched ahead: two started frameworks would share its memory
    fake_workers.started = []
    monkeypatch.setattr(prober_module, "visible_gpus", lambda: ["0"])
    with prober_module.Prober(tmp_path) as prober:
        prober.prestart(2)
        assert len(fake_workers.started) == 1


def test_out_of_memory_in_a_reused_worker_is_asked_again_of_a_fresh_one(fake_workers, tmp_path):
    from catsdogs.measure.prober import Prober

    # given a worker that ran 8, 16 and 32 and so holds 15 MiB more than a fresh one
    with Prober(tmp_path) as prober:
        for b in (8, 16, 32):
            prober.run(probe_task(b))
        # when 80 does not fit there (10 + 80 + 15 > 100) but would in a fresh worker
        record = prober.run(probe_task(80))
        # then the fresh worker's answer is the one recorded, marked as retried
        assert record.status == "done" and record.peak_memory_mb == 90 and record.worker == "retried"
        # and a reused worker's out of memory that a fresh one confirms stays out of memory
        again = prober.run(probe_task(95))
        assert again.status == "oom" and again.worker == "retried"
    # while out of memory in a fresh worker is final: no second worker is started for it
    fake_workers.started = []
    with Prober(tmp_path) as prober:
        final = prober.run(probe_task(95))
    assert final.status == "oom" and final.worker == "fresh" and [w.tasks for w in fake_workers.started] == [1]


def test_jax_on_a_gpu_probes_in_one_worker_until_an_out_of_memory_leaves_something_behind(fake_workers, tmp_path,
                                                                                        monkeypatch):
    from catsdogs.measure import prober as prober_module

    monkeypatch.setattr(prober_module, "Worker", GpuWorker)
    monkeypatch.setattr(prober_module, "visible_gpus", lambda: ["0"])
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    GpuWorker.residue = 0.0
    # given JAX on a GPU, with fresh workers asked for from 60 up (as a prediction would)
    with prober_module.Prober(tmp_path, fresh_from=60) as prober:
        assert prober.in_place
        # when the probes go up past the limit (90) and back down, the device recovering each time
        records = [prober.run(probe_task(b)) for b in (8, 64, 95, 80, 92, 85)]
        # then every probe ran in the one worker, an out-of-memory included and not asked again
        assert [r.status for r in records] == ["done", "done", "oom", "done", "oom", "done"]
        assert [r.worker for r in records] == ["fresh"] + ["reused"] * 5
        assert len(fake_workers.started) == 1
        # and when an out-of-memory leaves 50 MiB behind, the worker ends and fresh ones come back
        GpuWorker.residue = 50.0
        kept = prober.run(probe_task(97))
        assert kept.status == "oom" and not prober.in_place and kept.worker == "retried"
        later = prober.run(probe_task(70))
        assert later.worker == "fresh" and len(fake_workers.started) == 3  # the retry's, and this one's
