"""What the per-cell egress proxy adds: request latency, time to first chunk, held chunks.

An upstream HTTP/1.1 server runs in its own process on loopback; a raw-socket client
(TCP_NODELAY on both sides: without it, delayed ACKs add ~44 ms) times the same requests
directly and through the proxy (`egress.proxy.start_proxy`: mitmproxy with the
blocklist, audit, metering addons), interleaved so machine noise hits all alike:

* **plain GET**: the blocklist and the audit log only;
* **model POST** (`/v1/chat/completions` with a JSON body): also web-tool stripping, usage
  read from the response and three checkpoint writes (start, admission, settlement);

each over one keep-alive connection and over a new connection per request; the added
latency is the difference of the p50 (and p99) figures. Two references without any
egress addon are timed alongside: a bare `mitmdump`, and mitmproxy embedded with the
built-in addons the proxy loads (`egress.proxy.builtin_addons`), so mitmproxy's own
share can be told from the addons'. Each proxy process's CPU time per request is
printed too: unlike latency, it hardly moves with other load on the machine. Then a
streaming model request (`/v1/messages`, server-sent events, a chunk every `--gap-ms`,
a new connection each): the time to first chunk through the proxy minus directly, and
every chunk's arrival time against the time the upstream sent it (the upstream stamps
it into the chunk; one monotonic clock), so a chunk the proxy held back until the next
one shows up as a delay of a whole gap.

Targets: p50 added <= 2 ms with keep-alive; TTFC overhead <= 5 ms; no chunk held back
(none more than half a gap late).
The exit status is 0 whatever the verdict: a benchmark, not a test.

    .venv/bin/python bench/proxy_overhead.py
    .venv/bin/python bench/proxy_overhead.py --requests 300 --streams 10
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import start_proxy

TARGET_KEEPALIVE_P50_MS = 2.0
TARGET_TTFC_MS = 5.0

USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
MODEL_BODY = json.dumps(
    {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
    }
).encode()


# -- the upstream (its own process) --------------------------------------------------------
def _read_request(conn: socket.socket, buffer: bytearray) -> tuple[str, bytes] | None:
    while b"\r\n\r\n" not in buffer:
        data = conn.recv(65536)
        if not data:
            return None
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            return None
        rest += data
    buffer[:] = rest[length:]
    target = head.split(b" ", 2)[1].decode()
    return target, rest[:length]


def _serve_connection(conn: socket.socket, gap: float, chunks: int) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    try:
        while (request := _read_request(conn, buffer)) is not None:
            target, _ = request
            if target.endswith("/v1/messages"):
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )
                for i in range(chunks):
                    event = f"event: ping\ndata: {i} {time.monotonic_ns()}\n\n".encode()
                    conn.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    if i + 1 < chunks:
                        time.sleep(gap)
                conn.sendall(b"0\r\n\r\n")
                continue
            if target.endswith("/v1/chat/completions"):
                body = json.dumps({"id": "x", "choices": [], "usage": USAGE}).encode()
                ctype = b"application/json"
            else:
                body, ctype = b"ok\n", b"text/plain"
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: "
                + ctype
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
    except OSError:
        pass
    finally:
        conn.close()


def upstream_main(port_out: multiprocessing.Queue[int], gap: float, chunks: int) -> None:
    server = socket.create_server(("127.0.0.1", 0), backlog=256)
    port_out.put(server.getsockname()[1])
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve_connection, args=(conn, gap, chunks), daemon=True).start()


# -- the client ---------------------------------------------------------------------------------
def connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_bytes(upstream: int, path: str, via_proxy: bool, body: bytes | None) -> bytes:
    target = f"http://127.0.0.1:{upstream}{path}" if via_proxy else path
    method = "POST" if body is not None else "GET"
    head = f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


def read_response(sock: socket.socket) -> None:
    """Read one Content-Length response."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)


class Endpoint:
    """Where requests go: directly to the upstream, or through the proxy."""

    def __init__(self, name: str, host: str, port: int, upstream: int, via_proxy: bool) -> None:
        self.name, self.host, self.port = name, host, port
        self.upstream, self.via_proxy = upstream, via_proxy
        self._sock: socket.socket | None = None

    def once(self, path: str, body: bytes | None, keep_alive: bool) -> float:
        """One request; its latency in seconds."""
        payload = request_bytes(self.upstream, path, self.via_proxy, body)
        t0 = time.perf_counter()
        if keep_alive:
            if self._sock is None:
                self._sock = connect(self.host, self.port)
            sock = self._sock
        else:
            sock = connect(self.host, self.port)
        sock.sendall(payload)
        read_response(sock)
        elapsed = time.perf_counter() - t0
        if not keep_alive:
            sock.close()
        return elapsed

    def stream(self) -> tuple[float, list[float]]:
        """A streaming request: time to first chunk (s), and each chunk's delay between
        the upstream's send and its arrival here (ms)."""
        payload = request_bytes(self.upstream, "/v1/messages", self.via_proxy, b"{}")
        sock = connect(self.host, self.port)
        t0 = time.perf_counter()
        sock.sendall(payload)
        buffer = b""
        ttfc: float | None = None
        delays: list[float] = []
        while True:
            data = sock.recv(65536)
            now = time.monotonic_ns()
            if not data:
                break
            buffer += data
            if ttfc is None and b"\r\n\r\n" in buffer and b"data: " in buffer:
                ttfc = time.perf_counter() - t0
            while b"data: " in buffer and b"\n\n" in buffer.split(b"data: ", 1)[1]:
                event, buffer = buffer.split(b"data: ", 1)[1].split(b"\n\n", 1)
                sent = int(event.split()[1])
                delays.append((now - sent) / 1e6)
            if buffer.endswith(b"0\r\n\r\n"):
                break
        sock.close()
        assert ttfc is not None, "no chunk arrived"
        return ttfc, delays


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def interleaved(calls: list[Callable[[], float]], n: int) -> list[list[float]]:
    """`n` timings of each call, in rotating order (noise hits all alike), in ms."""
    out: list[list[float]] = [[] for _ in calls]
    for i in range(n):
        for j in range(len(calls)):
            k = (i + j) % len(calls)
            out[k].append(calls[k]() * 1000)
    return out


EMBEDDED = """
import asyncio, signal, sys
from mitmproxy import master, options
from maka_eval.egress.proxy import builtin_addons

async def main():
    opts = options.Options()
    proxy = master.Master(opts)
    proxy.addons.add(*builtin_addons())
    opts.update(listen_host="127.0.0.1", listen_port=int(sys.argv[1]), confdir=sys.argv[2])
    opts.update(stream_large_bodies="1")
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, proxy.shutdown)
    await proxy.run()

asyncio.run(main())
"""
"""mitmproxy embedded as the proxy embeds it, with its built-in addons and no other."""


def start_reference(kind: str, confdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A proxy without any egress addon, for reference: `mitmdump` (everything it loads,
    nothing printed per flow) or `embedded`; returns it and its port."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    if kind == "mitmdump":
        argv = [
            *(str(Path(sys.executable).parent / "mitmdump"), "--listen-host", "127.0.0.1"),
            *("--listen-port", str(port), "--set", f"confdir={confdir}", "--set", "flow_detail=0"),
            # Streams every body, as the addons do (else it would hold the whole stream).
            *("--set", "stream_large_bodies=1"),
        ]
    else:
        argv = [sys.executable, "-c", EMBEDDED, str(port), str(confdir)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"the {kind} reference proxy did not start") from None
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="per keep-alive series")
    parser.add_argument("--new-connections", type=int, default=300)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--gap-ms", type=float, default=30.0)
    args = parser.parse_args()

    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    server = multiprocessing.Process(
        target=upstream_main, args=(ports, args.gap_ms / 1000, args.chunks), daemon=True
    )
    server.start()
    upstream = ports.get(timeout=30)
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        proxy = start_proxy(
            state_dir=root / "state",
            publish_dir=root / "published",
            policy=EgressPolicy("terminal-bench"),
            checkpoint_path=root / "provider-usage.json",
            result_token="bench-token",
        )
        print(f"proxy start: {time.perf_counter() - t0:.2f} s (mitmproxy, new CA)")
        references = []
        try:
            references = [
                start_reference("mitmdump", root / "mitmdump-confdir"),
                start_reference("embedded", root / "embedded-confdir"),
            ]
            (dump_proc, dump_port), (emb_proc, emb_port) = references
            direct = Endpoint("direct", "127.0.0.1", upstream, upstream, via_proxy=False)
            paths = [
                (direct, None),
                (Endpoint("mitmdump", "127.0.0.1", dump_port, upstream, True), dump_proc.pid),
                (Endpoint("embedded", "127.0.0.1", emb_port, upstream, True), emb_proc.pid),
                (Endpoint("proxy", proxy.host, proxy.port, upstream, True), proxy.pid),
            ]
            proxied = paths[-1][0]
            for endpoint, _ in paths:  # warm up: connections, caches
                for _ in range(50):
                    endpoint.once("/plain", None, keep_alive=True)
                    endpoint.once("/v1/chat/completions", MODEL_BODY, keep_alive=True)
            print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print(
                "\nlatency p50 / p99 in ms; CPU: the proxy process's CPU time per request\n"
                "(mitmdump: bare, no addons; embedded: mitmproxy with the proxy's built-in "
                "addons, no egress addons)"
            )
            print(
                f"{'':<28}{'direct':>14}{'mitmdump':>15}{'embedded':>15}{'proxy':>15}"
                f"{'added':>15}{'addons share':>15}   CPU ms/request"
            )
            results = {}
            series = [
                ("plain GET, keep-alive", "/plain", None, True, args.requests),
                ("model POST, keep-alive", "/v1/chat/completions", MODEL_BODY, True, args.requests),
                ("plain GET, new connection", "/plain", None, False, args.new_connections),
                (
                    "model POST, new connection",
                    "/v1/chat/completions",
                    MODEL_BODY,
                    False,
                    args.new_connections,
                ),
            ]
            for name, path, body, keep, n in series:
                before = [cpu_seconds(pid) if pid else 0.0 for _, pid in paths]
                a, r, e, b = interleaved(
                    [
                        lambda e=e, path=path, body=body, keep=keep: e.once(path, body, keep)
                        for e, _ in paths
                    ],
                    n,
                )
                cpu = [
                    (cpu_seconds(pid) - t) * 1000 / n if pid else 0.0
                    for (_, pid), t in zip(paths, before, strict=True)
                ]

                def cell(x: float, y: float) -> str:
                    return f"{x:6.2f} /{y:6.2f}"

                added = (pct(b, 0.5) - pct(a, 0.5), pct(b, 0.99) - pct(a, 0.99))
                share = (pct(b, 0.5) - pct(e, 0.5), pct(b, 0.99) - pct(e, 0.99))
                results[name] = added[0]
                print(
                    f"{name:<28}{cell(pct(a, 0.5), pct(a, 0.99)):>14}"
                    f"{cell(pct(r, 0.5), pct(r, 0.99)):>15}{cell(pct(e, 0.5), pct(e, 0.99)):>15}"
                    f"{cell(pct(b, 0.5), pct(b, 0.99)):>15}{cell(*added):>15}{cell(*share):>15}"
                    f"   mitmdump {cpu[1]:.2f}, embedded {cpu[2]:.2f}, proxy {cpu[3]:.2f}"
                )

            ttfc: dict[str, list[float]] = {endpoint.name: [] for endpoint, _ in paths}
            delays_direct, delays_proxy = [], []
            for _ in range(args.streams):
                for endpoint, _ in paths:
                    t, d = endpoint.stream()
                    ttfc[endpoint.name].append(t * 1000)
                    if endpoint is direct:
                        delays_direct += d
                    elif endpoint is proxied:
                        delays_proxy += d
            expected = args.streams * args.chunks
            p50 = statistics.median
            ttfc_added = p50(ttfc["proxy"]) - p50(ttfc["direct"])
            print(
                f"\nstreaming ({args.streams} streams x {args.chunks} chunks, "
                f"{args.gap_ms:g} ms apart, a new connection each)"
            )
            print(
                f"  time to first chunk p50: direct {p50(ttfc['direct']):.2f} ms, mitmdump "
                f"{p50(ttfc['mitmdump']):.2f} ms, embedded {p50(ttfc['embedded']):.2f} ms, "
                f"proxy {p50(ttfc['proxy']):.2f} ms; added {ttfc_added:.2f} ms (addons' share "
                f"{p50(ttfc['proxy']) - p50(ttfc['embedded']):.2f} ms)"
            )
            print(
                f"  chunk delay after the upstream sent it: direct p50 "
                f"{pct(delays_direct, 0.5):.2f} / max {max(delays_direct):.2f} ms; proxy p50 "
                f"{pct(delays_proxy, 0.5):.2f} / p99 {pct(delays_proxy, 0.99):.2f} / max "
                f"{max(delays_proxy):.2f} ms ({len(delays_proxy)}/{expected} chunks)"
            )
            held_back_ms = args.gap_ms / 2  # held until the next chunk: a whole gap late
            held = [d for d in delays_proxy if d > held_back_ms]
            late_direct = [d for d in delays_direct if d > held_back_ms]
            checkpoint = proxy.read_checkpoint()
            print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        finally:
            for proc, _ in references:
                proc.terminate()
                proc.wait()
            proxy.stop()
            server.terminate()

    keepalive = max(results["plain GET, keep-alive"], results["model POST, keep-alive"])
    print()
    print(
        f"{verdict(keepalive <= TARGET_KEEPALIVE_P50_MS)}  p50 added with keep-alive "
        f"{keepalive:.2f} ms (worst series) <= {TARGET_KEEPALIVE_P50_MS:g} ms"
    )
    print(
        f"{verdict(ttfc_added <= TARGET_TTFC_MS)}  TTFC overhead {ttfc_added:.2f} ms "
        f"<= {TARGET_TTFC_MS:g} ms"
    )
    print(
        f"{verdict(not held and len(delays_proxy) == expected)}  no chunk held back: "
        f"{len(held)} of {len(delays_proxy)} arrived more than {held_back_ms:g} ms (half a "
        f"gap) after they were sent (directly, with no proxy: {len(late_direct)}, which is "
        "the machine's own scheduling delay)"
    )
    print(f"(the checkpoint counted {getattr(checkpoint, 'requests', '?')} model requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
