"""The strict JSON reader: what it refuses at any depth, and what it reads as json.loads does."""

from __future__ import annotations

import json
import math

import pytest

from maka_eval import strict_json


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 1}',
        '{"outer": {"b": [1, {"c": 1, "d": 2, "c": 3}]}}',
        '[{"x": 1}, {"y": 2, "y": 2}]',
        '{"a": 1, "a" : 2}',
    ],
)
def test_a_key_named_twice_is_refused_at_any_depth(text):
    with pytest.raises(strict_json.DuplicateKeyError, match=r"duplicate key '[acy]'"):
        strict_json.loads(text)
    with pytest.raises(strict_json.DuplicateKeyError):
        strict_json.loads(text.encode())


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_are_refused_unless_allowed(constant):
    with pytest.raises(strict_json.NonFiniteNumberError):
        strict_json.loads(f'{{"x": {{"y": [{constant}]}}}}')
    value = strict_json.loads(f"[{constant}]", allow_nonfinite=True)[0]
    assert math.isnan(value) or math.isinf(value)


def test_everything_else_reads_as_json_loads_reads_it():
    document = {"s": 'quote " and ":', "n": [1, 2.5, -0.0, None, True], "o": {"k": {}}}
    text = json.dumps(document, indent=2)
    assert strict_json.loads(text) == document
    for data in (text.encode(), bytearray(text.encode()), text.encode("utf-16")):
        assert strict_json.loads(data) == document
    with pytest.raises(json.JSONDecodeError, match="BOM"):
        strict_json.loads("\ufeff" + text)
    with pytest.raises(TypeError):
        strict_json.loads(3)  # type: ignore[arg-type]
