"""The envtest control plane (hack/envtest.sh) is a real Kubernetes: the API server
validates with CEL, the garbage collector and the scheduler run, the fake node is Ready.

Tests play the kubelet: nothing runs containers, pod status is written by the test.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.k8s.conftest import NODE_NAME, Kubectl, wait_until

pytestmark = pytest.mark.slow


def test_readyz_and_version(kubectl: Kubectl) -> None:
    assert kubectl.run("get", "--raw", "/readyz").stdout.strip() == "ok"
    version = kubectl.json("version")["serverVersion"]
    assert version["major"] == "1"
    assert version["gitVersion"].startswith("v1.")


def test_fake_node_is_ready_and_schedulable(kubectl: Kubectl) -> None:
    node = kubectl.json("get", "node", NODE_NAME)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert not node["spec"].get("taints")
    assert not node["spec"].get("unschedulable")
    assert node["status"]["allocatable"]["pods"] == "110"


def test_cel_transition_rule_refuses_spec_change(kubectl: Kubectl, namespace: str) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.envtest.maka-eval.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"pins.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "pins", "singular": "pin", "kind": "Pin", "listKind": "PinList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-validations": [
                                        {"rule": "self == oldSelf", "message": "spec is immutable"}
                                    ],
                                    "properties": {"value": {"type": "string"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    kubectl.apply(crd)
    try:
        kubectl.run("wait", "--for=condition=Established", f"crd/pins.{group}", "--timeout=60s")
        pin = {
            "apiVersion": f"{group}/v1",
            "kind": "Pin",
            "metadata": {"name": "p"},
            "spec": {"value": "a"},
        }
        wait_until(
            lambda: (
                kubectl.run(
                    "apply", f"-n={namespace}", "-f", "-", input=json.dumps(pin), check=False
                ).returncode
                == 0
            ),
            what="the first Pin to be created",
        )
        refused = kubectl.run(
            "patch",
            f"pins.{group}",
            "p",
            f"-n={namespace}",
            "--type=merge",
            "-p",
            '{"spec": {"value": "b"}}',
            check=False,
        )
        assert refused.returncode != 0
        assert "spec is immutable" in refused.stderr
        # Changes outside spec are allowed; spec is unchanged.
        kubectl.run("label", f"pins.{group}", "p", f"-n={namespace}", "touched=yes")
        got = kubectl.json("get", f"pins.{group}", "p", f"-n={namespace}")
        assert got["spec"] == {"value": "a"}
        assert got["metadata"]["labels"] == {"touched": "yes"}
    finally:
        kubectl.run("delete", "crd", f"pins.{group}", "--wait=false", check=False)


def test_garbage_collector_deletes_owned_objects(kubectl: Kubectl, namespace: str) -> None:
    owner = kubectl.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace
    )
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "owned",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
        },
        namespace,
    )
    assert kubectl.exists("configmap", "owned", f"-n={namespace}")
    kubectl.run("delete", "configmap", "owner", f"-n={namespace}")
    wait_until(
        lambda: not kubectl.exists("configmap", "owned", f"-n={namespace}"),
        what="the garbage collector to delete the owned ConfigMap",
    )


def test_scheduler_binds_pod_to_fake_node(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "trial"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/never-pulled:1",
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ]
            },
        },
        namespace,
    )

    def bound_pod() -> dict | None:
        pod = kubectl.json("get", "pod", "trial", f"-n={namespace}")
        return pod if pod["spec"].get("nodeName") else None

    pod = wait_until(bound_pod, what="the scheduler to bind the pod")
    assert pod["spec"]["nodeName"] == NODE_NAME
    scheduled = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    assert scheduled.get("PodScheduled") == "True"
    # Play the kubelet: the test writes the pod status.
    kubectl.run(
        "patch",
        "pod",
        "trial",
        f"-n={namespace}",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Succeeded"}}',
    )
    assert kubectl.json("get", "pod", "trial", f"-n={namespace}")["status"]["phase"] == "Succeeded"


def test_python_kubernetes_client_loads_the_kubeconfig(control_plane: Path) -> None:
    kubernetes = pytest.importorskip("kubernetes", reason="optional: the kubernetes client")
    client = kubernetes.config.new_client_from_config(config_file=str(control_plane))
    try:
        nodes = kubernetes.client.CoreV1Api(client).list_node().items
    finally:
        client.close()
    assert NODE_NAME in [n.metadata.name for n in nodes]
