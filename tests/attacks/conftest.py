"""Attacks, for real: subjects (and whatever else a hostile agent controls) that want
reward 1 without solving the task, another arm's credential, or a record rewritten.

Each test here runs the attack against the real thing (bubblewrap namespaces, Podman
containers, the egress proxy, the store) and asserts that it gains nothing and that the
record says what was seen. The fixtures are the local and sandbox tests' own.
"""

from __future__ import annotations

from tests.local.conftest import Setup, setup
from tests.sandbox.conftest import container_engine, engine

__all__ = ["Setup", "container_engine", "engine", "setup"]
