"""Draw the two homes behind one contract into docs/architecture.md, from the code.

The diagram is a Mermaid ``graph`` generated from the ``Protocol`` faces
(``journal/contract.py``, ``governance/contract.py``,
``runtime/capabilities.py``), the classes that keep each face (found by
comparing their members, as the type checker does by signature), and the
modules of ``runtime/`` typed against each capability (found in their
imports). It replaces whatever sits between the ``<!-- homes:start -->`` and
``<!-- homes:end -->`` markers of the doc.

    python dev/docs/make_architecture_diagram.py           # rewrite the doc
    python dev/docs/make_architecture_diagram.py --check   # exit 1 if the doc has drifted

The test suite runs the check, so a face or an implementation changed without
regenerating the doc fails.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any, Protocol

START = "<!-- homes:start -->"
END = "<!-- homes:end -->"
LAYERS_START = "<!-- layers:start -->"
LAYERS_END = "<!-- layers:end -->"
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def members(face: type) -> set[str]:
    """The names a ``Protocol`` asks for, its bases' included."""
    names: set[str] = set()
    for klass in face.__mro__:
        if klass in (Protocol, object) or not getattr(klass, "_is_protocol", False):
            continue
        names.update(n for n in vars(klass) if not (n.startswith("__") and n.endswith("__")))
        names.update(getattr(klass, "__annotations__", {}))
    return names - {"_is_protocol", "_is_runtime_protocol", "_abc_impl"}


def keeps(cls: type, face: type) -> bool:
    """Whether ``cls`` has every member of ``face`` (its own, not the face's placeholders)."""
    return all(any(name in vars(k) for k in cls.__mro__ if k is not object) or _set_in_init(cls, name)
               for name in members(face))


def _set_in_init(cls: type, name: str) -> bool:
    """An attribute assigned in the class body's methods (``self.journal = ...``) or annotated on it."""
    return name in getattr(cls, "__annotations__", {}) or name in _assigned(cls)


@functools.cache
def _assigned(cls: type) -> frozenset[str]:
    """The ``self.<name>`` attributes the class's methods assign."""
    import inspect

    try:
        tree = ast.parse(inspect.getsource(cls).lstrip())
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    return frozenset(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                     and isinstance(n.value, ast.Name) and n.value.id == "self")


def model() -> dict[str, Any]:
    """Faces, the classes that keep them, and the runtime modules typed against each capability."""
    from apollia_nb.governance import contract as governance_contract
    from apollia_nb.governance.store import GovernanceStore
    from apollia_nb.journal import contract as journal_contract
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime import capabilities
    from apollia_nb.runtime.records import RuntimeRecords
    from apollia_nb.runtime.remote import RemoteGovernance, RemoteJournal
    from apollia_nb.runtime.runtime import Runtime

    stores = [journal_contract.JournalFace, governance_contract.GovernanceFace, capabilities.RecordsFace]
    hosts = [getattr(capabilities, n) for n in capabilities.__all__ if n != "RecordsFace"]
    homes = {
        "owner home": [Journal, GovernanceStore, RuntimeRecords],
        "client of apollia-os serve": [RemoteJournal, RemoteGovernance],
    }
    kept = {face.__name__: sorted(c.__name__ for cs in homes.values() for c in cs if keeps(c, face))
            for face in stores}
    hosted = {face.__name__: keeps(Runtime, face) for face in hosts}
    users: dict[str, list[str]] = {face.__name__: [] for face in hosts}
    names = set(users)
    for path in sorted((ROOT / "apollia_nb" / "runtime").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "apollia_nb.runtime.capabilities":
                for alias in node.names:
                    if alias.name in names:
                        users[alias.name].append(path.stem)
    return {"homes": {h: [c.__name__ for c in cs] for h, cs in homes.items()}, "kept": kept,
            "hosted": hosted, "users": users}


def mermaid(m: dict[str, Any]) -> str:
    lines = ["```mermaid", "graph LR"]
    for i, (home, classes) in enumerate(m["homes"].items()):
        lines.append(f'    subgraph home{i}["{home}"]')
        lines.extend(f"        {c}" for c in classes)
        lines.append("    end")
    lines.append('    subgraph faces["one contract"]')
    lines.extend(f"        {face}{{{{{face}}}}}" for face in m["kept"])
    lines.append("    end")
    for face, classes in m["kept"].items():
        lines.extend(f"    {c} -. keeps .-> {face}" for c in classes)
    lines.append('    Runtime["Runtime (runtime.py, the composition root)"]')
    for face in m["kept"]:
        lines.append(f"    Runtime --> {face}")
    for host, ok in m["hosted"].items():
        if ok:
            lines.append(f"    Runtime -. keeps .-> {host}([{host}])")
        for module in m["users"][host]:
            lines.append(f'    {module}["{module}.py"] --> {host}')
    lines.append("```")
    return "\n".join(lines)


def render() -> str:
    return ("<!-- Generated by dev/docs/make_architecture_diagram.py from the faces and the classes that keep"
            " them; do not edit by hand. -->\n\n" + mermaid(model()))


def _state_diagrams() -> Any:
    """The state-diagram generator beside this script, whose region rewriting and command line this reuses."""
    spec = importlib.util.spec_from_file_location("make_state_diagrams", Path(__file__).with_name("make_state_diagrams.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_graph() -> Any:
    """``tests/test_import_graph.py``: the layers and the walk over every import that checks them."""
    path = Path(__file__).resolve().parents[2] / "tests" / "test_import_graph.py"
    spec = importlib.util.spec_from_file_location("_import_graph_rules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while the module runs
    spec.loader.exec_module(module)
    return module


def layers_mermaid() -> str:
    """The layers, bottom up, with the imports between the packages above the ground (every layer uses it)."""
    g = _import_graph()
    edges = g.package_graph(g.graph(g.all_imports(), skip=set(g.KNOWN_VIOLATIONS)))
    node = {name: name.removeprefix("apollia_nb.").replace(".", "_") if name != "apollia_nb" else "root"
            for name in g.LAYERS}
    label = {name: name.removeprefix("apollia_nb.") if name != "apollia_nb" else "apollia_nb/__init__"
             for name in g.LAYERS}
    lines = ["graph BT"]
    for layer in sorted(set(g.LAYERS.values())):
        lines.append(f'    subgraph L{layer}["{layer} {g.LAYER_NAMES[layer]}"]')
        lines += [f'        {node[n]}["{label[n]}"]' for n in g.LAYERS if g.LAYERS[n] == layer]
        lines.append("    end")
    for layer in sorted(set(g.LAYERS.values()))[:-1]:
        lines.append(f"    L{layer} --- L{layer + 1}")
    for source in sorted(edges):
        for target in sorted(edges[source]):
            if g.LAYERS[source] and g.LAYERS[target]:
                lines.append(f"    {node[source]} --> {node[target]}")
    return "```mermaid\n" + "\n".join(lines) + "\n```\n"


def render_layers() -> str:
    return ("<!-- Generated by dev/docs/make_architecture_diagram.py from the layers of tests/test_import_graph.py"
            " and the package's imports; do not edit by hand. -->\n\n" + layers_mermaid())


def rewrite(text: str) -> str:
    text = _state_diagrams().replace_region(text, START, END, render())
    if LAYERS_START in text:
        text = _state_diagrams().replace_region(text, LAYERS_START, LAYERS_END, render_layers())
    return text


def main(argv: list[str] | None = None) -> int:
    return _state_diagrams().run(argv, description=__doc__.splitlines()[0], doc=DOC, rewrite=rewrite,
                                 stale="the homes or layers diagram differs from the code; "
                                       "run python dev/docs/make_architecture_diagram.py")


if __name__ == "__main__":
    sys.exit(main())
