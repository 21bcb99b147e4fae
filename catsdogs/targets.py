"""A target a trial trains until (`sweep --until val_loss=0.45`, plan key `until`): what it means,
whether a point of the validation curve reaches it, and where between two evaluations the curve
crossed it. Framework-free: the engine stops on it, the analysis reads it back.

A validation curve (`sweep --eval-every N`) is a list of points, one per evaluation: the step
(optimizer updates so far), the images seen, the training seconds so far, val_loss and
val_accuracy. Its first point is the model as it starts (step 0).

How a crossing is placed: between the last evaluation that had not reached the target and the
first that has, linearly in the metric. With values m0 (not reached) and m1 (reached) at steps
s0 and s1, the fraction f = (m0 - target) / (m0 - m1) of the way from s0 to s1, and the images
and seconds at the same fraction. A curve is only seen at its evaluations, so the true crossing
lies somewhere in (s0, s1]: the interpolation takes the straight line between them, which is
exact for a curve straight there and off by at most s1 - s0 otherwise (the `--eval-every`
spacing, in the steps of that batch size). A target reached at the first point (before any
update) crosses at step 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from catsdogs.errors import SettingError

# The metrics a target may be on, and which way reaches it. Validation only: a trial is stopped
# by what it has not trained on. val_loss's values are the binary cross-entropy (chance: ln 2).
METRICS = {"val_loss": "at most", "val_accuracy": "at least"}
# The sweep's options (catsdogs.schema's fields `until` and `eval_every` carry them)
UNTIL_HELP = (
    "Train each trial until a validation target, METRIC=VALUE: val_loss=0.45 (reached at or below) or "
    "val_accuracy=0.8 (at or above), checked at each --eval-every evaluation, or until its --epochs "
    "(--max-epochs) run out: 'not reached', recorded so. The store gets the steps, images and training "
    "seconds to the target, interpolated between the evaluations around it (catsdogs/targets.py). "
    "Part of the trial's identity.")
EVAL_EVERY_HELP = (
    "Evaluate the validation split each time N more training images have been seen (at the first step "
    "boundary after), at one evaluation batch size whatever the training batch, and record the curve: "
    "step, images, training seconds, val_loss, val_accuracy. Outside the training clock; trains exactly "
    "as without it, so no part of a trial's identity unless --until stops on it.")
# What a crossing places between two evaluations (a curve point also holds val_loss, val_accuracy)
CROSSED = ("step", "examples", "train_seconds")


@dataclass(frozen=True)
class Target:
    metric: str
    value: float

    def reached(self, point: dict) -> bool:
        """True when `point` (a curve point, or any dict holding the metric) reaches the target."""
        x = point.get(self.metric)
        if x is None or not math.isfinite(x):
            return False
        return x <= self.value if self.metric == "val_loss" else x >= self.value

    def text(self) -> str:
        """The canonical spelling, `val_loss=0.45`: what a trial's configuration holds, so two
        spellings of one target (0.450, .45) are one trial."""
        return f"{self.metric}={self.value!r}"

    def describe(self) -> str:
        return f"{self.metric} {'<=' if self.metric == 'val_loss' else '>='} {self.value:g}"


def parse(text, key: str = "until") -> Target:
    """'val_loss=0.45' -> Target('val_loss', 0.45), or a SettingError naming `key` saying what a
    target may be: val_loss above 0, val_accuracy above 0 and at most 1."""
    if isinstance(text, Target):
        return text
    if not isinstance(text, str) or text.count("=") != 1:
        raise SettingError(f"must be METRIC=VALUE with METRIC one of {', '.join(METRICS)} "
                           f"(like val_loss=0.45), got {text!r}", key)
    metric, raw = (part.strip() for part in text.split("="))
    if metric not in METRICS:
        raise SettingError(f"unknown metric {metric!r} in {text!r}; choose from {', '.join(METRICS)} "
                           "(the validation split's: a trial stops on what it does not train on)", key)
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{raw!r} in {text!r} is not a number", key) from None
    if metric == "val_loss" and not (math.isfinite(value) and value > 0):
        raise SettingError(f"a val_loss target must be a positive number (chance is ln 2 = 0.693), got {raw}", key)
    if metric == "val_accuracy" and not (0 < value <= 1):
        raise SettingError(f"a val_accuracy target is a fraction above 0 and at most 1 (0.8, not 80), got {raw}", key)
    return Target(metric, value)


def check_trial(until: str | None, eval_every: int | None) -> None:
    """A trial's target and the evaluations it is checked at come together, or neither."""
    if until is not None:
        parse(until)
    if until is not None and eval_every is None:
        raise SettingError(f"{until} is checked at evaluations: give eval_every too (--eval-every N: "
                           "evaluate each time N more training images have been seen)", "until")
    if until is None and eval_every is not None:
        raise SettingError("is a trial's field only with a target (until): without one it is the "
                           "sweep's measurement", "eval_every")


def check_plan(plan: dict) -> None:
    """A target (a grid's `until`) needs evaluations to be checked at (`eval_every`); `max_epochs`,
    the cap of a trial that trains until a target, needs one, and is the only cap given."""
    until = any(grid.get("until") not in (None, []) for grid in plan["grids"].values())
    if until and plan.get("eval_every") is None:
        raise SettingError("a target is checked at evaluations: give eval_every too (--eval-every N: evaluate "
                           "each time N more training images have been seen)", "until")
    if "max_epochs" in plan:
        if not until:
            raise SettingError("caps a trial that trains until a target: give until (--until) too, or give "
                               "epochs", "max_epochs")
        if "epochs" in plan or any("epochs" in grid for grid in plan["grids"].values()):
            raise SettingError("and epochs both cap the trials: give one", "max_epochs")


def canonical(text: str | None) -> str | None:
    """A target's canonical spelling (Target.text), None for none."""
    return None if text is None else parse(text).text()


def crossing(curve: list[dict], target: Target) -> dict | None:
    """Where `curve` first reaches `target`: {"step", "examples", "train_seconds"} interpolated
    between the evaluations around it (the module's docstring says how), or None when no point
    reaches it."""
    for i, point in enumerate(curve):
        if not target.reached(point):
            continue
        if i == 0:
            return {k: float(point[k]) for k in CROSSED}
        before = curve[i - 1]
        m0, m1 = before[target.metric], point[target.metric]
        f = 1.0 if m0 == m1 else min(1.0, max(0.0, (m0 - target.value) / (m0 - m1)))
        return {k: before[k] + f * (point[k] - before[k]) for k in CROSSED}
    return None


def record_fields(curve: list[dict] | None, until: str | None) -> dict:
    """A trial's columns for its target: whether it was reached (1 or 0), and the steps, images
    and training seconds to it (None when not reached). Nothing without a target."""
    if until is None or curve is None:
        return {}
    at = crossing(curve, parse(until))
    return {"target_reached": int(at is not None),
            "steps_to_target": round(at["step"], 3) if at else None,
            "examples_to_target": round(at["examples"], 1) if at else None,
            "seconds_to_target": round(at["train_seconds"], 4) if at else None}
