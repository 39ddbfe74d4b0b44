"""The proxy's audit log: one JSON line per decision, private, bounded, rotated."""

from __future__ import annotations

import json
import stat

import pytest

from maka_eval.egress.audit import LINE_LIMIT, MIN_MAX_BYTES, AuditLog


@pytest.mark.parametrize("background", [False, True])
def test_bounded_rotated_private_and_in_order(tmp_path, background):
    path = tmp_path / "private" / "audit.jsonl"
    log = AuditLog(path, MIN_MAX_BYTES, background=background)
    for i in range(400):
        log.write({"event": "request", "decision": "allow", "n": i, "url": "http://x/" + "y" * 50})
    log.close()
    backup = path.with_name("audit.jsonl.1")
    assert path.stat().st_size <= MIN_MAX_BYTES and backup.stat().st_size <= MIN_MAX_BYTES
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    numbers = [json.loads(line)["n"] for f in (backup, path) for line in f.read_text().splitlines()]
    assert numbers == list(range(numbers[0], 400))  # the newest lines, in order, none lost


def test_long_fields_are_cut_and_a_line_stays_bounded(tmp_path):
    log = AuditLog(tmp_path / "a" / "audit.jsonl", MIN_MAX_BYTES)
    log.write({"event": "request", "url": "http://x/" + "z" * 100_000})
    log.write({"event": "request", "decision": "block", "many": ["q" * 1000] * 30})
    log.close()
    lines = (tmp_path / "a" / "audit.jsonl").read_text().splitlines()
    assert len(lines[0]) < LINE_LIMIT and json.loads(lines[0])["url"].endswith("...")
    assert json.loads(lines[1]) | {"ts": 0} == {
        "ts": 0,
        "event": "request",
        "decision": "block",
        "truncated": True,
    }


def test_a_symlink_in_place_of_the_log_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "audit.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        AuditLog(tmp_path / "a" / "audit.jsonl")
    assert not (tmp_path / "elsewhere").exists()


def test_the_size_cap_has_a_floor(tmp_path):
    with pytest.raises(ValueError):
        AuditLog(tmp_path / "a.jsonl", 100)
