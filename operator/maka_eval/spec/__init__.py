"""The experiment document: pydantic models, strict loading, messages with JSON paths."""

from maka_eval.spec.experiment import Experiment, ExperimentSpec
from maka_eval.spec.load import LoadedExperiment, load_experiment_file, load_experiment_text

__all__ = [
    "Experiment",
    "ExperimentSpec",
    "LoadedExperiment",
    "load_experiment_file",
    "load_experiment_text",
]
