"""Cell -> AttemptPlan: the one builder every executor calls.

The local executor and the kubernetes renderer pass what is theirs (where the attempt's
folders are, how the subject's program is found, the sandbox and the network they made)
and get the same plan from the same spec settings. The task's own settings are applied
by `relay.plan.with_task`, here when the executor can read the task, else by the relay
inside the Pod from `task_dir` (`relay.plan.with_task_dir`): the same function either
way. A new spec field is read here and used where it acts.
"""

from __future__ import annotations

from maka_eval.engine.expand import Cell
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.engine.modes import EgressMode, Isolation
from maka_eval.relay.plan import AttemptPlan, EgressPlan, MeteringPlan, with_task
from maka_eval.sandbox.plans import ContainerPlan
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.task_directory import TaskDefinition


def plan_attempt(
    experiment: Experiment,
    cell: Cell,
    *,
    run_id: str,
    attempt_id: str,
    root: str,
    artifacts_dir: str,
    subject: SubjectLaunch,
    isolation: Isolation,
    task: TaskDefinition | None,
    task_dir: str | None,
    spec_egress: EgressMode | None = None,
    hidden: tuple[str, ...] = (),
    visible: tuple[str, ...] = (),
    in_task_image: bool = False,
    container: ContainerPlan | None = None,
    egress: EgressPlan | None = None,
    metering: MeteringPlan | None = None,
) -> AttemptPlan:
    """The relay plan for one attempt of `cell`. `task` is the task as read by the
    executor (None: only the relay can read it, from `task_dir`; both None: a task
    that is not on this machine, which Harbor fetches and applies itself, so the plan
    names no task file); `spec_egress` is executor.config.egress's mode, `egress` the
    policed network made for the cell."""
    spec = experiment.spec
    defaults = spec.execution.default_timeouts
    plan = AttemptPlan(
        attempt_id=attempt_id,
        run_id=run_id,
        cell_id=cell.id,
        task_id=cell.task_id,
        repetition=cell.repetition,
        subject_id=cell.subject_id,
        root=root,
        artifacts_dir=artifacts_dir,
        # Until the task's own settings are applied: where a task keeps them.
        instruction_file=f"{task_dir}/instruction.md" if task_dir is not None else "",
        tests_dir=f"{task_dir}/tests" if task_dir is not None else "",
        environment_dir=None,
        subject=subject,
        agent_timeout_sec=defaults.agent_sec,
        verifier_timeout_sec=defaults.verifier_sec,
        score_key=spec.verifier.config.score_key,
        redact=tuple(dict.fromkeys(c for s in spec.subjects for c in s.credentials)),
        output_limit_bytes=spec.execution.max_output_bytes,
        max_artifact_files=spec.execution.max_artifact_files,
        isolation=isolation,
        hidden=hidden,
        visible=visible,
        in_task_image=in_task_image,
        task_dir=task_dir,
        container=container,
        egress=egress,
        metering=metering,
    )
    return plan if task is None else with_task(plan, task, spec_egress)
