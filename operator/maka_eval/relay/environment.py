"""The environment a subject and a verifier start with, built from nothing.

Nothing of the relay's own environment leaks through except PATH: a subject sees its
declared non-secret values, its declared credentials (under their bound names), the
attempt's MAKA_EVAL_* variables, and the fixed DEBIAN_FRONTEND and TZ -- an interactive
package prompt in an unattended run is indistinguishable from a hung command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from maka_eval.engine.launch import FIXED_ENV
from maka_eval.processes.supervisor import MARKER_VARIABLE

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MissingCredential(Exception):
    """A declared credential has no value in the relay's environment."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"the credential {name} is not set in the environment")


def base_environment(
    *, attempt_id: str, home: str, tmp: str, host_env: Mapping[str, str], path: str | None = None
) -> dict[str, str]:
    """What every process of the attempt gets (`path`: the PATH the sandbox can serve,
    else the relay's own)."""
    return {
        "PATH": path or host_env.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "TMPDIR": tmp,
        **FIXED_ENV,
        MARKER_VARIABLE: attempt_id,
    }


def resolve_credentials(bindings: Mapping[str, str], host_env: Mapping[str, str]) -> dict[str, str]:
    """target name -> value, for each target -> source binding (MissingCredential if unset)."""
    values = {}
    for target, source in bindings.items():
        value = host_env.get(source)
        if not value:
            raise MissingCredential(source)
        values[target] = value
    return values


def subject_environment(
    base: Mapping[str, str],
    attempt_vars: Mapping[str, str],
    declared_env: Mapping[str, str],
    credentials: Mapping[str, str],
) -> dict[str, str]:
    """The subject's environment: base, its declared env, credentials, MAKA_EVAL_*."""
    env = dict(declared_env)
    env.update(credentials)
    env.update(attempt_vars)
    env.update(base)  # fixed values last: a spec cannot override them
    return env


VERIFIER_PYTHON = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}
"""Python in the verifier puts neither its working folder (the subject's workspace) nor
the script's folder on the module path, and reads no user site-packages: a json.py or a
usercustomize.py the subject planted is never imported."""


def verifier_environment(
    base: Mapping[str, str],
    task_env: Mapping[str, str],
    own_dirs: tuple[str, str] | None,
) -> dict[str, str]:
    """The verifier's environment, built from nothing: the task's [verifier].env, then
    the fixed values (PATH, DEBIAN_FRONTEND, TZ, the attempt's marker), its own HOME and
    TMPDIR (`own_dirs`, from the sandbox; never the subject's) and VERIFIER_PYTHON. No
    credential: none is in `base` or in the task's files."""
    env = dict(task_env)
    env.update(base)
    if own_dirs is None:  # the backend sets its own
        env.pop("HOME", None)
        env.pop("TMPDIR", None)
    else:
        env["HOME"], env["TMPDIR"] = own_dirs
    env.update(VERIFIER_PYTHON)
    return env


NO_PROXY = "localhost,127.0.0.1"
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
"""Where OpenSSL, Python's requests, curl and Node look for the CA to trust."""
RESOLV_CONF = "# maka-eval: no resolver; the egress proxy's name is in /etc/hosts\n"
"""A policed sandbox's /etc/resolv.conf: no nameserver line."""


def egress_environment(proxy_url: str, ca_cert: str | None) -> dict[str, str]:
    """What a policed subject gets on top of its environment: the proxy (both spellings,
    as tools read one or the other) and the proxy's CA as the one to trust."""
    env = {name: proxy_url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    env.update({"NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY})
    if ca_cert is not None:
        env.update({name: ca_cert for name in CA_VARIABLES})
    return env


def hosts_file(pinned: Mapping[str, str], base: str | None = None) -> str:
    """A policed sandbox's /etc/hosts: `base` (this machine's) with `pinned` names
    (name -> address) replacing any line that named them."""
    if base is None:
        try:
            with open("/etc/hosts", encoding="utf-8", errors="replace") as handle:
                base = handle.read()
        except OSError:
            base = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    kept = [
        line
        for line in base.splitlines()
        if not set(line.split("#", 1)[0].split()[1:]) & set(pinned)
    ]
    return "\n".join([*kept, *(f"{addr}\t{name}" for name, addr in pinned.items())]) + "\n"


def host_environment() -> Mapping[str, str]:
    """The relay's own environment (where credential values are read from)."""
    return os.environ
