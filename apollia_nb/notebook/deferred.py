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

The first use may come from two threads at once (a cell and the side panel's
subshell, or DuckDB's own threads): the module's code runs once, under a lock,
and every other thread waits for it to finish rather than reading a module that
is half executed. The standard library's ``LazyLoader`` before Python 3.13 does
not (CPython issue 114763); ``_Loader`` follows the 3.13 design on every version.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

__all__ = ["DEFERRED", "widgets_on_first_use"]

#: The modules found lazily while the home opens.
DEFERRED = frozenset({"ipywidgets"})


class _Deferred(types.ModuleType):
    """A module whose code has not run yet: the first attribute read (from any thread) runs it, once."""

    def __getattribute__(self, attr: str) -> Any:
        spec = object.__getattribute__(self, "__spec__")
        state = spec.loader_state
        with state["lock"]:
            if object.__getattribute__(self, "__class__") is _Deferred:
                real = state["__class__"]
                if state["is_loading"]:  # the module's own code, or what it imports, reads it: no second run
                    return real.__getattribute__(self, attr)
                state["is_loading"] = True
                now = real.__getattribute__(self, "__dict__")
                then = state["__dict__"]
                # what was set on the module before its code ran is kept, as an eager import would have it
                updated = {k: v for k, v in now.items() if k not in then or v is not then[k]}
                spec.loader.exec_module(self)
                if spec.name in sys.modules and sys.modules[spec.name] is not self:
                    raise ValueError(f"module object for {spec.name!r} substituted in sys.modules during a lazy load")
                now.update(updated)
                self.__class__ = real
        return getattr(self, attr)

    def __delattr__(self, attr: str) -> None:
        self.__getattribute__(attr)  # runs the module's code, and raises if it has no such attribute
        delattr(self, attr)


class _Loader(importlib.util.LazyLoader):
    """``LazyLoader`` whose module runs its code under a lock on its first use (see the module's text)."""

    def exec_module(self, module: ModuleType) -> None:
        spec: Any = module.__spec__
        spec.loader = module.__loader__ = self.loader  # type: ignore[attr-defined]  # set by LazyLoader.__init__
        spec.loader_state = {"__dict__": module.__dict__.copy(), "__class__": module.__class__,
                             "lock": threading.RLock(), "is_loading": False}
        module.__class__ = _Deferred


class _OnFirstUse(importlib.abc.MetaPathFinder):
    """Finds a module of ``names`` with the other finders and wraps its loader in ``_Loader``."""

    def __init__(self, names: frozenset[str] = DEFERRED) -> None:
        self.names = names

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.names:
            return None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
            return spec
        return None


@contextmanager
def widgets_on_first_use(names: frozenset[str] = DEFERRED) -> Iterator[None]:
    """While the block runs, a first import of ``ipywidgets`` (or of ``names``) defers executing the module
    to its first use."""
    if all(name in sys.modules for name in names):
        yield
        return
    finder: Any = _OnFirstUse(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        try:
            sys.meta_path.remove(finder)
        except ValueError:
            pass
