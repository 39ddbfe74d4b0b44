"""What one attempt produced, and its result kernel.

The kernel is all a result is: score, normalized usage, attributable cost, duration,
status and artifacts (name, bytes, sha256). In a pod it travels in the termination
message, so it is bounded well under 4 KiB.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from maka_eval.artifacts import ArtifactDigest
from maka_eval.engine.classify import Classification, Execution, Frame, Verification

KERNEL_LIMIT_BYTES = 3 * 1024
REASON_LIMIT = 400


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


def kernel(
    outcome: AttemptOutcome, digests: Sequence[tuple[str, ArtifactDigest]]
) -> dict[str, Any]:
    """The result kernel (plus the reason and status source), bounded for a pod."""
    c = outcome.classification
    body: dict[str, Any] = {
        "status": c.status.value,
        "score": c.score,
        "usage": c.usage.to_json() if c.usage else None,
        "costUsd": c.cost_usd,
        "durationSec": round(outcome.duration_sec, 6),
        "artifacts": [{"name": n, "bytes": d.bytes, "sha256": d.sha256} for n, d in digests],
        "statusSource": c.source.value,
        "reason": (c.reason or "")[:REASON_LIMIT] or None,
    }
    if c.exit_code is not None:
        body["exitCode"] = c.exit_code
    while len(json.dumps(body)) > KERNEL_LIMIT_BYTES and body["artifacts"]:
        body["artifacts"].pop()
        body["artifactsTruncated"] = True
    return body


def kernel_json(body: Mapping[str, Any]) -> str:
    """Compact JSON for the termination message."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True)
