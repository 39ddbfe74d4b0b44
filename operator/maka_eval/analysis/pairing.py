"""Pairing: compare subjects only on the task groups where every subject has a result.

Attempt loss is not random (long, chatty runs die more often), so each subject's mean
over its own surviving cells compares different task mixes. The paired view keeps a
task group (task x repetition) only when every subject has a selected result in it.
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


def mean_and_sem(values: list[float]) -> MeanAndSem:
    """Mean and standard error of the mean (sample standard deviation / sqrt(n))."""
    if not values:
        return MeanAndSem(0, None, None)
    mean = statistics.fmean(values)
    if len(values) < 2:
        return MeanAndSem(1, mean, None)
    return MeanAndSem(len(values), mean, statistics.stdev(values) / math.sqrt(len(values)))


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


def paired_difference(
    expansion: Expansion, scores: Mapping[str, float | None], subject: str, baseline: str
) -> MeanAndSem:
    """Mean of (subject - baseline) per complete group, with its standard error."""
    paired = paired_scores(expansion, scores)
    return mean_and_sem([a - b for a, b in zip(paired[subject], paired[baseline], strict=True)])
