"""The hot routes of a served home — a client's governed call (``POST /api/v1/internal/calls``) and another
agent's hook (``POST /api/v1/hooks/{tool}``) — are answered past the framework's per-request machinery
(``api/hot.py``) and keep every rule of the routes: the host and origin checks, the body limit, the route's
guard (the server's token, a worker credential for its batch only, a person with the route's role), the
model's refusals in the app's own words, and the answer only after the commit. And what a served call costs
the home besides: the first call of a run the server saw opened reads nothing back from the journal, and a
run's size for its seal is counted where the journal keeps it.

Against a real server (uvicorn on 127.0.0.1, port 0, in a thread of the test) on the test's own home, and
raw sockets for what a well-behaved client never sends.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from apollia_nb.api.server import ServerThread
from test_served_calls import call_body

TOKEN = "hot-routes-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALLS = "/api/v1/internal/calls"
HOOK = "/api/v1/hooks/claude-code"


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN, max_body_bytes=64_000) as srv:
        yield srv


@pytest.fixture
def owner(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
        yield client


@pytest.fixture
def framework(monkeypatch):
    """The requests that went through FastAPI's routing to a route (path by path)."""
    seen: list[str] = []
    handle = APIRoute.handle

    async def counted(self: Any, scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await handle(self, scope, receive, send)

    monkeypatch.setattr(APIRoute, "handle", counted)
    return seen


def head(owner: httpx.Client) -> int:
    return owner.get("/api/v1/internal/journal/head").json()["seq"]


def hook_input(tmp_path: Any, i: int = 0) -> dict[str, Any]:
    return {"session_id": "s", "transcript_path": None, "cwd": str(tmp_path), "permission_mode": "default",
            "hook_event_name": "PreToolUse", "tool_name": "Read",
            "tool_input": {"file_path": str(tmp_path / "notes.txt")}, "tool_use_id": f"toolu_{i}"}


def test_a_call_and_a_hook_are_answered_past_the_frameworks_routing(owner, framework, tmp_path):
    answer = owner.post(CALLS, json=call_body("run-hot"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"]["outcome"] == "ask" and answer.headers["content-type"] == "application/json"
    hooked = owner.post(HOOK, json=hook_input(tmp_path))
    assert hooked.status_code == 200  # the tool's answer (here its deny: nothing is installed for this project)
    assert hooked.json()["hookSpecificOutput"]["permissionDecision"] in ("allow", "deny", "ask")
    assert framework == []  # neither went through FastAPI's routing
    owner.get("/api/v1/internal/journal/head")
    assert framework == ["/api/v1/internal/journal/head"]  # every other route still does


def test_the_hot_routes_refuse_a_missing_or_wrong_token_before_anything_is_journaled(owner, server, tmp_path,
                                                                                     framework):
    before = head(owner)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": "Bearer"}):
        for path, body in ((CALLS, call_body("run-tok")), (HOOK, hook_input(tmp_path))):
            answer = httpx.post(server.url + path, json=body, headers=headers, timeout=30)
            assert answer.status_code == 401, (path, headers, answer.text)
            assert answer.json()["code"] == "UNAUTHORIZED" and answer.headers["www-authenticate"] == "Bearer"
    # a body the model refuses, sent without the token, is refused for the token first (nothing is told about it)
    bad = httpx.post(server.url + CALLS, json=call_body("run-tok", family="bogus"), timeout=30,
                     headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.json()["code"] == "UNAUTHORIZED"
    assert head(owner) == before
    # the one the fast path handed to the app; the others were refused by its own guard
    assert [p for p in framework if p in (CALLS, HOOK)] == [CALLS]


def test_a_person_needs_the_routes_role_on_the_fast_path_too(owner, server, framework):
    made = {role: owner.post("/api/v1/people", json={"name": f"p-{role}", "roles": [role]}) for role in
            ("auditor", "approver", "admin")}
    tokens = {role: r.json()["token"] for role, r in made.items()}
    before = head(owner)
    for role in ("auditor", "approver"):
        answer = httpx.post(server.url + CALLS, json=call_body("run-role"), timeout=30,
                            headers={"Authorization": f"Bearer {tokens[role]}"})
        assert answer.status_code == 403 and answer.json()["code"] == "FORBIDDEN", answer.text
        assert "'runner'" in answer.json()["message"] and f"p-{role}" in answer.json()["message"]
    assert head(owner) == before
    as_admin = {"Authorization": f"Bearer {tokens['admin']}"}
    # a person's call is for a run that person opened, whatever their roles
    other = httpx.post(server.url + CALLS, json=call_body("run-role"), timeout=30, headers=as_admin)
    assert other.status_code == 403 and "opened" in other.json()["message"], other.text
    assert head(owner) == before
    opened = httpx.post(server.url + "/api/v1/internal/journal/entries", timeout=30, headers=as_admin, json={
        "entries": [{"kind": "run_open", "run_id": "run-role", "agent": "clerk",
                     "payload": {"run_kind": "task", "task_id": "task-role"}}]})
    assert opened.status_code == 201, opened.text
    admin = httpx.post(server.url + CALLS, json=call_body("run-role"), timeout=30, headers=as_admin)
    assert admin.status_code == 200, admin.text
    revoked = owner.post("/api/v1/people/p-admin/revoke")
    assert revoked.status_code == 200, revoked.text
    again = httpx.post(server.url + CALLS, json=call_body("run-role", "call-2"), timeout=30,
                       headers={"Authorization": f"Bearer {tokens['admin']}"})
    assert again.status_code == 401  # revoked: the next request already fails
    assert CALLS not in framework


def test_the_host_origin_and_size_rules_still_come_first(owner, server, tmp_path, framework):
    before = head(owner)
    port = server.url.rsplit(":", 1)[1]
    rebound = httpx.post(server.url + CALLS, json=call_body("run-host"), timeout=30,
                         headers={**AUTH, "Host": f"evil.example:{port}"})
    assert rebound.status_code == 421 and rebound.json()["code"] == "HOST_NOT_ALLOWED"
    page = httpx.post(server.url + HOOK, json=hook_input(tmp_path), timeout=30,
                      headers={**AUTH, "Origin": "http://evil.example"})
    assert page.status_code == 403 and page.json()["code"] == "ORIGIN_NOT_ALLOWED"
    big = call_body("run-big", arguments={"path": "x" * 70_000, "content": "x"})
    declared = owner.post(CALLS, json=big)
    assert declared.status_code == 413 and declared.json()["code"] == "PAYLOAD_TOO_LARGE"

    def streamed() -> Any:  # no Content-Length: counted as it arrives
        data = json.dumps(big).encode()
        for at in range(0, len(data), 8192):
            yield data[at:at + 8192]

    chunked = owner.post(CALLS, content=streamed(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413 and chunked.json()["code"] == "PAYLOAD_TOO_LARGE", chunked.text
    assert head(owner) == before
    assert not [p for p in framework if p in (CALLS, HOOK)]


def test_what_the_fast_path_does_not_take_is_answered_by_the_app_in_its_own_words(owner, framework):
    before = head(owner)
    wrong_family = owner.post(CALLS, json=call_body("run-422", family="bogus"))
    assert wrong_family.status_code == 422 and wrong_family.json()["code"] == "BAD_INPUT"
    assert wrong_family.json()["message"].startswith("body.family:"), wrong_family.text
    extra = owner.post(CALLS, json={**call_body("run-422"), "sneaky": True})
    assert extra.status_code == 422 and "body.sneaky" in extra.json()["message"]
    torn_json = owner.post(CALLS, content=b'{"call_id": "c", "run_id": ', headers={"Content-Type": "application/json"})
    assert torn_json.status_code == 422 and "not valid JSON" in torn_json.json()["message"]
    as_text = owner.post(CALLS, content=json.dumps(call_body("run-422")).encode(),
                         headers={"Content-Type": "text/plain"})
    assert as_text.status_code == 422 and as_text.json()["code"] == "BAD_INPUT"
    a_bool_for_a_str = owner.post(CALLS, json=call_body("run-422", shell="yes"))
    assert a_bool_for_a_str.status_code == 422
    got = owner.get(CALLS)
    assert got.status_code == 405 and got.json()["code"] == "METHOD_NOT_ALLOWED"
    other_tool = owner.post("/api/v1/hooks/vim", json={})
    assert other_tool.status_code == 422 and other_tool.json()["code"] == "BAD_INPUT"
    assert head(owner) == before
    assert len([p for p in framework if p.startswith((CALLS, "/api/v1/hooks/"))]) == 7  # the app refused each


def test_a_body_torn_off_before_its_end_decides_nothing_and_the_server_goes_on(owner, server, framework):
    before = head(owner)
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    data = json.dumps(call_body("run-torn")).encode()
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST " + CALLS.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         + f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n".encode()
                         + f"Content-Length: {len(data)}\r\n\r\n".encode() + data[:cut])
            sock.shutdown(socket.SHUT_WR)  # the client goes away with its body unsent
            sock.settimeout(10)
            left = sock.recv(65536)  # nothing decided: no answer, or the server's 400 for the torn message
            assert b"200 OK" not in left
    assert head(owner) == before and CALLS not in framework
    assert owner.post(CALLS, json=call_body("run-torn")).status_code == 200  # the server goes on


def test_a_worker_credential_on_the_fast_path_reaches_only_its_batchs_runs(owner, server):
    batch = "batch-00aa11bb22cc"
    issued = owner.post("/api/v1/internal/worker-tokens", json={"agent": "clerk", "batch_id": batch, "tasks": 1})
    worker = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {issued.json()['token']}"},
                          timeout=30)
    mine = f"task-{batch.removeprefix('batch-')}-0"
    assert worker.post("/api/v1/internal/journal/entries", json={"entries": [
        {"kind": "run_open", "run_id": "run-w", "agent": "clerk",
         "payload": {"run_kind": "task", "goal": "g", "task_id": mine}}]}).status_code == 201
    assert worker.post(CALLS, json=call_body("run-w")).status_code == 200
    assert worker.post(CALLS, json=call_body("run-x", "call-2")).status_code == 401
    assert worker.post(HOOK, json={}).status_code == 401  # not a route of its batch
    sized = worker.get("/api/v1/internal/journal/run-size", params={"run_id": "run-w"})
    assert sized.status_code == 200 and sized.json() == {"run_id": "run-w", "entries": 3}
    assert worker.get("/api/v1/internal/journal/run-size", params={"run_id": "run-x"}).status_code == 401
    owner.post("/api/v1/internal/worker-tokens/revoke", json={"token": issued.json()["token"]})
    assert worker.post(CALLS, json=call_body("run-w", "call-3")).status_code == 401


def test_a_run_opened_through_this_server_is_not_read_back_at_its_first_call(home, monkeypatch):
    from apollia_nb.api import idempotency

    reads: list[str] = []
    journaled_calls = idempotency.journaled_calls

    def counted(journal: Any, run_id: str) -> Any:
        reads.append(run_id)
        return journaled_calls(journal, run_id)

    monkeypatch.setattr(idempotency, "journaled_calls", counted)
    opened = {"kind": "run_open", "run_id": "run-new", "agent": "clerk",
              "payload": {"run_kind": "task", "goal": "g", "task_id": "task-1"}}
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as api:
        # opened with its first call: read back (a retry after a restart carries the run_open too)
        first = api.post(CALLS, json=call_body("run-new", before=[opened]))
        assert first.status_code == 200, first.text
        assert api.post("/api/v1/internal/journal/entries", json={"entries": [
            {**opened, "run_id": "run-appended"}]}).status_code == 201  # opened by an append
        assert api.post(CALLS, json=call_body("run-appended")).status_code == 200
        # a decision journaled by an append is still found: the same call id is not decided again
        assert api.post("/api/v1/internal/journal/entries", json={"entries": [
            {"kind": "decision", "run_id": "run-appended", "agent": "clerk",
             "payload": {"call_id": "call-9", "outcome": "allow"}}]}).status_code == 201
        twice = api.post(CALLS, json=call_body("run-appended", "call-9"))
        assert twice.status_code == 409 and twice.json()["code"] == "CONFLICT"
        assert api.post(CALLS, json=call_body("run-elsewhere")).status_code == 200  # never opened here
        assert api.post(CALLS, json=call_body("run-new", "call-2")).status_code == 200
        assert reads == ["run-new", "run-elsewhere"]  # never a run opened by an append of this server
    reads.clear()
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as api:
        size = api.get("/api/v1/internal/journal/run-size", params={"run_id": "run-new"}).json()["entries"]
        api.post(CALLS, json=call_body("run-new", before=[opened]))  # a retry after a restart
        assert reads == ["run-new"]  # opened by an earlier process: read back once
        assert api.get("/api/v1/internal/journal/run-size", params={"run_id": "run-new"}).json()["entries"] == size
        entries = api.get("/api/v1/internal/journal/entries", params={"run_id": "run-appended"}).json()["entries"]
        assert [json.loads(e["payload"]).get("call_id") for e in entries if e["kind"] == "decision"] == [
            "call-1", "call-9"]


def test_a_runs_size_is_what_its_entries_are_however_many_are_not_yet_copied(owner):
    assert owner.get("/api/v1/internal/journal/run-size", params={"run_id": "run-none"}).json()["entries"] == 0
    for i in range(5):
        assert owner.post(CALLS, json=call_body("run-size", f"call-{i}")).status_code == 200
    size = owner.get("/api/v1/internal/journal/run-size", params={"run_id": "run-size"}).json()
    listed = owner.get("/api/v1/internal/journal/entries", params={"run_id": "run-size"}).json()["entries"]
    assert size == {"run_id": "run-size", "entries": len(listed)} and len(listed) == 10
    missing = owner.get("/api/v1/internal/journal/run-size")
    assert missing.status_code == 422 and missing.json()["code"] == "BAD_INPUT"


def test_the_server_answers_others_while_a_workers_new_run_is_looked_up(home, monkeypatch):
    """A worker's ``run_open`` is checked against what the server knows of the journal's runs (the run must be
    new), a read of ``journal.db``: in a worker thread, so the event loop answers other requests meanwhile."""
    import threading

    from apollia_nb.api.worker_tokens import KnownRuns

    looking, release = threading.Event(), threading.Event()
    holds = KnownRuns.holds

    def slow(self: Any, run_id: str) -> Any:
        if run_id == "run-slow":
            looking.set()
            assert release.wait(30)
        return holds(self, run_id)

    monkeypatch.setattr(KnownRuns, "holds", slow)
    batch = "batch-00aa11bb22cc"
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(base_url=srv.url, headers=AUTH, timeout=30) as api:
        issued = api.post("/api/v1/internal/worker-tokens", json={"agent": "clerk", "batch_id": batch, "tasks": 1})
        token = issued.json()["token"]
        opened: list[httpx.Response] = []

        def open_run() -> None:
            with httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as w:
                opened.append(w.post("/api/v1/internal/journal/entries", json={"entries": [
                    {"kind": "run_open", "run_id": "run-slow", "agent": "clerk",
                     "payload": {"run_kind": "task", "goal": "g", "task_id": f"task-{batch[6:]}-0"}}]}))

        worker = threading.Thread(target=open_run)
        worker.start()
        try:
            assert looking.wait(30)
            with httpx.Client(base_url=srv.url, headers=AUTH, timeout=5) as other:  # answered while it waits
                assert other.get("/api/v1/internal/journal/head").status_code == 200
                assert other.post(CALLS, json=call_body("run-meanwhile")).status_code == 200
        finally:
            release.set()
            worker.join(30)
        assert opened and opened[0].status_code == 201, opened
