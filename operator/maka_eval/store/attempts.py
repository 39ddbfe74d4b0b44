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
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from operator import attrgetter
from pathlib import Path
from typing import Any

from maka_eval.contract.fields import ContractError
from maka_eval.contract.kernel import ArtifactEntry, ResultKernel
from maka_eval.contract.record import MAX_RECORD_BYTES, AttemptRecord
from maka_eval.engine.expand import cell_id
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.engine.usage import Usage
from maka_eval.errors import Problem

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


@dataclass
class CellsRead:
    """What the attempts directories of some cells hold."""

    records: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    """Valid records by cell id, each cell's in attempt-number order."""
    interrupted: dict[str, list[int]] = field(default_factory=dict)
    damaged: list[Problem] = field(default_factory=list)
    """Records that do not parse, name another cell or attempt than their path, or
    belong to another run: left out of `records`."""

    def extend(self, other: CellsRead) -> None:
        """Add what other cells hold (read after these, so the order stays the path's)."""
        for cell, records in other.records.items():
            self.records.setdefault(cell, []).extend(records)
        for cell, numbers in other.interrupted.items():
            self.interrupted.setdefault(cell, []).extend(numbers)
        self.damaged.extend(other.damaged)


def read_cells(cells_root: str, run_id: str) -> CellsRead:
    """Read every `<task>/<rep>/<subject>/attempts` directory under `cells_root`, in
    path order (a cell without one has no attempts)."""
    with collector_paused():
        tasks = _subdirectory_names(cells_root)
        if not _worth_a_helper(cells_root, tasks):
            return _read_tasks(cells_root, tasks, run_id)
        half = len(tasks) // 2
        with _helper(cells_root, tasks[half], run_id) as helper:
            read = _read_tasks(cells_root, tasks[:half], run_id)
            rest = helper.result() if helper is not None else None
        if rest is None:  # the helper failed: read its half here
            rest = _read_tasks(cells_root, tasks[half:], run_id)
        read.extend(rest)
        if sum(map(len, read.records.values())) >= FREEZE_FROM_RECORDS:
            # A large run's records are most of the heap, live as long as their reader
            # and hold no cycles: move them (and what else is alive) out of the
            # collector's sight, or each full collection after this walks them again.
            gc.freeze()
        return read


def serve_helper() -> None:
    """The helper process: read the task directories under argv[1] named argv[2] or
    after, for run argv[3]; write the CellsRead to stdout (`encode_cells_read`)."""
    cells_root, first, run_id = sys.argv[1:4]
    gc.disable()  # a short-lived process holding acyclic records
    tasks = [task for task in _subdirectory_names(cells_root) if task >= first]
    read = _read_tasks(cells_root, tasks, run_id)
    sys.stdout.buffer.write(encode_cells_read(read))
    sys.stdout.buffer.flush()


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
    # As `contract.fields.assembled`: no __init__ (the helper validated these values, and
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
    cells, interrupted, damaged = marshal.loads(data[1:])
    return CellsRead(
        records={cell: [_unflat_record(values) for values in records] for cell, records in cells},
        interrupted=interrupted,
        damaged=[Problem(where, message) for where, message in damaged],
    )


def _read_tasks(cells_root: str, tasks: Sequence[str], run_id: str) -> CellsRead:
    read = CellsRead()
    for task in tasks:
        for rep in _subdirectories(os.path.join(cells_root, task)):
            repetition = _number(rep.name) or 0
            for subject in _subdirectories(rep.path):
                cell = cell_id(task, repetition, subject.name)
                _read_cell(cell, f"{subject.path}/attempts", run_id, read)
    for records in read.records.values():
        records.sort(key=_attempt)
    for numbers in read.interrupted.values():
        numbers.sort()
    return read


def _read_cell(cell: str, attempts_dir: str, run_id: str, read: CellsRead) -> None:
    try:
        names = sorted(os.listdir(attempts_dir))
    except (FileNotFoundError, NotADirectoryError):
        return
    numbers_with_records = set()
    for name in names:
        if not name.endswith(".json") or name.startswith(TMP_PREFIX):
            continue
        number = _number(name[: -len(".json")])
        if number is not None:  # a record, damaged or not, is not an interrupted attempt
            numbers_with_records.add(number)
        path = f"{attempts_dir}/{name}"
        try:
            record = AttemptRecord.from_json(_read_record(path))
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
        read.records.setdefault(cell, []).append(record)
    for name in names:
        number = _number(name)
        if (
            number is not None
            and number not in numbers_with_records
            and os.path.isdir(f"{attempts_dir}/{name}")
        ):
            read.interrupted.setdefault(cell, []).append(number)


def _read_record(path: str) -> bytes:
    """The file's bytes, at most one more than a record may have (so that an oversized
    file is refused as such without being loaded)."""
    fd = os.open(path, _RECORD_OPEN_FLAGS)
    try:
        chunks = []
        size = 0
        while size <= MAX_RECORD_BYTES:
            wanted = MAX_RECORD_BYTES + 1 - size
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
    """The helper process, started; its result is None if it failed in any way."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def result(self) -> CellsRead | None:
        out, _ = self.process.communicate()
        if self.process.returncode != 0:
            return None
        try:
            return decode_cells_read(out)
        except Exception:  # truncated or garbled output can raise almost anything
            return None


@contextlib.contextmanager
def _helper(cells_root: str, first: str, run_id: str) -> Iterator[_Helper | None]:
    """Start the helper (None if it cannot start: this process then reads it all); it
    is killed if this process stops reading early."""
    # The helper imports this package from where this process did, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _HELPER_MAIN, cells_root, first, run_id],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        )
    except OSError:
        yield None
        return
    try:
        yield _Helper(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


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
