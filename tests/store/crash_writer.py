"""A writer killed (SIGKILL) at one moment of a commit, for the crash tests.

    python -m tests.store.crash_writer RUN_DIR MOMENT

commits attempt 1 of cell t::1::s, then attempt 2, and dies at MOMENT of the second:
`before-line` (its record written and fsync'd, its ledger line not), `torn-line` (half
its line written), `before-head` (its line written, the head not moved on).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from maka_eval.store import ledger
from maka_eval.store.run_store import RunWriter
from tests.store.test_run_store import IDENTITY, record


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    run_dir, moment = Path(sys.argv[1]), sys.argv[2]
    writer = RunWriter.open(run_dir, IDENTITY, "0")
    first = writer.reserve("t", 1, "s")
    writer.commit(first, record(writer, first))
    if moment == "before-line":
        ledger.LedgerWriter.append = lambda self, *args: die()  # type: ignore[method-assign]
    elif moment == "torn-line":
        write_all = ledger._write_all

        def torn(fd: int, data: bytes) -> None:
            if data.endswith(b" t::1::s\n"):  # a record's line, not the head
                os.write(fd, data[: len(data) // 2])
                die()
            write_all(fd, data)

        ledger._write_all = torn
    elif moment == "before-head":
        ledger.LedgerWriter._write_head = lambda self: die()  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown moment {moment}")
    second = writer.reserve("t", 1, "s")
    writer.commit(second, record(writer, second))
    raise SystemExit("the writer should have died")


if __name__ == "__main__":
    main()
