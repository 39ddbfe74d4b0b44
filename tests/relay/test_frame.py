"""The protocol-v1 result frame is bounded and never crashes the relay."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.engine.bounds import MAX_ATTEMPT_COST_USD, MAX_ATTEMPT_TOKENS
from maka_eval.engine.classify import FrameState
from maka_eval.engine.status import SubjectStatus
from maka_eval.engine.usage import USAGE_FIELDS, Usage
from maka_eval.relay.frame import MAX_FRAME_BYTES, PROTOCOL, frame_bytes, parse_frame, read_frame


def test_a_valid_frame():
    frame = parse_frame(frame_bytes("completed", Usage(10, 2, 0, 5), 0.25))
    assert frame.state is FrameState.VALID
    assert frame.status is SubjectStatus.COMPLETED
    assert frame.usage == Usage(10, 2, 0, 5) and frame.cost_usd == 0.25
    bare = parse_frame(json.dumps({"protocol": PROTOCOL}).encode())
    assert bare.state is FrameState.VALID and bare.status is None and bare.usage is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b"\xff\xfe",
        json.dumps({"status": "completed"}).encode(),
        json.dumps({"protocol": "v0"}).encode(),
        json.dumps({"protocol": PROTOCOL, "status": "great"}).encode(),
        json.dumps({"protocol": PROTOCOL, "costUsd": -1}).encode(),
        json.dumps({"protocol": PROTOCOL, "costUsd": "1"}).encode(),
        json.dumps({"protocol": PROTOCOL, "usage": {"inputTokens": -5}}).encode(),
        json.dumps({"protocol": PROTOCOL, "score": 1.0}).encode(),
        b'{"protocol": "maka.eval.result.v1", "protocol": "maka.eval.result.v1"}',
        b'{"protocol": "maka.eval.result.v1", "costUsd": NaN}',
        b"[" * 100_00 + b"]" * 100_00,
    ],
)
def test_malformed_frames_are_recorded_as_such(data):
    assert parse_frame(data).state is FrameState.MALFORMED


def test_oversized_frames():
    padding = " " * MAX_FRAME_BYTES
    assert parse_frame(frame_bytes("completed") + padding.encode()).state is FrameState.OVERSIZED


@settings(max_examples=300)
@given(st.binary(max_size=2048))
def test_parse_frame_never_raises(data):
    assert parse_frame(data).state in (FrameState.VALID, FrameState.MALFORMED)


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    )
)
def test_parse_frame_never_raises_on_any_json(value):
    parse_frame(json.dumps(value).encode())


def _dir(tmp_path):
    return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)


def test_reading_refuses_symlinks_fifos_and_big_files(tmp_path):
    fd = _dir(tmp_path)
    try:
        assert read_frame(fd).state is FrameState.ABSENT
        (tmp_path / "secret").write_bytes(frame_bytes("completed"))
        os.symlink(tmp_path / "secret", tmp_path / "result.json")
        assert read_frame(fd).error == "the frame path is a symbolic link"
        os.unlink(tmp_path / "result.json")
        os.mkfifo(tmp_path / "result.json")  # a writer-less FIFO must not hang the relay
        assert read_frame(fd).state is FrameState.MALFORMED
        os.unlink(tmp_path / "result.json")
        with open(tmp_path / "result.json", "wb") as handle:
            handle.write(b" " * (50 * 1024 * 1024))
        assert read_frame(fd).state is FrameState.OVERSIZED
    finally:
        os.close(fd)


# -- the bounds of a self-reported figure (engine.bounds) -----------------------------------
def _frame(**fields) -> bytes:
    return json.dumps({"protocol": PROTOCOL, **fields}).encode()


@pytest.mark.parametrize(
    "data",
    [
        _frame(costUsd=1e308),
        _frame(costUsd=1e6),
        _frame(costUsd=MAX_ATTEMPT_COST_USD * (1 + 1e-9)),
        _frame(costUsd=-1),
        _frame(costUsd=-0.0001),
        _frame(costUsd=True),
        _frame(costUsd=10**400),  # an integer no float holds: must not raise
        b'{"protocol": "maka.eval.result.v1", "costUsd": 1e999}',  # reads as infinity
        b'{"protocol": "maka.eval.result.v1", "costUsd": -1e999}',
        b'{"protocol": "maka.eval.result.v1", "costUsd": NaN}',
        b'{"protocol": "maka.eval.result.v1", "costUsd": Infinity}',
        _frame(usage={"inputTokens": 10**15}),
        _frame(usage={"outputTokens": MAX_ATTEMPT_TOKENS + 1}),
        _frame(usage={"inputTokens": 1e12}),
        _frame(usage={"inputTokens": 1000.0}),
        _frame(usage={"cachedInputTokens": True}),
        _frame(usage={"inputTokens": 6 * 10**9, "outputTokens": 6 * 10**9}),  # the total
        _frame(usage={"inputTokens": 1, "totalTokens": 10**15}),
        _frame(usage={"inputTokens": 1, "totalTokens": 1.0}),
        _frame(usage={"inputTokens": 1, "totalTokens": True}),
        _frame(usage={"inputTokens": 10**400}),
    ],
)
def test_figures_beyond_sane_bounds_make_a_malformed_frame(data):
    frame = parse_frame(data)
    assert frame.state is FrameState.MALFORMED
    assert frame.usage is None and frame.cost_usd is None


def test_figures_at_the_bounds_are_valid():
    frame = parse_frame(
        _frame(
            usage={"inputTokens": MAX_ATTEMPT_TOKENS - 1, "outputTokens": 1},
            costUsd=int(MAX_ATTEMPT_COST_USD),
        )
    )
    assert frame.state is FrameState.VALID
    assert frame.usage == Usage(MAX_ATTEMPT_TOKENS - 1, 0, 0, 1)
    assert frame.cost_usd == MAX_ATTEMPT_COST_USD and type(frame.cost_usd) is float


_any_count = st.integers(min_value=-5, max_value=2 * MAX_ATTEMPT_TOKENS) | st.floats(
    min_value=0, max_value=1e11
)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(sorted(USAGE_FIELDS)), _any_count, min_size=1))
def test_usage_is_valid_exactly_within_the_bounds(counts):
    frame = parse_frame(_frame(usage=counts))
    whole = all(type(n) is int and 0 <= n <= MAX_ATTEMPT_TOKENS for n in counts.values())
    within = whole and sum(counts.values()) <= MAX_ATTEMPT_TOKENS
    assert (frame.state is FrameState.VALID) == within
    if within:
        assert frame.usage is not None and frame.usage.total_tokens == sum(counts.values())


@settings(max_examples=300)
@given(
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.booleans()
)
def test_cost_is_valid_exactly_within_the_bounds(cost):
    # json.dumps writes NaN/Infinity, which the strict reader refuses: malformed too.
    frame = parse_frame(_frame(costUsd=cost))
    within = (
        not isinstance(cost, bool) and math.isfinite(cost) and 0 <= cost <= MAX_ATTEMPT_COST_USD
    )
    assert (frame.state is FrameState.VALID) == within
    assert frame.cost_usd == (float(cost) if within else None)


def test_a_malformed_frames_error_quotes_nothing_raw():
    frame = parse_frame(b'{"protocol": "maka.eval.result.v1", "x\\u001b]0;pwned\\u0007": 1}')
    assert frame.state is FrameState.MALFORMED
    assert frame.error == "unknown field(s): x\\x1b]0;pwned\\x07"
