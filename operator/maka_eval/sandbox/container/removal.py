"""Removing containers: in the background after an attempt (frozen first, off the
attempt's path), and what a run left behind when its writer died."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from typing import Any

from maka_eval.sandbox import exec as exec_helper
from maka_eval.sandbox.container.engine import LABEL


class Removals:
    """Containers being removed in the background, each frozen first (the engine's
    pause: every process at once, about 12 ms here; the removal takes about 270 ms on
    Podman, while the next attempt starts): a thread per container, joined by `drain` and
    by an attempt that joins the same network namespace (`wait_for`: a frozen server
    still holds its port)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[threading.Thread, str | None] = {}

    def remove(self, client: Any, container_id: str, namespace: str | None) -> None:
        import docker.errors

        try:
            client.api.pause(container_id)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:  # no freezer, already stopped...: remove it now
            remove_now(client, container_id)
            return
        thread = threading.Thread(
            target=self._remove,
            args=(client, container_id),
            name=f"maka-eval-remove-{container_id[:12]}",
        )
        with self._lock:
            self._pending[thread] = namespace
        thread.start()

    def _remove(self, client: Any, container_id: str) -> None:
        try:
            remove_now(client, container_id)
        except Exception:  # the engine went away: remove_leftovers finds it next run
            pass
        finally:
            with self._lock:
                self._pending.pop(threading.current_thread(), None)

    def wait_for(self, namespace: str) -> None:
        """Wait until no container that joined `namespace` is left to remove."""
        with self._lock:
            threads = [t for t, ns in self._pending.items() if ns == namespace]
        for thread in threads:
            thread.join()

    def drain(self) -> None:
        """Wait until every container stopped so far is removed."""
        with self._lock:
            threads = list(self._pending)
        for thread in threads:
            thread.join()


def remove_now(client: Any, container_id: str) -> None:
    """Remove a container (and its anonymous volumes) at once, if it still exists."""
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(container_id, force=True, v=True)


removals = Removals()
"""The removals of this process's sandboxes."""


def drain_removals() -> None:
    """Wait until every container a sandbox stopped has been removed (the executor calls
    this before it returns; a container whose removal failed is a leftover that the next
    run of the same run folder removes)."""
    removals.drain()


def leftover_containers(engine: str, run_id: str | None = None) -> list[str]:
    """Ids of the containers maka-eval made (for one run) that still exist."""
    label = f"{LABEL}.run-id={run_id}" if run_id else f"{LABEL}.attempt-id"
    filters = urllib.parse.quote(json.dumps({"label": [label]}))
    status, found = exec_helper.request(engine, "GET", f"/containers/json?all=1&filters={filters}")
    if status != 200 or not isinstance(found, list):
        return []
    return [str(c.get("Id")) for c in found]


def remove_leftovers(engine: str, run_id: str) -> int:
    """Remove the containers a writer of this run left when it died (their PID 1 sleeps
    forever); how many. Only the run's writer, holding its lock, may call this."""
    removed = 0
    for container_id in leftover_containers(engine, run_id):
        with contextlib.suppress(OSError):
            status, _ = exec_helper.request(
                engine, "DELETE", f"/containers/{container_id}?force=1&v=1"
            )
            removed += status in (200, 204)
    return removed
