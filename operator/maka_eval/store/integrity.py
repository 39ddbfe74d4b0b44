"""What a reader concludes about a run's records: verified, failed (and how), or not
verifiable here.

The record readers (store/attempts.py) check each record's seal where they read it and
hand back the files that fail, with what they saw (`Rejection`). Against the ledger
(store/ledger.py) each becomes a finding: a file at a place the ledger lists was
**edited**; one at a place it does not list was **added** (forged); a file sealed for
another place was **moved**, one sealed for another run **replayed**; a line without
its file means the record was **removed**. The ledger itself can be **edited** (its
chain breaks), **cut** (shorter than the head), **removed**, or disagree with the head.
A finding's record is never used: readers leave it out and name it; a writer refuses to
resume the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from maka_eval.engine.expand import parse_cell_id
from maka_eval.errors import Problem

if TYPE_CHECKING:
    from maka_eval.contract.record import AttemptRecord
    from maka_eval.store.ledger import LedgerState


def place(cell_id: str, attempt: int) -> str:
    """A record's place as the ledger names it (here, below the ledger, because the
    findings name records by it too)."""
    return f"{attempt} {cell_id}"


class Breach(StrEnum):
    """How a run's records fail verification."""

    EDITED = "edited"
    ADDED = "added"
    REMOVED = "removed"
    MOVED = "moved"
    REPLAYED = "replayed"
    LEDGER_EDITED = "ledger edited"
    LEDGER_CUT = "ledger cut"
    LEDGER_REMOVED = "ledger removed"
    HEAD_MISMATCH = "head mismatch"
    DOCUMENT_EDITED = "run document edited"


class SealState(StrEnum):
    """What can be said of a run's records as a whole."""

    VERIFIED = "verified"
    """Every record's seal holds and the ledger lists exactly these records."""
    FAILED = "failed verification"
    UNVERIFIED = "unverified"
    """Sealed, but the run's key is not on this machine."""
    UNSIGNED = "unsigned"
    """Written before records were sealed (maka.eval.attempt.v2 files)."""


@dataclass(frozen=True)
class Finding:
    """One failure: what kind, which file, and what was seen."""

    kind: Breach
    where: str
    detail: str

    def problem(self) -> Problem:
        return Problem(self.where, f"{self.kind.value}: {self.detail}")


class Cause(StrEnum):
    """Why a reader refused a record file (before the ledger says what it means)."""

    NOT_SEALED = "not-sealed"
    BAD_SEAL = "bad-seal"
    MOVED = "moved"
    REPLAYED = "replayed"
    NOT_A_PLACE = "not-a-place"
    UNREADABLE = "unreadable"
    INVALID = "invalid"


@dataclass(frozen=True)
class Rejection:
    """A record file a reader refused, with the place its path names (attempt 0: no
    place maka-eval writes a record at)."""

    where: str
    cell_id: str
    attempt: int
    cause: Cause
    detail: str
    origin: str = ""
    """MOVED: the place it was sealed for; REPLAYED: the run it was sealed for."""

    def values(self) -> tuple[str, str, int, str, str, str]:
        """Plain values (what the reader's helper process sends)."""
        return (self.where, self.cell_id, self.attempt, self.cause.value, self.detail, self.origin)

    @classmethod
    def from_values(cls, values: tuple[str, str, int, str, str, str]) -> Rejection:
        where, cell, attempt, cause, detail, origin = values
        return cls(where, cell, attempt, Cause(cause), detail, origin)


@dataclass(frozen=True)
class Integrity:
    """A run's records, verified (or why they could not be)."""

    state: SealState
    key_id: str | None
    key_dir: str
    verified: int = 0
    """Records whose seal held (and, when the state is VERIFIED, that the ledger lists)."""
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    """What limits the verdict without failing it (no head here, records pending)."""
    pending: tuple[tuple[str, int], ...] = ()
    """(cell id, attempt) of sealed records the ledger does not list yet: a commit in
    progress, or one a crash interrupted (the writer adds them on resume)."""

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def describe(self) -> str:
        """One sentence for `status` and the report."""
        key = f"key {self.key_id}"
        if self.state is SealState.VERIFIED:
            text = f"{self.verified} record(s) verified (sealed with {key}, ledger complete)"
        elif self.state is SealState.FAILED:
            text = (
                f"FAILED: {len(self.findings)} finding(s), each named; the records they "
                f"concern are not used; {self.verified} record(s) verified ({key})"
            )
        elif self.state is SealState.UNVERIFIED:
            text = (
                f"UNVERIFIED: cannot verify, this run's {key} is not in {self.key_dir}; "
                "set MAKA_EVAL_KEY_DIR to the folder holding it"
            )
        else:
            text = (
                "UNSIGNED: written before records were sealed; they cannot be verified "
                "(and this run cannot be resumed)"
            )
        return "; ".join([text, *self.notes])


def classify(
    run_dir: Path,
    ledger: LedgerState,
    records: Mapping[str, Sequence[AttemptRecord]],
    rejected: Iterable[Rejection],
    interrupted: dict[str, list[int]],
) -> tuple[list[Finding], list[tuple[str, int]]]:
    """Findings for the refused files and the ledger's lines without a file, and the
    sealed records the ledger does not list (pending). Removed attempts are taken out
    of `interrupted` (their folder is left, their record is not)."""
    findings = list(ledger.findings)
    listed = ledger.places
    missing = dict(listed)
    pending: list[tuple[str, int]] = []
    for cell, cell_records in records.items():
        for record in cell_records:
            key = place(cell, record.attempt)
            if missing.pop(key, None) is None:
                pending.append((cell, record.attempt))
    for rejection in rejected:
        here = place(rejection.cell_id, rejection.attempt) if rejection.attempt else ""
        line = missing.pop(here, None) if here else None
        replaced = f"; the record the ledger lists here (line {line}) is gone" if line else ""
        if rejection.cause is Cause.MOVED:
            origin_line = missing.pop(rejection.origin, None)
            was = f" (ledger line {origin_line})" if origin_line else ""
            findings.append(
                Finding(
                    Breach.MOVED,
                    rejection.where,
                    f"it is sealed as {_describe(rejection.origin)}{was}, whose place is "
                    f"{_path(run_dir, rejection.origin)}: moved or copied here{replaced}",
                )
            )
        elif rejection.cause is Cause.REPLAYED:
            findings.append(
                Finding(
                    Breach.REPLAYED,
                    rejection.where,
                    f"it is sealed for run {rejection.origin}, not this one: copied from "
                    f"another run{replaced}",
                )
            )
        elif line is not None or here in listed:
            findings.append(
                Finding(
                    Breach.EDITED,
                    rejection.where,
                    f"changed after it was committed (ledger line {listed[here]}): "
                    f"{rejection.detail}",
                )
            )
        else:
            findings.append(
                Finding(
                    Breach.ADDED,
                    rejection.where,
                    f"no ledger line: this run's writer never committed it, and {rejection.detail}",
                )
            )
    for key, line in sorted(missing.items(), key=lambda item: item[1]):
        attempt, _, cell = key.partition(" ")
        findings.append(
            Finding(
                Breach.REMOVED,
                _path(run_dir, key),
                f"the ledger lists it (line {line}: attempt {attempt} of {cell}) but the "
                "file is gone",
            )
        )
        numbers = interrupted.get(cell)
        if numbers and attempt.isdecimal() and int(attempt) in numbers:
            numbers.remove(int(attempt))
            if not numbers:
                del interrupted[cell]
    gone = not ledger.exists and all(f.kind is not Breach.LEDGER_REMOVED for f in findings)
    if gone and (pending or findings):
        findings.append(
            Finding(
                Breach.LEDGER_REMOVED,
                str(run_dir / "records.ledger"),
                "the run holds records but no ledger: it was removed",
            )
        )
    return findings, pending


def _describe(key: str) -> str:
    attempt, _, cell = key.partition(" ")
    return f"attempt {attempt} of {cell}"


def _path(run_dir: Path, key: str) -> str:
    """Where the record of a ledger place is (or would be)."""
    attempt, _, cell = key.partition(" ")
    parts = parse_cell_id(cell)
    if parts is None or not attempt.isdecimal():
        return f"{run_dir} ({_describe(key)})"
    task, repetition, subject = parts
    name = f"{int(attempt):04d}.json"
    return str(run_dir / "cells" / task / str(repetition) / subject / "attempts" / name)
