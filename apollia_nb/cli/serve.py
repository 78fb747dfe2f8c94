"""``apollia-os serve``: own the home and serve the REST API.

Loopback only unless ``--allow-remote``. Requests are answered only for the
loopback names (``localhost``, ``127.0.0.1``, ``[::1]``), the bound address and
each ``--allowed-host``; browser pages only from the server's own origin and
each ``--cors-origin``. The token comes from ``--token``, else
``$APOLLIA_TOKEN``, else is generated; it is written to ``<home>/server.json``
(mode 0600) and printed only with ``--print-token``. FastAPI and uvicorn are
imported when the command runs, not when the CLI starts. Once stopped (Ctrl+C,
SIGTERM), it says on stderr what it leaves for the next start: the runs
suspended on a person, those not started yet, those cut short while running.
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
    p.add_argument("--hub", default=None, metavar="URL",
                   help="also let JupyterHub users in: check a token that is not the owner's nor a person's at "
                        "this hub API (e.g. http://127.0.0.1:8081/hub/api); the hub user is the person of the "
                        "same name (default: $JUPYTERHUB_API_URL when run as a JupyterHub service, else none)")
    p.add_argument("--hub-service", default=None, metavar="NAME",
                   help="the JupyterHub service name whose access scope a hub token needs "
                        "(default: $JUPYTERHUB_SERVICE_NAME, else apollia)")
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

    listened: list[ServerInfo] = []

    def told(info: ServerInfo) -> None:
        listened.append(info)
        listening(info)

    run(args.home, host=args.host, port=args.port, token=args.token, allow_remote=args.allow_remote,
        allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors_origin), max_body_bytes=args.max_body_bytes, on_listening=told,
        log_level=args.log_level, hub=args.hub, hub_service=args.hub_service)
    if listened:
        print(f"apollia-os serve: stopped; {left_for_next_start(args.home)}", file=sys.stderr)
    return 0


def left_for_next_start(home: object) -> str:
    """What the stopped server left in the home's ``runtime.db`` for its next start, in words."""
    from apollia_nb.errors import ApolliaError
    from apollia_nb.home import Home
    from apollia_nb.runtime.records import open_records

    try:
        the_home = Home.at(home, create=False)  # type: ignore[arg-type]
        if not the_home.runtime_db.exists():
            return "no run was in progress"
        records = open_records(the_home)
        try:
            unfinished = records.tasks(unfinished=True)
        finally:
            records.close()
    except (ApolliaError, OSError) as exc:  # the home went elsewhere meanwhile: say what is known
        return f"the runs in progress could not be counted ({getattr(exc, 'message', exc)})"
    suspended = [t for t in unfinished if t["status"] == "waiting" and not t.get("watched", True)]
    queued = [t for t in unfinished if t["status"] == "pending" and not t.get("watched", True)]
    cut = [t for t in unfinished if t not in suspended and t not in queued]
    parts = []
    if suspended:
        parts.append(f"{_runs(len(suspended))} suspended, waiting on a person: each resumes when its decision is "
                     "answered, after `apollia-os serve` starts again on this home (`apollia-os pending list`)")
    if queued:
        parts.append(f"{_runs(len(queued))} not started yet: they start when `apollia-os serve` starts again")
    if cut:
        parts.append(f"{_runs(len(cut))} cut short while running (or waiting on a person who watched): the next "
                     "start records them failed INTERRUPTED, with what their journal holds")
    return "; ".join(parts) if parts else "no run was in progress"


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"
