"""Shared fixtures, and the fast tier (`bash hack/test.sh --fast`, or `pytest --fast`).

The fast tier is FAST_TIER below minus the tests marked `slow`: the pure and unit tests,
which need no bubblewrap sandbox, no container engine, no control plane, no Harbor and
no browser. Two guards keep a slow test from landing in it unnoticed:
- at collection, in every run: a fast-tier test that is not marked `slow` may only use
  fixtures defined in the fast tier, here, or by pytest and its plugins (not the control
  plane of tests/k8s, the container engine of tests/sandbox, Harbor's, ...);
- with --fast: bwrap, podman, docker and chromium are found first in a folder of
  wrappers that note the test that ran them, and that test fails (it needs `slow`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

FAST_TIER = (
    "tests/engine",
    "tests/contract",
    "tests/spec",
    "tests/metering",
    "tests/store",
    "tests/analysis",
    "tests/cli",
    "tests/egress/test_policy.py",
    "tests/egress/test_policy_properties.py",
    "tests/test_one_json_reader.py",
    "tests/test_printable.py",
    "tests/test_process_table.py",
    "tests/test_strict_json.py",
)
"""Folders and files (from the repository root) of the fast tier."""

SLOW_PROGRAMS = ("bwrap", "podman", "docker", "chromium", "chromium-browser", "google-chrome")
"""Programs a fast-tier test must not start (with --fast they fail the test that did)."""

_FAST_PATHS = tuple(ROOT / entry for entry in FAST_TIER)


def in_fast_tier(path: Path) -> bool:
    """Whether a test file (or conftest) lies in the fast tier's folders or files."""
    return any(path == fast or fast in path.parents for fast in _FAST_PATHS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="only the fast tier: the tests in tests/conftest.py's FAST_TIER not marked slow",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --fast, the slow folders are not even imported."""
    if not config.getoption("--fast") or collection_path.name == "conftest.py":
        return None
    path = collection_path.resolve()
    if in_fast_tier(path) or any(path in fast.parents for fast in _FAST_PATHS):
        return None
    return True


def _fixture_module_path(module: str) -> Path | None:
    """The file of a fixture's module when it is one of the test suite's, else None."""
    if module != "tests" and not module.startswith("tests."):
        return None
    return ROOT / (module.replace(".", "/") + ".py")


def _slow_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures this test uses that are defined outside the fast tier."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    slow = []
    for name in item.fixturenames:  # type: ignore[attr-defined]
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        where = _fixture_module_path(defs[-1].func.__module__)
        if where is not None and where != TESTS / "conftest.py" and not in_fast_tier(where):
            slow.append(f"{name} ({where.relative_to(ROOT)})")
    return slow


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    offenders = []
    fast, rest = [], []
    for item in items:
        tiered = in_fast_tier(Path(item.path).resolve()) and item.get_closest_marker("slow") is None
        if tiered:
            offenders += [f"{item.nodeid} uses {name}" for name in _slow_fixtures(item)]
        (fast if tiered else rest).append(item)
    if offenders:
        raise pytest.UsageError(
            "fast-tier tests using fixtures from outside the fast tier (mark them "
            "@pytest.mark.slow, or move them; the tier is FAST_TIER in tests/conftest.py):\n  "
            + "\n  ".join(offenders)
        )
    if config.getoption("--fast"):
        config.hook.pytest_deselected(items=rest)
        items[:] = fast


def _install_tripwires(folder: Path, log: Path) -> None:
    """Wrappers for SLOW_PROGRAMS that note the running test, then run the real program."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SLOW_PROGRAMS:
        real = shutil.which(name)
        run = f'exec {real} "$@"' if real else f'echo "{name}: not installed" >&2; exit 127'
        wrapper = folder / name
        wrapper.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\t%s\\n" "{name}" "${{PYTEST_CURRENT_TEST:-?}}" >> {log}\n'
            f"{run}\n"
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


_TRIPWIRES = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """With --fast, SLOW_PROGRAMS are found first among tripwires (see the docstring)."""
    if not config.getoption("--fast"):
        return
    folder = Path(tempfile.mkdtemp(prefix="maka-eval-fast-tier-"))
    _install_tripwires(folder / "bin", folder / "started")
    config.stash[_TRIPWIRES] = folder
    os.environ["PATH"] = f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_TRIPWIRES, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _started(config: pytest.Config) -> list[tuple[str, str]]:
    """(program, test) for each SLOW_PROGRAMS start noted so far in this --fast run."""
    folder = config.stash.get(_TRIPWIRES, None)
    log = folder / "started" if folder is not None else None
    if log is None or not log.exists():
        return []
    return [
        (program, test)
        for program, _, test in (line.partition("\t") for line in log.read_text().splitlines())
    ]


@pytest.fixture(autouse=True)
def _fast_tier_tripwire(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a --fast test that started a program of SLOW_PROGRAMS (even from a fixture)."""
    yield
    nodeid = request.node.nodeid
    started = sorted({p for p, test in _started(request.config) if test.startswith(nodeid + " ")})
    if started:
        pytest.fail(
            f"this fast-tier test started {', '.join(started)}: mark it @pytest.mark.slow "
            "(the fast tier: tests/conftest.py)",
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A program started with no test to blame (a scrubbed environment) fails the run."""
    unknown = sorted({p for p, test in _started(session.config) if test == "?"})
    if unknown:
        print(f"\nfast tier: {', '.join(unknown)} started outside any known test")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _work_dir(tmp_path, monkeypatch):
    """Attempt workspaces of each test live in its own temporary folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("MAKA_EVAL_WORK_DIR", str(work))
    return work


@pytest.fixture(scope="session", autouse=True)
def _seal_keys(tmp_path_factory) -> Iterator[Path]:
    """The session's seal key folder (never the user's): records written by the tests
    are sealed with a key made there on first use, as a real one is. One for the whole
    session, as a user has one, so that runs made by module fixtures verify in every
    test that reads them; a test wanting another key sets MAKA_EVAL_KEY_DIR itself."""
    folder = tmp_path_factory.mktemp("keys") / "maka-eval"
    before = os.environ.get("MAKA_EVAL_KEY_DIR")
    os.environ["MAKA_EVAL_KEY_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("MAKA_EVAL_KEY_DIR", None)
        else:
            os.environ["MAKA_EVAL_KEY_DIR"] = before


@pytest.fixture
def key_dir() -> Path:
    """The seal key folder this test's records are sealed with."""
    return Path(os.environ["MAKA_EVAL_KEY_DIR"])


@pytest.fixture
def toy_sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy third-party sandbox backend (tests/fixtures/toy_sandbox), installed with
    pip and discoverable in this process through its entry point (kind `toy`)."""
    import sys

    from maka_eval.sandbox import backends
    from tests.helpers import install_fixture

    path = install_fixture(Path(__file__).parent / "fixtures" / "toy_sandbox", "toy-sandbox")
    monkeypatch.syspath_prepend(str(path))
    backends.refresh()
    yield path
    monkeypatch.undo()
    sys.modules.pop("maka_toy_sandbox", None)
    backends.refresh()
