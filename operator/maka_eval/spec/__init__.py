"""The experiment document: pydantic models, strict checks, messages with JSON paths.

Loading one on this machine (which also checks the executor it names is installed) is
maka_eval.executors.load.
"""

from maka_eval.spec.experiment import Experiment, ExperimentSpec
from maka_eval.spec.load import LoadedExperiment

__all__ = ["Experiment", "ExperimentSpec", "LoadedExperiment"]
