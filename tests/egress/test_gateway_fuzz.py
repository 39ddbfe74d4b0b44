"""The gateway fuzzed: request byte streams against the real gateway on loopback.

Hypothesis writes pipelined requests (no body, Content-Length, chunked with extensions
and trailers; credentials valid, missing or forged; allowed and blocklisted URLs;
Connection: close, HTTP/1.0, Expect: 100-continue), cuts the stream into random TCP
writes, and breaks it: one request's framing replaced by a known-bad one (the smuggling
classics CL.TE, TE.CL, TE.TE with obfuscated Transfer-Encoding, bad chunk sizes and
footers, repeated Content-Length, obs-fold...), or random bytes changed. A recording
upstream keeps every byte that reaches it. The invariant:

- what reaches upstream is, connection by connection, exactly one canonical request
  (`read_canonical`, a strict reader independent of h11), nothing after it; only the
  last may be cut short, when its client request was refused in the middle of its body;
- each is one the gateway admitted (an `allow` audit with the attempt's identity: its
  credential checked) and the blocklist lets through (the policy applied);
- for the generated streams, the upstream sees exactly the requests before the first
  refused one (its body, method, target and headers as sent), the client gets their
  answers, then the refusal, and nothing a refused request carried reaches upstream.
"""

from __future__ import annotations

import enum
import ipaddress
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maka_eval.egress.gateway import Settings
from maka_eval.egress.policy import EgressPolicy
from tests.egress.gateway_harness import (
    KEY,
    Canonical,
    InProcessGateway,
    RecordingUpstream,
    auth_header,
    basic,
    exchange_raw,
    read_canonical,
    read_replies,
    valid_credential,
)

pytestmark = pytest.mark.slow

IDENTITY = "ns1/attempt-1"
POLICY = EgressPolicy()  # the terminal-bench preset: a URL with the name is refused
BLOCKED_PATH = "/mirror/terminal-bench/tasks"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    server = RecordingUpstream().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway() -> Iterator[InProcessGateway]:
    served = InProcessGateway(
        Settings(
            keys=(KEY,),
            policy=POLICY,
            allow_private=(ipaddress.ip_network("127.0.0.1/32"),),
            allowed_ports=((1, 65535),),
            head_timeout=30,
            idle_timeout=30,
        )
    ).start()
    try:
        yield served
    finally:
        served.stop()


# -- requests, as a client writes them --------------------------------------------------------


class Credential(enum.Enum):
    VALID = "valid"
    MISSING = "missing"
    FORGED = "forged"


class Body(enum.Enum):
    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"


@dataclass(frozen=True)
class Req:
    method: str
    path: str
    credential: Credential
    body_kind: Body
    body: bytes
    cuts: tuple[int, ...]
    """Where the chunked body is cut into chunks."""
    extensions: bool
    trailers: bool
    close: bool
    http10: bool
    expect: bool
    lower_names: bool


def smuggled(port: int, path: str = "/smuggled") -> bytes:
    """A whole request with a valid credential: what a smuggler hides in a body."""
    auth = auth_header(valid_credential(IDENTITY))
    return (
        f"GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Proxy-Authorization: {auth}\r\n\r\n"
    ).encode()


@st.composite
def requests(draw: st.DrawFn, index: int) -> Req:
    body_kind = draw(st.sampled_from(Body))
    payload = draw(
        st.one_of(
            st.binary(max_size=200),
            st.sampled_from([b"0\r\n\r\n{SMUGGLED}", b"{SMUGGLED}", b"5\r\nhello\r\n{SMUGGLED}"]),
        )
    )
    body = b"" if body_kind is Body.NONE else payload
    cuts = tuple(sorted(draw(st.sets(st.integers(1, max(1, len(body) - 1)), max_size=4))))
    http10 = body_kind is not Body.CHUNKED and draw(st.booleans()) and draw(st.booleans())
    tail = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~/", max_size=16))
    query = draw(st.sampled_from(["", "?q=1", "?a=b&c=%20d"]))
    path = draw(st.sampled_from([f"/r{index}/{tail}{query}", BLOCKED_PATH]))
    return Req(
        method=draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])),
        path=path,
        credential=draw(
            st.sampled_from([Credential.VALID] * 6 + [Credential.MISSING, Credential.FORGED])
        ),
        body_kind=body_kind,
        body=body,
        cuts=cuts,
        extensions=draw(st.booleans()),
        trailers=draw(st.booleans()),
        close=draw(st.booleans()) and draw(st.booleans()),
        http10=http10,
        expect=body_kind is not Body.NONE and draw(st.booleans()),
        lower_names=draw(st.booleans()),
    )


def chunks_of(req: Req) -> list[bytes]:
    edges = [0, *(c for c in req.cuts if c < len(req.body)), len(req.body)]
    return [req.body[a:b] for a, b in itertools.pairwise(edges) if b > a]


@dataclass
class Wire:
    """A request in pieces a mutation may change: head lines (no CRLF), the framing
    header lines among them, the body's size lines, data and footers."""

    lines: list[bytes]
    framing: list[bytes]
    sizes: list[bytes]
    datas: list[bytes]
    footers: list[bytes]
    last: bytes
    trailer: bytes
    raw_body: bytes

    def join(self) -> bytes:
        head = b"\r\n".join([*self.lines, *self.framing]) + b"\r\n\r\n"
        if self.sizes or self.last:
            body = b"".join(
                s + d + f for s, d, f in zip(self.sizes, self.datas, self.footers, strict=True)
            )
            return head + body + self.last + self.trailer
        return head + self.raw_body


def wire(req: Req, port: int) -> Wire:
    def name(text: str) -> bytes:
        return (text.lower() if req.lower_names else text).encode()

    version = "HTTP/1.0" if req.http10 else "HTTP/1.1"
    lines = [f"{req.method} http://127.0.0.1:{port}{req.path} {version}".encode()]
    lines.append(name("Host") + f": 127.0.0.1:{port}".encode())
    if req.credential is Credential.VALID:
        lines.append(name("Proxy-Authorization") + b": " + auth_header(valid_credential()).encode())
    elif req.credential is Credential.FORGED:
        forged = basic(IDENTITY, "0" * 64)
        lines.append(name("Proxy-Authorization") + b": " + forged.encode())
    lines.append(name("X-Fuzz") + b": " + req.path.encode())
    if req.close:
        lines.append(name("Connection") + b": close")
    elif req.http10:
        lines.append(b"Connection: keep-alive")  # h11 still ends an HTTP/1.0 exchange
    if req.expect:
        lines.append(name("Expect") + b": 100-continue")
    body = req.body.replace(b"{SMUGGLED}", smuggled(port))
    req_body = replace(req, body=body)
    if req.body_kind is Body.LENGTH:
        framing = [name("Content-Length") + f": {len(body)}".encode()]
        return Wire(lines, framing, [], [], [], b"", b"", body)
    if req.body_kind is Body.NONE:
        return Wire(lines, [], [], [], [], b"", b"", b"")
    datas = chunks_of(req_body)
    ext = b";name=value;flag" if req.extensions else b""
    sizes = [b"%x" % len(d) + ext + b"\r\n" for d in datas]
    trailer = b"X-Trailer: t\r\n\r\n" if req.trailers else b"\r\n"
    framing = [name("Transfer-Encoding") + b": chunked"]
    return Wire(lines, framing, sizes, datas, [b"\r\n"] * len(datas), b"0\r\n", trailer, body)


# -- known-bad framing ----------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    name: str
    body_kind: Body
    apply: Callable[[Wire, int], None]
    """Changes the wire; the int picks a chunk where that matters."""
    in_body: bool = False
    """Found in the body (the head was admitted): the upstream may have a cut copy."""


def _framing(*lines: bytes) -> Callable[[Wire, int], None]:
    def apply(w: Wire, _: int) -> None:
        length = len(w.join()) - len(b"\r\n".join([*w.lines, *w.framing]) + b"\r\n\r\n")
        w.framing = [line.replace(b"{N}", str(length).encode()) for line in lines]

    return apply


def _size(token: bytes, end: bytes = b"\r\n") -> Callable[[Wire, int], None]:
    def apply(w: Wire, pick: int) -> None:
        if not w.sizes:
            w.last = token + end
            return
        w.sizes[pick % len(w.sizes)] = token + end

    return apply


def _footer(footer: bytes) -> Callable[[Wire, int], None]:
    def apply(w: Wire, pick: int) -> None:
        if w.footers:
            w.footers[pick % len(w.footers)] = footer
        else:
            w.last = b"0\r\n"
            w.trailer = footer + b"0\r\n\r\n"  # an empty body: break the last chunk instead
            w.sizes, w.datas, w.footers = [b"1\r\n"], [b"x"], [footer]

    return apply


def _extra(*lines: bytes) -> Callable[[Wire, int], None]:
    def apply(w: Wire, _: int) -> None:
        w.lines.extend(lines)

    return apply


def _http10(w: Wire, _: int) -> None:
    w.lines[0] = w.lines[0].replace(b"HTTP/1.1", b"HTTP/1.0")


CL, TE = b"Content-Length", b"Transfer-Encoding"
MUTATIONS = [
    # CL.TE and TE.CL: both headers, in either order, with every length.
    Mutation("cl-te", Body.CHUNKED, _framing(CL + b": {N}", TE + b": chunked")),
    Mutation("te-cl", Body.CHUNKED, _framing(TE + b": chunked", CL + b": {N}")),
    Mutation("te-cl-4", Body.CHUNKED, _framing(TE + b": chunked", CL + b": 4")),
    Mutation("cl-0-te", Body.CHUNKED, _framing(CL + b": 0", TE + b": chunked")),
    # TE.TE: a Transfer-Encoding one reader takes and another does not.
    Mutation("te-xchunked", Body.CHUNKED, _framing(b"Transfer-Encoding: xchunked")),
    Mutation("te-list", Body.CHUNKED, _framing(b"Transfer-Encoding: chunked, identity")),
    Mutation("te-identity", Body.CHUNKED, _framing(b"Transfer-Encoding: identity, chunked")),
    Mutation("te-gzip", Body.CHUNKED, _framing(b"Transfer-Encoding: gzip, chunked")),
    Mutation(
        "te-twice", Body.CHUNKED, _framing(b"Transfer-Encoding: chunked", b"Transfer-Encoding: x")
    ),
    Mutation(
        "te-same-twice",
        Body.CHUNKED,
        _framing(b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"),
    ),
    Mutation("te-vtab", Body.CHUNKED, _framing(b"Transfer-Encoding:\x0bchunked")),
    Mutation("te-cr", Body.CHUNKED, _framing(b"Transfer-Encoding: chunked\r")),
    Mutation("te-nul", Body.CHUNKED, _framing(b"Transfer-Encoding: chunked\x00")),
    Mutation("te-space-colon", Body.CHUNKED, _framing(b"Transfer-Encoding : chunked")),
    Mutation("te-fold", Body.CHUNKED, _framing(b"Transfer-Encoding:", b" chunked")),
    Mutation(
        "te-underscore",
        Body.LENGTH,
        _framing(b"Content-Length: {N}", b"Transfer_Encoding: chunked"),
    ),
    Mutation(
        "te-behind-lf",
        Body.LENGTH,
        _framing(b"Content-Length: {N}", b"X-Hide: x\nTransfer-Encoding: chunked"),
    ),
    Mutation("te-http10", Body.CHUNKED, _http10),
    # Content-Length: repeated, listed, signed, hex, past every reader's integers.
    Mutation("cl-twice", Body.LENGTH, _framing(b"Content-Length: {N}", b"Content-Length: {N}")),
    Mutation("cl-differ", Body.LENGTH, _framing(b"Content-Length: {N}", b"Content-Length: 0")),
    Mutation("cl-list", Body.LENGTH, _framing(b"Content-Length: {N}, {N}")),
    Mutation("cl-plus", Body.LENGTH, _framing(b"Content-Length: +{N}")),
    Mutation("cl-hex", Body.LENGTH, _framing(b"Content-Length: 0x{N}")),
    Mutation("cl-negative", Body.LENGTH, _framing(b"Content-Length: -1")),
    Mutation("cl-2^64", Body.LENGTH, _framing(b"Content-Length: 18446744073709551616")),
    Mutation("cl-2^31", Body.LENGTH, _framing(b"Content-Length: 2147483648")),
    Mutation("cl-5000-digits", Body.LENGTH, _framing(b"Content-Length: " + b"1" * 5000)),
    Mutation("cl-underscore", Body.LENGTH, _framing(b"Content_Length: {N}")),
    Mutation("obs-fold", Body.NONE, _extra(b"X-Folded: a", b"\tb")),
    # Chunk sizes int(x, 16) takes and HTTP does not, bad footers: found in the body.
    *(
        Mutation(f"size {token!r}", Body.CHUNKED, _size(token), in_body=True)
        for token in (
            b"0x5",
            b"1_0",
            b"-1",
            b"+5",
            b" 5",
            b"5 5",
            b"",
            b"g",
            b"0x0",
            b"fffffffffffffffffffff",  # 21 digits
            b"000000000000000000005",
            b"10000000000000005",  # 2**64 + 5: 5 to a reader of 64-bit sizes
            b"80000000",  # 2**31
            b"5\x0b",
        )
    ),
    Mutation("size bare LF", Body.CHUNKED, _size(b"5", b"\n"), in_body=True),
    Mutation("footer XX", Body.CHUNKED, _footer(b"XX"), in_body=True),
    Mutation("footer LF", Body.CHUNKED, _footer(b"\n"), in_body=True),
    Mutation("footer none", Body.CHUNKED, _footer(b""), in_body=True),
]


# -- what the gateway must do ------------------------------------------------------------------


@dataclass
class Expected:
    forwarded: list[Req]
    statuses: list[int | tuple[int, ...]]
    cut: bool
    """The last upstream connection carries a cut copy (a refusal inside the body)."""


def url(port: int, req: Req) -> str:
    return f"http://127.0.0.1:{port}{req.path}"


def expected(reqs: list[Req], port: int, bad: int | None, mutation: Mutation | None) -> Expected:
    """What the gateway does with these requests, the one at `bad` broken by `mutation`."""
    forwarded: list[Req] = []
    statuses: list[int | tuple[int, ...]] = []
    for index, req in enumerate(reqs):
        broken = index == bad and mutation is not None
        if broken and mutation is not None and not mutation.in_body:
            statuses.append((400, 501))
            return Expected(forwarded, statuses, False)
        if req.credential is not Credential.VALID:
            statuses.append(407)
            return Expected(forwarded, statuses, False)
        if POLICY.check_url(url(port, req)).blocked:
            statuses.append(403)
            return Expected(forwarded, statuses, False)
        if broken:
            statuses.append(400)
            return Expected(forwarded, statuses, True)
        forwarded.append(req)
        statuses.append(200)
        if req.close or req.http10:
            break
    return Expected(forwarded, statuses, False)


def split(stream: bytes, cuts: set[int]) -> list[bytes]:
    edges = [0, *sorted(c for c in cuts if 0 < c < len(stream)), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


def canonical_connections(seen: list[bytes]) -> list[Canonical]:
    """Each upstream connection read strictly: one whole request and nothing after it,
    but the last, which may be cut short."""
    read = [read_canonical(data) for data in seen]
    for number, result in enumerate(read):
        assert not result.error, f"connection {number} is not canonical: {result.error}"
        assert result.rest == b"", f"bytes after the request: {result.rest[:200]!r}"
        assert result.request is not None or number == len(read) - 1, "a cut request"
    return read


def assert_admitted(gateway: InProcessGateway, read: list[Canonical], port: int) -> None:
    """Each upstream request was admitted (audited, with the attempt's identity) and the
    blocklist lets it through; no request was admitted after a refusal."""
    decisions = [e for e in gateway.audit if e["decision"] in ("allow", "deny", "error")]
    allowed = [e for e in decisions if e["decision"] == "allow"]
    assert len(allowed) == len(read), (decisions, read)
    refused = [n for n, e in enumerate(decisions) if e["decision"] != "allow"]
    assert not refused or all(e["decision"] != "allow" for e in decisions[refused[0] :])
    for event, result in zip(allowed, read, strict=True):
        assert event["identity"] == IDENTITY
        if result.request is None:
            continue
        # The URL checked is the one forwarded (damage may respell the host: 127.00.0.1
        # is a name the resolver turns into 127.0.0.1, and the address is what counts).
        parts = urlsplit(event["url"])
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        assert result.request.target == target
        assert not POLICY.check_url(event["url"]).blocked
        assert event["address"] == "127.0.0.1" and event["port"] == port
        assert result.request.header("Host") == [parts.netloc.lower()]
        assert result.request.header("Connection") == ["close"]
        assert not result.request.header("Proxy-Authorization")


def run(
    gateway: InProcessGateway,
    upstream: RecordingUpstream,
    stream: bytes,
    cuts: set[int],
    pause: bool,
) -> tuple[bytes, list[Canonical]]:
    """The gateway's answer to `stream` and the upstream connections it made, read."""
    gateway.audit.clear()
    answer = exchange_raw(gateway.port, split(stream, cuts), pause=0.001 if pause else 0.0)
    # Every connection the gateway made to the upstream follows an allow decision.
    allowed = sum(1 for e in gateway.audit if e["decision"] == "allow")
    return answer, canonical_connections(upstream.take(allowed))


# -- the properties ------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_pipelined_requests_reach_upstream_exactly_until_the_first_refusal(
    gateway: InProcessGateway, upstream: RecordingUpstream, data: st.DataObject
) -> None:
    check_stream(gateway, upstream, data, None)


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.name)
@settings(FUZZ, max_examples=6)
@given(data=st.data())
def test_known_bad_framing_is_refused_wherever_it_comes_in_a_stream(
    gateway: InProcessGateway, upstream: RecordingUpstream, mutation: Mutation, data: st.DataObject
) -> None:
    check_stream(gateway, upstream, data, mutation)


def check_stream(
    gateway: InProcessGateway,
    upstream: RecordingUpstream,
    data: st.DataObject,
    mutation: Mutation | None,
) -> None:
    """Pipelined requests, one of them broken by `mutation`, against the invariant."""
    count = data.draw(st.integers(1, 4), label="requests")
    reqs = [data.draw(requests(index), label=f"request {index}") for index in range(count)]
    bad = data.draw(st.integers(0, count - 1), label="broken") if mutation else None
    if mutation is not None and bad is not None:
        body = reqs[bad].body or b"0\r\n\r\n{SMUGGLED}"
        reqs[bad] = replace(
            reqs[bad],
            body_kind=mutation.body_kind,
            body=body if mutation.body_kind is not Body.NONE else b"",
            http10=False,
            close=False,
            expect=reqs[bad].expect and mutation.body_kind is not Body.NONE,
        )
    pick = data.draw(st.integers(0, 10), label="chunk picked")
    wires = [wire(req, upstream.port) for req in reqs]
    if mutation is not None and bad is not None:
        mutation.apply(wires[bad], pick)
    stream = b"".join(w.join() for w in wires)
    cuts = data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=8), label="cuts")
    pause = data.draw(st.booleans(), label="pause between writes")

    answer, read = run(gateway, upstream, stream, cuts, pause)
    want = expected(reqs, upstream.port, bad, mutation)

    # The upstream: exactly the requests before the refusal, as the client sent them.
    whole = [r.request for r in read if r.request is not None]
    assert len(whole) == len(want.forwarded), (whole, want)
    assert (len(read) - len(whole) == 1) == want.cut, read
    for got, req in zip(whole, want.forwarded, strict=True):
        assert got.method == req.method and got.target == req.path
        assert got.body == req.body.replace(b"{SMUGGLED}", smuggled(upstream.port))
        assert got.header("X-Fuzz") == [req.path]
        assert not got.header("Expect") and not got.header("X-Trailer")
        assert got.target != "/smuggled"
    assert_admitted(gateway, read, upstream.port)

    # The client: the answers of the forwarded requests, then the refusal (interim
    # 100 Continue answers aside).
    replies = [r for r in read_replies(answer) if r.status >= 200]
    assert len(replies) == len(want.statuses), (replies, want.statuses)
    for reply, status, req in zip(replies, want.statuses, reqs, strict=False):
        if isinstance(status, tuple):
            assert reply.status in status, reply
        else:
            assert reply.status == status, reply
        if status == 200:
            body = req.body.replace(b"{SMUGGLED}", smuggled(upstream.port))
            assert reply.body == f"upstream says hello {req.path} ({len(body)} bytes)".encode()
    refusals = [e for e in gateway.audit if e["decision"] in ("deny", "error")]
    assert len(refusals) == (1 if replies and replies[-1].status != 200 else 0), refusals


EDIT_BYTES = [b"\r", b"\n", b" ", b"\t", b"0", b"1", b"f", b"x", b"-", b"+", b"_", b";", b":", b","]


@FUZZ
@given(data=st.data())
def test_random_damage_never_gets_an_unchecked_request_upstream(
    gateway: InProcessGateway, upstream: RecordingUpstream, data: st.DataObject
) -> None:
    count = data.draw(st.integers(1, 3), label="requests")
    reqs = [data.draw(requests(index), label=f"request {index}") for index in range(count)]
    # Hidden in bodies: a request with a valid credential to a blocklisted URL. Damage
    # may well make it a request of its own; it must then meet the blocklist.
    reqs = [
        replace(r, body=r.body.replace(b"{SMUGGLED}", smuggled(upstream.port, BLOCKED_PATH)))
        for r in reqs
    ]
    parts = [wire(req, upstream.port).join() for req in reqs]
    stream = bytearray(b"".join(parts))
    edits = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(stream) - 1),
                st.sampled_from(["replace", "insert", "delete"]),
                st.sampled_from(EDIT_BYTES) | st.binary(min_size=1, max_size=3),
            ),
            min_size=1,
            max_size=3,
        ),
        label="edits",
    )
    for offset, kind, value in sorted(edits, reverse=True):
        if kind == "replace":
            stream[offset : offset + 1] = value
        elif kind == "insert":
            stream[offset:offset] = value
        else:
            del stream[offset : offset + 1]
    first_edit = min(offset for offset, _, _ in edits)
    intact = 0
    while intact < count and sum(len(p) for p in parts[: intact + 1]) <= first_edit:
        intact += 1
    cuts = data.draw(st.sets(st.integers(1, max(1, len(stream) - 1)), max_size=6), label="cuts")

    answer, read = run(gateway, upstream, bytes(stream), cuts, pause=False)
    assert_admitted(gateway, read, upstream.port)
    # The requests wholly before the first damaged byte go as they would undamaged.
    want = expected(reqs[:intact], upstream.port, None, None)
    whole = [r.request for r in read if r.request is not None]
    assert len(whole) >= len(want.forwarded)
    for got, req in zip(whole, want.forwarded, strict=False):
        assert (got.method, got.target, got.body) == (req.method, req.path, req.body)
    read_replies(answer)  # whatever the gateway answered is well framed
