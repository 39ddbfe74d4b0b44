"""Run a multi-step task (task.toml `[[steps]]`) in one attempt's sandbox: for each step
its instruction, solution and workdir files, setup.sh and healthcheck, its subject, its
artifacts and its verifier; between steps the verifier's logs kept with the step and the
sandbox told (`Sandbox.next_step`). relay.steps has the rules between the steps and how
their outcomes make the attempt's evidence; this module drives the attempt
(relay.attempt) through its public methods. Standard library and engine only: the relay
bundle runs it.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from maka_eval.engine.classify import Execution, ExecutionEnd, Verification
from maka_eval.engine.launch import SOLUTION_DIR_NAME
from maka_eval.engine.task_settings import StepPlan
from maka_eval.processes.supervisor import WaitEnd
from maka_eval.relay import steps
from maka_eval.relay.steps import StepOutcome
from maka_eval.sandbox.base import Phase

if TYPE_CHECKING:  # the attempt calls this module: its type only, for the checker
    from maka_eval.relay.attempt import Attempt


def run_steps(attempt: Attempt) -> tuple[Execution, Verification]:
    """Run the task's steps in order in the attempt's one sandbox (relay.steps has the
    rules); the attempt's execution and verification over them. Each step's timings
    (`step.<name>.<phase>`) go into `attempt.timings` as it ends, its rewards into
    `attempt.step_metrics` once the steps are over."""
    plan = attempt.plan
    outcomes: list[StepOutcome] = []
    for index, step in enumerate(plan.steps):
        try:
            if index:
                _between_steps(attempt, plan.steps[index - 1])
            outcome = _run_step(attempt, step)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise
            error = f"{type(exc).__name__}: {exc}"
            outcome = StepOutcome(step.name, Execution(ExecutionEnd.THREW, error=error))
        outcomes.append(outcome)
        attempt.timings.update({f"step.{step.name}.{k}": v for k, v in outcome.timings.items()})
        why = steps.stop_reason(outcome, step.min_reward)
        rest = [s.name for s in plan.steps[index + 1 :]]
        if why is not None and rest:
            attempt.notes.append(
                f"step {step.name}: {why}; the remaining steps did not run ({', '.join(rest)})"
            )
        if why is not None:
            break
    attempt.step_metrics = steps.step_metrics(outcomes)
    return (
        steps.aggregate_execution(outcomes),
        steps.aggregate_verification(outcomes, plan.step_reward_strategy, plan.score_key),
    )


def subject_seconds(timings: Mapping[str, float]) -> float:
    """The subject phase of a multi-step attempt: the steps interleave the phases, so it
    is the sum of the steps' setup and subject times (`timings` as run_steps left them)."""
    return sum(v for k, v in timings.items() if k.endswith((".subjectSec", ".setupSec")))


def _run_step(attempt: Attempt, step: StepPlan) -> StepOutcome:
    """One step: its files and setup, its subject, its verifier."""
    t0 = time.perf_counter()
    attempt.layout.step_dir(step.name).mkdir(parents=True, exist_ok=True)
    if attempt.cancel.is_set():
        return StepOutcome(step.name, Execution(ExecutionEnd.CANCELLED))
    failed = _prepare_step(attempt, step)
    t1 = time.perf_counter()
    timings = {"setupSec": t1 - t0}
    if failed is not None:
        threw = Execution(ExecutionEnd.THREW, error=failed)
        return StepOutcome(step.name, threw, None, timings)
    execution = attempt.run_subject(
        step.agent_timeout_sec, step.agent_user, f"steps/{step.name}/subject"
    )
    if execution.end in (ExecutionEnd.EXITED, ExecutionEnd.TIMED_OUT):
        entries = (*attempt.plan.artifacts, *step.artifacts)
        attempt.collect_artifacts(entries, attempt.layout.step_dir(step.name) / "artifacts")
    t2 = time.perf_counter()
    timings["subjectSec"] = t2 - t1
    verification: Verification | None = None
    if execution.end in (ExecutionEnd.EXITED, ExecutionEnd.TIMED_OUT):
        # The task's tests/ overlaid by the step's, with the step's timeout, env and user.
        verification = attempt.verify(
            step.tests_dirs,
            timeout_sec=step.verifier_timeout_sec,
            env=step.verifier_env,
            user=step.verifier_user,
            output=f"steps/{step.name}/verifier",
        )
        if verification is None:
            execution = Execution(ExecutionEnd.CANCELLED)
    timings["verifierSec"] = time.perf_counter() - t2
    return StepOutcome(step.name, execution, verification, timings)


def _prepare_step(attempt: Attempt, step: StepPlan) -> str | None:
    """The step's instruction, the oracle's solution for it, its workdir files and
    setup.sh (with bash, as the subject's user); why the step cannot run, or None."""
    layout = attempt.layout
    subject = functools.partial(attempt.inside, Phase.SUBJECT)
    shutil.copyfile(step.instruction_file, layout.instruction)  # in place: it is shown
    attempt.sandbox.upload(str(layout.instruction), subject(layout.instruction))
    if SOLUTION_DIR_NAME in attempt.plan.subject.extra_dirs and step.solution_dir is not None:
        attempt.refill_subject_dir(SOLUTION_DIR_NAME, step.solution_dir)
    if step.workdir_dir is not None:
        workdir = subject(layout.workspace)
        try:
            attempt.sandbox.upload(step.workdir_dir, workdir, user=step.agent_user)
        except OSError as exc:
            return f"its workdir files could not be uploaded: {exc.strerror or exc}"
        if os.path.isfile(os.path.join(step.workdir_dir, "setup.sh")):
            failed = _run_setup(attempt, step, f"{workdir.rstrip('/')}/setup.sh")
            if failed is not None:
                return failed
    if step.healthcheck is not None:
        folder = layout.step_dir(step.name)
        return attempt.healthy(step.healthcheck, "its healthcheck", step.agent_user, folder)
    return None


def _run_setup(attempt: Attempt, step: StepPlan, script: str) -> str | None:
    """`bash <workdir>/setup.sh`, as Harbor runs it; why it failed, or None."""
    sandbox = attempt.sandbox
    env = {**attempt.base_env, **attempt.attempt_vars()}
    with open(attempt.layout.step_dir(step.name) / "setup.out", "w+b") as out:
        try:
            proc = sandbox.spawn(
                Phase.SUBJECT,
                ["bash", script],
                env=env,
                cwd=attempt.inside(Phase.SUBJECT, attempt.layout.workspace),
                stdout=out,
                stderr=out,
                user=step.agent_user,
            )
        except OSError as exc:
            return f"its setup.sh could not start: {exc.strerror or exc}"
        end = sandbox.wait(proc, step.agent_timeout_sec, attempt.cancel)
        if end is not WaitEnd.EXITED:
            sandbox.quiesce(Phase.SUBJECT, proc)
        code = sandbox.release(proc)
        if end is WaitEnd.CANCELLED:
            return "the run was cancelled during its setup.sh"
        if end is WaitEnd.TIMED_OUT:
            return f"its setup.sh timed out after {step.agent_timeout_sec:g}s"
        if code == 0:
            return None
        said = attempt.quote_output(out)
    return f"its setup.sh exited with code {code}: {said}"


def _between_steps(attempt: Attempt, previous: StepPlan) -> None:
    """The previous step's verifier logs are kept with the step; the next verifier
    starts from empty /tests and /logs/verifier, out of the subject's sight."""
    attempt.reset_verifier_files(keep_logs_in=attempt.layout.step_dir(previous.name) / "verifier")
    attempt.sandbox.next_step()
