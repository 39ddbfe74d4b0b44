"""One attempt through a plug-in executor, inside maka-eval's run loop.

The local run loop (maka_eval.local.executor.LocalRun) keeps everything that is the
experiment's: the schedule (`engine.reconcile.decide`), the store, retries, progress and
results. For a plug-in kind it calls `PluginAttempts.run` from a worker thread per
attempt; this module turns the plug-in's `run_attempt` into an append-only attempt
record: it builds the request (task, subject launch, this subject's credentials only,
deadline, cancel signal, group start gate), checks the kernel the plug-in returns with
the same parser as every other executor's, and makes a failure of the plug-in an
infrastructure failure of that attempt (retried), never a crash of the run.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from maka_eval import __version__, layout
from maka_eval.artifacts import Redactor, digest_file
from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import AttemptRecord, utc_from_epoch
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.reconcile import Start
from maka_eval.engine.status import AttemptStatus
from maka_eval.errors import MakaEvalError, PrerequisiteError, Problem
from maka_eval.executors.base import (
    AttemptIdentity,
    AttemptRequest,
    CancelSignal,
    ExecutorPlugin,
    Prerequisite,
    RunContext,
    TaskInput,
    failure_kernel,
)
from maka_eval.spec.experiment import Experiment, PluginExecutor
from maka_eval.spec.subjects import ExternalSubject, OracleSubject, Subject, subject_launch
from maka_eval.spec.task_directory import TaskDefinition
from maka_eval.store.run_store import AttemptSlot, RunWriter

DEADLINE_MARGIN_SEC = 60.0
"""Added to the agent and verifier timeouts: setting up and tearing down an environment."""


@dataclass(frozen=True)
class PluginExecution:
    """A plug-in executor and its parsed config, for one experiment."""

    plugin: ExecutorPlugin
    config: BaseModel


def plugin_of(experiment: Experiment) -> PluginExecution | None:
    """The plug-in that runs this experiment, or None for a built-in executor."""
    executor = experiment.spec.executor
    if not isinstance(executor, PluginExecutor):
        return None
    from maka_eval.executors.registry import load

    plugin = load(executor.kind)
    return PluginExecution(plugin, plugin.config_model.model_validate(executor.config))


def task_inputs(
    experiment: Experiment, definitions: Mapping[str, TaskDefinition]
) -> dict[str, TaskInput]:
    """Every task as a plug-in sees it: inline (input, config) or a task directory."""
    defaults = experiment.spec.execution.default_timeouts
    out: dict[str, TaskInput] = {}
    for task in experiment.spec.tasks:
        definition = definitions.get(task.id)
        if definition is not None:
            instruction = definition.instruction_file.read_text(encoding="utf-8", errors="replace")
        else:
            instruction = task.input or ""
        out[task.id] = TaskInput(
            id=task.id,
            instruction=instruction,
            config=dict(task.config),
            directory=definition.root if definition is not None else None,
            agent_timeout_sec=(
                definition.agent_timeout_sec
                if definition is not None and definition.agent_timeout_sec is not None
                else defaults.agent_sec
            ),
            verifier_timeout_sec=(
                definition.verifier_timeout_sec
                if definition is not None and definition.verifier_timeout_sec is not None
                else defaults.verifier_sec
            ),
        )
    return out


def readiness_problems(experiment: Experiment, prefix: str) -> list[Problem]:
    """What a valid document still lacks to run, one problem per field.

    An inline task carries no tests: unless its `config` gives the executor something to
    score it with (a Harbor task path, a dataset reference), no verifier can score it.
    (The built-in executors refuse inline tasks when the document is loaded.)
    """
    spec = experiment.spec
    problems: list[Problem] = []
    if spec.benchmark.source != "inline":
        return problems
    for i, task in enumerate(spec.tasks):
        if not task.config:
            problems.append(
                Problem(
                    f"{prefix}tasks[{i}].config",
                    f"inline task '{task.id}' has no tests and its config names none, so it "
                    "cannot be scored (the verifier runs a task's tests): give the executor "
                    "a task in config (for executor.kind harbor: a task path or a dataset "
                    "reference), or make it a task directory with tests/test.sh",
                )
            )
    return problems


def check_plugin_prerequisites(
    execution: PluginExecution,
    experiment: Experiment,
    host_env: Mapping[str, str],
    prefix: str,
) -> list[Prerequisite]:
    """The plug-in's prerequisites; PrerequisiteError lists the missing ones (and what
    the document lacks to run)."""
    kind = execution.plugin.kind
    problems = readiness_problems(experiment, prefix)
    try:
        found = list(execution.plugin.prerequisites(execution.config, experiment, host_env))
    except Exception as exc:
        raise PrerequisiteError(
            f"executor '{kind}' could not check its prerequisites; nothing was started:",
            [Problem(f"{prefix}executor.kind", f"{type(exc).__name__}: {exc}")],
        ) from exc
    for item in found:
        if not item.found:
            problem = item.problem()
            where = problem.where if prefix else problem.where.removeprefix("spec.")
            problems.append(Problem(where, problem.message))
    if problems:
        raise PrerequisiteError(
            f"executor '{kind}' cannot run this experiment here; nothing was started:", problems
        )
    return found


def launch_of(subject: Subject, definition: TaskDefinition | None) -> SubjectLaunch | None:
    """How maka-eval would start `subject`, with the command as the document names it."""
    if isinstance(subject, ExternalSubject):
        return subject_launch(subject, program=subject.config.command)
    if isinstance(subject, OracleSubject):
        if definition is None or definition.solution_dir is None:
            return None
        return subject_launch(
            subject,
            solution_dir=str(definition.solution_dir),
            solution_script="solution/solve.sh",
            solution_env=definition.solution_env,
        )
    if subject.kind == "maka":
        return None  # its Runtime Host is the executor's to provide
    return subject_launch(subject)


class CancelHub:
    """The run's cancellation, handed to each attempt as its own `CancelSignal`.

    The run's token fires its listeners from the signal handler; plug-in code must not
    run there (it may take a lock the interrupted code holds), and a listener per attempt
    on the run's token would outlive its attempt (a later cancel would signal a process
    id the system has given to someone else). So the token gets one signal-safe listener
    (a queue put); a dispatcher thread calls the listeners of the attempts running then.
    """

    def __init__(self, token: CancelSignal) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._listeners: dict[int, list[Callable[[], None]]] = {}
        self._fired = False
        self._wakeups: queue.SimpleQueue[bool] = queue.SimpleQueue()
        token.on_cancel(lambda: self._wakeups.put(True))  # SimpleQueue.put: signal-safe
        self._thread = threading.Thread(target=self._dispatch, name="cancel", daemon=True)
        self._thread.start()

    def _dispatch(self) -> None:
        if not self._wakeups.get():
            return
        with self._lock:
            self._fired = True
            listeners = [f for fs in self._listeners.values() for f in fs]
            self._listeners.clear()
        for listener in listeners:
            with contextlib.suppress(Exception):
                listener()

    def close(self) -> None:
        """Stop the dispatcher (the run is over)."""
        self._wakeups.put(False)
        self._thread.join(timeout=5)

    def attempt(self) -> AttemptCancel:
        return AttemptCancel(self)

    def _add(self, key: int, listener: Callable[[], None]) -> bool:
        with self._lock:
            if self._fired:
                return False
            self._listeners.setdefault(key, []).append(listener)
            return True

    def _remove(self, key: int) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def is_set(self) -> bool:
        return self._token.is_set()


class AttemptCancel:
    """One attempt's view of the run's cancellation (`AttemptRequest.cancel`)."""

    def __init__(self, hub: CancelHub) -> None:
        self._hub = hub

    def is_set(self) -> bool:
        return self._hub.is_set()

    def on_cancel(self, listener: Callable[[], None]) -> None:
        """Call `listener` once, from another thread, when the run is cancelled while this
        attempt runs; at once (in this thread) if it already is."""
        if self._hub.is_set() or not self._hub._add(id(self), listener):
            listener()

    def close(self) -> None:
        """The attempt is over: its listeners are dropped, never called."""
        self._hub._remove(id(self))


class _Gate:
    """The group's start gate, passed once; remembers when the subject started."""

    def __init__(self, gate: Callable[[], Any] | None) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        self.passed_at: float | None = None

    def __call__(self) -> None:
        with self._lock:
            if self.passed_at is not None:
                return
            self.passed_at = time.time()
            gate = self._gate
        if gate is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate()
        with self._lock:
            self.passed_at = time.time()


class PluginAttempts:
    """Runs attempts of one run through a plug-in and records them."""

    def __init__(
        self,
        execution: PluginExecution,
        experiment: Experiment,
        tasks: Mapping[str, TaskInput],
        definitions: Mapping[str, TaskDefinition],
        host_env: Mapping[str, str],
        cancel: CancelSignal,
        host: str,
    ) -> None:
        self.execution = execution
        self.experiment = experiment
        self.tasks = tasks
        self.definitions = definitions
        self.host_env = host_env
        self.cancel = cancel
        self.host = host
        self.hub: CancelHub | None = None

    def close(self) -> None:
        """The run is over."""
        if self.hub is not None:
            self.hub.close()
            self.hub = None

    def prepare(self, writer: RunWriter, run_dir: Path, work_dir: Path, base_dir: Path) -> None:
        """The plug-in's `prepare`, once per run."""
        self.hub = CancelHub(self.cancel)
        context = RunContext(
            experiment=self.experiment,
            config=self.execution.config,
            base_dir=base_dir,
            run_dir=run_dir,
            run_id=writer.run_id,
            work_dir=work_dir,
            tasks=self.tasks,
            host_env=self.host_env,
        )
        try:
            self.execution.plugin.prepare(context)
        except MakaEvalError:
            raise
        except Exception as exc:
            raise PrerequisiteError(
                f"executor '{self.execution.plugin.kind}' could not prepare the run; no "
                "attempt was started:",
                [Problem("", f"{type(exc).__name__}: {exc}")],
            ) from exc

    def credentials(self, launch: SubjectLaunch | None, subject: Subject) -> dict[str, str]:
        """target variable -> value, for this subject's declared credentials only."""
        targets = (
            launch.credentials
            if launch is not None
            else {name: name for name in subject.credentials}
        )
        return {t: self.host_env[s] for t, s in targets.items() if s in self.host_env}

    def run(
        self,
        writer: RunWriter,
        slot: AttemptSlot,
        start: Start,
        gate: Callable[[], Any] | None,
        attempt_root: Path,
        keep_workspace: bool,
    ) -> AttemptRecord:
        """Run one attempt through the plug-in and commit its record."""
        cell = start.cell
        plugin = self.execution.plugin
        task = self.tasks[cell.task_id]
        definition = self.definitions.get(cell.task_id)
        subject = self.experiment.subject(cell.subject_id)
        launch = launch_of(subject, definition)
        credentials = self.credentials(launch, subject)
        redactor = Redactor.of(credentials)
        attempt_id = layout.attempt_id(writer.run_id, cell.id, slot.number)
        start_gate = _Gate(gate)
        assert self.hub is not None, "prepare() comes first"
        cancel = self.hub.attempt()
        started = time.time()
        attempt_root.mkdir(parents=True, exist_ok=True)
        request = AttemptRequest(
            cell=cell,
            task=task,
            subject=subject,
            launch=launch,
            credentials=credentials,
            attempt=AttemptIdentity(writer.run_id, attempt_id, slot.number),
            artifacts_dir=slot.artifacts_dir,
            work_dir=attempt_root,
            deadline=started
            + task.agent_timeout_sec
            + task.verifier_timeout_sec
            + DEADLINE_MARGIN_SEC,
            cancel=cancel,
            start_gate=start_gate,
            config=self.execution.config,
            host_env=self.host_env,
        )
        try:
            kernel = plugin.run_attempt(request)
            if not isinstance(kernel, ResultKernel):
                raise TypeError(f"run_attempt returned {type(kernel).__name__}, not a ResultKernel")
            # The same parser as a termination message on a cluster.
            kernel = ResultKernel.from_dict(kernel.to_dict())
            _check_artifacts(kernel, slot.artifacts_dir)
        except Exception as exc:
            reason = redactor.text(f"executor '{plugin.kind}' failed: {type(exc).__name__}: {exc}")
            kernel = failure_kernel(AttemptStatus.INFRA_FAILED, reason, time.time() - started)
        finally:
            cancel.close()
            start_gate()  # the other arms of the group must not wait for this one
        finished = time.time()
        if (
            self.cancel.is_set()
            and not kernel.status.is_result
            and kernel.status is not AttemptStatus.CANCELLED
        ):
            kernel = failure_kernel(
                AttemptStatus.CANCELLED,
                f"the run was cancelled while the attempt ran ({kernel.reason or 'no reason'})",
                kernel.duration_sec,
                kernel.artifacts,
            )
        record = attempt_record(
            writer,
            self.experiment.id,
            start,
            slot,
            attempt_id,
            kernel,
            started=started,
            subject_started=start_gate.passed_at,
            finished=finished,
            timings={"executor": finished - started},
            host=self.host,
        )
        writer.commit(slot, record)
        if not keep_workspace:
            shutil.rmtree(attempt_root, ignore_errors=True)
        return record


def attempt_record(
    writer: RunWriter,
    experiment_id: str,
    start: Start,
    slot: AttemptSlot,
    attempt_id: str,
    kernel: ResultKernel,
    *,
    started: float,
    subject_started: float | None,
    finished: float,
    timings: Mapping[str, float],
    host: str,
    egress_policy_digest: str | None = None,
) -> AttemptRecord:
    """The record of one attempt of this machine's run loop (built-in or plug-in
    executor): the kernel plus the attempt's identity, times in epoch seconds."""
    cell = start.cell
    return AttemptRecord(
        run_id=writer.run_id,
        experiment_id=experiment_id,
        cell_id=cell.id,
        task_id=cell.task_id,
        repetition=cell.repetition,
        subject_id=cell.subject_id,
        attempt=slot.number,
        attempt_id=attempt_id,
        trigger=start.trigger,
        request=start.request,
        started_at=utc_from_epoch(started),
        subject_started_at=utc_from_epoch(subject_started) if subject_started else None,
        finished_at=utc_from_epoch(finished),
        result=kernel,
        timings={k: round(v, 6) for k, v in timings.items()},
        host=host,
        maka_eval_version=__version__,
        egress_policy_digest=egress_policy_digest,
    )


def _check_artifacts(kernel: ResultKernel, artifacts_dir: Path) -> None:
    """Every artifact the kernel names is a file under the attempt's folder, as large as
    it says, with that digest."""
    root = artifacts_dir.resolve()
    for entry in kernel.artifacts:
        path = (artifacts_dir / entry.name).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise ContractError(f"artifact '{entry.name}' is not a file in the attempt's folder")
        digest = digest_file(path)
        if (digest.bytes, digest.sha256) != (entry.bytes, entry.sha256):
            raise ContractError(f"artifact '{entry.name}' does not match its size and sha256")


__all__ = [
    "PluginAttempts",
    "PluginExecution",
    "check_plugin_prerequisites",
    "launch_of",
    "plugin_of",
    "readiness_problems",
    "task_inputs",
]
