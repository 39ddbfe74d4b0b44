"""`executor.kind: harbor`: every attempt is one trial of Harbor 0.26 itself.

maka-eval keeps the experiment's semantics (task groups that start together, the
concurrency limit, append-only attempts, retries, the status rules, credentials only for
the declaring subject); Harbor prepares the task environment (any of its environment
types), runs the relay Agent (bridge/agent.py), which invokes exactly one subject, and
scores the trial with its native verifier. One Harbor worker process per run runs the
trials (bridge/worker.py); Harbor's job queue and n_concurrent are not used.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from maka_eval import strict_json
from maka_eval.artifacts import Redactor
from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.launch import SOLUTION_DIR_NAME, SubjectLaunch
from maka_eval.engine.modes import EgressMode, Isolation
from maka_eval.errors import PrerequisiteError, Problem
from maka_eval.executors.base import (
    CONFIG_PATH,
    AttemptRequest,
    Prerequisite,
    RunContext,
)
from maka_eval.executors.plan import plan_attempt
from maka_eval.harbor.bridge.plan_file import PlanFile
from maka_eval.harbor.config import (
    HARBOR_VERSION,
    PYTHON_ENV,
    HarborExecutorConfig,
    harbor_environment,
)
from maka_eval.harbor.results import trial_kernel
from maka_eval.harbor.worker import (
    TrialWorker,
    WorkerError,
    harbor_environment_variables,
    probe,
    stage_bridge,
)
from maka_eval.relay.plan import AttemptPlan, PlanError
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.subjects import MakaSubject, OracleSubject, Subject, subject_launch
from maka_eval.spec.task_directory import TaskDefinition, load_task

RELAY_AGENT = "maka_eval_harbor.agent:RelayAgent"
TASK_CONFIG_KEYS = frozenset({"path", "name", "ref"})
INSTALL_FIX = (
    f"set {PYTHON_ENV} to the python of a virtualenv holding harbor=={HARBOR_VERSION}.* "
    "and podman-compose for Podman (hack/harbor.sh makes one); nothing is installed at run time"
)


def _declared_credentials(experiment: Experiment) -> set[str]:
    names: set[str] = set()
    for subject in experiment.spec.subjects:
        names.update(subject.credentials)
        bindings = getattr(subject.config, "credential_bindings", {})
        names.update(bindings.values())
    return names


@functools.lru_cache(maxsize=32)
def _probe_cached(
    python: str, stamp: float, environment: str, env: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    return probe(python, _decode(environment), dict(env))


def _decode(text: str) -> dict[str, Any]:
    value = strict_json.loads(text)
    assert isinstance(value, dict)
    return value


@dataclass
class _Run:
    """One run's Harbor worker and folders."""

    context: RunContext
    config: HarborExecutorConfig
    python: str
    env: dict[str, str]
    stage: Path
    trials_dir: Path
    log: Path
    worker: TrialWorker
    lock: threading.Lock


class HarborExecutor:
    """The `harbor` executor plug-in (maka_eval.executors.base.ExecutorPlugin)."""

    kind = "harbor"
    config_model = HarborExecutorConfig

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    # -- validate -------------------------------------------------------------------
    def validate(self, config: Any, experiment: Experiment) -> Sequence[Problem]:
        """What this experiment lacks for Harbor (before anything runs)."""
        problems: list[Problem] = []
        assert isinstance(config, HarborExecutorConfig)
        for i, task in enumerate(experiment.spec.tasks):
            unknown = sorted(set(task.config) - TASK_CONFIG_KEYS)
            if unknown:
                problems.append(
                    Problem(
                        f"spec.tasks[{i}].config",
                        f"unknown key(s) {', '.join(unknown)} for executor.kind harbor; a task "
                        "config is {path: <Harbor task folder>} or {name: <org/task>, ref: ...}",
                    )
                )
            if "path" in task.config and "name" in task.config:
                problems.append(
                    Problem(
                        f"spec.tasks[{i}].config",
                        "give either `path` (a Harbor task folder) or `name` (a dataset task), "
                        "not both",
                    )
                )
        return problems

    # -- prerequisites --------------------------------------------------------------
    def prerequisites(
        self, config: Any, experiment: Experiment, host_env: Mapping[str, str]
    ) -> Sequence[Prerequisite]:
        """Harbor's interpreter (by MAKA_EVAL_HARBOR_PYTHON, with the expected and the
        found Harbor version) and Harbor's verdict on the environment config."""
        assert isinstance(config, HarborExecutorConfig)
        expected = f"harbor {HARBOR_VERSION}.*"
        ready: list[Prerequisite] = []
        for i, subject in enumerate(experiment.spec.subjects):
            if isinstance(subject, MakaSubject) and config.runtime_host is None:
                ready.append(
                    Prerequisite(
                        f"{CONFIG_PATH}.runtimeHost",
                        False,
                        f"subject '{subject.id}' (spec.subjects[{i}]) has kind 'maka', which "
                        "runs through the Runtime Host inside the task environment",
                        "set executor.config.runtimeHost.command",
                    )
                )
        return ready + list(self._harbor(config, experiment, host_env, expected))

    def _harbor(
        self,
        config: HarborExecutorConfig,
        experiment: Experiment,
        host_env: Mapping[str, str],
        expected: str,
    ) -> Sequence[Prerequisite]:
        python = host_env.get(PYTHON_ENV, "").strip()
        if not python:
            return [Prerequisite(PYTHON_ENV, False, f"not set (expected {expected})", INSTALL_FIX)]
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            return [
                Prerequisite(
                    PYTHON_ENV,
                    False,
                    f"{python} is not an executable file (expected {expected})",
                    INSTALL_FIX,
                )
            ]
        environment = harbor_environment(config)
        withheld = _declared_credentials(experiment)
        env = tuple(sorted((k, v) for k, v in host_env.items() if k not in withheld))
        try:
            answer = _probe_cached(
                python, os.stat(python).st_mtime, json.dumps(environment, sort_keys=True), env
            )
        except (WorkerError, OSError, subprocess.SubprocessError, ValueError) as exc:
            return [Prerequisite(PYTHON_ENV, False, f"{python}: {exc}", INSTALL_FIX)]
        found = str(answer.get("harborVersion") or "")
        if found != HARBOR_VERSION and not found.startswith(HARBOR_VERSION + "."):
            return [
                Prerequisite(
                    PYTHON_ENV,
                    False,
                    f"{python} has harbor {found or '(not installed)'}; expected {expected}",
                    INSTALL_FIX,
                )
            ]
        out = [
            Prerequisite(
                PYTHON_ENV,
                True,
                f"{python}: harbor {found} (expected {expected}), Python {answer.get('python')}",
            )
        ]
        harbor_problems = [str(p) for p in answer.get("problems") or []]
        where = f"{CONFIG_PATH}.environment"
        if harbor_problems:
            out.append(
                Prerequisite(
                    where,
                    False,
                    "Harbor refuses it: "
                    + " | ".join(" ".join(p.split()) for p in harbor_problems)[:900],
                    "fix the environment type or its options (Harbor's own names)",
                )
            )
        else:
            kind = environment.get("type") or environment.get("import_path")
            out.append(Prerequisite(where, True, f"Harbor accepts environment {kind}"))
        return out

    # -- prepare ----------------------------------------------------------------------
    def prepare(self, context: RunContext) -> None:
        """Start this run's Harbor worker (Harbor's interpreter, the bridge staged)."""
        config = context.config
        assert isinstance(config, HarborExecutorConfig)
        python = context.host_env.get(PYTHON_ENV, "").strip()
        if not python:
            raise PrerequisiteError(f"{PYTHON_ENV} is not set", [Problem(PYTHON_ENV, INSTALL_FIX)])
        self._forget_finished()
        root = context.work_dir / "harbor"
        stage = stage_bridge(root / "bridge")
        trials_dir = root / "trials"
        trials_dir.mkdir(parents=True, exist_ok=True)
        env = harbor_environment_variables(
            python, stage, context.host_env, _declared_credentials(context.experiment)
        )
        log = root / "worker.log"
        try:
            worker = TrialWorker(python, stage, env, log)
        except (WorkerError, OSError) as exc:
            raise PrerequisiteError(
                "Harbor's worker could not be started; nothing was started:",
                [Problem(PYTHON_ENV, f"{python}: {exc}")],
            ) from exc
        with self._lock:
            self._runs[context.run_id] = _Run(
                context, config, python, env, stage, trials_dir, log, worker, threading.Lock()
            )

    def _forget_finished(self) -> None:
        """Stop the workers of runs that are over (their scratch folder is gone)."""
        with self._lock:
            done = [k for k, r in self._runs.items() if not r.stage.is_dir() or not r.worker.alive]
            runs = [self._runs.pop(k) for k in done]
        for run in runs:
            run.worker.stop()

    def _worker(self, run: _Run) -> TrialWorker:
        with run.lock:
            if not run.worker.alive:  # it died: one more, for the attempts still to come
                run.worker = TrialWorker(run.python, run.stage, run.env, run.log)
            return run.worker

    # -- one attempt ------------------------------------------------------------------
    def run_attempt(self, request: AttemptRequest) -> ResultKernel:
        """One Harbor trial for this attempt; its result classified by the engine."""
        with self._lock:
            run = self._runs.get(request.attempt.run_id)
        if run is None:
            raise RuntimeError("the harbor executor was not prepared for this run")
        launch = self._launch(request.subject, request.launch, run.config)
        private = request.work_dir / "relay"
        private.mkdir(parents=True, exist_ok=True, mode=0o700)
        plan_path = private / "plan.json"
        plan = self._write_plan(plan_path, request, launch, run, private)
        name = _trial_name(request)
        trial_config = {
            "task": self._task_config(request, run),
            "trial_name": name,
            "trials_dir": str(run.trials_dir),
            "agent": {
                "import_path": RELAY_AGENT,
                "override_timeout_sec": plan.agent_timeout_sec,
                "kwargs": {"plan": str(plan_path)},
            },
            "environment": harbor_environment(run.config),
            "verifier": {"override_timeout_sec": plan.verifier_timeout_sec},
        }
        cancelled = threading.Event()
        request.cancel.on_cancel(cancelled.set)
        done = self._worker(run).run_trial(
            request.attempt.attempt_id,
            trial_config,
            request.start_gate,
            cancelled,
            request.deadline,
        )
        plan_path.unlink(missing_ok=True)  # if the agent never ran, it still holds secrets
        return trial_kernel(
            done.trial_dir,
            contract=plan.subject.contract,
            score_key=plan.score_key,
            agent_timeout_sec=plan.agent_timeout_sec,
            artifacts_dir=request.artifacts_dir,
            redactor=Redactor.of(dict(request.credentials)),
            error=done.error,
            cancelled=done.cancelled or cancelled.is_set(),
        )

    @staticmethod
    def _launch(
        subject: Subject, launch: SubjectLaunch | None, config: HarborExecutorConfig
    ) -> SubjectLaunch | None:
        if isinstance(subject, MakaSubject) and config.runtime_host is not None:
            host = config.runtime_host
            return subject_launch(subject, program=host.command, runtime_host_args=host.args)
        return launch

    @staticmethod
    def _task_config(request: AttemptRequest, run: _Run) -> dict[str, Any]:
        folder = task_folder(request, run.context.base_dir)
        if folder is not None:
            return {"path": str(folder)}
        given = request.task.config
        return {k: given[k] for k in ("name", "ref") if k in given}

    @staticmethod
    def _write_plan(
        path: Path,
        request: AttemptRequest,
        launch: SubjectLaunch | None,
        run: _Run,
        private: Path,
    ) -> AttemptPlan:
        """The relay Agent's plan file: the attempt plan every executor makes
        (`plan_attempt`), and beside it what only this attempt's bridge may know (the
        credentials' values, which an AttemptPlan never holds). Mode 0600, in the
        attempt's private folder; the agent deletes it once read."""
        plan, upload = harbor_plan(
            request, launch, run.context.experiment, run.context.base_dir, private
        )
        folder = task_folder(request, run.context.base_dir)
        PlanFile(
            plan=plan,
            kind=request.subject.kind,
            credentials=request.credentials,
            upload=upload,
            instruction=request.task.instruction,
            task_dir=str(folder) if folder is not None else None,
        ).write(path)
        return plan


def task_folder(request: AttemptRequest, base_dir: Path) -> Path | None:
    """The task's folder on this machine (None: a dataset task Harbor fetches itself)."""
    if request.task.directory is not None:
        return request.task.directory
    given = request.task.config.get("path")
    if given is None:
        return None
    path = Path(str(given))
    return path if path.is_absolute() else base_dir / path


def harbor_plan(
    request: AttemptRequest,
    launch: SubjectLaunch | None,
    experiment: Experiment,
    base_dir: Path,
    root: Path,
) -> tuple[AttemptPlan, str | None]:
    """The attempt's plan, as every executor makes it (`plan_attempt`, the task's own
    settings applied when the task is on this machine), and the host file of the
    subject's program to upload into the environment (None: the image's own command).

    `launch` is the subject's (`HarborExecutor._launch`); `root` is the attempt's
    private folder the bridge works in. PlanError when the task cannot run as planned.
    """
    cell, subject = request.cell, request.subject
    folder = task_folder(request, base_dir)
    task: TaskDefinition | None = None
    if folder is not None:
        task, problems = load_task(
            cell.task_id,
            folder,
            f"task {cell.task_id}",
            request.host_env,
            phase_networks=False,  # Harbor runs each phase's network itself
            withheld=frozenset(_declared_credentials(experiment)),
        )
        if task is None:
            raise PlanError("; ".join(f"{p.where}: {p.message}" for p in problems))
    upload: str | None = None
    if isinstance(subject, OracleSubject):
        # Harbor's own oracle agent runs solve.sh; the plan says where it is, as the
        # other executors' plans do.
        if folder is None:
            raise PlanError(
                f"the oracle runs the task's solution/solve.sh, but task {cell.task_id} is "
                "a Harbor dataset task with no folder on this machine; give it by `path`"
            )
        launch = subject_launch(
            subject,
            solution_dir=str(folder / SOLUTION_DIR_NAME),
            solution_script=str(root / SOLUTION_DIR_NAME / "solve.sh"),
            solution_env={},  # the task's own, applied with its other settings
        )
    elif launch is None:
        raise PlanError(f"subject '{subject.id}' has no launch (executor.config.runtimeHost?)")
    elif subject.kind in ("external", "maka") and "/" in launch.argv[0]:
        # A program named by a path is a file of this machine, uploaded to /maka/bin/.
        program = Path(launch.argv[0])
        program = program if program.is_absolute() else base_dir / program
        if not program.is_file():
            raise FileNotFoundError(f"the subject's program {program} is not a file")
        upload = str(program.resolve())
        launch = replace(launch, argv=(upload, *launch.argv[1:]))
    config = experiment.spec.executor_egress
    plan = plan_attempt(
        experiment,
        cell,
        run_id=request.attempt.run_id,
        attempt_id=request.attempt.attempt_id,
        root=str(root),
        artifacts_dir=str(request.artifacts_dir),
        subject=launch,
        # Harbor's environment is the sandbox (recorded as 'container' by
        # harbor.results); maka-eval's own sandbox is not used.
        isolation=Isolation.AUTO,
        task=task,
        task_dir=str(folder) if folder is not None else None,
        spec_egress=EgressMode(config.mode) if config is not None else None,
    )
    return plan, upload


def _trial_name(request: AttemptRequest) -> str:
    """Harbor's trial (and compose project) name: the cell, the attempt, the run."""
    cell = request.cell
    raw = f"{cell.task_id}__{cell.repetition}__{cell.subject_id}__{request.attempt.number}"
    safe = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_") or "trial"
    run = re.sub(r"[^a-z0-9]+", "", request.attempt.run_id.lower())[-8:]
    return f"{safe[:80]}__{run}"


PLUGIN = HarborExecutor()
"""The object the `maka_eval.executors` entry point `harbor` loads."""
