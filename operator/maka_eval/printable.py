"""Text a subject controls, made printable: control and invisible characters escaped.

A subject names its files (in /logs/agent, in collected task artifacts), writes the keys
of reward.json through a verifier, the fields of its result frame and whatever a setup
script or a healthcheck prints. Such text ends up in records and on the user's terminal,
where an ESC sequence retitles the window or clears the screen, a CR or a backspace
overwrites what was printed, and a bidi override shows a name reversed.

The rule, the same everywhere: a character is unsafe when Unicode calls it a control
(C0, DEL, C1: category Cc), a format character (Cf: the bidi embeddings, overrides,
isolates and marks, zero-width characters), a line or paragraph separator (Zl, Zp) or a
lone surrogate (Cs: a byte of a file name that is not UTF-8, as `os` decodes it). Each is
written as a Python string literal would write it: `\\n`, `\\r`, `\\t`, `\\xNN` up to
U+00FF (`\\x1b`, `\\x7f`, `\\x9b`), `\\uNNNN` (`\\u202e`, `\\udcff`) and `\\UNNNNNNNN`.

- `escaped` also doubles every backslash, so it is reversible (`unescaped`) and two
  different names never share an escaped form: artifact names and metric keys.
- `visible` leaves backslashes alone: messages (reasons, notes) that only need to be safe
  to print.

Standard library only: the relay uses it inside task images.
"""

from __future__ import annotations

import re
import unicodedata

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE = re.compile(r"\\(\\|n|r|t|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def unsafe(char: str) -> bool:
    """Whether one character must not be printed as it is."""
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def _escape(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    point = ord(char)
    if point <= 0xFF:
        return f"\\x{point:02x}"
    if point <= 0xFFFF:
        return f"\\u{point:04x}"
    return f"\\U{point:08x}"


def _clean(text: str, backslash: bool) -> bool:
    # str.isprintable() is False for every unsafe character (and for spaces other than
    # ' ', which are safe): the fast path for the text nearly all names are.
    return text.isprintable() and not (backslash and "\\" in text)


def escaped(text: str) -> str:
    """`text` with every unsafe character escaped and every backslash doubled: printable,
    and reversible by `unescaped`."""
    if _clean(text, backslash=True):
        return text
    return "".join(
        "\\\\" if char == "\\" else _escape(char) if unsafe(char) else char for char in text
    )


def unescaped(text: str) -> str:
    """The text `escaped` was given (a lone `\\` that starts no escape is kept)."""

    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        if code == "\\":
            return "\\"
        if code in ("n", "r", "t"):
            return {"n": "\n", "r": "\r", "t": "\t"}[code]
        return chr(int(code[1:], 16))

    return _ESCAPE.sub(one, text)


def visible(text: str) -> str:
    """`text` with every unsafe character escaped, backslashes as they are: safe to print,
    for a message that quotes what a subject wrote."""
    if _clean(text, backslash=False):
        return text
    return "".join(_escape(char) if unsafe(char) else char for char in text)
