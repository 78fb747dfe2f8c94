"""Every route of the REST API over real HTTP: statuses, shapes, and the one error model.

A server runs in a background thread on an ephemeral port of 127.0.0.1 over a
fresh home; requests are plain httpx, so what is checked is the wire.
"""

from __future__ import annotations

import httpx
import pytest
from runtime_helpers import call, manifest

from apollia_nb.api.server import ServerThread
from apollia_nb.wire import schemas

TOKEN = "test-token-abc"
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}])


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN) as srv:
        yield srv


@pytest.fixture
def api(server):
    with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30) as client:
        yield client


def error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message"} and body["code"] == code, body
    assert body["message"]
    return body["message"]


def register(api: httpx.Client, text: str = WRITER) -> dict:
    r = api.post("/agents", json={"manifest": text})
    assert r.status_code == 201, r.text
    return r.json()


def submit(api: httpx.Client, agent: str = "clerk", goal: str = "Write", **extra) -> dict:
    r = api.post("/tasks", json={"agent": agent, "goal": goal, **extra})
    assert r.status_code == 202, r.text
    return r.json()


def settled(api: httpx.Client, task_id: str, until: str = "settled") -> dict:
    r = api.get(f"/tasks/{task_id}/wait", params={"until": until, "timeout": 30})
    assert r.status_code == 200, r.text
    return r.json()


#: The documented routes (path parameters without braces).
DOCUMENTED_ROUTES = [
    ("GET", "/health"), ("GET", "/agents"), ("POST", "/agents"), ("GET", "/agents/name"),
    ("POST", "/agents/name/start"), ("POST", "/agents/name/stop"),
    ("POST", "/tasks"), ("GET", "/tasks"), ("GET", "/tasks/task_id"), ("POST", "/tasks/task_id/cancel"),
    ("POST", "/tasks/task_id/plan/approve"), ("POST", "/tasks/task_id/plan/reject"), ("GET", "/tasks/task_id/events"),
    ("POST", "/sessions"), ("GET", "/sessions/session_id"), ("POST", "/sessions/session_id/messages"),
    ("POST", "/sessions/session_id/pause"), ("POST", "/sessions/session_id/inject"),
    ("POST", "/sessions/session_id/resume"), ("POST", "/sessions/session_id/fork"),
    ("POST", "/sessions/session_id/close"), ("POST", "/sessions/session_id/plan/approve"),
    ("POST", "/sessions/session_id/plan/reject"),
    ("GET", "/pending-decisions"), ("POST", "/pending-decisions/decide"),
    ("GET", "/governance/rules"), ("POST", "/governance/rules"), ("DELETE", "/governance/rules/rule_id"),
    ("GET", "/governance/consents"), ("DELETE", "/governance/consents/agent/family"),
    ("GET", "/governance/developer-mode"), ("PUT", "/governance/developer-mode"), ("GET", "/governance/policy"),
    ("GET", "/audit/verify"), ("POST", "/audit/replay/run_id"), ("GET", "/audit/entries"),
]


# --- the token -------------------------------------------------------------------------------------


def _all_operations(server) -> list[tuple[str, str]]:
    doc = httpx.get(server.url + "/api/v1/openapi.json").json()
    ops = []
    for path, item in doc["paths"].items():
        for method in item:
            ops.append((method.upper(), path.replace("{", "").replace("}", "")))
    return ops


def test_health_needs_no_token_and_every_other_route_does(server):
    r = httpx.get(server.url + "/api/v1/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "version": r.json()["version"]}
    ops = _all_operations(server)
    assert {f"{m} {p}" for m, p in ops} >= {f"{m} /api/v1{p}" for m, p in DOCUMENTED_ROUTES}
    with httpx.Client(base_url=server.url) as anonymous:
        for method, path in ops:
            if path == "/api/v1/health":
                continue
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                            {"Authorization": f"Bearer {TOKEN}x"}):
                r = anonymous.request(method, path, headers=headers, json={})
                error(r, 401, "UNAUTHORIZED")
                assert r.headers["www-authenticate"] == "Bearer"


def test_unknown_routes_are_404_and_wrong_methods_405_in_the_error_model(api):
    error(api.get("/nowhere"), 404, "NOT_FOUND")
    r = api.delete("/tasks")
    error(r, 405, "METHOD_NOT_ALLOWED")
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}


def test_bodies_over_the_limit_are_413_declared_or_streamed(api):
    big = b'{"agent": "clerk", "goal": "' + b"x" * 1_100_000 + b'"}'
    error(api.post("/tasks", content=big, headers={"content-type": "application/json"}), 413, "PAYLOAD_TOO_LARGE")

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    r = api.post("/tasks", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    error(r, 413, "PAYLOAD_TOO_LARGE")
    assert api.get("/tasks").json() == []


def test_malformed_bodies_are_422_bad_input_naming_the_field(api):
    register(api)
    assert "body.goal" in error(api.post("/tasks", json={"agent": "clerk"}), 422, "BAD_INPUT")
    assert "max_steps" in error(api.post("/tasks", json={"agent": "clerk", "goal": "g", "max_steps": 0}),
                                422, "BAD_INPUT")
    assert "grants" in error(api.post("/tasks", json={"agent": "clerk", "goal": "g", "grants": ["nope"]}),
                             422, "BAD_INPUT")
    assert "watched" in error(api.post("/tasks", json={"agent": "clerk", "goal": "g", "watched": "yes"}),
                              422, "BAD_INPUT")
    assert "colour" in error(api.post("/tasks", json={"agent": "clerk", "goal": "g", "colour": 1}), 422, "BAD_INPUT")
    assert "not valid JSON" in error(api.post("/tasks", content=b'{"agent": ',
                                              headers={"content-type": "application/json"}), 422, "BAD_INPUT")
    assert "limit" in error(api.get("/audit/entries", params={"limit": 0}), 422, "BAD_INPUT")
    assert "enabled" in error(api.put("/governance/developer-mode", json={"enabled": "yes"}), 422, "BAD_INPUT")
    assert api.get("/tasks").json() == []  # nothing was submitted


# --- agents -----------------------------------------------------------------------------------------


def test_agents_register_list_get_stop_start(api):
    r = api.post("/agents", json={"manifest": WRITER})
    assert r.status_code == 201 and r.headers["location"] == "/api/v1/agents/clerk"
    agent = r.json()
    assert agent["name"] == "clerk" and agent["state"] == "active" and agent["model"] == "scripted"
    assert set(agent) >= {"name", "description", "state", "warnings", "tools", "model", "workspace", "max_steps",
                          "inflight"}
    assert api.get("/agents").json() == [agent]
    assert api.get("/agents/clerk").json() == agent
    assert api.post("/agents", json={"manifest": WRITER}).json() == agent  # idle: registered again in its place
    error(api.get("/agents/nobody"), 404, "UNKNOWN_AGENT")
    error(api.post("/agents/nobody/stop"), 404, "UNKNOWN_AGENT")
    error(api.post("/agents/clerk/start"), 409, "CONFLICT")

    stopped = api.post("/agents/clerk/stop")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert "stopped" in error(api.post("/tasks", json={"agent": "clerk", "goal": "g"}), 409, "AGENT_UNAVAILABLE")
    error(api.post("/sessions", json={"agent": "clerk"}), 409, "AGENT_UNAVAILABLE")
    error(api.post("/agents/clerk/stop"), 409, "INVALID_TRANSITION")
    assert api.post("/agents/clerk/start").json()["state"] == "active"
    assert submit(api)["status"] == "pending"


def test_an_agent_that_has_worked_can_be_stopped_and_started_again(api):
    register(api, manifest())
    sub = submit(api)
    assert settled(api, sub["id"])["status"] == "completed"
    assert api.post("/agents/clerk/stop").json()["state"] == "stopped"
    r = api.post("/agents/clerk/start")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "active"


def test_a_bad_manifest_is_422_manifest_invalid_naming_the_key(api):
    message = error(api.post("/agents", json={"manifest": 'name = "x"\ncolour = "blue"\n'}), 422,
                    "MANIFEST_INVALID")
    assert "colour" in message
    error(api.post("/agents", json={"manifest": ""}), 422, "BAD_INPUT")
    assert api.get("/agents").json() == []


def test_a_degraded_agent_takes_work_with_a_warning(api):
    agent = register(api, manifest("spare", required=["read_file"], optional=["mcp:gone/search"]))
    assert agent["state"] == "degraded" and agent["warnings"]
    sub = submit(api, "spare")
    assert sub["warnings"] and "degraded" in sub["warnings"][0]


# --- tasks ------------------------------------------------------------------------------------------


def test_submit_answers_202_with_the_submission_and_the_task_json_has_the_spec_shape(api):
    register(api, manifest())
    r = api.post("/tasks", json={"agent": "clerk", "goal": "Say hello", "max_steps": 7})
    assert r.status_code == 202
    sub = r.json()
    assert set(sub) == {"id", "run_id", "status", "warnings"} and sub["warnings"] == []
    assert r.headers["location"] == f"/api/v1/tasks/{sub['id']}"
    task = settled(api, sub["id"])
    assert task["status"] == "completed" and task["error"] is None and task["result"] == "Done."
    assert task["budget"] == {"used": 3, "ceiling": 7}
    assert set(task) >= {"id", "run_id", "agent", "status", "error", "steps", "budget", "result", "warnings"}
    assert task["steps"][0]["status"] == "done"
    assert api.get(f"/tasks/{sub['id']}").json() == task
    assert [t["id"] for t in api.get("/tasks").json()] == [sub["id"]]
    assert api.get("/tasks", params={"status": "completed", "agent": "clerk"}).json() == [task]
    assert api.get("/tasks", params={"status": "failed"}).json() == []
    error(api.get("/tasks", params={"status": "sleeping"}), 422, "BAD_INPUT")
    error(api.get("/tasks/task-nope"), 404, "UNKNOWN_TASK")
    error(api.get("/tasks/task-nope/events"), 404, "UNKNOWN_TASK")
    error(api.get("/tasks/task-nope/wait"), 404, "UNKNOWN_TASK")
    error(api.post("/tasks", json={"agent": "nobody", "goal": "g"}), 404, "UNKNOWN_AGENT")


def test_the_budget_ceiling_fails_the_task_with_its_code(api):
    register(api, manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}] * 5))
    task = settled(api, submit(api, max_steps=2)["id"])
    assert task["status"] == "failed" and task["error"]["code"] == "BUDGET_EXCEEDED"


def test_cancel_a_waiting_task_refuses_its_decision_and_a_second_cancel_is_409(api):
    register(api)
    sub = submit(api)
    assert settled(api, sub["id"])["status"] == "waiting"
    r = api.post(f"/tasks/{sub['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert api.get("/pending-decisions").json() == []
    error(api.post(f"/tasks/{sub['id']}/cancel"), 409, "CONFLICT")
    error(api.post("/tasks/task-nope/cancel"), 404, "UNKNOWN_TASK")


def test_plan_approval_with_edited_steps_and_rejection(api):
    register(api, manifest(planner=[{"steps": ["one"]}, {"steps": ["two"]}]))
    first = submit(api, goal="Plan it", approve_plan=True)
    task = settled(api, first["id"])
    assert task["status"] == "waiting" and task["awaiting_plan_approval"] and task["plan"] == ["one"]
    error(api.post(f"/tasks/{first['id']}/plan/approve", json={"steps": []}), 422, "BAD_INPUT")
    r = api.post(f"/tasks/{first['id']}/plan/approve", json={"steps": ["edited"]})
    assert r.status_code == 202
    done = settled(api, first["id"], "finished")
    assert done["status"] == "completed" and done["plan"] == ["edited"]
    error(api.post(f"/tasks/{first['id']}/plan/approve"), 409, "CONFLICT")

    second = submit(api, goal="Plan again", approve_plan=True)
    assert settled(api, second["id"])["awaiting_plan_approval"]
    error(api.post(f"/tasks/{second['id']}/plan/reject", json={}), 422, "BAD_INPUT")
    assert api.post(f"/tasks/{second['id']}/plan/reject", json={"reason": "too risky"}).status_code == 202
    failed = settled(api, second["id"], "finished")
    assert failed["status"] == "failed" and failed["error"]["code"] == "REJECTED"
    assert "too risky" in failed["error"]["message"]

    third = submit(api, goal="No body", approve_plan=True)
    assert settled(api, third["id"])["awaiting_plan_approval"]
    assert api.post(f"/tasks/{third['id']}/plan/approve").status_code == 202  # no body: as proposed
    assert settled(api, third["id"], "finished")["status"] == "completed"


# --- pending decisions --------------------------------------------------------------------------------


def test_decide_validates_the_answer_and_refuses_a_second_answer(api):
    register(api, manifest(actor=[{"tool_calls": [call("bash_executor", command="echo hi")]}]))
    sub = submit(api)
    assert settled(api, sub["id"])["status"] == "waiting"
    [pending] = api.get("/pending-decisions").json()
    assert pending["answers"] == ["once", "refuse"] and pending["family"] == "execute"
    assert set(pending) >= {"id", "run_id", "task_id", "agent", "tool", "family", "arguments", "answers",
                            "created_at"}
    error(api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "always"}), 422, "BAD_ANSWER")
    error(api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "sure"}), 422, "BAD_ANSWER")
    error(api.post("/pending-decisions/decide", json={"id": "pd-nope", "answer": "once"}), 404, "UNKNOWN_DECISION")
    error(api.post("/pending-decisions/decide", json={"id": pending["id"]}), 422, "BAD_INPUT")
    assert api.get("/pending-decisions").json() == [pending]  # nothing changed
    r = api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "refuse", "reason": "no",
                                                    "by": "ops"})
    assert r.status_code == 200
    decided = r.json()
    assert decided["status"] == "answered" and decided["answer"] == "refuse" and decided["answered_by"] == "ops"
    assert decided["answer_reason"] == "no"
    error(api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}), 409, "CONFLICT")
    task = settled(api, sub["id"], "finished")
    assert task["status"] == "failed" and task["error"]["code"] == "REFUSED"


# --- governance -----------------------------------------------------------------------------------------


def test_rules_add_list_remove(api):
    r = api.post("/governance/rules", json={"tool": "bash_executor", "effect": "allow", "prefix": "git status"})
    assert r.status_code == 201
    rule = r.json()
    assert {k: rule[k] for k in ("tool", "prefix", "effect", "agent")} == {
        "tool": "bash_executor", "prefix": "git status", "effect": "allow", "agent": "*"}
    assert r.headers["location"] == f"/api/v1/governance/rules/{rule['id']}"
    assert rule["created_by"] == "api"
    assert api.get("/governance/rules").json() == [rule]
    deny = api.post("/governance/rules", json={"tool": "write_file", "effect": "deny", "agent": "clerk",
                                               "by": "ops"}).json()
    assert deny["agent"] == "clerk" and deny["prefix"] is None and deny["created_by"] == "ops"
    error(api.post("/governance/rules", json={"tool": "x", "effect": "maybe"}), 422, "BAD_INPUT")
    error(api.post("/governance/rules", json={"tool": "x", "effect": "deny", "agent": "Not A Name"}), 422,
          "BAD_INPUT")
    r = api.delete(f"/governance/rules/{rule['id']}")
    assert r.status_code == 204 and r.content == b""
    assert api.get("/governance/rules").json() == [deny]
    error(api.delete(f"/governance/rules/{rule['id']}"), 404, "UNKNOWN_RULE")


def test_always_records_a_consent_that_can_be_listed_and_revoked(api):
    register(api)
    sub = submit(api)
    settled(api, sub["id"])
    [pending] = api.get("/pending-decisions").json()
    api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "always"})
    assert settled(api, sub["id"], "finished")["status"] == "completed"
    [consent] = api.get("/governance/consents").json()
    assert consent["agent"] == "clerk" and consent["family"] == "write" and consent["granted_by"] == "api"
    error(api.delete("/governance/consents/clerk/colour"), 422, "BAD_INPUT")
    assert api.delete("/governance/consents/clerk/write").status_code == 204
    assert api.get("/governance/consents").json() == []
    error(api.delete("/governance/consents/clerk/write"), 404, "NOT_FOUND")


def test_developer_mode_and_policy(api):
    assert api.get("/governance/developer-mode").json()["enabled"] is False
    on = api.put("/governance/developer-mode", json={"enabled": True})
    assert on.status_code == 200 and on.json()["enabled"] is True and on.json()["changed_by"] == "api"
    assert api.get("/governance/developer-mode").json()["enabled"] is True
    assert api.put("/governance/developer-mode", json={"enabled": False}).json()["enabled"] is False
    policy = api.get("/governance/policy").json()
    assert policy["status"] == "none" and policy["policy"] is None


# --- audit ------------------------------------------------------------------------------------------------


def test_verify_entries_paging_and_replay(api):
    register(api, manifest())
    sub = submit(api)
    assert settled(api, sub["id"])["status"] == "completed"
    report = api.get("/audit/verify").json()
    assert report["ok"] is True and report["entries"] > 0 and report["problem"] is None

    run = api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()
    kinds = [e["kind"] for e in run["entries"]]
    assert kinds[0] == "run_open" and kinds[-1] == "run_seal" and run["next_since_seq"] is None
    first = api.get("/audit/entries", params={"limit": 2}).json()
    assert len(first["entries"]) == 2 and first["next_since_seq"] == first["entries"][1]["seq"]
    rest = api.get("/audit/entries", params={"since_seq": first["next_since_seq"], "limit": 1000}).json()
    seqs = [e["seq"] for e in first["entries"] + rest["entries"]]
    assert seqs == list(range(1, report["entries"] + 1))
    entry = first["entries"][0]
    assert set(entry) == {"seq", "ts", "run_id", "agent", "kind", "payload", "prev_hash", "hash", "signature",
                          "key_id"}

    replay = api.post(f"/audit/replay/{sub['run_id']}").json()
    assert replay["verdict"] == "identical" and replay["divergences"] == [] and replay["run_id"] == sub["run_id"]
    error(api.post("/audit/replay/run-nope"), 404, "UNKNOWN_RUN")


# --- sessions -------------------------------------------------------------------------------------------------


def sse(response: httpx.Response) -> list[tuple[str, dict]]:
    import json

    out, name = [], None
    for line in response.iter_lines():
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            out.append((name, json.loads(line.split(":", 1)[1])))
    return out


def test_a_chat_message_streams_its_exchange_and_the_session_keeps_the_history(api):
    register(api, manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}, {"text": "Nothing here."}]))
    r = api.post("/sessions", json={"agent": "clerk"})
    assert r.status_code == 201
    session = r.json()
    assert session["state"] == "active" and session["history"] == []
    assert r.headers["location"] == f"/api/v1/sessions/{session['id']}"
    with api.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "What is there?"}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = sse(resp)
    names = [n for n, _ in events]
    for name, data in events:
        schemas.EXCHANGE_EVENTS[name].model_validate(data)
    assert names[0] == "tool_call_started" and "tool_result" in names and names[-1] == "end"
    assert events[-1][1]["status"] == "done" and events[-1][1]["reply"] == "Nothing here."
    assert "".join(d["text"] for n, d in events if n == "text") == "Nothing here."
    got = api.get(f"/sessions/{session['id']}").json()
    assert got["state"] == "active" and got["history"][0] == {"role": "user", "content": "What is there?"}
    assert [s["id"] for s in api.get("/sessions").json()] == [session["id"]]
    with api.stream("GET", f"/sessions/{session['id']}/events") as resp:  # the last exchange, replayed
        assert [n for n, _ in sse(resp)] == names

    fork = api.post(f"/sessions/{session['id']}/fork")
    assert fork.status_code == 201 and fork.json()["forked_from"] == session["id"]
    assert fork.json()["history"] == got["history"]
    with api.stream("GET", f"/sessions/{fork.json()['id']}/events") as resp:
        assert sse(resp) == []  # no exchange yet

    closed = api.post(f"/sessions/{session['id']}/close")
    assert closed.status_code == 200 and closed.json()["state"] == "closed"
    error(api.post(f"/sessions/{session['id']}/messages", json={"text": "more"}), 409, "SESSION_CLOSED")
    assert api.get(f"/sessions/{session['id']}").json()["history"] == got["history"]
    error(api.get("/sessions/chat-nope"), 404, "UNKNOWN_SESSION")
    error(api.post("/sessions/chat-nope/messages", json={"text": "hi"}), 404, "UNKNOWN_SESSION")
    error(api.post(f"/sessions/{fork.json()['id']}/messages", json={"text": ""}), 422, "BAD_INPUT")


def test_a_second_message_while_processing_is_409_session_busy(api):
    register(api, manifest(actor=[{"tool_calls": [call("write_file", path="n.txt", content="x")]},
                                  {"text": "Written."}]))
    session = api.post("/sessions", json={"agent": "clerk"}).json()
    with api.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "Write"}) as resp:
        lines = resp.iter_lines()
        for line in lines:
            if line.startswith("event: card"):
                break
        error(api.post(f"/sessions/{session['id']}/messages", json={"text": "again"}), 409, "SESSION_BUSY")
        [pending] = api.get("/pending-decisions").json()
        assert pending["tool"] == "write_file"
        assert api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}).status_code == 200
        rest = "\n".join(lines)
    assert "event: end" in rest and '"reply": "Written."' in rest


def test_pause_inject_resume_and_plan_mode(api):
    register(api, manifest(planner=[{"steps": ["look", "report"]}], actor=[{"text": "Reported."}]))
    session = api.post("/sessions", json={"agent": "clerk", "plan_mode": True}).json()
    assert session["plan_mode"] is True
    paused = api.post(f"/sessions/{session['id']}/pause").json()
    assert paused["state"] == "paused"
    error(api.post(f"/sessions/{session['id']}/messages", json={"text": "hi"}), 409, "CONFLICT")
    injected = api.post(f"/sessions/{session['id']}/inject", json={"text": "context"}).json()
    assert injected["history"][-1]["content"] == "context"
    resumed = api.post(f"/sessions/{session['id']}/resume")
    assert resumed.status_code == 202 and resumed.json()["state"] == "active"
    error(api.post(f"/sessions/{session['id']}/resume"), 409, "CONFLICT")

    with api.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "Report"}) as resp:
        events = sse(resp)
    assert ("plan", {"type": "plan", "steps": ["look", "report"]}) in events
    assert api.get(f"/sessions/{session['id']}").json()["pending_plan"] == ["look", "report"]
    error(api.post(f"/sessions/{session['id']}/plan/approve", json={"steps": [""]}), 422, "BAD_INPUT")
    approved = api.post(f"/sessions/{session['id']}/plan/approve", json={"steps": ["report"]})
    assert approved.status_code == 202
    with api.stream("GET", f"/sessions/{session['id']}/events") as resp:
        events = sse(resp)
    assert events[-1][0] == "end" and events[-1][1]["reply"] == "Reported."
    error(api.post(f"/sessions/{session['id']}/plan/reject", json={"reason": "no"}), 409, "CONFLICT")


# --- CORS ----------------------------------------------------------------------------------------------


def test_no_cors_unless_configured(server, home):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization"}
    r = httpx.options(server.url + "/api/v1/tasks", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/api/v1/health", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_for_the_configured_origins_only(tmp_path):
    with ServerThread(tmp_path / "cors-home", token=TOKEN, cors_origins=("http://app.example",)) as srv:
        preflight = {"Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"}
        r = httpx.options(srv.url + "/api/v1/tasks", headers={"Origin": "http://app.example", **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        r = httpx.options(srv.url + "/api/v1/tasks", headers={"Origin": "http://evil.example", **preflight})
        assert r.headers.get("access-control-allow-origin") != "http://evil.example"


# --- the OpenAPI document -------------------------------------------------------------------------------------


def test_the_openapi_document_declares_bearer_auth_and_a_schema_for_every_body_and_response(server):
    doc = httpx.get(server.url + "/api/v1/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearerToken"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearerToken"][
            "description"]}
    error_ref = {"$ref": "#/components/schemas/Error"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            if path == "/api/v1/health":
                assert "security" not in op, where
            else:
                assert op["security"] == [{"bearerToken": []}], where
                assert op["responses"]["401"]["content"]["application/json"]["schema"] == error_ref, where
            if "requestBody" in op:
                assert op["requestBody"]["content"]["application/json"]["schema"], where
                assert op["responses"]["422"]["content"]["application/json"]["schema"] == error_ref, where
            ok = [code for code in op["responses"] if code.startswith("2")]
            assert len(ok) == 1, where
            content = op["responses"][ok[0]].get("content", {})
            if ok[0] == "204":
                assert content == {}, where
            elif "text/event-stream" in content:
                assert content["text/event-stream"]["schema"]["type"] == "string", where
                assert content["text/event-stream"]["x-itemSchema"]["oneOf"], where
            else:
                assert content["application/json"]["schema"], where
            for code, response in op["responses"].items():
                if code.startswith("4"):
                    assert response["content"]["application/json"]["schema"] == error_ref, where
