"""``apollia-os acp-proxy -- AGENT_COMMAND…``: an ACP agent governed by the home (``apollia_nb.acp``).

Standard input and output carry the Agent Client Protocol between the client (an editor, a
jupyter-ai persona) and the agent; nothing else is written to standard output. The exit status is
the agent's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("acp-proxy", parents=[common],
                       help="run an ACP agent with the home deciding its permission requests (stdio)")
    p.add_argument("--project", default=None, metavar="DIR",
                   help="the agent's project folder: its workspace and the second part of its name "
                        "(default: the current directory)")
    p.add_argument("--ask-timeout", type=float, default=300.0, metavar="SECS",
                   help="how long an asked permission waits for a person before it is refused (default 300)")
    p.add_argument("agent_command", nargs=argparse.REMAINDER, metavar="-- AGENT_COMMAND…",
                   help="the ACP agent's command line, after --")
    p.set_defaults(handler=_acp_proxy)


def _acp_proxy(args: argparse.Namespace) -> int:
    import anyio

    from apollia_nb.acp.proxy import run_proxy
    from apollia_nb.errors import BadInput

    command = list(args.agent_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise BadInput("name the ACP agent's command after --, e.g. apollia-os acp-proxy -- my-agent --acp")
    if not args.ask_timeout > 0:
        raise BadInput("--ask-timeout must be a positive number of seconds")
    project = Path(args.project) if args.project else None
    return int(anyio.run(lambda: run_proxy(command, home=args.home, project=project,
                                           ask_timeout=args.ask_timeout)))
