"""Pure experiment semantics: expansion, task groups, scheduling, status rules, selection.

No I/O and no clocks. The local executor, the relay and the operator call these same
functions, so local and cluster runs cannot drift apart. Modules here import nothing
heavier than the standard library (the relay bundle carries `status`, `usage` and
`classify`).
"""
