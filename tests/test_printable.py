"""Text a subject controls, made printable: the escaping rule of names and messages."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maka_eval.printable import escaped, unescaped, unsafe, visible

# Every kind of character, lone surrogates (undecodable bytes of a file name) included.
_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("report.txt", "report.txt"),
        ("a\nb", "a\\nb"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("\x1b[2J", "\\x1b[2J"),
        ("cr\roverwrite", "cr\\roverwrite"),
        ("del\x7f", "del\\x7f"),
        ("csi\u009b2J", "csi\\x9b2J"),
        ("\u202etxt.exe", "\\u202etxt.exe"),
        ("iso\u2066late\u2069", "iso\\u2066late\\u2069"),
        ("line\u2028sep", "line\\u2028sep"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("[bold red]x[/]", "[bold red]x[/]"),  # markup is the terminal layer's concern
        ("café ünïcode 日本", "café ünïcode 日本"),
        ("tab\there", "tab\\there"),
        (os.fsdecode(b"bad\xffutf8"), "bad\\udcffutf8"),
    ],
)
def test_unsafe_characters_are_written_as_python_escapes(text, shown):
    assert visible(text) == shown
    assert escaped(text) == shown
    assert unescaped(escaped(text)) == text


def test_only_escaped_doubles_backslashes():
    assert visible("C:\\x1b") == "C:\\x1b"
    assert escaped("C:\\x1b") == "C:\\\\x1b"  # not the escaped form of an ESC
    assert escaped("C:\\x1b") != escaped("C:\x1b")


@given(_any_text)
def test_escaped_text_is_printable_and_reversible(text):
    out = escaped(text)
    assert not any(unsafe(c) for c in out)
    assert unescaped(out) == text
    assert not any(unsafe(c) for c in visible(text))


@given(_any_text, _any_text)
def test_two_texts_never_share_an_escaped_form(a, b):
    assert (escaped(a) == escaped(b)) == (a == b)


@given(st.text(st.characters(categories=("L", "N", "P", "S")), max_size=40))
def test_ordinary_text_is_left_as_it_is(text):
    assert visible(text) == text
    assert escaped(text) == text.replace("\\", "\\\\")
