"""``ipywidgets`` imported by DuckDB while the home opens, executed only when first used.

In a Jupyter kernel, DuckDB's Python client imports ``ipywidgets`` with the first
connection of the process, to offer a progress bar in the notebook; importing it
executes every widget module (measured: 35–90 ms on a 2-core machine, about a
fifth of ``%load_ext apollia_nb``). Opening the home needs none of it, so while
the home opens ``ipywidgets`` is found with ``importlib.util.LazyLoader``: the
module object DuckDB receives (and ``sys.modules`` holds) runs its code on the
first attribute anyone reads — a widget view of a handle, an ``import ipywidgets``
in a cell, or DuckDB itself showing a progress bar. Nothing else changes: DuckDB
still sees ``ipywidgets`` installed, so its progress bars work as they would
without this extension, and the first use pays the import it would have paid
anyway. Outside that window (and when ``ipywidgets`` was already imported)
imports are untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__all__ = ["DEFERRED", "widgets_on_first_use"]

#: The modules found lazily while the home opens.
DEFERRED = frozenset({"ipywidgets"})


class _OnFirstUse(importlib.abc.MetaPathFinder):
    """Finds a module of ``DEFERRED`` with the other finders and wraps its loader in a ``LazyLoader``."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in DEFERRED:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = importlib.util.LazyLoader(spec.loader)
            return spec
        return None


@contextmanager
def widgets_on_first_use() -> Iterator[None]:
    """While the block runs, a first import of ``ipywidgets`` defers executing the module to its first use."""
    if all(name in sys.modules for name in DEFERRED):
        yield
        return
    finder: Any = _OnFirstUse()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        try:
            sys.meta_path.remove(finder)
        except ValueError:
            pass
