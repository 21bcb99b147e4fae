"""find-batch-size's answer as the command prints it: each probe as it ends, then the summary.

Reads only the summary find_batch_size.json holds (catsdogs.measure.find_batch_size), so the
lines are the same whether the search just ran or its JSON is read back.
"""

from __future__ import annotations

from catsdogs.gradient_noise import NoiseEstimate, describe
from catsdogs.messages import ProbeRecord
from catsdogs.schema import Status

METHODS = {"bfc": "the step replayed through TensorFlow's allocator", "xla": "XLA's memory plan"}


def probe_line(p: ProbeRecord) -> str:
    worker = {"fresh": "", "reused": "", "retried": " (out of memory in a reused worker; again in a fresh one)"}
    parts = [f"{p.phase:<9} batch size {p.batch_size:>5}: {p.status}{worker.get(p.worker or '', '')}"]
    if p.peak_memory_mb is not None:
        cap = f" of {p.memory_cap_mb:.0f}" if p.memory_cap_mb else ""
        parts.append(f"peak {p.peak_memory_mb:.0f}{cap} MiB")
    if p.status == Status.DONE and p.images_per_second:
        parts.append(f"{p.images_per_second:.1f} images/s")
    if p.status == Status.FAILED and p.error:
        parts.append(p.error.splitlines()[0][:200])
    return ", ".join(parts)


def _linear_rule_note(rec: dict, b_noise: float) -> str:
    """How the linear scaling rule compares with the paper's, and why."""
    if rec["batch_size"] > b_noise:
        return ", too large: above the critical batch size a larger batch no longer takes larger steps."
    if abs(rec["learning_rate"] / rec["linear_learning_rate"] - 1) <= 0.2:
        return ", close to it, as it should be well below the critical batch size."
    return (f", which holds only when both batch sizes ({rec['batch_size']} and {rec['base_batch_size']}) are well "
            "below the critical batch size, as they are not here.")


def _noise_lines(measured: dict | None, settings: dict) -> list[str]:
    if measured:
        shown = describe(NoiseEstimate.from_dict(measured))
        return [f"Critical batch size (the gradient noise scale B_simple after one epoch at batch size "
                f"{measured['batch_size']}): {shown}; measured in {measured['seconds']:.0f} s. It grows as "
                "training goes on, so this early value is a cautious one. It assumes batches drawn with "
                "replacement; training draws without, whose noise is smaller by (n − B)/(n − 1) for n "
                "training images."]
    if settings.get("noise_scale"):
        return ["Critical batch size: not measured (the short run failed; see above)."]
    return []


def summary_lines(summary: dict) -> list[str]:
    """The end of the command's output: measured, predicted, margin, fastest, recommendation."""
    s = summary["settings"]
    lines = []
    largest = summary["largest_fitting"]
    probes = summary["probes"]
    cap_mb = next((p.get("memory_cap_mb") or p.get("device_memory_limit_mb") for p in probes
                   if p.get("memory_cap_mb") or p.get("device_memory_limit_mb")), None)
    under = f" under {cap_mb:.0f} MiB" if cap_mb else ""
    if largest is None:
        lines.append(f"No batch size fits{under}.")
    else:
        nxt = summary["first_not_fitting"]
        why = (f"; {nxt} did not" if nxt else
               f"; every size up to --max {s['max']} fit" if summary["reached_max"] else "")
        lines.append(f"Largest batch size that fits{under}: {largest} (measured{why}).")
    fraction = summary.get("memory_fraction")
    if fraction and cap_mb:
        lines.append(f"That limit is XLA's: {fraction:.0%} of the GPU's memory (XLA_CLIENT_MEM_FRACTION, 75% by "
                     f"default, with preallocation off too); a training run gets the same unless it sets it.")
    pred = summary.get("prediction")
    if pred:
        apart = f" ({pred['percent_apart']:+.1f}% from the measured {largest})" if "percent_apart" in pred else ""
        if pred.get("method") == "xla":
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
                f"{pred['state_bytes'] / 2**20:.0f} MiB of weights, gradients and {s['optimizer']} slots, "
                f"{pred['baseline_bytes'] / 2**20:.0f} MiB runtime baseline "
                f"(from the batch-size-{pred['calibration_batch_size']} probe).")
    if largest is None:
        return lines
    if summary.get("fastest"):
        f = summary["fastest"]
        lines.append(f"Fastest that fits: {f['batch_size']} at {f['images_per_second']:.1f} images/s "
                     f"(median of {s['steps']} steps per probe).")
    if s["margin"]:
        lines.append(f"With a {s['margin']:.0%} margin: {summary['margin_batch_size']}.")
    measured = summary.get("noise_scale")
    lines += _noise_lines(measured, s)
    rec = summary.get("recommendation")
    if not rec:
        lines.append("No recommendation: no size at or below the margin's fit with a throughput measured.")
        return lines
    why = {"memory": f"memory binds: it is the largest size the {s['margin']:.0%} margin allows, and the fastest",
           "speed": "speed binds: throughput peaked below the memory limit"
                    + (" and the critical batch size" if measured and measured.get("b_simple") else ""),
           "statistics": "statistics binds: a larger batch would be faster but is above the critical batch "
                         "size, where it buys few steps"}[rec["binding"]]
    lines.append(f"Recommendation: batch size {rec['batch_size']}, {rec['images_per_second']:.1f} images/s ({why}).")
    if rec["learning_rate_rule"] == "paper":
        b_noise = measured["b_simple"]
        lines.append(
            f"Learning rate {rec['learning_rate']:.3g}: the paper's rule, {s['optimizer']}'s default "
            f"{rec['base_learning_rate']:g} at batch size {rec['base_batch_size']} x (1 + {b_noise:.0f}/"
            f"{rec['base_batch_size']}) / (1 + {b_noise:.0f}/{rec['batch_size']}); the linear scaling rule "
            f"would give {rec['linear_learning_rate']:.3g}" + _linear_rule_note(rec, b_noise))
    else:
        lines.append(
            f"Learning rate {rec['learning_rate']:.3g} ({s['optimizer']}'s default {rec['base_learning_rate']:g} "
            f"x {rec['batch_size']}/{rec['base_batch_size']}, the linear scaling rule"
            + ("; the noise scale is only a lower bound, so the paper's rule cannot be applied)." if measured else ")."))
        lines.append("The linear scaling rule holds only below the critical batch size: check the accuracy, "
                     "and consider a learning-rate warm-up at large batch sizes.")
    return lines
