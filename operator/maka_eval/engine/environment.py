"""Two task.toml settings (Harbor 0.26) that the relay carries out in a task's
environment: the healthcheck it waits on before the subject, and the artifacts it
collects after. Read from task.toml by spec.task_directory, carried to the relay in its
plan (relay.plan), acted on by relay.attempt. Standard library only: the relay bundle
runs it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Healthcheck:
    """task.toml `healthcheck` (Docker HEALTHCHECK semantics): `command` runs with bash
    in the environment until it exits 0; failures in the first `start_period_sec` do not
    count, and `retries` consecutive failures after it mean the environment never
    became healthy."""

    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Healthcheck | None:
        """What `dataclasses.asdict` made of one (None stays None)."""
        return cls(**data) if data is not None else None


@dataclass(frozen=True)
class TaskArtifact:
    """One entry of task.toml `artifacts`: a path in the environment collected once the
    subject is done, before the verifier runs."""

    source: str
    """Absolute, or relative to the workdir."""
    destination: str | None = None
    """Where it goes among the attempt's artifacts (relative); None: its source path."""
    exclude: tuple[str, ...] = ()
    """Patterns of files not to keep from a folder (matched on the path in the folder
    and on the file's name)."""

    @classmethod
    def from_dicts(cls, data: Sequence[Mapping[str, Any]]) -> tuple[TaskArtifact, ...]:
        """What `dataclasses.asdict` made of some."""
        return tuple(
            cls(d["source"], d.get("destination"), tuple(d.get("exclude", ()))) for d in data
        )
