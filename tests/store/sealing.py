"""Sealing records by hand, with the test session's key (tests/conftest.py), for tests
that build run directories a writer could have left but does not make on demand."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from maka_eval.contract.record import AttemptRecord
from maka_eval.store.ledger import LEDGER_FILE, LedgerWriter, document_digest
from maka_eval.store.seal import BODY_AT, heads_dir, key_dir, seal_record, signing_key


def write_sealed(path: Path, record: AttemptRecord) -> bytes:
    """Write `record` to `path` sealed with this session's key, for the place it names
    (as the writer does, without its ledger line); return its seal."""
    data, seal = seal_record(signing_key(key_dir()), record)
    if path.exists():
        path.chmod(0o644)
    path.write_bytes(data)
    path.chmod(0o444)
    return seal


def read_sealed(path: Path) -> AttemptRecord:
    """The record in a sealed record file (its seal unchecked)."""
    return AttemptRecord.from_json(path.read_bytes()[BODY_AT:-2])


def reseal_run(run_dir: Path, *, drop: Callable[[Path], bool] = lambda path: False) -> str:
    """Make `run_dir` (a copy of a run) a run of its own, as its writer would have left
    it had the `drop`ped records never been committed: a new run id, every other record
    sealed for it and listed in a new ledger, a head in the key folder. The dropped
    records' files are removed (their attempt folders stay: interrupted attempts).
    Returns the new run id."""
    key = signing_key(key_dir())
    document_path = run_dir / "experiment.json"
    document = json.loads(document_path.read_text())
    run_id = f"run-{secrets.token_hex(8)}"
    document["runId"] = run_id
    document["keyId"] = key.key_id
    raw = (json.dumps(document, indent=2) + "\n").encode()
    document_path.chmod(0o644)
    document_path.write_bytes(raw)
    (run_dir / LEDGER_FILE).unlink(missing_ok=True)
    ledger = LedgerWriter.create(
        run_dir, run_id, key, document_digest(raw), heads_dir(key_dir()), durable=False
    )
    try:
        for path in sorted(run_dir.glob("cells/*/*/*/attempts/*.json")):
            if drop(path):
                path.unlink()
                continue
            record = replace(read_sealed(path), run_id=run_id)
            seal = write_sealed(path, record)
            ledger.append(record.cell_id, record.attempt, seal)
    finally:
        ledger.close()
    return run_id
