"""The status rules (DESIGN.md section 2): what an attempt's evidence makes of it.

This is the one place these rules live. The relay collects the evidence (how the
execution ended, the result frame, the verifier's reward, metered model work) and calls
`classify`; nothing else decides a status.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from maka_eval.engine.status import AttemptStatus, StatusSource, SubjectStatus
from maka_eval.engine.usage import Usage


class ResultContract(StrEnum):
    """How a subject reports its result."""

    EXIT_CODE = "exit-code"
    PROTOCOL_V1 = "protocol-v1"


class ExecutionEnd(StrEnum):
    """How the subject's execution ended, as the relay observed it."""

    EXITED = "exited"
    """The subject exited on its own."""
    TIMED_OUT = "timed_out"
    """The framework timeout cut it off (the relay quiesced it)."""
    CANCELLED = "cancelled"
    """The run was cancelled while it ran (the relay quiesced it)."""
    THREW = "threw"
    """The execution call itself failed: the relay, the executor or the host."""


@dataclass(frozen=True)
class Execution:
    """How the execution ended."""

    end: ExecutionEnd
    exit_code: int | None = None
    error: str | None = None
    timeout_sec: float | None = None


class FrameState(StrEnum):
    """What the relay found on the result-frame channel."""

    NOT_EXPECTED = "not_expected"
    ABSENT = "absent"
    VALID = "valid"
    MALFORMED = "malformed"
    OVERSIZED = "oversized"


@dataclass(frozen=True)
class Frame:
    """A protocol-v1 result frame as read (status and usage only when VALID)."""

    state: FrameState
    status: SubjectStatus | None = None
    usage: Usage | None = None
    cost_usd: float | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.state is FrameState.VALID


NO_FRAME = Frame(FrameState.NOT_EXPECTED)


@dataclass(frozen=True)
class Verification:
    """The verifier's outcome: a score, or why there is none."""

    score: float | None
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Every value the verifier reported (reward.json), the score among them."""


NOT_VERIFIED = Verification(None, "the verifier did not run")


@dataclass(frozen=True)
class MeteredWork:
    """Model work a metering proxy observed (provider-usage checkpoint)."""

    admitted_requests: int
    usage: Usage | None = None
    cost_usd: float | None = None
    complete: bool = True
    """False when the figure is a lower bound (the proxy had not settled, a request was
    in flight, or an admitted response carried no usage): its cost is then unknown."""


@dataclass(frozen=True)
class Classification:
    """The recorded outcome of one attempt."""

    status: AttemptStatus
    score: float | None
    usage: Usage | None
    cost_usd: float | None
    source: StatusSource
    reason: str | None = None
    exit_code: int | None = None
    """Recorded only when the exit code decided the status, so the record can never hold
    a frame status and an exit code that say different things."""


def _attributed(frame: Frame, metered: MeteredWork | None) -> tuple[Usage | None, float | None]:
    """Usage and cost to record: a self-reported figure never outranks a meter.

    Where the egress proxy metered the cell (a signed checkpoint that verifies and saw a
    model request), its figure is the attempt's, whatever a valid frame says: its tokens
    even when they are only a lower bound (a subject that reports fewer is certainly
    wrong; one that reports more cannot be checked, and a self-report must not reach the
    shared budget unchecked), its cost only when the figure is complete (a cost derived
    from a lower bound would read as a settled one). Otherwise a valid frame's own
    (bounded) figures, else nothing. `self_report` says what the record keeps of the
    frame's figures next to the meter's."""
    if metered is not None and metered.usage is not None:
        return metered.usage, metered.cost_usd if metered.complete else None
    if frame.valid and (frame.usage is not None or frame.cost_usd is not None):
        return frame.usage, frame.cost_usd
    return None, None


COST_TOLERANCE_USD = 1e-4
"""A reported cost this close to the metered one agrees with it (the four decimals a
table shows: a subject may round its figure so)."""
COST_RELATIVE_TOLERANCE = 1e-3
"""... or this close relative to the metered cost (prices rounded differently)."""


def _counts(usage: Usage) -> tuple[int, int, int, int]:
    return (
        usage.input_tokens,
        usage.cached_input_tokens,
        usage.cache_write_tokens,
        usage.output_tokens,
    )


def _tokens(usage: Usage, split: bool) -> str:
    detail = " (input/cached/cache write/output " + "/".join(f"{n:,}" for n in _counts(usage))
    return f"{usage.total_tokens:,} tokens" + (detail + ")" if split else "")


def _usd(cost: float | None) -> str:
    return "no cost" if cost is None else f"${cost:,.4f}"


def self_report(frame: Frame, metered: MeteredWork | None) -> str | None:
    """A note keeping a valid frame's own figures beside the metered ones that outrank
    them (`_attributed`), or None when the frame reported none or they agree.

    It begins "suspected misreport" when the two disagree beyond rounding: reported
    tokens that differ from a complete figure or fall short of a lower bound in any
    count, a reported cost away from a metered one. Reporting more than a lower bound, or
    a cost where the meter has none, cannot be checked: it is only kept beside."""
    if not frame.valid or metered is None or metered.usage is None:
        return None
    meter = metered.usage
    suspect = False
    reported: list[str] = []
    measured: list[str] = []
    if frame.usage is not None and frame.usage != meter:
        short = any(a < b for a, b in zip(_counts(frame.usage), _counts(meter), strict=True))
        suspect = metered.complete or short
        split = frame.usage.total_tokens == meter.total_tokens  # then say how it differs
        reported.append(_tokens(frame.usage, split))
        measured.append(("" if metered.complete else "at least ") + _tokens(meter, split))
    if frame.cost_usd is not None:
        cost = metered.cost_usd if metered.complete else None
        if cost is None:
            reported.append(_usd(frame.cost_usd))
            measured.append("no cost")
        elif not math.isclose(
            frame.cost_usd, cost, rel_tol=COST_RELATIVE_TOLERANCE, abs_tol=COST_TOLERANCE_USD
        ):
            suspect = True
            reported.append(_usd(frame.cost_usd))
            measured.append(_usd(cost))
    if not reported:
        return None
    said, found = " and ".join(reported), " and ".join(measured)
    if suspect:
        return f"suspected misreport: the subject reported {said}, the proxy metered {found}"
    return f"the subject reported {said}; the record holds the proxy's figure, {found}"


def _frame_problem(frame: Frame) -> str:
    if frame.state is FrameState.ABSENT:
        return "the result frame is missing"
    if frame.state is FrameState.OVERSIZED:
        return f"the result frame is oversized ({frame.error})"
    return f"the result frame is malformed ({frame.error})"


def _by_exit_code(
    exit_code: int | None, score: float, usage: Usage | None, cost: float | None
) -> Classification:
    """Exit 0 means completed; the code is recorded because it decided the status."""
    if exit_code == 0:
        return Classification(
            AttemptStatus.COMPLETED, score, usage, cost, StatusSource.EXIT_CODE, None, 0
        )
    return Classification(
        AttemptStatus.SUBJECT_FAILED,
        score,
        usage,
        cost,
        StatusSource.EXIT_CODE,
        f"the subject exited with code {exit_code}",
        exit_code,
    )


def classify(
    contract: ResultContract,
    execution: Execution,
    frame: Frame = NO_FRAME,
    verification: Verification = NOT_VERIFIED,
    metered: MeteredWork | None = None,
    disk_full: str | None = None,
    tampered: str | None = None,
) -> Classification:
    """Apply the status rules to one attempt's evidence.

    `tampered` says what the subject changed of the verifier's own start-up (its shell,
    interpreter chain, loader, libraries): whatever the verifier then said, the attempt
    is the subject's failure with score 0, never an infrastructure failure to retry (a
    subject that breaks the verifier on purpose must not earn another try).

    `disk_full` names a folder the attempt needed whose file system was full when the
    attempt ended: whatever else happened, that is neither the subject's failure nor
    an infrastructure failure to spend a retry on. The attempt is recorded as cancelled
    (it runs again on resume) and the run stops.
    """
    usage, cost = _attributed(frame, metered)

    if disk_full is not None:
        return Classification(
            AttemptStatus.CANCELLED,
            None,
            usage,
            cost,
            StatusSource.HOST,
            f"the file system holding {disk_full} is full; the run stops and this cell "
            "runs again on resume",
        )
    if execution.end is ExecutionEnd.CANCELLED:
        return Classification(
            AttemptStatus.CANCELLED,
            None,
            usage,
            cost,
            StatusSource.CANCELLATION,
            "the run was cancelled while the attempt ran",
        )
    if tampered is not None:
        return Classification(
            AttemptStatus.SUBJECT_FAILED,
            0.0,
            usage,
            cost,
            StatusSource.TAMPERING,
            f"the subject changed what the verifier runs on: {tampered}",
        )
    if execution.end is ExecutionEnd.THREW:
        # Admitted work stays attributed, but an infrastructure failure is never a zero.
        return Classification(
            AttemptStatus.INFRA_FAILED,
            None,
            usage,
            cost,
            StatusSource.INFRASTRUCTURE,
            f"the execution failed: {execution.error or 'unknown error'}",
        )
    if verification.score is None:
        return Classification(
            AttemptStatus.INFRA_FAILED,
            None,
            usage,
            cost,
            StatusSource.VERIFIER,
            f"the verifier produced no reward: {verification.error or 'unknown reason'}",
        )
    score = verification.score
    if execution.end is ExecutionEnd.TIMED_OUT:
        limit = f" after {execution.timeout_sec:g}s" if execution.timeout_sec else ""
        return Classification(
            AttemptStatus.SUBJECT_FAILED,
            score,
            usage,
            cost,
            StatusSource.TIMEOUT,
            f"the framework timeout cut the subject off{limit}",
        )

    if contract is ResultContract.EXIT_CODE:
        return _by_exit_code(execution.exit_code, score, usage, cost)

    if frame.valid:
        if frame.status is not None:
            status = AttemptStatus(frame.status.value)
            reason = (
                None
                if status is AttemptStatus.COMPLETED
                else ("the subject reported subject_failed")
            )
            return Classification(status, score, usage, cost, StatusSource.FRAME, reason)
        return _by_exit_code(execution.exit_code, score, usage, cost)

    # The execution returned but the frame is unusable: the evidence decides.
    problem = _frame_problem(frame)
    if metered is not None and metered.admitted_requests > 0:
        bound = "" if metered.complete else " (its usage is a lower bound)"
        return Classification(
            AttemptStatus.SUBJECT_FAILED,
            score,
            usage,
            cost,
            StatusSource.ADMITTED_WORK,
            f"{problem} after {metered.admitted_requests} admitted model request(s)"
            f"{bound}; recorded as a failure, not retried at the same cost",
        )
    return Classification(
        AttemptStatus.INFRA_FAILED,
        None,
        usage,
        cost,
        StatusSource.INFRASTRUCTURE,
        f"{problem} and no admitted model work is on record",
    )
