"""`--help` shows flags as flags and values by what they mean, not by Python types."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from maka_eval.cli.main import app

runner = CliRunner()


def help_text(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "120"}, color=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", [(), ("validate",), ("run",), ("status",), ("results",)])
def test_options_show_no_python_types(command):
    text = help_text(*command)
    assert "<bool>" not in text and "<list[" not in text, text
    assert not re.search(r"--[\w-]+ <", text), text  # an option's value is named, not typed


def test_boolean_options_are_plain_flags():
    assert re.search(r"--version\s+Print the version", help_text())
    text = help_text("run")
    assert re.search(r"--force\s+With --cell", text)
    assert re.search(r"--keep-workspaces\s+Keep", text)
    assert re.search(r"--cell CELL_ID\s", text)
    assert re.search(r"--out DIR\s", text)
    assert re.search(r"--cells\s+Also list", help_text("validate"))


def test_choices_are_shown():
    assert "table|json|csv" in help_text("results")
