"""Identifier and name rules shared by the spec models.

Ids end up in file names, Kubernetes label values and cell ids (`task::rep::subject`),
so they are restricted to what all three accept.
"""

from __future__ import annotations

import re

# Kubernetes label value: at most 63 characters, alphanumeric at both ends, `-_.` inside.
ID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
# The experiment id also names Kubernetes objects: a DNS-1123 label.
EXPERIMENT_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

_ID = re.compile(ID_PATTERN)
_EXPERIMENT_ID = re.compile(EXPERIMENT_ID_PATTERN)
_ENV_NAME = re.compile(ENV_NAME_PATTERN)

# Variables the relay sets for every subject; a spec may not override them.
RESERVED_ENV_NAMES = frozenset({"DEBIAN_FRONTEND", "TZ", "PATH", "HOME", "TMPDIR"})
RESERVED_ENV_PREFIX = "MAKA_EVAL_"


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid task/subject id, or None when it is."""
    if _ID.fullmatch(value):
        return None
    if not value:
        return "an id must not be empty"
    if len(value) > 63:
        return f"'{value[:20]}...' is {len(value)} characters; ids are at most 63"
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
        f"at most 63 characters, starting and ending with a letter or digit{suggestion}; "
        "it names Kubernetes objects"
    )


def env_name_problem(value: str) -> str | None:
    """Why `value` is not a valid environment variable name, or None."""
    if _ENV_NAME.fullmatch(value):
        return None
    return (
        f"'{value}' is not a valid environment variable name: use letters, digits and '_', "
        "not starting with a digit"
    )


def reserved_env_problem(value: str) -> str | None:
    """Why a spec may not set `value` in a subject's environment, or None."""
    if value in RESERVED_ENV_NAMES or value.startswith(RESERVED_ENV_PREFIX):
        return (
            f"'{value}' is set by maka-eval for every subject and cannot be overridden; "
            "choose another name"
        )
    return None


def cell_id(task_id: str, repetition: int, subject_id: str) -> str:
    """The cell id `<taskId>::<repetition>::<subjectId>` (repetition counts from 1)."""
    return f"{task_id}::{repetition}::{subject_id}"


def parse_cell_id(value: str) -> tuple[str, int, str] | None:
    """Split a cell id into (task, repetition, subject), or None if it is malformed."""
    parts = value.split("::")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    if id_problem(parts[0]) or id_problem(parts[2]) or int(parts[1]) < 1:
        return None
    return parts[0], int(parts[1]), parts[2]
