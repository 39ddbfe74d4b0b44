"""The statistics of a report: bootstrap intervals, pass@k, exact tests, Holm's adjustment.

Pure functions over numbers (numpy for the resampling); every method is named here once,
and the tests check each against a reference (scipy) or a table worked out by hand.

- Bootstrap: percentile interval of the mean over resamples of the observations, drawn
  with replacement from a seeded generator. When the values take few distinct levels
  (0/1 scores, paired differences of them) the resample mean depends only on how many
  times each level is drawn, so the draw is one multinomial per resample: the same
  resampling distribution as drawing every observation, at a fraction of the cost.
- Cluster bootstrap: the task is the unit. Repetitions of one task are not independent
  (a task an agent cannot solve fails every repetition together), so each task's
  observations are first averaged, and the bootstrap above resamples those task means:
  whole tasks are drawn with replacement. With one observation per task this is the
  plain bootstrap, draw for draw.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k), per
  task over its n samples with c passes, averaged over tasks with at least k samples.
- Exact tests: the two-sided binomial test with p = 1/2 (the sign test). McNemar's exact
  test is this test on the discordant pairs of binary scores; for other scores it is the
  sign test on the nonzero paired differences. Fisher's exact test compares two
  proportions (of lost cells) when the tables are small, as they are here.
- Holm's step-down adjustment: with several comparisons in one report, each p-value is
  also given adjusted so that the chance of any false 'significant' stays at alpha.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_RESAMPLES = 10_000
CONFIDENCE = 0.95
_CHUNK_ELEMENTS = 4_000_000
"""At most this many drawn indices in memory at once (32 MB): large samples are
resampled in chunks of resamples so memory stays flat whatever the sample size."""
_RELATIVE_TOLERANCE = 1 + 1e-7
"""Outcomes at most this much more likely than the observed one count as 'as extreme'
(as scipy does), so floating-point noise does not drop the observed table's twin."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    n: int
    """Observations (cells, or pairs of cells)."""
    tasks: int = -1
    """Tasks (the resampled unit); -1: each observation its own (set to n)."""

    def __post_init__(self) -> None:
        if self.tasks < 0:
            object.__setattr__(self, "tasks", self.n)


def bootstrap_mean(
    values: Sequence[float] | FloatArray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    stream: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """The mean with a percentile bootstrap interval; None for no values. `stream` gives
    each interval of one report its own random numbers from the one seed."""
    data = np.asarray(values, dtype=np.float64)
    n = int(data.size)
    if n == 0:
        return None
    means = resampled_means(data, resamples=resamples, seed=seed, stream=stream)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(data.mean()), float(low), float(high), n)


TaskIndex = tuple[npt.NDArray[np.intp], int]
"""Each observation's task as a number (0, 1, ... in order of first appearance), and
how many tasks there are: made once by `task_ids`, passed to the functions below."""


def task_ids(tasks: Sequence[str] | TaskIndex) -> TaskIndex:
    """Number the tasks (a TaskIndex is returned as it is). Looked up in C: a report
    numbers 100,000s of cells."""
    if isinstance(tasks, tuple) and len(tasks) == 2 and isinstance(tasks[0], np.ndarray):
        return tasks
    index = {task: i for i, task in enumerate(dict.fromkeys(tasks))}
    ids = np.fromiter(map(index.__getitem__, tasks), dtype=np.intp, count=len(tasks))
    return ids, len(index)


def task_means(
    tasks: Sequence[str] | TaskIndex, values: Sequence[float] | FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Each task's mean of its values, and how many values it has; tasks in order of
    first appearance (so one value per task gives the values back, in order)."""
    ids, count = task_ids(tasks)
    data = np.asarray(values, dtype=np.float64)
    if data.shape != ids.shape:
        raise ValueError("every value needs its task")
    sizes = np.bincount(ids, minlength=count).astype(np.float64)
    sums = np.bincount(ids, weights=data, minlength=count)
    return sums / np.maximum(sizes, 1.0), sizes


def cluster_bootstrap_mean(
    tasks: Sequence[str] | TaskIndex,
    values: Sequence[float] | FloatArray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    stream: int = 0,
    confidence: float = CONFIDENCE,
) -> Interval | None:
    """The mean of the task means, with a percentile interval from resampling whole
    tasks; None for no values. One value per task: exactly `bootstrap_mean`."""
    means, _ = task_means(tasks, values)
    interval = bootstrap_mean(
        means, resamples=resamples, seed=seed, stream=stream, confidence=confidence
    )
    if interval is None:
        return None
    n = len(task_ids(tasks)[0])
    return Interval(interval.estimate, interval.low, interval.high, n, int(means.size))


def resampled_means(data: FloatArray, *, resamples: int, seed: int, stream: int = 0) -> FloatArray:
    """The means of `resamples` bootstrap resamples of `data` (seeded, deterministic)."""
    if resamples < 1:
        raise ValueError("the bootstrap needs at least one resample")
    rng = np.random.default_rng([seed, stream])
    n = int(data.size)
    levels, counts = np.unique(data, return_counts=True)
    if levels.size * 8 <= n:
        # Few distinct values: draw how often each is picked (one multinomial per
        # resample) instead of which observations are picked; same distribution.
        picked = rng.multinomial(n, counts / n, size=resamples)
        return np.asarray(picked @ levels / n, dtype=np.float64)
    means = np.empty(resamples, dtype=np.float64)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        index = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = data[index].mean(axis=1)
    return means


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k for one task: n samples, c of them passed."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) as a product, stable for large n.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(samples: Sequence[tuple[int, int]], k: int) -> tuple[float | None, int]:
    """pass@k averaged over tasks given as (n, c); tasks with fewer than k samples are
    left out. Returns (the average or None, how many tasks it averages)."""
    # Tasks share few (n, c) pairs (n is mostly the repetition count): each once.
    distinct = {sample: pass_at_k(*sample, k) for sample in set(samples) if sample[0] >= k}
    used = [distinct[sample] for sample in samples if sample[0] >= k]
    return (sum(used) / len(used) if used else None), len(used)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p is
    multiplied by (m - i + 1), made no smaller than the adjusted ones before it, capped
    at 1. Rejecting where the adjusted p < alpha keeps the family-wise error <= alpha."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _log_binomial_pmf(n: int, p: float) -> FloatArray:
    """log P(X = k) for k = 0..n, X ~ Binomial(n, p)."""
    k = np.arange(n + 1, dtype=np.float64)
    log_factorial = np.array([math.lgamma(x + 1) for x in range(n + 1)], dtype=np.float64)
    log_choose = log_factorial[n] - log_factorial - log_factorial[::-1]
    with np.errstate(divide="ignore"):
        return np.asarray(log_choose + k * np.log(p) + (n - k) * np.log1p(-p), dtype=np.float64)


def binomial_test(successes: int, trials: int, p: float = 0.5) -> float:
    """Two-sided exact binomial test p-value (the outcomes no more likely than the
    observed one, as scipy.stats.binomtest computes it)."""
    if not 0 <= successes <= trials:
        raise ValueError("successes must be between 0 and trials")
    if trials == 0:
        return 1.0
    log_pmf = _log_binomial_pmf(trials, p)
    observed = log_pmf[successes]
    extreme = log_pmf <= observed + math.log(_RELATIVE_TOLERANCE)
    top = float(log_pmf[extreme].max())
    total = float(np.exp(log_pmf[extreme] - top).sum()) * math.exp(top)
    return min(1.0, total)


@dataclass(frozen=True)
class ExactTest:
    """An exact test of 'no difference' on paired observations."""

    name: str
    """'McNemar exact' (binary scores) or 'sign test' (other scores)."""
    positive: int
    """Pairs where the first arm scored higher."""
    negative: int
    """Pairs where the second arm scored higher."""
    ties: int
    p_value: float
    unit: str = "pairs"
    """What the counts count: 'pairs', or 'tasks' when repetitions were averaged."""


def paired_test(first: Sequence[float], second: Sequence[float]) -> ExactTest:
    """McNemar's exact test when every score is 0 or 1, else the sign test; both are the
    two-sided binomial test (p = 1/2) on the pairs that differ."""
    if len(first) != len(second):
        raise ValueError("paired observations must have equal lengths")
    binary = all(v in (0.0, 1.0) for v in first) and all(v in (0.0, 1.0) for v in second)
    # Counted in C (map over both columns): a report compares 10,000s of pairs.
    positive = sum(map(operator.gt, first, second))
    negative = sum(map(operator.lt, first, second))
    ties = len(first) - positive - negative
    return ExactTest(
        "McNemar exact" if binary else "sign test",
        positive,
        negative,
        ties,
        binomial_test(positive, positive + negative),
    )


def task_paired_test(
    tasks: Sequence[str] | TaskIndex, first: Sequence[float], second: Sequence[float]
) -> ExactTest:
    """The paired test with the task as the unit. One pair per task: `paired_test`
    itself (McNemar's exact test on 0/1 scores). Otherwise each task's repetitions are
    averaged per arm and the sign test counts the tasks where the first arm's mean is
    higher, lower or equal: the repetitions of a task are not independent pairs."""
    ids, count = task_ids(tasks)
    if not len(ids) == len(first) == len(second):
        raise ValueError("paired observations must have equal lengths")
    if count == len(ids):
        return paired_test(first, second)
    # Each task has as many values in both arms: comparing sums compares means.
    a = np.bincount(ids, weights=np.asarray(first, dtype=np.float64), minlength=count)
    b = np.bincount(ids, weights=np.asarray(second, dtype=np.float64), minlength=count)
    positive, negative = int((a > b).sum()), int((a < b).sum())
    return ExactTest(
        "sign test over tasks",
        positive,
        negative,
        count - positive - negative,
        binomial_test(positive, positive + negative),
        "tasks",
    )


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided Fisher exact p-value of the 2x2 table [[a, b], [c, d]] (the tables with
    the same margins no more likely than the observed one)."""
    if min(a, b, c, d) < 0:
        raise ValueError("a 2x2 table holds counts")
    row, column, total = a + b, a + c, a + b + c + d
    low, high = max(0, column - (total - row)), min(row, column)
    if high <= low:
        return 1.0

    def log_pmf(x: int) -> float:
        return (
            _log_choose(row, x) + _log_choose(total - row, column - x) - _log_choose(total, column)
        )

    observed = log_pmf(a)
    logs = [log_pmf(x) for x in range(low, high + 1)]
    extreme = [v for v in logs if v <= observed + math.log(_RELATIVE_TOLERANCE)]
    top = max(extreme)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in extreme))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


@dataclass(frozen=True)
class Spread:
    """The distribution of a positive quantity (durations)."""

    n: int
    median: float
    p90: float
    max: float
    mean: float


def spread(values: Sequence[float] | FloatArray) -> Spread | None:
    """Median, 90th percentile (linear interpolation), maximum and mean; None if empty."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return None
    median, p90 = np.quantile(data, [0.5, 0.9])
    return Spread(int(data.size), float(median), float(p90), float(data.max()), float(data.mean()))
