"""The ledger: every commit is a line chained to the one before, the head in the key
folder follows it; edits, cuts and a replaced head are found; what a crash leaves is
not taken for tampering and is repaired on resume; concurrent commits keep it whole."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from maka_eval.store.integrity import SealState
from maka_eval.store.run_store import RunWriter, read_run

from .test_run_store import IDENTITY, record

ROOT = Path(__file__).resolve().parents[2]


def _commit(writer: RunWriter, task: str, subject: str) -> None:
    slot = writer.reserve(task, 1, subject)
    cell = f"{task}::1::{subject}"
    committed = replace(
        record(writer, slot),
        cell_id=cell,
        task_id=task,
        subject_id=subject,
        attempt_id=f"{writer.run_id}/{cell}/{slot.number}",
    )
    writer.commit(slot, committed)


def _three(tmp_path: Path) -> Path:
    """A run of three commits: t::1::s twice, u::1::s once."""
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    for task in ("t", "t", "u"):
        _commit(writer, task, "s")
    writer.close()
    return run


def _head(key_dir: Path, run: Path) -> Path:
    run_id = json.loads((run / "experiment.json").read_text())["runId"]
    return key_dir / "runs" / f"{run_id}.head"


def _kinds(run: Path) -> list[str]:
    return [p.message.split(":")[0] for p in read_run(run).damaged]


def test_every_commit_is_a_chained_line_and_the_head_follows(tmp_path, key_dir):
    run = _three(tmp_path)
    lines = (run / "records.ledger").read_bytes().decode().splitlines()
    run_id = json.loads((run / "experiment.json").read_text())["runId"]
    fmt, line_run, key_id, digest, _ = lines[0].split(" ")
    assert (fmt, line_run) == ("maka.eval.ledger.v1", run_id)
    assert digest == hashlib.sha256((run / "experiment.json").read_bytes()).hexdigest()
    places = [line.split(" ", 2)[2] for line in lines[1:]]
    assert places == ["1 t::1::s", "2 t::1::s", "1 u::1::s"]
    seal = json.loads((run / "cells/t/1/s/attempts/0002.json").read_bytes())["seal"]
    assert lines[2].split(" ")[0] == seal  # the line holds the record's seal
    head = json.loads(_head(key_dir, run).read_text())
    assert head["count"] == 3 and head["chain"] == lines[3].split(" ")[1]
    assert head["keyId"] == key_id and head["runId"] == run_id
    assert oct(_head(key_dir, run).stat().st_mode & 0o777) == "0o600"
    contents = read_run(run)
    assert contents.integrity.state is SealState.VERIFIED and contents.integrity.notes == ()
    assert contents.integrity.verified == 3


def _lines(edit: Callable[[list[bytes]], list[bytes]]) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        return b"".join(line + b"\n" for line in edit(data.splitlines()))

    return apply


def _flip(line: bytes, at: int) -> bytes:
    return line[:at] + (b"0" if line[at : at + 1] != b"0" else b"1") + line[at + 1 :]


def _rechained(data: bytes) -> bytes:
    """The ledger rewritten by someone without the key: attempt 2 of t::1::s taken
    out, every chain value recomputed with plain sha256."""
    lines = data.splitlines()
    chain = bytes.fromhex(lines[0].split(b" ")[4].decode())
    out = [lines[0]]
    for line in (lines[1], lines[3]):
        seal, _, rest = line.split(b" ", 2)
        chain = hashlib.sha256(chain + seal + b" " + rest).digest()
        out.append(seal + b" " + chain.hex().encode() + b" " + rest)
    return b"".join(line + b"\n" for line in out)


@pytest.mark.parametrize(
    ("edit", "kinds"),
    [
        # a seal changed in the middle line
        (_lines(lambda ls: [ls[0], ls[1], _flip(ls[2], 5), ls[3]]), {"ledger edited"}),
        # a chain value changed
        (_lines(lambda ls: [ls[0], ls[1], _flip(ls[2], 70), ls[3]]), {"ledger edited"}),
        # two lines swapped
        (_lines(lambda ls: [ls[0], ls[2], ls[1], ls[3]]), {"ledger edited"}),
        # a middle line dropped
        (_lines(lambda ls: [ls[0], ls[1], ls[3]]), {"ledger edited"}),
        # a line repeated at the end
        (_lines(lambda ls: [*ls, ls[1]]), {"ledger edited"}),
        # the place of a line changed (attempt 2 -> 5)
        (_lines(lambda ls: [ls[0], ls[1], ls[2].replace(b" 2 t::", b" 5 t::"), ls[3]]), None),
        # the first line's document digest changed
        (_lines(lambda ls: [_flip(ls[0], 60), *ls[1:]]), {"ledger edited"}),
        # the last line cut off
        (_lines(lambda ls: ls[:-1]), {"ledger cut"}),
        # every record line cut off
        (_lines(lambda ls: ls[:1]), {"ledger cut"}),
        # rewritten and re-chained without the key
        (_rechained, {"ledger edited"}),
        # emptied
        (lambda data: b"", {"ledger edited"}),
    ],
)
def test_an_edited_ledger_is_found(tmp_path, edit, kinds):
    run = _three(tmp_path)
    ledger = run / "records.ledger"
    ledger.write_bytes(edit(ledger.read_bytes()))
    found = set(_kinds(run))
    if kinds is None:
        assert "ledger edited" in found
    else:
        assert kinds <= found, found
    assert read_run(run).integrity.state is SealState.FAILED
    with pytest.raises(Exception, match="fail verification"):
        RunWriter.open(run, IDENTITY, "0")


def test_a_removed_ledger_is_found(tmp_path):
    run = _three(tmp_path)
    (run / "records.ledger").unlink()
    assert _kinds(run) == ["ledger removed"]
    for path in run.glob("cells/*/*/*/attempts/*.json"):
        path.unlink()  # and every record with it: the head still says 3 were committed
    assert _kinds(run) == ["ledger removed"]
    assert "listed 3 record(s)" in read_run(run).damaged[0].message


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (lambda head: {**head, "count": 2}, "head mismatch"),  # behind, wrong chain
        (lambda head: {**head, "count": 7}, "ledger cut"),  # ahead of the ledger
        (lambda head: {**head, "chain": "00" * 32}, "head mismatch"),
        (lambda head: {**head, "runId": "run-0000000000000000"}, "head mismatch"),
        (lambda head: "not a head", "head mismatch"),
    ],
)
def test_an_edited_head_is_found(tmp_path, key_dir, change, kind):
    run = _three(tmp_path)
    path = _head(key_dir, run)
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    assert _kinds(run) == [kind]


def test_a_head_behind_the_ledger_is_what_a_crash_leaves_and_is_accepted(tmp_path, key_dir):
    run = _three(tmp_path)
    lines = (run / "records.ledger").read_text().splitlines()
    path = _head(key_dir, run)
    head = json.loads(path.read_text())
    path.write_text(json.dumps({**head, "count": 1, "chain": lines[1].split(" ")[1]}))
    assert read_run(run).integrity.state is SealState.VERIFIED
    RunWriter.open(run, IDENTITY, "0").close()  # resume moves it on
    assert json.loads(path.read_text()) == head


def test_without_a_head_a_reader_says_what_it_cannot_check(tmp_path, key_dir):
    run = _three(tmp_path)
    _head(key_dir, run).unlink()
    integrity = read_run(run).integrity
    assert integrity.state is SealState.VERIFIED
    assert any("cut off the ledger's end would go unnoticed" in n for n in integrity.notes)


def test_an_empty_head_is_what_a_power_loss_can_leave_and_is_no_head(tmp_path, key_dir):
    run = _three(tmp_path)
    _head(key_dir, run).write_bytes(b"")
    integrity = read_run(run).integrity
    assert integrity.state is SealState.VERIFIED
    assert any("is empty" in note for note in integrity.notes)
    RunWriter.open(run, IDENTITY, "0").close()  # resume writes it anew
    assert json.loads(_head(key_dir, run).read_text())["count"] == 3


def test_a_torn_last_line_is_ignored_by_readers(tmp_path):
    run = _three(tmp_path)
    with (run / "records.ledger").open("ab") as ledger:
        ledger.write(b"deadbeef")  # a crash (or anyone) left half a line
    assert read_run(run).integrity.state is SealState.VERIFIED


# -- a writer killed during a commit ---------------------------------------------------


@pytest.mark.parametrize("moment", ["before-line", "torn-line", "before-head"])
def test_a_crash_during_a_commit_resumes_cleanly(tmp_path, key_dir, moment):
    run = tmp_path / "run"
    crash = subprocess.run(
        [sys.executable, "-m", "tests.store.crash_writer", str(run), moment],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert crash.returncode == -9, crash.stderr
    assert (run / "cells/t/1/s/attempts/0002.json").exists()  # the record was written
    contents = read_run(run)  # (the lock is stale: the next writer needs `unlock`)
    integrity = contents.integrity
    assert integrity.state is SealState.VERIFIED and contents.damaged == []
    assert [r.attempt for r in contents.attempts("t::1::s")] == [1, 2]
    if moment == "before-head":
        assert integrity.pending == ()
    else:
        assert integrity.pending == (("t::1::s", 2),)
        assert any("not in the ledger yet" in note for note in integrity.notes)
    (run / ".writer.lock").unlink()  # what `maka-eval unlock` does once it proved it stale
    writer = RunWriter.open(run, IDENTITY, "0")
    writer.close()
    after = read_run(run)
    assert after.integrity.state is SealState.VERIFIED and after.integrity.pending == ()
    assert after.integrity.notes == ()
    lines = (run / "records.ledger").read_bytes()
    assert lines.endswith(b"\n") and len(lines.splitlines()) == 3
    head = json.loads(_head(key_dir, run).read_text())
    assert head["count"] == 2


# -- concurrent commits ------------------------------------------------------------------


def test_concurrent_commits_keep_the_ledger_whole(tmp_path, key_dir):
    """Sixteen threads commit at once, to the same cells and to their own: every record
    has one line, the chain holds from the first line to the head."""
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    threads_count, each = 16, 12
    barrier = threading.Barrier(threads_count)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            barrier.wait()
            for n in range(each):
                task = "shared" if n % 2 else f"own{index}"
                _commit(writer, task, f"s{n % 3}")
        except BaseException as exc:  # reported below, with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    assert errors == []
    total = threads_count * each
    contents = read_run(run)
    assert contents.integrity.state is SealState.VERIFIED, contents.damaged
    assert contents.integrity.verified == total and contents.integrity.pending == ()
    lines = (run / "records.ledger").read_text().splitlines()[1:]
    assert len(lines) == total and len({line.split(" ", 2)[2] for line in lines}) == total
    assert all(len(line.split(" ")) == 4 for line in lines)
    assert json.loads(_head(key_dir, run).read_text())["count"] == total
    shared = contents.attempts("shared::1::s0")
    assert [r.attempt for r in shared] == list(range(1, len(shared) + 1))
