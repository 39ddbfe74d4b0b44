"""The run directory: a frozen experiment.json and append-only attempt records.

    <run>/experiment.json                              written once: the identity
    <run>/.writer.lock                                 present while a writer runs
    <run>/cells/<task>/<rep>/<subject>/attempts/0001/  reserved at start; artifacts
    <run>/cells/<task>/<rep>/<subject>/attempts/0001.json  the record, written once

A record is written to a temporary file, fsync'd, then hard-linked to its final name
(the link fails if the name exists, so nothing is ever overwritten and a reader sees a
whole record or none). An attempt directory without a record is an attempt whose
writer died: it stays in the history as interrupted. Status and results are computed
from these files; there is no second, mutable results file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets as random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maka_eval.contract.record import AttemptRecord
from maka_eval.errors import Problem, StoreError
from maka_eval.spec.documents import DocumentError, parse_json
from maka_eval.store.attempts import TMP_PREFIX, read_cells
from maka_eval.store.lock import LOCK_NAME, WriterLock
from maka_eval.store.records import RUN_FORMAT, run_document

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
    """Records that cannot be trusted (unparsable, moved, another run's), each naming its
    file; they are left out of `records`. Readers report them; a writer refuses them."""

    @property
    def run_id(self) -> str:
        return str(self.document["runId"])

    @property
    def experiment(self) -> Mapping[str, Any]:
        return self.document["experiment"]  # type: ignore[no-any-return]

    def attempts(self, cell_id: str) -> list[AttemptRecord]:
        return self.records.get(cell_id, [])


def _read_document(run_dir: Path) -> dict[str, Any]:
    path = run_dir / EXPERIMENT_FILE
    try:
        data = parse_json(path.read_text(encoding="utf-8"), str(path))
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
    return data


def read_run(run_dir: Path) -> RunContents:
    """Read experiment.json and every attempt record. Damaged records are collected in
    `contents.damaged` and left out, so one bad file does not hide every other result;
    StoreError only when experiment.json itself is missing or unreadable."""
    run_dir = Path(run_dir)
    contents = RunContents(run_dir, _read_document(run_dir))
    cells_root = run_dir / CELLS_DIR
    if not cells_root.is_dir():
        return contents
    read = read_cells(str(cells_root), contents.run_id)
    contents.records = read.records
    contents.interrupted = read.interrupted
    contents.damaged = read.damaged
    return contents


def require_intact(contents: RunContents) -> None:
    """Refuse (StoreError naming each file) a run holding damaged records: a writer must
    not add attempts next to records it cannot trust."""
    if contents.damaged:
        raise StoreError(
            f"{contents.run_dir} holds damaged attempt records (maka-eval never rewrites a "
            "record); move them out of the run directory, or run into a new --out directory:",
            contents.damaged,
        )


class RunWriter:
    """The one writer of a run directory (holds the writer lock while open)."""

    def __init__(self, run_dir: Path, contents: RunContents, lock: WriterLock) -> None:
        self.run_dir = run_dir
        self.contents = contents
        self._lock = lock
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
        if not path.exists():
            # Written before the lock is taken, so that a writer killed at any moment
            # leaves a directory the next run can resume (or `unlock` can prove stale).
            document = run_document("run-" + random.token_hex(8), identity.document(), version)
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
            writer = cls(run_dir, contents, lock)
            writer._remove_temporary_files()
            return writer
        except BaseException:
            lock.release()
            raise

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
        """Write the attempt's record (once; never overwritten)."""
        _fsync_dir(slot.artifacts_dir)
        write_exclusive(slot.record_path, record.to_json_bytes())
        with self._mutex:
            self.contents.records.setdefault(record.cell_id, []).append(record)

    def close(self) -> None:
        """Release the writer lock."""
        self._lock.release()
