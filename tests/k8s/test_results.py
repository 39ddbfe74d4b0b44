"""A Pod's end -> the attempt's kernel, and the controller's passes, on an in-memory API."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.k8s.cluster import AlreadyExists, Rejected
from maka_eval.k8s.controller import Controller
from maka_eval.k8s.results import image_pull_waiting_since, pod_end
from maka_eval.k8s.store import Store
from tests.k8s.conftest import REPO

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
KERNEL = ResultKernel(
    status=AttemptStatus.COMPLETED,
    score=1.0,
    usage=None,
    cost_usd=None,
    duration_sec=2.0,
    artifacts=(),
    status_source=StatusSource.FRAME,
)


def pod(phase: str = "Running", terminated: dict[str, Any] | None = None, **status: Any) -> Any:
    container: dict[str, Any] = {"name": "subject", "state": {"running": {}}}
    if terminated is not None:
        container["state"] = {"terminated": terminated}
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-12-02T11:50:00Z"},
        "status": {
            "phase": phase,
            "startTime": "2026-12-02T11:59:00Z",
            "containerStatuses": [container],
            **status,
        },
    }


def test_a_running_pod_has_no_end() -> None:
    assert pod_end(pod(), NOW) is None
    assert pod_end(pod("Pending"), NOW) is None


def test_the_termination_message_is_the_kernel() -> None:
    end = pod_end(
        pod(
            "Succeeded",
            {"exitCode": 0, "message": KERNEL.to_json(), "finishedAt": "2026-12-02T11:59:30Z"},
        ),
        NOW,
    )
    assert end is not None and end.kernel == KERNEL
    assert end.finished_at == datetime(2026, 12, 2, 11, 59, 30, tzinfo=UTC)


def test_a_relay_crash_without_a_kernel_is_an_infrastructure_failure() -> None:
    end = pod_end(pod("Failed", {"exitCode": 139, "reason": "Error"}), NOW)
    assert end is not None
    assert end.kernel.status is AttemptStatus.INFRA_FAILED
    assert end.kernel.score is None
    assert "exit code 139" in (end.kernel.reason or "")


def test_oomkilled_says_what_to_raise() -> None:
    end = pod_end(pod("Failed", {"exitCode": 137, "reason": "OOMKilled"}), NOW)
    assert end is not None and end.kernel.status is AttemptStatus.INFRA_FAILED
    assert "resources.limits.memory" in (end.kernel.reason or "")


def test_a_forged_or_broken_termination_message_is_not_a_result() -> None:
    forged = KERNEL.to_json().replace('"score":1.0', '"score":"1"')
    end = pod_end(pod("Failed", {"exitCode": 0, "message": forged}), NOW)
    assert end is not None and end.kernel.status is AttemptStatus.INFRA_FAILED
    assert "not a valid result kernel" in (end.kernel.reason or "")


def test_eviction_and_init_failures() -> None:
    evicted = pod("Failed", reason="Evicted", message="The node was low on memory.")
    evicted["status"]["containerStatuses"] = []
    end = pod_end(evicted, NOW)
    assert end is not None and "Evicted: The node was low on memory." in (end.kernel.reason or "")
    init = pod(
        "Failed",
        initContainerStatuses=[
            {"name": "relay-bundle", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
        ],
    )
    init["status"]["containerStatuses"] = []
    end = pod_end(init, NOW)
    assert end is not None and "init container relay-bundle failed" in (end.kernel.reason or "")


def test_image_pull_waiting() -> None:
    waiting = pod("Pending")
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ImagePullBackOff"}}
    assert image_pull_waiting_since(waiting) == datetime(2026, 12, 2, 11, 50, tzinfo=UTC)
    assert image_pull_waiting_since(pod("Pending")) is None


# -- the controller on an in-memory API ---------------------------------------------------


class FakeCluster:
    """Keeps objects by kind and name, stamps resourceVersions and uids, counts writes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.version = itertools.count(1)
        self.refuse: set[str] = set()

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self.version))
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        return copy.deepcopy(obj)

    def create(self, kind: str, namespace: str, body: Any, *, dry_run: bool = False) -> Any:
        store = self.objects.setdefault(kind, {})
        name = body["metadata"].get("name") or f"{body['metadata']['generateName']}{len(store)}"
        self.writes.append(("POST", kind, name))
        if name in store:
            raise AlreadyExists(name)
        if kind in self.refuse:
            raise Rejected(403, f'pods "{name}" is forbidden: exceeded quota: pods')
        obj = copy.deepcopy(body)
        obj["metadata"]["name"] = name
        store[name] = obj
        return self._stamp(obj)

    def get(self, kind: str, namespace: str, name: str) -> Any:
        obj = self.objects.get(kind, {}).get(name)
        return copy.deepcopy(obj) if obj is not None else None

    def patch(self, kind: str, namespace: str, name: str, patch: Any, **_: Any) -> Any:
        self.writes.append(("PATCH", kind, name))
        obj = self.objects.get(kind, {}).get(name)
        if obj is None:
            raise Rejected(404, "not found")
        for key, value in patch.items():
            if isinstance(value, dict):
                merged = {**(obj.get(key) or {}), **value}
                obj[key] = {k: v for k, v in merged.items() if v is not None}
            else:
                obj[key] = value
        return self._stamp(obj)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.writes.append(("DELETE", kind, name))
        self.objects.get(kind, {}).pop(name, None)


def experiment_body(deadline: float = 300.0) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples/hello/experiment.k8s.yaml").read_text())
    spec = doc["spec"]
    spec["tasks"] = [{"id": "sum-numbers"}]
    spec["subjects"] = [s for s in spec["subjects"] if s["id"] in ("oracle", "scripted")]
    spec["repetitions"] = 1
    spec["executor"]["config"]["imagePullDeadlineSec"] = deadline
    doc["metadata"].update(namespace="ns", uid="exp-uid", generation=1, resourceVersion="1")
    return doc


def setup(deadline: float = 300.0) -> tuple[FakeCluster, Store, Controller, list[datetime]]:
    cluster = FakeCluster()
    store = Store()
    clock = [NOW]
    controller = Controller(cluster, store, clock=lambda: clock[0])  # type: ignore[arg-type]
    body = experiment_body(deadline)
    cluster.objects["Experiment"] = {"hello": copy.deepcopy(body)}
    store.put("Experiment", body)
    return cluster, store, controller, clock


def sync(cluster: FakeCluster, store: Store) -> None:
    """Deliver every object as a watch event would."""
    for kind in ("Cell", "Attempt", "Pod"):
        for obj in cluster.objects.get(kind, {}).values():
            store.put(kind, copy.deepcopy(obj))


def test_a_group_starts_gated_then_its_gates_lift_and_a_quiet_pass_writes_nothing() -> None:
    cluster, store, controller, _ = setup()
    controller.reconcile(("ns", "hello"))
    kinds = [(verb, kind) for verb, kind, _ in cluster.writes]
    assert kinds.count(("POST", "Cell")) == 2
    assert kinds.count(("POST", "Attempt")) == 2
    assert kinds.count(("POST", "NetworkPolicy")) == 2
    assert kinds.count(("POST", "Pod")) == 2
    assert kinds.count(("PATCH", "Pod")) == 2  # both gates lifted once both Pods existed
    assert all(not p["spec"].get("schedulingGates") for p in cluster.objects["Pod"].values())
    sync(cluster, store)
    before = len(cluster.writes)
    controller.reconcile(("ns", "hello"))
    assert cluster.writes[before:] == []  # nothing changed: nothing written


def test_results_are_written_once_and_selection_follows() -> None:
    cluster, store, controller, _ = setup()
    controller.reconcile(("ns", "hello"))
    for obj in cluster.objects["Pod"].values():
        obj["status"] = pod("Succeeded", {"exitCode": 0, "message": KERNEL.to_json()})["status"]
    sync(cluster, store)
    before = len(cluster.writes)
    controller.reconcile(("ns", "hello"))
    writes = [(v, k) for v, k, _ in cluster.writes[before:]]
    assert writes.count(("PATCH", "Attempt")) == 2
    assert writes.count(("PATCH", "Cell")) == 2
    assert writes.count(("PATCH", "Experiment")) == 1
    assert not [w for w in writes if w[0] == "POST" and w[1] != "Event"]
    for cell in cluster.objects["Cell"].values():
        assert cell["status"]["selectedAttempt"] == 1 and cell["status"]["score"] == 1.0
    status = cluster.objects["Experiment"]["hello"]["status"]
    assert status["phase"] == "Complete" and status["cellsDone"] == 2
    sync(cluster, store)
    before = len(cluster.writes)
    controller.reconcile(("ns", "hello"))
    assert [w for w in cluster.writes[before:] if w[1] != "Experiment"] == []


def test_an_image_that_cannot_be_pulled_fails_the_attempt_at_the_deadline() -> None:
    cluster, store, controller, clock = setup(deadline=60)
    controller.reconcile(("ns", "hello"))
    for obj in cluster.objects["Pod"].values():
        obj["metadata"]["creationTimestamp"] = "2026-12-02T12:00:00Z"
        obj["status"] = {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "subject", "state": {"waiting": {"reason": "ErrImagePull"}}}
            ],
        }
    sync(cluster, store)
    due = controller.reconcile(("ns", "hello"))
    assert due is not None and 59 <= due <= 60  # a timer, not polling
    clock[0] = NOW + timedelta(seconds=61)
    sync(cluster, store)
    controller.reconcile(("ns", "hello"))
    deleted = [n for v, k, n in cluster.writes if v == "DELETE" and k == "Pod"]
    assert len(deleted) == 2
    first = [a for a in cluster.objects["Attempt"].values() if a["spec"]["number"] == 1]
    assert all(a["status"]["result"]["status"] == "infra_failed" for a in first)
    assert all("could not be pulled within" in a["status"]["result"]["reason"] for a in first)
    retries = [a for a in cluster.objects["Attempt"].values() if a["spec"]["number"] == 2]
    assert len(retries) == 2 and all(a["spec"]["trigger"] == "retry" for a in retries)


def test_a_pod_the_server_refuses_fails_its_attempt_with_the_servers_words() -> None:
    cluster, _store, controller, _ = setup()
    cluster.refuse.add("Pod")
    controller.reconcile(("ns", "hello"))
    attempts = list(cluster.objects["Attempt"].values())
    assert len(attempts) == 2
    for attempt in attempts:
        result = attempt["status"]["result"]
        assert result["status"] == "infra_failed"
        assert "refused the attempt's Pod: 403: " in result["reason"]
        assert "exceeded quota" in result["reason"]


def test_after_a_restart_a_pod_never_created_is_created_and_a_lost_one_is_retried() -> None:
    """The operator died between creating an Attempt and its Pod: the next operator
    creates the Pod for the same attempt. A Pod that was created and is gone (deleted
    while no operator watched) fails its attempt as infrastructure, and a retry starts."""
    cluster, _store, controller, _ = setup()
    controller.reconcile(("ns", "hello"))
    attempts = sorted(cluster.objects["Attempt"])
    assert all(cluster.objects["Attempt"][a]["status"]["podName"] == a for a in attempts)
    never, lost = attempts
    # `never`: as if the operator had died right after creating the Attempt.
    del cluster.objects["Pod"][never]
    del cluster.objects["Attempt"][never]["status"]
    # `lost`: its Pod was evicted and removed while no operator ran.
    del cluster.objects["Pod"][lost]

    store = Store()
    store.put("Experiment", cluster.objects["Experiment"]["hello"])
    sync(cluster, store)
    restarted = Controller(cluster, store, clock=lambda: NOW)  # type: ignore[arg-type]
    before = len(cluster.writes)
    restarted.reconcile(("ns", "hello"))
    writes = cluster.writes[before:]
    assert ("POST", "Pod", never) in writes
    assert "result" not in cluster.objects["Attempt"][never]["status"]
    assert cluster.objects["Attempt"][never]["status"]["podName"] == never
    result = cluster.objects["Attempt"][lost]["status"]["result"]
    assert result["status"] == "infra_failed" and "gone" in result["reason"]
    numbers = sorted(a["spec"]["number"] for a in cluster.objects["Attempt"].values())
    assert numbers == [1, 1, 2]  # one retry, for the lost Pod only
