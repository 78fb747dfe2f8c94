"""The Python SDK: typed results, one exception per code, event streams, sync and async, kept light."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import apollia_nb.sdk as sdk
from apollia_nb import errors as core_errors
from apollia_nb.api.server import ServerThread
from apollia_nb.sdk import AsyncClient, Client, errors
from apollia_nb.sdk.client import SSEDecoder, raise_for_error
from runtime_helpers import call, manifest

TOKEN = "sdk-token"
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="notes.txt", content="tidy")]},
                         {"text": "Filed."}])


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN) as srv:
        yield srv


@pytest.fixture
def api(server):
    with Client(server.url, TOKEN) as client:
        yield client


# --- pure parts ----------------------------------------------------------------------------------


def test_the_public_surface_is_pinned():
    assert sdk.__all__ == [
        "Client", "AsyncClient", "Event", "errors", "Agent", "Task", "Submission", "Session", "PendingDecision",
        "Rule", "Consent", "DeveloperMode", "Policy", "VerifyReport", "ReplayResult", "JournalEntry",
        "EntriesPage",
    ]


def test_the_sync_and_async_clients_offer_the_same_methods_with_the_same_signatures():
    def public(cls):
        return {n: inspect.signature(f) for n, f in vars(cls).items() if not n.startswith("_") and callable(f)}

    sync, async_ = public(Client), public(AsyncClient)
    assert set(sync) - {"close"} == set(async_) - {"aclose"}
    for name in set(sync) & set(async_):
        assert list(sync[name].parameters) == list(async_[name].parameters), name


def test_importing_the_sdk_pulls_in_neither_fastapi_nor_duckdb():
    code = ("import sys, apollia_nb.sdk; "
            "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn', 'duckdb', 'anyio', 'nacl') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_sse_decoder_reads_names_multiline_data_ids_and_skips_comments():
    decoder = SSEDecoder()
    lines = [": ping", "event: task", 'data: {"a":', 'data:  1}', "id: 7", "", "", 'data: "x"', "", "event: end",
             ""]
    events = [e for e in (decoder.feed(line) for line in lines) if e is not None]
    assert [(e.event, e.data, e.id) for e in events] == [("task", {"a": 1}, "7"), ("message", "x", "7"),
                                                         ("end", None, "7")]


def _every_error_class():
    """The error tree on the wire (other modules may subclass a class without a code of their own)."""
    out, todo = [], [core_errors.ApolliaError]
    while todo:
        cls = todo.pop()
        if cls.__module__ in (core_errors.__name__, errors.__name__):
            out.append(cls)
            todo.extend(cls.__subclasses__())
    return out


def test_each_error_code_raises_its_own_class():
    classes = _every_error_class()
    codes = {cls.code for cls in classes}
    assert {"UNAUTHORIZED", "METHOD_NOT_ALLOWED", "PAYLOAD_TOO_LARGE", "UNKNOWN_TASK", "BAD_ANSWER"} <= codes
    for cls in classes:
        body = f'{{"code": "{cls.code}", "message": "why"}}'.encode()
        with pytest.raises(cls) as raised:
            raise_for_error(cls.http_status if cls.http_status >= 400 else 500, body)
        assert type(raised.value) is cls and raised.value.message == "why"
    assert issubclass(errors.PayloadTooLarge, errors.BadInput)
    with pytest.raises(errors.ApolliaError, match="HTTP 502"):
        raise_for_error(502, b"<html>bad gateway</html>")
    raise_for_error(200, b"")  # no error


def test_from_home_without_a_server_says_how_to_start_one(tmp_path):
    with pytest.raises(errors.NotFound, match="apollia-os serve"):
        Client.from_home(tmp_path / "nowhere")


# --- against a live server ---------------------------------------------------------------------------


def test_typed_results_for_agents_tasks_and_decisions(api, home):
    agent = api.register_agent(WRITER)
    assert isinstance(agent, sdk.Agent) and agent.state == "active"
    assert [a.name for a in api.agents()] == ["clerk"] and api.agent("clerk") == agent

    sub = api.submit("clerk", "File the notes")
    assert isinstance(sub, sdk.Submission) and sub.status == "pending"
    waiting = api.wait(sub.id)
    assert isinstance(waiting, sdk.Task) and waiting.status == "waiting" and not waiting.finished
    [decision] = api.pending()
    assert isinstance(decision, sdk.PendingDecision) and decision.family == "write"
    with pytest.raises(errors.BadAnswer):
        api.decide(decision.id, "maybe")
    answered = api.decide(decision.id, "once", reason="fine", by="ops")
    assert answered.status == "answered" and answered.answered_by == "ops"
    with pytest.raises(errors.Conflict):
        api.decide(decision.id, "once")
    with pytest.raises(errors.UnknownDecision):
        api.decide("pd-none", "once")
    done = api.wait(sub.id, until="finished")
    assert done.status == "completed" and done.result == "Filed." and done.budget.used == 5  # plan, turn, call, turn, critic
    assert api.task(sub.id) == done and api.tasks(status="completed") == [done]

    with pytest.raises(errors.UnknownTask):
        api.task("task-none")
    with pytest.raises(errors.UnknownAgent):
        api.submit("nobody", "x")
    api.register_agent(manifest("spare"))
    assert api.stop_agent("spare").state == "stopped"
    with pytest.raises(errors.AgentUnavailable):
        api.submit("spare", "x")
    assert api.start_agent("spare").state == "active"
    with pytest.raises(errors.ManifestInvalid):
        api.register_agent('name = "x"\nbogus = 1\n')


def test_task_events_follow_a_task_until_it_finishes(api):
    api.register_agent(WRITER)
    sub = api.submit("clerk", "File the notes", grants=["write"])  # the grant lets the write through
    events = list(api.task_events(sub.id))
    assert {e.event for e in events} == {"task"}
    assert events[-1].data["status"] == "completed" and events[-1].data["id"] == sub.id
    assert all(e.data["status"] != "waiting" for e in events)


def test_plans_cancel_and_wait_with_a_timeout(api):
    api.register_agent(manifest(planner=[{"steps": ["a", "b"]}]))
    sub = api.submit("clerk", "Plan", approve_plan=True, max_steps=9)
    task = api.wait(sub.id)
    assert task.awaiting_plan_approval and task.plan == ["a", "b"] and task.budget.ceiling == 9
    assert api.wait(sub.id, until="finished", timeout=0.2).status == "waiting"  # timed out: as it stands
    assert api.approve_plan(sub.id, ["b"]).id == sub.id
    assert api.wait(sub.id, until="finished").plan == ["b"]

    second = api.submit("clerk", "Plan again", approve_plan=True)
    api.wait(second.id)
    api.reject_plan(second.id, "not now")
    failed = api.wait(second.id, until="finished")
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "REJECTED"

    third = api.submit("clerk", "Plan thrice", approve_plan=True)
    api.wait(third.id)
    assert api.cancel(third.id).status == "cancelled"
    with pytest.raises(errors.Conflict):
        api.cancel(third.id)


def test_sessions_stream_their_exchanges(api):
    api.register_agent(manifest(actor=[{"text": "Hello there."}, {"text": "Again."}]))
    session = api.open_session("clerk")
    assert isinstance(session, sdk.Session) and session.state == "active"
    events = list(api.send_message(session.id, "Hi"))
    assert events[-1].event == "end" and events[-1].data["reply"] == "Hello there."
    assert [e.event for e in api.session_events(session.id)] == [e.event for e in events]
    assert api.pause(session.id).state == "paused"
    assert api.inject(session.id, "more context").history[-1]["content"] == "more context"
    assert api.resume(session.id).state == "active"
    fork = api.fork(session.id)
    assert fork.forked_from == session.id and fork.history == api.session(session.id).history
    assert [s.id for s in api.sessions()] == [session.id, fork.id]
    assert api.close_session(session.id).state == "closed"
    with pytest.raises(errors.SessionClosed):
        list(api.send_message(session.id, "Hi"))
    with pytest.raises(errors.UnknownSession):
        list(api.session_events("chat-none"))

    planner = api.open_session("clerk", plan_mode=True)
    assert [e.event for e in api.send_message(planner.id, "Plan it")][-2:] == ["plan", "end"]
    api.reject_session_plan(planner.id, "no")
    assert api.session(planner.id).pending_plan is None
    assert [e.event for e in api.send_message(planner.id, "Plan again")][-1] == "end"
    approved = api.approve_session_plan(planner.id, ["do it"])
    assert approved.pending_plan is None
    assert list(api.session_events(planner.id))[-1].event == "end"


def test_governance_and_audit(api):
    rule = api.add_rule("bash_executor", "allow", prefix="git status")
    assert isinstance(rule, sdk.Rule) and rule.agent == "*" and api.rules() == [rule]
    api.remove_rule(rule.id)
    assert api.rules() == []
    with pytest.raises(errors.UnknownRule):
        api.remove_rule(rule.id)
    assert api.developer_mode().enabled is False
    assert api.set_developer_mode(True, by="ops").changed_by == "ops"
    assert api.policy().status == "none"
    assert api.consents() == []
    with pytest.raises(errors.NotFound):
        api.revoke_consent("clerk", "write")

    api.register_agent(manifest())
    sub = api.submit("clerk", "Hello")
    api.wait(sub.id)
    report = api.verify()
    assert isinstance(report, sdk.VerifyReport) and report.ok
    assert api.replay(sub.run_id).verdict == "identical"
    with pytest.raises(errors.UnknownRun):
        api.replay("run-none")
    entries = list(api.iter_entries(page=3))
    assert [e.seq for e in entries] == list(range(1, report.entries + 1))
    run = api.entries(run_id=sub.run_id, limit=1000)
    assert run.entries[0].kind == "run_open" and run.entries[-1].kind == "run_seal" and run.next_since_seq is None


def test_a_body_over_the_servers_limit_raises_payload_too_large(home):
    with ServerThread(home, token=TOKEN, max_body_bytes=2000) as srv, Client(srv.url, TOKEN) as api:
        with pytest.raises(errors.PayloadTooLarge):
            api.register_agent(manifest() + "# " + "x" * 5000 + "\n")
        assert api.agents() == []


@pytest.mark.anyio
async def test_the_async_client_drives_the_same_flow(server):
    async with AsyncClient(server.url, TOKEN) as api:
        await api.register_agent(WRITER)
        sub = await api.submit("clerk", "File the notes")
        statuses = []
        async for event in api.task_events(sub.id):
            statuses.append(event.data["status"])
            if event.data["status"] == "waiting":
                break
        [decision] = await api.pending()
        await api.decide(decision.id, "always")
        done = await api.wait(sub.id, until="finished")
        assert statuses[-1] == "waiting" and done.status == "completed"
        assert [(c.agent, c.family) for c in await api.consents()] == [("clerk", "write")]
        session = await api.open_session("clerk")  # plays the script anew: its write is consented
        events = [e.event async for e in api.send_message(session.id, "Hi")]
        assert events[-1] == "end"
        await api.revoke_consent("clerk", "write")
        assert await api.consents() == []
        assert (await api.verify()).ok
        assert len([e async for e in api.iter_entries(page=5)]) == (await api.verify()).entries
        with pytest.raises(errors.UnknownTask):
            await api.task("task-none")
    async with AsyncClient(server.url, "wrong") as intruder:
        with pytest.raises(errors.Unauthorized):
            await intruder.agents()
