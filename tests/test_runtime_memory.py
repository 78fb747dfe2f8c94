"""What a long-lived runtime keeps in memory: bounded by the work in flight, not by the work done.

A real ``Runtime`` on a fresh home runs many tasks of one scripted agent, some of
which ask and are answered; afterwards the live tables are empty, the recent
finished tasks are a bounded few, and every finished task is still readable by
id (from ``runtime.db`` once it has left memory), through the runtime and the
REST API.
"""

from __future__ import annotations

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import Conflict, UnknownTask
from apollia_nb.runtime import Runtime
from apollia_nb.runtime import runtime as runtime_module
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

TASKS = 12
KEPT = 3


def _agent(tasks: int) -> str:
    """Even tasks list the workspace; odd ones write a file (asks: the task waits, then is answered)."""
    actor = []
    for i in range(tasks):
        if i % 2:
            actor += [{"tool_calls": [call("write_file", path=f"out-{i}.txt", content="x")]}, {"text": f"wrote {i}"}]
        else:
            actor += [{"tool_calls": [call("list_dir", path=".")]}, {"text": f"listed {i}"}]
    return manifest(actor=actor, max_steps=10)


async def _run_all(rt: Runtime, tasks: int) -> list[dict]:
    """One task after the other (each takes its own turns of the script), answering what asks."""
    finished = []
    for i in range(tasks):
        handle = await rt.submit("clerk", f"Task {i}", watched=False)
        await handle.settled()
        if handle.status == "waiting":
            (card,) = handle.pending
            rt.answer(card.id, "once", by="test")
        await handle.wait()
        assert handle.status == "completed", handle.error
        finished.append(handle.to_dict())
    return finished


async def test_finished_tasks_leave_the_live_tables_and_stay_readable_by_id(home, monkeypatch):
    monkeypatch.setattr(runtime_module, "FINISHED_KEPT", KEPT)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(TASKS))
        finished = await _run_all(rt, TASKS)

        assert rt._runs == {} and rt.tasks() == []  # nothing in flight
        assert rt._cards == {}  # the answered decisions' cards went with their tasks
        assert rt._events == {}
        assert list(rt._finished) == [t["id"] for t in finished[-KEPT:]]  # the latest few, bounded
        assert rt.agent("clerk").inflight == set()

        for task in finished:  # the oldest from runtime.db, the latest from memory: the same JSON
            handle = rt.task(task["id"])
            assert handle.to_dict() == task
            assert handle.status == "completed" and handle.result == task["result"]
            assert (await handle.wait()) is handle and handle.pending == []

        oldest = finished[0]["id"]
        with pytest.raises(Conflict):
            await rt.cancel(oldest)
        with pytest.raises(Conflict):
            rt.approve_plan(oldest)
        with pytest.raises(UnknownTask):
            rt.task("task-nope")


async def test_a_handle_held_by_its_owner_reads_its_task_after_the_runtime_let_go(home, monkeypatch):
    monkeypatch.setattr(runtime_module, "FINISHED_KEPT", 1)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(4))
        first = await rt.submit("clerk", "Task 0", watched=False)
        await first.wait()
        await _run_all(rt, 1)  # a later task pushes the first out of memory
        assert first.id not in rt._finished and first.id not in rt._runs
        assert first.status == "completed" and first.to_dict()["result"] == "listed 0"
        assert first.record["status"] == "completed"


async def test_a_cancelled_suspended_task_leaves_the_agent_and_the_live_table(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        assert handle.status == "waiting" and handle.id in rt._runs
        await rt.cancel(handle.id)
        assert handle.status == "cancelled"
        assert handle.id not in rt._runs and rt._cards == {}
        assert rt.agent("clerk").inflight == set()
        assert rt.agent("clerk").to_dict()["inflight"] == 0
        assert rt.task(handle.id).to_dict() == handle.to_dict()


def test_the_rest_api_reads_a_finished_task_from_runtime_db_and_refuses_to_act_on_it(home, monkeypatch):
    monkeypatch.setattr(runtime_module, "FINISHED_KEPT", 1)
    token = "memory-token"
    with ServerThread(home, token=token) as server, httpx.Client(
            base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        assert api.post("/agents", json={"manifest": _agent(4)}).status_code == 201
        ids = []
        for i in range(3):
            sub = api.post("/tasks", json={"agent": "clerk", "goal": f"Task {i}"}).json()
            task = api.get(f"/tasks/{sub['id']}/wait", params={"timeout": 30}).json()
            if task["status"] == "waiting":
                (pending,) = api.get("/pending-decisions").json()
                assert api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"}).is_success
            done = api.get(f"/tasks/{sub['id']}/wait", params={"until": "finished", "timeout": 30}).json()
            assert done["status"] == "completed", done
            ids.append((sub["id"], done))
        for task_id, done in ids:  # the first two are out of memory now
            assert api.get(f"/tasks/{task_id}").json() == done
            assert api.get(f"/tasks/{task_id}/wait", params={"until": "finished", "timeout": 30}).json() == done
            r = api.post(f"/tasks/{task_id}/cancel")
            assert r.status_code == 409 and r.json()["code"] == "CONFLICT"
        listed = {t["id"]: t for t in api.get("/tasks").json()}
        assert all(listed[task_id] == done for task_id, done in ids)
