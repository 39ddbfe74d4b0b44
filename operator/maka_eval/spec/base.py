"""The base model and constrained string types every spec model uses.

Models are strict (no coercion: `version: 1.0` is a number, not a string), reject unknown
fields, are frozen once parsed, and use camelCase names on the wire because the same
models generate the Kubernetes CRD schemas.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from maka_eval.spec import ids


class SpecModel(BaseModel):
    """Base of every experiment-document model."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
    )


def _checked(problem: object) -> AfterValidator:
    def check(value: str) -> str:
        message = problem(value)  # type: ignore[operator]
        if message:
            raise PydanticCustomError("maka_invalid", message)
        return value

    return AfterValidator(check)


def _nonblank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("maka_invalid", "must not be empty")
    return value


Id = Annotated[str, _checked(ids.id_problem)]
ExperimentId = Annotated[str, _checked(ids.experiment_id_problem)]
EnvName = Annotated[str, _checked(ids.env_name_problem)]
SubjectEnvName = Annotated[str, _checked(ids.env_name_problem), _checked(ids.reserved_env_problem)]
NonBlank = Annotated[str, AfterValidator(_nonblank)]
PositiveSeconds = Annotated[float, Field(gt=0, le=7 * 24 * 3600)]
