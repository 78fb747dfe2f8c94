"""Scenario C against the example host: read its notes over MCP, write summaries back over REST.

The notes host (``examples/host_notes``) runs as its own process on an
ephemeral port of 127.0.0.1, with a bearer token and its test-only
``/_fail`` switch; its stdio mode is used as users would configure it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from apollia_nb.errors import UnknownTool
from apollia_nb.governance.policy import keygen, sign
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from test_federation_support import REPO, answer_all, decisions, results, write_config

pytestmark = pytest.mark.anyio

TOKEN = "notes-token-7f3a9c"
SHIPPED = REPO / "examples" / "host_notes" / "openapi.json"


@pytest.fixture(scope="module")
def notes_host():
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.host_notes", "--port", "0", "--token", TOKEN, "--faults"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), f"the notes host did not start (exit {proc.poll()})"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("NOTES_TEST_TOKEN", TOKEN)
    return "NOTES_TEST_TOKEN"


def host_config(url, token_env, **extra):
    return {"base_url": url, "openapi": str(SHIPPED), "token_env": token_env, **extra}


def summaries(url):
    response = httpx.get(f"{url}/summaries", headers={"Authorization": f"Bearer {TOKEN}"})
    response.raise_for_status()
    return response.json()["summaries"]


async def test_read_over_mcp_and_write_back_over_rest_after_a_consent_card(home, notes_host, token_env):
    write_config(home, servers={"notes": {"url": f"{notes_host}/mcp", "families": {"search": "read"}}},
                 hosts={"notes": host_config(notes_host, token_env)})
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:notes/search", query="budget")]},
                   {"tool_calls": [call("rest:notes/createSummary", title="Budget, in short",
                                        text="Q3 is 4% over plan; cut travel first.", note_ids=["n1"])]},
                   {"text": "Summary written."}],
            required=["mcp:notes/search", "rest:notes/createSummary"]))
        assert agent.tools.get("rest:notes/createSummary").parameter_names == ("title", "text", "note_ids")
        handle = await rt.submit("clerk", "Summarise the budget notes for the host")
        cards = await answer_all(rt, handle, "once")
        assert handle.status == "completed", handle.error

        [card] = cards  # the read ran without asking; the write-back asked
        assert (card.tool, card.family, card.answers) == ("rest:notes/createSummary", "write",
                                                          ("once", "always", "refuse"))
        assert card.hints == {"method": "POST", "url": f"{notes_host}/summaries"}
        read, written = results(rt, handle.run_id)
        assert [n["id"] for n in read["output"]["notes"]] == ["n1", "n2", "n4"]
        assert written["status"] == "ok" and written["output"]["note_ids"] == ["n1"]
        assert {d["tool"]: d["connection"] for d in decisions(rt, handle.run_id)} == {
            "mcp:notes/search": "notes", "rest:notes/createSummary": "notes"}
        stored = [s for s in summaries(notes_host) if s["id"] == written["output"]["id"]]
        assert stored == [written["output"]]  # the host is the system of record
        for entry in rt.journal.entries():
            assert TOKEN not in entry.payload.decode("utf-8")


async def test_a_4xx_from_the_host_is_permanent_and_leaves_the_breaker_alone(home, notes_host, token_env):
    write_config(home, hosts={"notes": host_config(notes_host, token_env)})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("rest:notes/createSummary", title="x", text="y", note_ids=["n99"])]},
                   {"text": "the host said no"}],
            required=["rest:notes/createSummary"]))
        handle = await rt.submit("clerk", "Write a bad summary", watched=False, grants=["write"])
        await handle
        [result] = results(rt, handle.run_id)
        assert result["error_code"] == "TOOL_PERMANENT"
        assert "HTTP 422" in result["output"]["message"] and "unknown note id 'n99'" in result["output"]["message"]
        assert rt.breakers.get("rest:notes/createSummary").consecutive_failures == 0


async def test_a_503_is_transient_and_counted_by_the_breaker(home, notes_host, token_env):
    write_config(home, hosts={"notes": host_config(notes_host, token_env)})
    httpx.post(f"{notes_host}/_fail", json={"status": 503, "times": 1}).raise_for_status()
    async with Runtime(home, tool_sources=open_sources) as rt:
        attempt = call("rest:notes/createSummary", title="retry", text="second time lucky")
        await rt.register_agent(manifest(actor=[{"tool_calls": [attempt]}, {"tool_calls": [attempt]}, {"text": "ok"}],
                                         required=["rest:notes/createSummary"]))
        breaker = rt.breakers.get("rest:notes/createSummary")
        handle = await rt.submit("clerk", "Write a summary", watched=False, grants=["write"])
        await handle
        failed, succeeded = results(rt, handle.run_id)
        assert failed["error_code"] == "TOOL_TRANSIENT" and "HTTP 503" in failed["output"]["message"]
        assert succeeded["status"] == "ok"
        assert breaker.consecutive_failures == 0  # counted once, reset by the success
        assert [s["status"] for s in (handle.to_dict()["steps"][0]["tool_calls"])] == ["error", "ok"]


async def test_a_wrong_or_missing_token_is_a_permanent_error(home, notes_host, monkeypatch):
    write_config(home, hosts={"notes": host_config(notes_host, "NOTES_TEST_TOKEN")})
    attempt = call("rest:notes/listSummaries")
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [attempt]}, {"text": "refused"}, {"tool_calls": [attempt]}, {"text": "no token"}],
            required=["rest:notes/listSummaries"]))
        monkeypatch.setenv("NOTES_TEST_TOKEN", "wrong")
        handle = await rt.submit("clerk", "List summaries", watched=False)
        await handle
        monkeypatch.delenv("NOTES_TEST_TOKEN")
        handle2 = await rt.submit("clerk", "List summaries", watched=False)
        await handle2
        [wrong] = results(rt, handle.run_id)
        assert wrong["error_code"] == "TOOL_PERMANENT" and "HTTP 401" in wrong["output"]["message"]
        [missing] = results(rt, handle2.run_id)
        assert missing["error_code"] == "TOOL_PERMANENT"
        assert "NOTES_TEST_TOKEN is not set" in missing["output"]["message"]


async def test_the_openapi_document_can_be_fetched_from_the_host(home, notes_host, token_env):
    write_config(home, hosts={"notes": {"openapi": f"{notes_host}/openapi.json", "token_env": token_env}})
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(actor=[{"tool_calls": [call("rest:notes/listSummaries")]}],
                                                 required=["rest:notes/listSummaries"]))
        assert agent.tools.get("rest:notes/listSummaries").family.value == "read"
        handle = await rt.submit("clerk", "List summaries", watched=False)
        await handle
        [listed] = results(rt, handle.run_id)
        assert listed["status"] == "ok" and isinstance(listed["output"]["summaries"], list)


def test_the_served_document_is_the_shipped_file_naming_its_server(notes_host):
    served = httpx.get(f"{notes_host}/openapi.json").json()
    assert served.pop("servers") == [{"url": notes_host}]
    assert served == json.loads(SHIPPED.read_text())


async def test_the_example_host_over_stdio(home):
    write_config(home, servers={"notes": {
        "command": sys.executable, "args": ["-m", "examples.host_notes", "--stdio"], "cwd": str(REPO),
        "families": {"get": "read_personal"},
    }})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:notes/get", id="n2")]}, {"tool_calls": [call("mcp:notes/get", id="zz")]}],
            required=["mcp:notes/get"]))
        handle = await rt.submit("clerk", "Read note n2", watched=False, grants=["read_personal"])
        await handle
        found, missing = results(rt, handle.run_id)
        assert found["output"]["title"] == "Hiring plan"
        assert missing["error_code"] == "TOOL_PERMANENT" and "no note with id 'zz'" in missing["output"]["message"]


async def test_a_host_refused_by_policy_is_never_contacted(home, tmp_path, token_env):
    _, public = keygen(tmp_path / "org.key")
    home.policy_path.parent.mkdir(parents=True, exist_ok=True)
    home.policy_path.write_text('[refuse]\nconnections = ["crm"]\n')
    sign(home.policy_path, tmp_path / "org.key")
    # Nothing listens there: a fetch would fail with a connection error, not with the policy's reason.
    write_config(home, hosts={"crm": {"openapi": "http://127.0.0.1:9/openapi.json", "base_url": "http://127.0.0.1:9"}},
                 trusted_keys=[public])
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(optional=["rest:crm/createNote"]))
        assert agent.state.state.value == "degraded"
        assert any(w.startswith("rest:crm: organisation policy refuses the connection 'crm'") for w in agent.warnings)
        with pytest.raises(UnknownTool):
            await rt.register_agent(manifest(name="strict", required=["rest:crm/createNote"]))


def test_the_walkthrough_runs_offline_and_shows_both_paths():
    done = subprocess.run([sys.executable, str(REPO / "examples" / "host_notes" / "walkthrough.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("  mcp:", "  rest:"))]
    assert ["mcp:notes/search", "read", "allow", "3", "-", "ok"] in rows
    assert ["rest:notes/createSummary", "write", "ask", "6", "once", "ok"] in rows
    assert "entries mentioning the host's token: 0" in done.stdout
    assert "the host now holds 1 summary" in done.stdout
