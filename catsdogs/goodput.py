"""Which batch size reaches a target soonest: predicted time to accuracy from the probes' step
times and the gradient noise scale, and the size that holds up whatever B_noise turns out to be
within its interval. Pure functions, no framework.

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
monotonic in the batch size), no larger than the margin's size. Where two neighbouring candidates
near the choice lie more than a factor 2 apart, the sizes between are timed before the decision
(`between`): a size between two probes is otherwise never a candidate. Between probed sizes t_step is
interpolated on log-log axes (`step_seconds_at`), never extrapolated: what the report uses to read
the prediction at a batch size the search did not probe.

**The least worst case** (`worst_cases`, `decide`). B_noise is known only within its interval
[low, high], or [low, infinity) when the interval is open above. For each candidate B the
**regret** at b is T(B; b) / min over B' of T(B'; b): how many times the best time B costs if
B_noise were b. Its worst case over the interval is exact, not sampled: each T(B'; b) is linear
in b, so the best is a concave piecewise-linear envelope, and on each of its pieces the regret is
a ratio of two linear functions, monotone in b; the worst case lies at an end of the interval or
at a crossing of two candidates' lines (infinity's regret is speed's, t_step/B against the best
per image). The recommendation is the candidate whose worst case is least. Read an open interval
as B_noise = infinity and a size fast per image can cost 7 times the best should
B_noise be at the interval's low end; the worst case over the interval prices that risk.

**Ties** (`TIE`): step times are measured, so predicted times are only as sure as they are. Every
candidate whose worst case lies within TIE (10%) of the least, widened by the two sizes' measured
step-time spreads (`spreads`: between their runs where a size was timed again, half the
throughputs' range over their median, about 20% on this project's shared CPU; never less than
within a run, `step_spread`: half the timed steps' interquartile range, relative, 6-9%), is as
good: the **near-best set**. The
recommendation is its middle on a log scale (`log_middle`: the size nearest the geometric mean of
its smallest and largest, the smaller of two as near), a rule fixed in advance: noise in the step
times moves the set at its edges, and its middle least. (A first version took the smallest: on this
project's shared CPU one seed's runs then recommended 8, 16 and 24 as a size entered the set at its
low edge. The next took the middle by count, which probes added where the search bisects moved: three
near the limit carried it from 256 to 544, 0.26.0 on the H200.)

**Unresolved statistics**: a noise scale not measured, or undetermined (neither the gradient nor
the noise clearly positive: not even a lower end), could be anything; then the choice falls back
to speed within memory, and says what it risks: its regret should B_noise be as small as the base
batch size (`RISK_AT`), the scale the short runs measured at.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace

from catsdogs.gradient_noise import NoiseEstimate
from catsdogs.messages import TIMING_PHASES, ProbeRecord
from catsdogs.schema import Status, default

TIE = 0.10  # within 10% of the least worst case (plus the step times' spread): a tie, the near-best set
CONTESTED = 3.0  # a size whose worst case is within 3 times the least may be timed again ...
CONTESTED_MOST = 5  # ... the 5 nearest the least's size, before the decision (`contested`)
BETWEEN_MOST = 3  # the gaps' sizes timed before the decision (`between`), the nearest its choice
RISK_AT = float(default("base_batch_size"))  # unresolved: what speed's choice risks should B_noise be this small


def passed(probes: list[ProbeRecord], at_most: int | None = None) -> dict[int, ProbeRecord]:
    """{batch size: its probe} for every size whose last probe passed with a throughput, no larger
    than `at_most`. A size probed again for its time ("retime") is one record: its throughput the
    median over its probes that passed, its step times all of theirs; a retime that failed (a
    worker lost, say) says nothing of the size's memory and is left out."""
    out = {}
    for b, (p, runs) in _last_and_runs(probes, at_most).items():
        out[b] = p if len(runs) == 1 else replace(
            p, images_per_second=statistics.median(r.images_per_second for r in runs),
            step_times_s=[t for r in runs for t in (r.step_times_s or [])] or None)
    return out


def spreads(probes: list[ProbeRecord], at_most: int | None = None) -> dict[int, float]:
    """{batch size: its step time's relative spread} for `passed`'s sizes: between its runs where it
    was timed more than once (half their throughputs' range over their median: on this project's
    shared CPU one probe's throughput moved by about 20% between runs, where a probe's own steps
    spread by 6-9%), never less than within its runs (`step_spread`, its steps pooled)."""
    merged, out = passed(probes, at_most), {}
    for b, (_, runs) in _last_and_runs(probes, at_most).items():
        ips = [r.images_per_second for r in runs]
        between = (max(ips) - min(ips)) / 2 / statistics.median(ips) if len(ips) > 1 else 0.0
        out[b] = max(between, step_spread(merged[b]))
    return out


def _last_and_runs(probes: list[ProbeRecord], at_most: int | None) -> dict[int, tuple[ProbeRecord, list]]:
    """{batch size: (its last probe, its timed runs that passed)} for the sizes `passed` keeps."""
    last: dict[int, ProbeRecord] = {}
    timed: dict[int, list[ProbeRecord]] = {}
    for p in probes:
        if p.phase in TIMING_PHASES and p.status != Status.DONE:
            continue
        last[p.batch_size] = p
        if p.status == Status.DONE and p.images_per_second:
            timed.setdefault(p.batch_size, []).append(p)
    return {b: (p, timed[b]) for b, p in sorted(last.items())
            if p.status == Status.DONE and p.images_per_second and (at_most is None or b <= at_most)}


def contested(probes: list[ProbeRecord], safe: int, estimate: NoiseEstimate | None, *,
              timeable: Callable[[ProbeRecord], bool]) -> list[int]:
    """The sizes the recommendation could fall on, what find-batch-size times again before it
    decides: the CONTESTED_MOST nearest the least worst case's size on a log scale (itself
    included), among those whose worst case is within CONTESTED times the least and whose peak
    a worker can time again (`timeable`: the prober's rule, ProbeRun.can_retime: near the limit a timing
    worker would run out of memory). Chosen by their
    batch size, not by how their one noisy probe came out: a probe timed at half its speed in a busy
    moment looks twice as bad, and still gets its second look."""
    candidates, near, least = _contest(probes, safe, estimate)
    nearest = sorted((b for b in near if timeable(candidates[b])), key=lambda b: (abs(math.log(b / least)), b))
    return sorted(nearest[:CONTESTED_MOST])


def _contest(probes: list[ProbeRecord], safe: int, estimate: NoiseEstimate | None) -> tuple[dict, set, int]:
    """(the candidates, those whose worst case over B_noise's interval is within CONTESTED times
    the least, the least's size): what `contested` and `between` choose from; no sizes when fewer
    than two candidates passed."""
    candidates = passed(probes, safe)
    if len(candidates) < 2:
        return candidates, set(), 0
    worst = decide({b: b / p.images_per_second for b, p in candidates.items()}, interval(estimate))["worst_case"]
    least = min(worst, key=lambda b: (worst[b], b))
    return candidates, {b for b, w in worst.items() if w <= CONTESTED * worst[least]}, least


def between(probes: list[ProbeRecord], safe: int, estimate: NoiseEstimate | None, *,
            timeable: Callable[[ProbeRecord], bool]) -> list[int]:
    """The sizes the decision interpolates over near its choice: in each gap wider than a factor
    of 2 between two neighbouring candidates, one of them within CONTESTED times the least worst
    case, the sizes that halve it (doubling from the smaller, on the margin's grid: `round_batch`),
    the BETWEEN_MOST nearest the least's size on a log scale. The search doubles from --start, so
    between the calibration's 1 and the start's 8 the decision had two points, and the best size
    can lie in the gap: on JAX's CPU the critical plan measured 4 the fastest to the target, and a
    find-batch-size that never probed it recommended 8, 1.38 times the best. Run in the retime's
    worker, first timed there ("between"), then decided with the rest; so only below a size that
    worker can time beside the others (`timeable`: the prober's rule, ProbeRun.can_retime)."""
    candidates, near, least = _contest(probes, safe, estimate)
    sizes = sorted(candidates) if near else []
    probed = {p.batch_size for p in probes}
    gaps = set()
    for a, c in zip(sizes, sizes[1:], strict=False):  # below a size with room: the retime's worker keeps every step
        if c > 2 * a and (a in near or c in near) and timeable(candidates[c]):
            gaps |= {n for k in range(1, math.ceil(math.log2(c / a))) if a < (n := round_batch(a * 2**k)) < c}
    nearest = sorted(gaps - probed, key=lambda b: (abs(math.log(b / least)), b))
    return sorted(nearest[:BETWEEN_MOST])


def round_batch(value: float) -> int:
    """A batch size at or below `value`, as the margin's is rounded: a multiple of 8, or a power
    of two below 8; at least 1."""
    whole = max(1, math.floor(value + 1e-9))
    return whole // 8 * 8 if whole >= 8 else 2 ** int(math.log2(whole))


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


def spread_at(batch: float, spread: dict[int, float]) -> float:
    """The step-time spread at `batch`: a probed size's own, else the larger of the probed sizes'
    around it (what `step_seconds_at` interpolates between: as unsure as its less sure end); 0
    outside them or with none measured."""
    if batch in spread:
        return spread[int(batch)]
    below = [b for b in spread if b < batch]
    above = [b for b in spread if b > batch]
    return max(spread[max(below)], spread[min(above)]) if below and above else 0.0


def relative_times(step_seconds: dict[int, float], b_noise: float | None) -> dict[int, float]:
    """T(B) / min T over the sizes: (1 + B_noise/B) t_step(B), or speed's t_step/B when B_noise is
    None (unbounded: the limit B_noise -> infinity)."""
    raw = {b: (t / b if b_noise is None else (1 + b_noise / b) * t) for b, t in step_seconds.items()}
    best = min(raw.values())
    return {b: v / best for b, v in raw.items()}


def interval(estimate: NoiseEstimate | None) -> tuple[float, float] | None:
    """B_noise's interval as the decision reads it, (low, high) with high math.inf when open above
    (a lower bound alone included); None when there is not even a lower end."""
    if not estimate or estimate.low is None:
        return None
    return float(estimate.low), math.inf if estimate.high is None else float(estimate.high)


def resolved(estimate: NoiseEstimate | None) -> bool:
    """A noise scale bounded on both sides: a number, with an interval bounded above."""
    return bool(estimate and estimate.b_simple is not None and estimate.low is not None and estimate.high is not None)


def statistics_of(estimate: NoiseEstimate | None) -> str:
    """"resolved" (bounded), "open above" (a lower end only), or "unresolved" (none)."""
    return "resolved" if resolved(estimate) else "open above" if interval(estimate) else "unresolved"


def regret(step_seconds: dict[int, float], b_noise: float) -> dict[int, float]:
    """T(B; b) / min over B' of T(B'; b) at B_noise = b (math.inf: speed's limit)."""
    return relative_times(step_seconds, None if math.isinf(b_noise) else b_noise)


def worst_cases(step_seconds: dict[int, float], low: float, high: float) -> dict[int, float]:
    """Each size's worst regret over B_noise in [low, high] (high math.inf: open above), exact: at
    the ends and at every crossing of two sizes' T(B; b) lines inside (the module says why)."""
    points = {max(0.0, low), high}
    sizes = list(step_seconds)
    for n, a in enumerate(sizes):  # T(B; b) = t + b t/B: two lines cross where their slopes part
        for c in sizes[n + 1:]:
            ta, tc = step_seconds[a], step_seconds[c]
            slope = ta / a - tc / c
            if slope:
                b = (tc - ta) / slope
                if low < b < high:
                    points.add(b)
    worst = {b: 1.0 for b in sizes}
    for b_noise in points:
        for b, r in regret(step_seconds, b_noise).items():
            worst[b] = max(worst[b], r)
    return worst


def step_spread(probe: ProbeRecord) -> float:
    """A probe's relative step-time spread: half its timed steps' interquartile range over their
    median (0 with fewer than 4 steps timed, or none kept, as in a JSON read back)."""
    times = sorted(probe.step_times_s or [])
    if len(times) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / 2 / statistics.median(times)


def decide(step_seconds: dict[int, float], span: tuple[float, float] | None,
           spread: dict[int, float] | None = None) -> dict:
    """The choice among `step_seconds`'s sizes: {"batch_size", "worst_case": {size: worst regret over
    `span`}, "least": the least worst case, "near_best": the sizes tied with it (within TIE plus
    the two probes' `spread`), "by": "worst case" or "speed"}. The near-best set's middle on a
    log scale (`log_middle`) is chosen. With no `span` (unresolved), speed's: the fastest per image, its
    ties within TIE, and the regrets at RISK_AT."""
    spread = spread or {}
    if span is None:
        worst = regret(step_seconds, math.inf)
        risk = regret(step_seconds, RISK_AT)
    else:
        worst, risk = worst_cases(step_seconds, *span), None
    least_size = min(worst, key=lambda b: (worst[b], b))
    least = worst[least_size]
    near = sorted(b for b, w in worst.items()
                  if w <= least * (1 + TIE + spread.get(b, 0.0) + spread.get(least_size, 0.0)))
    return {"batch_size": log_middle(near), "worst_case": worst, "least": least, "near_best": near,
            "by": "speed" if span is None else "worst case", "risk": risk}


def log_middle(sizes: list[int]) -> int:
    """The size nearest the geometric mean of the smallest and the largest (the smaller of two as
    near): the middle of a set of batch sizes on a log scale, where their times and steps move,
    which probes added at one end (where the search bisects) do not shift as they shift a count."""
    centre = (math.log(min(sizes)) + math.log(max(sizes))) / 2
    return min(sizes, key=lambda b: (round(abs(math.log(b) - centre), 9), b))  # (rounded: two as near tie)


def choose(probes: list[ProbeRecord], safe: int, estimate: NoiseEstimate | None) -> dict | None:
    """The batch size that reaches a target soonest whatever B_noise is within its interval, among
    the candidates (the module says which), with the table it was chosen from: {"batch_size",
    "binding", "statistics": "resolved", "open above" or "unresolved", "b_noise" (the estimate, or
    None), "interval": [low, high or None], "table": [{batch_size, images_per_second,
    step_seconds, step_spread, relative_steps, relative_time, worst_case}], "near_best": [...],
    "worst_case", "fastest_worst_case", "risk"}; None when no size passed."""
    candidates = passed(probes, safe)
    if not candidates:
        return None
    step_seconds = {b: b / p.images_per_second for b, p in candidates.items()}
    spread = spreads(probes, safe)
    span = interval(estimate)
    b_noise = estimate.b_simple if span else None
    decision = decide(step_seconds, span, spread)
    best = decision["batch_size"]
    times = relative_times(step_seconds, b_noise)  # at the estimate itself (speed's without one)
    per_image = relative_times(step_seconds, None)
    speed = min(per_image, key=lambda b: (per_image[b], b))  # the fastest per image
    # what decides: the memory limit, the fastest per image, or else the steps (statistics), which
    # moved the answer off the fastest per image, below it (a larger batch saves too few steps) or
    # above it (a larger batch saves enough steps to be worth its slower images)
    binding = "memory" if best == max(candidates) else "speed" if best == speed else "statistics"
    worst = decision["worst_case"]
    risk = decision["risk"]
    return {"batch_size": best, "images_per_second": candidates[best].images_per_second, "binding": binding,
            "fastest_per_image": speed, "statistics": statistics_of(estimate), "b_noise": b_noise,
            "interval": [span[0], None if math.isinf(span[1]) else span[1]] if span else None,
            "criterion": decision["by"],
            "table": [{"batch_size": b, "images_per_second": candidates[b].images_per_second,
                       "step_seconds": step_seconds[b], "step_spread": round(spread[b], 4),
                       "relative_steps": 1 + b_noise / b if b_noise else 1.0,
                       "relative_time": times[b], "worst_case": worst[b]} for b in sorted(candidates)],
            "worst_case": worst[best], "fastest_worst_case": worst[speed],
            "least_worst_case": decision["least"],
            "risk": {"b_noise": RISK_AT, "relative_time": risk[best]} if risk else None,
            "near_best": decision["near_best"]}
