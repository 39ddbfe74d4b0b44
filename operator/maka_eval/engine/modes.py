"""Network modes and isolation: the enums shared by the spec, the CRDs and the record,
and the one decision of how a task's cells reach the network.

Standard library only (the relay bundle carries this module). The values are the
strings records, CRDs and plans have always held, so serialized forms do not change.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class NetworkMode(StrEnum):
    """task.toml's `[environment] network_mode`, as Harbor names it."""

    PUBLIC = "public"
    """The environment's default network (the task's own; Harbor's default)."""
    NO_NETWORK = "no-network"
    """Loopback only (also `allow_internet = false`)."""
    ALLOWLIST = "allowlist"
    """Only the task's `allowed_hosts`, kept by the cell's egress proxy."""


class Isolation(StrEnum):
    """What separates a subject from the host and from other cells."""

    NAMESPACES = "namespaces"
    """Own PID, mount, IPC, UTS and network namespaces: the run folder, other cells,
    the task's tests and solution and the executor's processes are out of sight."""
    CONTAINER = "container"
    """The task's own container image, through a Docker Engine API (Docker or Podman):
    its own PID, mount, IPC, UTS and network namespaces, and only the files the image and
    the relay put there; the verifier's folders are made private to the verifier."""
    NONE = "none"
    """Plain processes of this machine: nothing is hidden (recorded as such)."""
    AUTO = "auto"
    """A request, never a record: namespaces where the machine (or a Pod's container)
    can make them, else none; resolved before the sandbox starts."""


REQUESTED_ISOLATIONS: Final = (Isolation.AUTO, Isolation.NAMESPACES, Isolation.NONE)
"""What the local executor's `isolation` setting may ask for, in the schema's order (a
container is asked for with `sandbox: container`). The spec's and the CRD's enum."""
RECORDED_ISOLATIONS: Final = tuple(i for i in Isolation if i is not Isolation.AUTO)
"""What a record may say separated a subject (AUTO is resolved before any sandbox)."""


class EgressMode(StrEnum):
    """How a cell reaches the network (executor.config.egress.mode, then per task)."""

    PROXY = "proxy"
    """A policed network whose only way out is the cell's egress proxy."""
    NONE = "none"
    """No network at all (loopback only)."""


def egress_mode(
    spec_mode: EgressMode | str | None, task_mode: NetworkMode | str
) -> EgressMode | None:
    """How the cells of a task reach the network: `spec_mode` is executor.config.egress's
    mode (None: no egress declared), `task_mode` the task's network_mode. None: not
    policed (the environment's own network). A task that allows no network gets none
    whatever the spec says; an 'allowlist' task is policed by the proxy, with or without
    a spec policy, unless the spec allows no network at all."""
    spec = EgressMode(spec_mode) if spec_mode is not None else None
    task = NetworkMode(task_mode)
    if task is NetworkMode.ALLOWLIST:
        return EgressMode.NONE if spec is EgressMode.NONE else EgressMode.PROXY
    if spec is None:
        return None
    return EgressMode.NONE if task is NetworkMode.NO_NETWORK else spec


def container_network(
    mode: EgressMode | None, policed: bool, task_mode: NetworkMode | str
) -> NetworkMode:
    """The network a task's container joins: none when the cell is policed but no policed
    network was made for it (`policed` False), else what the task asks for."""
    if mode is not None and not policed:
        return NetworkMode.NO_NETWORK
    return NetworkMode(task_mode)


def verifier_uses_proxy(task_mode: NetworkMode | str) -> bool:
    """Whether the verifier is told of the cell's proxy: only for a task whose own
    allowlist the proxy keeps (its tests may fetch from the hosts it lists)."""
    return NetworkMode(task_mode) is NetworkMode.ALLOWLIST


def needs_policing(task_mode: NetworkMode | str) -> bool:
    """Whether a cell of this task needs a policed network when egress is declared (a
    task that allows no network needs none: it gets loopback only)."""
    return NetworkMode(task_mode) is not NetworkMode.NO_NETWORK
