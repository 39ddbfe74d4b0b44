"""The operator's Prometheus metrics (docs/operations.md lists them).

One `OperatorMetrics` per operator, with a registry of its own (no process-global
state: tests run several operators in one process). The controller reports what it
does -- an attempt started or ended, an experiment's cells by phase -- and the worker
the duration of each pass; the API call counts are read from `Cluster` when Prometheus
scrapes, so they are never behind. The metrics are always kept; `serve(port)` exposes
them on `/metrics`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from maka_eval.engine.status import Trigger
from maka_eval.k8s.resources import CellPhase, ExperimentPhase

ExperimentKey = tuple[str, str]
"""(namespace, experiment name)."""

PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _StateCollector(Collector):
    """Gauges of the experiments' last reported state, and the API call counters."""

    def __init__(
        self,
        states: Callable[[], Mapping[ExperimentKey, tuple[str, Mapping[str, int]]]],
        api_counts: Callable[[], tuple[Mapping[str, int], Mapping[tuple[str, str], int]]],
    ) -> None:
        self._states = states
        self._api_counts = api_counts

    def collect(self) -> Iterator[Metric]:
        states = self._states()
        experiments = GaugeMetricFamily(
            "maka_eval_experiments", "Experiments known to the operator, by phase", labels=["phase"]
        )
        by_phase = {phase.value: 0 for phase in ExperimentPhase}
        for phase, _ in states.values():
            by_phase[phase] = by_phase.get(phase, 0) + 1
        for phase, count in sorted(by_phase.items()):
            experiments.add_metric([phase], count)
        yield experiments

        cells = GaugeMetricFamily(
            "maka_eval_cells",
            "Cells of each experiment by phase (Pending: no attempt running, no result yet)",
            labels=["namespace", "experiment", "phase"],
        )
        for (namespace, name), (_, counts) in sorted(states.items()):
            for phase in CellPhase:
                cells.add_metric([namespace, name, phase.value], counts.get(phase.value, 0))
        yield cells

        writes, errors = self._api_counts()
        written = CounterMetricFamily(
            "maka_eval_api_writes", "Successful API write requests by verb", labels=["verb"]
        )
        for verb, count in sorted(writes.items()):
            written.add_metric([verb], count)
        yield written
        failed = CounterMetricFamily(
            "maka_eval_api_errors",
            "API requests answered with an error (code: HTTP status or 'connection'), "
            "retried ones included",
            labels=["verb", "code"],
        )
        for (verb, code), count in sorted(errors.items()):
            failed.add_metric([verb, code], count)
        yield failed


def _no_api_counts() -> tuple[Mapping[str, int], Mapping[tuple[str, str], int]]:
    return {}, {}


class OperatorMetrics:
    """The operator's metrics; every method is cheap and thread-safe."""

    def __init__(
        self,
        api_counts: Callable[
            [], tuple[Mapping[str, int], Mapping[tuple[str, str], int]]
        ] = _no_api_counts,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._states: dict[ExperimentKey, tuple[str, dict[str, int]]] = {}
        self._api_counts = api_counts
        self.registry.register(_StateCollector(self._state_copy, self._call_api_counts))
        r = self.registry
        self.passes = Counter("maka_eval_reconcile_passes", "Reconcile passes run", registry=r)
        self.pass_errors = Counter(
            "maka_eval_reconcile_errors", "Reconcile passes that failed", registry=r
        )
        self.pass_seconds = Histogram(
            "maka_eval_reconcile_seconds",
            "Duration of one reconcile pass",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        self.attempts_started = Counter(
            "maka_eval_attempts_started",
            "Attempts created, by trigger",
            ["trigger"],
            registry=r,
        )
        self.attempts_ended = Counter(
            "maka_eval_attempts",
            "Attempts ended, by result status and by what decided it",
            ["status", "reason"],
            registry=r,
        )
        self.infra_retries = Counter(
            "maka_eval_infra_retries",
            "Attempts started to replace one that failed on infrastructure",
            registry=r,
        )
        self.events = Counter(
            "maka_eval_events", "Kubernetes Events recorded", ["type", "reason"], registry=r
        )
        self.events_dropped = Counter(
            "maka_eval_events_dropped",
            "Events not recorded (refused by the API server, or the queue was full)",
            registry=r,
        )
        for trigger in Trigger:
            self.attempts_started.labels(trigger.value)

    def use_api_counts(
        self, counts: Callable[[], tuple[Mapping[str, int], Mapping[tuple[str, str], int]]]
    ) -> None:
        """Read the API call counters from here (a Cluster's `counts`)."""
        self._api_counts = counts

    def _call_api_counts(self) -> tuple[Mapping[str, int], Mapping[tuple[str, str], int]]:
        return self._api_counts()

    def _state_copy(self) -> dict[ExperimentKey, tuple[str, Mapping[str, int]]]:
        with self._lock:
            return dict(self._states)

    # -- what the controller reports ----------------------------------------------------
    def experiment_state(
        self, key: ExperimentKey, phase: ExperimentPhase, cells: Mapping[CellPhase, int]
    ) -> None:
        """An experiment's phase and its cells by phase, as of the pass just done."""
        with self._lock:
            self._states[key] = (phase.value, {p.value: n for p, n in cells.items()})

    def forget(self, key: ExperimentKey) -> None:
        """The experiment is gone: its series go too."""
        with self._lock:
            self._states.pop(key, None)

    def attempt_started(self, trigger: str) -> None:
        self.attempts_started.labels(trigger).inc()
        if trigger == Trigger.RETRY.value:
            self.infra_retries.inc()

    def attempt_ended(self, status: str, reason: str) -> None:
        self.attempts_ended.labels(status, reason).inc()

    def event(self, type_: str, reason: str) -> None:
        self.events.labels(type_, reason).inc()

    def event_dropped(self) -> None:
        self.events_dropped.inc()

    # -- exposition ---------------------------------------------------------------------
    def serve(self, port: int, address: str = "0.0.0.0") -> Any:
        """Serve /metrics on address:port from a thread of its own; the server."""
        server, _thread = start_http_server(port, addr=address, registry=self.registry)
        return server
