"""An incremental server-sent-events parser: fed chunk by chunk, it never holds a chunk.

The proxy passes every chunk on unchanged as soon as it arrives and gives a copy to this
parser, which keeps only the unfinished line and event (bounded) and returns the events
completed so far. Lines end in CRLF, LF or CR, and a CR at the end of one chunk may be
followed by the LF at the start of the next; feeding byte by byte gives the same events
as feeding the whole stream (WHATWG HTML, "Interpreting an event stream").
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EVENT_BYTES = 8 * 1024 * 1024
"""An event larger than this is dropped (and counted), never buffered further."""


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its type ('message' when unnamed) and data."""

    event: str
    data: str


class SSEParser:
    """Feed bytes, get completed events."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._line = bytearray()
        self._skip_lf = False
        self._first = True
        self._event = ""
        self._data: list[bytes] = []
        self._size = 0
        self._overflow = False
        self.dropped = 0
        """Events dropped for being larger than the bound."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse `chunk`; return the events it completed."""
        events: list[SSEEvent] = []
        start = 0
        end = len(chunk)
        if self._skip_lf and end:
            self._skip_lf = False
            if chunk[0:1] == b"\n":
                start = 1
        # Each search runs once per separator found, never from the same start twice: a
        # large chunk of many lines is scanned in linear time.
        cr = lf = -2
        while start < end:
            if cr != -1 and cr < start:
                cr = chunk.find(b"\r", start)
            if lf != -1 and lf < start:
                lf = chunk.find(b"\n", start)
            if cr < 0 and lf < 0:
                self._append(chunk[start:end])
                break
            stop = lf if cr < 0 else cr if lf < 0 else min(cr, lf)
            self._append(chunk[start:stop])
            if chunk[stop : stop + 1] == b"\r":
                if stop + 1 == end:
                    self._skip_lf = True
                    start = end
                elif chunk[stop + 1 : stop + 2] == b"\n":
                    start = stop + 2
                else:
                    start = stop + 1
            else:
                start = stop + 1
            event = self._line_done()
            if event is not None:
                events.append(event)
        return events

    def _append(self, part: bytes) -> None:
        if not part or self._overflow:
            return
        if len(self._line) + self._size + len(part) > self._max:
            self._overflow = True
            self._line.clear()
            self._data.clear()
            return
        self._line += part

    def _line_done(self) -> SSEEvent | None:
        line = bytes(self._line)
        self._line.clear()
        if self._first:
            self._first = False
            if line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
        if not line:
            return self._dispatch()
        if self._overflow or line.startswith(b":"):
            return None
        name, sep, value = line.partition(b":")
        if sep and value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._size += len(value) + 1
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        return None

    def _dispatch(self) -> SSEEvent | None:
        overflow, data, name = self._overflow, self._data, self._event
        self._overflow = False
        self._data = []
        self._size = 0
        self._event = ""
        if overflow:
            self.dropped += 1
            return None
        if not data:
            return None
        return SSEEvent(name or "message", b"\n".join(data).decode("utf-8", "replace"))
