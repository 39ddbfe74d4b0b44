"""What maka-eval runs inside Harbor's own Python environment (stdlib and Harbor only).

maka-eval copies this folder into a private folder as the package `maka_eval_harbor`,
beside the standard-library part of `maka_eval` the relay reads its plan with
(harbor.worker.PLAN_READER), and puts that folder on Harbor's PYTHONPATH: the rest of
maka-eval's package and its dependencies never enter Harbor's interpreter.
"""
