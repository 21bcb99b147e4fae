"""The trial engine: long-lived workers give the results a fresh process gives, and a trial that
fails, crashes or is killed never takes another trial's result with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from catsdogs.host import oom_kills
from catsdogs.manifest import require_prepared
from catsdogs.messages import PeakTask, TrialTask
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker
from catsdogs.schema import Status, TrialConfig
from catsdogs.store import Store
from catsdogs.training.local_slot import LocalSlot
from catsdogs.training.sweep import SweepSettings, claim_order, run_sweep

SIZE = 32
ALONE: dict[str, object] = {}  # a trial's record alone in a fresh worker, by key: made once, compared often


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


def trial(data_dir: Path | None, **kw) -> TrialConfig:
    fingerprint = require_prepared(data_dir)["fingerprint"][kw.get("dataset", "standard")] if data_dir else "f"
    fields = {"optimizer": "adam", "batch_size": 8, "dataset": "standard", "seed": 0, "epochs": 2,
              "image_size": SIZE, "data": fingerprint, "backend": backends.name()}
    return TrialConfig(**{**fields, **kw})


def outcome(record) -> tuple:
    """What a trial's result is, without its timings."""
    history = [{k: v for k, v in row.items() if "seconds" not in k} for row in record.history]
    return record.weights_digest, record.test_accuracy, record.test_loss, history, record.steps


def run_in_fresh_process(cfg: TrialConfig, data_dir: Path, workdir: Path, env: dict | None = None):
    slot = LocalSlot(0, 1, workdir, isolate=True, env=env)
    try:
        return slot.run(cfg, data_dir)
    finally:
        slot.close()


def alone(cfg: TrialConfig, data_dir: Path, workdir: Path):
    """The trial alone in a fresh worker (with the worker's allocator), once per session."""
    if cfg.key() not in ALONE:
        ALONE[cfg.key()] = run_in_fresh_process(cfg, data_dir, workdir / "alone")
    return ALONE[cfg.key()]


def test_a_slot_claims_cached_shapes_first_within_the_lowest_seed():
    a0, b0, a1, b1 = (trial(None, optimizer=o, seed=s) for s in (0, 1) for o in ("adam", "sgd"))
    grid = [a0, b0, a1, b1]
    by_key = {c.key(): c for c in grid}
    keys = [c.key() for c in grid]
    # given a worker that holds SGD's compiled step, then one that holds nothing
    sgd = {repr(b0.shape())}
    # then seed 0 comes first either way, and within it the shape the worker holds
    assert claim_order(keys, by_key, sgd) == [b0.key(), a0.key(), b1.key(), a1.key()]
    assert claim_order(keys, by_key, set()) == keys
    # and so with the shapes made once for the sweep, as its slots claim
    shape_of = {k: repr(c.shape()) for k, c in by_key.items()}
    assert claim_order(keys, by_key, sgd, shape_of) == [b0.key(), a0.key(), b1.key(), a1.key()]


def test_the_digest_is_every_weights_bytes_hashed_in_order_as_before(monkeypatch):
    import hashlib
    import threading

    import keras
    import numpy as np

    from catsdogs.training.engine import start_weights_digest, weights_digest
    from catsdogs.training.model import build_model

    # given a model with weights of its own
    keras.utils.set_random_seed(5)
    model = build_model(SIZE)
    # when it is digested off the critical path
    pending = start_weights_digest(model)
    # then the value is catsdogs' digest of old: BLAKE2b-128 of each weight's bytes, in order
    old = hashlib.blake2b(digest_size=16)
    for w in model.weights:
        old.update(keras.ops.convert_to_numpy(w).tobytes())
    assert pending() == weights_digest(model) == old.hexdigest()
    # and weights changed after it started, before its thread reads them, do not change it: it
    # digests the values it was given, not the variables
    before = weights_digest(model)
    assigned = threading.Event()
    to_numpy = keras.ops.convert_to_numpy
    monkeypatch.setattr(keras.ops, "convert_to_numpy", lambda x: (assigned.wait(10), to_numpy(x))[1])
    pending = start_weights_digest(model)
    model.weights[-1].assign(np.ones(model.weights[-1].shape, "float32"))
    assigned.set()
    assert pending() == before
    monkeypatch.undo()
    assert weights_digest(model) != before


# --- the same results, whatever process runs them -----------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("engine-alone")
def test_a_trial_is_bit_identical_alone_or_as_a_later_trial_of_a_worker(keras_backend, data_dir, tmp_path):
    # given one trial, and a worker that first runs other trials: two of its shape (another seed
    # at another learning rate, which builds the step; the other data set) and one of another
    # shape (SGD)
    target = trial(data_dir, seed=2)
    before = [trial(data_dir, seed=0, lr=0.003), trial(data_dir, optimizer="sgd", seed=2),
              trial(data_dir, seed=1, dataset="augmented")]
    slot = LocalSlot(0, 1, tmp_path / "worker")
    try:
        records = [slot.run(cfg, data_dir) for cfg in [*before, target]]
    finally:
        slot.close()
    assert all(r.status == Status.DONE for r in records), [r.error for r in records]
    in_worker = records[-1]
    # when the same trial runs alone in a fresh process
    first = alone(target, data_dir, tmp_path)
    # then the worker reused its compiled step for it, and the results are the same to the bit:
    # weights, test accuracy and loss, every epoch's history
    assert in_worker.step_reused and not first.step_reused
    assert outcome(in_worker) == outcome(first)
    assert records[2].step_reused  # the augmented trial reused the standard trials' step
    assert target.shape() == before[0].shape()  # the rate is no part of the step, set at its reset
    assert outcome(records[0]) != outcome(in_worker)  # another seed: really another trial


def test_a_seeds_initial_weights_are_built_once_however_the_seeds_interleave_within_the_byte_bound(monkeypatch):
    import random
    from types import SimpleNamespace

    import numpy as np

    from catsdogs.training import steps

    # given a model whose build (counted) draws its weights from NumPy's generator, 1 MiB a seed
    builds = []

    def build(cfg):
        builds.append(cfg.seed)
        return SimpleNamespace(variables=[SimpleNamespace(value=np.random.random(2**17))])

    step = SimpleNamespace(user=None, _build=build)
    kept = steps.InitialWeights()

    def trial(seed):
        return SimpleNamespace(image_size=64, precision="float32", seed=seed)

    def values(seed):
        np.random.seed(seed)
        random.seed(seed)
        return kept.values(step, trial(seed))[0].copy(), np.random.random(), random.random()

    # when a race's trials run an arm at a time over seeds 0-5, three arms
    first = {seed: values(seed) for seed in range(6)}
    later = [values(seed) for _ in range(2) for seed in range(6)]
    # then each seed's model is built once, its weights are the same each time, and NumPy and
    # Python draw after a kept seed's reset what they drew after the build
    assert builds == list(range(6))
    assert all(np.array_equal(w, first[i % 6][0]) and (np_after, py_after) == first[i % 6][1:]
               for i, (w, np_after, py_after) in enumerate(later))
    # and no more than MOST_BYTES are kept: the least recently used goes first (seed 3, not seed
    # 0 asked again just now), and is built again when asked
    monkeypatch.setattr(steps.InitialWeights, "MOST_BYTES", 3 * 2**20)
    values(0)
    values(6)
    assert builds == [*range(7)] and list(k[-1] for k in kept._kept) == [5, 0, 6]
    values(0)
    values(3)
    assert builds == [*range(7), 3]


def test_the_articles_model_is_seeded_by_the_backend_and_a_users_by_keras_which_restarts_stateful_kernels(monkeypatch):
    from types import SimpleNamespace

    import keras

    from catsdogs.training import steps

    # given a backend and Keras whose seeding is recorded
    seeded = []
    backend = SimpleNamespace(seed=lambda seed: seeded.append(("backend", seed)))
    monkeypatch.setattr(keras.utils, "set_random_seed", lambda seed: seeded.append(("keras", seed)))
    # when the article's model's step and a user's model's step are seeded
    steps.TrainingStep._seed(SimpleNamespace(user=None, backend=backend), 3)
    steps.TrainingStep._seed(SimpleNamespace(user=("examples.example_models:small_cnn", "auto"), backend=backend), 4)
    # then the article's keeps its kernels (the backend's seed) and the user's takes Keras's own,
    # whose TensorFlow seed restarts any stateful random op a layer of its own may call
    assert seeded == [("backend", 3), ("keras", 4)]


def without_noise(record) -> tuple:
    """`outcome`, the noise scale's fields left out of the history."""
    digest, acc, loss, history, steps = outcome(record)
    return digest, acc, loss, [{k: v for k, v in row.items() if not k.startswith("noise")} for row in history], steps


@pytest.mark.slow
@pytest.mark.xdist_group("engine-alone")
def test_recording_the_noise_scale_changes_nothing_the_trial_trains(keras_backend, data_dir, tmp_path):
    from catsdogs import config
    from catsdogs.gradient_noise import NoiseSampling

    # given a trial alone in a fresh worker, and the same trial with the noise scale recorded
    target = trial(data_dir, seed=2)
    sampling = NoiseSampling()
    slot = LocalSlot(0, 1, tmp_path / "noise", isolate=True)
    try:
        recorded = slot.run(target, data_dir, noise_sampling=sampling.as_dict())
    finally:
        slot.close()
    plain = alone(target, data_dir, tmp_path)
    assert recorded.status == plain.status == Status.DONE, recorded.error
    # then the trial trained exactly as without it: weights, accuracies, losses, history, steps
    assert without_noise(recorded) == without_noise(plain)
    assert plain.initial_noise is None and plain.noise_scale_low is None
    # and it was measured at the start and after each epoch, the last in the row
    assert recorded.initial_noise["epoch"] == 0 and recorded.initial_noise["pairs"] == config.NOISE_PAIRS
    assert [row["noise_scale_low"] is not None for row in recorded.history] == [True, True]
    last = recorded.history[-1]
    assert (recorded.noise_scale, recorded.noise_scale_low) == (last["noise_scale"], last["noise_scale_low"])
    # and its time is in no epoch's clock: fit's wall time holds the epochs and the measurements
    measuring = sum(row["noise_seconds"] for row in recorded.history)
    assert measuring > 0 and recorded.noise_seconds == pytest.approx(measuring + recorded.initial_noise["seconds"],
                                                                     abs=1e-3)
    assert recorded.fit_seconds >= sum(row["seconds"] for row in recorded.history) + measuring - 0.05


@pytest.mark.slow
def test_a_sampling_from_epoch_2_measures_nothing_before_it(keras_backend, data_dir, tmp_path):
    from catsdogs.gradient_noise import NoiseSampling

    # given a two-epoch trial whose noise scale is sampled from epoch 2 on (find-batch-size's way)
    target = trial(data_dir, seed=2)  # two epochs
    slot = LocalSlot(0, 1, tmp_path / "noise", isolate=True)
    try:
        record = slot.run(target, data_dir, noise_sampling=NoiseSampling(pairs=4, from_epoch=2).as_dict())
    finally:
        slot.close()
    assert record.status == Status.DONE, record.error
    # then nothing was measured at the start or after epoch 1, and epoch 2's measurement is the row's
    assert record.initial_noise is None
    assert ["noise_trace" in row for row in record.history] == [False, True]
    assert record.noise_seconds == pytest.approx(record.history[1]["noise_seconds"], abs=1e-3)
    assert record.noise_scale == record.history[1]["noise_scale"]


@pytest.mark.slow
@pytest.mark.xdist_group("engine-alone")
def test_results_are_the_same_with_the_systems_allocator(data_dir, tmp_path, monkeypatch):
    from catsdogs.training import engine, steps

    # given the trial alone in a worker, on the worker's BFC allocator, and the same trial built
    # afresh in this process, which TensorFlow started on glibc's malloc (its default)
    assert os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "false").lower() != "true"
    cfg = trial(data_dir, seed=2, backend="tensorflow")
    bfc = alone(cfg, data_dir, tmp_path)
    steps.STEPS.clear()
    monkeypatch.setattr(steps, "DATA", steps.DataCache())
    system = engine.run_trial(cfg, data_dir)
    # then the allocator changes nothing but time
    assert bfc.status == system.status == Status.DONE and not system.step_reused
    assert outcome(bfc) == outcome(system)


# --- faults stay in their trial -------------------------------------------------------------------


class FaultySlot(LocalSlot):
    """A local slot that notes which worker process trained each trial, and kills its worker from
    outside (kill -9) during the first epoch of the batch-8 trial."""

    pids: dict[str, int] = {}

    def run(self, cfg, data_dir, on_epoch=None, noise_sampling=None, eval_every=None, user=None):
        def epoch(row):
            FaultySlot.pids.setdefault(cfg.key(), self.worker.proc.pid)
            if cfg.batch_size == 8:
                os.kill(self.worker.proc.pid, signal.SIGKILL)
            elif on_epoch:
                on_epoch(row)
        return super().run(cfg, data_dir, epoch, noise_sampling, eval_every)


@pytest.fixture(scope="module")
def faulty_sweep(data_dir, tmp_path_factory):
    """When: a sweep runs, in this order, a trial, one that fails (a batch larger than the 48
    training images), one whose worker is killed mid-trial, and another seed of the first."""
    out = tmp_path_factory.mktemp("faulty")
    grid = [trial(data_dir, batch_size=16), trial(data_dir, batch_size=64), trial(data_dir, batch_size=8, epochs=3),
            trial(data_dir, batch_size=16, seed=1)]
    lines: list[str] = []
    counts = run_sweep("f", grid, data_dir, out, SweepSettings(log=lines.append,
                                                      slots=lambda i, n, workdir: FaultySlot(i, n, workdir)))
    with Store(out / "results.sqlite") as store:
        rows = {(t["batch_size"], t["seed"]): t for t in store.trials("f")}
    return {"grid": grid, "rows": rows, "counts": counts, "lines": lines, "pids": FaultySlot.pids}


@pytest.mark.slow
@pytest.mark.xdist_group("engine-faulty")
def test_a_failed_trial_ends_its_worker_and_the_next_trial_gets_a_fresh_one(faulty_sweep):
    rows, pids = faulty_sweep["rows"], faulty_sweep["pids"]
    first, failing, killed, again = (c.key() for c in faulty_sweep["grid"])
    # then the failure is recorded, its first line the one-line reason (the traceback below it)
    assert rows[(64, 0)]["status"] == Status.FAILED
    assert rows[(64, 0)]["error"].splitlines()[0] == (
        "CatsdogsError: batch size 64 is larger than the 48 training images: not one full batch to train on")
    assert "Traceback" in rows[(64, 0)]["error"]
    # and the trial after it trained in another process than the one before it
    assert pids[killed] != pids[first]


@pytest.mark.slow
@pytest.mark.xdist_group("engine-faulty")
def test_a_worker_killed_mid_trial_is_recorded_and_the_sweep_goes_on(faulty_sweep):
    rows, pids = faulty_sweep["rows"], faulty_sweep["pids"]
    first, failing, killed, again = (c.key() for c in faulty_sweep["grid"])
    # then the killed trial has a status and a one-line reason: a kill that the kernel's OOM
    # killer did not do is a failure (where its counter cannot be read, most likely memory)
    row = rows[(8, 0)]
    assert row["status"] == (Status.FAILED if oom_kills() is not None else Status.OOM)
    assert row["error"].startswith("worker process killed by signal 9 (SIGKILL)")
    assert ("(not by the OOM killer)" if oom_kills() is not None else "(likely out of memory)") in row["error"]
    assert row["test_accuracy"] is None and row["history"] is None
    assert any("killed by signal 9" in line for line in faulty_sweep["lines"])
    # and the sweep went on in a fresh worker, which compiled its step anew
    assert rows[(16, 1)]["status"] == Status.DONE and not rows[(16, 1)]["step_reused"]
    assert pids[again] not in (pids[killed], pids[first])
    assert faulty_sweep["counts"]["done"] == 2


@pytest.mark.slow
def test_a_worker_that_cannot_start_gives_a_failed_record(tmp_path):
    # given a worker whose process dies before it is ready (an unknown backend module)
    worker = Worker(tmp_path / "w.log", env={"PYTHONPATH": str(tmp_path / "nothing"),
                                             "KERAS_BACKEND": "nonesuch"})
    # when a task is sent to it
    record = worker.run(PeakTask("float32", 1.0))
    # then the task has a status and the reason, never an exception
    assert record.status == Status.FAILED
    assert record.error.startswith("worker process exited with code 1 without a result")


def test_what_is_made_after_the_start_is_frozen_is_still_collected():
    import gc
    import weakref

    from catsdogs.training import child as worker_module

    # given the start's objects frozen, as a worker's start leaves them (freeze_imported)
    class Model:  # a model and its layers point at each other: only the collector frees them
        pass

    worker_module.freeze_imported()
    try:
        frozen = gc.get_freeze_count()
        model = Model()
        model.layers = [model]
        dropped = weakref.ref(model)
        # when a probe drops its model and the step cache collects (steps.StepCache.clear)
        del model
        gc.collect()
        # then the model is gone, and what the start made stays out of the passes (a frozen object
        # still goes when nothing refers to it: the count may fall, never to nothing)
        assert dropped() is None
        assert frozen > 0 and 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_a_workers_start_leaves_its_framework_out_of_the_collectors_passes(keras_backend, tmp_path):
    # given a worker started on either backend
    worker = Worker(tmp_path / "w.log")
    try:
        # when it is ready
        worker.start()
        # then the framework's objects (hundreds of thousands) are out of the collector's full
        # passes, which a probe pays at each step cache's clear
        assert worker.frozen > 100_000
    finally:
        worker.close()


# --- the data under a worker ----------------------------------------------------------------------


@pytest.mark.slow
def test_data_re_prepared_under_a_worker_is_noticed(tmp_path, monkeypatch):
    from catsdogs.data.prepare import prepare
    from catsdogs.training import engine, steps

    # A worker's memory of the data is the engine's, so the engine runs here, in this process.
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    data = tmp_path / "data"

    def prepare_with(seed: int) -> str:
        prepare(source="synthetic", data_dir=data, per_class=40, split=(24, 8, 8), size=SIZE,
                seed=seed, log=lambda *a: None, progress=False)
        return require_prepared(data)["fingerprint"]["standard"]

    def run(cfg):
        return engine.run_task(TrialTask(cfg, str(data.resolve())))

    old = prepare_with(0)
    # given an engine that has decoded the data for a trial
    assert run(trial(data, seed=0)).status == Status.DONE
    # when the data is prepared again (another choice of images) under it
    new = prepare_with(1)
    assert new != old
    # then a trial planned on the old data fails in one line, and loses nothing else
    stale = run(TrialConfig("adam", 8, "standard", 1, epochs=2, image_size=SIZE, data=old))
    assert stale.status == Status.FAILED
    assert "changed since this trial was planned" in stale.error.splitlines()[0]
    # and a trial planned on the new data trains on the new images, not the cached ones: the same
    # result as with nothing cached at all
    fresh = TrialConfig("adam", 8, "standard", 1, epochs=2, image_size=SIZE, data=new)
    with_cache = run(fresh)
    monkeypatch.setattr(steps, "DATA", steps.DataCache())
    without = run(fresh)
    assert with_cache.status == without.status == Status.DONE
    assert outcome(with_cache) == outcome(without)


def test_every_kind_of_task_has_one_handler_and_a_task_of_no_kind_is_refused():
    from catsdogs import messages
    from catsdogs.training import engine

    # given the engine's handlers, one a task type (HANDLERS), and the kinds a worker decodes
    # then every kind has its handler, and nothing else has one
    assert set(engine.HANDLERS) == set(messages.TASKS.values())

    # when a task of a type the engine does not know comes in
    class Stray:
        RECORD = messages.MemoryPlan

    # then it is an error naming it, not run as some other kind (a memory plan, before)
    with pytest.raises(TypeError, match="no handler for a Stray"):
        engine.run_task(Stray())
