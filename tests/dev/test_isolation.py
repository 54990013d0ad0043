"""The database never imports the development tooling: no module outside ``kafkakv.dev`` (and
the ``kafkakv dev-cluster`` command, which exists to run it) names ``kafkakv.dev`` in an
import, and importing the database's packages loads none of it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import kafkakv

PACKAGE = Path(kafkakv.__file__).resolve().parent
DEV = "kafkakv.dev"
ALLOWED = {
    PACKAGE / "dev",
    PACKAGE / "cli" / "devcluster_commands.py",
    PACKAGE / "cli" / "devspark_commands.py",
}
"""The dev package itself, and the commands that run it (importing it lazily)."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The module ``from ... import`` names, a relative one resolved against ``package``."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module name an import in ``tree`` names, relative imports resolved; also the
    constant argument of ``importlib.import_module(...)`` and ``__import__(...)`` calls."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names.add(str(first.value))
    return names


def _is_dev(name: str) -> bool:
    return name == DEV or name.startswith(DEV + ".")


def _violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if any(path == allowed or allowed in path.parents for allowed in ALLOWED):
            continue
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for name in sorted(_imported(tree, module, path.name == "__init__.py")):
            if _is_dev(name):
                found.append(f"{path.relative_to(root.parent)} imports {name}")
    return found


def test_no_database_module_imports_the_dev_package() -> None:
    assert (PACKAGE / "dev" / "__init__.py").is_file()
    assert _violations(PACKAGE) == []


def test_the_check_sees_every_form_of_import() -> None:
    forms = {
        "import kafkakv.dev.postgres": "kafkakv.dev.postgres",
        "from kafkakv.dev import DevCluster": "kafkakv.dev",
        "from kafkakv import dev": "kafkakv.dev",
        "from .. import dev": "kafkakv.dev",
        "from ..dev.errors import ClusterError": "kafkakv.dev.errors",
        "def f():\n    import kafkakv.dev": "kafkakv.dev",
        "importlib.import_module('kafkakv.dev.cluster')": "kafkakv.dev.cluster",
    }
    for source, expected in forms.items():
        names = _imported(ast.parse(source), "kafkakv.pipeline.jdbc", False)
        assert expected in names, source
        assert any(_is_dev(name) for name in names), source
    harmless = "import kafkakv.devices\nfrom kafkakv import db\n'kafkakv.dev in a string'"
    assert not any(_is_dev(n) for n in _imported(ast.parse(harmless), "kafkakv.x", False))


def test_importing_the_database_loads_no_dev_module() -> None:
    code = (
        "import json, sys\n"
        "import kafkakv, kafkakv.db, kafkakv.pipeline, kafkakv.directory, kafkakv.cli.main\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kafkakv'))))\n"
    )
    path = os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    loaded = json.loads(done.stdout)
    assert "kafkakv.pipeline.postgres" in loaded  # the imports above did run
    assert [name for name in loaded if _is_dev(name)] == []
