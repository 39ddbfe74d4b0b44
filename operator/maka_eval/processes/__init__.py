"""Process tools for any part of maka-eval that starts, watches or stops processes.

Standard library only, importing nothing of maka-eval's: the process table read from
/proc and the attempt/run markers (`table`), the supervisor that starts and quiesces
whole process trees (`supervisor`), and bounded output capture (`output`). Below the
sandboxes, the relay, the store's lock and the local executor, which all use them.
"""
