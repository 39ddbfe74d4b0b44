"""The protocol-v1 result frame is bounded and never crashes the relay."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.engine.classify import FrameState
from maka_eval.engine.status import SubjectStatus
from maka_eval.engine.usage import Usage
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
