"""The objects the operator writes, checked as data; the real API server accepts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval.egress import credential
from maka_eval.egress.policy import EgressPolicy
from maka_eval.engine.expand import expand
from maka_eval.engine.status import Trigger
from maka_eval.executors.load import experiment_from_data
from maka_eval.k8s import names
from maka_eval.k8s.egress import GatewayAccess, GatewayRoute
from maka_eval.k8s.render import (
    EGRESS_PROXY_PORT,
    ExperimentRef,
    attempt_object,
    attempt_objects,
    cell_object,
    network_policy_object,
    pod_object,
)
from maka_eval.relay.plan import OWN_NETWORK, AttemptPlan
from tests.k8s.conftest import REPO, Kubectl

EXAMPLE = REPO / "examples" / "hello" / "experiment.k8s.yaml"
REF = ExperimentRef("hello", "ns1", "00000000-1111-2222-3333-444444444444")


def document(**config: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["executor"]["config"].update(config)
    doc["spec"]["subjects"][2]["credentials"] = ["API_KEY"]  # scripted
    return doc


def objects(doc: dict[str, Any], subject: str = "scripted", gated: bool = True) -> dict[str, Any]:
    experiment, _ = experiment_from_data(doc)
    cell = next(c for c in expand(experiment).cells if c.subject_id == subject)
    cell_obj = cell_object(REF, cell)
    attempt = attempt_object(REF, cell, "cell-uid", 1, Trigger.SCHEDULED, None)
    attempt["metadata"]["uid"] = "attempt-uid"
    return {
        "cell": cell_obj,
        "attempt": attempt,
        "pod": pod_object(REF, experiment, cell, attempt, gated=gated),
        "policy": network_policy_object(REF, attempt),
    }


def test_names_are_deterministic_dns_labels_and_differ_per_experiment_uid() -> None:
    a = names.cell_name("hello", "uid-1", "Fix_Greeting.v2", 12, "Oracle")
    assert a == names.cell_name("hello", "uid-1", "Fix_Greeting.v2", 12, "Oracle")
    assert a != names.cell_name("hello", "uid-2", "Fix_Greeting.v2", 12, "Oracle")
    assert a.startswith("hello-fix-greeting-v2-12-oracle-")
    long = names.cell_name("e" * 63, "u", "t" * 63, 100000, "s" * 63)
    assert len(names.attempt_name(long, 1000)) <= 63
    assert names.cell_name("x", "u", "a-b", 1, "c") != names.cell_name("x", "u", "a", 1, "b-c")


def test_the_pod_has_the_anatomy_the_design_asks_for() -> None:
    built = objects(document(runtimeClassName="gvisor", nodeSelector={"pool": "eval"}))
    pod = built["pod"]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["nodeSelector"] == {"pool": "eval"}
    assert spec["schedulingGates"] == [{"name": names.GROUP_GATE}]
    assert [c["name"] for c in spec["initContainers"]] == ["relay-bundle", "benchmark"]
    assert spec["initContainers"][0]["image"] == "localhost/maka-eval/relay:0.1.0"
    (subject,) = spec["containers"]
    assert subject["image"] == "localhost/maka-eval/debian-python:bookworm"
    assert subject["command"] == ["/maka/relay/bin/maka-relay"]
    assert subject["terminationMessagePath"] == "/dev/termination-log"
    assert subject["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    for container in [*spec["initContainers"], subject]:
        assert container["securityContext"]["capabilities"]["drop"] == ["NET_RAW", "NET_ADMIN"]
    relay_mount = next(m for m in subject["volumeMounts"] if m["name"] == "relay")
    assert relay_mount["readOnly"] is True
    owner = pod["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Attempt" and owner["uid"] == "attempt-uid" and owner["controller"]
    labels = pod["metadata"]["labels"]
    assert labels[names.LABEL_ATTEMPT] == built["attempt"]["metadata"]["name"]
    assert labels[names.LABEL_EXPERIMENT_UID] == REF.uid


def test_the_relay_plan_in_the_pod_names_the_task_folder_and_no_secret() -> None:
    pod = objects(document())["pod"]
    args = pod["spec"]["containers"][0]["args"]
    plan = AttemptPlan.from_json(args[args.index("--plan-json") + 1])
    assert plan.task_dir == "/maka/benchmark/tasks/fix-greeting"
    assert plan.subject.argv[0] == "/maka/benchmark/agents/scripted_agent.py"
    assert plan.visible == ("/maka/benchmark/agents",)
    assert plan.hidden == ("/maka/benchmark",)
    assert plan.isolation == "auto"
    assert plan.subject.credentials == {"API_KEY": "API_KEY"}
    env = pod["spec"]["containers"][0]["env"]
    assert env and all("value" not in e and "secretKeyRef" in e["valueFrom"] for e in env)


def test_no_container_of_an_attempt_gains_a_capability() -> None:
    """The subject and the verifier (the relay runs both in the subject container) hold
    no capability beyond the runtime's default set less NET_RAW and NET_ADMIN; nothing
    is privileged; the relay shows the subject the task image's own folders."""
    for pod in (objects(document())["pod"], rendered(proxied())["Pod"]):
        spec = pod["spec"]
        for container in [*spec["initContainers"], *spec["containers"]]:
            context = container["securityContext"]
            assert "add" not in context["capabilities"], container["name"]
            assert not context.get("privileged"), container["name"]
        args = spec["containers"][0]["args"]
        plan = AttemptPlan.from_json(args[args.index("--plan-json") + 1])
        assert plan.in_task_image is True


def test_credentials_go_only_to_the_subject_that_declares_them() -> None:
    doc = document(credentials={"API_KEY": {"name": "provider", "key": "anthropic"}})
    scripted = objects(doc, "scripted")["pod"]["spec"]["containers"][0]
    assert scripted["env"] == [
        {"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "provider", "key": "anthropic"}}}
    ]
    oracle = objects(doc, "oracle")["pod"]["spec"]["containers"][0]
    assert "env" not in oracle


def test_an_ungated_arm_and_the_network_policy() -> None:
    built = objects(document(), gated=False)
    assert "schedulingGates" not in built["pod"]["spec"]
    policy = built["policy"]["spec"]
    assert policy["podSelector"] == {
        "matchLabels": {names.LABEL_ATTEMPT: built["attempt"]["metadata"]["name"]}
    }
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["egress"] == [] and policy["ingress"] == []


def test_per_task_images_and_tolerations() -> None:
    doc = document(
        taskImages={"fix-greeting": "example.org/greeting:1"},
        tolerations=[{"key": "eval", "operator": "Exists", "effect": "NoSchedule"}],
    )
    spec = objects(doc)["pod"]["spec"]
    assert spec["containers"][0]["image"] == "example.org/greeting:1"
    assert spec["tolerations"] == [{"key": "eval", "operator": "Exists", "effect": "NoSchedule"}]


def test_unknown_task_image_keys_and_undeclared_credentials_are_refused() -> None:
    from maka_eval.errors import SpecError

    doc = document(taskImages={"nope": "x:1"}, credentials={"OTHER": {"name": "s", "key": "k"}})
    with pytest.raises(SpecError) as caught:
        experiment_from_data(doc)
    text = "\n".join(str(p) for p in caught.value.problems)
    assert "spec.executor.config.taskImages.nope: no task has id 'nope'" in text
    assert "spec.executor.config.credentials.OTHER: no subject declares credential" in text


@pytest.mark.slow
def test_the_api_server_accepts_every_rendered_object(
    kubectl: Kubectl, crds: list[str], namespace: str, tmp_path: Path
) -> None:
    ref = ExperimentRef("hello", namespace, REF.uid)
    experiment, _ = experiment_from_data(document())
    cell = expand(experiment).cells[0]
    attempt = attempt_object(ref, cell, "cell-uid", 1, Trigger.RETRY, None)
    attempt["metadata"]["uid"] = "attempt-uid"
    rendered = [
        cell_object(ref, cell),
        attempt,
        pod_object(ref, experiment, cell, attempt, gated=True),
        network_policy_object(ref, attempt),
    ]
    for obj in rendered:
        path = tmp_path / f"{obj['kind']}.json"
        path.write_text(json.dumps(obj))
        proc = kubectl.run(
            "create", "--dry-run=server", f"--namespace={namespace}", "-f", str(path), "-o", "json"
        )
        accepted = json.loads(proc.stdout)
        assert accepted["kind"] == obj["kind"]
        assert accepted["metadata"]["name"] == obj["metadata"]["name"]


# -- the egress proxy: sidecar, Secret, NetworkPolicy to the gateway only ---------------------

GATEWAY = GatewayRoute(
    host="maka-eval-egress-gateway.maka-eval-system.svc",
    address="10.96.0.42",
    port=3128,
    namespace="maka-eval-system",
    pod_labels={"app.kubernetes.io/name": "maka-eval-egress-gateway"},
)
GATEWAY_KEY = b"k" * 32


def proxied(**egress: Any) -> dict[str, Any]:
    return document(egress={"mode": "proxy", "block": ["answers.example.org"], **egress})


def rendered(doc: dict[str, Any], namespace: str = REF.namespace) -> dict[str, Any]:
    """Everything attempt_objects makes for the scripted arm, by kind."""
    ref = ExperimentRef(REF.name, namespace, REF.uid)
    experiment, _ = experiment_from_data(doc)
    cell = next(c for c in expand(experiment).cells if c.subject_id == "scripted")
    attempt = attempt_object(ref, cell, "cell-uid", 1, Trigger.SCHEDULED, None)
    attempt["metadata"]["uid"] = "attempt-uid"
    made = attempt_objects(
        ref, experiment, cell, attempt, gated=False, gateway=GatewayAccess(GATEWAY, GATEWAY_KEY)
    )
    assert [kind for kind, _ in made] == sorted(
        (kind for kind, _ in made), key=["NetworkPolicy", "Secret", "Pod"].index
    )
    return {"attempt": attempt, "experiment": experiment, **dict(made)}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or ()}


def test_with_the_proxy_the_pod_gets_a_native_sidecar_started_before_the_subject() -> None:
    pod = rendered(proxied())["Pod"]
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == [
        "relay-bundle",
        "benchmark",
        "egress-proxy",
    ]
    sidecar = spec["initContainers"][-1]
    assert sidecar["restartPolicy"] == "Always"  # native sidecar: runs beside the subject
    assert sidecar["image"] == "localhost/maka-eval/egress:0.1.0"
    assert sidecar["command"] == ["python3", "-m", "maka_eval.egress.sidecar"]
    args = sidecar["args"]

    def arg(flag: str) -> str:
        return str(args[args.index(flag) + 1])

    assert arg("--upstream") == "http://maka-eval-egress-gateway.maka-eval-system.svc:3128"
    assert arg("--port") == str(EGRESS_PROXY_PORT)
    assert arg("--credential-file") == "/var/run/maka-eval/egress-secret/upstream-auth"
    assert arg("--policy-file") == "/var/run/maka-eval/egress-secret/policy.json"
    # The subject starts only after this passes: the proxy listens, its CA is published.
    probe = sidecar["startupProbe"]
    assert probe["exec"]["command"][:4] == ["python3", "-m", "maka_eval.egress.sidecar", "--probe"]
    assert str(EGRESS_PROXY_PORT) in probe["exec"]["command"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 60
    assert sidecar["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    (subject,) = spec["containers"]
    assert subject["securityContext"]["capabilities"]["drop"] == ["NET_RAW", "NET_ADMIN"]
    assert spec["hostAliases"] == [
        {"ip": "127.0.0.1", "hostnames": ["maka-eval-proxy"]},
        {"ip": "10.96.0.42", "hostnames": ["maka-eval-egress-gateway.maka-eval-system.svc"]},
    ]


def test_the_credential_and_the_ca_key_never_reach_the_subject() -> None:
    pod = rendered(proxied())["Pod"]
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret = volumes["egress-secret"]["secret"]
    assert secret["secretName"] == pod["metadata"]["name"] + "-egress"
    assert volumes["egress-state"] == {"name": "egress-state", "emptyDir": {}}
    sidecar = spec["initContainers"][-1]
    others = [*spec["initContainers"][:-1], *spec["containers"]]
    # Only the sidecar mounts the credential and its state (CA key, audit log).
    for private in ("egress-secret", "egress-state"):
        assert private in _mounts(sidecar)
        assert all(private not in _mounts(c) for c in others)
    assert _mounts(sidecar)["egress-secret"]["readOnly"] is True
    # The CA certificate folder: written by the sidecar, read-only for the subject.
    subject = spec["containers"][0]
    assert _mounts(subject)["egress-ca"] == {
        "name": "egress-ca",
        "mountPath": "/maka/egress-ca",
        "readOnly": True,
    }
    assert not _mounts(sidecar)["egress-ca"].get("readOnly")
    env = {e["name"]: e for e in subject["env"]}
    assert env["HTTPS_PROXY"]["value"] == f"http://maka-eval-proxy:{EGRESS_PROXY_PORT}"
    assert env["http_proxy"]["value"] == env["HTTPS_PROXY"]["value"]
    assert "127.0.0.1" in env["NO_PROXY"]["value"]
    assert env["SSL_CERT_FILE"]["value"] == "/maka/egress-ca/mitmproxy-ca-cert.pem"
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "maka-eval-credentials"
    assert not any("upstream-auth" in json.dumps(e) for e in subject["env"])


def test_the_relay_keeps_the_subject_in_the_pods_policed_network() -> None:
    made = rendered(proxied())
    args = made["Pod"]["spec"]["containers"][0]["args"]
    plan = AttemptPlan.from_json(args[args.index("--plan-json") + 1])
    assert plan.egress is not None
    assert plan.egress.namespace == OWN_NETWORK and plan.egress.namespace_identity == ""
    assert (plan.egress.proxy_name, plan.egress.proxy_address) == ("maka-eval-proxy", "127.0.0.1")
    assert plan.egress.proxy_port == EGRESS_PROXY_PORT
    assert plan.egress.ca_cert == "/maka/egress-ca/mitmproxy-ca-cert.pem"
    expected = EgressPolicy("terminal-bench", ["answers.example.org"])
    assert plan.egress.policy_digest == expected.digest


def test_the_attempts_egress_secret_holds_its_credential_and_the_policy() -> None:
    made = rendered(proxied(preset="none"))
    secret = made["Secret"]
    attempt = made["attempt"]["metadata"]
    assert secret["metadata"]["name"] == attempt["name"] + "-egress"
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("Attempt", "attempt-uid")  # garbage-collected
    assert secret["immutable"] is True
    value = secret["stringData"]["upstream-auth"]
    identity = credential.verify([GATEWAY_KEY], credential.proxy_authorization(value))
    assert identity == f"{REF.namespace}/{attempt['name']}"
    assert credential.verify([b"x" * 32], credential.proxy_authorization(value)) is None
    policy = EgressPolicy.from_json(secret["stringData"]["policy.json"])
    assert policy == EgressPolicy("none", ["answers.example.org"])


def test_with_the_proxy_the_network_policy_allows_the_gateway_pods_only() -> None:
    made = rendered(proxied())
    policy = made["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["ingress"] == []
    assert policy["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "maka-eval-system"}
                    },
                    "podSelector": {
                        "matchLabels": {"app.kubernetes.io/name": "maka-eval-egress-gateway"}
                    },
                }
            ],
            "ports": [{"protocol": "TCP", "port": 3128}],  # no DNS, nothing else
        }
    ]
    name = made["attempt"]["metadata"]["name"]
    assert policy["podSelector"] == {"matchLabels": {names.LABEL_ATTEMPT: name}}


def test_without_the_proxy_no_sidecar_and_no_egress_at_all() -> None:
    for doc in (document(), document(egress={"mode": "none"})):
        made = rendered(doc)
        assert "Secret" not in made
        spec = made["Pod"]["spec"]
        assert [c["name"] for c in spec["initContainers"]] == ["relay-bundle", "benchmark"]
        assert "hostAliases" not in spec
        assert made["NetworkPolicy"]["spec"]["egress"] == []
        args = spec["containers"][0]["args"]
        assert AttemptPlan.from_json(args[args.index("--plan-json") + 1]).egress is None


def test_a_proxied_attempt_needs_the_gateway() -> None:
    experiment, _ = experiment_from_data(proxied())
    cell = expand(experiment).cells[0]
    attempt = attempt_object(REF, cell, "cell-uid", 1, Trigger.SCHEDULED, None)
    attempt["metadata"]["uid"] = "attempt-uid"
    with pytest.raises(ValueError, match="gateway"):
        attempt_objects(REF, experiment, cell, attempt, gated=False, gateway=None)
    with pytest.raises(ValueError, match="gateway"):
        pod_object(REF, experiment, cell, attempt, gated=False)


@pytest.mark.slow
def test_the_api_server_accepts_the_proxied_attempt_and_the_gateway_manifest(
    kubectl: Kubectl, crds: list[str], namespace: str, tmp_path: Path
) -> None:
    made = rendered(proxied(), namespace)
    objects = [made["NetworkPolicy"], made["Secret"], made["Pod"]]
    # The gateway's manifest, moved into the test namespace.
    manifest = REPO / "hack" / "kind" / "egress-gateway.yaml"
    for doc in yaml.safe_load_all(manifest.read_text()):
        doc["metadata"]["namespace"] = namespace
        objects.append(doc)
    assert {o["kind"] for o in objects[3:]} == {
        "ServiceAccount",
        "Service",
        "Deployment",
        "NetworkPolicy",
    }
    for i, obj in enumerate(objects):
        path = tmp_path / f"{i}-{obj['kind']}.json"
        path.write_text(json.dumps(obj))
        proc = kubectl.run(
            "create", "--dry-run=server", f"--namespace={namespace}", "-f", str(path), "-o", "json"
        )
        accepted = json.loads(proc.stdout)
        assert accepted["kind"] == obj["kind"]
        if obj["kind"] == "Pod":
            sidecar = accepted["spec"]["initContainers"][-1]
            assert sidecar["restartPolicy"] == "Always"
            assert sidecar["startupProbe"]["exec"]["command"][3] == "--probe"
        if obj["kind"] == "Deployment":
            volume = accepted["spec"]["template"]["spec"]["volumes"][0]
            assert volume["secret"]["defaultMode"] == 0o440
