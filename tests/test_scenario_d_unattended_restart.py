"""Unattended runs: suspend, list, answer, resume — across a restart."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from apollia_nb.errors import BadAnswer, Conflict, UnknownDecision
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

SCRIPT = manifest(
    actor=[
        {"tool_calls": [call("write_file", path="first.txt", content="one")]},
        {"tool_calls": [call("bash_executor", command="echo resumed")]},
        {"text": "All done."},
    ],
)


async def test_the_first_call_that_would_ask_suspends_the_run_and_lists_the_decision(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        assert handle.status == "waiting"
        [pending] = rt.pending_decisions()
        assert pending["task_id"] == handle.id and pending["tool"] == "write_file"
        assert pending["family"] == "write" and pending["answers"] == ["once", "always", "refuse"]
        assert pending["arguments"] == {"path": "a", "content": "b"}
        assert set(pending) >= {"id", "run_id", "task_id", "agent", "tool", "family", "arguments", "answers",
                                "created_at"}


async def test_answering_refuse_refuses_the_call_and_fails_its_step(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        rt.answer(rt.pending_decisions()[0]["id"], "refuse", by="ops")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert rt.pending_decisions() == []


async def test_bad_answers_and_unknown_decisions_get_stable_codes_and_change_nothing(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("bash_executor", command="ls")]}]))
        handle = await rt.submit("clerk", "List", watched=False)
        await handle.settled()
        [pending] = rt.pending_decisions()
        assert pending["answers"] == ["once", "refuse"]  # execute outside developer mode: no always
        entries = len(rt.journal.entries())
        with pytest.raises(BadAnswer):
            rt.answer(pending["id"], "always")
        with pytest.raises(BadAnswer):
            rt.answer(pending["id"], "yes please")
        with pytest.raises(UnknownDecision):
            rt.answer("pd-does-not-exist", "once")
        assert len(rt.journal.entries()) == entries
        assert rt.pending_decisions() == [pending]
        rt.answer(pending["id"], "once")
        with pytest.raises(Conflict):
            rt.answer(pending["id"], "once")
        assert (await handle).status == "completed"


def _first_process_until_waiting(home, *, then: str) -> tuple[dict, int]:
    """Another process submits SCRIPT unattended and waits until it settles, then ``then``
    (``"exit"`` cleanly or ``"kill"`` itself with SIGKILL); returns what it printed and its exit code."""
    home.path.mkdir(parents=True, exist_ok=True)
    ending = "" if then == "exit" else "os.kill(os.getpid(), signal.SIGKILL)"
    script = textwrap.dedent(
        f"""
        import anyio, json, os, signal
        from apollia_nb.runtime import Runtime
        async def main():
            async with Runtime({str(home.path)!r}) as rt:
                rt.governance.grant_consent("clerk", "write", by="setup")
                await rt.register_agent({SCRIPT!r})
                handle = await rt.submit("clerk", "Write then run", watched=False)
                await handle.settled()
                os.write(1, json.dumps({{"status": handle.status, "task": handle.id}}).encode() + b"\\n")
                {ending}
        anyio.run(main)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1]), out.returncode


async def _answer_and_finish(home, task_id: str):
    """In this (restarted) process: the task is waiting on bash_executor; answer it and see it through."""
    async with Runtime(home) as rt:
        handle = rt.task(task_id)
        assert handle.status == "waiting"
        [pending] = rt.pending_decisions()
        assert pending["tool"] == "bash_executor"
        rt.answer(pending["id"], "once", by="ops")
        task = await handle
        assert task.status == "completed", task.error
        assert task.result == "All done."
        started = [json.loads(e.payload)["tool"] for e in rt.journal.entries(run_id=task.run_id)
                   if e.kind == "tool_call"]
        assert started == ["write_file", "bash_executor"]  # write_file ran once, before the restart
        output = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id) if e.kind == "tool_result"]
        assert output[-1]["output"]["stdout"].strip() == "resumed"
        replay = rt.replay(task.run_id)
        assert replay.verdict == "identical", replay.to_dict()
        assert rt.verify().ok


async def test_a_suspended_run_survives_a_restart_and_resumes_without_rerunning_tools(home):
    state, code = _first_process_until_waiting(home, then="exit")
    assert code == 0 and state["status"] == "waiting"
    await _answer_and_finish(home, state["task"])  # the process started again


async def test_a_suspended_run_survives_a_kill_nine_the_moment_it_is_settled(home):
    """No clean close: what was recorded when the run suspended is all the next process has."""
    state, code = _first_process_until_waiting(home, then="kill")
    assert code == -9 and state["status"] == "waiting"
    assert home.journal_db.with_suffix(".log").exists()  # no clean close: the log still holds the run
    await _answer_and_finish(home, state["task"])


async def test_an_answer_given_while_the_suspension_is_being_recorded_resumes_the_run(home):
    """The run has suspended and waits for runtime.db (held here): an answer given then must resume it."""
    import threading

    import anyio

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="x")]},
                                                {"text": "Wrote it."}]))
        release = threading.Event()
        recording = anyio.Event()
        real_flush = rt.records._flush_future

        def held_flush():
            if not recording.is_set():
                rt.records._write(lambda: release.wait(10))  # the writer is busy until released
                recording.set()
            return real_flush()

        try:
            handle = await rt.submit("clerk", "Write", watched=False)
            rt.records._flush_future = held_flush  # from now on: the suspension's wait is held
            with anyio.fail_after(10):
                await recording.wait()
                [pending] = rt.pending_decisions()
                rt.answer(pending["id"], "once", by="ops")
                task = await handle
            assert task.status == "completed" and task.result == "Wrote it."
        finally:
            release.set()


async def test_a_run_cut_short_by_a_crash_is_failed_interrupted_at_the_next_boot(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
    # Simulate a record left running by a process that died.
    from apollia_nb.runtime.records import RuntimeRecords
    from apollia_nb.runtime.tasks import new_task_record

    records = RuntimeRecords(home.runtime_db)
    record = new_task_record(task_id="task-crashed", run_id="run-crashed", agent="clerk", goal="g", ceiling=5,
                             watched=True, grants=[], approve_plan=False, warnings=[], created_at="2026-01-01T00:00:00Z")
    record["status"] = "running"
    records.save_task(record, record["created_at"])
    records.close()
    async with Runtime(home) as rt:
        handle = rt.task("task-crashed")
        assert handle.status == "failed" and handle.error["code"] == "INTERRUPTED"


async def test_every_governed_action_of_a_run_lands_in_the_signed_journal_which_verifies(home):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="setup")
        await rt.register_agent(SCRIPT)
        handle = await rt.submit("clerk", "Write then run")
        await handle.settled()
        handle.pending[0].answer("once", by="auditor-test")
        task = await handle
        kinds = [e.kind for e in rt.journal.entries(run_id=task.run_id)]
        for kind in ("run_open", "model_response", "decision", "answer", "tool_call", "tool_result",
                     "verdict", "task_status", "run_seal"):
            assert kind in kinds, kind
        report = rt.verify()
        assert report.ok and report.first_bad_seq is None
        governance = [e.kind for e in rt.journal.entries() if e.run_id is None]
        assert "consent_granted" in governance
        assert rt.journal.latest_checkpoint() is not None  # written at the end of the run
    from apollia_nb.journal.verify import verify_home

    assert verify_home(home).ok  # and again offline, from the files alone


async def test_a_run_grant_allows_its_family_for_that_run_only(home):
    write = {"tool_calls": [call("write_file", path="g.txt", content="x")]}
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[write, {"text": "ok"}, write]))
        granted = await (await rt.submit("clerk", "Write", grants=["write"]))
        assert granted.status == "completed"
        decision = [json.loads(e.payload) for e in rt.journal.entries(run_id=granted.run_id) if e.kind == "decision"]
        assert (decision[0]["outcome"], decision[0]["line"]) == ("allow", 5)
        other = await rt.submit("clerk", "Write again")
        await other.settled()
        assert other.status == "waiting"  # the grant was that run's, not a consent
        other.pending[0].answer("refuse")
        await other
