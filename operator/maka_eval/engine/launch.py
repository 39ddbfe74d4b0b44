"""How a subject becomes a process: argv, environment and credential bindings.

One module for every executor: the local executor, the relay program and the pod
builder all launch subjects as a `SubjectLaunch` (built from the spec's subject by
spec.subjects.subject_launch, with the host paths they use passed in as parameters),
and every subject's environment starts from `FIXED_ENV`. The spec's reserved names are
derived from here, so a spec can never set a variable the launch would silently
overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maka_eval.engine.classify import ResultContract

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
