"""Read glibc's /etc/ld.so.cache: which file the dynamic loader opens for each library name.

The loader finds a library named by a program (`libc.so.6`) through this cache, so a
subject that rewrites it (or makes `ldconfig` rewrite it) can have every program of the
container load its own copy of a library. The container sandbox reads the image's cache
once and the container's again when it changed (`sandbox.changes` compares them).

Both layouts are read: the new one (`glibc-ld.so.cache1.1`, what glibc writes since
2.32), alone or after the old one (`ld.so-1.7.0`), whose own entries are ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

NEW_MAGIC = b"glibc-ld.so.cache1.1"
OLD_MAGIC = b"ld.so-1.7.0"
_HEADER = struct.Struct("<II")  # nlibs, len_strings, after the 20-byte magic
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
_ENTRIES_AT = 48  # the new header's size


class CacheError(ValueError):
    """Not an ld.so.cache this reader knows."""


def read_cache(data: bytes) -> Mapping[str, frozenset[str]]:
    """Library name -> the paths the cache gives for it (one per hardware variant)."""
    if data.startswith(NEW_MAGIC):
        base = 0
    elif data.startswith(OLD_MAGIC):
        base = data.find(NEW_MAGIC)
        if base < 0:
            raise CacheError("an old-format ld.so.cache without the new part")
    else:
        raise CacheError("not an ld.so.cache")
    try:
        count, _ = _HEADER.unpack_from(data, base + len(NEW_MAGIC))
        if base + _ENTRIES_AT + count * _ENTRY.size > len(data):
            raise CacheError("ld.so.cache is cut short")
        found: dict[str, set[str]] = {}
        for i in range(count):
            _, key, value, _, _ = _ENTRY.unpack_from(data, base + _ENTRIES_AT + i * _ENTRY.size)
            found.setdefault(_string(data, base + key), set()).add(_string(data, base + value))
    except struct.error:
        raise CacheError("ld.so.cache is cut short") from None
    return {name: frozenset(paths) for name, paths in found.items()}


def _string(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    if at >= len(data) or end < 0:
        raise CacheError("ld.so.cache names a string outside the file")
    return data[at:end].decode("utf-8", "replace")


__all__ = ["CacheError", "read_cache"]
