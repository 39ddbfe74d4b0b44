"""The relay's egress gate: capability sets and the network namespace of a process
started like the subject; and the files and variables a policed subject gets."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.relay.environment import RESOLV_CONF, egress_environment, hosts_file
from maka_eval.relay.gate import PROBE_SCRIPT, Evidence, read_evidence, refusal
from maka_eval.relay.plan import AttemptPlan, EgressPlan

CLEAN = {"CapInh": 0, "CapPrm": 0x800405FB, "CapEff": 0x800405FB, "CapBnd": 0x800405FB}
CLEAN["CapAmb"] = 0
NET_RAW = 1 << 13
NET_ADMIN = 1 << 12


def test_a_context_without_net_raw_or_net_admin_in_the_policed_namespace_passes():
    assert refusal(Evidence(dict(CLEAN), "4:4026532178"), "4:4026532178") is None
    # readlink's form, where the image has no stat
    assert refusal(Evidence(dict(CLEAN), "net:[4026532178]"), "4:4026532178") is None


@pytest.mark.parametrize("held", ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"])
def test_net_raw_in_any_set_refuses(held):
    caps = dict(CLEAN)
    caps[held] |= NET_RAW
    why = refusal(Evidence(caps, "4:1"), "4:1")
    assert why is not None and f"CAP_NET_RAW (in {held})" in why
    assert "CAP_NET_ADMIN" not in why


def test_net_admin_in_the_bounding_set_alone_refuses():
    caps = dict(CLEAN, CapBnd=CLEAN["CapBnd"] | NET_ADMIN)
    why = refusal(Evidence(caps, "4:1"), "4:1")
    assert why is not None and "CAP_NET_ADMIN (in CapBnd)" in why


def test_another_namespace_or_unreadable_evidence_refuses():
    assert "not in the network namespace" in (refusal(Evidence(CLEAN, "4:2"), "4:1") or "")
    assert "not in the network namespace" in (refusal(Evidence(CLEAN, "net:[2]"), "4:1") or "")
    assert "could not read the subject's network" in (refusal(Evidence(CLEAN, None), "4:1") or "")
    missing = {k: v for k, v in CLEAN.items() if k != "CapAmb"}
    assert "CapAmb missing" in (refusal(Evidence(missing, "4:1"), "4:1") or "")
    assert "could not read" in (refusal(read_evidence("garbage\n"), "4:1") or "")


def test_the_probe_reads_a_real_process():
    out = subprocess.run(["sh", "-c", PROBE_SCRIPT], capture_output=True, text=True, check=True)
    seen = read_evidence(out.stdout)
    info = os.stat("/proc/self/ns/net")
    assert seen.netns == f"{info.st_dev}:{info.st_ino}"
    with open("/proc/self/status") as handle:
        bounding = next(line for line in handle if line.startswith("CapBnd:"))
    assert seen.capabilities["CapBnd"] == int(bounding.split()[1], 16)
    why = refusal(seen, seen.netns)
    if seen.capabilities["CapBnd"] & NET_RAW:  # an ordinary process: the bounding set is full
        assert why is not None and "CAP_NET_RAW (in " in why and "CapBnd" in why
    else:
        assert why is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a root process holds NET_RAW; others do not")
def test_the_relay_refuses_a_plain_process_subject_and_starts_nothing(plan_for, tmp_path):
    from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
    from maka_eval.relay.attempt import run_attempt

    marker = tmp_path / "subject-ran"
    info = os.stat("/proc/self/ns/net")
    egress = EgressPlan(
        namespace="/proc/self/ns/net",
        namespace_identity=f"{info.st_dev}:{info.st_ino}",
        proxy_name="maka-eval-proxy",
        proxy_address="127.0.0.1",
        proxy_port=9,
    )
    plan = replace(plan_for(["touch", str(marker)]), egress=egress)
    outcome = run_attempt(plan, ProcessSupervisor(), CancelToken(), {"PATH": os.environ["PATH"]})
    assert outcome.classification.status is AttemptStatus.INFRA_FAILED
    assert "CAP_NET_RAW" in (outcome.classification.reason or "")
    assert not marker.exists()
    assert outcome.subject_started_at is None


def test_an_egress_plan_survives_json(plan_for):
    egress = EgressPlan(
        namespace="/run/netns/maka-eval-0123abcd-0123456789",
        namespace_identity="4:4026532178",
        proxy_name="maka-eval-proxy",
        proxy_address="169.254.12.1",
        proxy_port=41234,
        ca_cert="/work/x.egress/publish/mitmproxy-ca-cert.pem",
        policy_digest="ab" * 32,
    )
    plan = replace(plan_for(["true"]), egress=egress)
    assert AttemptPlan.from_json(plan.to_json()) == plan
    assert AttemptPlan.from_json(plan_for(["true"]).to_json()).egress is None


def test_the_policed_subject_gets_the_proxy_and_its_ca_and_no_resolver():
    env = egress_environment("http://maka-eval-proxy:4000", "/maka/egress/ca.pem")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://maka-eval-proxy:4000"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1"
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert env[name] == "/maka/egress/ca.pem"
    base = "127.0.0.1 localhost\n10.0.0.9 maka-eval-proxy # stale\n::1 localhost\n"
    pinned = hosts_file({"maka-eval-proxy": "169.254.1.1"}, base)
    assert pinned.splitlines() == [
        "127.0.0.1 localhost",
        "::1 localhost",
        "169.254.1.1\tmaka-eval-proxy",
    ]
    assert "nameserver" not in RESOLV_CONF


def test_the_gate_stays_in_the_standard_library():
    code = (
        "import sys, maka_eval.relay.gate, maka_eval.relay.environment;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('pydantic', 'typer', 'rich', 'yaml', 'click', 'docker', 'mitmproxy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
