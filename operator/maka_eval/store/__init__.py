"""The append-only file attempt store of the local executor."""
