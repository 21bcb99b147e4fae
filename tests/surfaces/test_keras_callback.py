"""catsdogs.keras.GradientNoiseScale in a user's own `fit`: B_simple in the epoch's logs, and
nothing the model trains changed by it, on each backend."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

# One fit of a small model with dropout on random images, in a process of the backend's own: the
# weights' digest, the History's b_simple, and the callback's own rows.
FIT = r"""
import hashlib, json, sys
import keras, numpy as np
import catsdogs.keras

def fit(kind, with_callback):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (96, 12, 12, 3)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 127).astype("float32")
    # "dropout": the two-batch estimator's kind of model; "article": a chain per-example products cover
    end = [keras.layers.Flatten(), keras.layers.Dropout(0.3)] if kind == "dropout" else \
        [keras.layers.MaxPooling2D(), keras.layers.Flatten()]
    model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Rescaling(1 / 255.0),
                              keras.layers.Conv2D(4, 3, activation="relu"), *end, keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    noise = catsdogs.keras.GradientNoiseScale((x, y), pairs=4) if with_callback else None
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[noise] if noise else [])
    digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()
    loss = model.loss
    return (digest, history.history.get("b_simple"), noise.history if noise else None,
            catsdogs.keras.articles_kind(model, loss))

out = {}
for kind in ("dropout", "article"):
    plain, with_noise = fit(kind, False), fit(kind, True)
    out[kind] = {"plain": plain[0], "with": with_noise[0], "logged": with_noise[1], "rows": with_noise[2],
                 "articles_kind": with_noise[3]}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_callback_logs_b_simple_and_changes_nothing_the_model_trains(keras_backend, tmp_path):
    # given a small model with dropout fitted twice from one seed, without and with the callback
    out = subprocess.run([sys.executable, "-c", FIT], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "KERAS_BACKEND": keras_backend})
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    # (the model with dropout is measured by the two-batch estimator, the chain by per-example products)
    assert (results["dropout"]["articles_kind"], results["article"]["articles_kind"]) == (False, True)
    for result in results.values():
        # then the weights are the same to the bit
        assert result["with"] == result["plain"]
        # and each epoch's logs (the History) hold B_simple, as the callback's own rows do
        rows = result["rows"]
        assert [r["epoch"] for r in rows] == [1, 2] and len(result["logged"]) == 2
        for logged, row in zip(result["logged"], rows, strict=True):
            assert (math.isnan(logged) and row["b_simple"] is None) or logged == pytest.approx(row["b_simple"])
            assert row["low"] is not None and row["seconds"] > 0


def test_bad_data_is_one_line_of_the_documented_error():
    from catsdogs.errors import CatsdogsError
    from catsdogs.keras import GradientNoiseScale

    with pytest.raises(CatsdogsError, match="give \\(images, labels\\)"):
        GradientNoiseScale([1, 2, 3])
    with pytest.raises(CatsdogsError, match="4 images but 3 labels"):
        GradientNoiseScale(([0] * 4, [0] * 3))
    with pytest.raises(CatsdogsError, match="every=0"):
        GradientNoiseScale(([0] * 4, [0] * 4), every=0)


@pytest.mark.parametrize("kwargs, said", [
    (dict(pairs=0), "pairs=0"), (dict(pairs=-1), "pairs=-1"), (dict(pairs=1), "pairs=1"),
    (dict(pairs=2.5), "pairs=2.5"), (dict(pairs=10**9), "must be at most 1,024"), (dict(pairs=True), "pairs=True"),
    (dict(micros=1), "micros=1"), (dict(micro=0), "micro=0"), (dict(seed="x"), "seed='x'"),
])
def test_a_bad_setting_is_refused_when_the_callback_is_made_not_after_an_epoch(kwargs, said):
    from catsdogs.errors import CatsdogsError
    from catsdogs.keras import GradientNoiseScale

    # given a setting no measurement can run with, then the constructor says so, in one line
    with pytest.raises(CatsdogsError, match=f"{said}.*whole number|whole number.*{said}|{said}") as refused:
        GradientNoiseScale(([0.0] * 4, [0] * 4), **kwargs)
    assert "\n" not in str(refused.value)


def test_labels_no_loss_can_read_are_refused_when_the_callback_is_made():
    from catsdogs.errors import CatsdogsError
    from catsdogs.keras import GradientNoiseScale

    with pytest.raises(CatsdogsError, match="labels are numbers a loss can read, got <U3"):
        GradientNoiseScale(([0.0] * 2, ["cat", "dog"]))


def _counted_fit(model, labels, loss, fit_labels=None):
    """`fit` one epoch of 8 random images with the callback (its data: the images and `labels`),
    and a counter of the epochs begun."""
    import keras
    import numpy as np

    from catsdogs.keras import GradientNoiseScale

    x = np.random.default_rng(0).random((8, 8, 8, 3)).astype("float32")
    begun = []
    counter = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: begun.append(epoch))
    model.compile(optimizer="sgd", loss=loss)
    noise = GradientNoiseScale((x, labels))
    model.fit(x, labels if fit_labels is None else fit_labels, epochs=1, batch_size=4, verbose=0,
              callbacks=[noise, counter])
    return begun


@pytest.mark.parametrize("outputs, labels, loss, said", [
    (2, [0, 1] * 4, ["binary_crossentropy", "binary_crossentropy"], "the model has 2 outputs"),
    (1, [0, 1, 2, 0, 1, 2, 0, 1], "binary_crossentropy", "labels up to 2, but the model's output has 1 class"),
])
def test_a_model_or_labels_the_callback_cannot_measure_are_refused_before_an_epoch_trains(outputs, labels, loss, said):
    import keras
    import numpy as np

    from catsdogs.errors import CatsdogsError

    # given a model of two outputs, or binary cross-entropy on labels of three classes
    inputs = keras.Input((8, 8, 3))
    flat = keras.layers.Flatten()(inputs)
    heads = [keras.layers.Dense(1, activation="sigmoid")(flat) for _ in range(outputs)]
    model = keras.Model(inputs, heads if outputs > 1 else heads[0])
    y = np.array(labels)
    begun: list = []
    # when `fit` starts with the callback, then it is refused in one line before the first epoch begins
    with pytest.raises(CatsdogsError, match=said):
        begun = _counted_fit(model, y, loss, fit_labels=[y] * outputs if outputs > 1 else None)
    assert begun == []


@pytest.mark.slow
def test_a_nan_in_the_data_gives_an_undetermined_reading_and_one_warning_not_a_confident_bound():
    import keras
    import numpy as np

    from catsdogs.keras import GradientNoiseScale

    # given images with a NaN pixel, as the callback's sample of the data (in every image, so that
    # every measurement draws one)
    rng = np.random.default_rng(0)
    x = rng.random((64, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 2, 64)
    sample = x.copy()
    sample[:, 1, 1, 0] = np.nan
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    noise = GradientNoiseScale((sample, y), pairs=4)
    # when it measures after each of two epochs
    with pytest.warns(RuntimeWarning, match="NaN or infinite") as warned:
        history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[noise])
    # then every reading is undetermined (NaN in all three logs, None in its history), said once
    for key in ("b_simple", "b_simple_low", "b_simple_high"):
        assert all(math.isnan(v) for v in history.history[key]), key
    assert all(r["b_simple"] is None and r["low"] is None and r["high"] is None for r in noise.history)
    assert len([w for w in warned if "NaN or infinite" in str(w.message)]) == 1


@pytest.mark.slow
def test_the_callbacks_b_simple_on_the_articles_model_agrees_with_the_sweeps_at_the_same_weights(prepared_data):
    # (TensorFlow: the estimator is one code on both backends, and the bit-identity test above runs both.
    # The same weights: a sweep's trial trains by the engine's own loop, so a user's `fit` of the same
    # seed reaches other weights, where B_simple differs by more than its interval: 44.7 to unbounded
    # against 6.1 here. What the callback must match is the sweep's measurement of the model it is given.)
    from types import SimpleNamespace

    import keras

    import catsdogs.keras
    from catsdogs.data import loading
    from catsdogs.data.loading import Split
    from catsdogs.gradient_noise import NoiseSampling
    from catsdogs.runtime import backends
    from catsdogs.training import engine
    from catsdogs.training.model import build_model, loss_and_metrics

    # given the article's model at 32 px fitted on 400 training images, seed 0, Adam, batch 32,
    # 2 epochs, the callback measuring at its defaults (16 pairs of 25 images)
    train = loading.load_dataset(prepared_data(32, (200, 20, 20)), "standard")["train"]
    keras.utils.set_random_seed(0)
    model = build_model(32)
    loss, metrics = loss_and_metrics()
    model.compile(optimizer="adam", loss=loss, metrics=metrics)
    noise = catsdogs.keras.GradientNoiseScale((train.images, train.labels))
    model.fit(train.images, train.labels, batch_size=32, epochs=2, verbose=0, callbacks=[noise])
    fitted = noise.history[-1]
    # when `sweep --noise-scale`'s measurement (8 pairs of 10 images, the epoch's own draw) is taken
    # of the same weights
    step = SimpleNamespace(user=None, model=model, loss=loss, compiled={})
    swept = engine.noise_estimate_at(step, Split(train.images, train.labels, []), NoiseSampling(), 0, 2,
                                     backends.current())
    # then the two 95% intervals of B_simple overlap, each bounded below and its estimate positive
    assert swept.low is not None and fitted["low"] is not None and fitted["b_simple"] > 0
    assert fitted["low"] <= (swept.high or math.inf) and swept.low <= (fitted["high"] or math.inf), (swept, fitted)
