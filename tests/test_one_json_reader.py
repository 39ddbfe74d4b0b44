"""Every JSON document maka-eval reads goes through the one strict reader."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "maka_eval"


def test_no_module_parses_json_by_itself():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "strict_json.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bjson\.loads?\(", line):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == [], "use maka_eval.strict_json:\n" + "\n".join(offenders)
