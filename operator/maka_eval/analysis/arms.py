"""Per-arm figures: score with its interval, pass@k, the variance split, tokens, cost,
duration.

Each arm's figures are over its own cells with a selected result. The task is the unit:
the mean score is the mean over tasks of each task's mean over its repetitions, and its
interval (and pass@k's) comes from resampling whole tasks (`cluster_bootstrap_mean`).
Because loss is not random, these unpaired means are descriptive only: arms are
compared in `analysis.comparison`, on re-paired observations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from maka_eval.analysis.observations import PASS_SCORE, CellObservation
from maka_eval.analysis.statistics import (
    Interval,
    Spread,
    bootstrap_mean,
    cluster_bootstrap_mean,
    pass_at_k,
    spread,
    task_ids,
)
from maka_eval.analysis.variance import VarianceSplit, variance_split

TOKEN_KINDS = (
    ("input", "input_tokens"),
    ("cache read", "cached_input_tokens"),
    ("cache write", "cache_write_tokens"),
    ("output", "output_tokens"),
)
"""The normalized usage every arm reports (input excludes cached input, so the four
add up to the total). The usage contract has no reasoning count: it is 'not reported'."""
REASONING_NOTE = "not reported (the normalized usage carries no reasoning count)"

# Columns of the observations, read in C (an arm has 10,000s of cells).
_STATUS = attrgetter("status")
_TASK = attrgetter("task_id")
_ATTEMPTS = attrgetter("attempts")
_ALL_ATTEMPTS_COST = attrgetter("all_attempts_cost_usd")
_ALL_ATTEMPTS_UNKNOWN = attrgetter("all_attempts_cost_unknown")


@dataclass(frozen=True)
class TokenFigure:
    """One kind of token over the results that reported usage."""

    kind: str
    total: int
    mean: float


@dataclass(frozen=True)
class Tokens:
    """Token usage of an arm's results."""

    reported: int
    """Results that reported usage."""
    unreported: int
    """Results without usage (the exit-code contract reports none)."""
    figures: tuple[TokenFigure, ...]
    total: int
    mean_total: float | None


@dataclass(frozen=True)
class Cost:
    """What an arm cost, and how much of it is only a lower bound."""

    known: int
    """Results with a known cost."""
    unknown: int
    """Results whose cost is unknown: the total is then a lower bound."""
    total_usd: float | None
    """Sum of the known costs of the results; None when no result has one."""
    mean_usd: float | None
    """Mean over the results with a known cost."""
    all_attempts_usd: float | None
    """Every recorded attempt of the arm (lost and retried ones too), known costs only."""
    all_attempts_unknown: int

    @property
    def lower_bound(self) -> bool:
        return self.unknown > 0 and self.known > 0


@dataclass(frozen=True)
class PassAtK:
    """pass@k of an arm over the tasks with at least k results."""

    k: int
    value: float | None
    tasks: int
    interval: Interval | None = None
    """The mean over tasks with its 95% interval from resampling tasks."""


@dataclass(frozen=True)
class ArmSummary:
    """One arm (a subject of a run) over its cells."""

    arm: str
    run: str
    subject_id: str
    cells: int
    results: int
    completed: int
    subject_failed: int
    score: Interval | None
    """Mean over tasks of each task's mean score, with its 95% interval from resampling
    tasks (with one repetition: the mean over the results, resampling results)."""
    variance: VarianceSplit | None
    """How the scores vary between tasks and within a task."""
    binary: bool
    """Every score is 0 or 1."""
    pass_at_k: tuple[PassAtK, ...]
    tokens: Tokens
    cost: Cost
    duration: Spread | None
    """Seconds, over the results."""


def pass_ks(repetitions: int) -> tuple[int, ...]:
    """Which k a report shows: 1, a few round numbers, and the repetition count."""
    if repetitions < 2:
        return ()
    round_numbers = {k for k in (1, 2, 5, 10, 20, 50, 100) if k <= repetitions}
    return tuple(sorted(round_numbers | {repetitions}))


PASS_STREAMS = 1_000_000
"""pass@k intervals draw from streams above this (an arm's stream times 64, plus the
k's place), so adding them left every other interval's random numbers as they were."""


def summarize_arm(
    arm: str,
    cells: Sequence[CellObservation],
    *,
    repetitions: int,
    resamples: int,
    seed: int,
    stream: int,
) -> ArmSummary:
    """An arm's figures from its cells (every cell, with or without a result)."""
    results = [c for c in cells if c.score is not None]
    scores = [c.score for c in results if c.score is not None]
    tasks = task_ids(list(map(_TASK, results)))  # numbered once for every figure below
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in results:  # each with a score: `c.passed` is its comparison, inlined
        counts = per_task[c.task_id]
        counts[0] += 1
        counts[1] += 1 if c.score >= PASS_SCORE else 0  # type: ignore[operator]
    samples = [(n, passed) for n, passed in per_task.values()]
    passes = []
    for place, k in enumerate(pass_ks(repetitions)):
        # Tasks share few (n, c) pairs (n is mostly the repetition count): each once.
        distinct = {sample: pass_at_k(*sample, k) for sample in set(samples) if sample[0] >= k}
        values = [distinct[sample] for sample in samples if sample[0] >= k]
        interval = bootstrap_mean(
            values, resamples=resamples, seed=seed, stream=PASS_STREAMS + stream * 64 + place
        )
        passes.append(PassAtK(k, interval.estimate if interval else None, len(values), interval))
    first = cells[0] if cells else None
    statuses = list(map(_STATUS, results))
    return ArmSummary(
        arm=arm,
        run=first.run if first else "",
        subject_id=first.subject_id if first else arm,
        cells=len(cells),
        results=len(results),
        completed=statuses.count("completed"),
        subject_failed=statuses.count("subject_failed"),
        score=cluster_bootstrap_mean(tasks, scores, resamples=resamples, seed=seed, stream=stream),
        variance=variance_split(tasks, scores) if repetitions > 1 else None,
        binary=all(s in (0.0, 1.0) for s in scores),
        pass_at_k=tuple(passes),
        tokens=_tokens(results),
        cost=_cost(cells, results),
        duration=spread([c.duration_sec for c in results if c.duration_sec is not None]),
    )


def _tokens(results: Sequence[CellObservation]) -> Tokens:
    reporting = [c for c in results if c.input_tokens is not None]
    n = len(reporting)
    figures = []
    for kind, attribute in TOKEN_KINDS:
        # None counts as 0; summed in C (a large run has 30,000 cells per arm).
        total = sum(filter(None, map(attrgetter(attribute), reporting)))
        figures.append(TokenFigure(kind, total, total / n if n else 0.0))
    total = sum(f.total for f in figures)
    return Tokens(n, len(results) - n, tuple(figures), total, total / n if n else None)


def _cost(cells: Sequence[CellObservation], results: Sequence[CellObservation]) -> Cost:
    known = [c.cost_usd for c in results if c.cost_usd is not None]
    every_known = sum(map(_ALL_ATTEMPTS_COST, cells))
    every_unknown = sum(map(_ALL_ATTEMPTS_UNKNOWN, cells))
    every_attempts = sum(map(_ATTEMPTS, cells))
    return Cost(
        known=len(known),
        unknown=len(results) - len(known),
        total_usd=sum(known) if known else None,
        mean_usd=sum(known) / len(known) if known else None,
        all_attempts_usd=every_known if every_unknown < every_attempts else None,
        all_attempts_unknown=every_unknown,
    )
