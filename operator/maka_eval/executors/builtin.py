"""maka-eval's own executors, registered in the `maka_eval.executors` group like any other.

Their configuration is part of maka-eval's schema (and of the CRD), and each has its own
driver: `local` is the event-driven run loop of `maka_eval.local.executor` (the relay
in-process, no worker round trip), `kubernetes` is the operator (a Pod per attempt). So
the registry lists them, `validate` and `prerequisites` answer for them, and
`run_attempt` says where their attempts run instead of running one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from maka_eval.contract.kernel import ResultKernel
from maka_eval.errors import Problem
from maka_eval.executors.base import AttemptRequest, Prerequisite, RunContext
from maka_eval.spec.experiment import KubernetesExecutorConfig, LocalExecutorConfig

if TYPE_CHECKING:
    from maka_eval.spec.experiment import Experiment


class _Builtin:
    kind = ""
    config_model: type[BaseModel] = BaseModel
    driver = ""

    def validate(self, config: Any, experiment: Experiment) -> Sequence[Problem]:
        return ()  # the spec models and spec/rules.py check everything

    def prerequisites(
        self, config: Any, experiment: Experiment, host_env: Mapping[str, str]
    ) -> Sequence[Prerequisite]:
        return ()  # checked by the driver itself (local/prerequisites.py, the operator)

    def prepare(self, context: RunContext) -> None:
        return None

    def run_attempt(self, request: AttemptRequest) -> ResultKernel:
        raise RuntimeError(
            f"executor '{self.kind}' runs its attempts through {self.driver}, not through "
            "the plug-in loop"
        )


class LocalBuiltin(_Builtin):
    kind = "local"
    config_model = LocalExecutorConfig
    driver = "maka_eval.local.executor.LocalRun (maka-eval run)"


class KubernetesBuiltin(_Builtin):
    kind = "kubernetes"
    config_model = KubernetesExecutorConfig
    driver = "the maka-eval operator (kubectl apply -f)"


LOCAL = LocalBuiltin()
KUBERNETES = KubernetesBuiltin()
