"""Acknowledged means durable: a process killed at each window of the answer path (fault points,
``APOLLIA_FAULT``), then started again on the same home, finishes what it acknowledged.

Real processes throughout: `apollia-os serve` over real HTTP on 127.0.0.1, a Python child with a
``Runtime``, the CLI against a home. The tool's effect is a marker file: it must be written exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from apollia_nb.faults import FaultInjected, parse
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.tasks import recovery
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
TOKEN = "durable-token"
# Deadlines for events that come (a server's death at its fault point, a run settling): they cost
# nothing when things work, and a loaded machine (2 cores, load 10 and more: a server takes 20 s to
# start there) must not turn a slow event into a failure. A test's own timeout only catches a hang.
EVENT_SECS = 240
HANG_SECS = 600
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="marker.txt", content="once")]},
                         {"text": "Wrote the marker."}])


def _env(fault: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_FAULT"}
    if fault:
        env["APOLLIA_FAULT"] = fault
    return env


class Served:
    """`apollia-os serve` on the home, as a subprocess; killed by its fault point or stopped with SIGTERM."""

    def __init__(self, home: Path, work: Path, fault: str | None = None) -> None:
        # Its stderr goes to a file nobody has to drain, read when the server did not do what was expected.
        self.fault = fault
        self.errors = home.parent / f"serve-{os.urandom(4).hex()}.stderr"
        with self.errors.open("w") as errors:
            self.proc = subprocess.Popen(
                [*APOLLIA, "serve", "--home", str(home), "--port", "0", "--token", TOKEN, "--json"],
                stdout=subprocess.PIPE, stderr=errors, text=True, env=_env(fault), cwd=work,
            )
        line = self.proc.stdout.readline()
        assert line, self.errors.read_text()
        self.api = httpx.Client(base_url=json.loads(line)["url"] + "/api/v1",
                                headers={"Authorization": f"Bearer {TOKEN}"},
                                timeout=httpx.Timeout(60, read=EVENT_SECS + 30))  # the long polls below

    def died(self) -> int:
        """The server's exit status, once it has ended; one still running after EVENT_SECS is killed and
        the test fails with what it printed (its fault point was never reached)."""
        self.api.close()
        try:
            return self.proc.wait(timeout=EVENT_SECS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the server (fault {self.fault}) did not end: {self.errors.read_text()[-3000:]}")
        finally:
            self.proc.stdout.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.died()


def cli(*args: str, home: Path, work: Path, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True,
                          timeout=EVENT_SECS, cwd=work, env=_env(fault))


@pytest.fixture
def places(tmp_path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    work.mkdir()
    return tmp_path / "home", work


def _suspended(srv: Served) -> tuple[dict, dict]:
    """Register WRITER, submit it unattended and wait until it suspends on write_file."""
    assert srv.api.post("/agents", json={"manifest": WRITER}).status_code == 201
    sub = srv.api.post("/tasks", json={"agent": "clerk", "goal": "Write the marker"}).json()
    assert wait(srv, sub["id"])["status"] == "waiting"
    [pending] = srv.api.get("/pending-decisions").json()
    return sub, pending


def wait(srv: Served, task_id: str, **params: str) -> dict:
    """``GET /tasks/{id}/wait``: the task once it settles (or ends, with ``until="finished"``)."""
    return srv.api.get(f"/tasks/{task_id}/wait", params={**params, "timeout": EVENT_SECS}).json()


def _finished_once(srv: Served, sub: dict, work: Path) -> dict:
    """The restarted server resumed the run: completed, the tool ran exactly once, nothing waits."""
    task = wait(srv, sub["id"], until="finished")
    assert task["status"] == "completed", task
    assert task["result"] == "Wrote the marker."
    assert (work / "marker.txt").read_text() == "once"
    entries = srv.api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()["entries"]
    assert [e["payload"]["tool"] for e in entries if e["kind"] == "tool_call"] == ["write_file"]
    assert [e["kind"] for e in entries].count("answer") == 1
    assert entries[-1]["kind"] == "run_seal"
    assert srv.api.get("/pending-decisions").json() == []
    assert srv.api.get("/audit/verify").json()["ok"] is True
    return task


def _verified_offline(home: Path, work: Path) -> None:
    verified = cli("audit", "verify", home=home, work=work)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr


# --- over HTTP, `apollia-os serve` killed ---------------------------------------------------------------

@pytest.mark.timeout(HANG_SECS)
@pytest.mark.parametrize("fault, acknowledged", [
    ("decide.after_commit", False),     # recorded; killed before the 200 is sent
    ("answer.after_journal", False),    # journaled; killed before governance.db was written
    ("answer.before_resume", False),    # recorded; killed before the run was resumed
    ("decide.after_response", True),    # the 200 was sent; killed before the run took a step
    ("resume.after_running", None),     # the run journaled `task_status running`, then the kill
])
def test_a_server_killed_on_the_answer_path_resumes_the_run_at_restart_and_runs_the_tool_once(
        places, fault, acknowledged):
    home, work = places
    srv = Served(home, work, fault=f"{fault}:kill")
    sub, pending = _suspended(srv)
    try:
        reply = srv.api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once", "by": "ops"})
    except httpx.TransportError:
        reply = None
    assert srv.died() == -signal.SIGKILL
    if acknowledged is True:
        assert reply is not None and reply.status_code == 200 and reply.json()["status"] == "answered"
    elif acknowledged is False:
        assert reply is None  # no answer reached the client
    assert not (work / "marker.txt").exists()  # the tool had not run

    again = Served(home, work)
    try:
        _finished_once(again, sub, work)
    finally:
        assert again.stop() == 0
    _verified_offline(home, work)


@pytest.mark.timeout(HANG_SECS)
def test_an_always_answer_cut_off_before_its_consent_was_stored_gets_the_consent_at_restart(places):
    home, work = places
    srv = Served(home, work, fault="answer.after_commit:kill")
    sub, pending = _suspended(srv)
    with pytest.raises(httpx.TransportError):
        srv.api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "always", "by": "ops"})
    assert srv.died() == -signal.SIGKILL

    again = Served(home, work)
    try:
        _finished_once(again, sub, work)
        consents = again.api.get("/governance/consents").json()
        assert [(c["agent"], c["family"]) for c in consents] == [("clerk", "write")]
    finally:
        assert again.stop() == 0


@pytest.mark.timeout(HANG_SECS)
@pytest.mark.parametrize("verdict", ["approve", "reject"])
def test_a_plan_answer_cut_off_before_the_run_took_it_is_taken_at_restart(places, verdict):
    home, work = places
    srv = Served(home, work, fault="answer.before_resume:kill")
    assert srv.api.post("/agents", json={"manifest": WRITER}).status_code == 201
    sub = srv.api.post("/tasks", json={"agent": "clerk", "goal": "Write the marker", "approve_plan": True}).json()
    assert wait(srv, sub["id"])["awaiting_plan_approval"] is True
    body = {"steps": ["write the marker"]} if verdict == "approve" else {"reason": "not today"}
    with pytest.raises(httpx.TransportError):
        srv.api.post(f"/tasks/{sub['id']}/plan/{verdict}", json=body)
    assert srv.died() == -signal.SIGKILL

    again = Served(home, work)
    try:
        task = wait(again, sub["id"])
        if verdict == "reject":
            assert task["status"] == "failed" and task["error"]["code"] == "REJECTED", task
            assert "not today" in task["error"]["message"]
        else:
            assert task["status"] == "waiting" and not task["awaiting_plan_approval"], task
            assert task["plan"] == ["write the marker"]  # the edited plan, as approved
            [pending] = again.api.get("/pending-decisions").json()
            again.api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
            _finished_once(again, sub, work)
        entries = again.api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()["entries"]
        assert len([e for e in entries if e["kind"] == "plan" and "approved" in e["payload"]]) == 1
    finally:
        assert again.stop() == 0
    _verified_offline(home, work)


@pytest.mark.timeout(HANG_SECS)
def test_a_task_recorded_before_the_202_was_sent_is_started_at_restart(places):
    home, work = places
    srv = Served(home, work, fault="submit.after_commit:kill")
    assert srv.api.post("/agents", json={"manifest": WRITER}).status_code == 201
    with pytest.raises(httpx.TransportError):
        srv.api.post("/tasks", json={"agent": "clerk", "goal": "Write the marker"})
    assert srv.died() == -signal.SIGKILL

    again = Served(home, work)
    try:
        [task] = again.api.get("/tasks").json()
        task = wait(again, task["id"])
        assert task["status"] == "waiting", task  # started at the restart, suspended on write_file as usual
        [pending] = again.api.get("/pending-decisions").json()
        assert pending["task_id"] == task["id"]
        again.api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
        _finished_once(again, {"id": task["id"], "run_id": task["run_id"]}, work)
    finally:
        assert again.stop() == 0


@pytest.mark.timeout(HANG_SECS)
def test_a_decision_opened_by_a_run_killed_before_its_suspension_was_recorded_is_closed_with_it(places):
    """Nothing can resume such a run: it fails INTERRUPTED, and its decision is not left waiting for an
    answer that would never be acted on."""
    home, work = places
    srv = Served(home, work, fault="suspend.before_record:kill")
    assert srv.api.post("/agents", json={"manifest": WRITER}).status_code == 201
    sub = srv.api.post("/tasks", json={"agent": "clerk", "goal": "Write the marker"}).json()
    assert srv.died() == -signal.SIGKILL

    again = Served(home, work)
    try:
        task = again.api.get(f"/tasks/{sub['id']}").json()
        assert task["status"] == "failed" and task["error"]["code"] == "INTERRUPTED", task
        assert again.api.get("/pending-decisions").json() == []
        entries = again.api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()["entries"]
        [answer] = [e["payload"] for e in entries if e["kind"] == "answer"]
        assert (answer["answer"], answer["answered_by"]) == ("refuse", "restart")
        assert entries[-1]["kind"] == "run_seal"
        assert not (work / "marker.txt").exists()
    finally:
        assert again.stop() == 0
    _verified_offline(home, work)


# --- card.answer() in a Python process killed -------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.timeout(HANG_SECS)
@pytest.mark.parametrize("fault", ["answer.before_resume", "resume.after_running"])
async def test_a_python_runtime_killed_after_card_answer_resumes_the_run_when_the_home_is_opened_again(
        places, fault, monkeypatch):
    home, work = places
    script = textwrap.dedent(f"""
        import anyio, json, os
        from apollia_nb.runtime import Runtime
        async def main():
            async with Runtime({str(home)!r}) as rt:
                await rt.register_agent({WRITER!r})
                handle = await rt.submit("clerk", "Write the marker", watched=False)
                await handle.settled()
                os.write(1, json.dumps({{"task": handle.id, "status": handle.status}}).encode() + b"\\n")
                [card] = handle.pending
                card.answer("once", by="ops")
                await handle
                os.write(1, b"not killed\\n")
        anyio.run(main)
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=EVENT_SECS,
                           cwd=work, env=_env(f"{fault}:kill"))
    assert child.returncode == -signal.SIGKILL, child.stderr
    state = json.loads(child.stdout.splitlines()[0])
    assert state["status"] == "waiting" and "not killed" not in child.stdout
    assert not (work / "marker.txt").exists()

    monkeypatch.chdir(work)
    async with Runtime(home) as rt:
        task = await rt.task(state["task"])
        assert task.status == "completed", task.error
        assert task.result == "Wrote the marker."
        calls = [json.loads(e.payload)["tool"] for e in rt.journal.entries(run_id=task.run_id)
                 if e.kind == "tool_call"]
        assert calls == ["write_file"]
        assert rt.pending_decisions() == []
        assert rt.verify().ok
    assert (work / "marker.txt").read_text() == "once"


@pytest.mark.anyio
@pytest.mark.timeout(HANG_SECS)
async def test_a_run_killed_after_its_seal_was_journaled_keeps_its_end_at_restart(places, monkeypatch):
    """The journal closed the run; runtime.db had not been told: the restart takes the seal's status."""
    home, work = places
    script = textwrap.dedent(f"""
        import anyio, json, os
        from apollia_nb.runtime import Runtime
        async def main():
            async with Runtime({str(home)!r}) as rt:
                await rt.register_agent({manifest(actor=[{"text": "Nothing to do."}])!r})
                handle = await rt.submit("clerk", "Say so", watched=False)
                os.write(1, json.dumps({{"task": handle.id}}).encode() + b"\\n")
                await handle
        anyio.run(main)
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=EVENT_SECS,
                           cwd=work, env=_env("run.after_seal:kill"))
    assert child.returncode == -signal.SIGKILL, child.stderr
    task_id = json.loads(child.stdout.splitlines()[0])["task"]

    monkeypatch.chdir(work)
    async with Runtime(home) as rt:
        record = rt.records.task(task_id)
        assert record["status"] == "completed", record["error"]
        assert record["result"] == "Nothing to do."
        assert rt.verify().ok


# --- `apollia-os pending decide` against a home, killed ----------------------------------------------------

@pytest.mark.anyio
@pytest.mark.timeout(HANG_SECS)
async def test_the_cli_killed_after_pending_decide_recorded_the_answer_finishes_the_run_at_the_next_command(
        places, monkeypatch):
    home, work = places
    (work / "clerk.toml").write_text(WRITER)
    assert cli("agents", "register", "clerk.toml", home=home, work=work).returncode == 0
    ran = cli("run", "clerk", "Write the marker", "--unattended", "--json", home=home, work=work)
    assert ran.returncode == 0, ran.stderr
    task = json.loads(ran.stdout)
    assert task["status"] == "waiting"
    [pending] = json.loads(cli("pending", "list", "--json", home=home, work=work).stdout)

    decided = cli("pending", "decide", pending["id"], "once", home=home, work=work,
                  fault="answer.before_resume:kill")
    assert decided.returncode == -signal.SIGKILL, decided.stderr
    assert not (work / "marker.txt").exists()

    listed = cli("agents", "list", home=home, work=work)  # any command that opens the home finishes it
    assert listed.returncode == 0, listed.stderr
    assert (work / "marker.txt").read_text() == "once"
    assert json.loads(cli("pending", "list", "--json", home=home, work=work).stdout) == []
    _verified_offline(home, work)
    monkeypatch.chdir(work)
    async with Runtime(home) as rt:
        record = rt.records.task(task["id"])  # finished in an earlier process: read from runtime.db
        assert record["status"] == "completed" and record["result"] == "Wrote the marker."
        calls = [json.loads(e.payload)["tool"] for e in rt.journal.entries(run_id=record["run_id"])
                 if e.kind == "tool_call"]
        assert calls == ["write_file"]


# --- the table a restart follows, and the fault points themselves -----------------------------------------

def _found(**kw):
    base = dict(status="waiting", unattended=True, awaiting=True, decision="pending", answered_by=None,
                opened=True, call_started=False, sealed=False)
    return {**base, **kw}


@pytest.mark.parametrize("found, action", [
    (_found(), "park"),
    (_found(decision="unreadable"), "park"),
    (_found(decision="answered", answered_by="ops"), "resume"),
    (_found(status="running", decision="answered", answered_by="ops"), "resume"),
    (_found(decision="answered", answered_by="cancel"), "cancel"),
    (_found(decision="answered", answered_by="ops", call_started=True), "interrupt"),
    (_found(decision="answered", answered_by="ops", unattended=False), "interrupt"),
    (_found(decision="unknown"), "lost"),
    (_found(awaiting=False, decision=None), "park"),
    (_found(status="running", awaiting=False, decision=None), "interrupt"),
    (_found(status="running", decision="pending"), "interrupt"),
    (_found(status="pending", awaiting=False, decision=None, opened=False), "start"),
    (_found(status="pending", awaiting=False, decision=None, opened=True), "interrupt"),
    (_found(status="pending", awaiting=False, decision=None, opened=False, unattended=False), "interrupt"),
    (_found(status="running", sealed=True), "sealed"),
    (_found(awaiting=False, decision=None, plan_answered=True), "resume"),
    (_found(awaiting=False, decision=None, plan_answered=True, unattended=False), "interrupt"),
])
def test_what_a_restart_does_with_each_unfinished_record(found, action):
    assert recovery(**found) == action


def test_fault_points_are_named_with_an_action_and_a_wrong_action_is_refused():
    assert parse("") == {}
    assert parse("a.b:kill, c.d:raise") == {"a.b": "kill", "c.d": "raise"}
    assert parse("a.b") == {"a.b": "kill"}
    with pytest.raises(ValueError, match="APOLLIA_FAULT"):
        parse("a.b:explode")


def test_an_armed_raise_point_raises_exactly_there_and_others_do_nothing():
    script = textwrap.dedent("""
        from apollia_nb import faults
        faults.point("not.armed")
        try:
            faults.point("here")
        except faults.FaultInjected as exc:
            print("raised:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=_env("here:raise"))
    assert out.stdout.strip() == "raised: fault point here", out.stderr
    assert issubclass(FaultInjected, RuntimeError)


# --- routes that change runtime.db rows answer once they are committed -------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("route", ["open", "pause", "cancel", "stop"])
async def test_a_route_that_changes_runtime_db_answers_only_once_its_rows_are_committed(home, route):
    import anyio

    from apollia_nb.api.app import create_app

    async with Runtime(home) as rt:
        await rt.register_agent(WRITER)
        session = rt.sessions.open("clerk")
        task = await rt.submit("clerk", "Write the marker", watched=False)
        await task.settled()
        asked, gate, answered = anyio.Event(), anyio.Event(), []
        real_flush = rt.records.flush_async

        async def held_flush():  # runtime.db's commit, held until the test lets it go
            asked.set()
            await gate.wait()
            await real_flush()

        rt.records.flush_async = held_flush
        path = {"open": "/sessions", "pause": f"/sessions/{session.id}/pause",
                "cancel": f"/tasks/{task.id}/cancel", "stop": "/agents/clerk/stop"}[route]
        body = {"agent": "clerk"} if route == "open" else None
        app = create_app(rt, token=TOKEN)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1/api/v1",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            async def send() -> None:
                answered.append(await api.post(path, json=body))

            with anyio.fail_after(EVENT_SECS):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(send)
                    await asked.wait()  # the route waits for the commit ...
                    assert answered == []  # ... and has not answered
                    gate.set()
        assert answered[0].status_code in (200, 201), answered[0].text
