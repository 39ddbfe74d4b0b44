"""The shell programs the container sandbox runs in a container
(maka_eval/sandbox/container/scripts/*.sh): each one, as the shell gets it, passes
shellcheck; every shipped file is part of a program; the numbers they are given are in."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources

import pytest

from maka_eval import layout
from maka_eval.sandbox import toolbox
from maka_eval.sandbox.container import shell

SHELLCHECK_INSTALL = "apt-get update && apt-get install -y shellcheck"


@pytest.fixture(scope="module")
def shellcheck() -> str:
    found = shutil.which("shellcheck")
    if found is None:
        pytest.fail(
            f"shellcheck is needed to lint the container's shell programs: {SHELLCHECK_INSTALL}"
        )
    return found


def lint(shellcheck: str, text: str) -> str:
    """shellcheck's findings for a program (every severity, POSIX sh: busybox's ash)."""
    proc = subprocess.run(
        [shellcheck, "--norc", "--shell=sh", "--severity=style", "--format=gcc", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: findings; anything else: it failed
    return proc.stdout


@pytest.mark.parametrize("name", sorted(shell.PROGRAMS))
def test_every_program_passes_shellcheck(shellcheck: str, name: str) -> None:
    assert lint(shellcheck, shell.program(name)) == ""


def test_shellcheck_finds_what_it_should(shellcheck: str) -> None:
    # The lint above sees the text: a program with a known mistake is reported.
    said = lint(shellcheck, shell.program("maka-chown") + 'rm -rf "$p"/*\n')
    assert "SC2115" in said


def test_every_shipped_script_is_in_a_program() -> None:
    used = {f for files in shell.PROGRAMS.values() for f in files}
    assert used == set(shell.script_files())


def test_the_programs_get_the_marker_capability() -> None:
    for name in shell.PROGRAMS:
        assert "@" not in shell.program(name).replace("$@", "").replace('"$@"', ""), name
    assert f"--drop-bounding {shell.MARKER_CAP} --" in shell.program("maka-subject")
    assert f'ids="$ids --ambient {shell.MARKER_CAP}"' in shell.program("maka-verifier")


PLACEHOLDER = re.compile(r"@[A-Za-z_]+@")


def test_no_placeholder_is_left_and_every_one_is_used() -> None:
    shipped = resources.files("maka_eval.sandbox.container").joinpath("scripts")
    raw = "".join(shipped.joinpath(f).read_text(encoding="utf-8") for f in shell.script_files())
    assert set(PLACEHOLDER.findall(raw)) == set(shell.SUBSTITUTIONS)
    for name in shell.PROGRAMS:
        assert PLACEHOLDER.findall(shell.program(name)) == [], name


def test_the_programs_get_the_layouts_paths() -> None:
    holder = shell.program("maka-holder")
    assert f"maka-tests {layout.TESTS_PATH} " in holder
    assert f"maka-verifier {layout.VERIFIER_LOGS_PATH} " in holder
    assert f"maka-private {toolbox.PRIVATE} " in holder
    assert f"T={toolbox.BIN}\n" in holder
    assert f"rm -rf {layout.VERIFIER_BOX_PREFIX}*" in shell.program("maka-next-step")
    verifier = shell.program("maka-verifier")
    assert f"p=$r{toolbox.PRIVATE}\n" in verifier
    assert f"tar -C {layout.AGENT_LOGS_PATH} " in verifier
    assert f"{toolbox.SETPRIV} --root" in verifier


def test_a_program_runs_in_the_toolboxs_shell_with_its_name_and_arguments() -> None:
    argv = shell.argv("maka-quiesce", "12")
    assert argv[:3] == [toolbox.BUSYBOX, "sh", "-c"]
    assert argv[3] == shell.program("maka-quiesce")
    assert argv[4:] == ["maka-quiesce", "12"]
