"""find-batch-size's answer as the command prints it: each probe as it ends, then the summary.

Reads only the summary find_batch_size.json holds (catsdogs.measure.find_batch_size), so the
lines are the same whether the search just ran or its JSON is read back.
"""

from __future__ import annotations

from catsdogs import targets
from catsdogs.find_result import FindResult
from catsdogs.goodput import TIE
from catsdogs.gradient_noise import NoiseEstimate, describe
from catsdogs.lr_rules import RULES
from catsdogs.measure.common import format_bytes, settings_note
from catsdogs.messages import ProbeRecord
from catsdogs.optimizers import OPTIMIZERS
from catsdogs.schema import Status

METHODS = {"bfc": "the step replayed through TensorFlow's allocator", "xla": "XLA's memory plan",
           "line": "a line through the batch-size-1 probe and a fresh one"}


def probe_line(p: ProbeRecord) -> str:
    worker = {"fresh": "", "reused": "", "retried": " (out of memory in a reused worker; again in a fresh one)"}
    said = worker.get(p.worker or "", "")
    if p.status == Status.OOM and p.residue_mb is not None:
        said = (" (the worker recovered in place)" if p.keeps_worker() else
                f" (the worker kept {p.residue_mb:.0f} MiB after it: fresh workers from here on)")
    parts = [f"{p.phase:<9} batch size {p.batch_size:>5}: {p.status}{said}"]
    if p.peak_memory_mb is not None:
        cap = f" of {p.memory_cap_mb:.0f}" if p.memory_cap_mb else ""
        parts.append(f"peak {p.peak_memory_mb:.0f}{cap} MiB")
    if p.status == Status.DONE and p.images_per_second:
        parts.append(f"{p.images_per_second:.1f} images/s")
    if p.status == Status.FAILED and p.error:
        parts.append(p.error.splitlines()[0][:200])
    if p.status == Status.OOM and p.oom_cause:
        parts.append(p.oom_cause)  # the allocator's words (catsdogs.measure.oom)
    return ", ".join(parts)


def _noise_lines(measured: dict | None, settings: dict, model: dict | None = None) -> list[str]:
    if measured:
        shown = describe(NoiseEstimate.from_dict(measured))
        seeds, first = measured.get("seeds"), measured.get("from_epoch")
        epochs = f"epoch {first}" if first == measured["epochs"] else f"epochs {first}-{measured['epochs']}"
        clustered = len(seeds or []) > 2 or measured.get("clustered")
        when = (f"after {epochs} at batch size {measured['batch_size']}, seeds "
                + (f"{', '.join(map(str, seeds[:-1]))} and {seeds[-1]}, each one cluster" if clustered else
                   f"{' and '.join(map(str, seeds))} pooled")
                if seeds and first else f"after one epoch at batch size {measured['batch_size']}")
        if measured.get("estimator") == "two-batch":
            when += f", by the two-batch estimator on micro-batches of {measured['small']}"
            if measured.get("batch_norm"):
                when += " (the model has BatchNormalization: over fewer images its statistics are nothing like training's)"
        return [f"Critical batch size (the gradient noise scale B_simple {when}): {shown}; measured in "
                f"{measured['seconds']:.0f} s. It grows as training goes on, so this early value is a cautious "
                "one. It assumes batches drawn with replacement; training draws without, whose noise is smaller "
                "by (n − B)/(n − 1) for n training images."]
    if settings.get("noise_scale") and (model or {}).get("random_images"):
        return ["Critical batch size: not measured: random images have no gradient signal to measure "
                "(--data DIR, or prepared data of the model's input size, gives it real ones)."]
    if settings.get("noise_scale"):
        return ["Critical batch size: not measured (the noise scale's line above says why)."]
    return []


def _margin_lines(result: FindResult, s: dict) -> list[str]:
    """The margin's size, and where its confirmation failed, how far the answer moved and why."""
    lines: list[str] = []
    failed = result.margin_failed or []
    unneeded = (s["margin"] and result.stopped_by in ("data", "max")
                and result.margin_batch_size == result.largest_fitting)
    if unneeded:
        lines.append(f"No {s['margin']:.0%} margin taken: memory did not stop the search, and the largest size's "
                     f"peak left more room than the margin would.")
    elif s["margin"] or failed:
        safe = result.margin_batch_size
        lines.append(f"With a {s['margin']:.0%} margin: {safe if safe is not None else 'none that passed'}."
                     if s["margin"] else f"The largest that passed again: {safe}.")
    if failed:
        safe = result.margin_batch_size
        outcome = ("and no size below them passed: no answer with the margin; try a larger --margin" if safe is None
                   else f"so the answer moved down the margin's grid to {safe}, the first size that passed again")
        lines.append(f"The limit is noisy there: {', '.join(map(str, failed))} did not pass "
                     f"{'its' if len(failed) == 1 else 'their'} confirmation (peak memory is not monotonic in the "
                     f"batch size), {outcome}.")
    return lines


def _prediction_lines(pred: dict, largest: int | None, optimizer: str) -> list[str]:
    """The memory model's answer beside the measured one (and what the search aimed at instead)."""
    lines: list[str] = []
    apart = f" ({pred['percent_apart']:+.1f}% from the measured {largest})" if "percent_apart" in pred else ""
    if (pred.get("refined") or {}).get("max_batch_size"):
        r = pred["refined"]
        lines.append(f"The search aimed at {r['max_batch_size']}, the line through its probes of "
                     f"{r['from'][0]} and {r['from'][1]} (exact peaks on a GPU), past the memory model's:")
    if pred.get("method") == "line":
        lines.append(
            f"A line through two probes predicts {pred['max_batch_size']}{apart}: peak "
            f"{pred['calibration_peak_mb']:.0f} MiB at batch size {pred['calibration_batch_size']} and "
            f"{pred['second_peak_mb']:.0f} MiB at {pred['second_batch_size']} (a fresh worker), "
            f"{pred['per_image_bytes'] / 2**20:.2f} MiB per image.")
    elif pred.get("method") == "xla":
        lines.append(
            f"XLA's memory plan predicts {pred['max_batch_size']}{apart}: "
            f"{pred['per_image_bytes'] / 2**20:.2f} MiB per image, {pred['state_bytes'] / 2**20:.0f} MiB "
            f"batch-independent, as compiled at batch sizes {', '.join(map(str, pred['planned_bytes']))}; "
            f"{pred['baseline_bytes'] / 2**20:.0f} MiB runtime baseline "
            f"(from the batch-size-{pred['calibration_batch_size']} probe).")
    else:
        written = " written" if pred.get("device") == "cpu" else ""
        lines.append(
            f"The step replayed through TensorFlow's allocator predicts {pred['max_batch_size']}{apart}: "
            f"{pred['per_image_bytes'] / 2**20:.2f} MiB{written} per image up to it, "
            f"{pred['state_bytes'] / 2**20:.0f} MiB of weights, gradients and {optimizer} slots, "
            f"{pred['baseline_bytes'] / 2**20:.0f} MiB runtime baseline "
            f"(from the batch-size-{pred['calibration_batch_size']} probe).")
        if pred.get("check"):
            lines.append(_check_line(pred))
    return lines


def _check_line(pred: dict) -> str:
    """What the replay's check (memory_prediction.check_replay) measured, and what it changed."""
    c = pred["check"]
    if c["status"] == "oom":
        return (f"Checked at batch size {c['batch_size']} (a fresh worker): out of memory, so the replay's "
                f"{c['replay_max_batch_size']} is more than a quarter high; the search bisected below it.")
    if c.get("apart_mb") is None:
        return f"Its check at batch size {c['batch_size']} did not run to the end ({c['status']}): the replay stands."
    said = (f"Checked at batch size {c['batch_size']} (a fresh worker): "
            f"{c['peak_mb']:,.0f} MiB against the replay's {c['replayed_mb']:,.0f} ({c['apart_mb']:+,.0f} MiB")
    if not pred.get("kernel_bytes_per_image"):
        return f"{said}, within the {c['threshold_mb']:,.0f} MiB one probe's spread reaches: the replay stands)."
    return (f"{said}, beyond the {c['threshold_mb']:,.0f} MiB one probe's spread reaches): "
            f"{pred['kernel_bytes_per_image'] / 2**20:+.3f} MiB an image as this CPU's kernels run the step, "
            f"counted in the prediction (the replay alone: {c['replay_max_batch_size']}).")


def summary_lines(result: FindResult) -> list[str]:
    """The end of the command's output, rendered from its result: measured, predicted, margin,
    fastest, recommendation."""
    s = result.settings
    largest = result.largest_fitting
    cap_mb = next((p.get("memory_cap_mb") or p.get("device_memory_limit_mb") for p in result.probes
                   if p.get("memory_cap_mb") or p.get("device_memory_limit_mb")), None)
    lines = [_largest_line(result, cap_mb)]
    if result.memory_fraction and cap_mb:
        lines.append(f"That limit is XLA's: {result.memory_fraction:.0%} of the GPU's memory (XLA_CLIENT_MEM_FRACTION, "
                     f"75% by default, with preallocation off too); a training run gets the same unless it sets it.")
    if result.prediction:
        lines += _prediction_lines(result.prediction, largest, s["optimizer"])
    if largest is None:
        return lines
    if result.fastest:
        f = result.fastest
        lines.append(f"Fastest that fits: {f['batch_size']} at {f['images_per_second']:.1f} images/s "
                     f"(the median step of each probe's {s['steps']} or more, timed for at least "
                     f"{s.get('min_seconds') or 0:g} s).")
    lines += _margin_lines(result, s)
    lines += _noise_lines(result.noise_scale, s, result.model)
    rec = result.recommendation
    if not rec:
        lines.append("No recommendation: no size at or below the margin's fit with a throughput measured.")
        return lines
    lines += time_table_lines(rec)
    lines += _decision_lines(rec, s, result.noise_scale)
    lr, base = rec["learning_rate"], rec["base_learning_rate"]
    anchor = rec.get("learning_rate_anchor", "Keras's default")  # a JSON of 0.11.0 read back has none
    lines.append(f"Learning rate {lr:.3g}: {RULES[rec['learning_rate_rule']].text}, anchored at {anchor}: {base:g} at "
                 f"batch size {rec['base_batch_size']}.")
    lines.append(learning_rate_caveat(rec["learning_rate_rule"], anchor, s["optimizer"]))
    plan = (result.hand_off or {}).get("accumulation")
    if plan:
        m, k, e = plan["micro_batch_size"], plan["steps"], plan["effective_batch_size"]
        safe = result.margin_batch_size
        lines.append(f"Effective batch {e:,}: " + (f"fits as one batch (the margin's size is {safe:,})."
                     if k == 1 else f"accumulate {k} micro-batches of {m:,} a step ({m:,} x {k} = {e:,}; the "
                     f"margin's size is {safe:,}): each step costs {k} step times of "
                     f"{m:,}, which no fewer steps repay, so train at {rec['batch_size']:,} unless the recipe needs {e:,}."))
    return lines


def _largest_line(result: FindResult, cap_mb: float | None) -> str:
    """The measured limit, and what ended the search."""
    under, largest = f" under {cap_mb:.0f} MiB" if cap_mb else "", result.largest_fitting
    if largest is None:
        return f"No batch size fits{under}."
    if result.stopped_by == "data":
        train = (result.search_bound or {}).get("train_images") or largest
        return (f"Largest batch size that fits{under}: {largest} (measured): every size up to the {train:,} "
                f"training images fits: a larger batch cannot be trained on these data; --max N searches further.")
    nxt, top = result.first_not_fitting, result.pool_ceiling
    held = (f", and by its allocator's words no size above {top['batch_size']} can fit in the worker's pool "
            f"(its largest free block {top['largest_free_mb']:,.0f} MiB, {top['per_image_mb']:.2f} MiB an image): "
            "not probed" if top and top.get("per_image_mb") and top.get("largest_free_mb") else "")
    why = (f"; {nxt} did not{held}" if nxt else
           f"; every size up to --max {result.settings['max']} fit" if result.reached_max else "")
    return f"Largest batch size that fits{under}: {largest} (measured{why})."


def learning_rate_caveat(rule: str, anchor: str, optimizer: str) -> str:
    """What the printed rate does not know, said for every rule: a rule carries a rate, it does not
    tune one; Keras's default is not a tuned rate; Adam's rule scales the rate only."""
    said = ["Tune it where it matters: a rule carries a rate from its anchor, it does not tune one."]
    if anchor == "Keras's default":
        said.append(OPTIMIZERS[optimizer].note)
    if rule == "sqrt":
        said.append("The square-root rule scales the rate only: Adam's betas and epsilon, which Malladi et al. "
                    "rescale with the batch too, stay at their defaults.")
    return " ".join(said)


def _decision_lines(rec: dict, s: dict, measured: dict | None) -> list[str]:
    """The recommendation, what binds it, its worst case beside the fastest's, and its ties."""
    span = rec.get("interval")
    over = (f"B_noise from {span[0]:.0f} to {'any larger value' if span[1] is None else f'{span[1]:.0f}'}"
            if span else "")
    why = {"memory": f"memory binds: it is the largest size the {s['margin']:.0%} margin allows, and a larger "
                     "one would reach a target sooner still",
           "data": "the data bind: it is as large as these training images allow, and a larger one would reach "
                   "a target sooner still",
           "max": "--max binds: it is the largest size searched, and a larger one may reach a target sooner "
                  "still",
           "speed": "speed binds: throughput per image peaked here, below the memory limit",
           "statistics": (f"statistics binds: with {over or 'B_noise ' + format(rec.get('b_noise') or 0, '.0f')}, "
                          "the steps a batch size saves or costs outweigh its speed per image (the fastest per "
                          f"image is {rec.get('fastest_per_image')})")
           }[rec["binding"]]
    lines = []
    statistics = rec.get("statistics")
    if statistics == "unresolved" and measured:
        risk = rec.get("risk") or {}
        lines.append("Statistics could not be resolved (not even a lower end of the noise scale was measured): the "
                     "choice is speed's within memory"
                     + (f"; should B_noise be as small as {risk['b_noise']:.0f}, it would take "
                        f"{risk['relative_time']:.1f} times the best time." if risk else "."))
    elif statistics == "open above":
        lines.append(f"The noise scale's interval is open above: the choice holds for {over}, its worst case "
                     "over them the least.")
    lines.append(f"Recommendation: batch size {rec['batch_size']}, {rec['images_per_second']:.1f} images/s ({why}).")
    if rec.get("worst_case") is not None and span:
        fastest = rec.get("fastest_per_image")
        lines.append(f"Worst case over {over}: {rec['worst_case']:.2f} times the best time"
                     + (f"; the fastest per image, {fastest}, {rec['fastest_worst_case']:.2f} times."
                        if fastest != rec["batch_size"] else " (it is the fastest per image too)."))
    near = rec.get("near_best") or []
    if near and "worst_case" in rec:
        what = "least worst case" if span else "best predicted time"
        lines.append(f"As good (within {TIE:.0%} of the {what}, plus the step times' spread): "
                     f"{_sizes(near)}" + ("; the middle one on a log scale is recommended." if len(near) > 1 else "."))
    elif near:  # a result of 0.16.0 or earlier read back
        wide = rec.get("near_best_interval") or []
        lines.append(f"Within {TIE:.0%} of the best predicted time: {_sizes(near)}"
                     + (f"; over B_noise's interval: {_sizes(wide)}." if wide and wide != near else "."))
    return lines


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes))


def time_table_lines(rec: dict) -> list[str]:
    """The table the recommendation was chosen from: per size that passed, its throughput, the
    steps and the time to a target relative to the best at B_noise's estimate, and its worst case
    over B_noise's interval."""
    table = rec.get("table") or []
    if not table:
        return []
    worst = "worst_case" in table[0] and rec.get("interval")
    steps = "the paper's steps (1 + B_noise/B)" if rec.get("b_noise") else "speed alone (the noise scale unresolved)"
    lines = [f"Predicted time to a target by batch size: {steps} times each probe's step time, relative to the best"
             + (", and its worst case over B_noise's interval:" if worst else ":"),
             f"  {'batch':>6} {'images/s':>10} {'steps':>7} {'time':>7}" + (f" {'worst':>7}" if worst else "")]
    for r in table:
        mark = "  <- recommended" if r["batch_size"] == rec["batch_size"] else ""
        lines.append(f"  {r['batch_size']:>6} {r['images_per_second']:>10.1f} {r['relative_steps']:>7.2f} "
                     f"{r['relative_time']:>7.2f}" + (f" {r['worst_case']:>7.2f}" if worst else "") + mark)
    return lines


def time_lines(result: FindResult) -> list[str]:
    """Where the answer's time went (none for a JSON from before 0.13.0)."""
    t, n = result.seconds, len(result.probes)
    if not t:
        return []
    noise = f"the noise scale {t['noise_scale']:.0f} s, " if t.get("noise_scale") is not None else ""
    return [f"Answered in {t['total']:.0f} s: {noise}the memory model {t['prediction']:.0f} s, "
            f"{n} probe{'s' if n != 1 else ''} {t['probes']:.0f} s (their workers' starts included)."]


def opening_line(s, size: int, cpu_cap: int | None, user=None, bound=None) -> str:
    """The command's first line: what it searches, on what, under which cap (`s`: its FindSettings,
    `bound`: its SearchBound)."""
    cap_text = (f"each probe capped at {format_bytes(s.memory_cap_bytes)}" if s.memory_cap_bytes else
                "on a GPU its memory is the cap; on the CPU "
                + (f"{format_bytes(cpu_cap)} (90% of the memory available now)" if cpu_cap else "no cap"))
    what = f"model {user.name}" if user else f"{s.dataset} data ({size} px)"
    up_to = ""
    if bound and bound.batch_size:
        up_to = (f" up to {bound.batch_size:,}" if bound.by == "max" else
                 f" up to the {bound.batch_size:,} training images")
    return (f"Find batch size {s.name}: {s.mode} from {s.start}{up_to}, "
            f"{s.optimizer}, {what}, {s.precision}; {cap_text}"
            + settings_note(s.deterministic, s.tf32))


def race_lines(race: dict) -> list[str]:
    """The race's answer as printed: the target, the measured fastest with its interval, what it
    cannot be told from, the fixed costs apart, and the prediction beside it."""
    d = race.get("decision")
    lines = [f"Race to {targets.parse(race['target']).describe()} ({race['target_said']}): {race['trials']} trials "
             f"in {race['seconds']:.0f} s (sweep {race['sweep']})."]
    stopped = race["stopped"]
    if stopped["by"] == "budget" and stopped.get("extension_skipped"):
        lines.append(f"  Every rung ran; --race-budget {stopped['budget_seconds']:g} s left out the edge's extra rate, "
                     f"{stopped['extension_skipped']}.")
    elif stopped["by"] == "budget":
        n = stopped["rungs_finished"]
        lines.append(f"  Stopped by --race-budget {stopped['budget_seconds']:g} s " + (
            f"after {n} whole rung{'s' if n != 1 else ''}: the answer is theirs, on fewer seeds." if n else
            f"before its first rung would finish (about {stopped.get('estimate_seconds', 0):.0f} s more): "
            "a larger budget, or a GPU, races it."))
    if d is None:
        lines.append("  No measured answer: no rung finished; the prediction stands alone.")
        return lines
    high = f"{d['seconds_high']:.2f}" if d["seconds_high"] is not None else "unbounded"
    lines.append(f"  Measured fastest: batch size {d['batch_size']} at learning rate {d['lr']:g}: "
                 f"{d['seconds']:.2f} s of steady training to the target ({d['seconds_low']:.2f}-{high}, 95%, "
                 f"{d['seeds']} seeds; the median time, a log-normal spread's; its least mean: "
                 f"{d['mean_leader']['batch_size']} at {d['mean_leader']['lr']:g}).")
    tied = ", ".join(f"{t['batch_size']} at {t['lr']:g}" for t in d["tied"])
    lines.append(f"  Not told apart from it (within {race['tie']:g}x): {tied or 'none'}.")
    if race["fixed_seconds"]:
        fixed = ", ".join(f"{b}: {s:.2f}" for b, s in race["fixed_seconds"].items())
        lines.append(f"  Fixed costs apart, a trial's median seconds by batch size (compilation, evaluations, "
                     f"data; not in T): {fixed}.")
    p = race["prediction"]
    if p:
        verdict = ("agrees" if p["agrees"] else
                   f"does not: {p['ratio']:.2f}x the fastest's time on {p['seeds']} seeds" if p["raced"] else
                   "was not raced (thinned from the race's grid)")
        lines.append(f"  The prediction recommended {p['batch_size']}: it {verdict}.")
    return lines
