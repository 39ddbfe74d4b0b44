"""Kubernetes Events for the state changes a user looks for (docs/operations.md).

The controller calls `EventRecorder.record` right after the write that made the change
(an Attempt's launch or result, a Cell's selected result, an Experiment's phase), so an
Event is recorded once per change, and not again after an operator restart: the write
that would repeat it is not repeated.

An Event is informative only: it never fails or slows a reconcile pass. In the operator
they are sent by one thread of its own from a bounded queue (`start()`): at most one
Event request is in flight, so Events (about three per attempt) never crowd out the
pass's own writes; when the queue is full or the API server refuses one, it is dropped
and counted. Without `start()` each Event is sent at once, in the caller's thread (the
unit tests' way: what a pass recorded is there when it returns).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from maka_eval.k8s.metrics import OperatorMetrics
from maka_eval.spec.experiment import API_VERSION

log = logging.getLogger("maka_eval.operator")

COMPONENT = "maka-eval-operator"
"""source.component of every Event the operator records."""
QUEUE_LIMIT = 10_000
SENDERS = 1
MESSAGE_LIMIT = 1024


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """Every Event reason the operator uses, by the object it is about."""

    # Experiment
    INVALID_SPEC = "InvalidSpec"
    PREREQUISITES_MISSING = "PrerequisitesMissing"
    STARTED = "Started"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    COMPLETED = "Completed"
    COMPLETED_WITH_FAILURES = "CompletedWithFailures"
    STOPPED_BY_BUDGET = "StoppedByBudget"
    # Cell
    RETRIED = "Retried"
    RERUN = "Rerun"
    RESULT_SELECTED = "ResultSelected"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    # Attempt (STARTED and COMPLETED too)
    SUBJECT_FAILED = "SubjectFailed"
    INFRA_FAILED = "InfraFailed"
    CANCELLED = "Cancelled"


class EventSink(Protocol):
    """What sends an Event (Cluster.create)."""

    def create(self, kind: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Involved:
    """The object an Event is about."""

    kind: str
    namespace: str
    name: str
    uid: str
    api_version: str = API_VERSION

    @classmethod
    def of(cls, kind: str, obj: Mapping[str, Any]) -> Involved:
        meta = obj.get("metadata") or {}
        return cls(kind, meta.get("namespace") or "", meta.get("name") or "", meta.get("uid") or "")


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(
    involved: Involved, type_: EventType, reason: EventReason, message: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Event (what `kubectl describe` and `kubectl events` show)."""
    stamp = _stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # <= 253 characters with the 5 random ones the server appends.
        "metadata": {"generateName": f"{involved.name[:200]}.", "namespace": involved.namespace},
        "involvedObject": {
            "apiVersion": involved.api_version,
            "kind": involved.kind,
            "name": involved.name,
            "namespace": involved.namespace,
            "uid": involved.uid,
        },
        "reason": reason.value,
        "message": message[:MESSAGE_LIMIT],
        "type": type_.value,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


_STOP = object()


class EventRecorder:
    """Records Events through `sink`; see the module docstring."""

    def __init__(
        self, sink: EventSink, metrics: OperatorMetrics, *, limit: int = QUEUE_LIMIT
    ) -> None:
        self.sink = sink
        self.metrics = metrics
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=limit)
        self._threads: list[threading.Thread] = []

    def start(self, senders: int = SENDERS) -> None:
        """Send from `senders` threads of their own from now on."""
        if self._threads:
            return
        for i in range(senders):
            thread = threading.Thread(target=self._send_loop, name=f"maka-events-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued (within `timeout`), then stop the threads."""
        threads, self._threads = self._threads, []
        for _ in threads:
            try:
                self._queue.put(_STOP, timeout=timeout)
            except queue.Full:
                break
        for thread in threads:
            thread.join(timeout)

    def record(
        self,
        involved: Involved,
        type_: EventType,
        reason: EventReason,
        message: str,
        now: datetime | None = None,
    ) -> None:
        """Record one Event (never raises)."""
        if not involved.name or not involved.namespace:
            return
        body = event_body(involved, type_, reason, message, now or datetime.now(UTC))
        if not self._threads:
            self._send(body)
            return
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.metrics.event_dropped()
            log.warning("event queue full: dropped %s %s", reason.value, involved.name)

    def _send_loop(self) -> None:
        while True:
            body = self._queue.get()
            if body is _STOP:
                return
            self._send(body)

    def _send(self, body: dict[str, Any]) -> None:
        try:
            self.sink.create("Event", body["metadata"]["namespace"], body)
        except Exception as exc:  # an Event is informative only
            self.metrics.event_dropped()
            log.info("could not record event %s: %s", body["reason"], exc)
            return
        self.metrics.event(body["type"], body["reason"])
