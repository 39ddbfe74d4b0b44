"""Every row of the status rules (DESIGN.md section 2), table-driven."""

from __future__ import annotations

import pytest

from maka_eval.engine.classify import (
    NO_FRAME,
    NOT_VERIFIED,
    Execution,
    ExecutionEnd,
    Frame,
    FrameState,
    MeteredWork,
    ResultContract,
    Verification,
    classify,
)
from maka_eval.engine.status import AttemptStatus, StatusSource, SubjectStatus
from maka_eval.engine.usage import Usage

EXIT = ResultContract.EXIT_CODE
V1 = ResultContract.PROTOCOL_V1
USAGE = Usage(100, 10, 0, 20)
REWARD = Verification(0.75)
NO_REWARD = Verification(None, "neither reward.json nor reward.txt was written")
WORK = MeteredWork(admitted_requests=3, usage=Usage(500, 0, 0, 50), cost_usd=0.01)
NO_WORK = MeteredWork(admitted_requests=0)
PARTIAL_WORK = MeteredWork(
    admitted_requests=2, usage=Usage(300, 0, 0, 10), cost_usd=0.004, complete=False
)


def exited(code: int) -> Execution:
    return Execution(ExecutionEnd.EXITED, exit_code=code)


def frame(status: SubjectStatus | None = None, usage: Usage | None = USAGE) -> Frame:
    return Frame(FrameState.VALID, status, usage, 0.002 if usage else None)


S = AttemptStatus
# (name, contract, execution, frame, verification, metered, status, score, source)
ROWS = [
    (
        "exit-code: exit 0 is completed",
        EXIT,
        exited(0),
        NO_FRAME,
        REWARD,
        None,
        S.COMPLETED,
        0.75,
        StatusSource.EXIT_CODE,
    ),
    (
        "exit-code: exit 1 is subject_failed, reward kept",
        EXIT,
        exited(1),
        NO_FRAME,
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.EXIT_CODE,
    ),
    (
        "exit-code: killed by a signal is subject_failed",
        EXIT,
        exited(-9),
        NO_FRAME,
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.EXIT_CODE,
    ),
    (
        "timeout: subject_failed with the reward kept",
        EXIT,
        Execution(ExecutionEnd.TIMED_OUT, timeout_sec=900),
        NO_FRAME,
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.TIMEOUT,
    ),
    (
        "timeout overrides a frame saying completed",
        V1,
        Execution(ExecutionEnd.TIMED_OUT, timeout_sec=5),
        frame(SubjectStatus.COMPLETED),
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.TIMEOUT,
    ),
    (
        "verifier produced no reward: infra",
        EXIT,
        exited(0),
        NO_FRAME,
        NO_REWARD,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.VERIFIER,
    ),
    (
        "no reward after a timeout is still infra",
        EXIT,
        Execution(ExecutionEnd.TIMED_OUT, timeout_sec=5),
        NO_FRAME,
        NO_REWARD,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.VERIFIER,
    ),
    (
        "the verifier never ran: infra",
        EXIT,
        exited(0),
        NO_FRAME,
        NOT_VERIFIED,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.VERIFIER,
    ),
    (
        "frame status wins over the exit code (completed, exit 3)",
        V1,
        exited(3),
        frame(SubjectStatus.COMPLETED),
        REWARD,
        None,
        S.COMPLETED,
        0.75,
        StatusSource.FRAME,
    ),
    (
        "frame status wins over the exit code (failed, exit 0)",
        V1,
        exited(0),
        frame(SubjectStatus.SUBJECT_FAILED),
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.FRAME,
    ),
    (
        "frame without a status: the exit code decides (0)",
        V1,
        exited(0),
        frame(None),
        REWARD,
        None,
        S.COMPLETED,
        0.75,
        StatusSource.EXIT_CODE,
    ),
    (
        "frame without a status: the exit code decides (2)",
        V1,
        exited(2),
        frame(None),
        REWARD,
        None,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.EXIT_CODE,
    ),
    (
        "frame missing, admitted work on record: subject_failed",
        V1,
        exited(0),
        Frame(FrameState.ABSENT),
        REWARD,
        WORK,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.ADMITTED_WORK,
    ),
    (
        "frame missing, no admitted work: infra",
        V1,
        exited(0),
        Frame(FrameState.ABSENT),
        REWARD,
        NO_WORK,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "frame missing, nothing metered: infra",
        V1,
        exited(0),
        Frame(FrameState.ABSENT),
        REWARD,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "malformed frame, admitted work: subject_failed",
        V1,
        exited(0),
        Frame(FrameState.MALFORMED, error="not JSON"),
        REWARD,
        WORK,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.ADMITTED_WORK,
    ),
    (
        "malformed frame, no work: infra",
        V1,
        exited(0),
        Frame(FrameState.MALFORMED, error="not JSON"),
        REWARD,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "oversized frame, no work: infra",
        V1,
        exited(0),
        Frame(FrameState.OVERSIZED, error="more than 65536 bytes"),
        REWARD,
        None,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "frame missing, admitted work only a lower bound: still subject_failed",
        V1,
        exited(0),
        Frame(FrameState.ABSENT),
        REWARD,
        PARTIAL_WORK,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.ADMITTED_WORK,
    ),
    (
        "wrapper killed (no frame) after admitted work: subject_failed, not retried",
        V1,
        exited(-9),
        Frame(FrameState.ABSENT),
        REWARD,
        PARTIAL_WORK,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.ADMITTED_WORK,
    ),
    (
        "oversized frame, admitted work: subject_failed",
        V1,
        exited(0),
        Frame(FrameState.OVERSIZED, error="more than 65536 bytes"),
        REWARD,
        WORK,
        S.SUBJECT_FAILED,
        0.75,
        StatusSource.ADMITTED_WORK,
    ),
    (
        "execution threw after partial admitted work: still infra",
        V1,
        Execution(ExecutionEnd.THREW, error="relay died"),
        NO_FRAME,
        NOT_VERIFIED,
        PARTIAL_WORK,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "execution threw: infra",
        V1,
        Execution(ExecutionEnd.THREW, error="host died"),
        NO_FRAME,
        NOT_VERIFIED,
        WORK,
        S.INFRA_FAILED,
        None,
        StatusSource.INFRASTRUCTURE,
    ),
    (
        "cancelled: cancelled",
        EXIT,
        Execution(ExecutionEnd.CANCELLED),
        NO_FRAME,
        NOT_VERIFIED,
        None,
        S.CANCELLED,
        None,
        StatusSource.CANCELLATION,
    ),
]


@pytest.mark.parametrize(
    ("contract", "execution", "frame_", "verification", "metered", "status", "score", "source"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_status_rules(contract, execution, frame_, verification, metered, status, score, source):
    result = classify(contract, execution, frame_, verification, metered)
    assert result.status is status
    assert result.score == score
    assert result.source is source
    if status is not AttemptStatus.COMPLETED:
        assert result.reason


def test_threw_keeps_admitted_usage_attributed_but_not_a_zero():
    result = classify(V1, Execution(ExecutionEnd.THREW, error="x"), NO_FRAME, NOT_VERIFIED, WORK)
    assert result.usage == WORK.usage and result.cost_usd == WORK.cost_usd
    assert result.score is None


def test_admitted_work_usage_is_attributed_when_the_frame_is_missing():
    result = classify(V1, exited(0), Frame(FrameState.ABSENT), REWARD, WORK)
    assert result.usage == WORK.usage and result.cost_usd == 0.01


def test_exit_code_contract_records_null_usage_and_cost():
    result = classify(EXIT, exited(0), NO_FRAME, REWARD, None)
    assert result.usage is None and result.cost_usd is None


def test_frame_usage_is_recorded():
    result = classify(V1, exited(0), frame(SubjectStatus.COMPLETED), REWARD)
    assert result.usage == USAGE and result.cost_usd == 0.002


@pytest.mark.parametrize("code", [0, 1, 3, -15])
@pytest.mark.parametrize("status", [SubjectStatus.COMPLETED, SubjectStatus.SUBJECT_FAILED])
def test_frame_and_exit_code_never_disagree_in_the_record(code, status):
    """When the frame has a status, the exit code is not recorded next to it."""
    result = classify(V1, exited(code), frame(status), REWARD)
    assert result.status.value == status.value
    assert result.exit_code is None


@pytest.mark.parametrize("code", [0, 1, 7])
def test_exit_code_is_recorded_only_when_it_decided(code):
    assert classify(EXIT, exited(code), NO_FRAME, REWARD).exit_code == code
    assert classify(V1, exited(code), frame(None), REWARD).exit_code == code


def test_a_lower_bound_keeps_its_usage_but_has_no_cost():
    """A partial count is kept; a cost derived from it would read as a settled figure."""
    result = classify(V1, exited(0), Frame(FrameState.ABSENT), REWARD, PARTIAL_WORK)
    assert result.usage == PARTIAL_WORK.usage and result.cost_usd is None
    assert result.reason is not None and "lower bound" in result.reason
    threw = classify(
        V1, Execution(ExecutionEnd.THREW, error="x"), NO_FRAME, NOT_VERIFIED, PARTIAL_WORK
    )
    assert threw.usage == PARTIAL_WORK.usage and threw.cost_usd is None


def test_a_valid_frame_with_usage_wins_over_metered_work():
    result = classify(V1, exited(0), frame(SubjectStatus.COMPLETED), REWARD, PARTIAL_WORK)
    assert result.usage == USAGE and result.cost_usd == 0.002


@pytest.mark.parametrize(
    ("execution", "verification"),
    [
        (exited(0), REWARD),  # the verifier said 1: its word is worth nothing now
        (exited(0), NOT_VERIFIED),  # broke it on purpose: no retry for that
        (Execution(ExecutionEnd.TIMED_OUT, timeout_sec=5), REWARD),
        (Execution(ExecutionEnd.THREW, error="relay died"), NOT_VERIFIED),
    ],
)
def test_a_subject_that_changed_the_verifiers_tools_fails_with_zero(execution, verification):
    why = "/usr/bin/bash (modified)"
    result = classify(EXIT, execution, NO_FRAME, verification, tampered=why)
    assert result.status is AttemptStatus.SUBJECT_FAILED
    assert result.score == 0.0
    assert result.source is StatusSource.TAMPERING
    assert result.reason is not None and why in result.reason


def test_tampering_does_not_outrank_a_cancellation_or_a_full_disk():
    cancelled = classify(EXIT, Execution(ExecutionEnd.CANCELLED), tampered="/bin/sh")
    assert cancelled.status is AttemptStatus.CANCELLED
    full = classify(EXIT, exited(0), NO_FRAME, REWARD, disk_full="/x", tampered="/bin/sh")
    assert full.status is AttemptStatus.CANCELLED
