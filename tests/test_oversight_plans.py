"""The ``oversight`` view lists plan approvals and rejections beside the answers to cards: the task, who
answered, their role and how they authenticated, when the plan was put to them, how long it waited, and
the digest of the plan they approved; a plan that was only proposed is no row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest
from runtime_helpers import call, manifest
from served_helpers import api_client, until

from apollia_nb.api.server import ServerThread
from apollia_nb.governance.approvals import plan_digest
from apollia_nb.journal import Journal
from apollia_nb.journal.views import list_oversight
from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio

OWNER = "plans-owner-" + "p" * 32
PLANNED = manifest(planner=[{"steps": ["Write the file"]}, {"steps": ["Write the file"]}],
                   actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}])


def _plans(home: Any) -> list[dict[str, Any]]:
    with Journal.open(home) as journal:
        return [r for r in list_oversight(journal) if r["event"] == "plan"]


def _proposed_at(home: Any, task_id: str) -> list[str]:
    with Journal.open(home) as journal:
        return [e.ts for e in journal.entries(kinds=["plan"])
                if json.loads(e.payload).get("task_id") == task_id and "approved" not in json.loads(e.payload)]


def test_plan_answers_over_rest_are_rows_naming_the_person_the_role_and_the_plans_digest(home):
    with ServerThread(home, token=OWNER) as srv, api_client(srv.url, OWNER) as owner:
        made = owner.post("/people", json={"name": "ann", "roles": ["approver"]})
        assert made.status_code == 201, made.text
        assert owner.post("/agents", json={"manifest": PLANNED}).status_code == 201
        tasks = [owner.post("/tasks", json={"agent": "clerk", "goal": f"Write {i}", "approve_plan": True,
                                            "grants": ["write"]}).json() for i in range(2)]
        first, second = [until(lambda t=t: owner.get(f"/tasks/{t['id']}").json(),
                                lambda x: x["awaiting_plan_approval"]) for t in tasks]
        with api_client(srv.url, made.json()["token"]) as ann:
            assert ann.post(f"/tasks/{first['id']}/plan/approve",
                            json={"digest": first["plan_digest"]}).status_code == 202
            assert ann.post(f"/tasks/{second['id']}/plan/reject", json={"reason": "not now"}).status_code == 202
        until(lambda: owner.get(f"/tasks/{first['id']}").json(), lambda t: t["status"] == "completed")
        until(lambda: owner.get(f"/tasks/{second['id']}").json(), lambda t: t["status"] != "waiting")
    rows = _plans(home)
    assert [(r["card"], r["answer"], r["answered_by"], r["by_role"], r["auth"], r["digest"]) for r in rows] == [
        (first["id"], "approve", "ann", "approver", "token", first["plan_digest"]),
        (second["id"], "reject", "ann", "approver", "token", second["plan_digest"])]
    assert first["plan_digest"] == plan_digest(task_id=first["id"], run_id=first["run_id"], agent="clerk",
                                               steps=["Write the file"])
    for row, task in zip(rows, (first, second), strict=True):
        assert (row["run_id"], row["agent"], row["tool"], row["family"]) == (task["run_id"], "clerk", None, None)
        [asked] = _proposed_at(home, task["id"])
        asked_at = datetime.fromisoformat(row["asked_at"].replace("Z", "+00:00"))
        assert abs((asked_at - datetime.fromisoformat(asked.replace("Z", "+00:00"))).total_seconds()) < 0.001
        answered_at = datetime.fromisoformat(row["answered_at"].replace("Z", "+00:00"))
        assert row["waited_seconds"] == pytest.approx((answered_at - asked_at).total_seconds(), abs=0.002)
        assert row["waited_seconds"] >= 0
        assert (row["consent_for"], row["consent_until"], row["refused_code"]) == (None, None, None)


async def test_an_edited_plan_names_the_digest_of_what_runs_and_a_proposal_alone_is_no_row(home):
    async with Runtime(home) as rt:
        await rt.register_agent(PLANNED)
        handle = await rt.submit("clerk", "Write", approve_plan=True, grants=["write"], watched=False)
        await handle.settled()
        assert [r for r in list_oversight(rt.journal) if r["event"] == "plan"] == []  # proposed, not answered
        steps = ["Write the file", "Say it is done"]
        rt.approve_plan(handle.id, steps, by="ops")
        await handle
        run_id = handle.run_id
    [row] = _plans(home)
    assert (row["card"], row["answer"], row["answered_by"], row["by_role"], row["auth"]) == (
        handle.id, "approve", "ops", None, None)
    assert row["digest"] == plan_digest(task_id=handle.id, run_id=run_id, agent="clerk", steps=steps)


def test_audit_oversight_prints_plan_rows(home):
    test_plan_answers_over_rest_are_rows_naming_the_person_the_role_and_the_plans_digest(home)
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    out = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "oversight", "--json", "--home",
                          str(home.path)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    rows = [r for r in json.loads(out.stdout) if r["event"] == "plan"]
    assert [(r["answer"], r["answered_by"], r["by_role"]) for r in rows] == [
        ("approve", "ann", "approver"), ("reject", "ann", "approver")]
