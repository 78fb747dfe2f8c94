"""The package's imports follow its layers and have no circle (``docs/architecture.md``, "Layers").

Every import of every module of ``apollia_nb`` is counted: module-level, inside functions and
under ``TYPE_CHECKING``. A layer imports only layers below it; two packages of one layer import
each other only where ``MAY_USE`` says so. No import circle anywhere: between the modules of one
package, across packages, or between packages. ``KNOWN_VIOLATIONS`` lists the edges still to be
moved, each with its reason; any other violation fails, and so does an entry that no longer is one.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "apollia_nb"
DOC = ROOT / "docs" / "architecture.md"

#: Each top-level module or package of ``apollia_nb`` and its layer (lower is lower). A new one is
#: placed here (and in the doc's table) before it can be imported at all.
LAYERS: dict[str, int] = {
    # ground: what every layer may import
    "apollia_nb": 0,  # the root: __version__ and the IPython extension hooks (see ENTRY_POINTS)
    "apollia_nb.errors": 0,
    "apollia_nb.home": 0,
    "apollia_nb.config": 0,
    "apollia_nb.faults": 0,
    "apollia_nb.dbutil": 0,
    "apollia_nb.serverinfo": 0,
    "apollia_nb.wire": 0,
    # the signed record and the decisions
    "apollia_nb.governance": 1,
    "apollia_nb.journal": 1,
    "apollia_nb.runtime": 2,
    "apollia_nb.federation": 3,
    "apollia_nb.acp": 3,  # the ACP proxy: an outside agent governed by the home, as federation brings in tools
    "apollia_nb.hooks": 3,
    # surfaces
    "apollia_nb.api": 4,
    "apollia_nb.sdk": 4,
    "apollia_nb.notebook": 4,
    "apollia_nb.cli": 4,
    "apollia_nb.witness": 4,
    "apollia_nb.__main__": 4,
}

LAYER_NAMES = {0: "ground", 1: "governance, journal", 2: "runtime", 3: "federation", 4: "surfaces"}

#: Packages of one layer that may import each other, in this direction only.
MAY_USE: dict[str, set[str]] = {
    "apollia_nb.governance": {"apollia_nb.journal"},  # the home's files are accounted for by the journal
    "apollia_nb.cli": {"apollia_nb.api", "apollia_nb.sdk", "apollia_nb.witness"},  # serve, batch, witness serve
    # each opens the home's runtime and hands it the federated tool sources apollia.toml names
    "apollia_nb.acp": {"apollia_nb.federation"},
    "apollia_nb.hooks": {"apollia_nb.federation"},
    "apollia_nb.__main__": {"apollia_nb.cli"},  # python -m apollia_nb
}

#: Calls from outside the package's import order: ``%load_ext apollia_nb`` needs its hooks in the
#: root package; they import the notebook extension when IPython calls them, never at import.
ENTRY_POINTS = {("apollia_nb", "apollia_nb.notebook.extension")}

#: Edges that still break the layers or close a circle, each with why it is still here. Shrink it.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
    # layers
    # circles
}


#: Of ``KNOWN_VIOLATIONS``, the edges being moved to the module named beside each: each may be there
#: or gone. Drop both entries once it is gone.
MOVING: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's ``__init__`` is the package)
    line: int
    function_level: bool
    type_checking: bool


def module_name(path: Path, root: Path = PACKAGE_DIR) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _dynamic_import(call: ast.Call) -> str | None:
    """What ``importlib.import_module(...)`` or ``__import__(...)`` imports: the name when it is a
    literal; for an f-string, the package its literal start names (``f"apollia_nb.journal.{m}"``)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rpartition(".")[0] or None
    return None


def imports_of(path: Path, module: str, known: dict[str, Path]) -> list[Import]:
    """Every import in ``path`` of a module in ``known``, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = module.split(".")[0]
    found: list[Import] = []

    def add(name: str, node: ast.stmt | ast.expr, in_function: bool, type_checking: bool) -> None:
        if name.split(".")[0] != top:
            return
        if name != module:  # a name not in ``known`` is a module of the package that does not exist
            found.append(Import(module, name, node.lineno, in_function, type_checking))

    def walk(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            f = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            t = type_checking or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, f, t)
            elif isinstance(child, ast.Call) and (name := _dynamic_import(child)) is not None:
                add(name, child, f, t)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                for alias in child.names:  # ``from pkg import mod`` imports the module
                    full = f"{base}.{alias.name}"
                    add(full if full in known else base, child, f, t)
            walk(child, f, t)

    walk(ast.parse(path.read_text(), str(path)), False, False)
    return found


def all_imports(root: Path = PACKAGE_DIR) -> list[Import]:
    known = modules(root)
    return [i for m, p in known.items() for i in imports_of(p, m, known)]


def owner(module: str, layers: dict[str, int] = LAYERS) -> str | None:
    """The entry of ``layers`` a module belongs to (its top-level module or package)."""
    name = ".".join(module.split(".")[:2])  # the root package owns only its own __init__
    return name if name in layers else None


def layer_problem(i: Import, layers: dict[str, int] = LAYERS,
                  may_use: dict[str, set[str]] = MAY_USE) -> str | None:
    a, b = owner(i.source, layers), owner(i.target, layers)
    if a is None or b is None:
        return f"{i.source if a is None else i.target} has no layer: place it in LAYERS and the doc's table"
    if a == b or (i.source, i.target) in ENTRY_POINTS or layers[a] == layers[b] == 0:
        return None  # the ground's modules use each other freely (never in a circle)
    if layers[b] > layers[a]:
        return f"{a} (layer {layers[a]}) imports {b} (layer {layers[b]}), above it"
    if layers[b] == layers[a] and b not in may_use.get(a, set()):
        return f"{a} imports {b} of its own layer, which MAY_USE does not allow"
    return None


def graph(imports: list[Import], skip: set[tuple[str, str]] = set()) -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for i in imports:
        if (i.source, i.target) not in skip and (i.source, i.target) not in ENTRY_POINTS:
            g.setdefault(i.source, set()).add(i.target)
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same edges between the packages (and top-level modules) of ``LAYERS``."""
    out: dict[str, set[str]] = {}
    for a, targets in g.items():
        for b in targets:
            pa, pb = owner(a), owner(b)
            if pa and pb and pa != pb:
                out.setdefault(pa, set()).add(pb)
    return out


def _where(imports: list[Import], edge: tuple[str, str]) -> str:
    lines = sorted({i.line for i in imports if (i.source, i.target) == edge})
    return f"{edge[0]} -> {edge[1]} (line {', '.join(map(str, lines))})"


# --- the package ----------------------------------------------------------------------------------


def test_every_import_names_a_module_of_the_package() -> None:
    known = modules()
    missing = sorted(f"{i.source} (line {i.line}) imports {i.target}" for i in all_imports() if i.target not in known)
    assert not missing, "no such module: " + "; ".join(missing)


def test_no_layer_is_imported_from_below() -> None:
    imports = all_imports()
    assert len({i.source for i in imports}) > 80  # the walk sees the whole package
    problems = sorted({(i.source, i.target): p for i in imports
                       if (p := layer_problem(i)) and (i.source, i.target) not in KNOWN_VIOLATIONS}.items())
    assert not problems, "\n".join(f"{_where(imports, e)}: {p}" for e, p in problems)


def test_no_import_cycle_anywhere() -> None:
    imports = all_imports()
    g = graph(imports, skip=set(KNOWN_VIOLATIONS))
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    cycle = find_cycle(package_graph(g))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_each_known_violation_is_still_there_and_gives_its_reason() -> None:
    edges = {(i.source, i.target) for i in all_imports()}
    gone = sorted(e for e in KNOWN_VIOLATIONS if e not in edges and e not in MOVING)
    assert not gone, f"no longer imported: take them out of KNOWN_VIOLATIONS: {gone}"
    assert all(len(reason) > 20 for reason in KNOWN_VIOLATIONS.values())
    assert MOVING <= set(KNOWN_VIOLATIONS)


def test_nothing_in_the_package_imports_the_composition_root() -> None:
    importers = sorted({i.source for i in all_imports() if i.target == "apollia_nb.runtime.runtime"
                        and i.source != "apollia_nb.runtime"})
    assert importers == [], f"{importers} import runtime.py; type them against runtime/capabilities.py"


def test_the_doc_lists_the_layers_of_the_test() -> None:
    text = DOC.read_text()
    rows = re.findall(r"^\| (\d) \| ([^|]+) \| ([^|]+) \|", text, re.M)
    documented = {name.strip("` "): int(n) for n, _, names in rows for name in names.split(",")
                  if name.strip("` ")}
    expected = {m.removeprefix("apollia_nb.").replace(".", "/") if m != "apollia_nb" else "apollia_nb/__init__": n
                for m, n in LAYERS.items()}
    assert documented == expected


# --- the walk itself ------------------------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "apollia_nb"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_walk_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/a.py": "def f():\n    from apollia_nb.runtime.b import x\n",
        "runtime/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from apollia_nb.runtime import c\n",
        "runtime/c.py": "from .a import f\n",
    })
    imports = all_imports(root)
    a_b = next(i for i in imports if i.source == "apollia_nb.runtime.a")
    assert a_b.function_level and not a_b.type_checking and a_b.target == "apollia_nb.runtime.b"
    assert next(i for i in imports if i.source == "apollia_nb.runtime.b").type_checking
    assert find_cycle(graph(imports)) == ["apollia_nb.runtime.a", "apollia_nb.runtime.b",
                                          "apollia_nb.runtime.c", "apollia_nb.runtime.a"]


def test_an_import_by_name_at_run_time_is_counted(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "journal/__init__.py": "", "journal/store.py": "",
        "journal/a.py": "import importlib\ndef f(m):\n    return importlib.import_module(f'apollia_nb.api.{m}')\n",
        "journal/b.py": "def g():\n    return __import__('apollia_nb.journal.store')\n",
        "api/__init__.py": "", "api/app.py": "",
    })
    imports = {(i.source, i.target) for i in all_imports(root)}
    assert ("apollia_nb.journal.a", "apollia_nb.api") in imports
    assert ("apollia_nb.journal.b", "apollia_nb.journal.store") in imports
    i = next(i for i in all_imports(root) if i.source == "apollia_nb.journal.a")
    assert "above it" in (layer_problem(i) or "")


def test_an_import_of_a_module_that_is_not_there_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"notebook/__init__.py": "", "notebook/batch.py":
                            "from apollia_nb.notebook.arguments import magic_parser\nfrom apollia_nb import errors\n",
                            "errors.py": ""})
    known = modules(root)
    assert [i.target for i in all_imports(root) if i.target not in known] == ["apollia_nb.notebook.arguments"]


def test_an_upward_import_is_found_even_inside_a_function(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "journal/__init__.py": "",
        "journal/store.py": "def open_():\n    from apollia_nb.runtime.tasks import Task\n",
        "runtime/__init__.py": "", "runtime/tasks.py": "Task = 1\n",
        "cli/__init__.py": "", "cli/x.py": "from apollia_nb import sdk\n",
        "sdk/__init__.py": "", "api/__init__.py": "", "api/y.py": "import apollia_nb.sdk\n",
        "newthing.py": "from apollia_nb import errors\n", "errors.py": "",
    })
    problems = {(i.source, i.target): layer_problem(i) for i in all_imports(root)}
    assert "above it" in (problems[("apollia_nb.journal.store", "apollia_nb.runtime.tasks")] or "")
    assert problems[("apollia_nb.cli.x", "apollia_nb.sdk")] is None  # allowed by MAY_USE
    assert "own layer" in (problems[("apollia_nb.api.y", "apollia_nb.sdk")] or "")
    assert "has no layer" in (problems[("apollia_nb.newthing", "apollia_nb.errors")] or "")


def test_a_cycle_between_packages_through_different_modules_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "governance/__init__.py": "", "governance/a.py": "from apollia_nb.journal import b\n",
        "journal/__init__.py": "", "journal/b.py": "", "journal/c.py": "import apollia_nb.governance.d\n",
        "governance/d.py": "",
    })
    g = graph(all_imports(root))
    assert find_cycle(g) is None
    assert find_cycle(package_graph(g)) == ["apollia_nb.governance", "apollia_nb.journal", "apollia_nb.governance"]


# --- the runtime is a composition root: its collaborators use what it hands them, never its privates -------

#: The names a ``Runtime`` goes by where another module holds one.
RUNTIME_NAMES = frozenset({"rt", "runtime", "_rt", "_runtime"})


def private_reaches(root: Path) -> list[str]:
    """Every ``rt._x`` (``runtime._x``, ``self.rt._x``, ``run.rt._x`` …) outside ``runtime/runtime.py``,
    and every underscore member of a ``Protocol`` in ``runtime/capabilities.py``, as ``path:line what``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if rel != "apollia_nb/runtime/runtime.py":
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                        and not node.attr.startswith("__")):
                    continue
                holder = node.value
                name = holder.id if isinstance(holder, ast.Name) else (
                    holder.attr if isinstance(holder, ast.Attribute) else None)
                if name in RUNTIME_NAMES:
                    found.append(f"{rel}:{node.lineno} {name}.{node.attr}")
        if rel == "apollia_nb/runtime/capabilities.py":
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                for item in cls.body:
                    if (isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("_")
                            and not item.name.startswith("__")):
                        found.append(f"{rel}:{item.lineno} {cls.name}.{item.name}")
    return found


def test_nothing_outside_the_runtime_reaches_its_private_members() -> None:
    assert private_reaches(PACKAGE_DIR) == []


def test_a_private_reach_into_the_runtime_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "runtime/__init__.py": "",
        "runtime/runtime.py": "class Runtime:\n    def f(self, rt):\n        return rt._x\n",
        "runtime/tasks.py": "def f(self):\n    self.rt._notify(1)\n    return self.rt.notify\n",
        "runtime/capabilities.py": "class Host:\n    def _emit(self): ...\n    def emit(self): ...\n",
        "api/internal.py": "def f(runtime):\n    return runtime._remote, runtime.__class__\n",
    })
    assert private_reaches(root) == ["apollia_nb/api/internal.py:2 runtime._remote",
                                      "apollia_nb/runtime/capabilities.py:2 Host._emit",
                                      "apollia_nb/runtime/tasks.py:2 rt._notify"]
