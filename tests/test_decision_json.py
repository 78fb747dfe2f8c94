"""A decision waiting for a person, or answered, is one JSON on every face: the runtime that owns the
home (a kernel, the CLI) gives exactly what ``GET /pending-decisions`` and ``POST
/pending-decisions/decide`` give on a served home — the same fields in the same order, null where
there is nothing to say (no hints, no approval end, nobody left to answer)."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.governance.approvals import local_person
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime
from apollia_nb.wire import schemas as s
from runtime_helpers import call, manifest
from test_four_eyes import TWO, _deposit, _until

WRITE = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])
OWNER = "decision-json-owner-" + "d" * 32


def _as_the_wire_gives_it(decision: dict[str, Any]) -> None:
    """The wire's own fields, in its order, with the values it would send."""
    assert list(decision) == list(s.PendingDecision.model_fields)
    wire = s.PendingDecision.model_validate(decision).model_dump(mode="json", by_alias=True)
    assert json.dumps(decision) == json.dumps(wire)


async def _waiting(rt: Runtime) -> tuple[Any, dict[str, Any]]:
    await rt.register_agent(WRITE)
    handle = await rt.submit("clerk", "Write", watched=False)
    await handle.settled()
    [pending] = rt.pending_decisions()
    return handle, pending


@pytest.mark.anyio
async def test_the_owners_waiting_and_answered_decisions_are_the_wires(home):
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        _as_the_wire_gives_it(pending)
        assert (pending["hints"], pending["expires_at"]) == (None, None)
        assert pending["may_answer"]["approvals_needed"] == 1 and pending["digest"].startswith("sha256:")
        answered = rt.answer(pending["id"], "once", by="ops", expires_in=60)
        _as_the_wire_gives_it(answered)
        assert answered["status"] == "answered" and answered["answered_by"] == "ops"
        assert answered["expires_at"].endswith("Z") and answered["may_answer"] is None
        assert answered["digest"] == pending["digest"]
        assert (await handle).status == "completed"


@pytest.mark.anyio
async def test_an_approval_short_of_the_number_needed_and_the_refusal_after_it_are_the_wires(home):
    _deposit(home, TWO)
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        first = rt.answer(pending["id"], "once", by="ops")
        _as_the_wire_gives_it(first)
        assert first["status"] == "pending" and first["may_answer"]["approved_by"] == [local_person()]
        assert first["may_answer"]["approvals_needed"] == 1
        [still] = rt.pending_decisions()
        _as_the_wire_gives_it(still)
        refused = rt.answer(pending["id"], "refuse", by="ops", reason="not now")
        _as_the_wire_gives_it(refused)
        assert (refused["status"], refused["answer"], refused["answer_reason"]) == ("answered", "refuse", "not now")
        assert (await handle).status == "failed"


def _norm(value: Any) -> str:
    text = json.dumps(value)
    text = re.sub(r"\b(task|run|pd)-[0-9a-f]{6,}\b", r"\1-<ID>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<TIME>", text)
    # the home's owner is one person: the local user where the runtime owns the home, `owner` by its token
    text = re.sub(r'"started_by": "(owner|%s)"' % re.escape(local_person()), '"started_by": "<OWNER>"', text)
    return re.sub(r"sha256:[0-9a-f]{64}", "sha256:<HASH>", text)


def test_a_served_home_lists_and_answers_with_the_text_the_owner_gives(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the agents' workspace (".")

    async def owned() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with Runtime(Home.at(tmp_path / "owned")) as rt:
            handle, _ = await _waiting(rt)
            listed = rt.pending_decisions()
            answered = rt.answer(listed[0]["id"], "once", by="ops", expires_in=60)
            await handle
            return listed, answered

    listed, answered = anyio.run(owned)
    with ServerThread(Home.at(tmp_path / "served"), token=OWNER) as srv, httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {OWNER}"}, timeout=60) as api:
        assert api.post("/agents", json={"manifest": WRITE}).status_code == 201
        assert api.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).status_code == 202
        served_list = _until(lambda: api.get("/pending-decisions").json(), bool)
        decided = api.post("/pending-decisions/decide", json={"id": served_list[0]["id"], "answer": "once",
                                                               "expires_in": 60, "by": "ops"})
        assert decided.status_code == 200, decided.text
        served_answer = decided.json()
    assert served_answer["answered_by"] == answered["answered_by"] == "ops"
    assert _norm(served_list) == _norm(listed)
    assert _norm(served_answer) == _norm(answered)
