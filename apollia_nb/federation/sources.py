"""Tool sources: what the runtime asks for federated tools, and the rules every source follows.

The runtime calls ``open_sources(rt)`` once at boot when ``apollia.toml`` has
``[mcp.servers.*]`` or ``[hosts.*]``. Each source then answers
``await source.tools(manifest)`` when an agent registers and is closed with
``await source.aclose()`` when the runtime closes.

Two rules hold for every source:

* **Only what the agent names.** A source returns the tools of its
  connection that the manifest lists in ``[tools] required/optional``. An
  agent that names none of them never causes the server to start or the
  host to be contacted.
* **A connection the organisation policy refuses is never contacted.**
  Before starting a server or fetching a document, a source reads the
  current governance snapshot; if its accepted policy refuses the
  connection, ``tools()`` raises ``REFUSED`` and the agent's tools from it
  stay unresolved (an optional one degrades the agent, a required one fails
  its start with ``UNKNOWN_TOOL``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from apollia_nb.errors import ApolliaError
from apollia_nb.federation.base import ToolSource, check_connection_allowed, named_tools
from apollia_nb.federation.config import parse_host, parse_mcp_server
from apollia_nb.federation.mcp import McpSource
from apollia_nb.federation.rest import RestSource

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.tools import ToolDef

__all__ = ["ToolSource", "open_sources", "named_tools", "check_connection_allowed"]


def open_sources(rt: Any) -> list[ToolSource]:
    """One source per configured MCP server and per host; a broken entry reports when asked."""
    sources: list[ToolSource] = []
    for name, table in rt.config.mcp_servers.items():
        try:
            sources.append(McpSource(rt, parse_mcp_server(name, table)))
        except ApolliaError as exc:
            sources.append(_Broken(f"mcp:{name}", exc))
    for name, table in rt.config.hosts.items():
        try:
            sources.append(RestSource(rt, parse_host(name, table)))
        except ApolliaError as exc:
            sources.append(_Broken(f"rest:{name}", exc))
    return sources


class _Broken:
    """A configuration entry that did not check: every agent naming its tools hears why."""

    def __init__(self, name: str, error: ApolliaError) -> None:
        self.name = name
        self.error = error

    async def tools(self, manifest: Any) -> "list[ToolDef]":
        if named_tools(manifest, self.name + "/"):
            raise self.error
        return []

    async def aclose(self) -> None:
        return None
