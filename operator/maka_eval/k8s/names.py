"""Deterministic, DNS-safe object names and the labels every object carries.

A name is a readable prefix plus a short hash of the real ids, so two cells never share
a name however their ids are cut, and the operator finds an object again by computing
its name (creating an existing name is a harmless 409, never a duplicate). The real ids
live in spec fields and labels.
"""

from __future__ import annotations

import hashlib
import re

from maka_eval.spec.experiment import API_GROUP

LABEL_EXPERIMENT = f"{API_GROUP}/experiment"
LABEL_EXPERIMENT_UID = f"{API_GROUP}/experiment-uid"
"""Tells apart the objects of an Experiment deleted and created again under its name."""
LABEL_TASK = f"{API_GROUP}/task"
LABEL_REPETITION = f"{API_GROUP}/repetition"
LABEL_SUBJECT = f"{API_GROUP}/subject"
LABEL_GROUP = f"{API_GROUP}/task-group"
"""A hash of the group id (`<task>::<rep>` does not fit a label value's rules)."""
LABEL_CELL = f"{API_GROUP}/cell"
LABEL_ATTEMPT = f"{API_GROUP}/attempt"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "maka-eval"

RERUN_ANNOTATION = f"{API_GROUP}/rerun"
"""`kubectl annotate cell <name> eval.maka.dev/rerun=<token>`: one more attempt."""
GROUP_GATE = f"{API_GROUP}/task-group"
"""The scheduling gate held on every arm's Pod until all arms of the group exist."""

_PREFIX_LENGTH = 45
_HASH_LENGTH = 10
_UNSAFE = re.compile(r"[^a-z0-9-]+")


def short_hash(*parts: str) -> str:
    """Ten hex digits of sha256 over the parts (NUL-separated)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:_HASH_LENGTH]


def _readable(*parts: str) -> str:
    text = _UNSAFE.sub("-", "-".join(parts).lower()).strip("-")
    return re.sub(r"-{2,}", "-", text)[:_PREFIX_LENGTH].strip("-") or "x"


def cell_name(
    experiment: str, experiment_uid: str, task_id: str, repetition: int, subject_id: str
) -> str:
    """The Cell's metadata.name: at most 56 characters, so attempt names stay labels.
    The hash covers the Experiment's uid: an Experiment deleted and applied again never
    meets the old one's objects, which the garbage collector may not have removed yet."""
    prefix = _readable(experiment, task_id, str(repetition), subject_id)
    digest = short_hash(experiment, experiment_uid, task_id, str(repetition), subject_id)
    return f"{prefix}-{digest}"


def attempt_name(cell: str, number: int) -> str:
    """The Attempt's (and its Pod's and NetworkPolicy's) metadata.name."""
    return f"{cell}-{number}"


def egress_secret_name(attempt: str) -> str:
    """The Secret holding an attempt's egress credential and policy (its sidecar's)."""
    return f"{attempt}-egress"


def group_label(experiment: str, group_id: str) -> str:
    """The value of LABEL_GROUP for a task group."""
    return short_hash(experiment, group_id)
