"""The experiment document: pydantic models, strict checks, messages with JSON paths.

The models are loaded when first named: `spec.task_directory` (one task's directory,
standard library only) is read by the relay inside a Pod, which must not load pydantic.
Loading an experiment on this machine (which also checks that the executor it names is
installed) is maka_eval.executors.load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maka_eval.spec.experiment import Experiment, ExperimentSpec
    from maka_eval.spec.load import LoadedExperiment

_HOMES = {
    "Experiment": "maka_eval.spec.experiment",
    "ExperimentSpec": "maka_eval.spec.experiment",
    "LoadedExperiment": "maka_eval.spec.load",
}

__all__ = ["Experiment", "ExperimentSpec", "LoadedExperiment"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'maka_eval.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
