"""A sensitive value in a tool call's arguments is redacted everywhere it is shown, kept or sent — except
to the tool.

A real MCP server of the test's own over stdio offers a tool whose arguments' schema marks one argument
``"writeOnly": true`` and a nested one ``"format": "password"`` (behind a ``$ref``, as pydantic writes a
nested model), and a plain tool. A scripted agent calls both, with a password, a nested key and a
configured token by value; both calls are asked about. None of those values is in the journal (every
entry, journal.db, journal.log), runtime.db, governance.db, the home's logs, a card, the side panel's
inbox row, the runtime's events, ``GET /pending-decisions``, the task's REST routes or its event stream;
the server received each in clear, and a replay of the run is ``identical``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.federation import open_sources
from apollia_nb.federation.rest import operations
from apollia_nb.governance.decision import Family
from apollia_nb.notebook.panel import inbox_item
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.cards import REDACTED, sensitive_plan, shown_arguments
from apollia_nb.runtime.tools import ToolDef
from fake_model_servers import FakeModelServer, fake_model_server, openai_stream, openai_text_chunks, openai_tool_chunks
from runtime_helpers import call, manifest
from test_federation_support import results, write_config

PASSWORD = "pw-hunter2-writeonly-arg"
NESTED = "nested-key-format-password"
TOKEN = "tok-4c2e-configured-by-value"
MODEL_KEY = "sk-model-key-by-value-31"
SECRETS = (PASSWORD, NESTED, TOKEN, MODEL_KEY)

KEEPER = '''
import json, os, sys
from typing import Annotated
import anyio
from pydantic import BaseModel, Field
from mcp.server.mcpserver import MCPServer

server = MCPServer("keeper", log_level="WARNING")
RECEIVED = sys.argv[1]


class Creds(BaseModel):
    key: Annotated[str, Field(json_schema_extra={"format": "password"})]
    label: str


def _keep(what):
    with open(RECEIVED, "a", encoding="utf-8") as out:
        out.write(json.dumps(what) + "\\n")


@server.tool()
def store(user: str, password: Annotated[str, Field(json_schema_extra={"writeOnly": True})],
          creds: Creds | None = None) -> str:
    """Store a credential."""
    _keep({"tool": "store", "user": user, "password": password,
           "creds": creds.model_dump() if creds is not None else None})
    return f"stored for {user}; the password was {password}"


@server.tool()
def note(text: str) -> str:
    """Keep a note."""
    _keep({"tool": "note", "text": text})
    return "noted"

anyio.run(server.run_stdio_async)
'''

STORE = {"user": "ada", "password": PASSWORD, "creds": {"key": NESTED, "label": "work"}}
NOTE = {"text": f"the host's token is {TOKEN}, the model's key {MODEL_KEY}"}


def _agent(server: FakeModelServer) -> str:
    """An agent whose model (OpenAI's API, a fake server on 127.0.0.1) asks for both tools with secrets."""
    server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Keep the credential"]}'])])),
        openai_stream(openai_tool_chunks([("call_1", "mcp:keeper/store", [json.dumps(STORE)])])),
        openai_stream(openai_tool_chunks([("call_2", "mcp:keeper/note", [json.dumps(NOTE)])])),
        openai_stream(openai_text_chunks(["kept"])),
        openai_stream(openai_tool_chunks([("v", "submit_verdict", ['{"verdict": "pass", "reasons": []}'])])))
    return ('name = "clerk"\ndescription = "d"\ninstructions = "Keep."\n\n'
            '[tools]\nrequired = ["mcp:keeper/store", "mcp:keeper/note"]\n\n'
            f'[model]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.url}/v1"\n'
            'api_key_env = "MODEL_KEY"\nmax_retries = 0\n')


def _configure(home, tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("H_TOKEN", TOKEN)
    monkeypatch.setenv("MODEL_KEY", MODEL_KEY)
    script = tmp_path / "keeper.py"
    script.write_text(KEEPER, encoding="utf-8")
    received = tmp_path / "received.jsonl"
    write_config(home, servers={"keeper": {"command": sys.executable, "args": [str(script), str(received)],
                                           "families": {"store": "write", "note": "write"}}},
                 hosts={"h": {"base_url": "http://127.0.0.1:9", "openapi": "h.json", "token_env": "H_TOKEN"}})
    return received


def _received(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _home_bytes(home) -> dict[str, bytes]:
    """Every file of the home, by name (journal.db, journal.log, runtime.db, governance.db, logs/...)."""
    return {str(p.relative_to(home.path)): p.read_bytes() for p in sorted(home.path.rglob("*")) if p.is_file()}


def _assert_nowhere(surfaces: dict[str, str | bytes]) -> None:
    for where, text in surfaces.items():
        for secret in SECRETS:
            needle = secret.encode() if isinstance(text, bytes) else secret
            assert needle not in text, (where, secret)


def _assert_server_got_clear(received: Path) -> None:
    got = _received(received)
    assert got == [{"tool": "store", "user": "ada", "password": PASSWORD, "creds": {"key": NESTED, "label": "work"}},
                   {"tool": "note", **NOTE}]


def test_the_shown_arguments_are_redacted_from_the_schema_and_the_known_secrets():
    schema = {"type": "object", "$defs": {"C": {"type": "object", "properties": {
        "key": {"type": "string", "format": "password"}, "label": {"type": "string"}}}},
        "properties": {
            "user": {"type": "string"},
            "password": {"type": "string", "writeOnly": True},
            "creds": {"anyOf": [{"$ref": "#/$defs/C"}, {"type": "null"}]},
            "keys": {"type": "array", "items": {"allOf": [{"format": "password"}]}},
            "deep": {"type": "object", "additionalProperties": {"oneOf": [{"type": "string", "writeOnly": True}]}},
        }}
    plan = sensitive_plan(schema)
    given = {"user": f"ada {TOKEN}", "password": PASSWORD, "creds": {"key": NESTED, "label": "work"},
             "keys": ["k1", "k2"], "deep": {"a": "x1"}}
    assert shown_arguments(plan, given, {TOKEN: "H_TOKEN"}) == {
        "user": "ada [redacted: H_TOKEN]", "password": REDACTED, "creds": {"key": REDACTED, "label": "work"},
        "keys": [REDACTED, REDACTED], "deep": {"a": REDACTED}}
    assert given["password"] == PASSWORD  # the given arguments are not changed
    # A schema with nothing sensitive has no plan: the arguments are shown as given, the same object.
    plain = {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}}}
    assert sensitive_plan(plain) is None
    args = {"path": "a", "n": 1}
    assert shown_arguments(None, args, {}) is args
    # A reference that points nowhere, or loops, hides what it describes (it cannot be told safe).
    for ref in ("#/$defs/missing", "#/$defs/loop", "https://example.com/s.json"):
        odd = {"type": "object", "$defs": {"loop": {"$ref": "#/$defs/loop"}},
               "properties": {"x": {"$ref": ref}, "y": {"type": "string"}}}
        assert shown_arguments(sensitive_plan(odd), {"x": "v", "y": "w"}, {}) == {"x": REDACTED, "y": "w"}
    assert sensitive_plan({"type": "object", "properties": {"x": {"writeOnly": "yes"}}}) is None  # only true marks it


def test_a_hosts_operation_with_a_password_parameter_or_body_field_is_sensitive_there():
    doc = {"openapi": "3.0.3", "paths": {"/login": {"post": {
        "operationId": "login",
        "parameters": [{"name": "otp", "in": "header", "schema": {"type": "string", "format": "password"}}],
        "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Login"}}}},
    }}}, "components": {"schemas": {"Login": {"type": "object", "properties": {
        "user": {"type": "string"}, "secret": {"type": "string", "writeOnly": True}}}}}}
    [op], _ = operations(doc)
    plan = sensitive_plan(op.schema)
    assert shown_arguments(plan, {"otp": "123456", "user": "ada", "secret": PASSWORD}, {}) == {
        "otp": REDACTED, "user": "ada", "secret": REDACTED}


async def _card(handle, tool):
    with anyio.fail_after(60):
        while not [c for c in handle.pending if c.tool == tool]:
            if handle.status in ("completed", "failed", "cancelled"):
                raise AssertionError(f"the task ended ({handle.status}, {handle.error}) without a {tool} card")
            await anyio.sleep(0.02)
    return [c for c in handle.pending if c.tool == tool][0]


@pytest.mark.anyio
async def test_a_sensitive_argument_reaches_only_the_tool(home, tmp_path, monkeypatch, fake_model_server):
    received = _configure(home, tmp_path, monkeypatch)
    async with Runtime(home, tool_sources=open_sources) as rt:
        seen: list[str] = []
        rt.subscribe(lambda kind, obj: seen.append(json.dumps(obj.to_dict() if hasattr(obj, "to_dict") else
                                                              str(obj), default=str)))
        await rt.register_agent(_agent(fake_model_server))
        handle = await rt.submit("clerk", "Keep the credential")
        shown: dict[str, str] = {}
        for tool in ("mcp:keeper/store", "mcp:keeper/note"):
            card = await _card(handle, tool)
            row = card.to_dict()
            shown[f"{tool} card"] = json.dumps(row)
            shown[f"{tool} repr"] = repr(card)
            shown[f"{tool} panel"] = json.dumps(inbox_item(row, row))
            shown[f"{tool} pending"] = json.dumps(rt.pending_decisions(), default=str)
            shown[f"{tool} task"] = json.dumps(handle.to_dict(), default=str)
            if tool == "mcp:keeper/store":
                assert row["arguments"] == {"user": "ada", "password": REDACTED,
                                            "creds": {"key": REDACTED, "label": "work"}}
            else:
                assert row["arguments"] == {"text": "the host's token is [redacted: H_TOKEN], "
                                                    "the model's key [redacted: MODEL_KEY]"}
            card.answer("once")
        await handle
        assert handle.status == "completed", handle.error
        shown["task"] = json.dumps(handle.to_dict(), default=str)
        shown["events"] = "\n".join(seen)
        entries = list(rt.journal.entries())
        shown["journal"] = "\n".join(e.payload if isinstance(e.payload, str) else bytes(e.payload).decode()
                                     for e in entries)
        by_tool = {r["tool"]: r for r in results(rt, handle.run_id)}
        assert by_tool["mcp:keeper/store"]["status"] == "ok"
        assert rt.replay(handle.run_id).verdict == "identical"
    _assert_server_got_clear(received)
    shown.update(_home_bytes(home))
    _assert_nowhere(shown)


def test_a_sensitive_argument_is_redacted_over_rest_and_its_event_stream(home, tmp_path, monkeypatch,
                                                                         fake_model_server):
    received = _configure(home, tmp_path, monkeypatch)
    shown: dict[str, str] = {}
    with ServerThread(home, token="rest-token") as srv, httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": "Bearer rest-token"}, timeout=60) as api:
        assert api.post("/agents", json={"manifest": _agent(fake_model_server)}).status_code == 201
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Keep the credential"}).json()
        for tool in ("mcp:keeper/store", "mcp:keeper/note"):
            with api.stream("GET", f"/tasks/{sub['id']}/events") as response:
                lines = []
                for line in response.iter_lines():
                    lines.append(line)
                    if line.startswith("data:") and json.loads(line[5:])["status"] == "waiting":
                        break
            shown[f"{tool} events"] = "\n".join(lines)
            pending = api.get("/pending-decisions")
            shown[f"{tool} pending"] = pending.text
            [row] = pending.json()
            assert row["tool"] == tool
            shown[f"{tool} task"] = api.get(f"/tasks/{sub['id']}").text
            shown.update({f"{tool} waiting {name}": data for name, data in _home_bytes(home).items()})
            shown[f"{tool} tasks"] = api.get("/tasks").text
            decided = api.post("/pending-decisions/decide", json={"id": row["id"], "answer": "once"})
            assert decided.status_code == 200, decided.text
            shown[f"{tool} decided"] = decided.text
        task = api.get(f"/tasks/{sub['id']}/wait", params={"until": "finished"}).json()
        assert task["status"] == "completed", task
        shown["task"] = json.dumps(task)
        shown["entries"] = api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).text
        assert api.post(f"/audit/replay/{sub['run_id']}").json()["verdict"] == "identical"
    _assert_server_got_clear(received)
    shown.update(_home_bytes(home))
    _assert_nowhere(shown)


def _unlock_tool(ran: list[str]) -> ToolDef:
    def unlock(code: str, label: str = "") -> str:
        """Unlock with a code."""
        ran.append(code)
        return f"unlocked with {code}"

    return ToolDef(name="unlock", family=Family.WRITE, fn=unlock, parameters={
        "type": "object", "required": ["code"], "additionalProperties": False,
        "properties": {"code": {"type": "string", "writeOnly": True}, "label": {"type": "string"}}})


@pytest.mark.anyio
async def test_a_deny_rule_decides_on_the_clear_value_and_its_refusal_does_not_repeat_it(home, fake_model_server):
    """Governance is not weakened: a deny rule's prefix matches the clear value; the reason, the task's
    error and the journal name no sensitive value (the agent also repeats it in another argument)."""
    ran: list[str] = []
    fake_model_server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Unlock"]}'])])),
        openai_stream(openai_tool_chunks([("c", "unlock", [json.dumps({"code": PASSWORD, "label": f"{PASSWORD}!"})])])))
    agent = ('name = "clerk"\ndescription = "d"\ninstructions = "Unlock."\n\n[tools]\nrequired = ["unlock"]\n\n'
             f'[model]\nprovider = "openai"\nmodel = "m"\nbase_url = "{fake_model_server.url}/v1"\nmax_retries = 0\n')
    async with Runtime(home) as rt:
        await rt.register_agent(agent, tools=[_unlock_tool(ran)])
        rt.governance.add_rule("unlock", "deny", prefix=PASSWORD[:6], by="test")
        handle = await (await rt.submit("clerk", "Unlock"))
        assert handle.status == "failed" and handle.error["code"] == "REFUSED", handle.error
        [decided] = [json.loads(e.payload) for e in rt.journal.entries(run_id=handle.run_id) if e.kind == "decision"]
        assert decided["outcome"] == "refuse" and decided["arguments"] == {
            "code": REDACTED, "label": "[redacted: code]!"}
        shown = {"task": json.dumps(handle.to_dict(), default=str),
                 "journal": "\n".join(str(e.payload) for e in rt.journal.entries())}
        assert rt.replay(handle.run_id).verdict == "identical"
    assert ran == []
    shown.update(_home_bytes(home))
    _assert_nowhere(shown)


@pytest.mark.anyio
async def test_a_card_answered_after_its_process_ended_cannot_run_a_call_whose_value_was_redacted(
        home, tmp_path, monkeypatch, fake_model_server):
    """The clear value is kept nowhere but in the memory of the process that asked: answered after a
    restart, the call is not made with the redacted text — it ends ``INTERRUPTED``."""
    received = _configure(home, tmp_path, monkeypatch)
    fake_model_server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Keep"]}'])])),
        openai_stream(openai_tool_chunks([("c", "mcp:keeper/store", [json.dumps(STORE)])])),
        openai_stream(openai_text_chunks(["could not keep it"])),
        openai_stream(openai_tool_chunks([("v", "submit_verdict", ['{"verdict": "pass", "reasons": []}'])])))
    agent = ('name = "clerk"\ndescription = "d"\ninstructions = "Keep."\n\n'
             '[tools]\nrequired = ["mcp:keeper/store"]\n\n'
             f'[model]\nprovider = "openai"\nmodel = "m"\nbase_url = "{fake_model_server.url}/v1"\nmax_retries = 0\n')
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(agent)
        handle = await rt.submit("clerk", "Keep", watched=False)
        card = await _card(handle, "mcp:keeper/store")
        with anyio.fail_after(30):
            while handle.status != "waiting":  # suspended: its record saved, nothing runs it
                await anyio.sleep(0.02)
        assert card.to_dict()["arguments"]["password"] == REDACTED
        task_id = handle.id
    async with Runtime(home, tool_sources=open_sources) as rt:
        [pending] = rt.pending_decisions()
        assert pending["arguments"] == {"user": "ada", "password": REDACTED, "creds": {"key": REDACTED,
                                                                                         "label": "work"}}
        rt.answer(pending["id"], "once", by="ada")
        handle = rt.task(task_id)
        await handle
        [result] = [r for r in results(rt, handle.run_id) if r["tool"] == "mcp:keeper/store"]
        assert result["status"] == "error" and result["error_code"] == "INTERRUPTED", result
        assert handle.status == "completed", handle.error
        assert rt.replay(handle.run_id).verdict == "identical"
    assert not received.exists()  # never run with the redacted text, nor with anything else
    _assert_nowhere(_home_bytes(home))
