"""The executor plug-in interface: what an executor implements, and what it is given.

An executor decides *where and how* one attempt of a cell runs (processes on this
machine, a Pod, a Harbor trial, a cloud sandbox). Everything else is maka-eval's and
stays the same whichever executor runs the cells: the expansion into cells, task groups
that start together, the concurrency limit, append-only attempt records, infrastructure
retries, the status rules, result selection, progress and results.

An executor is found by its `kind` (the experiment's `executor.kind`) in the Python
entry-point group `maka_eval.executors`; the entry point loads an object implementing
`ExecutorPlugin` (or a class whose no-argument call returns one). The interface is four
calls, made in this order by the local run loop:

1. `validate(config, experiment)` when the document is loaded (`maka-eval validate`
   too): what is *wrong* in the document for this executor, each a `Problem` whose path
   starts with `spec.` (e.g. `spec.executor.config.environment.type`,
   `spec.subjects[0].kind`; the bare form drops the `spec.`). The config has already
   been parsed by `config_model`; this is for rules that need the whole experiment (a
   subject kind the executor cannot run, an unknown key in a task's config). A problem
   makes the document invalid.
   What a valid document merely *leaves out* but a run needs (a Runtime Host for `maka`
   subjects, a task reference) is not a validation problem: report it from
   `prerequisites` as a missing `Prerequisite` named by its field path, so that the
   document validates and `maka-eval validate` still says, in one line, what to add.
2. `prerequisites(config, experiment, host_env)` before a run starts (and in
   `maka-eval validate`): what the executor needs on this machine, each by name, found
   or missing. Nothing starts while one is missing.
3. `prepare(context)` once per run, after the prerequisites and before the first
   attempt (build images, start a shared service). Raising `PrerequisiteError` stops the
   run with its message; nothing was started.
4. `run_attempt(request)` once per attempt, from a worker thread: run the cell's subject
   and its verifier and return the result kernel. It may block; attempts of the same run
   are called concurrently (one thread per running attempt, at most the experiment's
   concurrency limit times the number of subjects). An exception it raises becomes an
   infrastructure failure of that attempt (retried), never a crash of the run.

Plug-ins import this module and `maka_eval.contract.kernel`; they should not need any
other part of maka-eval. See docs/executors.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

from maka_eval.contract.kernel import ArtifactEntry, ResultKernel, failure_kernel
from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.errors import Problem
from maka_eval.layout import DEFAULT_AGENT_TIMEOUT_SEC, DEFAULT_VERIFIER_TIMEOUT_SEC

if TYPE_CHECKING:
    from maka_eval.spec.experiment import Experiment
    from maka_eval.spec.subjects import Subject

ENTRY_POINT_GROUP = "maka_eval.executors"
"""The Python entry-point group executors register in (`kind = "module:object"`)."""

CONFIG_PATH = "spec.executor.config"
"""Where an executor's configuration is in the Kubernetes form of the document; problems
name paths under it (the bare form's `executor.config` is reported the same way)."""


# -- what the run loop tells an executor ------------------------------------------------
@dataclass(frozen=True)
class Prerequisite:
    """One thing an executor needs on this machine, by name, and whether it is there."""

    name: str
    """What it is, as the user would look for it: an environment variable
    (`MAKA_EVAL_HARBOR_PYTHON`), a program (`podman`), a service, or the JSON path of a
    field the document left out but a run needs (`spec.executor.config.runtimeHost`)."""
    found: bool
    detail: str = ""
    """What was found (a path, a version) or, when missing, what is wrong."""
    fix: str = ""
    """How to provide it (shown only when it is missing)."""

    def problem(self) -> Problem:
        """The missing prerequisite as a user-facing problem."""
        message = self.detail or "missing"
        if self.fix:
            message = f"{message}; {self.fix}"
        return Problem(self.name, message)


@dataclass(frozen=True)
class TaskInput:
    """One task as an executor sees it."""

    id: str
    instruction: str
    """What the subject is asked to do (instruction.md, or an inline task's `input`)."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The task's `config` from the document, passed through unchanged (for example a
    Harbor task path or dataset reference)."""
    directory: Path | None = None
    """The task's Harbor-format directory (instruction.md, tests/, environment/,
    solution/) when the benchmark has one, resolved on this machine."""
    agent_timeout_sec: float = DEFAULT_AGENT_TIMEOUT_SEC
    """The subject's time limit: task.toml's, else `execution.defaultTimeouts.agentSec`."""
    verifier_timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    """The verifier's time limit: task.toml's, else `execution.defaultTimeouts.verifierSec`."""


@dataclass(frozen=True)
class RunContext:
    """One invocation of a run, as `prepare` sees it."""

    experiment: Experiment
    config: BaseModel
    """`executor.config`, parsed by the executor's `config_model`."""
    base_dir: Path
    """The experiment file's folder: relative paths in the document resolve from here."""
    run_dir: Path
    """The run folder (records and artifacts). An executor writes only under an
    attempt's `artifacts_dir`, never elsewhere in it."""
    run_id: str
    work_dir: Path
    """A private scratch folder for this run, outside the run folder, removed afterwards
    (kept with `--keep-workspaces`)."""
    tasks: Mapping[str, TaskInput]
    host_env: Mapping[str, str]
    """This machine's environment (credentials and machine-local paths come from here)."""


@dataclass(frozen=True)
class AttemptIdentity:
    """Which attempt this is; `attempt_id` is unique across runs' records."""

    run_id: str
    attempt_id: str
    """`<runId>/<cellId>/<number>`."""
    number: int
    """1 for a cell's first attempt, then 2, 3... (retries and manual re-runs append)."""


class CancelSignal(Protocol):
    """Set when the run is being stopped (Ctrl-C, SIGTERM, a host failure)."""

    def is_set(self) -> bool: ...

    def on_cancel(self, listener: Callable[[], None]) -> None:
        """Call `listener` once, from another thread, when the run is cancelled while
        this attempt runs; at once if it already is. Listeners are dropped when the
        attempt ends."""
        ...


@dataclass(frozen=True)
class AttemptRequest:
    """Everything `run_attempt` is given for one attempt."""

    cell: Cell
    """`<taskId>::<repetition>::<subjectId>` and its parts."""
    task: TaskInput
    subject: Subject
    """The subject's spec (its kind and config)."""
    launch: SubjectLaunch | None
    """How maka-eval would start the subject: argv, result contract, declared non-secret
    env, credential bindings (target variable -> declared credential). The program is the
    command as the document names it (resolve it where the subject runs). None when the
    launch depends on the executor's own environment: an oracle of a task without a
    solution folder, or a `maka` subject when the executor config has no `runtimeHost`."""
    credentials: Mapping[str, str]
    """target variable -> value, for THIS subject's declared credentials only (read from
    the machine's environment). Never write them to logs, artifacts or config files."""
    attempt: AttemptIdentity
    artifacts_dir: Path
    """Where this attempt's artifacts go (the kernel names them relative to it, with
    their size and sha256: use `artifact_entry`)."""
    work_dir: Path
    """A fresh private folder for this attempt (removed afterwards)."""
    deadline: float
    """Wall-clock time (`time.time()`) by which the attempt should be over: its start plus
    the agent and verifier timeouts plus a margin. Past it, stop and return."""
    cancel: CancelSignal
    """Set when the run is cancelled: stop the subject, return a `cancelled` kernel."""
    start_gate: Callable[[], None]
    """Call it once, right before the subject starts, after the environment is ready:
    it returns when every arm of the task group is ready too, so that the arms of a group
    start together. Calling it again does nothing."""
    config: BaseModel
    """`executor.config`, parsed by the executor's `config_model`."""
    host_env: Mapping[str, str]


# -- the interface ------------------------------------------------------------------------
@runtime_checkable
class ExecutorPlugin(Protocol):
    """What an executor implements (see the module docstring for when each is called)."""

    @property
    def kind(self) -> str:
        """The `executor.kind` it answers to (lowercase letters, digits and '-')."""
        ...

    @property
    def config_model(self) -> type[BaseModel]:
        """The pydantic model of `executor.config`; unknown fields should be errors
        (`extra="forbid"`). Its JSON schema documents the config."""
        ...

    def validate(self, config: Any, experiment: Experiment) -> Sequence[Problem]:
        """Problems with this experiment for this executor (paths under
        `spec.executor.config` or naming the field, e.g. `spec.subjects[0].kind`)."""
        ...

    def prerequisites(
        self, config: Any, experiment: Experiment, host_env: Mapping[str, str]
    ) -> Sequence[Prerequisite]:
        """What it needs on this machine, found or missing, by name (`maka-eval validate`
        and `maka-eval run` show them; nothing starts while one is missing)."""
        ...

    def prepare(self, context: RunContext) -> None:
        """Once per run, before the first attempt."""
        ...

    def run_attempt(self, request: AttemptRequest) -> ResultKernel:
        """Run one attempt to its end and return its result kernel."""
        ...


# -- helpers for executors ------------------------------------------------------------------
def artifact_entry(artifacts_dir: Path, name: str) -> ArtifactEntry:
    """The kernel's entry for a file an executor wrote under `artifacts_dir`."""
    from maka_eval.artifacts import digest_file

    digest = digest_file(artifacts_dir / name)
    return ArtifactEntry(name=name, bytes=digest.bytes, sha256=digest.sha256)


__all__ = [
    "CONFIG_PATH",
    "ENTRY_POINT_GROUP",
    "ArtifactEntry",
    "AttemptIdentity",
    "AttemptRequest",
    "AttemptStatus",
    "CancelSignal",
    "ExecutorPlugin",
    "Prerequisite",
    "Problem",
    "ResultKernel",
    "RunContext",
    "StatusSource",
    "SubjectLaunch",
    "TaskInput",
    "artifact_entry",
    "failure_kernel",
]
