"""The attempt record: one file per attempt, written once, never rewritten."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.engine.usage import Usage

RECORD_FORMAT: Literal["maka.eval.attempt.v1"] = "maka.eval.attempt.v1"
RUN_FORMAT = "maka.eval.run.v1"


class _Record(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


class UsageRecord(_Record):
    """Normalized token usage (input excludes cached input)."""

    input_tokens: int = Field(ge=0)
    cached_input_tokens: int = Field(ge=0)
    cache_write_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)

    @classmethod
    def of(cls, usage: Usage) -> UsageRecord:
        return cls.model_validate(usage.to_json())

    def usage(self) -> Usage:
        return Usage(
            self.input_tokens, self.cached_input_tokens, self.cache_write_tokens, self.output_tokens
        )


class ArtifactRef(_Record):
    """An artifact stored next to the record."""

    name: str
    bytes: int = Field(ge=0)
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    path: str = Field(description="Relative to the run directory.")


class ResultKernel(_Record):
    """What a result is: nothing else is part of it."""

    status: AttemptStatus
    score: float | None
    usage: UsageRecord | None
    cost_usd: float | None = Field(ge=0)
    duration_sec: float = Field(ge=0)
    artifacts: tuple[ArtifactRef, ...]


Trigger = Literal["scheduled", "retry", "manual"]


class AttemptRecord(_Record):
    """One attempt of one cell."""

    format: Literal["maka.eval.attempt.v1"] = RECORD_FORMAT
    run_id: str
    experiment_id: str
    cell_id: str
    task_id: str
    repetition: int = Field(ge=1)
    subject_id: str
    attempt: int = Field(ge=1, description="Numbered per cell from 1.")
    trigger: Trigger
    started_at: datetime
    subject_started_at: datetime | None
    finished_at: datetime
    result: ResultKernel
    status_source: StatusSource
    reason: str | None
    exit_code: int | None = None
    timings: dict[str, float]
    host: str
    maka_eval_version: str

    # -- what selection and summaries need ---------------------------------------
    @property
    def number(self) -> int:
        return self.attempt

    @property
    def status(self) -> AttemptStatus:
        return self.result.status

    def spending(self) -> tuple[Usage | None, float | None]:
        """(usage, cost) this attempt spent, for the shared budget."""
        return (self.result.usage.usage() if self.result.usage else None, self.result.cost_usd)

    def to_json_bytes(self) -> bytes:
        return (self.model_dump_json(by_alias=True, indent=2) + "\n").encode()


def utc_from_epoch(seconds: float) -> datetime:
    """A timezone-aware UTC datetime."""
    return datetime.fromtimestamp(seconds, tz=UTC)


def run_document(
    run_id: str, experiment: dict[str, Any], tasks: dict[str, str], version: str
) -> dict[str, Any]:
    """The content of experiment.json: the frozen experiment and its tasks' digests."""
    return {
        "format": RUN_FORMAT,
        "runId": run_id,
        "createdAt": datetime.now(tz=UTC).isoformat(),
        "makaEvalVersion": version,
        "experiment": experiment,
        "taskDigests": tasks,
    }
