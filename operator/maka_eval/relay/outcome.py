"""What one attempt produced, and its result kernel.

The kernel is all a result is: score, normalized usage, attributable cost, duration,
status and artifacts (name, bytes, sha256). In a pod it travels in the termination
message, so it is bounded well under 4 KiB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maka_eval.artifacts import ArtifactDigest
from maka_eval.contract.kernel import REASON_LIMIT, ArtifactEntry, ResultKernel
from maka_eval.engine.classify import Classification, Execution, Frame, Verification


@dataclass(frozen=True)
class ArtifactFile:
    """An artifact the relay left in the attempt directory."""

    name: str
    path: str


@dataclass(frozen=True)
class AttemptOutcome:
    """Everything the relay observed and decided for one attempt."""

    classification: Classification
    execution: Execution
    frame: Frame
    verification: Verification
    artifacts: tuple[ArtifactFile, ...]
    started_at: float
    finished_at: float
    subject_started_at: float | None
    timings: Mapping[str, float]
    credential_values: Mapping[str, str] = field(default_factory=dict, repr=False)
    """name -> value of the credentials the subject got, so artifacts can be redacted.
    Held in memory only; never serialized."""

    @property
    def duration_sec(self) -> float:
        """The subject's execution time (the kernel's duration)."""
        return self.timings.get("subjectSec", 0.0)


def kernel(outcome: AttemptOutcome, digests: Sequence[tuple[str, ArtifactDigest]]) -> ResultKernel:
    """The result kernel of an attempt, fitted to the relay's share of the bound."""
    c = outcome.classification
    return ResultKernel(
        status=c.status,
        score=c.score,
        usage=c.usage,
        cost_usd=c.cost_usd,
        duration_sec=round(outcome.duration_sec, 6),
        artifacts=tuple(ArtifactEntry(n, d.bytes, d.sha256) for n, d in digests),
        status_source=c.source,
        reason=(c.reason or "")[:REASON_LIMIT] or None,
        exit_code=c.exit_code,
    ).fitted()
