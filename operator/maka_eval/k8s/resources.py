"""The custom resources' models: Cell and Attempt spec and status, Experiment status.

The Experiment's spec is the experiment document (spec/experiment.py); everything else
the operator writes is modelled here, so the CRD schemas (k8s/crds.py) and the code
that writes the objects share one definition. Wire names are camelCase, as Kubernetes
objects use. `KernelModel` is the result kernel of contract/kernel.py in schema form:
its bounds and enums are taken from that module, and tests/k8s/test_crds.py checks that
it accepts exactly the kernel's wire form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from maka_eval.contract.kernel import (
    _SHA256,  # the kernel parser's own digest rule
    ARTIFACT_NAME_LIMIT,
    KERNEL_FORMAT,
    MAX_KERNEL_BYTES,
    MAX_METRICS,
    MAX_NOTES,
    NOTE_LIMIT,
    REASON_LIMIT,
)
from maka_eval.engine.expand import cell_id, group_id
from maka_eval.engine.modes import RECORDED_ISOLATIONS
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import MAX_TOKENS
from maka_eval.spec import ids

DNS_SUBDOMAIN_MAX_LENGTH = 253
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CELL_ID_MAX_LENGTH = 2 * ids.ID_MAX_LENGTH + 4 + 6
"""`<task>::<rep>::<subject>` with a repetition of at most 6 digits (spec: <= 100000)."""
ATTEMPT_ID_MAX_LENGTH = 512
"""As contract/record.py reads it."""
REQUEST_MAX_LENGTH = 256
"""A rerun token (the annotation's value), as contract/record.py reads `request`."""
MAX_RERUN_TOKENS = 256
MAX_ATTEMPTS = 1000
"""Attempts a cell can have: retries are capped by the spec, reruns by MAX_RERUN_TOKENS."""
_MIN_ARTIFACT_BYTES = len(
    json.dumps({"name": "a", "bytes": 0, "sha256": "0" * 64}, separators=(",", ":"))
)
MAX_KERNEL_ARTIFACTS = MAX_KERNEL_BYTES // _MIN_ARTIFACT_BYTES
"""No kernel within MAX_KERNEL_BYTES can list more artifacts than this."""

# metav1.Condition's rules (k8s.io/apimachinery/pkg/apis/meta/v1/types.go).
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class ResourceModel(BaseModel):
    """Base of the resource models: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
    )


# -- shared pieces -------------------------------------------------------------------


class ConditionStatus(StrEnum):
    """A condition's truth value, as Kubernetes spells it."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ResourceModel):
    """One aspect of the object's state (the Kubernetes metav1.Condition convention)."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
        description=(
            "What the condition is about, in CamelCase (kstatus: Ready, Reconciling, "
            "Stalled; the Experiment also has Validated, Complete and others)."
        ),
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation the condition was set for."
    )
    last_transition_time: datetime = Field(
        description="When the status last changed from one value to another."
    )
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="Why the condition is in this state: a CamelCase word for programs.",
    )
    message: str = Field(max_length=32768, description="The reason for people to read.")


def _conditions() -> list[Condition]:
    return []


class KStatus(StrEnum):
    """The three condition types of kstatus (sigs.k8s.io/cli-utils/pkg/kstatus), set on
    every Experiment, Cell and Attempt status so Flux, Argo CD and `kubectl wait` read
    health without custom code. Exactly one of them is True (docs/operations.md)."""

    READY = "Ready"
    """The object reached its end, and it is a good one."""
    RECONCILING = "Reconciling"
    """The operator is still working on it; it moves on its own."""
    STALLED = "Stalled"
    """It will not move without a person (a new experiment, a rerun, a Secret)."""


class Reason(StrEnum):
    """The reasons of the kstatus conditions (one per state; docs/operations.md)."""

    # Experiment
    RUNNING = "Running"
    PREREQUISITES_MISSING = "PrerequisitesMissing"
    COMPLETE = "Complete"
    INVALID_SPEC = "InvalidSpec"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    CELLS_FAILED = "CellsFailed"
    # Cell
    RESULT_SELECTED = "ResultSelected"
    RETRYING = "Retrying"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    # Attempt (RUNNING too)
    COMPLETED = "Completed"
    SUBJECT_FAILED = "SubjectFailed"
    INFRA_FAILED = "InfraFailed"
    CANCELLED = "Cancelled"


ConditionWish = tuple[str, bool, str, str]
"""(type, is it True, reason, message) of one condition to write."""


def kstatus(true: KStatus, reason: Reason, message: str) -> list[ConditionWish]:
    """Ready, Reconciling and Stalled: `true` is True, the others False, one reason."""
    return [(kind.value, kind is true, reason.value, message) for kind in KStatus]


def merge_conditions(
    previous: Iterable[Mapping[str, Any]] | None,
    wanted: Sequence[ConditionWish],
    generation: int,
    now: str,
) -> tuple[list[dict[str, Any]], list[ConditionWish]]:
    """The conditions to write, each with observedGeneration, keeping lastTransitionTime
    where the status did not change; and the wishes whose status changed (a condition
    that was not there before counts as changed)."""
    old = {c.get("type"): c for c in previous or ()}
    written = []
    changed = []
    for type_, truth, reason, message in wanted:
        status = ConditionStatus.TRUE.value if truth else ConditionStatus.FALSE.value
        before = old.get(type_) or {}
        flipped = before.get("status") != status
        written.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message[:32768],
                "observedGeneration": generation,
                "lastTransitionTime": now if flipped else before.get("lastTransitionTime", now),
            }
        )
        if flipped:
            changed.append((type_, truth, reason, message))
    return written, changed


CONDITIONS = Field(
    default_factory=_conditions,
    description="Current state, one entry per condition type (Kubernetes conventions).",
    json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
)
OBSERVED_GENERATION = Field(
    default=None, ge=0, description="The metadata.generation this status describes."
)

# -- the result kernel ----------------------------------------------------------------


class KernelUsage(ResourceModel):
    """Token counts of the attempt (engine/usage.py: input excludes cached input)."""

    input_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS, description="Uncached input.")
    cached_input_tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Input read from the provider's cache."
    )
    cache_write_tokens: int = Field(
        default=0, ge=0, le=MAX_TOKENS, description="Input written to the provider's cache."
    )
    output_tokens: int = Field(default=0, ge=0, le=MAX_TOKENS, description="Generated tokens.")
    total_tokens: int | None = Field(
        default=None, ge=0, le=4 * MAX_TOKENS, description="The sum of the four counts."
    )


class KernelArtifact(ResourceModel):
    """One stored artifact of the attempt: a relative path, its size and digest."""

    name: str = Field(
        min_length=1,
        max_length=ARTIFACT_NAME_LIMIT,
        description="Path relative to the attempt's artifact folder (no '..').",
    )
    bytes: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=_SHA256.pattern, description="sha256, 64 lowercase hex digits.")
    truncated: bool = Field(
        default=False, description="The output was longer than the output limit and was cut."
    )


if TYPE_CHECKING:
    RecordedIsolation = str
else:
    # engine.modes lists the values once; a Literal of them keeps the CRD's enum.
    RecordedIsolation = Literal[tuple(i.value for i in RECORDED_ISOLATIONS)]


class KernelModel(ResourceModel):
    """The result kernel (contract/kernel.py): what one attempt produced. Written once."""

    format: Literal["maka.eval.kernel.v1"] = Field(description="The kernel's format version.")
    status: AttemptStatus = Field(
        description=(
            "How the attempt ended: completed and subject_failed are results; "
            "infra_failed and cancelled are not and are run again."
        )
    )
    score: float | None = Field(
        default=None, description="The verifier's score; present exactly for results."
    )
    metrics: dict[str, float] | None = Field(
        default=None,
        max_length=MAX_METRICS,
        description="Every value the verifier reported (reward.json), the score among them.",
    )
    usage: KernelUsage | None = Field(default=None, description="Token usage; null if unknown.")
    cost_usd: float | None = Field(default=None, ge=0, description="Cost in US dollars.")
    duration_sec: float = Field(ge=0, description="Wall-clock duration of the attempt.")
    artifacts: list[KernelArtifact] = Field(
        max_length=MAX_KERNEL_ARTIFACTS, description="Stored artifacts (logs, outputs)."
    )
    artifacts_omitted: int | None = Field(
        default=None, ge=0, description="Artifacts left out to keep the kernel within its bound."
    )
    isolation: RecordedIsolation | None = Field(
        default=None,
        description="What separated the subject from the host and other cells; "
        "null when the executor did not say.",
    )
    notes: list[Annotated[str, Field(max_length=NOTE_LIMIT)]] | None = Field(
        default=None,
        max_length=MAX_NOTES,
        description="What the relay noticed that a reader must know (suspected tampering).",
    )
    status_source: StatusSource = Field(description="Which evidence decided the status.")
    reason: str | None = Field(
        default=None, max_length=REASON_LIMIT, description="A short reason for the status."
    )
    exit_code: int | None = Field(
        default=None,
        ge=-(2**31),
        le=2**31 - 1,
        description="The subject's exit code, present exactly when it decided the status.",
    )


assert KERNEL_FORMAT == "maka.eval.kernel.v1", "update KernelModel.format"

# -- Experiment -------------------------------------------------------------------------


class ExperimentPhase(StrEnum):
    """Where an experiment is, in one word (the details are in its conditions)."""

    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETE = "Complete"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    FAILED = "Failed"


class SubjectSummary(ResourceModel):
    """One subject's results so far."""

    subject_id: str = Field(
        max_length=ids.ID_MAX_LENGTH, pattern=ids.ID_PATTERN, description="The subject's id."
    )
    n: int = Field(default=0, ge=0, description="Cells with a selected (scored) attempt.")
    mean_score: float | None = Field(default=None, description="Mean score over those cells.")
    cost_usd: float | None = Field(
        default=None, ge=0, description="Cost of all its attempts; null while unknown."
    )
    tokens: int = Field(default=0, ge=0, description="Tokens of all its attempts.")


class BudgetStatus(ResourceModel):
    """What the experiment has spent against spec.budget."""

    cost_usd: float = Field(default=0.0, ge=0, description="Spent so far, US dollars.")
    tokens: int = Field(default=0, ge=0, description="Spent so far, tokens.")
    held: bool = Field(
        default=False, description="The budget is reached: no new task group starts."
    )


class ExperimentStatus(ResourceModel):
    """What the operator observed of an experiment (written by the operator only)."""

    observed_generation: int | None = OBSERVED_GENERATION
    phase: ExperimentPhase | None = Field(default=None, description="Where it is, in one word.")
    conditions: list[Condition] = CONDITIONS
    cells_total: int = Field(default=0, ge=0, description="Cells (task x repetition x subject).")
    cells_done: int = Field(default=0, ge=0, description="Cells with a selected result.")
    cells_failed: int = Field(
        default=0, ge=0, description="Cells that used up their retries without a result."
    )
    cells_running: int = Field(default=0, ge=0, description="Cells with an attempt running.")
    attempts: int = Field(default=0, ge=0, description="Attempts created, over all cells.")
    attempts_running: int = Field(default=0, ge=0, description="Attempts running now.")
    subjects: list[SubjectSummary] = Field(
        default_factory=list,
        description="Per-subject summary, in the spec's subject order.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["subjectId"],
        },
    )
    budget: BudgetStatus | None = Field(default=None, description="Spending and the budget hold.")


# -- Cell -------------------------------------------------------------------------------


class ExperimentRef(ResourceModel):
    """The Experiment (same namespace) a cell belongs to."""

    name: str = Field(
        max_length=ids.ID_MAX_LENGTH,
        pattern=ids.EXPERIMENT_ID_PATTERN,
        description="The Experiment's metadata.name (its id).",
    )


class CellSpec(ResourceModel):
    """One task x repetition x subject of an experiment. Immutable."""

    experiment_ref: ExperimentRef
    task_id: str = Field(
        max_length=ids.ID_MAX_LENGTH, pattern=ids.ID_PATTERN, description="The task's id."
    )
    repetition: int = Field(ge=1, le=100_000, description="The repetition, from 1.")
    subject_id: str = Field(
        max_length=ids.ID_MAX_LENGTH, pattern=ids.ID_PATTERN, description="The subject's id."
    )
    group_id: str = Field(
        max_length=CELL_ID_MAX_LENGTH,
        description="`<taskId>::<repetition>`: the task group whose arms start together.",
    )
    cell_id: str = Field(
        max_length=CELL_ID_MAX_LENGTH,
        description="`<taskId>::<repetition>::<subjectId>`: the cell's id in results.",
    )

    @model_validator(mode="after")
    def _ids_agree(self) -> CellSpec:
        if self.cell_id != cell_id(self.task_id, self.repetition, self.subject_id):
            raise ValueError("cellId does not match taskId, repetition and subjectId")
        if self.group_id != group_id(self.task_id, self.repetition):
            raise ValueError("groupId does not match taskId and repetition")
        return self


class CellPhase(StrEnum):
    """Where a cell is."""

    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    """An attempt is selected as the cell's result."""
    FAILED = "Failed"
    """The retries are used up and no attempt is a result."""


class CellStatus(ResourceModel):
    """What the operator observed of a cell; the selected attempt never changes once set."""

    observed_generation: int | None = OBSERVED_GENERATION
    phase: CellPhase | None = Field(default=None, description="Where the cell is.")
    attempts: int = Field(
        default=0, ge=0, le=MAX_ATTEMPTS, description="Attempts of this cell that have ended."
    )
    selected_attempt: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ATTEMPTS,
        description="Number of the attempt selected as the cell's result (the earliest "
        "valid one). Write-once.",
    )
    status: AttemptStatus | None = Field(default=None, description="The selected attempt's status.")
    score: float | None = Field(default=None, description="The selected attempt's score.")
    rerun_tokens: list[str] = Field(
        default_factory=list,
        max_length=MAX_RERUN_TOKENS,
        description="eval.maka.dev/rerun annotation values already answered with an attempt "
        "(the same token twice does nothing).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    conditions: list[Condition] = CONDITIONS


# -- Attempt ----------------------------------------------------------------------------


class AttemptSpec(ResourceModel):
    """One attempt of one cell: which, its number and why it runs. Frozen."""

    cell_name: str = Field(
        max_length=DNS_SUBDOMAIN_MAX_LENGTH,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="metadata.name of the Cell (same namespace).",
    )
    cell_id: str = Field(max_length=CELL_ID_MAX_LENGTH, description="The cell's id.")
    number: int = Field(ge=1, le=MAX_ATTEMPTS, description="Numbered per cell from 1.")
    trigger: Trigger = Field(description="Why it was started.")
    request: str | None = Field(
        default=None,
        max_length=REQUEST_MAX_LENGTH,
        description="The rerun token this attempt answers (trigger manual).",
    )
    attempt_id: str = Field(
        min_length=1,
        max_length=ATTEMPT_ID_MAX_LENGTH,
        description="Unique across runs; every process of the attempt carries it.",
    )


class AttemptPhase(StrEnum):
    """Where an attempt is; how it ended is in result.status."""

    PENDING = "Pending"
    RUNNING = "Running"
    FINISHED = "Finished"


class AttemptStatusBlock(ResourceModel):
    """What the operator observed of an attempt; `result` is written once."""

    observed_generation: int | None = OBSERVED_GENERATION
    phase: AttemptPhase | None = Field(default=None, description="Where the attempt is.")
    pod_name: str | None = Field(
        default=None, max_length=DNS_SUBDOMAIN_MAX_LENGTH, description="The attempt's Pod."
    )
    started_at: datetime | None = Field(default=None, description="When the Pod started.")
    finished_at: datetime | None = Field(default=None, description="When the result arrived.")
    result: KernelModel | None = Field(
        default=None,
        description="The result kernel from the relay. Write-once: never changed or removed.",
    )
    conditions: list[Condition] = CONDITIONS
