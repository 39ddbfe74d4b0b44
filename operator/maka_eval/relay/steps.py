"""Multi-step tasks (task.toml `[[steps]]`): the rules Harbor 0.26 applies between steps
and how the steps' results make the attempt's evidence (trial/multi_step.py, trial.py).

- A step whose subject could not run, or whose verifier produced no reward, ends the
  attempt: the remaining steps do not run.
- `min_reward` ends it too when the step's rewards fall below it (a number gates
  `reward`; a table gates each of its keys; a missing key counts as -inf).
- The attempt's rewards are the steps' per-key means (`mean`, the default: over the
  steps that have rewards, a key a step lacks counting 0) or the last step's (`final`).

The aggregate then goes through the one set of status rules (engine.classify) as any
attempt's evidence does. Standard library and engine only: the relay bundle runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from maka_eval.engine.classify import Execution, ExecutionEnd, Verification


@dataclass(frozen=True)
class StepOutcome:
    """What one step of an attempt came to."""

    name: str
    execution: Execution
    verification: Verification | None = None
    """None: the verifier did not run."""
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def rewards(self) -> dict[str, float] | None:
        """The verifier's rewards, as Harbor keeps them (None: no verifier result)."""
        v = self.verification
        if v is None:
            return None
        if v.metrics:
            return dict(v.metrics)
        return {"reward": v.score} if v.score is not None else None


def min_reward_failure(
    rewards: Mapping[str, float] | None, min_reward: float | Mapping[str, float]
) -> str | None:
    """Why `rewards` do not meet `min_reward`, or None when they do."""
    thresholds = min_reward if isinstance(min_reward, Mapping) else {"reward": min_reward}
    for key, threshold in thresholds.items():
        actual = (rewards or {}).get(key, float("-inf"))
        if actual < threshold:
            return f"{key}={actual:g} is below min_reward {threshold:g}"
    return None


def stop_reason(outcome: StepOutcome, min_reward: float | Mapping[str, float] | None) -> str | None:
    """Why no further step may run after `outcome`, or None."""
    end = outcome.execution.end
    if end is ExecutionEnd.CANCELLED:
        return "the run was cancelled"
    if end is ExecutionEnd.THREW:
        return outcome.execution.error or "the step failed"
    if outcome.rewards is None:
        why = outcome.verification.error if outcome.verification is not None else None
        return f"its verifier produced no reward ({why or 'it did not run'})"
    if min_reward is not None:
        return min_reward_failure(outcome.rewards, min_reward)
    return None


def aggregate_rewards(outcomes: Sequence[StepOutcome], strategy: str) -> dict[str, float] | None:
    """The attempt's rewards under `strategy` ('mean' or 'final'); None when there are none."""
    if not outcomes:
        return None
    if strategy == "final":
        return outcomes[-1].rewards
    valid = [o.rewards for o in outcomes if o.rewards is not None]
    keys = sorted({key for rewards in valid for key in rewards})
    if not keys:
        return None
    return {key: sum(r.get(key, 0.0) for r in valid) / len(valid) for key in keys}


def aggregate_verification(
    outcomes: Sequence[StepOutcome], strategy: str, score_key: str
) -> Verification:
    """The attempt's verification: its rewards, and the score among them (`score_key`;
    the only reward when there is one), as a single-step reward.json is read."""
    rewards = aggregate_rewards(outcomes, strategy)
    if rewards is None:
        last = outcomes[-1] if outcomes else None
        why = last.verification.error if last and last.verification else None
        detail = f" ({why})" if why else ""
        if strategy == "final" and last is not None:
            return Verification(None, f"the last step ({last.name}) produced no reward{detail}")
        return Verification(None, f"no step's verifier produced a reward{detail}")
    if score_key in rewards:
        return Verification(rewards[score_key], metrics=rewards)
    if len(rewards) == 1:
        return Verification(next(iter(rewards.values())), metrics=rewards)
    keys = ", ".join(sorted(rewards))[:80]
    return Verification(
        None,
        f"the steps' rewards have no '{score_key}' key and several metrics (keys: {keys}); "
        "set verifier.config.scoreKey to the one that is the score",
        metrics=rewards,
    )


def aggregate_execution(outcomes: Sequence[StepOutcome]) -> Execution:
    """How the attempt's subject ended, over its steps: cancelled or failed to run if any
    step was, cut off by a timeout if any step was, else the first non-zero exit."""
    if not outcomes:
        return Execution(ExecutionEnd.THREW, error="the task has no steps")
    for end in (ExecutionEnd.CANCELLED, ExecutionEnd.THREW, ExecutionEnd.TIMED_OUT):
        found = next((o for o in outcomes if o.execution.end is end), None)
        if found is not None:
            e = found.execution
            if end is ExecutionEnd.THREW:
                return Execution(end, error=f"step {found.name!r}: {e.error or 'failed'}")
            return e
    failed = next((o for o in outcomes if o.execution.exit_code not in (0, None)), None)
    return failed.execution if failed is not None else outcomes[-1].execution


def step_metrics(outcomes: Sequence[StepOutcome]) -> dict[str, float]:
    """Each step's rewards as metrics named `step.<name>.<key>`."""
    return {
        f"step.{o.name}.{key}": value
        for o in outcomes
        if o.rewards is not None
        for key, value in o.rewards.items()
    }
