"""One reconcile pass of one Experiment: observe -> decide -> act.

The pass reads what the store has observed (watch events, never a periodic LIST) into
plain values (k8s/observe.py), asks the engine's `decide()` what to start -- the same
function the local executor calls -- and carries it out with as few writes as the
objects allow. What each status says is worked out apart from the writes, by the pure
functions of k8s/status.py; this module only reads, calls them and writes. Per attempt lifecycle:
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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ResultKernel, infra_failure
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import Cell, Expansion, expand
from maka_eval.engine.reconcile import Decision, Policy, Request, decide
from maka_eval.engine.status import Trigger
from maka_eval.errors import MakaEvalError, Problem
from maka_eval.executors.load import experiment_from_data
from maka_eval.k8s import names
from maka_eval.k8s.cluster import AlreadyExists, Cluster, Rejected
from maka_eval.k8s.egress import (
    GatewayAccess,
    GatewaySettings,
    gateway_access,
)
from maka_eval.k8s.events import EventRecorder, Involved
from maka_eval.k8s.metrics import OperatorMetrics
from maka_eval.k8s.observe import Ending, FinishedAttempt, Observation, endings, launched, observe
from maka_eval.k8s.render import (
    ExperimentRef,
    attempt_object,
    attempt_objects,
    cell_object,
    credential_sources,
    egress_policy,
)
from maka_eval.k8s.results import (
    EndCause,
    parse_time,
)
from maka_eval.k8s.status import (
    CellWrite,
    EventWish,
    ExperimentState,
    attempt_finished,
    attempt_launched,
    attempt_started,
    cell_writes,
    experiment_progress,
    experiment_status,
    invalid_spec,
    prerequisites_missing,
    stamp,
)
from maka_eval.k8s.store import ExperimentView, Key, Store
from maka_eval.spec.experiment import API_VERSION, Experiment, KubernetesExecutorConfig

log = logging.getLogger("maka_eval.operator")

PREREQUISITE_RECHECK_SEC = 15.0
"""A missing Secret is looked for again after this long (Secrets are not watched: the
operator needs no permission to list them)."""


def _now() -> datetime:
    return datetime.now(UTC)


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
            self._write_experiment_status(view, ref, generation, invalid_spec(message), key)
            return None
        experiment = parsed

        if spec_key not in self._prerequisites_ok:
            missing = self.prerequisites(ref.namespace, experiment)
            if missing:
                state = prerequisites_missing(problems_text(missing), PREREQUISITE_RECHECK_SEC)
                self._write_experiment_status(view, ref, generation, state, key)
                return PREREQUISITE_RECHECK_SEC
            self._prerequisites_ok.add(spec_key)

        expansion = expand(experiment)
        self._ensure_cells(view, ref, expansion)
        self._resume_launches(view, ref, experiment, expansion)
        wake = self._collect_results(view, experiment)
        seen = self._observe(view)
        decision, budget = self._decide(seen, experiment, expansion, key)
        self._launch(view, ref, experiment, decision, seen.finished)
        self._lift_gates(view)

        # Status: observed again after this pass's writes to attempts (results, launches),
        # worked out by k8s/status.py, then written.
        seen = self._observe(view)
        spec = experiment.spec
        retries = spec.execution.max_infra_retries
        writes = cell_writes(seen, retries, budget_held=budget.exhausted, now=stamp(self.clock()))
        self._write_cell_statuses(view, writes)
        state = experiment_progress(
            expansion.cells,
            [s.id for s in spec.subjects],
            seen,
            retries,
            budget,
            idle=decision.idle and not seen.running,
            held=decision.held_by_budget > 0,
        )
        self._write_experiment_status(view, ref, generation, state, key)
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
        """Write the result of every attempt whose Pod has ended (or is gone, or never
        will end on its own: that Pod is deleted first); the seconds until the nearest
        deadline of one that may still end."""
        config = experiment.spec.executor.config
        assert isinstance(config, KubernetesExecutorConfig)
        ended, wake = endings(view, config.image_pull_deadline_sec, self.clock())

        def write(end: Ending) -> None:
            if end.delete_pod:
                meta = end.attempt["metadata"]
                self.cluster.delete("Pod", meta["namespace"], meta["name"])
            self._record(view, end.attempt, end.kernel, end.started, end.finished, end.cause)

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
        write = attempt_finished(attempt, kernel, started, finished, stamp(self.clock()))
        try:
            updated = self.cluster.patch(
                "Attempt", namespace, name, {"status": write.status}, status=True
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
            self._record_events(Involved.of("Attempt", attempt), write.events)
        updated.setdefault("kind", "Attempt")
        self.store.put("Attempt", updated)
        view.attempts[name] = updated

    # -- deciding ------------------------------------------------------------------------
    def _observe(self, view: ExperimentView) -> Observation:
        return observe(view, self._kernel)

    def _decide(
        self, seen: Observation, experiment: Experiment, expansion: Expansion, key: Key
    ) -> tuple[Decision, BudgetState]:
        spec = experiment.spec
        budget = budget_state(
            spec.budget.max_cost_usd,
            spec.budget.max_tokens,
            (
                (a.kernel.usage, a.kernel.cost_usd)
                for attempts in seen.finished.values()
                for a in attempts
            ),
        )
        requests = [
            Request(cell.cell_id, cell.rerun)
            for cell in seen.cells
            if cell.rerun and cell.rerun not in seen.answered
        ]
        policy = Policy(spec.execution.max_concurrent_task_groups, spec.execution.max_infra_retries)
        decision = decide(
            expansion,
            seen.finished,
            seen.running,
            budget,
            policy,
            requests,
            self._settled.get(key, 0),
        )
        self._settled[key] = decision.settled
        return decision, budget

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
                self.metrics.attempt_started(trigger.value)
                event = attempt_started(number, trigger, request, finished.get(cell.id, ()))
                if event is not None:
                    self._record_events(Involved.of("Cell", cell_obj), [event])
            attempt.setdefault("kind", "Attempt")
            self.store.put("Attempt", attempt)
            view.attempts[attempt["metadata"]["name"]] = attempt
            if (attempt.get("status") or {}).get("result"):
                return
            self._create_pod(view, ref, experiment, cell, attempt, gated=gated)

        list(self.pool.map(start, work))

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
        write = attempt_launched(attempt, stamp(self.clock()))
        try:
            updated = self.cluster.patch(
                "Attempt", meta["namespace"], meta["name"], {"status": write.status}, status=True
            )
        except Rejected as exc:
            if exc.status not in (409, 422):
                raise
            return  # the result was written meanwhile: the launch no longer matters
        self._record_events(Involved.of("Attempt", attempt), write.events)
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
            if not (attempt.get("status") or {}).get("result") and not launched(attempt)
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

    # -- status ------------------------------------------------------------------------
    def _write_cell_statuses(self, view: ExperimentView, writes: Sequence[CellWrite]) -> None:
        """Patch each Cell's status as computed, then record its Events."""

        def write(item: CellWrite) -> None:
            cell = view.cells[item.name]
            meta = cell["metadata"]
            updated = self.cluster.patch(
                "Cell", meta["namespace"], item.name, {"status": item.write.status}, status=True
            )
            updated.setdefault("kind", "Cell")
            self.store.put("Cell", updated)
            view.cells[item.name] = updated
            self._record_events(Involved.of("Cell", cell), item.write.events)

        list(self.pool.map(write, writes))

    def _write_experiment_status(
        self,
        view: ExperimentView,
        ref: ExperimentRef,
        generation: int,
        state: ExperimentState,
        key: Key,
    ) -> None:
        """Patch the Experiment's status if `state` changes it (Events after), and report
        the state to the metrics either way."""
        body = view.body
        assert body is not None
        write = experiment_status(body.get("status") or {}, generation, state, stamp(self.clock()))
        if write is not None:
            updated = self.cluster.patch(
                "Experiment", ref.namespace, ref.name, {"status": write.status}, status=True
            )
            updated.setdefault("kind", "Experiment")
            self.store.put("Experiment", updated)
            view.body = updated
            involved = Involved("Experiment", ref.namespace, ref.name, ref.uid)
            self._record_events(involved, write.events)
        self.metrics.experiment_state(key, state.phase, state.cells_by_phase)

    def _record_events(self, involved: Involved, events: Sequence[EventWish]) -> None:
        for event in events:
            self.events.record(involved, event.type, event.reason, event.message)


__all__ = ["Controller", "parse_time", "validate"]
