"""``apollia-os mcp-gateway``: the ``mcp`` SDK's client, the gateway, and ``server-everything`` (npm,
installed by dev/install-test-mcp-servers.sh) behind it over stdio, as configured in the home.

Over stdio on an owned home, and over streamable HTTP (port 0) as a client of a served home whose
pending decisions are answered over REST. Each test has its own home under ``tmp_path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import duckdb
import httpx
import pytest
from test_federation_support import EVERYTHING_JS, node, require_peer, write_config

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadInput
from apollia_nb.federation.gateway import exposed_name, parse_listen
from apollia_nb.home import Home
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime

TOKEN = "gateway-token"


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("APOLLIA_HOME", "APOLLIA_TOKEN")}


@pytest.fixture
def gateway_home(tmp_path: Path) -> Home:
    home = Home.at(tmp_path / "home")
    write_config(home, servers={"everything": {
        "command": node(), "args": [str(require_peer(EVERYTHING_JS)), "stdio"],
        "families": {"echo": "read", "get-sum": "write", "get-env": "read"}}})

    async def rules() -> None:
        async with Runtime(home, tool_sources=open_sources) as rt:
            rt.governance.add_rule("mcp:everything/get-env", "deny", by="test")
    anyio.run(rules)
    return home


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def journal_rows(home: Home, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_over_stdio_each_call_is_governed_and_journaled_as_the_servers_tool(gateway_home):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    home = gateway_home

    async def main() -> dict[str, Any]:
        params = StdioServerParameters(
            command=sys.executable, env=environment(),
            args=["-m", "apollia_nb", "mcp-gateway", "--home", str(home.path), "--ask-timeout", "1"])
        seen: dict[str, Any] = {}
        async with Client(stdio_client(params)) as client:
            listed = await client.list_tools()
            seen["names"] = [t.name for t in listed.tools]
            seen["echo_schema"] = next(t.input_schema for t in listed.tools if t.name == "everything__echo")
            seen["echo"] = await client.call_tool("everything__echo", {"message": "hello"})
            seen["env"] = await client.call_tool("everything__get-env", {})  # a deny rule
            seen["sum"] = await client.call_tool("everything__get-sum", {"a": 1, "b": 2})  # asked, nobody answers
            seen["unknown"] = await client.call_tool("everything__nope", {})
            seen["raw"] = await client.call_tool("mcp:everything/echo", {"message": "x"})  # only listed names
        return seen

    seen = anyio.run(main)
    assert {"everything__echo", "everything__get-sum", "everything__get-env"} <= set(seen["names"])
    assert all(name.startswith("everything__") for name in seen["names"])
    assert "message" in seen["echo_schema"]["properties"]
    assert not seen["echo"].is_error and text_of(seen["echo"]) == "Echo: hello"
    assert seen["env"].is_error and text_of(seen["env"]).startswith("REFUSED: ")
    assert "deny" in text_of(seen["env"])
    assert seen["sum"].is_error and "refused by timeout" in text_of(seen["sum"])
    assert seen["unknown"].is_error and "UNKNOWN_TOOL" in text_of(seen["unknown"])
    assert seen["raw"].is_error and "UNKNOWN_TOOL" in text_of(seen["raw"])

    decisions = journal_rows(home, "SELECT tool, outcome, line, answered_by, agent FROM decisions ORDER BY seq")
    assert decisions == [("mcp:everything/echo", "allow", 3, None, "mcp-gateway"),
                         ("mcp:everything/get-env", "refuse", 2, None, "mcp-gateway"),
                         ("mcp:everything/get-sum", "ask", 6, "timeout", "mcp-gateway")]
    calls = journal_rows(home, "SELECT tool, status FROM tool_calls ORDER BY started_at")
    assert calls == [("mcp:everything/echo", "ok"), ("mcp:everything/get-env", "refused"),
                     ("mcp:everything/get-sum", "refused")]


def wait_pending(api: httpx.Client, tool: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in api.get("/pending-decisions").json() if p["tool"] == tool]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no pending decision for {tool}")


def test_over_http_an_asked_call_is_answered_over_rest_on_a_served_home(gateway_home):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    home = gateway_home
    with ServerThread(home, token=TOKEN) as srv, \
            httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=30) as api:
        proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "mcp-gateway", "--home", str(home.path),
                                 "--http", "127.0.0.1:0"], env=environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert "listening on http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
            url = line.split("listening on ", 1)[1].strip()

            async def main() -> dict[str, Any]:
                seen: dict[str, Any] = {}
                async with Client(streamable_http_client(url)) as client:
                    async with anyio.create_task_group() as tg:
                        async def asked() -> None:
                            seen["sum"] = await client.call_tool("everything__get-sum", {"a": 2, "b": 3})
                        async def refused() -> None:
                            seen["links"] = await client.call_tool("everything__get-resource-links", {"count": 1})
                        tg.start_soon(asked)
                        tg.start_soon(refused)
                        answer_sum = await anyio.to_thread.run_sync(wait_pending, api, "mcp:everything/get-sum")
                        answer_links = await anyio.to_thread.run_sync(wait_pending, api,
                                                                      "mcp:everything/get-resource-links")
                        seen["pending"] = (answer_sum, answer_links)
                        for pending, answer in ((answer_sum, "once"), (answer_links, "refuse")):
                            done = await anyio.to_thread.run_sync(
                                lambda p=pending, a=answer: api.post("/pending-decisions/decide",
                                                                     json={"id": p["id"], "answer": a}))
                            assert done.status_code == 200, done.text
                return seen

            seen = anyio.run(main)
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    sum_pending, links_pending = seen["pending"]
    assert sum_pending["agent"] == "mcp-gateway" and sum_pending["answers"] == ["once", "always", "refuse"]
    assert links_pending["family"] is None and links_pending["answers"] == ["once", "refuse"]  # unclassified
    assert not seen["sum"].is_error and "5" in text_of(seen["sum"])
    assert seen["links"].is_error and "REFUSED" in text_of(seen["links"]) and "refused by" in text_of(seen["links"])
    answers = {r[0]: r[1:] for r in journal_rows(home, "SELECT tool, answer, outcome FROM decisions")}
    assert answers["mcp:everything/get-sum"] == ("once", "ask")
    assert answers["mcp:everything/get-resource-links"] == ("refuse", "ask")
    assert ("mcp:everything/get-sum", "ok") in journal_rows(home, "SELECT tool, status FROM tool_calls")


def test_a_home_that_cannot_be_opened_serves_nothing_and_http_is_loopback_unless_allowed(tmp_path):
    missing = subprocess.run([sys.executable, "-m", "apollia_nb", "mcp-gateway", "--home", str(tmp_path / "none")],
                             capture_output=True, text=True, env=environment(), timeout=120, stdin=subprocess.DEVNULL)
    assert missing.returncode == 3 and "HOME_FILE_MISSING" in missing.stderr and missing.stdout == ""
    assert not (tmp_path / "none").exists()
    remote = subprocess.run([sys.executable, "-m", "apollia_nb", "mcp-gateway", "--home", str(tmp_path),
                             "--http", "0.0.0.0:0"], capture_output=True, text=True, env=environment(), timeout=120)
    assert remote.returncode == 3 and "BAD_INPUT" in remote.stderr and "--allow-remote" in remote.stderr
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:8766") == ("::1", 8766)
    assert parse_listen("0.0.0.0:1", allow_remote=True) == ("0.0.0.0", 1)
    for bad in ("127.0.0.1", ":80", "localhost:x", "127.0.0.1:70000", "example.org:80"):
        with pytest.raises(BadInput):
            parse_listen(bad)
    assert exposed_name("mcp:everything/get-sum") == "everything__get-sum"


def test_two_tools_that_would_be_listed_under_one_name_are_offered_under_none():
    from apollia_nb.federation.gateway import exposed_names

    offered, clashing = exposed_names(["mcp:a__b/c", "mcp:a/b__c", "mcp:a/d", "mcp:a/d", "bash_executor",
                                       "mcp:e/f.g"])
    assert offered == {"a__d": "mcp:a/d", "e__f.g": "mcp:e/f.g"}
    assert clashing == ["mcp:a__b/c", "mcp:a/b__c"]


def test_a_servers_question_during_a_call_is_a_pending_decision_answered_over_rest(gateway_home):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    home = gateway_home
    with ServerThread(home, token=TOKEN) as srv, \
            httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=30) as api:
        params = StdioServerParameters(command=sys.executable, env=environment(),
                                       args=["-m", "apollia_nb", "mcp-gateway", "--home", str(home.path)])

        async def main() -> Any:
            async with Client(stdio_client(params)) as client:
                async with anyio.create_task_group() as tg:
                    got: dict[str, Any] = {}

                    async def ask() -> None:
                        got["result"] = await client.call_tool("everything__trigger-elicitation-request", {})
                    tg.start_soon(ask)
                    call = await anyio.to_thread.run_sync(wait_pending, api,
                                                          "mcp:everything/trigger-elicitation-request")
                    assert call["agent"] == "mcp-gateway" and call["answers"] == ["once", "refuse"]
                    await anyio.to_thread.run_sync(lambda: api.post(
                        "/pending-decisions/decide", json={"id": call["id"], "answer": "once"}).raise_for_status())
                    question = await anyio.to_thread.run_sync(wait_pending, api, "mcp:everything/elicitation/create")
                    got["question"] = question
                    # Declined: a served home takes a question's form values only from the process whose
                    # server asked it, and here the gateway, not the REST server, holds that connection.
                    answered = await anyio.to_thread.run_sync(lambda: api.post("/pending-decisions/decide", json={
                        "id": question["id"], "answer": "refuse"}))
                    assert answered.status_code == 200, answered.text
                return got

        got = anyio.run(main)
    assert got["question"]["arguments"]["mode"] == "form"
    assert "decline" in text_of(got["result"]).lower(), text_of(got["result"])
    rows = journal_rows(home, "SELECT tool, answer FROM decisions ORDER BY seq")
    assert rows == [("mcp:everything/trigger-elicitation-request", "once"),
                    ("mcp:everything/elicitation/create", "refuse")]


def test_a_served_home_whose_server_stops_during_an_asked_call_answers_the_client_with_an_error(gateway_home):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    home = gateway_home
    srv = ServerThread(home, token=TOKEN)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=30) as api:
            params = StdioServerParameters(command=sys.executable, env=environment(), args=[
                "-m", "apollia_nb", "mcp-gateway", "--home", str(home.path), "--ask-timeout", "2"])

            async def main() -> Any:
                async with Client(stdio_client(params)) as client:
                    got: dict[str, Any] = {}
                    async with anyio.create_task_group() as tg:
                        async def ask() -> None:
                            got["result"] = await client.call_tool("everything__get-sum", {"a": 1, "b": 1})
                        tg.start_soon(ask)
                        await anyio.to_thread.run_sync(wait_pending, api, "mcp:everything/get-sum")
                        await anyio.to_thread.run_sync(srv.stop)  # the home goes down while the call waits
                    return got["result"]

            result = anyio.run(main)
    finally:
        srv.stop()
    assert result.is_error, text_of(result)
    assert "the home did not answer within" in text_of(result), text_of(result)
