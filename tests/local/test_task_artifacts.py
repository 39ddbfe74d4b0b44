"""task.toml `artifacts` (Harbor 0.26), collected for real from the process sandbox once
the subject is done and before the verifier: files and folders, relative sources in the
workdir, destinations, `exclude`, /logs/agent; links are never followed (a subject that
plants one at an artifact's path gets nothing out of this machine), and what cannot be
collected is noted, never failing the attempt. tests/sandbox/test_container.py collects
from a container.
"""

from __future__ import annotations

import pytest

from maka_eval.engine.status import AttemptStatus
from maka_eval.sandbox.process import namespaces_unavailable
from maka_eval.spec.task_directory import TaskArtifact
from maka_eval.store.run_store import artifact_path, read_run
from tests.helpers import REWARD_ONE, loaded_task, spec

S = AttemptStatus
MAKER = r"""
mkdir -p out/sub /logs/agent/trace
echo one > out/a.txt; echo two > out/sub/b.txt; echo junk > out/sub/c.tmp
ln -s /etc/passwd out/passwd
ln -s /etc/hostname report-link.txt
echo report > report.txt
echo step > /logs/agent/trace/t.log; echo x > /logs/agent/trace/t.tmp
touch done.txt
"""
TOML = """artifacts = [
  "out",
  { source = "report.txt", destination = "r/report.txt" },
  { source = "/logs/agent/trace", exclude = ["*.tmp"] },
  "report-link.txt",
  "/etc",
  "missing",
]
"""


needs_namespaces = pytest.mark.skipif(
    namespaces_unavailable() is not None,
    reason=f"the namespace sandbox cannot run here: {namespaces_unavailable()}",
)


@needs_namespaces
def test_artifacts_are_collected_before_the_verifier(setup):
    subject = {
        "id": "maker",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", MAKER]},
    }
    # The verifier removes what the subject made: collection happened before it ran.
    test_sh = "#!/bin/sh\nrm -rf out report.txt\necho 1 > /logs/verifier/reward.txt\n"
    s = setup(
        spec(
            subjects=[subject],
            executor={"kind": "local", "config": {"isolation": "namespaces", "sandbox": "process"}},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        ),
        {"t1": {"toml": TOML, "test_sh": test_sh}},
    )
    s.run()
    (record,) = read_run(s.run_dir).attempts("t1::1::maker")
    assert record.status is S.COMPLETED, record.result.reason
    names = {a.name for a in record.result.artifacts}
    collected = sorted(n for n in names if n.startswith("artifacts/"))
    assert collected == [
        "artifacts/logs/agent/trace/t.log",  # its exclude dropped t.tmp
        "artifacts/out/a.txt",  # a relative source is in the workdir; named as written
        "artifacts/out/sub/b.txt",
        "artifacts/out/sub/c.tmp",  # not excluded: that pattern is the trace's
        "artifacts/r/report.txt",
    ], collected
    text = artifact_path(s.run_dir, record, "artifacts/r/report.txt").read_text()
    assert text == "report\n"
    notes = " | ".join(record.result.notes)
    assert "artifact report-link.txt: not collected (it is a link" in notes
    assert "artifact missing: not collected (it does not exist)" in notes
    assert "artifact /etc: not collected (the process sandbox collects artifacts from" in notes
    # The planted link into this machine's files came back as nothing at all.
    assert not any("passwd" in n or "hostname" in n for n in names)


def test_without_isolation_artifacts_come_from_the_workdir(setup):
    script = "mkdir out; echo one > out/a.txt; touch done.txt"
    subject = {"id": "s", "kind": "external", "config": {"command": "sh", "args": ["-c", script]}}
    s = setup(
        spec(
            subjects=[subject],
            executor={"kind": "local", "config": {"isolation": "none", "sandbox": "process"}},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        ),
        {"t1": {"toml": 'artifacts = ["out", "/etc/hostname"]\n'}},
    )
    s.run()
    (record,) = read_run(s.run_dir).attempts("t1::1::s")
    assert record.status is S.COMPLETED, record.result.reason
    assert artifact_path(s.run_dir, record, "artifacts/out/a.txt").read_text() == "one\n"
    # A path of this machine is not the environment's: never collected from the host.
    assert any("artifact /etc/hostname: not collected" in n for n in record.result.notes)


def test_bad_artifact_entries_are_named_with_the_fix(tmp_path):
    task, problems = loaded_task(
        tmp_path,
        (
            'artifacts = ["ok", { source = "../up" }, { source = "x", destination = "/abs" }, '
            '{ source = "y", service = "db" }, { source = "z", exclude = "*.tmp" }, 7]\n'
        ),
    )
    text = "\n".join(map(str, problems))
    assert task is None
    assert "artifacts[1]: source must not contain '..'" in text
    assert "artifacts[2]: destination must be a relative path without '..'" in text
    assert "artifacts[3]: service 'db': artifacts of other compose services" in text
    assert "artifacts[4]: exclude must be a list of patterns" in text
    assert "artifacts[5]: must be a path or a table, got 7" in text


def test_artifacts_are_read_as_harbor_gives_them(tmp_path):
    task, problems = loaded_task(
        tmp_path,
        (
            'artifacts = ["/app/out", { source = "log.txt", destination = "logs/log.txt", '
            'exclude = ["*.pyc"], service = "main" }]\n'
        ),
    )
    assert not problems and task is not None, problems
    assert task.artifacts == (
        TaskArtifact("/app/out"),
        TaskArtifact("log.txt", "logs/log.txt", ("*.pyc",)),
    )
    assert not task.warnings


def test_a_folder_of_many_files_yields_a_bounded_list(setup):
    # A record lists every artifact: a subject that fills a collected folder with files
    # gets the first MAX_TASK_ARTIFACT_FILES of them kept, and a note.
    from maka_eval.relay.attempt import MAX_TASK_ARTIFACT_FILES

    last = 1000 + MAX_TASK_ARTIFACT_FILES + 40
    script = f"mkdir out; for i in $(seq 1000 {last}); do echo $i > out/$i; done; touch done.txt"
    subject = {"id": "s", "kind": "external", "config": {"command": "sh", "args": ["-c", script]}}
    s = setup(
        spec(
            subjects=[subject],
            executor={"kind": "local", "config": {"isolation": "none", "sandbox": "process"}},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0},
        ),
        {"t1": {"toml": 'artifacts = ["out"]\n', "test_sh": REWARD_ONE}},
    )
    s.run()
    (record,) = read_run(s.run_dir).attempts("t1::1::s")
    assert record.status is S.COMPLETED, record.result.reason
    kept = sorted(a.name for a in record.result.artifacts if a.name.startswith("artifacts/"))
    # The record itself lists what fits its size budget and counts the rest.
    assert len(kept) + record.result.artifacts_omitted == MAX_TASK_ARTIFACT_FILES
    assert kept[0] == "artifacts/out/1000"
    assert f"only the first {MAX_TASK_ARTIFACT_FILES} files were kept" in " ".join(
        record.result.notes
    )


@needs_namespaces
def test_max_artifact_files_keeps_the_first_and_names_the_rest(setup):
    # execution.maxArtifactFiles caps the files one attempt keeps: the subject's
    # streams and the verifier's reward come first, the task's artifacts after them.
    subject = {
        "id": "maker",
        "kind": "external",
        "config": {"command": "sh", "args": ["-c", MAKER + "echo said; echo warned >&2\n"]},
    }
    s = setup(
        spec(
            subjects=[subject],
            executor={"kind": "local", "config": {"isolation": "namespaces", "sandbox": "process"}},
            execution={"maxConcurrentTaskGroups": 1, "maxInfraRetries": 0, "maxArtifactFiles": 3},
        ),
        {"t1": {"toml": TOML, "test_sh": REWARD_ONE}},
    )
    s.run()
    (record,) = read_run(s.run_dir).attempts("t1::1::maker")
    assert record.status is S.COMPLETED, record.result.reason
    names = [a.name for a in record.result.artifacts]
    assert len(names) == 3, names
    assert "verifier/reward.txt" in names
    assert not any(n.startswith("artifacts/") for n in names), names
    (note,) = [n for n in record.result.notes if "maxArtifactFiles" in n]
    # 5 task artifacts and /logs/agent's 2 files: 7 in all, each named.
    assert note.startswith("execution.maxArtifactFiles is 3: 7 artifact file(s) not kept:")
    assert note.endswith("agent/trace/t.tmp")
    assert "artifacts/r/report.txt" in note
    for name in names:
        assert artifact_path(s.run_dir, record, name).is_file()
