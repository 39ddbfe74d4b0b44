"""`executor.kind: harbor`: each attempt is one trial of Harbor itself (docs/harbor.md).

Two halves that never import each other: `bridge/` runs inside Harbor's own Python
environment (standard library and Harbor only: the relay Agent, a Podman environment for
offline no-network tasks, the trial worker), and the rest runs in maka-eval's (the
executor plug-in, its configuration, reading Harbor's trial results).
"""
