"""What a long-lived runtime keeps in memory: bounded by the work in flight, not by the work done.

A real ``Runtime`` on a fresh home runs many tasks of one scripted agent, some of
which ask and are answered; afterwards the live tables are empty, the recent
finished tasks are a bounded few, and every finished task is still readable by
id (from ``runtime.db`` once it has left memory), through the runtime and the
REST API.
"""

from __future__ import annotations

import json

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

        assert rt._runs == {}  # nothing in flight
        assert [h.id for h in rt.tasks()] == [t["id"] for t in finished[-KEPT:]]
        assert rt._cards == {}  # the answered decisions' cards went with their tasks
        assert rt.events.watched() == set()
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


async def test_the_journal_drops_a_runs_counters_once_it_is_sealed(home):
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(6))
        finished = await _run_all(rt, 6)
        assert rt.journal._run_counts == {} and rt.journal._run_base == {}
        for task in finished:  # the seals counted every entry before them all the same
            entries = rt.journal.entries(run_id=task["run_id"])
            assert entries[-1].kind == "run_seal"
            assert json.loads(entries[-1].payload)["entries"] == len(entries) - 1


def _setting(con, name: str = "memory_limit") -> str:
    cur = con.cursor()
    try:
        return cur.execute(f"SELECT current_setting('{name}')").fetchone()[0]
    finally:
        cur.close()


async def test_the_journal_and_runtime_db_have_a_bounded_memory_limit_and_checkpoint_often(home):
    import duckdb

    from apollia_nb.dbutil import CHECKPOINT_THRESHOLD, MEMORY_LIMIT

    scratch = duckdb.connect()
    default_threshold = _setting(scratch, "checkpoint_threshold")
    scratch.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    scratch.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    expected = (_setting(scratch), _setting(scratch, "checkpoint_threshold"))
    scratch.close()
    assert expected[1] != default_threshold  # DuckDB's own (16 MB) would hold four times as much
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(2))
        await _run_all(rt, 2)
        for con in (rt.journal._con, rt.records._con):
            assert (_setting(con), _setting(con, "checkpoint_threshold")) == expected
        assert rt.verify().ok  # a scan of the whole journal runs under the limit
        assert len(rt.records.tasks()) == 2


def _in_memory_bytes(con) -> int:
    cur = con.cursor()
    try:
        return cur.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]
    finally:
        cur.close()


def test_answered_decisions_do_not_accumulate_in_governance_db_memory(home):
    from apollia_nb.governance.store import CHECKPOINT_EVERY, GovernanceStore

    store = GovernanceStore(home)
    store.view()

    def decide(i: int) -> str:
        p = store.add_pending(run_id=f"run-{i}", task_id=f"task-{i}", agent="clerk", tool="write_file",
                              family="write", arguments={"path": "out.txt", "content": "x" * 1024},
                              answers=["once", "always", "refuse"], reason="asks", line=3, call_id="c1-1")
        store.answer_pending(p.id, "once", by="test")
        return p.id

    first = decide(0)
    assert store.keep_open() and store._keeper is not None
    for i in range(1, CHECKPOINT_EVERY):
        decide(i)
    settled = _in_memory_bytes(store._keeper)
    for i in range(CHECKPOINT_EVERY, 5 * CHECKPOINT_EVERY):  # each answer's update held ~130 KB until a checkpoint
        last = decide(i)
    grown = _in_memory_bytes(store._keeper) - settled
    assert grown < 4 * 2**20, f"governance.db holds {grown / 2**20:.1f} MiB more after {4 * CHECKPOINT_EVERY} answers"
    assert store.pending() == []
    assert [store.get_pending(d).status for d in (first, last)] == ["answered", "answered"]
    store.close()


def test_runtime_db_holds_a_bounded_few_megabytes_of_rewritten_task_rows(tmp_path):
    """Every task's row is written when submitted and rewritten when it ends: DuckDB holds the rows
    written since its last checkpoint, and the old versions of those rewritten, in memory until then.
    ``runtime.db`` checkpoints each ``CHECKPOINT_THRESHOLD`` of log, so that stays a few megabytes
    however many tasks a long-lived server has run (with DuckDB's 16 MB it reached 25 MiB here)."""
    from apollia_nb.runtime.records import RuntimeRecords

    records = RuntimeRecords(tmp_path / "runtime.db")
    try:
        highest = 0
        for i in range(3000):  # about 24 MB of rows written
            record = {"id": f"task-{i:05d}", "agent": "clerk", "status": "submitted", "goal": "g" * 4000}
            records.save_task(record, "2026-01-01T00:00:00Z", acknowledged=True).result()
            records.save_task({**record, "status": "completed"}, "2026-01-01T00:00:01Z")
            if i % 50 == 49:
                records.flush()
                highest = max(highest, _in_memory_bytes(records._con))
        assert highest < 16 * 2**20, f"runtime.db held {highest / 2**20:.1f} MiB of rewritten task rows"
        assert records.task("task-02999")["status"] == "completed"
        assert len(records.tasks()) == 3000
    finally:
        records.close()
