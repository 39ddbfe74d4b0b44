"""Imports run one way: no cycle between modules, no edge up the layer table.

The graph is read from the source with `ast`, so a lazy import inside a function counts
the same as one at the top of a module: it runs, and it ties the two modules together.
Imports under `if TYPE_CHECKING:` are treated in two ways:

- For cycles between modules they do not count. They never run, and they are the usual
  way for two modules of one package to name each other's types.
- For the layer table they count. A type named from a layer above is still a
  dependency on it (a change up there breaks the checker down here), so the layer
  check, which also rules out every cycle between units, sees them too.

A unit is a package directly under maka_eval (`spec`, `relay`, ...) or a module directly
under it (`errors`, `strict_json`, ...). When a package is added, moved or split, place it
in `LAYERS` below with a line saying why it sits there.
"""

from __future__ import annotations

import ast
import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import maka_eval

PACKAGE = "maka_eval"
SOURCE = Path(maka_eval.__file__).resolve().parent

# Bottom first. A unit may import units of LOWER layers only: two units in one layer are
# independent of each other (put one above the other to let it import the other).
LAYERS: tuple[tuple[str, ...], ...] = (
    # Leaves: standard library only, nothing of ours. The package root holds only the
    # version; errors is the one user-error hierarchy; strict_json the one JSON reader;
    # printable the escaping of untrusted text for terminals and pages; layout the
    # host and in-sandbox paths and MAKA_EVAL_* names every layer agrees on.
    ("maka_eval", "errors", "strict_json", "printable", "layout"),
    # Generic process tools over /proc and pipes (supervise, signal, capture output):
    # shared by the sandboxes, the relay, the store's lock and the local executor.
    ("processes",),
    # Pure semantics and its vocabulary (statuses, usage, result contracts, reserved
    # names, task settings): standard library only, carried by the relay bundle, so it
    # can never need the pydantic spec at run time; it takes plain values (a Protocol
    # where it reads an experiment). Below the spec, which validates with that
    # vocabulary: the one direction in which neither side needs a third package.
    ("engine",),
    # Formats over the engine's vocabulary, standard library only: the result kernel and
    # attempt record (contract), metered usage and prices (metering).
    ("contract", "metering"),
    # The egress policy and proxy addons: blocklist rules and metering, no spec.
    ("egress",),
    # The experiment document (pydantic): it validates against the vocabulary below
    # (result contracts, reserved names, blocklist entries, model names), never against
    # what is installed (the executor registry is above; the loader checks kinds there).
    ("spec",),
    # What reads and writes the spec's records and files: the file store, artifact
    # storage. And the sandboxes, which know processes and files but no spec.
    ("store", "artifacts", "sandbox"),
    # The relay runs one cell in a sandbox (stdlib at run time in a Pod).
    ("relay",),
    # The executor plug-in interface and registry, and loading an experiment with the
    # installed executors' checks.
    ("executors",),
    # The executors themselves: each runs attempts its own way, none knows the others.
    ("local", "k8s", "harbor"),
    # Reading results, from a run folder or a cluster (analysis.cluster reads the CRs).
    ("analysis",),
    # The command line: the edge of the house, imports anything, imported by nothing.
    ("cli",),
)


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` at `line`; `typing` when only under TYPE_CHECKING."""

    source: str
    target: str
    line: int
    typing: bool

    def __str__(self) -> str:
        path = _path_of(self.source)
        kind = " (under TYPE_CHECKING)" if self.typing else ""
        return f"{self.source} -> {self.target}  [{path}:{self.line}]{kind}"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _path_of(module: str) -> str:
    return str(MODULES[module].relative_to(SOURCE.parent.parent))


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _known(name: str) -> str | None:
    """The module of ours that importing `name` runs last (`a.b.C` -> `a.b`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = module.split(".") if _is_package(module) else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        origin = ".".join([*base, *([node.module] if node.module else [])])
    else:
        origin = node.module or ""
    for alias in node.names:
        # `from pkg import mod` runs pkg.mod; `from mod import name` runs mod only.
        submodule = f"{origin}.{alias.name}"
        yield submodule if submodule in MODULES else origin


def _edges_of(module: str, source: str | None = None) -> Iterator[Edge]:
    text = MODULES[module].read_text() if source is None else source
    tree = ast.parse(text, str(MODULES[module]))

    def walk(node: ast.AST, typing: bool) -> Iterator[Edge]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name in _targets(child, module):
                    target = _known(name)
                    if target is not None and target != module:
                        yield Edge(module, target, child.lineno, typing)
            if isinstance(child, ast.If) and _type_checking(child):
                for statement in child.body:
                    yield from walk(ast.Module([statement], []), True)
                for statement in child.orelse:
                    yield from walk(ast.Module([statement], []), typing)
            else:
                yield from walk(child, typing)

    yield from walk(tree, False)


EDGES = list(dict.fromkeys(edge for module in MODULES for edge in _edges_of(module)))


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _layer_of() -> dict[str, int]:
    return {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan), each as one
    closed path through it, so the message shows the loop itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth: the longest import chain (< 100)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _loop_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest closed path through the component's first node (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph[node] & component):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"no loop through {start}")  # pragma: no cover - a component has one


def test_the_reader_sees_every_kind_of_import():
    # Guards the reader itself, on a made-up body for a real module.
    source = """
import maka_eval.errors
from maka_eval import strict_json
from maka_eval.engine.status import AttemptStatus
from . import documents
from .experiment import Experiment
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from maka_eval.contract.kernel import ResultKernel
else:
    from maka_eval.printable import escaped
def lazy():
    from maka_eval.metering import pricing
"""
    edges = {(e.target, e.typing, e.line) for e in _edges_of("maka_eval.spec.load", source)}
    assert edges == {
        ("maka_eval.errors", False, 2),
        ("maka_eval.strict_json", False, 3),
        ("maka_eval.engine.status", False, 4),
        ("maka_eval.spec.documents", False, 5),
        ("maka_eval.spec.experiment", False, 6),
        ("maka_eval.contract.kernel", True, 9),
        ("maka_eval.printable", False, 11),
        ("maka_eval.metering.pricing", False, 13),
    }
    assert len(MODULES) > 100 and len(EDGES) > 500  # and it found the real tree


def test_no_module_imports_itself_through_others():
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for edge in EDGES:
        if not edge.typing:
            graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    where = {(e.source, e.target): e for e in EDGES if not e.typing}
    report = []
    for component in cycles:
        loop = _loop_in(graph, set(component))
        report.append(
            f"import cycle among {len(component)} modules ({', '.join(component)}), e.g.:\n"
            + "\n".join(f"    {where[a, b]}" for a, b in itertools.pairwise(loop))
        )
    assert not cycles, "\n".join(report)


def test_every_unit_has_a_layer():
    layer = _layer_of()
    assert len(layer) == sum(map(len, LAYERS)), "a unit is listed twice in LAYERS"
    units = {_unit(module) for module in MODULES}
    assert not units - set(layer), f"place these in LAYERS: {sorted(units - set(layer))}"
    assert not set(layer) - units, f"LAYERS lists what is gone: {sorted(set(layer) - units)}"


def test_imports_run_down_the_layers():
    layer = _layer_of()
    upward = [
        edge
        for edge in EDGES
        if _unit(edge.source) != _unit(edge.target)
        and layer.get(_unit(edge.target), -1) >= layer.get(_unit(edge.source), -1)
    ]
    by_pair: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for edge in upward:
        by_pair[_unit(edge.source), _unit(edge.target)].append(edge)
    report = [
        f"{source} (layer {layer.get(source)}) imports {target} (layer {layer.get(target)}):\n"
        + "\n".join(f"    {edge}" for edge in edges)
        for (source, target), edges in sorted(by_pair.items())
    ]
    assert not upward, "imports against the layer table:\n" + "\n".join(report)
