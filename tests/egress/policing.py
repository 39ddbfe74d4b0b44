"""What tests that police a cell for real need: root, nftables and bubblewrap."""

from __future__ import annotations

import os

import pytest

from maka_eval.local import netns
from maka_eval.sandbox import process

WHY_NOT = (
    "egress enforcement needs root"
    if os.geteuid() != 0
    else netns.enforcement_unavailable() or process.namespaces_unavailable()
)
"""Why no cell can be policed on this machine, or None."""

POLICED = [
    pytest.mark.slow,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"cannot police a cell here: {WHY_NOT}"),
]
"""The marks (pytestmark) of a module whose tests police cells."""
