"""The embedded local executor: every cell as local processes, results in a run directory.

The engine decides (which groups start, whether a cell is retried, what a status is);
this module only carries it out: threads for the arms of running task groups, the
relay in-process for each attempt, the store for every record.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import itertools
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maka_eval import __version__
from maka_eval.artifacts import ArtifactDigest, copy_artifact
from maka_eval.contract.kernel import ArtifactEntry, ResultKernel
from maka_eval.contract.record import AttemptRecord, utc_from_epoch
from maka_eval.engine.budget import BudgetState, budget_state
from maka_eval.engine.expand import Cell, Expansion, expand
from maka_eval.engine.schedule import Launch, plan_launches, waiting_groups
from maka_eval.engine.selection import CellState, cell_state, needs_retry
from maka_eval.engine.status import Trigger
from maka_eval.errors import CellSelectionError, Problem
from maka_eval.local.events import (
    AttemptFinished,
    AttemptStarted,
    BudgetReached,
    Cancelling,
    EventSink,
    RunStarted,
    ignore,
)
from maka_eval.local.plans import attempt_plan
from maka_eval.local.prerequisites import WORK_DIR_VARIABLE, ResolvedCommands, check_prerequisites
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.outcome import AttemptOutcome
from maka_eval.relay.processes import CancelToken, ProcessSupervisor
from maka_eval.spec.load import LoadedExperiment
from maka_eval.spec.task_directory import TaskDefinition
from maka_eval.store.run_store import AttemptSlot, RunIdentity, RunWriter


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


def selected_cells(
    expansion: Expansion, requested: Sequence[str], prefix: str = "--cell"
) -> list[str]:
    """Validate `--cell` ids against the expansion (CellSelectionError on unknown ids)."""
    problems = []
    for value in requested:
        if value not in expansion:
            close = difflib.get_close_matches(value, [c.id for c in expansion.cells], n=1)
            hint = (
                f"; did you mean '{close[0]}'?"
                if close
                else ("; cell ids are <taskId>::<repetition>::<subjectId>")
            )
            problems.append(Problem(f"{prefix} {value}", f"no such cell in this experiment{hint}"))
    if problems:
        raise CellSelectionError("unknown cell(s); nothing was started:", problems)
    return list(dict.fromkeys(requested))


def work_root(host_env: Mapping[str, str]) -> Path:
    """Where attempt workspaces live: outside the run directory, never inside it."""
    configured = host_env.get(WORK_DIR_VARIABLE)
    base = (
        Path(configured) if configured else Path(tempfile.gettempdir()) / f"maka-eval-{os.getuid()}"
    )
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    return base


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
        self._budget_lock = threading.Lock()
        self._budget = BudgetState(None, None)
        self._running_attempts = 0
        self._report = RunReport(self.run_dir)
        self._host = socket.gethostname()
        self._writer: RunWriter | None = None
        self._commands: ResolvedCommands | None = None
        self._work: Path | None = None
        self._attempt_counter = itertools.count(1)

    # -- the run --------------------------------------------------------------------
    def run(self) -> RunReport:
        """Run every cell that needs an attempt; return what happened."""
        manual = selected_cells(self.expansion, self.options.cells) if self.options.cells else []
        self._commands = check_prerequisites(self.loaded, self.tasks, self.host_env)
        identity = RunIdentity(
            self.experiment.canonical(), {tid: t.digest for tid, t in sorted(self.tasks.items())}
        )
        writer = RunWriter.open(self.run_dir, identity, __version__)
        self._writer = writer
        try:
            work = self._work_set(writer, manual)
            self._work = work_root(self.host_env) / writer.run_id
            # We hold the writer lock: whatever is here is left from a writer that died.
            shutil.rmtree(self._work, ignore_errors=True)
            self._work.mkdir(parents=True)
            spending = [r.spending() for rs in writer.contents.records.values() for r in rs]
            budget = self.experiment.spec.budget
            self._budget = budget_state(budget.max_cost_usd, budget.max_tokens, spending)
            with _stop_on_signals(self.cancel):
                self._schedule(
                    writer, work, trigger=Trigger.MANUAL if manual else Trigger.SCHEDULED
                )
        finally:
            # Orphans that dropped their attempt's marker could not be attributed to an
            # attempt; with every attempt over, they are nobody's and must not outlive us.
            self.supervisor.quiesce_adopted()
            writer.close()
            if self._work is not None and not self.options.keep_workspaces:
                shutil.rmtree(self._work, ignore_errors=True)
        self._report.budget = self._budget
        self._report.cancelled = self.cancel.is_set()
        return self._report

    def _work_set(self, writer: RunWriter, manual: list[str]) -> set[str]:
        cap = self.experiment.spec.execution.max_infra_retries
        contents = writer.contents

        def state(cell_id: str) -> CellState:
            return cell_state([r.status for r in contents.attempts(cell_id)], cap)

        if not manual:
            return {c.id for c in self.expansion.cells if state(c.id) is CellState.PENDING}
        refused = []
        for cell_id in manual:
            if state(cell_id) is CellState.DONE and not self.options.force:
                selected = next(r for r in contents.attempts(cell_id) if r.status.is_result)
                refused.append(
                    Problem(
                        f"--cell {cell_id}",
                        f"already has a valid result (attempt {selected.attempt}, "
                        f"{selected.status.value}); --force appends another attempt, but "
                        "result selection keeps the earliest valid one",
                    )
                )
        if refused:
            raise CellSelectionError("refusing to re-run cells that have results:", refused)
        return set(manual)

    def _schedule(self, writer: RunWriter, work: set[str], trigger: Trigger) -> None:
        spec = self.experiment.spec
        limit = spec.execution.max_concurrent_task_groups
        groups_to_run = len({self.expansion.cell(c).group_id for c in work})
        self.events(
            RunStarted(
                run_dir=str(self.run_dir),
                run_id=writer.run_id,
                resumed=any(writer.contents.records.values()) or bool(writer.contents.interrupted),
                total_cells=len(self.expansion),
                cells_with_results=sum(
                    1
                    for rs in writer.contents.records.values()
                    if any(r.status.is_result for r in rs)
                ),
                cells_to_run=len(work),
                groups_to_run=groups_to_run,
                max_concurrent_groups=limit,
                subjects=self.expansion.subject_ids,
                budget=self._budget,
            )
        )
        workers = max(1, min(limit, groups_to_run) * len(self.expansion.subject_ids))
        running: dict[str, list[Future[None]]] = {}
        waiting = collections.deque(waiting_groups(self.expansion, work))
        budget_reported = False
        cancel_reported = False
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arm") as pool:
            while True:
                if not self.cancel.is_set():
                    with self._budget_lock:
                        budget = self._budget
                    plan = plan_launches(waiting, len(running), limit, budget)
                    for launch in plan.launches:
                        waiting.popleft()
                        running[launch.group.id] = self._start_group(pool, launch, trigger)
                    self._report.held_by_budget = plan.held_by_budget
                    if plan.held_by_budget and not budget_reported:
                        self.events(BudgetReached(budget, plan.held_by_budget))
                        budget_reported = True
                elif not cancel_reported:
                    self.events(Cancelling(self._running_attempts))
                    cancel_reported = True
                if not running:
                    break
                futures = [f for fs in running.values() for f in fs]
                wait(futures, timeout=0.25, return_when=FIRST_COMPLETED)
                for group_id in [g for g, fs in running.items() if all(f.done() for f in fs)]:
                    for future in running.pop(group_id):
                        future.result()  # a store failure ends the run, loudly

    def _start_group(
        self, pool: ThreadPoolExecutor, launch: Launch, trigger: Trigger
    ) -> list[Future[None]]:
        arms = launch.cells
        barrier = threading.Barrier(len(arms), timeout=600) if len(arms) > 1 else None
        return [pool.submit(self._run_arm, cell, barrier, trigger) for cell in arms]

    def _run_arm(self, cell: Cell, barrier: threading.Barrier | None, trigger: Trigger) -> None:
        assert self._writer is not None
        cap = self.experiment.spec.execution.max_infra_retries
        statuses = [r.status for r in self._writer.contents.attempts(cell.id)]
        gate = barrier.wait if barrier is not None else None
        try:
            while True:
                record = self._run_one(cell, trigger, gate)
                gate = None
                statuses.append(record.status)
                again = (
                    trigger is not Trigger.MANUAL
                    and not self.cancel.is_set()
                    and needs_retry(statuses, cap)
                )
                self.events(AttemptFinished(record, again))
                if not again:
                    return
                trigger = Trigger.RETRY
        except BaseException:
            if barrier is not None:
                barrier.abort()
            self.cancel.cancel()
            raise

    def _run_one(self, cell: Cell, trigger: Trigger, gate: Any) -> AttemptRecord:
        writer, work, commands = self._writer, self._work, self._commands
        assert writer is not None and work is not None and commands is not None
        slot = writer.reserve(cell.task_id, cell.repetition, cell.subject_id)
        attempt_root = work / f"a{next(self._attempt_counter)}"
        plan = attempt_plan(
            experiment=self.experiment,
            cell=cell,
            task=self.tasks[cell.task_id],
            commands=commands,
            run_id=writer.run_id,
            attempt_id=f"{writer.run_id}/{cell.id}/{slot.number}",
            attempt_root=attempt_root,
        )
        self.events(AttemptStarted(cell.id, cell.subject_id, slot.number))
        with self._budget_lock:
            self._running_attempts += 1
        try:
            outcome = run_attempt(
                plan, self.supervisor, self.cancel, self.host_env, start_gate=gate
            )
        finally:
            with self._budget_lock:
                self._running_attempts -= 1
        record = self._record(cell, slot, trigger, outcome, self._store_artifacts(slot, outcome))
        writer.commit(slot, record)
        if not self.options.keep_workspaces:
            shutil.rmtree(attempt_root, ignore_errors=True)
        with self._budget_lock:
            self._budget = self._budget.spend(*record.spending())
            self._report.attempts += 1
            self._report.records.append(record)
        return record

    def _store_artifacts(self, slot: AttemptSlot, outcome: AttemptOutcome) -> list[ArtifactEntry]:
        refs = []
        for artifact in outcome.artifacts:
            target = slot.artifacts_dir / artifact.name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest: ArtifactDigest = copy_artifact(
                Path(artifact.path), target, outcome.credential_values
            )
            refs.append(ArtifactEntry(artifact.name, digest.bytes, digest.sha256))
        return refs

    def _record(
        self,
        cell: Cell,
        slot: AttemptSlot,
        trigger: Trigger,
        outcome: AttemptOutcome,
        artifacts: list[ArtifactEntry],
    ) -> AttemptRecord:
        assert self._writer is not None
        c = outcome.classification
        return AttemptRecord(
            run_id=self._writer.run_id,
            experiment_id=self.experiment.id,
            cell_id=cell.id,
            task_id=cell.task_id,
            repetition=cell.repetition,
            subject_id=cell.subject_id,
            attempt=slot.number,
            attempt_id=f"{self._writer.run_id}/{cell.id}/{slot.number}",
            trigger=trigger,
            started_at=utc_from_epoch(outcome.started_at),
            subject_started_at=(
                utc_from_epoch(outcome.subject_started_at) if outcome.subject_started_at else None
            ),
            finished_at=utc_from_epoch(outcome.finished_at),
            result=ResultKernel(
                status=c.status,
                score=c.score,
                usage=c.usage,
                cost_usd=c.cost_usd,
                duration_sec=outcome.duration_sec,
                artifacts=tuple(artifacts),
                status_source=c.source,
                reason=c.reason,
                exit_code=c.exit_code,
            ),
            timings={k: round(v, 6) for k, v in outcome.timings.items()},
            host=self._host,
            maka_eval_version=__version__,
        )
