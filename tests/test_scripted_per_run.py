"""A scripted agent plays its script from the beginning for every task and chat session."""

from __future__ import annotations

import json

import pytest

from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.scripted import ScriptedModel
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

LOOK = manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}, {"text": "Listed it."}])
WRITE_THEN_RUN = manifest(actor=[
    {"tool_calls": [call("write_file", path="first.txt", content="one")]},
    {"tool_calls": [call("bash_executor", command="echo resumed")]},
    {"text": "All done."},
])


def tools_called(rt, run_id: str) -> list[str]:
    return [json.loads(e.payload)["tool"] for e in rt.journal.entries(run_id=run_id) if e.kind == "tool_result"]


@pytest.mark.anyio
async def test_two_tasks_in_a_row_each_play_the_script_from_its_first_entry(home):
    async with Runtime(home) as rt:
        await rt.register_agent(LOOK)
        first = await (await rt.submit("clerk", "Look around"))
        second = await (await rt.submit("clerk", "Look around again"))
        for task in (first, second):
            assert task.status == "completed" and task.result == "Listed it."
            assert tools_called(rt, task.run_id) == ["list_dir"]


@pytest.mark.anyio
async def test_a_model_given_from_python_is_replayed_per_task_too(home):
    async with Runtime(home) as rt:
        model = ScriptedModel(actor=[{"tool_calls": [call("list_dir", path=".")]}, {"text": "Listed it."}])
        await rt.register_agent(manifest(), model=model)
        for goal in ("one", "two"):
            task = await (await rt.submit("clerk", goal))
            assert tools_called(rt, task.run_id) == ["list_dir"] and task.result == "Listed it."
        assert model.remaining("actor") == 2  # the agent's own copy is never consumed


@pytest.mark.anyio
async def test_each_chat_session_plays_the_script_and_its_turns_consume_it_in_order(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "first reply"}, {"text": "second reply"}]))
        one = rt.sessions.open("clerk")
        assert [(await one.send("a")).reply, (await one.send("b")).reply] == ["first reply", "second reply"]
        two = rt.sessions.open("clerk")
        assert (await two.send("c")).reply == "first reply"


@pytest.mark.anyio
async def test_a_run_resumed_after_a_restart_continues_and_a_new_task_starts_over(home):
    async with Runtime(home) as rt:
        await rt.register_agent(WRITE_THEN_RUN)
        handle = await rt.submit("clerk", "Write then run", watched=False)
        await handle.settled()
        assert handle.status == "waiting"
        task_id = handle.id
    async with Runtime(home) as rt:
        [pending] = rt.pending_decisions()
        assert pending["tool"] == "write_file"
        rt.answer(pending["id"], "once", by="ops")
        await rt.task(task_id).settled()
        [pending] = rt.pending_decisions()
        assert pending["tool"] == "bash_executor"  # the script went on from where it stopped
        rt.answer(pending["id"], "once", by="ops")
        resumed = await rt.task(task_id)
        assert resumed.status == "completed" and resumed.result == "All done."
        assert tools_called(rt, resumed.run_id) == ["write_file", "bash_executor"]
        fresh = await rt.submit("clerk", "Again", watched=False)
        await fresh.settled()
        assert [p["tool"] for p in rt.pending_decisions()] == ["write_file"]  # from the first entry


def test_a_notebook_cell_run_twice_makes_its_tool_call_both_times(ip):
    ip.run_cell_magic("apollia", "agent", LOOK)
    for _ in range(2):
        task = ip.run_cell_magic("apollia", "task clerk", "Look around").join(10)
        assert task.status == "completed" and task.result == "Listed it."
        assert [d["tool"] for d in task.decisions()] == ["list_dir"]
