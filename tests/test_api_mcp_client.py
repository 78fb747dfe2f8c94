"""A server's question to an unattended run, answered over the REST API; the tool's hints on the
pending decision; progress on the task's events. ``server-everything`` over streamable HTTP,
one server process for the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.sdk import Client
from runtime_helpers import call, manifest
from test_api_unattended import task_events
from test_federation_support import everything_url, write_config  # noqa: F401 (a fixture)

TOKEN = "mcp-client-token"
E = "mcp:everything"


def client(srv: ServerThread) -> httpx.Client:
    return httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def wait_pending(api: httpx.Client, tool: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [p for p in api.get("/pending-decisions").json() if p["tool"] == tool]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no pending decision for {tool}")


def test_an_unattended_question_is_answered_over_rest_with_the_tools_hints_shown(home, everything_url):
    write_config(home, servers={"everything": {"url": everything_url}})
    agent = manifest(actor=[{"tool_calls": [call(f"{E}/trigger-elicitation-request")]}, {"text": "answered"}],
                     required=[f"{E}/trigger-elicitation-request"])
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        assert api.post("/agents", json={"manifest": agent}).status_code == 201
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Ask me"}).json()

        tool_call = wait_pending(api, f"{E}/trigger-elicitation-request")  # unclassified: asked first
        assert tool_call["family"] is None and tool_call["answers"] == ["once", "refuse"]
        with Client(srv.url, TOKEN) as sdk:
            assert sdk.pending()[0].hints == tool_call["hints"]
        assert tool_call["hints"] == {"title": "Trigger Elicitation Request Tool", "readOnlyHint": False,
                                      "destructiveHint": False, "idempotentHint": False, "openWorldHint": False}
        assert api.post("/pending-decisions/decide", json={"id": tool_call["id"], "answer": "once"}).status_code == 200

        question = wait_pending(api, f"{E}/elicitation/create")
        assert question["task_id"] == sub["id"] and question["arguments"]["mode"] == "form"
        assert api.get(f"/tasks/{sub['id']}").json()["status"] == "waiting"
        bad = api.post("/pending-decisions/decide", json={"id": question["id"], "answer": "once",
                                                          "values": {"name": 42}})
        assert bad.status_code == 422 and bad.json()["code"] == "BAD_ANSWER", bad.json()
        wrong = api.post("/pending-decisions/decide", json={"id": tool_call["id"], "answer": "once",
                                                            "values": {"name": "x"}})
        assert wrong.status_code == 409  # already answered: values change nothing
        with Client(srv.url, TOKEN) as sdk:  # the SDK shows the form
            [shown] = [p for p in sdk.pending() if p.id == question["id"]]
            assert shown.arguments["requestedSchema"]["required"] == ["name"]
        env = {**os.environ, "APOLLIA_HOME": str(home.path), "APOLLIA_TOKEN": TOKEN}
        bad_cli = subprocess.run([sys.executable, "-m", "apollia_nb", "pending", "decide", question["id"], "once",
                                  "--values", "[1]"], capture_output=True, text=True, env=env, timeout=60)
        assert bad_cli.returncode != 0 and "BAD_INPUT: argument --values: must be a JSON object" in bad_cli.stderr
        cli = subprocess.run([sys.executable, "-m", "apollia_nb", "pending", "decide", question["id"], "once",
                              "--by", "alice", "--values", json.dumps({"name": "Grace Hopper", "check": True})],
                             capture_output=True, text=True, env=env, timeout=60)  # the CLI, through the server
        assert cli.returncode == 0, cli.stderr
        assert f"{question['id']}: once by alice" in cli.stdout

        final = list(task_events(api, sub["id"]))[-1]
        assert final["status"] == "completed" and final["result"] == "answered"
        run = api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()["entries"]
        [decided] = [e["payload"] for e in run if e["kind"] == "decision"
                     and e["payload"]["tool"] == f"{E}/trigger-elicitation-request"]
        assert decided["hints"]["readOnlyHint"] is False  # the auditor sees what the person saw
        answers = [e["payload"] for e in run if e["kind"] == "answer"]
        assert answers[-1]["values"] == {"name": "Grace Hopper", "check": True}
        assert answers[-1]["answered_by"] == "alice"
        [outer] = [e["payload"] for e in run if e["kind"] == "tool_result"
                   and e["payload"]["tool"] == f"{E}/trigger-elicitation-request"]
        assert "Grace Hopper" in json.dumps(outer["output"])
        assert api.post(f"/audit/replay/{sub['run_id']}").json()["verdict"] == "identical"


def test_progress_shows_on_the_tasks_events(home, everything_url):
    write_config(home, servers={"everything": {"url": everything_url,
                                               "families": {"trigger-long-running-operation": "read"}}})
    agent = manifest(actor=[{"tool_calls": [call(f"{E}/trigger-long-running-operation", duration=1, steps=4)]},
                            {"text": "done"}],
                     required=[f"{E}/trigger-long-running-operation"])
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        assert api.post("/agents", json={"manifest": agent}).status_code == 201
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Take a while"}).json()
        events = list(task_events(api, sub["id"]))
        progress = [e["progress"]["progress"] for e in events if e.get("progress")]
        assert progress and progress == sorted(progress) and progress[-1] <= 4
        assert all(e["progress"]["tool"] == f"{E}/trigger-long-running-operation" for e in events if e["progress"])
        assert events[-1]["status"] == "completed" and events[-1]["progress"] is None
