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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maka_eval.artifacts import Redactor
from maka_eval.contract.kernel import ResultKernel
from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.errors import PrerequisiteError, Problem
from maka_eval.executors.base import (
    CONFIG_PATH,
    AttemptRequest,
    Prerequisite,
    RunContext,
)
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
from maka_eval.processes.table import RUN_MARKER
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.subjects import MakaSubject, Subject, subject_launch

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
    from maka_eval import strict_json

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
        experiment = run.context.experiment
        launch = self._launch(request.subject, request.launch, run.config)
        private = request.work_dir / "relay"
        private.mkdir(parents=True, exist_ok=True, mode=0o700)
        plan_path = private / "plan.json"
        self._write_plan(plan_path, request, launch, run, private)
        name = _trial_name(request)
        trial_config = {
            "task": self._task_config(request, run),
            "trial_name": name,
            "trials_dir": str(run.trials_dir),
            "agent": {
                "import_path": RELAY_AGENT,
                "override_timeout_sec": request.task.agent_timeout_sec,
                "kwargs": {"plan": str(plan_path)},
            },
            "environment": harbor_environment(run.config),
            "verifier": {"override_timeout_sec": request.task.verifier_timeout_sec},
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
        contract = launch.contract if launch is not None else ResultContract.EXIT_CODE
        return trial_kernel(
            done.trial_dir,
            contract=contract,
            score_key=experiment.spec.verifier.config.score_key,
            agent_timeout_sec=request.task.agent_timeout_sec,
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
        given = dict(request.task.config)
        if request.task.directory is not None:
            return {"path": str(request.task.directory)}
        if "path" in given:
            path = Path(str(given["path"]))
            return {"path": str(path if path.is_absolute() else run.context.base_dir / path)}
        return {k: given[k] for k in ("name", "ref") if k in given}

    @staticmethod
    def _write_plan(
        path: Path,
        request: AttemptRequest,
        launch: SubjectLaunch | None,
        run: _Run,
        private: Path,
    ) -> None:
        """The relay Agent's plan: the subject, and its credentials (mode 0600, in the
        attempt's private folder; the agent deletes it once read)."""
        cell = request.cell
        upload = None
        argv: list[str] = list(launch.argv) if launch is not None else []
        if request.subject.kind in ("external", "maka") and argv and "/" in argv[0]:
            program = Path(argv[0])
            program = program if program.is_absolute() else run.context.base_dir / program
            if not program.is_file():
                raise FileNotFoundError(f"the subject's program {program} is not a file")
            upload = str(program.resolve())
        task_dir = request.task.directory
        if task_dir is None and "path" in request.task.config:
            task_dir = Path(HarborExecutor._task_config(request, run)["path"])
        plan = {
            "attemptId": request.attempt.attempt_id,
            "kind": request.subject.kind,
            "argv": argv,
            "contract": launch.contract.value if launch is not None else "exit-code",
            "env": dict(launch.env) if launch is not None else {},
            "credentials": dict(request.credentials),
            "attemptEnv": {
                RUN_MARKER: request.attempt.run_id,
                "MAKA_EVAL_CELL_ID": cell.id,
                "MAKA_EVAL_TASK_ID": cell.task_id,
                "MAKA_EVAL_REPETITION": str(cell.repetition),
                "MAKA_EVAL_SUBJECT_ID": cell.subject_id,
            },
            "upload": upload,
            "instruction": request.task.instruction,
            "taskDir": str(task_dir) if task_dir is not None else None,
            "workDir": str(private),
            "outputLimit": run.context.experiment.spec.execution.max_output_bytes,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(plan, handle)


def _trial_name(request: AttemptRequest) -> str:
    """Harbor's trial (and compose project) name: the cell, the attempt, the run."""
    cell = request.cell
    raw = f"{cell.task_id}__{cell.repetition}__{cell.subject_id}__{request.attempt.number}"
    safe = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_") or "trial"
    run = re.sub(r"[^a-z0-9]+", "", request.attempt.run_id.lower())[-8:]
    return f"{safe[:80]}__{run}"


PLUGIN = HarborExecutor()
"""The object the `maka_eval.executors` entry point `harbor` loads."""
