"""The command form: ``apollia-os hook TOOL`` reads the hook input on stdin and answers on stdout.

A home served by ``apollia-os serve`` (its ``server.json``) is asked over HTTP, at the same
``POST /api/v1/hooks/{tool}`` the tool could call itself, with the token the server wrote; the
server decides, and an asked call waits there for a person. Otherwise this process opens the
home as its owner for the one call (the cost of opening a home; nobody else can answer then).

Fail closed, always: input that is not what the tool documents, a missing, locked or damaged
home, a server that does not answer or answers anything but the hook's JSON, an ``apollia.toml``
whose ``[hooks]`` does not read — each denies, with exit status 2 and the reason on stderr
(each tool documents 2 as "block"), never an exit status a tool takes as "no opinion".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from apollia_nb.hooks.codecs import MalformedHook, Reply, load, malformed_reply

__all__ = ["run_command", "forward", "SERVER_TIMEOUT_SECS"]

#: How long the command waits for a served home's answer: the longest ask wait, and some.
SERVER_TIMEOUT_SECS = 115.0


def run_command(tool: str, raw: bytes, home: str | None) -> Reply:
    """The reply to one hook input ``raw`` for ``tool`` on the home ``home`` (None: the default home)."""
    from apollia_nb.home import Home

    try:
        data = load(raw)
    except MalformedHook as exc:
        return malformed_reply(tool, f"apollia: malformed hook input: {exc.message}")
    try:
        where = Home.at(home, create=False)
        if not where.path.is_dir():
            return malformed_reply(tool, f"apollia denied the call: there is no apollia home at {where.path} "
                                         "(`apollia-os hook install` creates it)", data)
        if where.server_json.exists():
            return forward(tool, data, where.server_json)
        return _owned(tool, data, where)
    except Exception as exc:  # noqa: BLE001 - fail closed: whatever went wrong denies
        from apollia_nb.errors import ApolliaError

        why = f"{exc.code}: {exc.message}" if isinstance(exc, ApolliaError) else f"{type(exc).__name__}: {exc}"
        return malformed_reply(tool, f"apollia denied the call: the home could not decide it ({why})", data)


def _owned(tool: str, data: dict[str, Any], home: Any) -> Reply:
    import anyio

    from apollia_nb.federation import open_sources
    from apollia_nb.hooks.gate import answer_hook
    from apollia_nb.runtime import Runtime

    async def main() -> Reply:
        async with Runtime(home, tool_sources=open_sources) as rt:
            return await answer_hook(rt, tool, data, served=False)

    return anyio.run(main)


def forward(tool: str, data: dict[str, Any], server_json: Path, *, timeout: float = SERVER_TIMEOUT_SECS) -> Reply:
    """Ask the server named in ``server_json`` for the reply; anything but its hook JSON denies."""
    import http.client
    from urllib.parse import urlsplit

    try:
        advertised = json.loads(server_json.read_text(encoding="utf-8"))
        url, token = str(advertised["url"]), str(advertised["token"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return malformed_reply(tool, f"apollia denied the call: {server_json} does not read ({exc}); start the "
                                     "server again (`apollia-os serve`)", data)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return malformed_reply(tool, f"apollia denied the call: {server_json} names no server URL ({url!r})", data)
    path = parts.path.rstrip("/")
    path = (path if path.endswith("/api/v1") else path + "/api/v1") + f"/hooks/{tool}"
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(data).encode(),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        status = response.status
    except (OSError, http.client.HTTPException) as exc:
        return malformed_reply(tool, f"apollia denied the call: the home's server at {url} does not answer "
                                     f"({type(exc).__name__}: {exc}); start it (`apollia-os serve`), or remove "
                                     f"{server_json} if it is stale", data)
    finally:
        conn.close()
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status != 200 or not isinstance(answer, dict):
        detail = answer.get("message") if isinstance(answer, dict) else body[:200].decode("utf-8", "replace")
        return malformed_reply(tool, f"apollia denied the call: the home's server answered {status} ({detail})", data)
    exit_code = 2 if response.getheader("X-Apollia-Hook-Block") == "1" else 0
    stderr = response.getheader("X-Apollia-Hook-Reason") or ""
    return Reply(answer, exit_code=exit_code, stderr=_unquote(stderr))


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)
