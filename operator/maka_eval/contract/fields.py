"""Strict readers for JSON objects: each failure names the field's path."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from maka_eval import strict_json


class ContractError(ValueError):
    """A kernel or record is malformed; the message names the field."""


def load_bounded(data: str | bytes, limit: int, what: str) -> Any:
    """Decode at most `limit` bytes of strict JSON (ContractError naming `what`)."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > limit:
        raise ContractError(f"{what} is larger than {limit} bytes")
    try:
        return strict_json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ContractError(f"{what} is not JSON: {str(exc)[:200]}") from None


class Fields:
    """Reads the fields of one JSON object, refusing unknown ones.

    The store reads 100,000 records at a time, so each reader tests the common case (a
    plain value of the right type) first and only then works out which rule is broken.
    """

    __slots__ = ("obj", "where")

    def __init__(self, obj: Any, where: str, known: frozenset[str]) -> None:
        if type(obj) is not dict and not isinstance(obj, Mapping):
            raise ContractError(f"{where}: must be an object")
        if not known.issuperset(obj):
            unknown = sorted(str(k) for k in obj if k not in known)
            raise ContractError(f"{where}: unknown field(s) {', '.join(unknown)[:200]}")
        self.obj: Mapping[str, Any] = obj
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.obj.get(key)

    def required(self, key: str) -> Any:
        if key not in self.obj:
            raise ContractError(f"{self.path(key)}: is required")
        return self.obj[key]

    def text(self, key: str, limit: int = 4096) -> str:
        """A required string of at most `limit` characters."""
        value = self.obj.get(key)
        if type(value) is str and len(value) <= limit:
            return value
        checked = self.string(key, limit=limit)
        assert checked is not None
        return checked

    def string(self, key: str, *, optional: bool = False, limit: int = 4096) -> str | None:
        value = self.obj.get(key)
        if type(value) is str and len(value) <= limit:
            return value
        if not optional:
            value = self.required(key)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise ContractError(f"{self.path(key)}: must be a string")
        if len(value) > limit:
            raise ContractError(f"{self.path(key)}: longer than {limit} characters")
        return value

    def integer(self, key: str, *, optional: bool = False, minimum: int = 0) -> int | None:
        value = self.obj.get(key)
        if type(value) is int and value >= minimum:
            return value
        if not optional:
            value = self.required(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError(f"{self.path(key)}: must be a whole number")
        if value < minimum:
            raise ContractError(f"{self.path(key)}: must be at least {minimum}")
        return value

    def number(
        self, key: str, *, optional: bool = False, minimum: float | None = None
    ) -> float | None:
        value = self.obj.get(key)
        if type(value) is float and _finite_at_least(value, minimum):
            return value
        if not optional:
            value = self.required(key)
        if value is None and optional:
            return None
        return finite(value, self.path(key), minimum)

    def numbers(self, key: str) -> dict[str, float]:
        """An optional object of finite numbers, by name ({} when absent)."""
        raw = self.obj.get(key) or {}
        if type(raw) is not dict and not isinstance(raw, Mapping):
            raise ContractError(f"{self.path(key)}: must be an object of numbers")
        values: dict[str, float] = {}
        for name, value in raw.items():
            if type(value) is not float or not math.isfinite(value):
                value = finite(value, f"{self.path(key)}.{name}")
            values[str(name)] = value
        return values

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self.obj.get(key, default)
        if not isinstance(value, bool):
            raise ContractError(f"{self.path(key)}: must be true or false")
        return value

    def timestamp(self, key: str, *, optional: bool = False) -> datetime | None:
        text = self.string(key, optional=optional, limit=64)
        if text is None:
            return None
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise ContractError(f"{self.path(key)}: not an ISO 8601 timestamp") from None
        if value.tzinfo is None:
            raise ContractError(f"{self.path(key)}: must carry a time zone")
        return value


def finite(value: Any, where: str, minimum: float | None = None) -> float:
    """A finite number (not a boolean), at least `minimum`."""
    if type(value) is float and _finite_at_least(value, minimum):
        return value
    if isinstance(value, bool) or not isinstance(value, _NUMBER) or not math.isfinite(value):
        raise ContractError(f"{where}: must be a finite number")
    if minimum is not None and value < minimum:
        raise ContractError(f"{where}: must be at least {minimum:g}")
    return float(value)


_NUMBER = (int, float)


def _finite_at_least(value: float, minimum: float | None) -> bool:
    return math.isfinite(value) and (minimum is None or value >= minimum)
