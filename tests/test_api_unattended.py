"""Scenario E's last paragraph over the REST API: an unattended task waits on a person, is answered
from wherever the person is, and resumes — watched through server-sent events, across a restart.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from runtime_helpers import call, manifest

TOKEN = "unattended-token"
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="summary.txt", content="ok")]},
                         {"text": "Wrote summary.txt."}])


def client(srv: ServerThread) -> httpx.Client:
    return httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def task_events(api: httpx.Client, task_id: str):
    """Yield each ``task`` event's JSON as it arrives."""
    with api.stream("GET", f"/tasks/{task_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                assert name == "task"
                yield json.loads(line.split(":", 1)[1])


def test_an_unattended_task_waits_on_write_file_is_decided_over_http_and_completes(home):
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        assert api.post("/agents", json={"manifest": WRITER}).status_code == 201
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Write the summary"}).json()

        seen = []
        for task in task_events(api, sub["id"]):
            seen.append(task["status"])
            if task["status"] == "waiting":
                break
        assert seen[0] in ("pending", "running") and seen[-1] == "waiting"
        assert not (home.path.parent / "work" / "summary.txt").exists()  # the tool has not run

        [pending] = api.get("/pending-decisions").json()
        assert pending["task_id"] == sub["id"] and pending["run_id"] == sub["run_id"]
        assert pending["agent"] == "clerk" and pending["tool"] == "write_file" and pending["family"] == "write"
        assert pending["arguments"] == {"path": "summary.txt", "content": "ok"}
        assert pending["answers"] == ["once", "always", "refuse"]

        decided = api.post("/pending-decisions/decide",
                           json={"id": pending["id"], "answer": "once", "by": "alice@phone"})
        assert decided.status_code == 200 and decided.json()["status"] == "answered"

        after = [t for t in task_events(api, sub["id"])]
        assert after[-1]["status"] == "completed" and after[-1]["result"] == "Wrote summary.txt."
        assert [t["status"] for t in after].count("completed") == 1  # the stream ends with the task
        assert api.get("/pending-decisions").json() == []
        assert (home.path.parent / "work" / "summary.txt").read_text() == "ok"

        run = api.get("/audit/entries", params={"run_id": sub["run_id"], "limit": 1000}).json()["entries"]
        answers = [e["payload"] for e in run if e["kind"] == "answer"]
        assert answers == [{"call_id": pending["call_id"], "decision_id": pending["id"], "answer": "once",
                            "answered_by": "alice@phone", "by_role": "admin", "auth": "owner",
                            "digest": pending["digest"]}]
        assert run[-1]["kind"] == "run_seal" and api.get("/audit/verify").json()["ok"] is True
        assert api.post(f"/audit/replay/{sub['run_id']}").json()["verdict"] == "identical"


def test_the_event_stream_of_a_finished_task_sends_it_once_and_ends(home):
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        api.post("/agents", json={"manifest": manifest()})
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Hello"}).json()
        assert api.get(f"/tasks/{sub['id']}/wait", params={"until": "finished"}).json()["status"] == "completed"
        assert [t["status"] for t in task_events(api, sub["id"])] == ["completed"]


def test_pending_decisions_survive_a_restart_of_the_server_and_answering_resumes_the_run(home):
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        api.post("/agents", json={"manifest": WRITER})
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Write the summary"}).json()
        assert api.get(f"/tasks/{sub['id']}/wait").json()["status"] == "waiting"
    assert not home.server_json.exists()

    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        [pending] = api.get("/pending-decisions").json()
        assert pending["task_id"] == sub["id"]
        assert api.get(f"/tasks/{sub['id']}").json()["status"] == "waiting"
        api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
        task = api.get(f"/tasks/{sub['id']}/wait", params={"until": "finished"}).json()
        assert task["status"] == "completed" and task["result"] == "Wrote summary.txt."
        assert api.get("/audit/verify").json()["ok"] is True

    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        # Finished in an earlier process: still readable, and cannot be cancelled.
        assert api.get(f"/tasks/{sub['id']}").json()["status"] == "completed"
        assert [t["id"] for t in api.get("/tasks").json()] == [sub["id"]]
        for action in ("cancel", "plan/approve"):
            r = api.post(f"/tasks/{sub['id']}/{action}")
            assert r.status_code == 409 and r.json()["code"] == "CONFLICT"


@pytest.mark.timeout(60)
def test_shutting_down_ends_open_event_streams_and_keeps_the_waiting_run(home):
    srv = ServerThread(home, token=TOKEN).start()
    with client(srv) as api:
        api.post("/agents", json={"manifest": WRITER})
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "Write"}).json()
        took: list[float] = []

        def stop() -> None:
            started = time.monotonic()
            srv.stop()
            took.append(time.monotonic() - started)

        stopper = threading.Thread(target=stop)
        statuses = []
        for task in task_events(api, sub["id"]):
            statuses.append(task["status"])
            if task["status"] == "waiting" and not stopper.is_alive():
                stopper.start()  # the stream is open; the server now shuts down under it
        stopper.join(30)
        assert not stopper.is_alive() and statuses[-1] == "waiting"
        assert took[0] < 8  # the stream ended with the shutdown, not at uvicorn's 10 s graceful timeout
    assert not home.server_json.exists()
    with ServerThread(home, token=TOKEN) as srv, client(srv) as api:
        assert [p["task_id"] for p in api.get("/pending-decisions").json()] == [sub["id"]]
