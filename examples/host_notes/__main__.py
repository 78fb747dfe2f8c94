"""Start the notes host: ``python -m examples.host_notes [--port 0] [--stdio]``.

Over HTTP it prints its base URL on the first line of standard output once it
listens (MCP at ``<url>/mcp``, OpenAPI at ``<url>/openapi.json``). With
``--stdio`` it speaks MCP on standard input and output instead (notes only).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from examples.host_notes.app import NotesStore, build_app, build_mcp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.host_notes", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    parser.add_argument("--data", type=Path, help="keep notes and summaries in this JSON file (default: in memory)")
    parser.add_argument("--token", default=os.environ.get("NOTES_TOKEN"),
                        help="require this bearer token on /summaries (default $NOTES_TOKEN; unset: no token)")
    parser.add_argument("--faults", action="store_true", help="enable POST /_fail (for tests only)")
    parser.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout instead of HTTP")
    args = parser.parse_args(argv)
    store = NotesStore(args.data)
    if args.stdio:
        import anyio

        anyio.run(build_mcp(store).run_stdio_async)
        return 0
    return _serve_http(build_app(store, token=args.token, faults=args.faults), args.host, args.port)


def _serve_http(app: object, host: str, port: int) -> int:
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            print(f"http://{shown}:{bound}", flush=True)

    server = Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
