"""Reading a run's cells: what a record file may be, and the helper process of large runs."""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from maka_eval.contract.kernel import ResultKernel
from maka_eval.contract.record import MAX_RECORD_BYTES, AttemptRecord
from maka_eval.engine.status import AttemptStatus, StatusSource, Trigger
from maka_eval.errors import Problem
from maka_eval.store import attempts
from maka_eval.store.run_store import RunIdentity, RunWriter, read_run

from .test_record_fast_path import BASES, _same

IDENTITY = RunIdentity(
    {"schemaVersion": "maka.eval.v1", "id": "x", "repetitions": 2}, {"t": "sha256:aa"}
)


def _commit(writer: RunWriter, task: str, rep: int, subject: str, status: AttemptStatus) -> None:
    slot = writer.reserve(task, rep, subject)
    now = datetime.now(tz=UTC)
    cell = f"{task}::{rep}::{subject}"
    writer.commit(
        slot,
        AttemptRecord(
            run_id=writer.run_id,
            experiment_id="x",
            cell_id=cell,
            task_id=task,
            repetition=rep,
            subject_id=subject,
            attempt=slot.number,
            attempt_id=f"{writer.run_id}/{cell}/{slot.number}",
            trigger=Trigger.SCHEDULED if slot.number == 1 else Trigger.RETRY,
            started_at=now,
            subject_started_at=None,
            finished_at=now,
            result=ResultKernel(
                status=status,
                score=1.0 if status.is_result else None,
                usage=None,
                cost_usd=None,
                duration_sec=0.5,
                artifacts=(),
                status_source=StatusSource.VERIFIER,
            ),
            host="h",
            maka_eval_version="0",
        ),
    )


def _run(tmp_path):
    """Six tasks x 2 repetitions x 2 subjects, with retries, an interrupted attempt and
    a damaged record, so that each half of a split read holds some of each."""
    run = tmp_path / "run"
    writer = RunWriter.open(run, IDENTITY, "0")
    for task in ("t1", "t2", "t3", "t4", "t5", "t6"):
        for rep in (1, 2):
            for subject in ("a", "b"):
                if task in ("t2", "t5") and subject == "b":
                    _commit(writer, task, rep, subject, AttemptStatus.INFRA_FAILED)
                _commit(writer, task, rep, subject, AttemptStatus.COMPLETED)
    writer.reserve("t1", 1, "a")  # never committed: interrupted
    writer.reserve("t6", 2, "b")
    writer.close()
    damaged = run / "cells" / "t5" / "1" / "a" / "attempts" / "0001.json"
    damaged.chmod(0o644)
    damaged.write_text("{not json")
    return run


def _force_helper(monkeypatch, *, slow_here=0.0):
    """Make read_run share even a small run with the helper; return the helpers made.
    `slow_here` slows this process's own reading of each task (not the helper's), so
    that the helper, which starts later, gets its share."""
    monkeypatch.setattr(attempts, "HELPER_FROM_CELLS", 1)
    monkeypatch.setattr(attempts, "_usable_cpus", lambda: 2)
    helpers = []
    init = attempts._Helper.__init__

    def spy(self, *args):
        init(self, *args)
        helpers.append(self)

    monkeypatch.setattr(attempts._Helper, "__init__", spy)
    if slow_here:
        read_tasks = attempts._read_tasks

        def slow(*args):
            time.sleep(slow_here)
            return read_tasks(*args)

        monkeypatch.setattr(attempts, "_read_tasks", slow)
    return helpers


def test_a_shared_read_is_the_same_as_one_process_reading_it_all(tmp_path, monkeypatch):
    run = _run(tmp_path)
    alone = read_run(run)
    assert sum(len(r) for r in alone.records.values()) == 27
    assert alone.interrupted == {"t1::1::a": [2], "t6::2::b": [2]}
    assert [p.where.split("/cells/")[1] for p in alone.damaged] == ["t5/1/a/attempts/0001.json"]

    helpers = _force_helper(monkeypatch, slow_here=0.25)
    split = read_run(run)
    assert len(helpers) == 1
    # The helper read from the last task back; this process, slowed, from the first on.
    assert helpers[0].pieces and 5 in helpers[0].pieces and 0 not in helpers[0].pieces
    assert list(split.records) == list(alone.records)  # path order, then attempt order
    assert split.records == alone.records
    assert split.interrupted == alone.interrupted
    assert split.damaged == alone.damaged
    assert gc.isenabled()


def test_a_fast_reader_leaves_the_late_helper_little_or_nothing(tmp_path, monkeypatch):
    run = _run(tmp_path)
    alone = read_run(run)
    helpers = _force_helper(monkeypatch)  # this process reads six tasks before it starts
    shared = read_run(run)
    assert len(helpers) == 1 and len(helpers[0].pieces) <= 2
    assert shared.records == alone.records and shared.damaged == alone.damaged


def test_after_handing_over_this_process_still_reads_while_tasks_are_left(tmp_path, monkeypatch):
    """Once this process hands the tasks between them to the helper and decodes what
    it sent, it goes on reading while the helper has not reached a task: a misjudged
    pace (here: a helper far slower than judged) never leaves it waiting idle."""
    run = _run(tmp_path)
    alone = read_run(run)
    helpers = _force_helper(monkeypatch)
    monkeypatch.setattr(attempts._Helper, "should_take_over", lambda self, *args: True)
    monkeypatch.setattr(
        attempts,
        "_HELPER_MAIN",
        "import time; from maka_eval.store import attempts as a; read = a._read_tasks; "
        "a._read_tasks = lambda *args: (time.sleep(0.5), read(*args))[1]; a.serve_helper()",
    )
    shared = read_run(run)
    assert len(helpers) == 1 and len(helpers[0].pieces) <= 1  # not the five left to it
    assert list(shared.records) == list(alone.records)
    assert shared.records == alone.records and shared.damaged == alone.damaged
    assert shared.interrupted == alone.interrupted


# What a helper reads first (its task list and the seal key): a failing helper below
# takes it before it misbehaves, so that this process has handed it the tasks (one that
# exits before reading them, refused at once, is the first case).
TAKES_ITS_TASKS = (
    "import struct, sys; i = sys.stdin.buffer; n = struct.unpack('<I', i.read(4))[0]; i.read(n); "
)


@pytest.mark.parametrize(
    ("helper_main", "started"),
    [
        ("import sys; sys.exit(3)", None),  # fails at once (it may not be handed the tasks)
        # says it started the last task, then sends garbage and exits
        (
            TAKES_ITS_TASKS + "o = sys.stdout.buffer; "
            "o.write(struct.pack('<cI', b'S', 4) + struct.pack('<I', 5)); "
            "o.write(struct.pack('<cI', b'T', 9) + b'garbage!!'); o.flush()",
            1,
        ),
        # says it started the last task, then dies without sending it
        (
            TAKES_ITS_TASKS + "o = sys.stdout.buffer; "
            "o.write(struct.pack('<cI', b'S', 4) + struct.pack('<I', 5)); o.flush()",
            1,
        ),
    ],
)
def test_what_a_failed_helper_did_not_deliver_is_read_here(
    tmp_path, monkeypatch, helper_main, started
):
    run = _run(tmp_path)
    alone = read_run(run)
    helpers = _force_helper(monkeypatch, slow_here=0.05)
    monkeypatch.setattr(attempts, "_HELPER_MAIN", helper_main)
    failed = read_run(run)
    assert len(helpers) == started if started is not None else len(helpers) <= 1
    assert list(failed.records) == list(alone.records)
    assert failed.records == alone.records and failed.damaged == alone.damaged
    assert failed.interrupted == alone.interrupted


def test_a_helper_that_cannot_start_leaves_it_all_here(tmp_path, monkeypatch):
    run = _run(tmp_path)
    alone = read_run(run)
    helpers = _force_helper(monkeypatch)
    monkeypatch.setattr(attempts.sys, "executable", str(tmp_path / "no-such-python"))
    assert read_run(run).records == alone.records
    assert helpers == []


def test_a_record_must_be_a_regular_file_of_bounded_size(tmp_path):
    run = _run(tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_bytes((run / "cells" / "t1" / "1" / "b" / "attempts" / "0001.json").read_bytes())
    cell = run / "cells" / "t3" / "1" / "a" / "attempts"
    (cell / "0001.json").unlink()
    (cell / "0001.json").symlink_to(outside)  # not followed: it could point anywhere
    big = run / "cells" / "t3" / "2" / "a" / "attempts" / "0001.json"
    big.chmod(0o644)
    big.write_bytes(b" " * (MAX_RECORD_BYTES + 1) + big.read_bytes())
    fifo = run / "cells" / "t4" / "1" / "a" / "attempts" / "0002.json"
    os.mkfifo(fifo)  # nobody writes to it: reading must not wait

    contents = read_run(run)
    problems = {p.where.split("/cells/")[1]: p.message for p in contents.damaged}
    assert "cannot be read" in problems["t3/1/a/attempts/0001.json"]  # (the symlink)
    assert "larger than" in problems["t3/2/a/attempts/0001.json"]
    # Never committed (no ledger line), and nothing a reader could take for a record.
    assert problems["t4/1/a/attempts/0002.json"].startswith("added: ")
    assert "empty" in problems["t4/1/a/attempts/0002.json"]
    assert "t3::1::a" not in contents.records and "t3::2::a" not in contents.records
    assert [r.attempt for r in contents.records["t4::1::a"]] == [1]


@pytest.mark.parametrize("name", ["01", "²", "x"])
def test_odd_repetition_directories_do_not_stop_the_read(tmp_path, name):
    run = _run(tmp_path)
    (run / "cells" / "t1" / name / "a" / "attempts" / "²").mkdir(parents=True)
    contents = read_run(run)
    assert sum(len(r) for r in contents.records.values()) == 27


# -- what the helper sends back --------------------------------------------------------


def _cells_read(records: list[AttemptRecord]) -> attempts.CellsRead:
    read = attempts.CellsRead()
    for record in records:
        read.records.setdefault(record.cell_id, []).append(record)
    read.interrupted = {"t::2::s": [4, 7]}
    read.damaged = [Problem("cells/t/1/s/attempts/0001.json", "not a valid attempt record")]
    return read


def test_the_helpers_output_rebuilds_every_record_exactly():
    read = _cells_read(list(BASES))
    data = attempts.encode_cells_read(read)
    assert data[:1] == b"M"  # marshalled plain values, not a pickle
    back = attempts.decode_cells_read(data)
    assert back == read
    assert list(back.records) == list(read.records)
    for cell, records in read.records.items():
        for original, rebuilt in zip(records, back.records[cell], strict=True):
            assert _same(original, rebuilt)  # field for field, down to the value types
            # the rebuilt records' dicts share their keys as the constructed ones' do
            assert sys.getsizeof(vars(rebuilt)) == sys.getsizeof(vars(original))
            assert sys.getsizeof(vars(rebuilt.result)) == sys.getsizeof(vars(original.result))


def test_what_marshal_cannot_carry_exactly_is_pickled():
    other_zone = timezone(timedelta(hours=2))
    record = replace(BASES[0], started_at=datetime(2026, 1, 5, 11, tzinfo=other_zone))
    read = _cells_read([BASES[1], record])
    data = attempts.encode_cells_read(read)
    assert data[:1] == b"P"
    back = attempts.decode_cells_read(data)
    assert back == read
    assert back.records[record.cell_id][-1].started_at.tzinfo == other_zone


@pytest.mark.parametrize("cut", [0, 1, 40, -1])
def test_garbled_helper_output_is_refused(cut):
    data = attempts.encode_cells_read(_cells_read(list(BASES)))
    garbled = data[:cut] if cut else b"X" + data[1:]
    with pytest.raises(Exception):  # noqa: B017  (whatever it is, the read redoes it)
        attempts.decode_cells_read(garbled)
