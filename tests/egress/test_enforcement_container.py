"""Egress enforcement in the container sandbox, for real on Podman: the task's container
joins the cell's policed namespace (Podman's `ns:` network mode through the Docker API),
and a subject in it tries every way out (tests/egress/attacks.py) and gets nowhere but
through the proxy; the relay's gate refuses a container that holds NET_RAW or is not in
the policed namespace; task.toml's allow_internet = false wins over the proxy.

Root and nftables are needed (and the `container_engine` session fixture starts Podman:
hack/podman.sh); without root these tests skip, saying why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from maka_eval import layout
from maka_eval.egress.policy import EgressPolicy
from maka_eval.engine.status import AttemptStatus
from maka_eval.local import netns
from maka_eval.sandbox.container import sandbox as container_sandbox
from maka_eval.sandbox.container.removal import leftover_containers
from maka_eval.store.run_store import artifact_path, read_run
from tests.egress import attacks
from tests.helpers import REWARD_ONE, make_task, spec, write_experiment
from tests.sandbox.conftest import container_engine  # noqa: F401 - the session fixture

WHY_NOT = "egress enforcement needs root" if os.geteuid() != 0 else netns.enforcement_unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"cannot police a cell here: {WHY_NOT}"),
]

S = AttemptStatus
TOML = f'[environment]\ndocker_image = "{attacks.PYTHON_IMAGE}"\n'


def no_containers_left(engine: str, run_id: str) -> None:
    assert leftover_containers(engine, run_id) == []
    assert netns.leftovers(run_id) == [] and netns.leftover_tables(run_id) == []


def test_no_way_out_of_a_container_cell_but_the_proxy(container_engine, tmp_path, monkeypatch):  # noqa: F811
    with attacks.host_side(monkeypatch) as side:
        cell = attacks.run_cell(tmp_path, side, container=True, engine=container_engine)
    results, record = cell.results, cell.record
    assert record.result.status is S.COMPLETED, record.result.reason
    assert record.result.isolation == "container"
    assert len(results) >= 30, results
    assert attacks.failures(results) == []
    trusted = next(r for r in results if r["attack"].startswith("the proxy's CA certificate"))
    assert trusted["detail"] == layout.CONTAINER_CA_CERT_PATH
    assert side.bait_hits == []
    assert side.seen == ["/ok"]
    policy = EgressPolicy("terminal-bench", [attacks.BLOCKED_HOST])
    assert record.egress_policy_digest == policy.digest
    audit = cell.artifact("egress/audit.jsonl").decode()
    assert "laude-institute/terminal-bench" in audit and attacks.BLOCKED_HOST in audit
    no_containers_left(container_engine, record.run_id)


def _engine_creates(monkeypatch: Any, change: Any) -> None:
    """Fault injection: the engine creates the container with changed settings."""
    create = container_sandbox.create_container

    def changed(client: Any, image: str, kwargs: dict[str, Any]) -> str:
        kwargs = dict(kwargs)
        change(kwargs)
        return create(client, image, kwargs)

    monkeypatch.setattr(container_sandbox, "create_container", changed)


def _refused(root: Path, engine: str) -> str:
    make_task(root / "tasks", "t1", test_sh=REWARD_ONE, toml=TOML)
    subject = {"id": "s", "kind": "external", "config": {"command": "echo", "args": ["ran"]}}
    config = {"egress": {"mode": "proxy"}, "sandbox": "container"}
    doc = spec(
        subjects=[subject],
        executor={"kind": "local", "config": config},
        execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
    )
    env = {
        "PATH": os.environ["PATH"],
        "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
        "DOCKER_HOST": engine,
    }
    attacks.run(write_experiment(root, doc), root / "run", env)
    record = read_run(root / "run").attempts("t1::1::s")[-1]
    assert record.result.status is S.INFRA_FAILED
    assert "subject.stdout" not in {a.name for a in record.result.artifacts}
    assert record.subject_started_at is None
    no_containers_left(engine, record.run_id)
    return record.result.reason or ""


def test_the_gate_refuses_a_container_that_holds_net_raw(container_engine, tmp_path, monkeypatch):  # noqa: F811
    # Docker's default capabilities include NET_RAW; a sandbox that forgot to drop it.
    monkeypatch.setattr(container_sandbox, "SUBJECT_CAP_DROP", ())
    _engine_creates(monkeypatch, lambda kw: kw.update(cap_add=[*kw["cap_add"], "NET_RAW"]))
    reason = _refused(tmp_path, container_engine)
    assert "refused to start the subject" in reason
    assert "CAP_NET_RAW" in reason and "CapBnd" in reason


def test_the_gate_refuses_a_container_outside_the_policed_namespace(
    container_engine,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    # The container gets a network of its own (as a task's own networking would).
    _engine_creates(monkeypatch, lambda kw: kw.update(network_mode="none"))
    reason = _refused(tmp_path, container_engine)
    assert "not in the network namespace the egress policy was applied to" in reason


def test_allow_internet_false_wins_over_the_proxy(container_engine, tmp_path):  # noqa: F811
    toml = TOML + "allow_internet = false\n"
    make_task(tmp_path / "tasks", "t1", test_sh=REWARD_ONE, toml=toml)
    show = "cat /proc/net/dev; echo proxies=$(env | grep -ci proxy)"
    subject = {"id": "s", "kind": "external", "config": {"command": "sh", "args": ["-c", show]}}
    doc = spec(
        subjects=[subject],
        executor={"kind": "local", "config": {"egress": {"mode": "proxy"}}},
    )
    env = {
        "PATH": os.environ["PATH"],
        "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
        "DOCKER_HOST": container_engine,
    }
    report = attacks.run(write_experiment(tmp_path, doc), tmp_path / "run", env)
    record = report.records[0]
    assert record.result.status is S.COMPLETED, record.result.reason
    out = artifact_path(tmp_path / "run", record, "subject.stdout").read_text()
    interfaces = [line.split(":")[0].strip() for line in out.splitlines() if ":" in line]
    assert interfaces == ["lo"], out
    assert "proxies=0" in out
    assert record.egress_policy_digest is None
    no_containers_left(container_engine, record.run_id)
