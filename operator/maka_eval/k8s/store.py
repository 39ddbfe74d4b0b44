"""What the operator has observed: every Experiment, Cell, Attempt and Pod it owns.

Filled by one LIST at start-up and then by watch events only (no periodic listing), and
by the objects the operator's own writes return, so a reconcile pass never acts on a
view older than its own last write. Objects are kept by (namespace, experiment); a
newer resourceVersion always wins, so a late watch event cannot roll an object back.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from maka_eval.k8s import names

Key = tuple[str, str]
"""(namespace, experiment name)."""

KINDS = ("Cell", "Attempt", "Pod")


def _version(obj: Mapping[str, Any]) -> int:
    value = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(value) if str(value).isdigit() else -1


@dataclass
class ExperimentView:
    """Everything observed of one experiment (a snapshot is a shallow copy)."""

    body: dict[str, Any] | None = None
    objects: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )

    @property
    def cells(self) -> dict[str, dict[str, Any]]:
        return self.objects["Cell"]

    @property
    def attempts(self) -> dict[str, dict[str, Any]]:
        return self.objects["Attempt"]

    @property
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.objects["Pod"]


class Store:
    """Thread-safe: watch handlers write, reconcile passes read snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[Key, ExperimentView] = {}

    @staticmethod
    def key_of(kind: str, obj: Mapping[str, Any]) -> Key | None:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        if kind == "Experiment":
            return namespace, meta.get("name") or ""
        experiment = (meta.get("labels") or {}).get(names.LABEL_EXPERIMENT)
        return (namespace, experiment) if experiment else None

    def put(self, kind: str, obj: Mapping[str, Any]) -> Key | None:
        """Record an object (ignored if an equal or newer version is known)."""
        key = self.key_of(kind, obj)
        if key is None:
            return None
        with self._lock:
            view = self._views.setdefault(key, ExperimentView())
            if kind == "Experiment":
                if view.body is None or _version(obj) >= _version(view.body):
                    view.body = dict(obj)
                return key
            name = obj["metadata"]["name"]
            known = view.objects[kind].get(name)
            if known is None or _version(obj) >= _version(known):
                view.objects[kind][name] = dict(obj)
            return key

    def remove(self, kind: str, obj: Mapping[str, Any]) -> Key | None:
        """Forget a deleted object."""
        key = self.key_of(kind, obj)
        if key is None:
            return None
        with self._lock:
            view = self._views.get(key)
            if view is None:
                return key
            if kind == "Experiment":
                del self._views[key]
                return key
            name = obj["metadata"]["name"]
            view.objects[kind].pop(name, None)
            return key

    def snapshot(self, key: Key) -> ExperimentView | None:
        """A copy of what is known of one experiment (None: no such experiment)."""
        with self._lock:
            view = self._views.get(key)
            if view is None or view.body is None:
                return None
            uid = (view.body.get("metadata") or {}).get("uid")

            def ours(obj: Mapping[str, Any]) -> bool:
                labels = (obj.get("metadata") or {}).get("labels") or {}
                return labels.get(names.LABEL_EXPERIMENT_UID) == uid

            return ExperimentView(
                body=view.body,
                objects={
                    kind: {n: o for n, o in objs.items() if ours(o)}
                    for kind, objs in view.objects.items()
                },
            )

    def experiment_keys(self) -> list[Key]:
        with self._lock:
            return [k for k, v in self._views.items() if v.body is not None]
