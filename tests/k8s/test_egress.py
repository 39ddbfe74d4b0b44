"""The operator's side of the egress gateway (settings, the key Secret, the address) and
the relay in a proxied Pod."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval.egress import credential
from maka_eval.engine.expand import expand
from maka_eval.k8s import egress
from maka_eval.k8s.egress import (
    GatewayAccess,
    GatewaySettings,
    gateway_access,
    operator_namespace,
    split_address,
)
from maka_eval.k8s.render import attempt_plan, executor_config
from maka_eval.relay.__main__ import EXIT_BAD_PLAN
from maka_eval.relay.__main__ import main as relay_main
from maka_eval.relay.plan import OWN_NETWORK, AttemptPlan, with_task_settings
from maka_eval.spec.load import experiment_from_data
from tests.helpers import make_task
from tests.k8s.conftest import REPO

KEY = "0123456789abcdef0123456789abcdef"


def secrets(data: Mapping[str, Mapping[str, Any]]) -> Any:
    def get(namespace: str, name: str) -> Mapping[str, Any] | None:
        return data.get(f"{namespace}/{name}")

    return get


def encoded(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def test_the_defaults_name_the_gateway_service_in_the_operators_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    account = tmp_path / "namespace"
    monkeypatch.setattr(egress, "_SERVICE_ACCOUNT_NAMESPACE", account)
    assert operator_namespace({}) == "maka-eval-system"  # outside a cluster
    account.write_text("from-sa\n")
    assert operator_namespace({}) == "from-sa"  # in a Pod with a ServiceAccount
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    assert operator_namespace() == "ops"  # the Deployment's downward API wins
    settings = GatewaySettings.make()
    assert (settings.host, settings.port) == ("maka-eval-egress-gateway.ops.svc", 3128)
    assert (settings.namespace, settings.key_secret, settings.key_name) == (
        "ops",
        "maka-eval-egress-gateway",
        "key",
    )
    other = GatewaySettings.make("10.0.0.5:8080", namespace="gw", key_secret="k")
    assert (other.host, other.port, other.namespace, other.key_secret) == (
        "10.0.0.5",
        8080,
        "gw",
        "k",
    )


def test_gateway_addresses_parse_or_are_refused() -> None:
    assert split_address("gw.example:3129") == ("gw.example", 3129)
    assert split_address("gw.example") == ("gw.example", 3128)
    assert split_address("[fd00::1]:3128") == ("fd00::1", 3128)
    for bad in ("gw:port", "gw:0", ":3128", "gw:70000"):
        with pytest.raises(ValueError):
            split_address(bad)


def test_the_key_and_the_address_give_the_route_and_attempt_credentials() -> None:
    settings = GatewaySettings.make("gateway.test:3128", namespace="gw")
    found = gateway_access(
        settings,
        secrets({"gw/maka-eval-egress-gateway": {"data": {"key": encoded(KEY + "\n")}}}),
        resolve=lambda host, port: "10.96.0.7",
    )
    assert isinstance(found, GatewayAccess)
    assert found.route.url == "http://gateway.test:3128"
    assert (found.route.address, found.route.pinned) == ("10.96.0.7", True)
    value = found.credential("evals", "hello-x-1")
    header = credential.proxy_authorization(value)
    # What the gateway, holding the same Secret's bytes, accepts.
    assert credential.verify([credential.load_key(KEY.encode())], header) == "evals/hello-x-1"
    by_ip = gateway_access(
        GatewaySettings.make("127.0.0.1:9999", namespace="gw"),
        secrets({"gw/maka-eval-egress-gateway": {"stringData": {"key": KEY}}}),
        resolve=lambda host, port: pytest.fail("an IP is not resolved"),
    )
    assert isinstance(by_ip, GatewayAccess) and not by_ip.route.pinned


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({}, "does not exist"),
        ({"gw/maka-eval-egress-gateway": {"data": {"other": encoded(KEY)}}}, "has no key 'key'"),
        ({"gw/maka-eval-egress-gateway": {"data": {"key": encoded("short")}}}, "at least 16"),
    ],
)
def test_a_missing_or_weak_key_is_a_problem_naming_the_fix(
    stored: dict[str, Any], expected: str
) -> None:
    found = gateway_access(
        GatewaySettings.make(namespace="gw"), secrets(stored), resolve=lambda h, p: "10.0.0.1"
    )
    assert isinstance(found, list) and len(found) == 1
    (problem,) = found
    assert problem.where == "spec.executor.config.egress"
    assert expected in problem.message and "maka-eval-egress-gateway" in problem.message


def test_a_gateway_that_does_not_resolve_is_a_problem() -> None:
    def unresolvable(host: str, port: int) -> str:
        raise OSError(f"[Errno -2] Name or service not known: {host}")

    found = gateway_access(
        GatewaySettings.make(namespace="gw"),
        secrets({"gw/maka-eval-egress-gateway": {"data": {"key": encoded(KEY)}}}),
        resolve=unresolvable,
    )
    assert isinstance(found, list)
    (problem,) = found
    assert "maka-eval-egress-gateway.gw.svc:3128 does not resolve" in problem.message
    assert "--egress-gateway" in problem.message


# -- the relay in a proxied Pod -----------------------------------------------------------------


def _pod_plan(tmp_path: Path, toml: str | None) -> AttemptPlan:
    """The relay plan the operator renders for a proxied experiment, its task replaced
    by one on disk with this task.toml."""
    doc = yaml.safe_load((REPO / "examples" / "hello" / "experiment.k8s.yaml").read_text())
    doc["spec"]["executor"]["config"]["egress"] = {"mode": "proxy"}
    experiment, _ = experiment_from_data(doc)
    cell = expand(experiment).cells[0]
    plan = attempt_plan(experiment, cell, "uid/cell/1", executor_config(experiment))
    task = make_task(tmp_path / "tasks", cell.task_id, toml=toml)
    return replace(plan, task_dir=str(task))


def test_a_task_that_allows_no_network_leaves_the_pods_network(tmp_path: Path) -> None:
    public = with_task_settings(_pod_plan(tmp_path / "a", None))
    assert public.egress is not None and public.egress.namespace == OWN_NETWORK
    closed = with_task_settings(
        _pod_plan(tmp_path / "b", "[environment]\nallow_internet = false\n")
    )
    assert closed.egress is None  # namespaces isolation: an empty network namespace


def test_without_a_namespace_such_a_task_is_not_run_at_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _pod_plan(tmp_path, "[environment]\nallow_internet = false\n")
    result = tmp_path / "result.json"
    code = relay_main(
        ["--plan-json", replace(plan, isolation="none").to_json(), "--result", str(result)]
    )
    assert code == EXIT_BAD_PLAN and not result.exists()
    assert "allows no network" in capsys.readouterr().err
