"""Which batch size reaches a target soonest: predicted time to accuracy from the probes' step
times and the gradient noise scale. Pure functions, no framework.

The paper's model (McCandlish et al. 2018) puts the optimizer steps to a target at
S(B) = S_min (1 + B_noise/B); a probe measures the seconds a step takes, t_step(B) = B / (images/s).
The time to the target is their product,

    T(B) = S_min (1 + B_noise/B) t_step(B),

which is what Pollux (OSDI 2021, AdaptDL) calls goodput's inverse: throughput times statistical
efficiency. S_min is the same for every batch size, so T(B) / T(best) needs only B_noise and the
probes. Its two limits: with B_noise -> 0 every step is as good as the whole data set, and the
smallest step time wins; with B_noise -> infinity T(B) is B_noise / (images/s), and the fastest
throughput wins, which is what speed alone picks.

**The candidates** are the sizes that were probed and passed, whose last probe passed (a size is
never recommended on an earlier probe when a later one of it failed: TensorFlow's CPU peak is not
monotonic in the batch size), no larger than the margin's size. Between probed sizes t_step is
interpolated on log-log axes (`step_seconds_at`), never extrapolated: what the report uses to read
the prediction at a batch size the search did not probe.

**Unresolved statistics**: a noise scale that is not a number, or whose interval is open above,
could be anything large, and then T(B) is speed's. So the recommendation falls back to speed
within memory, and says "statistics could not be resolved": an interval open above never moves
the answer below speed's.

**The near-best set**: every candidate within NEAR (10%) of the best predicted time, at B_noise's
value and at each end of its interval (the union): how far the answer may move within what the
measurement allows.
"""

from __future__ import annotations

import math

from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.messages import ProbeRecord
from catsdogs.schema import Status

NEAR = 0.10  # within 10% of the best predicted time: as good (the near-best set)


def passed(probes: list[ProbeRecord], at_most: int | None = None) -> dict[int, ProbeRecord]:
    """{batch size: its last probe} for every size whose last probe passed with a throughput, no
    larger than `at_most`."""
    last: dict[int, ProbeRecord] = {}
    for p in probes:
        last[p.batch_size] = p
    return {b: p for b, p in sorted(last.items())
            if p.status == Status.DONE and p.images_per_second and (at_most is None or b <= at_most)}


def step_seconds_at(batch: float, step_seconds: dict[int, float]) -> float | None:
    """t_step at `batch`, interpolated on log-log axes between the probed sizes around it; None
    outside them (never extrapolated)."""
    sizes = sorted(step_seconds)
    if not sizes or batch < sizes[0] or batch > sizes[-1]:
        return None
    if batch in step_seconds:
        return step_seconds[int(batch)]
    hi = next(b for b in sizes if b > batch)
    lo = max(b for b in sizes if b < batch)
    f = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp(math.log(step_seconds[lo]) + f * (math.log(step_seconds[hi]) - math.log(step_seconds[lo])))


def relative_times(step_seconds: dict[int, float], b_noise: float | None) -> dict[int, float]:
    """T(B) / min T over the sizes: (1 + B_noise/B) t_step(B), or speed's t_step/B when B_noise is
    None (unbounded: the limit B_noise -> infinity)."""
    raw = {b: (t / b if b_noise is None else (1 + b_noise / b) * t) for b, t in step_seconds.items()}
    best = min(raw.values())
    return {b: v / best for b, v in raw.items()}


def resolved(estimate: NoiseEstimate | None) -> bool:
    """A noise scale to decide with: a number, with an interval bounded above."""
    return bool(estimate and estimate.b_simple is not None and estimate.low is not None and estimate.high is not None)


def choose(probes: list[ProbeRecord], safe: int, estimate: NoiseEstimate | None) -> dict | None:
    """The batch size predicted to reach a target soonest among the candidates (the module says
    which), with the table it was chosen from: {"batch_size", "binding", "statistics": "resolved" or
    "unresolved", "b_noise", "table": [{batch_size, images_per_second, step_seconds,
    relative_steps, relative_time}], "near_best": [...], "near_best_interval": [...]}; None when
    no size passed."""
    candidates = passed(probes, safe)
    if not candidates:
        return None
    step_seconds = {b: b / p.images_per_second for b, p in candidates.items()}
    ok = resolved(estimate)
    b_noise = estimate.b_simple if ok else None
    times = relative_times(step_seconds, b_noise)
    best = min(times, key=lambda b: (times[b], b))
    per_image = relative_times(step_seconds, None)
    speed = min(per_image, key=lambda b: (per_image[b], b))  # the fastest per image
    largest = max(candidates)
    # what decides: the memory limit, the fastest per image, or else the steps (statistics), which
    # moved the answer off the fastest per image, below it (a larger batch saves too few steps) or
    # above it (a larger batch saves enough steps to be worth its slower images)
    binding = "memory" if best == largest else "speed" if best == speed else "statistics"
    scenarios = [b_noise] + ([estimate.low, estimate.high] if ok else [])
    near_interval = sorted({b for s in scenarios for b, t in relative_times(step_seconds, s).items() if t <= 1 + NEAR})
    return {"batch_size": best, "images_per_second": candidates[best].images_per_second, "binding": binding,
            "fastest_per_image": speed,
            "statistics": "resolved" if ok else "unresolved", "b_noise": b_noise,
            "table": [{"batch_size": b, "images_per_second": candidates[b].images_per_second,
                       "step_seconds": step_seconds[b], "relative_steps": 1 + b_noise / b if b_noise else 1.0,
                       "relative_time": times[b]} for b in sorted(candidates)],
            "near_best": sorted(b for b, t in times.items() if t <= 1 + NEAR),
            "near_best_interval": near_interval}
