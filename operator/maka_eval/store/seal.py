"""The seal: an attempt record that was changed, forged or moved is noticed.

Every record file is an envelope around the record's JSON, laid out at fixed offsets so
that a reader checks the seal on the raw bytes without re-serializing anything:

    {"format":"maka.eval.sealed-attempt.v1","seal":"<64 hex>","record":<record JSON>}

The seal is HMAC-SHA256, under a per-user secret key, of the record's bytes *and* its
place: the run id, the cell id and the attempt number. A record edited in place, written
by anyone without the key, moved to another cell or number, or copied from another run
fails. Which records a run committed (so that a removed one is noticed too) is the
ledger's part (store/ledger.py).

The key: 32 random bytes in `<key folder>/seal.key`, created 0600 on first use, in a
folder (0700) outside every run and work folder, where no sandbox shows it:
`$MAKA_EVAL_KEY_DIR`, else `$XDG_DATA_HOME/maka-eval`, else `~/.local/share/maka-eval`.
Its id (the first 16 hex digits of its sha256) is written in the run document, so that
a reader knows which key a run needs. The key never enters an environment, an argument
list or a log: the reader's helper process gets it on its stdin pipe.

HMAC, not a signature: a report reads 100,000 records, and verifying an Ed25519
signature costs about 60 µs where this costs about 2 µs. Anyone who can verify a seal
can therefore also make one: the seal proves that a record was written by a process
holding this key, not by whom (docs/security.md says what it proves and what not).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from maka_eval.contract.record import AttemptRecord
from maka_eval.errors import Problem, StoreError

KEY_DIR_ENV = "MAKA_EVAL_KEY_DIR"
KEY_FILE = "seal.key"
KEY_BYTES = 32
HEADS_DIR = "runs"
"""Under the key folder: each sealed run's ledger head (store/ledger.py)."""

SEAL_FORMAT = "maka.eval.sealed-attempt.v1"
_PREFIX = b'{"format":"' + SEAL_FORMAT.encode() + b'","seal":"'
_MIDDLE = b'","record":'
_SUFFIX = b"}\n"
SEAL_AT = len(_PREFIX)
"""Where the seal's 64 hex digits start in a record file."""
BODY_AT = SEAL_AT + 64 + len(_MIDDLE)
"""Where the record's JSON starts (it ends two bytes before the file's end)."""
ENVELOPE_BYTES = BODY_AT + len(_SUFFIX)
"""What the envelope adds to a record's JSON."""

_RECORD = b"record\0"
_LINK = b"ledger\0"
_GENESIS = b"genesis\0"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_envelope(data: bytes) -> bool:
    """Whether `data` has the envelope's fixed layout (the seal itself unchecked)."""
    return (
        len(data) >= ENVELOPE_BYTES
        and data.startswith(_PREFIX)
        and data[SEAL_AT + 64 : BODY_AT] == _MIDDLE
        and data.endswith(_SUFFIX)
    )


def envelope(seal: bytes, body: bytes) -> bytes:
    """The record file: `body` (a record's JSON) with its seal (64 hex digits)."""
    return _PREFIX + seal + _MIDDLE + body + _SUFFIX


def seal_record(key: SealKey, record: AttemptRecord) -> tuple[bytes, bytes]:
    """A record's file (its JSON in the envelope) and its seal, for the place the
    record names (its run, cell and attempt number)."""
    body = json.dumps(record.to_dict(), indent=2).encode()
    seal = key.seal(record_place(record.run_id, record.cell_id), record.attempt, body)
    return envelope(seal, body), seal


def record_place(run_id: str, cell_id: str) -> bytes:
    """What a seal binds besides the record's bytes, up to the attempt number (a reader
    makes it once per cell): ids hold no NUL, so no two places read the same."""
    return _RECORD + f"{run_id}\0{cell_id}\0".encode()


def is_run_id(value: str) -> bool:
    """Whether a run id is safe to name a file with (the head's, in the key folder)."""
    return _RUN_ID.fullmatch(value) is not None


class SealKey:
    """The secret key, ready to seal: HMAC-SHA256 with its padded-key states made once
    (a seal then costs two hash copies, not a new HMAC object: 1.6 µs instead of 2.5
    for a record here). Its repr shows the id only."""

    __slots__ = ("_inner", "_outer", "_secret", "key_id")

    def __init__(self, secret: bytes) -> None:
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a seal key is {KEY_BYTES} bytes")
        self._secret = secret
        self.key_id = key_id(secret)
        padded = secret.ljust(64, b"\0")  # HMAC's block: a 32-byte key is padded, not hashed
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))

    def __repr__(self) -> str:
        return f"SealKey(id={self.key_id})"

    def secret_for_helper(self) -> bytes:
        """The key's bytes, for the store's own helper process (on its stdin)."""
        return self._secret

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 of the parts' concatenation (raw 32 bytes)."""
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def seal(self, place: bytes, attempt: int, body: bytes) -> bytes:
        """The seal (64 hex digits, ASCII) of a record's JSON at `place` (record_place)."""
        inner = self._inner.copy()
        inner.update(place)
        inner.update(b"%d\0" % attempt)
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest().encode()

    def link(self, previous: bytes, entry: bytes) -> bytes:
        """A ledger line's chain value: the previous one's, then the line's entry."""
        inner = self._inner.copy()
        inner.update(_LINK + previous + b"\0" + entry)  # (one update: a ledger has 100,000s)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def genesis(self, run_id: str, document_digest: str) -> bytes:
        """The chain's first value: the run, this key, and its run document's digest."""
        return self.mac(_GENESIS, f"{run_id}\0{self.key_id}\0{document_digest}".encode())


def same_seal(found: bytes, expected: bytes) -> bool:
    """Constant-time comparison of two seals (hex, ASCII)."""
    return hmac.compare_digest(found, expected)


def key_id(secret: bytes) -> str:
    """A key's public id: the first 16 hex digits of its sha256."""
    return hashlib.sha256(secret).hexdigest()[:16]


def key_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The key folder: $MAKA_EVAL_KEY_DIR, else $XDG_DATA_HOME/maka-eval, else
    ~/.local/share/maka-eval."""
    env = os.environ if environ is None else environ
    explicit = env.get(KEY_DIR_ENV)
    if explicit:
        return Path(explicit).absolute()
    data = env.get("XDG_DATA_HOME")
    base = Path(data) if data and os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "maka-eval"


def heads_dir(directory: Path) -> Path:
    """Where the ledger heads of the runs sealed with this folder's key are."""
    return directory / HEADS_DIR


def _private(path: Path, info: os.stat_result, what: str, mode: str) -> None:
    """Refuse a key file or folder that another user owns or may read."""
    if info.st_uid != os.geteuid():
        raise StoreError(
            f"the seal key's {what} {path} belongs to another user:",
            [Problem(str(path), f"use a {what} of your own: set {KEY_DIR_ENV}")],
        )
    if info.st_mode & 0o077:
        raise StoreError(
            f"the seal key's {what} {path} is open to other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); anyone who reads the key can forge records:",
            [Problem(str(path), f"chmod {mode} {path}")],
        )


def _check_folder(directory: Path) -> None:
    info = os.stat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise StoreError(
            f"the seal key folder {directory} is not a folder:",
            [Problem(str(directory), f"set {KEY_DIR_ENV} to a folder of your own")],
        )
    _private(directory, info, "folder", "700")


def _read_key(path: Path) -> bytes | None:
    """The key file's bytes, checked; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(
            f"the seal key {path} cannot be read:", [Problem(str(path), str(exc))]
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StoreError(
                f"the seal key {path} is not a regular file:",
                [Problem(str(path), f"remove it, or set {KEY_DIR_ENV} to another folder")],
            )
        _private(path, info, "file", "600")
        secret = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != KEY_BYTES:
        raise StoreError(
            f"the seal key {path} is not a maka-eval key ({KEY_BYTES} bytes):",
            [Problem(str(path), f"it was changed; restore it, or set {KEY_DIR_ENV}")],
        )
    return secret


def find_key(directory: Path, wanted: str) -> SealKey | None:
    """The key with id `wanted` in the key folder, or None (a reader never makes one)."""
    key = own_key(directory)
    return key if key is not None and key.key_id == wanted else None


def own_key(directory: Path) -> SealKey | None:
    """The key folder's key, if it has one (never made here)."""
    if not directory.is_dir():
        return None
    _check_folder(directory)
    secret = _read_key(directory / KEY_FILE)
    return SealKey(secret) if secret is not None else None


def signing_key(directory: Path) -> SealKey:
    """The key folder's key, made (32 random bytes, 0600) on first use."""
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)
    _check_folder(directory)
    path = directory / KEY_FILE
    secret = _read_key(path)
    if secret is not None:
        return SealKey(secret)
    # Made in a temporary file and linked to its name: two first runs at once end up
    # with the one key that was linked first.
    tmp = directory / f".tmp-{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    secret = _read_key(path)
    assert secret is not None
    return SealKey(secret)
