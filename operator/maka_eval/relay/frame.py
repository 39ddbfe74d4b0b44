"""The protocol-v1 result frame: a bounded JSON object a subject writes on its own channel.

The channel is the file named by MAKA_EVAL_RESULT_FILE (never stdout, which stays an
unparsed artifact). The frame is at most 64 KiB; anything else there -- oversized,
malformed, a symlink, a FIFO -- is recorded as such and never crashes the relay.

    {"protocol": "maka.eval.result.v1",
     "status": "completed" | "subject_failed",          (optional)
     "usage": {"inputTokens": 0, "cachedInputTokens": 0,
               "cacheWriteTokens": 0, "outputTokens": 0},  (optional)
     "costUsd": 0.0}                                      (optional)

Its figures are bounded (engine.bounds): every token count and their total whole
numbers from 0 to 10^10, the cost a number from 0 to 10^5 USD. A frame with anything
else there (a boolean, a float count, a negative or non-finite number, 1e999 that reads
as infinity, an integer too large for a float) is malformed, like any other broken
frame. Even a bounded figure never outranks the egress proxy's meter: that rule is
engine.classify's.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from typing import Any

from maka_eval import layout, strict_json
from maka_eval.engine.bounds import (
    MAX_ATTEMPT_COST_USD,
    MAX_ATTEMPT_TOKENS,
    cost_within_bounds,
)
from maka_eval.engine.classify import Frame, FrameState
from maka_eval.engine.status import SubjectStatus
from maka_eval.engine.usage import Usage, UsageError
from maka_eval.printable import visible

PROTOCOL = "maka.eval.result.v1"
MAX_FRAME_BYTES = layout.MAX_FRAME_BYTES
"""The layout's figure, which Harbor's bridge reads too."""
_FIELDS = {"protocol", "status", "usage", "costUsd"}


def _malformed(why: str) -> Frame:
    # The reason quotes what the subject wrote (a key, a parser's message): no control
    # character of it reaches a record or a terminal raw.
    return Frame(FrameState.MALFORMED, error=visible(why))


def _cost(value: Any) -> float | None:
    """The frame's cost as a float, or None when it is not a bounded number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not 0 <= value <= MAX_ATTEMPT_COST_USD:
        return None  # before float(): an integer of 400 digits does not fit one
    cost = float(value)
    return cost if cost_within_bounds(cost) else None


def parse_frame(data: bytes) -> Frame:
    """Parse frame bytes; never raises."""
    if len(data) > MAX_FRAME_BYTES:
        return Frame(FrameState.OVERSIZED, error=f"more than {MAX_FRAME_BYTES} bytes")
    try:
        obj = strict_json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _malformed(f"not JSON: {str(exc)[:120]}")
    if not isinstance(obj, dict):
        return _malformed("not a JSON object")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        return _malformed(f"unknown field(s): {', '.join(unknown)[:120]}")
    if obj.get("protocol") != PROTOCOL:
        return _malformed(f"'protocol' must be '{PROTOCOL}'")

    status = None
    if obj.get("status") is not None:
        try:
            status = SubjectStatus(obj["status"])
        except (ValueError, TypeError):
            return _malformed("'status' must be 'completed' or 'subject_failed'")
    usage = None
    if obj.get("usage") is not None:
        try:
            usage = Usage.from_json(obj["usage"], limit=MAX_ATTEMPT_TOKENS)
        except UsageError as exc:
            return _malformed(str(exc))
        if usage.total_tokens > MAX_ATTEMPT_TOKENS:
            return _malformed(f"usage: more than {MAX_ATTEMPT_TOKENS:,} tokens in total")
    cost = None
    if obj.get("costUsd") is not None:
        cost = _cost(obj["costUsd"])
        if cost is None:
            return _malformed(f"'costUsd' must be a number from 0 to {MAX_ATTEMPT_COST_USD:g}")
    return Frame(FrameState.VALID, status, usage, cost)


def read_bounded(dir_fd: int, name: str, limit: int) -> bytes | None:
    """Read at most limit+1 bytes of a regular file `name` in an open directory.

    Returns None when the file does not exist; raises OSError naming why it is not a
    regular file (a symlink or FIFO placed there is refused, not followed or waited on).
    """
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not a regular file")
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_frame(
    dir_fd: int, name: str = "result.json", scrub: Callable[[bytes], bytes] = bytes
) -> Frame:
    """Read the frame file from the frame directory; never raises. `scrub` is applied
    to the bytes before parsing (no message about them can carry a credential)."""
    try:
        data = read_bounded(dir_fd, name, MAX_FRAME_BYTES)
    except OSError as exc:
        if exc.errno is not None and exc.errno == getattr(os, "ELOOP", 40):
            return _malformed("the frame path is a symbolic link")
        return _malformed(str(exc) if not exc.errno else f"cannot read it: {exc.strerror}")
    if data is None:
        return Frame(FrameState.ABSENT)
    return parse_frame(scrub(data))


def frame_bytes(
    status: str | None = None,
    usage: Usage | None = None,
    cost_usd: float | None = None,
) -> bytes:
    """Encode a frame (for wrappers and tests)."""
    obj: dict[str, Any] = {"protocol": PROTOCOL}
    if status is not None:
        obj["status"] = status
    if usage is not None:
        obj["usage"] = usage.to_json()
    if cost_usd is not None:
        obj["costUsd"] = cost_usd
    return json.dumps(obj).encode()
