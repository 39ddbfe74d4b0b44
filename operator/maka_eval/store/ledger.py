"""The ledger: which records a run committed, so that a removed record is noticed.

    <run>/records.ledger                 append-only: a first line, then a line a record
    <key folder>/runs/<run-id>.head      how many record lines the ledger had, last chain

    maka.eval.ledger.v1 <run id> <key id> <sha256 of experiment.json> <chain>
    <seal> <chain> <attempt> <cell id>
    ...

Each line's chain value is an HMAC, under the run's key, of the previous line's chain
value and the line's own entry (the first line's of the run, the key and the run
document's digest): nobody without the key can edit, insert, reorder or remove a line
without breaking the chain from there on. Only cutting lines off the end keeps the rest
intact, and the head catches that: it lives in the key folder, out of every sandbox's
reach, and is replaced after every line.

A record's seal (store/seal.py) proves where it belongs; the ledger proves which
records exist: a record file without a line was never committed (added), a line
without its file was removed. The writer's order makes a crash look like neither:
record file (fsync), then its line (fdatasync), then the head (replaced by a rename). A
crash can leave a sealed record without its line (read as pending and added on resume;
only the key's holder can seal one), a head behind the ledger (accepted: a head is a
lower bound, the writer moves it on at resume), or a last line without its newline
(ignored, and cut on resume). The head is not fsync'd (a commit costs one fsync more
than before sealing, not two): a process crash never loses it, and a power loss can
only leave an older head (the line it follows is durable first) or, on a file system
that does not order a rename after the data it replaces, an empty one, which is read as
no head (a note, never a false alarm).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from maka_eval import strict_json
from maka_eval.store.integrity import Breach, Finding, place
from maka_eval.store.seal import SealKey, is_run_id, same_seal

LEDGER_FILE = "records.ledger"
LEDGER_FORMAT = "maka.eval.ledger.v1"
HEAD_FORMAT = "maka.eval.ledger-head.v1"
_HEAD_KEYS = frozenset({"format", "runId", "keyId", "count", "chain"})
_HEX = 64
_CHAIN_AT = _HEX + 1
_ENTRY_AT = _CHAIN_AT + _HEX + 1
MAX_HEAD_BYTES = 4096


def document_digest(document: bytes) -> str:
    """The run document's digest, as the ledger's first line binds it."""
    return hashlib.sha256(document).hexdigest()


def head_path(heads: Path, run_id: str) -> Path | None:
    """Where a run's head is kept (None for a run id that cannot name a file)."""
    return heads / f"{run_id}.head" if is_run_id(run_id) else None


@dataclass(frozen=True)
class LedgerSnapshot:
    """A run's head and ledger as they were read, the head first: a live writer appends
    a line before it moves the head on, so this head is never ahead of this ledger (and
    the records, read after both, include every record the ledger lists)."""

    path: Path
    data: bytes | None
    """The ledger's bytes; None when there is no ledger."""
    head_path: Path | None
    head: bytes | None
    """The head's bytes; None when the key folder holds none for this run."""

    @classmethod
    def take(cls, run_dir: Path, heads: Path, run_id: str) -> LedgerSnapshot:
        """Read the head, then the ledger."""
        where = head_path(heads, run_id)
        head = _read_optional(where, MAX_HEAD_BYTES) if where is not None else None
        path = run_dir / LEDGER_FILE
        return cls(path, _read_optional(path, None), where, head)


def _read_optional(path: Path, limit: int | None) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink: not a file the store wrote
            return b""
        raise
    try:
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read() if limit is None else handle.read(limit + 1)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Head:
    """The head: how many record lines the ledger had and the last line's chain value."""

    count: int
    chain: str


@dataclass
class LedgerState:
    """A ledger, verified: the places of the lines that chain, and what is wrong."""

    exists: bool
    places: dict[str, int] = field(default_factory=dict)
    """Each record line's place (`integrity.place()`) -> its line number in the file (the first
    record's line is 2: line 1 names the run)."""
    count: int = 0
    """Record lines that chain (all of them, unless a finding says otherwise)."""
    chain: bytes = b""
    """The chain value after those lines."""
    torn: int = 0
    """Bytes of a last line without its newline (a crash while appending)."""
    head: Head | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def verify_ledger(snapshot: LedgerSnapshot, key: SealKey, run_id: str, digest: str) -> LedgerState:
    """Check the ledger's chain from its first line and hold it against the head."""
    where = str(snapshot.path)
    head, findings = _parse_head(snapshot, run_id, key.key_id)
    if snapshot.data is None:
        state = LedgerState(exists=False, head=head, findings=findings)
        if head is not None:
            state.findings.append(
                Finding(
                    Breach.LEDGER_REMOVED,
                    where,
                    f"the run's ledger is gone; the head ({snapshot.head_path}) says it "
                    f"listed {head.count} record(s)",
                )
            )
        return state
    data = snapshot.data
    complete = data.rfind(b"\n") + 1
    state = LedgerState(exists=True, torn=len(data) - complete, head=head, findings=findings)
    lines = data[:complete].split(b"\n")
    lines.pop()  # after the last newline
    first = lines[0] if lines else b""
    chain = _first_line(first, key, run_id, digest, where, state)
    if chain is None:
        return state
    at_head = chain if head is not None and head.count == 0 else None
    head_count = head.count if head is not None else -1
    places = state.places
    link = key.link
    number = 0
    for number, line in enumerate(lines[1:], 1):
        if len(line) <= _ENTRY_AT or line[_HEX] != 0x20 or line[_CHAIN_AT + _HEX] != 0x20:
            broken = True
        else:
            entry = line[:_HEX] + line[_ENTRY_AT - 1 :]  # "<seal> <attempt> <cell>"
            chain = link(chain, entry)
            broken = not same_seal(chain.hex().encode(), line[_CHAIN_AT : _CHAIN_AT + _HEX])
        if broken:
            state.findings.append(
                Finding(
                    Breach.LEDGER_EDITED,
                    where,
                    f"line {number + 1} does not follow from the lines before it: lines "
                    "were edited, inserted, reordered or removed; what it and the lines "
                    "after it list cannot be checked",
                )
            )
            state.count = number - 1
            return state
        places[line[_ENTRY_AT:].decode()] = number + 1  # (the file's line number)
        if number == head_count:
            at_head = chain
    state.count = number
    state.chain = chain
    if head is not None:
        if head.count > state.count:
            state.findings.append(
                Finding(
                    Breach.LEDGER_CUT,
                    where,
                    f"the head ({snapshot.head_path}) says {head.count} record(s) were "
                    f"committed, the ledger lists {state.count}: its last "
                    f"{head.count - state.count} line(s) were cut off",
                )
            )
        elif at_head is None or at_head.hex() != head.chain:
            state.findings.append(
                Finding(
                    Breach.HEAD_MISMATCH,
                    str(snapshot.head_path),
                    f"the head does not match the ledger's line {head.count + 1}: the head "
                    "or the ledger was replaced",
                )
            )
    elif state.count:
        folder = snapshot.head_path.parent if snapshot.head_path else "the key folder"
        why = (
            f"its head {snapshot.head_path} is empty (the machine lost power while it was "
            "replaced?)"
            if snapshot.head == b""
            else f"no head for this run in {folder} (the run was written with another key "
            "folder, or copied here with its key)"
        )
        state.notes.append(f"{why}: records cut off the ledger's end would go unnoticed")
    return state


def ledger_sealed_with(path: Path, key: SealKey) -> bool:
    """Whether the ledger at `path` was started with `key` (its first line's chain value
    is the key's), whatever run document it names."""
    data = _read_optional(path, 4096)
    if not data:
        return False
    parts = data.split(b"\n", 1)[0].split(b" ")
    try:
        fmt, run_id, line_key, digest, chain = (p.decode() for p in parts)
    except (ValueError, UnicodeDecodeError):
        return False
    if fmt != LEDGER_FORMAT or line_key != key.key_id:
        return False
    return same_seal(key.genesis(run_id, digest).hex().encode(), chain.encode())


def _first_line(
    line: bytes, key: SealKey, run_id: str, digest: str, where: str, state: LedgerState
) -> bytes | None:
    """The chain's first value, from the ledger's first line; None (with a finding)
    when that line is not this run's."""
    parts = line.split(b" ")
    try:
        fmt, line_run, line_key, line_digest, chain = (p.decode() for p in parts)
    except (ValueError, UnicodeDecodeError):
        fmt = line_run = line_key = line_digest = chain = ""
    if fmt != LEDGER_FORMAT or line_key != key.key_id:
        state.findings.append(
            Finding(
                Breach.LEDGER_EDITED,
                where,
                "its first line is not a ledger line written with this run's key: the "
                "ledger was replaced; what it lists cannot be checked",
            )
        )
        return None
    value = key.genesis(line_run, line_digest)
    if not same_seal(value.hex().encode(), chain.encode()):
        state.findings.append(
            Finding(
                Breach.LEDGER_EDITED,
                where,
                "its first line was edited; what the ledger lists cannot be checked",
            )
        )
        return None
    if line_run != run_id:
        state.findings.append(
            Finding(
                Breach.REPLAYED,
                where,
                f"the ledger is run {line_run}'s, not this run's ({run_id}): the run "
                "document or the ledger was replaced",
            )
        )
        return None
    if line_digest != digest:
        state.findings.append(
            Finding(
                Breach.DOCUMENT_EDITED,
                str(Path(where).with_name("experiment.json")),
                "the run document (experiment.json) was changed after the run was created "
                "(its sha256 is not the one the ledger's first line holds)",
            )
        )
    return value


def _parse_head(
    snapshot: LedgerSnapshot, run_id: str, key_id: str
) -> tuple[Head | None, list[Finding]]:
    if not snapshot.head:  # none, or emptied by a power loss (see the module's doc)
        return None, []
    where = str(snapshot.head_path)
    try:
        data = strict_json.loads(snapshot.head)
        if (
            type(data) is not dict
            or not _HEAD_KEYS.issuperset(data)
            or data.get("format") != HEAD_FORMAT
            or type(data.get("count")) is not int
            or data["count"] < 0
            or type(data.get("chain")) is not str
        ):
            raise ValueError("not a ledger head")
    except ValueError:
        return None, [
            Finding(Breach.HEAD_MISMATCH, where, "the head is not a ledger head: it was edited")
        ]
    if data.get("runId") != run_id or data.get("keyId") != key_id:
        return None, [
            Finding(
                Breach.HEAD_MISMATCH,
                where,
                f"the head names run {data.get('runId')} and key {data.get('keyId')}: it was "
                "edited",
            )
        ]
    return Head(data["count"], data["chain"]), []


class LedgerWriter:
    """Appends a run's ledger lines and moves its head on (the run's one writer; commits
    from several threads are taken one at a time)."""

    def __init__(
        self,
        path: Path,
        head: Path,
        key: SealKey,
        run_id: str,
        count: int,
        chain: bytes,
        *,
        durable: bool = True,
    ) -> None:
        self.path = path
        self._head = head
        self._key = key
        self._run_id = run_id
        self._count = count
        self._chain = chain
        self._durable = durable
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)

    @property
    def count(self) -> int:
        return self._count

    @classmethod
    def create(
        cls,
        run_dir: Path,
        run_id: str,
        key: SealKey,
        digest: str,
        heads: Path,
        *,
        durable: bool = True,
    ) -> LedgerWriter:
        """Start the ledger of a run that has none (and no records): its first line."""
        head = _heads_folder(heads, run_id)
        path = run_dir / LEDGER_FILE
        chain = key.genesis(run_id, digest)
        first = f"{LEDGER_FORMAT} {run_id} {key.key_id} {digest} {chain.hex()}\n".encode()
        # Whole or not at all (a temporary file linked to its name): an empty or torn
        # first line would read as a replaced ledger.
        tmp = path.with_name(f".tmp-{LEDGER_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                _write_all(fd, first)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, path)  # FileExistsError: there is a ledger already
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if durable:
            _fsync_dir(run_dir)
        writer = cls(path, head, key, run_id, 0, chain, durable=durable)
        writer._write_head()
        return writer

    @classmethod
    def reopen(
        cls,
        run_dir: Path,
        run_id: str,
        key: SealKey,
        state: LedgerState,
        heads: Path,
        *,
        durable: bool = True,
    ) -> LedgerWriter:
        """Append to a verified ledger: cut a last line a crash left without its newline,
        and bring the head up to the ledger. (`durable=False` skips every fsync: for
        synthesized runs, as a benchmark writes them.)"""
        head = _heads_folder(heads, run_id)
        path = run_dir / LEDGER_FILE
        if state.torn:
            os.truncate(path, path.stat().st_size - state.torn)
        writer = cls(path, head, key, run_id, state.count, state.chain, durable=durable)
        writer._write_head()
        return writer

    def append(self, cell_id: str, attempt: int, seal: bytes) -> None:
        """Add a committed record's line, then move the head on."""
        entry = seal + f" {place(cell_id, attempt)}".encode()
        with self._lock:
            chain = self._key.link(self._chain, entry)
            line = seal + b" " + chain.hex().encode() + entry[_HEX:] + b"\n"
            _write_all(self._fd, line)
            if self._durable:
                os.fdatasync(self._fd)
            self._chain = chain
            self._count += 1
            self._write_head()

    def _write_head(self) -> None:
        document = {
            "format": HEAD_FORMAT,
            "runId": self._run_id,
            "keyId": self._key.key_id,
            "count": self._count,
            "chain": self._chain.hex(),
        }
        tmp = self._head.with_name(f".tmp-{self._head.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                _write_all(fd, (json.dumps(document) + "\n").encode())
            finally:
                os.close(fd)
            os.replace(tmp, self._head)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def close(self) -> None:
        """Close the ledger file."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _heads_folder(heads: Path, run_id: str) -> Path:
    where = head_path(heads, run_id)
    if where is None:
        raise ValueError(f"run id {run_id!r} cannot name a head file")
    with contextlib.suppress(FileExistsError):
        heads.mkdir(mode=0o700)
    # What a writer of this run killed while replacing its head left (we are its writer).
    for tmp in heads.glob(f".tmp-{where.name}.*"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return where


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
