"""What the operator has observed: every Experiment, Cell, Attempt and Pod it owns.

Filled by one LIST at start-up and then by watch events only (no periodic listing), and
by the objects the operator's own writes return, so a reconcile pass never acts on a
view older than its own last write. Objects are kept by (namespace, experiment); a
newer resourceVersion always wins, so a late watch event cannot roll an object back.

The store keeps what the controller reads, compactly: no metadata.managedFields (the API
server's bookkeeping, nearly half of a Cell), none of a Pod's spec but its scheduling
gates (the operator wrote the spec and never reads it back; it is the bulk of a Pod: the
relay plan), and every dict key and short string shared with the other objects'
(sys.intern: thousands of objects repeat the same keys, labels and values). For the
10,000 cells of bench/operator_scale.py that is about 75 MB for the Cells, Attempts and
Pods instead of 700 MB as decoded, and far less for the garbage collector to walk.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import Any

from maka_eval.k8s import names

Key = tuple[str, str]
"""(namespace, experiment name)."""

KINDS = ("Cell", "Attempt", "Pod")

POD_SPEC_KEPT = ("schedulingGates", "nodeName")
"""The fields of a Pod's spec the controller reads (the rest is not kept)."""
_SHORT = 64
"""Strings up to this long are interned: names, labels, enum values, timestamps."""


def _compact(value: Any) -> Any:
    """A copy of decoded JSON with its keys and short strings interned."""
    if isinstance(value, dict):
        return {intern(k): _compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _SHORT:
        return intern(value)
    return value


def _kept(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the store keeps of an object (see the module docstring)."""
    kept = {k: v for k, v in obj.items() if k != "metadata" and (k != "spec" or kind != "Pod")}
    meta = obj.get("metadata") or {}
    kept["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    if kind == "Pod":
        spec = obj.get("spec") or {}
        kept["spec"] = {k: spec[k] for k in POD_SPEC_KEPT if k in spec}
    compact: dict[str, Any] = _compact(kept)
    return compact


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
        return self._put(kind, obj)[0]

    def record(self, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Record an object the operator has just written, and return what the store holds
        of it: its compact copy, or a newer version already observed. A pass keeps that in
        its view rather than the API server's full answer (10,000 Cells in one pass)."""
        return self._put(kind, obj)[1]

    def _put(self, kind: str, obj: Mapping[str, Any]) -> tuple[Key | None, dict[str, Any]]:
        kept = _kept(kind, obj)
        key = self.key_of(kind, obj)
        if key is None:
            return None, kept
        with self._lock:
            view = self._views.setdefault(key, ExperimentView())
            if kind == "Experiment":
                if view.body is None or _version(obj) >= _version(view.body):
                    view.body = kept
                return key, view.body
            name = obj["metadata"]["name"]
            known = view.objects[kind].get(name)
            if known is None or _version(obj) >= _version(known):
                view.objects[kind][name] = known = kept
            return key, known

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
