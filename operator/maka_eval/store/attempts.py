"""Reading the cells of a run: their attempt records, interrupted attempts, damaged files.

    <cells>/<task>/<rep>/<subject>/attempts/0001.json   a record, written once
    <cells>/<task>/<rep>/<subject>/attempts/0001/       its artifacts; an attempt
                                                        directory without a record is
                                                        an interrupted attempt

A report reads every record of a run, 100,000 of them for a large one, at over 100 µs
of CPU each on a small machine: listing, reading, strict JSON, validation. So each
directory is listed once and nothing is stat'ed (os.scandir gives the file types), each
record is read with one open and a bounded read, the garbage collector is paused (the
records form no cycles) and, after a large read, frozen out of them, and a large run is
read by two processes: a helper reads the second half of the task directories while
this process reads the first, and sends its records back as tuples of plain values
(marshal: half the cost of pickling the records, see `_flat_record`). Well-formed records
take the contract's fast path (`AttemptRecord.from_dict` -> `plain_record`).

In a sealed run (store/seal.py) each record's seal is checked on the bytes read, before
the record is parsed, in both processes (the helper gets the key on its stdin pipe);
about 2 µs a record. A record that fails is refused with what was seen (`Rejection`):
what it means (edited, added, moved, replayed) is decided against the ledger
(store/integrity.py).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import gc
import marshal
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

from maka_eval import strict_json
from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ArtifactEntry, ResultKernel
from maka_eval.contract.record import MAX_RECORD_BYTES, AttemptRecord
from maka_eval.engine.expand import cell_id
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.errors import Problem
from maka_eval.store.integrity import Cause, Rejection
from maka_eval.store.seal import (
    BODY_AT,
    ENVELOPE_BYTES,
    SEAL_AT,
    SealKey,
    is_envelope,
    record_place,
    same_seal,
)

TMP_PREFIX = ".tmp-"
"""Temporary files of the writer (a record before it is linked to its name)."""

HELPER_FROM_CELLS = 10_000
"""Runs with fewer cells are read by one process: starting the helper costs about as
much as reading 3,000 records."""

FREEZE_FROM_RECORDS = 10_000
"""From this many records on, a read ends with gc.freeze() (see read_cells)."""

_RECORD_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
"""A record is a regular file: a symlink is refused, not followed (it could point
anywhere on the host), and a FIFO cannot make the reader wait."""

_HELPER_MAIN = "from maka_eval.store.attempts import serve_helper; serve_helper()"

MAX_FILE_BYTES = MAX_RECORD_BYTES + ENVELOPE_BYTES
"""A sealed record file: a record of at most MAX_RECORD_BYTES in its envelope."""


class ReadMode(enum.StrEnum):
    """What a run's record files are, and what a reader checks of them."""

    SEALED = "sealed"
    """Envelopes whose seals are checked with the run's key (store/seal.py)."""
    SEALED_UNCHECKED = "sealed-unchecked"
    """Envelopes, read without checking their seals: the run's key is not here."""
    UNSEALED = "unsealed"
    """Bare records, written before records were sealed."""


@dataclass(frozen=True)
class RecordCheck:
    """How to read a run's record files: the mode, and the key for SEALED."""

    mode: ReadMode
    key: SealKey | None = None

    def __post_init__(self) -> None:
        if (self.mode is ReadMode.SEALED) != (self.key is not None):
            raise ValueError("a key is needed to check seals, and only then")


UNSEALED = RecordCheck(ReadMode.UNSEALED)


@dataclass
class CellsRead:
    """What the attempts directories of some cells hold."""

    records: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    """Valid records by cell id, each cell's in attempt-number order."""
    interrupted: dict[str, list[int]] = field(default_factory=dict)
    damaged: list[Problem] = field(default_factory=list)
    """Records that do not parse, name another cell or attempt than their path, or
    belong to another run: left out of `records` (runs whose seals are not checked)."""
    rejected: list[Rejection] = field(default_factory=list)
    """Record files whose seal or place fails (SEALED): left out of `records`; what
    each means is the ledger's to say (store/integrity.py)."""

    def extend(self, other: CellsRead) -> None:
        """Add what other cells hold (read after these, so the order stays the path's)."""
        for cell, records in other.records.items():
            self.records.setdefault(cell, []).extend(records)
        for cell, numbers in other.interrupted.items():
            self.interrupted.setdefault(cell, []).extend(numbers)
        self.damaged.extend(other.damaged)
        self.rejected.extend(other.rejected)


def read_cells(
    cells_root: str,
    run_id: str,
    check: RecordCheck = UNSEALED,
    meanwhile: Callable[[], None] | None = None,
) -> CellsRead:
    """Read every `<task>/<rep>/<subject>/attempts` directory under `cells_root`, in
    path order (a cell without one has no attempts). `meanwhile` is called before this
    process reads its first record, once the helper (if any) is starting."""
    # Pays: without the pause (here and in render_plots) a 100,000-record report takes
    # 1.3 s more CPU (read +0.65, summarize +0.34, analyse +0.33 s; bench/report_scale.py,
    # medians of 3 interleaved runs).
    with collector_paused():
        tasks = _subdirectory_names(cells_root)
        if not _worth_a_helper(cells_root, tasks):
            if meanwhile is not None:
                meanwhile()
            return _read_tasks(cells_root, tasks, run_id, check)
        read = _shared_read(cells_root, tasks, run_id, check, meanwhile)
        if sum(map(len, read.records.values())) >= FREEZE_FROM_RECORDS:
            # A large run's records are most of the heap, live as long as their reader
            # and hold no cycles: move them (and what else is alive) out of the
            # collector's sight, or each full collection after this walks them again.
            # Pays: without it summarize takes 0.83 s CPU instead of 0.60, the page 0.51
            # instead of 0.31 (bench/report_scale.py, medians of 3 interleaved runs).
            gc.freeze()
        return read


# -- two processes share the read -----------------------------------------------------------
# This process reads the task directories from the first on, the helper from the last
# back, until they meet: neither waits for the other however their speeds differ (the
# helper starts about 0.3 s late, and this process also rebuilds what the helper sends).
# Each says which task it starts before it reads it: this process on the helper's stdin
# (`_TASK_INDEX` numbers), the helper in its output (frames). Each stops before a task the
# other has started, so the two cover every task, one or two possibly twice (both may
# start the same task at once; this process keeps its own). The helper's frames are
# taken as they come, between two tasks. Whatever the helper did not deliver, because
# it failed, could not start or sent something unreadable, this process reads itself.

_TASK_INDEX = struct.Struct("<I")
"""A task's index, as this process tells the helper it started it."""
_FRAME = struct.Struct("<cI")
"""A helper frame's head: its kind and the length of what follows."""
_FRAME_STARTED = b"S"  # payload: _TASK_INDEX
_FRAME_TASK = b"T"  # payload: _TASK_INDEX, then encode_cells_read of that task's cells
_FRAME_END = b"E"  # no payload: the helper stopped and sent all it read
_PIPE_BYTES = 1 << 20
"""The helper's output pipe is enlarged to this (where Linux allows): it then rarely
waits for this process to take a task's records."""
_F_SETPIPE_SZ = 1031


def _shared_read(
    cells_root: str,
    tasks: Sequence[str],
    run_id: str,
    check: RecordCheck,
    meanwhile: Callable[[], None] | None,
) -> CellsRead:
    pieces: dict[int, CellsRead] = {}
    with _helper(cells_root, tasks, run_id, check) as helper:
        if meanwhile is not None:  # while the helper starts (about 0.3 s)
            meanwhile()
        reading = 0.0  # seconds this process spent reading tasks
        decoding = False  # whether this process decodes the helper's tasks as they come
        for index, task in enumerate(tasks):
            if helper is not None:
                helper.take_frames()
                if not decoding and pieces:
                    decoding = helper.should_take_over(
                        helper.lowest_started - index, reading / len(pieces)
                    )
                if decoding:
                    # Decode what has come, then read on while tasks are left: had the
                    # helper's pace been misjudged, this process would wait idle.
                    helper.decode_frames()
                    helper.take_frames()
                if index >= helper.lowest_started:
                    break
                helper.tell_started(index)
            if helper is None or index not in helper.pieces:  # (the helper failed)
                started = time.perf_counter()
                pieces[index] = _read_tasks(cells_root, [task], run_id, check)
                reading += time.perf_counter() - started
        if helper is not None:
            helper.finish()
            for index, piece in helper.pieces.items():
                pieces.setdefault(index, piece)
    read = CellsRead()
    for index, task in enumerate(tasks):
        own = pieces.get(index)
        read.extend(own if own is not None else _read_tasks(cells_root, [task], run_id, check))
    return read


def serve_helper() -> None:
    """The helper process: read task directories under argv[1] for run argv[2], from
    the last of those this process named on stdin back, until one this process has
    started; send each in frames on stdout (see `_shared_read`)."""
    cells_root, run_id = sys.argv[1:3]
    out = sys.stdout.buffer
    started = sys.stdin.fileno()  # unbuffered: no number may be read ahead and lost
    (size,) = _TASK_INDEX.unpack(_read_exactly(started, _TASK_INDEX.size))
    # The seal key comes on this pipe, never in the environment or the arguments.
    tasks, mode, secret = marshal.loads(_read_exactly(started, size))
    check = RecordCheck(ReadMode(mode), SealKey(secret) if secret is not None else None)
    os.set_blocking(started, False)
    pending = b""
    other = -1  # the last task this process said it started
    for index in range(len(tasks) - 1, -1, -1):
        try:
            chunk = os.read(started, 1 << 16)
        except BlockingIOError:
            chunk = b""
        if chunk:
            pending += chunk
            whole = len(pending) - len(pending) % _TASK_INDEX.size
            if whole:
                (other,) = _TASK_INDEX.unpack_from(pending, whole - _TASK_INDEX.size)
                pending = pending[whole:]
        if index <= other:
            break
        number = _TASK_INDEX.pack(index)
        out.write(_FRAME.pack(_FRAME_STARTED, len(number)) + number)
        out.flush()
        data = number + encode_cells_read(_read_tasks(cells_root, [tasks[index]], run_id, check))
        out.write(_FRAME.pack(_FRAME_TASK, len(data)) + data)
    out.write(_FRAME.pack(_FRAME_END, 0))
    out.flush()


def _read_exactly(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError("this process closed the helper's stdin early")
        data += chunk
    return data


# -- the helper's output -------------------------------------------------------------------
# Pickling a record and unpickling it cost about 15 µs each. The helper instead sends each
# record as a tuple of its fields' values in declaration order, with the values marshal
# cannot carry made plain: enum members as their values, UTC datetimes as their pickled
# state, the kernel, usage and artifact entries as tuples of their own fields (about
# 10 µs to make and marshal, 11 µs to rebuild). The field lists come from the dataclasses
# themselves, so a field added to them travels too; a value marshal refuses (or a datetime
# in another time zone) makes the helper fall back to pickle (the first byte says which).

_MARSHALLED = b"M"
_PICKLED = b"P"


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_RECORD_FIELDS = _field_names(AttemptRecord)
_KERNEL_FIELDS = _field_names(ResultKernel)
_USAGE_FIELDS = _field_names(Usage)
_ARTIFACT_FIELDS = _field_names(ArtifactEntry)
_record_values = attrgetter(*_RECORD_FIELDS)
_kernel_values = attrgetter(*_KERNEL_FIELDS)
_usage_values = attrgetter(*_USAGE_FIELDS)
_artifact_values = attrgetter(*_ARTIFACT_FIELDS)
_TRIGGER = _RECORD_FIELDS.index("trigger")
_STARTED = _RECORD_FIELDS.index("started_at")
_SUBJECT_STARTED = _RECORD_FIELDS.index("subject_started_at")
_FINISHED = _RECORD_FIELDS.index("finished_at")
_RESULT = _RECORD_FIELDS.index("result")
_TIMINGS = _RECORD_FIELDS.index("timings")
_STATUS = _KERNEL_FIELDS.index("status")
_SOURCE = _KERNEL_FIELDS.index("status_source")
_USAGE = _KERNEL_FIELDS.index("usage")
_ARTIFACTS = _KERNEL_FIELDS.index("artifacts")
_METRICS = _KERNEL_FIELDS.index("metrics")
_TRIGGERS = {member.value: member for member in Trigger}
_STATUSES = {member.value: member for member in AttemptStatus}
_SOURCES = {member.value: member for member in StatusSource}


def _flat_record(record: AttemptRecord) -> tuple[Any, ...]:
    values = list(_record_values(record))
    values[_TRIGGER] = record.trigger.value
    values[_STARTED] = _flat_time(record.started_at)
    if record.subject_started_at is not None:
        values[_SUBJECT_STARTED] = _flat_time(record.subject_started_at)
    values[_FINISHED] = _flat_time(record.finished_at)
    values[_TIMINGS] = dict(record.timings)
    kernel = record.result
    kernel_values = list(_kernel_values(kernel))
    kernel_values[_STATUS] = kernel.status.value
    kernel_values[_SOURCE] = kernel.status_source.value
    if kernel.usage is not None:
        kernel_values[_USAGE] = _usage_values(kernel.usage)
    if kernel.artifacts:
        kernel_values[_ARTIFACTS] = tuple(map(_artifact_values, kernel.artifacts))
    kernel_values[_METRICS] = dict(kernel.metrics)
    values[_RESULT] = tuple(kernel_values)
    return tuple(values)


def _flat_time(moment: datetime) -> bytes:
    """A UTC datetime's pickled state (10 bytes; isoformat() costs ten times as much);
    ValueError for any other time zone (the helper then pickles)."""
    state: tuple[Any, ...] = moment.__reduce__()[1]  # type: ignore[assignment]
    if len(state) != 2 or state[1] is not UTC:
        raise ValueError("not a UTC datetime")
    packed: bytes = state[0]
    return packed


_new = object.__new__


def _rebuilt(cls: type[Any], names: tuple[str, ...], values: Sequence[Any]) -> Any:
    # As `contract.record.plain_record` does: no __init__ (the helper validated these values, and
    # equal records come out), the fields set in declaration order (so that every
    # instance's dict shares its keys with the others', as the constructor's do).
    instance = _new(cls)
    instance.__dict__.update(zip(names, values, strict=True))
    return instance


def _unflat_record(values: tuple[Any, ...]) -> AttemptRecord:
    # Inlined _rebuilt: a report rebuilds 50,000 of these.
    kernel = _new(ResultKernel)
    own = kernel.__dict__
    own.update(zip(_KERNEL_FIELDS, values[_RESULT], strict=False))
    own["status"] = _STATUSES[own["status"]]
    own["status_source"] = _SOURCES[own["status_source"]]
    usage = own["usage"]
    if usage is not None:
        own["usage"] = _rebuilt(Usage, _USAGE_FIELDS, usage)
    if own["artifacts"]:
        own["artifacts"] = tuple(
            _rebuilt(ArtifactEntry, _ARTIFACT_FIELDS, entry) for entry in own["artifacts"]
        )
    record: AttemptRecord = _new(AttemptRecord)
    own = record.__dict__
    own.update(zip(_RECORD_FIELDS, values, strict=False))
    own["trigger"] = _TRIGGERS[own["trigger"]]
    own["started_at"] = _utc(own["started_at"], UTC)
    if own["subject_started_at"] is not None:
        own["subject_started_at"] = _utc(own["subject_started_at"], UTC)
    own["finished_at"] = _utc(own["finished_at"], UTC)
    own["result"] = kernel
    return record


_utc: Any = datetime
"""datetime(state, tzinfo) rebuilds a datetime from its pickled state (typed Any: the
stubs know only the public signature)."""


def encode_cells_read(read: CellsRead) -> bytes:
    """What the helper sends: marshalled plain values, or a pickle if marshal cannot
    carry some value."""
    try:
        return _MARSHALLED + marshal.dumps(
            (
                [
                    (cell, [_flat_record(r) for r in records])
                    for cell, records in read.records.items()
                ],
                read.interrupted,
                [(problem.where, problem.message) for problem in read.damaged],
                [rejection.values() for rejection in read.rejected],
            )
        )
    except ValueError:  # an unmarshallable value
        return _PICKLED + pickle.dumps(read, protocol=pickle.HIGHEST_PROTOCOL)


def decode_cells_read(data: bytes) -> CellsRead:
    """The CellsRead `encode_cells_read` encoded (ValueError, TypeError, KeyError,
    EOFError or pickle's own errors for anything else)."""
    if data[:1] == _PICKLED:
        read = pickle.loads(data[1:])  # our own child's output
        if not isinstance(read, CellsRead):
            raise TypeError("the helper sent something else than a CellsRead")
        return read
    if data[:1] != _MARSHALLED:
        raise ValueError("the helper's output has no known format")
    cells, interrupted, damaged, rejected = marshal.loads(data[1:])
    return CellsRead(
        records={cell: [_unflat_record(values) for values in records] for cell, records in cells},
        interrupted=interrupted,
        damaged=[Problem(where, message) for where, message in damaged],
        rejected=[Rejection.from_values(values) for values in rejected],
    )


def _read_tasks(
    cells_root: str, tasks: Sequence[str], run_id: str, check: RecordCheck = UNSEALED
) -> CellsRead:
    read = CellsRead()
    for task in tasks:
        for rep in _subdirectories(os.path.join(cells_root, task)):
            repetition = _number(rep.name) or 0
            # A folder maka-eval never makes ("01" for 1) is no place for a record.
            placed = str(repetition) == rep.name
            for subject in _subdirectories(rep.path):
                cell = cell_id(task, repetition, subject.name)
                attempts_dir = f"{subject.path}/attempts"
                if check.key is not None:
                    _read_sealed_cell(cell, attempts_dir, run_id, read, check.key, placed)
                else:
                    _read_cell(cell, attempts_dir, run_id, read, check.mode)
    for records in read.records.values():
        records.sort(key=_attempt)
    for numbers in read.interrupted.values():
        numbers.sort()
    return read


def _read_cell(cell: str, attempts_dir: str, run_id: str, read: CellsRead, mode: ReadMode) -> None:
    """A cell whose seals are not checked: bare records (UNSEALED) or envelopes read
    without the key (SEALED_UNCHECKED)."""
    names = _listing(attempts_dir)
    if names is None:
        return
    numbers_with_records = set()
    folders: list[tuple[int, str]] = []  # names that may be attempt directories
    records = None
    sealed = mode is ReadMode.SEALED_UNCHECKED
    for name in names:
        if not name.endswith(".json"):
            number = _number(name)
            if number is not None:
                folders.append((number, name))
            continue
        if name.startswith(TMP_PREFIX):
            continue
        number = _number(name[: -len(".json")])
        if number is not None:  # a record, damaged or not, is not an interrupted attempt
            numbers_with_records.add(number)
        path = f"{attempts_dir}/{name}"
        try:
            data = _read_record(path, MAX_FILE_BYTES if sealed else MAX_RECORD_BYTES)
            if sealed != is_envelope(data):
                raise ContractError(
                    "not a sealed record: this run's records are sealed"
                    if sealed
                    else "a sealed record in a run that names no seal key (its "
                    "experiment.json was changed?)"
                )
            record = _from_json(data[BODY_AT:-2] if sealed else data)
        except (ContractError, OSError) as exc:
            read.damaged.append(Problem(path, f"not a valid attempt record: {str(exc)[:200]}"))
            continue
        if record.cell_id != cell or f"{record.attempt:04d}.json" != name:
            read.damaged.append(
                Problem(
                    path,
                    f"claims to be attempt {record.attempt} of "
                    f"{record.cell_id}; records are never moved, so it was tampered with",
                )
            )
            continue
        if record.run_id != run_id:
            read.damaged.append(Problem(path, "belongs to a different run"))
            continue
        if records is None:
            records = read.records.setdefault(cell, [])
        records.append(record)
    _interrupted(cell, attempts_dir, folders, numbers_with_records, read)


def _read_sealed_cell(
    cell: str, attempts_dir: str, run_id: str, read: CellsRead, key: SealKey, placed: bool
) -> None:
    """A cell of a sealed run, each record's seal checked against the record's bytes
    and its place (this run, this cell, the number its name gives)."""
    names = _listing(attempts_dir)
    if names is None:
        return
    numbers_with_records = set()
    folders: list[tuple[int, str]] = []
    records = None
    place = record_place(run_id, cell)
    seal = key.seal
    for name in names:
        if not name.endswith(".json"):
            number = _number(name)
            if number is not None:
                folders.append((number, name))
            continue
        if name.startswith(TMP_PREFIX):
            continue
        number = _number(name[: -len(".json")])
        path = f"{attempts_dir}/{name}"
        if number is None or not placed or f"{number:04d}.json" != name:
            reject = Rejection(
                path, cell, 0, Cause.NOT_A_PLACE, "maka-eval never writes a record there"
            )
            read.rejected.append(reject)
            continue
        numbers_with_records.add(number)  # a record, valid or not: not interrupted
        try:
            data = _read_record(path, MAX_FILE_BYTES)
        except OSError as exc:
            why = f"it cannot be read as a record file ({exc.strerror or exc})"
            read.rejected.append(Rejection(path, cell, number, Cause.UNREADABLE, why))
            continue
        if len(data) > MAX_FILE_BYTES or not is_envelope(data):
            read.rejected.append(_unsealed(path, cell, number, data))
            continue
        body = data[BODY_AT:-2]
        if not same_seal(data[SEAL_AT : SEAL_AT + 64], seal(place, number, body)):
            read.rejected.append(_bad_seal(path, cell, number, run_id, data, key))
            continue
        try:
            record = _from_json(body)
        except ContractError as exc:  # sealed, so written with the key: not by maka-eval
            why = f"sealed, but not a valid attempt record: {str(exc)[:200]}"
            read.rejected.append(Rejection(path, cell, number, Cause.INVALID, why))
            continue
        if record.cell_id != cell or record.attempt != number or record.run_id != run_id:
            why = "sealed, but it names another place than the one it was sealed for"
            read.rejected.append(Rejection(path, cell, number, Cause.INVALID, why))
            continue
        if records is None:
            records = read.records.setdefault(cell, [])
        records.append(record)
    _interrupted(cell, attempts_dir, folders, numbers_with_records, read)


def _unsealed(path: str, cell: str, number: int, data: bytes) -> Rejection:
    if len(data) > MAX_FILE_BYTES:
        why = f"it is larger than a record file may be ({MAX_FILE_BYTES} bytes)"
    elif not data.strip():
        why = "it is empty (or not a regular file)"
    elif data.lstrip().startswith(b"{") and b'"format"' in data[:200]:
        why = "it is not sealed (a bare record, or its seal was taken off)"
    else:
        why = "it is not a sealed record file (not JSON in the envelope's layout)"
    return Rejection(path, cell, number, Cause.NOT_SEALED, why)


def _bad_seal(
    path: str, cell: str, number: int, run_id: str, data: bytes, key: SealKey
) -> Rejection:
    """A record whose seal fails here: sealed for another place or run, or not sealed
    with this key at all (or edited)."""
    found = data[SEAL_AT : SEAL_AT + 64]
    body = data[BODY_AT:-2]
    claims = None
    with contextlib.suppress(ValueError, RecursionError):
        claims = strict_json.loads(body)
    if isinstance(claims, dict):
        run, claimed, attempt = claims.get("runId"), claims.get("cellId"), claims.get("attempt")
        if (
            isinstance(run, str)
            and isinstance(claimed, str)
            and type(attempt) is int
            and attempt >= 1
            and same_seal(found, key.seal(record_place(run, claimed), attempt, body))
        ):
            if run != run_id:
                return Rejection(path, cell, number, Cause.REPLAYED, "", run)
            return Rejection(path, cell, number, Cause.MOVED, "", f"{attempt} {claimed}")
    why = "its seal does not match its content (edited, or sealed with another key)"
    return Rejection(path, cell, number, Cause.BAD_SEAL, why)


def _listing(attempts_dir: str) -> list[str] | None:
    try:
        return sorted(os.listdir(attempts_dir))
    except (FileNotFoundError, NotADirectoryError):
        return None


def _interrupted(
    cell: str,
    attempts_dir: str,
    folders: list[tuple[int, str]],
    numbers_with_records: set[int],
    read: CellsRead,
) -> None:
    for number, name in folders:
        if number not in numbers_with_records and os.path.isdir(f"{attempts_dir}/{name}"):
            read.interrupted.setdefault(cell, []).append(number)


_from_json = AttemptRecord.from_json


def _read_record(path: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The file's bytes, at most one more than `limit` (so that an oversized file is
    refused as such without being loaded)."""
    fd = os.open(path, _RECORD_OPEN_FLAGS)
    try:
        chunks = []
        size = 0
        while size <= limit:
            wanted = limit + 1 - size
            chunk = os.read(fd, wanted)
            chunks.append(chunk)
            size += len(chunk)
            # A short read of a regular file is its end: no second read to be told so
            # (a record is complete before it gets its name).
            if len(chunk) < wanted:
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


class _Helper:
    """The started helper: the tasks it has started, and what it sent of them.

    Frames are taken as they come but decoded late: records rebuilt between this
    process's own would scatter both over the heap, and every later phase of a report
    then runs 30% slower (measured). So this process reads until the decoding it owes
    would take as long as the helper needs for the tasks left between them
    (`should_take_over`), then decodes it, and from then on decodes each task the helper
    sends before reading another, until the two meet: it never waits while tasks are
    left (stopping its reads there, it waited up to a second whenever the helper's pace
    was misjudged; the records decoded in between are a few tasks' worth)."""

    def __init__(self, process: subprocess.Popen[bytes], task_count: int) -> None:
        self.process = process
        self.lowest_started = task_count
        """The first task this process must leave to the helper (none yet)."""
        self.pieces: dict[int, CellsRead] = {}
        """The tasks the helper read, decoded."""
        self._frames: list[tuple[int, bytes]] = []  # received, not decoded yet
        self._undecoded_bytes = 0
        self._seconds_per_byte: float | None = None  # decoding, from the first task sent
        self._first_sent: float | None = None  # when its first task arrived
        self._tasks_sent = 0
        self._buffer = bytearray()
        self._ended = False
        assert process.stdout is not None and process.stdin is not None
        self._out = process.stdout.fileno()
        self._in = process.stdin.fileno()
        os.set_blocking(self._out, False)
        # A full stdin pipe must not make this process wait while the helper waits for
        # it to take frames: a number that does not fit is dropped (the next one says
        # more; a pipe write this small is all or nothing).
        os.set_blocking(self._in, False)
        with contextlib.suppress(OSError):  # not Linux, or over the allowed pipe size
            fcntl.fcntl(self._out, _F_SETPIPE_SZ, _PIPE_BYTES)

    def tell_started(self, index: int) -> None:
        if self._ended:
            return
        try:
            os.write(self._in, _TASK_INDEX.pack(index))
        except BlockingIOError:
            pass
        except OSError:  # the helper is gone: what it did not send is read here
            self._fail()

    def should_take_over(self, tasks_left: int, seconds_per_task: float) -> bool:
        """Whether the helper should read the tasks left between the two processes
        while this one decodes what it has sent. Its pace is measured once it has sent
        a few tasks (it also encodes them: about 15% slower than this process's)."""
        if self._seconds_per_byte is None or self._ended:
            return False
        if self._first_sent is not None and self._tasks_sent > 10:
            seconds_per_task = (time.perf_counter() - self._first_sent) / (self._tasks_sent - 1)
        return self._undecoded_bytes * self._seconds_per_byte >= tasks_left * seconds_per_task

    def take_frames(self, *, wait: bool = False) -> None:
        """Take what the helper has sent; with `wait`, wait until it sends something
        (or stops)."""
        while not self._ended:
            try:
                chunk = os.read(self._out, _PIPE_BYTES)
            except BlockingIOError:
                if not wait:
                    return
                select.select([self._out], [], [])
                continue
            except OSError:
                chunk = b""
            if not chunk:  # the helper exited before its end frame
                self._fail()
                return
            self._buffer += chunk
            self._split_frames()
            wait = False

    def finish(self) -> None:
        """Decode what the helper sends until it stops."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]  # no more numbers
        while True:
            self.decode_frames()
            if self._ended:
                return
            self.take_frames(wait=True)

    def _split_frames(self) -> None:
        buffer, at = self._buffer, 0
        try:
            while len(buffer) - at >= _FRAME.size:
                kind, length = _FRAME.unpack_from(buffer, at)
                end = at + _FRAME.size + length
                if end > len(buffer):
                    break
                body = bytes(buffer[at + _FRAME.size : end])
                at = end
                if kind == _FRAME_END:
                    self._ended = True
                    self.process.wait()
                    return
                (index,) = _TASK_INDEX.unpack_from(body)
                if kind == _FRAME_STARTED:
                    self.lowest_started = min(self.lowest_started, index)
                elif kind == _FRAME_TASK:
                    self._tasks_sent += 1
                    if self._first_sent is None:
                        self._first_sent = time.perf_counter()
                    self._frames.append((index, body[_TASK_INDEX.size :]))
                    self._undecoded_bytes += len(body)
                    if self._seconds_per_byte is None:  # the first: decoded now, timed
                        started = time.perf_counter()
                        self.decode_frames()
                        elapsed = time.perf_counter() - started
                        self._seconds_per_byte = elapsed / max(len(body), 1)
                else:
                    raise ValueError(f"unknown frame {kind!r}")
        except Exception:  # garbled output can raise almost anything: read it here
            self._fail()
            return
        del buffer[:at]

    def decode_frames(self) -> None:
        """Decode the tasks taken so far."""
        frames, self._frames, self._undecoded_bytes = self._frames, [], 0
        for index, data in frames:
            try:
                self.pieces[index] = decode_cells_read(data)
            except Exception:  # garbled: this process reads that task itself
                continue

    def _fail(self) -> None:
        # Nothing more is taken from it; a task it started and did not send is read by
        # this process (_shared_read reads every task that has no piece).
        self._ended = True
        self.lowest_started = sys.maxsize
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def _helper(
    cells_root: str, tasks: Sequence[str], run_id: str, check: RecordCheck
) -> Iterator[_Helper | None]:
    """Start the helper (None if it cannot start: this process then reads it all); it
    is killed if this process stops reading early."""
    # The helper imports this package from where this process did, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _HELPER_MAIN, cells_root, run_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        )
    except OSError:
        yield None
        return
    try:
        secret = check.key.secret_for_helper() if check.key is not None else None
        names = marshal.dumps((list(tasks), check.mode.value, secret))
        assert process.stdin is not None
        try:  # the list is small (20 bytes a task); the helper reads it first
            process.stdin.write(_TASK_INDEX.pack(len(names)) + names)
            process.stdin.flush()
        except OSError:
            process.kill()
            process.wait()
            yield None
            return
        yield _Helper(process, len(tasks))
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


def _worth_a_helper(cells_root: str, tasks: Sequence[str]) -> bool:
    if len(tasks) < 2 or not sys.executable or _usable_cpus() < 2:
        return False
    first_task = os.path.join(cells_root, tasks[0])
    cells_per_task = sum(len(_subdirectories(rep.path)) for rep in _subdirectories(first_task))
    return cells_per_task * len(tasks) >= HELPER_FROM_CELLS


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: records hold no reference cycles, and reading
    100,000 of them (or building a row per cell from them) would otherwise make it rescan
    the growing heap again and again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _subdirectories(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as listing:
            return sorted((entry for entry in listing if entry.is_dir()), key=_name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []  # gone or unreadable: no cells there (as a glob would skip it)


def _subdirectory_names(path: str) -> list[str]:
    return [entry.name for entry in _subdirectories(path)]


def _number(name: str) -> int | None:
    return int(name) if name.isdecimal() else None


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def _attempt(record: AttemptRecord) -> int:
    return record.attempt
