"""``apollia-os serve``: own the home and serve the REST API.

Loopback only unless ``--allow-remote``. Requests are answered only for the
loopback names (``localhost``, ``127.0.0.1``, ``[::1]``), the bound address and
each ``--allowed-host``; browser pages only from the server's own origin and
each ``--cors-origin``. The token comes from ``--token``, else
``$APOLLIA_TOKEN``, else is generated; it is written to ``<home>/server.json``
(mode 0600) and printed only with ``--print-token``. FastAPI and uvicorn are
imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve the REST API for this home (owns the home)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default 0)")
    p.add_argument("--token", default=None,
                   help="bearer token (default: $APOLLIA_TOKEN, else a generated one); see server.json")
    p.add_argument("--allow-remote", action="store_true", help="allow binding an address other than loopback")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests for this host name (repeatable; '*' for any; default: loopback "
                        "names and the bound address)")
    p.add_argument("--print-token", action="store_true", help="print the token with the URL")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser calls from this origin (repeatable; default: no CORS)")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000, help="largest request body (default 1000000)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from apollia_nb.api.server import ServerInfo, run

    def listening(info: ServerInfo) -> None:
        if args.json:
            data = {"url": info.url, "pid": info.pid, **({"token": info.token} if args.print_token else {})}
            print(json.dumps(data))
        else:
            tail = f" token {info.token}" if args.print_token else ""
            print(f"apollia-os serve: listening on {info.url}{tail} (pid {info.pid}; stop with Ctrl+C)")
        sys.stdout.flush()

    run(args.home, host=args.host, port=args.port, token=args.token, allow_remote=args.allow_remote,
        allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors_origin), max_body_bytes=args.max_body_bytes, on_listening=listening,
        log_level=args.log_level)
    return 0
