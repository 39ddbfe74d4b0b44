"""Request smuggling through the cluster's egress gateway, for real.

The attacker holds an attempt credential (a leaked sidecar Secret, or a sidecar
turned against the gateway) and wants a request past the gateway's checks: here one to a
URL the blocklist refuses, hidden in the body of an allowed request, so that a next hop
that frames the body differently reads it as a request of its own (a desync on the
gateway's upstream connection). The payloads are the classics: chunk sizes Python's
`int(x, 16)` takes and HTTP does not (`0x5`, `1_0`, `-1`, `+5`, ` 5`), sizes a 64-bit
reader wraps, CL.TE and TE.CL with the second header hidden behind a bare LF or spelt
with `_`, TE.TE with a vertical tab, repeated Content-Lengths, Transfer-Encoding in
HTTP/1.0.

The gateway program runs on loopback in front of a recording upstream. Each payload
must be refused (400, 501 for an unknown coding) and what reached the upstream must be
at most a canonical, cut-short copy of the admitted request's start (the gateway never
forwards a byte it did not parse): no whole request, no smuggled one, no byte another
reader could frame differently.

Before h11 (the hand-written parser) every one of these got through: the chunk sizes
and the huge Content-Length went upstream raw (with `-1` the rest of the connection
was forwarded unparsed), the hidden headers went on as they were, and the requests were
answered 200 or not at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.egress.gateway_harness import (
    GatewayProcess,
    RecordingUpstream,
    auth_header,
    exchange_raw,
    read_canonical,
    read_replies,
    valid_credential,
    write_key,
)

SANDBOX = "cluster egress gateway"
"""Where these attacks run (bench/integrity_attacks.py prints it)."""
ATTACK_CLASS = "request smuggling past the gateway"

BLOCKED = "/mirror/terminal-bench/tasks"
"""A URL the gateway's default preset (terminal-bench) refuses."""


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    server = RecordingUpstream().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    key = write_key(Path(tmp_path_factory.mktemp("gateway")) / "key")
    # A short idle timeout: a gateway waiting for an answer the upstream never gives
    # (to bytes it cannot read) gives up in seconds.
    process = GatewayProcess(key, extra=("--idle-timeout", "5")).start()
    try:
        yield process
    finally:
        process.stop()


def _head(port: int, *lines: str, version: str = "HTTP/1.1") -> bytes:
    auth = auth_header(valid_credential())
    start = [
        f"POST http://127.0.0.1:{port}/upload {version}",
        f"Host: 127.0.0.1:{port}",
        f"Proxy-Authorization: {auth}",
    ]
    return "\r\n".join([*start, *lines]).encode() + b"\r\n\r\n"


def _smuggled(port: int) -> bytes:
    auth = auth_header(valid_credential())
    return (
        f"GET http://127.0.0.1:{port}{BLOCKED} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Proxy-Authorization: {auth}\r\n\r\n"
    ).encode()


def _chunked(size: bytes, port: int) -> bytes:
    """A chunked body whose first chunk size is `size`, the smuggled request after it."""
    hidden = _smuggled(port)
    return (
        _head(port, "Transfer-Encoding: chunked")
        + size
        + b"\r\n"
        + hidden
        + b"\r\n0\r\n\r\n"
        + hidden
    )


def _cl_te(framing: str, port: int, *, version: str = "HTTP/1.1") -> bytes:
    """A body that ends at once for a chunked reader, the smuggled request after it; the
    Content-Length covers both (`{N}` in `framing`)."""
    body = b"0\r\n\r\n" + _smuggled(port)
    return _head(port, *framing.replace("{N}", str(len(body))).split("|"), version=version) + body


PAYLOADS = {
    # Chunk sizes: (payload, connections the gateway makes upstream before refusing).
    "size 0x5": (lambda p: _chunked(b"0x%x" % len(_smuggled(p)), p), 1),
    "size 1_0": (lambda p: _chunked(b"1_0", p), 1),
    "size -1": (lambda p: _chunked(b"-1", p), 1),
    "size +5": (lambda p: _chunked(b"+%x" % len(_smuggled(p)), p), 1),
    "size leading space": (lambda p: _chunked(b" %x" % len(_smuggled(p)), p), 1),
    "size 2**64 + n": (lambda p: _chunked(b"1%016x" % len(_smuggled(p)), p), 1),
    "size 22 hex digits": (lambda p: _chunked(b"f" * 22, p), 1),
    # CL.TE: the chunked framing hidden from a reader that splits lines at CRLF only.
    "CL.TE behind a bare LF": (
        lambda p: _cl_te("Content-Length: {N}|X-Note: x\nTransfer-Encoding: chunked", p),
        0,
    ),
    # CL.TE and TE.CL: the second framing header spelt with `_` (read as `-` by some).
    "CL.TE with Transfer_Encoding": (
        lambda p: _cl_te("Content-Length: {N}|Transfer_Encoding: chunked", p),
        0,
    ),
    "TE.CL with Content_Length": (
        lambda p: _cl_te("Transfer-Encoding: chunked|Content_Length: 5", p),
        0,
    ),
    # TE.TE: a coding one reader trims to `chunked` and another does not.
    "TE.TE vertical tab": (lambda p: _cl_te("Transfer-Encoding:\x0bchunked", p), 0),
    "TE.TE trailing vertical tab": (lambda p: _cl_te("Transfer-Encoding: chunked\x0b", p), 0),
    # Content-Length: repeated (which one counts?), past 64 bits (wrapped to a small one).
    "CL repeated": (lambda p: _cl_te("Content-Length: {N}|Content-Length: {N}", p), 0),
    "CL 2**64 + 5": (lambda p: _cl_te("Content-Length: 18446744073709551621", p), 0),
    # Transfer-Encoding in HTTP/1.0, which has none: a 1.0 reader takes Content-Length.
    "TE in HTTP/1.0": (
        lambda p: _cl_te("Transfer-Encoding: chunked", p, version="HTTP/1.0"),
        0,
    ),
}


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_a_smuggling_payload_is_refused_and_nothing_of_it_is_forwarded(
    gateway: GatewayProcess, upstream: RecordingUpstream, name: str
) -> None:
    make, connections = PAYLOADS[name]
    payload = make(upstream.port)
    answer = exchange_raw(gateway.port, [payload], timeout=30)
    seen = upstream.take(connections)
    with contextlib.suppress(AssertionError):  # the old gateway never decided some
        gateway.wait_for(lambda e: e["decision"] in ("deny", "error"), timeout=5)
    audit = list(gateway.audit)
    gateway.audit.clear()

    # The gateway answers the refusal, once, and closes.
    replies = read_replies(answer)
    assert [r.status for r in replies] in ([400], [501]), (name, answer[:300])
    decisions = [(e["decision"], e.get("status")) for e in audit if e["decision"] != "end"]
    assert decisions == [("allow", 200)] * connections + [("deny", replies[0].status)], audit

    # The upstream got no request: at most the admitted request's start, canonical.
    assert len(seen) == connections, seen
    for data in seen:
        read = read_canonical(data)
        assert not read.error, (
            f"{name}: the upstream got bytes another reader frames differently: {read.error}"
        )
        assert read.request is None, f"{name}: a whole request reached the upstream: {read}"
        assert b"terminal-bench" not in data, f"{name}: the smuggled request reached the upstream"
