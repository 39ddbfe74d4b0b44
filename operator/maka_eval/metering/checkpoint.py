"""The provider-usage checkpoint: what the metering proxy observed, signed.

The proxy rewrites it at the start of every provider request, when the provider admits
one (response status and headers received: the model work is done and billed whether
or not anyone sees the stream end), when a request settles, and when the proxy itself
settles. Each write is atomic (a temporary file in the same folder, chmod 0644,
os.replace), so a reader sees one whole snapshot or the previous one.

It carries only raw observations: usage, whether the proxy had settled, and the
request, in-flight, admitted and usage-request counts. `derive` is the one function
that turns them into a figure (complete or a lower bound, missing usage, cost); the
proxy and the relay both call it, so the two can never hold different versions.

A reader accepts a snapshot only from a regular file of at most 64 KiB whose HMAC-SHA256
(keyed by the relay's result token, over a canonical serialization) verifies: a subject
that replaces the path with a symlink, a FIFO, a large write or schema-valid forged JSON
gets a typed rejection, never a figure.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import stat
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from maka_eval import strict_json
from maka_eval.engine.usage import Usage, UsageError, total_usage
from maka_eval.metering.pricing import Prices

CHECKPOINT_FORMAT = "maka.eval.provider-usage.v1"
MAX_CHECKPOINT_BYTES = 64 * 1024
MAX_COUNT = 10**12
MAX_MODELS = 32
"""Models named in one checkpoint; usage of further models is kept under OTHER_MODELS
(which no price list names, so its cost is unknown) to keep the file bounded."""
MODEL_NAME_LIMIT = 128
OTHER_MODELS = "*other*"
_KEYS = frozenset(
    {
        "format",
        "settled",
        "requests",
        "inFlight",
        "admitted",
        "usageRequests",
        "usage",
        "usageByModel",
        "hmac",
    }
)


# -- the snapshot -----------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """One snapshot of what the proxy observed."""

    settled: bool = False
    """The proxy settled (it was told the subject is done, or it shut down): no later
    request belongs to this figure. No arrangement of the counts implies it -- a
    snapshot written between two requests has nothing in flight either."""
    requests: int = 0
    """Provider requests forwarded."""
    in_flight: int = 0
    """Forwarded requests that have not settled (response complete, or failed)."""
    admitted: int = 0
    """Requests the provider admitted (a 2xx status and headers received)."""
    usage_requests: int = 0
    """Admitted requests whose response carried usage the proxy read."""
    usage_by_model: Mapping[str, Usage] = field(default_factory=dict)
    """Usage per model name (the request's `model`, '' when it named none)."""

    @property
    def usage(self) -> Usage:
        """All usage observed."""
        return total_usage(self.usage_by_model.values())

    def body(self) -> dict[str, Any]:
        """The signed content (everything but the HMAC)."""
        return {
            "format": CHECKPOINT_FORMAT,
            "settled": self.settled,
            "requests": self.requests,
            "inFlight": self.in_flight,
            "admitted": self.admitted,
            "usageRequests": self.usage_requests,
            "usage": self.usage.to_json(),
            "usageByModel": {
                name: usage.to_json() for name, usage in sorted(self.usage_by_model.items())
            },
        }


def canonical(body: Mapping[str, Any]) -> bytes:
    """The bytes the HMAC covers: sorted keys, no whitespace, ASCII only."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(body: Mapping[str, Any], token: str) -> str:
    """HMAC-SHA256 of the canonical body under the result token, as hex."""
    return hmac.new(token.encode("utf-8"), canonical(body), hashlib.sha256).hexdigest()


def encode(checkpoint: Checkpoint, token: str) -> bytes:
    """The file content of a signed snapshot."""
    if not token:
        raise ValueError("a checkpoint is signed with a non-empty result token")
    body = checkpoint.body()
    return canonical({**body, "hmac": sign(body, token)}) + b"\n"


_FRESH = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def write_checkpoint(path: Path, checkpoint: Checkpoint, token: str) -> None:
    """Replace the checkpoint at `path` atomically with a signed snapshot (mode 0644)."""
    data = encode(checkpoint, token)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(temp, _FRESH, 0o644)
    except FileExistsError:  # left by a writer that died, or put there: a fresh name
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        temp = Path(name)
    try:
        try:
            os.fchmod(fd, 0o644)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


# -- reading ------------------------------------------------------------------------
class RejectReason(StrEnum):
    """Why a checkpoint was not accepted."""

    MISSING = "missing"
    NOT_REGULAR_FILE = "not_regular_file"
    OVERSIZED = "oversized"
    UNREADABLE = "unreadable"
    MALFORMED = "malformed"
    UNSIGNED = "unsigned"
    BAD_SIGNATURE = "bad_signature"
    INVALID = "invalid"


@dataclass(frozen=True)
class CheckpointRejected:
    """A checkpoint that was not accepted, and why (never a figure)."""

    reason: RejectReason
    detail: str

    @property
    def suspicious(self) -> bool:
        """Whether the file was there but not what the proxy writes (tampering, or a
        proxy that died mid-way: a reader must say so rather than stay silent)."""
        return self.reason is not RejectReason.MISSING


def _read_regular(path: Path, limit: int) -> bytes | CheckpointRejected:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return CheckpointRejected(RejectReason.MISSING, f"{path} does not exist")
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", 40):
            return CheckpointRejected(RejectReason.NOT_REGULAR_FILE, f"{path} is a symbolic link")
        return CheckpointRejected(RejectReason.UNREADABLE, f"{path}: {exc.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return CheckpointRejected(
                RejectReason.NOT_REGULAR_FILE, f"{path} is not a regular file"
            )
        if info.st_size > limit:
            return CheckpointRejected(
                RejectReason.OVERSIZED, f"{path} is larger than {limit} bytes"
            )
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        return CheckpointRejected(RejectReason.UNREADABLE, f"{path}: {exc.strerror}")
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        return CheckpointRejected(RejectReason.OVERSIZED, f"{path} is larger than {limit} bytes")
    return data


def _count(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"'{key}' must be a whole number from 0 to {MAX_COUNT}")
    return value


def _from_body(obj: Mapping[str, Any]) -> Checkpoint:
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)[:120]}")
    if obj.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"'format' must be '{CHECKPOINT_FORMAT}'")
    settled = obj.get("settled")
    if not isinstance(settled, bool):
        raise ValueError("'settled' must be true or false")
    by_model_raw = obj.get("usageByModel")
    if not isinstance(by_model_raw, Mapping) or len(by_model_raw) > MAX_MODELS + 1:
        raise ValueError(f"'usageByModel' must be an object of at most {MAX_MODELS + 1} models")
    by_model: dict[str, Usage] = {}
    for name, raw in by_model_raw.items():
        if len(name) > MODEL_NAME_LIMIT:
            raise ValueError(f"a model name is longer than {MODEL_NAME_LIMIT} characters")
        try:
            by_model[name] = Usage.from_json(raw)
        except UsageError as exc:
            raise ValueError(f"usageByModel.{name[:40]}: {exc}") from None
    checkpoint = Checkpoint(
        settled=settled,
        requests=_count(obj, "requests"),
        in_flight=_count(obj, "inFlight"),
        admitted=_count(obj, "admitted"),
        usage_requests=_count(obj, "usageRequests"),
        usage_by_model=by_model,
    )
    try:
        usage = Usage.from_json(obj.get("usage"))
    except UsageError as exc:
        raise ValueError(f"usage: {exc}") from None
    if usage != checkpoint.usage:
        raise ValueError("'usage' is not the sum of 'usageByModel'")
    if checkpoint.in_flight > checkpoint.requests:
        raise ValueError("more requests in flight than were made")
    if not checkpoint.usage_requests <= checkpoint.admitted <= checkpoint.requests:
        raise ValueError("the counts must satisfy usageRequests <= admitted <= requests")
    return checkpoint


def parse_checkpoint(data: bytes, token: str) -> Checkpoint | CheckpointRejected:
    """Verify and parse checkpoint bytes; never raises."""
    if len(data) > MAX_CHECKPOINT_BYTES:
        return CheckpointRejected(
            RejectReason.OVERSIZED, f"larger than {MAX_CHECKPOINT_BYTES} bytes"
        )
    try:
        obj = strict_json.loads(data.decode("utf-8"), max_depth=4)
    except (UnicodeDecodeError, ValueError) as exc:
        return CheckpointRejected(RejectReason.MALFORMED, f"not JSON: {str(exc)[:120]}")
    if not isinstance(obj, dict):
        return CheckpointRejected(RejectReason.MALFORMED, "not a JSON object")
    mac = obj.pop("hmac", None)
    if mac is None:
        return CheckpointRejected(RejectReason.UNSIGNED, "the checkpoint carries no HMAC")
    if not isinstance(mac, str) or not token:
        return CheckpointRejected(RejectReason.BAD_SIGNATURE, "the HMAC does not verify")
    try:
        expected = sign(obj, token)
    except (TypeError, ValueError):
        return CheckpointRejected(RejectReason.MALFORMED, "the content cannot be serialized")
    if not hmac.compare_digest(mac.encode("ascii", "replace"), expected.encode("ascii")):
        return CheckpointRejected(
            RejectReason.BAD_SIGNATURE, "the HMAC does not verify with the result token"
        )
    try:
        return _from_body(obj)
    except ValueError as exc:
        return CheckpointRejected(RejectReason.INVALID, str(exc)[:200])


def read_checkpoint(path: Path, token: str) -> Checkpoint | CheckpointRejected:
    """Read and verify the checkpoint at `path`; never raises.

    Only a regular file is opened (O_NOFOLLOW | O_NONBLOCK: a symlink is refused, a FIFO
    is not waited on), at most MAX_CHECKPOINT_BYTES are read, the JSON is strict and the
    HMAC is compared in constant time.
    """
    data = _read_regular(Path(path), MAX_CHECKPOINT_BYTES)
    if isinstance(data, CheckpointRejected):
        return data
    return parse_checkpoint(data, token)


# -- the figure ------------------------------------------------------------------------
@dataclass(frozen=True)
class MeteredUsage:
    """What a checkpoint says about a run's model work (see `derive`)."""

    usage: Usage
    """All observed usage: the run's usage when complete, else a lower bound."""
    usage_by_model: Mapping[str, Usage]
    complete: bool
    """Settled, nothing in flight, and every admitted request's usage was read."""
    missing_usage: int
    """Admitted requests whose usage the proxy did not read."""
    cost_usd: float | None
    """Only for a complete figure whose every model has a price; else None."""
    unpriced_models: tuple[str, ...]
    requests: int
    admitted: int
    in_flight: int
    usage_requests: int
    settled: bool

    def describe(self) -> str:
        """One line for a note or a log: what the figure is and why it is partial."""
        if self.complete:
            return (
                f"{self.admitted} admitted request(s), {self.usage.total_tokens} tokens, complete"
            )
        why = []
        if not self.settled:
            why.append("the proxy had not settled")
        if self.in_flight:
            why.append(f"{self.in_flight} request(s) in flight")
        if self.missing_usage:
            why.append(f"{self.missing_usage} admitted request(s) without usage")
        return (
            f"{self.admitted} admitted request(s), at least {self.usage.total_tokens} tokens "
            f"(a lower bound: {', '.join(why)})"
        )


def derive(checkpoint: Checkpoint, prices: Prices | None) -> MeteredUsage:
    """The one figure both the proxy and the relay take from a checkpoint.

    complete = settled, nothing in flight, and admitted == usage requests; the cost is
    given only for a complete figure (a partial token count is a lower bound, and a cost
    derived from it would read as a settled one).
    """
    complete = (
        checkpoint.settled
        and checkpoint.in_flight == 0
        and checkpoint.admitted == checkpoint.usage_requests
    )
    cost: float | None = None
    unpriced: tuple[str, ...] = ()
    if prices is not None:
        priced, unpriced = prices.cost(checkpoint.usage_by_model)
        cost = priced if complete else None
    return MeteredUsage(
        usage=checkpoint.usage,
        usage_by_model=dict(checkpoint.usage_by_model),
        complete=complete,
        missing_usage=max(0, checkpoint.admitted - checkpoint.usage_requests),
        cost_usd=cost,
        unpriced_models=unpriced,
        requests=checkpoint.requests,
        admitted=checkpoint.admitted,
        in_flight=checkpoint.in_flight,
        usage_requests=checkpoint.usage_requests,
        settled=checkpoint.settled,
    )
