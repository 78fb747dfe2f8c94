"""``apollia-os mcp-gateway``: the home's MCP servers offered to any MCP client, every call governed.

The gateway is an MCP server (the ``mcp`` SDK's low-level ``Server``, over stdio or streamable
HTTP) in front of the servers configured in ``apollia.toml`` (``[mcp.servers.NAME]``). It opens the
home (as its owner, or as a client of ``apollia-os serve``), and registers one agent of the home
(``mcp-gateway`` unless told another name) whose tools are every tool those servers offer when it
starts. A tool ``T`` of server ``S`` is listed to the client as ``S__T`` (two tools that would be
listed under one name are offered under none) and called as ``mcp:S/T`` through the same path as
our own agents' MCP calls (``runtime.governed.governed_call`` and ``McpSource``): decided by
``decide()`` on the family the operator's ``families`` table gives it (unclassified otherwise),
journaled (``decision``, ``answer``, ``tool_call``, ``tool_result``), and run on the server's
connection, whose questions (elicitation) and model calls (sampling) become the home's pending
decisions the way they do for our agents.

A call that governance asks about waits on the home's pending decisions (answerable over REST,
the CLI, the panel) for up to ``ask_timeout`` seconds, then is refused by ``timeout``. A refused
call is an error result (``isError``) whose text says ``REFUSED`` and why; so is a call that failed.
A home that cannot be opened stops the gateway with its error: nothing is served ungoverned.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

import anyio

from apollia_nb.errors import ApolliaError, BadInput, Conflict

__all__ = [
    "ASK_TIMEOUT_SECS",
    "Gateway",
    "exposed_name",
    "exposed_names",
    "open_gateway",
    "parse_listen",
    "serve_http",
    "serve_stdio",
]

#: How long an asked call waits for a person by default.
ASK_TIMEOUT_SECS = 300.0
#: How long past its ask timeout a call may take before the client is told the home did not answer.
GRACE_SECS = 30.0
_SEPARATOR = "__"


def exposed_name(internal: str) -> str:
    """``mcp:S/T`` as the gateway lists it: ``S__T`` (MCP tool names take no ``:`` or ``/``)."""
    server, _, tool = internal[len("mcp:"):].partition("/")
    return f"{server}{_SEPARATOR}{tool}"


def exposed_names(internal: list[str]) -> tuple[dict[str, str], list[str]]:
    """The names the gateway lists (``S__T``: ``mcp:S/T``), and the tools left out because another
    tool would be listed under the same name (``mcp:a__b/c`` and ``mcp:a/b__c``): which of them a
    call would run is not the client's to guess, so neither is offered."""
    spelled: dict[str, list[str]] = {}
    for name in dict.fromkeys(internal):
        if name.startswith("mcp:") and "/" in name:
            spelled.setdefault(exposed_name(name), []).append(name)
    offered = {exposed: names[0] for exposed, names in spelled.items() if len(names) == 1}
    clashing = [name for names in spelled.values() if len(names) > 1 for name in names]
    return offered, clashing


def parse_listen(text: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` for ``--http``; a host other than loopback only with ``allow_remote``."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise BadInput(f"--http takes HOST:PORT (e.g. 127.0.0.1:8766, port 0 for a free one), got {text!r}")
    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not loopback and not allow_remote:
        raise BadInput(f"--http {text}: the gateway listens on loopback only unless --allow-remote is given")
    return host, int(port_text)


class Gateway:
    """The home's side of the gateway: the tools offered, and each call governed."""

    def __init__(self, rt: Any, agent: Any, *, ask_timeout: float = ASK_TIMEOUT_SECS) -> None:
        self.rt = rt
        self.agent = agent
        self.ask_timeout = ask_timeout
        self.run_id = f"gateway-{uuid.uuid4().hex[:12]}"
        self.names, self.clashing = exposed_names(list(agent.offered))

    def tools(self) -> list[Any]:
        import mcp_types as t

        listed = []
        for exposed, name in self.names.items():
            tooldef = self.agent.tools.get(name)
            hints = tooldef.annotations or {}
            listed.append(t.Tool(name=exposed, title=hints.get("title"), description=tooldef.description or None,
                                 input_schema=dict(tooldef.parameters)))
        return listed

    async def call(self, exposed: str, arguments: dict[str, Any] | None) -> Any:
        """One call of a listed tool, governed; the client's ``CallToolResult``. Whatever the home does
        meanwhile (a server that stops answering), the client has an answer once the ask timeout, a
        grace and the MCP server's own timeout have passed: an error result, the call owned by the
        runtime until it ends."""
        if exposed not in self.names:
            return _error(f"UNKNOWN_TOOL: the gateway offers no tool {exposed!r}")
        found: list[Any] = []
        ended = anyio.Event()

        async def governed() -> None:
            try:
                found.append(await self._call(self.names[exposed], dict(arguments or {})))
            finally:
                ended.set()

        self.rt.start_soon(governed)
        bound = self.ask_timeout + GRACE_SECS + self._server_timeout(self.names[exposed])
        with anyio.move_on_after(bound):
            await ended.wait()
        if found:
            return found[0]
        return _error(f"the home did not answer within {bound:g} s; the call may still be carried out "
                      "and journaled")

    def _server_timeout(self, name: str) -> float:
        """How long the call's server is given to answer (``timeout_secs`` of its configuration)."""
        server = name[len("mcp:"):].partition("/")[0]
        for source in self.rt.tool_sources:
            config = getattr(source, "config", None)
            if getattr(source, "server", None) == server and config is not None:
                return float(getattr(config, "timeout_secs", 0.0) or 0.0)
        return 0.0

    async def _call(self, name: str, arguments: dict[str, Any]) -> Any:
        import mcp_types as t

        from apollia_nb.runtime.governed import (
            continue_after_answer,
            governed_call,
            new_id,
        )

        error = _error
        rt, agent = self.rt, self.agent
        result = await governed_call(rt, agent, run_id=self.run_id, call_id=new_id("gw"), name=name,
                                     arguments=arguments, mode="unattended")
        card = result.card
        asked = result.decision.reason if result.decision is not None else None
        if result.status == "waiting" and card is not None:
            try:
                with anyio.move_on_after(self.ask_timeout):
                    await card.wait()
                if card.waiting:
                    try:
                        rt.answer(card.id, "refuse", by="timeout", reason=f"unanswered for {self.ask_timeout:g} s")
                    except Conflict:
                        pass  # answered elsewhere at the same moment: that answer stands
                    await card.wait()
            finally:
                if card.waiting:  # the client went away: nobody may answer a call no longer asked
                    with anyio.CancelScope(shield=True):
                        try:
                            rt.answer(card.id, "refuse", by="system", reason="the client that asked has gone")
                        except ApolliaError:
                            pass
            result = await continue_after_answer(rt, agent, card, decision=result.decision)
        if result.status == "ok":
            output = result.output
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
            return t.CallToolResult(content=[t.TextContent(type="text", text=text)])
        if result.status == "refused":
            why = result.error_message if asked is None or card is None else f"{asked}; {result.error_message}"
            return error(f"REFUSED: {why}")
        return error(f"{result.error_code}: {result.error_message}")

    def server(self) -> Any:
        """The MCP server the client talks to."""
        import mcp_types as t
        from mcp.server.lowlevel import Server

        async def list_tools(ctx: Any, params: Any) -> Any:
            return t.ListToolsResult(tools=self.tools())

        async def call_tool(ctx: Any, params: Any) -> Any:
            return await self.call(params.name, params.arguments)

        return Server("apollia-mcp-gateway", version=_version(),
                      instructions="The tools of this home's MCP servers; every call is decided and journaled.",
                      on_list_tools=list_tools, on_call_tool=call_tool)


def _error(text: str) -> Any:
    import mcp_types as t

    return t.CallToolResult(content=[t.TextContent(type="text", text=text)], is_error=True)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("apollia-nb")
    except Exception:
        return "0"


def _manifest(name: str, tools: list[str]) -> str:
    return "\n".join([
        f"name = {json.dumps(name)}",
        'description = "the MCP gateway: the home\'s MCP servers offered to MCP clients"',
        "[tools]",
        f"optional = {json.dumps(tools)}",
        "",
    ])


async def open_gateway(stack: Any, home: str | None, *, agent: str = "mcp-gateway",
                       ask_timeout: float = ASK_TIMEOUT_SECS, say: Callable[[str], None] | None = None) -> Gateway:
    """Open the home (held by ``stack``), read each configured server's tools, register the gateway's agent."""
    from apollia_nb.errors import HomeFileMissing
    from apollia_nb.federation.mcp import McpSource
    from apollia_nb.federation.sources import open_sources
    from apollia_nb.home import Home
    from apollia_nb.runtime import Runtime

    say = say or (lambda text: print(f"apollia-os mcp-gateway: {text}", file=sys.stderr, flush=True))
    where = Home.at(home, create=False)
    if not where.path.is_dir():
        raise HomeFileMissing(f"there is no home at {where.path}: point --home (or $APOLLIA_HOME) at one")
    rt = await stack.enter_async_context(Runtime(where, tool_sources=open_sources))
    names: list[str] = []
    for source in rt.tool_sources:
        if not isinstance(source, McpSource):
            continue
        try:
            names += await source.offered()
        except ApolliaError as exc:  # the others are still offered; this one is said
            say(f"{source.name}: its tools are not offered: {exc.code}: {exc.message}")
    if not names:
        say("no MCP server of the home offers a tool (configure [mcp.servers.NAME] in apollia.toml)")
    registered = await rt.register_agent(_manifest(agent, names))
    for warning in getattr(registered, "warnings", ()):
        say(warning)
    gateway = Gateway(rt, registered, ask_timeout=ask_timeout)
    for name in gateway.clashing:
        say(f"{name} is not offered: another tool would be listed under the same name ({exposed_name(name)})")
    return gateway


async def serve_stdio(home: str | None, *, agent: str = "mcp-gateway", ask_timeout: float = ASK_TIMEOUT_SECS) -> None:
    """Serve the gateway over this process's stdio until the client closes it."""
    import contextlib

    from mcp.server.stdio import stdio_server

    async with contextlib.AsyncExitStack() as stack:
        gateway = await open_gateway(stack, home, agent=agent, ask_timeout=ask_timeout)
        server = gateway.server()
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


async def serve_http(home: str | None, *, host: str, port: int, agent: str = "mcp-gateway",
                     ask_timeout: float = ASK_TIMEOUT_SECS) -> None:
    """Serve the gateway over streamable HTTP at ``http://HOST:PORT/mcp``; the address is printed
    on standard output once it listens (``port`` 0 picks a free one)."""
    import contextlib
    import socket

    import uvicorn

    async with contextlib.AsyncExitStack() as stack:
        gateway = await open_gateway(stack, home, agent=agent, ask_timeout=ask_timeout)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        app = gateway.server().streamable_http_app(host=host)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        shown = f"[{host}]" if ":" in host else host
        print(f"apollia-os mcp-gateway: listening on http://{shown}:{bound}/mcp", flush=True)
        await server.serve(sockets=[sock])
