"""What a sandbox backend is asked to run in: plain, JSON-serializable settings.

The relay's attempt plan (relay.plan) carries them and the sandbox acts on them, so
they live here, below both. Standard library and the engine's modes only: the relay
reads them in a Pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from maka_eval.engine.modes import NetworkMode


@dataclass(frozen=True)
class ContainerPlan:
    """How to run an attempt in the task's container image (the container sandbox)."""

    engine: str
    """Docker Engine API url (DOCKER_HOST form: unix:///run/docker.sock, tcp://h:2375)."""
    image: str
    """The image to run: task.toml's docker_image, or the tag an environment/Dockerfile
    is built under (maka-eval-task/<task>:<environment digest>)."""
    build_dir: str | None = None
    """environment/ folder to build `image` from when it is not in the engine yet."""
    build_timeout_sec: float = 600.0
    workdir: str | None = None
    """task.toml's workdir; else the image's WORKDIR; else / (the engine's default, as
    under Harbor)."""
    agent_user: str | None = None
    verifier_user: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int = 0
    network: NetworkMode = NetworkMode.PUBLIC
    """Harbor's network_mode: 'public' (the engine's default network), 'no-network', or
    'allowlist' (the cell's policed namespace, whose proxy keeps the allowlist)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """task.toml's [environment] env: set in the container for every process."""
    program: str | None = None
    """Host file of the subject's program, uploaded to /maka/bin/ (a subject named by a
    path); a program named without a path is looked up on the image's PATH."""
