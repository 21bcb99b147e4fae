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
    step = SimpleNamespace(user=None, model=model, loss=loss, gram_functions={})
    swept = engine.noise_estimate_at(step, Split(train.images, train.labels, []), NoiseSampling(), 0, 2,
                                     backends.current())
    # then the two 95% intervals of B_simple overlap, each bounded below and its estimate positive
    assert swept.low is not None and fitted["low"] is not None and fitted["b_simple"] > 0
    assert fitted["low"] <= (swept.high or math.inf) and swept.low <= (fitted["high"] or math.inf), (swept, fitted)
