"""What a trained model does on the test images: whether it predicts one class for all of them
(a collapse), and why it might (`diagnose`); and the same of the model as it starts, once per
seed (`initial_diagnosis`). Read from the article's hidden Dense layer (steps.inspection_model);
a user's model has none, and no diagnosis. Runs inside a worker.
"""

from __future__ import annotations

import keras
import numpy as np

from catsdogs.schema import TrialConfig
from catsdogs.training import steps


def diagnose(step: steps.TrainingStep, batches, prefix: str = "") -> dict:
    """What the model does on every image of `batches` (the test set): whether it predicts one
    class for all of them (a collapse), and why it might.

    - dog_share: the share of images predicted Dog (logit > 0); 0 or 1 is a collapse;
    - dead_units: the share of the Dense(128) layer's ReLU units that output 0 for every image.
      With all 128 dead the logit is the last bias alone, the same for every image, and no
      gradient reaches the layers below: the model cannot leave the collapse;
    - logit_abs: the mean |logit|; a large one at step 0 means saturated sigmoids, a first
      gradient of the largest size, and a first Adam step that can push units dead;
    - logit_sd: how much the logit varies between images (0 for a constant prediction)."""
    if step.inspect is None:  # a user's model: no hidden layer of the article's to read
        return {}
    return _diagnosis(*step.inspect.predict(batches, verbose=0), prefix)


def test_and_diagnose(step: steps.TrainingStep, batches, labels: np.ndarray) -> tuple[float, float, dict]:
    """The trained model's test loss and accuracy over `batches` (the test set, whose labels are
    `labels`), and its `diagnose`, from one pass over the images where there is a diagnosis: the
    hidden layer's pass gives the logits, from which the model's own loss object and its metric's
    rule (logit > 0 is Dog) give what `model.evaluate` would (the same float32 loss but for the
    order its sum is taken in; the same accuracy). Two passes, evaluate's then the diagnosis's,
    cost a trial a forward pass over the test set more (0.08 s at 400 images on this CPU). A
    user's model: the backend's `evaluate` (`model.evaluate`'s figures), and no diagnosis."""
    if step.inspect is None:
        loss, accuracy = step.backend.evaluate(step.model, batches, step.compiled)
        return loss, accuracy, {}
    hidden, logits = step.inspect.predict(batches, verbose=0)
    labels = np.asarray(labels, dtype=np.float32).reshape(-1, 1)
    # the compiled loss object's per-image values, averaged here: its own reduction divides by a
    # tf.distribute strategy's replicas when called in its scope, as the trial's test is
    per_image = step.loss.call(labels, np.asarray(logits, dtype=np.float32).reshape(-1, 1))
    loss = float(np.mean(keras.ops.convert_to_numpy(per_image), dtype=np.float32))
    accuracy = float(np.mean((np.asarray(logits).ravel() > 0) == (labels.ravel() > 0.5)))
    return loss, accuracy, _diagnosis(hidden, logits, "")


def _diagnosis(hidden, logits, prefix: str) -> dict:
    logits = np.asarray(logits, dtype=np.float64).ravel()
    alive = np.asarray(hidden).reshape(len(logits), -1).max(axis=0) > 0
    share = float((logits > 0).mean())
    out = {"dog_share": share, "dead_units": float(1 - alive.mean()),
           "logit_abs": float(np.abs(logits).mean()), "logit_sd": float(logits.std())}
    if not prefix:
        out["collapsed"] = int(share in (0.0, 1.0))
    return {prefix + k: round(v, 6) if isinstance(v, float) else v for k, v in out.items()}


_INITIAL: dict[tuple, dict] = {}  # the initial diagnoses, by what decides them, oldest first
MOST_INITIAL = 64  # kept at once (a race interleaves up to 18 seeds; each a few numbers)


def initial_diagnosis(step: steps.TrainingStep, cfg: TrialConfig, test_batches) -> dict:
    """`diagnose` of the model as it starts. Every trial of a seed starts from the same weights
    (whatever its optimizer or batch size) and tests on the same images at one batch size, so the
    answer is the same for all of them: made once per seed, model, image size, precision and data
    set, MOST_INITIAL of them kept (a sweep runs seed-major, but a race runs an arm at a time over
    up to 18 seeds: keeping the last seed's alone, every race trial paid a pass over the test set
    for it, as the curve's first point did before it kept MOST_STARTS)."""
    key = (step.user, cfg.image_size, cfg.precision, cfg.seed, cfg.data, cfg.dataset)
    if key not in _INITIAL:
        if len(_INITIAL) >= MOST_INITIAL:
            _INITIAL.pop(next(iter(_INITIAL)))  # the oldest
        _INITIAL[key] = diagnose(step, test_batches, prefix="initial_")
    return dict(_INITIAL[key])
