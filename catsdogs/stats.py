"""The statistics of a report, in one place and free of any framework: intervals over seeds.

- `mean_ci`: a cell's mean test accuracy and its Student-t interval over the seeds;
- `welch`: the difference between two cells' means and its Welch interval (the claims);
- `wilson`: a proportion (the collapse rate of a cell) and its Wilson score interval.

Why these. Seeds are independent runs, so a cell's seeds are a sample and the t interval is
the textbook one. Two cells are compared with Welch's interval rather than a pooled-variance t
or a bootstrap: their spreads differ by up to two orders of magnitude (a cell where some seeds
collapse to 50% against one where none does), adaptive seeds give them different numbers of
seeds, and a bootstrap over 3-10 seeds cannot see beyond the values it has (its percentile
interval is too narrow at such n, and a point when the seeds agree). A rate of k collapses in n
runs is a binomial proportion; Wilson's interval stays inside 0..1 and is not empty at 0/n or
n/n, where the textbook p ± z·se interval is. Each interval is at its own 95%: no correction
for the several claims a report tests (each claim's verdict stands alone).

Seeds that agree exactly (two cells that both collapsed to 50%) have no spread, and Welch's
interval would be the difference itself, zero wide. But every accuracy is measured on a finite
test set, whose sampling noise no number of agreeing seeds removes: given `n_test`, each side's
per-seed standard deviation is taken at least at the binomial one, sqrt(p(1-p)/n_test), p its
mean kept within [0.1, 0.9] (`binomial_sd`, the same floor as catsdogs.seeds' stopping guard).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

LEVEL = 0.95  # confidence level of every interval


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` (whole) degrees of freedom, for p in (0.5, 1).

    Exact: the t distribution's CDF has a finite closed form for whole df (Abramowitz and
    Stegun 26.7.3-4), inverted by bisection. Past 10,000 df, the normal quantile."""
    if not 0.5 < p < 1:
        raise ValueError(f"p must be in (0.5, 1), got {p}")
    if df < 1 or int(df) != df:
        raise ValueError(f"df must be a whole number >= 1, got {df}")
    df = int(df)
    mass = 2 * p - 1  # P(|T| <= t)
    cdf = _normal_two_sided if df > 10_000 else (lambda t: _t_two_sided(t, df))
    lo, hi = 0.0, 1.0
    while cdf(hi) < mass:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if cdf(mid) < mass:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with whole df (A&S 26.7.3 for odd df, 26.7.4 for even)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 1:
        if df == 1:
            return 2 * theta / math.pi
        term = total = c
        for k in range(1, (df - 3) // 2 + 1):
            term *= (2 * k) / (2 * k + 1) * c2
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= (2 * k - 1) / (2 * k) * c2
        total += term
    return s * total


def _normal_two_sided(z: float) -> float:
    return math.erf(z / math.sqrt(2))


def mean_ci(values: Iterable[float], level: float = LEVEL) -> dict:
    """Mean, sample sd and the Student-t interval mean ± t_{(1+level)/2, n-1} · sd / √n.

    n = 0: everything None. n = 1: the mean only; one run gives no interval (and no sd)."""
    v = [float(x) for x in values]
    n = len(v)
    out = {"n": n, "mean": None, "sd": None, "t": None, "ci_low": None, "ci_high": None,
           "ci_half_width": None}
    if n == 0:
        return out
    out["mean"] = statistics.fmean(v)
    if n == 1:
        return out
    sd = statistics.stdev(v)
    t = t_quantile((1 + level) / 2, n - 1)
    half = t * sd / math.sqrt(n)
    out.update(sd=sd, t=t, ci_low=out["mean"] - half, ci_high=out["mean"] + half, ci_half_width=half)
    return out


def normal_quantile(p: float) -> float:
    """The p-quantile of the standard normal, for p in (0.5, 1)."""
    return t_quantile(p, 10**6)


P_RANGE = (0.1, 0.9)  # the accuracy a binomial floor is taken at is kept within this range


def binomial_sd(accuracy: float, n_test: int) -> float:
    """The binomial standard deviation of an accuracy measured on n_test images (a fraction),
    with the accuracy kept within P_RANGE (a cell at 0% or 100% still has noise left to find)."""
    p = min(max(accuracy, P_RANGE[0]), P_RANGE[1])
    return math.sqrt(p * (1 - p) / n_test)


def welch(a: Iterable[float], b: Iterable[float], level: float = LEVEL, n_test: int | None = None) -> dict:
    """mean(a) - mean(b), and Welch's interval for it: diff ± t·√(sa²/na + sb²/nb), with the
    Welch-Satterthwaite degrees of freedom rounded down (a wider, so safer, interval). With
    `n_test` (the test images each accuracy was measured on), each side's sd is at least the
    binomial one (`binomial_sd`): never an interval narrower than the test set's own noise.

    With fewer than 2 values on either side there is no interval (ci_low, ci_high None). Without
    `n_test`, when both sides have no spread, the interval is the difference itself."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    out = {"n_a": len(a), "n_b": len(b), "diff": None, "se": None, "df": None,
           "ci_low": None, "ci_high": None}
    if a and b:
        out["diff"] = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return out

    def variance_of_mean(x: list[float]) -> float:
        floor = binomial_sd(statistics.fmean(x), n_test) ** 2 if n_test else 0.0
        return max(statistics.variance(x), floor) / len(x)

    va, vb = variance_of_mean(a), variance_of_mean(b)
    se = math.sqrt(va + vb)
    if se == 0:
        out.update(se=0.0, ci_low=out["diff"], ci_high=out["diff"])
        return out
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    df = max(1, math.floor(df + 1e-9))
    half = t_quantile((1 + level) / 2, df) * se
    out.update(se=se, df=df, ci_low=out["diff"] - half, ci_high=out["diff"] + half)
    return out


def wilson(k: int, n: int, level: float = LEVEL) -> dict:
    """The proportion k/n and its Wilson score interval; everything None when n is 0."""
    if n == 0:
        return {"k": 0, "n": 0, "rate": None, "ci_low": None, "ci_high": None}
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    z = normal_quantile((1 + level) / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # at 0/n and n/n the bound is the rate itself; clamp away float residue
    return {"k": k, "n": n, "rate": p, "ci_low": 0.0 if k == 0 else max(0.0, centre - half),
            "ci_high": 1.0 if k == n else min(1.0, centre + half)}
