"""Harbor's Podman environment, able to run no-network tasks without a registry.

Stock Harbor enforces `network_mode = "no-network"` (and `allow_internet = false`) with
an egress-control sidecar whose image must be pulled or built from a pulled base; on a
machine without a registry the whole job aborts. This subclass applies Harbor's own
`network_mode: none` compose overlay to the task's main service instead: the container
has no network but loopback, which is what the task asks for. Allowlist tasks still need
the sidecar, so they fail the way stock Harbor does (an environment error of that trial).
Loaded by import path: `maka_eval_harbor.environment:OfflinePodmanEnvironment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.docker import COMPOSE_NO_NETWORK_PATH
from harbor.environments.podman import PodmanEnvironment
from harbor.models.task.config import NetworkMode, NetworkPolicy


def _restricted(policy: NetworkPolicy | None) -> bool:
    return policy is not None and policy.network_mode == NetworkMode.NO_NETWORK


class OfflinePodmanEnvironment(PodmanEnvironment):  # type: ignore[misc]
    """PodmanEnvironment whose no-network policy is `network_mode: none`, no sidecar."""

    def __init__(
        self,
        *args: Any,
        network_policy: NetworkPolicy | None = None,
        phase_network_policies: Sequence[NetworkPolicy] | None = None,
        extra_docker_compose: Sequence[Path | str] | None = None,
        **kwargs: Any,
    ) -> None:
        phases = list(phase_network_policies or ())
        # Only when every phase is no-network: a task that opens the network in one phase
        # needs Harbor's dynamic policy (the sidecar), as stock Harbor does.
        self._maka_no_network = _restricted(network_policy) and all(_restricted(p) for p in phases)
        overlays = list(extra_docker_compose or ())
        if self._maka_no_network:
            overlays.append(COMPOSE_NO_NETWORK_PATH)
        super().__init__(
            *args,
            network_policy=network_policy,
            phase_network_policies=phases,
            extra_docker_compose=overlays,
            **kwargs,
        )

    @classmethod
    def _egress_control_kernel_support(cls) -> bool:
        # The sidecar's probe image cannot be pulled offline; the overlay replaces it.
        return False

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        caps: EnvironmentCapabilities = super().capabilities
        if getattr(self, "_maka_no_network", False):
            return caps.model_copy(update={"disable_internet": True})
        return caps
