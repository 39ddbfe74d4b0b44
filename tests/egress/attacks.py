"""Attacks on a policed cell's network, run for real by a subject (tests and bench).

`PROBE` is the subject: a Python program (standard library only: python3 is the one
tool both sandboxes have) that tries every way out it knows and prints one JSON line
per attempt: {"attack", "expect": "blocked" | "allowed", "ok", "detail"}, where `ok`
means the expectation held. `run_cell` runs it through the local executor, in either
backend, with a live bait on the host side of the cell's veth (a TCP listener and a UDP
echo on the proxy's own address, another port; they would answer if anything got
through) and an allowed upstream HTTP server on the host's loopback (reached only
through the proxy, which runs on the host).

tests/egress/test_enforcement_process.py, tests/egress/test_enforcement_container.py and
bench/egress_attacks.py all use this one catalogue.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maka_eval.executors.load import load_experiment_file
from maka_eval.local import netns
from maka_eval.local.executor import LocalRun, RunOptions, RunReport
from maka_eval.spec.task_directory import load_tasks
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment, write_script

BAIT_PORT = 18080
"""The bait's port on the proxy's address (each cell's address is its own: always free)."""
UPSTREAM_HOST = "127.0.0.2"
"""The allowed upstream's address: the host's loopback, which only the proxy can reach
(and not 127.0.0.1, which NO_PROXY sends straight to the cell's own loopback)."""
UPSTREAM_BODY = b"upstream-ok"
BLOCKED_HOST = "contamination.example"
"""Blocked by the spec's own entry (the rest by the terminal-bench preset)."""
PYTHON_IMAGE = "localhost/maka-eval/debian-python:bookworm"

PROBE = Path(__file__).with_name("attack_probe.py")
"""The subject: a script of its own, copied next to each experiment."""


# -- the host side ---------------------------------------------------------------------------
class _Upstream(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", str(len(UPSTREAM_BODY)))
        self.end_headers()
        self.wfile.write(UPSTREAM_BODY)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class HostSide:
    """The allowed upstream, and the baits put on each cell's proxy address."""

    upstream: http.server.ThreadingHTTPServer
    seen: list[str] = field(default_factory=list)
    bait_hits: list[str] = field(default_factory=list)
    networks: list[netns.CellNetwork] = field(default_factory=list)
    _closers: list[Any] = field(default_factory=list)

    @property
    def upstream_url(self) -> str:
        return f"http://{UPSTREAM_HOST}:{self.upstream.server_address[1]}/ok"

    def bait(self, network: netns.CellNetwork) -> None:
        """A TCP listener and a UDP echo on the proxy's address, another port."""
        self.networks.append(network)
        tcp = socket.create_server((network.host_address, BAIT_PORT))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((network.host_address, BAIT_PORT))
        self._closers += [tcp, udp]

        def serve_tcp() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, peer = tcp.accept()
                    self.bait_hits.append(f"tcp from {peer}")
                    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nbait")
                    conn.close()

        def serve_udp() -> None:
            with contextlib.suppress(OSError):
                while True:
                    data, peer = udp.recvfrom(512)
                    if peer is None:  # shut down
                        return
                    self.bait_hits.append(f"udp from {peer}")
                    udp.sendto(data, peer)

        for target in (serve_tcp, serve_udp):
            threading.Thread(target=target, daemon=True).start()

    def close(self) -> None:
        for sock in self._closers:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.upstream.shutdown()
        self.upstream.server_close()


@contextlib.contextmanager
def host_side(monkeypatch: Any) -> Iterator[HostSide]:
    """The upstream server, and every cell namespace made meanwhile baited."""
    seen: list[str] = []
    handler = type("Upstream", (_Upstream,), {"seen": seen})
    server = http.server.ThreadingHTTPServer((UPSTREAM_HOST, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    side = HostSide(server, seen)
    create = netns.create

    def baited(run_id: str, cell_id: str) -> netns.CellNetwork:
        network = create(run_id, cell_id)
        side.bait(network)
        return network

    monkeypatch.setattr(netns, "create", baited)
    try:
        yield side
    finally:
        side.close()


def host_resolvers() -> list[str]:
    """The nameservers this machine uses (the cell must not reach them)."""
    found = []
    with contextlib.suppress(OSError), open("/etc/resolv.conf") as handle:
        for line in handle:
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver" and ":" not in words[1]:
                found.append(words[1])
    return found


def host_addresses() -> list[str]:
    """This machine's own IPv4 addresses but loopback (nothing may reach them)."""
    found = []
    for link in json.loads(netns._must(["ip", "-4", "-j", "addr", "show"]) or "[]"):
        for info in link.get("addr_info", ()):
            local = info.get("local", "")
            if local and not local.startswith(("127.", "169.254.")):
                found.append(local)
    return found


# -- the experiment ----------------------------------------------------------------------------
@dataclass
class CellRun:
    """One run of the probe in one backend, and what it left."""

    report: RunReport
    run_dir: Path
    results: list[dict[str, Any]]
    side: HostSide

    @property
    def record(self) -> Any:
        return read_run(self.run_dir).attempts(self.report.records[0].cell_id)[-1]

    def artifact(self, name: str) -> bytes:
        return artifact_path(self.run_dir, self.record, name).read_bytes()


def write_probe(root: Path) -> Path:
    return write_script(root / "attack_probe.py", PROBE.read_text())


def experiment(
    root: Path, side: HostSide, *, container: bool, extra_block: tuple[str, ...] = ()
) -> Path:
    """An experiment of one task whose subject is the probe, policed by the proxy."""
    toml = f'[environment]\ndocker_image = "{PYTHON_IMAGE}"\n' if container else None
    make_task(root / "tasks", "t1", test_sh=REWARD_ONE, toml=toml)
    write_probe(root)
    subject = {
        "id": "attacker",
        "kind": "external",
        "config": {
            "command": "./attack_probe.py",
            "env": {
                "ATTACK_BAIT_PORT": str(BAIT_PORT),
                "ATTACK_UPSTREAM": side.upstream_url,
                "ATTACK_RESOLVERS": ",".join(host_resolvers()),
                "ATTACK_HOST_ADDRESSES": ",".join(host_addresses()),
                "ATTACK_BLOCKED_HOST": BLOCKED_HOST,
            },
        },
    }
    config: dict[str, Any] = {
        "egress": {"mode": "proxy", "block": [BLOCKED_HOST, *extra_block]},
        "sandbox": "container" if container else "process",
    }
    if not container:
        config["isolation"] = "namespaces"
    doc = spec(subjects=[subject], executor={"kind": "local", "config": config})
    return write_experiment(root, doc)


def run(path: Path, run_dir: Path, env: dict[str, str], **options: Any) -> RunReport:
    loaded = load_experiment_file(path)
    tasks = load_tasks(loaded.experiment, loaded.base_dir)
    return LocalRun(loaded, tasks, run_dir, options=RunOptions(**options), host_env=env).run()


def run_cell(
    root: Path, side: HostSide, *, container: bool, engine: str | None = None, **options: Any
) -> CellRun:
    """Run the probe once in one backend; its results, parsed."""
    path = experiment(root, side, container=container)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env["MAKA_EVAL_WORK_DIR"] = os.environ.get("MAKA_EVAL_WORK_DIR", str(root / "work"))
    Path(env["MAKA_EVAL_WORK_DIR"]).mkdir(parents=True, exist_ok=True)
    if engine is not None:
        env["DOCKER_HOST"] = engine
    run_dir = root / "runs" / ("container" if container else "process")
    report = run(path, run_dir, env, **options)
    record = report.records[0]
    results: list[dict[str, Any]] = []
    if "subject.stdout" in {a.name for a in record.result.artifacts}:
        text = artifact_path(run_dir, record, "subject.stdout").read_text()
        results = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return CellRun(report, run_dir, results, side)


def failures(results: list[dict[str, Any]]) -> list[str]:
    """Every expectation that did not hold, readably."""
    return [f"{r['attack']}: expected {r['expect']}, {r['detail']}" for r in results if not r["ok"]]
