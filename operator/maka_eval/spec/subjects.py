"""Subjects: the agents under test. One model per kind, told apart by `kind`, and how
each kind is launched (`subject_launch`, the engine's `SubjectLaunch`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import SOLUTION_DIR_NAME, SubjectLaunch, credential_targets
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


def subject_launch(
    subject: Subject,
    *,
    program: str | None = None,
    runtime_host_args: tuple[str, ...] = (),
    solution_dir: str | None = None,
    solution_script: str | None = None,
    solution_env: Mapping[str, str] | None = None,
) -> SubjectLaunch:
    """How to start `subject`.

    `program` is the resolved command of an external subject, or the Runtime Host of a
    maka subject; `solution_dir` is where the task's solution is read from and
    `solution_script` where its `solve.sh` will be inside the attempt (the oracle).
    """
    if isinstance(subject, ExternalSubject):
        assert program is not None, "an external subject needs its resolved command"
        config = subject.config
        return SubjectLaunch(
            argv=(program, *config.args),
            contract=ResultContract(config.result_contract),
            env=dict(config.env),
            credentials=credential_targets(subject.credentials, config.credential_bindings),
        )
    if isinstance(subject, MakaSubject):
        assert program is not None, "a maka subject needs the Runtime Host command"
        maka = subject.config
        model = ("--model", maka.model) if maka.model else ()
        return SubjectLaunch(
            argv=(
                program,
                *runtime_host_args,
                "--session-profile",
                maka.profile,
                *model,
                *maka.args,
            ),
            contract=ResultContract.PROTOCOL_V1,
            credentials=credential_targets(subject.credentials, {}),
        )
    if isinstance(subject, NopSubject):
        return SubjectLaunch(
            argv=("true",),
            contract=ResultContract.EXIT_CODE,
            credentials=credential_targets(subject.credentials, {}),
        )
    assert isinstance(subject, OracleSubject)
    assert solution_dir is not None and solution_script is not None
    return SubjectLaunch(
        argv=(solution_script,),
        contract=ResultContract.EXIT_CODE,
        env=dict(solution_env or {}),
        credentials=credential_targets(subject.credentials, {}),
        extra_dirs={SOLUTION_DIR_NAME: solution_dir},
    )
