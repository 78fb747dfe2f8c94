"""The in-kernel tools: an agent reads (and, with consent, writes) the notebook's variables.

``notebook_get_variable(name)`` and ``notebook_list_variables()`` are family
``read``; ``notebook_set_variable(name, value)`` is ``write``, so it asks
unless the agent holds a standing consent. The bodies are the runtime's
built-ins (``apollia_nb.runtime.builtins``), bound here to the kernel's user
namespace: large objects (DataFrames, arrays) are summarised, never dumped.

An agent declared in a cell gets them as tools of its registration: all three
when its manifest lists no tools (every built-in is offered), otherwise those
its ``[tools]`` lists name.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["NOTEBOOK_TOOLS", "notebook_tools"]

NOTEBOOK_TOOLS = ("notebook_get_variable", "notebook_list_variables", "notebook_set_variable")


def notebook_tools(namespace: Callable[[], MutableMapping[str, Any]], manifest: Any) -> list[Any]:
    """The notebook tools ``manifest`` may use, bound to ``namespace()`` (the kernel's ``user_ns``)."""
    from apollia_nb.runtime.builtins import builtin_tools

    wanted = set(NOTEBOOK_TOOLS)
    listed = set(manifest.tools_required) | set(manifest.tools_optional)
    if listed:
        wanted &= listed
    # The workspace is not used by the notebook tools; only their namespace matters.
    return [t for t in builtin_tools(Path("."), namespace=namespace) if t.name in wanted]
