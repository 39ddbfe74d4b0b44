"""Comparing two arms on re-paired observations.

Observations are paired by (task id, repetition): within a run that is the task group,
whose arms started together; across two runs it is the same task and repetition number
of each run. A cell with a result whose partner has none is an unmatched observation: it
is discarded, and counted per arm, because attempt loss is not random (long, chatty runs
die more) and keeping it would bias the comparison toward the arm that finished sooner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from maka_eval.analysis.observations import CellObservation
from maka_eval.analysis.statistics import ExactTest, Interval, bootstrap_mean, paired_test


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
    """Mean of (first - second) per pair, with its bootstrap 95% interval."""
    test: ExactTest | None


Key = tuple[str, int]


def _scores(cells: Sequence[CellObservation]) -> dict[Key, float]:
    return {(c.task_id, c.repetition): c.score for c in cells if c.score is not None}


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
    a, b = _scores(first_cells), _scores(second_cells)
    keys = [key for key in a if key in b]
    a_scores = [a[key] for key in keys]
    b_scores = [b[key] for key in keys]
    differences = [x - y for x, y in zip(a_scores, b_scores, strict=True)]
    return PairComparison(
        first=first,
        second=second,
        across_runs=across_runs,
        pairs=len(keys),
        first_unmatched=len(a) - len(keys),
        second_unmatched=len(b) - len(keys),
        first_mean=sum(a_scores) / len(keys) if keys else None,
        second_mean=sum(b_scores) / len(keys) if keys else None,
        difference=bootstrap_mean(differences, resamples=resamples, seed=seed, stream=stream),
        test=paired_test(a_scores, b_scores) if keys else None,
    )
