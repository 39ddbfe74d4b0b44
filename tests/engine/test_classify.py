"""Every row of the status rules (DESIGN.md section 2), table-driven."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine.classify import (
    COST_RELATIVE_TOLERANCE,
    COST_TOLERANCE_USD,
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
    self_report,
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


def test_a_meter_outranks_a_valid_frames_figures():
    """The frame's status still decides; its usage and cost do not, where a meter ran."""
    result = classify(V1, exited(0), frame(SubjectStatus.COMPLETED), REWARD, WORK)
    assert result.status is AttemptStatus.COMPLETED and result.source is StatusSource.FRAME
    assert result.usage == WORK.usage and result.cost_usd == WORK.cost_usd


def test_a_lower_bound_still_outranks_a_frame_but_has_no_cost():
    """Tokens from the meter even when they are a lower bound; cost only from a
    complete figure, so none at all (not the frame's)."""
    result = classify(V1, exited(0), frame(SubjectStatus.COMPLETED), REWARD, PARTIAL_WORK)
    assert result.usage == PARTIAL_WORK.usage and result.cost_usd is None


def test_a_frame_counts_where_no_meter_has_a_figure():
    for metered in (None, NO_WORK):  # NO_WORK: MeteredWork without a figure
        result = classify(V1, exited(0), frame(SubjectStatus.COMPLETED), REWARD, metered)
        assert result.usage == USAGE and result.cost_usd == 0.002


METERED = MeteredWork(admitted_requests=2, usage=Usage(1000, 200, 0, 345), cost_usd=0.0066)
LOWER = replace(METERED, cost_usd=None, complete=False)


def valid(usage: Usage | None, cost: float | None) -> Frame:
    return Frame(FrameState.VALID, SubjectStatus.COMPLETED, usage, cost)


@pytest.mark.parametrize(
    ("reported", "metered", "note"),
    [
        # agrees (cost within rounding: four decimals): nothing to keep beside
        (valid(Usage(1000, 200, 0, 345), 0.0066), METERED, None),
        (valid(Usage(1000, 200, 0, 345), 0.00664), METERED, None),
        (valid(Usage(1000, 200, 0, 345), None), METERED, None),
        (valid(Usage(1000, 200, 0, 345), None), LOWER, None),
        # under-reported
        (
            valid(Usage(), 0.0),
            METERED,
            "suspected misreport: the subject reported 0 tokens and $0.0000, the proxy "
            "metered 1,545 tokens and $0.0066",
        ),
        (
            valid(None, 0.0),
            METERED,
            "suspected misreport: the subject reported $0.0000, the proxy metered $0.0066",
        ),
        # over-reported
        (
            valid(Usage(10**10), 1e5),
            METERED,
            "suspected misreport: the subject reported 10,000,000,000 tokens and "
            "$100,000.0000, the proxy metered 1,545 tokens and $0.0066",
        ),
        # the same total, split differently (cached input counted as input)
        (
            valid(Usage(1200, 0, 0, 345), None),
            METERED,
            "suspected misreport: the subject reported 1,545 tokens (input/cached/cache "
            "write/output 1,200/0/0/345), the proxy metered 1,545 tokens (input/cached/"
            "cache write/output 1,000/200/0/345)",
        ),
        # a lower bound: fewer in any count is certainly wrong ...
        (
            valid(Usage(5000, 0, 0, 5000), None),
            LOWER,
            "suspected misreport: the subject reported 10,000 tokens, the proxy metered "
            "at least 1,545 tokens",
        ),
        # ... more in every count cannot be checked: kept beside, the meter's recorded
        (
            valid(Usage(5000, 200, 0, 5000), 0.05),
            LOWER,
            "the subject reported 10,200 tokens and $0.0500; the record holds the proxy's "
            "figure, at least 1,545 tokens and no cost",
        ),
        # a cost where the meter has none (no prices)
        (
            valid(None, 0.25),
            replace(METERED, cost_usd=None),
            "the subject reported $0.2500; the record holds the proxy's figure, no cost",
        ),
        # no figure in the frame, no valid frame, no meter, a meter without a figure
        (valid(None, None), METERED, None),
        (Frame(FrameState.MALFORMED, error="x"), METERED, None),
        (Frame(FrameState.ABSENT), METERED, None),
        (valid(Usage(), 0.0), None, None),
        (valid(Usage(), 0.0), NO_WORK, None),
    ],
)
def test_the_frames_own_figures_are_kept_beside_the_meters(reported, metered, note):
    assert self_report(reported, metered) == note
    result = classify(V1, exited(0), reported, REWARD, metered)
    if note is not None:  # whenever there is something to say, the meter was recorded
        assert metered is not None
        assert result.usage == metered.usage
        assert result.cost_usd == (metered.cost_usd if metered.complete else None)


_counts = st.integers(min_value=0, max_value=10**6)
_usages = st.builds(Usage, _counts, _counts, _counts, _counts)


@given(
    _usages,
    st.none() | st.floats(min_value=0, max_value=10),
    _usages,
    st.none() | st.floats(min_value=0, max_value=10),
    st.booleans(),
)
def test_a_misreport_is_suspected_exactly_when_the_figures_contradict_the_meter(
    usage, cost, metered_usage, metered_cost, complete
):
    metered = MeteredWork(3, metered_usage, metered_cost if complete else None, complete)
    note = self_report(valid(usage, cost), metered)
    pairs = list(
        zip(
            (
                usage.input_tokens,
                usage.cached_input_tokens,
                usage.cache_write_tokens,
                usage.output_tokens,
            ),
            (
                metered_usage.input_tokens,
                metered_usage.cached_input_tokens,
                metered_usage.cache_write_tokens,
                metered_usage.output_tokens,
            ),
            strict=True,
        )
    )
    tokens_wrong = usage != metered_usage if complete else any(a < b for a, b in pairs)
    cost_wrong = (
        complete
        and cost is not None
        and metered_cost is not None
        and not math.isclose(
            cost, metered_cost, rel_tol=COST_RELATIVE_TOLERANCE, abs_tol=COST_TOLERANCE_USD
        )
    )
    assert (note is not None and note.startswith("suspected misreport")) == (
        tokens_wrong or cost_wrong
    )
    result = classify(V1, exited(0), valid(usage, cost), REWARD, metered)
    assert result.usage == metered_usage  # never the frame's
    assert result.cost_usd == metered.cost_usd


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
