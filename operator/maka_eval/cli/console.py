"""The command's two consoles: results on stdout, warnings and errors on stderr."""

from __future__ import annotations

import sys

from rich.console import Console

# Tables stay readable in logs and pipes, where rich would otherwise assume 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
