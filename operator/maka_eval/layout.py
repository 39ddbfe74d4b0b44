"""Where an attempt's things are, and what they are called: written once.

In the spirit of Harbor's `EnvironmentPaths` and `TrialPaths`: the paths a subject and a
verifier see inside the sandbox, the `MAKA_EVAL_*` variables that describe an attempt,
the attempt id, and the defaults an experiment falls back to. A leaf: standard library
only, imported by the spec, the executors, the relay (in a Pod too) and the sandboxes.
"""

from __future__ import annotations

from typing import Final

# -- inside the sandbox: the process sandbox's own folders ----------------------------
ATTEMPT_ROOT: Final = "/attempt"
WORKSPACE_PATH: Final = f"{ATTEMPT_ROOT}/workspace"
HOME_PATH: Final = f"{ATTEMPT_ROOT}/home"
TMP_PATH: Final = f"{ATTEMPT_ROOT}/tmp"
INSTRUCTION_PATH: Final = f"{ATTEMPT_ROOT}/instruction.md"
FRAME_PATH: Final = f"{ATTEMPT_ROOT}/frame"

# -- inside the sandbox: Harbor's paths, the same in every sandbox --------------------
TESTS_PATH: Final = "/tests"
SOLUTION_PATH: Final = "/solution"
LOGS_ROOT: Final = "/logs"
AGENT_LOGS_PATH: Final = f"{LOGS_ROOT}/agent"
VERIFIER_LOGS_PATH: Final = f"{LOGS_ROOT}/verifier"

# -- the variables that describe an attempt to its processes ---------------------------
ENV_PREFIX: Final = "MAKA_EVAL_"
"""Every variable the relay sets to describe the attempt starts with this."""
ATTEMPT_ID_ENV: Final = "MAKA_EVAL_ATTEMPT_ID"
"""Every process of an attempt carries it (quiescing finds them by it)."""
RUN_ID_ENV: Final = "MAKA_EVAL_RUN_ID"
CELL_ID_ENV: Final = "MAKA_EVAL_CELL_ID"
TASK_ID_ENV: Final = "MAKA_EVAL_TASK_ID"
REPETITION_ENV: Final = "MAKA_EVAL_REPETITION"
SUBJECT_ID_ENV: Final = "MAKA_EVAL_SUBJECT_ID"
WORKSPACE_ENV: Final = "MAKA_EVAL_WORKSPACE"
INSTRUCTION_FILE_ENV: Final = "MAKA_EVAL_INSTRUCTION_FILE"
RESULT_FILE_ENV: Final = "MAKA_EVAL_RESULT_FILE"
TESTS_DIR_ENV: Final = "MAKA_EVAL_TESTS_DIR"
VERIFIER_LOGS_DIR_ENV: Final = "MAKA_EVAL_VERIFIER_LOGS_DIR"
RESULT_TOKEN_ENV: Final = "MAKA_EVAL_RESULT_TOKEN"


def subject_dir_env(name: str) -> str:
    """The variable naming a subject-only folder of the attempt (the oracle's solution:
    MAKA_EVAL_SOLUTION_DIR)."""
    return f"{ENV_PREFIX}{name.upper()}_DIR"


# -- the attempt id ------------------------------------------------------------------
def attempt_id(run_id: str, cell_id: str, number: int) -> str:
    """Unique across runs (and clusters: a Pod's run id is its Experiment's uid)."""
    return f"{run_id}/{cell_id}/{number}"


# -- defaults an experiment falls back to ---------------------------------------------
DEFAULT_AGENT_TIMEOUT_SEC: Final = 900.0
"""The subject's time limit when neither task.toml nor the spec sets one."""
DEFAULT_VERIFIER_TIMEOUT_SEC: Final = 600.0
"""The verifier's time limit when neither task.toml nor the spec sets one."""
DEFAULT_OUTPUT_LIMIT_BYTES: Final = 8 * 1024 * 1024
"""Cap on each output stream of an attempt (execution.maxOutputBytes' default)."""
