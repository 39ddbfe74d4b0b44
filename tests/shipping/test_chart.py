"""The Helm chart (charts/maka-eval): rendered and linted by Helm's Go SDK, every object
checked against the Kubernetes OpenAPI schemas and by the real API server, RBAC exactly
what the operator calls, and the operator started the way the chart's Deployment starts it
running the example experiment on the control plane of hack/envtest.sh."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import helm_python as helm
import kubernetes_validate
import pytest
import typer
import yaml

from maka_eval.cli.main import app
from maka_eval.k8s import operator as operator_module
from maka_eval.k8s.egress import GATEWAY_POD_LABELS
from tests.k8s.conftest import REPO, Kubectl, wait_until
from tests.k8s.test_operator import EXAMPLE, free_port
from tests.shipping.chart import (
    CHART,
    NAMESPACE,
    REPRESENTATIVE,
    crd_objects,
    find,
    load,
    objects,
    one,
    operator_container,
    render,
    rules_of,
)
from tests.shipping.test_gitops import HEALTH_LUA, Health

KUBE_VERSION = "1.37.0"
MAKA_EVAL = Path(sys.executable).parent / "maka-eval"


# -- rendering and linting ----------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(REPRESENTATIVE))
def test_the_chart_lints_clean(case: str) -> None:
    report = helm.lint(
        CHART, REPRESENTATIVE[case], strict=True, namespace=NAMESPACE, kube_version="v1.37.2"
    )
    assert report["errors"] == [], report
    # Strict: warnings count as errors; only Helm's "icon is recommended" note remains.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report["messages"]


@pytest.mark.parametrize("case", sorted(REPRESENTATIVE))
def test_every_rendered_object_matches_the_kubernetes_openapi_schemas(case: str) -> None:
    objs = objects(REPRESENTATIVE[case])
    assert objs
    custom = {(c["spec"]["group"], c["spec"]["names"]["kind"]) for c in crd_objects()}
    for obj in [*objs, *crd_objects()]:
        group = obj["apiVersion"].rpartition("/")[0]
        if (group, obj["kind"]) in custom:
            continue  # a custom resource: the API server checks it (test below)
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{case}: {obj['kind']}/{obj['metadata']['name']}: {exc.message}")


def test_the_default_install_has_every_piece() -> None:
    objs = objects()
    kinds = sorted({o["kind"] for o in objs})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",  # the gateway's (2 replicas); the operator has 1
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    assert {o["metadata"]["name"] for o in find(objs, "Deployment")} == {
        "maka-eval-operator",
        "maka-eval-egress-gateway",
    }
    assert {o["metadata"]["name"] for o in find(objs, "Service")} == {
        "maka-eval-operator-metrics",
        "maka-eval-egress-gateway",
    }
    for obj in objs:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]


def test_the_crds_are_the_generated_ones() -> None:
    """charts/maka-eval/crds holds crds/ byte for byte (plus kopf's peering CRDs)."""
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert generated
    for name in generated:
        chart_copy = CHART / "crds" / name
        assert chart_copy.exists(), f"{chart_copy} is missing: run hack/gen-crds"
        assert chart_copy.read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"{chart_copy} differs from crds/{name}: run hack/gen-crds"
        )
    extra = sorted(p.name for p in (CHART / "crds").glob("*.yaml") if p.name not in generated)
    assert extra == ["kopf-peerings.yaml"]
    kinds = {c["spec"]["names"]["kind"] for c in crd_objects()}
    assert kinds == {"Experiment", "Cell", "Attempt", "KopfPeering", "ClusterKopfPeering"}


def image_entrypoint(stage: str) -> list[str]:
    """The ENTRYPOINT of a stage of images/Dockerfile (the images' one Dockerfile)."""
    entrypoint: list[str] = []
    current = None
    for line in (REPO / "images" / "Dockerfile").read_text().splitlines():
        match = re.match(r"^FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = match.group(1)
        elif current == stage and line.startswith("ENTRYPOINT "):
            entrypoint = json.loads(line.removeprefix("ENTRYPOINT "))
    return entrypoint


def test_the_operator_container_gets_the_options_the_cli_knows() -> None:
    """Every argument the chart gives the operator parses with `maka-eval operator`."""
    assert image_entrypoint("operator") == ["maka-eval", "operator"]
    group = typer.main.get_command(app)
    command = group.get_command(click.Context(group), "operator")  # type: ignore[attr-defined]
    for values in REPRESENTATIVE.values():
        container = operator_container(objects(values))
        assert "command" not in container, "the image's entrypoint is `maka-eval operator`"
        ctx = command.make_context("operator", list(container["args"]))  # raises if unknown
        assert ctx.params["metrics_port"] == container["ports"][0]["containerPort"]
    args = operator_container(objects(REPRESENTATIVE["ha-cluster-wide"]))["args"]
    assert "--egress-key-secret=gateway-key" in args and "--log-format=json" in args
    assert f"--relay-bundle-digest=sha256:{'cd' * 32}" in args
    assert not any("relay-bundle-digest" in a for a in operator_container(objects())["args"])


def test_the_gateway_pods_carry_the_labels_attempt_policies_allow() -> None:
    for values in (REPRESENTATIVE["default"], REPRESENTATIVE["renamed"]):
        objs = objects(values)
        gateway = one(
            objs,
            "Deployment",
            next(
                o["metadata"]["name"]
                for o in find(objs, "Deployment")
                if o["metadata"]["name"].endswith("-egress-gateway")
            ),
        )
        labels = gateway["spec"]["template"]["metadata"]["labels"]
        assert GATEWAY_POD_LABELS.items() <= labels.items()
        (container,) = gateway["spec"]["template"]["spec"]["containers"]
        port = container["ports"][0]["containerPort"]
        # The operator is told where the gateway is and which Secret holds its key.
        args = operator_container(objs)["args"]
        service = one(objs, "Service", gateway["metadata"]["name"])
        assert f"--egress-gateway={service['metadata']['name']}.{NAMESPACE}.svc:{port}" in args
        secret = gateway["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
        assert f"--egress-key-secret={secret}" in args
        assert gateway["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_generated_gateway_key_survives_uninstall_and_suits_the_gateway() -> None:
    import base64

    from maka_eval.egress.credential import load_key

    secret = one(objects(), "Secret")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    load_key(base64.b64decode(secret["data"]["key"]))  # long enough for the gateway
    assert not find(objects(REPRESENTATIVE["ha-cluster-wide"]), "Secret")


def test_one_replica_is_standalone_and_more_use_peering() -> None:
    objs = objects()
    deployment = one(objs, "Deployment", "maka-eval-operator")
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert not any(a.startswith("--peering") for a in operator_container(objs)["args"])
    assert not find(objs, "PodDisruptionBudget", "maka-eval-operator")
    assert not find(objs, "ClusterKopfPeering")

    objs = objects(REPRESENTATIVE["ha-cluster-wide"])
    deployment = one(objs, "Deployment", "maka-eval-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--peering=maka-eval" in operator_container(objs)["args"]
    assert one(objs, "ClusterKopfPeering")["metadata"]["name"] == "maka-eval"
    pdb = one(objs, "PodDisruptionBudget", "maka-eval-operator")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    env = {e["name"]: e for e in operator_container(objs)["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    objs = objects(REPRESENTATIVE["namespaced"])
    assert [(p["kind"], p["metadata"]["namespace"]) for p in find(objs, "KopfPeering")] == [
        ("KopfPeering", "evals")
    ]


def test_replicas_started_earlier_have_the_higher_peering_priority() -> None:
    """kopf pauses every replica that sees a peer of equal priority: each takes its own."""
    first = operator_module.peering_priority(now=1000.0, tiebreak=999)
    later = operator_module.peering_priority(now=1000.001, tiebreak=0)
    assert first > later
    same_ms = {operator_module.peering_priority(now=1000.0, tiebreak=t) for t in range(1000)}
    assert len(same_ms) == 1000


def test_the_notes_tell_the_next_command() -> None:
    notes = render()["maka-eval/templates/NOTES.txt"]
    assert "kubectl -n maka-eval-system rollout status deployment/maka-eval-operator" in notes
    assert "kubectl apply -n default -f examples/hello/experiment.k8s.yaml" in notes
    notes = render(REPRESENTATIVE["namespaced"])["maka-eval/templates/NOTES.txt"]
    assert "kubectl apply -n evals -f" in notes and "active/standby" in notes


# -- values: documented, and a wrong one refused with its path -----------------------------------


def _schema_paths(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        yield path, sub
        yield from _schema_paths(sub, path)


def test_every_value_is_documented_and_in_the_schema() -> None:
    with load() as chart:
        schema = chart.schema
        defaults = chart.values
    assert schema is not None
    described = dict(_schema_paths(schema))
    for path, sub in described.items():
        assert sub.get("description"), f"values.schema.json: {path} has no description"

    def leaves(value: Any, prefix: str = "") -> Iterator[str]:
        if isinstance(value, dict) and value and prefix not in FREE_FORM:
            for key, sub in value.items():
                yield from leaves(sub, f"{prefix}.{key}" if prefix else key)
        else:
            yield prefix

    for path in leaves(defaults):
        assert path in described, f"values.yaml: {path} is not in values.schema.json"
    # values.yaml: a comment right above every chart field (not inside Kubernetes-shaped
    # objects such as resources or a securityContext, documented by Kubernetes).
    stack: list[tuple[int, str]] = []
    previous = ""
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        match = re.match(r"^( *)([A-Za-z]\w*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([*(key for _, key in stack), match.group(2)])
            stack.append((indent, match.group(2)))
            inside = any(path.startswith(shaped + ".") for shaped in KUBERNETES_SHAPED)
            if path in described and not inside:
                assert previous.lstrip().startswith("#"), (
                    f"values.yaml line {number}: {path} has no comment above it"
                )
        if line.strip():
            previous = line


KUBERNETES_SHAPED = {
    f"{component}.{field}"
    for component in ("operator", "egressGateway")
    for field in ("resources", "podSecurityContext", "securityContext")
} | {
    "egressGateway.networkPolicy.dns.namespaceSelector",
    "egressGateway.networkPolicy.dns.podSelector",
}
FREE_FORM = {
    "operator.resources.requests",
    "operator.resources.limits",
    "operator.podSecurityContext",
    "operator.securityContext",
    "egressGateway.resources.requests",
    "egressGateway.resources.limits",
    "egressGateway.podSecurityContext",
    "egressGateway.securityContext",
    "egressGateway.networkPolicy.dns.namespaceSelector",
    "egressGateway.networkPolicy.dns.podSelector",
}


WRONG_VALUES = [
    ({"operator": {"replicas": "two"}}, "/operator/replicas", "want integer"),
    ({"operator": {"replicas": 0}}, "/operator/replicas", "minimum"),
    ({"operator": {"replica": 2}}, "/operator", "'replica' not allowed"),
    ({"operator": {"logFormat": "xml"}}, "/operator/logFormat", "'plain', 'json'"),
    ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0", "pattern"),
    ({"operator": {"image": {"digest": "abc"}}}, "/operator/image/digest", "pattern"),
    ({"operator": {"relayBundleDigest": "sha256:XYZ"}}, "/operator/relayBundleDigest", "pattern"),
    (
        {"egressGateway": {"image": {"pullPolicy": "Sometimes"}}},
        "/egressGateway/image/pullPolicy",
        "'Always', 'IfNotPresent', 'Never'",
    ),
    ({"metrics": {"port": 80}}, "/metrics/port", "minimum"),
    ({"egressGateway": {"port": "3128"}}, "/egressGateway/port", "want integer"),
    (
        {"operator": {"podDisruptionBudget": {"maxUnavailable": "half"}}},
        "/operator/podDisruptionBudget/maxUnavailable",
        "pattern",
    ),
    ({"rbac": {"create": "yes"}}, "/rbac/create", "want boolean"),
]


@pytest.mark.parametrize(("values", "path", "why"), WRONG_VALUES)
def test_a_wrong_value_fails_the_install_naming_its_path(
    values: dict[str, Any], path: str, why: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        render(values)
    message = str(refused.value)
    assert f"at '{path}'" in message and why in message, message
    assert "Traceback" not in message and len(message.splitlines()) <= 4, message
    report = helm.lint(CHART, values, namespace=NAMESPACE)
    assert any(path in error for error in report["errors"]), report


def test_an_existing_service_account_must_be_named() -> None:
    with pytest.raises(helm.HelmRenderError) as refused:
        render({"operator": {"serviceAccount": {"create": False}}})
    assert "operator.serviceAccount.name" in str(refused.value)
    objs = objects({"operator": {"serviceAccount": {"create": False, "name": "ops"}}})
    assert not find(objs, "ServiceAccount", "ops")
    binding = one(objs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == "ops"


# -- RBAC: exactly what the operator calls ------------------------------------------------------

# (API group, resource) -> verbs, from maka_eval.k8s.cluster / controller / operator and
# kopf's watches. Anything more is a finding; anything less breaks the operator (the
# cluster test below runs it with these rights only).
OPERATOR_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("eval.maka.dev", "experiments"): {"list", "watch"},
    ("eval.maka.dev", "cells"): {"get", "list", "watch", "create"},
    ("eval.maka.dev", "attempts"): {"get", "list", "watch", "create"},
    ("eval.maka.dev", "experiments/status"): {"patch"},
    ("eval.maka.dev", "cells/status"): {"patch"},
    ("eval.maka.dev", "attempts/status"): {"patch"},
    ("", "pods"): {"get", "list", "watch", "create", "patch", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create"},
    ("", "secrets"): {"get", "create"},
    ("", "events"): {"create"},
}
DANGEROUS = {"escalate", "bind", "impersonate", "*"}


def operator_rights(
    objs: list[dict[str, Any]], sa: str
) -> dict[str, dict[tuple[str, str], set[str]]]:
    """Namespace ('' for cluster-wide) -> (group, resource) -> verbs granted to `sa`."""
    bound: list[tuple[str, str, str]] = []  # (namespace, kind, role name)
    for binding in objs:
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"]
        ):
            ns = binding["metadata"].get("namespace", "")
            bound.append((ns, binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    rights: dict[str, dict[tuple[str, str], set[str]]] = defaultdict(lambda: defaultdict(set))
    for ns, kind, name in bound:
        role = one(
            [
                o
                for o in objs
                if o.get("metadata", {}).get("namespace", "") == (ns if kind == "Role" else "")
            ],
            kind,
            name,
        )
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    key = (
                        group,
                        resource
                        + (
                            ":" + ",".join(rule["resourceNames"])
                            if rule.get("resourceNames")
                            else ""
                        ),
                    )
                    rights[ns][key] |= set(rule["verbs"])
    return rights


@pytest.mark.parametrize("case", sorted(REPRESENTATIVE))
def test_rbac_grants_the_operator_exactly_what_it_calls(case: str) -> None:
    values = REPRESENTATIVE[case]
    objs = objects(values)
    for role, rule in rules_of(objs):
        where = f"{role['kind']}/{role['metadata']['name']}"
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(field, ()), f"{where}: wildcard in {field}: {rule}"
        assert not DANGEROUS & set(rule["verbs"]), f"{where}: {rule['verbs']}"
        assert not {"pods/exec", "pods/attach", "pods/portforward", "pods/log"} & set(
            rule["resources"]
        ), f"{where}: {rule['resources']}"
    sa = one(
        objs,
        "ClusterRoleBinding",
        next(b["metadata"]["name"] for b in find(objs, "ClusterRoleBinding")),
    )["subjects"][0]["name"]
    rights = operator_rights(objs, sa)
    operator = values.get("operator", {})
    watched = operator.get("watchNamespaces") or []
    peering = operator.get("replicas", 1) > 1
    table = "\n".join(
        f"  {ns or '(cluster)'} {group or 'core'}/{resource}: {sorted(verbs)}"
        for ns, per in sorted(rights.items())
        for (group, resource), verbs in sorted(per.items())
    )
    print(f"{case}: verbs per resource of ServiceAccount {sa}\n{table}")
    crd_scan = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
    if not watched:
        expected = dict(OPERATOR_RIGHTS)
        if peering:
            expected[("kopf.dev", "clusterkopfpeerings")] = {"list", "watch", "patch"}
        assert {ns: dict(per) for ns, per in rights.items()} == {"": expected}
        return
    # Watching namespaces: the namespaced rights only there; kopf follows namespaces.
    cluster = {**crd_scan, ("", "namespaces"): {"list", "watch"}}
    namespaced = {k: v for k, v in OPERATOR_RIGHTS.items() if k not in crd_scan}
    if peering:
        namespaced[("kopf.dev", "kopfpeerings")] = {"list", "watch", "patch"}
    expected_all: dict[str, dict[tuple[str, str], set[str]]] = {"": cluster}
    for ns in watched:
        expected_all[ns] = namespaced
    release = NAMESPACE
    if values.get("egressGateway", {}).get("enabled", True) and release not in watched:
        # Only the gateway key, by name, in the release namespace.
        key = values.get("egressGateway", {}).get("key", {}).get("existingSecret") or (
            f"{values.get('fullnameOverride') or 'maka-eval'}-egress-gateway"
        )
        expected_all[release] = {("", f"secrets:{key}"): {"get"}}
    assert {ns: dict(per) for ns, per in rights.items()} == expected_all


def test_nobody_but_the_operator_may_write_status() -> None:
    objs = objects()
    sa = "maka-eval-operator"
    operator_roles = {
        b["roleRef"]["name"]
        for b in objs
        if b["kind"].endswith("Binding") and any(s["name"] == sa for s in b["subjects"])
    }
    people = [r for r in find(objs, "ClusterRole") if r["metadata"]["name"] not in operator_roles]
    assert {r["metadata"]["name"] for r in people} == {"maka-eval-edit", "maka-eval-view"}
    for role in people:
        for rule in role["rules"]:
            assert not [r for r in rule["resources"] if r.endswith("/status")], role
    edit = one(people, "ClusterRole", "maka-eval-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    verbs = {r: set(rule["verbs"]) for rule in edit["rules"] for r in rule["resources"]}
    assert verbs["attempts"] == {"get", "list", "watch"}  # attempts are the operator's


# -- the real API server --------------------------------------------------------------------------


def apply_chart_crds(kubectl: Kubectl) -> None:
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    names = [f"crd/{c['metadata']['name']}" for c in crd_objects()]
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", *names)


def in_namespace(values: Mapping[str, Any], ns: str) -> dict[str, Any]:
    """The values with the watched namespaces replaced by the test's own."""
    copied = json.loads(json.dumps(values))
    operator = copied.setdefault("operator", {})
    if operator.get("watchNamespaces"):
        operator["watchNamespaces"] = [ns]
    return copied


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REPRESENTATIVE))
def test_every_rendered_object_is_accepted_by_the_api_server(
    kubectl: Kubectl, namespace: str, case: str
) -> None:
    apply_chart_crds(kubectl)
    values = in_namespace(REPRESENTATIVE[case], namespace)
    objs = objects(values, name=f"r{namespace[-8:]}", namespace=namespace)
    listed = {"apiVersion": "v1", "kind": "List", "items": objs}
    proc = kubectl.run(
        "apply",
        "--dry-run=server",
        "-o",
        "name",
        "-f",
        "-",
        input=json.dumps(listed),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    accepted = proc.stdout.split()
    assert len(accepted) == len(objs), (accepted, [o["kind"] for o in objs])


FORBIDDEN_TO_THE_OPERATOR = [
    ("create", "pods/exec", ""),
    ("get", "pods/log", ""),
    ("update", "experiments", "eval.maka.dev"),
    ("patch", "experiments", "eval.maka.dev"),
    ("delete", "experiments", "eval.maka.dev"),
    ("delete", "cells", "eval.maka.dev"),
    ("update", "attempts", "eval.maka.dev"),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("delete", "secrets", ""),
    ("delete", "networkpolicies", "networking.k8s.io"),
    ("create", "rolebindings", "rbac.authorization.k8s.io"),
    ("list", "namespaces", ""),
]


def can_i(
    kubectl: Kubectl, verb: str, resource: str, group: str, namespace: str, *who: str
) -> bool:
    """The real API server's RBAC answer (`kubectl auth can-i`)."""
    target = f"{resource.split('/')[0]}.{group}" if group else resource.split("/")[0]
    sub = ["--subresource", resource.split("/")[1]] if "/" in resource else []
    proc = kubectl.run(
        "auth", "can-i", verb, target, *sub, f"--namespace={namespace}", *who, check=False
    )
    return proc.stdout.strip() == "yes"


@pytest.mark.slow
def test_the_api_server_grants_the_operator_exactly_its_verbs(
    kubectl: Kubectl, namespace: str
) -> None:
    """Cluster-wide install: every verb of OPERATOR_RIGHTS allowed in any namespace, the
    rest refused; people with the built-in edit role may not write status."""
    with Installed(kubectl, {}, namespace) as installed:
        sa = ["--as", f"system:serviceaccount:{namespace}:{installed.service_account()}"]
        elsewhere = "default"
        for (group, resource), verbs in OPERATOR_RIGHTS.items():
            for verb in sorted(verbs):
                assert can_i(kubectl, verb, resource, group, elsewhere, *sa), (verb, resource)
        for verb, resource, group in FORBIDDEN_TO_THE_OPERATOR:
            assert not can_i(kubectl, verb, resource, group, elsewhere, *sa), (verb, resource)

        # A person holding the built-in `edit` role in a namespace (the chart's
        # -edit ClusterRole is aggregated into it by the controller manager).
        kubectl.run(
            "create",
            "rolebinding",
            "alice-edit",
            "--clusterrole=edit",
            "--user=alice",
            f"--namespace={namespace}",
        )
        alice = ["--as", "alice"]
        wait_until(
            lambda: can_i(kubectl, "create", "experiments", "eval.maka.dev", namespace, *alice),
            timeout=60,
            what="the edit role to aggregate maka-eval-edit",
        )
        assert can_i(kubectl, "patch", "cells", "eval.maka.dev", namespace, *alice)  # rerun
        for resource in ("experiments/status", "cells/status", "attempts/status"):
            for verb in ("patch", "update"):
                assert not can_i(kubectl, verb, resource, "eval.maka.dev", namespace, *alice)
        assert not can_i(kubectl, "create", "attempts", "eval.maka.dev", namespace, *alice)


# -- the operator as the chart runs it ------------------------------------------------------------


def service_account_kubeconfig(kubectl: Kubectl, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (as in-cluster config would)."""
    token = kubectl.run("create", "token", sa, f"--namespace={namespace}", "--duration=2h")
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "envtest", "cluster": cluster}],
                "users": [{"name": sa, "user": {"token": token.stdout.strip()}}],
                "contexts": [{"name": sa, "context": {"cluster": "envtest", "user": sa}}],
                "current-context": sa,
            }
        )
    )
    return path


class ChartOperator:
    """`maka-eval operator` with the args and env of the chart's operator container."""

    def __init__(
        self, container: Mapping[str, Any], namespace: str, pod: str, kubeconfig: Path, log: Path
    ) -> None:
        self.container = container
        self.namespace = namespace
        self.pod = pod
        self.kubeconfig = kubeconfig
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.port = free_port()

    def argv(self) -> list[str]:
        args = [a for a in self.container["args"] if not a.startswith("--metrics-port")]
        # The one change: a free port here, where every test shares the host network.
        return [
            str(MAKA_EVAL),
            "operator",
            *args,
            f"--metrics-port={self.port}",
            f"--kubeconfig={self.kubeconfig}",
        ]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "POD_ID")}
        env["HOME"] = str(self.log.parent)
        fields = {"metadata.namespace": self.namespace, "metadata.name": self.pod}
        for item in self.container.get("env") or ():
            if "value" in item:
                env[item["name"]] = item["value"]
            else:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    def start(self) -> ChartOperator:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class Installed:
    """The chart's objects applied for real in a test namespace (cluster-scoped ones
    removed afterwards)."""

    def __init__(self, kubectl: Kubectl, values: Mapping[str, Any], namespace: str) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.release = f"r{namespace[-8:]}"
        self.objs = objects(values, name=self.release, namespace=namespace)

    def __enter__(self) -> Installed:
        apply_chart_crds(self.kubectl)
        listed = {"apiVersion": "v1", "kind": "List", "items": self.objs}
        self.kubectl.run("apply", "-f", "-", input=json.dumps(listed))
        return self

    def __exit__(self, *_: object) -> None:
        for obj in self.objs:
            if "namespace" not in obj["metadata"]:  # the namespace goes with the test
                self.kubectl.run(
                    "delete",
                    obj["kind"],
                    obj["metadata"]["name"],
                    "--ignore-not-found",
                    "--wait=false",
                    check=False,
                )

    def service_account(self) -> str:
        binding = find(self.objs, "RoleBinding") + find(self.objs, "ClusterRoleBinding")
        return str(binding[0]["subjects"][0]["name"])


def wait_complete(
    kubectl: Kubectl, namespace: str, name: str, ops: list[ChartOperator], timeout: float = 420
) -> dict[str, Any]:
    def done() -> Any:
        assert any(op.alive() for op in ops), "the operator exited:\n" + ops[0].text()[-3000:]
        exp = kubectl.json("get", "experiment", name, f"--namespace={namespace}")
        return exp if (exp.get("status") or {}).get("phase") == "Complete" else None

    try:
        return wait_until(done, timeout=timeout, interval=1.0, what=f"experiment {name} Complete")
    except AssertionError:
        for op in ops:
            print(op.text()[-4000:])
        raise


@pytest.mark.slow
def test_the_operator_installed_from_the_chart_runs_the_example(
    kubectl: Kubectl, namespace: str, node_agent: Any, tmp_path: Path
) -> None:
    values = {"operator": {"watchNamespaces": [namespace], "logFormat": "json"}}
    with Installed(kubectl, values, namespace) as installed:
        sa = installed.service_account()
        # Nothing but the chart's RBAC: the operator authenticates as its ServiceAccount.
        config = service_account_kubeconfig(kubectl, namespace, sa, tmp_path / "sa.kubeconfig")
        container = operator_container(installed.objs)
        op = ChartOperator(container, namespace, "operator-0", config, tmp_path / "op.log")
        op.start()
        try:
            doc = yaml.safe_load(EXAMPLE.read_text())
            kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc))
            exp = wait_complete(kubectl, namespace, "hello", [op])
            status = exp["status"]
            spec = doc["spec"]
            cells = len(spec["tasks"]) * spec["repetitions"] * len(spec["subjects"])
            assert status["cellsTotal"] == cells and status["cellsDone"] == cells, status
            assert {s["subjectId"]: s["n"] for s in status["subjects"]} == {
                s["id"]: len(spec["tasks"]) * spec["repetitions"] for s in spec["subjects"]
            }
            oracle = next(s for s in status["subjects"] if s["subjectId"] == "oracle")
            assert oracle["meanScore"] == 1.0
            # Argo CD would show the run, its cells and attempts Healthy (kstatus Ready).
            health = Health(HEALTH_LUA.read_text())
            for kind in ("experiments", "cells", "attempts"):
                for obj in kubectl.json("get", kind, f"--namespace={namespace}")["items"]:
                    hs = health(obj)
                    assert hs["status"] == "Healthy", (kind, obj["metadata"]["name"], hs)
            # The Deployment's readiness probe: /metrics on the chart's metrics port.
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{op.port}/metrics").read()
            assert b"maka_eval_reconcile_passes_total" in metrics
            # JSON logs (operator.logFormat): every line one object.
            lines = [line for line in op.text().splitlines() if line.strip()]
            assert lines and all(line.startswith("{") for line in lines), lines[:5]
            assert "Forbidden" not in op.text() and " 403" not in op.text(), op.text()[-3000:]
        finally:
            op.stop()


RESUMED = "Resuming operations after the pause"
"""kopf's line when a paused replica (every replica starts paused) becomes the active one."""
STANDING_BY = "started as a peer"
ACTIVE = "maka-eval operator active"


@pytest.mark.slow
def test_two_replicas_run_active_standby(
    kubectl: Kubectl, namespace: str, node_agent: Any, tmp_path: Path
) -> None:
    values = {"operator": {"watchNamespaces": [namespace], "replicas": 2}}
    with Installed(kubectl, values, namespace) as installed:
        sa = installed.service_account()
        config = service_account_kubeconfig(kubectl, namespace, sa, tmp_path / "sa.kubeconfig")
        container = operator_container(installed.objs)
        first = ChartOperator(container, namespace, "operator-a", config, tmp_path / "a.log")
        second = ChartOperator(container, namespace, "operator-b", config, tmp_path / "b.log")
        first.start()
        try:
            (peering,) = [
                a.split("=", 1)[1] for a in container["args"] if a.startswith("--peering=")
            ]
            assert one(installed.objs, "KopfPeering")["metadata"]["name"] == peering

            def peers() -> dict[str, Any]:
                obj = kubectl.json("get", "kopfpeering", peering, f"--namespace={namespace}")
                return dict(obj.get("status") or {})

            # A replica starts paused and resumes once it sees no peer above it.
            wait_until(lambda: "operator-a" in peers(), timeout=60, what="operator-a peering")
            wait_until(lambda: RESUMED in first.text(), timeout=60, what="operator-a to act")

            one_cell = yaml.safe_load(EXAMPLE.read_text())
            one_cell["metadata"]["name"] = "first"
            one_cell["spec"]["tasks"] = [{"id": "sum-numbers"}, {"id": "fix-greeting"}]
            one_cell["spec"]["subjects"] = [{"id": "oracle", "kind": "oracle"}]
            one_cell["spec"]["repetitions"] = 1
            one_cell["spec"]["execution"]["maxConcurrentTaskGroups"] = 1
            kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(one_cell))
            # The second replica joins while the first runs an experiment: it stands by.
            second.start()
            wait_until(lambda: "operator-b" in peers(), timeout=60, what="operator-b peering")
            status = peers()
            assert status["operator-a"]["priority"] > status["operator-b"]["priority"]
            wait_complete(kubectl, namespace, "first", [first, second], timeout=180)
            assert STANDING_BY in second.text()
            assert RESUMED not in second.text() and ACTIVE not in second.text()

            # The active one goes away cleanly (a rollout, a drain): the standby takes over.
            first.stop()
            wait_until(lambda: ACTIVE in second.text(), timeout=90, what="the standby to act")
            assert RESUMED in second.text()
            one_cell["metadata"]["name"] = "second"
            kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(one_cell))
            wait_complete(kubectl, namespace, "second", [second], timeout=180)
        except BaseException:
            print("operator-a:\n" + first.text()[-4000:])
            print("operator-b:\n" + second.text()[-4000:])
            raise
        finally:
            first.stop()
            second.stop()
