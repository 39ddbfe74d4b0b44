"""Which shell or interpreter the verifier's script runs with in a container: a bash
script gets the toolbox's static bash, never the image's, which the subject may have
replaced."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from maka_eval.sandbox import toolbox


def trusted_argv(argv: Sequence[str], head: bytes) -> tuple[list[str], str | None]:
    """The verifier's argv with the toolbox's bash when its script is a bash script (no
    `#!`: the relay names `bash`; or a `#!` naming bash, directly or through env), and
    the image's interpreter it runs with otherwise (None: none of the image's)."""
    argv = list(argv)
    if argv and argv[0] == "bash":
        return [toolbox.BASH, *argv[1:]], None
    if not head.startswith(b"#!"):
        return argv, None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    interpreter, _, option = line.partition(" ")
    option = option.strip()
    name = posixpath.basename(interpreter)
    if name == "env" and option and " " not in option and not option.startswith("-"):
        name, option = option, ""
    if name == "bash":
        return [toolbox.BASH, *([option] if option else []), *argv], None
    return argv, interpreter or None
