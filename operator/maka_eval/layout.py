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

# -- inside a container (the container sandbox, Harbor's task container): the relay's --
RELAY_ROOT: Final = "/maka"
"""The relay's own folder in a container and in an attempt's Pod; the subject's working
folders are elsewhere."""
PROGRAM_DIR: Final = f"{RELAY_ROOT}/bin"
"""A subject's program named by a path on maka-eval's machine is uploaded here."""
CONTAINER_INSTRUCTION_PATH: Final = f"{RELAY_ROOT}/instruction.md"
CONTAINER_FRAME_DIR: Final = f"{RELAY_ROOT}/frame"
"""The container sandbox's: where a maka subject writes its result frame."""
CONTAINER_CA_CERT_PATH: Final = f"{RELAY_ROOT}/egress/ca.pem"
"""Where a policed container sees the egress proxy's CA certificate (read-only)."""
VERIFIER_BOX_PREFIX: Final = f"{RELAY_ROOT}/.v-"
"""The container sandbox's: each verifier's upload folder is this and a random name."""
BRIDGE_OUTPUT_DIR: Final = f"{RELAY_ROOT}/out"
"""Harbor's task container: the subject's stdout, stderr and result frame."""
BRIDGE_FRAME_FILE: Final = f"{BRIDGE_OUTPUT_DIR}/result.json"
BRIDGE_RUN_DIR: Final = f"{RELAY_ROOT}/run"
BRIDGE_CREDENTIALS_FILE: Final = f"{BRIDGE_RUN_DIR}/credentials.env"
"""Harbor's task container: sourced then deleted by the subject's wrapper."""

# -- in an attempt's Pod: the subject container's mounts -------------------------------
POD_RELAY_DIR: Final = f"{RELAY_ROOT}/relay"
"""The relay bundle, copied from the relay image (read-only to the subject container)."""
POD_RELAY_PROGRAM: Final = f"{POD_RELAY_DIR}/bin/maka-relay"
POD_BENCHMARK_DIR: Final = f"{RELAY_ROOT}/benchmark"
POD_WORK_DIR: Final = f"{RELAY_ROOT}/work"
"""The relay's working folder; the attempt's own folders are below it."""
POD_ARTIFACTS_DIR: Final = f"{RELAY_ROOT}/artifacts"
POD_EGRESS_CA_DIR: Final = f"{RELAY_ROOT}/egress-ca"
"""The egress sidecar publishes its CA certificate (only) here."""
POD_EGRESS_METER_DIR: Final = f"{RELAY_ROOT}/egress-meter"
"""The egress sidecar writes the provider-usage checkpoint here."""
POD_SECRETS_ROOT: Final = "/var/run/maka-eval"
POD_EGRESS_STATE_DIR: Final = f"{POD_SECRETS_ROOT}/egress"
"""The egress sidecar's own: the CA key and the audit log."""
POD_EGRESS_SECRET_DIR: Final = f"{POD_SECRETS_ROOT}/egress-secret"
POD_RESULT_TOKEN_DIR: Final = f"{POD_SECRETS_ROOT}/result-token"
RELAY_BUNDLE_IN_IMAGE: Final = "/opt/maka-eval"
"""Where the relay image holds the bundle (bin/maka-relay and what it needs)."""
BENCHMARK_IN_IMAGE: Final = "/benchmark"
"""Where a benchmark image holds the benchmark (copied into the Pod's benchmark dir)."""
TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
"""Kubernetes' default: the relay's result and the bundle check's refusal go here."""

# -- on the machine that runs the attempts (never shown to a sandbox) -----------------
HOST_RUN_DIR: Final = "/run/maka-eval"
HOST_SLOTS_DIR: Final = f"{HOST_RUN_DIR}/slots"
"""The process sandbox's trees of mount slots (SLOTS_ROOT/<pid>.<n>)."""
HOST_ETC_VIEWS_DIR: Final = f"{HOST_RUN_DIR}/etc"
"""Each process's copy of /etc for the sandboxes."""
HOST_NETNS_LOCK: Final = f"{HOST_RUN_DIR}/netns.lock"
HOST_PODMAN_SOCKET: Final = f"{HOST_RUN_DIR}/podman.sock"
"""The rootful Podman service hack/podman.sh starts (it spells this path too)."""

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


# -- limits ----------------------------------------------------------------------------
MAX_FRAME_BYTES: Final = 64 * 1024
"""A result frame larger than this is oversized (the relay's reader and Harbor's bridge)."""

# -- defaults an experiment falls back to ---------------------------------------------
DEFAULT_AGENT_TIMEOUT_SEC: Final = 900.0
"""The subject's time limit when neither task.toml nor the spec sets one."""
DEFAULT_VERIFIER_TIMEOUT_SEC: Final = 600.0
"""The verifier's time limit when neither task.toml nor the spec sets one."""
DEFAULT_OUTPUT_LIMIT_BYTES: Final = 8 * 1024 * 1024
"""Cap on each output stream of an attempt (execution.maxOutputBytes' default)."""
