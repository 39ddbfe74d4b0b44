"""The relay: runs ONE cell (prepare, launch, quiesce, verify, classify, result frame).

Standard library and the pure engine rules only: it is injected into arbitrary task
images and must not import the CLI, the operator or heavy libraries.
"""
