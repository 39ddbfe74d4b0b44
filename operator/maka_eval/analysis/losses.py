"""What the infrastructure lost, per arm, and a warning when arms lost differently.

Loss is not random: an attempt is likelier to be lost the longer it lives and the more
requests it makes, so an arm that loses more cells than another has lost its hardest
(or most expensive) cases, and even the re-paired comparison then covers a different
task mix than the experiment asked for.

The rule, stated plainly: for every compared pair of arms, the share of started cells
left without a result is compared; whenever the two shares differ, a warning names both
counts, with the two-sided Fisher exact p-value of the 2x2 table (without / with a
result, per arm) so a reader can tell a difference chance would often produce from one
it would not. Below p = 0.05 the warning says the difference is significant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from maka_eval.analysis.observations import CellObservation
from maka_eval.analysis.statistics import fisher_exact
from maka_eval.engine.selection import CellState

SIGNIFICANT = 0.05

# Columns of the observations, read in C (an arm has 10,000s of cells).
_STATE = attrgetter("state")
_ATTEMPTS = attrgetter("attempts")
_INFRA_FAILED = attrgetter("infra_failed")
_CANCELLED = attrgetter("cancelled")
_INTERRUPTED = attrgetter("interrupted")


@dataclass(frozen=True)
class ArmLoss:
    """An arm's cells and attempts by what became of them."""

    arm: str
    cells: int
    started: int
    """Cells with at least one attempt (recorded or interrupted)."""
    with_result: int
    without_result: int
    """Started cells that have no result (yet, in a run still going)."""
    exhausted: int
    """...of which out of infrastructure retries: they run again only when asked."""
    not_started: int
    attempts: int
    infra_failed: int
    cancelled: int
    interrupted: int
    retried_to_result: int
    """Cells whose result came after one or more lost attempts."""

    @property
    def lost_attempts(self) -> int:
        return self.infra_failed + self.cancelled + self.interrupted

    @property
    def loss_rate(self) -> float | None:
        """Share of started cells without a result."""
        return self.without_result / self.started if self.started else None


def arm_loss(arm: str, cells: Sequence[CellObservation]) -> ArmLoss:
    """Count an arm's losses."""
    # An arm has 10,000s of cells: the observations' properties (`started`, `has_result`,
    # `lost_attempts`) are inlined.
    started = [c for c in cells if c.attempts > 0 or c.interrupted > 0]
    with_result = [c for c in cells if c.score is not None]
    return ArmLoss(
        arm=arm,
        cells=len(cells),
        started=len(started),
        with_result=len(with_result),
        without_result=sum(1 for c in started if c.score is None),
        exhausted=list(map(_STATE, cells)).count(CellState.EXHAUSTED),
        not_started=len(cells) - len(started),
        attempts=sum(map(_ATTEMPTS, cells)),
        infra_failed=sum(map(_INFRA_FAILED, cells)),
        cancelled=sum(map(_CANCELLED, cells)),
        interrupted=sum(map(_INTERRUPTED, cells)),
        retried_to_result=sum(
            1 for c in with_result if c.infra_failed or c.cancelled or c.interrupted
        ),
    )


@dataclass(frozen=True)
class LossWarning:
    """Two arms lost different shares of their started cells."""

    first: str
    second: str
    p_value: float

    def message(self, first: ArmLoss, second: ArmLoss) -> str:
        verdict = "significantly " if self.p_value < SIGNIFICANT else ""
        return (
            f"{first.arm} and {second.arm} lost {verdict}different shares of their started "
            f"cells ({first.without_result}/{first.started} vs "
            f"{second.without_result}/{second.started}, Fisher exact p = {self.p_value:.3g}); "
            "loss is not random, so the arms' surviving cells are different task mixes"
        )


def loss_warning(first: ArmLoss, second: ArmLoss) -> LossWarning | None:
    """A warning when the two arms' shares of started cells without a result differ."""
    if first.started == 0 or second.started == 0:
        return None
    if first.without_result * second.started == second.without_result * first.started:
        return None
    p = fisher_exact(
        first.without_result, first.with_result, second.without_result, second.with_result
    )
    return LossWarning(first.arm, second.arm, p)
