"""The noise scale of a user's model (issue 35, item 4): micro-batch gradients by each backend's own
autodiff, a trial of the user's model trained as the article's is, and find-batch-size measuring
it by the two-batch estimator on real images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from catsdogs.cli import cli
from catsdogs.data import folder
from catsdogs.data.loading import Split
from catsdogs.manifest import require_prepared
from catsdogs.messages import TrialTask
from catsdogs.runtime import backends
from catsdogs.runtime.worker import Worker
from catsdogs.schema import Status, TrialConfig

SIZE = 32

MODELS = textwrap.dedent("""
    import keras
    from keras import layers

    from catsdogs.training.model import build_model


    def article():  # the article's model, as a user would hand it in
        return build_model(32)


    def normed():  # BatchNormalization and Dropout: state that training mode moves
        return keras.Sequential([keras.Input((32, 32, 3)), layers.Rescaling(1 / 255), layers.Conv2D(4, 3),
                                 layers.BatchNormalization(), layers.ReLU(), layers.Dropout(0.2),
                                 layers.GlobalAveragePooling2D(), layers.Dense(3)], name="normed")


    def depthwise():  # JAX maps its micro-batches in turn (vmap would make a grouped convolution of them all)
        return keras.Sequential([keras.Input((32, 32, 3)), layers.Rescaling(1 / 255), layers.DepthwiseConv2D(3),
                                 layers.BatchNormalization(), layers.ReLU(), layers.GlobalAveragePooling2D(),
                                 layers.Dense(3)], name="depthwise")
""")


@pytest.fixture
def in_a_project(a_project) -> Path:
    """Given: a user's project with the article's model and one with BatchNormalization and Dropout."""
    return a_project(MODELS)


def test_a_folder_holds_out_a_fixed_tenth_for_testing():
    # given 30 images
    split = Split(np.arange(30).reshape(30, 1, 1, 1), np.arange(30, dtype=np.float32), [str(i) for i in range(30)])
    # when held out twice
    train, test = folder.holdout(split)
    again, _ = folder.holdout(split)
    # then 3 test and 27 train, disjoint, covering all, in order, and the same each time
    assert (len(train), len(test)) == (27, 3)
    assert sorted(train.files + test.files, key=int) == split.files
    assert train.files == again.files and list(train.labels) == sorted(train.labels)
    assert len(folder.holdout(Split(split.images[:3], split.labels[:3], split.files[:3]))[1]) == 1


# --- the micro-batch gradients, by each backend's autodiff ---------------------------------------------

CHECK = r"""
import json, sys
import numpy as np
import keras
sys.path.insert(0, sys.argv[1])
from my_models import article, depthwise, normed
from catsdogs.runtime import backends
from catsdogs.training.model import loss_and_metrics

backend = backends.current()
backend.start()
keras.utils.set_random_seed(3)
model = normed()
rng = np.random.default_rng(0)
for w in model.trainable_variables:  # some way into training: not the initial weights
    w.assign(w.value + 0.05 * rng.standard_normal(w.shape).astype("float32"))
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
images = rng.integers(0, 256, (12, 32, 32, 3)).astype("float32")
labels = rng.integers(0, 3, 12).astype("float32")
before = [np.array(w.value) for w in model.weights]
dropping = {}  # one compiled gram a shape, as the engine keeps them (the dropout's rate is read when it compiles)
gram = backend.micro_gradient_gram(model, loss, images, labels, micro=2, micros=3,  # 2 pairs of 3 micro-batches
                                   cache=dropping)
moved = max(float(np.abs(np.array(w.value) - b).max()) for w, b in zip(model.weights, before))

# the same two images in each of the 6 micro-batches: with dropout, each draws its own masks
twins = backend.micro_gradient_gram(model, loss, np.tile(images[:2], (6, 1, 1, 1)), np.tile(labels[:2], 6),
                                    micro=2, micros=3, cache=dropping)

jitted = {}  # on JAX one compiled gradient a model, where op-by-op dispatch took seconds

def plain_gradient(x, y, model=model):  # the framework's own gradient of a micro-batch's loss, in training mode
    if backend.NAME == "jax":
        import jax
        if id(model) not in jitted:
            def of(values, rest, x, y):
                out, _ = model.stateless_call(values, rest, x, training=True)
                return loss(y, out)
            jitted[id(model)] = jax.jit(jax.grad(of))
        grads = jitted[id(model)]([v.value for v in model.trainable_variables],
                                   [v.value for v in model.non_trainable_variables], x, y)
    else:
        import tensorflow as tf
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
    return np.concatenate([np.asarray(g).ravel() for g in grads]).astype(np.float64)

dropout = next(layer for layer in model.layers if isinstance(layer, keras.layers.Dropout))
dropout.rate = 0.0  # off for the comparison: a mask is a draw
quiet = {}
quiet_gram = backend.micro_gradient_gram(model, loss, images, labels, micro=2, micros=3, cache=quiet)
quiet_twins = backend.micro_gradient_gram(model, loss, np.tile(images[:2], (6, 1, 1, 1)), np.tile(labels[:2], 6),
                                          micro=2, micros=3, cache=quiet)
flat = np.stack([plain_gradient(images[i:i + 2], labels[i:i + 2]) for i in range(0, 12, 2)]).reshape(2, 3, -1)
reference = np.einsum("pid,pjd->pij", flat, flat)

dw = depthwise()
dw_gram = backend.micro_gradient_gram(dw, loss, images, labels, micro=2, micros=3)
flat = np.stack([plain_gradient(images[i:i + 2], labels[i:i + 2], dw) for i in range(0, 12, 2)]).reshape(2, 3, -1)
dw_reference = np.einsum("pid,pjd->pij", flat, flat)

keras.utils.set_random_seed(4)
art = article()
x8 = rng.integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
y8 = rng.integers(0, 2, 8).astype("float32")
singles = backend.micro_gradient_gram(art, loss_and_metrics()[0], x8, y8, micro=1, micros=4)
ghost = backend.per_example_gram(art, x8, y8, block=4)
print(json.dumps({"gram": gram.tolist(), "quiet": quiet_gram.tolist(), "reference": reference.tolist(), "moved": moved,
                  "twins": twins.tolist(), "quiet_twins": quiet_twins.tolist(),
                  "dw_gram": dw_gram.tolist(), "dw_reference": dw_reference.tolist(),
                  "singles": singles.tolist(), "ghost": ghost.tolist()}))
"""


@pytest.mark.slow
def test_micro_batch_gradients_are_the_frameworks_own_and_move_no_state(keras_backend, tmp_path):
    # given a model with BatchNormalization and Dropout at some weights, on each backend
    (tmp_path / "my_models.py").write_text(MODELS)
    out = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERAS_BACKEND": keras_backend, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = {k: np.array(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    # then measuring moved no variable: not a weight, not BatchNormalization's statistics, not a seed
    assert got["moved"] == 0.0
    # and each pair's Gram matrix of micro-batch gradients is that of the framework's plain gradients
    # (dropout off for the comparison: a mask is a draw)
    assert got["gram"].shape == (2, 3, 3)
    reference = got["reference"]
    assert np.allclose(got["quiet"], reference, rtol=1e-4, atol=1e-6 * np.abs(reference).max())
    # and so for a depthwise convolution's model (on JAX its micro-batches in turn)
    assert np.allclose(got["dw_gram"], got["dw_reference"], rtol=1e-4, atol=1e-6 * np.abs(got["dw_reference"]).max())
    # and with dropout each micro-batch draws its own masks: the same images give different
    # gradients (without it, the same ones)
    twins, quiet_twins = got["twins"][0], got["quiet_twins"][0]
    assert len({round(v, 6) for v in np.diagonal(twins)}) == 3
    assert np.allclose(quiet_twins, quiet_twins[0, 0], rtol=1e-5)
    # and for the article's model, micro-batches of one example give the per-example products' Gram matrix
    ghost = got["ghost"]
    assert np.allclose(got["singles"], ghost, rtol=1e-3, atol=1e-5 * np.abs(ghost).max())


BATCH_NORM_CHECK = r"""
import json
import numpy as np
import keras
from catsdogs import gradient_noise
from catsdogs.runtime import backends

backend = backends.current()
backend.start()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
n, d = 1024, 16
labels = rng.integers(0, 2, n)
x = (rng.standard_normal((n, d)) + 0.8 * (2 * labels[:, None] - 1) * rng.standard_normal(d)).astype("float32")
y = labels.astype("float32")
inputs = keras.Input((d,))
h = keras.layers.ReLU()(keras.layers.BatchNormalization()(keras.layers.Dense(32)(inputs)))
model = keras.Model(inputs, keras.layers.Dense(1)(h))
loss = keras.losses.BinaryCrossentropy(from_logits=True)
for w in model.trainable_variables:  # some way into training
    w.assign(w.value + 0.1 * rng.standard_normal(w.shape).astype("float32"))
compiled = {}  # one compiled function a shape, as a trial keeps them (engine.noise_estimate_at)
# directly: |G_32|^2, the squared norm of a training batch's gradient (BatchNormalization over its 32),
# averaged over 100 batches drawn with replacement
direct = []
for _ in range(50):
    idx = rng.integers(0, n, 64)
    direct += list(np.diagonal(backend.micro_gradient_gram(model, loss, x[idx], y[idx], micro=32, micros=2,
                                                           cache=compiled)[0]))
out = {"direct": float(np.mean(direct))}
# the two-batch estimator's E|G_32|^2 = |G|^2 + tr(Sigma)/32, from 64 pairs of micro-batches of 2 and of 8
for micro, micros in ((2, 12), (8, 6)):
    idx = rng.integers(0, n, 64 * micro * micros)
    gram = backend.micro_gradient_gram(model, loss, x[idx], y[idx], micro=micro, micros=micros, cache=compiled)
    small, large = gradient_noise.norms_from_gram(gram, 1)
    g2, trace = gradient_noise.pair_estimates(small, large, micro, micro * micros)
    out[str(micro)] = float(g2.mean() + trace.mean() / 32)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_with_batch_normalization_micro_batches_of_8_see_the_gradient_training_sees():
    # (on JAX: the micro-batch gradients equal each framework's own, above; what normalization over a
    # micro-batch does to them is the model's, not the backend's)
    # given a small model with BatchNormalization after a Dense layer, some way into training
    out = subprocess.run([sys.executable, "-c", BATCH_NORM_CHECK], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERAS_BACKEND": "jax"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # when the two-batch estimator predicts a training batch's squared gradient norm, E|G_32|^2
    off = {micro: abs(got[micro] / got["direct"] - 1) for micro in ("2", "8")}
    # then from micro-batches of 8 it comes within 5% of the one computed directly from batches of 32,
    # and closer than from micro-batches of 2, whose normalization over two images is nothing like training's
    assert off["8"] <= 0.05 and off["8"] < off["2"], got


# --- a trial of a user's model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(prepared_data) -> Path:
    """Given: the prepared synthetic data at 32 px, the models' input."""
    return prepared_data(SIZE, (24, 8, 8))


def trial(data_dir: Path, **kw) -> TrialConfig:
    fields = {"optimizer": "adam", "batch_size": 8, "dataset": "standard", "seed": 1, "epochs": 2,
              "image_size": SIZE, "data": require_prepared(data_dir)["fingerprint"]["standard"],
              "backend": backends.name()}
    return TrialConfig(**{**fields, **kw})


def trained(record) -> tuple:
    return (record.weights_digest, record.test_accuracy, record.test_loss, record.steps,
            [(row["loss"], row["accuracy"]) for row in record.history])


@pytest.mark.slow
def test_the_article_model_handed_in_as_a_users_trains_to_the_same_weights(keras_backend, in_a_project, data_dir):
    # given one seeded trial of the article's model, and the same trial of a function returning it
    cfg = trial(data_dir)
    worker = Worker(in_a_project / "worker.log")
    try:
        built_in = worker.run(TrialTask(cfg, str(data_dir)))
        handed_in = worker.run(TrialTask(cfg, str(data_dir), user={"model": "my_models:article", "loss": "auto"}))
        other_seed = worker.run(TrialTask(trial(data_dir, seed=2), str(data_dir),
                                          user={"model": "my_models:article", "loss": "auto"}))
    finally:
        worker.close()
    assert built_in.status == handed_in.status == other_seed.status == Status.DONE, handed_in.error
    # then the generic path trains it to the same weights, accuracy, loss and history, bit for bit
    assert trained(handed_in) == trained(built_in)
    assert trained(other_seed) != trained(handed_in)  # another seed is another trial
    # and only the article's own path reads its hidden layer for a collapse
    assert built_in.collapsed is not None and handed_in.collapsed is None


@pytest.mark.slow
def test_a_users_model_trial_measures_the_noise_scale_by_the_two_batch_estimator(keras_backend, in_a_project, data_dir):
    from catsdogs.gradient_noise import NoiseSampling

    # given the BatchNormalization model trained two epochs, measured after each, micro-batches of 2
    sampling = NoiseSampling(micro=2, micros=4, pairs=4, from_epoch=1)
    task = TrialTask(trial(data_dir), str(data_dir), sampling.as_dict(), user={"model": "my_models:normed", "loss": "auto"})
    quiet = TrialTask(trial(data_dir), str(data_dir), user={"model": "my_models:normed", "loss": "auto"})
    worker = Worker(in_a_project / "worker.log")
    try:
        measured, plain = worker.run(task), worker.run(quiet)
    finally:
        worker.close()
    assert measured.status == plain.status == Status.DONE, measured.error
    # then each epoch has its estimate from 4 pairs, and measuring changed nothing it trained
    assert [row["noise_trace"] > 0 for row in measured.history] == [True, True]
    assert measured.noise_seconds > 0 and measured.initial_noise is None
    assert trained(measured) == trained(plain)


# --- find-batch-size on a user's folder ------------------------------------------------------------------------


@pytest.fixture
def pictures(tmp_path) -> Path:
    """Given: three classes of 40 32 px images each, told apart by their colour, with noise."""
    rng = np.random.default_rng(0)
    root = tmp_path / "pics"
    for label, name in enumerate(("ant", "bee", "cow")):
        (root / name).mkdir(parents=True)
        for i in range(40):
            pixels = np.clip(rng.normal(60 + 70 * label, 40, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_find_batch_size_measures_a_users_models_noise_scale_on_its_folder(in_a_project, pictures, tmp_path,
                                                                          launched_workers):
    # (on TensorFlow: what differs by backend, the micro-batch gradients and a trial measuring by them
    # in a worker, is tested on both above; this is find-batch-size's own part, which runs no framework)
    # when find-batch-size runs the BatchNormalization model on the folder, the search kept short
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["find-batch-size", "--model", "my_models:normed", "--data", str(pictures),
                                      "--data-dir", str(tmp_path / "none"), "--out", str(out),
                                      "--memory-limit", "1GiB", "--max", "16"])
    assert result.exit_code == 0, result.output
    # then it measured the noise scale on the folder's images by the two-batch estimator, said so,
    # and recommends by the statistics as for the article's model
    # (micro-batches of 8: BatchNormalization normalizes over each, as training does over its batch)
    assert "the two-batch estimator on ordinary gradients, 16 pairs of 6 micro-batches of 8 images" in result.output
    assert "by the two-batch estimator on micro-batches of 8 (the model has BatchNormalization" in result.output
    saved = json.loads((out / "find-batch-size" / "find_batch_size.json").read_text())
    noise = saved["noise_scale"]
    assert (noise["estimator"], noise["small"], noise["large"], noise["measurements"]) == ("two-batch", 8, 48, 4)
    assert noise["batch_norm"] and saved["model"]["batch_norm"]
    assert noise["trace"] > 0 and noise["low"] is not None
    assert saved["model"]["data_folder"] == str(pictures) and saved["model"]["image_count"] == 120
    assert saved["recommendation"]["batch_size"] in {p["batch_size"] for p in saved["probes"] if p["status"] == "done"}
    # and the short runs trained in the worker the model was checked in (no worker of their own), ended after them
    checked = [w for w in launched_workers if w.log_path.name == "model-check.log"]
    assert len(checked) == 1 and checked[0].tasks >= 1 + 4 and not checked[0].alive
    assert not any(w.log_path.name == "noise-scale.log" for w in launched_workers)


@pytest.mark.slow
@pytest.mark.usefixtures("brief_probes")
def test_the_article_model_handed_in_is_predicted_by_the_articles_memory_model(keras_backend, in_a_project, data_dir,
                                                                              tmp_path):
    # when find-batch-size runs on the article's model built in, and handed in as a user's
    runs = {}
    for name, extra in (("built-in", []), ("handed-in", ["--model", "my_models:article"])):
        result = CliRunner().invoke(cli, ["find-batch-size", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                                          "--name", name, "--memory-limit", "1GiB", "--max", "2", "--no-noise-scale",
                                          *extra])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads((tmp_path / "out" / name / "find_batch_size.json").read_text())["prediction"]
    # then both are predicted by the article's own model of its memory (the replay, or XLA's plan)
    built_in, handed_in = runs["built-in"], runs["handed-in"]
    assert handed_in["method"] == built_in["method"] == ("bfc" if keras_backend == "tensorflow" else "xla")
    if keras_backend == "tensorflow":  # the built-in's replay, given the handed-in run's calibration, answers as it did
        from catsdogs.training.costs import predict_max_batch_size

        replayed = predict_max_batch_size(handed_in["cap_bytes"], 1, handed_in["calibration_peak_mb"] * 2**20, SIZE,
                                          train_images=built_in["train_images"], device=built_in["device"],
                                          steps=built_in["steps"])
        assert replayed["max_batch_size"] == handed_in["max_batch_size"]
        assert handed_in["state_bytes"] == built_in["state_bytes"]
    else:  # the same plan of the step, compiled at the same sizes, none above the search's bound (--max 2)
        assert handed_in["planned_bytes"] == built_in["planned_bytes"]
        assert list(handed_in["planned_bytes"]) == ["1", "2"]
