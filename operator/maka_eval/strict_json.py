"""JSON read strictly: duplicate keys, NaN/Infinity and runaway nesting are refused.

The standard library keeps the last of two duplicate keys silently, reads the
non-standard constants NaN, Infinity and -Infinity as floats, and raises RecursionError
on deeply nested input. The standard library is enough: the relay reads result frames
with it inside task images that may have nothing else.

Where `jiter` (pydantic's JSON parser, a dependency of the package) is installed, bytes
are parsed by it first: 2.5 times as fast as the standard library with the
duplicate-key hook, which matters to a report reading 100,000 records. It refuses
duplicate keys, NaN and Infinity itself, and it is stricter than the standard library
elsewhere (a lone surrogate escape, nesting past 200 levels, a byte-order mark, any
encoding but UTF-8): whatever it refuses is read again by the standard library, so what
is accepted, what it reads as, and every error message are the standard library's.
`tests/test_strict_json.py` checks that the two agree on generated documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_jiter_from_json: Callable[..., Any] | None
try:
    from jiter import from_json as _jiter_from_json
except ImportError:  # a relay in a task image: the standard library alone
    _jiter_from_json = None


class DuplicateKeyError(ValueError):
    """An object names the same key twice."""


class NonFiniteNumberError(ValueError):
    """The text uses NaN, Infinity or -Infinity, which JSON does not have."""


class NestingError(ValueError):
    """The document is nested deeper than allowed."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):  # a key was named twice: find it for the message
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(
                    f"duplicate key '{key}' (a mapping may name a key only once)"
                )
            seen.add(key)
    return result


def _no_constants(name: str) -> Any:
    raise NonFiniteNumberError(
        f"'{name}' is not a JSON number; write a finite number (or quote it as a string)"
    )


def _keep_constants(name: str) -> float:
    return float(name)


# Built once: json.loads with hooks builds a new decoder (and its scanner) on every call,
# which costs as much as reading a small document (the store reads 100,000 of them).
_STRICT = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
_NONFINITE = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_keep_constants)


def depth(value: Any) -> int:
    """How deeply `value` nests lists and mappings (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def loads(text: str | bytes, *, max_depth: int | None = None, allow_nonfinite: bool = False) -> Any:
    """json.loads, refusing duplicate keys, NaN/Infinity and nesting beyond `max_depth`.

    `allow_nonfinite` keeps NaN/Infinity as floats for a caller that refuses them itself
    with a better message (the spec loader names their JSON path).
    """
    if isinstance(text, bytes) and _jiter_from_json is not None and not allow_nonfinite:
        try:
            value = _jiter_from_json(text, allow_inf_nan=False, catch_duplicate_keys=True)
        except ValueError:
            pass  # read again below: the standard library's verdict and message
        else:
            if max_depth is not None and depth(value) > max_depth:
                raise NestingError(f"the document is nested more than {max_depth} levels deep")
            return value
    if isinstance(text, bytes | bytearray):  # as json.loads decodes bytes
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    elif not isinstance(text, str):
        raise TypeError(f"the JSON object must be str, bytes or bytearray, not {type(text)}")
    elif text.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        value = (_NONFINITE if allow_nonfinite else _STRICT).decode(text)
    except RecursionError:
        if max_depth is not None:
            raise NestingError(
                f"the document is nested more than {max_depth} levels deep"
            ) from None
        raise NestingError("the document is nested too deeply to read") from None
    if max_depth is not None and depth(value) > max_depth:
        raise NestingError(f"the document is nested more than {max_depth} levels deep")
    return value
