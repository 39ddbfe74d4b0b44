"""The base model and constrained string types every spec model uses.

Models are strict (no coercion: `version: 1.0` is a number, not a string), reject unknown
fields and non-finite numbers, are frozen once parsed, and use camelCase names on the
wire because the same models generate the Kubernetes CRD schemas.

A constrained string carries its rule twice, on purpose: an `AfterValidator(Check(...))`
that validates with a friendly message, and a `SchemaOnly` with the pattern and length
the JSON schema (and so the CRD) shows. tests/spec/test_schema.py checks that they agree
or that the rule is listed in `rules.CROSS_FIELD_RULES`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from maka_eval.spec import ids
from maka_eval.spec.paths import task_path_problem


class SpecModel(BaseModel):
    """Base of every experiment-document model."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=False,
        allow_inf_nan=False,
    )


ValueRule = Callable[[str], str | None]
"""Returns None for a good value, else the message naming the fix."""


class Check:
    """A single-value rule: `problem(value)` is None, or the message naming the fix."""

    def __init__(self, problem: ValueRule) -> None:
        self.problem = problem

    def __call__(self, value: str) -> str:
        message = self.problem(value)
        if message:
            raise PydanticCustomError("maka_invalid", message)
        return value

    def __repr__(self) -> str:
        return f"Check({self.problem.__name__})"


class SchemaOnly:
    """JSON-schema keywords mirroring a `Check`; they never validate (the Check does)."""

    def __init__(self, **keywords: Any) -> None:
        self.keywords: Mapping[str, Any] = keywords

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema.update(self.keywords)
        return schema


# Every character str.strip() removes (str.isspace), as literal characters so the pattern
# means the same in Python, ECMA-262 (JSON schema) and RE2 (Kubernetes).
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(
    map(chr, [*range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
)
NONBLANK_PATTERN = "[^\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
"""Matches (unanchored, as JSON schema patterns do) a string with a non-blank character."""


def blank_problem(value: str) -> str | None:
    """Why `value` is unusable as a required text (empty or only spaces), or None."""
    return None if value.strip() else "must not be empty"


def nul_problem(value: str) -> str | None:
    """Why `value` cannot reach a program (a NUL byte ends C strings), or None."""
    if "\0" in value:
        return (
            "contains a NUL byte (\\u0000), which no argument, environment value or path "
            "can carry; remove it"
        )
    return None


def _rule(problem: ValueRule) -> AfterValidator:
    return AfterValidator(Check(problem))


Id = Annotated[
    str,
    _rule(ids.id_problem),
    SchemaOnly(pattern=ids.ID_PATTERN, maxLength=ids.ID_MAX_LENGTH),
]
ExperimentId = Annotated[
    str,
    _rule(ids.experiment_id_problem),
    SchemaOnly(pattern=ids.EXPERIMENT_ID_PATTERN, maxLength=ids.ID_MAX_LENGTH),
]
EnvName = Annotated[
    str,
    _rule(ids.env_name_problem),
    SchemaOnly(pattern=ids.ENV_NAME_PATTERN, maxLength=ids.ENV_NAME_MAX_LENGTH),
]
SubjectEnvName = Annotated[
    str,
    _rule(ids.env_name_problem),
    _rule(ids.reserved_env_problem),
    SchemaOnly(pattern=ids.ENV_NAME_PATTERN, maxLength=ids.ENV_NAME_MAX_LENGTH),
]
Text = Annotated[str, _rule(nul_problem)]
"""Free text handed to a program (an argument, an environment value)."""
NonBlank = Annotated[
    str, _rule(blank_problem), _rule(nul_problem), SchemaOnly(pattern=NONBLANK_PATTERN)
]
TaskPath = Annotated[NonBlank, _rule(task_path_problem)]


PositiveSeconds = Annotated[float, Field(gt=0, le=7 * 24 * 3600)]

# -- Kubernetes values (the kubernetes executor's settings) ---------------------------
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
K8S_NAME_MAX_LENGTH = 253
QUANTITY_PATTERN = (
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$"
)
_K8S_NAME = re.compile(K8S_NAME_PATTERN)
_QUANTITY = re.compile(QUANTITY_PATTERN)


def k8s_name_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes object name (a DNS subdomain), or None."""
    if len(value) > K8S_NAME_MAX_LENGTH or not _K8S_NAME.fullmatch(value):
        return (
            f"'{value[:40]}' is not a Kubernetes name: lowercase letters, digits, '-' and "
            f"'.', starting and ending with a letter or digit, at most {K8S_NAME_MAX_LENGTH}"
        )
    return None


def quantity_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes quantity, or None."""
    if len(value) > 64 or not _QUANTITY.fullmatch(value):
        return f"'{value[:40]}' is not a Kubernetes quantity (e.g. 500m, 2, 4Gi)"
    return None


K8sName = Annotated[
    str,
    _rule(k8s_name_problem),
    SchemaOnly(pattern=K8S_NAME_PATTERN, maxLength=K8S_NAME_MAX_LENGTH),
]
Quantity = Annotated[
    str, _rule(quantity_problem), SchemaOnly(pattern=QUANTITY_PATTERN, maxLength=64)
]

SHA256_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_SHA256_DIGEST = re.compile(SHA256_DIGEST_PATTERN)


def sha256_digest_problem(value: str) -> str | None:
    """Why `value` is not a `sha256:<64 lowercase hex>` digest, or None."""
    if _SHA256_DIGEST.fullmatch(value):
        return None
    return (
        f"'{value[:80]}' is not a digest: write 'sha256:' and 64 lowercase hex digits, "
        "as hack/build-images.sh prints it"
    )


Sha256Digest = Annotated[
    str, _rule(sha256_digest_problem), SchemaOnly(pattern=SHA256_DIGEST_PATTERN, maxLength=71)
]
