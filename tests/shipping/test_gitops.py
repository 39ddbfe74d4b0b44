"""GitOps: the cohort kustomization of examples/gitops, a frozen Experiment edited in Git
refused by the real API server with a message a user can act on, and the Argo CD health
check (docs/argocd-health.lua) run in a real Lua runtime against the kstatus conditions
the operator writes."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest
import yaml
from lupa import LuaRuntime

from maka_eval.k8s.controller import validate
from maka_eval.k8s.resources import KStatus, Reason, kstatus, merge_conditions
from tests.k8s.conftest import CRDS, KUBECTL, REPO, Kubectl

GITOPS = REPO / "examples" / "gitops"
HEALTH_LUA = REPO / "docs" / "argocd-health.lua"
IMMUTABLE = (
    "Experiment spec is immutable: to run a changed spec, create an Experiment with a new "
    "metadata.name"
)


def build() -> list[dict[str, Any]]:
    """`kubectl kustomize examples/gitops`: what Argo CD or Flux applies."""
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(GITOPS)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def experiments(namespace: str | None = None) -> list[dict[str, Any]]:
    found = [o for o in build() if o["kind"] == "Experiment"]
    if namespace:
        for obj in found:
            obj["metadata"]["namespace"] = namespace
    return found


# -- the cohort ------------------------------------------------------------------------------------


def test_the_cohort_builds_into_valid_experiments() -> None:
    objs = build()
    assert [o["kind"] for o in objs].count("Experiment") == 3
    names = [o["metadata"]["name"] for o in experiments()]
    assert len(set(names)) == len(names)
    for obj in experiments():
        meta = obj["metadata"]
        assert meta["namespace"] == "evals"
        assert meta["labels"]["eval.maka.dev/cohort"] == "hello-2026-12"
        # A file leaving Git never deletes a finished run.
        assert meta["annotations"]["argocd.argoproj.io/sync-options"] == "Prune=false"
        assert meta["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"
        validate(obj)  # the operator's own validation: a MakaEvalError would fail here


def test_every_experiment_file_is_in_the_cohort() -> None:
    kustomization = yaml.safe_load((GITOPS / "kustomization.yaml").read_text())
    listed = {r for r in kustomization["resources"] if r.startswith("experiments/")}
    on_disk = {f"experiments/{p.name}" for p in (GITOPS / "experiments").glob("*.yaml")}
    assert listed == on_disk


@pytest.mark.slow
def test_the_cohort_is_accepted_by_the_api_server(
    kubectl: Kubectl, crds: list[str], namespace: str
) -> None:
    listed = {"apiVersion": "v1", "kind": "List", "items": experiments(namespace)}
    proc = kubectl.run(
        "apply", "--dry-run=server", "-o", "name", "-f", "-", input=json.dumps(listed)
    )
    assert len(proc.stdout.split()) == 3, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("server_side", [False, True], ids=["client-side", "server-side"])
def test_an_applied_experiment_edited_in_git_is_a_clear_sync_error(
    kubectl: Kubectl, crds: list[str], namespace: str, server_side: bool
) -> None:
    """Argo CD applies client-side by default (or server-side), Flux server-side: either
    way the edit is refused, naming the experiment and what to do instead."""
    mode = ["--server-side", "--field-manager=gitops-test"] if server_side else []
    first = experiments(namespace)
    kubectl.run(
        "apply",
        *mode,
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": first}),
    )
    edited = copy.deepcopy(first)
    target = next(o for o in edited if o["metadata"]["name"] == "hello-scripted-r1")
    target["spec"]["repetitions"] = 5  # "just bump the repetitions" in Git
    proc = kubectl.run(
        "apply",
        *mode,
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": edited}),
        check=False,
    )
    assert proc.returncode != 0
    print(proc.stderr)
    # The one error names the experiment and says what to do.
    assert 'The Experiment "hello-scripted-r1" is invalid: spec' in proc.stderr, proc.stderr
    assert IMMUTABLE in proc.stderr, proc.stderr
    for other in ("hello-oracle-baseline", "hello-scripted-r2"):
        assert f'"{other}" is invalid' not in proc.stderr
    stored = kubectl.json("get", "experiment", "hello-scripted-r1", f"--namespace={namespace}")
    assert stored["spec"]["repetitions"] == 2  # the frozen spec stands

    # The intended workflow: the change as a new experiment next to the old one.
    renamed = copy.deepcopy(target)
    renamed["metadata"]["name"] = "hello-scripted-r3"
    kubectl.run("apply", *mode, "-f", "-", input=json.dumps(renamed))
    stored = kubectl.json("get", "experiment", "hello-scripted-r3", f"--namespace={namespace}")
    assert stored["spec"]["repetitions"] == 5
    # Metadata is not frozen: relabelling a run (a cohort renamed in Git) syncs.
    relabelled = copy.deepcopy(first[0])
    relabelled["metadata"]["labels"]["eval.maka.dev/cohort"] = "hello-2027-01"
    kubectl.run("apply", *mode, "-f", "-", input=json.dumps(relabelled))


def test_the_immutability_message_is_the_crds() -> None:
    crd = yaml.safe_load((CRDS / "experiments.eval.maka.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    assert {"rule": "self == oldSelf", "message": IMMUTABLE} in rules


# -- the Argo CD health check ----------------------------------------------------------------------


class Health:
    """docs/argocd-health.lua as Argo CD runs it: `obj` a global, the script returns hs."""

    def __init__(self, script: str) -> None:
        self.lua = LuaRuntime(unpack_returned_tuples=True)
        self.script = script
        self.run = self.lua.eval(
            "function(obj, script)"
            " local env = setmetatable({obj = obj}, {__index = _G})"
            " local chunk = assert(load(script, 'health.lua', 't', env))"
            " return chunk()"
            " end"
        )

    def __call__(self, obj: dict[str, Any]) -> dict[str, str]:
        hs = self.run(self.lua.table_from(obj, recursive=True), self.script)
        return {"status": hs["status"], "message": hs["message"]}


@pytest.fixture(scope="module")
def health() -> Health:
    return Health(HEALTH_LUA.read_text())


def resource(kind: str, generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "eval.maka.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "evals", "generation": generation},
    }
    if status is not None:
        obj["status"] = status
    return obj


def written(true: KStatus, reason: Reason, message: str, generation: int = 1) -> dict[str, Any]:
    """A status with the conditions exactly as the operator writes them."""
    conditions, _ = merge_conditions(
        None, kstatus(true, reason, message), generation, "2026-12-03T08:00:00Z"
    )
    return {"observedGeneration": generation, "phase": "Whatever", "conditions": conditions}


ARGO = {KStatus.READY: "Healthy", KStatus.RECONCILING: "Progressing", KStatus.STALLED: "Degraded"}

# Every (kind, kstatus, reason) the operator writes (maka_eval.k8s.controller).
WRITTEN = [
    ("Experiment", KStatus.RECONCILING, Reason.RUNNING),
    ("Experiment", KStatus.RECONCILING, Reason.PREREQUISITES_MISSING),
    ("Experiment", KStatus.READY, Reason.COMPLETE),
    ("Experiment", KStatus.STALLED, Reason.INVALID_SPEC),
    ("Experiment", KStatus.STALLED, Reason.BUDGET_EXHAUSTED),
    ("Experiment", KStatus.STALLED, Reason.CELLS_FAILED),
    ("Cell", KStatus.RECONCILING, Reason.RETRYING),
    ("Cell", KStatus.READY, Reason.RESULT_SELECTED),
    ("Cell", KStatus.STALLED, Reason.RETRIES_EXHAUSTED),
    ("Cell", KStatus.STALLED, Reason.BUDGET_EXHAUSTED),
    ("Attempt", KStatus.RECONCILING, Reason.RUNNING),
    ("Attempt", KStatus.READY, Reason.COMPLETED),
    ("Attempt", KStatus.READY, Reason.SUBJECT_FAILED),
    ("Attempt", KStatus.STALLED, Reason.INFRA_FAILED),
    ("Attempt", KStatus.STALLED, Reason.CANCELLED),
]


@pytest.mark.parametrize(("kind", "true", "reason"), WRITTEN)
def test_argo_health_follows_the_operators_conditions(
    health: Health, kind: str, true: KStatus, reason: Reason
) -> None:
    message = f"what the operator says about the {kind}"
    hs = health(resource(kind, 3, written(true, reason, message, generation=3)))
    assert hs == {"status": ARGO[true], "message": f"{reason.value}: {message}"}


def test_argo_health_of_hand_written_kstatus_samples(health: Health) -> None:
    def condition(type_: str, status: str, reason: str, generation: int = 2) -> dict[str, Any]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": f"{type_} says {reason}",
            "observedGeneration": generation,
            "lastTransitionTime": "2026-12-03T08:00:00Z",
        }

    def status(*conditions: dict[str, Any], observed: int = 2) -> dict[str, Any]:
        return {"observedGeneration": observed, "conditions": list(conditions)}

    # Not reconciled yet: no status, or no conditions.
    assert health(resource("Experiment", 1, None))["status"] == "Progressing"
    assert health(resource("Experiment", 1, {"phase": "Pending"}))["status"] == "Progressing"
    ready = status(
        condition("Ready", "True", "Complete"),
        condition("Reconciling", "False", "Complete"),
        condition("Stalled", "False", "Complete"),
    )
    assert health(resource("Experiment", 2, ready)) == {
        "status": "Healthy",
        "message": "Complete: Ready says Complete",
    }
    # The operator has not seen the latest generation: whatever it said is old news.
    stale = health(resource("Experiment", 3, ready))
    assert stale["status"] == "Progressing" and "generation 3" in stale["message"]
    # observedGeneration on the status is current but a condition is older: ignored.
    old_condition = status(condition("Ready", "True", "Complete", generation=1))
    assert health(resource("Cell", 2, old_condition))["status"] == "Progressing"
    # Stalled wins over anything else True (kstatus: Stalled is terminal until a person acts).
    both = status(condition("Ready", "True", "Complete"), condition("Stalled", "True", "Budget"))
    assert health(resource("Experiment", 2, both))["status"] == "Degraded"
    # No generation anywhere (older objects): conditions are taken as they are.
    bare = {"conditions": [{"type": "Reconciling", "status": "True", "reason": "Running"}]}
    hs = health({"kind": "Attempt", "metadata": {"name": "a"}, "status": bare})
    assert hs == {"status": "Progressing", "message": "Running"}
    # Only False conditions (should not happen): still waiting, never Healthy.
    none_true = status(condition("Ready", "False", "Running"))
    assert health(resource("Attempt", 2, none_true))["status"] == "Progressing"


def test_the_argocd_configmap_carries_the_same_lua_for_each_kind() -> None:
    config = yaml.safe_load((GITOPS / "argocd" / "argocd-cm.yaml").read_text())
    lua = HEALTH_LUA.read_text()
    keys = {k: v for k, v in config["data"].items() if k.startswith("resource.customizations")}
    assert keys == {
        f"resource.customizations.health.eval.maka.dev_{kind}": lua
        for kind in ("Experiment", "Cell", "Attempt")
    }


def test_the_gitops_manifests_parse() -> None:
    for path in [*(GITOPS / "argocd").glob("*.yaml"), *(GITOPS / "flux").glob("*.yaml")]:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert docs and all("apiVersion" in d and "kind" in d for d in docs), path
