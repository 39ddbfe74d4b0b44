"""The report's statistics against a reference: scipy for the exact tests, tables worked
out by hand for McNemar and pass@k, and coverage of the bootstrap interval on synthetic
data whose true mean is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from maka_eval.analysis.statistics import (
    binomial_test,
    bootstrap_mean,
    fisher_exact,
    mean_pass_at_k,
    paired_test,
    pass_at_k,
    resampled_means,
    spread,
)


@pytest.mark.parametrize(
    ("k", "n", "p"),
    [
        *[(0, 1, 0.5), (3, 10, 0.5), (5, 10, 0.5), (0, 7, 0.5), (12, 40, 0.5), (300, 700, 0.5)],
        *[(3, 10, 0.3), (7, 20, 0.2), (0, 50, 0.01), (49, 50, 0.9), (2000, 4100, 0.5)],
    ],
)
def test_binomial_test_matches_scipy(k, n, p):
    assert binomial_test(k, n, p) == pytest.approx(stats.binomtest(k, n, p).pvalue, rel=1e-9)


# McNemar's exact test on known tables: (b, c) are the discordant cells (first arm right
# and second wrong, and the reverse); the concordant cells do not enter the p-value.
# p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2), computed by hand.
KNOWN_MCNEMAR = [
    ((0, 5), 2 / 2**5),  # 0.0625
    ((1, 9), 2 * (1 + 10) / 2**10),  # 0.021484375
    ((0, 8), 2 / 2**8),  # 0.0078125
    ((4, 0), 2 / 2**4),  # 0.125
    ((3, 3), 1.0),
    ((2, 10), 2 * (1 + 12 + 66) / 2**12),  # 0.03857421875
]


@pytest.mark.parametrize(("discordant", "expected"), KNOWN_MCNEMAR)
def test_mcnemar_exact_on_known_tables(discordant, expected):
    b, c = discordant
    # Build paired 0/1 scores with these discordant counts and some concordant pairs.
    first = [1.0] * b + [0.0] * c + [1.0] * 7 + [0.0] * 4
    second = [0.0] * b + [1.0] * c + [1.0] * 7 + [0.0] * 4
    test = paired_test(first, second)
    assert test.name == "McNemar exact"
    assert (test.positive, test.negative, test.ties) == (b, c, 11)
    assert test.p_value == pytest.approx(expected, rel=1e-12)
    assert test.p_value == pytest.approx(stats.binomtest(b, b + c).pvalue if b + c else 1.0)


def test_mcnemar_on_a_large_table_matches_scipy():
    # The classic 2x2 example (Agresti): 794 / 86 / 150 / 570.
    first = [1.0] * 794 + [1.0] * 150 + [0.0] * 86 + [0.0] * 570
    second = [1.0] * 794 + [0.0] * 150 + [1.0] * 86 + [0.0] * 570
    test = paired_test(first, second)
    assert (test.positive, test.negative) == (150, 86)
    assert test.p_value == pytest.approx(stats.binomtest(150, 236).pvalue, rel=1e-9)
    assert test.p_value < 1e-4


def test_sign_test_on_graded_scores_matches_scipy():
    rng = np.random.default_rng(7)
    first = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=60).tolist()
    second = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=60).tolist()
    test = paired_test(first, second)
    assert test.name == "sign test"
    higher = sum(a > b for a, b in zip(first, second, strict=True))
    lower = sum(a < b for a, b in zip(first, second, strict=True))
    assert (test.positive, test.negative, test.ties) == (higher, lower, 60 - higher - lower)
    assert test.p_value == pytest.approx(stats.binomtest(higher, higher + lower).pvalue)


def test_no_discordant_pair_means_no_evidence():
    assert paired_test([1.0, 0.0], [1.0, 0.0]).p_value == 1.0
    with pytest.raises(ValueError):
        paired_test([1.0], [1.0, 0.0])


@pytest.mark.parametrize(
    "table",
    [
        *[(1, 9, 11, 3), (0, 5, 5, 0), (3, 3, 3, 3), (10, 200, 0, 210), (2, 7, 8, 2)],
        *[(0, 0, 4, 6), (0, 40, 3, 37), (5, 995, 20, 980), (7, 0, 0, 7)],
    ],
)
def test_fisher_exact_matches_scipy(table):
    a, b, c, d = table
    expected = stats.fisher_exact([[a, b], [c, d]]).pvalue
    assert fisher_exact(a, b, c, d) == pytest.approx(expected, rel=1e-9)


# pass@k by hand: 1 - C(n-c, k) / C(n, k).
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),  # C(3,2)=3, C(5,2)=10
        (5, 2, 3, 1 - 1 / 10),  # C(3,3)=1, C(5,3)=10
        (5, 2, 4, 1.0),  # fewer than k failures: some draw of k always passes
        (10, 3, 5, 1 - 21 / 252),  # C(7,5)=21, C(10,5)=252
        (4, 0, 2, 0.0),
        (4, 4, 1, 1.0),
        (200, 1, 100, 0.5),
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_mean_pass_at_k_leaves_out_tasks_with_too_few_samples():
    # Task 1: 2 of 4 passed; task 2: 0 of 4; task 3: only 1 sample (1 passed).
    samples = [(4, 2), (4, 0), (1, 1)]
    assert mean_pass_at_k(samples, 1) == (pytest.approx((0.5 + 0.0 + 1.0) / 3), 3)
    value, tasks = mean_pass_at_k(samples, 2)
    assert tasks == 2 and value == pytest.approx((1 - 1 / 6 + 0.0) / 2)
    assert mean_pass_at_k(samples, 5) == (None, 0)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def _coverage(draw, truth: float, datasets: int = 200, resamples: int = 2000) -> float:
    rng = np.random.default_rng(2024)
    covered = 0
    for i in range(datasets):
        interval = bootstrap_mean(draw(rng), resamples=resamples, seed=i)
        assert interval is not None
        covered += interval.low <= truth <= interval.high
    return covered / datasets


def test_bootstrap_interval_covers_a_bernoulli_mean_95_percent_of_the_time():
    coverage = _coverage(lambda rng: rng.binomial(1, 0.3, size=120).astype(float), 0.3)
    assert 0.92 <= coverage <= 0.98, coverage


def test_bootstrap_interval_covers_a_continuous_mean_95_percent_of_the_time():
    # Many distinct values: the path that draws observations, not level counts.
    coverage = _coverage(lambda rng: rng.uniform(0, 1, size=150), 0.5)
    assert 0.92 <= coverage <= 0.98, coverage


def test_level_counts_resample_like_drawing_observations():
    data = np.array([0.0] * 70 + [1.0] * 30)
    by_levels = resampled_means(data, resamples=20_000, seed=1)  # few levels: multinomial
    rng = np.random.default_rng(2)
    by_draws = data[rng.integers(0, 100, size=(20_000, 100))].mean(axis=1)
    for q in (0.025, 0.25, 0.5, 0.75, 0.975):
        assert np.quantile(by_levels, q) == pytest.approx(np.quantile(by_draws, q), abs=0.011)
    assert by_levels.std() == pytest.approx(math.sqrt(0.3 * 0.7 / 100), rel=0.03)


def test_bootstrap_is_seeded_and_streams_differ():
    values = np.random.default_rng(0).uniform(size=50)
    a = bootstrap_mean(values, resamples=500, seed=3)
    assert a == bootstrap_mean(values, resamples=500, seed=3)
    assert a != bootstrap_mean(values, resamples=500, seed=3, stream=1)
    assert bootstrap_mean([], resamples=10) is None
    single = bootstrap_mean([0.5], resamples=10)
    assert single is not None and (single.low, single.estimate, single.high) == (0.5, 0.5, 0.5)


def test_large_samples_resample_in_bounded_chunks():
    values = np.random.default_rng(0).uniform(size=200_000)
    interval = bootstrap_mean(values, resamples=200, seed=0)
    assert interval is not None and interval.low < values.mean() < interval.high


def test_spread_matches_numpy():
    values = [3.0, 1.0, 2.0, 10.0, 4.0]
    s = spread(values)
    assert s is not None
    assert (s.median, s.max, s.n) == (3.0, 10.0, 5)
    assert s.p90 == pytest.approx(np.percentile(values, 90))
    assert spread([]) is None
