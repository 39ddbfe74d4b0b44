"""The environment a subject and a verifier start with, built from nothing.

Nothing of the relay's own environment leaks through except PATH: a subject sees its
declared non-secret values, its declared credentials (under their bound names), the
attempt's MAKA_EVAL_* variables, and the fixed DEBIAN_FRONTEND and TZ -- an interactive
package prompt in an unattended run is indistinguishable from a hung command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from maka_eval.engine.launch import FIXED_ENV
from maka_eval.relay.processes import MARKER_VARIABLE

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MissingCredential(Exception):
    """A declared credential has no value in the relay's environment."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"the credential {name} is not set in the environment")


def base_environment(
    *, attempt_id: str, home: str, tmp: str, host_env: Mapping[str, str]
) -> dict[str, str]:
    """What every process of the attempt gets."""
    return {
        "PATH": host_env.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "TMPDIR": tmp,
        **FIXED_ENV,
        MARKER_VARIABLE: attempt_id,
    }


def resolve_credentials(bindings: Mapping[str, str], host_env: Mapping[str, str]) -> dict[str, str]:
    """target name -> value, for each target -> source binding (MissingCredential if unset)."""
    values = {}
    for target, source in bindings.items():
        value = host_env.get(source)
        if not value:
            raise MissingCredential(source)
        values[target] = value
    return values


def subject_environment(
    base: Mapping[str, str],
    attempt_vars: Mapping[str, str],
    declared_env: Mapping[str, str],
    credentials: Mapping[str, str],
) -> dict[str, str]:
    """The subject's environment: base, its declared env, credentials, MAKA_EVAL_*."""
    env = dict(declared_env)
    env.update(credentials)
    env.update(attempt_vars)
    env.update(base)  # fixed values last: a spec cannot override them
    return env


def host_environment() -> Mapping[str, str]:
    """The relay's own environment (where credential values are read from)."""
    return os.environ
