"""The one place an artifact gets its name (maka_eval.artifacts.artifact_name): escaped,
reversible, and never longer than a record or a file system holds."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from maka_eval.artifacts import NAME_MAX_BYTES, artifact_name
from maka_eval.contract.kernel import ARTIFACT_NAME_LIMIT, ArtifactEntry
from maka_eval.printable import unescaped, unsafe

# Path components as os.walk gives them: any character but '/' and NUL, undecodable
# bytes as lone surrogates.
_component = st.text(
    st.characters(codec=None, exclude_categories=(), exclude_characters="/\x00"),
    min_size=1,
    max_size=30,
).filter(lambda c: c not in (".", ".."))
_relative = st.lists(_component, min_size=1, max_size=4).map("/".join)


def test_names_of_the_issue():
    assert artifact_name("agent", "a\nb") == "agent/a\\nb"
    assert artifact_name("agent", "\x1b]0;pwned\x07") == "agent/\\x1b]0;pwned\\x07"
    assert artifact_name("agent", "x/\u202egnp.exe") == "agent/x/\\u202egnp.exe"
    assert artifact_name("agent", os.fsdecode(b"bad\xff")) == "agent/bad\\udcff"
    assert artifact_name("agent", "plain/report.txt") == "agent/plain/report.txt"
    assert artifact_name("agent", "\x1b" * 60) is None  # 240 characters escaped
    assert artifact_name("agent", "日" * 80 + "\x1b" * 10) is None  # 280 bytes, one name


@given(_relative)
def test_a_name_is_printable_reversible_and_fits_a_record(relative):
    name = artifact_name("agent", relative)
    if name is None:
        return
    assert not any(unsafe(c) for c in name)
    assert unescaped(name) == f"agent/{relative}"
    assert all(len(part.encode()) <= NAME_MAX_BYTES for part in name.split("/"))
    # the record reads it back
    entry = ArtifactEntry.from_dict({"name": name, "bytes": 1, "sha256": "0" * 64}, "a")
    assert entry.name == name and len(name) <= ARTIFACT_NAME_LIMIT


@given(_relative, _relative)
def test_two_files_never_share_a_name(a, b):
    first, second = artifact_name("agent", a), artifact_name("agent", b)
    if first is not None and second is not None:
        assert (first == second) == (a == b)
