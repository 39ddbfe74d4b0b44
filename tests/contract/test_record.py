"""The attempt record's reader: every field's rule still names the field, whatever the value."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.contract.fields import ContractError
from maka_eval.contract.record import AttemptRecord
from tests.contract.test_kernel import record


def wire() -> dict:
    return json.loads(record(timings={"subjectSec": 1.0}).to_json_bytes())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(trigger=["scheduled"]), "trigger: must be one of"),
        (lambda d: d.pop("trigger"), "trigger: is required"),
        (lambda d: d["result"].update(status={"completed": 1}), "result.status: must be one of"),
        (lambda d: d["result"].update(statusSource=[]), "result.statusSource: must be one of"),
        (lambda d: d.pop("runId"), "runId: is required"),
        (lambda d: d.update(runId=None), "runId: must be a string"),
        (lambda d: d.update(host="h" * 513), "host: longer than 512"),
        (lambda d: d.update(attempt=0), "attempt: must be at least 1"),
        (lambda d: d.update(repetition=True), "repetition: must be a whole number"),
        (lambda d: d.update(timings={"subjectSec": "1"}), "timings.subjectSec: must be a finite"),
        (lambda d: d.update(timings=[1.0]), "timings: must be an object of numbers"),
        (lambda d: d["result"].update(durationSec=-1.0), "result.durationSec: must be at least 0"),
        (lambda d: d["result"].update(score=float("inf")), "result.score: must be a finite"),
        (lambda d: d["result"].update(metrics={"m": None}), "result.metrics.m: must be a finite"),
        (lambda d: d["result"].update(notes="a note"), "result.notes: must be a list"),
        (lambda d: d["result"].update(extra=1), "result: unknown field"),
    ],
)
def test_each_rule_names_its_field(mutate, message):
    data = wire()
    mutate(data)
    with pytest.raises(ContractError, match=message):
        AttemptRecord.from_dict(data)


def test_numbers_are_read_as_floats():
    data = wire()
    data["timings"] = {"subjectSec": 2}
    data["result"]["durationSec"] = 3
    parsed = AttemptRecord.from_dict(data)
    assert parsed.timings == {"subjectSec": 2.0} and type(parsed.timings["subjectSec"]) is float
    assert type(parsed.result.duration_sec) is float


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    field=st.sampled_from(sorted(wire())),
    inner=st.sampled_from(sorted(wire()["result"])),
    value=json_values,
)
def test_any_value_in_any_field_is_a_record_or_a_contract_error(field, inner, value):
    for target in ("record", "result"):
        data = wire()
        if target == "record":
            data[field] = value
        else:
            data["result"][inner] = value
        with contextlib.suppress(ContractError):
            AttemptRecord.from_dict(data)
