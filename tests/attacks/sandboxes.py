"""The sandboxes the attacks run in: executor configurations, and the marks that run a
test in each where this machine can make it (skipped with the reason where it cannot)."""

from __future__ import annotations

from typing import Any

import pytest

from maka_eval.sandbox.process import namespaces_unavailable
from tests.egress.policing import WHY_NOT as CANNOT_POLICE

ISOLATED: dict[str, Any] = {"kind": "local", "config": {"isolation": "namespaces"}}
"""The process sandbox: the attempt in namespaces of its own (bubblewrap)."""
POLICED: dict[str, Any] = {
    "kind": "local",
    "config": {"isolation": "namespaces", "sandbox": "process", "egress": {"mode": "proxy"}},
}
"""The process sandbox in the cell's policed network namespace (egress through its proxy)."""
CONTAINER: dict[str, Any] = {"kind": "local", "config": {"sandbox": "container"}}
"""The container sandbox (the task's image, on Podman)."""

NAMESPACES = [
    pytest.mark.slow,
    pytest.mark.skipif(
        namespaces_unavailable() is not None,
        reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
    ),
]
"""The marks (pytestmark) of a module whose attacks need the namespace sandbox."""

_POLICED = pytest.param(
    POLICED,
    marks=pytest.mark.skipif(
        CANNOT_POLICE is not None, reason=f"cannot police a cell here: {CANNOT_POLICE}"
    ),
    id="policed",
)
PROCESS_SANDBOXES = pytest.mark.parametrize(
    "executor", [pytest.param(ISOLATED, id="namespaces"), _POLICED]
)
"""Run the test in the process sandbox, without and with a policed network."""
EVERY_SANDBOX = pytest.mark.parametrize(
    "executor",
    [pytest.param(ISOLATED, id="namespaces"), _POLICED, pytest.param(CONTAINER, id="container")],
)
"""... and in the container sandbox too (the test asks for `container_engine` then)."""
