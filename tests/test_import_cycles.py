"""The package's import graph has no cycle, not even through imports made only for types
(``if TYPE_CHECKING:``) or inside functions: a lower module never names an upper one, it
states what it needs as a ``Protocol`` (STYLE.md, 15)."""

from __future__ import annotations

import ast
from pathlib import Path

import kafkakv
from tests.dev.test_isolation import _module_name, from_module

PACKAGE = Path(kafkakv.__file__).resolve().parent


def _graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package under ``root`` and the package's modules it imports."""
    paths = {_module_name(path): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        names = _imports(tree, module, path.name == "__init__.py", set(paths))
        graph[module] = names - {module}
    return graph


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules among ``modules`` that an import anywhere in ``tree`` names, relative
    imports resolved: ``from a import b`` names module ``a.b`` if there is one, else ``a``
    (a package whose ``__init__`` imports its own modules is no cycle with them)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return names & modules


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each as one cycle through it: ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(_cycle_in(graph, set(component)))
    return found


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle through the first module of ``component`` (a breadth-first search back)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in {sorted(component)}")


def test_the_package_has_no_import_cycle() -> None:
    cycles = [" -> ".join(cycle) for cycle in _cycles(_graph(PACKAGE))]
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_check_finds_cycles_and_sees_every_import() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
    }
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y", "x"]]
    modules = {"kafkakv.map", "kafkakv.map.engine", "kafkakv.map.ops", "kafkakv.errors"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import ops\n"
        "if TYPE_CHECKING:\n"
        "    from kafkakv.map.engine import ReplicaEngine\n"
        "def f():\n"
        "    import kafkakv.errors\n"
    )
    names = _imports(ast.parse(source), "kafkakv.map.metrics", False, modules)
    assert names == {"kafkakv.map.engine", "kafkakv.map.ops", "kafkakv.errors"}
