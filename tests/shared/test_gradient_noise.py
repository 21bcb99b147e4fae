"""The gradient noise scale's estimator (catsdogs.gradient_noise): its arithmetic, a known answer, the
not-positive case, the interval, the estimate as a record holds it, and the paper's model. Pure
numpy: nothing trains."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from catsdogs import gradient_noise
from catsdogs import gradient_noise as noise
from catsdogs.gradient_noise import NoiseEstimate, NoiseSampling


def logistic_problem(n=2000, d=20, seed=0):
    """A logistic regression at weights off its optimum: per-example gradients (n, d) of the
    cross-entropy, and the exact |G|^2, tr(Sigma) (Sigma normalized by n) and B_simple."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w_true = rng.normal(size=d)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ w_true))).astype(float)
    w = w_true * 0.3  # not at the optimum: |G| > 0
    per_example = (1 / (1 + np.exp(-x @ w)) - y)[:, None] * x
    g = per_example.mean(axis=0)
    trace = ((per_example - g) ** 2).sum(axis=1).mean()
    return per_example, float(g @ g), float(trace)


def measure(per_example, settings: NoiseSampling, seed=0):
    """What the engine does, on exact per-example gradients: draw pairs with replacement, take
    each large batch's per-example gradient Gram matrix (what a backend returns), and give the
    estimator only the squared norms it yields."""
    idx = noise.draw(len(per_example), settings, seed=seed, epoch=0).reshape(settings.pairs, settings.large)
    g = per_example[idx]  # (pairs, B_b, d)
    small_sq, large_sq = noise.norms_from_gram(np.einsum("pid,pjd->pij", g, g), settings.micro)
    return noise.estimate(small_sq, large_sq, settings.micro, settings.large)


def test_norms_from_the_gram_matrix_are_the_micro_batches_and_the_large_batchs():
    # given per-example gradients of two large batches of 6, in micro-batches of 2
    rng = np.random.default_rng(0)
    g = rng.normal(size=(2, 6, 5))
    small_sq, large_sq = noise.norms_from_gram(np.einsum("pid,pjd->pij", g, g), micro=2)
    # then each is the squared norm of the mean gradient it names
    micro_means = g.reshape(2, 3, 2, 5).mean(axis=2)
    assert np.allclose(small_sq, (micro_means**2).sum(axis=2).mean(axis=1))
    assert np.allclose(large_sq, (g.mean(axis=1) ** 2).sum(axis=1))


def test_pair_estimates_recover_the_gradient_and_the_noise_from_exact_expectations():
    # given the expected squared norms |G|^2 + tr/B at two batch sizes
    g2, trace = 0.5, 40.0
    small, large = 4, 32
    # when each pair holds exactly those
    got_g2, got_trace = noise.pair_estimates([g2 + trace / small] * 3, [g2 + trace / large] * 3, small, large)
    # then both come back exactly
    assert np.allclose(got_g2, g2) and np.allclose(got_trace, trace)


def test_the_estimate_is_within_10_percent_of_a_logistic_regressions_exact_noise_scale():
    # given a logistic regression whose exact B_simple is known
    per_example, g2, trace = logistic_problem()
    exact = trace / g2
    # when catsdogs' estimator sees only the squared norms of sampled batches
    m = measure(per_example, NoiseSampling(micro=1, micros=16, pairs=400))
    # then B_simple is within 10% and the 95% interval holds the exact value
    assert exact > 10  # a problem where the noise matters
    assert abs(m.b_simple - exact) / exact < 0.10
    assert m.low <= exact <= m.high
    assert abs(m.trace - trace) / trace < 0.05


def test_the_interval_covers_the_exact_value_about_95_percent_of_the_time():
    # given the same problem measured with few pairs, 200 times
    per_example, g2, trace = logistic_problem()
    exact = trace / g2
    covered = 0
    for seed in range(200):
        m = measure(per_example, NoiseSampling(micro=1, micros=16, pairs=16), seed=seed)
        high = math.inf if m.high is None else m.high
        covered += m.b_simple is not None and m.low <= exact <= high or (
            m.b_simple is None and m.low <= exact)
    # then the coverage is near the nominal 95%
    assert 0.88 <= covered / 200 <= 0.995


def test_a_gradient_estimate_that_is_not_positive_gives_a_lower_bound_never_a_number():
    # given pairs whose large-batch norms say the mean gradient is zero or less (noise dominates)
    rng = np.random.default_rng(1)
    trace = 100.0
    small_sq = trace / 4 + rng.normal(0, 1.0, 10)
    large_sq = trace / 32 + rng.normal(0, 0.5, 10) - 0.2
    # when estimated
    m = noise.estimate(small_sq, large_sq, 4, 32)
    # then there is no number, and the bound is positive and finite
    assert m.gradient_sq <= 0
    assert m.b_simple is None
    assert 0 < m.low < math.inf and m.high is None
    assert noise.describe(m) == f"above {m.low:.0f}"


def test_a_gradient_clearly_below_zero_gives_the_large_batch_as_the_bound():
    # given pairs that all say |G|^2 < 0 (by chance: it cannot be): no positive 1/B_simple fits
    m = noise.from_pairs([-1.0, -1.1, -0.9, -1.05], [100.0, 101.0, 99.0, 100.5], floor=16)
    # then the bound is the large batch, whose gradient still looked like pure noise
    assert m.b_simple is None and m.low == 16.0 and m.high is None


def test_a_positive_but_unclear_gradient_gives_a_number_with_an_interval_unbounded_above():
    # given a mean gradient barely above zero against a noisy estimate of it
    rng = np.random.default_rng(2)
    small_sq = 25.0 + rng.normal(0, 1.0, 10)
    large_sq = 25.0 / 8 + 0.05 + rng.normal(0, 0.3, 10)
    m = noise.estimate(small_sq, large_sq, 4, 32)
    # then the number exists and the interval is open above
    assert m.gradient_sq > 0 and m.b_simple > 0
    assert m.high is None and 0 < m.low <= m.b_simple
    assert noise.describe(m).endswith("to unbounded)")


def test_fieller_with_no_spread_is_the_ratio_itself():
    low, high = noise.fieller([2.0, 2.0, 2.0], [4.0, 4.0, 4.0])
    assert low == pytest.approx(0.5) and high == pytest.approx(0.5)


def test_fieller_matches_its_closed_form_for_independent_samples():
    # given paired samples; when Fieller's interval is taken; then its bounds solve the quadratic
    num, den = np.array([1.0, 1.4, 0.8, 1.2, 1.1]), np.array([2.0, 2.2, 1.9, 2.5, 2.1])
    low, high = noise.fieller(num, den)
    t2 = noise.t_quantile(0.975, 4) ** 2
    p = len(num)
    for r in (low, high):
        lhs = (num.mean() - r * den.mean()) ** 2
        rhs = t2 * (num.var(ddof=1) - 2 * r * np.cov(num, den)[0, 1] + r * r * den.var(ddof=1)) / p
        assert lhs == pytest.approx(rhs, rel=1e-9)
    assert low < num.mean() / den.mean() < high


def test_draw_is_deterministic_for_a_seed_and_epoch_and_samples_with_replacement():
    s = NoiseSampling(micro=8, micros=4, pairs=50)
    a, b = noise.draw(100, s, seed=3, epoch=2), noise.draw(100, s, seed=3, epoch=2)
    assert a.shape == (50, 4, 8) and (a == b).all()
    assert not (a == noise.draw(100, s, seed=3, epoch=1)).all()
    assert any(len(set(batch.ravel())) < 32 for batch in a)  # repeats within a large batch
    assert a.min() >= 0 and a.max() < 100


@pytest.mark.parametrize("settings, key", [(NoiseSampling(0, 4, 8), "noise_micro"),
                                           (NoiseSampling(8, 1, 8), "noise_micros"),
                                           (NoiseSampling(8, 4, 1), "noise_pairs")])
def test_settings_that_cannot_estimate_are_refused_naming_the_setting(settings, key):
    from catsdogs.errors import SettingError

    with pytest.raises(SettingError) as e:
        settings.check()
    assert e.value.key == key


def test_pooling_seeds_is_the_ratio_of_means_over_all_their_pairs():
    # given the same problem measured by three seeds with few pairs each
    per_example, g2, trace = logistic_problem()
    settings = NoiseSampling(micro=1, micros=16, pairs=8)
    seeds = [measure(per_example, settings, seed=s) for s in range(3)]
    pooled = noise.pool([*seeds, None])  # a seed without the measurement counts for nothing
    # then it is one estimate over the 24 pairs, narrower than the typical seed's own
    everything = noise.from_pairs([v for m in seeds for v in m.pair_gradient_sq],
                                  [v for m in seeds for v in m.pair_trace], floor=16)
    assert pooled.pairs == 24 and pooled.measurements == 3
    assert pooled.b_simple == pytest.approx(everything.b_simple)
    assert pooled.b_simple == pytest.approx(sum(m.trace for m in seeds) / sum(m.gradient_sq for m in seeds))
    width = (pooled.high or math.inf) - pooled.low
    assert width < sorted((m.high or math.inf) - m.low for m in seeds)[1]
    assert noise.pool([None]) is None


def test_the_fixed_epochs_limit_and_the_papers_learning_rate():
    # E = 3 E_min: the target is reached up to B = 2 B_noise
    assert noise.fixed_epochs_limit(100.0, 3.0) == pytest.approx(200.0)
    # well below B_noise the paper's rule is linear, well above it is flat
    assert noise.paper_learning_rate(0.001, 32, 64, 1e9) == pytest.approx(0.002, rel=1e-6)
    flat = noise.paper_learning_rate(0.001, 32, 10**6, 64.0)
    assert flat == pytest.approx(0.001 * (1 + 64 / 32), rel=1e-3)


# --- the estimate as a trial's record holds it ---------------------------------------------------


def a_measurement() -> NoiseEstimate:
    per_example, _, _ = logistic_problem()
    return replace(measure(per_example, NoiseSampling(micro=1, micros=16, pairs=8)), epoch=2, seconds=0.25)


def test_an_estimate_is_written_under_the_stores_noise_scale_names_and_read_back_whole():
    # given an estimate from 8 pairs of 1 and 16 images, after epoch 2
    m = a_measurement()
    # when written as a history row and read back with the trial's first measurement beside it
    row = {"epoch": 2, "loss": 0.4, **m.to_record()}
    back = NoiseEstimate.from_record(row, start=m)
    # then the names are those catsdogs 0.8.0 stored, and nothing is lost
    assert set(m.to_record()) == {"noise_scale", "noise_scale_low", "noise_scale_high", "noise_gradient_sq",
                                  "noise_trace", "noise_seconds", "noise_pair_gradient_sq", "noise_pair_trace"}
    assert row["noise_scale"] == m.b_simple and row["noise_scale_low"] == m.low
    assert back == m and back.images == 8 * 16
    # and a row without the measurement has none
    assert NoiseEstimate.from_record({"epoch": 1, "loss": 0.4}) is None


def test_a_trials_first_measurement_keeps_the_dict_catsdogs_0_8_0_stored():
    # given the estimate a trial measured before its first update
    m = replace(a_measurement(), epoch=0)
    # then its dict has exactly 0.8.0's keys, and reads back as the same estimate
    stored = m.as_dict()
    assert set(stored) == {"epoch", "b_simple", "low", "high", "gradient_sq", "trace", "pairs", "pair_gradient_sq",
                           "pair_trace", "small", "large", "seconds"}
    assert NoiseEstimate.from_dict(stored) == m and NoiseEstimate.from_dict(None) is None
    # and a dict as 0.9.0 wrote it (the estimate's fields, then the epoch and the time) reads the same
    old = {"epoch": 0, "b_simple": m.b_simple, "low": m.low, "high": m.high, "gradient_sq": m.gradient_sq,
           "trace": m.trace, "pairs": 8, "pair_gradient_sq": list(m.pair_gradient_sq),
           "pair_trace": list(m.pair_trace), "small": 1, "large": 16, "seconds": 0.25}
    assert NoiseEstimate.from_dict(old) == m


def test_a_lower_bound_reads_as_one():
    bound = noise.from_pairs([-1.0, -1.1, -0.9, -1.05], [100.0, 101.0, 99.0, 100.5], floor=16)
    assert bound.is_bound and bound.value == 16.0 and bound.describe() == "above 16"
    assert noise.describe(None) == "not measured"


def seeds_like_the_articles(rng: np.random.Generator, seeds: int, median: float = 20.0) -> dict:
    """Measurements of `seeds` seeds as the article's model gives them at batch 32 after epoch 2:
    each seed's own B_simple log-normal around `median` (log sd 0.91, docs/results.md), its gradient
    scale differing from seed to seed (up to 100-fold), 16 pairs each with their sampling noise."""
    by_seed = {}
    for seed in range(seeds):
        b = median * math.exp(0.91 * rng.standard_normal())
        scale = math.exp(1.5 * rng.standard_normal())
        g2 = scale * (1 + 0.6 * rng.standard_normal(16))
        trace = scale * b * (1 + 0.3 * rng.standard_normal(16))
        by_seed[seed] = [gradient_noise.from_pairs(g2, trace, 25, small=1, large=25)]
    return by_seed


def test_four_seeds_weighted_alike_cover_the_seeds_median_as_their_level_says():
    # given 400 find-batch-size measurements of 4 seeds each, the seeds' B_simple scattered as measured
    rng = np.random.default_rng(0)
    covered = {"seeds": 0, "pairs": 0}
    for _ in range(400):
        by_seed = seeds_like_the_articles(rng, 4)
        clustered = gradient_noise.pool_seeds(by_seed)
        pairwise = gradient_noise.pool([m for ms in by_seed.values() for m in ms])
        covered["seeds"] += clustered.low <= 20.0 <= clustered.high
        covered["pairs"] += pairwise.low is not None and pairwise.low <= 20.0 <= (pairwise.high or math.inf)
    # then the interval over seeds covers the median about 95% of the time, where the pairs pooled as
    # if independent (0.16.0's find-batch-size) cover it about a third of the time
    assert 0.90 <= covered["seeds"] / 400 <= 0.99
    assert covered["pairs"] / 400 < 0.5


def test_a_seed_measured_only_as_a_bound_leaves_the_interval_open_above():
    by_seed = seeds_like_the_articles(np.random.default_rng(1), 4)
    # given one seed whose |G|^2 estimate is not positive: B_simple "above N" only
    by_seed[3] = [gradient_noise.from_pairs([-0.1, 0.1] * 8, [5.0, 6.0] * 8, 25, small=1, large=25)]
    bound = gradient_noise.pool(by_seed[3])
    assert bound.is_bound
    pooled = gradient_noise.pool_seeds(by_seed)
    # then it enters at its bound, the interval has a lower end and no upper one
    assert pooled.high is None and pooled.low < pooled.b_simple and pooled.pairs == 4
    values = [gradient_noise.pool(ms).value for ms in by_seed.values()]
    assert pooled.b_simple == pytest.approx(math.exp(np.mean(np.log(values))))
    # and one usable seed is not enough for an interval over seeds
    assert gradient_noise.pool_seeds({0: by_seed[0]}) is None
