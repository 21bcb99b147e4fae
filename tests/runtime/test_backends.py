"""The Keras backends: chosen by KERAS_BACKEND, part of every trial's identity, never mixed in a
cell; JAX's own pieces (profile, data parallelism, out-of-memory texts, its memory plan); and
catsdogs on JAX in an environment without TensorFlow, as on the GPU machine."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import asdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from catsdogs.analysis.summary import summarize
from catsdogs.cli import cli
from catsdogs.runtime.backends import jax as jax_backend
from catsdogs.runtime.backends import tensorflow as tf_backend
from catsdogs.schema import TrialConfig
from catsdogs.training.costs import plan_batch_sizes, predict_max_batch_size_planned

SIZE = 32
ROOT = Path(__file__).resolve().parents[2]
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="jax is not installed (pip install -e '.[jax]')")


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: a small prepared synthetic data set (32 px, 24/8/8 images per class)."""
    return prepared_data(SIZE, (24, 8, 8))


# --- identity and cells (no framework needed) -------------------------------------------------


def protocol_methods(protocol) -> dict[str, inspect.Signature]:
    """A protocol's methods and their signatures, `self` left out."""
    out = {}
    for name, value in vars(protocol).items():
        if callable(value) and not name.startswith("_"):
            sig = inspect.signature(value)
            out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


@pytest.mark.parametrize("module", [tf_backend, jax_backend], ids=["tensorflow", "jax"])
def test_each_backend_module_provides_the_backend_protocol(module):
    from catsdogs.runtime.backends import Backend

    # given a backend's module, imported without its framework
    methods = protocol_methods(Backend)
    # then it is a Backend: every name the engine and the worker call, each taking what the protocol says
    assert isinstance(module, Backend) and len(methods) == 25
    for name, sig in methods.items():
        got = inspect.signature(getattr(module, name))
        assert [(p.name, p.default) for p in got.parameters.values()] == \
               [(p.name, p.default) for p in sig.parameters.values()], name
    assert module.NAME in ("tensorflow", "jax") and isinstance(module.OOM_MARKERS, tuple)
    assert module.compiled_step_bytes is None or callable(module.compiled_step_bytes)


def test_a_tensorflow_trial_keeps_its_key_from_before_backends_and_a_jax_trial_gets_its_own():
    tf = TrialConfig("adam", 32, "standard", 0, backend="tensorflow")
    jx = TrialConfig("adam", 32, "standard", 0, backend="jax")
    # the key a 0.3.0 store holds: the configuration without the backend field (nor those added
    # since, which a key leaves out at their defaults too)
    old = {k: v for k, v in asdict(tf).items() if k not in ("backend", "deterministic", "tf32", "until", "eval_every", "model",
                                                          "max_steps", "stop_at_chance")}
    old_key = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert tf.key() == old_key
    assert jx.key() != tf.key() and jx.shape() != tf.shape()
    assert "backend=jax" in jx.label() and "backend" not in tf.label()
    with pytest.raises(ValueError, match="unknown backend 'torch'"):
        TrialConfig("adam", 32, "standard", 0, backend="torch").check()


def _trial(backend: str | None, seed: int, accuracy: float) -> dict:
    config = {"optimizer": "adam", "batch_size": 32, "dataset": "standard", "seed": seed, "epochs": 5,
              "image_size": 200}
    if backend:
        config["backend"] = backend
    return {**config, "key": f"{backend}-{seed}", "status": "done", "test_accuracy": accuracy,
            "config": config}


def test_two_backends_results_never_share_a_cell():
    # given the same configuration run on TensorFlow (one row from before the backend column) and JAX
    trials = [_trial(None, 0, 0.70), _trial("tensorflow", 1, 0.72), _trial("jax", 0, 0.50),
              _trial("jax", 1, 0.52)]
    # when the report sorts them into figures
    rows = summarize(trials)["figures"][0]["rows"]
    # then each backend has its own cell, labelled, with its own trials only
    by_series = {r["series"]: r for r in rows}
    assert set(by_series) == {"Adam, TensorFlow", "Adam, JAX"}
    assert by_series["Adam, TensorFlow"]["accuracies"] == [0.70, 0.72]
    assert by_series["Adam, JAX"]["accuracies"] == [0.50, 0.52]
    # and a figure of one backend only is labelled as before
    alone = summarize(trials[:2])["figures"][0]["rows"]
    assert {r["series"] for r in alone} == {"Adam"}


def test_an_unknown_backend_is_a_one_line_error_and_help_still_works(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    for command in ("sweep", "profile", "find-batch-size", "reproduce"):
        result = CliRunner().invoke(cli, [command, "--data-dir", str(tmp_path), "--out", str(tmp_path)])
        assert result.exit_code == 1, result.output
        assert result.output.strip() == "Error: KERAS_BACKEND=torch is not supported by catsdogs; use tensorflow or jax"
        assert CliRunner().invoke(cli, [command, "--help"]).exit_code == 0


@pytest.mark.parametrize("spelling", ["JAX", "Tensorflow", " jax", "jax "])
def test_a_backend_name_keras_would_refuse_is_refused_before_any_trial_is_recorded(prepared_data, tmp_path,
                                                                                  monkeypatch, spelling):
    # given a KERAS_BACKEND spelled as Keras does not take it (it compares the name exactly)
    monkeypatch.setenv("KERAS_BACKEND", spelling)
    data = prepared_data(32)
    for command in (["sweep", "--opt", "adam", "--batch-size", "4", "--epochs", "1"], ["find-batch-size"]):
        # when a command that trains runs
        result = CliRunner().invoke(cli, [*command, "--data-dir", str(data), "--out", str(tmp_path / "out")])
        # then one line says what Keras takes, and nothing was recorded
        assert result.exit_code == 1, result.output
        assert result.output.strip() == (
            f"Error: KERAS_BACKEND is {spelling!r}, which is not a backend name Keras accepts (exactly one of "
            "tensorflow, jax, torch, numpy, openvino, in lower case); catsdogs runs on tensorflow or jax: "
            "e.g. KERAS_BACKEND=jax")
        assert not (tmp_path / "out").exists()


def test_the_h100s_out_of_memory_texts_are_out_of_memory_on_jax():
    # the texts ../shared/GPU.md records for Keras on JAX on the H100
    autotuner = RuntimeError("NOT_FOUND: Failed to get configs for: 2 out of 26 instructions. ... All "
                             "configs failed during profiling or were excluded")
    allocation = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 68719476736 bytes.")
    assert jax_backend.classify_error(autotuner) == "oom"
    assert jax_backend.classify_error(allocation) == "oom"
    assert jax_backend.classify_error(MemoryError()) == "oom"
    assert jax_backend.classify_error(ValueError("batch size 64 is larger than the 48 images")) == "failed"


def test_tensorflows_out_of_memory_errors_are_out_of_memory():
    tf = pytest.importorskip("tensorflow")
    # the allocator's error on a GPU or under a logical device's cap, and the host's
    exhausted = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[64,200,200,32]")
    assert tf_backend.classify_error(exhausted) == "oom"
    assert tf_backend.classify_error(MemoryError()) == "oom"
    assert tf_backend.classify_error(RuntimeError("std::bad_alloc")) == "oom"
    # an error of another kind is a failure, even a ResourceExhausted-free message about memory units
    assert tf_backend.classify_error(ValueError("batch size 64 is larger than the 48 images")) == "failed"
    assert tf_backend.classify_error(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes")) == "failed"


def test_a_planned_prediction_extends_the_line_through_the_largest_two_sizes_compiled():
    # given a compiler whose step takes 100 MB plus 3 MB per image, with a small bend above 200,
    # compiled at the sizes the plan asks for (none above 256), and a batch-1 probe that peaked at
    # 500 MB (so the runtime's baseline is 397 MB)
    def plan(b: int) -> int:
        return 100_000_000 + 3_000_000 * b + (2_000_000 if b > 200 else 0)

    sizes = plan_batch_sizes(1)
    assert sizes == [1, 64, 256]
    planned = {b: plan(b) for b in sizes}
    p = predict_max_batch_size_planned(planned, cap_bytes=2_000_000_000, calibration_batch=1,
                                       calibration_peak_bytes=500_000_000)
    # then the answer is the largest batch on the line through 64 and 256 whose baseline + plan fits:
    # the line through them carries the bend (2 MB over 192 images) on, so it lands within an image
    best = p["max_batch_size"]
    assert p["baseline_bytes"] == 500_000_000 - plan(1)
    assert p["method"] == "xla" and list(p["planned_bytes"]) == [1, 64, 256]
    assert abs(best - 499) <= 1 and p["baseline_bytes"] + plan(best - 1) <= 2_000_000_000
    # and a cap that binds below 256 is read on the line between the sizes around it
    small = predict_max_batch_size_planned(planned, cap_bytes=950_000_000, calibration_batch=1,
                                           calibration_peak_bytes=500_000_000)
    assert 64 < small["max_batch_size"] < 256
    assert p["baseline_bytes"] + plan(small["max_batch_size"]) <= 950_000_000 + 3_000_000
    # and a cap below the calibration probe's own plan fits nothing
    assert predict_max_batch_size_planned(planned, 450_000_000, 1, 500_000_000)["max_batch_size"] == 0
    # and the plan is never compiled above the search's bound, nor with fewer than two sizes predicts
    assert plan_batch_sizes(1, bound=48) == [1, 48] and plan_batch_sizes(1, bound=1) == [1]
    assert predict_max_batch_size_planned({1: plan(1)}, 2_000_000_000, 1, 500_000_000) is None


def test_only_jax_states_a_compiled_memory_plan():
    assert tf_backend.compiled_step_bytes is None and callable(jax_backend.compiled_step_bytes)


def test_tensorflow_seed_draws_as_keras_set_random_seed_and_keeps_the_compiled_kernels():
    import random

    import keras
    import numpy as np
    import tensorflow as tf

    def draws():  # Python's, NumPy's and Keras's global generators, TensorFlow's global and op seeds
        return (random.random(), float(np.random.random()), float(keras.random.uniform(())),
                tf.compat.v1.random.get_seed(None), tf.compat.v1.random.get_seed(None))

    # given the generators seeded by Keras's own set_random_seed, then by the backend's seed
    keras.utils.set_random_seed(7)
    expected = draws()
    tf_backend.seed(7)
    # then each draws what it drew after Keras's
    assert draws() == expected
    # and TensorFlow's kernel cache is kept: a stateful kernel's stream goes on after the backend's
    # seed, where Keras's own (tf.random.set_seed clearing the cache) starts it again
    keras.utils.set_random_seed(7)
    first = float(tf.random.uniform((), seed=1))
    keras.utils.set_random_seed(7)
    restarted = float(tf.random.uniform((), seed=1))
    tf_backend.seed(7)
    kept = float(tf.random.uniform((), seed=1))
    assert restarted == first and kept != first


# --- JAX's own pieces ---------------------------------------------------------------------------


@needs_jax
@pytest.mark.slow
def test_profile_on_jax_times_each_batch_size_and_measures_mfu(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    # when the profile runs two batch sizes on JAX, each timed for at least 0.3 s
    result = CliRunner().invoke(cli, ["profile", "--data-dir", str(data_dir), "--out", str(tmp_path),
                                      "--batch-size", "4", "16", "--steps", "2", "--warmup", "1",
                                      "--min-seconds", "0.3"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "profile" / "profile.csv") as f:
        rows = list(csv.DictReader(f))
    # then both ran on JAX, timed, with throughput, MFU against JAX's matmul peak, and memory
    assert [r["batch_size"] for r in rows] == ["4", "16"]
    for r in rows:
        assert r["status"] == "done" and r["backend"] == "jax", r
        assert float(r["images_per_second"]) > 0 and 0 < float(r["mfu_percent"]) < 100
        assert float(r["peak_memory_mb"]) > 0 and r["memory_kind"] == "cpu-rss"
        # past --steps: the probe's batches repeated until its timed steps lasted --min-seconds
        assert float(r["timed_seconds"]) >= 0.3 and int(r["timed_steps"]) > 2
    assert len(list((tmp_path / "profile" / "figures").glob("*.png"))) == 3
    # and its matmul peak timed for the default, 1 s a timing (profile.PEAK_SECONDS, read when called)
    assert json.loads((tmp_path / "profile" / "profile.json").read_text())["settings"]["peak_seconds"] == 1.0


@needs_jax
@pytest.mark.slow
def test_mirrored_on_jax_is_data_parallel_over_two_host_devices(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    args = ["sweep", "--data-dir", str(data_dir), "--out", str(tmp_path), "--opt", "adam", "--batch-size", "8",
            "--epochs", "1", "--seeds", "1"]
    # when a trial runs with --strategy mirrored (keras.distribution.DataParallel on JAX)
    result = CliRunner().invoke(cli, [*args, "--name", "m", "--strategy", "mirrored"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "m" / "results.csv") as f:
        (row,) = list(csv.DictReader(f))
    # then it trained on two replicas, each half of the global batch
    assert row["status"] == "done" and row["replicas"] == "2" and row["backend"] == "jax"


SATURATED_GRADIENT = """
import jax, jax.numpy as jnp, numpy as np
from catsdogs.training.model import build_model, loss_and_metrics
model = build_model(8)
loss, _ = loss_and_metrics()
model.layers[-1].bias.assign(np.array([30.0], "float32"))  # every image: "dog", sure of it
x, y = jnp.zeros((4, 8, 8, 3), "uint8"), jnp.zeros((4,), "float32")  # all cats
def f(bias):
    logits = model(x) - model.layers[-1].bias + bias
    return loss(y, logits)
print(float(jax.grad(f)(jnp.array([30.0]))[0]))
"""


@needs_jax
@pytest.mark.slow
def test_a_confidently_wrong_prediction_still_has_a_gradient_on_jax():
    # given the article's model with its last layer saturated the wrong way, on JAX, whose
    # cross-entropy of a sigmoid output is clipped (Keras on TensorFlow recovers the logit)
    out = subprocess.run([sys.executable, "-c", SATURATED_GRADIENT], capture_output=True, text=True,
                         env={**os.environ, "KERAS_BACKEND": "jax"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # then the loss's gradient is about 1, not 0: the model outputs the logit and the loss takes it
    assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(1.0, abs=1e-3)


# --- on JAX without TensorFlow, as on the GPU machine -------------------------------------------


def _site_without_tensorflow(root: Path) -> Path:
    """The test environment's packages but TensorFlow's (and catsdogs, which is installed
    below), as links in one folder: what the GPU machine has, found on PYTHONPATH."""
    site = root / "site"
    site.mkdir()
    skip = ("tensorflow", "tf_keras", "tensorboard", "catsdogs", "__editable__", "_tensorflow")
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(skip) and not entry.name.endswith(".pth"):
            (site / entry.name).symlink_to(entry)
    return site


@needs_jax
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CI"), reason="CI runs it (CI=true): it builds a virtual environment")
def test_catsdogs_installs_with_no_deps_and_runs_on_jax_without_tensorflow(tmp_path):
    # given a fresh virtual environment without TensorFlow, the other packages on PYTHONPATH,
    # and catsdogs installed with --no-deps from a copy of its source
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = _site_without_tensorflow(tmp_path)
    source = tmp_path / "src"
    shutil.copytree(ROOT / "catsdogs", source / "catsdogs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(site), PYTHONNOUSERSITE="1", KERAS_BACKEND="jax")
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                              "--no-build-isolation", str(source)], env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    no_tf = subprocess.run([python, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert no_tf.returncode != 0 and "No module named 'tensorflow'" in no_tf.stderr

    def catsdogs(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "catsdogs", *args], env={**env, **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)

    # when it prepares the synthetic source and runs a sweep and its report on JAX
    data, out = tmp_path / "data", tmp_path / "out"
    prepared = catsdogs("prepare", "--source", "synthetic", "--data-dir", str(data), "--per-class", "40",
                        "--split", "24,8,8", "--size", "32", "--quiet")
    assert prepared.returncode == 0, prepared.stderr
    swept = catsdogs("sweep", "--data-dir", str(data), "--out", str(out), "--opt", "adam", "sgd",
                     "--batch-size", "8", "--epochs", "1", "--seeds", "1")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert catsdogs("report", "--out", str(out)).returncode == 0
    # then every trial is done on JAX, and the report exists
    with open(out / "sweep" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["status"], r["backend"]) for r in rows] == [("done", "jax")] * 2
    assert (out / "sweep" / "results.md").exists()
    # and asking for the TensorFlow backend there is one line, not a traceback
    tf = catsdogs("sweep", "--data-dir", str(data), "--out", str(out), KERAS_BACKEND="tensorflow")
    assert tf.returncode == 1 and tf.stderr.strip() == (
        "Error: KERAS_BACKEND=tensorflow needs tensorflow, which is not installed: pip install tensorflow")


# --- honest timers: waiting for dispatched steps ----------------------------------------------


class WeightsOf:
    """Stands in for a model: its trainable variables hold `arrays` (as Keras variables' .value)."""

    def __init__(self, *arrays):
        self.trainable_variables = [type("Variable", (), {"value": a, "shape": a.shape})() for a in arrays]


def test_jax_waits_for_a_dispatched_step_before_the_timer_stamps():
    import time

    import jax
    import jax.numpy as jnp

    @jax.jit
    def slow_step(x):  # a "training step" of known cost: 20 products of 1,000 x 1,000 matrices
        return jax.lax.fori_loop(0, 20, lambda i, y: (y @ x) / 1000.0, x)

    x = jnp.ones((1000, 1000), jnp.float32)
    jax.block_until_ready(slow_step(x))  # compiled
    costs = []
    for _ in range(3):  # its cost: the least of 3 (a busy machine only ever adds time)
        t0 = time.perf_counter()
        jax.block_until_ready(slow_step(x))
        costs.append(time.perf_counter() - t0)
    cost = min(costs)
    # given a step dispatched, its result not yet asked for
    t0 = time.perf_counter()
    weights = slow_step(x)
    dispatched = time.perf_counter() - t0
    # when the timer waits for the steps, then the wait covers the step's remaining time
    jax_backend.wait_for_steps(WeightsOf(weights))
    waited = time.perf_counter() - t0
    assert dispatched < 0.5 * cost <= waited, (dispatched, cost, waited)


def test_the_epoch_timer_stamps_the_end_of_training_after_the_steps_have_run():
    import time

    from catsdogs.training.engine import EpochTimer

    # given steps that take 0.2 s more to finish than to dispatch (as JAX's do)
    rows = []
    timer = EpochTimer(2, rows.append, wait_for_steps=lambda model: time.sleep(0.2))
    timer.set_model(object())
    # when an epoch with validation, then one without, end
    timer.on_epoch_begin(0)
    timer.on_test_begin()
    timer.on_epoch_end(0)
    timer.on_epoch_begin(1)
    timer.on_epoch_end(1)
    # then both epochs' training time holds the steps' 0.2 s
    assert [r["train_seconds"] >= 0.2 for r in rows] == [True, True]


OWN_EVALUATION = r"""
import json, sys
from pathlib import Path
from catsdogs.manifest import load_manifest
from catsdogs.runtime import backends
from catsdogs.runtime.backends import jax as jb, keras_evaluate
from catsdogs.schema import TrialConfig
backend = backends.current(); backend.start()
from catsdogs.training import engine
data_dir = Path(sys.argv[1]); data = load_manifest(data_dir)
ours = (jb.FIT_VALIDATES, jb.evaluate)
kerass = (True, lambda model, batches, cache=None: keras_evaluate(model, batches))  # 0.41.0's way

def record(seed, until, way):
    jb.FIT_VALIDATES, jb.evaluate = way
    cfg = TrialConfig("sgd", 8, "standard", seed, epochs=3, image_size=data["params"]["size"], lr=0.05,
                      data=data["fingerprint"]["standard"], until=until, eval_every=64 if until else None,
                      backend="jax", **backends.process_settings())
    r = engine.run_trial(cfg, data_dir)
    clockless = lambda rows: [{k: v for k, v in row.items() if "seconds" not in k} for row in rows or []]
    return {"history": clockless(r.history), "curve": clockless(r.curve), "test": [r.test_loss, r.test_accuracy],
            "digest": r.weights_digest}, [r.compiles, r.compile_cache_hits]

runs = [(record(seed, until, kerass), record(seed, until, ours)) for until in (None, "val_loss=0.1") for seed in (0, 1)]
print(json.dumps({"fit_validates": ours[0], "runs": [(k[0], o[0]) for k, o in runs],
                  "compiles": [o[1] for _, o in runs]}))
"""


@pytest.mark.slow
@needs_jax
def test_on_jax_each_epochs_validation_and_the_curves_points_are_kerass_own_bit_for_bit(data_dir):
    # given JAX trials (with and without a curve evaluated mid-epoch, every 64 images at batch 8)
    # validated by Keras's fit and evaluate, as up to 0.41.0, and the same trials validated by the
    # timer and the curve with the backend's own jitted `test_step`
    out = subprocess.run([sys.executable, "-c", OWN_EVALUATION, str(data_dir)], capture_output=True, text=True,
                         env={**os.environ, "KERAS_BACKEND": "jax"}, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # then fit does not validate on JAX, and every epoch's figures (validation and fit's running
    # loss and accuracy), every point of the curve, the test's figures and the weights are the same
    assert result["fit_validates"] is False
    for kerass, ours in result["runs"]:
        assert ours == kerass
        assert all("val_loss" in row for row in ours["history"])
    # (48 training images, 6 steps an epoch: points at the start, at 64 and 128 images mid-epoch, and the end)
    assert [len(ours["curve"]) for _, ours in result["runs"]] == [0, 0, 4, 4]
    # and our evaluation is compiled (or taken from the compilation cache) once, with the step: the
    # later trials that reuse the step compile nothing
    assert sum(result["compiles"][0]) > 0 and result["compiles"][1:] == [[0, 0]] * 3, result["compiles"]
