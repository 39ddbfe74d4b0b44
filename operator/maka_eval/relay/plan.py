"""What the relay is asked to do for one attempt: a plain, JSON-serializable plan.

The plan names credentials by their source variable, never by value: the relay reads the
values from its own environment (a Kubernetes Secret in a pod, the user's environment
locally), so a plan can be written to disk without holding a secret.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from maka_eval import layout, strict_json
from maka_eval.engine.classify import ResultContract
from maka_eval.engine.environment import Healthcheck, TaskArtifact
from maka_eval.engine.launch import SOLUTION_DIR_NAME, SubjectLaunch
from maka_eval.engine.modes import EgressMode, Isolation, NetworkMode, egress_mode
from maka_eval.engine.task_settings import StepPlan, task_settings
from maka_eval.metering.pricing import Prices
from maka_eval.sandbox.plans import ContainerPlan

if TYPE_CHECKING:
    from maka_eval.spec.task_directory import TaskDefinition


class PlanError(ValueError):
    """A relay plan is malformed."""


OWN_NETWORK = "/proc/self/ns/net"
"""`EgressPlan.namespace` in a Pod: the relay's own network namespace, which the Pod's
NetworkPolicy and egress sidecar police (the relay reads its identity when it starts)."""


@dataclass(frozen=True)
class EgressPlan:
    """The cell's policed network, prepared by the executor before the relay starts: a
    network namespace whose nftables policy admits only the cell's egress proxy."""

    namespace: str
    """Path of the namespace (/run/netns/NAME) the subject's sandbox joins."""
    namespace_identity: str
    """`st_dev:st_ino` of that namespace: the gate checks the subject is in it."""
    proxy_name: str
    """The proxy's name, pinned in the sandbox's /etc/hosts (no resolver is reachable)."""
    proxy_address: str
    proxy_port: int
    ca_cert: str | None = None
    """Host path of the proxy's CA certificate (the key never leaves the proxy's folder),
    shown read-only to the subject."""
    policy_digest: str | None = None
    verifier_uses_proxy: bool = False
    """Whether the verifier is told of the proxy too: for a task whose own allowlist the
    proxy keeps (task.toml network_mode = 'allowlist'), whose tests may fetch from the
    hosts it lists, as under Harbor. Otherwise the verifier gets no proxy variables."""


@dataclass(frozen=True)
class MeteringPlan:
    """Where the egress proxy's provider-usage checkpoint is, and how to verify it.

    Once the subject has ended the relay settles the proxy and reads the checkpoint
    (metering.checkpoint), accepting it only when its HMAC verifies with the result
    token: the metered usage and cost are recorded unless a valid result frame reports
    its own, and decide the status when the frame is missing (relay.metering).
    """

    checkpoint: str
    """Path of the checkpoint file the proxy writes."""
    token_env: str = layout.RESULT_TOKEN_ENV
    """The relay's environment variable holding the result token (the plan never holds
    the value); the subject does not receive it."""
    prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Model prices in metering.pricing's wire form; without a price, no cost."""
    token_file: str | None = None
    """Read the result token from this file instead of `token_env` (a Pod: a Secret
    volume; the relay hides its folder from the subject)."""
    settle_proxy: str | None = None
    """The proxy's URL (http://HOST:PORT) to settle over HTTP (metering.settle) when
    the relay cannot signal it (a Pod's sidecar)."""


@dataclass(frozen=True)
class AttemptPlan:
    """Everything the relay needs to run one attempt of one cell."""

    attempt_id: str
    """Unique for this attempt; every process of the attempt carries it (MAKA_EVAL_ATTEMPT_ID)."""
    run_id: str
    cell_id: str
    task_id: str
    repetition: int
    subject_id: str
    root: str
    """Attempt-private directory the relay creates and works in."""
    artifacts_dir: str
    """Where the relay leaves the attempt's artifacts (redacted, capped, digested)."""
    instruction_file: str
    tests_dir: str
    environment_dir: str | None
    subject: SubjectLaunch
    agent_timeout_sec: float
    verifier_timeout_sec: float
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    score_key: str = "reward"
    redact: tuple[str, ...] = ()
    """Names of every credential of the experiment: any of their values found in what
    leaves the relay (artifacts, reasons, metric names) is replaced by [redacted:NAME],
    whichever subject it came from."""
    output_limit_bytes: int = layout.DEFAULT_OUTPUT_LIMIT_BYTES
    max_artifact_files: int | None = None
    """execution.maxArtifactFiles: at most this many artifact files are kept (None: all);
    the kernel's notes name what was dropped."""
    isolation: Isolation = Isolation.NONE
    """'namespaces' (own PID, mount, IPC, UTS, network namespaces), 'container' (the
    task's image, see `container`), 'none', or 'auto' (a pod: the relay decides)."""
    hidden: tuple[str, ...] = ()
    """Host folders the sandbox hides (the run folder, all workspaces, the tasks)."""
    visible: tuple[str, ...] = ()
    """Host paths the subject still needs besides the machine's runtime (its program)."""
    in_task_image: bool = False
    """The relay runs inside the task's own image (a Pod): the process sandbox shows
    that image's folders but the hidden ones, where on a machine of its own it shows
    only the runtime folders (/usr, /etc, ...)."""
    task_dir: str | None = None
    """Read the task's own settings (task.toml timeouts and environments, environment/
    folder) from this task directory when the relay starts: in a Pod the operator cannot
    see the task, only the relay can. The plan's timeouts are then the defaults."""
    container: ContainerPlan | None = None
    """Set when isolation is 'container'."""
    egress: EgressPlan | None = None
    """Set when the cell's egress is policed (executor.config.egress mode 'proxy')."""
    metering: MeteringPlan | None = None
    """Set when an egress proxy meters the subject's model requests."""
    steps: tuple[StepPlan, ...] = ()
    """A multi-step task's steps (empty: one step, the plan's own instruction/tests)."""
    step_reward_strategy: str = "mean"
    """How the steps' rewards make the attempt's: 'mean' or 'final' (Harbor's)."""
    healthcheck: Healthcheck | None = None
    """task.toml's [environment.healthcheck]: run once the sandbox is up, before the
    subject (and any step)."""
    artifacts: tuple[TaskArtifact, ...] = ()
    """task.toml's `artifacts`: collected once the subject is done, before the verifier
    (after each step's subject, for a multi-step task)."""

    def to_json(self) -> str:
        """Serialize for the relay program (`python -m maka_eval.relay`)."""
        data = asdict(self)
        data["subject"]["contract"] = self.subject.contract.value
        data["subject"]["argv"] = list(self.subject.argv)
        data["redact"] = list(self.redact)
        data["hidden"] = list(self.hidden)
        data["visible"] = list(self.visible)
        if not self.steps:
            del data["steps"], data["step_reward_strategy"]
        if self.healthcheck is None:
            del data["healthcheck"]
        if self.max_artifact_files is None:
            del data["max_artifact_files"]
        if not self.artifacts:
            del data["artifacts"]
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AttemptPlan:
        """Parse a serialized plan; PlanError names what is wrong."""
        try:
            data: dict[str, Any] = strict_json.loads(text)
            subject = dict(data.pop("subject"))
            launch = SubjectLaunch(
                argv=tuple(subject.pop("argv")),
                contract=ResultContract(subject.pop("contract")),
                **subject,
            )
            container = data.pop("container", None)
            egress = data.pop("egress", None)
            metering = data.pop("metering", None)
            if metering is not None:
                metering = MeteringPlan(**metering)
                Prices.from_dict(metering.prices)  # refused here, not when it is needed
            if container is not None:
                container["network"] = NetworkMode(container.get("network", "public"))
            plan = cls(
                subject=launch,
                isolation=Isolation(data.pop("isolation", Isolation.NONE)),
                container=ContainerPlan(**container) if container is not None else None,
                egress=EgressPlan(**egress) if egress is not None else None,
                metering=metering,
                redact=tuple(data.pop("redact", ())),
                hidden=tuple(data.pop("hidden", ())),
                visible=tuple(data.pop("visible", ())),
                steps=tuple(StepPlan.from_dict(step) for step in data.pop("steps", ())),
                healthcheck=Healthcheck.from_dict(data.pop("healthcheck", None)),
                artifacts=TaskArtifact.from_dicts(data.pop("artifacts", ())),
                **data,
            )
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise PlanError(f"the relay plan is malformed: {exc}") from None
        if not plan.subject.argv:
            raise PlanError("the relay plan has an empty subject.argv")
        if plan.step_reward_strategy not in ("mean", "final"):
            raise PlanError("the relay plan's step_reward_strategy must be 'mean' or 'final'")
        if (plan.isolation is Isolation.CONTAINER) != (plan.container is not None):
            raise PlanError(
                "the relay plan needs 'container' exactly when isolation is 'container'"
            )
        return plan


def with_task(
    plan: AttemptPlan, task: TaskDefinition, spec_egress: EgressMode | None
) -> AttemptPlan:
    """The plan with `task`'s own settings over the experiment's (the plan's timeouts
    are the spec's defaults until then): the one place every executor applies them, the
    local executor when it plans and the relay in a Pod (`with_task_dir`). `spec_egress`
    is executor.config.egress's mode (None: none declared). PlanError when the task
    cannot run as planned.
    """
    settings = task_settings(
        task,
        plan.agent_timeout_sec,
        plan.verifier_timeout_sec,
        image_built=plan.container is not None,
    )
    subject = plan.subject
    if SOLUTION_DIR_NAME in subject.extra_dirs:
        if settings.solution_dir is None:
            raise PlanError(f"{task.root}/solution/solve.sh is missing; the oracle runs it")
        subject = replace(
            subject,
            env={**settings.solution_env, **subject.env},
            extra_dirs={**subject.extra_dirs, SOLUTION_DIR_NAME: settings.solution_dir},
        )
    # A task that allows no network gets none, whatever the experiment says.
    policed = egress_mode(spec_egress, settings.network_mode) is EgressMode.PROXY
    return replace(
        plan,
        subject=subject,
        steps=settings.steps,
        step_reward_strategy=settings.step_reward_strategy,
        healthcheck=settings.healthcheck,
        artifacts=settings.artifacts,
        instruction_file=settings.instruction_file,
        tests_dir=settings.tests_dir,
        environment_dir=settings.environment_dir,
        agent_timeout_sec=settings.agent_timeout_sec,
        verifier_timeout_sec=settings.verifier_timeout_sec,
        verifier_env={**settings.verifier_env, **plan.verifier_env},
        task_dir=None,
        egress=plan.egress if policed else None,
    )


def with_task_dir(plan: AttemptPlan) -> AttemptPlan:
    """The plan with its task directory's settings applied (see `task_dir`): in a Pod,
    where only the relay can read the task. Standard library only (tests/relay checks
    no pydantic or PyYAML is loaded).

    PlanError when the task directory is not a valid task: the relay then reports an
    infrastructure failure (the benchmark image does not hold what the spec names).
    """
    if plan.task_dir is None:
        return plan
    from pathlib import Path

    from maka_eval.spec.task_directory import load_task

    task, problems = load_task(
        plan.task_id, Path(plan.task_dir), f"task {plan.task_id}", withheld=frozenset(plan.redact)
    )
    if task is None:
        raise PlanError("; ".join(f"{p.where}: {p.message}" for p in problems))
    if task.network_mode is NetworkMode.ALLOWLIST:
        # The Pod's egress sidecar keeps the experiment's policy, not a task's own list:
        # running the task with a wider network than it declares would be wrong, and
        # with none would fail it for a reason that is not its own.
        raise PlanError(
            f"{task.root}/task.toml asks for network_mode = 'allowlist', which the "
            "kubernetes executor cannot keep yet (its egress sidecar carries the "
            "experiment's policy only); run the task with executor.kind local, or leave it out"
        )
    # A Pod's network is policed whenever it has one (the operator gives it the egress
    # sidecar exactly when executor.config.egress.mode is 'proxy'); else it has none.
    return with_task(plan, task, EgressMode.PROXY if plan.egress is not None else EgressMode.NONE)
