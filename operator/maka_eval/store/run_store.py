"""The run directory: a frozen experiment.json and append-only, sealed attempt records.

    <run>/experiment.json                              written once: the identity
    <run>/.writer.lock                                 present while a writer runs
    <run>/records.ledger                               a line per committed record
    <run>/cells/<task>/<rep>/<subject>/attempts/0001/  reserved at start; artifacts
    <run>/cells/<task>/<rep>/<subject>/attempts/0001.json  the record, written once

A record is sealed (store/seal.py), written to a temporary file, fsync'd, then
hard-linked to its final name (the link fails if the name exists, so nothing is ever
overwritten and a reader sees a whole record or none), and listed in the ledger
(store/ledger.py). An attempt directory without a record is an attempt whose writer
died: it stays in the history as interrupted. Status and results are computed from
these files; there is no second, mutable results file. Every read verifies every seal
and the ledger; a record that fails is left out and named (store/integrity.py), and a
writer refuses to resume such a run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets as random
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from maka_eval.contract.record import AttemptRecord
from maka_eval.errors import Problem, StoreError
from maka_eval.spec.documents import DocumentError, parse_json
from maka_eval.store.attempts import (
    TMP_PREFIX,
    UNSEALED,
    CellsRead,
    ReadMode,
    RecordCheck,
    read_cells,
)
from maka_eval.store.integrity import Breach, Finding, Integrity, SealState, classify
from maka_eval.store.ledger import (
    LEDGER_FILE,
    LedgerSnapshot,
    LedgerState,
    LedgerWriter,
    document_digest,
    head_path,
    ledger_sealed_with,
    verify_ledger,
)
from maka_eval.store.lock import LOCK_NAME, WriterLock
from maka_eval.store.records import RUN_FORMAT, run_document
from maka_eval.store.seal import (
    SEAL_AT,
    SealKey,
    find_key,
    heads_dir,
    key_dir,
    own_key,
    seal_record,
    signing_key,
)

EXPERIMENT_FILE = "experiment.json"
CELLS_DIR = "cells"
_TMP_PREFIX = TMP_PREFIX


def cell_path(task_id: str, repetition: int, subject_id: str) -> Path:
    """A cell's directory relative to the run directory."""
    return Path(CELLS_DIR, task_id, str(repetition), subject_id)


def artifact_path(run_dir: Path, record: AttemptRecord, name: str) -> Path:
    """Where an artifact of a stored attempt is."""
    slot = AttemptSlot(
        run_dir / cell_path(record.task_id, record.repetition, record.subject_id), record.attempt
    )
    return slot.artifacts_dir / name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exclusive(path: Path, data: bytes) -> None:
    """Create `path` with `data` atomically and durably; FileExistsError if it exists."""
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{os.getpid()}.{random.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise FileExistsError(errno.EEXIST, "already exists", str(path)) from None
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # No hard links here: the lock makes us the only writer, so check, then rename.
            if path.exists():
                raise FileExistsError(errno.EEXIST, "already exists", str(path)) from None
            os.rename(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class RunIdentity:
    """What makes two runs the same experiment: the canonical spec, the task digests and
    the digests of the programs the subjects run (an edited agent script is a new run)."""

    experiment: Mapping[str, Any]
    task_digests: Mapping[str, str]
    program_digests: Mapping[str, str] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        """The identity as it is frozen in experiment.json."""
        return {
            "experiment": dict(self.experiment),
            "taskDigests": dict(self.task_digests),
            "programDigests": dict(self.program_digests),
        }


def _differences(old: Any, new: Any, path: str = "") -> Iterator[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                yield f"{sub}: added"
            elif key not in new:
                yield f"{sub}: removed"
            else:
                yield from _differences(old[key], new[key], sub)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif old != new:
        yield f"{path}: {json.dumps(old)[:60]} -> {json.dumps(new)[:60]}"


@dataclass
class AttemptSlot:
    """A reserved attempt number and its artifact directory."""

    cell_dir: Path
    number: int

    @property
    def name(self) -> str:
        return f"{self.number:04d}"

    @property
    def artifacts_dir(self) -> Path:
        return self.cell_dir / "attempts" / self.name

    @property
    def record_path(self) -> Path:
        return self.cell_dir / "attempts" / f"{self.name}.json"


@dataclass
class RunContents:
    """Everything in a run directory, read and checked."""

    run_dir: Path
    document: Mapping[str, Any]
    records: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    interrupted: dict[str, list[int]] = field(default_factory=dict)
    damaged: list[Problem] = field(default_factory=list)
    """What failed verification, each naming its file: records left out of `records`
    (edited, added, moved, another run's, unparsable), records removed, a ledger cut
    or edited. Readers report them; a writer refuses them."""
    integrity: Integrity = field(
        default_factory=lambda: Integrity(SealState.UNSIGNED, None, str(key_dir()))
    )
    """What the seals and the ledger say of the run as a whole."""
    ledger: LedgerState | None = None
    """The verified ledger (sealed runs whose key is here), for the writer."""

    @property
    def run_id(self) -> str:
        return str(self.document["runId"])

    @property
    def experiment(self) -> Mapping[str, Any]:
        return self.document["experiment"]  # type: ignore[no-any-return]

    def attempts(self, cell_id: str) -> list[AttemptRecord]:
        return self.records.get(cell_id, [])


def _read_document(run_dir: Path) -> tuple[dict[str, Any], bytes]:
    path = run_dir / EXPERIMENT_FILE
    try:
        raw = path.read_bytes()
        data = parse_json(raw.decode("utf-8"), str(path))
    except FileNotFoundError:
        raise StoreError(
            f"{run_dir} is not a maka-eval run directory:",
            [Problem(str(path), "missing; `maka-eval run <experiment> --out DIR` creates it")],
        ) from None
    except (DocumentError, OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} cannot be read:", [Problem(str(path), str(exc))]) from None
    if (
        not isinstance(data, dict)
        or data.get("format") != RUN_FORMAT
        or not isinstance(data.get("experiment"), dict)
    ):
        raise StoreError(
            f"{path} is not a maka-eval run file:",
            [Problem(str(path), f"expected format '{RUN_FORMAT}'; it was changed by hand?")],
        )
    return data, raw


def read_run(run_dir: Path) -> RunContents:
    """Read experiment.json and every attempt record, verifying every seal and the
    ledger with the run's key (from the key folder, store/seal.py). What fails is
    collected in `contents.damaged` and left out, so one bad file does not hide every
    other result; `contents.integrity` says what was verified. StoreError only when
    experiment.json itself is missing or unreadable, or the key folder is unsafe."""
    run_dir = Path(run_dir)
    document, raw = _read_document(run_dir)
    contents = RunContents(run_dir, document)
    folder = key_dir()
    key_id = document.get("keyId")
    cells_root = run_dir / CELLS_DIR
    if (
        key_id is None
        or (key := find_key(folder, key_id) if isinstance(key_id, str) else None) is None
    ):
        if key_id is None:
            read = _read_all(cells_root, contents.run_id, UNSEALED)
            contents.integrity = _unsigned(run_dir, contents.run_id, folder)
        else:
            read = _read_all(cells_root, contents.run_id, RecordCheck(ReadMode.SEALED_UNCHECKED))
            contents.integrity = _key_not_here(run_dir, contents.run_id, str(key_id), folder)
        if contents.integrity.findings:
            # The run was sealed here and its key id was taken out or changed: none of
            # its records can be verified, and none is used.
            count = sum(map(len, read.records.values()))
            read.records = {}
            unused = tuple(
                Finding(
                    f.kind,
                    f.where,
                    f"{f.detail}; none of its {count} record(s) can be verified, so none is used",
                )
                for f in contents.integrity.findings
            )
            contents.integrity = replace(contents.integrity, findings=unused)
            read.damaged.extend(finding.problem() for finding in unused)
    else:
        # The head, then the ledger, then the records (see LedgerSnapshot); the ledger's
        # chain is checked while the reader's helper process starts.
        snapshot = LedgerSnapshot.take(run_dir, heads_dir(folder), contents.run_id)
        verified: list[LedgerState] = []

        def verify() -> None:
            digest = document_digest(raw)
            verified.append(verify_ledger(snapshot, key, contents.run_id, digest))

        read = _read_all(cells_root, contents.run_id, RecordCheck(ReadMode.SEALED, key), verify)
        if not verified:
            verify()
        contents.ledger = ledger = verified[0]
        findings, pending = classify(run_dir, ledger, read.records, read.rejected, read.interrupted)
        notes = list(ledger.notes)
        if pending:
            notes.append(
                f"{len(pending)} sealed record(s) not in the ledger yet (a commit in "
                "progress, or one a crash cut short: the next resume lists them)"
            )
        contents.integrity = Integrity(
            SealState.FAILED if findings else SealState.VERIFIED,
            key.key_id,
            str(folder),
            verified=sum(map(len, read.records.values())),
            findings=tuple(findings),
            notes=tuple(notes),
            pending=tuple(pending),
        )
        read.damaged.extend(finding.problem() for finding in findings)
    contents.records = read.records
    contents.interrupted = read.interrupted
    contents.damaged = read.damaged
    return contents


def _read_all(
    cells_root: Path,
    run_id: str,
    check: RecordCheck,
    meanwhile: Callable[[], None] | None = None,
) -> CellsRead:
    if not cells_root.is_dir():
        return CellsRead()
    return read_cells(str(cells_root), run_id, check, meanwhile)


def _key_not_here(run_dir: Path, run_id: str, key_id: str, folder: Path) -> Integrity:
    """A run whose key is not in this key folder: copied from elsewhere (unverifiable
    here), unless this folder's key sealed it (then its key id was changed)."""
    signs = []
    head = head_path(heads_dir(folder), run_id)
    if head is not None and head.exists():
        signs.append(f"this key folder holds its head ({head})")
    local = own_key(folder)
    if local is not None and ledger_sealed_with(run_dir / LEDGER_FILE, local):
        signs.append(f"its ledger was written with this folder's key {local.key_id}")
    if not signs:
        return Integrity(SealState.UNVERIFIED, key_id, str(folder))
    finding = Finding(
        Breach.DOCUMENT_EDITED,
        str(run_dir / EXPERIMENT_FILE),
        f"it names seal key {key_id}, but {' and '.join(signs)}: its key id was changed, "
        "so that nothing would be verified",
    )
    return Integrity(SealState.FAILED, key_id, str(folder), findings=(finding,))


def _unsigned(run_dir: Path, run_id: str, folder: Path) -> Integrity:
    """A run whose document names no key: written before records were sealed, unless
    what only a sealed run has is there (then its key id was taken out)."""
    signs = []
    if (run_dir / LEDGER_FILE).exists():
        signs.append(f"a ledger ({LEDGER_FILE})")
    head = head_path(heads_dir(folder), run_id)
    if head is not None and head.exists():
        signs.append(f"a head in {head.parent}")
    if not signs:
        return Integrity(SealState.UNSIGNED, None, str(folder))
    finding = Finding(
        Breach.DOCUMENT_EDITED,
        str(run_dir / EXPERIMENT_FILE),
        f"it names no seal key, but the run has {' and '.join(signs)}: its key id was "
        "taken out, so that nothing would be verified",
    )
    return Integrity(SealState.FAILED, None, str(folder), findings=(finding,))


def require_intact(contents: RunContents) -> None:
    """Refuse (StoreError naming each file) a run whose records cannot be trusted or
    checked: a writer must not schedule attempts from forged results."""
    integrity = contents.integrity
    new_out = "run the experiment into a new --out directory"
    if integrity.state is SealState.UNSIGNED:
        raise StoreError(
            f"{contents.run_dir} was written before attempt records were sealed: its "
            "records cannot be verified, so it cannot be resumed. `maka-eval status`, "
            f"`results` and `report` still read it; to go on, {new_out}:",
            [
                Problem(str(contents.run_dir / EXPERIMENT_FILE), "names no seal key (keyId)"),
                *contents.damaged,
            ],
        )
    if integrity.state is SealState.UNVERIFIED:
        raise StoreError(
            f"{contents.run_dir} is sealed with key {integrity.key_id}, which is not in "
            f"{integrity.key_dir}: its records cannot be verified, so nothing was started:",
            [
                Problem(
                    integrity.key_dir,
                    "set MAKA_EVAL_KEY_DIR to the key folder this run was written with "
                    f"(its seal.key has id {integrity.key_id}), or {new_out}",
                )
            ],
        )
    if contents.damaged:
        raise StoreError(
            f"{contents.run_dir} holds attempt records that fail verification (edited, "
            "forged, moved or removed since they were written; maka-eval never rewrites a "
            "record): the run cannot be trusted, so nothing was started. `maka-eval status` "
            f"names each; {new_out}:",
            contents.damaged,
        )


class RunWriter:
    """The one writer of a run directory (holds the writer lock while open)."""

    def __init__(
        self,
        run_dir: Path,
        contents: RunContents,
        lock: WriterLock,
        key: SealKey,
        ledger: LedgerWriter,
    ) -> None:
        self.run_dir = run_dir
        self.contents = contents
        self._lock = lock
        self._key = key
        self._ledger = ledger
        self._next: dict[Path, int] = {}
        self._mutex = threading.Lock()

    @property
    def run_id(self) -> str:
        return self.contents.run_id

    @classmethod
    def open(cls, run_dir: Path, identity: RunIdentity, version: str) -> RunWriter:
        """Create the run directory or reopen it for the same experiment."""
        run_dir = Path(run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise StoreError(
                f"{run_dir} exists and is not a directory:",
                [Problem(str(run_dir), "choose another --out")],
            )
        path = run_dir / EXPERIMENT_FILE
        if run_dir.is_dir() and not path.exists():
            # What a writer killed before it wrote experiment.json can leave is no reason
            # to refuse; anything else is somebody else's folder.
            foreign = [
                p.name
                for p in run_dir.iterdir()
                if not (p.name.startswith(_TMP_PREFIX) or p.name == LOCK_NAME)
            ]
            if foreign:
                raise StoreError(
                    f"{run_dir} is not empty and is not a maka-eval run directory:",
                    [Problem(str(run_dir), "choose an empty or new directory for --out")],
                )
        run_dir.mkdir(parents=True, exist_ok=True)
        folder = key_dir()
        if folder.resolve().is_relative_to(run_dir.resolve()):
            raise StoreError(
                f"the seal key folder {folder} is inside the run directory {run_dir}, "
                "where a record's reader could find the key:",
                [Problem(str(folder), "set MAKA_EVAL_KEY_DIR to a folder outside every run")],
            )
        key = signing_key(folder)
        if not path.exists():
            # Written before the lock is taken, so that a writer killed at any moment
            # leaves a directory the next run can resume (or `unlock` can prove stale).
            document = run_document(
                "run-" + random.token_hex(8), identity.document(), version, key.key_id
            )
            with contextlib.suppress(FileExistsError):  # a concurrent first run won
                write_exclusive(path, (json.dumps(document, indent=2) + "\n").encode())
        lock = WriterLock(run_dir)
        lock.acquire()
        try:
            for tmp in run_dir.glob(f"{_TMP_PREFIX}*"):
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            contents = read_run(run_dir)
            require_intact(contents)
            cls._check_identity(run_dir, contents.document, identity)
            ledger = cls._open_ledger(run_dir, contents, key, folder)
            writer = cls(run_dir, contents, lock, key, ledger)
            writer._remove_temporary_files()
            return writer
        except BaseException:
            lock.release()
            raise

    @staticmethod
    def _open_ledger(
        run_dir: Path, contents: RunContents, key: SealKey, folder: Path
    ) -> LedgerWriter:
        """Start the ledger, or go on with the verified one after what a crash can leave:
        a last line without its newline (cut), a head behind the ledger (moved on), and
        sealed records without their line (listed now: only this key seals)."""
        state = contents.ledger
        assert state is not None  # require_intact: sealed with this key, verified
        heads = heads_dir(folder)
        if not state.exists:
            _, raw = _read_document(run_dir)
            return LedgerWriter.create(run_dir, contents.run_id, key, document_digest(raw), heads)
        ledger = LedgerWriter.reopen(run_dir, contents.run_id, key, state, heads)
        for cell, attempt in contents.integrity.pending:
            record = next(r for r in contents.records[cell] if r.attempt == attempt)
            data = _record_path(run_dir, record).read_bytes()
            ledger.append(cell, attempt, data[SEAL_AT : SEAL_AT + 64])
        return ledger

    @staticmethod
    def _check_identity(run_dir: Path, document: Mapping[str, Any], identity: RunIdentity) -> None:
        new = identity.document()
        old = {key: document.get(key) for key in new}
        if json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True):
            return
        changes = list(_differences(old, new))
        raise StoreError(
            f"{run_dir} holds a different experiment; a run directory belongs to one frozen "
            "experiment (its experiment.json). Run the changed experiment into a new --out "
            "directory, or restore the original spec and tasks to resume. What differs:",
            [Problem("", change) for change in changes[:20]],
        )

    def _remove_temporary_files(self) -> None:
        for tmp in (self.run_dir / CELLS_DIR).glob(f"*/*/*/attempts/{_TMP_PREFIX}*"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def reserve(self, task_id: str, repetition: int, subject_id: str) -> AttemptSlot:
        """Reserve the cell's next attempt number (its directory is created exclusively)."""
        cell_dir = self.run_dir / cell_path(task_id, repetition, subject_id)
        attempts = cell_dir / "attempts"
        with self._mutex:
            return self._reserve(cell_dir, attempts)

    def _reserve(self, cell_dir: Path, attempts: Path) -> AttemptSlot:
        if cell_dir not in self._next:
            attempts.mkdir(parents=True, exist_ok=True)
            taken = [
                int(p.name.split(".")[0])
                for p in attempts.iterdir()
                if p.name.split(".")[0].isdigit()
            ]
            self._next[cell_dir] = max(taken, default=0) + 1
        while True:
            slot = AttemptSlot(cell_dir, self._next[cell_dir])
            self._next[cell_dir] += 1
            try:
                slot.artifacts_dir.mkdir()
            except FileExistsError:
                continue
            return slot

    def commit(self, slot: AttemptSlot, record: AttemptRecord) -> None:
        """Seal and write the attempt's record (once; never overwritten), then list it
        in the ledger."""
        if record.run_id != self.run_id or _record_path(self.run_dir, record) != slot.record_path:
            raise ValueError(
                f"attempt {record.attempt} of {record.cell_id} (run {record.run_id}) is not "
                f"the record of slot {slot.record_path}"
            )
        _fsync_dir(slot.artifacts_dir)
        data, seal = seal_record(self._key, record)
        write_exclusive(slot.record_path, data)
        self._ledger.append(record.cell_id, record.attempt, seal)
        with self._mutex:
            self.contents.records.setdefault(record.cell_id, []).append(record)

    def close(self) -> None:
        """Close the ledger and release the writer lock."""
        self._ledger.close()
        self._lock.release()


def _record_path(run_dir: Path, record: AttemptRecord) -> Path:
    cell_dir = run_dir / cell_path(record.task_id, record.repetition, record.subject_id)
    return AttemptSlot(cell_dir, record.attempt).record_path
