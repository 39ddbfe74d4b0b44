"""Executor plug-ins: the interface (base) and the registry (entry points)."""
