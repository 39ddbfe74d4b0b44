"""The executor registry: `executor.kind` -> the plug-in registered under that name.

Executors are found through the Python entry-point group `maka_eval.executors` of the
installed distributions (maka-eval's own `local` and `kubernetes` are registered the same
way, in its pyproject.toml). Entry points are read once per process and loaded only when
an experiment names their kind.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points

from maka_eval.executors.base import ENTRY_POINT_GROUP, ExecutorPlugin

BUILTIN_KINDS = ("local", "kubernetes")
"""Kinds whose configuration is part of maka-eval's own schema (and CRD)."""

INSTALL_HINT = (
    f"install a package that registers it in the '{ENTRY_POINT_GROUP}' entry-point group "
    "(pip install <package> into the environment maka-eval runs from); see docs/executors.md"
)

REFUSED_KINDS: Mapping[str, str] = {
    "pier": (
        "'pier' has no public implementation maka-eval could drive; to run cells through "
        "Pier (or any other runner), implement the executor plug-in interface "
        "(maka_eval.executors.base.ExecutorPlugin: validate, prerequisites, prepare, "
        f"run_attempt) and register it in the '{ENTRY_POINT_GROUP}' entry-point group; "
        "see docs/executors.md"
    ),
}
"""Kinds the seeds mention that are refused with a reason, whatever is installed."""


class ExecutorLoadError(Exception):
    """A registered executor could not be loaded or does not implement the interface."""


_lock = threading.Lock()
_loaded: dict[str, ExecutorPlugin] = {}


@functools.cache
def _scan() -> tuple[Mapping[str, EntryPoint], Mapping[str, tuple[str, ...]]]:
    found: dict[str, EntryPoint] = {}
    values: dict[str, list[str]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, point)
        if point.value not in values.setdefault(point.name, []):
            values[point.name].append(point.value)
    return found, {k: tuple(v) for k, v in values.items() if len(v) > 1}


def installed() -> Mapping[str, EntryPoint]:
    """Every registered executor kind and its entry point."""
    return _scan()[0]


def conflicts() -> Mapping[str, tuple[str, ...]]:
    """Kinds that several installed packages register, with each one's object."""
    return _scan()[1]


def refresh() -> None:
    """Forget what was read (after installing a package into a running process)."""
    _scan.cache_clear()
    with _lock:
        _loaded.clear()


def installed_kinds() -> tuple[str, ...]:
    """The kinds an experiment may name, built-ins first."""
    others = sorted(k for k in installed() if k not in BUILTIN_KINDS and k not in REFUSED_KINDS)
    return (*BUILTIN_KINDS, *others)


def kind_problem(kind: str, *, frozen: bool = False) -> str | None:
    """Why `kind` cannot be used (one line naming the installed kinds and the fix), or None.

    `frozen`: reading a run's frozen experiment, whose plug-in need not be installed here
    (the records and results of a run are readable anywhere)."""
    if kind in REFUSED_KINDS:
        return REFUSED_KINDS[kind]
    if kind in BUILTIN_KINDS or kind in installed() or frozen:
        return None
    kinds = ", ".join(f"'{k}'" for k in installed_kinds())
    return f"no executor '{kind}' is installed (installed: {kinds}); {INSTALL_HINT}"


def load(kind: str) -> ExecutorPlugin:
    """The plug-in registered as `kind` (loaded once per process).

    KeyError if no such kind is installed (see `kind_problem`); ExecutorLoadError if it
    cannot be imported or does not implement the interface.
    """
    with _lock:
        plugin = _loaded.get(kind)
        if plugin is not None:
            return plugin
    point = installed().get(kind)
    if point is None or kind in REFUSED_KINDS:
        raise KeyError(kind)
    if kind in conflicts():
        raise ExecutorLoadError(
            f"executor '{kind}' is registered by several installed packages "
            f"({', '.join(conflicts()[kind])}); uninstall all but one"
        )
    try:
        obj = point.load()
        if isinstance(obj, type):
            obj = obj()
    except Exception as exc:
        raise ExecutorLoadError(
            f"executor '{kind}' ({point.value}) could not be loaded: "
            f"{type(exc).__name__}: {exc}; reinstall the package that provides it"
        ) from exc
    missing = [
        name
        for name in ("kind", "config_model", "validate", "prerequisites", "prepare", "run_attempt")
        if not hasattr(obj, name)
    ]
    if missing or not isinstance(obj, ExecutorPlugin):
        raise ExecutorLoadError(
            f"executor '{kind}' ({point.value}) does not implement the plug-in interface "
            f"(missing: {', '.join(missing) or '?'}); see docs/executors.md"
        )
    if obj.kind != kind:
        raise ExecutorLoadError(
            f"executor '{kind}' ({point.value}) says its kind is '{obj.kind}'; the entry "
            "point's name and the object's kind must agree"
        )
    with _lock:
        _loaded[kind] = obj
    return obj


__all__ = [
    "BUILTIN_KINDS",
    "REFUSED_KINDS",
    "ExecutorLoadError",
    "conflicts",
    "installed",
    "installed_kinds",
    "kind_problem",
    "load",
    "refresh",
]
