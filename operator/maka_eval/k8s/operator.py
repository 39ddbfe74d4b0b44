"""The operator process: kopf watches, one store, one reconcile worker.

kopf delivers watch events for Experiments, and for the Cells, Attempts and Pods that
carry maka-eval's labels; each event updates the store and wakes its experiment's
reconcile. There is no periodic LIST: the only LISTs are the one at start-up (which
seeds the store before the first pass, so a restarted operator never decides on a
partial view) and the ones kopf's watches begin with. Timers exist only for what no
event announces: an image pull past its deadline, a missing Secret looked for again.

Only `@kopf.on.event` handlers are used: kopf then stores no progress annotations and
adds no finalizers, so deleting an Experiment never waits for the operator.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from maka_eval.k8s import names
from maka_eval.k8s.cluster import Cluster
from maka_eval.k8s.controller import Controller
from maka_eval.k8s.crds import VERSION
from maka_eval.k8s.egress import GatewaySettings
from maka_eval.k8s.store import Key, Store
from maka_eval.spec.experiment import API_GROUP

log = logging.getLogger("maka_eval.operator")

ERROR_BACKOFF_SEC = (1.0, 2.0, 5.0, 10.0, 30.0)


def client_configuration() -> k8s_client.Configuration:
    """The cluster's address and credentials: the kubeconfig named by $KUBECONFIG (read
    now, not when the client library was imported) or ~/.kube/config, else in-cluster."""
    configuration = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration,
        )
    except (k8s_config.ConfigException, FileNotFoundError, TypeError):
        configuration = k8s_client.Configuration()
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    return configuration


def api_client() -> k8s_client.ApiClient:
    """A client for the operator's writes (a pool large enough for parallel creates)."""
    configuration = client_configuration()
    configuration.connection_pool_maxsize = 32
    return k8s_client.ApiClient(configuration)


def connection_info() -> kopf.ConnectionInfo:
    """kopf's watches use the same address and credentials as the operator's client."""
    c = client_configuration()
    header = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
    prefix = (c.api_key_prefix or {}).get("authorization")
    token = header.split(" ", 1)[1] if header and " " in header else header
    scheme = "Bearer" if token else None
    if prefix and not (header and " " in header):
        scheme = prefix
    return kopf.ConnectionInfo(
        server=c.host,
        ca_path=c.ssl_ca_cert,
        insecure=not c.verify_ssl,
        certificate_path=c.cert_file,
        private_key_path=c.key_file,
        scheme=scheme,
        token=token,
        username=c.username or None,
        password=c.password or None,
    )


@dataclass
class Metrics:
    """Prometheus metrics (prometheus-client), created only when a port is given."""

    port: int | None
    passes: Any = None
    pass_seconds: Any = None
    writes: Any = None
    errors: Any = None

    def start(self) -> None:
        if self.port is None:
            return
        from prometheus_client import Counter, Histogram, start_http_server

        self.passes = Counter("maka_eval_reconcile_passes_total", "Reconcile passes run")
        self.errors = Counter("maka_eval_reconcile_errors_total", "Reconcile passes that failed")
        self.pass_seconds = Histogram(
            "maka_eval_reconcile_seconds", "Duration of one reconcile pass"
        )
        self.writes = Counter("maka_eval_api_writes_total", "API write requests by verb", ["verb"])
        start_http_server(self.port)


@dataclass
class Worker:
    """Runs reconcile passes, one experiment at a time, coalescing bursts of events."""

    controller: Controller
    metrics: Metrics
    pending: set[Key] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failures: dict[Key, int] = field(default_factory=dict)
    _written: dict[str, int] = field(default_factory=dict)

    def enqueue(self, key: Key) -> None:
        self.pending.add(key)
        self.wake.set()

    def enqueue_later(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(max(0.0, delay), self.enqueue, key)

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.pending:
                key = min(self.pending)
                self.pending.discard(key)
                started = time.monotonic()
                try:
                    due = await asyncio.to_thread(self.controller.reconcile, key)
                except Exception:  # a pass failed: try again later, keep the others going
                    count = self.failures.get(key, 0)
                    self.failures[key] = count + 1
                    delay = ERROR_BACKOFF_SEC[min(count, len(ERROR_BACKOFF_SEC) - 1)]
                    log.exception("reconcile of %s/%s failed; again in %ss", *key, delay)
                    if self.metrics.errors is not None:
                        self.metrics.errors.inc()
                    self.enqueue_later(key, delay)
                    continue
                self.failures.pop(key, None)
                if due is not None:
                    self.enqueue_later(key, due)
                if self.metrics.passes is not None:
                    self.metrics.passes.inc()
                    self.metrics.pass_seconds.observe(time.monotonic() - started)
                    for verb, count in self.controller.cluster.writes.items():
                        self.metrics.writes.labels(verb).inc(count - self._written.get(verb, 0))
                        self._written[verb] = count


def build_registry(
    *,
    namespaces: Iterable[str] = (),
    metrics_port: int | None = None,
    egress: GatewaySettings | None = None,
) -> kopf.OperatorRegistry:
    """The operator's handlers in a registry of their own (tests run it in-process too)."""
    registry = kopf.OperatorRegistry()
    store = Store()
    state: dict[str, Any] = {}
    watched = tuple(namespaces)

    def worker() -> Worker | None:
        return state.get("worker")

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # Events are the controller's, one per transition
        settings.watching.server_timeout = 600
        settings.networking.request_timeout = 90
        cluster = Cluster(api_client())
        selector = names.LABEL_EXPERIMENT
        for kind in ("Experiment", "Cell", "Attempt", "Pod"):
            label = (
                ""
                if kind == "Experiment"
                else (f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}" if kind == "Pod" else selector)
            )
            for namespace in watched or (None,):
                objects = await asyncio.to_thread(cluster.list, kind, namespace, label)
                for obj in objects:
                    store.put(kind, obj)
        metrics = Metrics(metrics_port)
        metrics.start()
        run = Worker(Controller(cluster, store, egress=egress), metrics)
        state["worker"] = run
        state["task"] = asyncio.create_task(run.run())
        for key in store.experiment_keys():
            run.enqueue(key)
        log.info("maka-eval operator started: %d experiment(s) known", len(store.experiment_keys()))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        task = state.get("task")
        if task is not None:
            task.cancel()

    def observe(kind: str, event: kopf.RawEvent) -> None:
        obj = event["object"]
        obj.setdefault("kind", kind)
        key = store.remove(kind, obj) if event.get("type") == "DELETED" else store.put(kind, obj)
        run = worker()
        if key is not None and run is not None:
            run.enqueue(key)

    @kopf.on.event(API_GROUP, VERSION, "experiments", registry=registry)
    async def experiment_event(event: kopf.RawEvent, **_: Any) -> None:
        observe("Experiment", event)

    @kopf.on.event(
        API_GROUP,
        VERSION,
        "cells",
        labels={names.LABEL_EXPERIMENT: kopf.PRESENT},
        registry=registry,
    )
    async def cell_event(event: kopf.RawEvent, **_: Any) -> None:
        observe("Cell", event)

    @kopf.on.event(
        API_GROUP,
        VERSION,
        "attempts",
        labels={names.LABEL_EXPERIMENT: kopf.PRESENT},
        registry=registry,
    )
    async def attempt_event(event: kopf.RawEvent, **_: Any) -> None:
        observe("Attempt", event)

    @kopf.on.event("pods", labels={names.LABEL_MANAGED_BY: names.MANAGED_BY}, registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        observe("Pod", event)

    return registry


def run(
    *,
    namespaces: Iterable[str] = (),
    peering: str | None = None,
    log_format: str = "plain",
    metrics_port: int | None = None,
    kubeconfig: str | None = None,
    verbose: bool = False,
    egress: GatewaySettings | None = None,
) -> None:
    """`maka-eval operator`: run until interrupted."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig
    watched = tuple(namespaces)
    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.PLAIN,
    )
    if not verbose:
        # kopf logs every handled watch event at INFO: one line per Pod change.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    registry = build_registry(namespaces=watched, metrics_port=metrics_port, egress=egress)
    kopf.run(
        registry=registry,
        standalone=peering is None,
        peering_name=peering,
        namespaces=list(watched),
        clusterwide=not watched,
    )
