"""Harbor-format task directories."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from maka_eval.errors import TaskError
from maka_eval.executors.load import experiment_from_data
from maka_eval.spec.task_directory import Healthcheck, directory_digest, load_task, load_tasks
from tests.helpers import loaded_task, make_task, spec


def test_a_task_directory_is_read(tmp_path):
    make_task(
        tmp_path,
        "t1",
        files={"a.txt": "x"},
        toml='[agent]\ntimeout_sec = 12.5\n[verifier]\ntimeout_sec = 3\nenv = {K = "v"}\n'
        '[solution]\nenv = {S = "1"}\n[metadata]\nanything = "ignored"\n',
    )
    task, problems = load_task("t1", tmp_path / "t1", "tasks[0]")
    assert not problems and task is not None
    assert task.agent_timeout_sec == 12.5 and task.verifier_timeout_sec == 3.0
    assert task.verifier_env == {"K": "v"} and task.solution_env == {"S": "1"}
    assert task.environment_dir == tmp_path / "t1" / "environment"
    assert task.solution_dir == tmp_path / "t1" / "solution"
    assert task.digest.startswith("sha256:")


def test_problems_are_named_with_the_task_and_file(tmp_path):
    (tmp_path / "empty").mkdir()
    _, problems = load_task("empty", tmp_path / "empty", "tasks[3]")
    text = "\n".join(map(str, problems))
    assert "tasks[3]: " in text and "instruction.md is missing" in text
    assert "tests/test.sh is missing" in text
    make_task(tmp_path, "badtoml", toml="[agent\n")
    _, problems = load_task("badtoml", tmp_path / "badtoml", "tasks[0]")
    assert "not valid TOML" in str(problems[0])
    make_task(tmp_path, "neg", toml="[agent]\ntimeout_sec = -1\n")
    _, problems = load_task("neg", tmp_path / "neg", "tasks[0]")
    assert "timeout_sec must be a positive number" in str(problems[0])


def test_load_tasks_reports_every_task(tmp_path):
    (tmp_path / "tasks").mkdir()
    make_task(tmp_path / "tasks", "ok")
    experiment, _ = experiment_from_data(
        spec(tasks=[{"id": "ok"}, {"id": "gone"}, {"id": "x", "path": "y"}])
    )
    with pytest.raises(TaskError) as info:
        load_tasks(experiment, tmp_path)
    text = info.value.render()
    assert "tasks[1]" in text and "tasks[2]" in text and "tasks[0]" not in text
    with pytest.raises(TaskError, match=r"benchmark\.config\.path"):
        load_tasks(experiment, tmp_path / "elsewhere")


def test_digest_follows_content_and_executable_bit(tmp_path):
    task = make_task(tmp_path, "t", files={"a.txt": "1"})
    before = directory_digest(task)
    assert directory_digest(task) == before
    (task / "environment" / "a.txt").write_text("2")
    changed = directory_digest(task)
    assert changed != before
    (task / "environment" / "a.txt").chmod(0o755)
    assert directory_digest(task) != changed


def test_digest_follows_a_symlinked_tests_folder(tmp_path):
    # A verifier kept outside the task and linked in must still be part of its identity.
    task = make_task(tmp_path / "tasks", "t")
    outside = tmp_path / "shared-tests"
    (task / "tests").rename(outside)
    (task / "tests").symlink_to(outside, target_is_directory=True)
    before = directory_digest(task)
    assert directory_digest(task) == before
    (outside / "test.sh").write_text("#!/bin/sh\necho 0 > /dev/null\n")
    assert directory_digest(task) != before


def test_digest_follows_symlinked_files_by_content(tmp_path):
    task = make_task(tmp_path / "tasks", "t")
    target = tmp_path / "data.txt"
    target.write_text("1")
    (task / "environment").mkdir(exist_ok=True)
    (task / "environment" / "data.txt").symlink_to(target)
    before = directory_digest(task)
    target.write_text("2")
    assert directory_digest(task) != before


def test_digest_survives_symlink_cycles_and_special_files(tmp_path):
    task = make_task(tmp_path / "tasks", "t")
    (task / "environment").mkdir(exist_ok=True)
    (task / "environment" / "loop").symlink_to(task, target_is_directory=True)
    (task / "environment" / "self").symlink_to("self")
    (task / "environment" / "dangling").symlink_to(tmp_path / "missing")
    (task / "environment" / "zero").symlink_to("/dev/zero")
    os.mkfifo(task / "environment" / "pipe")
    first = directory_digest(task)
    assert directory_digest(task) == first


def test_digest_of_a_plain_task_is_unchanged_by_the_symlink_support(tmp_path):
    # Resuming a run compares digests: tasks without links keep their old digest.
    task = make_task(tmp_path / "tasks", "t", files={"a.txt": "1", "sub/b.txt": "2"})
    expected = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(task):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            relative = path.relative_to(task).as_posix()
            expected.update(f"{relative}\0{int(os.access(path, os.X_OK))}\0".encode())
            expected.update(path.read_bytes())
            expected.update(b"\0")
    assert directory_digest(task) == "sha256:" + expected.hexdigest()


def test_a_task_linked_out_of_the_benchmark_folder_is_refused(tmp_path):
    (tmp_path / "tasks").mkdir()
    make_task(tmp_path, "outside")
    (tmp_path / "tasks" / "t1").symlink_to(tmp_path / "outside", target_is_directory=True)
    experiment, _ = experiment_from_data(spec())
    with pytest.raises(TaskError) as info:
        load_tasks(experiment, tmp_path)
    text = info.value.render()
    assert "tasks[0].path: " in text and "outside the benchmark folder" in text


def test_two_tasks_resolving_to_one_folder_are_refused(tmp_path):
    (tmp_path / "tasks").mkdir()
    make_task(tmp_path / "tasks", "a")
    (tmp_path / "tasks" / "b").symlink_to("a", target_is_directory=True)
    experiment, _ = experiment_from_data(spec(tasks=[{"id": "a"}, {"id": "b"}]))
    with pytest.raises(TaskError) as info:
        load_tasks(experiment, tmp_path)
    assert "tasks[1].path: " in info.value.render()
    assert "same task directory as tasks[0]" in info.value.render()


def test_a_task_linked_inside_the_benchmark_folder_is_fine(tmp_path):
    (tmp_path / "tasks" / "real").mkdir(parents=True)
    make_task(tmp_path / "tasks" / "real", "t1")
    (tmp_path / "tasks" / "t1").symlink_to("real/t1", target_is_directory=True)
    experiment, _ = experiment_from_data(spec())
    assert set(load_tasks(experiment, tmp_path)) == {"t1"}


def test_a_multi_step_task_is_read_step_by_step():
    from maka_eval.spec.task_directory import load_task

    root = Path(__file__).resolve().parents[1] / "fixtures" / "steps" / "notes"
    task, problems = load_task("notes", root, "tasks[0]", host_env={"MAKA_EVAL_FIXTURE_SEED": "s"})
    assert task is not None and not problems and not task.warnings
    assert [s.name for s in task.steps] == ["create", "append", "finish"]
    create, append, finish = task.steps
    assert task.step_reward_strategy == "mean"
    assert task.instruction_file == create.instruction_file
    assert create.tests_dirs == (root / "tests", root / "steps" / "create" / "tests")
    assert finish.tests_dirs == (root / "tests",)  # the task's test.sh runs
    assert (create.min_reward, finish.min_reward, append.min_reward) == (1.0, {"reward": 1.0}, None)
    assert (create.agent_timeout_sec, append.verifier_timeout_sec) == (30.0, 20.0)
    assert append.verifier_env == {"NOTES_FILE": "notes.txt", "EXPECTED_SEED": "s"}
    assert append.setup_script == root / "steps" / "append" / "workdir" / "setup.sh"
    assert task.solution_dir == create.solution_dir == root / "steps" / "create" / "solution"


def test_bad_steps_are_named_with_the_fix(tmp_path):
    from maka_eval.spec.task_directory import load_task

    task = tmp_path / "multi"
    (task / "steps" / "one").mkdir(parents=True)
    (task / "steps" / "one" / "instruction.md").write_text("Do one.\n")
    (task / "task.toml").write_text(
        'multi_step_reward_strategy = "best"\n'
        '[[steps]]\nname = "one"\nmin_reward = "high"\nhealthcheck = { command = "true" }\n'
        '[[steps]]\nname = "two"\n[steps.agent]\ntimeout_sec = -1\n'
        '[[steps]]\nname = "ONE"\n'
        '[[steps]]\nname = "../up"\n'
    )
    definition, problems = load_task("multi", task, "tasks[0]")
    assert definition is None
    text = "\n".join(f"{p.where}: {p.message}" for p in problems)
    assert "multi_step_reward_strategy: must be one of mean, final, got 'best'" in text
    assert "[[steps]][0]: min_reward must be a number or a table of numbers, got 'high'" in text
    assert "test.sh exists; the step's verifier runs one of them" in text
    assert "steps/two/instruction.md is missing; every step needs one" in text
    assert "[[steps]][1] [agent]: timeout_sec must be a positive number, got -1" in text
    assert "[[steps]][2]: name 'ONE' is used by [[steps]][0] too" in text
    assert "[[steps]][3]: name '../up' is not a portable folder name" in text


def test_an_oracle_needs_a_solution_for_every_step(tmp_path):
    import shutil

    from maka_eval.spec.task_directory import load_task

    root = tmp_path / "notes"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "steps" / "notes", root)
    shutil.rmtree(root / "steps" / "append" / "solution")
    task, _ = load_task("notes", root, "tasks[0]", host_env={})
    assert task is not None and task.solution_dir is None
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    task, _ = load_task("notes", root, "tasks[0]", host_env={})
    assert task is not None and task.steps[1].solution_dir == root / "solution"


# -- Harbor's task.toml fields ------------------------------------------------------------
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"


def test_the_harbor_fixtures_load_without_warnings():
    for folder in sorted(FIXTURES.iterdir()):
        task, problems = load_task(folder.name, folder, "tasks[0]", host_env={})
        assert not problems and task is not None, problems
        assert task.warnings == () and task.needs_image


def test_every_field_the_container_backend_needs_is_read(tmp_path):
    make_task(
        tmp_path,
        "t",
        files={"Dockerfile": "FROM debian:bookworm-slim\n"},
        toml=(
            '[agent]\ntimeout_sec = 30\nuser = "agent"\n'
            "[verifier]\nuser = 1001\n"
            '[verifier.env]\nMODE = "${MODE:-strict}"\n'
            '[solution.env]\nTOKEN = "${TOKEN}"\n'
            "[environment]\n"
            'build_timeout_sec = 99\ncpus = 1.5\nmemory = "1G"\nstorage_mb = 2048\ngpus = 0\n'
            'workdir = "/srv/app"\nallow_internet = false\n'
            'env = { URL = "http://${HOST:-localhost}:${PORT}/x", '
            'EMPTY = "${UNSET_OR_EMPTY:-d}" }\n'
        ),
    )
    env = {"TOKEN": "t0k", "PORT": "8080", "UNSET_OR_EMPTY": ""}
    task, problems = load_task("t", tmp_path / "t", "tasks[0]", host_env=env)
    assert not problems and task is not None, problems
    assert (task.agent_user, task.verifier_user) == ("agent", "1001")
    assert task.verifier_env == {"MODE": "strict"} and task.solution_env == {"TOKEN": "t0k"}
    assert task.environment_env == {"URL": "http://localhost:8080/x", "EMPTY": "d"}
    assert (task.cpus, task.memory_mb, task.storage_mb, task.gpus) == (1.5, 1024, 2048, 0)
    assert task.build_timeout_sec == 99.0 and task.workdir == "/srv/app"
    assert task.network_mode == "no-network"  # allow_internet = false, as Harbor maps it
    assert task.image_build_file == "Dockerfile" and task.needs_image
    assert task.environment_digest == directory_digest(tmp_path / "t" / "environment")


def test_a_missing_template_variable_names_it_and_the_file(tmp_path):
    task, problems = loaded_task(tmp_path, '[environment.env]\nKEY = "${NOT_SET_ANYWHERE}"\n')
    assert task is None and len(problems) == 1
    text = str(problems[0])
    assert "NOT_SET_ANYWHERE" in text and str(tmp_path / "t" / "task.toml") in text
    assert "[environment.env]" in text and "${NOT_SET_ANYWHERE:-value}" in text


def test_unknown_and_unhonoured_fields_are_warnings_naming_the_file(tmp_path):
    task, problems = loaded_task(
        tmp_path,
        (
            'schema_version = "1.1"\ncolour = "blue"\n'
            '[task]\nname = "org/t"\n[metadata]\nanything = 1\n'
            "[agent]\ntimeout = 5\n"
            '[verifier]\nenvironment_mode = "shared"\n'
            '[environment]\nskills_dir = "skills"\nmcp_servers = []\n'
        ),
    )
    assert not problems and task is not None
    toml = str(tmp_path / "t" / "task.toml")
    assert all(w.startswith(toml + ": ") for w in task.warnings)
    text = "\n".join(task.warnings)
    assert "unknown field colour" in text and "unknown field [agent] timeout" in text
    assert "[environment] skills_dir is not honoured" in text
    assert len(task.warnings) == 3  # [task], [metadata], empty or default values: silent


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[environment]\nos = "windows"\n', "Linux tasks only"),
        ('[environment]\nworkdir = "app"\n', "workdir must be an absolute path"),
        ('[environment]\nnetwork_mode = "open"\n', "network_mode must be one of"),
        ('[environment]\nmemory = "lots"\n', 'memory must be a size such as "512M"'),
        ("[environment]\ngpus = -1\n", "gpus must be a whole number"),
        ("[environment]\nmemory_mb = 1.5\n", "memory_mb must be a positive whole number"),
        ("[agent]\nuser = true\n", "user must be a user name or a numeric uid"),
        ('[environment]\ndocker_image = ""\n', "docker_image must be a non-empty string"),
        (
            '[environment.healthcheck]\ncommand = ""\n',
            "healthcheck.command must be a shell command",
        ),
        (
            '[environment.healthcheck]\ncommand = "true"\ninterval_sec = -1\nretries = 1.5\n',
            "healthcheck.interval_sec must be a number of seconds >= 0, got -1",
        ),
        (
            '[environment.healthcheck]\ncommand = "true"\nretries = 1.5\n',
            "healthcheck.retries must be a whole number >= 0, got 1.5",
        ),
        (
            '[environment.healthcheck]\ncommand = "true"\nintervall_sec = 1\n',
            "healthcheck has unknown field(s) intervall_sec",
        ),
        (
            '[environment]\nallowed_hosts = ["pypi.org"]\n',
            "allowed_hosts is only valid with network_mode = 'allowlist'",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = "pypi.org"\n',
            "allowed_hosts must be a list of hosts",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["pypi.org", "https://pypi.org/simple"]\n',
            "allowed_hosts[1]: 'https://pypi.org/simple' is a URL; give its host only",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["files.*.org"]\n',
            "allowed_hosts[0]: 'files.*.org': a wildcard is only allowed as a leading '*.'",
        ),
    ],
)
def test_bad_harbor_values_are_problems(tmp_path, toml, message):
    task, problems = loaded_task(tmp_path, toml)
    assert task is None and message in "\n".join(map(str, problems))


def test_an_allowlist_is_read_in_harbors_normal_form(tmp_path):
    task, problems = loaded_task(
        tmp_path,
        (
            '[environment]\nnetwork_mode = "allowlist"\n'
            'allowed_hosts = ["PyPI.org.", "*.Example.com", "10.0.0.0/8", "::1", "pypi.org"]\n'
        ),
    )
    assert not problems and task is not None, problems
    assert task.network_mode == "allowlist" and not task.warnings
    assert task.allowed_hosts == ("pypi.org", "*.example.com", "10.0.0.0/8", "::1")


def test_healthchecks_are_read_with_harbors_defaults(tmp_path):
    task, problems = loaded_task(
        tmp_path,
        (
            "[environment.healthcheck]\n"
            'command = "curl -sf localhost:8080"\nstart_period_sec = 2\nretries = 0\n'
        ),
    )
    assert not problems and task is not None, problems
    assert task.healthcheck == Healthcheck(
        "curl -sf localhost:8080",
        interval_sec=5.0,
        timeout_sec=30.0,
        start_period_sec=2.0,
        start_interval_sec=5.0,
        retries=0,
    )
    assert not task.warnings


# -- [agent] / [verifier] network overrides ----------------------------------------------


@pytest.mark.parametrize(
    "toml",
    [
        '[environment]\nnetwork_mode = "no-network"\n[agent]\nnetwork_mode = "no-network"\n',
        "[agent]\nnetwork_mode = 'public'\n[verifier]\nnetwork_mode = 'public'\n",
        '[environment]\nallow_internet = false\n[verifier]\nnetwork_mode = "no-network"\n',
        '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org", "*.x.dev"]\n'
        '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["*.X.dev", "PyPI.org."]\n',
    ],
)
def test_a_phase_override_that_is_the_environments_policy_is_accepted(tmp_path, toml):
    task, problems = loaded_task(tmp_path, toml)
    assert not problems and task is not None, problems
    assert task.warnings == ()


@pytest.mark.parametrize(
    ("toml", "where", "message"),
    [
        # the agent offline in a public environment: ignoring it would give the agent a
        # network its task denies it
        (
            '[agent]\nnetwork_mode = "no-network"\n',
            "[agent]",
            "network_mode 'no-network' differs from [environment] network_mode 'public'",
        ),
        (
            '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
            "[verifier]",
            "cannot give the verifier one of its own",
        ),
        (
            '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
            '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["example.com"]\n',
            "[agent]",
            "'allowlist' with ['example.com'] differs from [environment] network_mode "
            "'allowlist' with ['pypi.org']",
        ),
        ("[agent]\nallowed_hosts = ['pypi.org']\n", "[agent]", "only valid with network_mode"),
        ("[verifier]\nnetwork_mode = 'open'\n", "[verifier]", "network_mode must be one of"),
    ],
)
def test_a_phase_override_of_its_own_is_refused_naming_the_fix(tmp_path, toml, where, message):
    task, problems = loaded_task(tmp_path, toml)
    assert task is None
    text = "\n".join(f"{p.where}: {p.message}" for p in problems)
    assert f"task.toml {where}: " in text and message in text, text


def test_a_steps_phase_override_is_checked_too(tmp_path):
    task = tmp_path / "multi"
    (task / "steps" / "one" / "tests").mkdir(parents=True)
    (task / "steps" / "one" / "instruction.md").write_text("Do one.\n")
    test_sh = task / "steps" / "one" / "tests" / "test.sh"
    test_sh.write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text(
        '[[steps]]\nname = "one"\n[steps.agent]\nnetwork_mode = "no-network"\n'
    )
    definition, problems = load_task("multi", task, "tasks[0]")
    assert definition is None
    text = "\n".join(f"{p.where}: {p.message}" for p in problems)
    assert "[[steps]][0] [agent]: network_mode 'no-network' differs" in text, text


def test_harbor_runs_phase_overrides_itself(tmp_path):
    """`executor.kind: harbor`: Harbor runs the phases, so their networks are its to keep;
    a local experiment over the same task is refused."""
    (tmp_path / "tasks").mkdir()
    make_task(tmp_path / "tasks", "t", toml='[agent]\nnetwork_mode = "no-network"\n')
    harbor = {"kind": "harbor", "config": {"environment": {"type": "podman"}}}
    experiment, _ = experiment_from_data(spec(tasks=[{"id": "t"}], executor=harbor))
    assert set(load_tasks(experiment, tmp_path)) == {"t"}
    local, _ = experiment_from_data(spec(tasks=[{"id": "t"}]))
    with pytest.raises(TaskError, match="problem"):
        load_tasks(local, tmp_path)
