"""The run-directory AttemptSource: a damaged record is reported and skipped for readers,
and still refused by a writer."""

from __future__ import annotations

import pytest

from maka_eval.analysis.source import AttemptSource, RunDirectorySource
from maka_eval.analysis.summary import summarize, summarize_source
from maka_eval.errors import StoreError
from maka_eval.store.lock import LockState
from maka_eval.store.run_store import RunWriter, read_run, require_intact
from tests.analysis.records import identity, make_run


def test_reads_experiment_records_and_writer(tmp_path):
    make_run(tmp_path / "run")
    source: AttemptSource = RunDirectorySource(tmp_path / "run")
    assert source.location == str(tmp_path / "run")
    assert source.experiment_origin.endswith("experiment.json")
    assert source.experiment_document()["id"] == "exp"
    assert sorted(source.records()) == ["t1::1::x", "t1::1::y"]
    assert source.damaged() == [] and source.interrupted() == {}
    writer = source.writer()
    assert writer is not None and writer.state is LockState.FREE


def test_a_damaged_record_is_reported_and_skipped_not_fatal(tmp_path):
    paths = make_run(tmp_path / "run")
    damaged = paths["y"]
    damaged.chmod(0o644)
    damaged.write_text(damaged.read_text().replace('"completed"', '"winning"'))

    contents = read_run(tmp_path / "run")  # no longer raises
    assert [p.where for p in contents.damaged] == [str(damaged)]
    assert list(contents.records) == ["t1::1::x"]
    assert contents.interrupted == {}  # its attempt had a record: it was not interrupted

    summary = summarize(tmp_path / "run")
    assert [p.where for p in summary.damaged] == [str(damaged)]
    rows = {r.cell_id: r for r in summary.cells}
    assert rows["t1::1::x"].selected is not None and rows["t1::1::y"].selected is None


def test_a_writer_still_refuses_damaged_records(tmp_path):
    paths = make_run(tmp_path / "run")
    paths["x"].chmod(0o644)
    paths["x"].write_text("{not json")
    with pytest.raises(StoreError) as info:
        require_intact(read_run(tmp_path / "run"))
    assert str(paths["x"]) in info.value.render()
    with pytest.raises(StoreError) as info:
        RunWriter.open(tmp_path / "run", identity(), "0")
    assert "fail verification" in info.value.summary
    assert str(paths["x"]) in info.value.render()


def test_a_moved_record_is_damaged(tmp_path):
    paths = make_run(tmp_path / "run")
    target = paths["y"].parent.parent.parent / "z" / "attempts"
    target.mkdir(parents=True)
    paths["y"].rename(target / "0001.json")
    summary = summarize_source(RunDirectorySource(tmp_path / "run"))
    assert len(summary.damaged) == 1 and summary.damaged[0].message.startswith("moved: ")
