"""The result contract: what one attempt produced, in one format every executor parses.

Standard library only. The relay writes the result kernel (`kernel.py`), bounded to
fit a container termination message; the local executor and the operator read it back
with the same parser; the attempt record (`record.py`) is that kernel plus the
attempt's identity, and is what the file store keeps.
"""
