"""The operator's side of the egress gateway (settings, the key Secret, the address) and
the relay in a proxied Pod."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval.egress import credential
from maka_eval.engine.expand import expand
from maka_eval.engine.usage import Usage
from maka_eval.executors.load import experiment_from_data
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
from maka_eval.relay.plan import OWN_NETWORK, AttemptPlan, with_task_dir
from tests.helpers import make_task
from tests.k8s.conftest import NODE_NAME, REPO
from tests.k8s.node_agent import NodeAgent, bwrap_available, egress_image_bin, relay_bundle

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
    public = with_task_dir(_pod_plan(tmp_path / "a", None))
    assert public.egress is not None and public.egress.namespace == OWN_NETWORK
    closed = with_task_dir(_pod_plan(tmp_path / "b", "[environment]\nallow_internet = false\n"))
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


# -- metering in a proxied Pod, on the real API server with the node agent as kubelet --------


@pytest.fixture(scope="module")
def metering_node(
    control_plane: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeAgent]:
    """The node agent with the example's images (as tests/k8s/test_operator.py has it)."""
    if not bwrap_available():
        pytest.fail("the node agent needs bubblewrap and root (hack/test.sh installs it)")
    base = tmp_path_factory.mktemp("node")
    example = REPO / "examples" / "hello" / "experiment.k8s.yaml"
    config = yaml.safe_load(example.read_text())["spec"]["executor"]["config"]
    images = {
        config["relayImage"]: {"/opt/maka-eval": relay_bundle(base / "relay-image")},
        config["benchmarkImage"]: {"/benchmark": REPO / "examples" / "hello"},
        config["taskImage"]: {},
        config["egressImage"]: {"/usr/local/bin": egress_image_bin(base / "egress-image")},
    }
    extra = {REPO, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    agent = NodeAgent(control_plane, NODE_NAME, images, base / "pods", extra_ro=tuple(extra))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


METERED_SUBJECT = """
import json, os, sys, urllib.request
base = sys.argv[1]
tools = [{"type": "web_search"}, {"type": "function", "function": {"name": "run_shell"}}]
def call(**extra):
    body = {"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "hi"}],
            "tools": tools, **extra}
    request = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=60).read()
call()
call(stream=True, stream_options={"include_usage": True})
# The checkpoint is visible to the subject, read-only; the token is not there at all.
checkpoint = "/maka/egress-meter/provider-usage.json"
assert os.path.isfile(checkpoint), checkpoint
try:
    open(checkpoint, "a").close()
except OSError:
    pass
else:
    sys.exit("the subject could write the provider-usage checkpoint")
assert not os.listdir("/var/run/maka-eval/result-token"), "the result token is visible"
assert "MAKA_EVAL_RESULT_TOKEN" not in os.environ
print("called")
"""


@pytest.mark.slow
def test_a_pods_metered_usage_and_cost_reach_the_attempt_result(
    kubectl: Any,
    namespace: str,
    control_plane: Path,
    crds: list[str],
    metering_node: NodeAgent,
    tmp_path: Path,
) -> None:
    """The sidecar meters the subject's model requests; the relay settles it over HTTP,
    verifies its checkpoint with the attempt's result token and puts the usage and its
    cost (spec.metering.prices) in the result kernel the operator records."""
    from tests.egress.fake_provider import FakeProvider
    from tests.egress.gateway_harness import GatewayProcess
    from tests.k8s.test_operator import (
        UPSTREAM_NAME,
        Operator,
        gateway_key_secret,
        get,
        proxied,
        wait_for_phase,
    )

    provider = FakeProvider().__enter__()
    hosts = tmp_path / "gateway-hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n127.0.0.1\t{UPSTREAM_NAME}\n")
    key_file = tmp_path / "gateway-key"
    key_file.write_text(KEY + "\n")
    gateway = GatewayProcess(
        key_file,
        prefix=("bwrap", "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--"),
    ).start()
    secret = gateway_key_secret(namespace)
    secret["data"]["key"] = encoded(KEY + "\n")
    kubectl.apply(secret, namespace)
    op = Operator(
        control_plane,
        namespace,
        tmp_path / "operator.log",
        extra=(
            "--egress-gateway",
            f"127.0.0.1:{gateway.port}",
            "--egress-gateway-namespace",
            namespace,
        ),
    ).start()
    try:
        subjects = [
            {
                "id": name,
                "kind": "external",
                "config": {
                    "command": "python3",
                    "args": ["-c", METERED_SUBJECT, f"http://{UPSTREAM_NAME}:{provider.port}"],
                },
            }
            for name in ("caller", "other")
        ]
        # Two arms: their Pods start together, each with its sidecar on 127.0.0.1:15080
        # of its own network.
        doc = proxied("metered", subjects[0])
        doc["spec"]["subjects"] = subjects
        doc["spec"]["metering"] = {
            "prices": {
                "gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10, "cacheReadPerMTok": 1.25}
            }
        }
        kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
        wait_for_phase(kubectl, namespace, "metered", ("Complete",), op, timeout=180)
        attempts = get(kubectl, "attempts", namespace)["items"]
        assert len(attempts) == 2  # no retry: neither sidecar failed to listen
        one = provider.reported.normalized()
        expected = Usage(
            2 * one.input_tokens, 2 * one.cached_input_tokens, 0, 2 * one.output_tokens
        )
        cost = (
            expected.input_tokens * 2.5
            + expected.cached_input_tokens * 1.25
            + expected.output_tokens * 10
        ) / 1e6
        for attempt in attempts:
            result = attempt["status"]["result"]
            assert result["status"] == "completed", (result, gateway.output()[-3000:])
            assert Usage.from_json(result["usage"]) == expected, result
            assert result["costUsd"] == pytest.approx(cost, abs=1e-9)
            notes = result.get("notes", [])
            assert any("metered by the egress proxy" in n for n in notes), result
        # The provider saw each arm's two calls, without the web tool.
        posts = [r for r in provider.received if r.method == "POST"]
        assert len(posts) == 4
        assert all(
            "web_search" not in r.raw.decode() and "run_shell" in r.raw.decode() for r in posts
        )
        # The token is in the attempt's Secret (the sidecar's), not in the Pod's spec.
        name = attempt["metadata"]["name"]
        stored = get(kubectl, "secret", namespace, f"{name}-egress")["data"]
        token = base64.b64decode(stored["result-token"]).decode()
        pod = get(kubectl, "pod", namespace, name)
        assert token not in json.dumps(pod)
    finally:
        op.stop()
        print(op.tail())
        gateway.stop()
        provider.__exit__(None, None, None)


# -- metering in the rendered Pod (as data) ---------------------------------------------------


def test_the_pod_hands_the_checkpoint_to_the_relay_and_the_token_to_nobody_else() -> None:
    from maka_eval.k8s.render import EGRESS_CHECKPOINT, RESULT_TOKEN_FILE
    from maka_eval.layout import POD_RESULT_TOKEN_DIR as RESULT_TOKEN_DIR
    from tests.k8s.test_render import GATEWAY_KEY, REF, _mounts, proxied, rendered

    doc = proxied()
    doc["spec"]["metering"] = {"prices": {"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10}}}
    made = rendered(doc)
    spec = made["Pod"]["spec"]
    sidecar, subject = spec["initContainers"][-1], spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}

    # The sidecar writes the checkpoint into a memory emptyDir, signed with the token
    # from its Secret...
    args = sidecar["args"]
    assert args[args.index("--checkpoint") + 1] == EGRESS_CHECKPOINT
    token_arg = args[args.index("--result-token-file") + 1]
    assert token_arg == "/var/run/maka-eval/egress-secret/result-token"
    assert volumes["egress-meter"]["emptyDir"]["medium"] == "Memory"
    assert not _mounts(sidecar)["egress-meter"].get("readOnly")
    # ...which the subject's container (the relay) mounts read-only.
    assert _mounts(subject)["egress-meter"]["readOnly"] is True
    # The relay gets the token alone (a projection of one key, never the credential),
    # read-only, and hides the folder from the subject it starts.
    token_volume = volumes["result-token"]["secret"]
    assert token_volume["items"] == [{"key": "result-token", "path": "token"}]
    assert token_volume["secretName"] == made["Secret"]["metadata"]["name"]
    assert _mounts(subject)["result-token"] == {
        "name": "result-token",
        "mountPath": RESULT_TOKEN_DIR,
        "readOnly": True,
    }
    assert "result-token" not in _mounts(sidecar)  # it reads the whole Secret instead
    plan = AttemptPlan.from_json(subject["args"][subject["args"].index("--plan-json") + 1])
    assert plan.metering is not None
    assert plan.metering.checkpoint == EGRESS_CHECKPOINT
    assert plan.metering.token_file == RESULT_TOKEN_FILE
    assert plan.metering.settle_proxy == "http://127.0.0.1:15080"
    assert plan.metering.prices == {"gpt-4o*": {"inputPerMTok": 2.5, "outputPerMTok": 10.0}}
    assert RESULT_TOKEN_DIR in plan.hidden
    # The Secret's token is the one the gateway key derives for this attempt, and it is
    # nowhere in the Pod.
    attempt = made["attempt"]["metadata"]
    token = made["Secret"]["stringData"]["result-token"]
    identity = f"{REF.namespace}/{attempt['name']}"
    assert token == credential.result_token(GATEWAY_KEY, identity, attempt["uid"])
    assert token != credential.result_token(GATEWAY_KEY, identity, "another-uid")
    assert token not in json.dumps(made["Pod"])


def test_without_the_proxy_nothing_is_metered() -> None:
    from tests.k8s.test_render import document, objects

    pod = objects(document())["pod"]
    args = pod["spec"]["containers"][0]["args"]
    plan = AttemptPlan.from_json(args[args.index("--plan-json") + 1])
    assert plan.metering is None and plan.egress is None
    assert "result-token" not in json.dumps(pod)


# -- a sidecar that never starts --------------------------------------------------------------


def _sidecar_pod(state: dict[str, Any], restarts: int = 0, started: bool = False) -> Any:
    return {
        "status": {
            "phase": "Pending",
            "startTime": "2026-12-02T12:00:00Z",
            "initContainerStatuses": [
                {"name": "relay-bundle", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "egress-proxy",
                    "started": started,
                    "restartCount": restarts,
                    "state": state,
                },
            ],
        }
    }


def test_when_a_sidecar_has_been_trying_to_start() -> None:
    from datetime import UTC, datetime

    from maka_eval.k8s.egress import SIDECAR_CONTAINER, sidecar_waiting_since
    from maka_eval.k8s.render import EGRESS_CONTAINER

    assert SIDECAR_CONTAINER == EGRESS_CONTAINER
    running = {"running": {"startedAt": "2026-12-02T12:00:30Z"}}
    assert sidecar_waiting_since(_sidecar_pod(running)) == datetime(
        2026, 12, 2, 12, 0, 30, tzinfo=UTC
    )
    pod_start = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    # Restarted, crash-looping or just killed: counted from the Pod's start.
    assert sidecar_waiting_since(_sidecar_pod(running, restarts=2)) == pod_start
    crash = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert sidecar_waiting_since(_sidecar_pod(crash, restarts=1)) == pod_start
    assert sidecar_waiting_since(_sidecar_pod({"terminated": {"exitCode": 1}})) == pod_start
    # Started, not its turn yet, or pulling its image (that deadline is another's).
    assert sidecar_waiting_since(_sidecar_pod(running, started=True)) is None
    assert sidecar_waiting_since(_sidecar_pod({"waiting": {"reason": "PodInitializing"}})) is None
    assert sidecar_waiting_since(_sidecar_pod({"waiting": {"reason": "ErrImagePull"}})) is None
    assert sidecar_waiting_since({"status": {}}) is None


def test_an_attempt_whose_sidecar_never_starts_fails_at_the_deadline() -> None:
    from datetime import timedelta

    from maka_eval.k8s.egress import SIDECAR_STARTUP_DEADLINE_SEC
    from tests.k8s.test_results import NOW, setup, sync

    cluster, store, controller, clock = setup()
    controller.reconcile(("ns", "hello"))
    start = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    for obj in cluster.objects["Pod"].values():
        obj["status"] = _sidecar_pod({"running": {"startedAt": start}})["status"]
    sync(cluster, store)
    due = controller.reconcile(("ns", "hello"))
    assert due is not None and due <= SIDECAR_STARTUP_DEADLINE_SEC  # a timer, not polling
    clock[0] = NOW + timedelta(seconds=SIDECAR_STARTUP_DEADLINE_SEC + 1)
    sync(cluster, store)
    controller.reconcile(("ns", "hello"))
    deleted = [n for v, k, n in cluster.writes if v == "DELETE" and k == "Pod"]
    assert len(deleted) == 2  # they would stay in Init for good
    first = [a for a in cluster.objects["Attempt"].values() if a["spec"]["number"] == 1]
    for attempt in first:
        result = attempt["status"]["result"]
        assert result["status"] == "infra_failed"
        assert "egress-proxy sidecar) did not pass its startup probe" in result["reason"]
    retries = [a for a in cluster.objects["Attempt"].values() if a["spec"]["number"] == 2]
    assert len(retries) == 2
