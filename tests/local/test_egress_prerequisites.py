"""A spec that declares an egress policy never runs unenforced: where this machine cannot
police a cell, `validate` and `run` refuse it, naming executor.config.egress and what is
missing. Also: how the plan follows the policy (mode none, allow_internet = false), and
the record's policy digest (old records without it still read)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.expand import Cell
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.errors import PrerequisiteError
from maka_eval.executors.load import experiment_from_data
from maka_eval.local import prerequisites
from maka_eval.local.plans import attempt_plan, egress_mode
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.relay.plan import EgressPlan
from maka_eval.sandbox.container.engine import EngineInfo, EngineProbe
from maka_eval.spec.task_directory import load_task
from tests.helpers import make_task, spec

PODMAN = EngineInfo("unix:///run/maka-eval/podman.sock", "Podman", "4.3.1", "1.41", gpus=False)
DOCKER = EngineInfo("unix:///var/run/docker.sock", "Docker", "27.0", "1.46", gpus=False)
IMAGE_TOML = '[environment]\ndocker_image = "debian:bookworm-slim"\n'


def egress_spec(mode: str = "proxy", **config) -> dict:
    return spec(executor={"kind": "local", "config": {"egress": {"mode": mode}, **config}})


def refusal(setup, monkeypatch, doc, tasks=None, engine=None) -> str:
    monkeypatch.setattr(prerequisites, "engine_info", lambda env: EngineProbe(engine, ()))
    s = setup(doc, tasks)
    with pytest.raises(PrerequisiteError) as info:
        s.run()
    assert not s.run_dir.exists()  # nothing started, no run folder
    return info.value.render()


def test_where_namespaces_and_nftables_are_missing_a_policy_is_refused(setup, monkeypatch):
    why = "network namespaces and nftables need root (run maka-eval as root)"
    monkeypatch.setattr(prerequisites, "enforcement_unavailable", lambda: why)
    text = refusal(setup, monkeypatch, egress_spec(isolation="namespaces"))
    assert f"executor.config.egress: mode 'proxy' declares an egress policy, but {why}" in text
    assert "never runs unenforced" in text


def test_a_policy_without_nft_names_the_package(setup, monkeypatch):
    why = "'nft' is not installed (Debian package nftables)"
    monkeypatch.setattr(prerequisites, "enforcement_unavailable", lambda: why)
    text = refusal(setup, monkeypatch, egress_spec(isolation="namespaces"))
    assert "executor.config.egress" in text and "Debian package nftables" in text


@pytest.mark.parametrize("mode", ["proxy", "none"])
def test_process_tasks_without_their_own_namespaces_are_refused(setup, monkeypatch, mode):
    monkeypatch.setattr(prerequisites, "enforcement_unavailable", lambda: None)
    text = refusal(setup, monkeypatch, egress_spec(mode, isolation="none"))
    assert f"executor.config.egress: mode '{mode}' needs every task run as processes (t1)" in text
    assert "executor.config.isolation is 'none'" in text


def test_containers_need_an_engine_that_joins_a_namespace_by_path(setup, monkeypatch):
    monkeypatch.setattr(prerequisites, "enforcement_unavailable", lambda: None)
    doc = egress_spec(sandbox="container")
    text = refusal(setup, monkeypatch, doc, {"t1": {"toml": IMAGE_TOML}}, DOCKER)
    assert "executor.config.egress" in text and "only Podman has the ns: network mode" in text
    assert "tasks t1 need it" in text


def test_a_task_without_internet_needs_no_proxy(setup, monkeypatch):
    # allow_internet = false wins: no namespace, no proxy, nothing to enforce but 'none'.
    monkeypatch.setattr(
        prerequisites, "enforcement_unavailable", lambda: "network namespaces need root"
    )
    monkeypatch.setattr(prerequisites, "engine_info", lambda env: EngineProbe(DOCKER, ()))
    s = setup(
        egress_spec(sandbox="container"),
        {"t1": {"toml": IMAGE_TOML + "allow_internet = false\n"}},
    )
    loaded, tasks = s.load()
    commands = prerequisites.check_prerequisites(loaded, tasks, {"PATH": "/usr/bin:/bin"})
    assert commands.containers == {"t1"}


def _plan(tmp_path: Path, toml: str, mode: str | None, egress: EgressPlan | None = None):
    make_task(tmp_path / "tasks", "t1", toml=toml)
    task, problems = load_task("t1", tmp_path / "tasks" / "t1", "tasks[0]", host_env={})
    assert task is not None, problems
    config = {"egress": {"mode": mode}} if mode else {}
    experiment, _ = experiment_from_data(spec(executor={"kind": "local", "config": config}))
    commands = ResolvedCommands({}, None, containers=frozenset({"t1"}), engine=PODMAN)
    plan = attempt_plan(
        experiment=experiment,
        cell=Cell("t1::1::done", "t1", 1, "done"),
        task=task,
        commands=commands,
        run_id="r",
        attempt_id="r/a/1",
        attempt_root=tmp_path / "attempt",
        artifacts_dir=tmp_path / "artifacts",
        egress=egress,
    )
    return egress_mode(experiment, task), plan


EGRESS = EgressPlan("/run/netns/x", "4:1", "maka-eval-proxy", "169.254.9.1", 4000)


def test_the_plan_follows_the_policy(tmp_path):
    cases = [
        (IMAGE_TOML, None, None, None, "public"),
        (IMAGE_TOML, "none", None, "none", "no-network"),
        (IMAGE_TOML, "proxy", EGRESS, "proxy", "public"),
        (IMAGE_TOML, "proxy", None, "proxy", "no-network"),  # not prepared: fail closed
        (IMAGE_TOML + "allow_internet = false\n", "proxy", EGRESS, "none", "no-network"),
    ]
    for n, (toml, mode, egress, resolved, network) in enumerate(cases):
        found, plan = _plan(tmp_path / str(n), toml, mode, egress)
        assert found == resolved
        assert plan.container is not None and plan.container.network == network
        assert plan.egress == (egress if resolved == "proxy" else None)


def _record(**changes) -> AttemptRecord:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    kernel = ResultKernel(
        status=AttemptStatus.COMPLETED,
        score=1.0,
        usage=None,
        cost_usd=None,
        duration_sec=1.0,
        artifacts=(),
        status_source=StatusSource.VERIFIER,
    )
    record = AttemptRecord(
        run_id="r",
        experiment_id="e",
        cell_id="t1::1::s",
        task_id="t1",
        repetition=1,
        subject_id="s",
        attempt=1,
        attempt_id="r/t1::1::s/1",
        trigger=Trigger.SCHEDULED,
        started_at=now,
        subject_started_at=now,
        finished_at=now,
        result=kernel,
        host="h",
        maka_eval_version="0",
    )
    return replace(record, **changes)


def test_the_record_carries_the_policy_digest_and_old_records_still_read():
    old = _record()
    assert "egressPolicyDigest" not in old.to_dict()
    assert AttemptRecord.from_json(old.to_json_bytes()) == old
    policed = _record(egress_policy_digest="ab" * 32)
    assert policed.to_dict()["egressPolicyDigest"] == "ab" * 32
    assert AttemptRecord.from_json(policed.to_json_bytes()) == policed
    bad = json.loads(policed.to_json_bytes())
    bad["egressPolicyDigest"] = "not-a-digest"
    with pytest.raises(ContractError, match="egressPolicyDigest"):
        AttemptRecord.from_dict(bad)
