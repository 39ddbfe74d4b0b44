"""The result contract: one kernel format, parsed strictly, bounded for a termination message."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.artifacts import CHUNK, Redactor, _redact_stream
from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import (
    KERNEL_FORMAT,
    MAX_KERNEL_BYTES,
    RELAY_BUDGET_BYTES,
    ArtifactEntry,
    ResultKernel,
)
from maka_eval.contract.record import RECORD_FORMAT, AttemptRecord
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage

SHA = "ab" * 32
S = AttemptStatus


def kernel(**changes) -> ResultKernel:
    base = {
        "status": S.COMPLETED,
        "score": 1.0,
        "usage": Usage(10, 2, 0, 5),
        "cost_usd": 0.01,
        "duration_sec": 1.5,
        "artifacts": (ArtifactEntry("subject.stdout", 12, SHA),),
        "status_source": StatusSource.FRAME,
        "metrics": {"reward": 1.0, "tests_passed": 7.0},
    }
    base.update(changes)
    return ResultKernel(**base)


def test_round_trip_through_the_wire_form():
    k = kernel(artifacts=(ArtifactEntry("subject.stdout", 12, SHA, truncated=True),))
    text = k.to_json()
    assert json.loads(text)["format"] == KERNEL_FORMAT
    assert ResultKernel.from_json(text) == k
    assert ResultKernel.from_json(text.encode()) == k
    assert ResultKernel.from_dict(k.to_dict()) == k


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="maka.eval.kernel.v0"), "format"),
        (lambda d: d.update(extra=1), "unknown field"),
        (lambda d: d.update(status="winning"), "status"),
        (lambda d: d.update(score=None), "must have a score"),
        (lambda d: d.update(status="infra_failed"), "has no score"),
        (lambda d: d.update(score=float("nan")), "finite"),
        (lambda d: d.update(score=True), "finite"),
        (lambda d: d.update(costUsd=-1), "at least 0"),
        (lambda d: d.update(exitCode=3), "exitCode"),
        (lambda d: d["artifacts"][0].update(sha256="x" * 64), "hex"),
        (lambda d: d["artifacts"][0].update(name="../../etc/passwd"), "relative path"),
        (lambda d: d["artifacts"].append(dict(d["artifacts"][0])), "unique"),
        (lambda d: d["usage"].update(inputTokens=-1), "usage"),
        (lambda d: d.update(reason="x" * 401), "reason"),
        (lambda d: d.update(metrics={"m": "1"}), "metrics.m"),
    ],
)
def test_malformed_kernels_are_refused_with_the_field_named(mutate, message):
    data = kernel().to_dict()
    mutate(data)
    with pytest.raises(ContractError, match=message):
        ResultKernel.from_json(json.dumps(data))


def test_the_exit_code_is_kept_only_when_it_decided():
    k = kernel(status_source=StatusSource.EXIT_CODE, exit_code=0)
    assert ResultKernel.from_json(k.to_json()).exit_code == 0
    with pytest.raises(ContractError, match="exitCode"):
        kernel(status_source=StatusSource.EXIT_CODE)


def test_size_bound_and_fitting():
    many = tuple(ArtifactEntry(f"logs/file-{i:03d}.txt", i, SHA) for i in range(60))
    big = kernel(artifacts=many)
    with pytest.raises(ContractError, match="larger than 4096"):
        big.to_json()
    fitted = big.fitted()
    assert len(fitted.to_json().encode()) <= RELAY_BUDGET_BYTES
    assert fitted.artifacts_omitted == 60 - len(fitted.artifacts) > 0
    assert ResultKernel.from_json(fitted.to_json()) == fitted
    with pytest.raises(ContractError, match="larger than"):
        ResultKernel.from_json(" " * (MAX_KERNEL_BYTES + 1))


def test_duplicate_keys_are_refused():
    text = kernel().to_json()
    with pytest.raises(ContractError, match="duplicate key"):
        ResultKernel.from_json(text[:-1] + ',"score":0.0}')


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_the_parser_never_crashes(data):
    with contextlib.suppress(ContractError):
        ResultKernel.from_json(data)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=12), children, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_json_value_is_either_a_kernel_or_a_contract_error(value):
    with contextlib.suppress(ContractError):
        ResultKernel.from_dict(value)


def record(**changes) -> AttemptRecord:
    now = datetime.now(tz=UTC)
    base = {
        "run_id": "run-1",
        "experiment_id": "e",
        "cell_id": "t::1::s",
        "task_id": "t",
        "repetition": 1,
        "subject_id": "s",
        "attempt": 1,
        "attempt_id": "run-1/t::1::s/1",
        "trigger": Trigger.SCHEDULED,
        "started_at": now,
        "subject_started_at": None,
        "finished_at": now,
        "result": kernel(),
    }
    base.update(changes)
    return AttemptRecord(**base)


def test_the_record_is_the_kernel_plus_identity():
    r = record(request="cli-1")
    data = json.loads(r.to_json_bytes())
    assert data["format"] == RECORD_FORMAT and data["result"] == r.result.to_dict()
    assert AttemptRecord.from_json(r.to_json_bytes()) == r


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(cellId="t::2::s"), "does not match"),
        (lambda d: d.update(trigger="whenever"), "trigger"),
        (lambda d: d.update(startedAt="yesterday"), "ISO 8601"),
        (lambda d: d.update(startedAt="2026-01-01T00:00:00"), "time zone"),
        (lambda d: d.update(format="maka.eval.attempt.v1"), "older maka-eval"),
        (lambda d: d["result"].update(status="completed", score=None), "result"),
    ],
)
def test_malformed_records_are_refused(mutate, message):
    data = json.loads(record().to_json_bytes())
    mutate(data)
    with pytest.raises(ContractError, match=message):
        AttemptRecord.from_json(json.dumps(data))


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=4, max_size=40
    ),
    before=st.binary(max_size=3 * CHUNK),
    after=st.binary(max_size=200),
)
def test_redaction_catches_a_value_wherever_it_falls_across_chunks(secret, before, after):
    redactor = Redactor.of({"KEY": secret})
    data = before + secret.encode() + after
    out = io.BytesIO()
    _redact_stream(io.BytesIO(data), out, redactor.replacements)
    assert secret.encode() not in out.getvalue()
    assert b"[redacted:KEY]" in out.getvalue()
    assert secret not in redactor.text(data.decode(errors="replace") + secret)


def test_redaction_also_catches_the_json_escaped_form():
    secret = 'a"b\\c-0123'
    redactor = Redactor.of({"KEY": secret})
    assert secret not in redactor.text(json.dumps({"k": secret}))
    assert json.dumps(secret)[1:-1] not in redactor.text(json.dumps({"k": secret}))
