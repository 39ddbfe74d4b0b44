"""The whole operator (kopf, in this process) against an API server that misbehaves.

kmock's `KubernetesEmulator` plays the API server: objects in memory, served over HTTP
to both kopf's watches and the operator's own `Cluster`. On top of it, `FaultyKubernetes`
adds what the operator relies on and kmock leaves out, and the faults a real server has:

- metadata a real server fills in (uid, resourceVersion, creationTimestamp, generation,
  generateName), without which the controller cannot name an Attempt's owner;
- refusals *before* the write (429 with Retry-After, 500, 503: nothing is stored);
- a watch that cannot miss a change made while it starts (kmock's can: `_serve_watch`);
- watch streams that end (EOF, the way a server ends a watch at its timeout), end with a
  410 Gone ERROR event (kmock never sends one), or lose their connection (reset); new
  LIST and WATCH requests can be held back while "the server is away".

kmock's own reactions inject the other kind of fault: `kmock[CREATE, resource][:1] << 409`
answers after the emulator has already stored the object, which is exactly a create
whose name is taken, or a write whose answer was lost (500 after the write).

Each test runs one small Experiment (one subject, one repetition) to the end, marks the
Pods finished the way a kubelet would, and checks the end state exactly: every Cell,
Attempt, NetworkPolicy and Pod created once (counted per object name on the operator's
own requests), each result written, the Experiment Complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
import pytest
import yaml
from kmock import KubernetesEmulator, KubernetesError, Request, action, resource, subresource
from kubernetes import client as k8s_client
from kubernetes.config import kube_config

from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.expand import expand
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.k8s import names
from maka_eval.k8s.controller import validate
from maka_eval.k8s.crds import VERSION
from maka_eval.k8s.operator import build_registry
from maka_eval.k8s.render import SUBJECT_CONTAINER
from maka_eval.spec.experiment import API_GROUP
from tests.k8s.conftest import REPO

EXAMPLE = REPO / "examples" / "hello" / "experiment.k8s.yaml"
NAMESPACE = "faults"
EXPERIMENT = "hello"
OPERATOR_AGENT = "OpenAPI-Generator/"
"""The kubernetes client's User-Agent: the operator's own reads and writes (not kopf's)."""

CUSTOM = {"Experiment": "experiments", "Cell": "cells", "Attempt": "attempts"}
CELLS = resource(API_GROUP, VERSION, "cells")
ATTEMPTS = resource(API_GROUP, VERSION, "attempts")
PODS = resource("", "v1", "pods")

# -- the API server --------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One request as the server answered it."""

    at: float
    method: str
    plural: str | None
    name: str | None
    subresource: str | None
    status: int
    agent: str


@dataclass
class Refusal:
    """Answer the next `times` matching requests with `status`, storing nothing."""

    method: str
    plural: str
    status: int
    times: int = 1
    name: str | None = None
    subresource: str | None = None
    retry_after: int | None = None
    refused: list[str] = field(default_factory=list)

    def matches(self, method: str, plural: str | None, name: str | None, sub: str | None) -> bool:
        return (
            self.times > 0
            and method == self.method
            and plural == self.plural
            and sub == self.subresource
            and (self.name is None or name == self.name)
        )


def _name_of(request: Request) -> str | None:
    if request.action == action.CREATE and isinstance(request.data, dict):
        return (request.data.get("metadata") or {}).get("name")
    return request.name


class FaultyKubernetes(KubernetesEmulator):
    """kmock's emulator plus server-filled metadata, refusals and droppable watches."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.calls: list[Call] = []
        self.refusals: list[Refusal] = []
        self.watches: Counter[str] = Counter()
        self.live_watches = 0
        self._versions = itertools.count(1)
        self._drop = asyncio.Event()
        self._drop_how = "eof"
        self._open = asyncio.Event()
        self._open.set()

    # -- faults ------------------------------------------------------------------------
    def refuse(self, method: str, plural: str, status: int, **kwargs: Any) -> Refusal:
        refusal = Refusal(method, plural, status, **kwargs)
        self.refusals.append(refusal)
        return refusal

    def drop_watches(self, how: str, *, hold: bool = False) -> int:
        """End every open watch stream (`eof`, `gone` or `reset`); with `hold`, new
        LISTs and WATCHes wait until `release()`. Returns how many streams were open."""
        assert how in ("eof", "gone", "reset")
        if hold:
            self._open.clear()
        dropped = self.live_watches
        self._drop_how = how
        self._drop.set()
        self._drop = asyncio.Event()
        return dropped

    def release(self) -> None:
        self._open.set()

    # -- serving -----------------------------------------------------------------------
    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        method = str(request.method.value).upper()
        plural = request.resource.plural if request.resource is not None else None
        agent = request.headers.get("User-Agent", "")
        if request.action == action.WATCH:
            self.watches[plural or ""] += 1
            return await super()._handle(request)
        if request.resource is not None:
            self._fill_metadata(request)
        name = _name_of(request)

        def log(status: int) -> None:
            self.calls.append(
                Call(time.monotonic(), method, plural, name, request.subresource, status, agent)
            )

        for refusal in self.refusals:
            if refusal.matches(method, plural, name, request.subresource):
                refusal.times -= 1
                refusal.refused.append(name or "")
                log(refusal.status)
                headers = {}
                if refusal.retry_after is not None:
                    headers["Retry-After"] = str(refusal.retry_after)
                return aiohttp.web.json_response(
                    {
                        "apiVersion": "v1",
                        "kind": "Status",
                        "status": "Failure",
                        "code": refusal.status,
                        "reason": "TooManyRequests" if refusal.status == 429 else "InternalError",
                        "message": "injected by the test",
                    },
                    status=refusal.status,
                    headers=headers,
                )
        try:
            response = await super()._handle(request)
        except KubernetesError as exc:
            log(exc.status)
            raise
        except Exception:
            log(500)
            raise
        log(response.status)
        return response

    def _fill_metadata(self, request: Request) -> None:
        """What a real API server adds: kmock stores the request body as it came."""
        data = request.data
        if not isinstance(data, dict):
            return
        if request.action == action.CREATE:
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(next(self._versions))
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["generation"] = 1
        elif request.action == action.UPDATE:
            data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))

    async def _serve_list(self, request: Request) -> Any:
        await self._open.wait()
        return await super()._serve_list(request)

    async def _serve_watch(self, request: Request) -> AsyncIterator[Any]:
        """kmock's watch, made gap-free and droppable.

        kmock lists the objects first and subscribes to its event bus only after it has
        sent them, so a change made in between is lost (a real server continues from
        the list's resourceVersion). Here the subscription and the listing happen
        together, under the lock every write holds while it publishes its event."""
        await self._open.wait()
        drop = self._drop
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:
            marker = await bus.mark()
            existing = [
                obj.raw
                for (res, namespace, name), obj in self.objects.items()
                if res == request.resource
                and not obj.deleted
                and request.namespace in (None, namespace)
                and request.name in (None, name)
            ]
        events = aiter(bus.stream(since=marker))
        stop = asyncio.ensure_future(drop.wait())
        step: asyncio.Future[Any] | None = None
        self.live_watches += 1
        try:
            yield b""  # the headers: the stream is open
            for raw in existing:
                yield {"type": "ADDED", "object": raw}
            while True:
                step = asyncio.ensure_future(anext(events))
                await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
                if step.done():
                    event = step.result()
                    meta = (event.get("object") or {}).get("metadata") or {}
                    if request.namespace in (None, meta.get("namespace")) and request.name in (
                        None,
                        meta.get("name"),
                    ):
                        yield event
                    continue
                if self._drop_how == "gone":
                    yield {
                        "type": "ERROR",
                        "object": {
                            "apiVersion": "v1",
                            "kind": "Status",
                            "status": "Failure",
                            "code": 410,
                            "reason": "Expired",
                            "message": "too old resource version",
                        },
                    }
                elif self._drop_how == "reset":
                    raw_request = request._raw_request  # aiohttp's: cut its connection
                    if raw_request is not None and raw_request.transport is not None:
                        raw_request.transport.abort()
                return
        finally:
            self.live_watches -= 1
            stop.cancel()
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
            await bus.unmark(marker)

    # -- what the tests read -----------------------------------------------------------
    def stored(self, plural: str) -> dict[str, dict[str, Any]]:
        """The live objects of one resource in the test namespace, by name."""
        found = {}
        for (res, namespace, name), obj in self.objects.items():
            if res.plural == plural and namespace == NAMESPACE and not obj.deleted:
                found[name] = obj.raw
        return found

    def creations(self, plural: str) -> Counter[str]:
        """How many times each object of a resource was created (deleted and created
        again counts twice): a duplicate create would show here."""
        counts: Counter[str] = Counter()
        for (res, namespace, name), obj in self.objects.items():
            if res.plural == plural and namespace == NAMESPACE:
                history = list(obj.history)
                counts[name] = sum(
                    1
                    for i, version in enumerate(history)
                    if version is not None and (i == 0 or history[i - 1] is None)
                )
        return counts

    def operator_calls(
        self, method: str, plural: str, *, sub: str | None = None, status: int | None = None
    ) -> Counter[str]:
        """The operator's requests of one kind, per object name."""
        return Counter(
            c.name or ""
            for c in self.calls
            if c.agent.startswith(OPERATOR_AGENT)
            and c.method == method
            and c.plural == plural
            and c.subresource == sub
            and c.name is not None  # not the start-up LIST
            and (status is None or c.status == status)
        )


pytestmark = [
    pytest.mark.kmock(cls=FaultyKubernetes),
    pytest.mark.asyncio,
    # kmock's load_bundled() reads its resource list with a deprecated importlib call.
    pytest.mark.filterwarnings("ignore:read_binary is deprecated:DeprecationWarning"),
]


# -- fixtures ----------------------------------------------------------------------------


def _register(api: KubernetesEmulator) -> None:
    api.resources.load_bundled()
    for kind, plural in CUSTOM.items():
        api.resources[f"{API_GROUP}/{VERSION}/{plural}"] = {
            "kind": kind,
            "singular": kind.lower(),
            "namespaced": True,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            "shortnames": [],
            "categories": [],
            "subresources": ["status"],
        }


@pytest.fixture
def api(
    kmock: FaultyKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> FaultyKubernetes:
    """The emulator, with the CRDs discoverable and a kubeconfig pointing at it (the
    operator's client and kopf's login both read KUBECONFIG)."""
    assert isinstance(kmock, FaultyKubernetes)
    _register(kmock)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "kmock"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
                "current-context": "kmock",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # The client reads $KUBECONFIG once, when it is imported: point its default here too.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    # kopf's login loads the kubeconfig into the client's process-wide default: undo it.
    monkeypatch.setattr(k8s_client.Configuration, "_default", k8s_client.Configuration._default)
    return kmock


@contextlib.asynccontextmanager
async def operator() -> AsyncIterator[None]:
    """`maka-eval operator`'s registry run by kopf, in a thread with its own event loop
    (as a separate process would be: kopf cancels every task of its loop at exit, and
    waits 5 s for those it did not start -- here, the emulator's connections)."""
    stop = threading.Event()
    ready = threading.Event()
    failures: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    thread = threading.Thread(target=main, name="maka-eval-operator", daemon=True)
    thread.start()
    try:
        if not await asyncio.to_thread(ready.wait, 15):
            raise AssertionError(f"the operator did not start: {failures}")
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
    assert not thread.is_alive(), "the operator did not stop"
    assert not failures, failures


# -- the experiment and the "kubelet" ----------------------------------------------------


def experiment_document(tasks: Iterable[str]) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": EXPERIMENT, "namespace": NAMESPACE}
    spec = doc["spec"]
    spec["tasks"] = [{"id": task} for task in tasks]
    spec["subjects"] = [s for s in spec["subjects"] if s["id"] == "oracle"]
    spec["repetitions"] = 1
    return doc


async def create_experiment(api: FaultyKubernetes, tasks: Iterable[str]) -> list[str]:
    """POST the Experiment (as kubectl would); the names of its cells, which depend on
    the uid the server gave it."""
    doc = experiment_document(tasks)
    path = f"/apis/{API_GROUP}/{VERSION}/namespaces/{NAMESPACE}/experiments"
    async with api.post(path, json=doc) as response:
        assert response.status == 200, await response.text()
        created = await response.json()
    uid = created["metadata"]["uid"]
    return [
        names.cell_name(EXPERIMENT, uid, c.task_id, c.repetition, c.subject_id)
        for c in expand(validate(created)).cells
    ]


def kernel_json() -> str:
    return ResultKernel(
        status=AttemptStatus.COMPLETED,
        score=1.0,
        usage=None,
        cost_usd=None,
        duration_sec=1.0,
        artifacts=(),
        status_source=StatusSource.VERIFIER,
    ).to_json()


async def finish_pod(api: FaultyKubernetes, name: str) -> None:
    """What the kubelet reports when the relay has written its kernel and exited."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "status": {
            "phase": "Succeeded",
            "startTime": now,
            "containerStatuses": [
                {
                    "name": SUBJECT_CONTAINER,
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "message": kernel_json(),
                            "finishedAt": now,
                        }
                    },
                }
            ],
        }
    }
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
    async with api.patch(path, json=status) as response:
        assert response.status == 200, await response.text()


async def until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def result_of(api: FaultyKubernetes, attempt: str) -> dict[str, Any] | None:
    found = api.stored("attempts").get(attempt) or {}
    result: dict[str, Any] | None = (found.get("status") or {}).get("result")
    return result


def experiment_status(api: FaultyKubernetes) -> dict[str, Any]:
    status: dict[str, Any] = api.stored("experiments")[EXPERIMENT].get("status") or {}
    return status


async def run_to_the_end(api: FaultyKubernetes, cells: list[str]) -> None:
    """Wait for every attempt's Pod, finish them all, wait for the Experiment to end."""
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    await until(lambda: set(attempts) <= set(api.stored("pods")), "a Pod per cell")
    for attempt in attempts:
        await finish_pod(api, attempt)
    await until(
        lambda: experiment_status(api).get("phase") == "Complete", "the Experiment to complete"
    )


def assert_no_failed_pass(caplog: pytest.LogCaptureFixture) -> None:
    """The faults were absorbed where the operator says it absorbs them (Cluster's
    retries, AlreadyExists): no reconcile pass failed and had to be run again."""
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reconcile of")]
    assert failed == []


def assert_end_state(api: FaultyKubernetes, cells: list[str]) -> None:
    """The same end state whatever failed on the way: one of everything, all results."""
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    assert api.creations("cells") == Counter(cells)
    assert api.creations("attempts") == Counter(attempts)
    assert api.creations("networkpolicies") == Counter(attempts)
    assert api.creations("pods") == Counter(attempts)
    for attempt in attempts:
        result = result_of(api, attempt)
        assert result is not None, attempt
        assert (result["status"], result["score"]) == ("completed", 1.0)
    for cell in cells:
        status = dict(api.stored("cells")[cell].get("status") or {})
        # The kstatus conditions (tests/k8s/test_observability.py checks them in full).
        conditions = {c["type"]: c for c in status.pop("conditions", [])}
        assert conditions["Ready"]["status"] == "True", conditions
        assert conditions["Ready"]["reason"] == "ResultSelected", conditions
        assert status.pop("observedGeneration") == 1
        assert status == {
            "attempts": 1,
            "phase": "Done",
            "rerunTokens": [],
            "selectedAttempt": 1,
            "status": "completed",
            "score": 1.0,
        }, cell
    status = experiment_status(api)
    assert status["phase"] == "Complete"
    assert (status["cellsTotal"], status["cellsDone"], status["cellsFailed"]) == (
        len(cells),
        len(cells),
        0,
    )
    assert (status["attempts"], status["attemptsRunning"]) == (len(cells), 0)


# -- the tests ---------------------------------------------------------------------------


async def test_without_faults_each_object_is_created_once(
    api: FaultyKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    """The baseline the fault tests are compared with: one POST per object, no retries."""
    async with operator():
        cells = await create_experiment(api, ["fix-greeting", "sum-numbers"])
        await run_to_the_end(api, cells)
    assert_end_state(api, cells)
    assert_no_failed_pass(caplog)
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    assert api.operator_calls("POST", "cells") == Counter(cells)
    assert api.operator_calls("POST", "attempts") == Counter(attempts)
    assert api.operator_calls("POST", "pods") == Counter(attempts)
    # Two status writes per attempt: its launch (the Pod exists) and its result.
    assert api.operator_calls("PATCH", "attempts", sub="status") == Counter(attempts * 2)


async def test_conflict_on_create_is_taken_as_existing(
    api: FaultyKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    """409 on the first create of a Cell, an Attempt and a Pod (kmock answers after it
    stored the object: the name is taken). The operator reads the object instead of
    creating it again, and carries on with it."""
    conflict = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": "AlreadyExists",
        "code": 409,
        "message": "already exists",
    }
    api[action.CREATE, CELLS][:1] << 409 << conflict
    api[action.CREATE, ATTEMPTS][:1] << 409 << conflict
    api[action.CREATE, PODS][:1] << 409 << conflict
    async with operator():
        cells = await create_experiment(api, ["fix-greeting", "sum-numbers"])
        await run_to_the_end(api, cells)
    assert_end_state(api, cells)
    assert_no_failed_pass(caplog)
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    # One POST per name: a 409 is an answer, not a failure to retry.
    assert api.operator_calls("POST", "cells") == Counter(cells)
    assert api.operator_calls("POST", "attempts") == Counter(attempts)
    assert api.operator_calls("POST", "pods") == Counter(attempts)
    for plural in ("cells", "attempts", "pods"):
        conflicted = api.operator_calls("POST", plural, status=409)
        assert sum(conflicted.values()) == 1, plural
        # ... and the conflicted object was read back exactly once (a GET by name).
        assert api.operator_calls("GET", plural) == conflicted, plural


async def test_throttled_and_failing_writes_are_retried(
    api: FaultyKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    """429 (Retry-After: 2), 500 and 503 before anything is stored, on creates and on
    status writes: each refused write is sent again, and nothing is created twice."""
    # Created before the operator starts (it finds it by its start-up LIST), so that each
    # fault can name the object it hits.
    cells = await create_experiment(api, ["fix-greeting", "sum-numbers"])
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    throttled = api.refuse("POST", "cells", 429, name=cells[0], retry_after=2)
    failing_attempt = api.refuse("POST", "attempts", 500, name=attempts[0], times=2)
    failing_policy = api.refuse("POST", "networkpolicies", 500, name=attempts[1])
    failing_pod = api.refuse("POST", "pods", 503, name=attempts[1])
    failing_result = api.refuse("PATCH", "attempts", 500, subresource="status")
    throttled_cell_status = api.refuse("PATCH", "cells", 429, subresource="status", retry_after=0)
    failing_summary = api.refuse("PATCH", "experiments", 500, subresource="status")
    async with operator():
        await run_to_the_end(api, cells)
    assert_end_state(api, cells)
    assert_no_failed_pass(caplog)

    refusals = (
        throttled,
        failing_attempt,
        failing_policy,
        failing_pod,
        failing_result,
        throttled_cell_status,
        failing_summary,
    )
    assert all(r.times == 0 for r in refusals), "every injected fault was hit"

    def expected(names_: list[str], refusal: Refusal) -> Counter[str]:
        return Counter(names_) + Counter(refusal.refused)

    assert api.operator_calls("POST", "cells") == expected(cells, throttled)
    assert api.operator_calls("POST", "attempts") == expected(attempts, failing_attempt)
    assert api.operator_calls("POST", "networkpolicies") == expected(attempts, failing_policy)
    assert api.operator_calls("POST", "pods") == expected(attempts, failing_pod)
    assert api.operator_calls("PATCH", "attempts", sub="status") == expected(
        attempts * 2, failing_result
    )
    # Every refused write was followed by a successful one of the same object; no 409:
    # nothing the operator retried had been stored.
    for plural in ("cells", "attempts", "networkpolicies", "pods"):
        assert api.operator_calls("POST", plural, status=409) == Counter(), plural
        assert set(api.operator_calls("POST", plural, status=200)) == set(api.creations(plural))

    # Retry-After was honoured: the throttled cell's next POST came two seconds later
    # (longer than the worker's first backoff after a failed pass, which is one second).
    cell = throttled.refused[0]
    times = [
        c.at
        for c in api.calls
        if c.agent.startswith(OPERATOR_AGENT)
        and (c.method, c.plural, c.name) == ("POST", "cells", cell)
    ]
    assert len(times) == 2
    assert times[1] - times[0] >= 2.0


async def test_lost_answers_after_the_write(
    api: FaultyKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    """500 *after* the server stored the object (kmock's reactions answer after the
    emulator's write): the retried create meets 409, which the operator takes as "it
    exists" and reads back; the retried status write simply writes the same result."""
    api[action.CREATE, CELLS][:1] << 500
    api[action.CREATE, ATTEMPTS][:1] << 500
    api[action.CREATE, PODS][:1] << 500
    api[action.UPDATE, ATTEMPTS, subresource("status")][:1] << 500
    async with operator():
        cells = await create_experiment(api, ["fix-greeting", "sum-numbers"])
        await run_to_the_end(api, cells)
    assert_end_state(api, cells)
    assert_no_failed_pass(caplog)
    for plural in ("cells", "attempts", "pods"):
        failed = api.operator_calls("POST", plural, status=500)
        assert sum(failed.values()) == 1, plural
        # The same name again, answered 409, then read back once.
        assert api.operator_calls("POST", plural, status=409) == failed, plural
        assert api.operator_calls("GET", plural) == failed, plural
    lost = api.operator_calls("PATCH", "attempts", sub="status", status=500)
    assert sum(lost.values()) == 1
    attempts = [names.attempt_name(cell, 1) for cell in cells]
    assert api.operator_calls("PATCH", "attempts", sub="status") == Counter(attempts * 2) + lost


@pytest.mark.parametrize("how", ["eof", "gone", "reset"])
async def test_dropped_watches_are_resumed(
    api: FaultyKubernetes, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every watch stream is dropped mid-run. A Pod that finishes while the operator
    cannot watch, and one that finishes after it watches again, both get their result;
    one that finished before the drop is not written twice."""
    async with operator():
        cells = await create_experiment(api, ["fix-greeting", "sum-numbers", "sort-names"])
        before, during, after = (names.attempt_name(cell, 1) for cell in cells)
        await until(lambda: {before, during, after} <= set(api.stored("pods")), "the Pods")

        await finish_pod(api, before)
        await until(lambda: result_of(api, before), "the result of the first Pod")

        watches = Counter(api.watches)
        dropped = api.drop_watches(how, hold=True)
        # Experiments, Cells, Attempts and Pods at least (kopf may watch more).
        assert dropped >= 4
        await until(lambda: api.live_watches == 0, "the watch streams to end")
        await finish_pod(api, during)
        await asyncio.sleep(1.0)
        assert result_of(api, during) is None, "the operator saw a Pod while not watching"

        api.release()
        await until(lambda: result_of(api, during), "the result of the Pod that ended unseen")
        for plural in ("experiments", "cells", "attempts", "pods"):
            await until(lambda p=plural: api.watches[p] > watches[p], f"a new watch of {plural}")

        await finish_pod(api, after)
        await until(lambda: result_of(api, after), "the result of the Pod after the drop")
        await until(
            lambda: experiment_status(api).get("phase") == "Complete",
            "the Experiment to complete",
        )
    assert_end_state(api, cells)
    assert_no_failed_pass(caplog)
    attempts = [before, during, after]
    # Each launch and each result written once: replayed events after the re-watch
    # wrote nothing again.
    assert api.operator_calls("PATCH", "attempts", sub="status") == Counter(attempts * 2)
    assert api.operator_calls("POST", "cells") == Counter(cells)
    assert api.operator_calls("POST", "attempts") == Counter(attempts)
