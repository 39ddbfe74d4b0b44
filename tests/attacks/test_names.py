"""Names and text a subject controls, for real: nothing it writes reaches a record's names
or the user's terminal raw.

A subject in the namespace sandbox names files in /logs/agent and in a task artifact
folder with newlines, terminal escape sequences (a window title, a screen clear), CR,
the rest of C0, DEL, C1 (CSI), bidi overrides, rich markup and bytes that are not UTF-8;
it feeds reward.json keys to a naive verifier, writes result-frame keys, and a task's
healthcheck prints escape sequences. The record must hold every name escaped (and a name
too long to hold refused, with a note), and `maka-eval run`, `status`, `results` (table,
json, csv) and `report` must print no raw control character and interpret no markup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.printable import escaped, unescaped, unsafe
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import make_task, spec, write_experiment

S = AttemptStatus
ISOLATED = {"kind": "local", "config": {"isolation": "namespaces", "sandbox": "process"}}

SANDBOX = "process sandbox (namespaces)"
"""Where these attacks run (bench/integrity_attacks.py prints it; a parameter naming
another sandbox, such as `policed`, says so in the test's id)."""
ATTACK_CLASS = "names and text that reach a terminal"

pytestmark = pytest.mark.skipif(
    namespaces_unavailable() is not None,
    reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
)

HOSTILE = [
    "new\nline",
    "\x1b]0;pwned\x07",  # OSC: sets the terminal's title
    "\x1b[2J",  # clears the screen
    "car\rriage",
    "c0 " + "".join(chr(c) for c in range(1, 32) if chr(c) not in "\n\r"),
    "del\x7f",
    "csi\u009b31m",  # C1 CSI: red text on terminals that take 8-bit controls
    "\u202egnp.exe",  # shows as exe.png
    "iso\u2066late",
    "[bold red]x",  # markup (a file name has no '/', so no closing tag)
    "[link=https:evil.example]click",
    "back\\slash",
]
MARKUP = ("[bold red]x[/]", "[link=https://evil.example]click[/link]")

NAMER = """
import json, os
names = json.loads(NAMES)
os.makedirs("out", exist_ok=True)
for folder in FOLDERS:
    for name in names:
        with open(os.path.join(folder, name), "w") as f:
            f.write("x\\n")
    os.makedirs(os.path.join(folder, "dir\\x1b[2J"), exist_ok=True)
    with open(os.path.join(folder, "dir\\x1b[2J", "in\\u202eside"), "w") as f:
        f.write("x\\n")
    with open(os.path.join(folder.encode(), b"bad\\xffutf8"), "w") as f:  # not UTF-8
        f.write("x\\n")
    with open(os.path.join(folder, "\\x1b" * 60), "w") as f:  # 240 characters escaped
        f.write("x\\n")
with open("keys.json", "w") as f:
    json.dump(dict({name: 0.5 for name in names}, reward=1), f)
open("done.txt", "w").close()
"""

# A naive verifier: it passes on the keys the subject's program wrote.
VERIFIER = (
    "#!/bin/sh\n"
    'if [ -f keys.json ]; then cp keys.json "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.json"; '
    'else echo 1 > "$MAKA_EVAL_VERIFIER_LOGS_DIR/reward.txt"; fi\n'
)


def python_subject(subject_id: str, script: str, **config) -> dict:
    return {
        "id": subject_id,
        "kind": "external",
        "config": {"command": "python3", "args": ["-c", script], **config},
    }


def namer(subject_id: str = "namer", folders: tuple[str, ...] = ("/logs/agent",)) -> dict:
    """A subject that names files in `folders` (a record lists some 25 artifacts at
    most: one folder a subject)."""
    names = f"NAMES = {json.dumps(json.dumps(HOSTILE))}\nFOLDERS = {folders!r}\n"
    return python_subject(subject_id, names + NAMER)


def stored_paths(folder: Path) -> list[str]:
    return [
        os.path.relpath(os.path.join(root, name), folder)
        for root, dirs, files in os.walk(folder)
        for name in dirs + files
    ]


def test_hostile_file_names_are_stored_escaped(setup):
    s = setup(
        spec(
            subjects=[namer("agent", ("/logs/agent",)), namer("collected", ("out",))],
            executor=ISOLATED,
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        ),
        {"t1": {"toml": 'artifacts = ["out"]\n', "test_sh": VERIFIER}},
    )
    s.run()
    run = read_run(s.run_dir)
    for subject_id, prefix in (("agent", "agent"), ("collected", "artifacts/out")):
        (record,) = run.attempts(f"t1::1::{subject_id}")
        result = record.result
        assert record.status is S.COMPLETED, (result.reason, result.notes)
        assert result.artifacts_omitted == 0
        names = {a.name for a in result.artifacts}
        expected = {f"{prefix}/{escaped(name)}" for name in HOSTILE}
        expected |= {f"{prefix}/dir\\x1b[2J/in\\u202eside", f"{prefix}/bad\\udcffutf8"}
        assert expected <= names, sorted(expected - names)
        # What the issue names, spelled out: visible and reversible.
        for shown in ("\\x1b]0;pwned\\x07", "new\\nline", "csi\\x9b31m", "\\u202egnp.exe"):
            assert f"{prefix}/{shown}" in names
        assert f"{prefix}/back\\\\slash" in names
        for name in names:
            assert not any(unsafe(c) for c in name), repr(name)
        assert {unescaped(n) for n in names} >= {f"{prefix}/{n}" for n in HOSTILE}
        # The stored files are at their escaped names: nothing in the run folder is raw.
        folder = artifact_path(s.run_dir, record, "x").parent
        for path in stored_paths(folder):
            assert not any(unsafe(c) for c in path), repr(path)
        assert artifact_path(s.run_dir, record, f"{prefix}/\\x1b[2J").read_text() == "x\n"
        # A name a record cannot hold is refused, and a note says so.
        assert not any(n.endswith("\\x1b" * 10) for n in names)
        assert any(
            "1 file(s) not stored: their names, escaped, are too long" in n for n in result.notes
        ), result.notes
        # The reward.json keys a subject fed its verifier are recorded escaped.
        assert result.metrics["\\x1b]0;pwned\\x07"] == 0.5 and result.metrics["reward"] == 1.0
        assert result.metrics["[bold red]x"] == 0.5
        for key in result.metrics:
            assert not any(unsafe(c) for c in key), repr(key)


def maka_eval(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "maka_eval.cli.main", *args],
        capture_output=True,
        env=env,
        timeout=600,
        check=False,
    )


def assert_printed_safely(what: str, output: bytes, *, literal: tuple[str, ...] = ()) -> str:
    """No raw control, format or separator character (other than a line break) in
    `output`, and every `literal` printed as it is (not read as markup)."""
    text = output.decode("utf-8")  # strict: no byte a terminal would take as C1
    raw = sorted({repr(c) for c in text if c != "\n" and unsafe(c)})
    assert not raw, f"{what} printed raw {', '.join(raw)}:\n{text}"
    joined = "".join(text.split())  # a table may wrap a long note over lines
    for piece in literal:
        assert "".join(piece.split()) in joined, f"{what} did not print {piece!r}:\n{text}"
    return joined


HEALTHCHECK = (
    "[environment.healthcheck]\n"
    "command = '''printf '\\033]0;pwned\\007\\033[2J\\r[bold red]x[/] \\302\\233"
    "\\342\\200\\256 [link=https://evil.example]click[/link]\\n'; exit 1'''\n"
    "interval_sec = 0.01\nretries = 1\n"
)
FRAMER = """
import json, os
frame = {"protocol": "maka.eval.result.v1", "[bold red]x[/]\\x1b]0;pwned\\x07": 1}
with open(os.environ["MAKA_EVAL_RESULT_FILE"], "w") as f:
    json.dump(frame, f)
"""
SCORER = """
import json
with open("keys.json", "w") as f:
    json.dump({"\\x1b[2J": 1, "\\u202eyek": 0, "[bold red]x[/]": 1}, f)
"""


def test_subject_text_never_reaches_the_terminal_raw(tmp_path):
    make_task(tmp_path / "tasks", "plain", test_sh=VERIFIER)
    make_task(tmp_path / "tasks", "sick", test_sh=VERIFIER, toml=HEALTHCHECK)
    doc = spec(
        subjects=[
            python_subject("framer", FRAMER, resultContract="protocol-v1"),
            python_subject("scorer", SCORER),
            namer(),
        ],
        tasks=[{"id": "plain"}, {"id": "sick"}],
        executor=ISOLATED,
        execution={"maxConcurrentTaskGroups": 2, "maxInfraRetries": 0},
    )
    experiment = write_experiment(tmp_path, doc)
    run_dir = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "400"}

    ran = maka_eval("run", str(experiment), "--out", str(run_dir), env=env)
    assert ran.returncode == 0, ran.stderr.decode() + ran.stdout.decode()
    records = read_run(run_dir)
    reasons = {
        cell: records.attempts(cell)[-1].result.reason or ""
        for cell in ("sick::1::namer", "plain::1::framer", "plain::1::scorer")
    }
    assert "never became healthy" in reasons["sick::1::namer"], reasons
    assert "the result frame is malformed" in reasons["plain::1::framer"], reasons
    assert "reward.json has no 'reward' key" in reasons["plain::1::scorer"], reasons
    for reason in reasons.values():  # the record holds them printable too
        assert not any(unsafe(c) for c in reason), repr(reason)
    # The progress lines quote those reasons.
    assert_printed_safely("run", ran.stdout + ran.stderr, literal=MARKUP)

    status = maka_eval("status", str(run_dir), env=env)
    assert status.returncode == 0, status.stderr.decode()
    shown = assert_printed_safely("status", status.stdout + status.stderr, literal=MARKUP[:1])
    assert "\\x1b]0;pwned\\x07" in shown  # visibly escaped
    for fmt in ("table", "json", "csv"):
        results = maka_eval("results", str(run_dir), "--format", fmt, env=env)
        assert results.returncode == 0, results.stderr.decode()
        assert_printed_safely(f"results --format {fmt}", results.stdout + results.stderr)
    report = maka_eval("report", str(run_dir), "--out", str(tmp_path / "report"), env=env)
    assert report.returncode == 0, report.stderr.decode()
    assert_printed_safely("report", report.stdout + report.stderr)
    for name in ("report.html", "cells.csv", "summary.json"):
        page = (tmp_path / "report" / name).read_bytes()
        assert_printed_safely(name, page.replace(b"\r\n", b"\n"))


RAW = "\x1b]0;pwned\x07\x1b[2J\rcsi\u009b31m \u202egnp.exe [bold red]x[/] [link=https://e.example]y"


def test_a_raw_reason_in_an_older_record_is_escaped_when_shown():
    """A record written before reasons were stored printable (or by another relay: a
    cluster's records come from the bundle in each Pod) may hold a subject's raw text;
    `status`, `results` and `run`'s progress escape it when they show it."""
    from dataclasses import replace

    from rich.console import Console

    from maka_eval.analysis.summary import summarize_source
    from maka_eval.cli.progress import RunProgress
    from maka_eval.cli.render import results_table, status_view
    from maka_eval.local.events import AttemptFinished, AttemptStarted
    from tests.analysis.records import TWO_SUBJECTS, FakeSource, attempt
    from tests.cli.test_progress import started

    failed = attempt("t1::1::x", 1, S.INFRA_FAILED)
    failed = replace(failed, result=replace(failed.result, reason=RAW, notes=(RAW,)))
    source = FakeSource(
        spec(subjects=TWO_SUBJECTS), [failed, attempt("t1::1::y", 1, S.COMPLETED, 1.0)]
    )
    summary = summarize_source(source)
    console = Console(record=True, width=400, force_terminal=False, color_system=None)
    console.print(status_view(summary))
    console.print(results_table(summary))
    with RunProgress(console) as progress:
        progress(started(2))
        progress(AttemptStarted(failed.cell_id, failed.subject_id, 1))
        progress(AttemptFinished(failed, will_retry=False))
    shown = assert_printed_safely(
        "status/results/progress",
        console.export_text().encode(),
        literal=("[bold red]x[/]", "[link=https://e.example]y"),
    )
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rcsi\\x9b31m\\u202egnp.exe" in shown
