"""A JAX worker process (started as `backend.start` starts one, on this CPU) training the article's
model three steps with one of Keras's JAX `nn` functions as catsdogs routes it and as Keras has it:
what the tests of jax_pool and jax_conv check of a whole model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

TRAIN = r"""
import json, sys
import numpy as np
import keras
from catsdogs.runtime import backends
from catsdogs.runtime.backends.jax import NAME
from catsdogs.training.model import build_model, loss_and_metrics
import keras.src.backend.jax.nn as nn

name, mark = sys.argv[1:3]
stock = getattr(nn, name)
backends.current().start()
routed = getattr(nn, name)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (16, 16, 16, 3), dtype=np.uint8)
labels = rng.integers(0, 2, (16, 1)).astype("float32")

def train(function):
    setattr(nn, name, function)
    keras.utils.set_random_seed(0)
    model = build_model(16)
    loss, metrics = loss_and_metrics()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, metrics=metrics)
    for _ in range(3):
        model.train_on_batch(images, labels)
    return np.concatenate([w.ravel() for w in model.get_weights()])

first, again, theirs = train(routed), train(routed), train(stock)
print(json.dumps({"backend": NAME, "installed": bool(getattr(routed, mark, False)),
                  "repeatable": bool(np.array_equal(first, again)), "same": bool(np.array_equal(first, theirs)),
                  "apart": float(np.max(np.abs(first - theirs)))}))
"""


def train_routed_and_stock(name: str, mark: str) -> dict:
    """{"backend", "installed" (nn.<name> carries `mark` after the worker's start), "repeatable"
    (the routed way's weights twice alike), "same" (the routed and Keras's weights alike, bit for
    bit), "apart" (their largest difference)}."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    out = subprocess.run([sys.executable, "-c", TRAIN, name, mark], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
