"""The verifier's toolbox (maka_eval.sandbox.toolbox): static programs of this machine,
built once into the cache; what it refuses; maka-setpriv's privileges, for real; and the
small pure pieces of the container sandbox that choose the verifier's shell and read
what the image holds."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from maka_eval.errors import PrerequisiteError
from maka_eval.sandbox import exec as exec_helper
from maka_eval.sandbox import toolbox
from maka_eval.sandbox.container.engine import diff_caveat
from maka_eval.sandbox.container.image_facts import parse_facts
from maka_eval.sandbox.container.verifier_argv import trusted_argv
from tests.helpers import spec
from tests.local.conftest import Setup, setup
from tests.sandbox.test_changes import ld_cache

__all__ = ["Setup", "setup"]

needs_root = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="maka-setpriv changes users and capabilities: root on Linux",
)


@pytest.fixture
def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(toolbox, "_ready", {})
    return toolbox.toolbox({"MAKA_EVAL_CACHE": str(tmp_path / "cache")})


def test_static_programs_are_told_from_dynamic_ones(tmp_path: Path) -> None:
    assert toolbox.static_problem(Path("/bin/busybox")) is None
    assert "linked dynamically" in (toolbox.static_problem(Path("/bin/ls")) or "")
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\necho hi\n" * 10)
    assert "not a 64-bit" in (toolbox.static_problem(text) or "")
    assert "cannot be read" in (toolbox.static_problem(tmp_path / "missing") or "")


def test_the_toolbox_is_built_once_into_the_cache(built: Path, tmp_path: Path) -> None:
    assert built.parent == tmp_path / "cache" / "toolbox"
    for name in ("busybox", "bash", "maka-setpriv"):
        program = built / "bin" / name
        assert toolbox.static_problem(program) is None
        assert program.stat().st_mode & 0o777 == 0o755
    assert (built / "private").is_dir() and not any((built / "private").iterdir())
    setpriv = (built / "bin" / "maka-setpriv").stat()
    # Another process (nothing remembered) finds it as it is; a broken one is made again.
    toolbox._ready.clear()
    assert toolbox.toolbox({"MAKA_EVAL_CACHE": str(tmp_path / "cache")}) == built
    assert (built / "bin" / "maka-setpriv").stat().st_ino == setpriv.st_ino
    (built / "bin" / "bash").unlink()
    toolbox._ready.clear()
    assert toolbox.toolbox({"MAKA_EVAL_CACHE": str(tmp_path / "cache")}) == built
    assert toolbox.static_problem(built / "bin" / "bash") is None
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no build left over


@pytest.mark.parametrize(
    ("sources", "said"),
    [
        (("/nonexistent/busybox",), "none of /nonexistent/busybox exists"),
        (("/bin/ls",), "linked dynamically"),
    ],
)
def test_a_toolbox_that_cannot_be_made_names_the_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources: tuple[str, ...], said: str
) -> None:
    monkeypatch.setattr(toolbox, "_ready", {})
    monkeypatch.setattr(toolbox, "BUSYBOX_SOURCES", sources)
    with pytest.raises(toolbox.ToolboxError) as info:
        toolbox.toolbox({"MAKA_EVAL_CACHE": str(tmp_path)})
    assert said in str(info.value)
    assert "apt-get install busybox-static bash-static gcc libc6-dev" in str(info.value)
    assert toolbox.toolbox_problem({"MAKA_EVAL_CACHE": str(tmp_path)}) == str(info.value)


def test_a_run_with_container_tasks_needs_the_toolbox(setup, monkeypatch) -> None:
    from maka_eval.local import prerequisites
    from maka_eval.sandbox.container.engine import EngineInfo, EngineProbe

    engine = EngineInfo("unix:///fake.sock", "Podman", "4.3.1", "1.41", gpus=False)
    monkeypatch.setattr(prerequisites, "engine_info", lambda env: EngineProbe(engine, ()))
    monkeypatch.setattr(prerequisites, "toolbox_problem", lambda: "no busybox (install it)")
    s = setup(spec(), {"t1": {"toml": '[environment]\ndocker_image = "x"\n'}})
    with pytest.raises(PrerequisiteError) as info:
        s.run()
    text = info.value.render()
    assert "executor.config.sandbox" in text and "tasks t1 run in containers" in text
    assert "no busybox (install it)" in text


@needs_root
def test_setpriv_drops_what_it_is_told(built: Path) -> None:
    setpriv = str(built / "bin" / "maka-setpriv")
    busybox = "/bin/busybox"  # the pytest folder is root's alone
    status = "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status"

    def run(*options: str) -> dict[str, str]:
        out = subprocess.run(
            [setpriv, *options, "--", busybox, "sh", "-c", status],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        pairs = (line.partition(":") for line in out.splitlines())
        return {key: " ".join(value.split()) for key, _, value in pairs}

    # The subject: root without CAP_WAKE_ALARM (35) in its bounding set, nothing inherited.
    subject = run("--drop-bounding", "35")
    assert not int(subject["CapBnd"], 16) >> 35 & 1 and int(subject["CapInh"], 16) == 0
    assert subject["Uid"].startswith("0 ")
    # A verifier that is not root: its user and groups, and only CAP_WAKE_ALARM (ambient).
    verifier = run("--uid", "1001", "--gid", "1002", "--groups", "1002,5", "--ambient", "35")
    assert verifier["Uid"] == "1001 1001 1001 1001" and verifier["Gid"] == "1002 1002 1002 1002"
    assert set(verifier["Groups"].split()) == {"1002", "5"}
    for key in ("CapPrm", "CapEff", "CapAmb"):
        assert int(verifier[key], 16) == 1 << 35, verifier
    # The holder: only the bounding set it is given.
    assert int(run("--keep-bounding", "3fff")["CapBnd"], 16) == 0x3FFF
    # Into a root, and its workdir when there is one.
    out = subprocess.run(
        [setpriv, "--root", "/", "--cd", "/nonexistent", "--", busybox, "pwd"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "/"
    bad = subprocess.run([setpriv, "--uid", "5", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 126 and "--uid and --gid go together" in bad.stderr
    gone = subprocess.run([setpriv, "--", "/nonexistent"], capture_output=True, text=True)
    assert gone.returncode == 127 and "cannot run /nonexistent" in gone.stderr


# -- the verifier's shell ---------------------------------------------------------------
BASH = toolbox.BASH


@pytest.mark.parametrize(
    ("argv", "head", "expected", "interpreter"),
    [
        (["bash", "/tests/test.sh"], b"echo no shebang\n", [BASH, "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#!/bin/bash\n", [BASH, "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#!/usr/bin/bash\n", [BASH, "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#!/usr/bin/env bash\n", [BASH, "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#! /bin/bash -e\n", [BASH, "-e", "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#!/bin/bash -eu -x\n", [BASH, "-eu -x", "/tests/test.sh"], None),
        (["/tests/test.sh"], b"#!/bin/sh\n", ["/tests/test.sh"], "/bin/sh"),
        (["/tests/test.sh"], b"#!/usr/bin/env python3\n", ["/tests/test.sh"], "/usr/bin/env"),
        (["/tests/test.sh"], b"#!/opt/py/bin/python\n", ["/tests/test.sh"], "/opt/py/bin/python"),
        (["/tests/run"], b"\x7fELF\x02\x01\x01", ["/tests/run"], None),
    ],
)
def test_bash_scripts_run_in_the_toolboxs_bash(argv, head, expected, interpreter) -> None:
    assert trusted_argv(argv, head) == (expected, interpreter)


def test_what_the_image_holds_is_read_from_the_holders_report() -> None:
    cache = ld_cache({"libc.so.6": "/lib/libc.so.6"})
    lines = [
        "in /usr/local/bin",
        "- pip",
        "in /usr/bin",
        "- python3",
        "- bash",
        "link /bin",
        "in /usr/bin",  # /bin again, resolved: one folder
        "- python3",
        "m numpy",
        "m numpy-1.26.dist-info",
        "m six.py",
        "m __pycache__",
        "m distutils-precedence.pth",
        f"ldcache {base64.b64encode(cache).decode()}",
        "ready 12 34 56",
    ]
    facts = parse_facts(lines)
    assert facts.path_dirs == ("/usr/local/bin", "/usr/bin")
    assert facts.commands == {"/usr/local/bin": {"pip"}, "/usr/bin": {"python3", "bash"}}
    assert facts.links == {"/bin"}
    assert facts.site_modules == {"numpy", "six"}
    assert facts.libraries == {"libc.so.6": {"/lib/libc.so.6"}}
    # No cache in the image (musl): none known; one that cannot be read: unknown.
    assert parse_facts(["in /bin"]).libraries == {}
    assert parse_facts(["in /bin", "ldcache bm90IGEgY2FjaGU="]).libraries is None


@pytest.mark.parametrize(
    ("answer", "caveat"),
    [
        ((200, {"DriverStatus": [["Native Overlay Diff", "true"]]}), False),
        ((200, {"DriverStatus": [["Native Overlay Diff", "false"], ["x"]]}), True),
        ((200, {"Driver": "vfs"}), False),
        ((500, "boom"), False),
    ],
)
def test_an_engine_without_a_native_overlay_diff_is_named(monkeypatch, answer, caveat) -> None:
    engine = f"unix:///fake-{caveat}-{answer[0]}-{len(str(answer[1]))}.sock"
    monkeypatch.setattr(exec_helper, "request", lambda *a, **k: answer)
    said = diff_caveat(engine)
    assert (said is not None) is caveat
    if caveat:
        assert said is not None and "rewrote with its size and time kept" in said
