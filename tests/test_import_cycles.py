"""The package's import graph has no cycle, not even through imports made only for types
(``if TYPE_CHECKING:``) or inside functions: a lower module never names an upper one, it
states what it needs as a ``Protocol`` (STYLE.md, 15)."""

from __future__ import annotations

import ast
import graphlib
import itertools
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


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]`` (each imports the next), or None
    (the standard library's ``graphlib`` finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()  # a module's imports come before it
    except graphlib.CycleError as exc:
        found: list[str] = exc.args[1]  # each an import of the next: reversed, it reads on
        return found[::-1]
    return None


def test_the_package_has_no_import_cycle() -> None:
    cycle = _cycle(_graph(PACKAGE))
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or ())


def test_the_check_finds_cycles_and_sees_every_import() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
    }
    for cyclic, members in [
        (graph, {"a", "b", "c"}),
        ({"x": {"y"}, "y": {"x"}, "z": {"x"}}, {"x", "y"}),
    ]:
        cycle = _cycle(cyclic)
        assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == members
        assert all(later in cyclic[first] for first, later in itertools.pairwise(cycle))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
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
