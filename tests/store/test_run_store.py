"""The append-only run directory: exclusive records, frozen identity, the writer lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import AttemptRecord
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.errors import StoreError
from maka_eval.store.lock import LOCK_NAME, LockState, inspect_lock, unlock
from maka_eval.store.run_store import (
    RunIdentity,
    RunWriter,
    read_run,
    require_intact,
    write_exclusive,
)

IDENTITY = RunIdentity(
    {"schemaVersion": "maka.eval.v1", "id": "x", "repetitions": 1}, {"t": "sha256:aa"}
)


def record(
    writer: RunWriter, slot, cell="t::1::s", status=AttemptStatus.COMPLETED
) -> AttemptRecord:
    now = datetime.now(tz=UTC)
    return AttemptRecord(
        run_id=writer.run_id,
        experiment_id="x",
        cell_id=cell,
        task_id="t",
        repetition=1,
        subject_id="s",
        attempt=slot.number,
        attempt_id=f"{writer.run_id}/{cell}/{slot.number}",
        trigger=Trigger.SCHEDULED,
        started_at=now,
        subject_started_at=now,
        finished_at=now,
        result=ResultKernel(
            status=status,
            score=1.0 if status.is_result else None,
            usage=None,
            cost_usd=None,
            duration_sec=0.1,
            artifacts=(),
            status_source=StatusSource.VERIFIER,
        ),
        timings={},
        host="h",
        maka_eval_version="0",
    )


def test_write_exclusive_never_overwrites(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    target = folder / "a.json"
    write_exclusive(target, b"first")
    with pytest.raises(FileExistsError):
        write_exclusive(target, b"second")
    assert target.read_bytes() == b"first"
    assert [p.name for p in folder.iterdir()] == ["a.json"]  # no temporary file left
    assert oct(target.stat().st_mode & 0o777) == "0o444"


def test_experiment_json_is_written_once_and_is_the_identity(tmp_path):
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    document = json.loads((run / "experiment.json").read_text())
    assert document["experiment"] == IDENTITY.experiment
    assert document["taskDigests"] == {"t": "sha256:aa"}
    writer.close()
    again = RunWriter.open(run, IDENTITY, "0")
    assert again.run_id == document["runId"]
    again.close()
    changed = RunIdentity({**IDENTITY.experiment, "repetitions": 2}, IDENTITY.task_digests)
    with pytest.raises(StoreError) as info:
        RunWriter.open(run, changed, "0")
    assert "holds a different experiment" in info.value.summary
    assert "experiment.repetitions: 1 -> 2" in info.value.render()
    tasks_changed = RunIdentity(IDENTITY.experiment, {"t": "sha256:bb"})
    with pytest.raises(StoreError, match=r"taskDigests\.t"):
        RunWriter.open(run, tasks_changed, "0")
    assert not (run / LOCK_NAME).exists()  # a refused open leaves no lock behind


def test_a_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a maka-eval run directory"):
        RunWriter.open(tmp_path, IDENTITY, "0")


def test_attempts_are_numbered_per_cell_and_interrupted_ones_stay_visible(tmp_path):
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    one = writer.reserve("t", 1, "s")
    writer.commit(one, record(writer, one))
    two = writer.reserve("t", 1, "s")  # reserved, never committed: its writer "died"
    assert (one.number, two.number) == (1, 2)
    other = writer.reserve("u", 1, "s")
    assert other.number == 1
    writer.close()
    contents = read_run(tmp_path / "run")
    assert [r.attempt for r in contents.attempts("t::1::s")] == [1]
    assert contents.interrupted == {"t::1::s": [2], "u::1::s": [1]}
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    assert writer.reserve("t", 1, "s").number == 3  # numbering continues after reopening
    writer.close()


def test_damaged_records_are_reported_not_trusted(tmp_path):
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    slot = writer.reserve("t", 1, "s")
    writer.commit(slot, record(writer, slot))
    writer.close()
    path = slot.record_path
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"completed"', '"winning"'))
    contents = read_run(tmp_path / "run")  # readers skip it and say which file
    assert contents.records == {} and [p.where for p in contents.damaged] == [str(path)]
    assert contents.damaged[0].message.startswith("edited: ")
    with pytest.raises(StoreError) as info:
        require_intact(contents)  # ...and a writer refuses to add attempts next to it
    assert "fail verification" in info.value.summary
    assert str(path) in info.value.render()
    with pytest.raises(StoreError, match="fail verification"):
        RunWriter.open(tmp_path / "run", IDENTITY, "0")

    # A valid record moved to another cell is caught too.
    path.write_text(path.read_text().replace('"winning"', '"completed"'))
    moved = tmp_path / "run" / "cells" / "t" / "1" / "z" / "attempts"
    moved.mkdir(parents=True)
    os.rename(path, moved / "0001.json")
    damaged = read_run(tmp_path / "run").damaged
    assert len(damaged) == 1 and damaged[0].message.startswith("moved: ")
    assert damaged[0].where == str(moved / "0001.json")


def test_a_live_lock_refuses_a_second_writer(tmp_path):
    first = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    with pytest.raises(StoreError) as info:
        RunWriter.open(tmp_path / "run", IDENTITY, "0")
    assert "being written by another maka-eval run" in info.value.summary
    assert f"pid {os.getpid()}" in info.value.render()
    assert inspect_lock(tmp_path / "run")[0] is LockState.LIVE
    first.close()
    RunWriter.open(tmp_path / "run", IDENTITY, "0").close()
    assert inspect_lock(tmp_path / "run")[0] is LockState.FREE


def _stale_lock(run, pid=999_999, host=None):
    (run / LOCK_NAME).write_text(
        json.dumps({"pid": pid, "host": host or socket.gethostname(), "startedAt": "then"})
    )


def test_a_stale_lock_is_reported_with_how_to_prove_no_writer_remains(tmp_path):
    run = tmp_path / "run"
    RunWriter.open(run, IDENTITY, "0").close()
    _stale_lock(run)
    assert inspect_lock(run)[0] is LockState.STALE
    with pytest.raises(StoreError) as info:
        RunWriter.open(run, IDENTITY, "0")
    text = info.value.render()
    assert "stale writer lock" in text and "ps -p 999999" in text and "maka-eval unlock" in text
    run_id = read_run(run).run_id
    unlock(run, run_id)
    assert not (run / LOCK_NAME).exists()
    RunWriter.open(run, IDENTITY, "0").close()


def test_unlock_refuses_while_a_subject_of_the_run_is_alive(tmp_path):
    run = tmp_path / "run"
    RunWriter.open(run, IDENTITY, "0").close()
    run_id = read_run(run).run_id
    _stale_lock(run)
    survivor = subprocess.Popen(
        ["sleep", "30"], env={"MAKA_EVAL_RUN_ID": run_id, "PATH": "/bin:/usr/bin"}
    )
    try:
        with pytest.raises(StoreError, match=f"pids {survivor.pid}"):
            unlock(run, run_id)
    finally:
        survivor.kill()
        survivor.wait()
    unlock(run, run_id)


def test_unlock_refuses_a_live_writer_and_a_foreign_host_without_force(tmp_path):
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    run_id = writer.run_id
    with pytest.raises(StoreError, match="being written right now"):
        unlock(run, run_id)
    writer.close()
    _stale_lock(run, host="elsewhere.example")
    with pytest.raises(StoreError, match=r"left by host elsewhere\.example"):
        unlock(run, run_id)
    unlock(run, run_id, force=True)
    with pytest.raises(StoreError, match="no writer lock"):
        unlock(run, run_id)


def test_lock_holder_in_another_process_is_live(tmp_path):
    run = tmp_path / "run"
    RunWriter.open(run, IDENTITY, "0").close()
    code = (
        "import sys, time; from pathlib import Path;"
        "from maka_eval.store.lock import WriterLock;"
        f"w = WriterLock(Path({str(run)!r})); w.acquire();"
        "print('held', flush=True); time.sleep(30)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert inspect_lock(run)[0] is LockState.LIVE
        holder.kill()
        holder.wait()
        # The holder died without cleaning up: the file is left, the flock is gone.
        assert (run / LOCK_NAME).exists()
        assert inspect_lock(run)[0] is LockState.STALE
    finally:
        if holder.poll() is None:
            holder.kill()
