"""Comparing two arms on re-paired observations.

Observations are paired by (task id, repetition): within a run that is the task group,
whose arms started together; across two runs it is the same task and repetition number
of each run. A cell with a result whose partner has none is an unmatched observation: it
is discarded, and counted per arm, because attempt loss is not random (long, chatty runs
die more) and keeping it would bias the comparison toward the arm that finished sooner.

The task is the unit of the comparison: the repetitions of one task are not independent
pairs (a task neither arm can solve gives a zero difference every time), so each task's
paired differences are averaged, the difference is the mean over tasks, its interval
resamples whole tasks, and the test counts tasks (`task_paired_test`). With one
repetition every figure is the per-pair one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from maka_eval.analysis.observations import CellObservation
from maka_eval.analysis.power import Components, detectable_difference
from maka_eval.analysis.statistics import (
    ExactTest,
    Interval,
    cluster_bootstrap_mean,
    task_ids,
    task_means,
    task_paired_test,
)
from maka_eval.analysis.variance import VarianceSplit, variance_split


@dataclass(frozen=True)
class PairComparison:
    """`first` minus `second` over their matched observations."""

    first: str
    second: str
    across_runs: bool
    """The arms come from two separate runs: not a paired design (see provenance)."""
    pairs: int
    first_unmatched: int
    """Results of `first` discarded because `second` has none for that task repetition."""
    second_unmatched: int
    first_mean: float | None
    second_mean: float | None
    difference: Interval | None
    """Mean over tasks of each task's mean (first - second) over its pairs, with its 95%
    interval from resampling tasks."""
    test: ExactTest | None
    variance: VarianceSplit | None = None
    """How the paired differences vary between tasks and within a task."""
    p_holm: float | None = None
    """The test's p-value adjusted by Holm over every comparison of the report."""

    @property
    def components(self) -> Components | None:
        """The measured variance of the difference, for the power analysis."""
        v = self.variance
        if v is None or v.tasks < 2 or v.between + (v.within or 0.0) <= 0:
            return None
        return Components(v.between, v.within or 0.0)

    def detectable(self, tasks: float, repetitions: float) -> float | None:
        """The smallest difference a design of this many tasks and repetitions detects
        (80% power, alpha 0.05) at this pair's measured variance."""
        components = self.components
        if components is None:
            return None
        return detectable_difference(components, tasks, repetitions)


Key = tuple[str, int]


def _scores(cells: Sequence[CellObservation]) -> dict[Key, float]:
    return {(c.task_id, c.repetition): c.score for c in cells if c.score is not None}


@dataclass(frozen=True)
class Matched:
    """Two arms' scores re-paired by (task id, repetition), in the first arm's order."""

    tasks: list[str]
    """The task of each pair."""
    first: list[float]
    second: list[float]
    first_unmatched: int
    second_unmatched: int

    @property
    def differences(self) -> list[float]:
        return [x - y for x, y in zip(self.first, self.second, strict=True)]


def match(
    first_cells: Sequence[CellObservation], second_cells: Sequence[CellObservation]
) -> Matched:
    """Pair two arms' results by (task id, repetition); count what has no partner."""
    a, b = _scores(first_cells), _scores(second_cells)
    keys = [key for key in a if key in b]
    return Matched(
        [task for task, _ in keys],
        [a[key] for key in keys],
        [b[key] for key in keys],
        len(a) - len(keys),
        len(b) - len(keys),
    )


def compare(
    first: str,
    first_cells: Sequence[CellObservation],
    second: str,
    second_cells: Sequence[CellObservation],
    *,
    across_runs: bool = False,
    resamples: int,
    seed: int,
    stream: int,
) -> PairComparison:
    """Pair two arms' results by (task id, repetition) and compare the pairs."""
    matched = match(first_cells, second_cells)
    a_scores, b_scores, keys = matched.first, matched.second, matched.tasks
    tasks = task_ids(keys)  # numbered once for every figure below
    differences = matched.differences
    return PairComparison(
        first=first,
        second=second,
        across_runs=across_runs,
        pairs=len(keys),
        first_unmatched=matched.first_unmatched,
        second_unmatched=matched.second_unmatched,
        first_mean=float(task_means(tasks, a_scores)[0].mean()) if keys else None,
        second_mean=float(task_means(tasks, b_scores)[0].mean()) if keys else None,
        difference=cluster_bootstrap_mean(
            tasks, differences, resamples=resamples, seed=seed, stream=stream
        ),
        test=task_paired_test(tasks, a_scores, b_scores) if keys else None,
        variance=variance_split(tasks, differences),
    )
