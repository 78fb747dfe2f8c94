"""``apollia_nb/runtime/`` has no import circle: ``runtime.py`` composes, the modules it composes
never import it back (they are typed against ``runtime/capabilities.py``).

Every import is counted: module-level, inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "apollia_nb.runtime"
RUNTIME = Path(__file__).resolve().parent.parent / "apollia_nb" / "runtime"


def _imports(path: Path, module: str) -> set[str]:
    """The ``apollia_nb.runtime`` modules ``path`` imports, anywhere in it."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith(PACKAGE + ".") and name.count(".") == PACKAGE.count(".") + 1:
                found.add(name)
    return found


def import_graph(directory: Path = RUNTIME) -> dict[str, set[str]]:
    modules = {f"{PACKAGE}.{p.stem}": p for p in sorted(directory.glob("*.py")) if p.name != "__init__.py"}
    return {m: {d for d in _imports(p, m) if d in modules and d != m} for m, p in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_runtime_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.runtime" in graph and f"{PACKAGE}.chat" in graph[f"{PACKAGE}.runtime"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in apollia_nb/runtime/: " + " -> ".join(cycle or [])


def test_the_walk_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from apollia_nb.runtime.b import x\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from apollia_nb.runtime import c\n")
    (tmp_path / "c.py").write_text("from .a import f\n")
    graph = import_graph(tmp_path)
    assert find_cycle(graph) == [f"{PACKAGE}.a", f"{PACKAGE}.b", f"{PACKAGE}.c", f"{PACKAGE}.a"]


def test_nothing_in_the_package_imports_the_composition_root() -> None:
    graph = import_graph()
    importers = sorted(m for m, deps in graph.items() if f"{PACKAGE}.runtime" in deps)
    assert importers == [], f"{importers} import runtime.py; type them against runtime/capabilities.py"
