"""The experiment document: pydantic models, strict loading, messages with JSON paths.

The models are loaded when first named: `spec.task_directory` (one task's directory,
standard library only) is read by the relay inside a Pod, which must not load pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maka_eval.spec.experiment import Experiment, ExperimentSpec
    from maka_eval.spec.load import LoadedExperiment, load_experiment_file, load_experiment_text

_HOMES = {
    "Experiment": "maka_eval.spec.experiment",
    "ExperimentSpec": "maka_eval.spec.experiment",
    "LoadedExperiment": "maka_eval.spec.load",
    "load_experiment_file": "maka_eval.spec.load",
    "load_experiment_text": "maka_eval.spec.load",
}

__all__ = [
    "Experiment",
    "ExperimentSpec",
    "LoadedExperiment",
    "load_experiment_file",
    "load_experiment_text",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'maka_eval.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
