"""The critical batch size, measured: the paper's fit of steps to a target against batch size.

McCandlish et al. (2018) and Shallue et al. (2018) measure the critical batch size directly: train
at each batch size B (its learning rate tuned) until a fixed target, count the steps S(B) it took,
and fit

    S(B) = S_min (1 + B_crit / B),  that is  S = S_min + E_min / B,  E_min = S_min B_crit,

a straight line in x = 1/B with intercept S_min (the fewest steps, at an unbounded batch) and
slope E_min (the fewest examples, at batch size 1). B_crit = E_min / S_min is where the steps
saved and the examples spent trade evenly.

**The fit**: least squares on x = 1/B, weighted by 1/S(B)²: the spread of steps to a target over
seeds grows with the steps themselves (a seed's luck moves a 2,000-step run by hundreds of steps,
a 100-step run by tens), so every batch size counts by its relative error, not its absolute one;
the weights come from the fitted line, refitted until they settle (iteratively reweighted). Where
each size's seeds' spread is given (`log_sd`: the sd of their log steps; the `critical` plan
measured 0.38-1.12, widest at the smallest sizes), each also counts by the inverse square of that
relative error, read off a line through the sizes' log spreads against log B (`smooth_spread`):
3-5 seeds' own sd is too noisy a weight (in simulation with the plan's spreads it cut the median
error of B_crit from 0.50 to 0.44 in log but let coverage fall to 91.8%; the line's cut it to
0.47, 0.43 where the spread falls steadily with B, and kept 93-94%; with equal spreads it costs
0.30 to 0.31: tests/analysis/test_critical_fit.py).

**The interval**: Fieller's 95% interval for the ratio of the fit's two coefficients, with the
residual variance on n − 2 degrees of freedom. A ratio of two estimates whose denominator (S_min)
may be near zero: Fieller's interval takes the shape the data give (asymmetric; not bounded when
S_min is not clearly positive, said as such), where the delta method would be symmetric and blind
to it. Not a bootstrap over seeds: at the 3-5 seeds a plan affords, a bootstrap's percentile
interval is too narrow, and the fit's points are already each a median over seeds.
tests/analysis/test_critical_fit.py checks its coverage against a known answer (90-99% over 400 generated
studies at the `critical` plan's batch sizes and seeds).

Pure functions, no framework: what the report's section on steps to a target is built on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from catsdogs.stats import LEVEL, t_quantile

REWEIGHTS = 5  # iterations of the weights from the fitted line: 3 settle them to 1e-6 in practice


@dataclass(frozen=True)
class CriticalFit:
    """S = s_min + e_min / B fitted to `points` (batch size, steps to the target); b_crit =
    e_min / s_min with Fieller's interval [low, high] (both None: S_min is not clearly positive,
    and the interval is not bounded). b_crit is None when the fitted S_min is not positive: the
    steps still fall as fast as the batch grows, and B_crit lies above every batch size measured;
    and when the fitted E_min is not positive: the steps do not fall at all, B_crit lies below."""

    s_min: float
    e_min: float
    b_crit: float | None
    low: float | None
    high: float | None
    df: int
    points: tuple[tuple[int, float], ...]

    def describe(self) -> str:
        if self.e_min <= 0:
            return f"below {min(b for b, _ in self.points)} (the steps do not fall as the batch grows)"
        if self.b_crit is None:
            return f"above {max(b for b, _ in self.points)} (no saturation in the steps)"
        if self.low is None or self.high is None:
            return f"{self.b_crit:.0f} (interval unbounded: S_min not resolved)"
        return f"{self.b_crit:.0f} (95% interval {self.low:.0f}–{self.high:.0f})"


def fit_critical(batch_sizes, steps, log_sd=None, level: float = LEVEL) -> CriticalFit:
    """The paper's fit of steps to a target against batch size (the module's note says how).
    `batch_sizes` and `steps` pair up; at least 3 batch sizes, all distinct, steps positive;
    `log_sd`, paired with them too, each size's seeds' spread (None: all alike)."""
    batch_sizes, steps = list(batch_sizes), list(steps)
    points = tuple(sorted((int(b), float(s)) for b, s in zip(batch_sizes, steps, strict=True)))
    if len(points) < 3 or len({b for b, _ in points}) < len(points):
        raise ValueError(f"the fit needs 3 or more distinct batch sizes, got {[b for b, _ in points]}")
    if any(b <= 0 or not s > 0 or math.isinf(s) for b, s in points):
        raise ValueError(f"every batch size and its steps must be positive and finite, got {points}")
    spread = ({int(b): w for b, w in zip(batch_sizes, smooth_spread(batch_sizes, list(log_sd)), strict=True)}
              if log_sd is not None else {})
    x = [1.0 / b for b, _ in points]
    y = [s for _, s in points]
    fitted = y
    for _ in range(REWEIGHTS):
        a, b, cov = _weighted_line(x, y, [1.0 / (f * spread.get(p, 1.0)) ** 2 for f, (p, _) in zip(fitted, points, strict=True)])
        fitted = [a + b * xi for xi in x]
        if min(fitted) <= 0:  # a line through zero or below: the weights would blow up; keep these
            break
    df = len(points) - 2
    b_crit, low, high = _fieller(b, a, cov, df, level) if b > 0 else (None, None, None)  # no E_min: no B_crit
    return CriticalFit(a, b, b_crit, low, high, df, points)


def smooth_spread(batch_sizes, log_sd) -> list[float]:
    """Each size's spread read off the least-squares line of log(`log_sd`) against log B (a
    spread that is None or not positive left out of the line); all 1.0, the fit unweighted by
    spread, when fewer than 3 sizes have one."""
    known = [(math.log(b), math.log(s)) for b, s in zip(batch_sizes, log_sd, strict=True) if s and s > 0]
    if len(known) < 3 or len({x for x, _ in known}) < 2:
        return [1.0] * len(batch_sizes)
    mx = sum(x for x, _ in known) / len(known)
    my = sum(y for _, y in known) / len(known)
    slope = sum((x - mx) * (y - my) for x, y in known) / sum((x - mx) ** 2 for x, _ in known)
    return [math.exp(my + slope * (math.log(b) - mx)) for b in batch_sizes]


def _weighted_line(x: list[float], y: list[float], w: list[float]) -> tuple[float, float, tuple]:
    """Intercept, slope and their covariance (v_aa, v_bb, v_ab) of y = a + b x by weighted least
    squares, the residual variance estimated on n - 2 degrees of freedom."""
    sw = sum(w)
    swx = sum(wi * xi for wi, xi in zip(w, x, strict=True))
    swxx = sum(wi * xi * xi for wi, xi in zip(w, x, strict=True))
    swy = sum(wi * yi for wi, yi in zip(w, y, strict=True))
    swxy = sum(wi * xi * yi for wi, xi, yi in zip(w, x, y, strict=True))
    det = sw * swxx - swx * swx
    a = (swxx * swy - swx * swxy) / det
    b = (sw * swxy - swx * swy) / det
    residual = sum(wi * (yi - a - b * xi) ** 2 for wi, xi, yi in zip(w, x, y, strict=True))
    sigma2 = residual / (len(x) - 2)
    return a, b, (sigma2 * swxx / det, sigma2 * sw / det, -sigma2 * swx / det)


def _fieller(num: float, den: float, cov: tuple, df: int, level: float):
    """(num/den, low, high): Fieller's interval for the ratio of two estimates with covariance
    `cov` = (v_den, v_num, v_den_num), or None for an end it leaves unbounded."""
    v_den, v_num, v_cross = cov
    if den <= 0:
        return None, None, None
    t2 = t_quantile((1 + level) / 2, df) ** 2
    qa = den * den - t2 * v_den
    if qa <= 0:  # the denominator is not clearly nonzero: no bounded interval
        return num / den, None, None
    qb = num * den - t2 * v_cross
    qc = num * num - t2 * v_num
    root = math.sqrt(max(0.0, qb * qb - qa * qc))
    # a lower end below zero says the data do not rule out E_min <= 0: B_crit, a batch size, is at least 0
    return num / den, max(0.0, (qb - root) / qa), (qb + root) / qa
