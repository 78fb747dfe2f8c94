"""Plan-mode is a property of the session: pausing while the planner's turn is in flight, injecting and
resuming never turn it into the actor with every tool; children and forks of a plan-mode session are
plan-mode. A real Runtime, a scripted agent, a real workspace."""

from __future__ import annotations

import json

import anyio
import pytest

from apollia_nb.errors import Conflict
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.base import ModelResponse, ToolCallRequest
from apollia_nb.runtime.models.scripted import ScriptedModel
from runtime_helpers import assert_alive, manifest

pytestmark = pytest.mark.anyio

WRITE = {"name": "write_file", "arguments": {"path": "written.txt", "content": "no plan was approved"}}


def asks(*calls: dict) -> ModelResponse:
    return ModelResponse("", tuple(ToolCallRequest(f"t{i}", c["name"], c["arguments"]) for i, c in enumerate(calls)))


async def test_pause_during_the_planner_turn_then_resume_still_plans_and_runs_no_write(home):
    gate = anyio.Event()
    offered: list[tuple[str, list[str]]] = []

    async def model(role, messages, tools):
        offered.append((role, [t.name for t in tools]))
        planner_turns = sum(1 for r, _ in offered if r == "planner")
        if role == "planner" and planner_turns == 1:
            await gate.wait()  # the turn is in flight when the operator pauses
            return asks({"name": "list_dir", "arguments": {"path": "."}})
        if role == "planner" and planner_turns == 2:
            return asks(WRITE)  # the planner tries to write: not offered, and refused
        if role == "planner":
            return {"steps": ["write the file"]}
        actor_turns = sum(1 for r, _ in offered if r == "actor")
        return asks(WRITE) if actor_turns == 1 else {"text": "done"}

    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")  # a write that needs no card once allowed
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(model))
        workspace = rt.agent("clerk").workspace
        session = rt.sessions.open("clerk", plan_mode=True)
        exchange = session.send("write a file")
        await anyio.sleep(0)
        session.pause()
        gate.set()
        events = [e async for e in exchange.stream()]
        assert events[-1]["type"] == "paused", (events, offered, exchange.error)
        session.inject("and be quick")
        assert session.resume() is exchange
        with anyio.fail_after(10):
            await exchange
        assert not (workspace / "written.txt").exists()
        assert {role for role, _ in offered} == {"planner"}
        assert all("write_file" not in names for _, names in offered)
        assert session.pending_plan == ["write the file"]
        results = [json.loads(e.payload) for e in rt.journal.entries(run_id=session.r["run_id"])
                   if e.kind == "tool_result"]
        assert [(r["tool"], r["status"]) for r in results if r["tool"] == "write_file"] == [("write_file", "refused")]
        # only an approved plan lifts plan-mode, for the exchange that runs it
        with anyio.fail_after(10):
            await session.approve_plan()
        assert (workspace / "written.txt").exists()
        await assert_alive(rt)


async def test_children_and_forks_of_a_plan_mode_session_are_plan_mode(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        parent = rt.sessions.open("clerk", plan_mode=True)
        assert rt.sessions.spawn_child(parent.id).r["plan_mode"] is True
        with pytest.raises(Conflict, match="plan-mode"):
            rt.sessions.spawn_child(parent.id, plan_mode=False)
        assert rt.sessions.fork(parent.id).r["plan_mode"] is True
        plain = rt.sessions.open("clerk")
        assert rt.sessions.spawn_child(plain.id).r["plan_mode"] is False
