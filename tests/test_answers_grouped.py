"""Answers given at the same time (``Runtime.answer_async``, what ``POST /pending-decisions/decide`` calls)
share one journal commit and one governance.db commit; each is still validated, journaled once and
acknowledged on its own, and a bad answer in a group costs the others nothing."""

from __future__ import annotations

import asyncio
import json

import anyio
import pytest

from apollia_nb.errors import BadAnswer, Conflict, UnknownDecision
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])


async def _waiting(rt: Runtime, n: int) -> list[tuple[object, str]]:
    """``n`` unattended tasks, each suspended on its own decision: (task, decision id)."""
    tasks = [await rt.submit("clerk", f"Write a.txt {i}", watched=False) for i in range(n)]
    for task in tasks:
        with anyio.fail_after(30):
            await task.settled()
    by_task = {p["task_id"]: p["id"] for p in rt.pending_decisions()}
    return [(task, by_task[task.id]) for task in tasks]


def _answers(rt: Runtime, task: object) -> list[dict]:
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=task.to_dict()["run_id"], kinds=["answer"])]


async def test_answers_given_while_a_group_is_recorded_share_one_commit_of_each_store(home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        waiting = await _waiting(rt, 5)
        commits, journal_commits = rt.governance.stats["commits"], rt.journal.stats["transactions"]
        answered = await asyncio.gather(*(rt.answer_async(d, "once", by="ops") for _, d in waiting))
        assert [a["status"] for a in answered] == ["answered"] * 5
        assert [a["id"] for a in answered] == [d for _, d in waiting]
        # The first answer is recorded alone; the four given while it was are one group.
        assert rt.governance.stats["commits"] - commits == 2
        assert rt.journal.stats["transactions"] - journal_commits <= 2 + 5  # each resumed run appends too
        for task, decision in waiting:
            with anyio.fail_after(30):
                await task.wait()
            assert task.status == "completed"
            assert [(a["decision_id"], a["answer"], a["answered_by"]) for a in _answers(rt, task)] == [
                (decision, "once", "ops")]


async def test_a_group_answers_each_decision_once_and_refuses_the_bad_answers_in_it_alone(home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        (first, d1), (second, d2), (third, d3) = await _waiting(rt, 3)
        blocker = rt.answer_async(d3, "refuse", by="ops")  # recorded alone; the rest queue behind it as one group
        results = await asyncio.gather(
            blocker,
            rt.answer_async(d1, "once", by="ana"),
            rt.answer_async(d1, "refuse", by="mallory"),      # the same decision again in the group
            rt.answer_async("pd-nosuchdecision", "once", by="ana"),
            rt.answer_async(d2, "sometimes", by="ana"),        # not on offer
            rt.answer_async(d2, "once", values={"x": 1}, by="ana"),  # values answer only a server's question
            rt.answer_async(d3, "once", by="ana"),             # answered by the group before
            return_exceptions=True,
        )
        ok, once, again, unknown, bad, bad_values, late = results
        assert ok["answer"] == "refuse" and once["answer"] == "once" and once["answered_by"] == "ana"
        assert isinstance(again, Conflict) and "already answered (once by ana)" in again.message
        assert isinstance(unknown, UnknownDecision)
        assert isinstance(bad, BadAnswer) and isinstance(bad_values, BadAnswer)
        assert isinstance(late, Conflict)
        assert [p["id"] for p in rt.pending_decisions()] == [d2]  # the bad answers left it waiting
        assert (await rt.answer_async(d2, "once", by="ana"))["answer"] == "once"
        for task in (first, second, third):
            with anyio.fail_after(30):
                await task.wait()
        assert (first.status, second.status, third.status) == ("completed", "completed", "failed")
        assert [a["answer"] for a in _answers(rt, first)] == ["once"]
        assert [a["answer"] for a in _answers(rt, second)] == ["once"]
        assert [a["answer"] for a in _answers(rt, third)] == ["refuse"]


async def test_a_task_cancelled_while_its_answer_is_recorded_gets_the_answer_first_and_is_cancelled(home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        [(task, decision)] = await _waiting(rt, 1)
        answering = asyncio.ensure_future(rt.answer_async(decision, "once", by="ops"))
        await asyncio.sleep(0)  # the answer is taken and being recorded off the loop
        cancelled = await rt.cancel(task.id)
        assert (await answering)["answer"] == "once"
        assert cancelled.status == "cancelled"
        assert [a["answer"] for a in _answers(rt, task)] == ["once"]  # the cancel journaled no refusal over it
