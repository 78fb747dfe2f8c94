"""Approvals are bound to the action: the digest of exactly what the card showed is journaled with the
answer, an answer naming another digest is refused, an approval carries out one call once and no
other, and an approval with an expiry is refused (and the refusal journaled) once it has ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadInput, Conflict, StaleApproval
from apollia_nb.governance.approvals import action_digest, plan_digest
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.governed import continue_after_answer
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

WRITE = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])
# The same call twice: a retry of a call is another call, asked about again.
TWICE = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]},
                        {"tool_calls": [call("write_file", path="a.txt", content="one")]},
                        {"text": "Done."}])


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def _entries(rt: Any, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [json.loads(e.payload) if isinstance(e.payload, (str, bytes)) else dict(e.payload)
            for e in rt.journal.entries(run_id=run_id, kinds=[kind])]


async def _waiting(rt: Any, source: str = WRITE, **kw: Any) -> tuple[Any, dict[str, Any]]:
    await rt.register_agent(source)
    handle = await rt.submit("clerk", "Write", watched=False, **kw)
    await handle.settled()
    [pending] = rt.pending_decisions()
    return handle, pending


async def test_the_answer_journals_the_digest_of_the_call_as_shown_and_an_auditor_recomputes_it(home):
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        card = rt.card(pending["id"])
        assert pending["digest"] == card.digest == card.to_dict()["digest"]
        assert pending["digest"].startswith("sha256:") and len(pending["digest"]) == 71
        rt.answer(pending["id"], "once", by="ops", digest=pending["digest"])
        assert (await handle).status == "completed"
        [decided] = _entries(rt, handle.run_id, "decision")
        [answer] = _entries(rt, handle.run_id, "answer")
        # From the journal alone: the decision entry shows what the card showed.
        assert answer["digest"] == action_digest(
            decision_id=answer["decision_id"], run_id=handle.run_id, agent="clerk", tool=decided["tool"],
            call_id=decided["call_id"], arguments=decided["arguments"]) == pending["digest"]


async def test_an_answer_naming_another_digest_is_refused_journaled_and_the_card_still_waits(home):
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        other_run = action_digest(decision_id=pending["id"], run_id="run-other", agent="clerk", tool="write_file",
                                  call_id=pending["call_id"], arguments=pending["arguments"])
        other_args = action_digest(decision_id=pending["id"], run_id=pending["run_id"], agent="clerk",
                                   tool="write_file", call_id=pending["call_id"],
                                   arguments={**pending["arguments"], "content": "two"})
        for wrong in (other_run, other_args, "sha256:" + "0" * 64, "not a digest"):
            with pytest.raises(StaleApproval) as info:
                rt.answer(pending["id"], "once", by="ops", digest=wrong)
            assert info.value.code == "STALE_APPROVAL" and pending["digest"] in info.value.message
        refused = _entries(rt, handle.run_id, "answer_refused")
        assert [r["given_digest"] for r in refused] == [other_run, other_args, "sha256:" + "0" * 64, "not a digest"]
        assert {(r["code"], r["by"], r["digest"], r["decision_id"]) for r in refused} == {
            ("STALE_APPROVAL", "ops", pending["digest"], pending["id"])}
        assert _entries(rt, handle.run_id, "answer") == [] and rt.card(pending["id"]).waiting
        assert not (home.path.parent / "work" / "a.txt").exists()
        rt.answer(pending["id"], "once", by="ops", digest=pending["digest"])
        assert (await handle).status == "completed"


async def test_an_approval_is_not_carried_over_to_a_retry_of_the_same_call(home):
    async with Runtime(home) as rt:
        handle, first = await _waiting(rt, TWICE)
        rt.answer(first["id"], "once", by="ops", digest=first["digest"])
        await handle.settled()
        [second] = rt.pending_decisions()  # the same call again: asked again, with its own digest
        assert second["id"] != first["id"] and second["arguments"] == first["arguments"]
        assert second["digest"] != first["digest"]
        with pytest.raises(StaleApproval):  # the first approval, replayed for the second call
            rt.answer(second["id"], "once", by="ops", digest=first["digest"])
        with pytest.raises(Conflict):  # a new request reusing the answered card
            rt.answer(first["id"], "once", by="ops")
        refused = _entries(rt, handle.run_id, "answer_refused")
        assert [(r["decision_id"], r["code"]) for r in refused] == [(second["id"], "STALE_APPROVAL"),
                                                                   (first["id"], "CONFLICT")]
        assert [p["id"] for p in rt.pending_decisions()] == [second["id"]]
        rt.answer(second["id"], "refuse", by="ops")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        results = _entries(rt, handle.run_id, "tool_result")
        assert [r["status"] for r in results] == ["ok", "refused"]


async def test_an_approval_carries_out_its_call_once(home):
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        card = rt.card(pending["id"])
        rt.answer(pending["id"], "once", by="ops")
        assert (await handle).status == "completed" and card.used
        again = await continue_after_answer(rt, rt.agent("clerk"), card)  # a resumed run that would reuse it
        assert again.status == "refused" and "used already" in again.error_message
        [void] = _entries(rt, handle.run_id, "approval_refused")
        assert (void["why"], void["decision_id"], void["answered_by"]) == ("used", pending["id"], "ops")
        assert [r["status"] for r in _entries(rt, handle.run_id, "tool_result")] == ["ok", "refused"]


async def test_an_approval_whose_arguments_were_swapped_for_others_is_refused(home):
    async with Runtime(home) as rt:
        handle, pending = await _waiting(rt)
        card = rt.card(pending["id"])
        card.keep_call_arguments({"path": "b.txt", "content": "other"})  # not what the card shows
        rt.answer(pending["id"], "once", by="ops")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        [void] = _entries(rt, handle.run_id, "approval_refused")
        assert void["why"] == "changed"
        assert not (home.path.parent / "work" / "b.txt").exists()


@pytest.mark.parametrize("later, status", [(59.0, "completed"), (60.0, "failed"), (3600.0, "failed")])
async def test_an_approval_with_an_expiry_is_refused_and_journaled_once_it_has_ended(home, later, status):
    clock = Clock()
    async with Runtime(home, clock=clock) as rt:
        await rt.register_agent(WRITE)
        handle = await rt.submit("clerk", "Write")  # watched: the run waits on its card
        while not handle.pending:
            await rt.events.changed(handle.id).wait()
        [card] = handle.pending
        card.answer("once", by="ops", expires_in=60)
        clock.now += later  # before the run takes the answer up
        task = await handle
        assert task.status == status
        [answer] = _entries(rt, handle.run_id, "answer")
        assert answer["expires_at"] == "2030-03-17T17:47:40Z"  # 1_900_000_000 + 60
        voids = _entries(rt, handle.run_id, "approval_refused")
        if status == "completed":
            assert voids == [] and (home.path.parent / "work" / "a.txt").read_text() == "one"
        else:
            assert [(v["why"], v["expires_at"], v["answered_by"]) for v in voids] == [
                ("expired", "2030-03-17T17:47:40Z", "ops")]
            assert task.error["code"] == "REFUSED" and "expired" in task.error["message"]
            assert not (home.path.parent / "work" / "a.txt").exists()


async def test_expiry_values_that_cannot_hold_are_bad_input_and_change_nothing(home):
    clock = Clock()
    async with Runtime(home, clock=clock) as rt:
        handle, pending = await _waiting(rt)
        before = len(rt.journal.entries())
        for terms in ({"expires_in": 0}, {"expires_in": -5}, {"expires_in": float("nan")}, {"expires_in": True},
                      {"expires_in": "60"}, {"expires_in": 10 ** 9}, {"expires_at": "2030-03-17T17:50:00"},
                      {"expires_at": "2000-01-01T00:00:00Z"}, {"expires_at": "tomorrow"},
                      {"expires_in": 60, "expires_at": "2030-03-17T18:10:00Z"}):
            with pytest.raises(BadInput):
                rt.answer(pending["id"], "once", by="ops", **terms)
        with pytest.raises(BadInput):  # a refusal does not expire
            rt.answer(pending["id"], "refuse", by="ops", expires_in=60)
        assert len(rt.journal.entries()) == before and rt.card(pending["id"]).waiting
        rt.answer(pending["id"], "once", by="ops", expires_at="2030-03-17T18:10:00+00:00")
        assert (await handle).status == "completed"
        [answer] = _entries(rt, handle.run_id, "answer")
        assert answer["expires_at"] == "2030-03-17T18:10:00Z"


def _answer_then_die(home: Any, point: str) -> str:
    """Another process submits WRITE unattended, answers it ``once`` for 60 s and is killed at ``point``
    (the answer recorded, the run not resumed); returns the task's id."""
    home.path.mkdir(parents=True, exist_ok=True)
    script = textwrap.dedent(f"""
        import anyio, sys
        from apollia_nb.runtime import Runtime

        async def main():
            async with Runtime({str(home.path)!r}) as rt:
                await rt.register_agent({WRITE!r})
                handle = await rt.submit("clerk", "Write", watched=False)
                await handle.settled()
                [pending] = rt.pending_decisions()
                print(handle.id, flush=True)
                rt.answer(pending["id"], "once", by="ops", expires_in=60)
                await handle
                print("resumed", flush=True)

        anyio.run(main)
    """)
    env = {**os.environ, "APOLLIA_FAULT": f"{point}:kill"}
    done = subprocess.run([sys.executable, "-c", script], cwd=os.getcwd(), env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    lines = done.stdout.split()
    assert len(lines) == 1, done.stdout
    return lines[0]


@pytest.mark.parametrize("later, status", [(30.0, "completed"), (120.0, "failed")])
async def test_an_approval_given_before_a_crash_keeps_its_expiry_in_the_resumed_run(home, later, status):
    task_id = _answer_then_die(home, "answer.before_resume")
    clock = Clock()
    clock.now = time.time() + later
    async with Runtime(home, clock=clock) as rt:
        handle = rt.task(task_id)
        task = await handle
        assert task.status == status
        voids = _entries(rt, handle.run_id, "approval_refused")
        assert [v["why"] for v in voids] == ([] if status == "completed" else ["expired"])
        assert (home.path.parent / "work" / "a.txt").exists() is (status == "completed")


# --- over REST ----------------------------------------------------------------------------------

OWNER = "bound-owner-" + "b" * 32
PLANNED = manifest(planner=[{"steps": ["Write the file"]}],
                   actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _until(fetch: Any, ok: Any) -> Any:
    deadline = time.monotonic() + 60
    while not ok(value := fetch()):
        assert time.monotonic() < deadline, value
        time.sleep(0.05)
    return value


def test_over_rest_a_stale_digest_is_409_and_the_digest_is_journaled_with_the_answer(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        assert owner.post("/agents", json={"manifest": TWICE}).status_code == 201
        task = owner.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
        [first] = _until(lambda: owner.get("/pending-decisions").json(), bool)
        assert first["may_answer"]["approvals_needed"] == 1 and first["may_answer"]["excluded"] == []
        ok = owner.post("/pending-decisions/decide", json={"id": first["id"], "answer": "once",
                                                            "digest": first["digest"], "expires_in": 300})
        assert ok.status_code == 200, ok.text
        [second] = _until(lambda: [p for p in owner.get("/pending-decisions").json() if p["id"] != first["id"]],
                          bool)
        stale = owner.post("/pending-decisions/decide", json={"id": second["id"], "answer": "once",
                                                               "digest": first["digest"]})
        assert stale.status_code == 409 and stale.json()["code"] == "STALE_APPROVAL"
        again = owner.post("/pending-decisions/decide", json={"id": first["id"], "answer": "once"})
        assert again.status_code == 409 and again.json()["code"] == "CONFLICT"
        bad = owner.post("/pending-decisions/decide", json={"id": second["id"], "answer": "once",
                                                             "expires_in": -1})
        assert bad.status_code in (400, 422) and bad.json()["code"] == "BAD_INPUT"
        assert owner.post("/pending-decisions/decide", json={"id": second["id"], "answer": "once",
                                                              "digest": second["digest"]}).status_code == 200
        done = _until(lambda: owner.get(f"/tasks/{task['id']}").json(), lambda t: t["status"] == "completed")
        assert done["started_by"] == "owner"
        entries = owner.get("/audit/entries", params={"run_id": task["run_id"], "limit": 1000}).json()["entries"]
    answers = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert [(a["decision_id"], a["digest"]) for a in answers] == [(first["id"], first["digest"]),
                                                                 (second["id"], second["digest"])]
    assert "expires_at" in answers[0] and "expires_at" not in answers[1]
    refused = [e["payload"] for e in entries if e["kind"] == "answer_refused"]
    assert [(r["decision_id"], r["code"], r["by_role"], r["auth"]) for r in refused] == [
        (second["id"], "STALE_APPROVAL", "admin", "owner"), (first["id"], "CONFLICT", "admin", "owner")]


def test_a_plan_approval_over_rest_names_who_approved_and_the_digest_of_the_plan(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        made = owner.post("/people", json={"name": "ann", "roles": ["approver"]})
        assert made.status_code == 201, made.text
        assert owner.post("/agents", json={"manifest": PLANNED}).status_code == 201
        tasks = [owner.post("/tasks", json={"agent": "clerk", "goal": f"Write {i}", "approve_plan": True,
                                            "grants": ["write"]}).json() for i in range(2)]
        waiting = [_until(lambda t=t: owner.get(f"/tasks/{t['id']}").json(), lambda x: x["awaiting_plan_approval"])
                   for t in tasks]
        first, second = waiting
        assert first["plan_digest"] == plan_digest(task_id=first["id"], run_id=first["run_id"], agent="clerk",
                                                   steps=["Write the file"])
        with _client(srv.url, made.json()["token"]) as ann:
            stale = ann.post(f"/tasks/{first['id']}/plan/approve", json={"digest": second["plan_digest"]})
            assert stale.status_code == 409 and stale.json()["code"] == "STALE_APPROVAL"
            assert ann.post(f"/tasks/{first['id']}/plan/approve",
                            json={"digest": first["plan_digest"]}).status_code == 202
            assert ann.post(f"/tasks/{second['id']}/plan/reject", json={"reason": "not now"}).status_code == 202
        _until(lambda: owner.get(f"/tasks/{first['id']}").json(), lambda t: t["status"] == "completed")
        plans = {}
        for t in waiting:
            entries = owner.get("/audit/entries", params={"run_id": t["run_id"], "limit": 1000}).json()["entries"]
            plans[t["id"]] = [e["payload"] for e in entries if e["kind"] == "plan" and "approved" in e["payload"]]
    [approved] = plans[first["id"]]
    assert {k: approved[k] for k in ("approved", "by", "by_role", "auth", "digest")} == {
        "approved": True, "by": "ann", "by_role": "approver", "auth": "token", "digest": first["plan_digest"]}
    [rejected] = plans[second["id"]]
    assert {k: rejected[k] for k in ("approved", "by", "by_role", "auth", "digest")} == {
        "approved": False, "by": "ann", "by_role": "approver", "auth": "token", "digest": second["plan_digest"]}


def test_the_sdk_names_the_digest_and_the_expiry_of_an_answer(home):
    from apollia_nb.sdk.client import Client

    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        assert owner.post("/agents", json={"manifest": TWICE}).status_code == 201
        task = owner.post("/tasks", json={"agent": "clerk", "goal": "Write", "watched": False}).json()
        [first] = _until(lambda: owner.get("/pending-decisions").json(), bool)
        with Client.from_home(home.path) as api:
            with pytest.raises(StaleApproval):
                api.decide(first["id"], "once", digest="sha256:" + "1" * 64)
            answered = api.decide(first["id"], "once", digest=first["digest"], expires_in=600)
            assert answered.status == "answered" and answered.digest == first["digest"]
        entries = owner.get("/audit/entries", params={"run_id": task["run_id"], "limit": 1000}).json()["entries"]
    [answer] = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert answer["digest"] == first["digest"] and answer["expires_at"].endswith("Z")


def test_a_kernel_on_a_served_home_refuses_its_call_once_the_approval_given_over_rest_has_ended(home):
    clock = Clock()
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        clock.now = time.time() + 3600  # the kernel's clock, an hour after the server's

        async def kernel() -> tuple[Any, list[dict[str, Any]]]:
            async with Runtime(home, clock=clock) as rt:  # a client of the served home
                assert rt.mode == "client"
                await rt.register_agent(WRITE)
                handle = await rt.submit("clerk", "Write")  # watched: the kernel's run waits on its card
                while not handle.pending:
                    await rt.events.changed(handle.id).wait()
                [card] = handle.pending
                import anyio

                answered = await anyio.to_thread.run_sync(lambda: owner.post(
                    "/pending-decisions/decide", json={"id": card.id, "answer": "once", "expires_in": 60}))
                assert answered.status_code == 200, answered.text
                return await handle, _entries(rt, handle.run_id, "approval_refused")

        import anyio

        task, voids = anyio.run(kernel)
    assert task.status == "failed" and "expired" in task.error["message"]
    assert [v["why"] for v in voids] == ["expired"]
    assert not (home.path.parent / "work" / "a.txt").exists()
