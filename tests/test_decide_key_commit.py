"""A decide's ``Idempotency-Key`` is taken while the answer waits for its group, and committed before the
answer is journaled: a crash between the two, or a key the disk refuses, never answers a decision twice nor
leaves an answer a retry with the key cannot find.

Real servers on 127.0.0.1 (``apollia-os serve`` as a subprocess for the crash, a background thread for the
full disk); the window is the named fault point ``answer.after_key`` (apollia_nb/faults.py).
"""

from __future__ import annotations

import signal

import httpx
import pytest

from apollia_nb.dbutil import FAULT_ENV
from api_helpers import api_url, auth, keyed, served
from runtime_helpers import call, manifest

TOKEN = "key-token"
AUTH = auth(TOKEN)
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])
TASK = {"agent": "clerk", "goal": "Write a.txt"}


def _waiting(api: httpx.Client) -> tuple[dict, dict]:
    task = api.post("/tasks", json=TASK).json()
    assert api.get(f"/tasks/{task['id']}/wait").json()["status"] == "waiting"
    [pending] = [p for p in api.get("/pending-decisions").json() if p["task_id"] == task["id"]]
    return task, pending


def _journaled(api: httpx.Client, run_id: str, kind: str) -> list[dict]:
    entries = api.get("/audit/entries", params={"run_id": run_id, "limit": 1000}).json()["entries"]
    return [e for e in entries if e["kind"] == kind]


@pytest.mark.timeout(180)
def test_a_server_killed_after_a_decides_key_is_committed_and_before_its_answer_answers_once_at_the_retry(tmp_path):
    from test_api_serve import start, stop

    home = tmp_path / "home"
    faulty, _ = start(home, "--token", TOKEN, env={"APOLLIA_FAULT": "answer.after_key:kill"})
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            assert api.post("/agents", json={"manifest": WRITER}).status_code == 201
            task, pending = _waiting(api)
            body = {"id": pending["id"], "answer": "once"}
            with pytest.raises(httpx.TransportError):  # killed there: the client never hears back
                api.post("/pending-decisions/decide", json=body, headers=keyed("cut-off"))
    finally:
        assert stop(faulty) == -signal.SIGKILL
    proc, _ = start(home, "--token", TOKEN)
    try:
        with httpx.Client(base_url=api_url(home), headers=AUTH, timeout=60) as api:
            assert api.get("/pending-decisions").json()[0]["id"] == pending["id"]  # nothing was answered
            assert _journaled(api, task["run_id"], "answer") == []
            again = api.post("/pending-decisions/decide", json=body, headers=keyed("cut-off"))
            assert again.status_code == 200 and again.json()["answer"] == "once", again.text
            replay = api.post("/pending-decisions/decide", json=body, headers=keyed("cut-off"))
            assert (replay.status_code, replay.json()) == (200, again.json())
            assert replay.headers["Idempotent-Replayed"] == "true"
            other = api.post("/pending-decisions/decide", json=body, headers=keyed("another"))
            assert other.status_code == 409, other.text  # answered once: another request is refused
            done = api.get(f"/tasks/{task['id']}/wait", params={"until": "finished", "timeout": 60}).json()
            assert done["status"] == "completed", done
            assert len(_journaled(api, task["run_id"], "answer")) == 1
            assert len([e for e in _journaled(api, task["run_id"], "tool_call")
                        if e["payload"].get("tool") == "write_file"]) == 1
    finally:
        assert stop(proc) == 0


def test_a_decides_key_the_disk_refuses_refuses_the_answer_and_the_same_key_answers_it_once_later(
        home, monkeypatch):
    with served(home, TOKEN, WRITER) as (_server, api):
        task, pending = _waiting(api)
        body = {"id": pending["id"], "answer": "once"}
        monkeypatch.setenv(FAULT_ENV, "runtime.db:ENOSPC")  # runtime.db refuses the key
        refused = api.post("/pending-decisions/decide", json=body, headers=keyed("full"))
        monkeypatch.delenv(FAULT_ENV)  # space is freed
        assert refused.status_code == 507 and refused.json()["code"] == "STORAGE_FULL", refused.text
        assert [p["id"] for p in api.get("/pending-decisions").json()] == [pending["id"]]  # nothing done
        assert _journaled(api, task["run_id"], "answer") == []
        again = api.post("/pending-decisions/decide", json=body, headers=keyed("full"))
        assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers, again.text
        replay = api.post("/pending-decisions/decide", json=body, headers=keyed("full"))
        assert replay.json() == again.json() and replay.headers["Idempotent-Replayed"] == "true"
        done = api.get(f"/tasks/{task['id']}/wait", params={"until": "finished", "timeout": 60}).json()
        assert done["status"] == "completed", done
        assert len(_journaled(api, task["run_id"], "answer")) == 1
