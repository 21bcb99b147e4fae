"""Models that are not the article's, for `--model` (issue 35's measurements): a small ResNet with
BatchNormalization, and keras.applications' MobileNet without weights, both at 32 px, two classes;
and a small CNN ending in a softmax, raced on a folder of images (issue 62).

    catsdogs find-batch-size --model examples.example_models:resnet_small --memory-limit 2GiB
    catsdogs find-batch-size --model examples.example_models:mobilenet --memory-limit 2GiB
    catsdogs find-batch-size --model examples.example_models:small_cnn --data PetImages --race

Run from the repository's root, so that `examples.example_models` imports.
"""

from __future__ import annotations

import keras
from keras import layers

SIZE = 32


def _block(x, filters: int, stride: int):
    shortcut = x
    y = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
    y = layers.BatchNormalization()(y)
    y = layers.ReLU()(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False)(y)
    y = layers.BatchNormalization()(y)
    if stride != 1 or shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(shortcut)
        shortcut = layers.BatchNormalization()(shortcut)
    return layers.ReLU()(layers.Add()([y, shortcut]))


def resnet_small(size: int = SIZE, classes: int = 2) -> keras.Model:
    """A ResNet of 3 stages x 2 basic blocks (16, 32, 64 filters), as CIFAR's ResNet-14."""
    inputs = keras.Input((size, size, 3))
    x = layers.Rescaling(1 / 255)(inputs)
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    for filters, stride in ((16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)):
        x = _block(x, filters, stride)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(1 if classes == 2 else classes)(x), name="resnet_small")


def mobilenet(size: int = SIZE, classes: int = 2) -> keras.Model:
    """keras.applications.MobileNet without weights (alpha 0.5), a logit head."""
    inputs = keras.Input((size, size, 3))
    base = keras.applications.MobileNet(input_shape=(size, size, 3), alpha=0.5, include_top=False, weights=None,
                                        pooling="avg")
    x = base(layers.Rescaling(1 / 127.5, offset=-1)(inputs))
    return keras.Model(inputs, layers.Dense(1 if classes == 2 else classes)(x), name="mobilenet")


def small_cnn(size: int = SIZE, classes: int = 2) -> keras.Model:
    """A user's own small network: two convolution blocks and a softmax over `classes` (24k
    parameters): what `find-batch-size --race --model` races on a folder of images in minutes on a
    CPU (docs/results.md, "A model of yours raced")."""
    inputs = keras.Input((size, size, 3))
    x = layers.Rescaling(1 / 255)(inputs)
    for filters in (16, 32):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x), name="small_cnn")
