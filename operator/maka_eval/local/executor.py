"""The embedded local executor: every cell as local processes, results in a run directory.

Observe -> decide -> act. The engine's `decide` says what to start (task groups, retries,
budget, manual requests); this module only carries it out: one thread per running
attempt, the relay in-process for each, the store for every record. The main thread
sleeps on a queue until an attempt ends or the run is cancelled, records what
happened, and asks `decide` again; nothing polls.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from maka_eval import __version__, layout
from maka_eval.artifacts import Redactor, digest_file
from maka_eval.contract.kernel import MAX_KERNEL_BYTES, ResultKernel
from maka_eval.contract.record import AttemptRecord
from maka_eval.egress.policy import EgressPolicy
from maka_eval.egress.proxy import ProxyStartError
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.classify import (
    NO_FRAME,
    NOT_VERIFIED,
    Execution,
    ExecutionEnd,
    ResultContract,
    classify,
)
from maka_eval.engine.expand import expand
from maka_eval.engine.modes import Isolation, verifier_uses_proxy
from maka_eval.engine.reconcile import (
    GROUP_START_TIMEOUT_SEC,
    AttemptView,
    Policy,
    Request,
    Start,
    check_requests,
    decide,
    retry_due,
)
from maka_eval.engine.selection import CellState, cell_state
from maka_eval.engine.status import StatusSource, Trigger
from maka_eval.errors import CellSelectionError, PrerequisiteError, ResourceError
from maka_eval.executors.attempts import (
    PluginAttempts,
    attempt_record,
    check_plugin_prerequisites,
    plugin_of,
    readiness_problems,
    task_inputs,
)
from maka_eval.local import netns
from maka_eval.local.cell_egress import CellEgress, start_cell_egress
from maka_eval.local.events import (
    AttemptFinished,
    AttemptStarted,
    BudgetReached,
    Cancelling,
    EventSink,
    RunStarted,
    ignore,
)
from maka_eval.local.plans import attempt_plan, egress_policy
from maka_eval.local.prerequisites import (
    ResolvedCommands,
    _prefix,
    check_prerequisites,
    work_root_path,
)
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.outcome import AttemptOutcome, build_kernel
from maka_eval.relay.plan import MeteringPlan
from maka_eval.sandbox.container.engine import client_for
from maka_eval.sandbox.container.images import forget_images
from maka_eval.sandbox.container.removal import drain_removals, remove_leftovers
from maka_eval.sandbox.holders import NamespacePool, etc_view
from maka_eval.spec.egress import policy_of
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.metering import prices_of
from maka_eval.spec.task_directory import TaskDefinition, benchmark_root
from maka_eval.store.run_store import RunIdentity, RunWriter
from maka_eval.store.seal import key_dir


@dataclass(frozen=True)
class RunOptions:
    """How to run: everything, or only some cells again."""

    cells: tuple[str, ...] = ()
    force: bool = False
    keep_workspaces: bool = False


@dataclass
class RunReport:
    """What a run did."""

    run_dir: Path
    attempts: int = 0
    cancelled: bool = False
    held_by_budget: int = 0
    budget: BudgetState | None = None
    records: list[AttemptRecord] = field(default_factory=list)
    work_dir: Path | None = None
    """Where the attempts' workspaces were kept (`--keep-workspaces`), one folder per
    attempt: <taskId>__<repetition>__<subjectId>__<attempt number>."""


def work_root(host_env: Mapping[str, str]) -> Path:
    """Where attempt workspaces live: outside the run directory, never inside it."""
    base = work_root_path(host_env)
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return base


def program_digests(loaded: LoadedExperiment, commands: ResolvedCommands) -> dict[str, str]:
    """Digests of the programs the spec names by path (an agent script, a Runtime Host):
    editing one is a different experiment. Programs found on PATH are the machine's."""
    spec = loaded.experiment.spec
    digests: dict[str, str] = {}
    for subject in spec.subjects:
        command = getattr(subject.config, "command", None)
        program = commands.subjects.get(subject.id)
        if isinstance(command, str) and "/" in command and program is not None:
            digests[f"subjects.{subject.id}"] = "sha256:" + digest_file(program).sha256
    host = spec.runtime_host
    if host is not None and "/" in host.command and commands.runtime_host is not None:
        digests["executor.runtimeHost"] = "sha256:" + digest_file(commands.runtime_host).sha256
    return digests


@contextlib.contextmanager
def _stop_on_signals(cancel: CancelToken) -> Iterator[None]:
    """Ctrl-C and SIGTERM cancel the run (attempts are quiesced and recorded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        cancel.cancel()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# What an arm thread reports to the main thread: its attempt's record, or what broke.
_Finished = tuple[Start, AttemptRecord | BaseException]


class LocalRun:
    """One invocation of `maka-eval run` against one run directory."""

    def __init__(
        self,
        loaded: LoadedExperiment,
        tasks: Mapping[str, TaskDefinition],
        run_dir: Path,
        *,
        options: RunOptions | None = None,
        events: EventSink = ignore,
        cancel: CancelToken | None = None,
        host_env: Mapping[str, str] | None = None,
        supervisor: ProcessSupervisor | None = None,
    ) -> None:
        self.loaded = loaded
        self.experiment = loaded.experiment
        self.tasks = tasks
        self.run_dir = Path(run_dir)
        self.options = options or RunOptions()
        self.events = events
        self.cancel = cancel or CancelToken()
        self.host_env = host_env if host_env is not None else os.environ
        self.supervisor = supervisor or ProcessSupervisor()
        self.expansion = expand(self.experiment)
        execution = self.experiment.spec.execution
        self.policy = Policy(
            max_concurrent_groups=execution.max_concurrent_task_groups,
            max_infra_retries=execution.max_infra_retries,
            schedule=not self.options.cells,
        )
        self._report = RunReport(self.run_dir)
        self._host = socket.gethostname()
        self._writer: RunWriter | None = None
        self._commands: ResolvedCommands | None = None
        self._work: Path | None = None
        self._host_problem: str | None = None
        self._hidden: tuple[str, ...] = ()
        # Each task's proxy policy: the spec's blocklist (compiled once), and a task's
        # own allowlist.
        spec_policy = policy_of(self.experiment.spec.executor_egress)
        self._egress_policies: dict[str, EgressPolicy | None] = {
            tid: egress_policy(self.experiment, task, spec_policy)
            for tid, task in self.tasks.items()
        }
        # A plug-in executor (executors/attempts.py) runs each attempt in place of the
        # in-process relay; the run loop, the store and the events stay these.
        self._plugin = plugin_of(self.experiment)
        self._plugin_attempts: PluginAttempts | None = None
        # Namespaces made ahead of attempts (the process sandbox's; nothing is made
        # unless an attempt asks): about as many as attempts can start at once.
        self._pool = NamespacePool(
            execution.max_concurrent_task_groups * len(self.experiment.spec.subjects),
            self.supervisor,
        )

    # -- the run --------------------------------------------------------------------
    def run(self) -> RunReport:
        """Run every cell that needs an attempt (or only the requested ones)."""
        if self._plugin is not None:
            check_plugin_prerequisites(
                self._plugin, self.experiment, self.host_env, _prefix(self.loaded)
            )
            self._plugin_attempts = PluginAttempts(
                self._plugin,
                self.experiment,
                task_inputs(self.experiment, self.tasks),
                self.tasks,
                self.host_env,
                self.cancel,
                self._host,
            )
            digests: dict[str, str] = {}
        else:
            unready = readiness_problems(self.experiment, _prefix(self.loaded))
            if unready:
                raise PrerequisiteError(
                    "this experiment cannot run here; nothing was started:", unready
                )
            self._commands = check_prerequisites(self.loaded, self.tasks, self.host_env)
            if self._commands.isolation is Isolation.NAMESPACES:
                # The sandboxes' /etc, copied once, now rather than in a first attempt.
                etc_view()
            digests = program_digests(self.loaded, self._commands)
        identity = RunIdentity(
            self.experiment.canonical(),
            {tid: t.digest for tid, t in sorted(self.tasks.items())},
            digests,
        )
        writer = RunWriter.open(self.run_dir, identity, __version__)
        self._writer = writer
        try:
            attempts: dict[str, list[AttemptView]] = {
                cell: list(records) for cell, records in writer.contents.records.items()
            }
            requests = self._requests(attempts)
            self._work = work_root(self.host_env) / writer.run_id
            # No sandbox sees the run folder, any workspace, or the tasks' folder.
            self._hidden = (
                str(self.run_dir.resolve()),
                str(self._work.parent.resolve()),
                str(benchmark_root(self.experiment, self.loaded.base_dir)),
                # The records' seal key: never in a sandbox, even one showing the
                # program's folder around it.
                str(key_dir().resolve()),
            )
            # We hold the writer lock: whatever is here is left from a writer that died.
            shutil.rmtree(self._work, ignore_errors=True)
            self._work.mkdir(parents=True)
            engine = self._commands.engine if self._commands is not None else None
            if self._commands is not None and self._commands.containers and engine is not None:
                remove_leftovers(engine.url, writer.run_id)
                forget_images()
                # The engine's client now, not in the first attempts (importing the SDK
                # takes most of a second: it would count as their preparation).
                client_for(engine.url)
            if self._plugin_attempts is not None:
                self._plugin_attempts.prepare(
                    writer, self.run_dir, self._work, self.loaded.base_dir
                )
            if any(p is not None for p in self._egress_policies.values()):
                netns.remove_leftovers(writer.run_id)
            spending = [r.spending() for rs in writer.contents.records.values() for r in rs]
            budget = self.experiment.spec.budget
            self._report.budget = budget_state(budget.max_cost_usd, budget.max_tokens, spending)
            with _stop_on_signals(self.cancel):
                self._reconcile(writer, attempts, requests)
        finally:
            # Stopped containers are removed in the background: none may outlive the run.
            drain_removals()
            # Orphans that dropped their attempt's marker could not be attributed to an
            # attempt; with every attempt over, they are nobody's and must not outlive us.
            self.supervisor.quiesce_adopted()
            self._pool.close()
            if self._plugin_attempts is not None:
                self._plugin_attempts.close()
            writer.close()
            if self._work is not None:
                if self.options.keep_workspaces:
                    self._report.work_dir = self._work
                else:
                    shutil.rmtree(self._work, ignore_errors=True)
        self._report.cancelled = self.cancel.is_set()
        if self._host_problem is not None:
            raise ResourceError(
                f"the run stopped: {self._host_problem}. Free some space, then run the same "
                "command again to resume (no retry was spent and no cell was charged)."
            )
        return self._report

    def _requests(self, attempts: Mapping[str, list[AttemptView]]) -> list[Request]:
        """`--cell` ids as manual requests of this invocation (refused ones raise)."""
        if not self.options.cells:
            return []
        problems = check_requests(
            self.expansion, attempts, self.options.cells, force=self.options.force
        )
        if problems:
            raise CellSelectionError(
                "cannot run the requested cell(s); nothing was started:", problems
            )
        token = f"cli-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"
        return [Request(cell, token) for cell in dict.fromkeys(self.options.cells)]

    def _reconcile(
        self,
        writer: RunWriter,
        attempts: dict[str, list[AttemptView]],
        requests: list[Request],
    ) -> None:
        """Observe -> decide -> act until nothing runs and nothing may start."""
        limit = self.policy.max_concurrent_groups
        report = self._report
        assert report.budget is not None
        self.events(
            RunStarted(
                run_dir=str(self.run_dir),
                run_id=writer.run_id,
                resumed=any(writer.contents.records.values()) or bool(writer.contents.interrupted),
                total_cells=len(self.expansion),
                cells_with_results=sum(
                    1 for rs in attempts.values() if any(a.status.is_result for a in rs)
                ),
                cells_to_run=self._remaining_cells(attempts, requests),
                groups_to_run=self._remaining_groups(attempts, requests),
                max_concurrent_groups=limit,
                subjects=self.expansion.subject_ids,
                budget=report.budget,
            )
        )
        inbox: queue.SimpleQueue[_Finished | None] = queue.SimpleQueue()
        self.cancel.on_cancel(lambda: inbox.put(None))  # SimpleQueue.put: signal-safe
        workers = max(1, limit * len(self.expansion.subject_ids))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arm") as pool:
            try:
                self._loop(pool, attempts, requests, inbox)
            except BaseException:
                self.cancel.cancel()  # running attempts quiesce; the pool waits for them
                raise

    def _loop(
        self,
        pool: ThreadPoolExecutor,
        attempts: dict[str, list[AttemptView]],
        requests: list[Request],
        inbox: queue.SimpleQueue[_Finished | None],
    ) -> None:
        report = self._report
        assert report.budget is not None
        running: dict[str, Start] = {}
        settled = 0
        budget_reported = cancel_reported = False
        failure: BaseException | None = None
        while True:
            if not self.cancel.is_set():
                decision = decide(
                    self.expansion,
                    attempts,
                    running.keys(),
                    report.budget,
                    self.policy,
                    requests,
                    settled,
                )
                settled = decision.settled
                for launch in decision.launches:
                    barrier = (
                        threading.Barrier(len(launch.arms), timeout=GROUP_START_TIMEOUT_SEC)
                        if launch.together
                        else None
                    )
                    for arm in launch.arms:
                        running[arm.cell.id] = arm
                        pool.submit(self._run_arm, arm, barrier, inbox.put)
                report.held_by_budget = decision.held_by_budget
                if decision.held_by_budget and not budget_reported:
                    self.events(BudgetReached(report.budget, decision.held_by_budget))
                    budget_reported = True
            if not running:
                break
            item = inbox.get()
            if self.cancel.is_set() and not cancel_reported:
                self.events(Cancelling(len(running)))
                cancel_reported = True
            if item is None:
                continue
            start, outcome = item
            running.pop(start.cell.id, None)
            if isinstance(outcome, BaseException):
                failure = failure or outcome
                self.cancel.cancel()  # a store failure ends the run, loudly
                continue
            self._observe(outcome, attempts)
        if failure is not None:
            raise failure

    def _observe(self, record: AttemptRecord, attempts: dict[str, list[AttemptView]]) -> None:
        """Take in one finished attempt."""
        history = attempts.setdefault(record.cell_id, [])
        history.append(record)
        report = self._report
        assert report.budget is not None
        report.budget = report.budget.spend(*record.spending())
        report.attempts += 1
        report.records.append(record)
        if record.result.status_source is StatusSource.HOST:
            self._host_problem = self._host_problem or record.result.reason or "host failure"
            self.cancel.cancel()
        again = (
            self.policy.schedule
            and not self.cancel.is_set()
            and retry_due(history, self.policy.max_infra_retries)
        )
        self.events(AttemptFinished(record, again))

    def _remaining_cells(
        self, attempts: Mapping[str, list[AttemptView]], requests: list[Request]
    ) -> int:
        if requests:
            return len(requests)
        cap = self.policy.max_infra_retries
        return sum(
            1
            for cell in self.expansion.cells
            if cell_state([a.status for a in attempts.get(cell.id, ())], cap) is CellState.PENDING
        )

    def _remaining_groups(
        self, attempts: Mapping[str, list[AttemptView]], requests: list[Request]
    ) -> int:
        everything = Policy(
            len(self.expansion.groups), self.policy.max_infra_retries, self.policy.schedule
        )
        unlimited = BudgetState(None, None)
        return len(decide(self.expansion, attempts, (), unlimited, everything, requests).launches)

    # -- one arm --------------------------------------------------------------------
    def _run_arm(
        self,
        start: Start,
        barrier: threading.Barrier | None,
        report: Callable[[_Finished], None],
    ) -> None:
        """Run one attempt in a worker thread and report it to the main thread."""
        try:
            gate = barrier.wait if barrier is not None else None
            if self._plugin_attempts is not None:
                record = self._run_plugin_one(self._plugin_attempts, start, gate)
            else:
                record = self._run_one(start, gate)
        except BaseException as exc:
            if barrier is not None:
                barrier.abort()
            report((start, exc))
            return
        report((start, record))

    def _run_plugin_one(
        self, attempts: PluginAttempts, start: Start, gate: Callable[[], Any] | None
    ) -> AttemptRecord:
        writer, work = self._writer, self._work
        assert writer is not None and work is not None
        cell = start.cell
        slot = writer.reserve(cell.task_id, cell.repetition, cell.subject_id)
        attempt_root = work / f"{cell.task_id}__{cell.repetition}__{cell.subject_id}__{slot.number}"
        self.events(AttemptStarted(cell.id, cell.subject_id, slot.number))
        return attempts.run(writer, slot, start, gate, attempt_root, self.options.keep_workspaces)

    def _run_one(self, start: Start, gate: Callable[[], Any] | None) -> AttemptRecord:
        writer, work, commands = self._writer, self._work, self._commands
        assert writer is not None and work is not None and commands is not None
        cell = start.cell
        slot = writer.reserve(cell.task_id, cell.repetition, cell.subject_id)
        # One flat folder per attempt, named by its cell (one mkdir, not four).
        attempt_root = work / f"{cell.task_id}__{cell.repetition}__{cell.subject_id}__{slot.number}"
        attempt_id = layout.attempt_id(writer.run_id, cell.id, slot.number)
        task = self.tasks[cell.task_id]
        self.events(AttemptStarted(cell.id, cell.subject_id, slot.number))
        egress: CellEgress | None = None
        egress_failure: str | None = None
        # The proxy signs its provider-usage checkpoint with this token; the relay (not
        # the subject) verifies it when the result frame is missing.
        result_token = secrets.token_hex(16)
        policy = self._egress_policies.get(cell.task_id)
        if policy is not None:
            try:
                egress = start_cell_egress(
                    run_id=writer.run_id,
                    cell_id=cell.id,
                    folder=attempt_root.with_name(attempt_root.name + ".egress"),
                    policy=policy,
                    result_token=result_token,
                )
            except (netns.NetnsError, ProxyStartError, OSError) as exc:
                egress_failure = f"the cell's egress enforcement could not be set up: {exc}"
        try:
            plan = attempt_plan(
                experiment=self.experiment,
                cell=cell,
                task=task,
                commands=commands,
                run_id=writer.run_id,
                attempt_id=attempt_id,
                attempt_root=attempt_root,
                artifacts_dir=slot.artifacts_dir,
                hidden=self._hidden,
                egress=(
                    egress.plan(verifier_uses_proxy=verifier_uses_proxy(task.network_mode))
                    if egress is not None
                    else None
                ),
            )
            redactor = Redactor.of(
                {name: self.host_env[name] for name in plan.redact if self.host_env.get(name)}
            )
            if egress_failure is not None:
                outcome = _not_started(plan.subject.contract, egress_failure, redactor, gate)
            elif egress is not None:
                prices = prices_of(self.experiment.spec.metering)
                metering = MeteringPlan(
                    str(egress.proxy.checkpoint_path),
                    prices=prices.to_dict() if prices is not None else {},
                )
                outcome = run_attempt(
                    replace(plan, metering=metering),
                    self.supervisor,
                    self.cancel,
                    {**self.host_env, metering.token_env: result_token},
                    start_gate=gate,
                    settle_metering=egress.proxy.settle,
                )
            else:
                outcome = run_attempt(
                    plan,
                    self.supervisor,
                    self.cancel,
                    self.host_env,
                    start_gate=gate,
                    pool=self._pool,
                )
        finally:
            if egress is not None:
                egress.finish()  # the proxy stopped, the namespace gone: nothing outlives it
        # The in-process path skips the bytes, not the validation: the same parser as a
        # termination message on a cluster.
        kernel = ResultKernel.from_dict(outcome.kernel.to_dict())
        timings = dict(outcome.timings)
        if egress is not None:
            audit = egress.store_audit_log(slot.artifacts_dir, redactor)
            # First, so that fitting the kernel to its bound drops others before it.
            kernel = replace(kernel, artifacts=(*audit, *kernel.artifacts)).fitted(MAX_KERNEL_BYTES)
            timings.update(egress.timings())
        record = attempt_record(
            writer,
            self.experiment.id,
            start,
            slot,
            attempt_id,
            kernel,
            started=outcome.started_at,
            subject_started=outcome.subject_started_at,
            finished=outcome.finished_at,
            timings=timings,
            host=self._host,
            egress_policy_digest=policy.digest if policy is not None else None,
        )
        writer.commit(slot, record)
        if not self.options.keep_workspaces:
            shutil.rmtree(attempt_root, ignore_errors=True)
            shutil.rmtree(attempt_root.with_name(attempt_root.name + ".egress"), True)
        return record


def _not_started(
    contract: ResultContract, error: str, redactor: Redactor, gate: Callable[[], Any] | None
) -> AttemptOutcome:
    """An attempt that failed before its relay could start: an infrastructure failure
    (retried), classified by the same rules as any other."""
    if gate is not None:
        with contextlib.suppress(Exception):
            gate()  # the other arms of the group must not wait for this one
    now = time.time()
    execution = Execution(ExecutionEnd.THREW, error=error)
    classification = classify(contract, execution, NO_FRAME, NOT_VERIFIED, metered=None)
    return AttemptOutcome(
        classification=classification,
        execution=execution,
        frame=NO_FRAME,
        verification=NOT_VERIFIED,
        artifacts=(),
        started_at=now,
        finished_at=now,
        subject_started_at=None,
        timings={},
        kernel=build_kernel(classification, NOT_VERIFIED, 0.0, (), redactor),
    )


__all__ = ["LocalRun", "RunOptions", "RunReport", "Trigger", "work_root"]
