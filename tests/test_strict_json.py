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


# -- the jiter fast path agrees with the standard library -----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)

_fragments = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"a"',
        '"a"',
        '"\\ud800"',
        '"\\u00e9"',
        '"\x01"',
        "1",
        "-0",
        "1e400",
        "0.1",
        "01",
        "NaN",
        "Infinity",
        "true",
        "null",
        " ",
        "\n",
        "\ufeff",
        '"\\"',
        "é",
    ]
)


def _verdict(read, data):
    try:
        return "ok", read(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and ours
        return type(exc).__name__, str(exc)


def _standard_library_only(data):
    saved, strict_json._jiter_from_json = strict_json._jiter_from_json, None
    try:
        return strict_json.loads(data)
    finally:
        strict_json._jiter_from_json = saved


def test_the_package_reads_bytes_with_jiter():
    # A dependency of the package: if it went missing, reports would be 2.5x slower.
    assert strict_json._jiter_from_json is not None


@settings(max_examples=300, deadline=None)
@given(_json_values, st.sampled_from([None, 2]), st.booleans())
def test_generated_documents_read_the_same_with_or_without_jiter(value, indent, ascii_only):
    data = json.dumps(value, indent=indent, ensure_ascii=ascii_only).encode()
    fast = _verdict(strict_json.loads, data)
    assert fast == _verdict(_standard_library_only, data)
    assert fast == ("ok", json.loads(data))
    if fast[0] == "ok":  # the same types too (1 and 1.0 are equal)
        assert json.dumps(fast[1]) == json.dumps(value)


@settings(max_examples=500, deadline=None)
@given(st.lists(_fragments, max_size=12), st.sampled_from(["utf-8", "utf-16"]))
def test_any_text_gets_the_standard_librarys_verdict(pieces, encoding):
    data = "".join(pieces).encode(encoding, "surrogatepass")
    fast = _verdict(strict_json.loads, data)
    slow = _verdict(_standard_library_only, data)
    assert fast[0] == slow[0]
    if fast[0] == "ok":
        assert json.dumps(fast[1]) == json.dumps(slow[1])
    else:
        assert fast[1] == slow[1]


def test_a_depth_limit_holds_on_the_fast_path():
    data = b'{"a": [[[1]]]}'
    assert strict_json.loads(data, max_depth=4) == {"a": [[[1]]]}
    with pytest.raises(strict_json.NestingError, match="more than 3 levels"):
        strict_json.loads(data, max_depth=3)
    deep = b"[" * 300 + b"]" * 300  # past jiter's own limit: the standard library reads it
    with pytest.raises(strict_json.NestingError, match="more than 250 levels"):
        strict_json.loads(deep, max_depth=250)
    assert strict_json.depth(strict_json.loads(deep)) == 300
