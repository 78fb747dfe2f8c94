"""``apollia-os mcp-gateway [--http HOST:PORT]``: the home's MCP servers, governed, for any MCP client.

Over stdio by default (standard output carries MCP alone); with ``--http`` over streamable HTTP at
``http://HOST:PORT/mcp``, loopback only unless ``--allow-remote``. See ``apollia_nb.federation.gateway``.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("mcp-gateway", parents=[common],
                       help="serve the home's MCP servers' tools to MCP clients, each call governed and journaled")
    p.add_argument("--http", default=None, metavar="HOST:PORT",
                   help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0 picks a free one)")
    p.add_argument("--allow-remote", action="store_true", help="allow --http on an address other than loopback")
    p.add_argument("--agent", default="mcp-gateway", metavar="NAME",
                   help="the home's agent the calls are made as (default mcp-gateway)")
    p.add_argument("--ask-timeout", type=float, default=300.0, metavar="SECS",
                   help="how long an asked call waits for a person before it is refused (default 300)")
    p.set_defaults(handler=_gateway)


def _gateway(args: argparse.Namespace) -> int:
    import anyio

    from apollia_nb.errors import BadInput
    from apollia_nb.federation.gateway import parse_listen, serve_http, serve_stdio

    if not args.ask_timeout > 0:
        raise BadInput("--ask-timeout must be a positive number of seconds")
    if args.http is None:
        anyio.run(lambda: serve_stdio(args.home, agent=args.agent, ask_timeout=args.ask_timeout))
        return 0
    host, port = parse_listen(args.http, allow_remote=args.allow_remote)
    anyio.run(lambda: serve_http(args.home, host=host, port=port, agent=args.agent, ask_timeout=args.ask_timeout))
    return 0
