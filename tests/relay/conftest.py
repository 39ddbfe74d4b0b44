"""Running real relay attempts against small task directories."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import SubjectLaunch
from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
from maka_eval.relay.attempt import run_attempt
from maka_eval.relay.outcome import AttemptOutcome
from maka_eval.relay.plan import AttemptPlan
from tests.helpers import REWARD_IF_DONE, make_task

_counter = itertools.count()


@pytest.fixture
def supervisor() -> ProcessSupervisor:
    return ProcessSupervisor()


@pytest.fixture
def plan_for(tmp_path) -> Callable[..., AttemptPlan]:
    def build(
        argv: list[str],
        *,
        contract: ResultContract = ResultContract.EXIT_CODE,
        test_sh: str = REWARD_IF_DONE,
        timeout: float = 20.0,
        verifier_timeout: float = 20.0,
        env: Mapping[str, str] | None = None,
        credentials: Mapping[str, str] | None = None,
        files: dict[str, str] | None = None,
        redact: tuple[str, ...] = (),
        output_limit: int = 1 << 20,
    ) -> AttemptPlan:
        n = next(_counter)
        task = make_task(tmp_path / "tasks", f"t{n}", test_sh=test_sh, files=files)
        return AttemptPlan(
            attempt_id=f"test-run/t{n}::1::s/1",
            run_id="test-run",
            cell_id=f"t{n}::1::s",
            task_id=f"t{n}",
            repetition=1,
            subject_id="s",
            root=str(tmp_path / "attempts" / str(n)),
            artifacts_dir=str(tmp_path / "artifacts" / str(n)),
            instruction_file=str(task / "instruction.md"),
            tests_dir=str(task / "tests"),
            environment_dir=str(task / "environment") if files else None,
            subject=SubjectLaunch(
                argv=tuple(argv),
                contract=contract,
                env=dict(env or {}),
                credentials=dict(credentials or {}),
            ),
            agent_timeout_sec=timeout,
            verifier_timeout_sec=verifier_timeout,
            redact=redact or tuple((credentials or {}).values()),
            output_limit_bytes=output_limit,
        )

    return build


@pytest.fixture
def run(supervisor) -> Callable[..., AttemptOutcome]:
    def go(
        plan: AttemptPlan,
        *,
        host_env: Mapping[str, str] | None = None,
        cancel: CancelToken | None = None,
        **kw,
    ) -> AttemptOutcome:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin"} if host_env is None else host_env
        return run_attempt(plan, supervisor, cancel or CancelToken(), env, **kw)

    return go


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def artifact_file(plan: AttemptPlan, outcome: AttemptOutcome, name: str) -> Path:
    """The stored artifact `name` (it must be listed in the kernel)."""
    assert name in {a.name for a in outcome.kernel.artifacts}, name
    return Path(plan.artifacts_dir) / name


def artifact(plan: AttemptPlan, outcome: AttemptOutcome, name: str) -> str:
    return artifact_file(plan, outcome, name).read_text()
