"""What one attempt produced: the evidence the relay gathered and the result kernel.

The kernel (maka_eval.contract.kernel) is built here, by the relay, with the artifacts
already redacted and digested, so every executor records exactly what the relay
decided: in-process locally, from the termination message in a pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from maka_eval.artifacts import Redactor
from maka_eval.contract.kernel import (
    MAX_NOTES,
    NOTE_LIMIT,
    REASON_LIMIT,
    ArtifactEntry,
    ResultKernel,
)
from maka_eval.engine.classify import Classification, Execution, Frame, Verification
from maka_eval.printable import visible


@dataclass(frozen=True)
class AttemptOutcome:
    """Everything the relay observed and decided for one attempt."""

    classification: Classification
    execution: Execution
    frame: Frame
    verification: Verification
    artifacts: tuple[ArtifactEntry, ...]
    started_at: float
    finished_at: float
    subject_started_at: float | None
    timings: Mapping[str, float]
    kernel: ResultKernel

    @property
    def duration_sec(self) -> float:
        """The subject's execution time (the kernel's duration)."""
        return self.timings.get("subjectSec", 0.0)


def build_kernel(
    classification: Classification,
    verification: Verification,
    duration_sec: float,
    artifacts: tuple[ArtifactEntry, ...],
    redactor: Redactor,
    isolation: str | None = None,
    notes: tuple[str, ...] = (),
) -> ResultKernel:
    """The result kernel: every string redacted and made printable (a reason or a note may
    quote what the subject wrote: maka_eval.printable.visible), evidence of suspected
    tampering or misreporting first among the notes a kernel keeps, fitted to the relay's
    share of the bound."""
    c = classification
    reason = visible(redactor.text(c.reason or ""))[:REASON_LIMIT] or None
    evidence = sorted(notes, key=lambda note: not note.startswith("suspected "))
    metrics = {
        redactor.text(name)[:64]: value for name, value in verification.metrics.items() if name
    }
    return ResultKernel(
        status=c.status,
        score=c.score,
        usage=c.usage,
        cost_usd=c.cost_usd,
        duration_sec=round(max(duration_sec, 0.0), 6),
        artifacts=artifacts,
        status_source=c.source,
        reason=reason,
        exit_code=c.exit_code,
        metrics=dict(list(metrics.items())[:32]),
        isolation=isolation,
        notes=tuple(visible(redactor.text(n))[:NOTE_LIMIT] for n in evidence[:MAX_NOTES]),
    ).fitted()
