"""Cell -> relay plan: how each subject kind is launched for one attempt."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.expand import Cell
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.relay.plan import AttemptPlan, SubjectLaunch
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.subjects import ExternalSubject, MakaSubject, OracleSubject, Subject
from maka_eval.spec.task_directory import TaskDefinition


def credential_targets(declared: tuple[str, ...], bindings: Mapping[str, str]) -> dict[str, str]:
    """target variable -> source credential; unbound credentials keep their own name."""
    targets = dict(bindings)
    bound = set(bindings.values())
    for name in declared:
        if name not in bound:
            targets[name] = name
    return targets


def subject_launch(
    subject: Subject,
    task: TaskDefinition,
    experiment: Experiment,
    commands: ResolvedCommands,
    attempt_root: Path,
) -> SubjectLaunch:
    """How to start this subject on this task."""
    if isinstance(subject, ExternalSubject):
        config = subject.config
        return SubjectLaunch(
            argv=(str(commands.subjects[subject.id]), *config.args),
            contract=ResultContract(config.result_contract),
            env=dict(config.env),
            credentials=credential_targets(subject.credentials, config.credential_bindings),
        )
    if isinstance(subject, MakaSubject):
        host = experiment.spec.executor.config.runtime_host
        assert host is not None and commands.runtime_host is not None
        model = ("--model", subject.config.model) if subject.config.model else ()
        return SubjectLaunch(
            argv=(
                str(commands.runtime_host),
                *host.args,
                "--session-profile",
                subject.config.profile,
                *model,
                *subject.config.args,
            ),
            contract=ResultContract.PROTOCOL_V1,
            credentials=credential_targets(subject.credentials, {}),
        )
    assert isinstance(subject, OracleSubject) and task.solution_dir is not None
    return SubjectLaunch(
        argv=(str(attempt_root / "solution" / "solve.sh"),),
        contract=ResultContract.EXIT_CODE,
        env=dict(task.solution_env),
        credentials=credential_targets(subject.credentials, {}),
        extra_dirs={"solution": str(task.solution_dir)},
    )


def attempt_plan(
    *,
    experiment: Experiment,
    cell: Cell,
    task: TaskDefinition,
    commands: ResolvedCommands,
    run_id: str,
    attempt_id: str,
    attempt_root: Path,
) -> AttemptPlan:
    """The relay plan for one attempt of `cell`."""
    spec = experiment.spec
    subject = experiment.subject(cell.subject_id)
    defaults = spec.execution.default_timeouts
    return AttemptPlan(
        attempt_id=attempt_id,
        run_id=run_id,
        cell_id=cell.id,
        task_id=cell.task_id,
        repetition=cell.repetition,
        subject_id=cell.subject_id,
        root=str(attempt_root),
        instruction_file=str(task.instruction_file),
        tests_dir=str(task.tests_dir),
        environment_dir=str(task.environment_dir) if task.environment_dir else None,
        subject=subject_launch(subject, task, experiment, commands, attempt_root),
        agent_timeout_sec=task.agent_timeout_sec or defaults.agent_sec,
        verifier_timeout_sec=task.verifier_timeout_sec or defaults.verifier_sec,
        verifier_env=dict(task.verifier_env),
        score_key=spec.verifier.config.score_key,
    )
