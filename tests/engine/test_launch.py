"""Subject launch: one builder for every executor, host paths passed in."""

from __future__ import annotations

import json

import pytest

from maka_eval.engine.classify import ResultContract
from maka_eval.engine.launch import (
    FIXED_ENV,
    RESERVED_ENV_NAMES,
    credential_targets,
    is_reserved_env,
)
from maka_eval.spec.subjects import ExternalSubject, MakaSubject, OracleSubject, subject_launch


def _parse(model, data):
    """As the loader does: from JSON (strict models take lists as tuples only there)."""
    return model.model_validate_json(json.dumps(data))


def test_external_subject_locally_and_in_a_pod():
    subject = _parse(
        ExternalSubject,
        {
            "id": "a",
            "kind": "external",
            "credentials": ["OPENAI_API_KEY", "OTHER"],
            "config": {
                "command": "agents/run.sh",
                "args": ["--fast"],
                "env": {"MODE": "x"},
                "credentialBindings": {"API_KEY": "OPENAI_API_KEY"},
                "resultContract": "protocol-v1",
            },
        },
    )
    local = subject_launch(subject, program="/home/me/exp/agents/run.sh")
    pod = subject_launch(subject, program="/workspace/agents/run.sh")
    assert local.argv == ("/home/me/exp/agents/run.sh", "--fast")
    assert pod.argv == ("/workspace/agents/run.sh", "--fast")
    assert local.contract is ResultContract.PROTOCOL_V1
    assert local.credentials == {"API_KEY": "OPENAI_API_KEY", "OTHER": "OTHER"}
    assert local.env == {"MODE": "x"} and local.credentials == pod.credentials


def test_maka_subject_goes_through_the_runtime_host():
    subject = _parse(
        MakaSubject,
        {
            "id": "m",
            "kind": "maka",
            "credentials": ["K"],
            "config": {"profile": "headless-coding-v1", "model": "mdl", "args": ["-v"]},
        },
    )
    launch = subject_launch(subject, program="/opt/host", runtime_host_args=("serve",))
    assert launch.argv == (
        "/opt/host",
        "serve",
        "--session-profile",
        "headless-coding-v1",
        "--model",
        "mdl",
        "-v",
    )
    assert launch.contract is ResultContract.PROTOCOL_V1 and launch.credentials == {"K": "K"}


def test_oracle_runs_the_solution_where_the_executor_puts_it():
    oracle = _parse(OracleSubject, {"id": "o", "kind": "oracle"})
    launch = subject_launch(
        oracle,
        solution_dir="/tasks/t/solution",
        solution_script="/solution/solve.sh",
        solution_env={"X": "1"},
    )
    assert launch.argv == ("/solution/solve.sh",) and launch.env == {"X": "1"}
    assert launch.extra_dirs == {"solution": "/tasks/t/solution"}
    assert launch.contract is ResultContract.EXIT_CODE


def test_reserved_names_come_from_the_fixed_environment():
    assert set(FIXED_ENV) <= RESERVED_ENV_NAMES
    for name in (*FIXED_ENV, "PATH", "HOME", "TMPDIR", "MAKA_EVAL_ANYTHING"):
        assert is_reserved_env(name)
    assert not is_reserved_env("OPENAI_API_KEY")


@pytest.mark.parametrize(
    ("declared", "bindings", "expected"),
    [
        (("A",), {}, {"A": "A"}),
        (("A", "B"), {"X": "A"}, {"X": "A", "B": "B"}),
        ((), {}, {}),
    ],
)
def test_credential_targets(declared, bindings, expected):
    assert credential_targets(declared, bindings) == expected
