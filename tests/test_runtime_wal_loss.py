"""A ``runtime.db`` that lost its write-ahead log never loses an acknowledged task without a word.

Real processes killed with SIGKILL, real files: the home's ``runtime.db.wal`` is deleted after the kill,
so ``runtime.db`` opens as it was at its last checkpoint. Each task the journal records as submitted and
``runtime.db`` no longer holds is rebuilt at the next start with the status its journal gives it, its
pending decisions are closed with it, and the rebuild is journaled and told.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apollia_nb.errors import Conflict, HomeFileRolledBack, IntegrityError
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.acknowledged import REBUILT, SUBMITTED, LostTask, lost_submissions, rebuilt_record
from runtime_helpers import call, manifest
from test_acknowledged_durable import Served, cli

WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="marker.txt", content="once")]},
                         {"text": "Wrote the marker."}])
SAYER = manifest("sayer", actor=[{"text": "Said."}])


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "APOLLIA_FAULT"}


def _child(body: str, home: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """``body`` (the inside of ``async with Runtime(home) as rt``) in a Python child on the home."""
    script = "import anyio, json, os, signal\nfrom apollia_nb.runtime import Runtime\n" \
             "async def main():\n" \
             f"    async with Runtime({str(home)!r}) as rt:\n" + textwrap.indent(textwrap.dedent(body), " " * 8) + \
             "\nanyio.run(main)\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=work,
                          env=_env())


def _lose_wal(home: Path) -> None:
    wal = home / "runtime.db.wal"
    assert wal.exists()  # the kill left commits that were never checkpointed
    wal.unlink()


REGISTER = f"""
await rt.register_agent({WRITER!r})
await rt.register_agent({SAYER!r})
"""

#: Two tasks completed, two suspended on a card (unattended), then one submitted and killed before it
#: could start: every submission acknowledged (``submit`` returned).
WORK = """
ids = {"completed": [], "waiting": []}
for _ in range(2):
    handle = await rt.submit("sayer", "Say it")
    await handle
    ids["completed"].append(handle.id)
for _ in range(2):
    handle = await rt.submit("clerk", "Write the marker", watched=False)
    await handle.settled()
    assert handle.status == "waiting" and handle.pending
    ids["waiting"].append(handle.id)
handle = await rt.submit("sayer", "Say it", watched=WATCHED)
ids["queued"] = [handle.id]
os.write(1, json.dumps(ids).encode() + b"\\n")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _payloads(rt: Runtime, kind: str, run_id: str | None = None) -> list[dict]:
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id, kinds=[kind])]


@pytest.fixture
def places(tmp_path, monkeypatch) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "home", work


def _opened(home: Path) -> tuple[Runtime, list[str]]:
    rt = Runtime(home)
    warnings: list[str] = []
    rt.subscribe(lambda kind, obj: warnings.append(str(obj)) if kind == "warning" else None)
    return rt, warnings


@pytest.mark.anyio
@pytest.mark.timeout(240)
@pytest.mark.parametrize("watched", [False, True])
async def test_tasks_lost_with_the_wal_after_a_kill_are_rebuilt_with_the_status_their_journal_gives(places, watched):
    home, work = places
    assert _child(REGISTER, home, work).returncode == 0  # closed: the agents are checkpointed
    child = _child(WORK.replace("WATCHED", str(watched)), home, work)
    assert child.returncode == -signal.SIGKILL, child.stderr
    ids = json.loads(child.stdout.splitlines()[0])
    _lose_wal(home)

    rt, warnings = _opened(home)
    async with rt:
        for task_id in ids["completed"]:
            task = rt.task(task_id)
            assert (task.status, task.result, task.error) == ("completed", "Said.", None)
        for task_id in ids["waiting"]:
            task = rt.task(task_id)
            assert task.status == "failed" and task.error["code"] == "INTERRUPTED", task.error
            assert "runtime.db lost this task's record" in task.error["message"]
            answers = _payloads(rt, "answer", task.run_id)
            assert [(a["answer"], a["answered_by"]) for a in answers] == [("refuse", "restart")]
            assert rt.journal.entries(run_id=task.run_id)[-1].kind == "run_seal"
            with pytest.raises(Conflict):  # never answered into a task nobody knows
                rt.answer(answers[0]["decision_id"], "once")
        assert rt.pending_decisions() == []
        [queued_id] = ids["queued"]
        queued = await rt.task(queued_id)
        if watched:  # a watched task a restart finds unstarted fails, as after any restart
            assert queued.status == "failed" and queued.error["code"] == "INTERRUPTED", queued.error
        else:  # an unattended one was queued: it runs now
            assert (queued.status, queued.result) == ("completed", "Said.")
        assert "rebuilt from the journal" in " ".join(rt.task(queued_id).record["warnings"])
        [repair] = [p for p in _payloads(rt, "home_repaired") if p.get("action") == REBUILT]
        lost = [*ids["completed"], *ids["waiting"], queued_id]
        assert sorted(t["task_id"] for t in repair["tasks"]) == sorted(lost)
        assert {t["task_id"]: t["found"] for t in repair["tasks"]} == {
            **{t: "sealed" for t in ids["completed"]}, **{t: "opened" for t in ids["waiting"]}, queued_id: "submitted"}
        assert [w for w in warnings if "write-ahead log was lost" in w]
        assert rt.verify().ok
    assert not (work / "marker.txt").exists()

    rt, warnings = _opened(home)
    async with rt:  # started again: nothing more to rebuild, every task as it was left
        assert len([p for p in _payloads(rt, "home_repaired") if p.get("action") == REBUILT]) == 1
        assert rt.task(ids["waiting"][0]).status == "failed"
        assert rt.task(queued_id).status == queued.status
        assert not [w for w in warnings if "write-ahead log" in w]


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_tasks_of_an_agent_whose_registration_was_lost_too_end_naming_it(places):
    """The agent's row went with the log: its tasks cannot run here, and say why."""
    home, work = places
    child = _child(REGISTER + """
done = await rt.submit("sayer", "Say it")
await done
waiting = await rt.submit("clerk", "Write the marker", watched=False)
await waiting.settled()
os.write(1, json.dumps([done.id, waiting.id]).encode() + b"\\n")
os.kill(os.getpid(), signal.SIGKILL)
""", home, work)
    assert child.returncode == -signal.SIGKILL, child.stderr
    done_id, waiting_id = json.loads(child.stdout.splitlines()[0])
    _lose_wal(home)
    with pytest.raises(HomeFileRolledBack, match="2 change.s. to agent registrations"):
        await Runtime.open(home)  # the registrations were acknowledged: the start refuses to go on without them
    (home / "runtime.db.acks").unlink()  # a home from before runtime.db kept its claims: nothing tells the loss

    rt, warnings = _opened(home)
    async with rt:
        assert rt.agents() == []
        done = rt.task(done_id)
        assert (done.status, done.result) == ("completed", "Said.")
        waiting = rt.task(waiting_id)
        assert waiting.status == "failed" and waiting.error["code"] == "INTERRUPTED"
        assert "'clerk'" in waiting.error["message"] and "register the agent again" in waiting.error["message"]
        assert rt.pending_decisions() == []
        entries = rt.journal.entries(run_id=waiting.run_id)
        assert entries[-1].kind == "run_seal" and json.loads(entries[-1].payload)["status"] == "failed"
        [repair] = [p for p in _payloads(rt, "home_repaired") if p.get("action") == REBUILT]
        assert repair["agents_lost"] == ["clerk", "sayer"]
        assert [w for w in warnings if "clerk, sayer" in w]
        assert rt.verify().ok


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_a_runtime_db_that_loses_its_wal_with_nothing_lost_starts_as_usual(places):
    home, work = places
    first = _child(REGISTER + """
handle = await rt.submit("sayer", "Say it")
await handle
os.write(1, json.dumps(handle.id).encode() + b"\\n")
""", home, work)
    assert first.returncode == 0, first.stderr  # closed: everything checkpointed
    task_id = json.loads(first.stdout)
    idle = _child("os.kill(os.getpid(), signal.SIGKILL)", home, work)  # opened, killed with nothing new
    assert idle.returncode == -signal.SIGKILL
    (home / "runtime.db.wal").unlink(missing_ok=True)

    rt, warnings = _opened(home)
    async with rt:
        assert rt.task(task_id).status == "completed"
        assert sorted(a.name for a in rt.agents()) == ["clerk", "sayer"]
        assert not [p for p in _payloads(rt, "home_repaired") if p.get("action") == REBUILT]
        assert warnings == []


@pytest.mark.timeout(240)
def test_a_served_home_killed_after_post_tasks_answers_every_task_it_acknowledged_after_losing_the_wal(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    srv = Served(home, work)
    assert srv.api.post("/agents", json={"manifest": SAYER}).status_code == 201
    assert srv.stop() == 0  # the agent is checkpointed

    srv = Served(home, work)
    ids = []
    for _ in range(3):
        reply = srv.api.post("/tasks", json={"agent": "sayer", "goal": "Say it"})
        assert reply.status_code == 202, reply.text
        ids.append(reply.json()["id"])
    for task_id in ids:
        assert srv.api.get(f"/tasks/{task_id}/wait", params={"until": "finished"}).json()["status"] == "completed"
    srv.proc.kill()
    assert srv.died() == -signal.SIGKILL
    _lose_wal(home)

    again = Served(home, work)
    try:
        for task_id in ids:
            task = again.api.get(f"/tasks/{task_id}").json()
            assert (task["status"], task["result"]) == ("completed", "Said."), task
        entries = again.api.get("/audit/entries", params={"limit": 1000}).json()["entries"]
        [repair] = [e["payload"] for e in entries if e["kind"] == "home_repaired"
                    and e["payload"].get("action") == REBUILT]
        assert sorted(t["task_id"] for t in repair["tasks"]) == sorted(ids)
        assert again.api.get("/audit/verify").json()["ok"] is True
    finally:
        assert again.stop() == 0


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_tasks_dropped_on_purpose_by_a_new_runtime_db_are_not_rebuilt(places):
    """``home repair --new-runtime-db`` says the tasks are gone and refuses their decisions: the start after it
    does not bring them back."""
    home, work = places
    child = _child(REGISTER + """
handle = await rt.submit("clerk", "Write the marker", watched=False)
await handle.settled()
os.write(1, json.dumps(handle.id).encode() + b"\\n")
os.kill(os.getpid(), signal.SIGKILL)
""", home, work)
    assert child.returncode == -signal.SIGKILL, child.stderr
    task_id = json.loads(child.stdout)
    _lose_wal(home)
    (home / "runtime.db").unlink()
    repaired = cli("home", "repair", "--new-runtime-db", home=home, work=work)
    assert repaired.returncode == 0, repaired.stderr

    rt, warnings = _opened(home)
    async with rt:
        assert rt.records.task(task_id) is None
        assert not [p for p in _payloads(rt, "home_repaired") if p.get("action") == REBUILT]
        assert rt.pending_decisions() == []
        assert warnings == []


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_submission_the_journal_refuses_is_refused_and_never_runs_at_a_restart(places):
    home, work = places
    async with Runtime(home) as rt:
        await rt.register_agent(SAYER)
        rt.journal.refuse_appends(IntegrityError("the journal does not verify"))
        with pytest.raises(IntegrityError):
            await rt.submit("sayer", "Say it", watched=False, task_id="task-refused")
        record = rt.records.task("task-refused")
        assert record["status"] == "failed" and record["error"]["code"] == "INTEGRITY_FAILURE"
        assert "could not be journaled" in record["error"]["message"]
    async with Runtime(home) as rt:
        assert rt.task("task-refused").status == "failed"
        assert not _payloads(rt, "run_open")


# --- the pure parts --------------------------------------------------------------------------------

def _submitted(task_id: str, **fields) -> dict:
    return {"task_id": task_id, "run_id": f"run-{task_id}", "goal": "Say it", "watched": False, "grants": [],
            "max_steps": 5, "approve_plan": False, "warnings": [], "created_at": "2026-01-01T00:00:00Z", **fields}


def test_only_submissions_after_the_last_new_runtime_db_and_without_a_row_are_lost():
    entries = [
        (1, "home_file_created", None, None, {"file": "runtime.db"}),
        (2, SUBMITTED, None, "sayer", _submitted("a")),
        (3, "home_repaired", None, None, {"file": "runtime.db", "action": "new"}),
        (4, SUBMITTED, None, "sayer", _submitted("b")),
        (5, SUBMITTED, None, "sayer", _submitted("c")),
        (6, "home_repaired", None, None, {"file": "runtime.db", "action": REBUILT}),  # not a new file
        (7, "home_file_created", None, None, {"file": "governance.db", "id": "g"}),
        (8, SUBMITTED, None, "sayer", {"task_id": 7}),  # no task id that reads: not a task
    ]
    asked: list[list[str]] = []

    def missing(ids: list[str]) -> set[str]:
        asked.append(ids)
        return {"a", "b"} & set(ids)

    lost = lost_submissions(entries, missing)
    assert [(t.seq, t.task_id, t.run_id, t.agent) for t in lost] == [(4, "b", "run-b", "sayer")]
    assert asked == [["b", "c"]]


@pytest.mark.parametrize("change", [
    {"goal": ""}, {"goal": "   "}, {"goal": None}, {"watched": "no"}, {"max_steps": 0}, {"max_steps": True},
    {"grants": "write"}, {"created_at": None},
])
def test_a_submission_that_does_not_read_back_ends_interrupted_and_is_never_run(change):
    lost = LostTask(2, "a", "run-a", "sayer", _submitted("a", **change))
    record, why = rebuilt_record(lost, agent_known=True, opened=False, sealed=None, result=None, at="now")
    assert record["status"] == "failed" and record["error"]["code"] == "INTERRUPTED" and why


def test_a_rebuilt_record_takes_the_seal_else_runs_again_only_when_never_opened():
    lost = LostTask(2, "a", "run-a", "sayer", _submitted("a", grants=["write"], max_steps=7))
    queued, why = rebuilt_record(lost, agent_known=True, opened=False, sealed=None, result=None, at="now")
    assert (queued["status"], why, queued["grants"], queued["budget"]) == (
        "pending", None, ["write"], {"used": 0, "ceiling": 7})
    opened, why = rebuilt_record(lost, agent_known=True, opened=True, sealed=None, result=None, at="now")
    assert opened["status"] == "failed" and opened["error"]["code"] == "INTERRUPTED" and why
    sealed, why = rebuilt_record(lost, agent_known=False, opened=True, result="Said.", at="now",
                                 sealed={"status": "completed", "entries": 4})
    assert (sealed["status"], sealed["result"], sealed["error"], why) == ("completed", "Said.", None, None)
    failed, _ = rebuilt_record(lost, agent_known=True, opened=True, result=None, at="now",
                               sealed={"status": "failed", "error": {"code": "REFUSED", "message": "no"}})
    assert (failed["status"], failed["error"]["code"]) == ("failed", "REFUSED")
