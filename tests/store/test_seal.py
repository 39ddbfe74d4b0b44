"""The seal: the key (where, how private, made once), the envelope, and what a seal
binds (the record's bytes and its place), checked against an independent HMAC."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from maka_eval import strict_json
from maka_eval.errors import StoreError
from maka_eval.store import attempts
from maka_eval.store.run_store import RunWriter, read_run
from maka_eval.store.seal import (
    BODY_AT,
    KEY_FILE,
    SEAL_AT,
    SealKey,
    find_key,
    is_envelope,
    key_dir,
    record_place,
    seal_record,
    signing_key,
)

from .test_attempts import _force_helper
from .test_attempts import _run as _shared_run
from .test_record_fast_path import BASES
from .test_run_store import IDENTITY, record


def test_the_key_folder_is_chosen_from_the_environment(tmp_path):
    assert key_dir({"MAKA_EVAL_KEY_DIR": str(tmp_path / "k")}) == tmp_path / "k"
    assert key_dir({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "maka-eval"
    assert key_dir({"XDG_DATA_HOME": "relative"}) == Path.home() / ".local/share/maka-eval"
    assert key_dir({}) == Path.home() / ".local" / "share" / "maka-eval"


def test_the_key_is_made_once_private_and_found_by_its_id(tmp_path):
    folder = tmp_path / "a" / "maka-eval"
    assert find_key(folder, "0" * 16) is None  # a reader never makes one
    assert not folder.exists()
    key = signing_key(folder)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    path = folder / KEY_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600" and path.stat().st_size == 32
    assert key.key_id == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert signing_key(folder).key_id == key.key_id  # the same key from now on
    found = find_key(folder, key.key_id)
    assert found is not None and found.key_id == key.key_id
    assert find_key(folder, "f" * 16) is None  # another run's key is not this one
    assert repr(key) == f"SealKey(id={key.key_id})"
    assert path.read_bytes().hex() not in repr(key) + str(key)


def test_first_runs_at_once_end_up_with_one_key(tmp_path):
    folder = tmp_path / "keys"
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def make() -> None:
        barrier.wait()
        ids.append(signing_key(folder).key_id)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 1 and len(ids) == 8
    assert sorted(p.name for p in folder.iterdir()) == [KEY_FILE]  # no temporary file left


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda folder: folder.chmod(0o755), "chmod 700"),
        (lambda folder: (folder / KEY_FILE).chmod(0o644), "chmod 600"),
        (lambda folder: (folder / KEY_FILE).write_bytes(b"short"), "not a maka-eval key"),
    ],
)
def test_a_key_others_could_read_or_that_was_changed_is_refused(tmp_path, spoil, message):
    folder = tmp_path / "keys"
    key = signing_key(folder)
    spoil(folder)
    with pytest.raises(StoreError) as info:
        signing_key(folder)
    assert message in info.value.render()
    with pytest.raises(StoreError):
        find_key(folder, key.key_id)


def test_a_key_folder_inside_the_run_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MAKA_EVAL_KEY_DIR", str(tmp_path / "run" / "keys"))
    with pytest.raises(StoreError, match="inside the run directory"):
        RunWriter.open(tmp_path / "run", IDENTITY, "0")
    assert not (tmp_path / "run" / "keys").exists()


def _independent_seal(secret: bytes, run_id: str, cell: str, attempt: int, body: bytes) -> str:
    """The documented seal, computed with the standard library's own HMAC."""
    message = b"record\0" + f"{run_id}\0{cell}\0{attempt}\0".encode() + body
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def test_a_sealed_record_is_strict_json_with_its_seal_at_fixed_offsets(tmp_path):
    secret = os.urandom(32)
    key = SealKey(secret)
    base = BASES[0]
    data, seal = seal_record(key, base)
    assert is_envelope(data) and data.endswith(b"}\n")
    document = strict_json.loads(data)
    assert list(document) == ["format", "seal", "record"]
    assert document["format"] == "maka.eval.sealed-attempt.v1"
    assert document["record"] == base.to_dict()
    assert data[SEAL_AT : SEAL_AT + 64] == seal == document["seal"].encode()
    body = data[BODY_AT:-2]
    assert json.loads(body) == base.to_dict()
    expected = _independent_seal(secret, base.run_id, base.cell_id, base.attempt, body)
    assert seal.decode() == expected  # HMAC-SHA256, no home-made construction


def test_a_seal_binds_the_bytes_and_the_place():
    key = SealKey(os.urandom(32))
    base = BASES[0]
    _, seal = seal_record(key, base)
    body = seal_record(key, base)[0][BODY_AT:-2]
    place = record_place(base.run_id, base.cell_id)
    assert key.seal(place, base.attempt, body) == seal
    assert key.seal(place, base.attempt + 1, body) != seal  # another number
    assert key.seal(record_place(base.run_id, "t::2::other"), base.attempt, body) != seal
    assert key.seal(record_place("run-2", base.cell_id), base.attempt, body) != seal
    assert key.seal(place, base.attempt, body.replace(b"1.0", b"1.00")) != seal
    assert SealKey(os.urandom(32)).seal(place, base.attempt, body) != seal
    # Every other record of the contract's corpus, too: none shares a seal.
    seals = {seal_record(key, r)[1] for r in BASES}
    assert len(seals) == len({json.dumps(r.to_dict()) for r in BASES})
    # Attempt 1 of cell "a::1::b" and attempt 11 of cell "a::1::b1" cannot collide:
    one = key.seal(record_place("r", "a::1::b"), 11, body)
    other = key.seal(record_place("r", "a::1::b1"), 1, body)
    assert one != other


def test_the_writer_seals_what_it_commits_and_the_reader_checks_it(tmp_path, key_dir):
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    slot = writer.reserve("t", 1, "s")
    committed = record(writer, slot)
    writer.commit(slot, committed)
    with pytest.raises(ValueError, match="not the record of slot"):  # a record is its slot's
        writer.commit(writer.reserve("t", 1, "s"), committed)
    writer.close()
    document = json.loads((tmp_path / "run" / "experiment.json").read_text())
    secret = (key_dir / KEY_FILE).read_bytes()
    assert document["keyId"] == hashlib.sha256(secret).hexdigest()[:16]
    data = slot.record_path.read_bytes()
    assert data[SEAL_AT : SEAL_AT + 64].decode() == _independent_seal(
        secret, writer.run_id, "t::1::s", 1, data[BODY_AT:-2]
    )
    contents = read_run(tmp_path / "run")
    assert contents.attempts("t::1::s") == [committed] and contents.damaged == []
    assert contents.integrity.state.value == "verified" and contents.integrity.verified == 1


def test_the_helper_gets_the_key_on_its_pipe_only(tmp_path, monkeypatch, key_dir):
    run = _shared_run(tmp_path)
    alone = read_run(run)
    secret = (key_dir / KEY_FILE).read_bytes()
    started: list[tuple[list[str], dict[str, str]]] = []
    real = subprocess.Popen

    def spy(args, **kwargs):
        started.append((list(args), dict(kwargs.get("env") or os.environ)))
        return real(args, **kwargs)

    helpers = _force_helper(monkeypatch, slow_here=0.25)
    monkeypatch.setattr(attempts.subprocess, "Popen", spy)
    shared = read_run(run)
    assert len(helpers) == 1 and helpers[0].pieces  # the helper checked seals too
    assert shared.records == alone.records and shared.damaged == alone.damaged
    assert shared.integrity == alone.integrity
    ((args, env),) = started
    for text in (*args, *env.values()):
        assert secret.hex() not in text and secret.hex().upper() not in text
        assert secret.decode("latin-1") not in text


def test_the_helpers_verdicts_are_this_processs_for_every_kind_of_file(tmp_path, monkeypatch):
    """Records the helper reads (the last tasks) are refused as this process refuses
    them: a forged one, one sealed for another cell, one from another run."""
    run = _shared_run(tmp_path)
    cells = run / "cells"
    t6 = cells / "t6" / "1" / "a" / "attempts" / "0001.json"
    moved = cells / "t6" / "2" / "a" / "attempts" / "0002.json"
    moved.write_bytes(t6.read_bytes())  # sealed for t6::1::a, put in t6::2::a
    forged = cells / "t5" / "2" / "a" / "attempts" / "0002.json"
    forged.write_bytes(t6.read_bytes().replace(b'"score": 1.0', b'"score": 1.5'))
    other = tmp_path / "other"
    writer = RunWriter.open(other, IDENTITY, "0")
    slot = writer.reserve("t6", 2, "b")
    writer.commit(
        slot,
        replace(
            record(writer, slot), cell_id="t6::2::b", task_id="t6", repetition=2, subject_id="b"
        ),
    )
    writer.close()
    replayed = cells / "t6" / "2" / "b" / "attempts" / "0003.json"
    replayed.write_bytes(slot.record_path.read_bytes())
    alone = read_run(run)
    kinds = {p.where.split("/cells/")[1]: p.message.split(":")[0] for p in alone.damaged}
    assert kinds == {
        "t5/1/a/attempts/0001.json": "edited",  # (the fixture's "{not json")
        "t5/2/a/attempts/0002.json": "added",
        "t6/2/a/attempts/0002.json": "moved",
        "t6/2/b/attempts/0003.json": "replayed",
    }
    helpers = _force_helper(monkeypatch, slow_here=0.25)
    shared = read_run(run)
    assert 5 in helpers[0].pieces  # t6 was the helper's
    assert shared.damaged == alone.damaged and shared.records == alone.records


def test_a_reader_on_a_machine_without_the_key_says_so(tmp_path, monkeypatch):
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    slot = writer.reserve("t", 1, "s")
    writer.commit(slot, record(writer, slot))
    writer.close()
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv("MAKA_EVAL_KEY_DIR", str(elsewhere))
    contents = read_run(tmp_path / "run")
    integrity = contents.integrity
    assert integrity.state.value == "unverified" and integrity.verified == 0
    assert f"is not in {elsewhere}" in integrity.describe()
    assert "MAKA_EVAL_KEY_DIR" in integrity.describe()
    assert len(contents.attempts("t::1::s")) == 1  # still read, never called verified
    with pytest.raises(StoreError, match="which is not in"):
        RunWriter.open(tmp_path / "run", IDENTITY, "0")  # nor resumed
    assert not elsewhere.exists() or not any(elsewhere.glob("runs/*.head"))


def test_a_run_written_before_records_were_sealed_is_read_as_unsigned(tmp_path):
    """A v2 run: bare records, no keyId, no ledger. Readable, never called verified,
    and not resumed."""
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    slot = writer.reserve("t", 1, "s")
    committed = record(writer, slot)
    writer.close()
    run = tmp_path / "run"
    document = json.loads((run / "experiment.json").read_text())
    del document["keyId"]
    (run / "experiment.json").chmod(0o644)
    (run / "experiment.json").write_text(json.dumps(document))
    (run / "records.ledger").unlink()
    (Path(os.environ["MAKA_EVAL_KEY_DIR"]) / "runs" / f"{writer.run_id}.head").unlink()
    slot.record_path.write_bytes(committed.to_json_bytes())  # the old format
    contents = read_run(run)
    assert contents.attempts("t::1::s") == [committed] and contents.damaged == []
    assert contents.integrity.state.value == "unsigned"
    assert "written before records were sealed" in contents.integrity.describe()
    with pytest.raises(StoreError, match="written before attempt records were sealed"):
        RunWriter.open(run, IDENTITY, "0")


def test_no_key_reaches_a_child_environment_through_the_writer(tmp_path, key_dir):
    """The writer holds the key in memory: nothing it starts (this test's child, as a
    subject would be) finds it in its environment."""
    writer = RunWriter.open(tmp_path / "run", IDENTITY, "0")
    try:
        secret = (key_dir / KEY_FILE).read_bytes().hex()
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(repr(dict(os.environ)))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert secret not in child.stdout
    finally:
        writer.close()
