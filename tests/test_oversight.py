"""The auditor's ``oversight`` view and ``apollia-os audit oversight``: for each answer a person gave to a
card, the card, when it was asked, when and by whom it was answered, their role and how they authenticated,
how long the card waited, and the digest of what they were shown (NULL when the entry names none)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import duckdb
import pytest
from runtime_helpers import call, manifest
from served_helpers import api_client, until

from apollia_nb.api.server import ServerThread
from apollia_nb.home import Home
from apollia_nb.journal import Journal
from apollia_nb.journal.views import OVERSIGHT_COLUMNS, bundle_sql, list_oversight
from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio

APOLLIA = [sys.executable, "-m", "apollia_nb"]
OWNER = "oversight-owner-" + "c" * 32


def _writes(n: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i in range(n):
        turns += [{"tool_calls": [call("write_file", path=f"f{i}.txt", content="x")]}, {"text": "Done."}]
    return turns


def _cli(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([*APOLLIA, *args, "--home", str(home.path)], capture_output=True, text=True,
                          timeout=120, env=env)


def _answers(home: Home) -> list[dict[str, Any]]:
    journal = Journal.open(home)
    try:
        return [{"seq": e.seq, **json.loads(e.payload)} for e in journal.entries(kinds=["answer"])]
    finally:
        journal.close()


async def test_each_answered_card_is_a_row_with_how_long_it_waited_and_what_was_shown(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=_writes(2)))
        handles = []
        for _ in range(2):
            handle = await rt.submit("clerk", "Write a file", watched=False)
            await handle.settled()
            handles.append(handle)
        first, second = sorted(rt.pending_decisions(), key=lambda p: p["created_at"])
        time.sleep(0.2)  # the first card waits at least this long
        rt.answer(first["id"], "once", by="ann")
        rt.answer(second["id"], "always", by="bob", lasting="8h")
        for handle in handles:
            await handle
        rows = list_oversight(rt.journal)
    journaled = {a["decision_id"]: a for a in _answers(home)}
    assert [r["card"] for r in rows] == [first["id"], second["id"]]
    one, two = rows
    assert set(one) == set(OVERSIGHT_COLUMNS)
    assert (one["event"], one["agent"], one["tool"], one["family"], one["answer"], one["answered_by"]) == (
        "answer", "clerk", "write_file", "write", "once", "ann")
    assert one["waited_seconds"] >= 0.2
    assert datetime.fromisoformat(one["asked_at"]) < datetime.fromisoformat(one["answered_at"])
    assert one["run_id"] == handles[0].run_id and one["seq"] == journaled[first["id"]]["seq"]
    assert one["digest"] == journaled[first["id"]].get("digest")  # NULL when the answer names none
    assert (one["consent_for"], one["consent_until"]) == (None, None)
    assert (two["answer"], two["answered_by"], two["consent_for"]) == ("always", "bob", "8h")
    ends = datetime.fromisoformat(journaled[second["id"]]["until"])
    assert abs((datetime.fromisoformat(two["consent_until"]) - ends).total_seconds()) < 0.001  # to the ms
    assert (one["by_role"], one["auth"]) == (None, None)  # answered in the owning process: no token


def test_an_answer_without_a_digest_or_a_decision_reads_as_null(home):
    journal = Journal.open(home)
    try:
        journal.append("answer", {"call_id": "c-1", "decision_id": "pd-1", "answer": "refuse", "answered_by": "ann"},
                       run_id="run-1", agent="clerk")
        [row] = list_oversight(journal)
    finally:
        journal.close()
    assert (row["card"], row["answered_by"], row["answer"]) == ("pd-1", "ann", "refuse")
    assert (row["digest"], row["asked_at"], row["waited_seconds"], row["tool"]) == (None, None, None, None)


def test_the_view_is_in_an_exported_bundles_script():
    assert "CREATE OR REPLACE VIEW oversight AS" in bundle_sql()


def test_over_rest_the_row_names_the_persons_role_and_how_they_authenticated(home):
    with ServerThread(home, token=OWNER) as srv:
        with api_client(srv.url, OWNER) as owner:
            made = owner.post("/people", json={"name": "ann", "roles": ["approver"]})
            assert made.status_code == 201, made.text
            assert owner.post("/agents", json={"manifest": manifest(actor=_writes(1))}).status_code == 201
            assert owner.post("/tasks", json={"agent": "clerk", "goal": "Write"}).status_code == 202
            pending = until(lambda: owner.get("/pending-decisions").json(), bool)
            with api_client(srv.url, made.json()["token"]) as ann:
                answered = ann.post("/pending-decisions/decide", json={"id": pending[0]["id"], "answer": "once"})
                assert answered.status_code == 200, answered.text
        served = _cli(home, "audit", "oversight", "--json")
    assert served.returncode == 0, served.stderr
    [row] = json.loads(served.stdout)
    assert (row["card"], row["answered_by"], row["by_role"], row["auth"]) == (pending[0]["id"], "ann", "approver",
                                                                              "token")
    owned = _cli(home, "audit", "oversight", "--json")
    assert owned.returncode == 0, owned.stderr
    assert json.loads(owned.stdout) == [row]


async def test_audit_oversight_prints_the_rows_since_a_seq_or_a_time(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=_writes(2)))
        for answer in ("once", "refuse"):
            handle = await rt.submit("clerk", "Write a file", watched=False)
            await handle.settled()
            rt.answer(rt.pending_decisions()[0]["id"], answer, by="ann")
            await handle.settled()
        rows = list_oversight(rt.journal)
    first, second = rows
    text = _cli(home, "audit", "oversight")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split()[:5] == ["SEQ", "CARD", "EVENT", "AGENT", "TOOL"]
    assert [line.split()[1] for line in lines[1:]] == [first["card"], second["card"]]
    assert "ann" in lines[1] and "once" in lines[1] and "refuse" in lines[2]
    since_seq = _cli(home, "audit", "oversight", "--since", str(first["seq"]), "--json")
    assert [r["card"] for r in json.loads(since_seq.stdout)] == [second["card"]]
    since_time = _cli(home, "audit", "oversight", "--since", second["answered_at"], "--json")
    assert [r["card"] for r in json.loads(since_time.stdout)] == [second["card"]]
    naive = second["answered_at"].replace("Z", "")  # a time without its zone is UTC
    assert [r["card"] for r in json.loads(_cli(home, "audit", "oversight", "--since", naive, "--json").stdout)] == [
        second["card"]]
    none = _cli(home, "audit", "oversight", "--since", str(second["seq"]))
    assert none.returncode == 0 and "no answers since" in none.stdout
    for bad in ("yesterday", "-1", "1.5", "12:00 tomorrow"):
        refused = _cli(home, "audit", "oversight", "--since", bad)
        assert refused.returncode == 3 and "BAD_INPUT" in refused.stderr, (bad, refused.stderr)


def test_the_view_reads_the_same_on_a_live_journal_and_an_exported_bundle(home, tmp_path):
    journal = Journal.open(home)
    try:
        journal.append("decision", {"call_id": "c-1", "tool": "write_file", "family": "write", "arguments": {},
                                    "outcome": "ask", "line": 6, "answers": ["once", "refuse"], "reason": "ask"},
                       run_id="run-1", agent="clerk")
        journal.append("answer", {"call_id": "c-1", "decision_id": "pd-1", "answer": "once", "answered_by": "ann",
                                  "by_role": "approver", "auth": "token", "digest": "sha256:" + "0" * 64},
                       run_id="run-1", agent="clerk")
        live = journal.sql("SELECT card, tool, answered_by, by_role, auth, digest, epoch(waited) >= 0 FROM oversight")
    finally:
        journal.close()
    out = tmp_path / "bundle"
    exported = _cli(home, "audit", "export", str(out))
    assert exported.returncode == 0, exported.stderr
    con = duckdb.connect()
    try:
        con.execute(bundle_sql(out))  # the bundle's Parquet files by their paths, then the views
        offline = con.execute(
            "SELECT card, tool, answered_by, by_role, auth, digest, epoch(waited) >= 0 FROM oversight").fetchall()
    finally:
        con.close()
    assert offline == live == [("pd-1", "write_file", "ann", "approver", "token", "sha256:" + "0" * 64, True)]
