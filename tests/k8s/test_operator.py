"""The operator on the real API server, with tests/k8s/node_agent.py as the only kubelet.

`maka-eval operator` runs as its own process (so it can be killed with SIGKILL), the
node agent runs the Pods the real scheduler binds, and everything in between -- CRD
validation, CEL rules, the status subresource, watches, scheduling gates, the garbage
collector -- is the real control plane of hack/envtest.sh.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.egress.gateway_harness import GatewayProcess, Upstream
from tests.k8s.conftest import NODE_NAME, REPO, Kubectl, wait_for_none_left, wait_until
from tests.k8s.node_agent import NodeAgent, bwrap_available, egress_image_bin, relay_bundle

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "hello" / "experiment.k8s.yaml"
MAKA_EVAL = Path(sys.executable).parent / "maka-eval"


def example(name: str = "hello", **changes: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec.update(changes)
    return doc


def small(name: str, **changes: Any) -> dict[str, Any]:
    """2 tasks x 2 repetitions x 2 subjects (oracle, scripted)."""
    doc = example(name)
    spec = doc["spec"]
    spec["tasks"] = [{"id": "fix-greeting"}, {"id": "sum-numbers"}]
    spec["subjects"] = [s for s in spec["subjects"] if s["id"] in ("oracle", "scripted")]
    spec["repetitions"] = 2
    spec["execution"]["maxConcurrentTaskGroups"] = 2
    spec.update(changes)
    return doc


@pytest.fixture(scope="module")
def node_agent(
    control_plane: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeAgent]:
    if not bwrap_available():
        pytest.fail("the node agent needs bubblewrap and root (hack/test.sh installs it)")
    base = tmp_path_factory.mktemp("node")
    config = yaml.safe_load(EXAMPLE.read_text())["spec"]["executor"]["config"]
    images = {
        config["relayImage"]: {"/opt/maka-eval": relay_bundle(base / "relay-image")},
        config["benchmarkImage"]: {"/benchmark": REPO / "examples" / "hello"},
        config["taskImage"]: {},
        # The egress image's python3 is this checkout's (maka_eval and mitmproxy).
        config["egressImage"]: {"/usr/local/bin": egress_image_bin(base / "egress-image")},
    }
    extra = {REPO, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    agent = NodeAgent(control_plane, NODE_NAME, images, base / "pods", extra_ro=tuple(extra))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Operator:
    """`maka-eval operator` as a process of its own."""

    def __init__(
        self, kubeconfig: Path, namespace: str, log: Path, extra: tuple[str, ...] = ()
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log = log
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()

    def start(self) -> Operator:
        # --kubeconfig, not $KUBECONFIG: the flag must be what the operator uses.
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["HOME"] = str(self.log.parent)  # no ~/.kube/config to fall back on
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    str(MAKA_EVAL),
                    "operator",
                    "--namespace",
                    self.namespace,
                    "--kubeconfig",
                    str(self.kubeconfig),
                    "--metrics-port",
                    str(self.port),
                    "-v",
                    *self.extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@pytest.fixture
def operator(
    control_plane: Path, crds: list[str], namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    op = Operator(control_plane, namespace, tmp_path / "operator.log").start()
    try:
        yield op
    finally:
        op.stop()
        print(op.tail())


def get(kubectl: Kubectl, kind: str, namespace: str, name: str = "") -> Any:
    return kubectl.json("get", kind, *([name] if name else []), f"--namespace={namespace}")


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == type_), None
    )


def wait_for_phase(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    phases: tuple[str, ...],
    op: Operator,
    timeout: float = 240,
) -> dict[str, Any]:
    def done() -> Any:
        assert op.process is not None and op.process.poll() is None, "the operator exited"
        exp = get(kubectl, "experiment", namespace, name)
        return exp if (exp.get("status") or {}).get("phase") in phases else None

    try:
        return wait_until(done, timeout=timeout, interval=1.0, what=f"experiment {name} {phases}")
    except AssertionError:
        print(op.tail())
        print(json.dumps(get(kubectl, "experiment", namespace, name).get("status"), indent=1))
        raise


def test_a_whole_experiment_runs_and_reports(
    kubectl: Kubectl, namespace: str, operator: Operator, node_agent: NodeAgent
) -> None:
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(small("hello")))
    exp = wait_for_phase(kubectl, namespace, "hello", ("Complete",), operator)
    status = exp["status"]
    assert status["cellsTotal"] == 8 and status["cellsDone"] == 8, status
    assert status["observedGeneration"] == exp["metadata"]["generation"]
    summaries = {s["subjectId"]: s for s in status["subjects"]}
    assert summaries["oracle"]["n"] == 4 and summaries["oracle"]["meanScore"] == 1.0
    assert summaries["scripted"]["n"] == 4
    assert summaries["scripted"]["tokens"] > 0 and summaries["scripted"]["costUsd"] > 0
    assert condition(exp, "Complete")["status"] == "True"
    assert condition(exp, "Validated")["status"] == "True"

    cells = get(kubectl, "cells", namespace)["items"]
    assert len(cells) == 8
    for cell in cells:
        assert cell["status"]["selectedAttempt"] == 1
        assert cell["status"]["phase"] == "Done"
        owner = cell["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Experiment" and owner["uid"] == exp["metadata"]["uid"]
    attempts = get(kubectl, "attempts", namespace)["items"]
    assert len(attempts) == 8
    for attempt in attempts:
        result = attempt["status"]["result"]
        assert result["status"] in ("completed", "subject_failed")
        assert result["format"] == "maka.eval.kernel.v1"
    # Arms of a group started together: every Pod was created gated, then released.
    pods = get(kubectl, "pods", namespace)["items"]
    assert len(pods) == 8
    assert all(not p["spec"].get("schedulingGates") for p in pods)
    assert all(p["spec"]["automountServiceAccountToken"] is False for p in pods)

    table = kubectl.run("get", "experiments,cells,attempts", f"--namespace={namespace}").stdout
    print(table)
    # PHASE DONE CELLS FAILED; each cell's selected attempt; each attempt's status
    assert re.search(r"experiment\.eval\.maka\.dev/hello\s+Complete\s+8\s+8\s+0\s", table)
    done = re.findall(r"cell\.eval\.maka\.dev/hello-\S+\s+\S+\s+[12]\s+\S+\s+Done\s+1\s", table)
    assert len(done) == 8
    assert len(re.findall(r"\s1\s+Finished\s+(completed|subject_failed)\s", table)) == 8

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{operator.port}/metrics").read().decode()
    assert re.search(r'maka_eval_api_writes_total\{verb="POST"\} [1-9]', metrics), metrics[-2000:]
    assert "maka_eval_reconcile_passes_total" in metrics

    results = subprocess.run(
        [str(MAKA_EVAL), "results", "--cluster", f"{namespace}/hello", "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(kubectl.kubeconfig)},
    )
    assert results.returncode == 0, results.stderr
    assert "fix-greeting::1::oracle" in results.stdout


def test_an_invalid_spec_gets_a_condition_and_no_cells(
    kubectl: Kubectl, namespace: str, operator: Operator
) -> None:
    doc = small("broken")
    doc["spec"]["subjects"].append(copy.deepcopy(doc["spec"]["subjects"][0]))  # duplicate id
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
    exp = wait_for_phase(kubectl, namespace, "broken", ("Failed",), operator, timeout=60)
    validated = condition(exp, "Validated")
    assert validated is not None and validated["status"] == "False"
    assert "spec.subjects[2].id" in validated["message"], validated
    assert get(kubectl, "cells", namespace)["items"] == []
    events = get(kubectl, "events", namespace)["items"]
    assert any(e["reason"] == "InvalidSpec" for e in events)


def test_a_missing_secret_is_named_and_nothing_starts(
    kubectl: Kubectl, namespace: str, operator: Operator
) -> None:
    doc = small("secret")
    doc["spec"]["subjects"][1]["credentials"] = ["API_KEY"]
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))

    def missing() -> Any:
        exp = get(kubectl, "experiment", namespace, "secret")
        cond = condition(exp, "PrerequisitesMet")
        return cond if cond and cond["status"] == "False" else None

    cond = wait_until(missing, timeout=60, what="PrerequisitesMet=False")
    assert "maka-eval-credentials" in cond["message"] and "API_KEY" in cond["message"]
    assert "scripted" in cond["message"]
    assert get(kubectl, "cells", namespace)["items"] == []


def test_a_credential_reaches_only_its_subject(
    kubectl: Kubectl, namespace: str, operator: Operator
) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "maka-eval-credentials"},
        "data": {"API_KEY": base64.b64encode(b"sk-test-123").decode()},
    }
    kubectl.apply(secret, namespace)
    doc = small("creds")
    doc["spec"]["subjects"][1]["credentials"] = ["API_KEY"]
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
    wait_until(lambda: len(get(kubectl, "pods", namespace)["items"]) >= 2, timeout=60, what="pods")
    for pod in get(kubectl, "pods", namespace)["items"]:
        env = pod["spec"]["containers"][0].get("env") or []
        subject = pod["metadata"]["labels"]["eval.maka.dev/subject"]
        if subject == "scripted":
            assert env == [
                {
                    "name": "API_KEY",
                    "valueFrom": {
                        "secretKeyRef": {"name": "maka-eval-credentials", "key": "API_KEY"}
                    },
                }
            ]
        else:
            assert env == []


def test_an_evicted_pod_gets_a_new_attempt_and_the_first_is_kept(
    kubectl: Kubectl, namespace: str, operator: Operator, node_agent: NodeAgent
) -> None:
    doc = small("evict")
    doc["spec"]["tasks"] = [{"id": "sum-numbers"}]
    doc["spec"]["subjects"] = [
        {"id": "slow", "kind": "external", "config": {"command": "sleep", "args": ["30"]}}
    ]
    doc["spec"]["repetitions"] = 1
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))

    def running_pod() -> Any:
        pods = get(kubectl, "pods", namespace)["items"]
        return pods[0] if pods and pods[0]["status"].get("phase") == "Running" else None

    pod = wait_until(running_pod, timeout=90, what="a running pod")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod["metadata"]["name"], "namespace": namespace},
    }
    kubectl.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/eviction",
        "-f",
        "-",
        input=json.dumps(eviction),
    )

    def two_attempts() -> Any:
        items = get(kubectl, "attempts", namespace)["items"]
        return items if len(items) >= 2 else None

    attempts = sorted(
        wait_until(two_attempts, timeout=90, what="a second attempt"),
        key=lambda a: a["spec"]["number"],
    )
    first, second = attempts[0], attempts[1]
    assert first["status"]["result"]["status"] == "infra_failed"
    assert "gone" in first["status"]["result"]["reason"]
    assert second["spec"]["trigger"] == "retry"


def test_a_rerun_annotation_appends_one_attempt(
    kubectl: Kubectl, namespace: str, operator: Operator, node_agent: NodeAgent
) -> None:
    doc = small("rerun")
    doc["spec"]["tasks"] = [{"id": "sum-numbers"}]
    doc["spec"]["subjects"] = [s for s in doc["spec"]["subjects"] if s["id"] == "oracle"]
    doc["spec"]["repetitions"] = 1
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
    wait_for_phase(kubectl, namespace, "rerun", ("Complete",), operator)
    cell = get(kubectl, "cells", namespace)["items"][0]["metadata"]["name"]
    for _ in range(2):  # the same token twice does nothing more
        kubectl.run(
            "annotate",
            "--overwrite",
            f"--namespace={namespace}",
            "cell",
            cell,
            "eval.maka.dev/rerun=again-1",
        )
    wait_until(
        lambda: len(get(kubectl, "attempts", namespace)["items"]) == 2,
        timeout=60,
        what="the rerun attempt",
    )
    wait_until(
        lambda: all(
            (a.get("status") or {}).get("result")
            for a in get(kubectl, "attempts", namespace)["items"]
        ),
        timeout=120,
        what="the rerun's result",
    )
    # The cell's status takes in the rerun after its result: wait for that, not 3 s.
    cell_obj = wait_until(
        lambda: (
            ((c := get(kubectl, "cell", namespace, cell)).get("status") or {}).get("rerunTokens")
            and c
        ),
        timeout=300,
        what="the cell to record the rerun",
    )
    attempts = sorted(
        get(kubectl, "attempts", namespace)["items"], key=lambda a: a["spec"]["number"]
    )
    assert len(attempts) == 2
    assert attempts[1]["spec"]["trigger"] == "manual"
    assert attempts[1]["spec"]["request"] == "again-1"
    assert cell_obj["status"]["selectedAttempt"] == 1  # the earliest valid result stays
    assert cell_obj["status"]["rerunTokens"] == ["again-1"]


def test_an_operator_killed_mid_run_resumes_without_duplicates_or_losses(
    kubectl: Kubectl, namespace: str, operator: Operator, node_agent: NodeAgent
) -> None:
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(small("crash")))
    wait_until(
        lambda: any(
            (a.get("status") or {}).get("result")
            for a in get(kubectl, "attempts", namespace)["items"]
        ),
        timeout=120,
        what="a first result",
    )
    operator.kill()

    def ended() -> set[str]:
        return {
            pod["metadata"]["name"]
            for pod in get(kubectl, "pods", namespace)["items"]
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        }

    # Pods end while no operator watches: wait for one more to end (not for 3 s), unless
    # none was left running.
    before = ended()
    if len(before) < len(get(kubectl, "pods", namespace)["items"]):
        wait_until(lambda: ended() - before, timeout=300, what="a pod to end unwatched")
    operator.start()
    exp = wait_for_phase(kubectl, namespace, "crash", ("Complete",), operator)
    attempts = get(kubectl, "attempts", namespace)["items"]
    per_cell: dict[str, list[int]] = {}
    for a in attempts:
        per_cell.setdefault(a["spec"]["cellId"], []).append(a["spec"]["number"])
        assert a["status"]["result"]["status"] in ("completed", "subject_failed"), a["status"]
    assert len(per_cell) == 8 and all(v == [1] for v in per_cell.values()), per_cell
    assert exp["status"]["cellsDone"] == 8


def test_frozen_specs_are_refused_by_the_server(
    kubectl: Kubectl, namespace: str, operator: Operator
) -> None:
    doc = small("frozen", repetitions=1)
    doc["spec"]["tasks"] = [{"id": "sum-numbers"}]
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
    doc["spec"]["repetitions"] = 3
    proc = kubectl.run(
        "apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc), check=False
    )
    assert proc.returncode != 0 and "Experiment spec is immutable" in proc.stderr
    wait_until(lambda: get(kubectl, "cells", namespace)["items"], timeout=60, what="cells")
    cell = get(kubectl, "cells", namespace)["items"][0]["metadata"]["name"]
    proc = kubectl.run(
        "patch",
        "cell",
        cell,
        f"--namespace={namespace}",
        "--type=merge",
        "-p",
        '{"spec":{"repetition":9}}',
        check=False,
    )
    assert proc.returncode != 0 and "immutable" in proc.stderr


def test_deleting_an_experiment_cascades(
    kubectl: Kubectl, namespace: str, operator: Operator, node_agent: NodeAgent
) -> None:
    kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(small("gone")))
    wait_until(lambda: get(kubectl, "pods", namespace)["items"], timeout=90, what="pods")
    kubectl.run(
        "delete", "experiment", "gone", f"--namespace={namespace}", "--wait=true", "--timeout=60s"
    )

    def left() -> int:
        return sum(
            len(get(kubectl, kind, namespace)["items"])
            for kind in ("cells", "attempts", "networkpolicies")
        ) + len(
            [
                p
                for p in get(kubectl, "pods", namespace)["items"]
                if not p["metadata"].get("deletionTimestamp")
            ]
        )

    wait_for_none_left(left, what="objects owned by the experiment")


# -- the egress proxy: sidecar in the Pod, gateway outside --------------------------------------

GATEWAY_KEY = "0123456789abcdef0123456789abcdef"
UPSTREAM_NAME = "upstream.maka-eval.test"
"""Known only to the gateway (its own /etc/hosts): the subject cannot reach it directly."""

SUBJECT_FETCH = """
import sys, urllib.error, urllib.request
url, gateway = sys.argv[1], sys.argv[2]
# Through the proxy the environment names (the egress sidecar, then the gateway).
body = urllib.request.urlopen(url + "/from-the-subject", timeout=60).read().decode()
assert body.startswith("upstream says hello /from-the-subject"), body
# Straight to the gateway, around the sidecar: no credential, refused.
direct = urllib.request.build_opener(urllib.request.ProxyHandler({"http": gateway}))
try:
    direct.open(url + "/around-the-sidecar", timeout=60)
except urllib.error.HTTPError as exc:
    assert exc.code == 407, exc.code
else:
    sys.exit("the gateway let a request without a credential through")
print("fetched:", body)
"""


def proxied(name: str, subject: dict[str, Any]) -> dict[str, Any]:
    doc = small(name)
    spec = doc["spec"]
    spec["tasks"] = [{"id": "sum-numbers"}]
    spec["subjects"] = [subject]
    spec["repetitions"] = 1
    spec["executor"]["config"]["egress"] = {"mode": "proxy", "block": ["answers.example.org"]}
    return doc


def gateway_key_secret(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "maka-eval-egress-gateway", "namespace": namespace},
        "data": {"key": base64.b64encode(GATEWAY_KEY.encode() + b"\n").decode()},
    }


def test_an_egress_experiment_without_the_gateway_key_starts_nothing(
    kubectl: Kubectl, namespace: str, control_plane: Path, crds: list[str], tmp_path: Path
) -> None:
    op = Operator(
        control_plane,
        namespace,
        tmp_path / "operator.log",
        extra=("--egress-gateway", "127.0.0.1:3128", "--egress-gateway-namespace", namespace),
    ).start()
    try:
        subject = {"id": "noop", "kind": "external", "config": {"command": "true"}}
        doc = proxied("nokey", subject)
        kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))

        def missing() -> Any:
            cond = condition(get(kubectl, "experiment", namespace, "nokey"), "PrerequisitesMet")
            return cond if cond and cond["status"] == "False" else None

        cond = wait_until(missing, timeout=60, what="PrerequisitesMet=False")
        assert "maka-eval-egress-gateway" in cond["message"], cond
        assert f"namespace {namespace}" in cond["message"]
        assert get(kubectl, "cells", namespace)["items"] == []
    finally:
        op.stop()


def test_a_subject_reaches_an_allowed_upstream_only_through_sidecar_and_gateway(
    kubectl: Kubectl,
    namespace: str,
    control_plane: Path,
    crds: list[str],
    node_agent: NodeAgent,
    tmp_path: Path,
) -> None:
    upstream = Upstream(host="127.0.0.1").start()
    hosts = tmp_path / "gateway-hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n127.0.0.1\t{UPSTREAM_NAME}\n")
    key_file = tmp_path / "gateway-key"
    key_file.write_text(GATEWAY_KEY + "\n")
    # The gateway as a local process, resolving the upstream's name through its own
    # /etc/hosts (a bind mount only it sees), allowed to reach 127.0.0.1 and nothing else
    # that is not public.
    gateway = GatewayProcess(
        key_file,
        prefix=("bwrap", "--dev-bind", "/", "/", "--ro-bind", str(hosts), "/etc/hosts", "--"),
    ).start()
    kubectl.apply(gateway_key_secret(namespace), namespace)
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
        url = f"http://{UPSTREAM_NAME}:{upstream.port}"
        subject = {
            "id": "fetcher",
            "kind": "external",
            "config": {
                "command": "python3",
                "args": ["-c", SUBJECT_FETCH, url, gateway.url],
                "resultContract": "exit-code",
            },
        }
        doc = proxied("egress", subject)
        kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
        exp = wait_for_phase(kubectl, namespace, "egress", ("Complete",), op, timeout=180)
        (attempt,) = get(kubectl, "attempts", namespace)["items"]
        result = attempt["status"]["result"]
        assert result["status"] == "completed", (result, gateway.output()[-3000:])
        assert result["exitCode"] == 0
        # The relay sandboxed the subject (its own namespaces: root and bubblewrap here)
        # and kept it in the Pod's network, the one the sidecar serves.
        assert result["isolation"] == "namespaces"
        assert exp["status"]["cellsDone"] == 1

        name = attempt["metadata"]["name"]
        identity = f"{namespace}/{name}"
        # The sidecar chained to the gateway with the attempt's credential...
        allowed = gateway.wait_for(lambda e: e["decision"] == "allow")
        assert allowed["identity"] == identity and allowed["host"] == UPSTREAM_NAME
        assert allowed["url"] == f"{url}/from-the-subject"
        # ...and the subject's own try around the sidecar had none.
        refused = gateway.wait_for(lambda e: e.get("status") == 407)
        assert refused["identity"] is None
        assert [s.path for s in upstream.seen] == ["/from-the-subject"]

        # The pieces that made it so, as the API server holds them.
        pod = get(kubectl, "pod", namespace, name)
        sidecar = pod["spec"]["initContainers"][-1]
        assert sidecar["name"] == "egress-proxy" and sidecar["restartPolicy"] == "Always"
        statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
        assert "terminated" in statuses["egress-proxy"]["state"]  # stopped after the subject
        secret = get(kubectl, "secret", namespace, f"{name}-egress")
        assert secret["metadata"]["ownerReferences"][0]["uid"] == attempt["metadata"]["uid"]
        policy = get(kubectl, "networkpolicy", namespace, name)["spec"]
        (rule,) = policy["egress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": gateway.port}]
    finally:
        op.stop()
        print(op.tail())
        gateway.stop()
        upstream.stop()
