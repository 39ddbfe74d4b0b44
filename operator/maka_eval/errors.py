"""User-facing errors: each names what is wrong (a JSON path, file, variable) and the fix.

Kept free of third-party imports: the relay, which must stay light, raises these too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with user input: where it is and what to do about it."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class MakaEvalError(Exception):
    """A mistake the user can fix; the CLI prints it without a traceback and exits non-zero."""

    exit_code = 2

    def __init__(self, summary: str, problems: Iterable[Problem] = ()) -> None:
        self.summary = summary
        self.problems = tuple(problems)
        super().__init__(self.render())

    def render(self) -> str:
        """The whole message: the summary, then one line per problem."""
        if not self.problems:
            return self.summary
        lines = [self.summary]
        lines.extend(f"  - {p}" for p in self.problems)
        return "\n".join(lines)


class SpecError(MakaEvalError):
    """The experiment document is not valid; every problem is listed with its JSON path."""


class TaskError(MakaEvalError):
    """A task directory named by the experiment is missing or malformed."""


class PrerequisiteError(MakaEvalError):
    """Something the run needs on this machine is missing; nothing was started."""


class StoreError(MakaEvalError):
    """The run directory cannot be used as asked (locked, different spec, tampered)."""


class CellSelectionError(MakaEvalError):
    """`--cell` names a cell that does not exist or must not be re-run."""


class ResourceError(MakaEvalError):
    """The machine ran out of something the run needs (disk space); the run stopped."""
