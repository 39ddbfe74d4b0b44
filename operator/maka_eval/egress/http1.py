"""HTTP/1.1 framing for the egress gateway: h11 decides it, the gateway only refuses more.

Every framing decision on the gateway's two connections (where a request or response
head ends, which body framing applies, chunk sizes and extensions, trailers, when a
connection may carry another request) is h11's, a well-kept parser that reads by the
RFCs and refuses what they call invalid: `0x5`, `1_0`, `-1`, `+5` or ` 5` as a chunk size,
more than 20 hex digits, a Transfer-Encoding other than `chunked`, conflicting
Content-Lengths, a missing or repeated Host, a head left incomplete past the limit.

On top of h11 this module refuses what h11 lets through but a stricter reader (the next
hop, or a future h11) could read another way. These checks only ever refuse; none of
them decides where a message ends, so they cannot disagree with h11 about framing:

- a chunk whose data is not followed by CRLF (h11 0.14 skips those two bytes unread,
  CVE-2025-43859; 0.16 refuses them itself), and a request chunk announced larger than
  `MAX_CHUNK_SIZE` (a reader with 64-bit sizes wraps `10000000000000005` to 5): both
  checked on h11's own unread buffer, where its events say a footer or size comes next;
- on a request head, as h11 delimited it: obsolete line folding, a repeated or
  comma-listed Content-Length (h11 merges equal ones), both Transfer-Encoding and
  Content-Length, Transfer-Encoding in an HTTP/1.0 request, a framing header spelt with
  `_` (some servers read `Transfer_Encoding` as `Transfer-Encoding`), a Content-Length
  past `MAX_CONTENT_LENGTH` (h11 0.14 takes any number of digits; a 64- or 32-bit reader
  would wrap it), an HTTP version other than 1.0 and 1.1, a whole head past the limit.

The gateway never forwards the HTTP bytes it read (a tunnel's bytes are not HTTP): what
it sends is built from these events (`Peer.send`), so the next hop reads exactly the
framing h11 read.
"""

from __future__ import annotations

import asyncio
import enum
import re
from dataclasses import dataclass
from typing import Any

import h11

FEED = 4096
"""The least handed to h11 at a time in a chunked body. The footer and size checks copy
h11's unread buffer once a chunk: it is fed about four chunks' worth at a time (between
this and READ), so a body of tiny chunks costs a small copy per chunk, one of large
chunks few calls."""
READ = 65536
"""Bytes read from a socket at a time."""
MAX_CONTENT_LENGTH = 2**31 - 1
"""The largest request Content-Length forwarded: every reader, 32-bit ones too, reads it
as it is."""
MAX_CHUNK_SIZE = MAX_CONTENT_LENGTH
"""The largest chunk a request may announce (h11 takes up to 20 hex digits, 2**80)."""
_MAX_CHUNK_DIGITS = 20
_HEX_DIGITS = b"0123456789abcdefABCDEF"

FRAMING_HEADERS = (b"content-length", b"transfer-encoding")
"""The headers that delimit a body (lower case): the gateway makes them anew."""
_FRAMING_NAMES = frozenset(FRAMING_HEADERS)
_OBS_FOLD = re.compile(rb"\n[ \t]")
_CONTENT_LENGTH_LINE = re.compile(rb"^content-length:([^\r\n]*)", re.IGNORECASE | re.MULTILINE)
_DIGITS = re.compile(rb"[ \t]*[0-9]+[ \t]*")

Event = h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]


class FramingError(Exception):
    """A peer's bytes are not an HTTP/1.1 message the gateway accepts; `status` is what
    to answer (h11's hint: 400, 431 for a head too large, 501 for an unknown coding)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class PeerClosed(ConnectionError):
    """The peer closed its side in the middle of a message."""


class Framing(enum.Enum):
    """How a request's body is delimited."""

    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"


@dataclass(frozen=True)
class Body:
    """A request's body framing, as forwarded: `length` for Framing.LENGTH."""

    framing: Framing
    length: int = 0

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The one framing header that says this on the next hop."""
        if self.framing is Framing.LENGTH:
            return [(b"Content-Length", str(self.length).encode("ascii"))]
        if self.framing is Framing.CHUNKED:
            return [(b"Transfer-Encoding", b"chunked")]
        return []


def values(headers: Any, name: bytes) -> list[bytes]:
    """The values of header `name` (lower case) in an h11 event's headers."""
    return [value for key, value in headers if key == name]


def request_body(request: h11.Request) -> Body:
    """The body framing of a request h11 accepted and `check_head` did not refuse."""
    if values(request.headers, b"transfer-encoding"):
        return Body(Framing.CHUNKED)
    lengths = values(request.headers, b"content-length")
    if lengths:
        return Body(Framing.LENGTH, int(lengths[0]))
    return Body(Framing.NONE)


def check_head(request: h11.Request, raw: bytes) -> None:
    """Refuse (FramingError) a request head that h11 accepted but another reader could
    frame differently; `raw` is the head's bytes exactly as h11 delimited them."""
    if request.http_version not in (b"1.0", b"1.1"):
        raise FramingError(f"HTTP/{request.http_version.decode('ascii')} is not served")
    if _OBS_FOLD.search(raw):
        raise FramingError("obsolete line folding (a header line starting with a space)")
    lengths = _CONTENT_LENGTH_LINE.findall(raw)
    if len(lengths) > 1:
        raise FramingError("more than one Content-Length")
    if lengths and not _DIGITS.fullmatch(lengths[0]):
        raise FramingError(f"bad Content-Length {lengths[0].strip()[:40]!r}")
    for name, _ in request.headers.raw_items():
        spelled = name.lower()
        if spelled not in _FRAMING_NAMES and spelled.replace(b"_", b"-") in _FRAMING_NAMES:
            raise FramingError(f"header {name.decode('ascii')!r} looks like a framing header")
    chunked = bool(values(request.headers, b"transfer-encoding"))
    if chunked and values(request.headers, b"content-length"):
        raise FramingError("both Transfer-Encoding and Content-Length")
    if chunked and request.http_version == b"1.0":
        raise FramingError("Transfer-Encoding in an HTTP/1.0 request")
    length = values(request.headers, b"content-length")
    if length and int(length[0]) > MAX_CONTENT_LENGTH:
        raise FramingError(f"Content-Length {length[0][:40].decode('ascii')} is too large")


class Peer:
    """One connection of the gateway (to the client, or to an upstream server) read and
    written through an h11 state machine: `receive()` gives events, `send()` writes them."""

    def __init__(
        self,
        role: type[h11.CLIENT] | type[h11.SERVER],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        head_limit: int,
    ) -> None:
        self.conn = h11.Connection(role, max_incomplete_event_size=head_limit)
        self._head_limit = head_limit
        self.reader = reader
        self.writer = writer
        self._pending = bytearray()
        """Read from the socket, not yet given to h11."""
        self._eof = False
        self._eof_fed = False
        self._footer_due = False
        """h11 is about to skip a chunk's footer: see that it is CRLF first."""
        self._size_due = False
        """h11 is about to read a request's chunk size: see that it is not huge first."""
        self._chunked_request = False
        self._chunked = False
        """A chunked body is being read (requests and responses alike)."""
        self._chunk_hint = 0
        self._chunk_bytes = 0
        """The size of the last whole chunk's data; of the current one so far."""
        self._ahead: h11.Event | None = None

    def start_next_cycle(self) -> None:
        """Ready for the next request on this connection (both sides are DONE)."""
        self.conn.start_next_cycle()

    @property
    def reusable(self) -> bool:
        """Whether this connection may carry another request (h11: both sides DONE)."""
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    def leftover(self) -> bytes:
        """What the peer sent past its last message (after a CONNECT: tunnel bytes)."""
        return self.conn.trailing_data[0] + bytes(self._pending)

    async def receive(self, timeout: float | None) -> h11.Event:
        """The next event; consecutive Data events come as one. Waits at most `timeout`
        for each read (TimeoutError)."""
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            return ahead
        while True:
            next_event = self._next()
            if next_event is h11.NEED_DATA:
                await self._read(timeout)
                continue
            if not isinstance(next_event, h11.Event):  # PAUSED: asked before a cycle ended
                raise RuntimeError(f"h11 paused in states {self.conn.states}")
            event = next_event
            break
        if not isinstance(event, h11.Data):
            return event
        parts = [bytes(event.data)]
        while True:
            more = self._next()
            if isinstance(more, h11.Data):
                parts.append(bytes(more.data))
                continue
            if isinstance(more, h11.Event):
                self._ahead = more
            break
        return h11.Data(data=b"".join(parts))

    def send(self, event: h11.Event) -> int:
        """Write an event (serialized by h11); the number of bytes written."""
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
        return len(data or b"")

    async def drain(self) -> None:
        await self.writer.drain()

    # -- reading ------------------------------------------------------------------------
    async def _read(self, timeout: float | None) -> None:
        data = await asyncio.wait_for(self.reader.read(READ), timeout)
        if data:
            self._pending += data
        else:
            self._eof = True

    def _feed(self) -> bool:
        """Give h11 the next slice of what was read; False when there is none."""
        if self._pending:
            if self.conn.their_state in (h11.IDLE, h11.SEND_RESPONSE):
                size = FEED  # a head: h11 measures the incomplete one against its limit
            elif self._chunked:
                size = min(READ, max(FEED, 4 * self._chunk_hint))
            else:
                size = READ
            self.conn.receive_data(bytes(self._pending[:size]))
            del self._pending[:size]
            return True
        if self._eof and not self._eof_fed:
            self._eof_fed = True
            self.conn.receive_data(b"")
            return True
        return False

    def _next(self) -> Event:
        """h11's next event from what was read (NEED_DATA: read more first)."""
        while True:
            if (self._footer_due or self._size_due) and not self._check_unread():
                if self._feed():
                    continue
                return h11.NEED_DATA
            head = self.conn.our_role is h11.SERVER and self.conn.their_state is h11.IDLE
            before = self.conn.trailing_data[0] if head else b""
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                if self._eof_fed:
                    raise PeerClosed(str(exc)) from None
                raise FramingError(str(exc), exc.error_status_hint) from None
            except ValueError:  # h11 0.14's int() of a Content-Length past 4300 digits
                raise FramingError("bad Content-Length") from None
            if event is h11.NEED_DATA:
                if self._feed():
                    continue
                return event
            if isinstance(event, h11.Request) and head:
                raw = before[: len(before) - len(self.conn.trailing_data[0])]
                if len(raw) > self._head_limit:
                    raise FramingError(f"the request head is larger than {self._head_limit}", 431)
                check_head(event, raw)
                self._chunked_request = request_body(event).framing is Framing.CHUNKED
                self._size_due = self._chunked = self._chunked_request
            elif isinstance(event, h11.Response):
                self._chunked = bool(values(event.headers, b"transfer-encoding"))
            elif isinstance(event, h11.Data):
                self._chunk_bytes += len(event.data)
                if event.chunk_end:
                    self._footer_due = True
                    self._chunk_hint, self._chunk_bytes = self._chunk_bytes, 0
            elif isinstance(event, h11.EndOfMessage):
                self._chunked_request = self._size_due = self._chunked = False
                self._chunk_hint = self._chunk_bytes = 0
            return event

    def _check_unread(self) -> bool:
        """Refuse (FramingError) a chunk footer other than CRLF, and a request's chunk
        size past MAX_CHUNK_SIZE, in the bytes h11 reads next (h11's events say where
        those are); False when more bytes are needed to tell."""
        unread, closed = self.conn.trailing_data
        if self._footer_due:
            footer = unread[:2]
            if footer != b"\r\n"[: len(footer)]:
                raise FramingError("a chunk's data is not followed by CRLF")
            if len(footer) < 2:
                return closed  # closed: h11 reports the cut body
            self._footer_due = False
            self._size_due = self._chunked_request
            unread = unread[2:]
        if self._size_due:
            digits = len(unread) - len(unread.lstrip(_HEX_DIGITS))
            if digits > _MAX_CHUNK_DIGITS or int(unread[:digits] or b"0", 16) > MAX_CHUNK_SIZE:
                raise FramingError(f"a chunk size of {digits} hex digits past {MAX_CHUNK_SIZE}")
            if digits == len(unread) and not closed:
                return False
            self._size_due = False
        return True
