"""Approvals bound to the action, on every face a person answers from: the cards a stream shows carry
what an answer approves (its digest, who may answer, when the approval ends), a terminal binds its answer
to the digest it saw, an approver reads the plan it approves, and a refused plan answer is journaled."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from runtime_helpers import call, manifest
from test_approvals_bound import Clock, _client, _until

OWNER = "wire-owner-" + "w" * 32
WRITE = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])
PLANNED = manifest(planner=[{"steps": ["Write the file"]}],
                   actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])


def _person(owner: httpx.Client, name: str, *roles: str) -> str:
    made = owner.post("/people", json={"name": name, "roles": list(roles)})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _entries(owner: httpx.Client, run_id: str, kind: str) -> list[dict[str, Any]]:
    entries = owner.get("/audit/entries", params={"run_id": run_id, "limit": 1000}).json()["entries"]
    return [e["payload"] for e in entries if e["kind"] == kind]


# --- an approver reads what it approves -------------------------------------------------------------


def test_an_approver_reads_the_task_whose_plan_it_approves_and_the_session_it_answers(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        ann = _person(owner, "ann", "approver")
        assert owner.post("/agents", json={"manifest": PLANNED}).status_code == 201
        task = owner.post("/tasks", json={"agent": "clerk", "goal": "Write", "approve_plan": True,
                                          "grants": ["write"]}).json()
        shown = _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["awaiting_plan_approval"])
        session = owner.post("/sessions", json={"agent": "clerk", "plan_mode": True}).json()
        with _client(srv.url, ann) as approver:
            seen = approver.get(f"/tasks/{task['id']}")
            assert seen.status_code == 200, seen.text
            assert seen.json()["plan"] == ["Write the file"] and seen.json()["plan_digest"] == shown["plan_digest"]
            assert approver.get(f"/sessions/{session['id']}").status_code == 200
            # What is a runner's alone stays so: listing every task, following a run, changing one.
            for method, path in (("GET", "/tasks"), ("GET", f"/tasks/{task['id']}/events"),
                                 ("POST", f"/tasks/{task['id']}/cancel"), ("GET", "/sessions")):
                refused = approver.request(method, path)
                assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN", (method, path)
            assert approver.post(f"/tasks/{task['id']}/plan/approve",
                                 json={"digest": seen.json()["plan_digest"]}).status_code == 202
        _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")


# --- a card on a stream shows what its answer approves -----------------------------------------------


def _sse_lines(lines: Any) -> Any:
    """``(event, data)`` of a stream's lines, as they come."""
    name = None
    for line in lines:
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            yield name, json.loads(line.split(":", 1)[1])


def test_a_card_on_a_chat_stream_carries_the_digest_who_may_answer_and_the_approvals_end(home):
    from apollia_nb.wire import schemas

    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner, \
            _client(srv.url, OWNER) as answering:
        assert owner.post("/agents", json={"manifest": WRITE}).status_code == 201
        session = owner.post("/sessions", json={"agent": "clerk"}).json()
        events: list[tuple[str, dict[str, Any]]] = []
        with owner.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "Write"}) as resp:
            assert resp.status_code == 200
            for name, data in _sse_lines(resp.iter_lines()):
                events.append((name, data))
                if name == "card":  # answered from another connection while the stream waits
                    [pending] = answering.get("/pending-decisions").json()
                    assert pending["id"] == data["card"]["id"]
                    decided = answering.post("/pending-decisions/decide", json={
                        "id": pending["id"], "answer": "once", "digest": data["card"]["digest"],
                        "expires_in": 600})
                    assert decided.status_code == 200, decided.text
                    answered = decided.json()
        [(_, raw)] = [(n, d) for n, d in events if n == "card"]
        assert events[-1][0] == "end" and events[-1][1]["status"] == "done"
        card = schemas.CardEvent.model_validate(raw).card  # as a client reads it: the same names as REST
        assert card.digest == pending["digest"] == answered["digest"] and card.digest.startswith("sha256:")
        assert card.may_answer == pending["may_answer"] and card.may_answer["roles"] == ["approver"]
        assert card.expires_at is None and answered["expires_at"] is not None  # asked before any answer
        with owner.stream("GET", f"/sessions/{session['id']}/events") as resp:  # the exchange replayed
            [replayed] = [schemas.CardEvent.model_validate(d).card for n, d in _sse_lines(resp.iter_lines())
                          if n == "card"]
        assert replayed.digest == pending["digest"] and replayed.may_answer == pending["may_answer"]
        # The document a client is generated from names them, as the pending decision's.
        document = owner.get("/openapi.json").json()["components"]["schemas"]
        for field in ("digest", "may_answer", "expires_at"):
            assert field in document["Card"]["properties"] and field in document["PendingDecision"]["properties"]


# --- a terminal binds its answer to what it saw ---------------------------------------------------------


def _cli(home: Any, *args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([sys.executable, "-m", "apollia_nb", *args, "--home", str(home.path)], capture_output=True,
                          text=True, env=env, timeout=180)


TWICE = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]},
                        {"tool_calls": [call("write_file", path="a.txt", content="one")]},
                        {"text": "Done."}])


def _terminal_binds_its_answer(home: Any, tmp_path: Any) -> list[dict[str, Any]]:
    """Run TWICE unattended, answer both calls at the terminal bound to their digests; returns the answers."""
    source = tmp_path / "clerk.toml"
    source.write_text(TWICE)
    assert _cli(home, "agents", "register", str(source)).returncode == 0
    started = _cli(home, "run", "clerk", "Write", "--unattended", "--json")
    assert started.returncode == 0, started.stderr
    [first] = json.loads(_cli(home, "pending", "list", "--json").stdout)
    assert first["digest"].startswith("sha256:") and len(first["digest"]) == 71
    listed = _cli(home, "pending", "list")
    assert f"digest: {first['digest']}" in listed.stdout  # what a person copies into --digest
    answered = []
    for wrong in ("sha256:" + "0" * 64, "not a digest"):
        stale = _cli(home, "pending", "decide", first["id"], "once", "--digest", wrong)
        assert stale.returncode == 3 and stale.stderr.startswith("error: STALE_APPROVAL: ")
        assert first["digest"] in stale.stderr
    bad = _cli(home, "pending", "decide", first["id"], "once", "--expires-in", "-5")
    assert bad.returncode == 3 and "BAD_INPUT" in bad.stderr
    both = _cli(home, "pending", "decide", first["id"], "once", "--expires-in", "60", "--expires-at",
                "2099-01-01T00:00:00Z")
    assert both.returncode == 3 and "BAD_INPUT" in both.stderr and "not allowed with" in both.stderr  # one end
    assert [p["id"] for p in json.loads(_cli(home, "pending", "list", "--json").stdout)] == [first["id"]]
    done = _cli(home, "pending", "decide", first["id"], "once", "--digest", first["digest"], "--expires-in", "600",
                "--json")
    assert done.returncode == 0, done.stderr
    decision = json.loads(done.stdout)["decision"]
    assert decision["digest"] == first["digest"] and decision["expires_at"].endswith("Z")
    answered.append(decision)
    [second] = json.loads(_cli(home, "pending", "list", "--json").stdout)
    replayed = _cli(home, "pending", "decide", second["id"], "once", "--digest", first["digest"])
    assert replayed.returncode == 3 and "STALE_APPROVAL" in replayed.stderr  # the first approval, for another call
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)
    text = _cli(home, "pending", "decide", second["id"], "once", "--digest", second["digest"], "--expires-at",
                tomorrow.isoformat())
    assert text.returncode == 0, text.stderr
    ends = tomorrow.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"the approval ends {ends}" in text.stdout.splitlines()[0]
    answered.append({"expires_at": ends})
    return answered


def test_pending_decide_binds_the_answer_to_the_digest_a_person_saw_on_an_owned_home(home, tmp_path):
    _terminal_binds_its_answer(home, tmp_path)
    report = _cli(home, "audit", "verify", "--json")
    assert report.returncode == 0, report.stderr


def test_pending_decide_binds_the_answer_to_the_digest_a_person_saw_on_a_served_home(home, tmp_path):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        decision, second = _terminal_binds_its_answer(home, tmp_path)
        [task] = owner.get("/tasks").json()
        _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")
        answers = _entries(owner, task["run_id"], "answer")
        refused = _entries(owner, task["run_id"], "answer_refused")
    assert [a["digest"] for a in answers][0] == decision["digest"] and len(answers) == 2
    assert [a.get("expires_at") for a in answers] == [decision["expires_at"], second["expires_at"]]
    assert [r["code"] for r in refused] == ["STALE_APPROVAL"] * 3


# --- a refused plan answer is journaled -------------------------------------------------------------


def _refusals(owner: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    keys = ("task_id", "session_id", "plan", "answer", "by", "by_role", "auth", "code", "digest", "given_digest")
    return [{k: r[k] for k in keys if k in r} for r in _entries(owner, run_id, "answer_refused")]


def test_a_refused_answer_to_a_task_plan_is_journaled_with_who_and_why(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        ann = _person(owner, "ann", "approver")
        assert owner.post("/agents", json={"manifest": PLANNED}).status_code == 201
        tasks = [owner.post("/tasks", json={"agent": "clerk", "goal": f"Write {i}", "approve_plan": True,
                                            "grants": ["write"]}).json() for i in range(2)]
        first, second = [_until(lambda t=t: owner.get(f"/tasks/{t['id']}").json(),
                                lambda x: x["awaiting_plan_approval"]) for t in tasks]
        with _client(srv.url, ann) as approver:
            for path, body in (("approve", {"digest": second["plan_digest"]}), ("approve", {"digest": "sha256:x"})):
                stale = approver.post(f"/tasks/{first['id']}/plan/{path}", json=body)
                assert stale.status_code == 409 and stale.json()["code"] == "STALE_APPROVAL"
            assert approver.post(f"/tasks/{first['id']}/plan/approve",
                                 json={"digest": first["plan_digest"]}).status_code == 202
            _until(lambda: owner.get(f"/tasks/{first['id']}").json(), lambda t: t["status"] == "completed")
            for path, body in (("approve", {"digest": first["plan_digest"]}), ("reject", {"reason": "late"})):
                late = approver.post(f"/tasks/{first['id']}/plan/{path}", json=body)  # its run took the answer
                assert late.status_code == 409 and late.json()["code"] == "CONFLICT", late.text
        refused = _refusals(owner, first["run_id"])
        assert _refusals(owner, second["run_id"]) == []
        every = owner.get("/audit/entries", params={"limit": 1000}).json()["entries"]
    from apollia_nb.journal.entry import KINDS

    written = {e["kind"] for e in every}
    assert {"answer_refused", "person_added", "plan"} <= written and written <= KINDS, written - KINDS
    who = {"task_id": first["id"], "plan": True, "by": "ann", "by_role": "approver", "auth": "token"}
    assert refused == [
        {**who, "answer": "approve", "code": "STALE_APPROVAL", "digest": first["plan_digest"],
         "given_digest": second["plan_digest"]},
        {**who, "answer": "approve", "code": "STALE_APPROVAL", "digest": first["plan_digest"],
         "given_digest": "sha256:x"},
        {**who, "answer": "approve", "code": "CONFLICT", "digest": None, "given_digest": first["plan_digest"]},
        {**who, "answer": "reject", "code": "CONFLICT", "digest": None}]


@pytest.mark.anyio
async def test_a_second_answer_to_a_plan_not_yet_taken_up_is_refused_and_journaled(home):
    from apollia_nb.errors import Conflict, StaleApproval
    from apollia_nb.runtime import Runtime

    async with Runtime(home) as rt:
        await rt.register_agent(PLANNED)
        handle = await rt.submit("clerk", "Write", approve_plan=True, grants=["write"], watched=False)
        await handle.settled()
        shown = handle.to_dict()["plan_digest"]
        with pytest.raises(StaleApproval):
            rt.approve_plan(handle.id, digest="sha256:" + "0" * 64, by="ops")
        rt.reject_plan(handle.id, "not this", by="ops")  # answered; the run has not taken it up yet
        with pytest.raises(Conflict):
            rt.approve_plan(handle.id, digest=shown, by="bob")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REJECTED"
        refused = [json.loads(e.payload) if isinstance(e.payload, (str, bytes)) else dict(e.payload)
                   for e in rt.journal.entries(run_id=handle.run_id, kinds=["answer_refused"])]
    assert [(r["answer"], r["by"], r["code"], r["digest"], r.get("given_digest")) for r in refused] == [
        ("approve", "ops", "STALE_APPROVAL", shown, "sha256:" + "0" * 64),
        ("approve", "bob", "CONFLICT", shown, shown)]


def test_a_session_plan_approval_is_bound_to_the_plan_shown_and_a_refused_one_is_journaled(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        ann = _person(owner, "ann", "approver")
        assert owner.post("/agents", json={"manifest": manifest(
            planner=[{"steps": ["look", "report"]}], actor=[{"text": "Reported."}])}).status_code == 201
        session = owner.post("/sessions", json={"agent": "clerk", "plan_mode": True}).json()
        assert session["plan_digest"] is None
        with owner.stream("POST", f"/sessions/{session['id']}/messages", json={"text": "Report"}) as resp:
            list(resp.iter_lines())
        with _client(srv.url, ann) as approver:
            shown = approver.get(f"/sessions/{session['id']}").json()
            assert shown["pending_plan"] == ["look", "report"] and shown["plan_digest"].startswith("sha256:")
            stale = approver.post(f"/sessions/{session['id']}/plan/approve", json={"digest": "sha256:" + "1" * 64})
            assert stale.status_code == 409 and stale.json()["code"] == "STALE_APPROVAL"
            assert approver.get(f"/sessions/{session['id']}").json()["pending_plan"] == ["look", "report"]
            ok = approver.post(f"/sessions/{session['id']}/plan/approve", json={"digest": shown["plan_digest"]})
            assert ok.status_code == 202, ok.text
            again = approver.post(f"/sessions/{session['id']}/plan/reject", json={"reason": "no"})
            assert again.status_code == 409 and again.json()["code"] == "CONFLICT"
        refused = _refusals(owner, session["run_id"])
        [approved] = [p for p in _entries(owner, session["run_id"], "plan") if p.get("approved")]
    who = {"session_id": session["id"], "plan": True, "by": "ann", "by_role": "approver", "auth": "token"}
    assert refused == [
        {**who, "answer": "approve", "code": "STALE_APPROVAL", "digest": shown["plan_digest"],
         "given_digest": "sha256:" + "1" * 64},
        {**who, "answer": "reject", "code": "CONFLICT", "digest": None}]
    assert approved["digest"] == shown["plan_digest"] and approved["by"] == "ann"


# --- another agent's hook: an answer approves its one call, once, while it holds -------------------------


def _hook_input(project: Any, use_id: str, path: str = "notes.txt") -> dict[str, Any]:
    """Claude Code's PreToolUse input for a Write in ``project`` (its hooks reference)."""
    return {"session_id": "sess-1", "transcript_path": "/tmp/t.jsonl", "cwd": str(project),
            "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "Write",
            "tool_input": {"file_path": str(project / path), "content": "hi"}, "tool_use_id": use_id}


async def _hook_answered(rt: Any, data: dict[str, Any], answer: Any) -> tuple[dict[str, Any], Any]:
    """Send ``data`` to the gate as the server does, answer the card it opens with ``answer(card)`` as soon
    as it shows (before the hook takes the answer up), and return the tool's answer and the card."""
    import anyio

    from apollia_nb.hooks.gate import answer_hook

    shown = anyio.Event()
    cards: list[Any] = []

    def listener(kind: str, obj: Any) -> None:
        if kind == "card":
            cards.append(obj)
            shown.set()

    unsubscribe = rt.subscribe(listener)
    got: dict[str, Any] = {}

    async def ask() -> None:
        got["reply"] = await answer_hook(rt, "claude-code", data, served=True)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await shown.wait()
            answer(cards[0])  # nothing awaited between this and the hook waking: it finds the answer as left
    finally:
        unsubscribe()
    return got["reply"].body, cards[0]


def _payloads(rt: Any, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [json.loads(e.payload) if isinstance(e.payload, (str, bytes)) else dict(e.payload)
            for e in rt.journal.entries(run_id=run_id, kinds=[kind])]


@pytest.mark.anyio
@pytest.mark.parametrize("later, allowed", [(59.0, True), (60.0, False), (7200.0, False)])
async def test_a_hook_answer_that_has_ended_when_the_hook_takes_it_denies_the_call_and_is_journaled(
        home, tmp_path, later, allowed):
    from apollia_nb.hooks.gate import run_id_of
    from apollia_nb.runtime import Runtime

    project = tmp_path / "proj"
    project.mkdir()
    clock = Clock()
    async with Runtime(home, clock=clock) as rt:
        def answer(card: Any) -> None:
            card.answer("once", by="ops", expires_in=60)
            clock.now += later

        body, card = await _hook_answered(rt, _hook_input(project, "toolu_e1"), answer)
        run_id = run_id_of("claude-code", "sess-1")
        voids = _payloads(rt, run_id, "approval_refused")
        results = _payloads(rt, run_id, "tool_result")
    spec = body["hookSpecificOutput"]
    if allowed:
        assert spec["permissionDecision"] == "allow" and voids == [] and results == [] and card.used
        return
    assert spec["permissionDecision"] == "deny" and "expired" in spec["permissionDecisionReason"]
    assert [(v["why"], v["call_id"], v["decision_id"], v["answered_by"], v["expires_at"], v["digest"],
             v["source"], v["source_tool"]) for v in voids] == [
        ("expired", "toolu_e1", card.id, "ops", "2030-03-17T17:47:40Z", card.digest, "claude-code", "Write")]
    assert [(r["call_id"], r["status"]) for r in results] == [("toolu_e1", "refused")]


@pytest.mark.anyio
async def test_a_hook_answer_approves_its_one_call_once(home, tmp_path):
    from apollia_nb.errors import StaleApproval
    from apollia_nb.hooks.codecs import parse
    from apollia_nb.hooks.gate import _taken, run_id_of
    from apollia_nb.hooks.mapping import Mapped
    from apollia_nb.runtime import Runtime

    project = tmp_path / "proj"
    project.mkdir()
    async with Runtime(home) as rt:
        first_body, first = await _hook_answered(rt, _hook_input(project, "toolu_o1"),
                                                 lambda card: card.answer("once", by="ops", digest=card.digest))
        assert first_body["hookSpecificOutput"]["permissionDecision"] == "allow" and first.used

        # The same call sent again (a retried request), and another call with the same input: each is
        # asked about again with a card of its own; the first approval, named by its digest, answers neither.
        stale: list[str] = []

        def replay(card: Any) -> None:
            assert card.id != first.id and card.digest != first.digest
            try:
                card.answer("once", by="ops", digest=first.digest)
            except StaleApproval as exc:
                stale.append(exc.code)
            card.answer("refuse", by="ops")

        for use_id in ("toolu_o1", "toolu_o2"):
            body, _ = await _hook_answered(rt, _hook_input(project, use_id), replay)
            assert body["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert stale == ["STALE_APPROVAL", "STALE_APPROVAL"]

        # An approval taken once is not taken again: a second taker of the same card is refused, journaled.
        event = parse("claude-code", _hook_input(project, "toolu_o1"))
        void = _taken(rt, first, event, Mapped(tool="write_file", family="write", arguments={}, native="Write"))
        assert void is not None and void[0][0] == "approval_refused" and void[0][1]["why"] == "used"
        run_id = run_id_of("claude-code", "sess-1")
        refused = _payloads(rt, run_id, "answer_refused")
        answers = _payloads(rt, run_id, "answer")
    assert [r["code"] for r in refused] == ["STALE_APPROVAL", "STALE_APPROVAL"]
    assert [(a["call_id"], a["answer"]) for a in answers] == [
        ("toolu_o1", "once"), ("toolu_o1", "refuse"), ("toolu_o2", "refuse")]
