"""The store's fast record reader accepts only what the field-by-field reader accepts.

A report reads 100,000 records through `plain_record` (and `plain_kernel`), which build
their objects without the dataclass constructors. Whatever the input, each either
declines it (None: the full reader then reads or refuses it, naming the field) or
returns exactly what `from_fields` returns, field for field and type for type.
"""

from __future__ import annotations

import copy
import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ArtifactEntry, ResultKernel, plain_kernel
from maka_eval.contract.record import AttemptRecord, plain_record
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage

SHA = "ab" * 32
T0 = datetime(2026, 1, 5, 9, tzinfo=UTC)


def _record(**changes: Any) -> AttemptRecord:
    kernel = {
        "status": AttemptStatus.COMPLETED,
        "score": 1.0,
        "usage": Usage(10, 2, 1, 5),
        "cost_usd": 0.01,
        "duration_sec": 1.5,
        "artifacts": (),
        "status_source": StatusSource.FRAME,
    }
    kernel.update(changes.pop("kernel", {}))
    base: dict[str, Any] = {
        "run_id": "run-1",
        "experiment_id": "e",
        "cell_id": "t::2::s",
        "task_id": "t",
        "repetition": 2,
        "subject_id": "s",
        "attempt": 3,
        "attempt_id": "run-1/t::2::s/3",
        "trigger": Trigger.RETRY,
        "started_at": T0,
        "subject_started_at": None,
        "finished_at": T0 + timedelta(seconds=1.5),
        "result": ResultKernel(**kernel),
        "timings": {"subjectSec": 1.25},
        "host": "h",
        "maka_eval_version": "0.1.0",
    }
    base.update(changes)
    return AttemptRecord(**base)


BASES = [
    _record(),
    _record(
        kernel={
            "artifacts": (
                ArtifactEntry("subject.stdout", 12, SHA, truncated=True),
                ArtifactEntry("logs/verifier.txt", 0, SHA),
            ),
            "metrics": {"reward": 1.0, "tests_passed": 7.0},
            "isolation": "namespaces",
            "notes": ("the subject wrote outside its workspace",),
            "reason": "frame said so",
            "artifacts_omitted": 2,
        },
        request="cli-1",
        egress_policy_digest="0f" * 32,
        subject_started_at=T0 + timedelta(seconds=0.25),
        timings={},
    ),
    _record(
        kernel={
            "status": AttemptStatus.SUBJECT_FAILED,
            "score": 0.25,
            "usage": None,
            "cost_usd": None,
            "status_source": StatusSource.EXIT_CODE,
            "exit_code": 1,
            "artifacts": (ArtifactEntry("subject.stdout", 3, SHA),),
        },
        trigger=Trigger.MANUAL,
    ),
    _record(
        kernel={
            "status": AttemptStatus.INFRA_FAILED,
            "score": None,
            "duration_sec": 0.0,
            "status_source": StatusSource.INFRASTRUCTURE,
            "isolation": "none",
        },
        trigger=Trigger.SCHEDULED,
    ),
    _record(kernel={"usage": Usage(7, 0, 0, 3), "metrics": {"reward": 1.0}}),
]


def _wire(record: AttemptRecord) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(record.to_json_bytes())
    if record is BASES[-1]:  # usage without its (optional) total
        del data["result"]["usage"]["totalTokens"]
    return data


def _same(a: object, b: object) -> bool:
    """Equal field for field, down to the type of every value (1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if hasattr(a, "__dataclass_fields__"):
        names = [f.name for f in fields(a)]  # type: ignore[arg-type]
        if set(vars(a)) != set(names) or set(vars(b)) != set(names):
            return False
        return all(_same(getattr(a, n), getattr(b, n)) for n in names)
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        assert isinstance(b, tuple | list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return repr(a) == repr(b)


def _full(data: Any) -> AttemptRecord | str:
    try:
        return AttemptRecord.from_fields(data)
    except ContractError as exc:
        return f"refused: {exc}"


def _check(data: dict[str, Any]) -> None:
    full = _full(copy.deepcopy(data))
    fast = plain_record(copy.deepcopy(data))
    if fast is not None:
        assert not isinstance(full, str), f"the fast reader accepted what is {full}"
        assert _same(fast, full)
    try:
        via_dict: AttemptRecord | str = AttemptRecord.from_dict(copy.deepcopy(data))
    except ContractError as exc:
        via_dict = f"refused: {exc}"
    assert via_dict == full if isinstance(full, str) else _same(via_dict, full)


@pytest.mark.parametrize("base", range(len(BASES)))
def test_plain_records_take_the_fast_path_and_read_the_same(base):
    data = _wire(BASES[base])
    fast = plain_record(copy.deepcopy(data))
    assert fast is not None, "a well-formed record must not fall back to the slow reader"
    assert _same(fast, BASES[base])
    assert _same(fast, AttemptRecord.from_fields(data))
    kernel = plain_kernel(copy.deepcopy(data["result"]))
    assert kernel is not None and _same(kernel, ResultKernel.from_fields(data["result"]))


NEAR = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    0.0,
    -0.0,
    0.5,
    1.0,
    -1.0,
    1e308,
    2**31,
    -(2**31),
    -(2**31) - 1,
    10**15,
    10**15 + 1,
    float("nan"),
    float("inf"),
    "",
    "x",
    "x" * 33,
    "x" * 65,
    "x" * 241,
    "x" * 257,
    "x" * 401,
    "x" * 513,
    "completed",
    "subject_failed",
    "infra_failed",
    "cancelled",
    "frame",
    "exit-code",
    "infrastructure",
    "scheduled",
    "retry",
    "none",
    "container",
    "namespaces",
    "maka.eval.kernel.v1",
    "maka.eval.attempt.v2",
    "2026-01-05T09:00:00+00:00",
    "2026-01-05T09:00:00",
    "2026-01-05",
    "t::2::s",
    "t::1::s",
    SHA,
    SHA.upper(),
    [],
    [1.0],
    ["a"],
    ["a"] * 5,
    {},
    {"a": 1.0},
    {"a": 1},
    {"": 1.0},
    {"a": "1"},
    {"x" * 65: 1.0},
    {1: 1.0},
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
values = st.sampled_from(NEAR) | json_values


def _places(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object of a wire record that a mutation may touch."""
    found = [data]
    result = data.get("result")
    if isinstance(result, dict):
        found.append(result)
        found += [v for k, v in result.items() if k in ("usage", "metrics") and isinstance(v, dict)]
        if isinstance(result.get("artifacts"), list):
            found += [a for a in result["artifacts"] if isinstance(a, dict)]
    if isinstance(data.get("timings"), dict):
        found.append(data["timings"])
    return found


def _single_edits(base: int) -> list[tuple[int, str, bool, Any]]:
    data = _wire(BASES[base])
    edits: list[tuple[int, str, bool, Any]] = []
    for place, target in enumerate(_places(data)):
        keys = sorted(set(target) | set(EXTRA_KEYS))
        for key in keys:
            edits.append((place, key, True, None))
            edits += [(place, key, False, value) for value in NEAR]
    return edits


EXTRA_KEYS = ("inputTokens", "totalTokens", "truncated", "extra", "exitCode", "notes")
EXTRA_KEYS += ("metrics", "isolation", "request", "subjectStartedAt", "reason")


@pytest.mark.parametrize("base", range(len(BASES)))
def test_every_single_field_edit_reads_the_same_both_ways(base):
    """Each field of each object, removed or set to each value near its rules' edges."""
    for place, key, remove, value in _single_edits(base):
        data = _wire(BASES[base])
        target = _places(data)[place]
        if remove:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)
        _check(data)


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(0, len(BASES) - 1),
    edits=st.lists(
        st.tuples(st.integers(0, 10), st.integers(0, 40), st.booleans(), values),
        min_size=1,
        max_size=3,
    ),
)
def test_whatever_the_input_the_fast_reader_agrees_with_the_full_one(base, edits):
    data = _wire(BASES[base])
    for place, key_index, remove, value in edits:
        places = _places(data)
        target = places[place % len(places)]
        keys = [*sorted(target, key=repr), *EXTRA_KEYS]  # keys of any type
        key = keys[key_index % len(keys)]
        if remove:
            target.pop(key, None)
        else:
            target[key] = value
    _check(data)


def test_duplicate_keys_are_still_refused_by_the_store_reader():
    text = BASES[0].to_json_bytes().decode()
    doubled = text.replace('"host": "h"', '"host": "h", "host": "h"')
    assert doubled != text
    with pytest.raises(ContractError, match="duplicate key"):
        AttemptRecord.from_json(doubled)
