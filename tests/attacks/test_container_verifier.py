"""A root subject in its container goes after the verifier's own start-up, for real on Podman.

The verifier runs after the subject in the root file system the subject just modified.
Each subject here leaves the task undone (the answer is not 42) and changes what the
verifier runs instead: its shell, its interpreter (replaced, or shadowed earlier on PATH),
the loader and libraries, Python's start-up (sitecustomize, .pth, usercustomize, a
compiled module), or the tools of the sandbox's own wrapper (sha256sum, tar, chroot,
setpriv, sh); one does it from a process it leaves running, once the verifier started.

Each such attempt must be the subject's failure with score 0 and source `tampering`, its
reason naming the file, and the evidence artifact listing it. The code before the
verifier's toolbox and the change list gave every one of them reward 1 (or, for a broken
libc, an infrastructure failure). Attacks that leave no file changed (a compiled module
the verifier's Python no longer reads; a process that became the verifier's user) must
gain nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from maka_eval.engine.status import AttemptStatus, StatusSource
from maka_eval.store.run_store import artifact_path
from tests.sandbox.test_container import PYTHON_IMAGE, Bench, records, sh

SANDBOX = "container sandbox (Podman)"
"""Where these attacks run (bench/integrity_attacks.py prints it)."""
ATTACK_CLASS = "the verifier's tools and start-up changed"

pytestmark = pytest.mark.slow

S = AttemptStatus
EVIDENCE = "evidence/container-changes.txt"
TOML = f"""
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 60
env = {{ VERIFIER_DELAY = "__DELAY__" }}
[environment]
docker_image = "{PYTHON_IMAGE}"
workdir = "/app"
network_mode = "no-network"
"""
# The real check: python3 reads the answer. The delay lets a process the subject left
# act while the verifier runs.
TEST_SH = """#!/bin/bash
sleep "$VERIFIER_DELAY"
if python3 -c 'import json, sys; sys.exit(open("/app/answer.txt").read().strip() != "42")'
then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt
fi
"""
SOLVE_SH = "#!/bin/sh\necho 42 > /app/answer.txt\n"

# A library whose constructor ends the verifier's python3 with success, before it checks.
EVIL_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    if (getenv("MAKA_EVAL_VERIFIER_LOGS_DIR") && strstr(program_invocation_short_name, "python"))
        _exit(0);
}
"""
PY_EXIT = 'import os\\nif os.environ.get("MAKA_EVAL_VERIFIER_LOGS_DIR"): os._exit(0)\\n'
FAKE_OK = "printf '#!/bin/sh\\nexit 0\\n'"
REWARD_TAR = 'd=$(mktemp -d); echo 1 > $d/reward.txt; /usr/bin/tar -C $d -cf "$out" reward.txt'
# The wrapper's tools, as the old wrapper called them (PATH: /usr/local/* comes first).
FAKE_SHA256SUM = (
    "#!/bin/sh\n"
    "for a; do out=$a; done\ncase $out in */verifier.tar) " + REWARD_TAR + " ;; esac\n"
    'exec /usr/bin/sha256sum "$@"\n'
)
FAKE_TAR = (
    "#!/bin/sh\n"
    "for a; do case $a in */verifier.tar) out=$a ;; esac; done\n"
    'case " $* " in *" -cf "*) [ -z "$out" ] || { ' + REWARD_TAR + "; exit 0; } ;; esac\n"
    'exec /usr/bin/tar "$@"\n'
)
FAKE_CHROOT = '#!/bin/sh\necho 1 > "$1/logs/verifier/reward.txt"\n'
FAKE_SETPRIV = "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"
# sh itself: the wrapper's script runs with a chroot of the subject's making.
FAKE_SH = (
    "#!/usr/bin/dash\n"
    'if [ "$1" = -c ] && [ "$3" = maka-verifier ]; then\n'
    '  script="chroot() { echo 1 > \\"\\$1/logs/verifier/reward.txt\\"; }\n$2"\n'
    '  shift 2; exec /usr/bin/dash -c "$script" "$@"\n'
    "fi\n"
    'exec /usr/bin/dash "$@"\n'
)
# And the toolbox, which it cannot touch (each of these fails: read-only, a mount point).
AT_THE_TOOLBOX = (
    "rm -rf /.maka-tools; mv /.maka-tools /tools.old; cp /tmp/f /.maka-tools/bin/busybox;"
    "cp /tmp/f /.maka-tools/bin/bash; umount /.maka-tools; mount -o remount,rw /.maka-tools;"
    "true"
)


def install(path: str, text: str) -> str:
    """Shell that puts `text` at `path`, executable, replacing what is there."""
    quoted = text.replace("'", "'\\''")
    return f"printf '%s' '{quoted}' > /tmp/f; chmod 755 /tmp/f; rm -f {path}; cp /tmp/f {path};"


ATTACKS: list[tuple[str, str, str, str]] = [
    # (name, the subject's script, the file the reason names, its evidence line)
    (
        "bash replaced",
        install("/usr/bin/bash", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"),
        "/usr/bin/bash",
        "! C /usr/bin/bash",
    ),
    (
        "python3 replaced",
        f"{FAKE_OK} > /tmp/p; rm /usr/bin/python3.11; cp /tmp/p /usr/bin/python3.11;"
        "chmod 755 /usr/bin/python3.11",
        "/usr/bin/python3.11",
        "! C /usr/bin/python3.11",
    ),
    (
        "python3 shadowed",
        f"{FAKE_OK} > /usr/local/bin/python3; chmod 755 /usr/local/bin/python3",
        "/usr/local/bin/python3 (a shell or interpreter on PATH: it shadows /usr/bin/python3)",
        "! A /usr/local/bin/python3",
    ),
    (
        "ld.so.preload",
        "cp /app/evil.so /usr/local/lib/libevil.so; echo /usr/local/lib/libevil.so "
        "> /etc/ld.so.preload",
        "/etc/ld.so.preload",
        "! A /etc/ld.so.preload",
    ),
    (
        "sitecustomize",
        f"printf '{PY_EXIT}' >> /etc/python3.11/sitecustomize.py",
        "/etc/python3.11/sitecustomize.py",
        "! C /etc/python3.11/sitecustomize.py",
    ),
    (
        ".pth file",
        "mkdir -p /usr/local/lib/python3.11/dist-packages;"
        "echo 'import os; os.environ.get(\"MAKA_EVAL_VERIFIER_LOGS_DIR\") and os._exit(0)'"
        " > /usr/local/lib/python3.11/dist-packages/zz.pth",
        "/usr/local/lib/python3.11/dist-packages/zz.pth",
        "! A /usr/local/lib/python3.11/dist-packages/zz.pth",
    ),
    (
        "usercustomize",
        "mkdir -p /root/.local/lib/python3.11/site-packages;"
        f"printf '{PY_EXIT}' > /root/.local/lib/python3.11/site-packages/usercustomize.py",
        "/root/.local/lib/python3.11/site-packages/usercustomize.py",
        "! A /root/.local/lib/python3.11/site-packages/usercustomize.py",
    ),
    (
        "a python .so",
        "cp /app/evil.so /usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
        "/usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
        "! C /usr/lib/python3.11/lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
    ),
    (
        "libc replaced",
        "L=/usr/lib/x86_64-linux-gnu; cp $L/libz.so.1 $L/.x && mv $L/.x $L/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6 (a shared library)",
        "! C /usr/lib/x86_64-linux-gnu/libc.so.6",
    ),
    (
        "ldconfig makes a copy shadow libz",
        "cp /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/local/lib/libshadow.so && ldconfig",
        "/etc/ld.so.cache (the dynamic loader's cache: it sends libz.so.1 to /usr/local/lib/",
        "! C /etc/ld.so.cache",
    ),
    (
        # Its strings share tails: libz.so.1 is the end of the path that stands for it.
        "ld.so.cache rewritten by hand",
        "python3 - <<'EOF'\n"
        "import re, shutil\n"
        "data = open('/etc/ld.so.cache', 'rb').read()\n"
        "old = re.search(rb'(/[^\\0]*/libz\\.so\\.1)\\0', data).group(1)\n"
        "new = b'/opt/' + b'x' * (len(old) - 15) + b'/libz.so.1'\n"
        "import os; os.makedirs(os.path.dirname(new.decode()), exist_ok=True)\n"
        "shutil.copy(old.decode(), new.decode())\n"
        "open('/etc/ld.so.cache', 'wb').write(data.replace(old + b'\\0', new + b'\\0'))\n"
        "EOF",
        "it sends libz.so.1 to /opt/xxx",
        "! C /etc/ld.so.cache",
    ),
    (
        "sha256sum shadowed",
        install("/usr/local/bin/sha256sum", FAKE_SHA256SUM),
        "/usr/local/bin/sha256sum",
        "! A /usr/local/bin/sha256sum",
    ),
    (
        "tar shadowed",
        install("/usr/local/bin/tar", FAKE_TAR),
        "/usr/local/bin/tar",
        "! A /usr/local/bin/tar",
    ),
    (
        "chroot shadowed",
        install("/usr/local/sbin/chroot", FAKE_CHROOT),
        "/usr/local/sbin/chroot",
        "! A /usr/local/sbin/chroot",
    ),
    (
        "setpriv shadowed",
        install("/usr/local/bin/setpriv", FAKE_SETPRIV),
        "/usr/local/bin/setpriv",
        "! A /usr/local/bin/setpriv",
    ),
    (
        "sh replaced, and the toolbox tried",
        install("/usr/bin/sh", FAKE_SH) + AT_THE_TOOLBOX,
        "/usr/bin/sh",
        "! C /usr/bin/sh",
    ),
]


def evil_library(folder: Path) -> bytes:
    source = folder / "evil.c"
    source.write_text(EVIL_C)
    target = folder / "evil.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None, "a C compiler is needed (apt-get install gcc: the toolbox needs it)"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(target), str(source)], check=True)
    return target.read_bytes()


def attack_bench(tmp_path: Path, engine: str, subjects: list[dict[str, Any]], delay: str = "0"):
    bench = Bench(tmp_path, engine, subjects)
    bench.task(
        "answer",
        TOML.replace("__DELAY__", delay),
        TEST_SH,
        {"README.txt": "Write the answer to answer.txt.\n"},
    )
    (bench.tasks / "answer" / "environment" / "evil.so").write_bytes(evil_library(tmp_path))
    solve = bench.tasks / "answer" / "solution" / "solve.sh"
    solve.parent.mkdir()
    solve.write_text(SOLVE_SH)
    solve.chmod(0o755)
    return bench


def evidence(run_dir: Path, record: Any) -> str:
    names = {a.name for a in record.result.artifacts}
    assert EVIDENCE in names, record.result
    return artifact_path(run_dir, record, EVIDENCE).read_text()


def assert_tampered(run_dir: Path, record: Any, named: str, line: str) -> None:
    result = record.result
    assert (record.status, result.score, result.status_source) == (
        S.SUBJECT_FAILED,
        0.0,
        StatusSource.TAMPERING,
    ), result
    assert named in (result.reason or ""), result.reason
    listed = evidence(run_dir, record)
    assert any(row == line or row.startswith(line + "  ") for row in listed.splitlines()), listed


def test_the_oracle_scores_1_and_leaves_no_critical_change(container_engine, tmp_path):
    bench = attack_bench(tmp_path, container_engine, [{"id": "oracle", "kind": "oracle"}])
    _, run_dir = bench.run()
    oracle = records(run_dir)["answer::1::oracle"]
    assert (oracle.status, oracle.result.score) == (S.COMPLETED, 1.0), oracle.result
    assert oracle.result.status_source is not StatusSource.TAMPERING


@pytest.mark.parametrize(("name", "script", "named", "line"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_a_subject_that_changes_the_verifiers_start_up_fails(
    container_engine, tmp_path, name, script, named, line
):
    bench = attack_bench(tmp_path, container_engine, [sh("cheat", script)])
    _, run_dir = bench.run()
    assert_tampered(run_dir, records(run_dir)["answer::1::cheat"], named, line)


def test_a_process_left_running_that_swaps_python3_while_the_verifier_runs(
    container_engine, tmp_path
):
    # It waits for test.sh to start (after every check made before the verifier), then
    # replaces python3; test.sh calls python3 two seconds later.
    swap = (
        "( while ! grep -qs 'tests/tes[t]' /proc/[0-9]*/cmdline; do sleep 0.02; done;"
        f"{FAKE_OK} > /tmp/p; rm /usr/bin/python3.11; cp /tmp/p /usr/bin/python3.11;"
        "chmod 755 /usr/bin/python3.11 ) >/dev/null 2>&1 &"
    )
    bench = attack_bench(tmp_path, container_engine, [sh("lurker", swap)], delay="2")
    _, run_dir = bench.run()
    record = records(run_dir)["answer::1::lurker"]
    assert_tampered(run_dir, record, "/usr/bin/python3.11", "! C /usr/bin/python3.11")
    assert (
        "changed /usr/bin/python3.11 (a shell or interpreter on PATH) while the verifier ran"
        in (record.result.reason or "")
    )


def test_a_planted_compiled_module_is_never_loaded(container_engine, tmp_path):
    # json's compiled file, rewritten with a header that matches its source: Python would
    # load it instead of the source. The verifier's Python reads its own compiled files.
    plant = (
        "python3 - <<'EOF'\n"
        "import importlib.util, marshal, os, struct\n"
        "src = '/usr/lib/python3.11/json/__init__.py'\n"
        "st = os.stat(src)\n"
        "extra = '\\nimport os as _o\\n'\n"
        "extra += 'if _o.environ.get(\"MAKA_EVAL_VERIFIER_LOGS_DIR\"): _o._exit(0)\\n'\n"
        "code = compile(open(src).read() + extra, src, 'exec')\n"
        "head = struct.pack('<III', 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)\n"
        "data = importlib.util.MAGIC_NUMBER + head + marshal.dumps(code)\n"
        "open(importlib.util.cache_from_source(src), 'wb').write(data)\n"
        "EOF"
    )
    bench = attack_bench(tmp_path, container_engine, [sh("planter", plant)])
    _, run_dir = bench.run()
    record = records(run_dir)["answer::1::planter"]
    assert (record.status, record.result.score) == (S.COMPLETED, 0.0), record.result
    pyc = "/usr/lib/python3.11/json/__pycache__/__init__.cpython-311.pyc"
    assert f"  C {pyc}" in evidence(run_dir, record).splitlines()


def test_ldconfig_after_installing_a_new_library_is_no_tampering(container_engine, tmp_path):
    # What apt-get install does for a library: a new file, and ldconfig rewrites the
    # cache (every library of the image still resolves where it did).
    source = tmp_path / "new.c"
    source.write_text("int maka_new(void) { return 42; }\n")
    library = tmp_path / "libmakanew.so.1"
    cc = shutil.which("cc") or "gcc"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libmakanew.so.1", "-o", str(library), str(source)],
        check=True,
    )
    install = "cp /app/libmakanew.so.1 /usr/local/lib/ && ldconfig && echo 42 > /app/answer.txt"
    bench = attack_bench(tmp_path, container_engine, [sh("installer", install)])
    (bench.tasks / "answer" / "environment" / library.name).write_bytes(library.read_bytes())
    _, run_dir = bench.run()
    record = records(run_dir)["answer::1::installer"]
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result
    listed = evidence(run_dir, record).splitlines()
    assert "  C /etc/ld.so.cache" in listed and "  A /usr/local/lib/libmakanew.so.1" in listed


CHECKER_DOCKERFILE = """FROM debian:bookworm-slim
RUN useradd --uid 1001 --create-home checker
WORKDIR /app
"""
CHECKER_TOML = """
[agent]
timeout_sec = 60
[verifier]
timeout_sec = 60
user = "checker"
[environment]
build_timeout_sec = 300
allow_internet = false
"""
CHECKER_TEST = """#!/bin/bash
sleep 2
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


def test_a_process_that_becomes_the_verifiers_user_cannot_reach_it(container_engine, tmp_path):
    # The subject is root: what it leaves behind turns into the verifier's user and
    # writes a reward into every process's root it can open (the verifier's private
    # /logs/verifier, seen through /proc/PID/root), or traces it.
    lurker = sh(
        "lurker",
        "( setpriv --reuid=1001 --regid=1001 --clear-groups sh -c 'while true; do"
        ' for p in /proc/[0-9]*; do echo "{\\"reward\\": 1}" > $p/root/logs/verifier/reward.json;'
        " done 2>/dev/null; sleep 0.02; done' ) >/dev/null 2>&1 & sleep 0.2",
    )
    bench = Bench(tmp_path, container_engine, [lurker])
    bench.task("checked", CHECKER_TOML, CHECKER_TEST, {"Dockerfile": CHECKER_DOCKERFILE})
    _, run_dir = bench.run()
    record = records(run_dir)["checked::1::lurker"]
    assert (record.status, record.result.score) == (S.COMPLETED, 0.0), record.result
    assert "verifier/reward.json" not in {a.name for a in record.result.artifacts}


PTH_SOLVE = """#!/bin/sh
# What `pip install` does for a package that ships a .pth (setuptools, editable installs):
# a folder of modules, and a .pth that puts it on Python's path.
site=/usr/local/lib/python3.11/dist-packages
mkdir -p $site/vendor && echo 'ANSWER = 42' > $site/vendor/answermod.py
echo $site/vendor > $site/vendor.pth
python3 -c 'import answermod; print(answermod.ANSWER)' > /app/answer.txt
"""


def test_an_oracle_that_installs_a_pth_file_is_flagged_and_says_so(container_engine, tmp_path):
    # A legitimate solution may change what the verifier's start-up depends on: it shows
    # up in the oracle run, with the file named, and is not scored.
    bench = attack_bench(tmp_path, container_engine, [{"id": "oracle", "kind": "oracle"}])
    (bench.tasks / "answer" / "solution" / "solve.sh").write_text(PTH_SOLVE)
    _, run_dir = bench.run()
    record = records(run_dir)["answer::1::oracle"]
    assert_tampered(
        run_dir,
        record,
        "added /usr/local/lib/python3.11/dist-packages/vendor.pth (a .pth file",
        "! A /usr/local/lib/python3.11/dist-packages/vendor.pth",
    )
    assert (
        "  A /usr/local/lib/python3.11/dist-packages/vendor/answermod.py"
        in evidence(run_dir, record).splitlines()
    )


# The notes task's verifiers read each line with `sed -n Np notes.txt`: a sed of the
# subject's making prints what they want.
FAKE_SED = (
    '#!/bin/sh\ncase "$2" in 1p) echo alpha ;; 2p) echo "$EXPECTED_SEED" ;; 3p) echo done ;; esac\n'
)
STEPPER = """
case "$(cat "$MAKA_EVAL_INSTRUCTION_FILE")" in
  *"STEP create"*) echo alpha > notes.txt ;;
  *"STEP append"*) SED ;;
esac
""".replace("SED", install("/usr/local/bin/sed", FAKE_SED))


def test_a_later_steps_subject_that_changes_the_verifiers_tools_fails(container_engine, tmp_path):
    # The first step is done honestly; the second step's subject shadows sed and does
    # nothing more. Its verifier does not run, nor does the third step.
    from tests.local.test_steps import external
    from tests.sandbox.test_steps_container import container_bench

    bench = container_bench(tmp_path, container_engine)
    bench.task("notes")
    found = bench.run([external("stepper", STEPPER)])
    record = found["notes::1::stepper"]
    result = record.result
    assert (record.status, result.score, result.status_source) == (
        S.SUBJECT_FAILED,
        0.0,
        StatusSource.TAMPERING,
    ), result
    assert "added /usr/local/bin/sed (a command on PATH: it shadows /usr/bin/sed)" in (
        result.reason or ""
    )
    assert result.metrics.get("step.create.reward") == 1.0
    assert "step.finish.reward" not in result.metrics
    assert any("the remaining steps did not run" in n for n in result.notes), result


SECRET = "sk-verifier-env-3c9d1e"
ENV_TEST = """#!/bin/bash
# The verifier's own HOME and TMPDIR (writable, not /root, not /tmp), Python settings, no
# credential in its environment nor in the container's PID 1.
ok=1
[ "$HOME" = /.maka-tools/private/home ] && touch "$HOME/mine" || ok=0
[ "$TMPDIR" = /.maka-tools/private/tmp ] && touch "$TMPDIR/mine" || ok=0
[ "$PYTHONSAFEPATH$PYTHONNOUSERSITE" = 11 ] || ok=0
[ "$PYTHONPYCACHEPREFIX" = /.maka-tools/private/pycache ] || ok=0
[ -z "$(ls -A "$HOME")" ] || [ "$(ls -A "$HOME")" = mine ] || ok=0
! env | grep -q -e SECRET_VALUE -e MAKA_EVAL_V_ -e MAKA_EVAL_EXEC_MARKER || ok=0
! tr '\\0' '\\n' < /proc/1/environ | grep -q SECRET_VALUE || ok=0
python3 -c 'import sys, site; sys.exit(site.ENABLE_USER_SITE is not False)' || ok=0
echo $ok > /logs/verifier/reward.txt
""".replace("SECRET_VALUE", SECRET)


def test_the_verifiers_environment_is_its_own(container_engine, tmp_path):
    import os

    from maka_eval.executors.load import load_experiment_file
    from maka_eval.local.executor import LocalRun
    from maka_eval.spec.task_directory import load_tasks

    # The subject holds a credential and leaves configuration in root's home and /tmp.
    holder = sh(
        "holder",
        'echo "$API_KEY" > /tmp/key; mkdir -p /root/.config/pip;'
        "printf '[global]\\nindex-url = http://127.0.0.1:1/\\n' > /root/.config/pip/pip.conf",
    )
    holder["credentials"] = ["API_KEY"]
    bench = Bench(tmp_path, container_engine, [holder])
    bench.task("env", TOML.replace("__DELAY__", "0"), ENV_TEST, {"README.txt": "x\n"})
    loaded = load_experiment_file(bench.write())
    tasks = load_tasks(loaded.experiment, loaded.base_dir)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "MAKA_EVAL_WORK_DIR": os.environ["MAKA_EVAL_WORK_DIR"],
        "DOCKER_HOST": container_engine,
        "API_KEY": SECRET,
    }
    run_dir = tmp_path / "run"
    LocalRun(loaded, tasks, run_dir, host_env=env).run()
    record = records(run_dir)["env::1::holder"]
    assert (record.status, record.result.score) == (S.COMPLETED, 1.0), record.result
