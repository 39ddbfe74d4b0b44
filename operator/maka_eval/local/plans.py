"""Cell -> relay plan: one attempt of one cell, laid out on this machine."""

from __future__ import annotations

from pathlib import Path

from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SOLUTION_DIR_NAME, subject_launch
from maka_eval.local.prerequisites import ResolvedCommands
from maka_eval.relay.plan import AttemptPlan
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.task_directory import TaskDefinition


def attempt_plan(
    *,
    experiment: Experiment,
    cell: Cell,
    task: TaskDefinition,
    commands: ResolvedCommands,
    run_id: str,
    attempt_id: str,
    attempt_root: Path,
    artifacts_dir: Path,
    hidden: tuple[str, ...] = (),
) -> AttemptPlan:
    """The relay plan for one attempt of `cell`."""
    spec = experiment.spec
    subject = experiment.subject(cell.subject_id)
    defaults = spec.execution.default_timeouts
    host = spec.executor.config.runtime_host
    program = commands.subjects.get(subject.id)
    launch = subject_launch(
        subject,
        program=str(program) if program is not None else None,
        runtime_host_args=host.args if host is not None else (),
        solution_dir=str(task.solution_dir) if task.solution_dir else None,
        solution_script=str(attempt_root / SOLUTION_DIR_NAME / "solve.sh"),
        solution_env=task.solution_env,
    )
    return AttemptPlan(
        attempt_id=attempt_id,
        run_id=run_id,
        cell_id=cell.id,
        task_id=cell.task_id,
        repetition=cell.repetition,
        subject_id=cell.subject_id,
        root=str(attempt_root),
        artifacts_dir=str(artifacts_dir),
        instruction_file=str(task.instruction_file),
        tests_dir=str(task.tests_dir),
        environment_dir=str(task.environment_dir) if task.environment_dir else None,
        subject=launch,
        agent_timeout_sec=task.agent_timeout_sec or defaults.agent_sec,
        verifier_timeout_sec=task.verifier_timeout_sec or defaults.verifier_sec,
        verifier_env=dict(task.verifier_env),
        score_key=spec.verifier.config.score_key,
        redact=tuple(dict.fromkeys(c for s in spec.subjects for c in s.credentials)),
        output_limit_bytes=spec.execution.max_output_bytes,
        isolation=commands.isolation,
        hidden=hidden,
        # The subject's own program stays visible, wherever it lives.
        visible=(str(Path(launch.argv[0]).parent),) if "/" in launch.argv[0] else (),
    )
