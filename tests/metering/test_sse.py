"""The incremental SSE parser: any chunking gives the same events as the whole stream."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from maka_eval.metering.sse import SSEEvent, SSEParser
from tests.metering.provider_payloads import (
    Reported,
    chat_stream,
    messages_stream,
    responses_stream,
)

STREAM = b"".join(
    chat_stream("gpt-4o", Reported(), include_usage=True)
    + responses_stream("gpt-4o", Reported())
    + messages_stream("claude", Reported())
)


def whole(data: bytes) -> list[SSEEvent]:
    return SSEParser().feed(data)


def byte_by_byte(data: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for i in range(len(data)):
        events += parser.feed(data[i : i + 1])
    return events


def test_byte_by_byte_equals_whole():
    events = whole(STREAM)
    assert len(events) == 9 + 7 + 11
    assert byte_by_byte(STREAM) == events


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_any_chunking_equals_whole(cuts):
    points = sorted(set(cuts))
    parser = SSEParser()
    events: list[SSEEvent] = []
    start = 0
    for point in [*points, len(STREAM)]:
        events += parser.feed(STREAM[start:point])
        start = point
    assert events == whole(STREAM)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([b"\n", b"\r\n", b"\r"]), st.integers(min_value=1, max_value=7))
def test_line_endings_and_a_cr_split_from_its_lf(ending, size):
    data = b"event: a" + ending + b"data: 1" + ending + b"data: 2" + ending + ending
    data += b": comment" + ending + b"data:x" + ending + ending
    expected = [SSEEvent("a", "1\n2"), SSEEvent("message", "x")]
    assert whole(data) == expected
    parser = SSEParser()
    events: list[SSEEvent] = []
    for i in range(0, len(data), size):
        events += parser.feed(data[i : i + size])
    assert events == expected


def test_fields_per_the_event_stream_rules():
    data = (
        b"\xef\xbb\xbfdata: first\n\n"  # a byte-order mark is dropped
        b"data\n\n"  # a field without a colon: empty data
        b"event: only-a-name\n\n"  # no data: nothing is dispatched
        b"id: 7\nretry: 10\ndata:  two spaces\n\n"  # only one space after ':' is removed
        b"data: unterminated"  # an event without its blank line is not dispatched
    )
    assert whole(data) == [
        SSEEvent("message", "first"),
        SSEEvent("message", ""),
        SSEEvent("message", " two spaces"),
    ]


def test_an_oversized_event_is_dropped_not_buffered():
    parser = SSEParser(max_event_bytes=100)
    events = parser.feed(b"data: " + b"x" * 60 + b"\n")
    events += parser.feed(b"data: " + b"y" * 60 + b"\n\n")
    events += parser.feed(b"data: small\n\n")
    assert events == [SSEEvent("message", "small")]
    assert parser.dropped == 1
    # A single line longer than the bound, fed byte by byte, is dropped too.
    for byte in b"data: " + b"z" * 500 + b"\n\n":
        assert parser.feed(bytes([byte])) == []
    assert parser.dropped == 2
