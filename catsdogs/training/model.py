"""The article's model and its loss (what it costs, without a framework: catsdogs.training.costs)."""

from __future__ import annotations

import keras
from keras import layers


def build_model(size: int = 200) -> keras.Sequential:
    """Conv2D(32) -> MaxPool -> Flatten -> Dense(128) -> Dense(1): the article's network.

    Images come in as uint8 and are scaled by 1/255 inside the model, as the article's
    ImageDataGenerator(rescale=1/255) did on the host: a quarter of the bytes cross to the
    device, and the layer has no weights, so the parameter count is the article's.

    The last layer's sigmoid is folded into the loss (`loss_and_metrics`: from logits), so the model outputs
    the logit. That is what the article's TensorFlow did with its sigmoid output: Keras on
    TensorFlow recovers the logit behind a sigmoid and computes the cross-entropy from it. Keras on
    JAX cannot: it clips the saturated probability, whose gradient is then zero, and every Adam
    trial at the article's learning rate collapsed to chance there (synthetic 64 px, 2 seeds)."""
    return keras.Sequential(
        [
            keras.Input((size, size, 3), dtype="uint8"),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"),
            layers.MaxPooling2D((2, 2)),
            layers.Flatten(),
            layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
            layers.Dense(1, dtype="float32"),  # the logit; float32 under mixed precision too
        ],
        name="article_cnn",
    )


def loss_and_metrics():
    """The article's loss and metric for a model that outputs the logit: binary cross-entropy of
    the sigmoid, accuracy of sigmoid > 0.5 (logit > 0)."""
    return (keras.losses.BinaryCrossentropy(from_logits=True),
            [keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0)])
