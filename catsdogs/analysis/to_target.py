"""The critical batch size, measured: steps to a target at every batch size, the paper's fit, and
the noise scale held against it. Pure functions of a sweep's trial rows; no framework.

A sweep run with `--until` (the `critical` plan, or any other) trains each trial until a
validation target and records its steps to it (catsdogs.targets: interpolated between the
evaluations around the crossing). Per **series** (a context, optimizer, data set, target and
protocol but for the learning rate) and batch size B:

- **S(B)**: the steps to the target at B's best learning rate, a seed that did not reach it
  counting as infinitely many (so a rate whose median seed missed is never chosen over one that
  reached it). The rate is chosen by the median over seeds, and marked, and marked again when it
  is the lowest or highest tried at B: the best rate may then lie outside the grid, and that
  batch size **leaves the fit**, named (the paper's model assumes each batch size's best rate).
  Choosing the rate and reading S(B) off the same seeds biases S(B) low (the winner's curse: the
  best of 3-4 noisy medians is lucky); reading each seed at the rate the other seeds chose
  (leave-one-out) biases it high (a rate chosen on fewer seeds is more often the wrong one).
  S(B) is the geometric mean of the two (`_batch_row`): in simulation with the `critical` plan's
  spread, which differs by batch size (tests/analysis/test_critical_fit.py), the fitted B_crit's median
  came within 10% of the truth where the same-seed reading was 10-35% low and leave-one-out
  20-27% high. A batch size whose median is not reached leaves the fit and is shown as such;
- **the fit**: S = S_min + E_min/B by weighted least squares on 1/B (each size by its relative
  error: its seeds' spread at the chosen rate, `log_sd`, smoothed), B_crit = E_min/S_min with
  Fieller's 95% interval (catsdogs.analysis.critical_fit says how and why not a bootstrap);
- **B_simple at the target**: the noise scale measured on the smallest batch size's trials, at
  every learning rate, where each reaches the target (the engine measures it at the evaluation
  that stops the trial: catsdogs.training.engine): all at the same validation loss, which is what
  the paper's noise scale is a function of. A seed is one cluster (its trials start from the
  same weights and see the same batches): B_simple is the ratio of the seeds' mean |G|^2 and
  tr(Sigma) estimates over all their pairs, and its interval Fieller's over the seeds (seeds - 1
  degrees of freedom), not over the pairs as if all were independent;
- **the claim**, stated before the run (McCandlish et al. 2018: B_simple predicts B_crit): the
  ratio B_simple/B_crit with a 95% interval from the two independent intervals by MOVER on the
  log scale (Zou & Donner 2008: each side of log-ratio's interval from the sides of the two
  intervals that move it, which keeps Fieller's asymmetry; an open side stays open).
  **agrees** when that interval lies within [1/3, 3], **disagrees** when it lies wholly outside,
  **unsettled** otherwise; **not run** without a fit or a measurement, saying which.
"""

from __future__ import annotations

import math
import statistics

from catsdogs.analysis.critical_fit import CriticalFit, fit_critical
from catsdogs.analysis.rows import (
    OPTIMIZER_NAMES,
    context_label,
    context_of,
    field,
    learning_rate_of,
    many_contexts,
    protocol_label,
    protocol_of,
    trial_order,
)
from catsdogs.gradient_noise import NoiseEstimate, pool_by_seed
from catsdogs.schema import Status
from catsdogs.targets import parse

AGREES = (1 / 3, 3.0)  # B_simple / B_crit within a factor of 3 agrees (the claim's thresholds)
TITLE = "Steps to the target against examples to it: the paper's form"


def has_target(trial: dict) -> bool:
    return field(trial, "until") is not None


def _series(trial: dict) -> tuple:
    p = {k: v for k, v in protocol_of(trial).items() if k not in ("lr", "until")}
    return (context_of(trial), field(trial, "optimizer"), field(trial, "dataset"), field(trial, "until"),
            field(trial, "eval_every"), tuple(sorted(p.items())))


def steps_of(trial: dict) -> float:
    """Steps to the target: infinitely many when not reached."""
    s = trial.get("steps_to_target")
    return math.inf if not trial.get("target_reached") or s is None else float(s)


def tables(trials: list[dict]) -> list[dict]:
    """One table per series of the finished trials that trained until a target (`series_table`)."""
    groups: dict[tuple, list[dict]] = {}
    for t in trials:
        if has_target(t) and t.get("status") == Status.DONE:
            groups.setdefault(_series(t), []).append(t)
    many = many_contexts(trials)
    return [series_table(members, many) for _, members in sorted(groups.items(), key=lambda kv: trial_order(kv[1][0]))]


def best_rate_steps(trials: list[dict]) -> dict[int, float]:
    """Each batch size's median steps to the target over its seeds at its best rate (`_batch_row`'s
    `steps_same_seeds`), of `trials` of one series: what a race is held against (benchmarks/
    bench_race.py, scripts/h100_summary.py)."""
    return {r["batch_size"]: r["steps_same_seeds"] for table in tables(trials) for r in table["rows"]}


def series_table(members: list[dict], many: bool = False) -> dict:
    """{"label", "target", "rows": per batch size, "fit": CriticalFit or None, "why_no_fit",
    "noise": B_simple at the target or None, "claim": {...}}."""
    first = members[0]
    by_batch: dict[int, dict[float, list[dict]]] = {}
    for t in members:  # a step is an update: of batch size x accumulation images
        b = int(field(t, "batch_size")) * int(field(t, "accumulate", 1))
        by_batch.setdefault(b, {}).setdefault(learning_rate_of(t), []).append(t)
    rows = [_batch_row(b, rates) for b, rates in sorted(by_batch.items())]
    edges = [r["batch_size"] for r in rows if r["edge"] and math.isfinite(r["steps"]) and r["steps"] > 0]
    reached = [r for r in rows if math.isfinite(r["steps"]) and r["steps"] > 0 and not r["edge"]]
    fit, why = None, None
    at_start = [r["batch_size"] for r in rows if r["steps"] == 0]
    if len(reached) >= 3:
        fit = fit_critical([r["batch_size"] for r in reached], [r["steps"] for r in reached],
                           [r["log_sd"] for r in reached])
    else:
        inside = " at a rate inside its grid" if edges else ""
        why = (f"{len(reached)} batch size{'s' if len(reached) != 1 else ''} can enter the fit (the target "
               f"reached after an update{inside}): it needs 3")
    if at_start:
        why = (why + "; " if why else "") + (f"batch size {', '.join(map(str, at_start))} met it before its first "
                                             "update (too easy a target), out of the fit")
    if edges:
        why = (why + "; " if why else "") + (f"batch size {', '.join(map(str, edges))} out of the fit: the chosen rate "
                                             "lies at its grid's edge, and the best may lie beyond")
    noise = noise_at_target([t for rate in rows[0]["rates"] for t in rate["trials"]]) if rows else None
    protocol = {k: v for k, v in protocol_of(first).items() if k not in ("lr", "until")}
    label = f"{OPTIMIZER_NAMES.get(field(first, 'optimizer'), field(first, 'optimizer'))}, {field(first, 'dataset')}"
    if protocol_label({**protocol, "lr": None}) != "article protocol":
        label += f", {protocol_label({**protocol, 'lr': None})}"
    return {"label": label, "context": context_label(context_of(first), many),
            "target": parse(field(first, "until")), "rows": rows, "fit": fit, "why_no_fit": why,
            "noise": noise, "claim": claim(fit, noise, why)}


def _batch_row(batch: int, rates: dict[float, list[dict]]) -> dict:
    """A batch size's rates, each's median steps over its seeds, the chosen one, and S(B): the
    geometric mean of the chosen rate's median (`steps_same_seeds`) and the median of each seed
    read at the rate the other seeds chose (`steps_held_out`); the module says why."""
    tried = []
    for lr, trials in sorted(rates.items()):
        steps = sorted(steps_of(t) for t in trials)
        tried.append({"lr": lr, "median": statistics.median(steps), "seeds": len(steps),
                      "reached": sum(math.isfinite(s) for s in steps), "trials": trials})
    best = min(tried, key=lambda r: (r["median"], r["lr"]))
    edge = len(tried) > 1 and best["lr"] in (tried[0]["lr"], tried[-1]["lr"])
    held_out = _held_out_steps(rates) if len(tried) > 1 else best["median"]
    same = best["median"]
    steps = math.sqrt(same * held_out) if math.isfinite(same) and math.isfinite(held_out) else math.inf
    logs = [math.log(s) for s in map(steps_of, best["trials"]) if math.isfinite(s) and s > 0]
    return {"batch_size": batch, "lr": best["lr"], "edge": edge, "steps": steps,
            # (None where a seed missed: the reached seeds' spread understates it; the fit's line fills it in)
            "log_sd": statistics.stdev(logs) if len(logs) > 1 and len(logs) == best["seeds"] else None,
            "steps_same_seeds": same, "steps_held_out": held_out,
            "examples": steps * batch if math.isfinite(steps) else math.inf,
            "seeds": best["seeds"], "reached": best["reached"], "rates": tried, "chosen": best["trials"]}


def _held_out_steps(rates: dict[float, list[dict]]) -> float:
    """The median over seeds of each seed's steps at the rate the other seeds' medians chose
    (leave-one-out: no seed helps choose the rate it is read at); inf when none can be read."""
    steps = {lr: {int(field(t, "seed")): steps_of(t) for t in trials} for lr, trials in rates.items()}
    seeds = sorted({seed for by_seed in steps.values() for seed in by_seed})
    read = []
    for seed in seeds:
        others = {lr: [v for s, v in by_seed.items() if s != seed] for lr, by_seed in steps.items()}
        others = {lr: vs for lr, vs in others.items() if vs and seed in steps[lr]}
        if others:
            lr = min(others, key=lambda r: (statistics.median(others[r]), r))
            read.append(steps[lr][seed])
    return statistics.median(read) if read else math.inf


def noise_at_target(trials: list[dict]) -> NoiseEstimate | None:
    """B_simple where `trials` reached the target, clustered by seed (gradient_noise.pool_by_seed);
    None when fewer than two seeds measured it there."""
    by_seed: dict[int, list[NoiseEstimate]] = {}
    for t in trials:
        if t.get("target_reached"):  # measured where the trial stopped: at the target (or at its start)
            at = (NoiseEstimate.from_record(t["history"][-1]) if t.get("history")
                  else NoiseEstimate.from_dict(t.get("initial_noise")))
            by_seed.setdefault(int(field(t, "seed")), []).append(at)
    return pool_by_seed(by_seed)


def ratio_interval(noise: NoiseEstimate, fit: CriticalFit) -> tuple[float, float | None, float | None]:
    """B_simple / B_crit and its 95% interval by MOVER on the log scale; None for an open side."""
    a, a_low, a_high = noise.b_simple, noise.low, noise.high
    b, b_low, b_high = fit.b_crit, fit.low, fit.high
    ratio = a / b
    log = math.log

    def side(d_a: float | None, d_b: float | None) -> float | None:
        return None if d_a is None or d_b is None else math.sqrt(d_a**2 + d_b**2)

    down = side(log(a) - log(a_low) if a_low and a_low > 0 else None,
                log(b_high) - log(b) if b_high else None)
    up = side(log(a_high) - log(a) if a_high else None,
              log(b) - log(b_low) if b_low and b_low > 0 else None)
    return ratio, (ratio * math.exp(-down) if down is not None else 0.0), (ratio * math.exp(up) if up is not None else None)


def claim(fit: CriticalFit | None, noise: NoiseEstimate | None, why_no_fit: str | None = None) -> dict:
    """B_simple predicts B_crit: agrees, disagrees, unsettled, or not run (and why)."""
    if fit is None or fit.b_crit is None:
        if fit is not None and fit.e_min <= 0:
            why_no_fit = f"B_crit not resolved: {fit.describe()}"
        return {"verdict": "not run", "why": why_no_fit or "B_crit not resolved: the steps still fall as fast as "
                                                           "the batch grows, at every batch size measured"}
    if noise is None or noise.b_simple is None:
        return {"verdict": "not run", "why": "no B_simple at the target: run the sweep with --noise-scale, with "
                                             "two or more seeds of the smallest batch size reaching it"
                if noise is None else f"B_simple at the target is only a lower bound ({noise.describe()})"}
    ratio, low, high = ratio_interval(noise, fit)
    lo, hi = AGREES
    if low >= lo and high is not None and high <= hi:
        verdict = "agrees"
    elif (high is not None and high < lo) or low > hi:
        verdict = "disagrees"
    else:
        verdict = "unsettled"
    return {"verdict": verdict, "ratio": ratio, "low": low, "high": high}


def ratio_text(c: dict) -> str:
    if "ratio" not in c:
        return "—"
    high = "∞" if c["high"] is None else f"{c['high']:.2f}"
    return f"{c['ratio']:.2f} ({c['low']:.2f}–{high})"


def markdown(tables_: list[dict]) -> list[str]:
    """The report's section: per series, S(B) with its chosen rates, the fit, B_simple and the claim."""
    if not tables_:
        return []
    lines = ["## The critical batch size, measured", "",
             "Each trial trained until its target (`--until`); its steps to the target are interpolated "
             "between the evaluations around the crossing (catsdogs/targets.py). Per batch size the rate is the "
             "one of the best median over seeds (a seed that missed counts as never reaching it), and S(B) the "
             "geometric mean of that median and of each seed read at the rate the other seeds chose (the first "
             "is biased low by the choice, the second high; catsdogs/analysis/to_target.py). *edge*: the chosen "
             "rate is the lowest or highest tried, so a better one may lie outside the grid: out of the fit. "
             "The fit: S = S_min + E_min/B, weighted least squares on 1/B, B_crit = E_min/S_min with Fieller's "
             "95% interval. B_simple: the smallest batch size's trials at every learning rate, measured where "
             "each reached the target, clustered by seed. The claim (McCandlish et al. 2018): B_simple predicts B_crit; "
             f"**agrees** when the 95% interval of B_simple/B_crit lies within [{AGREES[0]:.2g}, {AGREES[1]:g}], "
             "**disagrees** when wholly outside, **unsettled** otherwise.", "",
             "![critical_measured](figures/critical_measured.png)", ""]
    for t in tables_:
        lines += [f"### {t['label']} · {t['target'].describe()} · {t['context']}", "",
                  "| batch size | chosen lr | S(B) steps | examples | seeds reached | medians by lr |",
                  "|---|---|---|---|---|---|"]
        for r in t["rows"]:
            steps = f"{r['steps']:.0f}" if math.isfinite(r["steps"]) else "not reached"
            examples = f"{r['examples']:.0f}" if math.isfinite(r["examples"]) else "—"
            by_lr = ", ".join(f"{x['lr']:g}: " + (f"{x['median']:.0f}" if math.isfinite(x["median"]) else "∞")
                              for x in r["rates"])
            lines.append(f"| {r['batch_size']} | {r['lr']:g}{' (edge)' if r['edge'] else ''} | {steps} | {examples} "
                         f"| {r['reached']}/{r['seeds']} | {by_lr} |")
        fit, c = t["fit"], t["claim"]
        lines.append("")
        if fit is not None:
            lines.append(f"- Fit: S_min {fit.s_min:.0f} steps, E_min {fit.e_min:.0f} images, **B_crit "
                         f"{fit.describe()}** ({fit.df} degrees of freedom).")
        else:
            lines.append(f"- No fit: {t['why_no_fit']}.")
        noise = t["noise"]
        lines.append(f"- B_simple at the target: {noise.describe() if noise else 'not measured'}"
                     + (f", {noise.pairs} seeds ({noise.measurements} trials)" if noise else "") + ".")
        verdict = c["verdict"] + (f": {c['why']}" if "why" in c else f", B_simple/B_crit {ratio_text(c)}")
        lines += [f"- The noise scale predicts B_crit: **{verdict}**.", ""]
    return lines
