"""Federation: tools that live in other programs, governed like any other tool.

* ``mcp:<server>/<tool>`` — the tools of MCP servers (``[mcp.servers.NAME]``),
  over stdio or streamable HTTP (``apollia_nb.federation.mcp``);
* ``rest:<host>/<operationId>`` — the operations of a host product's REST API,
  from its OpenAPI document (``[hosts.NAME]``, ``apollia_nb.federation.rest``),
  so the host stays the system of record.

The runtime calls ``open_sources(rt)`` at boot and asks each source for the
tools an agent names when it registers (``apollia_nb.federation.sources``).
Nothing here imports ``mcp`` or ``httpx`` until a server or host is used.
"""

from __future__ import annotations

from apollia_nb.federation.sources import ToolSource, open_sources

__all__ = ["ToolSource", "open_sources"]
