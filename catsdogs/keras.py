"""The gradient noise scale in your own training: a Keras callback (issue 48's item 2).

    import catsdogs.keras

    noise = catsdogs.keras.GradientNoiseScale((x_train, y_train))
    model.fit(x_train, y_train, epochs=5, callbacks=[noise])
    noise.history            # [{"epoch": 1, "b_simple": 41.5, "low": 20.3, "high": 190.2, ...}, ...]

After every `every`-th epoch it measures B_simple (McCandlish et al. 2018) at the model's current
weights with the estimator find-batch-size uses, by find-batch-size's own code
(catsdogs.training.engine.noise_estimate_at): for a model of the article's kind (a chain of Dense
and Conv2D layers, one logit, binary cross-entropy from it) per-example gradient products over
`pairs` batches of 25 images (12 by default: CALLBACK_PAIRS says why); for any other model the two-batch estimator on ordinary gradients,
`pairs` large batches of `micros` micro-batches of `micro` images; each drawn with replacement
from the data you hand it, by a generator of its own; and
writes it into the epoch's `logs` (`b_simple`, `b_simple_low`, `b_simple_high`: NaN where the
interval has no end), so Keras's `History`, `CSVLogger` and `TensorBoard` callbacks record it.

It changes nothing the model trains: the gradients are taken statelessly from the variables'
values (BatchNormalization's statistics and a dropout's seed move in no variable), its batches
come from its own generator, and no weight, optimizer slot or metric is touched; the weights after
`fit` are the same, bit for bit, with and without it (tests/surfaces/test_keras_callback.py, both backends).
Its cost: about a training step of 400 images a measurement for the article's kind, a gradient a
micro-batch (`pairs * micros`) for any other (benchmarks/bench_callback.py times it against the
training it rides on).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import keras
import numpy as np

from catsdogs import gradient_noise
from catsdogs.errors import CatsdogsError, SettingError
from catsdogs.gradient_noise import NoiseSampling
from catsdogs.keywords import keyword
from catsdogs.measure.noise_run import NOISE_PAIRS, noise_sampling, user_noise_sampling

# Pairs a measurement: find-batch-size's 16 less a quarter, so that a measurement costs at most 15%
# of an epoch of the article's 1,200 training images at 64 px (benchmarks/bench_callback.py: 0.22 s,
# 18.5% of a 1.2 s epoch, at 16; 0.18 s at 12); the price, an interval about 15% wider
# (sqrt(16/12)), is paid once a measurement, where find-batch-size pools four seeds'.
CALLBACK_PAIRS = NOISE_PAIRS * 3 // 4


class GradientNoiseScale(keras.callbacks.Callback):
    """B_simple after every `every`-th epoch of `fit`, from `data` = (images, labels), the
    training data or a sample of it, as the model takes them. `loss`: the loss to differentiate
    (default: the one the model was compiled with). `seed`: the measurement's own generator."""

    def __init__(self, data, every: int = 1, pairs: int = CALLBACK_PAIRS, micros: int | None = None,
                 micro: int | None = None, loss=None, seed: int = 0):
        super().__init__()
        try:
            images, labels = data
        except (TypeError, ValueError):
            raise CatsdogsError("GradientNoiseScale(data): give (images, labels), two arrays of one length") from None
        self.images, self.labels = np.asarray(images), np.asarray(labels)
        if len(self.images) != len(self.labels):
            raise CatsdogsError(f"GradientNoiseScale(data): {len(self.images)} images but {len(self.labels)} labels")
        if self.labels.dtype.kind not in "iub" and not (self.labels.dtype.kind == "f" and
                                                         np.isfinite(self.labels).all()):
            raise CatsdogsError(f"GradientNoiseScale(data): labels are numbers a loss can read, got "
                                f"{self.labels.dtype} labels")
        for name, value in (("every", every), ("pairs", pairs), ("micros", micros), ("micro", micro), ("seed", seed)):
            try:  # the keywords' table (catsdogs.keywords), None taken where a default is None
                keyword(name).check(value, name)
            except SettingError as exc:
                raise SettingError(f"GradientNoiseScale({name}={value!r}): {exc}", name) from None
            if value is None and name not in ("micros", "micro"):
                raise SettingError(f"GradientNoiseScale({name}=None): must be a whole number", name)
        every, pairs, seed = int(every), int(pairs), int(seed)
        self.every, self.pairs, self.seed, self._loss = every, pairs, seed, loss
        self._micro, self._micros = micro, micros
        self.history: list[dict] = []  # one row a measurement: epoch, b_simple, low, high, seconds
        self._cache: dict = {}  # the backend's compiled gradient function, kept between epochs
        self._warned = False  # a measurement that was not a number said once

    def sampling(self) -> NoiseSampling:
        """What one measurement of the two-batch estimator draws: find-batch-size's for a model of
        one's own (catsdogs.measure.noise_run.user_noise_sampling: larger micro-batches with
        BatchNormalization, where a micro-batch normalises over its own images), unless given."""
        from catsdogs.training.user_model import has_batch_norm

        own = user_noise_sampling(has_batch_norm(self.model))
        micro = self._micro or own.micro
        sampling = NoiseSampling(micro=micro, micros=self._micros or own.micros, pairs=self.pairs)
        sampling.check()
        if len(self.images) < micro:
            raise CatsdogsError(f"GradientNoiseScale: {len(self.images)} images, fewer than a micro-batch of {micro}")
        return sampling

    def measure(self, epoch: int) -> gradient_noise.NoiseEstimate:
        """B_simple at the model's current weights (`epoch` seeds the draw, as in a sweep), by
        find-batch-size's own code (catsdogs.training.engine.noise_estimate_at): per-example
        products for a model of the article's kind, else the two-batch estimator."""
        from catsdogs.data.loading import Split
        from catsdogs.runtime import backends
        from catsdogs.training import engine

        loss = self._single_loss()
        article = self._micro is None and self._micros is None and articles_kind(self.model, loss)
        articles = noise_sampling()  # find-batch-size's for the article's model: pairs of 1 and 25 images
        sampling = (NoiseSampling(micro=articles.micro, micros=articles.micros, pairs=self.pairs) if article
                    else self.sampling())
        # engine's view of a trained model: the article's (user None) or any other, its loss, its cache
        step = SimpleNamespace(user=None if article else ("callback", "auto"), model=self.model, loss=loss,
                               compiled=self._cache)
        return engine.noise_estimate_at(step, Split(self.images, self.labels, []), sampling, self.seed, epoch,
                                        backends.current())

    def on_train_begin(self, logs=None):
        """What `fit` hands it, checked before an epoch trains: one output, one loss, the labels'
        range within the output's classes."""
        try:
            outputs = self.model.outputs or []
        except (AttributeError, ValueError):
            outputs = []
        if len(outputs) > 1:
            raise CatsdogsError(f"GradientNoiseScale: the model has {len(outputs)} outputs; it measures a model of one")
        self._single_loss()
        width = int(outputs[0].shape[-1]) if outputs and outputs[0].shape[-1] is not None else None
        top = int(np.max(self.labels)) if self.labels.size and self.labels.dtype.kind in "iub" else None
        if width is not None and top is not None and top >= max(2, width):
            raise CatsdogsError(f"GradientNoiseScale(data): labels up to {top}, but the model's output has {width} "
                                f"class{'es' if width != 1 else ''}")

    def _single_loss(self):
        """The loss to differentiate (given, or the model's compiled one), as Keras resolves a name;
        a CatsdogsError where there is no single one."""
        loss = self._loss or getattr(self.model, "loss", None)
        try:
            loss = keras.losses.get(loss) if isinstance(loss, str) else loss
        except ValueError:
            raise CatsdogsError(f"GradientNoiseScale(loss={loss!r}): not a loss Keras knows") from None
        if loss is None or isinstance(loss, list | dict):
            raise CatsdogsError("GradientNoiseScale: the model has no single loss to differentiate: compile it with "
                                "one, or give loss=")
        return loss

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        e = self.measure(epoch + 1)
        if not all(v is not None and math.isfinite(v) for v in (e.gradient_sq, e.trace)):
            e = self._undetermined(e)
        row = {"epoch": epoch + 1, "b_simple": e.b_simple, "low": e.low, "high": e.high, "seconds": e.seconds}
        self.history.append(row)
        if logs is not None:  # numbers only: History and CSVLogger take NaN where an end is open
            for key, value in (("b_simple", e.b_simple), ("b_simple_low", e.low), ("b_simple_high", e.high)):
                logs[key] = math.nan if value is None else float(value)


    def _undetermined(self, e: gradient_noise.NoiseEstimate) -> gradient_noise.NoiseEstimate:
        """A measurement whose gradients were not numbers (a NaN or infinity in the data or the
        weights): no reading, NaN in all three logs, said once."""
        if not self._warned:
            import warnings

            warnings.warn("GradientNoiseScale: a gradient was NaN or infinite (the data or the weights hold one): "
                          "the noise scale is undetermined, logged as NaN", RuntimeWarning, stacklevel=2)
            self._warned = True
        from dataclasses import replace

        return replace(e, b_simple=None, low=None, high=None)


def articles_kind(model, loss) -> bool:
    """Whether find-batch-size's per-example products cover `model` (catsdogs.runtime.backends.per_example):
    a chain of Dense and Conv2D layers and the weightless layers it knows, one logit out, and
    binary cross-entropy from it. Its cost is about a training step a measurement, where the
    two-batch estimator's is a gradient for each of its micro-batches."""
    from catsdogs.runtime.backends import per_example

    if not isinstance(model, keras.Sequential) or not isinstance(loss, keras.losses.BinaryCrossentropy):
        return False
    try:
        per_example.tapped_layers(model)
    except ValueError:
        return False
    last = model.layers[-1]
    return (loss.get_config().get("from_logits") is True and int(model.outputs[0].shape[-1]) == 1
            and isinstance(last, keras.layers.Dense) and getattr(last.activation, "__name__", "") == "linear")

