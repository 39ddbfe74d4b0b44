"""Sandboxes: where the relay runs one cell's subject and verifier.

One interface (`base.Sandbox`), one backend per file: `process` (this machine, in
namespaces where it can) and `container` (the task's image through a Docker Engine API).
Standard library only at import time, so the relay can carry the package into task
containers; `container` loads the docker SDK only when it runs a container.
"""
