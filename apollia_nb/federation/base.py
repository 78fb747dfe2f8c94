"""What every tool source is, and the two rules it follows (``federation/sources.py`` tells them).

The MCP and REST sources take these from here; ``sources.py`` builds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from apollia_nb.errors import Refused

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.tools import ToolDef

__all__ = ["ToolSource", "check_connection_allowed", "named_tools"]


class ToolSource(Protocol):
    name: str

    async def tools(self, manifest: Any) -> "list[ToolDef]": ...

    async def aclose(self) -> None: ...


def named_tools(manifest: Any, prefix: str) -> list[str]:
    """The tool names under ``prefix`` the manifest declares, in declared order."""
    declared = [*getattr(manifest, "tools_required", ()), *getattr(manifest, "tools_optional", ())]
    return [name for name in dict.fromkeys(declared) if name.startswith(prefix)]


def check_connection_allowed(rt: Any, connection: str) -> None:
    """Raise ``REFUSED`` when the accepted organisation policy refuses ``connection``."""
    policy = rt.governance.view().policy
    if policy is not None and connection in policy.refuse_connections:
        raise Refused(f"organisation policy refuses the connection {connection!r}; it is not contacted")
