"""Egress enforcement in the process sandbox, for real: a subject in a policed cell tries
every way out (tests/egress/attacks.py) and gets nowhere but through the proxy; the
namespace's two nftables layers hold on their own; the relay's gate refuses a subject
that keeps NET_RAW or is not in the policed namespace; nothing is left behind.

Root, nftables and bubblewrap are needed; without them these tests skip, saying why.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from maka_eval.egress.policy import EgressPolicy
from maka_eval.engine.status import AttemptStatus
from maka_eval.local import netns
from maka_eval.sandbox import process
from maka_eval.store.run_store import artifact_path, read_run
from tests.egress import attacks
from tests.egress.policing import POLICED
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment

pytestmark = POLICED

S = AttemptStatus


def nothing_left(run_id: str) -> None:
    assert netns.leftovers(run_id) == []
    assert netns.leftover_tables(run_id) == []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = {netns.namespace_name(run_id, cell) for cell in ("t1::1::attacker", "t1::1::s")}
    assert not any(netns._host_interface(n) in links for n in names)


def in_namespace(path: str, code: str) -> dict:
    """Run Python in a namespace as the test harness (root, every capability)."""
    proc = subprocess.run(
        ["nsenter", f"--net={path}", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


CONNECT = """
import json, socket
def tcp(host, port):
    s = socket.socket(); s.settimeout(1.5)
    try:
        s.connect((host, port)); return "connected"
    except Exception as exc:
        return type(exc).__name__
    finally:
        s.close()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5)
    try:
        s.sendto(b"x", (host, port)); s.recv(16); return "answered"
    except Exception as exc:
        return type(exc).__name__
    finally:
        s.close()
"""


def test_no_way_out_of_a_process_cell_but_the_proxy(tmp_path, monkeypatch):
    with attacks.host_side(monkeypatch) as side:
        cell = attacks.run_cell(tmp_path, side, container=False, keep_workspaces=True)
    results, record = cell.results, cell.record
    assert record.result.status is S.COMPLETED, record.result.reason
    assert record.result.isolation == "namespaces"
    assert len(results) >= 35, results
    assert attacks.failures(results) == []
    assert {r["attack"] for r in results if r["expect"] == "allowed"} >= {
        "the allowed upstream through the proxy",
        "curl to the allowed upstream through the proxy",
    }
    # The baits on the proxy's own address never heard a thing; the upstream saw only the
    # allowed requests (the blocked ones that named it in a query never left the proxy).
    assert side.bait_hits == []
    assert side.seen == ["/ok", "/ok"]
    # The secrets the subject looked for were where it looked, on the host.
    egress_dir = cell.report.work_dir / "t1__1__attacker__1.egress"
    assert (egress_dir / "state" / "audit" / "audit.jsonl").is_file()
    assert (egress_dir / "state" / "result-token").is_file()
    # The CA key was there while the subject ran; it does not outlive the proxy.
    assert not (egress_dir / "state" / "confdir").exists()
    assert (egress_dir / "publish" / "mitmproxy-ca-cert.pem").is_file()
    secrets = next(r for r in results if r["attack"].startswith("read the proxy's CA key"))
    assert secrets["ok"] and secrets["detail"] == "no answer"
    # The record: the policy's digest, the audit log as an artifact, the per-cell costs.
    policy = EgressPolicy("terminal-bench", [attacks.BLOCKED_HOST])
    assert record.egress_policy_digest == policy.digest
    entry = next(a for a in record.result.artifacts if a.name == "egress/audit.jsonl")
    audit = cell.artifact("egress/audit.jsonl")
    assert (entry.bytes, entry.sha256) == (len(audit), hashlib.sha256(audit).hexdigest())
    lines = [json.loads(line) for line in audit.splitlines()]
    text = audit.decode()
    assert "laude-institute/terminal-bench" in text and attacks.BLOCKED_HOST in text
    assert any("/ok" in json.dumps(line) for line in lines)
    assert {"egressSetupSec", "egressTeardownSec", "egressNamespaceSetupSec"} <= set(record.timings)
    assert record.timings["egressNamespaceSetupSec"] < 1.0
    nothing_left(record.run_id)


def _gate_experiment(root: Path) -> Path:
    make_task(root / "tasks", "t1", test_sh=REWARD_ONE)
    subject = {
        "id": "s",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", "echo the-subject-ran"]},
    }
    config = {"egress": {"mode": "proxy"}, "isolation": "namespaces", "sandbox": "process"}
    doc = spec(
        subjects=[subject],
        executor={"kind": "local", "config": config},
        execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
    )
    return write_experiment(root, doc)


def _refused(root: Path) -> tuple[str, object]:
    env = {"PATH": os.environ["PATH"], "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"]}
    report = attacks.run(_gate_experiment(root), root / "run", env)
    record = read_run(root / "run").attempts("t1::1::s")[-1]
    assert len(report.records) == 1
    assert record.result.status is S.INFRA_FAILED
    names = {a.name for a in record.result.artifacts}
    assert "subject.stdout" not in names  # the subject never started
    assert record.subject_started_at is None
    nothing_left(record.run_id)
    return record.result.reason or "", record


def test_the_gate_refuses_a_subject_that_keeps_net_raw(tmp_path, monkeypatch):
    # A sandbox that drops NET_ADMIN but forgets NET_RAW.
    monkeypatch.setattr(process, "SUBJECT_CAPS", (*process.SUBJECT_CAPS, "net_raw"))
    reason, _ = _refused(tmp_path)
    assert "refused to start the subject" in reason
    assert "CAP_NET_RAW" in reason and "CapBnd" in reason and "CAP_NET_ADMIN" not in reason


def test_the_gate_refuses_a_subject_outside_the_policed_namespace(tmp_path, monkeypatch):
    # A sandbox that makes its own network namespace instead of joining the cell's.
    made = process.make_sandbox

    def unpoliced(isolation, supervisor, attempt_id, layout, network=None, pool=None):
        return made(isolation, supervisor, attempt_id, layout, None, pool)

    # The relay makes it through the registry's process backend (sandbox.backends).
    monkeypatch.setattr(process, "make_sandbox", unpoliced)
    reason, _ = _refused(tmp_path)
    assert "not in the network namespace the egress policy was applied to" in reason


def test_a_cell_whose_namespace_cannot_be_made_is_an_infrastructure_failure(tmp_path, monkeypatch):
    def broken(run_id: str, cell_id: str) -> netns.CellNetwork:
        raise netns.NetnsError("ip netns add failed: no space in the pool (injected)")

    monkeypatch.setattr(netns, "create", broken)
    reason, record = _refused(tmp_path)
    assert reason.startswith("the execution failed: the cell's egress enforcement could not")
    assert "(injected)" in reason
    assert record.egress_policy_digest == EgressPolicy().digest


def test_mode_none_and_allow_internet_false_give_loopback_only(tmp_path):
    show = "cat /proc/net/dev; echo proxies=$(env | grep -ci proxy)"
    subject = {"id": "s", "kind": "external", "config": {"command": "sh", "args": ["-c", show]}}
    make_task(tmp_path / "tasks", "t1", test_sh=REWARD_ONE)
    make_task(
        tmp_path / "tasks", "t2", test_sh=REWARD_ONE, toml="[environment]\nallow_internet = false\n"
    )
    env = {"PATH": os.environ["PATH"], "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"]}
    # Mode none; and mode proxy for a task whose task.toml says allow_internet = false.
    for mode, task in (("none", "t1"), ("proxy", "t2")):
        config = {"egress": {"mode": mode}, "isolation": "namespaces", "sandbox": "process"}
        doc = spec(
            subjects=[subject], tasks=[{"id": task}], executor={"kind": "local", "config": config}
        )
        path = write_experiment(tmp_path, doc, name=f"{mode}.json")
        run_dir = tmp_path / f"run-{mode}"
        record = attacks.run(path, run_dir, env).records[0]
        out = artifact_path(run_dir, record, "subject.stdout").read_text()
        interfaces = [line.split(":")[0].strip() for line in out.splitlines() if ":" in line]
        assert interfaces == ["lo"], out
        assert "proxies=0" in out
        assert record.egress_policy_digest is None
        assert not any(a.name.startswith("egress/") for a in record.result.artifacts)
        assert netns.leftovers(record.run_id) == []


# -- the namespace itself -----------------------------------------------------------------
def test_the_loaded_rules_are_the_policy_and_teardown_removes_everything():
    network = netns.create("test-run-rules", "t1::1::a")
    try:
        network.enforce(3128)
        loaded = network.ruleset()
        expected = netns.inside_ruleset(network.host_address, 3128)
        assert [line.strip() for line in loaded.splitlines() if line.strip()] == [
            line.strip() for line in expected.splitlines() if line.strip()
        ]
        host = subprocess.run(
            ["nft", "list", "table", "inet", network.host_table], capture_output=True, text=True
        ).stdout
        assert f'iifname "{network.host_interface}" drop' in host
        assert "tcp dport 3128 accept" in host
        # Only loopback and the /30 to the proxy: no default route, no IPv6 address.
        routes = subprocess.run(
            ["ip", "-n", network.name, "route", "show"], capture_output=True, text=True
        ).stdout
        assert "default" not in routes and routes.count("\n") == 1
        six = subprocess.run(
            ["ip", "-n", network.name, "-6", "addr", "show", "dev", netns.INSIDE_INTERFACE],
            capture_output=True,
            text=True,
        ).stdout
        assert "inet6" not in six
        assert network.identity == "{0.st_dev}:{0.st_ino}".format(os.stat(network.path))
    finally:
        network.remove()
    assert not Path(network.path).exists()
    assert netns.leftover_tables("test-run-rules") == []
    assert network.teardown_sec < 2.0


def test_the_host_table_alone_keeps_the_namespace_off_other_ports():
    network = netns.create("test-run-host", "t1::1::a")
    servers = []
    try:
        proxy = socket.create_server((network.host_address, 0))
        port = proxy.getsockname()[1]
        bait = socket.create_server((network.host_address, port + 1 if port < 65535 else 1024))
        echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        echo.bind((network.host_address, bait.getsockname()[1]))
        servers += [proxy, bait, echo]

        def answer() -> None:
            try:
                data, peer = echo.recvfrom(16)
                if peer is not None:
                    echo.sendto(data, peer)
            except OSError:
                pass

        threading.Thread(target=answer, daemon=True).start()
        network.enforce(port)
        # The inside table is gone (as if a subject had CAP_NET_ADMIN after all): the
        # host's own table still lets through the proxy's port and nothing else.
        subprocess.run(
            ["nsenter", f"--net={network.path}", "nft", "delete", "table", "inet", "maka_eval"],
            check=True,
        )
        code = (
            CONNECT + f"print(json.dumps({{'proxy': tcp('{network.host_address}', {port}),"
            f" 'bait': tcp('{network.host_address}', {bait.getsockname()[1]}),"
            f" 'udp': udp('{network.host_address}', {bait.getsockname()[1]})}}))"
        )
        seen = in_namespace(network.path, code)
        assert seen == {"proxy": "connected", "bait": "TimeoutError", "udp": "TimeoutError"}
    finally:
        for sock in servers:
            sock.close()
        network.remove()


def test_each_cell_gets_its_own_block_and_leftovers_of_a_dead_writer_go():
    made = [netns.create("dead-writer", f"t{i}::1::a") for i in range(3)]
    other = netns.create("another-run", "t1::1::a")
    try:
        blocks = {n.host_address for n in [*made, other]}
        assert len(blocks) == 4
        for n in made:
            n.enforce(3128)
        assert len(netns.leftovers("dead-writer")) == 3
        assert netns.remove_leftovers("dead-writer") == 3
        assert netns.leftovers("dead-writer") == [] and netns.leftover_tables("dead-writer") == []
        assert netns.leftovers("another-run") == [other.name]  # not this run's: untouched
    finally:
        other.remove()
        for n in made:
            n.remove()


def test_a_block_is_never_one_this_machine_uses():
    name = "some-cell"
    first = netns.pick_block(name, [], [])
    taken = netns.pick_block(name, [first.network_address + 1], [])
    assert taken != first
    routed = netns.pick_block(name, [], [first, taken])
    assert routed not in (first, taken)
    for block in (first, taken, routed):
        assert block.subnet_of(netns.ADDRESS_POOL)
        assert not block.overlaps(ipaddress.IPv4Network("169.254.0.0/24"))
