"""Scenario B: chat with plan-mode — streaming, one message at a time, pause/inject/resume, fork, children."""

from __future__ import annotations

import json

import anyio
import pytest

from apollia_nb.errors import Conflict, SessionBusy, SessionClosed
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.scripted import ScriptedModel
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio


async def test_replies_stream_token_by_token(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "Hello there, how can I help?"}]))
        session = rt.sessions.open("clerk")
        exchange = session.send("hi")
        texts = [e["text"] async for e in exchange.stream() if e["type"] == "text"]
        assert len(texts) > 3 and "".join(texts) == "Hello there, how can I help?"
        assert (await exchange).reply == "Hello there, how can I help?"
        assert session.state == "active"
        assert [m["role"] for m in session.history] == ["user", "assistant"]


async def test_a_second_message_while_processing_is_refused_not_interleaved(home):
    gate = anyio.Event()

    async def slow(role, messages, tools):
        await gate.wait()
        return {"text": "done"}

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(slow))
        session = rt.sessions.open("clerk")
        first = session.send("one")
        await anyio.sleep(0)
        assert session.state == "processing"
        with pytest.raises(SessionBusy):
            session.send("two")
        gate.set()
        await first
        assert [m["content"] for m in session.history if m["role"] == "user"] == ["one"]


async def test_an_unanswered_card_in_a_conversation_is_refused_after_the_timeout(home):
    async with Runtime(home, chat_card_timeout=0.05) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]},
                                                {"text": "could not write"}]))
        session = rt.sessions.open("clerk")
        exchange = await session.send("write a")
        results = [e for e in exchange.events if e["type"] == "tool_result"]
        assert results[0]["status"] == "refused"
        assert not (rt.agent("clerk").workspace / "a").exists()
        entries = [json.loads(e.payload) for e in rt.journal.entries(run_id=session.r["run_id"]) if e.kind == "answer"]
        assert entries[0]["answer"] == "refuse" and entries[0]["answered_by"] == "timeout"


def test_the_chat_card_timeout_is_fixed_at_five_minutes():
    from apollia_nb.runtime.cards import CHAT_CARD_TIMEOUT_SECS

    assert CHAT_CARD_TIMEOUT_SECS == 300.0


async def test_a_card_in_a_conversation_answered_once_runs_the_tool(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]},
                                                {"text": "written"}]))
        session = rt.sessions.open("clerk")
        exchange = session.send("write a")
        async for event in exchange.stream():
            if event["type"] == "card":
                session.pending[0].answer("once")
        assert exchange.reply == "written"
        assert (rt.agent("clerk").workspace / "a").read_text() == "b"


async def test_plan_mode_proposes_a_plan_and_nothing_runs_until_approved(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(
            planner=[{"steps": ["write the file"]}],
            actor=[{"tool_calls": [call("write_file", path="plan.txt", content="x")]}, {"text": "done"}],
        ))
        rt.governance.grant_consent("clerk", "write", by="test")
        session = rt.sessions.open("clerk", plan_mode=True)
        exchange = await session.send("please write plan.txt")
        assert session.pending_plan == ["write the file"]
        assert not (rt.agent("clerk").workspace / "plan.txt").exists()
        with pytest.raises(Conflict):
            session.send("another thing")
        run = await session.approve_plan()
        assert run.reply == "done"
        assert (rt.agent("clerk").workspace / "plan.txt").read_text() == "x"


async def test_plan_mode_offers_only_read_only_tools_before_approval(home):
    seen = []

    def planner(role, messages, tools):
        seen.append((role, sorted(t.name for t in tools)))
        return {"steps": ["look"]} if role == "planner" else {"text": "ok"}

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(planner))
        session = rt.sessions.open("clerk", plan_mode=True)
        await session.send("do things")
        role, names = seen[0]
        assert role == "planner" and "submit_plan" in names
        assert "write_file" not in names and "bash_executor" not in names and "read_file" in names


async def test_plan_mode_edit_and_reject(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(planner=[{"steps": ["a"]}, {"steps": ["b"]}],
                                         actor=[{"text": "did c"}]))
        session = rt.sessions.open("clerk", plan_mode=True)
        await session.send("first")
        session.reject_plan("no")
        assert session.pending_plan is None and session.state == "active"
        await session.send("second")
        run = await session.approve_plan(["c"])
        assert run.reply == "did c"
        plans = [json.loads(e.payload) for e in rt.journal.entries(run_id=session.r["run_id"]) if e.kind == "plan"]
        assert [p.get("approved") for p in plans if "approved" in p] == [False, True]
        assert plans[-1]["steps"] == ["c"] and plans[-1]["edited"] is True


async def test_pause_stops_at_the_next_safe_point_inject_adds_a_message_resume_continues(home):
    turns = []

    def model(role, messages, tools):
        turns.append([m.content for m in messages if m.role == "user"])
        if len(turns) == 1:
            return {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
        return {"text": "finished"}

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(model))
        session = rt.sessions.open("clerk")
        exchange = session.send("start")
        session.pause()
        events = [e async for e in exchange.stream()]
        assert events[-1]["type"] == "paused" and session.state == "paused"
        session.inject("also mention the date")
        resumed = session.resume()
        assert resumed is exchange
        await exchange
        assert exchange.reply == "finished" and session.state == "active"
        assert turns[-1] == ["start", "also mention the date"]


async def test_closing_a_paused_session_ends_its_interrupted_exchange(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}, {"text": "unsaid"}]))
        session = rt.sessions.open("clerk")
        exchange = session.send("start")
        session.pause()
        assert [e async for e in exchange.stream()][-1]["type"] == "paused"
        await session.close()
        with anyio.fail_after(5):
            await exchange  # ended, not left waiting for a resume that cannot come
        assert exchange.status == "cancelled" and exchange.events[-1]["type"] == "end"
        assert session.state == "closed"


async def test_fork_copies_history_and_children_are_listed_under_their_parent(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "one"}, {"text": "two"}]))
        parent = rt.sessions.open("clerk")
        await parent.send("hello")
        fork = rt.sessions.fork(parent.id)
        assert fork.history == parent.history and fork.id != parent.id
        assert fork.r["forked_from"] == parent.id
        child = rt.sessions.spawn_child(parent.id)
        assert [c.id for c in parent.children] == [child.id]
        assert child.r["parent_id"] == parent.id


async def test_close_cancels_the_exchange_in_flight_and_closed_is_terminal_with_readable_history(home):
    gate = anyio.Event()

    async def never(role, messages, tools):
        await gate.wait()
        return {"text": "never"}

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(never))
        session = rt.sessions.open("clerk")
        exchange = session.send("hang")
        await anyio.sleep(0)
        await session.close()
        assert exchange.status == "cancelled" and session.state == "closed"
        assert session.history[0]["content"] == "hang"
        with pytest.raises(SessionClosed):
            session.send("again")
        with pytest.raises(SessionClosed):
            session.resume()
        kinds = [e.kind for e in rt.journal.entries(run_id=session.r["run_id"])]
        assert kinds[0] == "run_open" and kinds[-1] == "run_seal"


async def test_sessions_persist_and_one_left_processing_by_a_crash_is_not_reloaded_until_resumed(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "hi"}]))
        kept = rt.sessions.open("clerk")
        await kept.send("hello")
        crashed = rt.sessions.open("clerk")
        crashed.r["state"] = "processing"  # as a crash mid-exchange would leave it
        crashed._save()
        kept_id, crashed_id = kept.id, crashed.id
    async with Runtime(home) as rt:
        assert rt.sessions.get(kept_id).history[-1]["content"] == "hi"
        with pytest.raises(Conflict):
            rt.sessions.get(crashed_id)
        back = rt.sessions.resume(crashed_id)
        assert back.state == "active"
