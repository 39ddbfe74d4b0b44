"""Power: the smallest difference a design can detect, and the design a difference needs.

Pure arithmetic (standard library only), shared by `maka-eval plan` and the report.

Two arms are compared on the mean over tasks of their paired difference (each task's
repetitions averaged first). With `between` the variance across tasks of the true
per-task difference and `within` the variance of one repetition's difference around
it, that mean has the variance

    V = (between + within / repetitions) / tasks

and a two-sided test at level alpha detects a true difference D with probability
`power` when D = (z(1 - alpha/2) + z(power)) * sqrt(V): the normal approximation of
Miller (2024, "Adding Error Bars to Evals", section on power analysis), in which the
variance of a paired difference is what pairing leaves of the two arms' variances.

Assumed figures (`assumed_components`) describe each arm's single score by its variance,
the share of that variance within a task, and the correlation across tasks of the two
arms' task means (what pairing removes):

    between = 2 * (1 - correlation) * (1 - within_share) * score_variance
    within  = 2 * within_share * score_variance

(two arms of equal variance whose repetitions vary independently).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class Components:
    """The variance of a paired difference, split between tasks and within a task."""

    between: float
    within: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.between) and math.isfinite(self.within)):
            raise ValueError("variance components are finite")
        if self.between < 0 or self.within < 0 or self.between + self.within <= 0:
            raise ValueError("variance components are >= 0 and not both 0")

    def variance(self, tasks: float, repetitions: float) -> float:
        """The variance of the mean difference over `tasks` tasks of `repetitions` each."""
        if tasks <= 0 or repetitions <= 0:
            raise ValueError("a design has at least one task and one repetition")
        return (self.between + self.within / repetitions) / tasks


def z_sum(alpha: float = ALPHA, power: float = POWER) -> float:
    """z(1 - alpha/2) + z(power): how many standard errors a detectable difference is."""
    if not 0 < alpha < 1:
        raise ValueError("alpha is between 0 and 1")
    if not 0 < power < 1:
        raise ValueError("power is between 0 and 1")
    normal = NormalDist()
    return normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)


def detectable_difference(
    components: Components,
    tasks: float,
    repetitions: float,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
) -> float:
    """The smallest true difference detected with probability `power` at level alpha."""
    return z_sum(alpha, power) * math.sqrt(components.variance(tasks, repetitions))


def achieved_power(
    components: Components,
    difference: float,
    tasks: float,
    repetitions: float,
    *,
    alpha: float = ALPHA,
) -> float:
    """The probability that the two-sided test at level alpha rejects when the true
    difference is `difference` (both tails counted)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha is between 0 and 1")
    normal = NormalDist()
    z = normal.inv_cdf(1 - alpha / 2)
    shift = abs(difference) / math.sqrt(components.variance(tasks, repetitions))
    return normal.cdf(shift - z) + normal.cdf(-shift - z)


def _check_difference(difference: float) -> None:
    if not (math.isfinite(difference) and difference > 0):
        raise ValueError("the difference to detect is a positive number")


def tasks_needed(
    components: Components,
    difference: float,
    repetitions: int,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
) -> int:
    """How many tasks, each run `repetitions` times, detect `difference`."""
    _check_difference(difference)
    per_task = components.variance(1, repetitions)
    return max(1, math.ceil(z_sum(alpha, power) ** 2 * per_task / difference**2 - 1e-9))


def repetitions_needed(
    components: Components,
    difference: float,
    tasks: int,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
) -> int | None:
    """How many repetitions of each of `tasks` tasks detect `difference`; None when no
    number does (the variance between tasks alone is too large for so few tasks)."""
    _check_difference(difference)
    if tasks < 1:
        raise ValueError("a design has at least one task")
    allowed = tasks * difference**2 / z_sum(alpha, power) ** 2  # the largest V * tasks
    if components.within == 0:
        return 1 if components.between <= allowed else None
    room = allowed - components.between
    if room <= 0:
        return None
    return max(1, math.ceil(components.within / room - 1e-9))


def assumed_components(
    score_variance: float, within_share: float, correlation: float
) -> Components:
    """The components of a paired difference from assumed per-arm figures (see the
    module's doc); each argument's range is checked and named."""
    if not (math.isfinite(score_variance) and score_variance > 0):
        raise ValueError("score variance is a positive number")
    if not 0 <= within_share <= 1:
        raise ValueError("within-task share is between 0 and 1")
    if not -1 <= correlation <= 1:
        raise ValueError("correlation is between -1 and 1")
    between = 2 * (1 - correlation) * (1 - within_share) * score_variance
    within = 2 * within_share * score_variance
    return Components(between, within)
