"""Subjects: the agents under test. One model per kind, told apart by `kind`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from maka_eval.engine.classify import ResultContract
from maka_eval.spec.base import EnvName, Id, NonBlank, SpecModel, SubjectEnvName, Text

SessionProfile = Literal["headless-coding-v1"]


class ExternalSubjectConfig(SpecModel):
    """An external command run as the subject."""

    command: NonBlank = Field(
        description=(
            "Program to run. A relative path containing '/' is resolved from the "
            "experiment file's directory; a bare name is looked up on PATH."
        )
    )
    args: tuple[Text, ...] = Field(default=(), description="Arguments passed to the command.")
    env: dict[SubjectEnvName, Text] = Field(
        default_factory=dict,
        description="Non-secret environment values. Secrets belong in `credentials`.",
    )
    credential_bindings: dict[SubjectEnvName, EnvName] = Field(
        default_factory=dict,
        description=(
            "Target variable name -> declared credential it receives. Declared credentials "
            "without a binding are passed under their own name."
        ),
    )
    result_contract: ResultContract = Field(
        default=ResultContract.EXIT_CODE,
        description=(
            "'exit-code': stdout is not parsed, exit 0 means completed; usage and cost "
            "are what the egress proxy metered (else null). 'protocol-v1': the subject "
            "writes a bounded result frame (at most 64 KiB) to the file named by "
            "MAKA_EVAL_RESULT_FILE."
        ),
    )


class MakaSubjectConfig(SpecModel):
    """A Maka subject, run through the executor's Runtime Host with a frozen profile."""

    profile: SessionProfile = Field(
        default="headless-coding-v1",
        description=(
            "Frozen session profile the Runtime Host runs the subject with "
            "(default: headless-coding-v1)."
        ),
    )
    model: NonBlank | None = Field(default=None, description="Model the Runtime Host uses.")
    args: tuple[Text, ...] = Field(
        default=(), description="Extra arguments appended to the Runtime Host command."
    )


class OracleSubjectConfig(SpecModel):
    """The oracle runs each task's own `solution/solve.sh` (Harbor's oracle agent)."""


class NopSubjectConfig(SpecModel):
    """The nop subject does nothing (Harbor's nop agent): a task's floor score."""


class _SubjectBase(SpecModel):
    id: Id = Field(description="Subject id; unique in the experiment.")
    credentials: tuple[EnvName, ...] = Field(
        default=(),
        description=(
            "Names of the credential environment variables this subject receives; "
            "it receives no other secret."
        ),
    )


class ExternalSubject(_SubjectBase):
    """An agent run as an external command."""

    kind: Literal["external"]
    config: ExternalSubjectConfig


class MakaSubject(_SubjectBase):
    """A Maka agent run by the Runtime Host (protocol-v1 result)."""

    kind: Literal["maka"]
    config: MakaSubjectConfig


class OracleSubject(_SubjectBase):
    """Harbor's oracle: applies the task's reference solution (validates tasks)."""

    kind: Literal["oracle"]
    config: OracleSubjectConfig = Field(default_factory=OracleSubjectConfig)


class NopSubject(_SubjectBase):
    """Does nothing and exits 0: what the verifier scores is the untouched environment
    (a valid task scores 0 here and 1 with the oracle)."""

    kind: Literal["nop"]
    config: NopSubjectConfig = Field(default_factory=NopSubjectConfig)


Subject = Annotated[
    ExternalSubject | MakaSubject | OracleSubject | NopSubject, Field(discriminator="kind")
]
