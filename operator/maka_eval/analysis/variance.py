"""Where a score's variance lies: between tasks, or within a task across its repetitions.

A repetition is a new sample of the same task (the seeds), so a score varies for two
reasons: tasks differ (some are easy, some no agent solves) and one task's attempts
differ from each other. Averaging K repetitions shrinks only the second part:

    Var(mean of the task means) = (between + within / K) / tasks

`between` is the variance of the tasks' true means and `within` the variance of one
repetition around its task's mean. They are estimated by the method of moments, as in a
one-way analysis of variance: `within` pooled over the tasks with two or more
observations (each task's sample variance, weighted by its degrees of freedom), and
`between` the variance of the observed task means less the part of it that `within`
explains (never below 0). From them the report says what more repetitions would buy
against more tasks, and the power analysis (`analysis.power`) what a design can detect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from maka_eval.analysis.statistics import FloatArray, TaskIndex, task_ids


@dataclass(frozen=True)
class VarianceSplit:
    """How one quantity (an arm's scores, or a pair's differences) varies."""

    tasks: int
    observations: int
    repetitions: float
    """Observations per task: their harmonic mean, the K of the formula above."""
    between: float
    """Variance of the tasks' true means (with one observation per task, also holds the
    within-task part, which cannot then be told apart)."""
    within: float | None
    """Variance of one repetition around its task's mean; None when no task has two
    observations."""
    clustered_se: float | None
    """Standard error of the mean of the task means: their sample standard deviation
    over the square root of the number of tasks (None below two tasks)."""
    naive_se: float | None
    """What treating every observation as independent would claim (None below two)."""

    @property
    def within_share(self) -> float | None:
        """The share of one observation's variance that lies within a task."""
        if self.within is None:
            return None
        total = self.between + self.within
        return self.within / total if total > 0 else None

    @property
    def design_effect(self) -> float | None:
        """(clustered / naive standard error) squared: how many times wider than the
        independent-observations claim the honest variance is."""
        if self.clustered_se is None or not self.naive_se:
            return None
        return (self.clustered_se / self.naive_se) ** 2

    def standard_error(self, tasks: float, repetitions: float) -> float:
        """The predicted standard error of a design with this many tasks and repetitions
        per task (repetitions beyond one buy nothing when `within` is unknown)."""
        if tasks <= 0 or repetitions <= 0:
            raise ValueError("a design has at least one task and one repetition")
        within = 0.0 if self.within is None else self.within / repetitions
        return math.sqrt((self.between + within) / tasks)


def variance_split(
    tasks: Sequence[str] | TaskIndex, values: Sequence[float] | FloatArray
) -> VarianceSplit | None:
    """Split the variance of `values` (each with its task); None for no values."""
    data = np.asarray(values, dtype=np.float64)
    n = int(data.size)
    if n == 0:
        return None
    ids, g = task_ids(tasks)
    sizes = np.bincount(ids, minlength=g).astype(np.float64)
    means = np.bincount(ids, weights=data, minlength=g) / sizes
    residual = data - means[ids]
    within_df = float(n - g)
    within = float(np.square(residual).sum() / within_df) if within_df > 0 else None
    harmonic = float(g / np.reciprocal(sizes).sum())
    spread = float(means.var(ddof=1)) if g > 1 else 0.0
    if within is None:
        between = spread
    else:
        between = max(0.0, spread - within * float(np.reciprocal(sizes).mean()))
    return VarianceSplit(
        tasks=g,
        observations=n,
        repetitions=harmonic,
        between=between,
        within=within,
        clustered_se=math.sqrt(spread / g) if g > 1 else None,
        naive_se=float(data.std(ddof=1)) / math.sqrt(n) if n > 1 else None,
    )
