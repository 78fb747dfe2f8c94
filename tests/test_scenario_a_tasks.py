"""Scenario A: an orchestrated task with verification — one test per paragraph of the seed."""

from __future__ import annotations

import json

import duckdb
import pytest

from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio


def journal_kinds(rt, run_id):
    return [e.kind for e in rt.journal.entries(run_id=run_id)]


def payloads(rt, run_id, kind):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == kind]


async def test_task_plans_acts_and_the_critic_passes(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(
            planner=[{"steps": ["Read the note", "Summarise it"]}],
            actor=[{"tool_calls": [call("read_file", path="note.txt")]}, {"text": "Read it."},
                   {"text": "Summary: fine."}],
            critic=[{"verdict": "pass"}],
        ))
        (rt.agent("clerk").workspace / "note.txt").write_text("all fine")
        task = await (await rt.submit("clerk", "Summarise the note"))
        assert task.status == "completed", task.error
        assert task.result == "Summary: fine."
        assert [s["status"] for s in task.to_dict()["steps"]] == ["done", "done"]
        kinds = journal_kinds(rt, task.run_id)
        assert kinds[0] == "run_open" and kinds[-1] == "run_seal"
        assert "verdict" in kinds and kinds.count("model_response") == 5  # planner, 3 actor, critic
        assert payloads(rt, task.run_id, "tool_result")[0]["output"] == "all fine"


async def test_failing_verdict_replans_within_the_same_ceiling(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(
            planner=[{"steps": ["first try"]}, {"steps": ["second try"]}],
            actor=[{"text": "tried once"}, {"text": "tried twice"}],
            critic=[{"verdict": "fail", "reasons": ["not tidy"]}, {"verdict": "pass"}],
            max_steps=6,
        ))
        task = await (await rt.submit("clerk", "Tidy up"))
        assert task.status == "completed"
        # planner + actor + critic, twice: one ceiling counts them all.
        assert task.to_dict()["budget"] == {"used": 6, "ceiling": 6}
        plans = [p["steps"] for p in payloads(rt, task.run_id, "plan") if "steps" in p]
        assert plans == [["first try"], ["second try"]]


async def test_the_ceiling_stops_the_agent_inside_the_actor_loop(home):
    calls = [{"tool_calls": [call("list_dir", path=".")]} for _ in range(50)]
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=calls, max_steps=7))
        task = await (await rt.submit("clerk", "Loop forever"))
        assert task.status == "failed"
        assert task.error["code"] == "BUDGET_EXCEEDED"
        assert task.to_dict()["budget"]["used"] == 7
        seal = payloads(rt, task.run_id, "run_seal")[0]
        assert seal["status"] == "failed" and seal["error"]["code"] == "BUDGET_EXCEEDED"


async def test_the_critic_is_a_model_judgement_and_no_shell_check_runs(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(critic=[{"verdict": "pass"}]))
        task = await (await rt.submit("clerk", "Say hello"))
        assert task.status == "completed"
        tools = [p["tool"] for p in payloads(rt, task.run_id, "tool_call")]
        assert tools == []  # the default actor says "Done."; the critic used no tool
        verdict = payloads(rt, task.run_id, "verdict")[0]
        assert verdict["verdict"] == "pass"


async def test_a_tool_that_only_reads_runs_without_asking(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}]))
        task = await (await rt.submit("clerk", "Look around"))
        assert task.status == "completed"
        decision = payloads(rt, task.run_id, "decision")[0]
        assert (decision["outcome"], decision["line"]) == ("allow", 3)


async def test_a_sensitive_call_asks_with_once_always_refuse_and_runs_on_once(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="hi")]}]))
        handle = await rt.submit("clerk", "Write a file")
        await handle.settled()
        assert handle.status == "waiting"
        [card] = handle.pending
        assert card.answers == ("once", "always", "refuse") and card.line == 6
        assert not (rt.agent("clerk").workspace / "a.txt").exists()
        card.answer("once")
        task = await handle
        assert task.status == "completed"
        assert (rt.agent("clerk").workspace / "a.txt").read_text() == "hi"
        answer = payloads(rt, task.run_id, "answer")[0]
        assert answer["answer"] == "once" and answer["answered_by"] == "user"


async def test_always_records_a_standing_consent_for_the_family_and_it_covers_the_next_task(home):
    write = {"tool_calls": [call("write_file", path="a.txt", content="hi")]}
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[write, {"text": "ok"}, write]))
        first = await rt.submit("clerk", "Write once")
        await first.settled()
        first.pending[0].answer("always")
        assert (await first).status == "completed"
        consents = [(c.agent, str(c.family)) for c in rt.governance.consents()]
        assert ("clerk", "write") in consents
        second = await (await rt.submit("clerk", "Write again"))
        assert second.status == "completed"
        assert payloads(rt, second.run_id, "decision")[0]["line"] == 5


async def test_a_refused_call_fails_its_step_and_the_tool_never_runs(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [
            call("write_file", path="a.txt", content="hi"), call("list_dir", path=".")]}]))
        handle = await rt.submit("clerk", "Write a file")
        await handle.settled()
        handle.pending[0].answer("refuse")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert not (rt.agent("clerk").workspace / "a.txt").exists()
        assert payloads(rt, task.run_id, "tool_call") == []
        results = payloads(rt, task.run_id, "tool_result")
        assert [r["status"] for r in results] == ["refused", "skipped"]


async def test_a_deny_rule_refuses_before_any_consent(home):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [
            call("write_file", path="secrets/key", content="x")]}]))
        task = await (await rt.submit("clerk", "Leak"))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        decision = payloads(rt, task.run_id, "decision")[0]
        assert (decision["outcome"], decision["line"]) == ("refuse", 2)


async def test_waiting_for_a_person_consumes_no_budget(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write")
        await handle.settled()
        used = handle.to_dict()["budget"]["used"]
        for _ in range(20):  # the engine is parked on a plain await; nothing advances
            import anyio

            await anyio.sleep(0)
        assert handle.to_dict()["budget"]["used"] == used
        handle.pending[0].answer("once")
        await handle


async def test_unreadable_governance_refuses_every_sensitive_call_and_reading_continues(home):
    home.governance_db.write_bytes(b"this is not a database" * 100)
    before = home.governance_db.read_bytes()
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}, {"text": "seen"},
                                                {"tool_calls": [call("write_file", path="a", content="b")]}],
                                         planner=[{"steps": ["look", "write"]}]))
        task = await (await rt.submit("clerk", "Look then write"))
        decisions = payloads(rt, task.run_id, "decision")
        assert [(d["outcome"], d["line"]) for d in decisions] == [("allow", 3), ("refuse", 0)]
        assert task.status == "failed" and task.error["code"] == "REFUSED"
    assert home.governance_db.read_bytes() == before


async def test_plan_rejection_fails_the_task_with_rejected_and_the_reason(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(planner=[{"steps": ["delete everything"]}]))
        handle = await rt.submit("clerk", "Clean up", approve_plan=True)
        await handle.settled()
        assert handle.awaiting_plan_approval
        turns_before = rt._runs[handle.id].model.remaining("actor")
        handle.reject_plan("too risky")
        task = await handle
        assert task.status == "failed"
        assert task.error == {"code": "REJECTED", "message": "the plan was rejected: too risky"}
        assert rt._runs[handle.id].model.remaining("actor") == turns_before  # the agent was not called again
        assert payloads(rt, task.run_id, "model_response")[-1]["role"] == "planner"


async def test_plan_approval_with_edited_steps_runs_the_edited_plan(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(planner=[{"steps": ["a", "b"]}]))
        handle = await rt.submit("clerk", "Do it", approve_plan=True)
        await handle.settled()
        handle.approve_plan(["only c"])
        task = await handle
        assert task.status == "completed"
        assert [s["description"] for s in task.to_dict()["steps"]] == ["only c"]


async def test_a_task_waits_indefinitely_by_default(home):
    async with Runtime(home, clock=lambda: 10_000_000.0) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        assert rt.expire_overdue() == []  # no [hitl] timeout_hours: nothing expires
        assert handle.status == "waiting"


async def test_hitl_timeout_refuses_an_overdue_decision(home):
    home.config_path.write_text("[hitl]\ntimeout_hours = 1\nscan_interval_secs = 3600\n")
    now = [1_000_000.0]
    async with Runtime(home, clock=lambda: now[0]) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        now[0] += 1800
        assert rt.expire_overdue() == []
        now[0] += 1801
        assert len(rt.expire_overdue()) == 1
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"


async def test_every_tool_call_lands_in_the_sql_views(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("list_dir", path=".")]}]))
        task = await (await rt.submit("clerk", "Look"))
    con = duckdb.connect(str(home.journal_db), read_only=True)
    rows = con.execute("SELECT tool, status FROM tool_calls WHERE run_id = ?", [task.run_id]).fetchall()
    assert rows == [("list_dir", "ok")]
    runs = con.execute("SELECT status, entries FROM runs WHERE run_id = ?", [task.run_id]).fetchall()
    assert runs[0][0] == "completed" and runs[0][1] > 5


@pytest.mark.parametrize("watched", [True, False])
async def test_cancelling_a_waiting_task_closes_its_card_and_seals_the_run(home, watched):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=watched)
        await handle.settled()
        assert handle.status == "waiting"
        await rt.cancel(handle.id)
        assert handle.status == "cancelled"
        assert rt.pending_decisions() == [] and handle.pending == []
        kinds = [e.kind for e in rt.journal.entries(run_id=handle.run_id)]
        assert kinds[-1] == "run_seal" and kinds.count("run_seal") == 1
        assert rt.replay(handle.run_id).verdict == "identical"
        with pytest.raises(Exception) as err:
            await rt.cancel(handle.id)
        assert getattr(err.value, "code", "") == "CONFLICT"
