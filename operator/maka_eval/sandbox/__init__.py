"""Sandboxes: where the relay runs one cell's subject and verifier.

One interface (`base.Sandbox`), one backend per file. Standard library only: the relay
carries it into task containers.
"""
