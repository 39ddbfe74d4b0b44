"""The embedded local executor: cells as processes on this machine, a file store."""
