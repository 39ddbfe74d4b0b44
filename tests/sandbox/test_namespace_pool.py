"""Namespaces made ahead of their attempts (sandbox.holders.NamespacePool), for real.

A ready-made pair of holders is made over a slot's empty mount points; the attempt's
folders reach it by mount propagation. These tests check that an attempt sees its own
folders and nothing of another's, that what is read-only stays so, and that nothing is
left mounted or running afterwards, even after a process that held slots was killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from maka_eval.processes.supervisor import CancelToken, ProcessSupervisor
from maka_eval.sandbox.base import Layout, Phase
from maka_eval.sandbox.holders import NamespacePool
from maka_eval.sandbox.mounts import SLOTS_ROOT, SlotTree, mounts_under
from maka_eval.sandbox.process import Namespaces, namespaces_unavailable
from tests.helpers import sandbox_layout

pytestmark = pytest.mark.skipif(
    namespaces_unavailable() is not None,
    reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
)


def _layout(root: Path, marker: str) -> Layout:
    layout = sandbox_layout(root)
    (root / "ws" / "mine.txt").write_text(marker)
    (root / "tests" / "test.sh").write_text(f"# tests of {marker}\n")
    (root / "instruction.md").write_text(f"do {marker}\n")
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text(f"# solution of {marker}\n")
    return replace(layout, subject_dirs={str(root / "solution"): "/solution"})


def _run(sandbox: Namespaces, phase: Phase, script: str, tmp: Path) -> tuple[int, str]:
    out = tmp / f"out-{time.monotonic_ns()}"
    with out.open("wb") as handle:
        proc = sandbox.spawn(
            phase,
            ["sh", "-c", script],
            env={"PATH": "/usr/bin:/bin"},
            cwd=sandbox.path_of(phase, sandbox.layout.workspace),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
        sandbox.wait(proc, 10, CancelToken())
        code = sandbox.release(proc)
    return code, out.read_text()


def _ready_pool(pool: NamespacePool, sandbox: Namespaces) -> None:
    """Ask once (the pool starts making for this view), then wait until pairs are ready."""
    assert pool.take(sandbox._view) is None  # nothing made before it was asked for
    deadline = time.monotonic() + 120  # only ends a hang
    while time.monotonic() < deadline:
        with pool._cond:
            if len(pool._ready.get(sandbox._view, [])) >= pool.size:
                return
        time.sleep(0.02)
    raise AssertionError(f"the pool made no pair: {pool.broken}")


def test_a_ready_made_sandbox_shows_its_own_attempt_and_nothing_of_another(tmp_path):
    supervisor = ProcessSupervisor()
    pool = NamespacePool(2, supervisor)
    try:
        a = Namespaces(supervisor, "a", _layout(tmp_path / "a", "alpha"), pool=pool)
        b = Namespaces(supervisor, "b", _layout(tmp_path / "b", "bravo"), pool=pool)
        _ready_pool(pool, a)
        a.start()
        b.start()
        assert a._slot is not None and b._slot is not None and a._slot != b._slot
        look = (
            "cat mine.txt /attempt/instruction.md /solution/solve.sh; pwd; "
            "ls /tests /logs/verifier 2>&1; echo x > /attempt/instruction.md || echo RO-INSTR; "
            "echo x > /solution/solve.sh || echo RO-SOLUTION; "
            "echo from-subject > made.txt; ls /run/maka-eval 2>&1; "
            "grep -rl bravo /attempt /tmp /logs /solution /run 2>/dev/null | head"
        )
        _, out = _run(a, Phase.SUBJECT, look, tmp_path)
        assert "alpha" in out and "do alpha" in out and "solution of alpha" in out, out
        assert "/attempt/workspace" in out
        assert "bravo" not in out and "No such file" in out  # nor the slots in /run
        assert "tests of" not in out and "RO-INSTR" in out and "RO-SOLUTION" in out, out
        assert (tmp_path / "a" / "ws" / "made.txt").read_text() == "from-subject\n"
        assert (tmp_path / "a" / "instruction.md").read_text() == "do alpha\n"
        _, out = _run(b, Phase.SUBJECT, "cat mine.txt; ls", tmp_path)
        assert "bravo" in out and "made.txt" not in out, out
        _, out = _run(a, Phase.VERIFIER, "cat /tests/test.sh made.txt; ls /solution", tmp_path)
        assert "tests of alpha" in out and "from-subject" in out, out
        assert "solve.sh" not in out  # the verifier does not see the oracle's folder
        slots = [a._slot, b._slot]
        a.stop()
        b.stop()
        assert a.processes() == [] and b.processes() == []
        deadline = time.monotonic() + 120  # only ends a hang
        while time.monotonic() < deadline and any(p != s for s in slots for p in mounts_under(s)):
            time.sleep(0.02)
        assert [p for s in slots for p in mounts_under(s) if p != s] == []
        # The folders stay the attempts' own, on the host.
        assert (tmp_path / "b" / "ws" / "mine.txt").read_text() == "bravo"
        base = pool._tree.base if pool._tree is not None else ""
    finally:
        pool.close()
    assert base.startswith(SLOTS_ROOT) and not os.path.exists(base)
    assert mounts_under(base) == []


def test_a_closed_pool_leaves_no_holder_running(tmp_path):
    supervisor = ProcessSupervisor()
    pool = NamespacePool(3, supervisor)
    sandbox = Namespaces(supervisor, "a", _layout(tmp_path / "a", "alpha"), pool=pool)
    _ready_pool(pool, sandbox)
    with pool._cond:
        pids = [h.proc.pid for p in pool._ready[sandbox._view] for h in (p.subject, p.verifier)]
    assert len(pids) == 6
    pool.close()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), pid
    assert pool.take(sandbox._view) is None  # closed: attempts make their own


def test_slots_a_killed_process_left_mounted_are_taken_down(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("left")
    script = textwrap.dedent(
        f"""
        import os, sys
        from maka_eval.sandbox.mounts import SlotTree
        tree = SlotTree()
        slot = tree.new_slot()
        os.mkdir(slot + "/w")
        tree.attach({str(tmp_path / "src")!r}, slot + "/w")
        tree.attach({str(tmp_path / "src" / "f")!r}, slot + "/w/f", read_only=True)
        print(tree.base, flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    base = proc.stdout.strip()
    assert len(mounts_under(base)) >= 3  # its shared root, its stage, and what it bound
    tree = SlotTree()  # the next process to make slots sweeps the dead one's
    try:
        assert mounts_under(base) == [] and not os.path.exists(base)
        assert (tmp_path / "src" / "f").read_text() == "left"  # unmounted, not deleted
    finally:
        tree.close()


def test_a_ready_pair_that_died_is_not_handed_out(tmp_path):
    supervisor = ProcessSupervisor()
    pool = NamespacePool(1, supervisor)
    try:
        sandbox = Namespaces(supervisor, "a", _layout(tmp_path / "a", "alpha"), pool=pool)
        _ready_pool(pool, sandbox)
        with pool._cond:
            pair = pool._ready[sandbox._view][0]
        pair.subject.end()  # e.g. killed from outside while it waited
        assert pool.take(sandbox._view) is None
        sandbox.start()  # makes its own
        assert sandbox._slot is None
        _, out = _run(sandbox, Phase.SUBJECT, "cat mine.txt", tmp_path)
        assert out == "alpha"
        sandbox.stop()
    finally:
        pool.close()


def test_where_slots_cannot_be_mounted_attempts_make_their_own(tmp_path, monkeypatch):
    from maka_eval.sandbox import holders

    def refused(*_args, **_kwargs):
        raise OSError(1, "mount: Operation not permitted")

    monkeypatch.setattr(holders, "SlotTree", refused)
    supervisor = ProcessSupervisor()
    pool = NamespacePool(1, supervisor)
    try:
        sandbox = Namespaces(supervisor, "a", _layout(tmp_path / "a", "alpha"), pool=pool)
        assert pool.take(sandbox._view) is None
        deadline = time.monotonic() + 120  # only ends a hang
        while pool.broken is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.broken is not None and "not permitted" in pool.broken
        sandbox.start()
        _, out = _run(sandbox, Phase.SUBJECT, "cat mine.txt", tmp_path)
        assert out == "alpha" and sandbox._slot is None
        sandbox.stop()
    finally:
        pool.close()


def test_in_a_task_image_the_program_inside_the_hidden_benchmark_is_shown(tmp_path):
    """The relay in a Pod: the image's folders are shown but the hidden benchmark folder,
    which holds the subject's own program (visible, read-only), and is read-only itself."""
    bench = tmp_path / "bench"
    (bench / "agents").mkdir(parents=True)
    (bench / "agents" / "agent.sh").write_text("#!/bin/sh\necho agent\n")
    (bench / "tasks").mkdir()
    (bench / "tasks" / "secret.txt").write_text("solution")
    layout = replace(
        sandbox_layout(tmp_path / "a"),
        hidden=(str(bench),),
        visible=(str(bench / "agents"),),
        in_task_image=True,
    )
    supervisor = ProcessSupervisor()
    sandbox = Namespaces(supervisor, "pod", layout)
    try:
        sandbox.start()
        look = (
            f"cat {bench}/agents/agent.sh; ls {bench}; cat {bench}/tasks/secret.txt 2>&1; "
            f"touch {bench}/planted 2>&1 || echo RO-MASK; ls /usr/bin/env"
        )
        _, out = _run(sandbox, Phase.SUBJECT, look, tmp_path)
    finally:
        sandbox.stop()
    assert "echo agent" in out and "/usr/bin/env" in out, out
    assert "solution" not in out and "RO-MASK" in out, out
