"""A task's call that asks stores its pending decision in governance.db off the event loop: the loop
serves everything else meanwhile, the card is shown only once the decision is stored, and a store
that fails leaves the call unmade (fail closed)."""

from __future__ import annotations

import json
import threading

import anyio
import pytest

from apollia_nb.errors import GovernanceUnreadable
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])
READER = manifest("reader", actor=[{"text": "Read."}])


def _holding(rt: Runtime) -> tuple[threading.Event, threading.Event, list[int]]:
    """governance.db's first store of pending decisions held (in whatever thread makes it) until the second
    event is set; the list gets the number of decisions of each store."""
    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []
    many, one = rt.governance.add_pending_many, rt.governance.add_pending

    def hold() -> None:
        if not entered.is_set():
            entered.set()
            release.wait(5)  # where this is the event loop, nothing else runs until it gives up

    def held_many(calls):
        sizes.append(len(calls))
        hold()
        return many(calls)

    def held_one(**fields):
        sizes.append(1)
        hold()
        return one(**fields)

    rt.governance.add_pending_many = held_many  # type: ignore[method-assign]
    rt.governance.add_pending = held_one  # type: ignore[method-assign]
    return entered, release, sizes


async def test_the_loop_runs_other_tasks_while_a_pending_decision_is_stored(home, tmp_path) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        await rt.register_agent(READER)
        entered, release, _ = _holding(rt)
        writer = await rt.submit("clerk", "Write a.txt", watched=False)
        with anyio.fail_after(30):
            assert await anyio.to_thread.run_sync(entered.wait, 10)
        try:
            # The decision is being stored: another task runs to its end on the same loop meanwhile,
            # and the writer's card is not shown before its decision is stored.
            with anyio.fail_after(4):
                other = await rt.submit("reader", "Read", watched=False)
                await other.wait()
            assert other.status == "completed"
            assert rt.pending == [] and writer.status == "running"
        finally:
            release.set()
        with anyio.fail_after(30):
            await writer.settled()
        assert writer.status == "waiting"
        (card,) = rt.pending
        assert [p["id"] for p in rt.pending_decisions()] == [card.id]
        assert card.task_id == writer.id
        rt.answer(card.id, "once", by="ops")
        with anyio.fail_after(30):
            await writer.wait()
        assert writer.status == "completed"


async def test_decisions_asked_while_one_is_stored_are_stored_together_each_card_its_own(home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        entered, release, sizes = _holding(rt)
        first = await rt.submit("clerk", "Write a.txt 0", watched=False)
        with anyio.fail_after(30):
            assert await anyio.to_thread.run_sync(entered.wait, 10)
        try:
            commits = rt.governance.stats["commits"]
            others = [await rt.submit("clerk", f"Write a.txt {i}", watched=False) for i in range(1, 6)]
            with anyio.fail_after(10):  # each of the five asks while the first decision is being stored
                while len(getattr(rt, "_unstored", ())) + len(sizes) - 1 < 5:  # queued, or stored on its own
                    await anyio.sleep(0.01)
        finally:
            release.set()
        tasks = [first, *others]
        for task in tasks:
            with anyio.fail_after(30):
                await task.settled()
        assert [t.status for t in tasks] == ["waiting"] * 6
        assert sizes == [1, 5]  # the first alone, the five asked meanwhile as one group
        assert rt.governance.stats["commits"] - commits == 2
        by_task = {p["task_id"]: p for p in rt.pending_decisions()}
        assert sorted(by_task) == sorted(t.id for t in tasks)
        assert {c.task_id: c.id for c in rt.pending} == {tid: p["id"] for tid, p in by_task.items()}
        assert len({p["run_id"] for p in by_task.values()}) == 6
        for task in tasks:
            (card,) = [c for c in rt.pending if c.task_id == task.id]
            rt.answer(card.id, "once", by="ops")
        for task in tasks:
            with anyio.fail_after(30):
                await task.wait()
            assert task.status == "completed"


async def test_a_pending_decision_governance_db_does_not_store_leaves_the_call_unmade(home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)

        def refused(*calls, **fields):
            raise GovernanceUnreadable("governance.db cannot be written: held by a test")

        rt.governance.add_pending = refused  # type: ignore[method-assign]
        rt.governance.add_pending_many = refused  # type: ignore[method-assign]
        writer = await rt.submit("clerk", "Write a.txt", watched=False)
        with anyio.fail_after(30):
            await writer.wait()
        assert writer.status == "failed" and writer.error["code"] == "GOVERNANCE_UNREADABLE"
        assert rt.pending == [] and rt.pending_decisions() == []
        kinds = [e.kind for e in rt.journal.entries(run_id=writer.run_id)]
        assert "decision" in kinds and "tool_call" not in kinds and "answer" not in kinds
        assert kinds[-1] == "run_seal"
        results = [json.loads(e.payload) for e in rt.journal.entries(run_id=writer.run_id, kinds=["tool_result"])]
        assert [r["tool"] for r in results] == ["write_file"] and results[0]["status"] != "ok"
