"""The objects the operator writes, checked as data; the real API server accepts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from maka_eval.engine.expand import expand
from maka_eval.engine.status import Trigger
from maka_eval.k8s import names
from maka_eval.k8s.render import (
    ExperimentRef,
    attempt_object,
    cell_object,
    network_policy_object,
    pod_object,
)
from maka_eval.relay.plan import AttemptPlan
from maka_eval.spec.load import experiment_from_data
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
