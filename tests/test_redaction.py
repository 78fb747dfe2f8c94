"""A value marked sensitive is shown redacted everywhere and reaches, in clear, only the server that asked.

A server's question whose form marks fields sensitive (``"format": "password"``, ``"writeOnly": true``,
nested, with a default the server offers) is answered with a password and a configured token: the
card (``to_dict``, repr, text and HTML), the side panel's inbox row, the runtime's events, the answer's
echo, the pending decision, the journal and replay hold none of them; the server receives them all.
A card is a server's question only when the server's connection asked: a tool named like one is a tool
call. A real server of the test's own over stdio (the stateless revision) and the real runtime.
"""

from __future__ import annotations

import json
import sys

import anyio
import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.federation import open_sources
from apollia_nb.federation.mcp_requests import check_form_values, redact_form_values, shown_request
from apollia_nb.notebook import render
from apollia_nb.notebook.panel import inbox_item
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.cards import REDACTED, redact_sensitive, sensitive
from apollia_nb.runtime.tools import ToolDef
from runtime_helpers import call, manifest
from test_federation_support import results, write_config

PASSWORD = "hunter2-correct-horse"
PIN = "4242-pin-writeonly"
NESTED = "nested-api-key-77"
DEFAULT = "server-offered-default-pw"
TOKEN = "tok-9b1d-configured-secret"

FORM = {"type": "object", "required": ["user", "password"], "properties": {
    "user": {"type": "string"},
    "password": {"type": "string", "format": "password", "default": DEFAULT},
    "pin": {"type": "string", "writeOnly": True},
    "creds": {"type": "object", "properties": {"key": {"type": "string", "format": "password"},
                                               "label": {"type": "string"}}},
    "codes": {"type": "array", "items": {"type": "string", "writeOnly": True}},
    "either": {"anyOf": [{"type": "string", "format": "password"}, {"type": "integer"}]},
}}


def test_sensitive_fields_are_redacted_at_any_depth_and_the_rest_kept():
    given = {"user": "ada", "password": PASSWORD, "pin": PIN, "creds": {"key": NESTED, "label": "work"},
             "codes": ["c1", "c2"], "either": 7}
    assert redact_sensitive(FORM, given) == {
        "user": "ada", "password": REDACTED, "pin": REDACTED, "creds": {"key": REDACTED, "label": "work"},
        "codes": [REDACTED, REDACTED], "either": REDACTED}
    assert redact_form_values({"requestedSchema": FORM}, given) == redact_sensitive(FORM, given)
    assert given["password"] == PASSWORD and given["creds"]["key"] == NESTED  # the given values untouched
    assert sensitive({"oneOf": [{"type": "string"}, {"writeOnly": True}]}) and not sensitive({"type": "string"})
    assert not sensitive({"writeOnly": "yes"})  # only the JSON true marks it


def test_a_forms_offered_default_and_configured_tokens_are_redacted_when_the_request_arrives():
    asked = {"mode": "form", "message": f"Sign in (your token is {TOKEN})", "requestedSchema": FORM}
    shown = shown_request(asked, {TOKEN: "H_TOKEN"})
    assert shown["requestedSchema"]["properties"]["password"]["default"] == REDACTED
    assert shown["message"] == "Sign in (your token is [redacted: H_TOKEN])"
    assert DEFAULT not in json.dumps(shown) and TOKEN not in json.dumps(shown)
    assert FORM["properties"]["password"]["default"] == DEFAULT  # a copy: the server's schema is not changed


@pytest.mark.parametrize("values", [
    {"user": "ada", "password": 12345678901},  # not a string
    {"user": "ada", "password": "x", "codes": "not-a-list-secret"},
    {"user": "ada", "password": "x", "pin": True},
])
def test_an_answer_off_the_form_never_repeats_a_sensitive_value(values):
    with pytest.raises(BadAnswer) as caught:
        check_form_values({"mode": "form", "requestedSchema": FORM}, values)
    for value in values.values():
        if value not in ("ada", "x"):
            assert repr(value) not in caught.value.message and str(value) not in caught.value.message
    assert REDACTED in caught.value.message


VAULT = '''
from typing import Any
import anyio
import mcp_types as t
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("vault", log_level="WARNING")
FORM = %s

@server.tool()
async def login(ctx: Context) -> Any:
    """Sign in, asking the person for their credentials."""
    if not ctx.input_responses:
        return t.InputRequiredResult(input_requests={"login": t.ElicitRequest(
            params=t.ElicitRequestFormParams(message="Sign in to the vault", requested_schema=FORM))})
    answer = ctx.input_responses["login"]
    if answer.action != "accept":
        return f"not signed in: {answer.action}"
    got = answer.content
    return {"user": got["user"], "password": got["password"] == %r, "pin": got.get("pin") == %r}

anyio.run(server.run_stdio_async)
''' % (json.dumps(FORM).replace("true", "True"), PASSWORD, PIN)


async def _card(rt, handle, tool):
    with anyio.fail_after(30):
        while not [c for c in handle.pending if c.tool == tool]:
            if handle.status in ("completed", "failed", "cancelled"):
                raise AssertionError(f"the task ended ({handle.status}, {handle.error}) without a {tool} card")
            await anyio.sleep(0.02)
    return [c for c in handle.pending if c.tool == tool][0]


@pytest.mark.anyio
async def test_a_password_given_to_a_servers_question_reaches_only_the_server(home, tmp_path, monkeypatch):
    monkeypatch.setenv("H_TOKEN", TOKEN)
    script = tmp_path / "vault.py"
    script.write_text(VAULT, encoding="utf-8")
    write_config(home, servers={"vault": {"command": sys.executable, "args": [str(script)],
                                          "families": {"login": "read"}}},
                 hosts={"h": {"base_url": "http://127.0.0.1:9", "openapi": "h.json", "token_env": "H_TOKEN"}})
    secrets = (PASSWORD, PIN, NESTED, DEFAULT, TOKEN)
    async with Runtime(home, tool_sources=open_sources) as rt:
        seen: list[str] = []
        rt.subscribe(lambda kind, obj: seen.append(json.dumps(obj.to_dict() if hasattr(obj, "to_dict") else
                                                              str(obj), default=str)))
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("mcp:vault/login")]}, {"text": "in"}],
                                         required=["mcp:vault/login"]))
        handle = await rt.submit("clerk", "Sign in")
        card = await _card(rt, handle, "mcp:vault/elicitation/create")
        assert card.request == "elicitation/create" and card.to_dict()["request"] == "elicitation/create"
        waiting = json.dumps(rt.pending_decisions())
        assert DEFAULT not in waiting and REDACTED in waiting  # the server's offered default, as listed
        with pytest.raises(BadAnswer) as off_form:
            card.answer("once", values={"user": "ada", "password": 4242424242})
        assert "4242424242" not in off_form.value.message
        with pytest.raises(BadAnswer) as nested:  # the protocol's answer carries no object: never sent
            card.answer("once", values={"user": "ada", "password": PASSWORD, "creds": {"key": NESTED}})
        assert NESTED not in nested.value.message and PASSWORD not in nested.value.message
        values = {"user": TOKEN, "password": PASSWORD, "pin": PIN, "codes": ["c-1"]}
        echo = rt.answer(card.id, "once", by="ada", values=values)  # what POST /pending-decisions/decide returns
        await handle
        assert handle.status == "completed", handle.error

        # The server had every value in clear.
        by_tool = {r["tool"]: r for r in results(rt, handle.run_id)}
        assert json.loads(by_tool["mcp:vault/login"]["output"]) == {"user": "[redacted: H_TOKEN]", "password": True,
                                                                    "pin": True}
        # Everything shown: the card, its repr and text, the widgets' HTML, the panel's row, events, the echo.
        shown = card.to_dict()
        assert shown["values"] == {"user": "[redacted: H_TOKEN]", "password": REDACTED, "pin": REDACTED,
                                   "codes": [REDACTED]}
        assert card.values == shown["values"]
        surfaces = {
            "to_dict": json.dumps(shown), "repr": repr(card), "str": str(card),
            "text": render.card_text(shown), "html": render.card_html(shown),
            "panel": json.dumps(inbox_item(shown, shown)), "events": "\n".join(seen),
            "echo": json.dumps(echo, default=str), "task": json.dumps(handle.to_dict(), default=str),
            "pending": json.dumps([p.to_dict() for p in rt.governance.pending(run_id=handle.run_id)], default=str),
        }
        journaled = "".join(bytes(e.payload).decode() if not isinstance(e.payload, str) else e.payload
                            for e in rt.journal.entries())
        surfaces["journal"] = journaled
        for where, text in surfaces.items():
            for secret in secrets:
                assert secret not in text, (where, secret)
        [answer] = [json.loads(e.payload) for e in rt.journal.entries(run_id=handle.run_id) if e.kind == "answer"]
        assert answer["values"] == shown["values"]
        assert by_tool["mcp:vault/elicitation/create"]["output"] == {"action": "accept", "content": shown["values"]}
        assert card.delivered_values == values  # kept in clear for the server only
        assert rt.replay(handle.run_id).verdict == "identical"


@pytest.mark.anyio
async def test_a_tool_named_like_a_servers_question_is_a_tool_call_not_a_question(home):
    def lookalike(mode: str = "form", message: str = "") -> str:
        """A plain tool whose name mimics a server's question."""
        return "ran"

    tool = ToolDef.from_function(lookalike, None, name="mcp:fake/elicitation/create")
    async with Runtime(home) as rt:
        await rt.register_agent(
            manifest(actor=[{"tool_calls": [call("mcp:fake/elicitation/create", mode="form", message="pw?")]},
                            {"text": "done"}]), tools=[tool])
        handle = await rt.submit("clerk", "Ask")
        card = await _card(rt, handle, "mcp:fake/elicitation/create")
        assert card.request is None and not card.takes_values
        shown = card.to_dict()
        assert "question from the server" not in render.card_text(shown)
        assert "question from the server" not in render.card_html(shown)
        with pytest.raises(BadAnswer, match="values answer a server's question"):
            card.answer("once", values={"password": PASSWORD})
        card.answer("once")
        await handle
        assert handle.status == "completed", handle.error
