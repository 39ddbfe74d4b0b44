"""The task as the unit: cluster bootstrap, the test over tasks, the variance split and
Holm's adjustment, against hand-worked tables, an independently written cluster-robust
standard error, the per-pair figures (one repetition) and a simulation whose true
difference is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from maka_eval.analysis.arms import PASS_STREAMS
from maka_eval.analysis.report import build_report, report_json
from maka_eval.analysis.statistics import (
    bootstrap_mean,
    cluster_bootstrap_mean,
    holm,
    paired_test,
    pass_at_k,
    task_means,
    task_paired_test,
)
from maka_eval.analysis.variance import variance_split
from maka_eval.engine.status import AttemptStatus
from tests.analysis.records import FakeSource, attempt
from tests.helpers import spec

OK = AttemptStatus.COMPLETED


def _tasks(g: int, k: int) -> list[str]:
    return [f"t{t}" for t in range(g) for _ in range(k)]


# -- one repetition: the per-pair figures, draw for draw --------------------------------


def test_one_value_per_task_is_the_plain_bootstrap_and_test():
    rng = np.random.default_rng(5)
    for values in (rng.integers(0, 2, 90).astype(float), rng.uniform(size=70)):
        tasks = [f"t{i}" for i in range(values.size)]
        clustered = cluster_bootstrap_mean(tasks, values, resamples=3000, seed=4, stream=2)
        plain = bootstrap_mean(values, resamples=3000, seed=4, stream=2)
        assert clustered == plain and clustered.tasks == clustered.n == values.size
    first = rng.integers(0, 2, 60).astype(float).tolist()
    second = rng.integers(0, 2, 60).astype(float).tolist()
    tasks = [f"t{i}" for i in range(60)]
    assert task_paired_test(tasks, first, second) == paired_test(first, second)
    assert paired_test(first, second).name == "McNemar exact"


def _run(scores: dict[tuple[int, int, str], float], tasks: int, repetitions: int, subjects: str):
    doc = spec(
        tasks=[{"id": f"t{i}"} for i in range(tasks)],
        subjects=[{"id": s, "kind": "external", "config": {"command": "true"}} for s in subjects],
        repetitions=repetitions,
    )
    attempts = [attempt(f"t{t}::{r}::{s}", 1, OK, score) for (t, r, s), score in scores.items()]
    return FakeSource(doc, attempts)


def test_a_report_with_one_repetition_equals_the_per_pair_figures():
    # What the report computed before the task became the unit: the bootstrap over
    # cells (arms on streams 0 and 1, the pair on 2) and McNemar's test over pairs.
    rng = np.random.default_rng(11)
    scores = {
        (t, 1, s): float(rng.random() < (0.7 if s == "p" else 0.5)) for t in range(40) for s in "pq"
    }
    report = build_report([_run(scores, 40, 1, "pq")], resamples=2000, seed=9)
    p = [scores[t, 1, "p"] for t in range(40)]
    q = [scores[t, 1, "q"] for t in range(40)]
    assert report.arms[0].score == bootstrap_mean(p, resamples=2000, seed=9, stream=0)
    assert report.arms[1].score == bootstrap_mean(q, resamples=2000, seed=9, stream=1)
    (pair,) = report.pairs
    diffs = [a - b for a, b in zip(p, q, strict=True)]
    assert pair.difference == bootstrap_mean(diffs, resamples=2000, seed=9, stream=2)
    assert pair.test == paired_test(p, q) and pair.test.name == "McNemar exact"
    assert pair.p_holm == pair.test.p_value  # one comparison: nothing to adjust
    assert pair.first_mean == pytest.approx(sum(p) / 40)
    assert report.arms[0].variance is None and report.arms[0].pass_at_k == ()


# -- every repetition of a task agrees: the clustered interval widens --------------------


def test_when_every_repetition_agrees_the_clustered_interval_widens():
    g, k = 40, 5
    rng = np.random.default_rng(3)
    solved = rng.random(g) < 0.45
    values = np.repeat(solved.astype(float), k)  # a task's repetitions all agree
    tasks = _tasks(g, k)
    clustered = cluster_bootstrap_mean(tasks, values, resamples=20_000, seed=1)
    naive = bootstrap_mean(values, resamples=20_000, seed=1)
    assert clustered.estimate == pytest.approx(naive.estimate)
    assert (clustered.n, clustered.tasks) == (200, 40)
    width_ratio = (clustered.high - clustered.low) / (naive.high - naive.low)
    # 40 independent tasks, not 200 independent cells: about sqrt(5) = 2.24 times wider.
    assert 1.9 < width_ratio < 2.6, width_ratio
    split = variance_split(tasks, values)
    p = values.mean()
    # By hand: task means are 0/1 (sample variance p(1-p) 40/39), cells likewise (200/199).
    assert split.within == 0.0 and split.within_share == 0.0
    assert split.between == pytest.approx(p * (1 - p) * 40 / 39)
    assert split.clustered_se == pytest.approx(math.sqrt(p * (1 - p) / 39))
    assert split.naive_se == pytest.approx(math.sqrt(p * (1 - p) / 199))
    assert split.design_effect == pytest.approx(5 * (40 / 39) / (200 / 199))
    # More repetitions buy nothing here; more tasks do.
    assert split.standard_error(40, 10) == pytest.approx(split.standard_error(40, 5))
    assert split.standard_error(80, 5) == pytest.approx(split.standard_error(40, 5) / math.sqrt(2))


def test_the_test_counts_tasks_when_repetitions_agree():
    # 6 tasks x 4 repetitions: the first arm solves 5 tasks every time, the second none.
    first = [1.0] * 20 + [0.0] * 4
    second = [0.0] * 24
    tasks = _tasks(6, 4)
    test = task_paired_test(tasks, first, second)
    assert (test.name, test.unit) == ("sign test over tasks", "tasks")
    assert (test.positive, test.negative, test.ties) == (5, 0, 1)
    assert test.p_value == pytest.approx(stats.binomtest(5, 5).pvalue)  # 0.0625
    # Counted as 20 independent pairs it would claim p = 2 / 2^20.
    assert paired_test(first, second).p_value == pytest.approx(2 / 2**20)


# -- the clustered standard error against a cluster-robust one written independently ----


def _cr1(values: np.ndarray, tasks: list[str]) -> float:
    """Liang-Zeger cluster-robust standard error of a grand mean, with the G/(G-1)
    small-sample factor, written as a sum over clusters of summed residuals."""
    mean = values.mean()
    sums: dict[str, float] = {}
    for value, task in zip(values, tasks, strict=True):
        sums[task] = sums.get(task, 0.0) + (value - mean)
    g, n = len(sums), values.size
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / n


def test_clustered_standard_error_is_the_cluster_robust_one_on_balanced_designs():
    rng = np.random.default_rng(8)
    g, k = 150, 4
    effects = np.repeat(rng.normal(0, 0.3, g), k)
    values = effects + rng.normal(0, 0.5, g * k)
    tasks = _tasks(g, k)
    split = variance_split(tasks, values)
    assert split.clustered_se == pytest.approx(_cr1(values, tasks), rel=1e-9)
    # With one value per task CR1 is the usual standard error of the mean.
    single = values[::k]
    one = variance_split([f"t{i}" for i in range(g)], single)
    assert one.clustered_se == pytest.approx(stats.sem(single), rel=1e-9)
    assert one.naive_se == pytest.approx(stats.sem(single), rel=1e-9) and one.within is None
    # The percentile interval from resampling tasks matches the normal interval of the
    # bootstrap's own variance (the plug-in variance: CR1 times (G-1)/G).
    interval = cluster_bootstrap_mean(tasks, values, resamples=40_000, seed=2)
    half = stats.norm.ppf(0.975) * split.clustered_se * math.sqrt((g - 1) / g)
    assert interval.low == pytest.approx(values.mean() - half, abs=0.15 * half)
    assert interval.high == pytest.approx(values.mean() + half, abs=0.15 * half)
    # The variance split recovers the model's components (0.09 between, 0.25 within).
    assert split.between == pytest.approx(0.09, rel=0.35)
    assert split.within == pytest.approx(0.25, rel=0.1)


def test_variance_split_by_hand_on_an_unbalanced_table():
    # Task a: 1, 0, 1; task b: 0, 0; task c: 1, 1, 1, 1.
    tasks = ["a"] * 3 + ["b"] * 2 + ["c"] * 4
    values = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    means, sizes = task_means(tasks, values)
    assert means.tolist() == pytest.approx([2 / 3, 0.0, 1.0]) and sizes.tolist() == [3, 2, 4]
    split = variance_split(tasks, values)
    # Within: task a's sum of squares 2/3 over 9 - 3 degrees of freedom.
    assert split.within == pytest.approx(1 / 9)
    # Task means 2/3, 0, 1: sample variance 7/27; less within x mean(1/n) = 1/9 x 13/36.
    assert split.between == pytest.approx(7 / 27 - 13 / 324)
    assert split.repetitions == pytest.approx(36 / 13)  # the harmonic mean of 3, 2, 4
    assert split.clustered_se == pytest.approx(math.sqrt(7 / 27 / 3))
    assert split.within_share == pytest.approx((1 / 9) / (1 / 9 + 71 / 324))
    # The mean over tasks weighs each task once, whatever its repetitions.
    interval = cluster_bootstrap_mean(tasks, values, resamples=500)
    assert interval.estimate == pytest.approx(5 / 9) and (interval.n, interval.tasks) == (9, 3)
    assert variance_split([], []) is None


# -- Holm --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p_values", "expected"),
    [
        # Sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> the
        # last is raised to 0.06 (adjusted p-values never decrease with the rank).
        ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
        ([0.5, 0.2], [0.5, 0.4]),
        ([0.4, 0.3, 0.9], [0.9, 0.9, 0.9]),  # 0.9, then max(0.9, 0.8), then max(0.9, 0.9)
        ([0.02], [0.02]),
        ([0.01, 0.01, 0.01], [0.03, 0.03, 0.03]),
        ([], []),
    ],
)
def test_holm_by_hand(p_values, expected):
    assert holm(p_values) == pytest.approx(expected)


def test_holm_against_its_definition_on_random_p_values():
    rng = np.random.default_rng(1)
    for m in (2, 3, 6, 10):
        ps = rng.uniform(0, 0.2, m).tolist()
        order = sorted(range(m), key=ps.__getitem__)
        for rank, i in enumerate(order):
            steps = [min(1.0, (m - j) * ps[order[j]]) for j in range(rank + 1)]
            assert holm(ps)[i] == pytest.approx(max(steps))


# -- pass@k: per task, averaged over tasks, its interval over tasks ---------------------


def test_pass_at_k_interval_resamples_tasks():
    rng = np.random.default_rng(4)
    scores = {
        (t, r, s): float(rng.random() < (t % 5) / 4)
        for t in range(30)
        for r in range(1, 4)
        for s in "pq"
    }
    report = build_report([_run(scores, 30, 3, "pq")], resamples=1500, seed=3)
    arm = report.arms[0]
    assert [p.k for p in arm.pass_at_k] == [1, 2, 3]
    for place, entry in enumerate(arm.pass_at_k):
        per_task = [
            pass_at_k(3, int(sum(scores[t, r, "p"] for r in range(1, 4))), entry.k)
            for t in range(30)
        ]
        expected = bootstrap_mean(
            per_task, resamples=1500, seed=3, stream=PASS_STREAMS + 0 * 64 + place
        )
        assert entry.interval == expected and entry.value == pytest.approx(np.mean(per_task))
        assert entry.interval.low <= entry.value <= entry.interval.high
    data = report_json(report)
    assert data["arms"][0]["passAtK"][0]["interval"]["tasks"] == 30
    assert data["arms"][0]["variance"]["tasks"] == 30
    assert data["pairs"][0]["power"]["detectableDifference"] > 0
    assert data["method"]["unit"].startswith("task")


# -- simulation: coverage of the true difference ----------------------------------------

G, K, EXPERIMENTS = 200, 5, 1200
CAN, SOLVE, FAIL = (0.6, 0.5), 0.9, 0.1
"""Each task is one an arm can do (it then passes 90% of its attempts) or cannot (10%).
Arm A can do a task with probability 0.6 and B with 0.5, sharing the draw half the time:
the true difference of the mean scores is (0.6 - 0.5) x (0.9 - 0.1) = 0.08."""
TRUE_DIFFERENCE = (CAN[0] - CAN[1]) * (SOLVE - FAIL)
TRUE_A = CAN[0] * SOLVE + (1 - CAN[0]) * FAIL


def _experiment(rng: np.random.Generator) -> tuple[list[str], np.ndarray, np.ndarray]:
    u = rng.random(G)
    v = np.where(rng.random(G) < 0.5, u, rng.random(G))
    p_a = np.where(u < CAN[0], SOLVE, FAIL)
    p_b = np.where(v < CAN[1], SOLVE, FAIL)
    a = (rng.random((G, K)) < p_a[:, None]).astype(float).ravel()
    b = (rng.random((G, K)) < p_b[:, None]).astype(float).ravel()
    return _tasks(G, K), a, b


def test_clustered_intervals_cover_the_true_difference_95_percent_of_the_time():
    rng = np.random.default_rng(2024)
    clustered = naive = arm = 0
    for i in range(EXPERIMENTS):
        tasks, a, b = _experiment(rng)
        d = a - b
        c = cluster_bootstrap_mean(tasks, d, resamples=2000, seed=i)
        n = bootstrap_mean(d, resamples=2000, seed=i)
        s = cluster_bootstrap_mean(tasks, a, resamples=2000, seed=i, stream=1)
        clustered += c.low <= TRUE_DIFFERENCE <= c.high
        naive += n.low <= TRUE_DIFFERENCE <= n.high
        arm += s.low <= TRUE_A <= s.high
    clustered_rate, naive_rate, arm_rate = (x / EXPERIMENTS for x in (clustered, naive, arm))
    assert 0.93 <= clustered_rate <= 0.97, clustered_rate
    assert 0.93 <= arm_rate <= 0.97, arm_rate
    # Repetitions treated as independent pairs: intervals about 0.6 times as wide.
    assert naive_rate < 0.85, naive_rate
