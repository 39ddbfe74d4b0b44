"""A task's effective settings: its task.toml over the experiment's defaults.

One pure function for every executor: the local executor applies it when it plans an
attempt, and the relay inside a Pod applies the same function to the task it finds in
the benchmark image (the operator cannot see the task). Standard library only: the
relay bundle carries this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from maka_eval.engine.environment import Healthcheck, TaskArtifact
from maka_eval.engine.modes import NetworkMode


class StepDefinition(Protocol):
    """What the settings read of one task.toml `[[steps]]` entry (spec.task_directory's
    TaskStep): the engine sits below the spec and takes its values, not its types."""

    @property
    def name(self) -> str: ...
    @property
    def instruction_file(self) -> Path: ...
    @property
    def tests_dirs(self) -> Sequence[Path]: ...
    @property
    def workdir_dir(self) -> Path | None: ...
    @property
    def solution_dir(self) -> Path | None: ...
    @property
    def agent_timeout_sec(self) -> float | None: ...
    @property
    def verifier_timeout_sec(self) -> float | None: ...
    @property
    def agent_user(self) -> str | None: ...
    @property
    def verifier_user(self) -> str | None: ...
    @property
    def verifier_env(self) -> Mapping[str, str]: ...
    @property
    def min_reward(self) -> float | Mapping[str, float] | None: ...
    @property
    def healthcheck(self) -> Healthcheck | None: ...
    @property
    def artifacts(self) -> tuple[TaskArtifact, ...]: ...


class TaskDefinition(Protocol):
    """What the settings read of a task's directory (spec.task_directory's
    TaskDefinition)."""

    @property
    def instruction_file(self) -> Path: ...
    @property
    def tests_dir(self) -> Path: ...
    @property
    def environment_dir(self) -> Path | None: ...
    @property
    def image_build_file(self) -> str | None: ...
    @property
    def solution_dir(self) -> Path | None: ...
    @property
    def agent_timeout_sec(self) -> float | None: ...
    @property
    def verifier_timeout_sec(self) -> float | None: ...
    @property
    def verifier_env(self) -> Mapping[str, str]: ...
    @property
    def solution_env(self) -> Mapping[str, str]: ...
    @property
    def steps(self) -> Sequence[StepDefinition]: ...
    @property
    def step_reward_strategy(self) -> str: ...
    @property
    def healthcheck(self) -> Healthcheck | None: ...
    @property
    def artifacts(self) -> tuple[TaskArtifact, ...]: ...
    @property
    def network_mode(self) -> NetworkMode: ...


@dataclass(frozen=True)
class StepPlan:
    """One step of a multi-step task (task.toml `[[steps]]`), its settings resolved:
    the relay runs the steps in order in the same sandbox (relay.steps)."""

    name: str
    instruction_file: str
    tests_dirs: tuple[str, ...]
    """Copied into /tests in this order (the task's tests/, then the step's)."""
    agent_timeout_sec: float
    verifier_timeout_sec: float
    workdir_dir: str | None = None
    """Uploaded into the workdir before the step; its setup.sh then runs with bash."""
    solution_dir: str | None = None
    """The oracle's solution for this step."""
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    agent_user: str | None = None
    verifier_user: str | None = None
    min_reward: float | Mapping[str, float] | None = None
    healthcheck: Healthcheck | None = None
    """Run after the step's setup.sh, before its subject."""
    artifacts: tuple[TaskArtifact, ...] = ()
    """Collected after the step's subject (with the task's own), before its verifier."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepPlan:
        values = dict(data)
        values["tests_dirs"] = tuple(values.get("tests_dirs", ()))
        values["healthcheck"] = Healthcheck.from_dict(values.get("healthcheck"))
        values["artifacts"] = TaskArtifact.from_dicts(values.get("artifacts", ()))
        return cls(**values)


def step_plans(
    task: TaskDefinition, agent_timeout_sec: float, verifier_timeout_sec: float
) -> tuple[StepPlan, ...]:
    """The steps of `task`, each falling back to the task's timeouts (already resolved)."""
    return tuple(
        StepPlan(
            name=step.name,
            instruction_file=str(step.instruction_file),
            tests_dirs=tuple(str(d) for d in step.tests_dirs),
            agent_timeout_sec=step.agent_timeout_sec or agent_timeout_sec,
            verifier_timeout_sec=step.verifier_timeout_sec or verifier_timeout_sec,
            workdir_dir=str(step.workdir_dir) if step.workdir_dir is not None else None,
            solution_dir=str(step.solution_dir) if step.solution_dir is not None else None,
            verifier_env=dict(step.verifier_env),
            agent_user=step.agent_user,
            verifier_user=step.verifier_user,
            min_reward=(
                dict(step.min_reward) if isinstance(step.min_reward, Mapping) else step.min_reward
            ),
            healthcheck=step.healthcheck,
            artifacts=step.artifacts,
        )
        for step in task.steps
    )


@dataclass(frozen=True)
class TaskSettings:
    """What an attempt of a task runs with, task.toml over the experiment's defaults."""

    agent_timeout_sec: float
    verifier_timeout_sec: float
    instruction_file: str
    tests_dir: str
    environment_dir: str | None
    """environment/, when the attempt uploads it (None: absent, or built into the image)."""
    verifier_env: Mapping[str, str]
    solution_dir: str | None
    solution_env: Mapping[str, str]
    steps: tuple[StepPlan, ...]
    step_reward_strategy: str
    healthcheck: Healthcheck | None
    artifacts: tuple[TaskArtifact, ...]
    network_mode: NetworkMode


def task_settings(
    task: TaskDefinition,
    agent_default_sec: float,
    verifier_default_sec: float,
    *,
    image_built: bool = False,
) -> TaskSettings:
    """`task`'s settings over the experiment's default timeouts; `image_built`: the
    attempt runs in the image environment/ built (its files are in it, as under Harbor,
    so they are not uploaded again)."""
    agent = task.agent_timeout_sec or agent_default_sec
    verifier = task.verifier_timeout_sec or verifier_default_sec
    uploads_environment = task.environment_dir is not None and not (
        image_built and task.image_build_file
    )
    return TaskSettings(
        agent_timeout_sec=agent,
        verifier_timeout_sec=verifier,
        instruction_file=str(task.instruction_file),
        tests_dir=str(task.tests_dir),
        environment_dir=str(task.environment_dir) if uploads_environment else None,
        verifier_env=dict(task.verifier_env),
        solution_dir=str(task.solution_dir) if task.solution_dir is not None else None,
        solution_env=dict(task.solution_env),
        steps=step_plans(task, agent, verifier),
        step_reward_strategy=task.step_reward_strategy,
        healthcheck=task.healthcheck,
        artifacts=task.artifacts,
        network_mode=NetworkMode(task.network_mode),
    )
