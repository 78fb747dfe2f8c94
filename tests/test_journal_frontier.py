"""The head and Merkle frontier stored with the journal: open reads them, never every hash.

They are committed in the same transaction as the entries they cover; a frontier that
does not describe the stored entries refuses the open (HOME_FILE_CORRUPT) and changes
nothing; a journal from before the frontier was kept is migrated once; a crash between
copying entries and storing their frontier loses nothing. Proofs, verification and
export read the hashes range by range.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime

import duckdb
import pytest

from apollia_nb.errors import HomeFileCorrupt
from apollia_nb.journal import Journal, verify_journal
from apollia_nb.journal import export as export_module
from apollia_nb.journal import store as store_module
from apollia_nb.journal import verify as verify_module
from apollia_nb.journal import views as views_module
from apollia_nb.journal.export import export_home
from apollia_nb.journal.merkle import consistency_proof, inclusion_proof, leaf_hash, root
from apollia_nb.journal.verify import verify_bundle, verify_home

RUN_KINDS = [
    ("run_open", {"run_kind": "task"}),
    ("decision", {"call_id": "c1", "tool": "read_note", "family": "read", "outcome": "ask", "line": 3}),
    ("answer", {"call_id": "c1", "answer": "once", "answered_by": "user"}),
    ("tool_call", {"call_id": "c1", "tool": "read_note"}),
    ("tool_result", {"call_id": "c1", "tool": "read_note", "status": "error", "error_code": "TOOL_FAILED"}),
    ("tool_call", {"call_id": "c2", "tool": "list_dir"}),
    ("run_seal", {"status": "completed"}),
]


def _fill(journal: Journal, runs: int) -> None:
    for r in range(runs):
        journal.append_many([(kind, payload, f"run-{r}", "clerk") for kind, payload in RUN_KINDS])


def _db(home, sql: str, params=None, *, write: bool = False):
    con = duckdb.connect(str(home.journal_db), read_only=not write)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _frontier(home):
    return _db(home, "SELECT size, last_hash, root, hashes FROM frontier")


def _views(journal: Journal):
    return {name: journal.sql(f"SELECT * FROM {name}") for name in ("decisions", "tool_calls", "runs")}


def test_the_frontier_is_stored_with_the_entries_and_open_uses_it(home):
    with Journal.open(home) as journal:
        _fill(journal, 5)
        hashes = [e.hash for e in journal.entries()]
        expected_root = root([leaf_hash(h) for h in hashes])
    [(size, last_hash, stored_root, frontier)] = _frontier(home)
    assert (size, bytes(last_hash), bytes(stored_root)) == (len(hashes), hashes[-1], expected_root)
    assert len(bytes(frontier)) == 32 * size.bit_count()
    with Journal.open(home) as journal:
        assert journal.head() == (len(hashes), hashes[-1])
        assert journal.checkpoint()  # the root it signs is the stored frontier's
        latest = journal.checkpoints()[-1]
        assert (latest[0], latest[1]) == (len(hashes), expected_root)
        assert journal.append("plan", {"n": 1}).prev_hash == hashes[-1]
        assert verify_journal(journal).ok


@pytest.mark.parametrize("tamper, why", [
    ("DELETE FROM entries WHERE seq = (SELECT max(seq) FROM entries)", "covers 35 entries, but it holds 34"),
    ("DELETE FROM entries WHERE seq = 7", "covers 35 entries, but it holds 34"),
    ("UPDATE frontier SET hashes = repeat('\\x00'::BLOB, 96)", "does not have the stored root"),
    ("UPDATE frontier SET hashes = repeat('\\x00'::BLOB, 64)", "malformed"),
    ("UPDATE frontier SET last_hash = repeat('\\x01'::BLOB, 32)", "is not the hash of entry 35"),
    ("DELETE FROM frontier", "is missing"),
])
def test_a_frontier_that_does_not_match_the_entries_refuses_to_open_and_changes_nothing(home, tamper, why):
    with Journal.open(home) as journal:
        _fill(journal, 5)
    _db(home, tamper, write=True)
    before = (_frontier(home), _db(home, "SELECT count(*), max(seq) FROM entries"))
    with pytest.raises(HomeFileCorrupt, match=why) as info:
        Journal.open(home)
    assert info.value.code == "HOME_FILE_CORRUPT"
    assert "nothing was changed" in info.value.message
    assert (_frontier(home), _db(home, "SELECT count(*), max(seq) FROM entries")) == before
    with pytest.raises(HomeFileCorrupt):  # still refused: never rebuilt into a journal that opens
        Journal.open(home)


def test_a_journal_without_a_frontier_is_migrated_once(home):
    with Journal.open(home) as journal:
        _fill(journal, 4)
        views = _views(journal)
        head = journal.head()
    # As a journal written before the frontier and the typed fields were kept.
    _db(home, "DROP TABLE frontier; DROP TABLE entry_fields; DELETE FROM meta WHERE key = 'frontier'", write=True)
    with Journal.open(home) as journal:
        assert journal.head() == head
        assert _views(journal) == views
        journal.append("plan", {"n": 1})
    assert _db(home, "SELECT value FROM meta WHERE key = 'frontier'") == [("1",)]
    [(size, *_)] = _frontier(home)
    assert size == head[0] + 1
    assert verify_home(home).ok


def test_a_migration_refuses_a_journal_with_a_gap(home):
    with Journal.open(home) as journal:
        _fill(journal, 2)
    _db(home, "DROP TABLE frontier; DELETE FROM meta WHERE key = 'frontier'; DELETE FROM entries WHERE seq = 5",
        write=True)
    with pytest.raises(Exception, match="not contiguous: entry 5 is missing"):
        Journal.open(home)
    assert _db(home, "SELECT count(*) FROM meta WHERE key = 'frontier'") == [(0,)]


def test_a_crash_between_copying_entries_and_storing_their_frontier_loses_nothing(home):
    """The copy into journal.db and the frontier are one transaction: killed in between (the
    fault point ``journal.before_frontier``), neither is there, the log still holds the
    entries, and the next open copies them and stores their frontier."""
    script = textwrap.dedent(f"""
        import json, sys
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        journal = Journal.open(Home.at({str(home.path)!r}))
        entries = journal.append_many([("plan", {{"n": i}}, "run-1", "clerk") for i in range(20)])
        print(json.dumps([[e.seq, e.hash.hex()] for e in entries]), flush=True)
        journal.entries()  # has the writer copy them into journal.db: killed at the fault point
        print("survived", flush=True)
    """)
    env = {**os.environ, "APOLLIA_FAULT": "journal.before_frontier:kill"}
    with Journal.open(home) as journal:  # journal.db and its first frontier exist before the crash
        journal.append("plan", {"n": -1})
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == -signal.SIGKILL, out.stderr
    acknowledged = json.loads(out.stdout.splitlines()[0])
    assert "survived" not in out.stdout
    assert _db(home, "SELECT count(*) FROM entries") == [(1,)]  # the copy was not committed ...
    assert _frontier(home)[0][0] == 1  # ... nor its frontier
    with Journal.open(home) as journal:
        assert [[e.seq, e.hash.hex()] for e in journal.entries(since_seq=1)] == acknowledged
        assert journal.head()[0] == 21
        assert verify_journal(journal).ok
    assert _frontier(home)[0][0] == 21
    assert verify_home(home).ok


def test_proofs_read_the_hashes_range_by_range(home, monkeypatch):
    monkeypatch.setattr(store_module, "SEQ_RANGE", 4)  # many ranges, odd boundaries
    with Journal.open(home) as journal:
        _fill(journal, 3)
        leaves = [leaf_hash(e.hash) for e in journal.entries()]
        journal.checkpoint()
        for seq in (1, 2, 5, 8, 13, len(leaves)):
            proof = journal.inclusion_proof(seq)
            assert list(proof.path) == inclusion_proof(seq - 1, leaves)
        for old in (1, 3, 4, 9, len(leaves)):
            proof = journal.consistency_proof(old)
            assert list(proof.path) == consistency_proof(old, len(leaves), leaves)
            assert proof.old_root == root(leaves[:old]) and proof.new_root == root(leaves)


def test_views_read_typed_fields_that_match_the_payloads(home, tmp_path, monkeypatch):
    """entry_fields is filled as entries are copied; the bundle's views compute the same
    columns from entries.parquet, and give the same rows."""
    with Journal.open(home) as journal:
        _fill(journal, 3)
        live = _views(journal)
        (n,) = journal.sql("SELECT count(*) FROM entry_fields")[0]
        (kinds,) = journal.sql("SELECT count(*) FROM entries WHERE kind IN "
                               "('decision', 'answer', 'tool_call', 'tool_result', 'run_open', 'run_seal')")[0]
        assert n == kinds == 3 * 7
    assert live["decisions"][0][4:] == ("read_note", "read", "ask", 3, "once", "user")
    assert {(row[1], row[2], row[3], row[4]) for row in live["tool_calls"]} == {
        ("c1", "read_note", "error", "TOOL_FAILED"), ("c2", "list_dir", "running", None)}
    assert len(live["tool_calls"]) == 6
    assert [(row[0], row[2], row[3], row[6]) for row in live["runs"]] == [
        (f"run-{r}", "task", "completed", 7) for r in range(3)]
    export_home(home, tmp_path / "bundle")
    monkeypatch.chdir(tmp_path / "bundle")
    con = duckdb.connect()
    try:
        for statement in (tmp_path / "bundle" / "views.sql").read_text().split(";\n"):
            if statement.strip():
                con.execute(statement)
        for name, rows in live.items():
            assert con.execute(f"SELECT * FROM {name}").fetchall() == rows, name
    finally:
        con.close()


def test_verify_and_export_read_in_seq_ranges(home, tmp_path, monkeypatch):
    """With ranges of 3 rows, a good journal verifies and exports in seq order, and a
    duplicated entry is still found where one sort of every row finds it."""
    monkeypatch.setattr(verify_module, "RANGE", 3)
    with Journal.open(home) as journal:
        _fill(journal, 3)
        seqs = [e.seq for e in journal.entries()]
        assert verify_journal(journal).ok
        export_module.export_journal(journal, tmp_path / "live-bundle")
    assert verify_home(home).ok
    export_home(home, tmp_path / "bundle")
    for bundle in ("bundle", "live-bundle"):
        assert verify_bundle(tmp_path / bundle).ok
        con = duckdb.connect()
        try:
            order = [r[0] for r in con.execute(
                f"SELECT seq FROM read_parquet('{tmp_path / bundle / 'entries.parquet'}')").fetchall()]
        finally:
            con.close()
        assert order == seqs
        assert not [p.name for p in (tmp_path / bundle).iterdir() if p.name.startswith(".")]  # no side files left
    _db(home, "CREATE TABLE e2 AS SELECT * FROM entries; DROP VIEW journal; DROP VIEW decisions; "
              "DROP VIEW tool_calls; DROP VIEW runs; DROP TABLE entries; ALTER TABLE e2 RENAME TO entries; "
              "INSERT INTO entries SELECT * FROM entries WHERE seq = 8", write=True)  # no primary key now
    report = verify_home(home)
    assert not report.ok and report.first_bad_seq == 8 and "more than once" in report.problem


# The tool_calls view as it was computed from the payload JSON at query time, before ``calls``.
_TOOL_CALLS_FROM_JSON = """
WITH c AS (
    SELECT run_id, p->>'call_id' AS call_id, p->>'tool' AS tool, ts, seq
    FROM (SELECT seq, ts, run_id, CAST(decode(payload) AS JSON) AS p FROM entries WHERE kind = 'tool_call')
    QUALIFY row_number() OVER (PARTITION BY run_id, p->>'call_id' ORDER BY seq) = 1
), r AS (
    SELECT run_id, p->>'call_id' AS call_id, p->>'tool' AS tool, p->>'status' AS status,
           p->>'error_code' AS error_code, ts, seq
    FROM (SELECT seq, ts, run_id, CAST(decode(payload) AS JSON) AS p FROM entries WHERE kind = 'tool_result')
    QUALIFY row_number() OVER (PARTITION BY run_id, p->>'call_id' ORDER BY seq) = 1
)
SELECT coalesce(c.run_id, r.run_id), coalesce(c.call_id, r.call_id), coalesce(c.tool, r.tool),
       coalesce(r.status, 'running'), r.error_code, CAST(c.ts AS TIMESTAMPTZ), CAST(r.ts AS TIMESTAMPTZ)
FROM c FULL OUTER JOIN r ON r.run_id IS NOT DISTINCT FROM c.run_id AND r.call_id = c.call_id
ORDER BY coalesce(c.seq, r.seq)
"""
_CALL_COLUMNS = ("run_id, call_id, tool, family, outcome, answer, answered_by, status, error_code, "
                 "decided_at, started_at, finished_at, duration")


def _expected_calls(entries) -> list[tuple]:
    """Per call, from the payloads: the first decision's, answer's, tool_call's and tool_result's fields."""
    def ts(e):
        return datetime.fromisoformat(e.ts.replace("Z", "+00:00")) if e else None

    calls: dict = {}
    for e in entries:
        if e.kind in ("decision", "answer", "tool_call", "tool_result"):
            cid = e.data().get("call_id")
            calls.setdefault((e.run_id, cid, None if cid is not None else e.kind), {}).setdefault(e.kind, e)
    rows = []
    for (run_id, call_id, _), first in calls.items():
        d, a, c, r = (first.get(k) for k in ("decision", "answer", "tool_call", "tool_result"))
        p = {k: (e.data() if e else {}) for k, e in (("d", d), ("a", a), ("c", c), ("r", r))}
        rows.append((run_id, call_id, p["c"].get("tool") or p["r"].get("tool") or p["d"].get("tool"),
                     p["d"].get("family"), p["d"].get("outcome"), p["a"].get("answer"), p["a"].get("answered_by"),
                     p["r"].get("status"), p["r"].get("error_code"), ts(d), ts(c), ts(r),
                     ts(r) - ts(c) if c and r else None))
    return sorted(rows, key=lambda row: (row[0] is None, row[0] or "", row[1] is None, row[1] or ""))  # NULLS LAST


def test_the_calls_table_holds_what_the_payloads_say(home, tmp_path, monkeypatch):
    """Calls allowed, asked and answered, refused, errored (its result copied after its call)
    and cut by a kill -9 (no tool_result; its entries recovered from journal.log): the
    ``calls`` table, kept as entries are copied, holds each call's fields as the payloads
    give them; ``tool_calls`` gives the rows the JSON-extracting query gave; a bundle's
    views compute the same rows; and a journal from before ``calls`` computes it on open."""
    script = textwrap.dedent(f"""
        import os, signal
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        j = Journal.open(Home.at({str(home.path)!r}))
        def call(run, cid, outcome, *, answer=None, result=None, error=None, copy_between=False):
            out = [("decision", {{"call_id": cid, "tool": "read_note", "family": "read", "outcome": outcome,
                                  "line": 2, "answers": [], "reason": "r"}}, run, "clerk")]
            if answer:
                out.append(("answer", {{"call_id": cid, "answer": answer, "answered_by": "ada"}}, run, "clerk"))
            if outcome != "refuse" and answer != "refuse":
                out.append(("tool_call", {{"call_id": cid, "tool": "read_note", "arguments": {{}}}}, run, "clerk"))
            j.append_many(out)
            if copy_between:
                j.entries(since_seq=10**9)  # has the writer copy them now: the result comes in a later copy
            if result:
                payload = {{"call_id": cid, "tool": "read_note", "status": result, "output_digest": "d"}}
                if error:
                    payload["error_code"] = error
                j.append("tool_result", payload, run_id=run, agent="clerk")
        j.append("run_open", {{"run_kind": "task"}}, run_id="run-1", agent="clerk")
        call("run-1", "c1", "allow", result="ok")
        call("run-1", "c2", "ask", answer="once", result="ok", copy_between=True)
        call("run-1", "c3", "refuse", result="refused", error="REFUSED")
        call("run-1", "c4", "ask", answer="refuse", result="refused", error="REFUSED")
        call("run-1", "c5", "allow", result="error", error="TOOL_FAILED", copy_between=True)
        j.entries(since_seq=10**9)
        j.append("tool_result", {{"call_id": "c5", "tool": "read_note", "status": "ok", "output_digest": "x"}},
                 run_id="run-1", agent="clerk")  # a second result: the first one counts
        call("run-2", "c1", "allow", result="ok")  # the same call id in another run
        j.append("tool_call", {{"tool": "list_dir", "arguments": {{}}}}, run_id="run-2")  # no call id
        j.entries(since_seq=10**9)
        call("run-2", "c9", "allow")  # the tool is about to run ...
        os.kill(os.getpid(), signal.SIGKILL)  # ... and the process dies before its result
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    with Journal.open(home) as journal:  # copies what the log still holds
        entries = list(journal.entries())
        live = {name: journal.sql(f"SELECT * FROM {name}") for name in ("decisions", "tool_calls", "runs")}
        calls = journal.sql(f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY run_id, call_id")
        assert live["tool_calls"] == journal.sql(_TOOL_CALLS_FROM_JSON)
    assert entries[-1].kind == "tool_call" and entries[-1].data()["call_id"] == "c9"
    assert calls == _expected_calls(entries)
    assert [(r[0], r[1], r[4], r[5], r[7], r[8]) for r in calls] == [
        ("run-1", "c1", "allow", None, "ok", None),
        ("run-1", "c2", "ask", "once", "ok", None),
        ("run-1", "c3", "refuse", None, "refused", "REFUSED"),
        ("run-1", "c4", "ask", "refuse", "refused", "REFUSED"),
        ("run-1", "c5", "allow", None, "error", "TOOL_FAILED"),
        ("run-2", "c1", "allow", None, "ok", None),
        ("run-2", "c9", "allow", None, None, None),
        ("run-2", None, None, None, None, None),
    ]
    assert [(r[1], r[3]) for r in live["tool_calls"]] == [
        ("c1", "ok"), ("c2", "ok"), ("c3", "refused"), ("c4", "refused"), ("c5", "error"), ("c1", "ok"),
        (None, "running"), ("c9", "running")]

    export_home(home, tmp_path / "bundle")
    monkeypatch.chdir(tmp_path / "bundle")
    con = duckdb.connect()
    try:
        for statement in (tmp_path / "bundle" / "views.sql").read_text().split(";\n"):
            if statement.strip():
                con.execute(statement)
        for name, rows in live.items():
            assert con.execute(f"SELECT * FROM {name}").fetchall() == rows, name
        assert con.execute(f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY run_id, call_id").fetchall() == calls
    finally:
        con.close()

    # As a journal written before ``calls`` was kept: computed once on open, range by range.
    _db(home, "DELETE FROM calls; DELETE FROM meta WHERE key = 'calls'", write=True)
    monkeypatch.setattr(views_module, "rebuild_calls",
                        lambda con, step=3, _rebuild=views_module.rebuild_calls: _rebuild(con, step))
    monkeypatch.setattr(store_module, "rebuild_calls", views_module.rebuild_calls)
    with Journal.open(home) as journal:
        assert journal.sql(f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY run_id, call_id") == calls
        assert journal.sql("SELECT * FROM tool_calls") == live["tool_calls"]
    assert _db(home, "SELECT value FROM meta WHERE key = 'calls'") == [("1",)]
