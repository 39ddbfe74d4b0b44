"""One reconcile pass of one Experiment: observe -> decide -> act.

The pass reads what the store has observed (watch events, never a periodic LIST), asks
the engine's `decide()` what to start -- the same function the local executor calls --
and carries it out with as few writes as the objects allow. Per attempt lifecycle:
create Attempt, NetworkPolicy and Pod (3; 4 with the egress proxy, whose credential is
a Secret of the attempt), record in Attempt status that its Pod was created (1), lift
the task group's scheduling gate (1, only for groups of two or more arms), write the
result once into Attempt status (1), and the Cell's status (1). The
Experiment's status is written once per pass, when it changed, so a burst of events
costs one write.

The launch record is what tells, after a restart, an Attempt whose Pod was never
created (the operator died between the two creates: the Pod is created now) from one
whose Pod was created and is gone (deleted, evicted, its node lost: an infrastructure
failure, and a new Attempt).

Everything the pass decides is idempotent: names are deterministic (a second create is
a harmless 409), the result is written once (the API server refuses a second, different
write), and a Cell's selected attempt never changes. An operator killed at any point and
restarted reads the cluster again and carries on without duplicates or lost results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ResultKernel, infra_failure
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import Cell, Expansion, expand
from maka_eval.engine.reconcile import Decision, Policy, Request, decide
from maka_eval.engine.selection import CellState, cell_state, select_result
from maka_eval.engine.status import AttemptStatus, Trigger
from maka_eval.errors import MakaEvalError, Problem
from maka_eval.k8s import names
from maka_eval.k8s.cluster import AlreadyExists, Cluster, Rejected
from maka_eval.k8s.egress import (
    SIDECAR_STARTUP_DEADLINE_SEC,
    GatewayAccess,
    GatewaySettings,
    gateway_access,
    sidecar_not_started_reason,
    sidecar_waiting_since,
)
from maka_eval.k8s.events import EventReason, EventRecorder, EventType, Involved
from maka_eval.k8s.metrics import OperatorMetrics
from maka_eval.k8s.render import (
    ExperimentRef,
    attempt_object,
    attempt_objects,
    cell_object,
    credential_sources,
    egress_policy,
)
from maka_eval.k8s.resources import (
    CellPhase,
    ConditionWish,
    ExperimentPhase,
    KStatus,
    Reason,
    kstatus,
    merge_conditions,
)
from maka_eval.k8s.results import (
    EndCause,
    image_pull_failed,
    image_pull_waiting_since,
    parse_time,
    pod_end,
    pod_gone,
)
from maka_eval.k8s.store import ExperimentView, Key, Store
from maka_eval.spec.experiment import API_VERSION, Experiment, KubernetesExecutorConfig
from maka_eval.spec.load import experiment_from_data

log = logging.getLogger("maka_eval.operator")

PREREQUISITE_RECHECK_SEC = 15.0
"""A missing Secret is looked for again after this long (Secrets are not watched: the
operator needs no permission to list them)."""


@dataclass(frozen=True)
class FinishedAttempt:
    """An attempt with its result, as decide() and selection see it."""

    name: str
    number: int
    status: AttemptStatus
    trigger: Trigger
    request: str | None
    kernel: ResultKernel


def _now() -> datetime:
    return datetime.now(UTC)


def _launched(attempt: Mapping[str, Any]) -> bool:
    """Whether the Attempt's status records that its Pod was created."""
    return bool((attempt.get("status") or {}).get("podName"))


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def problems_text(problems: Sequence[Problem]) -> str:
    """Problems as one message: `path: what to do; ...`."""
    return "; ".join(str(p) for p in problems)


def validate(body: Mapping[str, Any]) -> Experiment:
    """The Experiment object's spec, validated exactly as `maka-eval validate` does."""
    document = {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {"name": body["metadata"]["name"]},
        "spec": body.get("spec") or {},
    }
    experiment, _ = experiment_from_data(document, f"Experiment {body['metadata']['name']}")
    if not isinstance(experiment.spec.executor.config, KubernetesExecutorConfig):
        raise MakaEvalError(
            "not for a cluster",
            [
                Problem(
                    "spec.executor.kind",
                    f"is '{experiment.spec.executor.kind}': the operator runs experiments "
                    "with executor.kind: kubernetes (set relayImage, egressImage, "
                    "benchmarkImage and taskImage in executor.config); run this one with "
                    "`maka-eval run` instead",
                )
            ],
        )
    return experiment


class Controller:
    """Reconciles experiments; `reconcile(key)` returns seconds until a timer is due."""

    def __init__(
        self,
        cluster: Cluster,
        store: Store,
        *,
        parallelism: int = 16,
        clock: Callable[[], datetime] = _now,
        egress: GatewaySettings | None = None,
        relay_digest: str | None = None,
        metrics: OperatorMetrics | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics or OperatorMetrics()
        self.events = events or EventRecorder(cluster, self.metrics)
        """Events are sent at once unless the recorder was started (the operator's is)."""
        self.egress = egress or GatewaySettings.make()
        self.relay_digest = relay_digest
        """The operator's pinned relay bundle digest (--relay-bundle-digest), or None."""
        self._gateway: GatewayAccess | None = None
        """The egress gateway's route and key, read when an experiment that uses the
        proxy passes its prerequisites."""
        self.store = store
        self.clock = clock
        self.pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="maka-write")
        self._kernels: dict[tuple[str, str], ResultKernel | None] = {}
        self._specs: dict[tuple[str, int], Experiment | MakaEvalError] = {}
        self._prerequisites_ok: set[tuple[str, int]] = set()
        self._settled: dict[Key, int] = {}

    # -- the pass ------------------------------------------------------------------------
    def reconcile(self, key: Key) -> float | None:
        view = self.store.snapshot(key)
        if view is None:
            self._settled.pop(key, None)
            self.metrics.forget(key)
            return None
        body = view.body
        assert body is not None
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        ref = ExperimentRef(meta["name"], meta["namespace"], meta["uid"])
        generation = int(meta.get("generation") or 1)

        spec_key = (meta["uid"], generation)
        parsed = self._specs.get(spec_key)
        if parsed is None:
            try:
                parsed = validate(body)
            except MakaEvalError as exc:
                parsed = exc
            self._specs[spec_key] = parsed
        if isinstance(parsed, MakaEvalError):
            message = problems_text(parsed.problems) or parsed.summary
            self._write_experiment_status(
                view,
                ref,
                generation,
                ExperimentPhase.FAILED,
                {},
                conditions=[
                    *kstatus(KStatus.STALLED, Reason.INVALID_SPEC, message),
                    ("Validated", False, "InvalidSpec", message),
                    ("Failed", True, "InvalidSpec", "the spec is not valid; no cell was created"),
                ],
            )
            self.metrics.experiment_state(key, ExperimentPhase.FAILED, {})
            return None
        experiment = parsed

        if spec_key not in self._prerequisites_ok:
            missing = self.prerequisites(ref.namespace, experiment)
            if missing:
                self._write_experiment_status(
                    view,
                    ref,
                    generation,
                    ExperimentPhase.PENDING,
                    {},
                    conditions=[
                        *kstatus(
                            KStatus.RECONCILING,
                            Reason.PREREQUISITES_MISSING,
                            f"{problems_text(missing)} (looked for again every "
                            f"{PREREQUISITE_RECHECK_SEC:g}s)",
                        ),
                        ("Validated", True, "Valid", "the spec is valid"),
                        ("PrerequisitesMet", False, "Missing", problems_text(missing)),
                    ],
                )
                self.metrics.experiment_state(key, ExperimentPhase.PENDING, {})
                return PREREQUISITE_RECHECK_SEC
            self._prerequisites_ok.add(spec_key)

        expansion = expand(experiment)
        self._ensure_cells(view, ref, expansion)
        self._resume_launches(view, ref, experiment, expansion)
        wake = self._collect_results(view, experiment)
        decision, finished, _running, budget = self._decide(view, experiment, expansion, key)
        self._launch(view, ref, experiment, decision, finished)
        self._lift_gates(view)
        self._write_cell_statuses(
            view, expansion, experiment, finished, budget_held=budget.exhausted
        )
        self._write_summary(view, ref, generation, experiment, expansion, decision, budget, key)
        return wake

    # -- prerequisites -------------------------------------------------------------------
    def prerequisites(self, namespace: str, experiment: Experiment) -> list[Problem]:
        """What must exist before anything starts: each declared credential's Secret and
        key (the images and toolchains are required by the spec's own validation)."""
        problems = []
        secrets: dict[str, dict[str, Any] | None] = {}
        subject_index = {s.id: i for i, s in enumerate(experiment.spec.subjects)}
        for subject_id, credential, secret, key in credential_sources(experiment):
            if secret not in secrets:
                secrets[secret] = self.cluster.get("Secret", namespace, secret)
            found = secrets[secret]
            where = f"spec.subjects[{subject_index[subject_id]}].credentials"
            if found is None:
                problems.append(
                    Problem(
                        where,
                        f"Secret '{secret}' (key '{key}', credential {credential} of subject "
                        f"'{subject_id}') does not exist in namespace {namespace}; create it: "
                        f"kubectl -n {namespace} create secret generic {secret} "
                        f"--from-literal={key}=...",
                    )
                )
            elif key not in (found.get("data") or {}) and key not in (
                found.get("stringData") or {}
            ):
                problems.append(
                    Problem(
                        where,
                        f"Secret '{secret}' has no key '{key}' (credential {credential} of "
                        f"subject '{subject_id}'); add it, or map the credential to another "
                        "key in spec.executor.config.credentials",
                    )
                )
        if egress_policy(experiment) is not None:
            # The gateway's key and address: without them no attempt could reach
            # anything, so none starts.
            access = gateway_access(self.egress, lambda ns, n: self.cluster.get("Secret", ns, n))
            if isinstance(access, GatewayAccess):
                self._gateway = access
            else:
                problems.extend(access)
        return problems

    # -- cells ---------------------------------------------------------------------------
    def _ensure_cells(self, view: ExperimentView, ref: ExperimentRef, expansion: Expansion) -> None:
        missing = [
            cell
            for cell in expansion.cells
            if names.cell_name(ref.name, ref.uid, cell.task_id, cell.repetition, cell.subject_id)
            not in view.cells
        ]
        if not missing:
            return

        # A first pass creates every Cell (10,000 in bench/operator_scale.py): each body is
        # made when it is sent, and the view keeps the store's compact copy of the answer,
        # so that the pass never holds them all in full.
        def create(cell: Cell) -> dict[str, Any] | None:
            obj = cell_object(ref, cell)
            created: dict[str, Any] | None
            try:
                created = self.cluster.create("Cell", ref.namespace, obj)
            except AlreadyExists:
                created = self.cluster.get("Cell", ref.namespace, obj["metadata"]["name"])
            if created is None:
                return None
            created.setdefault("kind", "Cell")
            return self.store.record("Cell", created)

        for held in self.pool.map(create, missing):
            if held is not None:
                view.cells[held["metadata"]["name"]] = held

    # -- results -------------------------------------------------------------------------
    def _kernel(self, attempt: Mapping[str, Any]) -> ResultKernel | None:
        result = (attempt.get("status") or {}).get("result")
        if not result:
            return None
        meta = attempt["metadata"]
        cache_key = (meta["name"], meta.get("resourceVersion") or "")
        if cache_key not in self._kernels:
            try:
                self._kernels[cache_key] = ResultKernel.from_dict(result)
            except ContractError as exc:
                log.warning("attempt %s has an unreadable result: %s", meta["name"], exc)
                self._kernels[cache_key] = None
        return self._kernels[cache_key]

    def _collect_results(self, view: ExperimentView, experiment: Experiment) -> float | None:
        """Write the result of every attempt whose Pod has ended (or is gone)."""
        config = experiment.spec.executor.config
        assert isinstance(config, KubernetesExecutorConfig)
        now = self.clock()
        wake: float | None = None
        ended: list[tuple[dict[str, Any], ResultKernel, datetime | None, datetime, str]] = []
        stuck: set[str] = set()  # attempts whose Pod would never end on its own: deleted
        for name, attempt in view.attempts.items():
            if (attempt.get("status") or {}).get("result"):
                continue
            pod = view.pods.get(name)
            if pod is None:
                if _launched(attempt):
                    ended.append((attempt, pod_gone(), None, now, EndCause.POD_GONE))
                continue
            end = pod_end(pod, now)
            if end is not None:
                ended.append((attempt, end.kernel, end.started_at, end.finished_at, end.cause))
                continue
            waiting = image_pull_waiting_since(pod)
            if waiting is not None:
                waited = (now - waiting).total_seconds()
                if waited >= config.image_pull_deadline_sec:
                    failure = image_pull_failed(waited)
                    ended.append((attempt, failure, None, now, EndCause.IMAGE_PULL))
                else:
                    due = config.image_pull_deadline_sec - waited
                    wake = due if wake is None else min(wake, due)
            starting = sidecar_waiting_since(pod)
            if starting is not None:
                waited = (now - starting).total_seconds()
                if waited >= SIDECAR_STARTUP_DEADLINE_SEC:
                    failure = infra_failure(sidecar_not_started_reason(waited), waited)
                    stuck.add(name)
                    ended.append((attempt, failure, None, now, EndCause.INIT_CONTAINER))
                else:
                    due = SIDECAR_STARTUP_DEADLINE_SEC - waited
                    wake = due if wake is None else min(wake, due)

        def write(
            item: tuple[dict[str, Any], ResultKernel, datetime | None, datetime, str],
        ) -> None:
            attempt, kernel, started, finished, cause = item
            if cause == EndCause.IMAGE_PULL or attempt["metadata"]["name"] in stuck:
                meta = attempt["metadata"]
                self.cluster.delete("Pod", meta["namespace"], meta["name"])
            self._record(view, attempt, kernel, started, finished, cause)

        list(self.pool.map(write, ended))
        return wake

    def _record(
        self,
        view: ExperimentView,
        attempt: Mapping[str, Any],
        kernel: ResultKernel,
        started: datetime | None,
        finished: datetime,
        cause: str,
    ) -> None:
        """Write an attempt's result into its status, once, with its conditions; then
        count it and record its Event. `cause`: an EndCause or the kernel's source."""
        name = attempt["metadata"]["name"]
        namespace = attempt["metadata"]["namespace"]
        generation = int(attempt["metadata"].get("generation") or 1)
        true, reason, event_type, message = _attempt_end(kernel)
        conditions, _ = merge_conditions(
            (attempt.get("status") or {}).get("conditions"),
            kstatus(true, reason, message),
            generation,
            _stamp(self.clock()),
        )
        status: dict[str, Any] = {
            "observedGeneration": generation,
            "phase": "Finished",
            "podName": name,
            "finishedAt": _stamp(finished),
            "result": _without_none(kernel.to_dict()),
            "conditions": conditions,
        }
        if started is not None:
            status["startedAt"] = _stamp(started)
        try:
            updated = self.cluster.patch(
                "Attempt", namespace, name, {"status": status}, status=True
            )
        except Rejected as exc:
            if exc.status not in (409, 422):
                raise
            # Written before (by an operator that stopped before it saw the answer): the
            # first write stands.
            fresh = self.cluster.get("Attempt", namespace, name)
            if fresh is None:
                return
            updated = fresh
        else:
            self.metrics.attempt_ended(kernel.status.value, cause or kernel.status_source.value)
            self.events.record(
                Involved.of("Attempt", attempt), event_type, EventReason(reason.value), message
            )
        updated.setdefault("kind", "Attempt")
        self.store.put("Attempt", updated)
        view.attempts[name] = updated

    # -- deciding ------------------------------------------------------------------------
    def _finished(self, view: ExperimentView) -> tuple[dict[str, list[FinishedAttempt]], set[str]]:
        finished: dict[str, list[FinishedAttempt]] = {}
        running: set[str] = set()
        for name, attempt in view.attempts.items():
            spec = attempt.get("spec") or {}
            kernel = self._kernel(attempt)
            if kernel is None:
                if not (attempt.get("status") or {}).get("result"):
                    running.add(spec["cellId"])
                continue
            finished.setdefault(spec["cellId"], []).append(
                FinishedAttempt(
                    name,
                    int(spec["number"]),
                    kernel.status,
                    Trigger(spec["trigger"]),
                    spec.get("request"),
                    kernel,
                )
            )
        for attempts in finished.values():
            attempts.sort(key=lambda a: a.number)
        return finished, running

    def _decide(
        self, view: ExperimentView, experiment: Experiment, expansion: Expansion, key: Key
    ) -> tuple[Decision, dict[str, list[FinishedAttempt]], set[str], BudgetState]:
        spec = experiment.spec
        finished, running = self._finished(view)
        budget = budget_state(
            spec.budget.max_cost_usd,
            spec.budget.max_tokens,
            (
                (a.kernel.usage, a.kernel.cost_usd)
                for attempts in finished.values()
                for a in attempts
            ),
        )
        requests = []
        for cell in view.cells.values():
            token = ((cell.get("metadata") or {}).get("annotations") or {}).get(
                names.RERUN_ANNOTATION
            )
            if token:
                requests.append(Request(cell["spec"]["cellId"], token[:256]))
        policy = Policy(spec.execution.max_concurrent_task_groups, spec.execution.max_infra_retries)
        answered_running = {
            (a.get("spec") or {}).get("request")
            for a in view.attempts.values()
            if (a.get("spec") or {}).get("request")
        }
        requests = [r for r in requests if r.token not in answered_running]
        decision = decide(
            expansion, finished, running, budget, policy, requests, self._settled.get(key, 0)
        )
        self._settled[key] = decision.settled
        return decision, finished, running, budget

    # -- acting --------------------------------------------------------------------------
    def _launch(
        self,
        view: ExperimentView,
        ref: ExperimentRef,
        experiment: Experiment,
        decision: Decision,
        finished: Mapping[str, Sequence[FinishedAttempt]],
    ) -> None:
        numbers: dict[str, int] = {}
        for attempt in view.attempts.values():
            spec = attempt.get("spec") or {}
            numbers[spec["cellId"]] = max(numbers.get(spec["cellId"], 0), int(spec["number"]))
        work = [
            (start.cell, start.trigger, start.request, launch.together)
            for launch in decision.launches
            for start in launch.arms
        ]

        def start(item: tuple[Cell, Trigger, str | None, bool]) -> None:
            cell, trigger, request, gated = item
            cell_name = names.cell_name(
                ref.name, ref.uid, cell.task_id, cell.repetition, cell.subject_id
            )
            cell_obj = view.cells.get(cell_name)
            if cell_obj is None:
                return
            number = numbers.get(cell.id, 0) + 1
            body = attempt_object(ref, cell, cell_obj["metadata"]["uid"], number, trigger, request)
            try:
                attempt = self.cluster.create("Attempt", ref.namespace, body)
            except AlreadyExists:
                # Created by an earlier pass whose answer was lost: carry on with it.
                existing = self.cluster.get("Attempt", ref.namespace, body["metadata"]["name"])
                if existing is None:
                    return
                attempt = existing
            else:
                self._started(cell_obj, number, trigger, request, finished.get(cell.id, ()))
            attempt.setdefault("kind", "Attempt")
            self.store.put("Attempt", attempt)
            view.attempts[attempt["metadata"]["name"]] = attempt
            if (attempt.get("status") or {}).get("result"):
                return
            self._create_pod(view, ref, experiment, cell, attempt, gated=gated)

        list(self.pool.map(start, work))

    def _started(
        self,
        cell: Mapping[str, Any],
        number: int,
        trigger: Trigger,
        request: str | None,
        before: Sequence[FinishedAttempt],
    ) -> None:
        """Count a new attempt; a retry or a rerun is an Event of its Cell."""
        self.metrics.attempt_started(trigger.value)
        involved = Involved.of("Cell", cell)
        if trigger is Trigger.RETRY:
            last = before[-1] if before else None
            why = (
                f"attempt {last.number} ended {last.status.value}"
                + (f": {last.kernel.reason}" if last.kernel.reason else "")
                if last is not None
                else "the last attempt ended without a result"
            )
            self.events.record(
                involved, EventType.WARNING, EventReason.RETRIED, f"attempt {number} started; {why}"
            )
        elif trigger is Trigger.MANUAL:
            self.events.record(
                involved,
                EventType.NORMAL,
                EventReason.RERUN,
                f"attempt {number} started for the rerun request '{request}'",
            )

    def _create_pod(
        self,
        view: ExperimentView,
        ref: ExperimentRef,
        experiment: Experiment,
        cell: Cell,
        attempt: dict[str, Any],
        *,
        gated: bool,
    ) -> None:
        """Create an attempt's NetworkPolicy, egress Secret (with the proxy) and Pod, then
        record the launch."""
        objects = attempt_objects(
            ref,
            experiment,
            cell,
            attempt,
            gated=gated,
            gateway=self._gateway,
            relay_digest=self.relay_digest,
        )
        for kind, obj in objects:
            try:
                created = self.cluster.create(kind, ref.namespace, obj)
            except Rejected as exc:
                # Refused for good (a quota, an admission policy): the attempt fails
                # as infrastructure, with the server's words, and is retried.
                failure = infra_failure(f"the API server refused the attempt's {kind}: {exc}")
                self._record(view, attempt, failure, None, self.clock(), EndCause.API_REFUSED)
                return
            except AlreadyExists:
                if kind != "Pod":
                    continue
                found = self.cluster.get("Pod", ref.namespace, obj["metadata"]["name"])
                if found is None:
                    continue
                created = found
            if kind == "Pod":
                created.setdefault("kind", "Pod")
                self.store.put("Pod", created)
                view.pods[created["metadata"]["name"]] = created
        self._mark_launched(view, attempt)

    def _mark_launched(self, view: ExperimentView, attempt: Mapping[str, Any]) -> None:
        """Record in Attempt status that its Pod exists (see the module docstring)."""
        meta = attempt["metadata"]
        spec = attempt.get("spec") or {}
        generation = int(meta.get("generation") or 1)
        message = (
            f"Pod {meta['name']} created for cell {spec.get('cellId')} (attempt "
            f"{spec.get('number')}, {spec.get('trigger')}); waiting for it to end"
        )
        conditions, _ = merge_conditions(
            (attempt.get("status") or {}).get("conditions"),
            kstatus(KStatus.RECONCILING, Reason.RUNNING, message),
            generation,
            _stamp(self.clock()),
        )
        status = {
            "observedGeneration": generation,
            "phase": "Running",
            "podName": meta["name"],
            "conditions": conditions,
        }
        try:
            updated = self.cluster.patch(
                "Attempt", meta["namespace"], meta["name"], {"status": status}, status=True
            )
        except Rejected as exc:
            if exc.status not in (409, 422):
                raise
            return  # the result was written meanwhile: the launch no longer matters
        self.events.record(
            Involved.of("Attempt", attempt), EventType.NORMAL, EventReason.STARTED, message
        )
        updated.setdefault("kind", "Attempt")
        held = self.store.record("Attempt", updated)
        view.attempts[meta["name"]] = held

    def _resume_launches(
        self, view: ExperimentView, ref: ExperimentRef, experiment: Experiment, expansion: Expansion
    ) -> None:
        """Finish launches an earlier operator began: an Attempt without a result and
        without a launch record has its Pod created now (or, if the Pod exists, its launch
        recorded). Its Pod is not gated: the other arms of its group may be running."""
        cells = {cell.id: cell for cell in expansion.cells}
        pending = [
            attempt
            for attempt in view.attempts.values()
            if not (attempt.get("status") or {}).get("result") and not _launched(attempt)
        ]
        if not pending:
            return

        def resume(attempt: dict[str, Any]) -> None:
            name = attempt["metadata"]["name"]
            if name in view.pods:
                self._mark_launched(view, attempt)
                return
            cell = cells.get((attempt.get("spec") or {}).get("cellId", ""))
            if cell is not None:
                log.info("attempt %s has no Pod yet: creating it", name)
                self._create_pod(view, ref, experiment, cell, attempt, gated=False)

        list(self.pool.map(resume, pending))

    def _lift_gates(self, view: ExperimentView) -> None:
        """Lift the group gate of Pods whose every running arm has its Pod."""
        waiting_groups: dict[str, list[dict[str, Any]]] = {}
        for pod in view.pods.values():
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            if any(g.get("name") == names.GROUP_GATE for g in gates):
                group = pod["metadata"]["labels"].get(names.LABEL_GROUP, "")
                waiting_groups.setdefault(group, []).append(pod)
        if not waiting_groups:
            return
        missing_pod_groups = set()
        for name, attempt in view.attempts.items():
            if (attempt.get("status") or {}).get("result"):
                continue
            if name not in view.pods:
                missing_pod_groups.add(attempt["metadata"]["labels"].get(names.LABEL_GROUP, ""))
        to_lift = [
            pod
            for group, pods in waiting_groups.items()
            if group not in missing_pod_groups
            for pod in pods
        ]

        def lift(pod: dict[str, Any]) -> None:
            gates = pod["spec"]["schedulingGates"]
            remaining = [g for g in gates if g.get("name") != names.GROUP_GATE]
            patch = {"spec": {"schedulingGates": remaining or None}}
            meta = pod["metadata"]
            try:
                updated = self.cluster.patch("Pod", meta["namespace"], meta["name"], patch)
            except Rejected as exc:
                if exc.status == 404:
                    return
                raise
            updated.setdefault("kind", "Pod")
            self.store.put("Pod", updated)
            view.pods[meta["name"]] = updated

        list(self.pool.map(lift, to_lift))

    # -- status --------------------------------------------------------------------------
    def _write_cell_statuses(
        self,
        view: ExperimentView,
        expansion: Expansion,
        experiment: Experiment,
        finished: Mapping[str, Sequence[FinishedAttempt]],
        *,
        budget_held: bool = False,
    ) -> None:
        del expansion
        retries = experiment.spec.execution.max_infra_retries
        refreshed, running = self._finished(view)
        now = _stamp(self.clock())
        patches = []
        for name, cell in view.cells.items():
            cell_id = cell["spec"]["cellId"]
            attempts = refreshed.get(cell_id, [])
            if not attempts:
                continue
            current = cell.get("status") or {}
            selected = select_result(attempts)
            state = cell_state([a.status for a in attempts], retries)
            desired: dict[str, Any] = {
                "attempts": len(attempts),
                "phase": (
                    CellPhase.DONE
                    if state is CellState.DONE
                    else CellPhase.FAILED
                    if state is CellState.EXHAUSTED
                    else CellPhase.PENDING
                ).value,
                "rerunTokens": sorted({a.request for a in attempts if a.request}),
            }
            if selected is not None:
                chosen = current.get("selectedAttempt") or selected.number
                pick = next((a for a in attempts if a.number == chosen), selected)
                desired["selectedAttempt"] = pick.number
                desired["status"] = pick.status.value
                if pick.kernel.score is not None:
                    desired["score"] = pick.kernel.score
            generation = int(cell["metadata"].get("generation") or 1)
            true, reason, message = _cell_health(
                name,
                attempts,
                desired["selectedAttempt"] if selected is not None else None,
                state,
                retries,
                held=budget_held and cell_id not in running,
            )
            desired["observedGeneration"] = generation
            desired["conditions"], _ = merge_conditions(
                current.get("conditions"), kstatus(true, reason, message), generation, now
            )
            if all(current.get(k) == v for k, v in desired.items()):
                continue
            patches.append((cell, desired, message))

        def write(item: tuple[dict[str, Any], dict[str, Any], str]) -> None:
            cell, desired, message = item
            meta = cell["metadata"]
            name = meta["name"]
            before = (cell.get("status") or {}).get("phase")
            updated = self.cluster.patch(
                "Cell", meta["namespace"], name, {"status": desired}, status=True
            )
            updated.setdefault("kind", "Cell")
            self.store.put("Cell", updated)
            view.cells[name] = updated
            phase = desired["phase"]
            involved = Involved.of("Cell", cell)
            if phase != before and phase == CellPhase.DONE.value:
                self.events.record(involved, EventType.NORMAL, EventReason.RESULT_SELECTED, message)
            elif phase != before and phase == CellPhase.FAILED.value:
                self.events.record(
                    involved, EventType.WARNING, EventReason.RETRIES_EXHAUSTED, message
                )

        list(self.pool.map(write, patches))
        del finished

    def _write_summary(
        self,
        view: ExperimentView,
        ref: ExperimentRef,
        generation: int,
        experiment: Experiment,
        expansion: Expansion,
        decision: Decision,
        budget: BudgetState,
        key: Key,
    ) -> None:
        finished, running = self._finished(view)
        retries = experiment.spec.execution.max_infra_retries
        done = failed = 0
        cells_by_phase = dict.fromkeys(CellPhase, 0)
        per_subject: dict[str, dict[str, Any]] = {
            s.id: {"subjectId": s.id, "n": 0, "scores": [], "cost": None, "tokens": 0}
            for s in experiment.spec.subjects
        }
        for cell in expansion.cells:
            attempts = finished.get(cell.id, [])
            summary = per_subject[cell.subject_id]
            for a in attempts:
                if a.kernel.cost_usd is not None:
                    summary["cost"] = (summary["cost"] or 0.0) + a.kernel.cost_usd
                if a.kernel.usage is not None:
                    summary["tokens"] += a.kernel.usage.total_tokens
            state = cell_state([a.status for a in attempts], retries)
            if state is CellState.DONE:
                done += 1
                cells_by_phase[CellPhase.DONE] += 1
                selected = select_result(attempts)
                if selected is not None and selected.kernel.score is not None:
                    summary["n"] += 1
                    summary["scores"].append(selected.kernel.score)
            elif cell.id in running:
                cells_by_phase[CellPhase.RUNNING] += 1
            elif state is CellState.EXHAUSTED:
                failed += 1
                cells_by_phase[CellPhase.FAILED] += 1
            else:
                cells_by_phase[CellPhase.PENDING] += 1
        subjects = []
        for s in per_subject.values():
            scores = s["scores"]
            subjects.append(
                _without_none(
                    {
                        "subjectId": s["subjectId"],
                        "n": s["n"],
                        "meanScore": round(sum(scores) / len(scores), 6) if scores else None,
                        "costUsd": round(s["cost"], 6) if s["cost"] is not None else None,
                        "tokens": s["tokens"],
                    }
                )
            )
        total = len(expansion.cells)
        idle = decision.idle and not any(
            not (a.get("status") or {}).get("result") for a in view.attempts.values()
        )
        held = decision.held_by_budget > 0
        if idle and held:
            phase = ExperimentPhase.BUDGET_EXHAUSTED
        elif idle:
            phase = ExperimentPhase.COMPLETE
        else:
            phase = ExperimentPhase.RUNNING
        conditions = [
            *kstatus(*_experiment_health(idle, held, done, failed, total, len(running), budget)),
            ("Validated", True, "Valid", "the spec is valid"),
            ("PrerequisitesMet", True, "Found", "every declared credential's Secret exists"),
            (
                "Running",
                not idle,
                "AttemptsRunning" if not idle else "Idle",
                f"{len(running)} attempt(s) running" if not idle else "nothing is running",
            ),
            (
                "Complete",
                idle and not held,
                "AllCellsSettled" if idle and not held else "CellsPending",
                f"{done} of {total} cells have a result, {failed} failed",
            ),
            (
                "BudgetExhausted",
                budget.exhausted,
                "BudgetReached" if budget.exhausted else "WithinBudget",
                budget.describe(),
            ),
            (
                "Failed",
                failed > 0 and idle,
                "CellsFailed" if failed > 0 and idle else "NoFailure",
                f"{failed} cell(s) used up their infrastructure retries without a result"
                if failed
                else "no cell failed",
            ),
        ]
        counters = {
            "cellsTotal": total,
            "cellsDone": done,
            "cellsFailed": failed,
            "cellsRunning": len(running),
            "attempts": len(view.attempts),
            "attemptsRunning": len(running),
            "subjects": subjects,
            "budget": {
                "costUsd": round(budget.spent_cost_usd, 6),
                "tokens": budget.spent_tokens,
                "held": budget.exhausted,
            },
        }
        self._write_experiment_status(view, ref, generation, phase, counters, conditions=conditions)
        self.metrics.experiment_state(key, phase, cells_by_phase)

    def _write_experiment_status(
        self,
        view: ExperimentView,
        ref: ExperimentRef,
        generation: int,
        phase: ExperimentPhase,
        counters: Mapping[str, Any],
        *,
        conditions: Sequence[ConditionWish],
    ) -> None:
        body = view.body
        assert body is not None
        current = body.get("status") or {}
        new_conditions, transitions = merge_conditions(
            current.get("conditions"), conditions, generation, _stamp(self.clock())
        )
        desired = {
            "observedGeneration": generation,
            "phase": phase.value,
            "conditions": new_conditions,
            **counters,
        }
        if all(current.get(k) == v for k, v in desired.items()):
            return
        updated = self.cluster.patch(
            "Experiment", ref.namespace, ref.name, {"status": desired}, status=True
        )
        updated.setdefault("kind", "Experiment")
        self.store.put("Experiment", updated)
        view.body = updated
        involved = Involved("Experiment", ref.namespace, ref.name, ref.uid)
        for type_, event_type, reason, message in _experiment_events(
            current.get("phase"), phase, transitions, counters
        ):
            del type_
            self.events.record(involved, event_type, reason, message)


def _attempt_end(kernel: ResultKernel) -> tuple[KStatus, Reason, EventType, str]:
    """An ended attempt's kstatus condition, reason, Event type and message."""
    status = kernel.status
    text = status.value
    if kernel.score is not None:
        text += f", score {kernel.score:g}"
    text += f", in {kernel.duration_sec:.1f}s"
    if kernel.reason:
        text += f": {kernel.reason}"
    if status is AttemptStatus.COMPLETED:
        return KStatus.READY, Reason.COMPLETED, EventType.NORMAL, text
    if status is AttemptStatus.SUBJECT_FAILED:
        return KStatus.READY, Reason.SUBJECT_FAILED, EventType.NORMAL, text
    if status is AttemptStatus.CANCELLED:
        return KStatus.STALLED, Reason.CANCELLED, EventType.WARNING, text
    return (
        KStatus.STALLED,
        Reason.INFRA_FAILED,
        EventType.WARNING,
        text + " (no result: the cell gets a new attempt while its retries last)",
    )


def _cell_health(
    name: str,
    attempts: Sequence[FinishedAttempt],
    selected: int | None,
    state: CellState,
    retries: int,
    *,
    held: bool,
) -> tuple[KStatus, Reason, str]:
    """A cell's kstatus condition, reason and message, from its ended attempts. The
    message depends only on them (and the budget hold), so it never costs a write."""
    if selected is not None:
        pick = next(a for a in attempts if a.number == selected)
        text = f"attempt {pick.number} is the cell's result: {pick.status.value}"
        if pick.kernel.score is not None:
            text += f", score {pick.kernel.score:g}"
        return KStatus.READY, Reason.RESULT_SELECTED, text
    last = attempts[-1]
    why = f"attempt {last.number} ended {last.status.value}" + (
        f" ({last.kernel.reason})" if last.kernel.reason else ""
    )
    if state is CellState.EXHAUSTED:
        return (
            KStatus.STALLED,
            Reason.RETRIES_EXHAUSTED,
            f"{why}; no result after {len(attempts)} attempt(s), the infrastructure "
            f"retries ({retries}) are used up. After fixing the cause: kubectl annotate "
            f"cell {name} {names.RERUN_ANNOTATION}=<token>",
        )
    if held:
        return (
            KStatus.STALLED,
            Reason.BUDGET_EXHAUSTED,
            f"{why}; the experiment's budget is reached, so no new attempt starts",
        )
    return (
        KStatus.RECONCILING,
        Reason.RETRYING,
        f"{why}; a new attempt runs or will start (at most {retries} retries)",
    )


def _experiment_health(
    idle: bool,
    held: bool,
    done: int,
    failed: int,
    total: int,
    running: int,
    budget: BudgetState,
) -> tuple[KStatus, Reason, str]:
    """An experiment's kstatus condition, reason and message (see docs/operations.md)."""
    progress = f"{done} of {total} cells have a result"
    if not idle:
        text = f"{progress}, {running} attempt(s) running"
        if budget.exhausted:
            text += f"; the budget is reached ({budget.describe()}): no new task group starts"
        return KStatus.RECONCILING, Reason.RUNNING, text
    if held:
        return (
            KStatus.STALLED,
            Reason.BUDGET_EXHAUSTED,
            f"the budget is reached ({budget.describe()}): {progress}, the others do not "
            "start; run a new experiment with a larger spec.budget for them",
        )
    if failed:
        return (
            KStatus.STALLED,
            Reason.CELLS_FAILED,
            f"{progress}; {failed} used up their infrastructure retries without a result "
            f"(rerun one with the {names.RERUN_ANNOTATION} annotation)",
        )
    return KStatus.READY, Reason.COMPLETE, progress


def _experiment_events(
    before: str | None,
    phase: ExperimentPhase,
    transitions: Sequence[ConditionWish],
    counters: Mapping[str, Any],
) -> list[tuple[str, EventType, EventReason, str]]:
    """The Events of an Experiment status write: its phase changes and the conditions
    a user looks for (an invalid spec, a missing prerequisite, the budget hold)."""
    events: list[tuple[str, EventType, EventReason, str]] = []
    for type_, truth, _reason, message in transitions:
        if type_ == "Validated" and not truth:
            events.append((type_, EventType.WARNING, EventReason.INVALID_SPEC, message))
        elif type_ == "PrerequisitesMet" and not truth:
            events.append((type_, EventType.WARNING, EventReason.PREREQUISITES_MISSING, message))
        elif type_ == "BudgetExhausted" and truth:
            events.append(
                (
                    type_,
                    EventType.WARNING,
                    EventReason.BUDGET_EXHAUSTED,
                    f"the budget is reached ({message}): no new task group starts",
                )
            )
    if phase.value == before:
        return events
    total, done, failed = (
        counters.get("cellsTotal", 0),
        counters.get("cellsDone", 0),
        counters.get("cellsFailed", 0),
    )
    progress = f"{done} of {total} cells have a result"
    if phase is ExperimentPhase.RUNNING:
        events.append(("phase", EventType.NORMAL, EventReason.STARTED, f"{total} cells"))
    elif phase is ExperimentPhase.COMPLETE and failed:
        events.append(
            (
                "phase",
                EventType.WARNING,
                EventReason.COMPLETED_WITH_FAILURES,
                f"{progress}; {failed} used up their infrastructure retries",
            )
        )
    elif phase is ExperimentPhase.COMPLETE:
        events.append(("phase", EventType.NORMAL, EventReason.COMPLETED, progress))
    elif phase is ExperimentPhase.BUDGET_EXHAUSTED:
        events.append(
            (
                "phase",
                EventType.WARNING,
                EventReason.STOPPED_BY_BUDGET,
                f"{progress}; the budget holds the others",
            )
        )
    return events


def monotonic() -> float:
    """Seconds on the monotonic clock (the worker's timers)."""
    return time.monotonic()


__all__ = ["Controller", "parse_time", "validate"]
