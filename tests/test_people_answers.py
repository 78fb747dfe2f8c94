"""Answers over REST are journaled as the person whose token gave them, with their role and how they
authenticated, even when answers from several people are recorded together in one group."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from apollia_nb.api.server import ServerThread
from runtime_helpers import call, manifest

OWNER = "answers-owner-" + "a" * 32
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def test_answers_and_the_consents_they_grant_name_who_answered_their_role_and_how(home):
    with ServerThread(home, token=OWNER) as srv, _client(srv.url, OWNER) as owner:
        tokens = {}
        for name, role in (("ann", "approver"), ("rob", "runner")):
            made = owner.post("/people", json={"name": name, "roles": [role]})
            assert made.status_code == 201, made.text
            tokens[name] = made.json()["token"]
        with _client(srv.url, tokens["rob"]) as rob, _client(srv.url, tokens["ann"]) as ann:
            assert rob.post("/agents", json={"manifest": WRITER}).status_code == 201
            tasks = [rob.post("/tasks", json={"agent": "clerk", "goal": f"Write {i}"}).json() for i in range(2)]
            refused = rob.post("/pending-decisions/decide", json={"id": "pd-x", "answer": "once"})
            assert refused.status_code == 403 and "'approver'" in refused.json()["message"]
            deadline = time.monotonic() + 60
            while len(pending := ann.get("/pending-decisions").json()) < 2:
                assert time.monotonic() < deadline, pending
                time.sleep(0.05)
            by_task = {p["task_id"]: p["id"] for p in pending}
            first, second = (by_task[t["id"]] for t in tasks)
            with ThreadPoolExecutor(2) as pool:  # given together: maybe recorded in one group
                a = pool.submit(ann.post, "/pending-decisions/decide",
                                json={"id": first, "answer": "always", "by": "mallory"})
                b = pool.submit(owner.post, "/pending-decisions/decide",
                                json={"id": second, "answer": "once", "by": "bob@phone"})
                assert a.result().status_code == 200, a.result().text
                assert b.result().status_code == 200, b.result().text
            entries = owner.get("/audit/entries", params={"limit": 1000}).json()["entries"]
    answers = {e["payload"]["decision_id"]: e["payload"] for e in entries if e["kind"] == "answer"}
    assert {k: answers[first][k] for k in ("answered_by", "by_role", "auth")} == {
        "answered_by": "ann", "by_role": "approver", "auth": "token"}
    assert {k: answers[second][k] for k in ("answered_by", "by_role", "auth")} == {
        "answered_by": "bob@phone", "by_role": "admin", "auth": "owner"}
    [granted] = [e["payload"] for e in entries if e["kind"] == "consent_granted"]
    assert (granted["by"], granted["by_role"], granted["auth"]) == ("ann", "approver", "token")
    for token in tokens.values():
        assert token not in json.dumps(entries)
