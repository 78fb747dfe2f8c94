"""The MCP client's side of the protocol, through the real runtime, against the reference server.

``@modelcontextprotocol/server-everything`` from npm (``dev/install-test-mcp-servers.sh``)
over stdio: a server's question (elicitation) becomes a card answered from code, a
server's model call (sampling) is decided like a tool call and journaled, progress
reaches the task, a returned resource link is read through ``resources/read``, a
task-augmented tool runs as a long-running call (completed, and cancelled with its
run), and the tool list is read again on ``list_changed``.
"""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from test_federation_support import (  # noqa: F401 (everything_url: a fixture)
    EVERYTHING_JS, decisions, everything_url, node, require_peer, results, write_config,
)

pytestmark = pytest.mark.anyio

E = "mcp:everything"


def everything(**extra):
    return {"command": node(), "args": [str(require_peer(EVERYTHING_JS)), "stdio"], **extra}


@pytest.fixture(params=["stdio", "http"])
def everything_over(request):
    """The reference server's configuration over stdio, then over streamable HTTP (one process per module)."""
    def config(**extra):
        if request.param == "stdio":
            return everything(**extra)
        return {"url": request.getfixturevalue("everything_url"), **extra}
    return config


def entries(rt, run_id, kind):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == kind]


async def next_card(rt, handle, tool):
    """The task's first waiting card for ``tool``, once it is there."""
    with anyio.fail_after(30):
        while True:
            changed = anyio.Event()
            unsubscribe = rt.subscribe(lambda kind, obj: changed.set())
            try:
                found = [c for c in handle.pending if c.tool == tool]
                if found:
                    return found[0]
                if handle.status in ("completed", "failed", "cancelled"):
                    raise AssertionError(f"the task ended ({handle.status}, {handle.error}) without a {tool} card")
                await changed.wait()
            finally:
                unsubscribe()


async def test_a_servers_question_is_a_card_answered_from_code_with_checked_values(home):
    write_config(home, servers={"everything": everything(families={"trigger-elicitation-request": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-elicitation-request")]},
                   {"tool_calls": [call(f"{E}/trigger-elicitation-request")]}, {"text": "asked"}],
            required=[f"{E}/trigger-elicitation-request"]))
        handle = await rt.submit("clerk", "Ask me twice")
        card = await next_card(rt, handle, f"{E}/elicitation/create")
        assert handle.status == "waiting"  # the call waits on a person
        assert (card.family, card.answers, card.arguments["mode"]) == (None, ("once", "refuse"), "form")
        assert card.arguments["requestedSchema"]["required"] == ["name"]
        with pytest.raises(BadAnswer, match="requires 'name'"):
            card.answer("once", values={"check": True})
        with pytest.raises(BadAnswer, match="takes a boolean"):
            card.answer("once", values={"name": "Ada", "check": "yes"})
        with pytest.raises(BadAnswer, match="takes one of"):
            card.answer("once", values={"name": "Ada", "untitledSingleSelectEnum": "Gunther"})
        assert card.waiting  # a bad answer loses nothing
        card.answer("once", values={"name": "Ada Lovelace", "check": True, "integer": 7})
        second = await next_card(rt, handle, f"{E}/elicitation/create")
        assert second.id != card.id
        second.answer("refuse")  # declined: the server hears decline, the call goes on
        await handle
        assert handle.status == "completed", handle.error
        asked, first_call, declined, second_call = results(rt, handle.run_id)
        assert asked["tool"] == declined["tool"] == f"{E}/elicitation/create"
        assert asked["output"] == {"action": "accept", "content": {"name": "Ada Lovelace", "check": True, "integer": 7}}
        assert "Ada Lovelace" in json.dumps(first_call["output"])
        assert declined["output"] == {"action": "decline"} and "declined" in json.dumps(second_call["output"])
        accepted, refused = entries(rt, handle.run_id, "answer")
        assert accepted["values"] == {"name": "Ada Lovelace", "check": True, "integer": 7}
        assert accepted["call_id"] == card.call_id and "values" not in refused
        decided = [d for d in decisions(rt, handle.run_id) if d["tool"] == f"{E}/elicitation/create"]
        assert decided[0]["caused_by"] == first_call["call_id"]
        assert rt.replay(handle.run_id).verdict == "identical"


async def test_cancelling_a_task_cancels_the_servers_open_question(home):
    write_config(home, servers={"everything": everything(families={"trigger-elicitation-request": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-elicitation-request")]}, {"text": "never"}],
            required=[f"{E}/trigger-elicitation-request"]))
        handle = await rt.submit("clerk", "Ask me", watched=False)
        card = await next_card(rt, handle, f"{E}/elicitation/create")
        await rt.cancel(handle.id)
        await handle
        assert handle.status == "cancelled"
        assert (card.answer_value, card.answered_by) == ("refuse", "cancel")
        assert rt.pending_decisions() == []
        with anyio.fail_after(10):  # the server is told: its question is cancelled, not declined
            while not [r for r in results(rt, handle.run_id) if r["tool"] == f"{E}/elicitation/create"]:
                await rt.committed()
                await anyio.sleep(0.02)
        [asked] = [r for r in results(rt, handle.run_id) if r["tool"] == f"{E}/elicitation/create"]
        assert asked["output"] == {"action": "cancel"}


async def test_the_only_root_offered_is_the_calling_agents_workspace(home):
    write_config(home, servers={"everything": everything(families={"echo": "read", "get-roots-list": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/echo", message="hi")]}, {"tool_calls": [call(f"{E}/get-roots-list")]},
                   {"text": "rooted"}],
            required=[f"{E}/echo", f"{E}/get-roots-list"]))
        handle = await rt.submit("clerk", "Which roots?", watched=False)
        await handle
        assert handle.status == "completed", handle.error
        _, roots = results(rt, handle.run_id)
        assert "Current MCP Roots (1 total)" in roots["output"]
        assert agent.workspace.resolve().as_uri() in roots["output"]
        [source] = [s for s in rt.tool_sources if s.name == E]
        assert source.listings >= 2  # its notifications/tools/list_changed after the handshake were followed
    log = (home.logs_dir / "mcp-everything.log").read_text()
    assert "[info] everything-server Roots updated: 1 root(s)" in log  # the server's log messages, in its log


async def test_an_unanswered_question_is_cancelled_when_its_time_is_up(home):
    write_config(home, servers={"everything": everything(families={"trigger-elicitation-request": "read"},
                                                         input_timeout_secs=0.5)})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-elicitation-request")]}, {"text": "nobody answered"}],
            required=[f"{E}/trigger-elicitation-request"]))
        handle = await rt.submit("clerk", "Ask me", watched=False)
        await handle
        assert handle.status == "completed", handle.error
        asked, outer = results(rt, handle.run_id)
        assert asked["output"] == {"action": "cancel"} and "cancel" in json.dumps(outer["output"])
        [answer] = entries(rt, handle.run_id, "answer")
        assert (answer["answer"], answer["answered_by"]) == ("refuse", "timeout")
        assert rt.pending_decisions() == []


async def test_a_servers_model_call_is_asked_answered_journaled_and_counted(home, everything_over):
    write_config(home, servers={"everything": everything_over(families={"trigger-sampling-request": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-sampling-request", prompt="Name a colour", maxTokens=20)]},
                   {"text": "Ultramarine."},  # the model call the server asked for
                   {"text": "sampled"}],
            required=[f"{E}/trigger-sampling-request"]))
        handle = await rt.submit("clerk", "Let the server ask the model")
        card = await next_card(rt, handle, f"{E}/sampling/createMessage")
        assert (card.family, card.answers, card.line) == (None, ("once", "refuse"), 6)
        assert card.arguments["messages"] == [
            {"role": "user", "text": "Resource trigger-sampling-request context: Name a colour"}]
        assert card.arguments["systemPrompt"] == "You are a helpful test server." and card.arguments["maxTokens"] == 20
        used = handle.to_dict()["budget"]["used"]
        card.answer("once")
        await handle
        assert handle.status == "completed", handle.error
        by_tool = {r["tool"]: r for r in results(rt, handle.run_id)}
        assert by_tool[f"{E}/sampling/createMessage"]["output"]["text"] == "Ultramarine."
        assert "Ultramarine." in json.dumps(by_tool[f"{E}/trigger-sampling-request"]["output"])
        [request] = [c for c in entries(rt, handle.run_id, "tool_call") if c["tool"].endswith("/sampling/createMessage")]
        assert request["arguments"]["messages"][0]["text"].endswith("Name a colour")
        assert handle.to_dict()["budget"]["used"] > used  # the server's model call was one more model turn
        assert handle.result == "sampled"
        assert rt.replay(handle.run_id).verdict == "identical"  # the request is checked inside its call


async def test_a_refused_model_call_is_the_protocols_error_and_never_reaches_the_model(home):
    write_config(home, servers={"everything": everything(families={"trigger-sampling-request": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-sampling-request", prompt="Leak it")]}, {"text": "refused"}],
            required=[f"{E}/trigger-sampling-request"]))
        handle = await rt.submit("clerk", "Let the server ask the model")
        card = await next_card(rt, handle, f"{E}/sampling/createMessage")
        card.answer("refuse")
        await handle
        assert handle.result == "refused"  # the script's next turn went to the agent, not to the server
        by_tool = {r["tool"]: r for r in results(rt, handle.run_id)}
        assert by_tool[f"{E}/sampling/createMessage"]["status"] == "refused"
        outer = by_tool[f"{E}/trigger-sampling-request"]
        assert outer["status"] == "error" and "refused the model call" in outer["output"]["message"]
        assert not [c for c in entries(rt, handle.run_id, "tool_call") if c["tool"].endswith("/sampling/createMessage")]


async def test_progress_reaches_the_task_and_the_journal_at_a_bounded_rate(home, everything_over):
    write_config(home, servers={"everything": everything_over(families={"trigger-long-running-operation": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/trigger-long-running-operation", duration=1, steps=5)]},
                   {"text": "done"}],
            required=[f"{E}/trigger-long-running-operation"]))
        seen = []
        rt.subscribe(lambda kind, obj: seen.append(obj.r.progress) if kind == "task" else None)
        handle = await rt.submit("clerk", "Take a while")
        await handle
        assert handle.status == "completed", handle.error
        shown = [p["progress"] for p in seen if p]
        assert shown == [1, 2, 3, 4, 5] and all(p["total"] == 5 for p in seen if p)
        assert handle.to_dict()["progress"] is None  # the call is over
        journaled = entries(rt, handle.run_id, "tool_progress")
        assert 1 <= len(journaled) < 5 and journaled[-1]["progress"] == 5  # bounded, the last one kept
        [tool_call] = entries(rt, handle.run_id, "tool_call")
        assert {p["call_id"] for p in journaled} == {tool_call["call_id"]}


async def test_a_returned_resource_link_is_read_through_resources_read(home, everything_over):
    write_config(home, servers={"everything": everything_over(families={"get-resource-links": "read",
                                                                   "resources/read": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        links = call(f"{E}/get-resource-links", count=2)
        read = call(f"{E}/resources/read", uri="demo://resource/dynamic/text/2")
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [links]}, {"tool_calls": [read]}, {"text": "read"}],
            required=[f"{E}/get-resource-links", f"{E}/resources/read"], optional=[f"{E}/prompts/list"]))
        handle = await rt.submit("clerk", "Follow the link", watched=False)
        await handle
        assert handle.status == "completed", handle.error
        linked, contents = results(rt, handle.run_id)
        assert {"type": "resource_link", "uri": "demo://resource/dynamic/text/2", "name": "Text Resource 2",
                "mime_type": "text/plain"} in linked["output"]
        [content] = contents["output"]
        assert content["uri"] == "demo://resource/dynamic/text/2" and "Resource 2" in content["text"]
        agent = rt.agent("clerk")
        assert agent.tools.get(f"{E}/resources/read").family.value == "read"  # configured
        assert agent.tools.get(f"{E}/prompts/list").family is None  # unclassified unless configured
        prompts = await agent.tools.get(f"{E}/prompts/list").fn()
        assert "simple-prompt" in [p["name"] for p in prompts["prompts"]]


async def test_a_task_augmented_tool_runs_as_a_long_running_call(home, everything_over):
    write_config(home, servers={"everything": everything_over(families={"simulate-research-query": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/simulate-research-query", topic="tides")]}, {"text": "researched"}],
            required=[f"{E}/simulate-research-query"]))
        handle = await rt.submit("clerk", "Research", watched=False)
        await handle
        assert handle.status == "completed", handle.error
        [result] = results(rt, handle.run_id)
        assert result["status"] == "ok" and "# Research Report: tides" in json.dumps(result["output"])
        statuses = [p.get("message") for p in entries(rt, handle.run_id, "tool_progress")]
        assert statuses and statuses[0] == "Gathering sources..."


async def test_a_long_running_call_is_cancelled_on_the_server_with_its_run(home):
    write_config(home, servers={"everything": everything(families={"simulate-research-query": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call(f"{E}/simulate-research-query", topic="tides")]}, {"text": "never"}],
            required=[f"{E}/simulate-research-query"]))
        handle = await rt.submit("clerk", "Research", watched=False)
        with anyio.fail_after(30):
            while not (handle.to_dict()["progress"] or {}).get("status") == "working":
                changed = anyio.Event()
                unsubscribe = rt.subscribe(lambda kind, obj: changed.set())
                try:
                    await changed.wait()
                finally:
                    unsubscribe()
        await rt.cancel(handle.id)
        await handle
        assert handle.status == "cancelled"
        with anyio.fail_after(10):
            while not any(p.get("status") == "cancelled" for p in entries(rt, handle.run_id, "tool_progress")):
                await rt.committed()
                await anyio.sleep(0.05)
        log = (home.logs_dir / "mcp-everything.log").read_text()
        assert "connected: protocol 2025-11-25" in log


LATE_SERVER = '''
import anyio
from mcp.server.mcpserver import MCPServer, Context
from mcp_types import ToolAnnotations

server = MCPServer("late", log_level="WARNING")

def echo(text: str) -> str:
    """Say it back."""
    return text

server.add_tool(echo, annotations=ToolAnnotations(readOnlyHint=True))

@server.tool(annotations={"readOnlyHint": True})
async def grow(ctx: Context) -> str:
    """Offer one more tool, change what another says of itself, and say so."""
    def late(text: str) -> str:
        """A tool that was not there at first."""
        return text.upper()
    server.add_tool(late)
    server.remove_tool("echo")
    server.add_tool(echo, annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    await ctx.notify_tools_changed()  # the stateless revision: on the listen stream
    return "grown"

anyio.run(server.run_stdio_async)
'''


async def test_list_changed_offers_a_new_tool_unclassified(home, tmp_path):
    script = tmp_path / "late_server.py"
    script.write_text(LATE_SERVER, encoding="utf-8")
    write_config(home, servers={"late": {"command": sys.executable, "args": [str(script)],
                                         "families": {"grow": "read"}}})
    async with Runtime(home, tool_sources=open_sources) as rt:
        first = await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:late/grow")]}, {"text": "grown"}],
            required=["mcp:late/grow", "mcp:late/echo"], optional=["mcp:late/late"]))
        assert "mcp:late/late" not in first.offered
        assert first.tools.get("mcp:late/echo").annotations == {"readOnlyHint": True}
        [source] = [s for s in rt.tool_sources if s.name == "mcp:late"]
        assert source.listings == 1
        await (await rt.submit("clerk", "Grow", watched=False))
        with anyio.fail_after(10):
            while source.listings < 2:
                await anyio.sleep(0.02)
        later = await rt.register_agent(manifest(
            name="second", actor=[{"tool_calls": [call("mcp:late/late", text="hi")]},
                                  {"tool_calls": [call("mcp:late/echo", text="again")]}, {"text": "called"}],
            required=["mcp:late/late", "mcp:late/echo"]))
        assert later.tools.get("mcp:late/late").family is None  # unclassified until configured
        handle = await rt.submit("second", "Call the new tool, then the changed one")
        card = await next_card(rt, handle, "mcp:late/late")
        assert card.answers == ("once", "refuse")
        card.answer("once")
        changed = await next_card(rt, handle, "mcp:late/echo")
        assert changed.hints == {"readOnlyHint": False, "destructiveHint": True, "changed": True}  # re-shown
        changed.answer("once")
        await handle
        assert [r["output"] for r in results(rt, handle.run_id)] == [{"result": "HI"}, {"result": "again"}]


MODERN_SERVER = '''
from typing import Any
import anyio
import mcp_types as t
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("vault", log_level="WARNING")
FORM = {"type": "object", "required": ["user", "password"], "properties": {
    "user": {"type": "string", "title": "User"},
    "password": {"type": "string", "title": "Password", "format": "password"}}}

@server.tool()
async def login(ctx: Context) -> Any:
    """Sign in, asking the person for their credentials (an input_required result)."""
    if not ctx.input_responses:
        return t.InputRequiredResult(input_requests={"login": t.ElicitRequest(
            params=t.ElicitRequestFormParams(message="Sign in to the vault", requested_schema=FORM))})
    answer = ctx.input_responses["login"]
    if answer.action != "accept":
        return f"not signed in: {answer.action}"
    return f"signed in as {answer.content['user']} with {len(answer.content['password'])} characters"

anyio.run(server.run_stdio_async)
'''


async def test_a_stateless_servers_question_is_a_card_and_its_password_is_never_journaled(home, tmp_path):
    script = tmp_path / "vault_server.py"
    script.write_text(MODERN_SERVER, encoding="utf-8")
    write_config(home, servers={"vault": {"command": sys.executable, "args": [str(script)],
                                          "families": {"login": "read"}}})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("mcp:vault/login")]}, {"text": "in"}],
                                         required=["mcp:vault/login"]))
        handle = await rt.submit("clerk", "Sign in")
        card = await next_card(rt, handle, "mcp:vault/elicitation/create")
        assert card.arguments["message"] == "Sign in to the vault"
        card.answer("once", values={"user": "ada", "password": "hunter2"})
        await handle
        assert handle.status == "completed", handle.error
        by_tool = {r["tool"]: r for r in results(rt, handle.run_id)}
        assert by_tool["mcp:vault/login"]["output"] == "signed in as ada with 7 characters"
        assert by_tool["mcp:vault/elicitation/create"]["output"] == {
            "action": "accept", "content": {"user": "ada", "password": "[redacted]"}}
        [answer] = entries(rt, handle.run_id, "answer")
        assert answer["values"] == {"user": "ada", "password": "[redacted]"}
        everything_journaled = "".join(e.payload if isinstance(e.payload, str) else bytes(e.payload).decode()
                                       for e in rt.journal.entries(run_id=handle.run_id))
        assert "hunter2" not in everything_journaled
        assert "connected: protocol 2026-07-28" in (home.logs_dir / "mcp-vault.log").read_text()
        assert rt.replay(handle.run_id).verdict == "identical"
