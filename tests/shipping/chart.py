"""The Helm chart as the tests see it: rendered by Helm's own Go SDK (helm-python-sdk)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "maka-eval"
RELEASE = "maka-eval"
NAMESPACE = "maka-eval-system"

REPRESENTATIVE: dict[str, dict[str, Any]] = {
    "default": {},
    # Active/standby, JSON logs, a pinned digest, a pre-made gateway key, selectors.
    "ha-cluster-wide": {
        "operator": {
            "replicas": 2,
            "logFormat": "json",
            "image": {"digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
            "relayBundleDigest": "sha256:" + "cd" * 32,
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "extraEnv": [{"name": "TZ", "value": "Etc/UTC"}],
            "podAnnotations": {"prometheus.io/scrape": "true"},
        },
        "egressGateway": {"replicas": 3, "key": {"existingSecret": "gateway-key"}},
        "imagePullSecrets": [{"name": "registry"}],
        "commonLabels": {"team": "evals"},
    },
    # One namespace watched, two replicas, no gateway, no user roles.
    "namespaced": {
        "operator": {"replicas": 2, "watchNamespaces": ["evals"], "verbose": True},
        "egressGateway": {"enabled": False},
        "rbac": {"aggregateToDefaultRoles": False},
        "metrics": {"port": 9443, "service": {"enabled": False}},
    },
    # A release with another name and a single namespace including the release's own.
    "renamed": {
        "fullnameOverride": "evals",
        "operator": {"watchNamespaces": ["maka-eval-system", "team-a"]},
        "egressGateway": {"replicas": 1, "networkPolicy": {"enabled": False}},
    },
}


def load() -> helm.Chart:
    return helm.Chart.load(CHART)


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included), as `helm install` renders."""
    with load() as chart:
        return chart.render(dict(values or {}), name=name, namespace=namespace, is_install=True)


def objects(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
) -> list[dict[str, Any]]:
    """Every object an install would create from templates/ (not NOTES, not crds/)."""
    found: list[dict[str, Any]] = []
    for path, text in sorted(render(values, name=name, namespace=namespace).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                found.append(doc)
    return found


def crd_objects() -> list[dict[str, Any]]:
    """The chart's crds/ (installed by Helm before the templates)."""
    with load() as chart:
        return [doc for crd in chart.crds for doc in yaml.safe_load_all(crd["data"]) if doc]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = find(objs, kind, name)
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def operator_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(
        objs,
        "Deployment",
        next(
            o["metadata"]["name"]
            for o in find(objs, "Deployment")
            if o["metadata"]["name"].endswith("-operator")
        ),
    )
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "operator")


def rules_of(objs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(role object, rule) for every rule of every Role and ClusterRole."""
    for role in objs:
        if role["kind"] in ("Role", "ClusterRole"):
            for rule in role.get("rules") or ():
                yield role, rule
