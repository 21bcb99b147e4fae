"""The article's model, and what it costs: parameters, FLOPs, memory."""

from __future__ import annotations

import keras
from keras import layers


def build_model(size: int = 200) -> keras.Sequential:
    """Conv2D(32) -> MaxPool -> Flatten -> Dense(128) -> Dense(1): the article's network.

    Images come in as uint8 and are scaled by 1/255 inside the model, as the article's
    ImageDataGenerator(rescale=1/255) did on the host: a quarter of the bytes cross to the
    device, and the layer has no weights, so the parameter count is the article's."""
    return keras.Sequential(
        [
            keras.Input((size, size, 3), dtype="uint8"),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(32, (3, 3), activation="relu", kernel_initializer="he_uniform", padding="same"),
            layers.MaxPooling2D((2, 2)),
            layers.Flatten(),
            layers.Dense(128, activation="relu", kernel_initializer="he_uniform"),
            layers.Dense(1, activation="sigmoid", dtype="float32"),  # float32 under mixed precision too
        ],
        name="article_cnn",
    )


def parameter_count(size: int = 200) -> int:
    """Closed form of build_model(size).count_params(); 40,961,153 at 200 px."""
    flat = (size // 2) * (size // 2) * 32
    return (3 * 3 * 3 * 32 + 32) + (flat * 128 + 128) + (128 + 1)


def train_flops_per_image(size: int = 200) -> float:
    """Floating-point operations of one training step, per image (multiply-add = 2 FLOPs).

    The backward pass costs about twice the forward pass (gradients for inputs and weights);
    the first layer needs no input gradient, which this ignores (it overestimates by <1%)."""
    conv = 2 * size * size * (3 * 3 * 3) * 32
    flat = (size // 2) * (size // 2) * 32
    dense = 2 * flat * 128 + 2 * 128
    return 3.0 * (conv + dense)
