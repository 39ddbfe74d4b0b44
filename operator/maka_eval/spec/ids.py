"""Identifier and name rules shared by the spec models.

Ids end up in file names, Kubernetes label values and cell ids (`task::rep::subject`),
so they are restricted to what all three accept. Each rule is a function returning the
friendly message (used by validation) plus a pattern and length for the JSON schema;
tests check that the two agree.
"""

from __future__ import annotations

import re

from maka_eval.engine.launch import is_reserved_env

ID_MAX_LENGTH = 63
# Kubernetes label value: at most 63 characters, alphanumeric at both ends, `-_.` inside.
ID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
# The experiment id also names Kubernetes objects: a DNS-1123 label.
EXPERIMENT_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME_MAX_LENGTH = 255
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

_ID = re.compile(ID_PATTERN)
_EXPERIMENT_ID = re.compile(EXPERIMENT_ID_PATTERN)
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid task/subject id, or None when it is."""
    if _ID.fullmatch(value):
        return None
    if not value:
        return "an id must not be empty"
    if len(value) > ID_MAX_LENGTH:
        return f"'{value[:20]}...' is {len(value)} characters; ids are at most {ID_MAX_LENGTH}"
    return (
        f"'{value}' is not a valid id: use letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit (it becomes a file name and a "
        "Kubernetes label value)"
    )


def experiment_id_problem(value: str) -> str | None:
    """Why `value` is not a valid experiment id (DNS-1123 label), or None."""
    if _EXPERIMENT_ID.fullmatch(value):
        return None
    hint = value.lower().replace("_", "-").replace(".", "-")
    suggestion = f" (e.g. '{hint}')" if _EXPERIMENT_ID.fullmatch(hint) else ""
    return (
        f"'{value}' is not a valid experiment id: use lowercase letters, digits and '-', "
        f"at most {ID_MAX_LENGTH} characters, starting and ending with a letter or digit"
        f"{suggestion}; it names Kubernetes objects"
    )


def env_name_problem(value: str) -> str | None:
    """Why `value` is not a valid environment variable name, or None."""
    if len(value) > ENV_NAME_MAX_LENGTH:
        return (
            f"'{value[:20]}...' is {len(value)} characters; environment variable names "
            f"are at most {ENV_NAME_MAX_LENGTH}"
        )
    if _ENV_NAME.fullmatch(value):
        return None
    return (
        f"'{value}' is not a valid environment variable name: use letters, digits and '_', "
        "not starting with a digit"
    )


def reserved_env_problem(value: str) -> str | None:
    """Why a spec may not set `value` in a subject's environment, or None.

    The reserved names come from the launch itself (engine/launch.py), so the spec
    refuses exactly what the launch would silently overwrite.
    """
    if is_reserved_env(value):
        return (
            f"'{value}' is set by maka-eval for every subject and cannot be overridden; "
            "choose another name"
        )
    return None
