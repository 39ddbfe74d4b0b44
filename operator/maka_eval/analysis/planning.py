"""Planning a run: what a design of tasks x repetitions can detect, and what a target
difference needs, from assumed variance figures or from those measured on a finished run.

The arithmetic is `analysis.power`'s; this module names the design (from the experiment's
expansion), measures the variance of each pair of arms' paired differences on a run (the
same re-pairing as the report's), and makes the rows `maka-eval plan` prints. With
several arms the report adjusts p-values by Holm, whose strictest step tests at
alpha / comparisons: a plan gives the figures at that level too (Bonferroni's, which is
conservative for Holm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from maka_eval.analysis.comparison import match
from maka_eval.analysis.observations import CellObservation, observations
from maka_eval.analysis.power import (
    Components,
    detectable_difference,
    repetitions_needed,
    tasks_needed,
)
from maka_eval.analysis.summary import RunSummary
from maka_eval.analysis.variance import VarianceSplit, variance_split
from maka_eval.engine.expand import Expansion

REPETITION_CHOICES = (1, 2, 3, 5, 10, 20)
"""The repetition counts a plan tabulates (with the design's own)."""


@dataclass(frozen=True)
class Design:
    """What an experiment runs: its tasks, repetitions and subjects (arms)."""

    experiment_id: str
    tasks: int
    repetitions: int
    subjects: tuple[str, ...]

    @property
    def comparisons(self) -> int:
        """Pairs of arms a report compares."""
        n = len(self.subjects)
        return n * (n - 1) // 2


def design_of(experiment_id: str, expansion: Expansion) -> Design:
    """The design of an expanded experiment."""
    return Design(
        experiment_id,
        len(expansion.task_ids),
        expansion.repetitions,
        tuple(expansion.subject_ids),
    )


@dataclass(frozen=True)
class Source:
    """Where a comparison's variance figures come from."""

    name: str
    """The pair of arms ('first - second'), or 'every pair' for assumed figures."""
    components: Components
    split: VarianceSplit | None = None
    """The measured split (None for assumed figures)."""


def measured_sources(summary: RunSummary) -> tuple[list[Source], list[str]]:
    """Each pair of a finished run's arms, with its paired differences' variance split,
    in the report's order; pairs with fewer than two tasks are left out, and so are
    those whose differences do not vary (named in the second list)."""
    by_subject: dict[str, list[CellObservation]] = {}
    for observation in observations(summary):
        by_subject.setdefault(observation.subject_id, []).append(observation)
    subjects = list(by_subject)
    found, constant = [], []
    for i, first in enumerate(subjects):
        for second in subjects[i + 1 :]:
            matched = match(by_subject[first], by_subject[second])
            split = variance_split(matched.tasks, matched.differences)
            if split is None or split.tasks < 2:
                continue
            name = f"{first} \u2212 {second}"
            within = split.within or 0.0
            if split.between + within <= 0:
                constant.append(name)
                continue
            found.append(Source(name, Components(split.between, within), split))
    return found, constant


@dataclass(frozen=True)
class Detectable:
    """What one comparison can detect in a design."""

    source: Source
    standard_error: float
    difference: float
    """Smallest detectable difference at alpha."""
    difference_adjusted: float | None
    """The same at alpha / comparisons (None for a single comparison)."""


def detectable(
    design: Design, sources: Sequence[Source], *, alpha: float, power: float
) -> list[Detectable]:
    """The smallest difference each comparison detects in `design`."""
    m = design.comparisons
    rows = []
    for source in sources:
        c = source.components
        rows.append(
            Detectable(
                source,
                c.variance(design.tasks, design.repetitions) ** 0.5,
                detectable_difference(
                    c, design.tasks, design.repetitions, alpha=alpha, power=power
                ),
                detectable_difference(
                    c, design.tasks, design.repetitions, alpha=alpha / m, power=power
                )
                if m > 1
                else None,
            )
        )
    return rows


def hardest(design: Design, sources: Sequence[Source]) -> Source:
    """The comparison whose difference varies most in `design` (it needs the most)."""
    return max(sources, key=lambda s: s.components.variance(1, design.repetitions))


@dataclass(frozen=True)
class Needed:
    """Tasks needed to detect a difference, at one repetition count."""

    repetitions: int
    tasks: int
    tasks_adjusted: int | None


def tasks_table(
    design: Design, source: Source, difference: float, *, alpha: float, power: float
) -> list[Needed]:
    """For each repetition count (REPETITION_CHOICES and the design's), the tasks that
    detect `difference`."""
    m = design.comparisons
    counts = sorted({*REPETITION_CHOICES, design.repetitions})
    c = source.components
    return [
        Needed(
            k,
            tasks_needed(c, difference, k, alpha=alpha, power=power),
            tasks_needed(c, difference, k, alpha=alpha / m, power=power) if m > 1 else None,
        )
        for k in counts
    ]


def repetitions_for(
    design: Design, source: Source, difference: float, *, alpha: float, power: float
) -> tuple[int | None, int | None]:
    """Repetitions of the design's tasks that detect `difference`, at alpha and at
    alpha / comparisons (None: no count does; the second None too for one comparison)."""
    m = design.comparisons
    c = source.components
    at_alpha = repetitions_needed(c, difference, design.tasks, alpha=alpha, power=power)
    if m < 2:
        return at_alpha, None
    return at_alpha, repetitions_needed(c, difference, design.tasks, alpha=alpha / m, power=power)
