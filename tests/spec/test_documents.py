"""Hostile documents: deep nesting, alias bombs, special files, non-finite numbers."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from maka_eval import strict_json
from maka_eval.errors import SpecError
from maka_eval.executors.load import load_experiment_file, load_experiment_text
from maka_eval.spec import documents
from tests.helpers import spec

MAKA_EVAL = Path(sys.executable).with_name("maka-eval")
DEEP = 2000


def deep_json(levels: int) -> str:
    return '{"schemaVersion": "maka.eval.v1", "x": ' + "[" * levels + "]" * levels + "}"


def deep_yaml(levels: int) -> str:
    return "schemaVersion: maka.eval.v1\nx: " + "[" * levels + "]" * levels + "\n"


@pytest.mark.parametrize(
    ("text", "name"), [(deep_json(DEEP), "e.json"), (deep_yaml(DEEP), "e.yaml")]
)
def test_deep_nesting_is_a_clear_error(tmp_path, text, name):
    with pytest.raises(SpecError) as info:
        load_experiment_text(text, name, tmp_path)
    assert f"nested more than {documents.MAX_DEPTH} levels deep" in info.value.render()


@pytest.mark.parametrize(("text", "name"), [(deep_json(150), "e.json"), (deep_yaml(150), "e.yaml")])
def test_nesting_below_the_recursion_limit_is_refused_too(tmp_path, text, name):
    with pytest.raises(SpecError, match="nested more than"):
        load_experiment_text(text, name, tmp_path)


@pytest.mark.parametrize(
    ("text", "name"), [(deep_json(DEEP), "e.json"), (deep_yaml(DEEP), "e.yaml")]
)
def test_the_cli_reports_deep_nesting_without_a_traceback(tmp_path, text, name):
    path = tmp_path / name
    path.write_text(text)
    done = subprocess.run(
        [str(MAKA_EVAL), "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr
    assert "nested more than" in done.stdout + done.stderr


BOMB = "\n".join(
    [
        "schemaVersion: maka.eval.v1",
        'a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)),
    ]
)


def test_an_alias_bomb_is_refused_in_bounded_memory(tmp_path):
    # Run in a child with a 1 GiB address-space limit: a full expansion (9**10 strings)
    # would need far more, so the child dies unless the loader refuses early. The timeout
    # only ends a hang (a loader that expands without allocating).
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from maka_eval.errors import SpecError\n"
        "from maka_eval.executors.load import load_experiment_file\n"
        "try:\n"
        f"    load_experiment_file({str(path)!r})\n"
        "except SpecError as exc:\n"
        "    print(exc.render())\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=os.getcwd()
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "aliases expand" in done.stdout, done.stdout


def test_alias_bomb_in_process_is_refused_within_a_small_memory_budget(tmp_path):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SpecError, match="aliases expand"):
        load_experiment_text(BOMB, "bomb.yaml", tmp_path)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024


def test_modest_aliases_are_fine(tmp_path):
    doc = spec()
    text = yaml.safe_dump(doc) + "budget: &b {maxTokens: 10}\n"
    assert load_experiment_text(text, "e.yaml", tmp_path).experiment.spec.budget.max_tokens == 10


def test_a_document_over_the_size_cap_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec()) + "#" * documents.MAX_DOCUMENT_BYTES + "\n")
    with pytest.raises(SpecError) as info:
        load_experiment_file(path)
    text = info.value.render()
    assert str(path) in text and "1 MiB" in text
    with pytest.raises(SpecError, match="1 MiB"):
        load_experiment_text(path.read_text(), "big.yaml", tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "experiment.yaml"
    os.mkfifo(fifo)
    code = (
        "from maka_eval.errors import SpecError\n"
        "from maka_eval.executors.load import load_experiment_file\n"
        "try:\n"
        f"    load_experiment_file({str(fifo)!r})\n"
        "except SpecError as exc:\n"
        "    print(exc.render())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert "is not a regular file" in done.stdout, done


def test_a_device_is_refused(tmp_path):
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    for path in (Path("/dev/zero"), link):
        with pytest.raises(SpecError, match="is not a regular file"):
            load_experiment_file(path)


def test_a_symlink_to_a_regular_file_still_loads(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(spec()))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert load_experiment_file(link).experiment.id == "exp"


def test_strict_json_refuses_duplicates_nonfinite_and_deep_documents():
    with pytest.raises(strict_json.DuplicateKeyError):
        strict_json.loads('{"a": 1, "a": 2}')
    for constant in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(ValueError, match=f"'{constant}' is not a JSON number"):
            strict_json.loads(f'{{"a": [{constant}]}}')
    assert strict_json.loads("[1e308, -0.5]") == [1e308, -0.5]
    with pytest.raises(ValueError, match="nested too deeply"):
        strict_json.loads("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested more than 3 levels"):
        strict_json.loads("[[[[1]]]]", max_depth=3)
    assert strict_json.loads("[[[1]]]", max_depth=3) == [[[1]]]


def test_the_spec_side_reads_json_only_through_the_strict_reader():
    root = Path(documents.__file__).parent
    for module in root.glob("*.py"):
        text = module.read_text()
        assert not re.search(r"(?<![\w])json\.loads?\(", text), module
