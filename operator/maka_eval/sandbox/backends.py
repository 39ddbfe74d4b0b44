"""The sandbox registry: a backend's kind -> the object that makes its sandboxes.

A sandbox backend is where one attempt's subject and verifier run (processes of this
machine, the task's container image, or a third party's: a cloud sandbox, a VM). It is
the extension point for *where* an attempt runs; everything else (launch, the egress
gate, result frames, metering, the status rules, redaction, records) stays maka-eval's.

maka-eval's own backends (`process`, `container`) are built in: the relay carries this
package into task containers without its distribution metadata, so they are found
without entry points. Others are found through the Python entry-point group
`maka_eval.sandboxes` of the installed distributions (`kind = "module:object"`, the
object a `SandboxBackend` or a class whose no-argument call returns one), read once per
process and loaded only when a plan names their kind. `maka_eval.sandbox.selfcheck`
is the conformance kit a backend runs against itself.

Standard library only at import time (the relay imports it in a Pod).
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from maka_eval.engine.modes import Isolation
from maka_eval.sandbox.base import Layout, Network, Sandbox

if TYPE_CHECKING:
    from maka_eval.processes.supervisor import ProcessSupervisor
    from maka_eval.sandbox.holders import NamespacePool
    from maka_eval.sandbox.plans import ContainerPlan

ENTRY_POINT_GROUP = "maka_eval.sandboxes"
"""The Python entry-point group sandbox backends register in."""

BUILTIN: Mapping[str, str] = {
    "process": "maka_eval.sandbox.process:BACKEND",
    "container": "maka_eval.sandbox.container.backend:BACKEND",
}
"""maka-eval's own backends (also registered as entry points, for listing)."""


@dataclass(frozen=True)
class SandboxRequest:
    """Everything a backend is given to make one attempt's sandbox."""

    supervisor: ProcessSupervisor
    """Starts, waits for and ends the attempt's programs (`SandboxBase` uses it)."""
    attempt_id: str
    layout: Layout
    """The attempt's host folders and where each is seen inside."""
    isolation: Isolation = Isolation.NAMESPACES
    """What the plan asks of a backend that can give several (the process backend)."""
    network: Network | None = None
    """The cell's policed network namespace to join, when egress is enforced."""
    container: ContainerPlan | None = None
    """The task's image and its settings, when the task ships one."""
    task_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Names to tag what the backend makes with (cell and run ids), for clean-up."""
    pool: NamespacePool | None = None
    """Ready-made namespaces the local executor keeps (process backend only)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Backend-specific settings, as the plan carries them (JSON values)."""


@runtime_checkable
class SandboxBackend(Protocol):
    """What a registered backend object implements."""

    kind: str

    def unavailable(self, request: SandboxRequest | None = None) -> str | None:
        """Why this machine cannot make this backend's sandboxes (one line naming the
        fix), or None when it can; checked before any attempt starts."""

    def create(self, request: SandboxRequest) -> Sandbox:
        """A new, not yet started sandbox for one attempt."""


class SandboxLoadError(Exception):
    """A registered backend could not be loaded or does not implement the interface."""


@functools.cache
def _points() -> Mapping[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, point)
    return found


def installed_kinds() -> tuple[str, ...]:
    """Every kind a plan may name: the built-ins first, then the registered ones."""
    return (*BUILTIN, *sorted(k for k in _points() if k not in BUILTIN))


def kind_problem(kind: str) -> str | None:
    """Why `kind` names no backend here (naming those installed and the fix), or None."""
    if kind in BUILTIN or kind in _points():
        return None
    kinds = ", ".join(f"'{k}'" for k in installed_kinds())
    return (
        f"no sandbox backend '{kind}' is installed (installed: {kinds}); install a package "
        f"that registers it in the '{ENTRY_POINT_GROUP}' entry-point group"
    )


def refresh() -> None:
    """Forget what was read (after installing a package into a running process)."""
    _points.cache_clear()
    with _lock:
        _loaded.clear()


_lock = threading.Lock()
_loaded: dict[str, SandboxBackend] = {}


def _resolve(kind: str) -> object:
    if kind in BUILTIN:
        module, _, name = BUILTIN[kind].partition(":")
        return getattr(importlib.import_module(module), name)
    point = _points().get(kind)
    if point is None:
        raise KeyError(kind_problem(kind))
    return point.load()


def load(kind: str) -> SandboxBackend:
    """The backend registered as `kind` (loaded once per process).

    KeyError (whose message is `kind_problem`'s) when none is; SandboxLoadError when it
    cannot be imported or does not implement `SandboxBackend`.
    """
    with _lock:
        backend = _loaded.get(kind)
    if backend is not None:
        return backend
    try:
        found = _resolve(kind)
    except KeyError:
        raise
    except Exception as exc:
        raise SandboxLoadError(
            f"sandbox backend '{kind}' could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(found, type):
        found = found()
    if not isinstance(found, SandboxBackend):
        raise SandboxLoadError(
            f"sandbox backend '{kind}' ({type(found).__name__}) does not implement "
            "maka_eval.sandbox.backends.SandboxBackend (kind, unavailable, create)"
        )
    with _lock:
        return _loaded.setdefault(kind, found)
