"""The trial engine: long-lived workers give the results a fresh process gives, and a trial that
fails, crashes or is killed never takes another trial's result with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from catsdogs import backends
from catsdogs.manifest import require_prepared
from catsdogs.schema import TrialConfig
from catsdogs.sweep import LocalSlot, claim_order, run_sweep
from catsdogs.worker import Worker

SIZE = 32
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


def trial(data_dir: Path, **kw) -> TrialConfig:
    fields = {"optimizer": "adam", "batch_size": 8, "dataset": "standard", "seed": 0, "epochs": 2,
              "image_size": SIZE, "data": require_prepared(data_dir)["fingerprint"][kw.get("dataset", "standard")],
              "backend": backends.name()}
    return TrialConfig(**{**fields, **kw})


def outcome(record: dict) -> tuple:
    """What a trial's result is, without its timings."""
    history = [{k: v for k, v in row.items() if "seconds" not in k} for row in record["history"]]
    return record["weights_digest"], record["test_accuracy"], record["test_loss"], history, record["steps"]


def run_in_fresh_process(cfg: TrialConfig, data_dir: Path, tmp_path: Path, env: dict | None = None) -> dict:
    slot = LocalSlot(0, 1, tmp_path / "fresh", isolate=True, env=env)
    try:
        return slot.run(cfg, data_dir)
    finally:
        slot.close()


def test_a_trial_is_bit_identical_alone_or_as_a_later_trial_of_a_worker(keras_backend, data_dir, tmp_path):
    # given one trial, and a worker that first runs other trials: two of its shape (other
    # seeds, the other data set) and one of another shape (SGD)
    target = trial(data_dir, seed=2)
    before = [trial(data_dir, seed=0), trial(data_dir, optimizer="sgd", seed=2),
              trial(data_dir, seed=1, dataset="augmented")]
    slot = LocalSlot(0, 1, tmp_path / "worker")
    try:
        records = [slot.run(cfg, data_dir) for cfg in [*before, target]]
        pid = slot.worker.proc.pid
    finally:
        slot.close()
    assert all(r["status"] == "done" for r in records), [r.get("error") for r in records]
    in_worker = records[-1]
    # when the same trial runs alone in a fresh process
    alone = run_in_fresh_process(target, data_dir, tmp_path)
    # then the worker reused its compiled step for it, in one process, and the results are
    # the same to the bit: weights, test accuracy and loss, every epoch's history
    assert in_worker["step_reused"] and not alone["step_reused"] and pid
    assert outcome(in_worker) == outcome(alone)
    assert records[2]["step_reused"]  # the augmented trial reused the standard trials' step
    assert outcome(records[0]) != outcome(in_worker)  # another seed: really another trial


def test_results_are_the_same_with_the_systems_allocator(data_dir, tmp_path):
    # given the worker's BFC allocator (the default) and glibc's malloc instead
    cfg = trial(data_dir, seed=4, batch_size=16)
    bfc = run_in_fresh_process(cfg, data_dir, tmp_path / "bfc")
    system = run_in_fresh_process(cfg, data_dir, tmp_path / "sys", env={"TF_CPU_ALLOCATOR_USE_BFC": "false"})
    # then the allocator changes nothing but time
    assert outcome(bfc) == outcome(system)


def test_a_failed_trial_ends_its_worker_and_the_next_trial_gets_a_fresh_one(data_dir, tmp_path):
    slot = LocalSlot(0, 1, tmp_path)
    try:
        # given a worker that has run a trial
        assert slot.run(trial(data_dir), data_dir)["status"] == "done"
        first = slot.worker.proc.pid
        # when a trial fails in it (a batch larger than the 48 training images)
        failed = slot.run(trial(data_dir, batch_size=64), data_dir)
        # then the failure is recorded in one line, and the worker is gone
        assert failed["status"] == "failed"
        assert failed["error"].splitlines()[0] == ("CatsdogsError: batch size 64 is larger than the 48 "
                                                    "training images: not one full batch to train on")
        assert not slot.worker.alive
        # and the next trial runs in a fresh process, from scratch
        after = slot.run(trial(data_dir, seed=1), data_dir)
        assert after["status"] == "done" and not after["step_reused"]
        assert slot.worker.proc.pid != first
    finally:
        slot.close()


class KillsItsWorker(LocalSlot):
    """A slot whose worker is killed from outside (kill -9) during the bs=8 trial's first epoch."""

    def run(self, cfg, data_dir, on_epoch=None):
        if cfg.batch_size != 8:
            return super().run(cfg, data_dir, on_epoch)

        def kill(_epoch):
            os.kill(self.worker.proc.pid, signal.SIGKILL)

        return super().run(cfg, data_dir, kill)


def test_a_worker_killed_mid_trial_is_recorded_and_the_sweep_goes_on(keras_backend, data_dir, tmp_path):
    from catsdogs.store import Store

    grid = [trial(data_dir, batch_size=8, epochs=3), trial(data_dir, batch_size=16)]
    lines: list[str] = []
    # when a sweep's worker is killed from outside during its first trial
    counts = run_sweep("k", grid, data_dir, tmp_path, log=lines.append,
                       slots=lambda i, n, workdir: KillsItsWorker(i, n, workdir))
    # then that trial has a status and a one-line reason, and the next trial ran and is done
    with Store(tmp_path / "results.sqlite") as store:
        rows = {t["batch_size"]: t for t in store.trials("k")}
    killed = rows[8]
    assert killed["status"] in ("failed", "oom"), killed
    assert killed["error"].startswith("worker process killed by signal 9 (SIGKILL)")
    assert killed["test_accuracy"] is None
    assert rows[16]["status"] == "done" and counts["done"] == 1
    assert any("killed by signal 9" in line for line in lines)


def test_data_re_prepared_under_a_worker_is_noticed(tmp_path):
    from catsdogs.prepare import prepare

    def prepare_with(seed: int) -> str:
        prepare(source="synthetic", data_dir=tmp_path / "data", per_class=40, split=(24, 8, 8), size=SIZE,
                seed=seed, log=lambda *a: None, progress=False)
        return require_prepared(tmp_path / "data")["fingerprint"]["standard"]

    data = tmp_path / "data"
    old = prepare_with(0)
    slot = LocalSlot(0, 1, tmp_path / "work")
    try:
        # given a worker that has decoded the data for a trial
        assert slot.run(trial(data, seed=0), data)["status"] == "done"
        # when the data is prepared again (another choice of images) under it
        new = prepare_with(1)
        assert new != old
        # then a trial planned on the old data fails in one line, and loses nothing else
        stale = slot.run(TrialConfig("adam", 8, "standard", 1, epochs=2, image_size=SIZE, data=old), data)
        assert stale["status"] == "failed"
        assert "changed since this trial was planned" in stale["error"].splitlines()[0]
        # and a trial planned on the new data trains on the new images, not the cached ones
        fresh_cfg = TrialConfig("adam", 8, "standard", 1, epochs=2, image_size=SIZE, data=new)
        in_worker = slot.run(trial(data, seed=0), data)
        assert in_worker["status"] == "done"
        again = slot.run(fresh_cfg, data)
    finally:
        slot.close()
    alone = run_in_fresh_process(fresh_cfg, data, tmp_path)
    assert again["step_reused"] and outcome(again) == outcome(alone)


def test_a_worker_that_cannot_start_gives_a_failed_record(tmp_path):
    # given a worker whose process dies before it is ready (an unknown backend module)
    worker = Worker(tmp_path / "w.log", env={"PYTHONPATH": str(tmp_path / "nothing"),
                                             "KERAS_BACKEND": "nonesuch"})
    # when a task is sent to it
    record = worker.run({"kind": "peak", "precision": "float32"})
    # then the task has a status and the reason, never an exception
    assert record["status"] == "failed"
    assert record["error"].startswith("worker process exited with code 1 without a result")


def test_a_slot_claims_cached_shapes_first_within_the_lowest_seed(data_dir):
    a0, b0, a1, b1 = (trial(data_dir, optimizer=o, seed=s) for s in (0, 1) for o in ("adam", "sgd"))
    grid = [a0, b0, a1, b1]
    by_key = {c.key(): c for c in grid}
    keys = [c.key() for c in grid]
    # given a worker that holds SGD's compiled step, then one that holds nothing
    sgd = {repr(b0.shape())}
    # then seed 0 comes first either way, and within it the shape the worker holds
    assert claim_order(keys, by_key, sgd) == [b0.key(), a0.key(), b1.key(), a1.key()]
    assert claim_order(keys, by_key, set()) == keys
