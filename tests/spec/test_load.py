"""Loading the experiment document: both forms, strictness, every error at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from maka_eval.errors import SpecError
from maka_eval.executors.load import (
    experiment_from_data,
    load_experiment_file,
    load_experiment_text,
)
from maka_eval.spec.experiment import Experiment
from maka_eval.spec.subjects import ExternalSubject
from tests.helpers import BAD_CREDENTIAL_SUBJECTS, spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hello"


def problems(data, source="x.json") -> list[str]:
    with pytest.raises(SpecError) as info:
        experiment_from_data(data, source)
    return [str(p) for p in info.value.problems]


def k8s(doc: dict) -> dict:
    body = {k: v for k, v in doc.items() if k not in ("schemaVersion", "id")}
    return {
        "apiVersion": "eval.maka.dev/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": doc["id"]},
        "spec": body,
    }


def test_a_valid_document_loads():
    experiment, form = experiment_from_data(spec())
    assert form == "bare"
    assert experiment.id == "exp"
    assert isinstance(experiment.spec.subjects[0], ExternalSubject)
    assert experiment.spec.execution.default_timeouts.agent_sec == 900


def test_both_forms_mean_the_same_experiment():
    bare, _ = experiment_from_data(spec())
    kube, form = experiment_from_data(k8s(spec()))
    assert form == "kubernetes"
    assert bare == kube
    assert bare.canonical() == kube.canonical()


def test_the_examples_bare_and_kubernetes_files_differ_only_in_their_executor():
    a = load_experiment_file(EXAMPLES / "experiment.yaml").experiment.canonical()
    b = load_experiment_file(EXAMPLES / "experiment.k8s.yaml").experiment.canonical()
    assert a.pop("executor")["kind"] == "local"
    assert b.pop("executor")["kind"] == "kubernetes"
    assert a == b


def test_yaml_and_json_texts_mean_the_same(tmp_path):
    doc = spec()
    a = load_experiment_text(json.dumps(doc), "e.json", tmp_path).experiment
    b = load_experiment_text(yaml.safe_dump(doc), "e.yaml", tmp_path).experiment
    assert a == b


def test_canonical_form_round_trips():
    experiment, _ = experiment_from_data(spec())
    again, _ = experiment_from_data(experiment.canonical())
    assert again == experiment


def test_kubernetes_form_accepts_server_metadata_and_ignores_status():
    doc = k8s(spec())
    doc["metadata"].update(
        {"namespace": "evals", "uid": "abc", "resourceVersion": "7", "labels": {"team": "x"}}
    )
    doc["status"] = {"phase": "Running"}
    experiment, _ = experiment_from_data(doc)
    assert experiment.id == "exp"


def test_issue_example_message_names_path_and_fix():
    doc = spec(subjects=BAD_CREDENTIAL_SUBJECTS)
    assert (
        "subjects[1].credentials[0]: 'my key' is not a valid environment variable name: "
        "use letters, digits and '_', not starting with a digit"
    ) in problems(doc)


def test_every_error_is_reported_at_once():
    doc = spec(
        id="Bad_Id",
        repetitions=0,
        subjects=[
            {"id": "a", "kind": "external", "config": {"command": "true", "colour": "red"}},
            {"id": "a", "kind": "external", "config": {"command": "true"}},
            {"id": "c", "kind": "extrnal", "config": {}},
        ],
        tasks=[{"id": "t/1"}],
    )
    found = problems(doc)
    joined = "\n".join(found)
    assert "id: 'Bad_Id' is not a valid experiment id" in joined
    assert "repetitions: must be greater than or equal to 1, got 0" in joined
    assert "subjects[0].config.colour: unknown field 'colour'" in joined
    assert "subjects[1].id: duplicate id 'a'" in joined
    assert "subjects[2]: kind 'extrnal' is not known; did you mean 'external'?" in joined
    assert "tasks[0].id: 't/1' is not a valid id" in joined
    assert len(found) >= 6


def test_kubernetes_paths_start_at_spec():
    doc = k8s(spec(repetitions="3"))
    assert any(p.startswith("spec.repetitions: must be a whole number") for p in problems(doc))


def test_unknown_top_level_field_suggests_the_right_one():
    doc = spec()
    doc["repetition"] = 3
    found = problems(doc)
    assert any(
        "repetition: unknown field 'repetition'; did you mean 'repetitions'?" in p for p in found
    )


@pytest.mark.parametrize(
    ("kind", "config", "expected"),
    [
        (
            "external",
            {"command": "x", "profile": "headless-coding-v1"},
            "config.profile: unknown field",
        ),
        (
            "maka",
            {"profile": "headless-coding-v1", "command": "x"},
            "config.command: unknown field",
        ),
        (
            "maka",
            {"profile": "headless-coding-v9"},
            "config.profile: 'headless-coding-v9' is not allowed",
        ),
        ("oracle", {"command": "x"}, "config.command: unknown field"),
        ("external", {"command": "x", "resultContract": "json"}, "config.resultContract: 'json'"),
        ("external", {"command": ""}, "config.command: must not be empty"),
        ("external", {}, "config.command: is required; add it"),
    ],
)
def test_subject_config_is_validated_per_kind(kind, config, expected):
    doc = spec(
        subjects=[{"id": "s", "kind": kind, "config": config}],
        executor={"kind": "local", "config": {"runtimeHost": {"command": "host"}}},
    )
    assert any(expected in p for p in problems(doc)), problems(doc)


def test_executor_config_is_validated():
    doc = spec(executor={"kind": "local", "config": {"runtimeHost": {"comand": "x"}}})
    found = "\n".join(problems(doc))
    assert (
        "executor.config.runtimeHost.comand: unknown field 'comand'; did you mean 'command'?"
        in found
    )
    # Kinds resolve through the plug-in registry (tests/executors cover it in full).
    (unknown,) = problems(spec(executor={"kind": "docker"}))
    assert unknown.startswith("executor.kind: no executor 'docker' is installed (installed: ")
    assert "'local', 'kubernetes'" in unknown and "docs/executors.md" in unknown


def test_maka_subject_needs_a_runtime_host():
    doc = spec(subjects=[{"id": "m", "kind": "maka", "config": {"profile": "headless-coding-v1"}}])
    assert any(
        p.startswith("executor.config.runtimeHost: required because subjects[0]")
        for p in problems(doc)
    )


def test_credential_rules():
    doc = spec(
        subjects=[
            {
                "id": "s",
                "kind": "external",
                "credentials": ["API_KEY", "API_KEY", "OTHER"],
                "config": {
                    "command": "true",
                    "env": {"OTHER": "literal", "TZ": "Europe/Paris", "MAKA_EVAL_X": "1"},
                    "credentialBindings": {"TARGET": "UNDECLARED"},
                },
            }
        ]
    )
    found = "\n".join(problems(doc))
    assert "subjects[0].credentials[1]: 'API_KEY' is declared twice" in found
    assert "subjects[0].config.credentialBindings.TARGET: 'UNDECLARED' is not declared" in found
    assert "subjects[0].config.env.OTHER: 'OTHER' is a declared credential" in found
    assert "subjects[0].config.env.TZ: 'TZ' is set by maka-eval" in found
    assert "subjects[0].config.env.MAKA_EVAL_X: 'MAKA_EVAL_X' is set by maka-eval" in found


def test_binding_a_credential_under_another_name_is_fine():
    doc = spec(
        subjects=[
            {
                "id": "s",
                "kind": "external",
                "credentials": ["SOURCE"],
                "config": {"command": "true", "credentialBindings": {"OPENAI_API_KEY": "SOURCE"}},
            }
        ]
    )
    experiment, _ = experiment_from_data(doc)
    assert experiment.spec.subjects[0].config.credential_bindings == {"OPENAI_API_KEY": "SOURCE"}


def test_numbers_where_strings_belong_get_a_quote_hint():
    doc = spec(benchmark={"id": "b", "version": 1.0, "kind": "directory", "config": {"path": "t"}})
    assert 'benchmark.version: must be a string, got 1.0; quote it: "1.0"' in problems(doc)


def test_ids_and_duplicates():
    found = "\n".join(problems(spec(tasks=[{"id": "a"}, {"id": "b", "path": "a"}, {"id": "a"}])))
    assert "tasks[2].id: duplicate id 'a' (already used by tasks[0])" in found
    assert "tasks[1].path: uses the same task directory 'a' as tasks[0]" in found
    long_id = "x" * 64
    assert any("ids are at most 63" in p for p in problems(spec(tasks=[{"id": long_id}])))


def test_yaml_norway_words_are_strings_and_duplicate_keys_are_errors(tmp_path):
    text = yaml.safe_dump(spec()).replace("- id: t1", "- id: no")
    experiment = load_experiment_text(text, "e.yaml", tmp_path).experiment
    assert experiment.spec.tasks[0].id == "no"
    with pytest.raises(SpecError, match="duplicate key 'repetitions'"):
        load_experiment_text(yaml.safe_dump(spec()) + "repetitions: 2\n", "e.yaml", tmp_path)
    with pytest.raises(SpecError, match="duplicate key 'id'"):
        load_experiment_text('{"id": "a", "id": "b"}', "e.json", tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds 0 YAML documents"),
        ("a: 1\n---\nb: 2\n", "holds 2 YAML documents"),
        ("[1, 2]", "the document must be a mapping"),
        ("foo: [", "not valid YAML"),
        ("id: x\n", "cannot tell the form"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {}\n", "apiVersion"),
    ],
)
def test_malformed_documents(tmp_path, text, message):
    with pytest.raises(SpecError) as info:
        load_experiment_text(text, "e.yaml", tmp_path)
    assert message in info.value.render()


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_experiment_file(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="is a directory"):
        load_experiment_file(tmp_path)


def test_models_are_frozen():
    experiment, _ = experiment_from_data(spec())
    with pytest.raises(ValidationError):
        experiment.spec.repetitions = 5  # type: ignore[misc]
    assert isinstance(experiment, Experiment)


def test_a_variable_the_launch_sets_cannot_be_set_in_the_spec():
    # LANG used to validate and then be silently replaced by C.UTF-8.
    doc = spec(
        subjects=[
            {"id": "s", "kind": "external", "config": {"command": "x", "env": {"LANG": "fr_FR"}}}
        ]
    )
    found = problems(doc)
    assert any(
        p.startswith("subjects[0].config.env.LANG: 'LANG' is set by maka-eval for every subject")
        for p in found
    ), found
    doc = spec(
        subjects=[
            {
                "id": "s",
                "kind": "external",
                "credentials": ["KEY"],
                "config": {"command": "x", "credentialBindings": {"LANG": "KEY"}},
            }
        ]
    )
    assert any(
        p.startswith("subjects[0].config.credentialBindings.LANG: 'LANG' is set by maka-eval")
        for p in problems(doc)
    )


def test_result_contract_is_the_engine_enum():
    from maka_eval.engine.classify import ResultContract
    from maka_eval.spec.subjects import ExternalSubjectConfig

    assert ExternalSubjectConfig.model_fields["result_contract"].annotation is ResultContract
    doc = spec(
        subjects=[
            {
                "id": "s",
                "kind": "external",
                "config": {"command": "x", "resultContract": "protocol-v1"},
            }
        ]
    )
    experiment, _ = experiment_from_data(doc)
    contract = experiment.spec.subjects[0].config.result_contract
    assert contract is ResultContract.PROTOCOL_V1
    assert experiment.canonical()["subjects"][0]["config"]["resultContract"] == "protocol-v1"
    default, _ = experiment_from_data(spec())
    assert default.spec.subjects[0].config.result_contract is ResultContract.EXIT_CODE


def test_a_wrong_result_contract_gets_a_suggestion():
    doc = spec(
        subjects=[
            {
                "id": "s",
                "kind": "external",
                "config": {"command": "x", "resultContract": "exit_code"},
            }
        ]
    )
    assert (
        "subjects[0].config.resultContract: 'exit_code' is not allowed; did you mean "
        "'exit-code'? use 'exit-code' or 'protocol-v1'"
    ) in problems(doc)


NUL = "a\0b"


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        (
            {
                "subjects": [
                    {"id": "s", "kind": "external", "config": {"command": "x", "args": [NUL]}}
                ]
            },
            "subjects[0].config.args[0]",
        ),
        (
            {"subjects": [{"id": "s", "kind": "external", "config": {"command": NUL}}]},
            "subjects[0].config.command",
        ),
        (
            {
                "subjects": [
                    {"id": "s", "kind": "external", "config": {"command": "x", "env": {"A": NUL}}}
                ]
            },
            "subjects[0].config.env.A",
        ),
        (
            {
                "subjects": [
                    {"id": "s", "kind": "external", "config": {"command": "x", "env": {NUL: "v"}}}
                ]
            },
            'subjects[0].config.env["a\\u0000b"]',
        ),
        (
            {
                "subjects": [
                    {
                        "id": "m",
                        "kind": "maka",
                        "config": {"profile": "headless-coding-v1", "args": ["--x", NUL]},
                    }
                ],
                "executor": {"kind": "local", "config": {"runtimeHost": {"command": "h"}}},
            },
            "subjects[0].config.args[1]",
        ),
        (
            {"executor": {"kind": "local", "config": {"runtimeHost": {"command": NUL}}}},
            "executor.config.runtimeHost.command",
        ),
        (
            {
                "executor": {
                    "kind": "local",
                    "config": {"runtimeHost": {"command": "h", "args": [NUL]}},
                }
            },
            "executor.config.runtimeHost.args[0]",
        ),
    ],
)
def test_nul_bytes_are_refused_with_their_path(changes, path):
    found = problems(spec(**changes))
    assert any(p.startswith(f"{path}: ") for p in found), found
    if "env[" not in path:
        assert any("NUL" in p for p in found), found


@pytest.mark.parametrize(
    ("value", "shown"),
    [(".inf", "inf"), ("-.inf", "-inf"), (".nan", "nan"), (".NaN", "nan"), (".Inf", "inf")],
)
def test_yaml_infinities_and_nan_are_refused(tmp_path, value, shown):
    text = yaml.safe_dump(spec()) + f"budget: {{maxCostUsd: {value}}}\n"
    with pytest.raises(SpecError) as info:
        load_experiment_text(text, "e.yaml", tmp_path)
    assert "budget.maxCostUsd: must be a finite number" in info.value.render()
    text = yaml.safe_dump(spec()).replace(
        "maxConcurrentTaskGroups: 2", f"maxConcurrentTaskGroups: {value}"
    )
    with pytest.raises(SpecError, match=r"execution\.maxConcurrentTaskGroups: must be a whole"):
        load_experiment_text(text, "e.yaml", tmp_path)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_json_nan_and_infinity_are_refused(tmp_path, value):
    doc = json.dumps(spec(budget={"maxCostUsd": 1.5})).replace("1.5", value)
    with pytest.raises(SpecError) as info:
        load_experiment_text(doc, "e.json", tmp_path)
    assert "budget.maxCostUsd: must be a finite number" in info.value.render()
    doc = json.dumps(k8s(spec(budget={"maxCostUsd": 1.5}))).replace("1.5", value)
    with pytest.raises(SpecError, match=r"spec\.budget\.maxCostUsd: must be a finite number"):
        load_experiment_text(doc, "e.json", tmp_path)
    doc = json.dumps(
        spec(benchmark={"id": "b", "version": 1.5, "kind": "directory", "config": {"path": "t"}})
    )
    with pytest.raises(SpecError, match=r"benchmark\.version: must be a string"):
        load_experiment_text(doc.replace("1.5", value), "e.json", tmp_path)


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        ([{"id": "a", "path": "/etc"}], "tasks[0].path: '/etc' is an absolute path"),
        (
            [{"id": "a", "path": "../other"}],
            "tasks[0].path: '../other' leaves the benchmark folder",
        ),
        ([{"id": "a", "path": "x/../../y"}], "tasks[0].path: 'x/../../y' leaves the benchmark"),
        ([{"id": "a", "path": ".."}], "tasks[0].path: '..' leaves the benchmark folder"),
        ([{"id": "a", "path": "."}], "tasks[0].path: '.' is the benchmark folder itself"),
        ([{"id": "a"}, {"id": "b", "path": "./a"}], "tasks[1].path: uses the same task directory"),
        ([{"id": "a"}, {"id": "b", "path": "a/"}], "tasks[1].path: uses the same task directory"),
        (
            [{"id": "x", "path": "d/a"}, {"id": "b", "path": "d/./c/../a"}],
            "tasks[1].path: uses the same task directory 'd/a' as tasks[0]",
        ),
        ([{"id": "x", "path": "b"}, {"id": "b"}], "tasks[1].id: uses the same task directory"),
        ([{"id": "x", "path": "b"}, {"id": "b", "path": None}], "tasks[1].id: uses the same"),
    ],
)
def test_task_paths_stay_inside_the_benchmark_and_differ(tasks, expected):
    found = problems(spec(tasks=tasks))
    assert any(p.startswith(expected) for p in found), found


def test_task_paths_inside_the_benchmark_are_fine():
    experiment, _ = experiment_from_data(
        spec(tasks=[{"id": "a", "path": "group/a"}, {"id": "b", "path": "x/../b"}, {"id": "c"}])
    )
    assert [t.directory_name for t in experiment.spec.tasks] == ["group/a", "x/../b", "c"]
