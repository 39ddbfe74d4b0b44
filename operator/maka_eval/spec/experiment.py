"""The experiment document: one benchmark, one executor, all subjects and tasks.

Two wire forms mean the same experiment: the bare form (`schemaVersion: maka.eval.v1`,
`id`, then the spec fields) and the Kubernetes form (`apiVersion: eval.maka.dev/v1alpha1`,
`kind: Experiment`, `metadata.name`, `spec`). Both parse into `Experiment`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag
from pydantic.json_schema import SkipJsonSchema

from maka_eval.engine.modes import REQUESTED_ISOLATIONS, Isolation
from maka_eval.layout import (
    DEFAULT_AGENT_TIMEOUT_SEC,
    DEFAULT_OUTPUT_LIMIT_BYTES,
    DEFAULT_VERIFIER_TIMEOUT_SEC,
)
from maka_eval.spec.base import (
    ExperimentId,
    Id,
    K8sName,
    NonBlank,
    PositiveSeconds,
    Quantity,
    Sha256Digest,
    SpecModel,
    TaskPath,
    Text,
)
from maka_eval.spec.egress import EgressConfig
from maka_eval.spec.metering import MeteringConfig
from maka_eval.spec.subjects import Subject

SCHEMA_VERSION = "maka.eval.v1"
API_GROUP = "eval.maka.dev"
API_VERSION = f"{API_GROUP}/v1alpha1"


class DirectoryBenchmarkConfig(SpecModel):
    """Where the tasks are: Harbor-format task directories under one folder, or inline."""

    path: NonBlank | None = Field(
        default=None,
        description=(
            "Folder holding one directory per task, relative to the experiment file. "
            "Required when kind is 'directory'; absent for inline tasks."
        ),
    )


class Benchmark(SpecModel):
    """What is being evaluated."""

    id: Id = Field(description="Benchmark id.")
    version: NonBlank = Field(description="Benchmark version (a string: quote numbers).")
    kind: Literal["directory", "inline"] | None = Field(
        default=None,
        description=(
            "Where the tasks come from. 'directory': task directories under config.path. "
            "'inline': each task's input and config in this document, passed to the "
            "executor. Default: 'directory' when config.path is set, else 'inline'."
        ),
    )
    config: DirectoryBenchmarkConfig = Field(default_factory=DirectoryBenchmarkConfig)

    @property
    def source(self) -> Literal["directory", "inline"]:
        """`kind`, or its default."""
        if self.kind is not None:
            return self.kind
        return "directory" if self.config.path is not None else "inline"


class Task(SpecModel):
    """One task of the benchmark."""

    id: Id = Field(description="Task id; unique in the experiment.")
    path: TaskPath | None = Field(
        default=None,
        description=(
            "Task directory relative to the benchmark folder, inside it (default: the id)."
        ),
    )
    input: Text | None = Field(
        default=None,
        description=(
            "Inline tasks: the instruction given to the subject. Task directories have "
            "theirs in instruction.md."
        ),
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "Passed to the executor unchanged (default: empty). For executor.kind harbor: "
            "a Harbor task path or a dataset reference. An inline task with an empty config "
            "has no tests to score it with."
        ),
    )

    @property
    def directory_name(self) -> str:
        """The task's directory under the benchmark folder."""
        return self.path or self.id


class RuntimeHost(SpecModel):
    """The Runtime Host command that runs `maka` subjects."""

    command: NonBlank = Field(description="Runtime Host program (on PATH or a path).")
    args: tuple[Text, ...] = Field(default=(), description="Arguments before the profile.")


EGRESS_DESCRIPTION = (
    "What subjects' network may reach (proxy with the contamination blocklist, or none). "
    "Executor configuration, shared by all arms; subjects cannot override it. A task "
    "whose task.toml sets allow_internet = false gets no network whatever this says."
)


if TYPE_CHECKING:
    IsolationSetting = str
else:
    # engine.modes lists the values once; a Literal of them keeps the schema's enum and
    # the spec's error message ("use 'auto', 'namespaces' or 'none'") as they were.
    IsolationSetting = Literal[tuple(i.value for i in REQUESTED_ISOLATIONS)]


class LocalExecutorConfig(SpecModel):
    """Settings of the embedded local executor (processes on this machine)."""

    runtime_host: RuntimeHost | None = Field(
        default=None, description="Required when any subject has kind 'maka'."
    )
    isolation: IsolationSetting = Field(
        default=Isolation.AUTO.value,
        description=(
            "How each attempt is separated from this machine and from other cells. "
            "'namespaces': own PID, mount, IPC, UTS and network namespaces (Linux, root, "
            "bubblewrap): the run folder, other workspaces, the tasks' tests and solutions "
            "and the executor's processes are out of sight, and the network is the cell's "
            "own loopback only. 'none': plain processes (nothing hidden; recorded). "
            "'auto': namespaces where this machine can make them, else none. Applies "
            "to tasks run as processes (sandbox)."
        ),
    )
    sandbox: Id = Field(
        default="auto",
        description=(
            "Where each task runs. 'container': in the task's image (environment/"
            "Dockerfile or task.toml docker_image) through a Docker Engine API (Docker or "
            "Podman), with Harbor's paths (/tests, /solution, /logs/verifier, the workdir); "
            "tasks without an image are refused. "
            "'process': as processes of this machine (tasks with an image are refused). "
            "'auto': a container for tasks that ship an image, when an engine answers; "
            "processes for the others. Any other value names an installed sandbox backend "
            "(entry-point group maka_eval.sandboxes), which runs every task."
        ),
    )
    egress: EgressConfig | None = Field(default=None, description=EGRESS_DESCRIPTION)


class LocalExecutor(SpecModel):
    """Run every cell as local processes, results in a run directory."""

    kind: Literal["local"]
    config: LocalExecutorConfig = Field(default_factory=LocalExecutorConfig)


ImageName = Annotated[NonBlank, Field(max_length=512)]
"""A container image reference (registry/name:tag or @digest)."""


class ResourceList(SpecModel):
    """Amounts of CPU, memory and ephemeral storage (Kubernetes quantities)."""

    cpu: Quantity | None = Field(default=None, description="CPU, e.g. 500m or 2.")
    memory: Quantity | None = Field(default=None, description="Memory, e.g. 4Gi.")
    ephemeral_storage: Quantity | None = Field(
        default=None, alias="ephemeral-storage", description="Local disk, e.g. 10Gi."
    )


class ResourceRequirements(SpecModel):
    """CPU and memory of each attempt's subject container."""

    requests: ResourceList = Field(
        default_factory=ResourceList, description="Guaranteed resources (scheduling)."
    )
    limits: ResourceList = Field(
        default_factory=ResourceList,
        description="Hard caps; a container over its memory limit is OOMKilled.",
    )


class Toleration(SpecModel):
    """A Kubernetes toleration copied into every attempt Pod."""

    key: str | None = Field(default=None, max_length=316, description="Taint key.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Match.")
    value: str | None = Field(default=None, max_length=63, description="Taint value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect (empty: all)."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="How long a NoExecute taint is tolerated."
    )


class SecretKey(SpecModel):
    """Where one credential's value is: a key of a Secret in the experiment's namespace."""

    name: K8sName = Field(description="The Secret's name.")
    key: NonBlank = Field(description="The key in the Secret's data.")


DEFAULT_CREDENTIALS_SECRET = "maka-eval-credentials"


class KubernetesExecutorConfig(SpecModel):
    """Settings of the Kubernetes executor (the operator runs each attempt as a Pod)."""

    relay_image: ImageName = Field(
        description="Image holding the relay bundle at /opt/maka-eval (copied into each Pod)."
    )
    relay_bundle_digest: Sha256Digest | None = Field(
        default=None,
        description=(
            "Pinned digest of the relay bundle (sha256 of its checksums.sha256, printed by "
            "hack/build-images.sh). Each Pod checks its copy of the bundle before the "
            "subject starts; a mismatch fails the attempt as infrastructure, naming both."
        ),
    )
    egress_image: ImageName = Field(
        description="Image of the egress proxy sidecar (mitmproxy with maka-eval's addons)."
    )
    benchmark_image: ImageName = Field(
        description=(
            "Image holding the experiment folder at /benchmark: the benchmark folder "
            "(benchmark.config.path) and any subject program named by a relative path "
            "resolve under it, as they do next to the experiment file locally."
        )
    )
    task_image: ImageName = Field(
        description="Image the subject container runs (the task's environment)."
    )
    task_images: dict[str, ImageName] = Field(
        default_factory=dict, description="Per-task image overrides: task id -> image."
    )
    runtime_host: RuntimeHost | None = Field(
        default=None,
        description="Runtime Host command inside the task image; required for 'maka' subjects.",
    )
    credentials: dict[str, SecretKey] = Field(
        default_factory=dict,
        description=(
            "Where each declared credential comes from. A credential not listed here is "
            f"key <NAME> of Secret '{DEFAULT_CREDENTIALS_SECRET}'."
        ),
    )
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    runtime_class_name: K8sName | None = Field(
        default=None, description="RuntimeClass of attempt Pods (e.g. gvisor, kata)."
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Node labels attempt Pods must run on."
    )
    tolerations: tuple[Toleration, ...] = Field(
        default=(), description="Tolerations of attempt Pods."
    )
    image_pull_deadline_sec: PositiveSeconds = Field(
        default=300.0,
        description=(
            "An attempt whose image has not been pulled after this long is an "
            "infrastructure failure (and is retried)."
        ),
    )
    service_account_name: K8sName | None = Field(
        default=None,
        description="ServiceAccount of attempt Pods; its token is never mounted.",
    )
    egress: EgressConfig | None = Field(default=None, description=EGRESS_DESCRIPTION)

    def credential(self, name: str) -> SecretKey:
        """Where credential `name` comes from."""
        return self.credentials.get(name) or SecretKey(name=DEFAULT_CREDENTIALS_SECRET, key=name)


class KubernetesExecutor(SpecModel):
    """Run every cell as a Pod on a Kubernetes cluster (the maka-eval operator)."""

    kind: Literal["kubernetes"]
    config: KubernetesExecutorConfig


class PluginExecutor(SpecModel):
    """An executor registered in the `maka_eval.executors` entry-point group (a plug-in,
    docs/executors.md). Its config is validated by the plug-in's own model when the
    document is loaded; the CRD lists only the built-in kinds (the operator runs
    `kubernetes`), so plug-in kinds run with `maka-eval run`."""

    union_tag: ClassVar[str] = "plugin"
    """The discriminator's tag for every plug-in kind (see `_executor_tag`)."""

    # Whether a plug-in registers this kind is a fact of the machine, not of the
    # document: the loader checks it (executors.load), above the executor registry.
    kind: str = Field(description="The kind a plug-in registers.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="The plug-in's configuration (its own model)."
    )


def _executor_tag(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in ("local", "kubernetes") else "plugin"


Executor = Annotated[
    Annotated[LocalExecutor, Tag("local")]
    | Annotated[KubernetesExecutor, Tag("kubernetes")]
    | Annotated[SkipJsonSchema[PluginExecutor], Tag("plugin")],
    Discriminator(_executor_tag),
]
"""`local`, `kubernetes`, or any kind a plug-in registers (maka_eval.executors.registry)."""


class Timeouts(SpecModel):
    """Timeouts used when a task's task.toml does not set its own."""

    agent_sec: PositiveSeconds = Field(
        default=DEFAULT_AGENT_TIMEOUT_SEC, description="Subject time limit."
    )
    verifier_sec: PositiveSeconds = Field(
        default=DEFAULT_VERIFIER_TIMEOUT_SEC, description="Verifier time limit."
    )


class Execution(SpecModel):
    """How cells are scheduled; frozen with the experiment."""

    max_concurrent_task_groups: int = Field(
        ge=1, le=4096, description="At most this many task groups run at once."
    )
    max_infra_retries: int = Field(
        default=2,
        ge=0,
        le=20,
        description="Replacement attempts a cell gets after infrastructure failures.",
    )
    default_timeouts: Timeouts = Field(default_factory=Timeouts)
    max_output_bytes: int = Field(
        default=DEFAULT_OUTPUT_LIMIT_BYTES,
        ge=1024,
        le=1024**3,
        description=(
            "Cap on each output stream of an attempt (the subject's and the verifier's "
            "stdout and stderr). Output past it is discarded, the stored artifact ends "
            "with a marker saying how much was cut, and the record marks it truncated."
        ),
    )
    max_artifact_files: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description=(
            "Cap on how many artifact files one attempt keeps (its output streams, the "
            "verifier's reports, task.toml artifacts). Files past it are dropped and a "
            "note on the record names them. Default: no cap."
        ),
    )


class Budget(SpecModel):
    """Shared experiment budget: no new task group starts once it is reached."""

    max_cost_usd: float | None = Field(default=None, gt=0, description="Total cost limit.")
    max_tokens: int | None = Field(default=None, gt=0, description="Total token limit.")


class HarborVerifierConfig(SpecModel):
    """Harbor-compatible verifier settings."""

    score_key: NonBlank = Field(
        default="reward",
        description="Key of reward.json that becomes the score (reward.txt is 'reward').",
    )


class HarborVerifier(SpecModel):
    """Run the task's tests/test.sh; read reward.json, then reward.txt."""

    kind: Literal["harbor"] = Field(
        default="harbor",
        description=(
            "The only verifier: Harbor's (the task's tests/test.sh writes "
            "/logs/verifier/reward.json or reward.txt). Default: 'harbor', so `verifier: {}` "
            "is enough."
        ),
    )
    config: HarborVerifierConfig = Field(default_factory=HarborVerifierConfig)


class ExperimentSpec(SpecModel):
    """Everything an experiment means, apart from its id."""

    benchmark: Benchmark
    executor: Executor = Field(
        description=(
            "How cells run: 'local' (this machine), 'kubernetes' (the operator), or a "
            "plug-in's kind (docs/executors.md)."
        ),
        json_schema_extra={"discriminator": {"propertyName": "kind"}},
    )
    execution: Execution
    subjects: tuple[Subject, ...] = Field(min_length=1, description="Agents under test.")
    tasks: tuple[Task, ...] = Field(min_length=1, description="Tasks, in order.")
    repetitions: int = Field(ge=1, le=100_000, description="Samples per task and subject.")
    budget: Budget = Field(
        default_factory=Budget, description="Default: no limit (`budget: {}` is the same)."
    )
    verifier: HarborVerifier = Field(
        default_factory=HarborVerifier, description="Default: Harbor's verifier."
    )
    metering: MeteringConfig | None = Field(
        default=None,
        description=(
            "Model prices for the usage the egress proxy meters (docs/egress.md); "
            "without them, metered usage is recorded with a null cost."
        ),
    )

    @property
    def executor_egress(self) -> EgressConfig | None:
        """`executor.config.egress` of a built-in executor (plug-ins police their own)."""
        config = self.executor.config
        return None if isinstance(config, dict) else config.egress

    @property
    def runtime_host(self) -> RuntimeHost | None:
        """`executor.config.runtimeHost` of a built-in executor."""
        config = self.executor.config
        return None if isinstance(config, dict) else config.runtime_host


class BareExperiment(ExperimentSpec):
    """The bare form of the document (`schemaVersion: maka.eval.v1`)."""

    schema_version: Literal["maka.eval.v1"]
    id: ExperimentId


class ObjectMeta(SpecModel):
    """Kubernetes object metadata; server-populated fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    name: ExperimentId
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class KubernetesExperiment(SpecModel):
    """The Kubernetes form of the document (`kind: Experiment`)."""

    api_version: Literal["eval.maka.dev/v1alpha1"]
    kind: Literal["Experiment"]
    metadata: ObjectMeta
    spec: ExperimentSpec
    status: dict[str, Any] | None = Field(
        default=None, description="Written by the operator; ignored when loading."
    )


class Experiment(SpecModel):
    """An experiment, whichever form it was written in."""

    id: ExperimentId
    spec: ExperimentSpec

    def canonical(self) -> dict[str, Any]:
        """The bare-form document with every default filled in: the experiment's identity."""
        body = self.spec.model_dump(mode="json", by_alias=True)
        return {"schemaVersion": SCHEMA_VERSION, "id": self.id, **body}

    def subject(self, subject_id: str) -> Subject:
        """The subject with this id."""
        for subject in self.spec.subjects:
            if subject.id == subject_id:
                return subject
        raise KeyError(subject_id)

    def task(self, task_id: str) -> Task:
        """The task with this id."""
        for task in self.spec.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)
