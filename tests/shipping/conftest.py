"""Fixtures of the shipping tests: the control plane and the fake node of tests/k8s."""

from tests.k8s.conftest import control_plane, crds, kubectl, namespace  # noqa: F401
from tests.k8s.test_operator import node_agent  # noqa: F401
