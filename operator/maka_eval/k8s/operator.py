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
import random
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
from maka_eval.k8s.events import EventRecorder
from maka_eval.k8s.metrics import OperatorMetrics
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
class Worker:
    """Runs reconcile passes, one experiment at a time, coalescing bursts of events."""

    controller: Controller
    pending: set[Key] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failures: dict[Key, int] = field(default_factory=dict)

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
                    self.controller.metrics.pass_errors.inc()
                    self.enqueue_later(key, delay)
                    continue
                self.failures.pop(key, None)
                if due is not None:
                    self.enqueue_later(key, due)
                self.controller.metrics.passes.inc()
                self.controller.metrics.pass_seconds.observe(time.monotonic() - started)


def build_registry(
    *,
    namespaces: Iterable[str] = (),
    metrics_port: int | None = None,
    egress: GatewaySettings | None = None,
    relay_digest: str | None = None,
    standby: bool = False,
) -> kopf.OperatorRegistry:
    """The operator's handlers in a registry of their own (tests run it in-process too).

    `standby`: one of several peered replicas. kopf delivers watch events only to the
    active one, so such a replica LISTs and reconciles nothing at start-up: it does so on
    its first event, when it has become the active one (a view LISTed hours earlier,
    while it stood by, would be stale)."""
    registry = kopf.OperatorRegistry()
    store = Store()
    state: dict[str, Any] = {}
    watched = tuple(namespaces)
    activation = asyncio.Lock()

    async def seed(cluster: Cluster) -> None:
        """LIST what the operator watches into the store (before any pass decides)."""
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

    def worker() -> Worker | None:
        return state.get("worker")

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # Events are the controller's (k8s/events.py)
        settings.watching.server_timeout = 600
        settings.networking.request_timeout = 90
        cluster = Cluster(api_client())
        state["cluster"] = cluster
        if not standby:
            await seed(cluster)
        metrics = OperatorMetrics(cluster.counts)
        events = EventRecorder(cluster, metrics)
        events.start()
        state["events"] = events
        if metrics_port is not None:
            # After the start-up LIST: /metrics answering is the Pod's readiness.
            state["metrics_server"] = metrics.serve(metrics_port)
        controller = Controller(
            cluster,
            store,
            egress=egress,
            relay_digest=relay_digest,
            metrics=metrics,
            events=events,
        )
        run = Worker(controller)
        state["worker"] = run
        state["task"] = asyncio.create_task(run.run())
        if standby:
            log.info("maka-eval operator started as a peer: it acts once it is the active one")
            return
        state["active"] = True
        for key in store.experiment_keys():
            run.enqueue(key)
        log.info("maka-eval operator started: %d experiment(s) known", len(store.experiment_keys()))

    async def activate() -> None:
        """A peer's first event: it is the active replica now; see `standby`."""
        async with activation:
            if state.get("active") or "worker" not in state:
                return
            await seed(state["cluster"])
            state["active"] = True
            for key in store.experiment_keys():
                state["worker"].enqueue(key)
            log.info(
                "maka-eval operator active: %d experiment(s) known", len(store.experiment_keys())
            )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        task = state.get("task")
        if task is not None:
            task.cancel()
        events = state.get("events")
        if events is not None:
            await asyncio.to_thread(events.stop)
        server = state.get("metrics_server")
        if server is not None:
            await asyncio.to_thread(server.shutdown)
            server.server_close()

    async def observe(kind: str, event: kopf.RawEvent) -> None:
        if not state.get("active"):
            await activate()
        obj = event["object"]
        obj.setdefault("kind", kind)
        key = store.remove(kind, obj) if event.get("type") == "DELETED" else store.put(kind, obj)
        run = worker()
        if key is not None and run is not None:
            run.enqueue(key)

    @kopf.on.event(API_GROUP, VERSION, "experiments", registry=registry)
    async def experiment_event(event: kopf.RawEvent, **_: Any) -> None:
        await observe("Experiment", event)

    @kopf.on.event(
        API_GROUP,
        VERSION,
        "cells",
        labels={names.LABEL_EXPERIMENT: kopf.PRESENT},
        registry=registry,
    )
    async def cell_event(event: kopf.RawEvent, **_: Any) -> None:
        await observe("Cell", event)

    @kopf.on.event(
        API_GROUP,
        VERSION,
        "attempts",
        labels={names.LABEL_EXPERIMENT: kopf.PRESENT},
        registry=registry,
    )
    async def attempt_event(event: kopf.RawEvent, **_: Any) -> None:
        await observe("Attempt", event)

    @kopf.on.event("pods", labels={names.LABEL_MANAGED_BY: names.MANAGED_BY}, registry=registry)
    async def pod_event(event: kopf.RawEvent, **_: Any) -> None:
        await observe("Pod", event)

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
    relay_digest: str | None = None,
) -> None:
    """`maka-eval operator`: run until interrupted; `relay_digest` pins the relay bundle
    every attempt Pod must carry (k8s/relay_bundle.py)."""
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
    registry = build_registry(
        namespaces=watched,
        metrics_port=metrics_port,
        egress=egress,
        relay_digest=relay_digest,
        standby=peering is not None,
    )
    kopf.run(
        registry=registry,
        standalone=peering is None,
        peering_name=peering,
        priority=peering_priority() if peering else None,
        namespaces=list(watched),
        clusterwide=not watched,
    )


def peering_priority(now: float | None = None, tiebreak: int | None = None) -> int:
    """This replica's kopf peering priority: the earlier it started, the higher.

    kopf pauses every replica that sees a live peer of the same or a higher priority, so
    replicas with one shared priority would all stand still. Ordering by start time makes
    the oldest replica the active one and a newcomer (a rolling update, a rescheduled Pod)
    its standby; the random tiebreak separates replicas started in the same millisecond.
    """
    started_ms = int((time.time() if now is None else now) * 1000)
    extra = random.randrange(1000) if tiebreak is None else tiebreak
    return -(started_ms * 1000 + extra)
