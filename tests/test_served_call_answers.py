"""What a client's governed call and journal append are answered with, as sent on the wire: exactly the JSON
their documented models (``CallOut``, ``JournalRows``) give, though the server builds these answers itself
rather than checking them against the models on every request.

Against a real server (uvicorn on 127.0.0.1 on a port of its own, the home's journal and governance).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apollia_nb.api.internal import CallOut, GovernanceSnapshot, JournalRows
from apollia_nb.api.server import ServerThread

TOKEN = "served-call-answers-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALLS = "/api/v1/internal/calls"


@pytest.fixture
def http(home):
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as client:
        yield client


def call_body(run_id: str, call_id: str, **changes: Any) -> dict[str, Any]:
    body = {"call_id": call_id, "run_id": run_id, "agent": "clerk", "tool": "list_dir", "family": "read",
            "arguments": {"path": "."}, "decision": {"call_id": call_id, "tool": "list_dir", "arguments": {"path": "."}},
            "before": [{"kind": "model_response", "run_id": run_id, "agent": "clerk",
                        "payload": {"role": "actor", "turn": 1, "text": "é ✓", "tool_calls": []}}]}
    return {**body, **changes}


def as_documented(model: Any, response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON, checked to be exactly what ``model`` sends for it (nothing more, nothing less)."""
    assert response.headers["content-type"] == "application/json"
    sent = response.json()
    assert model.model_validate(sent).model_dump(mode="json") == sent
    return sent


def test_a_call_answer_is_its_documented_model_with_the_snapshot_only_when_the_client_holds_another(http):
    snapshot = http.get("/api/v1/internal/governance/snapshot").json()
    stale = as_documented(CallOut, http.post(CALLS, json=call_body("run-a", "c1", generation="old.1")))
    assert stale["snapshot"] == GovernanceSnapshot.model_validate(snapshot).model_dump(mode="json")
    assert stale["generation"] == snapshot["generation"]
    none_held = as_documented(CallOut, http.post(CALLS, json=call_body("run-a", "c2")))
    assert none_held["snapshot"] == stale["snapshot"]
    held = as_documented(CallOut, http.post(CALLS, json=call_body("run-a", "c3", generation=snapshot["generation"])))
    assert held["snapshot"] is None
    assert held["decision"] == {"outcome": "allow", "line": held["decision"]["line"], "answers": [],
                                "reason": held["decision"]["reason"], "rule_id": None}
    kinds = [row["kind"] for row in held["entries"]]
    assert kinds == ["model_response", "decision", "tool_call"]
    assert json.loads(held["entries"][0]["payload"])["text"] == "é ✓"  # not escaped, not re-encoded
    # a retry is answered as the first was
    again = as_documented(CallOut, http.post(CALLS, json=call_body("run-a", "c1", generation="old.1")))
    assert again == stale


def test_a_refused_call_answer_is_its_documented_model(http):
    http.post("/api/v1/governance/rules", json={"tool": "list_dir", "effect": "deny", "agent": "clerk"}).raise_for_status()
    refused = as_documented(CallOut, http.post(CALLS, json=call_body("run-r", "c1")))
    assert refused["decision"]["outcome"] == "refuse" and refused["decision"]["rule_id"]
    assert [row["kind"] for row in refused["entries"]] == ["model_response", "decision", "tool_result"]


def test_an_append_answer_is_its_documented_model_and_201(http):
    response = http.post("/api/v1/internal/journal/entries", json={"entries": [
        {"kind": "note", "payload": {"text": "ü"}, "run_id": "run-n", "agent": None}]})
    assert response.status_code == 201
    rows = as_documented(JournalRows, response)["entries"]
    assert [(r["kind"], json.loads(r["payload"])) for r in rows] == [("note", {"text": "ü"})]


def test_a_bad_call_is_still_refused_before_anything_is_journaled(http):
    head = http.get("/api/v1/internal/journal/head").json()["seq"]
    bad = http.post(CALLS, json=call_body("run-b", "c1", family="bogus"))
    assert bad.status_code == 422
    assert http.get("/api/v1/internal/journal/head").json()["seq"] == head
