"""Pairing: compare subjects only on the task groups where every subject has a result.

Attempt loss is not random (long, chatty runs die more often), so each subject's mean
over its own surviving cells compares different task mixes. The paired view keeps a
task group (task x repetition) only when every subject has a selected result in it.

Standard errors are clustered by task: the repetitions of one task are not independent
(a task an agent cannot solve fails every time), so the error of a mean is the
cluster-robust one, which with one repetition is the usual standard error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from maka_eval.engine.expand import Expansion, TaskGroup


@dataclass(frozen=True)
class MeanAndSem:
    """A sample mean and its standard error (None below two values)."""

    n: int
    mean: float | None
    sem: float | None


def mean_and_sem(values: list[float], tasks: list[str] | None = None) -> MeanAndSem:
    """Mean and standard error of the mean, clustered by `tasks` when given: the
    cluster-robust (Liang-Zeger, with the G/(G-1) factor) error, sqrt(G/(G-1) * sum over
    tasks of (sum of the task's residuals)^2) / n, None below two tasks. Without tasks,
    or one value per task, it is the sample standard deviation / sqrt(n)."""
    if not values:
        return MeanAndSem(0, None, None)
    mean = statistics.fmean(values)
    n = len(values)
    if tasks is None or len(set(tasks)) == n:
        if n < 2:
            return MeanAndSem(1, mean, None)
        return MeanAndSem(n, mean, statistics.stdev(values) / math.sqrt(n))
    sums: dict[str, float] = {}
    for value, task in zip(values, tasks, strict=True):
        sums[task] = sums.get(task, 0.0) + (value - mean)
    g = len(sums)
    if g < 2:
        return MeanAndSem(n, mean, None)
    return MeanAndSem(n, mean, math.sqrt(g / (g - 1) * sum(x * x for x in sums.values())) / n)


def complete_groups(
    expansion: Expansion, scores: Mapping[str, float | None]
) -> tuple[TaskGroup, ...]:
    """Task groups in which every subject's cell has a selected result (a score)."""
    return tuple(
        group
        for group in expansion.groups
        if all(scores.get(cell.id) is not None for cell in group.cells)
    )


def paired_scores(
    expansion: Expansion, scores: Mapping[str, float | None]
) -> dict[str, list[float]]:
    """Each subject's scores over the complete groups, in group order (equal lengths)."""
    paired: dict[str, list[float]] = {s: [] for s in expansion.subject_ids}
    for group in complete_groups(expansion, scores):
        for cell in group.cells:
            score = scores[cell.id]
            assert score is not None
            paired[cell.subject_id].append(score)
    return paired


def paired_tasks(expansion: Expansion, scores: Mapping[str, float | None]) -> list[str]:
    """The task of each complete group, in the order of `paired_scores`."""
    return [group.task_id for group in complete_groups(expansion, scores)]


def paired_difference(
    expansion: Expansion, scores: Mapping[str, float | None], subject: str, baseline: str
) -> MeanAndSem:
    """Mean of (subject - baseline) per complete group, with its standard error
    clustered by task."""
    paired = paired_scores(expansion, scores)
    return mean_and_sem(
        [a - b for a, b in zip(paired[subject], paired[baseline], strict=True)],
        paired_tasks(expansion, scores),
    )
