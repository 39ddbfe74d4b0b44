"""Print the dependency lines of pyproject.toml that one image installs.

    python3 images/requirements.py operator|egress|relay [PYPROJECT]

Each image installs only what its programs import, with the version ranges
pyproject.toml gives them (one source of truth); a name missing from pyproject.toml
fails the build instead of installing an unpinned package.
"""

from __future__ import annotations

import re
import sys
import tomllib

GROUPS = {
    # `maka-eval operator`: the CLI's entry point, the Kubernetes client, kopf, metrics.
    "operator": ("pydantic", "pyyaml", "typer", "rich", "kubernetes", "kopf", "prometheus-client"),
    # The egress sidecar and gateway: the standard library, maka_eval's egress and
    # metering modules, mitmproxy, h11 (the gateway's HTTP/1.1 parser, which mitmproxy
    # brings too) and prometheus-client for the gateway's metrics.
    "egress": ("mitmproxy", "h11", "prometheus-client"),
    # The relay in a Pod: the standard library alone (PyInstaller is the build's own).
    "relay": (),
}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return re.sub(r"[-_.]+", "-", match.group()).lower() if match else ""


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in GROUPS:
        print(f"usage: requirements.py {'|'.join(GROUPS)} [pyproject.toml]", file=sys.stderr)
        return 2
    path = argv[1] if len(argv) == 2 else "pyproject.toml"
    with open(path, "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    by_name = {_name(d): d for d in deps}
    missing = [n for n in GROUPS[argv[0]] if n not in by_name]
    if missing:
        print(
            f"requirements.py: {', '.join(missing)} not in {path} [project.dependencies]",
            file=sys.stderr,
        )
        return 1
    print("\n".join(by_name[n] for n in GROUPS[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
