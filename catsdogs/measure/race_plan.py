"""The race's plan (find-batch-size --race, catsdogs.measure.race_run): what it races, made once
from the recommendation's table (`new_plan`) and kept in the results store as its sweep's config, so
that a race continued after Ctrl-C reads it back (`stored_plan`) rather than making it again from
probes that time differently.

A plan holds the race's identity (PLAN_KEYS: a stored plan of other values is another race's, and
refused), the sizes raced (race.race_sizes over the probes' step times, beyond BETWEEN_RUNS, and
the prediction's choice), each size's rates (the optimizer's rule from the anchor, and half and
twice it), the seeds, the evaluations' spacing (at least EVALUATIONS in the reference's
REFERENCE_EPOCHS epochs), the arm raced first, the anchor, and the target.
"""

from __future__ import annotations

import math
from pathlib import Path

from catsdogs import targets
from catsdogs.errors import CatsdogsError
from catsdogs.measure.model_check import Raced
from catsdogs.measure.race import SEEDS_PER_RUNG, race_rates, race_sizes
from catsdogs.recommendation import anchor_at, learning_rate, rule_noise
from catsdogs.runtime import backends
from catsdogs.store import Store, store_path

REFERENCE_EPOCHS = 3  # the reference run's epochs: the default target is its validation loss after them
EVALUATIONS = 8  # the reference's epochs hold at least this many evaluations
BETWEEN_RUNS = 0.2  # the step times' spread from one run to the next on a shared CPU (docs/performance.md)
PLAN_KEYS = ("optimizer", "dataset", "data", "image_size", "backend", "precision", "deterministic", "tf32",
             "seed", "until", "model")  # what makes a race another race: a stored plan of other values is not resumed


def identity_of(settings, raced: Raced, size: int) -> dict:
    """What makes this race this race (PLAN_KEYS' values): find-batch-size's settings (FindSettings),
    the model and data raced, the images' side."""
    return {"optimizer": settings.optimizer, "dataset": settings.dataset, "data": raced.data, "image_size": size,
            "backend": backends.check(), "precision": settings.precision, "deterministic": settings.deterministic,
            "tf32": settings.tf32, "seed": settings.seed, "until": targets.canonical(settings.until), "model": raced.model}


def stored_plan(out: Path, sweep: str, identity: dict, log) -> dict | None:
    """The plan of a race begun before under this name, to continue; None where there is none. A
    race of other settings under the name is refused: its trials are not this race's."""
    if not store_path(out).exists():
        return None
    with Store(store_path(out), read_only=True) as store:
        config = store.sweep_config(sweep) if sweep in store.sweeps() else None
    if config is not None and not config.get("race"):
        raise CatsdogsError(f"the store under {out} holds a sweep named {sweep!r} that is not a race: give this run "
                            "another --name")
    plan = (config or {}).get("race")
    if not plan:
        return None
    if {k: plan["identity"].get(k) for k in PLAN_KEYS} != identity:
        differ = [k for k in PLAN_KEYS if plan["identity"].get(k) != identity[k]]
        raise CatsdogsError(f"the store under {out} holds a race named {sweep!r} with other settings ({', '.join(differ)}): "
                            "give this run another --name")
    log(f"Race: continuing the race {sweep!r} begun before (its plan as recorded then).")
    return plan


def new_plan(settings, raced: Raced, recommendation: dict, anchor: dict | None, identity: dict) -> dict:
    """The sizes (race.race_sizes over the probes' step times, beyond the between-run spread, and the
    prediction's recommendation, so that it is held against the race), each size's rates by the optimizer's rule from the anchor and the factor-2 set around it, the seeds,
    the evaluations' spacing, and the arm raced first (the prediction's choice at its rule's rate)."""
    n_train = raced.train_images  # (a size past it has no batch to train: a user's folder holds out a tenth more)
    table = {int(r["batch_size"]): float(r["step_seconds"]) for r in recommendation["table"] if r["batch_size"] <= n_train}
    if not table:
        raise CatsdogsError(f"the race has no size to train: none that fitted has a whole batch in the {n_train:,} "
                            "images its trials train on (a tenth of a folder's held out to validate): lower --start")
    predicted = recommendation["batch_size"]  # raced whatever the grid: the prediction is held against the race
    span = recommendation.get("interval")
    sizes = sorted({*race_sizes(table, BETWEEN_RUNS, interval=tuple(span) if span else None),
                    *([predicted] if predicted in table else [])})
    noise = rule_noise(recommendation)
    rates, rule_rate = {}, {}
    for b in sizes:  # the recommendation's rule, at every size
        base, base_lr, _ = anchor_at(b, settings.optimizer, anchor)
        rule_rate[b] = round_rate(learning_rate(settings.optimizer, b, base_lr, base, *noise)[0])
        rates[b] = [round_rate(r) for r in race_rates(rule_rate[b])]
    predicted = min(sizes, key=lambda b: (abs(math.log(b / predicted)), b))  # (itself, where the table has it)
    base, base_lr, said = anchor_at(predicted, settings.optimizer, anchor)
    every = 2 ** max(5, int(math.log2(max(1, n_train * REFERENCE_EPOCHS // EVALUATIONS))))
    return {"identity": identity, "sizes": sizes, "rates": {str(b): rates[b] for b in sizes},
            "probe_step_seconds": {str(b): table[b] for b in sizes}, "steady_step_seconds": None,
            "seeds": [settings.seed + i for i in range(SEEDS_PER_RUNG[-1])], "eval_every": every,
            "first": {"batch_size": predicted, "lr": rule_rate[predicted]},
            "anchor": {"batch_size": base, "lr": round_rate(base_lr), "said": said},
            "target": targets.canonical(settings.until), "target_said": "given (--until)" if settings.until else None,
            "n_train": n_train}


def round_rate(lr: float) -> float:
    """A rate to 3 significant digits: a trial's identity holds it, and a stored plan reads it back."""
    return float(f"{lr:.3g}")


def race_words(plan: dict) -> str:
    """The plan in words: the target and how it was chosen, the sizes, the rates."""
    return (f"{targets.parse(plan['target']).describe()} ({plan['target_said']}): {len(plan['sizes'])} batch size"
            f"{'s' if len(plan['sizes']) != 1 else ''} ({', '.join(map(str, plan['sizes']))}) at 3 rates each, "
            "the rule's and half and twice it")
