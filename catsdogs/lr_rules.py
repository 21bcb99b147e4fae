"""The learning-rate rules: how a rate tuned at one batch size carries to another. One table, read
by a trial's `lr_scaling` (catsdogs.schema.learning_rate) and by find-batch-size's recommendation
(catsdogs.recommendation.learning_rate), which names each rule by its key and prints its text."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from catsdogs.gradient_noise import paper_learning_rate


@dataclass(frozen=True)
class Rule:
    """A rule: `rate(base_lr, base_batch, batch, b_noise)` the rate at `batch` for `base_lr` at
    `base_batch`. `trial`: a trial's `--lr-scaling` may name it (a rule that needs the noise scale
    cannot: a trial has none before it trains); `without_noise`: the rule used in its place where
    the noise scale is not resolved."""

    name: str
    text: str  # what find-batch-size prints of it
    rate: Callable[[float, int, int, float | None], float]
    trial: bool = True
    without_noise: str | None = None


RULES = {r.name: r for r in (
    Rule("none", "the rate kept at every batch size, eps(B) = eps(base)",
         lambda lr, base, batch, b_noise: lr),
    Rule("linear", "the linear scaling rule, eps(B) = eps(base) B/base (Goyal et al. 2017): SGD's when the noise "
                   "scale is not resolved",
         lambda lr, base, batch, b_noise: lr * (batch / base)),
    Rule("sqrt", "the square-root rule for Adam, eps(B) = eps(base) sqrt(B/base) (Malladi et al. 2022, the SDE of "
                 "adaptive methods)",
         lambda lr, base, batch, b_noise: lr * math.sqrt(batch / base)),
    Rule("paper", "the paper's rule for SGD, eps(B) = eps(base) (1 + B_noise/base) / (1 + B_noise/B) "
                  "(McCandlish et al. 2018)",
         lambda lr, base, batch, b_noise: paper_learning_rate(lr, base, batch, b_noise),
         trial=False, without_noise="linear"),
    Rule("paper-low", "the paper's rule for SGD at the low end of B_noise's interval, open above, eps(B) = eps(base) "
                      "(1 + low/base) / (1 + low/B) (McCandlish et al. 2018): the least rate any B_noise in the "
                      "interval gives above the base batch, where the linear rule (B_noise unbounded) gives the most",
         lambda lr, base, batch, b_noise: paper_learning_rate(lr, base, batch, b_noise or 0.0), trial=False),
)}
TRIAL_SCALINGS = tuple(name for name, rule in RULES.items() if rule.trial)  # a trial's --lr-scaling values


def scaled(rule: str, base_lr: float, base_batch: int, batch: float, b_noise: float | None = None
           ) -> tuple[float, str]:
    """(the rate at `batch` by `rule`, anchored at `base_lr` for `base_batch`; the rule's name as
    applied: `without_noise`'s where the rule needs a noise scale and `b_noise` is None)."""
    if not b_noise and RULES[rule].without_noise:
        rule = RULES[rule].without_noise
    return RULES[rule].rate(base_lr, base_batch, batch, b_noise), rule
