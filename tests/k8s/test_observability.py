"""What a platform team watches: kstatus conditions, Events, metrics and JSON logs.

The slow test runs `maka-eval operator --log-format json --metrics-port P` against the
real API server of hack/envtest.sh (tests/k8s/node_agent.py as the kubelet) with three
experiments at once: one whose spec is invalid, one that runs to the end with an
infrastructure failure on the way (its Pod is evicted, a retry takes its place) and one
whose budget holds its second task group. It then reads the conditions on the real
objects, lists the Events, and scrapes /metrics before and after, checking that the
figures moved by exactly what happened. The gateway's counters are checked on the real
gateway program; the docs are checked to list every condition reason, Event reason and
metric.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from maka_eval.k8s.controller import Controller
from maka_eval.k8s.events import EventReason
from maka_eval.k8s.metrics import OperatorMetrics
from maka_eval.k8s.resources import KStatus, Reason
from maka_eval.k8s.results import EndCause
from maka_eval.k8s.store import Store
from tests.egress.gateway_harness import (
    GatewayProcess,
    Upstream,
    auth_header,
    send,
    valid_credential,
    write_key,
)
from tests.k8s.conftest import REPO, Kubectl, wait_until
from tests.k8s.test_operator import (  # noqa: F401 (node_agent: a fixture)
    Operator,
    condition,
    get,
    node_agent,
    small,
    wait_for_phase,
)
from tests.k8s.test_results import NOW, FakeCluster, experiment_body, sync

OPERATIONS = REPO / "docs" / "operations.md"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of a /metrics page, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def kstatus_of(obj: dict[str, Any]) -> tuple[str, str]:
    """(the one kstatus condition that is True, its reason), checking the three."""
    status = obj.get("status") or {}
    generation = obj["metadata"]["generation"]
    assert status.get("observedGeneration") == generation, status
    true = []
    reasons = set()
    for kind in KStatus:
        cond = condition(obj, kind.value)
        assert cond is not None, (kind, status.get("conditions"))
        assert cond["observedGeneration"] == generation, cond
        assert cond["message"] and cond["lastTransitionTime"], cond
        reasons.add(cond["reason"])
        if cond["status"] == "True":
            true.append(kind.value)
        else:
            assert cond["status"] == "False", cond
    assert len(true) == 1, status["conditions"]
    assert len(reasons) == 1, status["conditions"]  # one state, one reason
    return true[0], reasons.pop()


def events_of(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(kubectl, "events", namespace)["items"]
    return [e for e in items if (e.get("source") or {}).get("component") == "maka-eval-operator"]


def has_event(events: list[dict[str, Any]], kind: str, name: str, reason: str) -> bool:
    return any(
        e["involvedObject"]["kind"] == kind
        and e["involvedObject"]["name"] == name
        and e["reason"] == reason
        for e in events
    )


@pytest.fixture
def json_operator(
    control_plane: Path, crds: list[str], namespace: str, tmp_path: Path
) -> Iterator[Operator]:
    op = Operator(
        control_plane, namespace, tmp_path / "operator.log", extra=("--log-format", "json")
    ).start()
    try:
        yield op
    finally:
        op.stop()
        print(op.tail())


@pytest.mark.slow
def test_conditions_events_and_metrics_on_the_real_api_server(
    kubectl: Kubectl,
    namespace: str,
    json_operator: Operator,
    node_agent: Any,  # noqa: F811
) -> None:
    op = json_operator
    wait_until(lambda: _answers(op.port), timeout=60, what="the operator's /metrics")
    before = scrape(op.port)
    assert value(before, "maka_eval_attempts_total") == 0

    # 1. An invalid spec: Stalled, an Event, counted as a Failed experiment.
    broken = small("broken")
    broken["spec"]["subjects"].append(dict(broken["spec"]["subjects"][0]))  # duplicate id
    # 2. One task, two arms; the slow arm's first Pod is evicted while it runs.
    doc = small("obs", repetitions=1)
    doc["spec"]["tasks"] = [{"id": "sum-numbers"}]
    doc["spec"]["subjects"] = [
        {"id": "oracle", "kind": "oracle"},
        {"id": "slow", "kind": "external", "config": {"command": "sleep", "args": ["12"]}},
    ]
    # 3. Two task groups one after the other; the first spends the whole token budget.
    held = small("held", repetitions=2)
    held["spec"]["tasks"] = [{"id": "sum-numbers"}]
    held["spec"]["subjects"] = [s for s in held["spec"]["subjects"] if s["id"] == "scripted"]
    held["spec"]["execution"]["maxConcurrentTaskGroups"] = 1
    held["spec"]["budget"] = {"maxTokens": 1}
    # 4. A credential whose Secret does not exist: the operator waits, and says so.
    nosecret = small("nosecret", repetitions=1)
    nosecret["spec"]["subjects"][1]["credentials"] = ["API_KEY"]
    for item in (broken, doc, held, nosecret):
        kubectl.run("apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(item))

    # While the slow arm runs: the Experiment and its Attempt are Reconciling.
    def slow_pod_running() -> Any:
        for pod in get(kubectl, "pods", namespace)["items"]:
            labels = pod["metadata"]["labels"]
            if (
                labels.get("eval.maka.dev/experiment") == "obs"
                and labels.get("eval.maka.dev/subject") == "slow"
                and pod["status"].get("phase") == "Running"
            ):
                return pod
        return None

    pod = wait_until(slow_pod_running, timeout=120, what="the slow arm's Pod running")
    first = pod["metadata"]["name"]
    running_attempt = get(kubectl, "attempt", namespace, first)
    assert kstatus_of(running_attempt) == ("Reconciling", "Running")
    assert running_attempt["status"]["phase"] == "Running"
    assert kstatus_of(get(kubectl, "experiment", namespace, "obs")) == ("Reconciling", "Running")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": first, "namespace": namespace},
    }
    kubectl.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{first}/eviction",
        "-f",
        "-",
        input=json.dumps(eviction),
    )
    # Between the eviction and the retry's result the cell is Retrying.
    slow_cell = running_attempt["spec"]["cellName"]

    def retrying() -> Any:
        cell = get(kubectl, "cell", namespace, slow_cell)
        return cell if condition(cell, "Reconciling") else None

    cell = wait_until(retrying, timeout=60, what="the slow cell's status")
    assert kstatus_of(cell) == ("Reconciling", "Retrying"), cell["status"]

    exp = wait_for_phase(kubectl, namespace, "obs", ("Complete",), op, timeout=240)
    assert kstatus_of(exp) == ("Ready", "Complete")
    wait_for_phase(kubectl, namespace, "held", ("BudgetExhausted",), op, timeout=240)
    wait_for_phase(kubectl, namespace, "broken", ("Failed",), op, timeout=60)

    # -- conditions on the real objects ----------------------------------------------
    held_exp = get(kubectl, "experiment", namespace, "held")
    assert kstatus_of(held_exp) == ("Stalled", "BudgetExhausted")
    assert "budget" in condition(held_exp, "Stalled")["message"]
    broken_exp = get(kubectl, "experiment", namespace, "broken")
    assert kstatus_of(broken_exp) == ("Stalled", "InvalidSpec")
    assert "spec.subjects[2].id" in condition(broken_exp, "Stalled")["message"]
    waiting = get(kubectl, "experiment", namespace, "nosecret")
    assert kstatus_of(waiting) == ("Reconciling", "PrerequisitesMissing")
    assert "maka-eval-credentials" in condition(waiting, "Reconciling")["message"]

    cells = {
        c["metadata"]["name"]: c
        for c in get(kubectl, "cells", namespace)["items"]
        if c["metadata"]["labels"]["eval.maka.dev/experiment"] == "obs"
    }
    assert len(cells) == 2
    for cell in cells.values():
        assert kstatus_of(cell) == ("Ready", "ResultSelected"), cell["status"]
    assert cells[slow_cell]["status"]["attempts"] == 2
    assert cells[slow_cell]["status"]["selectedAttempt"] == 2

    attempts = {
        a["metadata"]["name"]: a
        for a in get(kubectl, "attempts", namespace)["items"]
        if a["metadata"]["labels"]["eval.maka.dev/experiment"] == "obs"
    }
    assert len(attempts) == 3
    evicted = attempts[first]
    assert evicted["status"]["result"]["status"] == "infra_failed"
    assert kstatus_of(evicted) == ("Stalled", "InfraFailed")
    for name, attempt in attempts.items():
        if name != first:
            expected = {"completed": "Completed", "subject_failed": "SubjectFailed"}
            reason = expected[attempt["status"]["result"]["status"]]
            assert kstatus_of(attempt) == ("Ready", reason)
    retry = next(a for a in attempts.values() if a["spec"]["trigger"] == "retry")
    # The held experiment's one cell that never ran has no attempt and no status; the
    # other is done.
    held_cells = [
        c
        for c in get(kubectl, "cells", namespace)["items"]
        if c["metadata"]["labels"]["eval.maka.dev/experiment"] == "held"
    ]
    assert sorted(bool(c.get("status")) for c in held_cells) == [False, True]

    # -- Events (sent in the background: wait for the last ones) ---------------------
    expected_events = [
        ("Experiment", "broken", EventReason.INVALID_SPEC),
        ("Experiment", "nosecret", EventReason.PREREQUISITES_MISSING),
        ("Experiment", "obs", EventReason.STARTED),
        ("Experiment", "obs", EventReason.COMPLETED),
        ("Experiment", "held", EventReason.BUDGET_EXHAUSTED),
        ("Experiment", "held", EventReason.STOPPED_BY_BUDGET),
        ("Attempt", first, EventReason.STARTED),
        ("Attempt", first, EventReason.INFRA_FAILED),
        ("Attempt", retry["metadata"]["name"], EventReason.STARTED),
        ("Cell", slow_cell, EventReason.RETRIED),
        ("Cell", slow_cell, EventReason.RESULT_SELECTED),
    ]

    def all_events() -> Any:
        events = events_of(kubectl, namespace)
        missing = [e for e in expected_events if not has_event(events, e[0], e[1], e[2].value)]
        return events if not missing else None

    try:
        events = wait_until(all_events, timeout=30, what="the Events")
    except AssertionError:
        seen = events_of(kubectl, namespace)
        missing = [e for e in expected_events if not has_event(seen, e[0], e[1], e[2].value)]
        raise AssertionError(f"Events missing: {missing}") from None
    by_reason = {e["reason"]: e for e in events}
    assert by_reason["InfraFailed"]["type"] == "Warning"
    assert "gone" in by_reason["InfraFailed"]["message"]
    assert by_reason["Retried"]["message"].startswith("attempt 2 started; attempt 1 ended")
    assert by_reason["InvalidSpec"]["type"] == "Warning"
    # One Event per change: the Experiment started once and completed once.
    obs_events = [e["reason"] for e in events if e["involvedObject"]["name"] == "obs"]
    assert obs_events.count("Started") == 1 and obs_events.count("Completed") == 1, obs_events
    # `kubectl describe` finds them by the object.
    described = kubectl.run("describe", "attempt", first, f"--namespace={namespace}").stdout
    assert "InfraFailed" in described and "maka-eval-operator" in described

    # -- metrics: the figures moved by what happened ---------------------------------
    after = scrape(op.port)
    ended = value(after, "maka_eval_attempts_total")
    obs_and_held = len(attempts) + 1  # obs: 3 attempts; held: 1
    assert ended == obs_and_held, after
    assert value(after, "maka_eval_attempts_total", status="infra_failed") == 1
    assert (
        value(
            after, "maka_eval_attempts_total", status="infra_failed", reason=EndCause.POD_GONE.value
        )
        == 1
    )
    assert value(after, "maka_eval_infra_retries_total") == 1
    assert value(after, "maka_eval_attempts_started_total", trigger="retry") == 1
    assert value(after, "maka_eval_attempts_started_total", trigger="scheduled") == 3
    assert value(after, "maka_eval_cells", experiment="obs", phase="Done") == 2
    assert value(after, "maka_eval_cells", experiment="obs", phase="Pending") == 0
    assert value(after, "maka_eval_cells", experiment="held", phase="Done") == 1
    assert value(after, "maka_eval_cells", experiment="held", phase="Pending") == 1
    assert value(after, "maka_eval_experiments", phase="Complete") == 1
    assert value(after, "maka_eval_experiments", phase="BudgetExhausted") == 1
    assert value(after, "maka_eval_experiments", phase="Failed") == 1
    assert value(after, "maka_eval_experiments", phase="Pending") == 1
    assert value(after, "maka_eval_reconcile_seconds_count") > value(
        before, "maka_eval_reconcile_seconds_count"
    )
    assert value(after, "maka_eval_reconcile_passes_total") > 0
    assert value(after, "maka_eval_reconcile_errors_total") == 0
    assert value(after, "maka_eval_api_writes_total", verb="POST") > value(
        before, "maka_eval_api_writes_total", verb="POST"
    )
    # The missing Secret was looked for: a 404 answer, counted.
    assert value(after, "maka_eval_api_errors_total", verb="GET", code="404") >= 1
    assert value(before, "maka_eval_api_errors_total") == 0
    assert value(after, "maka_eval_events_total", type="Warning", reason="InfraFailed") == 1
    assert value(after, "maka_eval_events_dropped_total") == 0

    # -- JSON logs: every line the operator wrote is one JSON object -----------------
    lines = [line for line in op.log.read_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        record = json.loads(line)
        assert {"message", "severity", "timestamp"} <= set(record), line
    assert any("maka-eval operator started" in json.loads(line)["message"] for line in lines)


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


# -- the gateway's counters --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, authorization: str | None) -> bytes:
    lines = [f"GET {url} HTTP/1.1", "Host: x"]
    if authorization is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_the_gateway_counts_requests_by_decision_and_rule(tmp_path: Path) -> None:
    upstream = Upstream().start()
    metrics_port = _free_port()
    gateway = GatewayProcess(
        write_key(tmp_path / "key"), extra=("--metrics-port", str(metrics_port))
    ).start()
    try:
        auth = auth_header(valid_credential())
        base = f"http://127.0.0.1:{upstream.port}"
        assert send(gateway.port, _get(f"{base}/one", auth)).status == 200
        assert send(gateway.port, _get(f"{base}/two", auth)).status == 200
        assert send(gateway.port, _get(f"{base}/three", None)).status == 407
        # The terminal-bench preset's blocklist: a host, then a path on an allowed host.
        assert send(gateway.port, _get("http://tbench.ai/x", auth)).status == 403
        blocked_path = f"{base}/mirror/terminal-bench/tasks"
        assert send(gateway.port, _get(blocked_path, auth)).status == 403
        assert send(gateway.port, _get("http://169.254.169.254/latest/", auth)).status == 403
        assert send(gateway.port, _get("http://metadata.google.internal/", auth)).status == 403
        gateway.wait_for(lambda e: "metadata.google.internal" in str(e.get("host")))
        wait_until(
            lambda: sum(1 for e in gateway.audit if e.get("decision") == "end") >= 2,
            timeout=10,
            what="the two allowed requests to end",
        )
        samples = scrape(metrics_port)
    finally:
        gateway.stop()
        upstream.stop()

    name = "maka_eval_gateway_requests_total"
    assert value(samples, name, decision="allow", check="none") == 2
    assert value(samples, name, decision="deny", check="credential") == 1
    assert value(samples, name, decision="deny", check="blocklist") == 2
    blocklist_rules = {
        dict(labels)["rule"]
        for (n, labels), v in samples.items()
        if n == name and dict(labels).get("check") == "blocklist" and v
    }
    assert len(blocklist_rules) == 2 and all(blocklist_rules), blocklist_rules
    assert any("tbench.ai" in rule for rule in blocklist_rules), blocklist_rules
    assert value(samples, name, decision="deny", check="address") == 1
    assert value(samples, name, decision="deny", check="destination") == 1
    assert value(samples, "maka_eval_gateway_bytes_total", direction="received") > 0
    assert value(samples, "maka_eval_gateway_bytes_total", direction="sent") >= 0


# -- the docs name everything a user sees -----------------------------------------------


def test_operations_doc_lists_every_reason_event_and_metric() -> None:
    text = OPERATIONS.read_text()
    for reason in Reason:
        assert f"`{reason.value}`" in text, f"docs/operations.md lacks condition reason {reason}"
    for event in EventReason:
        assert f"`{event.value}`" in text, f"docs/operations.md lacks Event reason {event}"
    for cause in EndCause:
        assert f"`{cause.value}`" in text, f"docs/operations.md lacks attempt reason {cause}"
    metrics = OperatorMetrics()
    names = {family.name for family in metrics.registry.collect()}
    assert names
    for name in names:
        shown = re.escape(name)
        assert re.search(rf"`{shown}(_total)?`", text), f"docs/operations.md lacks {name}"
    for name in ("maka_eval_gateway_requests_total", "maka_eval_gateway_bytes_total"):
        assert f"`{name}`" in text


# -- the same on an in-memory API: the paths a real run rarely takes -----------------------


def test_used_up_retries_stall_the_cell_and_the_experiment_with_events_and_counts() -> None:
    """Every Pod's image never pulls: each attempt ends infra_failed at the deadline, a
    retry takes its place, and after the last one the Cell and the Experiment are
    Stalled. Each change is one Event, counted; a quiet pass records nothing more."""
    cluster = FakeCluster()
    store = Store()
    clock = [NOW]
    controller = Controller(cluster, store, clock=lambda: clock[0])  # type: ignore[arg-type]
    body = experiment_body(deadline=60)
    body["spec"]["execution"]["maxInfraRetries"] = 1
    cluster.objects["Experiment"] = {"hello": body}
    store.put("Experiment", body)
    key = ("ns", "hello")

    def pull_fails() -> None:
        for obj in cluster.objects["Pod"].values():
            obj["metadata"]["creationTimestamp"] = clock[0].strftime("%Y-%m-%dT%H:%M:%SZ")
            obj["status"] = {
                "phase": "Pending",
                "containerStatuses": [
                    {"name": "subject", "state": {"waiting": {"reason": "ErrImagePull"}}}
                ],
            }

    controller.reconcile(key)
    for _ in range(2):  # the first attempts, then the retries, miss the deadline
        pull_fails()
        sync(cluster, store)
        controller.reconcile(key)
        clock[0] += timedelta(seconds=61)
        sync(cluster, store)
        controller.reconcile(key)
        sync(cluster, store)
        store.put("Experiment", cluster.objects["Experiment"]["hello"])
    controller.reconcile(key)

    experiment = cluster.objects["Experiment"]["hello"]
    experiment["metadata"]["generation"] = 1
    assert experiment["status"]["phase"] == "Complete"
    assert kstatus_of(experiment) == ("Stalled", "CellsFailed")
    for cell in cluster.objects["Cell"].values():
        cell["metadata"]["generation"] = 1
        assert kstatus_of(cell) == ("Stalled", "RetriesExhausted"), cell["status"]
        assert "kubectl annotate cell" in condition(cell, "Stalled")["message"]
    for attempt in cluster.objects["Attempt"].values():
        attempt["metadata"]["generation"] = 1
        assert kstatus_of(attempt) == ("Stalled", "InfraFailed")

    events = cluster.objects["Event"].values()
    reasons = sorted(e["reason"] for e in events)
    assert reasons.count("InfraFailed") == 4 and reasons.count("Started") == 5, reasons
    assert reasons.count("Retried") == 2 and reasons.count("RetriesExhausted") == 2, reasons
    assert reasons.count("CompletedWithFailures") == 1, reasons
    exhausted = [e for e in events if e["reason"] == "RetriesExhausted"]
    assert {e["involvedObject"]["kind"] for e in exhausted} == {"Cell"}
    assert all(e["type"] == "Warning" for e in exhausted)

    samples = _registry_samples(controller.metrics)
    assert value(samples, "maka_eval_attempts_total", reason="image-pull") == 4
    assert value(samples, "maka_eval_infra_retries_total") == 2
    assert value(samples, "maka_eval_cells", experiment="hello", phase="Failed") == 2
    assert value(samples, "maka_eval_experiments", phase="Complete") == 1
    assert value(samples, "maka_eval_events_total", type="Warning", reason="InfraFailed") == 4

    # Nothing changed: nothing written, no Event.
    sync(cluster, store)
    store.put("Experiment", cluster.objects["Experiment"]["hello"])
    before = len(cluster.writes)
    controller.reconcile(key)
    assert cluster.writes[before:] == []

    # The experiment is deleted: its series go.
    store.remove("Experiment", cluster.objects["Experiment"]["hello"])
    controller.reconcile(key)
    samples = _registry_samples(controller.metrics)
    assert value(samples, "maka_eval_cells", experiment="hello") == 0
    assert value(samples, "maka_eval_experiments", phase="Complete") == 0


def _registry_samples(metrics: OperatorMetrics) -> Samples:
    samples: Samples = {}
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples
