"""The gradient noise scale: the batch size beyond which a larger batch buys few steps.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018). At the
current weights, let g_i be the gradient of the loss on training example i (the very model and
loss a trial trains: catsdogs.training.model, binary cross-entropy from the logit), over the n training
images. The **true gradient** is G = (1/n) sum g_i and the per-example **covariance** is
Sigma = (1/n) sum (g_i - G)(g_i - G)^T (normalized by n: the training set is the population).
A batch of B examples drawn uniformly **with replacement** has mean gradient G_B with

    E |G_B|^2 = |G|^2 + tr(Sigma) / B        exactly, for any B,

and the simple noise scale B_simple = tr(Sigma) / |G|^2 is the batch size at which the noise's
share of |G_B|^2 equals the signal's. The paper finds it tracks the critical batch size: below
it, doubling the batch nearly halves the steps to a target loss; above it, a larger batch buys
little. catsdogs samples with replacement, so the identity above needs no correction (without
replacement from n examples, tr(Sigma)/B shrinks by (n - B)/(n - 1), which biases |G|^2 low
by about tr(Sigma)/(n - 1)).

**The estimator** (the paper's appendix A.1). A **pair** is one large batch of B_b = k * B_s
examples, drawn with replacement and split into k micro-batches of B_s: |G_Bs|^2 is the mean
of the micro-batches' squared gradient norms, |G_Bb|^2 the squared norm of their mean (the
large batch's gradient), both at the same weights. Both come from the large batch's per-example
gradient Gram matrix K (catsdogs.runtime.backends.per_example: one forward and backward pass, no
gradient formed): |G_S|^2 = (1/|S|^2) sum_{i,j in S} K_ij (`norms_from_gram`). So B_s can be 1,
each example its own micro-batch, which puts the most of a pair's examples to use. Each pair
gives unbiased estimates

    |G|^2    ~ (B_b |G_Bb|^2 - B_s |G_Bs|^2) / (B_b - B_s)
    tr(Sigma) ~ (|G_Bs|^2 - |G_Bb|^2) / (1/B_s - 1/B_b),

and B_simple is the ratio of their means over the pairs (not the mean of the pairs' ratios,
which is biased, and undefined whenever one pair's |G|^2 estimate is not positive). A trial's
measurement has few pairs, to stay cheap; a report pools the pairs of a cell's seeds at the same
epoch into one estimate (`pool`): the same ratio of means, over several times the pairs.

**The interval**: Fieller's 95% interval for a ratio of two means of paired samples, with
Student's t on (pairs - 1) degrees of freedom. Not a bootstrap: over 8 to 64 pairs its
percentile interval is too narrow (catsdogs.stats says the same of seeds). Not the delta
method: it is symmetric, while the ratio's distribution is skewed, and it cannot say that a
denominator may be zero. Fieller's interval is exact for normal means and takes the shape the
data give: bounded when |G|^2 is clearly positive; unbounded above (B_simple "at least N") when
|G|^2 is not clearly positive, which is what a batch size well below the noise scale sees.
It is computed for phi = |G|^2 / tr(Sigma), whose denominator (the noise) is always well
determined, and inverted. When the |G|^2 estimate itself is not positive, the noise dominates:
there is no number, only a lower bound, "above N" with N = 1/phi_high, the smallest noise
scale the pairs do not rule out (the large batch size B_b if even phi_high is not positive).
Never a negative or infinite value.

**The paper's model** of what a batch size costs: S = S_min (1 + B_noise/B) steps and E =
E_min (1 + B/B_noise) examples to a target loss. A fixed number of epochs (E fixed) reaches
the target only for B <= B_noise (E/E_min - 1) (`fixed_epochs_limit`); the learning rate that
is best at batch B is eps_max / (1 + B_noise/B) (`paper_learning_rate`), linear in B only well
below B_noise.

**One estimate, one type**: `NoiseEstimate` carries an estimate from the estimator to the trial's
record and its store columns (`to_record` / `from_record`: the `noise_scale*` names, which stay
as 0.9.0 wrote them), the report and find-batch-size. Its words: `NoiseSampling` is how a
measurement samples (the plan key `noise_scale` and `--noise-scale` ask for one); `measure_noise`
is the yes or no of measuring at all; `noise_scale` is only ever the stored number.

Framework-free: the backends compute the Gram matrices (`per_example_gram`), the engine draws
the batches (`draw`) and records the estimates, the report and find-batch-size read them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from catsdogs import config
from catsdogs.errors import SettingError
from catsdogs.stats import LEVEL, t_quantile

STREAM = 0x6E6F6973  # "nois": the noise batches' own random stream, apart from training's


@dataclass(frozen=True)
class NoiseSampling:
    """How one measurement samples: `pairs` large batches of `micros` x `micro` examples (by
    default a sweep's, catsdogs.config)."""

    micro: int = config.NOISE_MICRO  # B_s: examples per micro-batch (1: each example on its own)
    micros: int = config.NOISE_MICROS  # k: micro-batches per large batch, so B_b = k * B_s
    pairs: int = config.NOISE_PAIRS  # large batches (pairs) per measurement
    # The first epoch measured after (0: before the first update too, as a sweep measures).
    # find-batch-size starts past the first epoch's transient, so it spends nothing measuring
    # what it would discard.
    from_epoch: int = 0

    @property
    def large(self) -> int:
        return self.micro * self.micros

    @property
    def examples(self) -> int:
        return self.large * self.pairs

    def check(self) -> None:
        if self.micro < 1:
            raise SettingError(f"micro-batches need at least 1 example, got {self.micro}", "noise_micro")
        if self.micros < 2:
            raise SettingError(f"a large batch needs at least 2 micro-batches, got {self.micros}", "noise_micros")
        if self.pairs < 2:
            raise SettingError(f"an interval needs at least 2 pairs, got {self.pairs}", "noise_pairs")
        if self.from_epoch < 0:
            raise SettingError(f"the first epoch measured cannot be negative, got {self.from_epoch}", "noise_from")

    def measures(self, epoch: int) -> bool:
        """Whether a trial measures after `epoch` epochs (0: before its first update)."""
        return epoch >= self.from_epoch

    def as_dict(self) -> dict:
        """Its fields; `from_epoch` only where it is not 0, so a sweep's record of its sampling
        reads as it did before find-batch-size could start later."""
        out = asdict(self)
        if not self.from_epoch:
            del out["from_epoch"]
        return out


# The names a measurement has in a trial's record (each history row, and the trial's own columns
# for the last one), as catsdogs 0.8.0 first stored them: `NoiseEstimate.to_record` writes them.
RECORD_NAMES = {"b_simple": "noise_scale", "low": "noise_scale_low", "high": "noise_scale_high",
                "gradient_sq": "noise_gradient_sq", "trace": "noise_trace", "seconds": "noise_seconds",
                "pair_gradient_sq": "noise_pair_gradient_sq", "pair_trace": "noise_pair_trace"}
# What a record keeps of a whole estimate (the trial's `initial_noise`, find-batch-size's JSON).
STORED = ("epoch", "b_simple", "low", "high", "gradient_sq", "trace", "pairs", "pair_gradient_sq",
          "pair_trace", "small", "large", "seconds")


@dataclass(frozen=True)
class NoiseEstimate:
    """B_simple from the pairs of one measurement (or of several, pooled).

    `b_simple` is the ratio of means, or None when the |G|^2 estimate is not positive: then `low`,
    if set, is a lower bound ("above low"), and with `low` None too the estimate is undetermined
    (neither the gradient nor the noise clearly positive). `low` and `high` are Fieller's interval
    (`high` None: unbounded above)."""

    b_simple: float | None
    low: float | None
    high: float | None
    gradient_sq: float | None  # the mean of the pairs' |G|^2 estimates
    trace: float | None  # the mean of the pairs' tr(Sigma) estimates
    pairs: int
    small: int | None = None  # B_s, the micro-batch's examples (None: pooled over different ones)
    large: int | None = None  # B_b, the large batch's examples
    pair_gradient_sq: tuple | None = None  # each pair's |G|^2 estimate (what `pool` reads)
    pair_trace: tuple | None = None  # each pair's tr(Sigma) estimate
    epoch: int | None = None  # when it was measured: after this many epochs (0: before the first update)
    seconds: float | None = None  # what measuring it took
    measurements: int = 1  # how many measurements were pooled into it

    @property
    def images(self) -> int | None:
        """The images whose gradients it used (each pair's large batch)."""
        return self.pairs * self.large if self.large else None

    @property
    def is_bound(self) -> bool:
        """Only a lower bound: the noise dominated."""
        return self.b_simple is None and self.low is not None

    @property
    def value(self) -> float | None:
        """The number a decision may use: the estimate, or where the noise dominated its lower bound."""
        return self.low if self.b_simple is None else self.b_simple

    def describe(self) -> str:
        """"84 (95%: 51 to 240)", "84 (95%: 51 to unbounded)", "above 310", or "undetermined"."""
        if self.b_simple is None and self.low is None:
            return "undetermined"
        if self.b_simple is None:
            return f"above {self.low:.0f}"
        high = "unbounded" if self.high is None else f"{self.high:.0f}"
        return f"{self.b_simple:.0f} ({LEVEL:.0%}: {self.low:.0f} to {high})"

    def to_record(self) -> dict:
        """The estimate as a trial record's history row holds it (RECORD_NAMES)."""
        out = {name: getattr(self, key) for key, name in RECORD_NAMES.items()}
        for name in ("noise_pair_gradient_sq", "noise_pair_trace"):
            out[name] = None if out[name] is None else list(out[name])
        return out

    @classmethod
    def from_record(cls, row: dict, start: NoiseEstimate | None = None) -> NoiseEstimate | None:
        """A history row's estimate (None when the row has none); the sampling it does not hold
        (B_s, B_b) from `start`, the trial's measurement before its first update."""
        if RECORD_NAMES["pair_trace"] not in row:
            return None
        values = {key: row.get(name) for key, name in RECORD_NAMES.items()}
        pairs = values["pair_trace"] or ()
        return cls(**{**values, "pair_gradient_sq": _tuple(values["pair_gradient_sq"]),
                      "pair_trace": _tuple(values["pair_trace"])},
                   pairs=len(pairs), epoch=_int(row.get("epoch")),
                   small=start.small if start else None, large=start.large if start else None)

    def as_dict(self) -> dict:
        """The whole estimate, as a record keeps it (STORED: a trial's `initial_noise`)."""
        out = {key: getattr(self, key) for key in STORED}
        for key in ("pair_gradient_sq", "pair_trace"):
            out[key] = None if out[key] is None else list(out[key])
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> NoiseEstimate | None:
        """`as_dict`'s dict back (one that a record of catsdogs 0.8.0 or later holds); None for none."""
        if not d:
            return None
        return cls(**{key: d.get(key) for key in STORED if key not in ("pairs", "pair_gradient_sq", "pair_trace")},
                   pairs=int(d.get("pairs") or len(d.get("pair_trace") or ())),
                   pair_gradient_sq=_tuple(d.get("pair_gradient_sq")), pair_trace=_tuple(d.get("pair_trace")))


def _tuple(values) -> tuple | None:
    return None if values is None else tuple(float(v) for v in values)


def _int(value) -> int | None:
    return None if value is None else int(value)


def describe(estimate: NoiseEstimate | None) -> str:
    """`NoiseEstimate.describe`, or "not measured"."""
    return estimate.describe() if estimate else "not measured"


def draw(n_train: int, sampling: NoiseSampling, seed: int, epoch: int) -> np.ndarray:
    """(pairs, micros, micro) indices into the training split, uniformly with replacement, from
    the noise's own generator (seed, epoch, STREAM): nothing training draws from is touched."""
    rng = np.random.default_rng([seed, epoch, STREAM])
    return rng.integers(0, n_train, size=(sampling.pairs, sampling.micros, sampling.micro))


def norms_from_gram(gram, micro: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's (|G_Bs|^2, |G_Bb|^2) from its large batch's per-example gradient Gram matrix
    (pairs, B_b, B_b): the mean over its micro-batches (consecutive blocks of `micro` examples)
    of their mean gradient's squared norm, and the whole batch's."""
    gram = np.asarray(gram, np.float64)
    pairs, large, _ = gram.shape
    k = large // micro
    blocks = gram.reshape(pairs, k, micro, k, micro)
    small_sq = np.einsum("pjajb->pj", blocks).mean(axis=1) / micro**2
    large_sq = gram.sum(axis=(1, 2)) / large**2
    return small_sq, large_sq


def pair_estimates(small_sq, large_sq, b_small: int, b_large: int) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's unbiased estimates (|G|^2, tr(Sigma)) from its squared norms at B_s and B_b."""
    small_sq, large_sq = np.asarray(small_sq, np.float64), np.asarray(large_sq, np.float64)
    if not b_large > b_small >= 1:
        raise ValueError(f"need B_b > B_s >= 1, got B_s={b_small}, B_b={b_large}")
    g2 = (b_large * large_sq - b_small * small_sq) / (b_large - b_small)
    trace = (small_sq - large_sq) / (1.0 / b_small - 1.0 / b_large)
    return g2, trace


def fieller(num, den, level: float = LEVEL) -> tuple[float, float] | None:
    """Fieller's interval for mean(num)/mean(den) over paired samples, or None when mean(den) is
    not clearly nonzero (the interval is then unbounded)."""
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    p = len(num)
    a, b = float(num.mean()), float(den.mean())
    v_aa, v_bb = float(num.var(ddof=1)) / p, float(den.var(ddof=1)) / p
    v_ab = float(np.cov(num, den, ddof=1)[0, 1]) / p
    t2 = t_quantile((1 + level) / 2, p - 1) ** 2
    qa = b * b - t2 * v_bb
    if qa <= 0:
        return None
    qb = a * b - t2 * v_ab
    qc = a * a - t2 * v_aa
    root = math.sqrt(max(0.0, qb * qb - qa * qc))
    return (qb - root) / qa, (qb + root) / qa


def estimate(small_sq, large_sq, b_small: int, b_large: int, level: float = LEVEL, *,
             epoch: int | None = None, seconds: float | None = None) -> NoiseEstimate:
    """B_simple over the pairs of one measurement, with its interval (`from_pairs`)."""
    g2, trace = pair_estimates(small_sq, large_sq, b_small, b_large)
    return from_pairs(g2, trace, b_large, level, small=int(b_small), large=int(b_large), epoch=epoch,
                      seconds=seconds)


def pool(measurements: list[NoiseEstimate | None], level: float = LEVEL, epoch: int | None = None) -> NoiseEstimate | None:
    """One estimate from the pairs of several measurements (a cell's seeds at one epoch): the
    ratio of means over all their pairs, with Fieller's interval, and how many it pooled. None
    when none has pairs."""
    usable = [m for m in measurements if m and m.pair_gradient_sq]
    if not usable:
        return None
    g2 = [v for m in usable for v in m.pair_gradient_sq]
    trace = [v for m in usable for v in m.pair_trace]
    floor = max(m.large or 2 for m in usable)
    smalls, larges = {m.small for m in usable}, {m.large for m in usable}
    pooled = from_pairs(g2, trace, floor, level, keep_pairs=False, epoch=epoch,
                        small=smalls.pop() if len(smalls) == 1 else None,
                        large=larges.pop() if len(larges) == 1 else None)
    return NoiseEstimate(**{**asdict(pooled), "measurements": len(usable)})


def pool_by_seed(by_seed: dict, level: float = LEVEL, epoch: int | None = None) -> NoiseEstimate | None:
    """One estimate from measurements grouped by seed ({seed: [NoiseEstimate, ...]}), each seed
    one cluster: the ratio of the seeds' mean |G|^2 and tr(Sigma) estimates over all their pairs,
    with Fieller's interval over the seeds (seeds - 1 degrees of freedom). Pairs of one seed are
    not independent draws of what the claim is about (they share the seed's weights and its
    trajectory), so they are not counted as if they were. Its `pairs` counts the seeds (the units
    its interval is over), `measurements` the measurements pooled. None with fewer than two seeds."""
    clusters = {seed: [m for m in ms if m and m.pair_gradient_sq] for seed, ms in by_seed.items()}
    clusters = {seed: ms for seed, ms in clusters.items() if ms}
    if len(clusters) < 2:
        return None
    g2 = [float(np.mean([v for m in ms for v in m.pair_gradient_sq])) for ms in clusters.values()]
    trace = [float(np.mean([v for m in ms for v in m.pair_trace])) for ms in clusters.values()]
    every = [m for ms in clusters.values() for m in ms]
    floor = max(m.large or 2 for m in every)
    smalls, larges = {m.small for m in every}, {m.large for m in every}
    pooled = from_pairs(g2, trace, floor, level, keep_pairs=False, epoch=epoch,
                        small=smalls.pop() if len(smalls) == 1 else None,
                        large=larges.pop() if len(larges) == 1 else None)
    return NoiseEstimate(**{**asdict(pooled), "measurements": sum(len(ms) for ms in clusters.values())})


def pool_seeds(by_seed: dict, level: float = LEVEL) -> NoiseEstimate | None:
    """find-batch-size's estimate from a few seeds' measurements ({seed: [NoiseEstimate, ...]}),
    each seed one cluster **weighted alike**: each seed's own B_simple (the ratio of means over its
    pairs, `pool`), and their geometric mean, with Student's interval on the logarithms over the
    seeds (seeds - 1 degrees of freedom).

    Why not `pool_by_seed`'s ratio of the seeds' mean |G|^2 and tr(Sigma): between seeds tr(Sigma)
    differs up to 100-fold (docs/results.md), so one seed's scale decides that ratio and its
    interval, and with four seeds the mean tr(Sigma) was often not clearly positive (an interval
    from 0 to unbounded). Seeds' B_simple scatter log-normally (log sd 0.91 at batch 32, epochs
    2-3), so the geometric mean and a t interval on the logs cover the seeds' median as they
    should (tests/shared/test_gradient_noise.py simulates it). A seed whose B_simple is only a lower bound
    (its |G|^2 not clearly positive) enters at its bound and leaves the interval open above: the
    truth may lie anywhere higher. A seed undetermined (neither clearly positive) is left out.
    `pairs` counts the seeds used, `measurements` the measurements. None with fewer than two."""
    seeds = {seed: pool(ms) for seed, ms in by_seed.items()}
    values = {seed: e for seed, e in seeds.items() if e is not None and e.value}
    if len(values) < 2:
        return None
    logs = np.log([e.value for e in values.values()])
    k = len(logs)
    centre, half = float(logs.mean()), t_quantile((1 + level) / 2, k - 1) * float(logs.std(ddof=1)) / math.sqrt(k)
    censored = any(e.is_bound for e in values.values())
    every = [m for ms in by_seed.values() for m in ms if m]
    smalls, larges = {m.small for m in every}, {m.large for m in every}
    return NoiseEstimate(math.exp(centre), math.exp(centre - half), None if censored else math.exp(centre + half),
                         float(np.mean([e.gradient_sq for e in values.values()])),
                         float(np.mean([e.trace for e in values.values()])), k,
                         small=smalls.pop() if len(smalls) == 1 else None,
                         large=larges.pop() if len(larges) == 1 else None,
                         measurements=sum(e.measurements for e in values.values()))


def from_pairs(g2, trace, floor: float, level: float = LEVEL, keep_pairs: bool = True, **about) -> NoiseEstimate:
    """B_simple from the pairs' estimates of |G|^2 and tr(Sigma). `floor`: the lower bound to
    report when even the interval's top for |G|^2 / tr(Sigma) is not positive (the large batch
    size: the measurement's own large batches still looked like pure noise). With `keep_pairs`
    the estimate keeps the pairs' own estimates (what `pool` reads); `about`: the rest of its
    fields (small, large, epoch, seconds)."""
    g2, trace = np.asarray(g2, np.float64), np.asarray(trace, np.float64)
    if len(g2) < 2:
        raise ValueError(f"an interval needs at least 2 pairs, got {len(g2)}")
    mean_g2, mean_trace = float(g2.mean()), float(trace.mean())
    b_simple, low, high = _ratio(g2, trace, mean_g2, mean_trace, floor, level)
    pairs = {"pair_gradient_sq": tuple(g2.tolist()), "pair_trace": tuple(trace.tolist())} if keep_pairs else {}
    return NoiseEstimate(b_simple, low, high, mean_g2, mean_trace, len(g2), **pairs, **about)


def _ratio(g2, trace, mean_g2: float, mean_trace: float, floor: float, level: float) -> tuple:
    """(b_simple, low, high) as `NoiseEstimate` reads them, from Fieller's intervals."""
    positive = mean_g2 > 0 and mean_trace > 0
    phi = fieller(g2, trace, level)  # |G|^2 / tr(Sigma) = 1 / B_simple
    if phi is None:  # the noise itself is not clearly positive: B_simple is small, if anything
        if not positive:
            return None, None, None  # neither clearly positive: undetermined
        rho = fieller(trace, g2, level)  # B_simple directly, when |G|^2 is clearly nonzero
        low, high = (max(0.0, rho[0]), rho[1]) if rho is not None and rho[1] > 0 else (0.0, None)
        return mean_trace / mean_g2, low, high
    phi_low, phi_high = phi
    if positive:
        b_simple = mean_trace / mean_g2
        return b_simple, 1.0 / phi_high if phi_high > 0 else b_simple, 1.0 / phi_low if phi_low > 0 else None
    if phi_high > 0:  # the noise dominates: a lower bound only
        return None, 1.0 / phi_high, None
    return None, float(floor), None


# --- the paper's model -----------------------------------------------------------------------------


def fixed_epochs_limit(b_noise: float, budget_over_minimum: float) -> float:
    """The largest batch size that reaches the target loss within a fixed number of examples E:
    B_noise (E/E_min - 1), from E = E_min (1 + B/B_noise)."""
    return b_noise * (budget_over_minimum - 1.0)


def paper_learning_rate(base_lr: float, base_batch: int, batch: int, b_noise: float) -> float:
    """The learning rate at `batch` by the paper's rule eps(B) = eps_max / (1 + B_noise/B),
    anchored at `base_lr` for `base_batch`: linear in B well below B_noise, flat well above."""
    return base_lr * (1.0 + b_noise / base_batch) / (1.0 + b_noise / batch)
