"""executor.config.egress: decoding, bad entries named by path, and no subject override."""

from __future__ import annotations

from typing import Any

import pytest

from maka_eval.egress.policy import EgressPolicy
from maka_eval.errors import SpecError
from maka_eval.executors.load import experiment_from_data
from maka_eval.relay.environment import egress_environment
from maka_eval.spec.egress import EgressConfig, is_egress_env, policy_of
from tests.helpers import spec

KUBERNETES: dict[str, Any] = {
    "kind": "kubernetes",
    "config": {
        "relayImage": "relay:1",
        "egressImage": "egress:1",
        "benchmarkImage": "bench:1",
        "taskImage": "task:1",
    },
}


def with_egress(egress: Any, executor: dict[str, Any] | None = None) -> dict[str, Any]:
    executor = dict(executor or {"kind": "local", "config": {}})
    executor["config"] = {**executor.get("config", {}), "egress": egress}
    return spec(executor=executor)


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        experiment_from_data(doc)
    return [str(p) for p in info.value.problems]


def k8s_form(doc: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in doc.items() if k not in ("schemaVersion", "id")}
    return {
        "apiVersion": "eval.maka.dev/v1alpha1",
        "kind": "Experiment",
        "metadata": {"name": doc["id"]},
        "spec": body,
    }


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", [None, KUBERNETES], ids=["local", "kubernetes"])
def test_egress_decodes_on_both_executors_with_defaults(executor):
    experiment, _ = experiment_from_data(with_egress({"mode": "proxy"}, executor))
    config = experiment.spec.executor.config.egress
    assert config == EgressConfig(mode="proxy", preset="terminal-bench", block=())
    policy = policy_of(config)
    assert policy is not None and policy == EgressPolicy("terminal-bench")
    # The defaults are part of the experiment's identity (the frozen experiment.json).
    canonical = experiment.canonical()["executor"]["config"]["egress"]
    assert canonical == {"mode": "proxy", "preset": "terminal-bench", "block": []}


def test_egress_is_optional_and_mode_none_means_no_url_policy():
    experiment, _ = experiment_from_data(spec())
    assert experiment.spec.executor.config.egress is None
    assert policy_of(None) is None
    experiment, _ = experiment_from_data(with_egress({"mode": "none"}))
    assert policy_of(experiment.spec.executor.config.egress) is None


def test_spec_entries_reach_the_policy():
    doc = with_egress(
        {"mode": "proxy", "preset": "none", "block": ["Answers.Example.com", "re:leak"]}
    )
    experiment, _ = experiment_from_data(doc)
    policy = policy_of(experiment.spec.executor.config.egress)
    assert policy is not None and policy.block == ("answers.example.com", "re:leak")
    assert policy.check_url("https://www.answers.example.com/").blocked
    assert policy.check_url("https://x.org/leak").blocked
    assert not policy.check_url("https://tbench.ai/").blocked  # preset none


@pytest.mark.parametrize(
    ("egress", "where", "message"),
    [
        ({}, "executor.config.egress.mode", "is required"),
        ({"mode": "open"}, "executor.config.egress.mode", "use 'proxy' or 'none'"),
        ({"mode": "proxy", "preset": "swe"}, "executor.config.egress.preset", "'terminal-bench'"),
        ({"mode": "proxy", "allow": []}, "executor.config.egress.allow", "unknown field"),
        ({"mode": "proxy", "block": "x.org"}, "executor.config.egress.block", "must be a list"),
    ],
)
def test_bad_egress_fields_name_their_path(egress, where, message):
    found = problems(with_egress(egress))
    assert any(p.startswith(where + ":") and message in p for p in found), found


def test_every_bad_block_entry_is_named_with_its_index_and_fix():
    doc = with_egress(
        {"mode": "proxy", "block": ["ok.example", "re:(", "", "https://x.org/a", "x.org:80"]}
    )
    found = problems(doc)
    assert len(found) == 4, found
    assert found[0].startswith("executor.config.egress.block[1]: 're:(' is not a valid regular")
    assert found[1].startswith("executor.config.egress.block[2]: an entry must not be empty")
    assert found[2].startswith("executor.config.egress.block[3]: 'https://x.org/a' has a scheme")
    assert "write it without one ('x.org/a')" in found[2]
    assert found[3].startswith("executor.config.egress.block[4]: 'x.org:80' has a port")


def test_kubernetes_form_paths_start_at_spec():
    found = problems(k8s_form(with_egress({"mode": "proxy", "block": ["re:("]}, KUBERNETES)))
    assert any(p.startswith("spec.executor.config.egress.block[0]:") for p in found), found


# -- a subject cannot override egress ------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "HTTP_PROXY",
        "https_proxy",
        "All_Proxy",
        "NO_PROXY",
        "no_proxy",
        "npm_config_https_proxy",
        "GIT_PROXY_COMMAND",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "PIP_CERT",
    ],
)
def test_a_subject_setting_a_proxy_or_ca_variable_is_refused(name):
    subjects = [
        {"id": "a", "kind": "external", "config": {"command": "true"}},
        {"id": "b", "kind": "external", "config": {"command": "true", "env": {name: "x"}}},
    ]
    found = problems(spec(subjects=subjects))
    assert len(found) == 1, found
    assert found[0].startswith(f"subjects[1].config.env.{name}: '{name}' carries egress")
    assert "egress is executor configuration" in found[0]
    assert "executor.config.egress" in found[0]


def test_a_credential_bound_to_a_proxy_variable_is_refused():
    subject = {
        "id": "a",
        "kind": "external",
        "credentials": ["CORP_PROXY_URL"],
        "config": {"command": "true", "credentialBindings": {"HTTPS_PROXY": "CORP_PROXY_URL"}},
    }
    found = problems(k8s_form(spec(subjects=[subject], executor=KUBERNETES)))
    assert found and found[0].startswith(
        "spec.subjects[0].config.credentialBindings.HTTPS_PROXY: 'HTTPS_PROXY' carries egress"
    ), found


@pytest.mark.parametrize("kind", ["external", "maka", "oracle", "nop"])
def test_an_egress_field_in_a_subject_is_refused_as_executor_configuration(kind):
    config: dict[str, Any] = {
        "external": {"command": "true"},
        "maka": {"profile": "headless-coding-v1"},
        "oracle": {},
        "nop": {},
    }[kind]
    subject = {"id": "a", "kind": kind, "config": {**config, "egress": {"mode": "none"}}}
    doc = spec(subjects=[subject])
    doc["executor"] = {"kind": "local", "config": {"runtimeHost": {"command": "rh"}}}
    found = problems(doc)
    assert found == [
        "subjects[0].config.egress: 'egress' is executor configuration, shared by all arms: "
        "set it once in executor.config.egress (mode, preset, block); a subject cannot set or "
        "override it. Remove it here"
    ], found


def test_an_egress_proxy_key_on_the_subject_itself_is_refused_the_same_way():
    subject = {"id": "a", "kind": "external", "egressProxy": "http://p:3128"}
    subject["config"] = {"command": "true"}
    found = problems(spec(subjects=[subject]))
    assert len(found) == 1 and found[0].startswith("subjects[0].egressProxy: 'egressProxy' is")


def test_ordinary_variables_are_not_mistaken_for_egress():
    for name in ("PROXYLESS", "OPENAI_API_KEY", "CERT_NAME", "MY_CA", "HTTP_TIMEOUT"):
        assert not is_egress_env(name), name
    subjects = [
        {"id": "a", "kind": "external", "config": {"command": "true", "env": {"HTTP_TIMEOUT": "9"}}}
    ]
    experiment_from_data(spec(subjects=subjects))


def test_every_variable_the_relay_sets_for_egress_is_refused_in_a_spec():
    for name in egress_environment("http://maka-eval-proxy:3128", "/ca/cert.pem"):
        assert is_egress_env(name), name
