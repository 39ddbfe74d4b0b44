"""What an image holds (`sandbox.changes.ImageFacts`), read from the report of the facts
function (scripts/image-facts.sh) when an attempt's container starts; kept per image,
which never changes."""

from __future__ import annotations

import base64
import posixpath
from collections.abc import Mapping, Sequence

from maka_eval.sandbox import changes
from maka_eval.sandbox.ldcache import CacheError, read_cache

known: dict[tuple[str, str], changes.ImageFacts] = {}
"""(image id, the task's PATH) -> what the image holds: an image never changes."""


def parse_facts(lines: Sequence[str]) -> changes.ImageFacts:
    """The facts report (`in FOLDER`, `- name`, `link PATH`, `m module`, `ldcache BASE64`)
    as ImageFacts."""
    libraries: Mapping[str, frozenset[str]] | None = {}
    dirs: list[str] = []
    commands: dict[str, set[str]] = {}
    links: set[str] = set()
    modules: set[str] = set()
    folder: str | None = None
    for line in lines:
        word, _, rest = line.partition(" ")
        if word == "in" and rest.startswith("/"):
            folder = posixpath.normpath(rest)
            if folder not in commands:
                dirs.append(folder)
                commands[folder] = set()
        elif word == "-" and folder is not None and rest:
            commands[folder].add(rest)
        elif word == "link" and rest.startswith("/"):
            links.add(posixpath.normpath(rest))
        elif word == "m" and rest and not rest.endswith((".dist-info", ".egg-info", ".pth")):
            modules.add(rest.split(".", 1)[0])
        elif word == "ldcache":
            try:
                libraries = read_cache(base64.b64decode(rest, validate=True))
            except (ValueError, CacheError):
                libraries = None
    return changes.ImageFacts(
        path_dirs=tuple(dirs),
        commands={d: frozenset(names) for d, names in commands.items()},
        links=frozenset(links),
        site_modules=frozenset(modules - {"__pycache__", ""}),
        libraries=None if libraries is None else dict(libraries),
    )
