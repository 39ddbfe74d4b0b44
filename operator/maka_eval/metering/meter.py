"""The proxy's running count of provider requests, written to the checkpoint as it moves.

Each provider request goes through `started` -> (`admitted`) -> `finished` exactly once,
keyed by the proxy's flow id; `settle` marks the figure final until the next request
starts. Every transition rewrites the checkpoint, so a proxy that dies leaves the last
state it saw, admission included.

In the proxy the writes run on a writer thread (`background=True`): creating and
renaming a file costs from ~50 us on tmpfs to over a millisecond on a busy ext4, which
must not sit on the request path. The thread always writes the newest state (states in
between are skipped: the counts only grow, so the newest holds every admission), and
`flush` waits until what was committed is on disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from maka_eval.engine.usage import Usage
from maka_eval.metering.checkpoint import (
    MAX_MODELS,
    MODEL_NAME_LIMIT,
    OTHER_MODELS,
    Checkpoint,
    write_checkpoint,
)

log = logging.getLogger(__name__)


@dataclass
class _Request:
    model: str
    admitted: bool = False


class Meter:
    """Counts provider requests and writes each new state as a signed checkpoint."""

    def __init__(
        self,
        path: Path | None,
        token: str | None,
        on_error: Callable[[str], None] | None = None,
        background: bool = False,
    ) -> None:
        if path is not None and not token:
            raise ValueError("a checkpoint path needs a result token to sign it with")
        self._path = path
        self._token = token or ""
        self._on_error = on_error or log.warning
        self._lock = threading.Lock()
        self._state = Checkpoint()
        self._open: dict[str, _Request] = {}
        self._written = threading.Condition()
        self._pending: Checkpoint | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if background and path is not None:
            self._thread = threading.Thread(
                target=self._writer, name="checkpoint-writer", daemon=True
            )
            self._thread.start()

    @property
    def state(self) -> Checkpoint:
        """The current snapshot."""
        return self._state

    def _write(self, state: Checkpoint) -> None:
        assert self._path is not None
        try:
            write_checkpoint(self._path, state, self._token)
        except OSError as exc:
            # Metering must never take the proxy down; the reader sees the last write.
            self._on_error(f"cannot write the provider-usage checkpoint {self._path}: {exc}")

    def _commit(self, state: Checkpoint) -> None:
        self._state = state
        if self._path is None:
            return
        if self._thread is None:
            self._write(state)
            return
        with self._written:
            self._pending = state
            self._written.notify_all()

    def _writer(self) -> None:
        while True:
            with self._written:
                while self._pending is None and not self._closed:
                    self._written.wait()
                if self._pending is None:
                    return
                state, self._pending = self._pending, None
                self._busy = True
            try:
                self._write(state)
            finally:
                with self._written:
                    self._busy = False
                    self._written.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every committed state is written; False on timeout."""
        if self._thread is None:
            return True
        with self._written:
            return self._written.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def close(self) -> None:
        """Write what is pending and stop the writer thread."""
        self.flush()
        if self._thread is not None:
            with self._written:
                self._closed = True
                self._written.notify_all()
            self._thread.join(10)

    def write(self) -> None:
        """Write the current state (the initial, empty checkpoint at start)."""
        with self._lock:
            self._commit(self._state)

    def started(self, key: str, model: str = "") -> None:
        """A provider request is being forwarded (`model`: what it asked for, if known)."""
        with self._lock:
            if key in self._open:
                return
            self._open[key] = _Request(model[:MODEL_NAME_LIMIT])
            s = self._state
            self._commit(
                replace(s, settled=False, requests=s.requests + 1, in_flight=s.in_flight + 1)
            )

    def admitted(self, key: str) -> None:
        """The provider admitted the request (a 2xx status and headers arrived)."""
        with self._lock:
            request = self._open.get(key)
            if request is None or request.admitted:
                return
            request.admitted = True
            self._commit(replace(self._state, admitted=self._state.admitted + 1))

    def finished(
        self, key: str, usage: Usage | None, final: bool, model: str | None = None
    ) -> None:
        """The request settled: its response ended (or failed). `usage` is what was read
        of it; `final` says it is the response's whole usage; `model` is the model the
        response names (the usage is attributed to it, else to the request's)."""
        with self._lock:
            request = self._open.pop(key, None)
            if request is None:
                return
            s = self._state
            by_model = dict(s.usage_by_model)
            if usage is not None and request.admitted and usage.total_tokens:
                model = (model or request.model)[:MODEL_NAME_LIMIT]
                if model not in by_model and len(by_model) >= MAX_MODELS:
                    model = OTHER_MODELS
                by_model[model] = by_model.get(model, Usage()) + usage
            counted = usage is not None and final and request.admitted
            self._commit(
                replace(
                    s,
                    in_flight=s.in_flight - 1,
                    usage_requests=s.usage_requests + (1 if counted else 0),
                    usage_by_model=by_model,
                )
            )

    def settle(self) -> Checkpoint:
        """Mark the figure final (no later request belongs to it) and return it."""
        with self._lock:
            self._commit(replace(self._state, settled=True))
            return self._state
