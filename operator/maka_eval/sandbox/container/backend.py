"""The `container` sandbox backend as the registry knows it (maka_eval.sandbox.backends)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from maka_eval.sandbox.container.engine import engine_info
from maka_eval.sandbox.container.sandbox import ContainerSandbox

if TYPE_CHECKING:
    from maka_eval.sandbox.backends import SandboxRequest


class ContainerBackend:
    """The `container` backend: the task's image through a Docker Engine API."""

    kind = "container"

    def unavailable(self, request: SandboxRequest | None = None) -> str | None:
        """Why no engine answers (at the plan's address, else at the usual ones)."""
        env = {"DOCKER_HOST": request.container.engine} if request and request.container else None
        probe = engine_info(env)
        return None if probe.engine is not None else probe.why_none()

    def create(self, request: SandboxRequest) -> ContainerSandbox:
        """A container sandbox for the request's container plan."""
        if request.container is None:
            raise ValueError("the container sandbox needs the task's container plan")
        return ContainerSandbox(
            request.supervisor,
            request.attempt_id,
            request.layout,
            request.container,
            task_id=request.task_id,
            labels=request.labels,
            network=request.network,
        )


BACKEND = ContainerBackend()
