"""How a subject becomes a process: argv, environment and credential bindings.

One module for every executor: the local executor, the relay program and the pod
builder all launch subjects through `subject_launch`, with the host paths they use
passed in as parameters, and every subject's environment starts from `FIXED_ENV`. The
spec's reserved names are derived from here, so a spec can never set a variable the
launch would silently overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from maka_eval.engine.classify import ResultContract

if TYPE_CHECKING:
    from maka_eval.spec.subjects import Subject

FIXED_ENV: Mapping[str, str] = {
    # An interactive package prompt in an unattended run is indistinguishable from a hang.
    "DEBIAN_FRONTEND": "noninteractive",
    "TZ": "Etc/UTC",
    "LANG": "C.UTF-8",
}
"""Set for every subject and verifier, whatever the spec says."""

PER_ATTEMPT_ENV = ("PATH", "HOME", "TMPDIR")
"""Set for every attempt by the relay (a private home and temp folder)."""

ATTEMPT_ENV_PREFIX = "MAKA_EVAL_"
"""Every variable the relay sets to describe the attempt starts with this."""

RESERVED_ENV_NAMES = frozenset({*FIXED_ENV, *PER_ATTEMPT_ENV})


def is_reserved_env(name: str) -> bool:
    """Whether the launch sets `name` itself (a spec may not)."""
    return name in RESERVED_ENV_NAMES or name.startswith(ATTEMPT_ENV_PREFIX)


@dataclass(frozen=True)
class SubjectLaunch:
    """How to start the subject of one attempt."""

    argv: tuple[str, ...]
    contract: ResultContract
    env: Mapping[str, str] = field(default_factory=dict)
    """Declared non-secret values."""
    credentials: Mapping[str, str] = field(default_factory=dict)
    """Target variable name -> source credential name (the value is read where it runs)."""
    extra_dirs: Mapping[str, str] = field(default_factory=dict)
    """Task folders copied into the attempt for this subject only (the oracle's solution),
    name -> source folder."""


def credential_targets(declared: tuple[str, ...], bindings: Mapping[str, str]) -> dict[str, str]:
    """target variable -> source credential; unbound credentials keep their own name."""
    targets = dict(bindings)
    bound = set(bindings.values())
    for name in declared:
        if name not in bound:
            targets[name] = name
    return targets


SOLUTION_DIR_NAME = "solution"


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
    # Imported here: the relay bundle carries this module but never builds a launch.
    from maka_eval.spec.subjects import ExternalSubject, MakaSubject, NopSubject, OracleSubject

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
