"""Which batch size to train with, and at what learning rate: find-batch-size's decision, from what
it measured (the sizes that fit under the margin, their speed, the gradient noise scale) and
the time-to-target model (catsdogs.goodput). Pure functions, no framework; the report reads the
same rules.

The recommendation (`recommend`) is the size predicted to reach a target soonest among the sizes
that passed, no larger than the margin's (goodput.choose: the paper's steps times each probe's
step time), with the limit that binds (memory, speed or statistics; the data or --max where the
search stopped at its bound with room to spare) and a learning rate by the optimizer's rule
(`learning_rate`): the paper's for SGD with a resolved noise scale, at its interval's low end above
the base batch where the interval is open above, else linear; the square-root
rule for Adam; anchored at a tuned rate from a store (--from-store) at the tuned batch size
nearest the recommendation, else at the best of the noise scale's short runs at 1, 3 and 10
times Keras's default at the base batch size, 32 (catsdogs.measure.noise_run), else (no noise
scale measured) at Keras's default itself, said so (`anchor_at`).
"""

from __future__ import annotations

import math

from catsdogs import goodput, lr_rules
from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.messages import ProbeRecord
from catsdogs.optimizers import OPTIMIZERS
from catsdogs.schema import DEFAULT_LR, TrialConfig, default
from catsdogs.schema import learning_rate as trial_learning_rate


def fastest(probes: list[ProbeRecord], bound: int | None = None) -> dict | None:
    """{"batch_size", "images_per_second"} of the size that passed fastest per image, no larger than
    `bound` (the search's: a user's model's memory probe may lie above the training images, which
    no batch can be trained on); None if none did."""
    fits = [p for p in goodput.passed(probes).values() if bound is None or p.batch_size <= bound]
    top = max(fits, key=lambda p: p.images_per_second) if fits else None
    return {"batch_size": top.batch_size, "images_per_second": top.images_per_second} if top else None


def recommend(probes: list[ProbeRecord], safe: int, optimizer: str, estimate: NoiseEstimate | None,
              anchor: dict | None = None, bound_by: str | None = None) -> dict | None:
    """The recommendation as find_batch_size.json holds it: the size predicted to reach a target
    soonest at or below `safe` (goodput.choose, its table and near-best sets), and its learning
    rate by the optimizer's rule from `anchor_at`'s rate. `bound_by`: "data" or "max" where the
    search stopped at that bound and `safe` is the largest size it tried, which then binds a
    recommendation at `safe` in memory's place. None when no size passed."""
    chosen = goodput.choose(probes, safe, estimate)
    if not chosen:
        return None
    if chosen["binding"] == "memory" and bound_by in ("data", "max"):
        chosen["binding"] = bound_by
    base, base_lr, said = anchor_at(chosen["batch_size"], optimizer, anchor)
    lr, rule = learning_rate(optimizer, chosen["batch_size"], base_lr, base, *rule_noise(chosen))
    return {**chosen, "learning_rate": lr, "learning_rate_rule": rule, "learning_rate_anchor": said,
            "linear_learning_rate": linear_scaled_lr(optimizer, chosen["batch_size"]),
            "base_learning_rate": base_lr, "base_batch_size": base}


def rule_noise(chosen: dict) -> tuple[float | None, float | None]:
    """(B_noise, the low end of an interval open above) as `learning_rate` reads them from a choice
    (goodput.choose's, or find_batch_size.json's recommendation): the estimate where resolved, the
    low end where open above, neither else."""
    statistics = chosen.get("statistics")
    return (chosen.get("b_noise") if statistics == "resolved" else None,
            (chosen.get("interval") or [None])[0] if statistics == "open above" else None)


def anchor_at(batch_size: int, optimizer: str, anchor: dict | None) -> tuple[int, float, str]:
    """(the batch size, its rate, what the rate is) the learning rate at `batch_size` is scaled
    from: a tuned rate from a store (--from-store: catsdogs.analysis.anchor), at the tuned batch
    size nearest `batch_size` on a log scale (the rule then carries it the shortest way), or the
    short runs' best at the base batch size (`anchor["said"]` says which); else Keras's default
    at the base batch size."""
    if not anchor:
        return default("base_batch_size"), DEFAULT_LR[optimizer], "Keras's default"
    rates = {int(b): float(lr) for b, lr in anchor["rates"].items()}
    base = min(rates, key=lambda b: (abs(math.log(b / batch_size)), b))
    edge = " (at its grid's edge: the best may lie beyond)" if base in {int(b) for b in anchor.get("edges", [])} else ""
    said = anchor.get("said") or f"the tuned rate of the {anchor['kind']} sweep {anchor['sweep']!r}"
    return base, rates[base], f"{said}{edge}"


def short_run_anchor(test: dict | None) -> dict | None:
    """The learning-rate anchor the noise scale's short runs give (noise_run.rate_test), in the
    form a store's tuned rates take (recommendation.anchor_at); None when none was chosen."""
    if not test or test.get("chosen") is None:
        return None
    b = test["batch_size"]
    grid = ", ".join(f"{r:g}" for r in test["rates"])
    return {"kind": "short-run", "rates": {b: test["chosen"]}, "edges": [b] if test["edge"] else [],
            "said": f"the best of the noise scale's short runs at {grid} (the least final loss after "
                    f"{test['epochs']} epochs at batch size {b})"}


def linear_scaled_lr(optimizer: str, batch_size: int) -> float:
    """The linear scaling rule from the optimizer's Keras default at the base batch size: the
    learning rate a trial with `--lr-scaling linear` trains with."""
    return trial_learning_rate(TrialConfig(optimizer, batch_size, "standard", 0, lr_scaling="linear"))


# --- the rules -------------------------------------------------------------------------------------


def learning_rate(optimizer: str, batch_size: int, base_lr: float, base_batch: int,
                  b_noise: float | None, open_low: float | None = None) -> tuple[float, str]:
    """(the learning rate at `batch_size`, its rule's name in catsdogs.lr_rules.RULES), anchored at
    `base_lr` for `base_batch` by the optimizer's rule (catsdogs.optimizers): SGD's the paper's with
    a resolved noise scale; where B_noise's interval is open above (`open_low`, its low end), above
    the base batch the paper's at that end, the least rate the interval allows (the linear rule,
    B_noise unbounded, printed 0.8 at 256 from 0.1 at 32 where 0.3 collapsed at 32), below it
    linear; else linear. Adam's the square-root rule, whose SDE argument holds for adaptive
    methods where the linear one does not."""
    rule = OPTIMIZERS[optimizer].rule
    if rule == "paper" and b_noise is None and open_low is not None and batch_size > base_batch:
        return lr_rules.RULES["paper-low"].rate(base_lr, base_batch, batch_size, open_low), "paper-low"
    return lr_rules.scaled(rule, base_lr, base_batch, batch_size, b_noise)


def hand_off(batch_size: int | None, largest: int | None, safe: int | None, effective: int | None = None) -> dict:
    """What a training run takes from the answer: the batch size to train with (the
    recommendation, which fits by construction); the evaluation batch size that fits, the largest
    training batch (evaluation holds no gradients nor optimizer state, so at least that fits: a
    floor, not measured above it); and for an effective batch the user keeps (a recipe's,
    --effective-batch) the gradient-accumulation plan: `steps` micro-batches of `micro_batch_size`,
    no larger than the margin's size, whose product is the effective batch exactly (a prime one
    larger than what fits accumulates micro-batches of 1). Accumulation never makes training
    sooner: k micro-steps cost k step times for fewer steps to a target by at most k."""
    plan = None
    if effective is not None and safe:
        steps = next(k for k in range(math.ceil(effective / safe), effective + 1) if effective % k == 0)
        plan = {"effective_batch_size": effective, "micro_batch_size": effective // steps, "steps": steps}
    return {"batch_size": batch_size, "eval_batch_size": largest, "accumulation": plan}
