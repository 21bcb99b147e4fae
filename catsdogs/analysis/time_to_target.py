"""Which batch size reaches the target soonest, measured, and find-batch-size's prediction held
against it. Pure functions of the to-target tables (catsdogs.analysis.to_target) and
find-batch-size's results (find_batch_size.json), apart from `load_find_results`.

Per series of a sweep run until a target (the `critical` plan) and a find-batch-size result on
the same optimizer, data (its fingerprint), image size and backend:

- **measured** T(B) = S(B) t_step(B), no prediction in it: S(B) the series' steps to the target
  (its chosen rate's median over seeds), t_step(B) the median over those same trials of their own
  training seconds per update (train_seconds / steps: evaluations and the noise scale are outside
  that clock; the first epoch's tracing is inside, as it is in any run's time to a target);
- **predicted** T(B) proportional to (1 + B_noise/B) t_step(B), from find-batch-size's noise scale
  and its probes' step times interpolated on log-log axes (catsdogs.goodput), at the plan's batch
  sizes that its probes cover (never extrapolated) and its margin allows;
- at the plan's batch sizes: the **recommended** one (least predicted time; find-batch-size's
  own answer may lie between or beyond them, so it is chosen again among them), the **measured
  best**, and the ratio T(recommended) / T(best). **met** when at most TARGET_RATIO, **missed**
  otherwise, with its cause in numbers: the two factors of the ratio, steps and step time, each
  as predicted and as measured.

How the report finds the results: those given with `catsdogs report --find-batch-size FILE`, else
every OUT/*/find_batch_size.json (find-batch-size --out OUT writes OUT/NAME/find_batch_size.json);
each is held against the series it matches, and one that matches none is left out, said so.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from catsdogs import goodput
from catsdogs.analysis.rows import field, setting_of
from catsdogs.errors import CatsdogsError
from catsdogs.model_ref import RACE_SPLIT, trial_model

TARGET_RATIO = 1.25  # T(recommended) / T(best) at most this: the recommendation costs at most 25% more time
RESULT_FILE = "find_batch_size.json"


def load_find_results(out: Path | str, given: list[Path] | None = None) -> list[dict]:
    """find-batch-size's results, each with its "path": `given` (a missing or unreadable one is an
    error), else every OUT/*/find_batch_size.json (an unreadable one is skipped)."""
    paths = list(given) if given else sorted(Path(out).glob(f"*/{RESULT_FILE}"))
    found = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            if not isinstance(data, dict) or "settings" not in data:
                raise ValueError("not a find_batch_size.json: it has no settings")
            if data.get("interrupted"):
                raise ValueError("its run was interrupted (Ctrl-C) before an answer: run it again")
        except (OSError, ValueError) as e:
            if given:
                raise CatsdogsError(f"cannot read find-batch-size's result {path}: {e}") from None
            continue
        found.append({**data, "path": str(path)})
    return found


def identity_of_series(table: dict) -> dict:
    """What a find-batch-size result must share with a series to be held against it."""
    t = table["rows"][0]["chosen"][0] if table["rows"] and table["rows"][0]["chosen"] else {}
    return {"optimizer": field(t, "optimizer"), "dataset": field(t, "dataset"), "image_size": field(t, "image_size"),
            "precision": field(t, "precision", "float32"), "backend": setting_of(t, "backend"),
            "data": _folder_of(field(t, "data")), "model": field(t, "model")}  # (None: the article's model)


def _folder_of(data):
    """A series' data as a result records it: a race's trials on a user's folder hold its split too."""
    return data.removesuffix(RACE_SPLIT) if isinstance(data, str) else data


def identity_of_result(found: dict) -> dict:
    """A result's identity as `identity_of_series`'s; "model": a user's model (--model) as its
    trials are keyed (model_ref.trial_model: its race's series, never the article's, whatever else
    it shares with one, its data or its image size)."""
    s, m = found.get("settings") or {}, found.get("model") or {}
    model = trial_model(m, m.get("name"), m.get("architecture")) if s.get("model") else None
    return {"optimizer": s.get("optimizer"), "dataset": s.get("dataset"), "image_size": s.get("image_size"),
            "precision": s.get("precision"), "backend": found.get("backend"), "data": s.get("data_fingerprint"),
            "model": model}


def comparisons(tables: list[dict], found: list[dict]) -> dict:
    """{"rows": a comparison per (series, matching result) (`compare`), "unmatched": the results'
    paths that match no series}."""
    rows, used = [], set()
    for table in tables:
        for f in found:
            if identity_of_result(f) == identity_of_series(table):
                rows.append(compare(table, f))
                used.add(f["path"])
    return {"rows": rows, "unmatched": [f["path"] for f in found if f["path"] not in used]}


def measured_step_seconds(trials: list[dict]) -> float | None:
    """The median over `trials` of their training seconds per update."""
    per = [t["train_seconds"] / t["steps"] for t in trials if t.get("train_seconds") and t.get("steps")]
    return statistics.median(per) if per else None


def compare(table: dict, found: dict) -> dict:
    """One series against one find-batch-size result: per batch size of the series its measured
    S, t_step and T, and the predicted relative T; the recommended (find-batch-size's rule among the
    series' sizes, its ties as wide as its probes' step-time spreads made them), the best, the
    ratio, the verdict."""
    rec = found.get("recommendation") or {}
    probed = {int(r["batch_size"]): r["step_seconds"] for r in rec.get("table") or []}
    b_noise = rec.get("b_noise")
    rows = []
    for r in table["rows"]:
        t_step = measured_step_seconds(r["chosen"])
        # measured: steps to the target and their seconds; a target met before the first update
        # (0 steps) says nothing of time, as it says nothing of B_crit (to_target leaves it out)
        timed = t_step is not None and math.isfinite(r["steps"]) and r["steps"] > 0
        seconds = r["steps"] * t_step if timed else math.inf
        predicted_step = goodput.step_seconds_at(r["batch_size"], probed) if probed else None
        rows.append({"batch_size": r["batch_size"], "steps": r["steps"], "step_seconds": t_step, "seconds": seconds,
                     "predicted_step_seconds": predicted_step})
    measured = {r["batch_size"]: r["seconds"] for r in rows if math.isfinite(r["seconds"])}
    predictable = {r["batch_size"]: r["predicted_step_seconds"] for r in rows if r["predicted_step_seconds"]}
    predicted = goodput.relative_times(predictable, b_noise) if predictable else {}
    best_time = min(measured.values(), default=None)
    for r in rows:
        r["relative"] = r["seconds"] / best_time if best_time else None
        r["predicted_relative"] = predicted.get(r["batch_size"])
    out = {"label": table["label"], "context": table["context"], "target": table["target"], "path": found["path"],
           "b_noise": b_noise, "statistics": rec.get("statistics"), "interval": rec.get("interval"),
           "own_recommendation": rec.get("batch_size"),
           "rows": rows, "recommended": None, "best": None, "ratio": None}
    if not measured:
        return {**out, "verdict": "not judged", "why": "no batch size has a measured time to the target"}
    if not predicted:
        return {**out, "verdict": "not judged",
                "why": "find-batch-size's probes cover none of the sweep's batch sizes within its margin"}
    best = min(measured, key=lambda b: (measured[b], b))
    # find-batch-size's rule on these sizes, its ties widened by its probes' step-time spreads
    probed_spread = {int(r["batch_size"]): r.get("step_spread") or 0.0 for r in rec.get("table") or []}
    spread = {b: goodput.spread_at(b, probed_spread) for b in predictable}
    chosen = goodput.decide(predictable, decision_span(rec), spread)["batch_size"]
    ratio = measured.get(chosen, math.inf) / measured[best]
    verdict = "met" if ratio <= TARGET_RATIO else "missed"
    return {**out, "recommended": chosen, "best": best, "ratio": ratio, "verdict": verdict,
            "cause": None if verdict == "met" else cause(rows, chosen, best, b_noise)}


def decision_span(rec: dict) -> tuple[float, float] | None:
    """B_noise's interval as find-batch-size decided with it (goodput.interval); a result written
    before 0.17.0 holds only the estimate it decided at, read as a point."""
    if "interval" in rec:
        span = rec["interval"]
        return (span[0], math.inf if span[1] is None else span[1]) if span else None
    return (rec["b_noise"], rec["b_noise"]) if rec.get("b_noise") is not None else None


def cause(rows: list[dict], chosen: int, best: int, b_noise: float | None) -> str:
    """A miss in numbers: T(chosen)/T(best) split into its steps and its step time, each as
    predicted and as measured."""
    by = {r["batch_size"]: r for r in rows}
    c, b = by[chosen], by[best]
    if not math.isfinite(c["seconds"]):
        return (f"batch size {chosen} did not reach the target (its median seed missed)" if not math.isfinite(c["steps"])
                else f"batch size {chosen} has no measured time to the target (no steps, or no step time)")
    steps_predicted = ((1 + b_noise / chosen) / (1 + b_noise / best)) if b_noise is not None else best / chosen
    step_predicted = c["predicted_step_seconds"] / b["predicted_step_seconds"] if b["predicted_step_seconds"] else math.nan
    return (f"steps S({chosen})/S({best}): predicted {steps_predicted:.2f}, measured {c['steps'] / b['steps']:.2f}; "
            f"step time t({chosen})/t({best}): predicted {step_predicted:.2f}, measured "
            f"{c['step_seconds'] / b['step_seconds']:.2f}")


def markdown(compared: dict | None) -> list[str]:
    """The report's section: per comparison, the table of measured and predicted T(B) and the verdict."""
    if not compared or not (compared["rows"] or compared["unmatched"]):
        return []
    lines = ["## Time to the target: measured, and find-batch-size's prediction", ""]
    if compared["rows"]:
        lines += ["Measured T(B) = S(B) × t_step(B): the steps to the target (the chosen rate's median over seeds) "
                  "times those trials' own training seconds per update; no prediction in it. Predicted: "
                  "(1 + B_noise/B) × t_step(B) from find-batch-size's noise scale and its probes' step times "
                  "(interpolated on log-log axes between probed sizes, never extrapolated), relative to the best. "
                  "The recommendation is chosen again among the sweep's batch sizes by find-batch-size's own rule "
                  "(the least worst case over B_noise's interval, the middle of its ties); "
                  f"**met** when its measured time is at most {TARGET_RATIO:g}× the measured best's.", "",
                  "![time_to_target](figures/time_to_target.png)", ""]
    for c in compared["rows"]:
        noise = (f"B_noise {c['b_noise']:.0f}" if c["b_noise"] is not None else
                 "the noise scale only a lower bound" if c["statistics"] == "open above" else
                 "the noise scale unresolved (speed alone)")
        if c.get("interval"):
            low, high = c["interval"]
            noise += f", {low:.0f} to {'unbounded' if high is None else f'{high:.0f}'}"
        lines += [f"### {c['label']} · {c['target'].describe()} · {c['context']}", "",
                  f"find-batch-size: `{c['path']}` ({noise}; its own recommendation {c['own_recommendation']}).", "",
                  "| batch size | steps | s per step | measured T (s) | measured, relative | predicted, relative |",
                  "|---|---|---|---|---|---|"]
        for r in c["rows"]:
            mark = " **best**" if r["batch_size"] == c["best"] else ""
            mark += " *recommended*" if r["batch_size"] == c["recommended"] else ""
            lines.append(
                f"| {r['batch_size']}{mark} | {_num(r['steps'], '.0f')} | {_num(r['step_seconds'], '.4f')} | "
                f"{_num(r['seconds'], '.1f')} | {_num(r['relative'], '.2f')} | {_num(r['predicted_relative'], '.2f')} |")
        lines.append("")
        if c["ratio"] is None:
            lines.append(f"- **{c['verdict']}**: {c['why']}.")
        else:
            lines.append(f"- Recommended {c['recommended']}, measured best {c['best']}: T(recommended)/T(best) "
                         f"{_num(c['ratio'], '.2f')}, **{c['verdict']}** (at most {TARGET_RATIO:g})"
                         + (f"; {c['cause']}." if c.get("cause") else "."))
        lines.append("")
    if compared["unmatched"]:
        lines += ["find-batch-size results that match no series of this sweep (another model, optimizer, data, image "
                  "size or backend): " + ", ".join(f"`{p}`" for p in compared["unmatched"]) + ".", ""]
    return lines


def _num(value, spec: str) -> str:
    if value is None:
        return "—"
    return format(value, spec) if math.isfinite(value) else "∞"
