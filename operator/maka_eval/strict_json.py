"""JSON that refuses duplicate keys (the standard library keeps the last one silently).

Standard library only: the relay reads result frames with it, the spec loader documents.
"""

from __future__ import annotations

import json
from typing import Any


class DuplicateKeyError(ValueError):
    """An object names the same key twice."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKeyError(f"duplicate key '{key}' (a mapping may name a key only once)")
        result[key] = value
    return result


def loads(text: str | bytes) -> Any:
    """json.loads, except that a duplicate key raises DuplicateKeyError."""
    return json.loads(text, object_pairs_hook=_no_duplicates)
