"""Where analysis reads a run from: one interface, one implementation per store.

Analysis never opens files itself. A source is a snapshot: every method answers from
the same read, so a summary is consistent even while a writer appends attempts. The
shapes follow what a cluster stores as well as what a run directory holds:

- the frozen experiment: `experiment.json` here; the Experiment resource's spec there;
- attempt records per cell: `attempts/NNNN.json` here; Attempt resources (spec = the
  identity, status = the result kernel) labelled with their Cell there;
- interrupted attempts: a reserved attempt directory without a record here; an Attempt
  whose pod is gone without a result there;
- damaged records: a record whose seal or ledger line fails verification (edited,
  added, moved, replayed, removed) or that does not parse here; an Attempt whose status
  fails validation there. They are reported and left out, never trusted;
- integrity: what the seals and the ledger say of the run as a whole here (verified,
  failed, or not verifiable on this machine); nothing there, where only the operator
  may write an Attempt's result (status RBAC, write-once CEL rules);
- the writer: the `.writer.lock` here; nothing there (the operator is the writer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from maka_eval.contract.record import AttemptRecord
from maka_eval.errors import Problem
from maka_eval.store.integrity import Integrity
from maka_eval.store.lock import LockInfo, LockState, inspect_lock
from maka_eval.store.run_store import EXPERIMENT_FILE, RunContents, read_run


@dataclass(frozen=True)
class WriterView:
    """Who is writing the run, as far as a lock file can tell."""

    state: LockState
    info: LockInfo | None


class AttemptSource(Protocol):
    """A consistent snapshot of one run's experiment and attempts."""

    @property
    def location(self) -> str:
        """Where the run is, as a user names it (a directory, or namespace/name)."""
        ...

    @property
    def run_id(self) -> str:
        """The run's unique id."""
        ...

    @property
    def experiment_origin(self) -> str:
        """Where the frozen experiment is, for messages about it."""
        ...

    def experiment_document(self) -> Mapping[str, Any]:
        """The frozen canonical experiment document (spec.load.experiment_from_data)."""
        ...

    def records(self) -> Mapping[str, Sequence[AttemptRecord]]:
        """Valid attempt records by cell id, each cell's in attempt-number order."""
        ...

    def interrupted(self) -> Mapping[str, Sequence[int]]:
        """Attempt numbers, by cell id, that were started but never got a record."""
        ...

    def damaged(self) -> Sequence[Problem]:
        """Records that were found but cannot be trusted, each naming where it is."""
        ...

    def writer(self) -> WriterView | None:
        """The writer lock's state, or None where the store has no such lock."""
        ...

    def integrity(self) -> Integrity | None:
        """What verifying the records' seals found, or None where records are not
        sealed because the store itself guards them (a cluster)."""
        ...


class RunDirectorySource:
    """An AttemptSource over a local run directory (the file store)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self._contents: RunContents = read_run(self.run_dir)

    @property
    def location(self) -> str:
        return str(self.run_dir)

    @property
    def run_id(self) -> str:
        return self._contents.run_id

    @property
    def experiment_origin(self) -> str:
        return str(self.run_dir / EXPERIMENT_FILE)

    def experiment_document(self) -> Mapping[str, Any]:
        return self._contents.experiment

    @property
    def document(self) -> Mapping[str, Any]:
        """The whole run document (experiment.json): the experiment and the identity
        around it (task digests, the maka-eval version, when the run was created)."""
        return self._contents.document

    def records(self) -> Mapping[str, Sequence[AttemptRecord]]:
        return self._contents.records

    def interrupted(self) -> Mapping[str, Sequence[int]]:
        return self._contents.interrupted

    def damaged(self) -> Sequence[Problem]:
        return self._contents.damaged

    def writer(self) -> WriterView | None:
        state, info = inspect_lock(self.run_dir)
        return WriterView(state, info)

    def integrity(self) -> Integrity | None:
        return self._contents.integrity
