"""Attacks on the attempt records, by a subject that escaped its sandbox and can write
the run folder (never the key folder): it edits its own record (score 0 -> 1), forges
a new attempt, removes its failed attempt so that the cell runs again on resume,
removes or edits another arm's record, moves a record to another cell, replays one
from another run, rewrites a record consistently (recomputing any plain sha256), cuts,
rewrites or deletes the ledger.

Each attack is made on a copy of a real run of the local executor and must be found by
every reader (`status`, `results`, `report`: the file named with how it failed, the
record left out, exit 3) and by a resume (refused, naming the file; nothing started).
The tests speak to maka-eval only through its commands, its executor and its files.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from maka_eval.cli import main as cli_main
from maka_eval.errors import StoreError
from maka_eval.local.executor import LocalRun, RunOptions
from tests.helpers import PLAIN_PROCESSES, make_task, spec
from tests.local.conftest import Setup

SANDBOX = "the run folder (store)"
"""Where these attacks run (bench/integrity_attacks.py prints it)."""
ATTACK_CLASS = "records rewritten"

SEALED = b'{"format":"maka.eval.sealed-attempt.v1","seal":"'
SEAL_AT = len(SEALED)
BODY_AT = SEAL_AT + 64 + len(b'","record":')
SOLVER = {"id": "solver", "kind": "external", "config": {"command": "touch", "args": ["done.txt"]}}
IDLER = {"id": "idler", "kind": "external", "config": {"command": "true"}}
RERUN = "t1::1::solver"


class Runs:
    """The experiment, its run (t1::1::solver has three attempts) and a second run."""

    def __init__(self, setup: Setup, other: Path) -> None:
        self.setup = setup
        self.run_dir = setup.run_dir
        self.other = other


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("records")
    for task in ("t1", "t2"):
        make_task(root / "tasks", task)
    doc = spec(
        tasks=[{"id": "t1"}, {"id": "t2"}], subjects=[SOLVER, IDLER], executor=PLAIN_PROCESSES
    )
    setup = Setup(root, doc)
    work = root / "work"
    execute(setup, setup.run_dir, work)
    for _ in range(2):
        execute(setup, setup.run_dir, work, RunOptions(cells=(RERUN,), force=True))
    execute(setup, root / "runs" / "other", work)
    return Runs(setup, root / "runs" / "other")


def execute(setup: Setup, run_dir: Path, work: Path, options: RunOptions | None = None) -> None:
    """The local executor runs (or resumes) the experiment into `run_dir`."""
    loaded, tasks = setup.load()
    work.mkdir(exist_ok=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "MAKA_EVAL_WORK_DIR": str(work)}
    options = options or RunOptions()
    LocalRun(loaded, tasks, run_dir, options=options, events=list().append, host_env=env).run()


@pytest.fixture
def run(runs, tmp_path) -> Path:
    """A copy of the run to attack (it shares the original's ledger head, which nothing
    writes again)."""
    copy = tmp_path / "run"
    shutil.copytree(runs.run_dir, copy)
    return copy


def record_path(run: Path, cell: str, attempt: int) -> Path:
    task, rep, subject = cell.split("::")
    return run / "cells" / task / rep / subject / "attempts" / f"{attempt:04d}.json"


def writable(path: Path) -> Path:
    path.chmod(0o644)
    return path


def body_of(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes()[BODY_AT:-2])


def envelope(seal: str, body: bytes) -> bytes:
    return SEALED + seal.encode() + b'","record":' + body + b"}\n"


def hmac_seal(key: bytes, run_id: str, cell: str, attempt: int, body: bytes) -> str:
    message = b"record\0" + f"{run_id}\0{cell}\0{attempt}\0".encode() + body
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def run_id_of(run: Path) -> str:
    return str(json.loads((run / "experiment.json").read_text())["runId"])


def key_id_of(run: Path) -> str:
    return str(json.loads((run / "experiment.json").read_text())["keyId"])


def head_of(run: Path) -> Path:
    return Path(os.environ["MAKA_EVAL_KEY_DIR"]) / "runs" / f"{run_id_of(run)}.head"


def invoke(*args: str):
    result = CliRunner().invoke(cli_main.app, list(args), env={"COLUMNS": "160"}, color=False)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def found(runs: Runs, run: Path, expected: list[tuple[str, Path]], tmp_path: Path) -> dict:
    """Every reader names each (kind, file), leaves it out and exits 3; a resume is
    refused, naming each, and starts nothing. Returns `results --format json`."""
    lines = [f"{where}: {kind}: " for kind, where in expected]
    status = invoke("status", str(run))
    results = invoke("results", str(run), "--format", "json")
    report = invoke("report", str(run), "--out", str(tmp_path / "report"), "--bootstrap", "100")
    for result in (status, results, report):
        assert result.exit_code == 3, result.output
        stderr = result.stderr.replace("\n", "")
        assert "FAILED VERIFICATION" in stderr
        for line in lines:
            assert line in stderr, (line, stderr)
    assert "FAILED VERIFICATION" in status.stdout
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    (info,) = summary["runs"]
    failures = {(f["kind"], f["where"]) for f in info["integrity"]["failures"]}
    assert {(kind, str(where)) for kind, where in expected} <= failures
    assert any("FAILED VERIFICATION" in w for w in summary["warnings"])
    page = (tmp_path / "report" / "report.html").read_text()
    assert "Failed verification" in page
    for _, where in expected:
        assert str(where) in page
    data = json.loads(results.stdout)
    assert data["integrity"]["state"] == "failed verification"

    before = sorted(str(p) for p in run.rglob("*"))
    with pytest.raises(StoreError) as refused:
        execute(runs.setup, run, tmp_path / "work")
    text = refused.value.render()
    assert "nothing was started" in text
    for line in lines:
        assert line in text, (line, text)
    assert sorted(str(p) for p in run.rglob("*")) == before  # nothing started
    return dict(data)


def cells(data: dict) -> dict[str, float]:
    return {c["cell"]: c["score"] for c in data["cells"]}


def test_the_untouched_copy_is_verified(run):
    status = invoke("status", str(run))
    assert status.exit_code == 0, status.output
    assert "6 record(s) verified" in status.stdout
    assert cells(json.loads(invoke("results", str(run), "-f", "json").stdout)) == {
        "t1::1::solver": 1.0,
        "t1::1::idler": 0.0,
        "t2::1::solver": 1.0,
        "t2::1::idler": 0.0,
    }


# -- a record edited ------------------------------------------------------------------


def _score_one(data: bytes) -> bytes:
    return data.replace(b'"score": 0.0', b'"score": 1.0')


def _compact_score_one(data: bytes) -> bytes:
    record = json.loads(data[BODY_AT:-2])
    record["result"]["score"] = 1.0
    return data[:BODY_AT] + json.dumps(record).encode() + b"}\n"


@pytest.mark.parametrize(
    "edit",
    [
        _score_one,  # in place, the seal kept
        lambda data: data.replace(b'"score": 0.0', b'"score": 1e0'),  # another spelling
        lambda data: data.replace(b'"score": 0.0', b'"score": 1.0       '),  # same bytes, ws
        _compact_score_one,  # re-serialized
        # the same record to a JSON reader: only the bytes differ
        lambda data: data.replace(b'"status": "completed"', b'"status": "\\u0063ompleted"'),
        lambda data: data.replace(b'"status": "completed"', b'"status": "subject_failed"'),
        lambda data: _score_one(data)[BODY_AT:-2] + b"\n",  # the envelope taken off
    ],
    ids=["in-place", "exponent", "padded", "re-serialized", "escaped", "status", "bare"],
)
def test_a_score_edited_in_place_is_found(runs, run, tmp_path, edit):
    path = writable(record_path(run, "t1::1::idler", 1))
    path.write_bytes(edit(path.read_bytes()))
    data = found(runs, run, [("edited", path)], tmp_path)
    assert "t1::1::idler" not in cells(data)  # left out: never a score of 1


@pytest.mark.parametrize(
    "make_seal",
    [
        lambda run, cell, body: hashlib.sha256(body).hexdigest(),
        lambda run, cell, body: hashlib.sha256(
            b"record\0" + f"{run_id_of(run)}\0{cell}\0{1}\0".encode() + body
        ).hexdigest(),
        lambda run, cell, body: hmac_seal(b"", run_id_of(run), cell, 1, body),
        lambda run, cell, body: hmac_seal(key_id_of(run).encode(), run_id_of(run), cell, 1, body),
        lambda run, cell, body: hmac_seal(
            bytes.fromhex(key_id_of(run)) * 4, run_id_of(run), cell, 1, body
        ),
    ],
    ids=["sha256-body", "sha256-place-body", "hmac-empty-key", "hmac-key-id", "hmac-id-bytes"],
)
def test_a_record_rewritten_consistently_is_found(runs, run, tmp_path, make_seal):
    """Rewritten whole (a score of 1, a completed status, new timings), in the writer's
    own layout, its seal recomputed every way one can without the key."""
    path = writable(record_path(run, "t1::1::idler", 1))
    record = body_of(path)
    record["result"]["score"] = 1.0
    record["timings"] = {"subjectSec": 0.5}
    body = json.dumps(record, indent=2).encode()
    path.write_bytes(envelope(make_seal(run, "t1::1::idler", body), body))
    data = found(runs, run, [("edited", path)], tmp_path)
    assert "t1::1::idler" not in cells(data)


# -- a record forged ------------------------------------------------------------------


def _forged(run: Path, attempt: int, cell: str = "t1::1::idler") -> bytes:
    record = body_of(record_path(run, cell, 1))
    record["attempt"] = attempt
    record["attemptId"] = f"{record['attemptId']}-forged"
    record["result"]["score"] = 1.0
    return json.dumps(record, indent=2).encode()


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("0002.json", lambda run, body: _bare(body)),  # the format written before seals
        ("0002.json", lambda run, body: envelope("0" * 64, body)),
        (
            "0002.json",  # sealed, correctly, with a key of its own
            lambda run, body: envelope(
                hmac_seal(os.urandom(32), run_id_of(run), "t1::1::idler", 2, body), body
            ),
        ),
        ("02.json", lambda run, body: record_path(run, "t1::1::idler", 1).read_bytes()),
        ("0002.json", lambda run, body: b""),
    ],
    ids=["unsealed", "zero-seal", "own-key", "odd-name-copy", "empty"],
)
def test_a_forged_attempt_is_found(runs, run, tmp_path, name, write):
    path = record_path(run, "t1::1::idler", 1).with_name(name)
    path.write_bytes(write(run, _forged(run, 2)))
    data = found(runs, run, [("added", path)], tmp_path)
    row = next(c for c in data["cells"] if c["cell"] == "t1::1::idler")
    assert row["attempts"] == 1 and row["score"] == 0.0  # the forgery is not counted


def _bare(body: bytes) -> bytes:
    record = json.loads(body)
    record["format"] = "maka.eval.attempt.v2"
    return json.dumps(record, indent=2).encode() + b"\n"


def test_a_forged_cell_sealed_with_another_key_is_found(runs, run, tmp_path):
    """A record for a cell that exists but never ran here, sealed with a key of the
    attacker's own, in a folder the executor would use."""
    folder = run / "cells" / "t2" / "1" / "idler" / "attempts"
    path = folder / "0002.json"
    body = _forged(run, 2, "t2::1::idler")
    path.write_bytes(
        envelope(hmac_seal(os.urandom(32), run_id_of(run), "t2::1::idler", 2, body), body)
    )
    found(runs, run, [("added", path)], tmp_path)


# -- a record removed -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "attempt", "with_folder"),
    [
        (RERUN, 2, False),  # the middle of three
        (RERUN, 3, False),  # the last
        ("t1::1::idler", 1, False),  # the only one (a failure: the cell would run again)
        ("t1::1::idler", 1, True),  # ... with its attempt folder
    ],
    ids=["middle", "last", "only", "only-with-folder"],
)
def test_a_removed_attempt_is_found(runs, run, tmp_path, cell, attempt, with_folder):
    path = record_path(run, cell, attempt)
    path.unlink()
    if with_folder:
        shutil.rmtree(path.with_suffix(""))
    data = found(runs, run, [("removed", path)], tmp_path)
    status = invoke("status", str(run)).stdout
    assert "interrupted" not in status  # removed, not an attempt whose writer died
    if cell == "t1::1::idler":
        assert "t1::1::idler" not in cells(data)


def test_a_removed_cell_folder_is_found(runs, run, tmp_path):
    shutil.rmtree(run / "cells" / "t2" / "1" / "idler")
    found(runs, run, [("removed", record_path(run, "t2::1::idler", 1))], tmp_path)


# -- a record moved or replayed -----------------------------------------------------------


def test_a_record_moved_over_another_arms_is_found(runs, run, tmp_path):
    """The solver's record (score 1) put in place of the idler's (score 0)."""
    solver = record_path(run, "t1::1::solver", 1)
    idler = writable(record_path(run, "t1::1::idler", 1))
    idler.unlink()
    os.rename(solver, idler)
    data = found(runs, run, [("moved", idler)], tmp_path)
    assert "t1::1::idler" not in cells(data)
    assert "is gone" in invoke("status", str(run)).stderr  # the idler's own record


@pytest.mark.parametrize("rewrite", [False, True], ids=["as-is", "ids-rewritten"])
def test_a_record_moved_to_another_cell_is_found(runs, run, tmp_path, rewrite):
    origin = record_path(run, "t2::1::solver", 1)
    target = record_path(run, "t2::1::idler", 2)
    if rewrite:  # its ids made those of the place it is moved to
        record = body_of(origin)
        record.update(cellId="t2::1::idler", subjectId="idler", attempt=2)
        body = json.dumps(record, indent=2).encode()
        target.write_bytes(origin.read_bytes()[:BODY_AT] + body + b"}\n")
        origin.unlink()
        expected = [("added", target), ("removed", origin)]
    else:
        os.rename(origin, target)
        expected = [("moved", target)]
    data = found(runs, run, expected, tmp_path)
    assert "t2::1::solver" not in cells(data)


def test_attempt_numbers_swapped_are_found(runs, run, tmp_path):
    first, third = record_path(run, RERUN, 1), record_path(run, RERUN, 3)
    os.rename(first, first.with_name("x"))
    os.rename(third, first)
    os.rename(first.with_name("x"), third)
    found(runs, run, [("moved", first), ("moved", third)], tmp_path)


def test_a_record_copied_to_a_repetition_folder_it_never_uses_is_found(runs, run, tmp_path):
    """`01` reads as repetition 1: a second copy of the cell's record there."""
    target = run / "cells" / "t1" / "01" / "idler" / "attempts" / "0001.json"
    target.parent.mkdir(parents=True)
    target.write_bytes(record_path(run, "t1::1::idler", 1).read_bytes())
    found(runs, run, [("added", target)], tmp_path)


@pytest.mark.parametrize(
    ("target_attempt", "rewrite", "kind"),
    [(1, False, "replayed"), (2, False, "replayed"), (1, True, "edited")],
    ids=["over-its-own", "as-a-new-attempt", "run-id-rewritten"],
)
def test_a_record_replayed_from_another_run_is_found(
    runs, run, tmp_path, target_attempt, rewrite, kind
):
    source = record_path(runs.other, "t2::1::solver", 1).read_bytes()
    if rewrite:
        record = json.loads(source[BODY_AT:-2])
        record["runId"] = run_id_of(run)
        source = source[:BODY_AT] + json.dumps(record, indent=2).encode() + b"}\n"
    target = record_path(run, "t2::1::solver", target_attempt)
    if target.exists():
        writable(target)
    target.write_bytes(source)
    found(runs, run, [(kind, target)], tmp_path)


# -- the ledger, the head, the run document ------------------------------------------------


def _rechain(lines: list[bytes]) -> list[bytes]:
    """Chain values recomputed without the key (plain sha256)."""
    chain = bytes.fromhex(lines[0].split(b" ")[4].decode())
    out = [lines[0]]
    for line in lines[1:]:
        seal, _, rest = line.split(b" ", 2)
        chain = hashlib.sha256(chain + seal + b" " + rest).digest()
        out.append(seal + b" " + chain.hex().encode() + b" " + rest)
    return out


def _without(lines: list[bytes], place: bytes) -> list[bytes]:
    return [line for line in lines if not line.endswith(b" " + place)]


@pytest.mark.parametrize(
    ("edit", "removed", "kind"),
    [
        (lambda lines: lines[:-1], None, "ledger cut"),  # the last line, record kept
        (lambda lines: lines[:-1], "last", "ledger cut"),  # ... and its record removed
        (lambda lines: lines[:1], "all", "ledger cut"),  # only the first line left
        (lambda lines: _rechain(_without(lines, b"1 t1::1::idler")), "idler", "ledger edited"),
        (lambda lines: _without(lines, b"1 t1::1::idler"), "idler", "ledger edited"),
        (lambda lines: [lines[0], *reversed(lines[1:])], None, "ledger edited"),
    ],
    ids=["cut-last", "cut-last-and-record", "cut-all", "rechained", "line-dropped", "reordered"],
)
def test_a_cut_or_rewritten_ledger_is_found(runs, run, tmp_path, edit, removed, kind):
    ledger = run / "records.ledger"
    lines = ledger.read_bytes().splitlines()
    last_place = lines[-1].split(b" ", 2)[2].decode()
    ledger.write_bytes(b"".join(line + b"\n" for line in edit(lines)))
    if removed == "last":
        attempt, cell = last_place.split(" ")
        record_path(run, cell, int(attempt)).unlink()
    elif removed == "all":
        for path in run.glob("cells/*/*/*/attempts/*.json"):
            path.unlink()
    elif removed == "idler":
        record_path(run, "t1::1::idler", 1).unlink()
    found(runs, run, [(kind, ledger)], tmp_path)


@pytest.mark.parametrize("records_too", [False, True])
def test_a_deleted_ledger_is_found(runs, run, tmp_path, records_too):
    (run / "records.ledger").unlink()
    if records_too:
        shutil.rmtree(run / "cells")
    found(runs, run, [("ledger removed", run / "records.ledger")], tmp_path)


@pytest.mark.parametrize(
    ("change", "kind", "where"),
    [
        (lambda head: {**head, "count": head["count"] - 3}, "head mismatch", "head"),
        (lambda head: {**head, "count": head["count"] + 1}, "ledger cut", "ledger"),
        (lambda head: {**head, "chain": "ab" * 32}, "head mismatch", "head"),
        (lambda head: [head], "head mismatch", "head"),
    ],
    ids=["count-lowered", "count-raised", "chain", "garbage"],
)
def test_an_edited_head_is_found(runs, run, tmp_path, change, kind, where):
    """The head is in the key folder, out of a sandbox's reach; edited anyway (the copy
    of the run shares the original's head, so it is put back afterwards)."""
    head = head_of(run)
    saved = head.read_bytes()
    try:
        head.write_text(json.dumps(change(json.loads(saved))))
        found(runs, run, [(kind, head if where == "head" else run / "records.ledger")], tmp_path)
    finally:
        head.write_bytes(saved)


def test_the_run_document_edited_is_found(runs, run, tmp_path):
    document = writable(run / "experiment.json")
    data = json.loads(document.read_text())
    data["createdAt"] = "2020-01-01T00:00:00+00:00"
    document.write_text(json.dumps(data, indent=2) + "\n")
    found(runs, run, [("run document edited", document)], tmp_path)


def test_a_run_made_to_look_unsigned_is_found(runs, run, tmp_path):
    """Its key id taken out, its ledger deleted, every record rewritten in the format
    written before records were sealed, the idler's score made 1: the key folder's head
    says the run was sealed."""
    document = writable(run / "experiment.json")
    data = json.loads(document.read_text())
    del data["keyId"]
    document.write_text(json.dumps(data, indent=2) + "\n")
    (run / "records.ledger").unlink()
    for path in run.glob("cells/*/*/*/attempts/*.json"):
        writable(path).write_bytes(_bare(_score_one(path.read_bytes())[BODY_AT:-2]))
    data = found(runs, run, [("run document edited", document)], tmp_path)
    assert data["cells"] == []  # no record of such a run can be verified: none is used


@pytest.mark.parametrize("head_too", [False, True], ids=["key-id-changed", "and-no-head"])
def test_a_run_pointed_at_another_key_is_found(runs, run, tmp_path, head_too):
    """Its key id replaced (so that a reader would find no key and only say so), the
    idler's score made 1: this key folder's head, or the ledger sealed with this
    folder's key, says the run was sealed here."""
    document = writable(run / "experiment.json")
    data = json.loads(document.read_text())
    data["keyId"] = "0123456789abcdef"
    document.write_text(json.dumps(data, indent=2) + "\n")
    path = writable(record_path(run, "t1::1::idler", 1))
    path.write_bytes(_score_one(path.read_bytes()))
    head = head_of(run)
    saved = head.read_bytes()
    try:
        if head_too:
            head.unlink()  # (the key folder is out of reach: only to show the ledger says it)
        data = found(runs, run, [("run document edited", document)], tmp_path)
        assert data["cells"] == []  # none of its records can be verified: none is used
    finally:
        head.write_bytes(saved)


def test_a_refused_resume_through_the_command_names_the_file_and_the_fix(runs, run):
    import subprocess
    import sys

    path = writable(record_path(run, "t1::1::idler", 1))
    path.write_bytes(_score_one(path.read_bytes()))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "maka_eval.cli.main",
            "run",
            str(runs.setup.path),
            "--out",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    stderr = " ".join(result.stderr.split())
    assert "fail verification" in stderr and "nothing was started" in stderr
    assert f"{path}: edited: " in stderr and "new --out directory" in stderr
    assert "Traceback" not in result.stderr
