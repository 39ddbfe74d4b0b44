"""Ids are safe for file names, Kubernetes label values and cell ids."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from maka_eval.engine import launch
from maka_eval.engine.expand import cell_id, parse_cell_id
from maka_eval.spec import ids
from maka_eval.spec.ids import (
    env_name_problem,
    experiment_id_problem,
    id_problem,
    reserved_env_problem,
)

# The Kubernetes label-value rule, written independently of the implementation.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@given(st.text(max_size=80))
def test_a_valid_id_is_a_label_value_and_a_file_name(value):
    if id_problem(value) is None:
        assert value and len(value) <= 63 and LABEL_VALUE.fullmatch(value)
        assert "/" not in value and value not in (".", "..") and "\0" not in value
        assert "::" not in value


@given(st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_every_label_value_is_a_valid_id(value):
    assert id_problem(value) is None


@given(st.text(max_size=70))
def test_experiment_ids_are_dns_labels(value):
    if experiment_id_problem(value) is None:
        assert len(value) <= 63 and DNS_LABEL.fullmatch(value)


@given(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True),
    st.integers(min_value=1, max_value=10**6),
    st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True),
)
def test_cell_ids_round_trip(task, rep, subject):
    assert parse_cell_id(cell_id(task, rep, subject)) == (task, rep, subject)


def test_malformed_cell_ids():
    for value in ("a::b", "a::0::b", "a::x::b", "a::1::b::c", "::1::b"):
        assert parse_cell_id(value) is None


def test_env_names():
    assert env_name_problem("OPENAI_API_KEY") is None
    assert env_name_problem("_x1") is None
    for bad in ("my key", "1ABC", "A-B", ""):
        assert env_name_problem(bad)


def test_long_env_names_are_refused():
    assert env_name_problem("A" * ids.ENV_NAME_MAX_LENGTH) is None
    assert "at most" in (env_name_problem("A" * (ids.ENV_NAME_MAX_LENGTH + 1)) or "")


def test_reserved_env_names_are_the_ones_the_launch_sets():
    # One source of truth: whatever the launch sets for every subject, a spec may not set.
    for name in (*launch.FIXED_ENV, *launch.RESERVED_ENV_NAMES, "LANG"):
        assert reserved_env_problem(name), name
    assert reserved_env_problem(launch.ATTEMPT_ENV_PREFIX + "ANYTHING")
    assert reserved_env_problem("LANGUAGE") is None
    assert not hasattr(ids, "RESERVED_ENV_NAMES"), "a second list would drift"


def test_the_spec_has_no_copy_of_the_cell_id_rule():
    assert not hasattr(ids, "cell_id") and not hasattr(ids, "parse_cell_id")
