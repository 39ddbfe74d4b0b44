"""Egress configuration: executor settings shared by every arm of the experiment.

The policy lives in the executor's config (`executor.config.egress`), never in a subject:
both arms of a comparison meet the same blocklist, and a subject cannot set or override
it. So the decoder also refuses a subject whose environment would redirect its traffic
or its trust (proxy and CA variables), and an `egress` field anywhere but the executor.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from maka_eval.egress.policy import MAX_ENTRY_LENGTH, EgressPolicy, entry_problem
from maka_eval.errors import Problem
from maka_eval.spec.base import Check, SchemaOnly, SpecModel


def block_entry_problem(value: str) -> str | None:
    """Why `value` is not a blocklist entry (the message names the fix), or None."""
    return entry_problem(value)


BlockEntry = Annotated[
    str,
    AfterValidator(Check(block_entry_problem)),
    SchemaOnly(maxLength=MAX_ENTRY_LENGTH),
]


class EgressConfig(SpecModel):
    """What the subjects' network may reach. Executor configuration, shared by all arms;
    a task whose task.toml says allow_internet = false gets no network whatever this says."""

    mode: Literal["proxy", "none"] = Field(
        description=(
            "'proxy': the subject's traffic goes through the metering and blocklist proxy "
            "(HTTP(S) only; everything else is refused). 'none': no network at all."
        )
    )
    preset: Literal["terminal-bench", "none"] = Field(
        default="terminal-bench",
        description=(
            "Built-in blocklist. 'terminal-bench': Terminal-Bench contamination surfaces "
            "(benchmark references, repositories and pinned revisions, task registries, "
            "dataset mirrors, public trajectories, patch mirrors). 'none': only `block`."
        ),
    )
    block: tuple[BlockEntry, ...] = Field(
        default=(),
        description=(
            "More blocked destinations: a host ('example.com' and its subdomains; "
            "'*.example.com' subdomains only), a host and path prefix "
            "('github.com/org/repo'), or 're:<regex>' searched in the host and, "
            "separately, in the path and query. Wrapped URLs (archives, caches, "
            "redirectors, reader proxies, encoded forms) are unwrapped and checked too."
        ),
    )


def policy_of(config: EgressConfig | None) -> EgressPolicy | None:
    """The URL policy the proxy enforces; None without egress config or with mode 'none'
    (no network: nothing to check)."""
    if config is None or config.mode == "none":
        return None
    return EgressPolicy(config.preset, config.block)


# -- a subject cannot override egress ------------------------------------------------------

_EGRESS_ENV = re.compile(
    r"""(?ix)
    (?:.*_)?proxy                     # HTTP_PROXY, https_proxy, ALL_PROXY, NO_PROXY, PIP_PROXY,
                                      # npm_config_https_proxy, ...
    | .*_proxy_command                # GIT_PROXY_COMMAND
    | ssl_cert_(?:file|dir)           # OpenSSL's trust store
    | .*_ca_(?:bundle|certs|file|path|info)  # REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE,
                                      # NODE_EXTRA_CA_CERTS, AWS_CA_BUNDLE, ...
    | .*_ssl_ca(?:info|path)          # GIT_SSL_CAINFO, GIT_SSL_CAPATH
    | .*_cainfo | .*_cafile | .*_capath  # CARGO_HTTP_CAINFO, npm_config_cafile, ...
    | pip_cert | deno_cert | httplib2_ca_certs
    """
)


def is_egress_env(name: str) -> bool:
    """Whether variable `name` carries egress configuration: a proxy or a CA bundle
    (any case; the executor sets these for the subject)."""
    return _EGRESS_ENV.fullmatch(name) is not None


def egress_env_problem(name: str) -> str | None:
    """Why a subject may not set variable `name`, or None."""
    if not is_egress_env(name):
        return None
    return (
        f"'{name}' carries egress configuration (a proxy or trusted CAs), and egress is "
        "executor configuration shared by all arms: a subject cannot set or override it. "
        "Remove it; configure egress in executor.config.egress"
    )


def misplaced_egress_message(name: str) -> str | None:
    """The message for an `egress` field found anywhere but executor.config, or None."""
    if name not in ("egress", "egressProxy", "egress_proxy"):
        return None
    return (
        f"'{name}' is executor configuration, shared by all arms: set it once in "
        "executor.config.egress (mode, preset, block); a subject cannot set or override "
        "it. Remove it here"
    )


def subject_egress_problems(doc: Mapping[str, Any], prefix: str) -> Iterator[Problem]:
    """A subject's config.env or config.credentialBindings naming a proxy or CA variable."""
    subjects = doc.get("subjects")
    for i, subject in enumerate(subjects if isinstance(subjects, list) else ()):
        config = subject.get("config") if isinstance(subject, Mapping) else None
        if not isinstance(config, Mapping):
            continue
        for field in ("env", "credentialBindings"):
            names = config.get(field)
            for name in names if isinstance(names, Mapping) else ():
                where = f"{prefix}subjects[{i}].config.{field}.{name}"
                message = egress_env_problem(str(name))
                if message:
                    yield Problem(where, message)
