"""The README and docs point only at files inside this repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE = re.compile(r"`([^`\s]+)`")
# Paths inside a Harbor task directory, which the README describes (not repo files).
TASK_RELATIVE = {"tests/test.sh", "solution/solve.sh"}
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


def relative_links(text: str) -> list[str]:
    links = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # URLs, mailto:, in-page anchors
        links.append(target.split("#", 1)[0])
    return links


def repo_paths_in_code(text: str) -> list[str]:
    """Inline-code spans that name a path in this repository (or outside it)."""
    paths = []
    for span in CODE.findall(text):
        if span.startswith("../") or (
            span.split("/")[0] in TOP
            and "/" in span
            and span not in TASK_RELATIVE
            and not re.search(r"[<>{}$*]", span)  # a pattern, not a file
        ):
            paths.append(span)
    return paths


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_resolves_inside_the_repository(document):
    text = document.read_text(encoding="utf-8")
    for target in relative_links(text):
        path = (document.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{document.name}: {target} leaves the repository"
        assert path.exists(), f"{document.name}: {target} does not exist"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_files_named_in_code_exist_in_the_repository(document):
    text = document.read_text(encoding="utf-8")
    for span in repo_paths_in_code(text):
        assert not span.startswith("../"), f"{document.name}: `{span}` is outside"
        assert (ROOT / span).exists(), f"{document.name}: `{span}` does not exist"


def test_the_checker_finds_links():
    assert relative_links("[a](docs/x.md) [b](https://x.y) [c](#top) [d](../y.md#s)") == [
        "docs/x.md",
        "../y.md",
    ]
    assert repo_paths_in_code("`../shared/CONVENTIONS.md` `tests/test.sh` `bench/x.py`") == [
        "../shared/CONVENTIONS.md",
        "bench/x.py",
    ]
