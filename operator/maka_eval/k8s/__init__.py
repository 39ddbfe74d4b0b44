"""The Kubernetes mapping: custom resources (Experiment, Cell, Attempt) and their CRDs.

`resources` holds the pydantic models of the Cell and Attempt objects and of every
status; `crds` turns them (and the experiment's spec models) into the CustomResource-
Definitions under crds/, with the API server's immutability rules.
"""
