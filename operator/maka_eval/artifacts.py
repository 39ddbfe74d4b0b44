"""Artifact files: their names, byte counts, sha256 digests, and copies with credentials
redacted.

Standard library only: the relay uses it inside task containers, the store locally.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from maka_eval.contract.kernel import ARTIFACT_NAME_LIMIT
from maka_eval.printable import escaped

CHUNK = 1 << 16


NAME_MAX_BYTES = 255
"""Bytes in one component of a path (Linux's NAME_MAX)."""


def artifact_name(prefix: str, relative: str) -> str | None:
    """The name of the file at `relative` (a '/'-separated path a subject may have chosen)
    under `prefix`, or None when that name is too long: longer than a record holds
    (ARTIFACT_NAME_LIMIT: the record would be unreadable) or, escaped, than a file name
    may be (NAME_MAX_BYTES).

    The one place a stored file gets its name, which is also its path in the attempt's
    artifacts folder: control, format and separator characters are escaped and
    backslashes doubled (maka_eval.printable.escaped: `\\x1b`, `\\u202e`), so no name
    carries a raw control character into a record or onto a terminal, the escaping can
    be undone, and two files never share a name."""
    name = f"{prefix}/{escaped(relative)}"
    if len(name) > ARTIFACT_NAME_LIMIT:
        return None
    if any(len(part.encode()) > NAME_MAX_BYTES for part in name.split("/")):
        return None
    return name


@dataclass(frozen=True)
class ArtifactDigest:
    """Size and content digest of one artifact."""

    bytes: int
    sha256: str


def digest_file(path: Path) -> ArtifactDigest:
    """Size and sha256 of a file."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return ArtifactDigest(size, digest.hexdigest())


def redaction(name: str) -> bytes:
    """What replaces a credential's value in an artifact."""
    return f"[redacted:{name}]".encode()


@dataclass(frozen=True)
class Redactor:
    """Replaces credential values, wherever they appear, by `[redacted:NAME]`."""

    replacements: Mapping[bytes, bytes]

    @classmethod
    def of(cls, secrets: Mapping[str, str]) -> Redactor:
        """From name -> value; a value is also caught in the forms a subject can write it
        out in without a key of its own (`encoded_forms`). Redaction is the last line:
        what keeps a credential from another arm is that no sandbox ever holds it."""
        replacements: dict[bytes, bytes] = {}
        for name, value in secrets.items():
            if value:
                replacements[value.encode()] = redaction(name)
                for form in encoded_forms(value):
                    replacements.setdefault(form, redaction(name))
        return cls(replacements)

    def __bool__(self) -> bool:
        return bool(self.replacements)

    def scrub(self, data: bytes) -> bytes:
        """`data` with every value replaced (leftmost, longest first)."""
        if not self.replacements or not data:
            return data
        out = io.BytesIO()
        _redact_stream(io.BytesIO(data), out, self.replacements)
        return out.getvalue()

    def text(self, value: str) -> str:
        """A string with every value replaced."""
        if not self.replacements or not value:
            return value
        return self.scrub(value.encode()).decode(errors="replace")


NO_REDACTION = Redactor({})
MIN_FORM_BYTES = 8
"""An encoded form shorter than this is not looked for (it would match by chance)."""


def encoded_forms(value: str) -> list[bytes]:
    """`value` as JSON escapes it, in base64 (standard and URL-safe, at each of the three
    alignments it can have inside a longer text: only the characters its own bytes
    decide), in hex (both cases), percent-encoded, and reversed."""
    raw = value.encode()
    forms = [json.dumps(value)[1:-1].encode(), raw.hex().encode(), raw.hex().upper().encode()]
    forms += [urllib.parse.quote(value, safe="").encode(), raw[::-1]]
    for lead in range(3):
        encoded = base64.b64encode(b"\0" * lead + raw)
        first = -(-8 * lead // 6)  # the first character decided by the value alone
        last = (8 * (lead + len(raw)) - 6) // 6
        core = encoded[first : last + 1]
        forms += [core, core.translate(_URL_SAFE)]
    return [f for f in dict.fromkeys(forms) if len(f) >= MIN_FORM_BYTES and f != raw]


_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def _earliest(buf: bytes, start: int, secrets: Mapping[bytes, bytes]) -> tuple[int, bytes] | None:
    best: tuple[int, bytes] | None = None
    for secret in secrets:
        at = buf.find(secret, start)
        if at >= 0 and (
            best is None or at < best[0] or (at == best[0] and len(secret) > len(best[1]))
        ):
            best = (at, secret)
    return best


def _redact_stream(
    src: BinaryIO, sink: BinaryIO, secrets: Mapping[bytes, bytes]
) -> tuple[int, str]:
    longest = max(len(s) for s in secrets)
    digest = hashlib.sha256()
    size = 0
    carry = b""

    def emit(data: bytes) -> None:
        nonlocal size
        if data:
            sink.write(data)
            digest.update(data)
            size += len(data)

    while True:
        chunk = src.read(CHUNK)
        buf = carry + chunk
        # At the end of input everything is safe; otherwise keep a tail that might hold
        # the start of a secret finishing in the next chunk.
        safe_end = len(buf) if not chunk else len(buf) - (longest - 1)
        i = 0
        while (found := _earliest(buf, i, secrets)) is not None and found[0] < safe_end:
            at, secret = found
            emit(buf[i:at])
            emit(secrets[secret])
            i = at + len(secret)
        cut = max(i, safe_end)
        emit(buf[i:cut])
        carry = buf[cut:]
        if not chunk:
            emit(carry)
            return size, digest.hexdigest()


def copy_artifact(
    src: Path, dst: Path, redactor: Redactor = NO_REDACTION, *, fsync: bool = True
) -> ArtifactDigest:
    """Copy `src` to a new file `dst` (never overwriting), redacting credential values.

    The digest is of what was written.
    """
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as sink, src.open("rb") as source:
        if redactor:
            size, sha = _redact_stream(source, sink, redactor.replacements)
        else:
            digest = hashlib.sha256()
            size = 0
            while chunk := source.read(CHUNK):
                sink.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            sha = digest.hexdigest()
        sink.flush()
        if fsync:
            os.fsync(sink.fileno())
    return ArtifactDigest(size, sha)
