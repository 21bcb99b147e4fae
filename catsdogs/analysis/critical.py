"""The critical batch size: the gradient noise scale over training, and the paper's prediction
tested against the sweep. Pure functions of a sweep's trial rows; no framework.

**The table** (`noise_table`): each trial recorded with `--noise-scale` has B_simple at the start
(epoch 0, `initial_noise`) and after each epoch (its history), each from a few pairs. Per cell
(optimizer, data set, protocol, batch size, learning rate) and epoch, the pairs of all its seeds
are pooled into one estimate with each seed one cluster (catsdogs.gradient_noise.pool_by_seed: the
ratio of the seeds' means, Fieller's interval over the seeds, not over their pairs as if
independent; "above N" where the noise dominated); a cell of one seed has only its pairs to go
on (gradient_noise.pool), and its interval says nothing of other seeds. Cells whose finished trials lack the
measurement (run before it, or without `--noise-scale`) are listed, with how to get it.

**The claim** (`claims`), as the paper's model predicts it (McCandlish et al. 2018, section 2):
with S = S_min (1 + B_noise/B) steps and E = E_min (1 + B/B_noise) examples to reach a target,
a fixed number of epochs (E fixed) reaches it for B <= B_noise (E/E_min - 1) and not beyond. The
row tests exactly that limit, B_noise (E/E_min - 1), not the critical batch size itself (which
catsdogs measures by steps to a target: catsdogs.analysis.to_target). The model assumes the best
learning rate at every batch size, so only a series whose rate is tuned per batch size gets a
verdict; a series at one rate (the article's protocol) shows its limit and comparisons and is
*not run*, saying why. How each piece is read off the sweep, per series:

- the target: the accuracy held, no more than SHARP (5) points of validation accuracy below what
  the smallest batch size B_0 reaches at the end (its mean over seeds);
- E/E_min: B_0's mean curve first reaches the target after e* of the E epochs, so E(B_0) = e*
  epochs and E_min = E(B_0) / (1 + B_0/B_noise), which gives E/E_min = (E/e*)(1 + B_0/B_noise).
  e* moves with the seed: the earliest and latest epoch at which a single seed's curve first
  reaches the target bound it, and the bounds below take the side of it that widens them;
- B_noise: B_simple measured on B_0's trials at epoch e*, where the target is first met: the
  noise scale *at the target*, which is the one the paper finds to predict the critical batch
  size for that target (B_simple grows several-fold during training). Each seed is one cluster
  (gradient_noise.pool_by_seed: Fieller's interval over the seeds, not over their pairs as if
  independent). Where it was a lower bound only, the prediction is a lower bound too;
- the limit: L = B_noise (E/E_min - 1), the largest batch size the budget carries to the target.

"Well below" is at most half the limit and "well above" at least twice it: one step of the
sweep's power-of-two grid on either side, so no cell sits on the boundary, where the model says
the target is just reached. Since B_noise and e* are measured with an uncertainty, and the limit
grows with B_noise and falls with e*, "well below" is half the limit at B_noise's low end and the
latest seed's e*, and "well above" twice the limit at its high end and the earliest seed's e*
(none when B_noise's interval is open above). Each such cell's mean test accuracy is compared
with B_0's by Welch's interval, as the article's claims are (catsdogs.analysis.claims): held
means less than SHARP points below B_0, lost more than SHARP points below. The verdict:
**supported** when every compared cell comes out as predicted, **contradicted** when one clearly
comes out the other way, **unsettled** otherwise; **not run** when the rate is not tuned, there
is no measurement, or no cell on one side of the limit (with which).
"""

from __future__ import annotations

from collections.abc import Iterable

from catsdogs.analysis import claims
from catsdogs.analysis.rows import (
    OPTIMIZER_NAMES,
    accuracy,
    context_label,
    context_of,
    is_article_protocol,
    learning_rate_of,
    many_contexts,
    per_context,
    protocol_label,
    protocol_of,
    trial_order,
)
from catsdogs.analysis.rows import field as field_of
from catsdogs.gradient_noise import NoiseEstimate, fixed_epochs_limit, pool, pool_by_seed
from catsdogs.schema import DEFAULT_LR, Status
from catsdogs.stats import welch

SHARP = claims.SHARP  # points: "held" is less than this far below the smallest batch size
WELL = 2.0  # "well below / above" the limit: a factor of 2, one step of a power-of-two grid
TITLE = "Gradient noise scale B_simple over training, by batch size"


# --- reading a trial ----------------------------------------------------------------------------


def measurements(trial: dict) -> list[NoiseEstimate]:
    """The trial's B_simple measurements in order of epoch (0: before the first update); [] when
    it was not measured."""
    start = NoiseEstimate.from_dict(trial.get("initial_noise"))
    if start is None:
        return []
    later = (NoiseEstimate.from_record(row, start) for row in trial.get("history") or [])
    return [start, *(m for m in later if m is not None)]


def _done(trials: Iterable[dict]) -> list[dict]:
    return [t for t in trials if t.get("status") == Status.DONE and accuracy(t) is not None]


def _group(trial: dict) -> tuple:
    """A figure panel: optimizer, data set, the protocol but for the learning rate, and the context
    (rows.context_of: trials of two contexts are never pooled)."""
    p = dict(protocol_of(trial), lr=None)
    return (field_of(trial, "optimizer"), field_of(trial, "dataset"), tuple(sorted(p.items(), key=str)),
            context_of(trial))


def _group_label(trial: dict, many: bool = False) -> str:
    name = OPTIMIZER_NAMES.get(field_of(trial, "optimizer"), field_of(trial, "optimizer"))
    rest = protocol_label(dict(protocol_of(trial), lr=None))
    label = f"{name}, {field_of(trial, 'dataset')} data" + ("" if rest == "article protocol" else f", {rest}")
    return label + (f" ({context_label(context_of(trial), True)})" if many else "")


# --- the table ----------------------------------------------------------------------------------


def noise_table(trials: list[dict], tuned: dict) -> dict:
    """{"name": "noise", "title", "groups": [{"label", "series": [{"label", "batch_size", "lr",
    "seeds", "points": [NoiseEstimate pooled over the cell's seeds, one per epoch]}]}],
    "panels": the figure's panels, like groups, "batch_sizes": every batch size of the sweep's
    finished trials, "missing": [{"cell", "seeds"}], "sampling": the (B_s, B_b, pairs) the
    measurements used, "measured" and "done": how many finished trials have the measurement, of
    how many}.

    A group is every cell of an optimizer, data set and protocol: the tables show them all. Where a
    group has several learning rates, the figure shows two panels of it, the ones the claim tests:
    the default rate, and each batch size at the rate validation chose for it (`tuned`: the tuned
    table, catsdogs.analysis.tuning.tune_learning_rates)."""
    done = _done(trials)
    measured = [t for t in done if measurements(t)]
    many = many_contexts(trials)
    rates: dict[tuple, set] = {}  # each group's learning rates, measured or not
    for t in done:
        rates.setdefault(_group(t), set()).add(learning_rate_of(t))
    cells: dict[tuple, list[dict]] = {}
    for t in measured:
        cells.setdefault((_group(t), int(field_of(t, "batch_size")), learning_rate_of(t)), []).append(t)
    groups: dict[tuple, dict] = {}
    panels: dict[tuple, dict] = {}
    chosen = _chosen_cells(tuned, cells)
    for (group, bs, lr), members in sorted(cells.items(), key=lambda kv: (trial_order(kv[1][0]), kv[0][1], kv[0][2])):
        panel = groups.setdefault(group, {"label": _group_label(members[0], many), "series": []})
        many_lrs = len(rates[group]) > 1
        by_epoch: dict[int, dict] = {}
        for t in members:
            for m in measurements(t):
                by_epoch.setdefault(m.epoch, {}).setdefault(field_of(t, "seed"), []).append(m)
        points = [pool_by_seed(by_seed, epoch=e) if len(by_seed) > 1 else
                  pool([m for ms in by_seed.values() for m in ms], epoch=e) for e, by_seed in sorted(by_epoch.items())]
        series = {"label": f"batch {bs}" + (f", lr {lr:g}" if many_lrs else ""), "batch_size": bs, "lr": lr,
                  "seeds": len(members), "points": [p for p in points if p is not None]}
        panel["series"].append(series)
        if not many_lrs:
            panels.setdefault((group, "all"), {"label": panel["label"], "series": []})["series"].append(series)
            continue
        default_lr = DEFAULT_LR[group[0]]
        if lr == default_lr:
            panels.setdefault((group, "default"), {"label": f"{panel['label']}, default lr {default_lr:g}",
                                                   "series": []})["series"].append({**series, "label": f"batch {bs}"})
        if (group, bs, lr) in chosen:
            panels.setdefault((group, "tuned"), {"label": f"{panel['label']}, lr tuned per batch size",
                                                 "series": []})["series"].append(series)
    for group, panel in groups.items():  # a group of several rates none of whose two panels is measured
        if not any(key[0] == group for key in panels):
            panels[(group, "every")] = {"label": f"{panel['label']}, every learning rate", "series": panel["series"]}
    missing: dict[str, list[int]] = {}
    for t in done:
        if not measurements(t):
            cell = f"{_group_label(t, many)}, batch size {field_of(t, 'batch_size')}"
            if field_of(t, "lr") is not None:
                cell += f", lr {learning_rate_of(t):g}"
            missing.setdefault(cell, []).append(int(field_of(t, "seed", 0)))
    starts = [measurements(t)[0] for t in measured]
    sampling = sorted({(m.small, m.large, m.pairs) for m in starts}, key=str)
    return {"name": "noise", "title": TITLE, "groups": list(groups.values()), "panels": list(panels.values()),
            "sampling": sampling,
            "batch_sizes": sorted({int(field_of(t, "batch_size")) for t in done}),
            "missing": [{"cell": c, "seeds": sorted(s)} for c, s in missing.items()],
            "measured": len(measured), "done": len(done)}


def _chosen_cells(tuned: dict, cells: dict[tuple, list[dict]]) -> set[tuple]:
    """The (group, batch size, learning rate) cells whose rate validation chose for their batch
    size (`tuned`: catsdogs.analysis.tuning.tune_learning_rates' table), among `cells`."""
    keys = {k for by_bs in tuned["chosen"].values() for ks in by_bs.values() for k in ks}
    return {cell for cell, members in cells.items() if any(t.get("key") in keys for t in members)}


# --- the claim ----------------------------------------------------------------------------------


def _tuned_series(tuned: dict, trials: list[dict]) -> list[tuple[str, dict[int, list[dict]]]]:
    """The tuned table's series, among `trials` (one context's finished ones): per batch size the
    trials of the learning rate validation chose. A series whose rates never had two finished at
    one batch size is no tuned series (it is the default rate's, chosen for want of another)."""
    tried: dict[tuple[str, int], int] = {}
    for c in tuned["choices"]:
        if c["n_done"]:
            tried[(c["series"], c["batch_size"])] = tried.get((c["series"], c["batch_size"]), 0) + 1
    chosen_from_several = {series for (series, _), n in tried.items() if n > 1}
    by_key = {t.get("key"): t for t in trials}
    return [(series, {bs: [by_key[k] for k in keys if k in by_key] for bs, keys in cells.items()})
            for series, cells in tuned["chosen"].items() if series in chosen_from_several]


def _article_series(trials: list[dict]) -> list[tuple[str, dict[int, list[dict]]]]:
    out: dict[tuple, dict[int, list[dict]]] = {}
    labels: dict[tuple, str] = {}
    for t in trials:
        if not is_article_protocol(t):
            continue
        key = (trial_order(t)[:2], field_of(t, "optimizer"), field_of(t, "dataset"))
        name = OPTIMIZER_NAMES.get(key[1], key[1])
        labels[key] = f"{name}{', augmented data' if key[2] == 'augmented' else ''}, default lr {DEFAULT_LR[key[1]]:g}"
        out.setdefault(key, {}).setdefault(int(field_of(t, "batch_size")), []).append(t)
    return [(labels[k], out[k]) for k in sorted(out, key=str)]


def critical_claims_by_context(trials: list[dict], tuned: dict, n_test: int | None = None) -> list[dict]:
    """The critical-batch-size claim for every series of every context (epochs, image size,
    backend, process settings) that has one: [{"context", "results": [result, ...]}]. `tuned`:
    the learning rate tuned per batch size (catsdogs.analysis.tuning), whose series are tested too.
    `n_test`: the test images each accuracy was measured on (the floor of Welch's interval)."""
    def results(context: tuple, members: list[dict]) -> list[dict]:
        if context[0] is None:  # trained until a target: no fixed number of epochs, which the claim is of
            return []
        series = [*((label, cells, False) for label, cells in _article_series(members)),
                  *((label, cells, True) for label, cells in _tuned_series(tuned, members))]
        return [r for r in (evaluate(label, cells, int(context[0]), n_test, tuned=is_tuned)
                            for label, cells, is_tuned in series) if r is not None]
    return per_context(trials, results)


def _curves(members: list[dict]) -> list[list[float]]:
    """Each trial's validation accuracy per epoch (training accuracy without a validation split)."""
    curves = []
    for t in members:
        history = t.get("history") or []
        key = "val_accuracy" if history and "val_accuracy" in history[0] else "accuracy"
        curves.append([float(h[key]) for h in history if h.get(key) is not None])
    return curves


def _val_curve(members: list[dict]) -> list[float] | None:
    """The mean over seeds of each epoch's validation accuracy."""
    curves = _curves(members)
    length = min((len(c) for c in curves), default=0)
    if not length:
        return None
    return [sum(c[e] for c in curves) / len(curves) for e in range(length)]


def _e_star_range(members: list[dict], target: float, epochs: int) -> tuple[int, int]:
    """The earliest and latest epoch at which a single seed first reaches `target` (a seed that
    never does: the last epoch): how far e* moves with the seed."""
    firsts = [next((e + 1 for e, v in enumerate(c) if v >= target), epochs) for c in _curves(members)]
    return min(firsts), max(firsts)


def evaluate(label: str, cells: dict[int, list[dict]], epochs: int, n_test: int | None = None,
             tuned: bool = True) -> dict | None:
    """The claim for one series ({batch size: its trials}); None when the series has fewer than
    two batch sizes with finished trials (nothing to compare). A series whose learning rate is not
    tuned per batch size (`tuned` False) shows its limit and comparisons, and is not run: the
    paper's model assumes each batch size's best rate."""
    cells = {bs: _done(ts) for bs, ts in cells.items()}
    cells = {bs: ts for bs, ts in sorted(cells.items()) if ts}
    if len(cells) < 2:
        return None
    b0 = min(cells)
    base = cells[b0]
    out = {"series": label, "b0": b0, "epochs": epochs, "limit": None, "limit_is_bound": False,
           "b_noise": None, "b_noise_low": None, "b_noise_high": None, "held_up_to": None, "lost_from": None,
           "e_star": None, "budget_ratio": None, "tests": [], "verdict": claims.NOT_RUN, "verdict_text": "",
           "n": {bs: len(ts) for bs, ts in cells.items()}}
    if not all(measurements(t) for t in base):
        out["verdict_text"] = _one_rate(tuned, f"not run: the noise scale was not measured at batch size {b0} "
                                               "(sweep --noise-scale)")
        return out
    curve = _val_curve(base)
    if not curve:
        out["verdict_text"] = _one_rate(tuned, f"not run: batch size {b0} has no per-epoch accuracy")
        return out
    target = curve[-1] - SHARP / 100
    e_star = next(e + 1 for e, v in enumerate(curve) if v >= target)
    e_early, e_late = _e_star_range(base, target, epochs)
    # B_simple at e*, each seed one cluster (not every later epoch's pairs as if independent)
    at = pool_by_seed({field_of(t, "seed"): [m for m in measurements(t) if m.epoch == e_star] for t in base},
                      epoch=e_star)
    if at is None or at.low is None or (at.b_simple is None and not at.low):
        why = "from two seeds or more" if at is None else "(undetermined: neither the gradient nor the noise clearly positive)"
        out["verdict_text"] = _one_rate(tuned, f"not run: no noise scale at batch size {b0} at epoch {e_star} {why}")
        return out
    bound_only = at.b_simple is None
    b_noise = at.low if bound_only else at.b_simple
    b_high = None if bound_only else at.high  # None: unbounded above

    def limit_at(b: float, e: int = e_star) -> float:  # B_noise (E/E_min - 1), E/E_min = (E/e*)(1 + B_0/B_noise)
        return fixed_epochs_limit(b, (epochs / e) * (1 + b0 / b)) if b else (epochs / e) * b0

    # the limit grows with B_noise and falls with e*: "well below" takes B_noise's interval's low end
    # and the latest seed's e*, "well above" its high end and the earliest seed's
    held_up_to = limit_at(at.low, e_late) / WELL
    lost_from = WELL * limit_at(b_high, e_early) if b_high is not None else None
    out.update(b_noise=b_noise, b_noise_low=at.low, b_noise_high=b_high, e_star=e_star, e_star_range=(e_early, e_late),
               budget_ratio=(epochs / e_star) * (1 + b0 / b_noise), limit=limit_at(b_noise),
               limit_is_bound=bound_only, held_up_to=held_up_to, lost_from=lost_from, target=target)
    out["tests"] = _compare(cells, b0, held_up_to, lost_from, n_test)
    sides = {t["predicted"] for t in out["tests"]}
    if not tuned:
        out["verdict_text"] = _one_rate(tuned)
        return out
    if "held" not in sides or "lost" not in sides:
        side = "below" if "held" not in sides else "above"
        above = f"≥ {lost_from:.0f}" if lost_from is not None else "none, B_noise's interval is open above"
        against = [t["batch_size"] for t in out["tests"] if t["agrees"] is False]
        out["verdict_text"] = (f"not run: no batch size well {side} the limit {'≥ ' if bound_only else ''}"
                               f"{out['limit']:.0f} (well below: ≤ {held_up_to:.0f}; well above: {above})"
                               + (f"; of those tested, {', '.join(map(str, against))} went the other way"
                                  if against else ""))
        return out
    verdicts = [t["agrees"] for t in out["tests"]]
    if False in verdicts:
        out["verdict"] = out["verdict_text"] = claims.CONTRADICTED
    elif all(v is True for v in verdicts):
        out["verdict"] = out["verdict_text"] = claims.SUPPORTED
    else:
        ns = sorted({len(base), *(t["n"] for t in out["tests"])})
        out["verdict"] = claims.UNSETTLED
        out["verdict_text"] = f"unsettled with {ns[0]}" + (f"-{ns[-1]}" if len(ns) > 1 else "") + " seeds"
    return out


ONE_RATE = ("not run: one learning rate at every batch size, and the paper's model assumes each batch size's "
            "best (the tuned plan's series is the test)")


def _one_rate(tuned: bool, reason: str | None = None) -> str:
    """Why a series gets no verdict: for one at a single learning rate that first (and `reason` beside it)."""
    if tuned:
        return reason or ""
    return ONE_RATE + (f"; also {reason.removeprefix('not run: ')}" if reason else "")


def _compare(cells: dict[int, list[dict]], b0: int, held_up_to: float, lost_from: float | None,
             n_test: int | None) -> list[dict]:
    """Each batch size well below the limit (predicted held) or well above it (predicted lost)
    against B_0 by Welch's interval: whether it came out as predicted (None: unsettled)."""
    tests = []
    base_acc = [accuracy(t) for t in cells[b0]]
    for bs, ts in cells.items():
        if bs == b0:
            continue
        if bs <= held_up_to * (1 + 1e-9):  # the tolerance: a limit of exactly twice a batch size
            predicted = "held"
        elif lost_from is not None and bs >= lost_from * (1 - 1e-9):
            predicted = "lost"
        else:
            continue
        w = welch([accuracy(t) for t in ts], base_acc, n_test=n_test)
        low, high = (None, None) if w["ci_low"] is None else (100 * w["ci_low"], 100 * w["ci_high"])
        if low is None:
            agrees = None
        elif predicted == "held":
            agrees = True if low > -SHARP else False if high < -SHARP else None
        else:
            agrees = True if high < -SHARP else False if low > -SHARP else None
        tests.append({"batch_size": bs, "predicted": predicted, "diff": 100 * w["diff"], "ci_low": low,
                      "ci_high": high, "agrees": agrees, "n": len(ts)})
    return tests


# --- as text --------------------------------------------------------------------------------------

SAYS = "A fixed number of epochs holds accuracy well below B_noise (E/E_min − 1) and loses it well above"


def shown(r: dict) -> dict | None:
    """The comparison a one-line summary shows: the first that disagrees, else the first unsettled,
    else the largest batch size tested."""
    tests = r["tests"]
    return (next((t for t in tests if t["agrees"] is False), None) or next((t for t in tests if t["agrees"] is None), None)
            or (tests[-1] if tests else None))


def test_text(r: dict) -> str:
    if r["limit"] is None:
        return f"{r['series']}: the limit B_noise (E/E_min − 1) from batch size {r['b0']}"
    held = [t["batch_size"] for t in r["tests"] if t["predicted"] == "held"]
    lost = [t["batch_size"] for t in r["tests"] if t["predicted"] == "lost"]
    bound = "≥ " if r["limit_is_bound"] else ""
    early, late = r.get("e_star_range") or (r["e_star"], r["e_star"])
    seeds = f", {early}-{late} by seed" if early != late else ""
    bits = [f"{r['series']}: limit {bound}{r['limit']:.0f} (B_noise {noise_text(r)} at epoch {r['e_star']}{seeds} "
            f"at batch size {r['b0']}, E/E_min {r['budget_ratio']:.2f})"]
    if held:
        bits.append(f"held at {', '.join(map(str, held))}")
    if lost:
        bits.append(f"lost at {', '.join(map(str, lost))}")
    return "; ".join(bits) + f", against {r['b0']}"


def noise_text(r: dict) -> str:
    """B_noise as measured: "21 (10–∞)", "≥ 10"."""
    if r["limit_is_bound"]:
        return f"≥ {r['b_noise']:.0f}"
    high = "∞" if r["b_noise_high"] is None else f"{r['b_noise_high']:.0f}"
    return f"{r['b_noise']:.0f} ({r['b_noise_low']:.0f}–{high})"


def table_rows(results: list[dict]) -> list[str]:
    """Rows for the claims table (catsdogs.analysis.claims.markdown_table's columns)."""
    lines = []
    for r in results:
        t = shown(r)
        diff = "—" if t is None else f"{t['diff']:+.1f} ({t['batch_size']} vs {r['b0']})"
        interval = "—" if t is None or t["ci_low"] is None else f"{t['ci_low']:+.1f} to {t['ci_high']:+.1f}"
        seeds = " / ".join(str(n) for n in r["n"].values())
        verdict = r["verdict_text"] if r["verdict"] == claims.NOT_RUN else f"**{r['verdict_text']}**"
        lines.append("| " + " | ".join([f"{SAYS} (McCandlish et al. 2018)", test_text(r), diff, interval, seeds,
                                       verdict]) + " |")
    return lines


def point_text(p: NoiseEstimate) -> str:
    """One epoch's pooled estimate: "84 (51–140)", "84 (51–∞)", "≥ 310", or "?" (undetermined)."""
    if p.b_simple is None:
        return "?" if p.low is None else f"≥ {p.low:.0f}"
    high = "∞" if p.high is None else f"{p.high:.0f}"
    return f"{p.b_simple:.0f} ({p.low:.0f}–{high})"
