"""Batches on one machine: 200 items over a DataFrame, waiting items answered by code and over REST,
results that match the items, a journal that verifies; bad input refused with nothing recorded."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from batch_helpers import AGENT, GOAL, expected_result, item_frame, item_model
from served_helpers import serve_on_loop

from apollia_nb.errors import (
    AgentUnavailable,
    BadInput,
    InvalidTransition,
    UnknownBatch,
)
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.batch import BATCH, counts, item_status, room, settle

pytestmark = pytest.mark.anyio
TOKEN = "batch-token"


async def _serve(rt, task_status=anyio.TASK_STATUS_IGNORED):
    """The REST API over ``rt`` on 127.0.0.1 (a real uvicorn on this loop); started with its URL."""
    from apollia_nb.api.app import create_app

    await serve_on_loop(create_app(rt, token=TOKEN), task_status, path="/api/v1")


async def test_200_items_at_concurrency_8_complete_with_waiting_items_answered_by_code_and_over_rest(home):
    frame = item_frame(200)  # every 20th item writes a file: 10 items wait on write_file
    async with Runtime(home) as rt:
        await rt.register_agent(AGENT, model=item_model())
        most = [0]

        def watch(kind, obj):
            if kind == "batch" and not answered:
                most[0] = max(most[0], obj.active())

        answered: list[str] = []
        rt.subscribe(watch)
        batch = await rt.batch("summariser", frame, goal=GOAL, concurrency=8)
        with anyio.fail_after(60):
            while batch.counts()["waiting"] + batch.counts()["completed"] < 200:  # the ten wait, the rest finish
                await anyio.sleep(0.02)
        c = batch.counts()
        assert c == {"pending": 0, "running": 0, "waiting": 10, "completed": 190, "failed": 0, "cancelled": 0}
        assert batch.status == "running" and 0 < most[0] <= 8
        [group] = batch.pending_groups()  # one question, each item's own file listed in it
        assert (group["tool"], group["family"], len(group["cards"])) == ("write_file", "write", 10)
        assert len({c["arguments"]["path"] for c in group["calls"]}) == 10
        cards = sorted(group["cards"], key=lambda c: c.created_at)
        for card in cards[:3]:  # three by code
            rt.answer(card.id, "once", by="code")
            answered.append(card.id)
        async with anyio.create_task_group() as tg:
            url, server = await tg.start(_serve, rt)
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
                listed = (await api.get("/pending-decisions")).json()
                assert sorted(p["id"] for p in listed) == sorted(c.id for c in cards[3:])
                for card in cards[3:5]:  # two over REST
                    r = await api.post("/pending-decisions/decide",
                                       json={"id": card.id, "answer": "once", "by": "alice@rest"})
                    assert r.status_code == 200, r.text
                    answered.append(card.id)
            server.should_exit = True
        # the rest as one group, as shown: `always` for the first, `once` for the others
        [group] = batch.pending_groups()
        rest = batch.answer_group(group, "always", by="lead")
        assert len(rest) == 5 and batch.pending == []
        with anyio.fail_after(60):
            done = await batch
        assert done.status == "completed"

        results = batch.results()
        assert list(results["key"]) == list(frame.index)
        assert (results["status"] == "completed").all()
        assert list(results["result"]) == [expected_result(n, t) for n, t in zip(frame["n"], frame["topic"])]
        assert results["run_id"].is_unique and results["task_id"].is_unique
        writers = results[frame["file"].to_numpy() == "yes"]
        assert (writers["steps_used"] > results[frame["file"].to_numpy() == "no"]["steps_used"].max()).all()
        for n in frame[frame["file"] == "yes"]["n"]:
            assert (home.path.parent / "work" / f"item-{n}.txt").exists()
        answers = [json.loads(e.payload) for e in rt.journal.entries() if e.kind == "answer"]
        assert sorted(a["answered_by"] for a in answers) == ["alice@rest"] * 2 + ["code"] * 3 + ["lead"] * 5
        assert [a["answer"] for a in answers if a["answered_by"] == "lead"].count("always") == 1
        assert rt.verify().ok
        assert rt.get_batch(batch.id).counts()["completed"] == 200
    async with Runtime(home) as rt:  # read back from runtime.db by a later process
        again = rt.get_batch(batch.id)
        assert again.status == "completed" and list(again.results()["result"]) == list(results["result"])
        assert [b.id for b in rt.batches()] == [batch.id]


async def test_bad_input_is_refused_with_a_stable_code_and_records_nothing(home):
    async with Runtime(home) as rt:
        await rt.register_agent(AGENT, model=item_model())
        frame = item_frame(3)
        with pytest.raises(BadInput, match="no field 'colour'"):
            await rt.batch("summariser", frame, goal="Paint {colour}")
        with pytest.raises(BadInput, match="concurrency"):
            await rt.batch("summariser", frame, goal=GOAL, concurrency=0)
        with pytest.raises(BadInput, match="iterable"):
            await rt.batch("summariser", {"n": 1}, goal=GOAL)
        with pytest.raises(BadInput, match="empty"):
            await rt.batch("summariser", [{"x": ""}], goal="{x}")
        with pytest.raises(UnknownBatch):
            rt.get_batch("batch-nope")
        await rt.stop_agent("summariser")
        with pytest.raises(AgentUnavailable):
            await rt.batch("summariser", frame, goal=GOAL)
        assert rt.records.batches() == [] and rt.records.tasks() == []


async def test_a_goal_function_and_a_key_field_and_cancelling_cancels_the_items(home):
    async with Runtime(home) as rt:
        await rt.register_agent(AGENT, model=item_model())
        items = [{"id": f"t{i}", "n": i, "topic": "alpha", "file": "yes"} for i in range(6)]
        batch = await rt.batch("summariser", items, goal=lambda item: GOAL.format(**item), key="id",
                               concurrency=2)
        with anyio.fail_after(30):  # two places, but a waiting item does not hold one: all six get to wait
            while batch.counts()["waiting"] < 6:
                await anyio.sleep(0.02)
        await batch.cancel()
        assert batch.status == "cancelled" and batch.counts()["cancelled"] == 6
        assert rt.pending_decisions() == []
        with pytest.raises(InvalidTransition):
            await batch.cancel()
        assert list(batch.results()["key"]) == [f"t{i}" for i in range(6)]


def test_the_core_is_pure_values():
    assert item_status(None, None, "running") == "pending"
    assert item_status(None, {"code": "AGENT_UNAVAILABLE"}, "running") == "failed"
    assert item_status(None, None, "cancelled") == "cancelled"
    assert item_status("waiting", None, "cancelled") == "waiting"
    tally = counts(["completed", "waiting", "completed"])
    assert tally["completed"] == 2 and tally["waiting"] == 1 and tally["running"] == 0
    assert settle("running", tally) == "running"
    assert settle("running", counts(["completed", "failed"])) == "completed"
    assert settle("cancelled", counts([])) == "cancelled"
    assert room(8, 3, 100) == 5 and room(8, 9, 100) == 0 and room(8, 0, 2) == 2
    with pytest.raises(InvalidTransition):
        settle("nonsense", tally)
    assert BATCH.table[BATCH.initial] == {"completed", "cancelled"}


async def test_items_that_cannot_start_hold_no_place_and_the_batch_still_ends(home):
    """At concurrency 1, the agent stopping while the first item runs: the two items after it cannot be
    submitted (AGENT_UNAVAILABLE); each fails at once without holding the one place, and the batch ends."""
    from apollia_nb.runtime.models.scripted import ScriptedModel

    gate = anyio.Event()

    async def actor(role, messages, tools):
        if role != "actor":
            return None
        text = " ".join(m.content for m in messages if m.content)
        if "after gate" in text:
            await gate.wait()
        return {"text": "noted"}

    async with Runtime(home) as rt:
        await rt.register_agent(AGENT, model=ScriptedModel.from_function(actor))
        batch = await rt.batch("summariser", [{"n": 0, "after": "gate"}, {"n": 1, "after": "none"},
                                              {"n": 2, "after": "none"}], goal="Note {n} after {after}",
                               concurrency=1)
        with anyio.fail_after(30):
            while batch.counts()["running"] < 1:
                await anyio.sleep(0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.stop_agent, "summariser")  # stopping at once; it drains the running item
            with anyio.fail_after(30):
                while rt.agent("summariser").state.state.value != "stopping":
                    await anyio.sleep(0.01)
            gate.set()
            with anyio.fail_after(30):
                await batch
        assert batch.status == "completed"
        assert [(r["status"], r["error_code"]) for r in batch.rows()] == [
            ("completed", None), ("failed", "AGENT_UNAVAILABLE"), ("failed", "AGENT_UNAVAILABLE")]
