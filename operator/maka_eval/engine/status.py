"""Attempt statuses and which of them are results."""

from __future__ import annotations

from enum import StrEnum


class AttemptStatus(StrEnum):
    """How one attempt of a cell ended."""

    COMPLETED = "completed"
    """The subject finished on its own and reported success; the verifier scored it."""
    SUBJECT_FAILED = "subject_failed"
    """The subject failed, was cut off by the framework timeout, or stopped after doing
    model work without a result frame; the verifier's reward is kept."""
    INFRA_FAILED = "infra_failed"
    """The infrastructure failed (relay, executor, verifier without a reward): not a
    result, retried by appending a replacement attempt."""
    CANCELLED = "cancelled"
    """The run was stopped while the attempt ran; not a result, run again on resume."""

    @property
    def is_result(self) -> bool:
        """Whether an attempt with this status can be selected as the cell's result."""
        return self in RESULT_STATUSES


RESULT_STATUSES = frozenset({AttemptStatus.COMPLETED, AttemptStatus.SUBJECT_FAILED})


class SubjectStatus(StrEnum):
    """What a subject says about itself in a protocol-v1 result frame."""

    COMPLETED = "completed"
    SUBJECT_FAILED = "subject_failed"


class StatusSource(StrEnum):
    """Which evidence decided an attempt's status (recorded next to it)."""

    FRAME = "frame"
    EXIT_CODE = "exit-code"
    TIMEOUT = "timeout"
    ADMITTED_WORK = "admitted-work"
    VERIFIER = "verifier"
    INFRASTRUCTURE = "infrastructure"
    CANCELLATION = "cancellation"
    HOST = "host"
    """The machine ran out of something the run needs (a full disk): the run stops."""
    TAMPERING = "tampering"
    """The subject changed what the verifier runs on (its shell, interpreter, loader or
    libraries): the verifier's word cannot be trusted, the attempt is a failure."""


class Trigger(StrEnum):
    """Why an attempt was started (recorded with it)."""

    SCHEDULED = "scheduled"
    """The schedule gave the cell an attempt: its first, or again after a cancellation."""
    RETRY = "retry"
    """An automatic replacement after an infrastructure failure."""
    MANUAL = "manual"
    """Asked for by the user (`--cell`, or the rerun annotation on a cluster)."""
