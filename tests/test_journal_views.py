"""The SQL views over a hand-built run: columns and rows of journal, decisions, tool_calls, runs."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from apollia_nb.journal import Journal

T0 = datetime(2026, 11, 29, 9, 0, 0, tzinfo=timezone.utc)


def at(n: int) -> datetime:
    return T0 + timedelta(seconds=n)


@pytest.fixture
def journal_db(home):
    """A task run with a decision answered, a refused call, a finished and a running call; an open chat."""
    tick = iter(range(1000))
    with Journal.open(home, clock=lambda: at(next(tick))) as journal:
        task = {"run_id": "run-1", "agent": "clerk"}
        journal.append("run_open", {"run_kind": "task", "goal": "tidy", "task_id": "t1"}, **task)  # 1 @0
        journal.append("model_response", {"role": "actor", "turn": 1, "text": "",
                                          "tool_calls": [{"call_id": "c1", "name": "write_file",
                                                          "arguments": {"path": "a"}}]}, **task)  # 2 @1
        journal.append("decision", {"call_id": "c1", "tool": "write_file", "family": "write",
                                    "arguments": {"path": "a"}, "outcome": "ask", "line": 6,
                                    "answers": ["once", "always", "refuse"], "reason": "asks"}, **task)  # 3 @2
        journal.append("answer", {"call_id": "c1", "answer": "once", "answered_by": "ada"}, **task)  # 4 @3
        journal.append("tool_call", {"call_id": "c1", "tool": "write_file", "arguments": {"path": "a"}}, **task)  # 5 @4
        journal.append("tool_result", {"call_id": "c1", "tool": "write_file", "status": "ok",
                                       "output": "done", "output_digest": "d1"}, **task)  # 6 @5
        journal.append("decision", {"call_id": "c2", "tool": "bash_executor", "family": "execute",
                                    "arguments": {"command": "rm -rf /"}, "outcome": "refuse", "line": 2,
                                    "answers": [], "reason": "deny rule"}, **task)  # 7 @6
        journal.append("tool_result", {"call_id": "c2", "tool": "bash_executor", "status": "refused",
                                       "error_code": "REFUSED", "output_digest": "d2"}, **task)  # 8 @7
        journal.append("decision", {"call_id": "c3", "tool": "mystery", "family": None, "arguments": {},
                                    "outcome": "ask", "line": 6, "answers": ["once", "refuse"],
                                    "reason": "unclassified"}, **task)  # 9 @8
        journal.append("decision", {"call_id": "c4", "tool": "read_file", "family": "read",
                                    "arguments": {"path": "b"}, "outcome": "allow", "line": 3,
                                    "answers": [], "reason": "reads"}, **task)  # 10 @9
        journal.append("tool_call", {"call_id": "c4", "tool": "read_file", "arguments": {"path": "b"}}, **task)  # 11 @10
        journal.append("tool_result", {"call_id": "c4", "tool": "read_file", "status": "error",
                                       "error_code": "TOOL_PERMANENT", "output_digest": "d4"}, **task)  # 12 @11
        journal.append("tool_call", {"call_id": "c5", "tool": "read_file", "arguments": {"path": "c"}}, **task)  # 13 @12
        journal.append("rule_added", {"tool": "bash_executor", "effect": "deny"})  # 14 @13, no run
        journal.append("run_seal", {"status": "failed", "entries": 13,
                                    "error": {"code": "REFUSED", "message": "refused"}}, **task)  # 15 @14
        journal.append("run_open", {"run_kind": "chat"}, run_id="run-2", agent="pal")  # 16 @15
        journal.append("decision", {"call_id": "c1", "tool": "send_mail", "family": "send", "arguments": {},
                                    "outcome": "ask", "line": 6, "answers": ["once", "always", "refuse"],
                                    "reason": "asks"}, run_id="run-2", agent="pal")  # 17 @16
    con = duckdb.connect(str(home.journal_db), read_only=True)
    yield con
    con.close()


def columns(con, view: str) -> list[str]:
    return [d[0] for d in con.execute(f"SELECT * FROM {view} LIMIT 0").description]


def test_journal_view(journal_db):
    assert columns(journal_db, "journal") == [
        "seq", "ts", "run_id", "agent", "kind", "payload", "prev_hash", "hash", "signature", "key_id",
    ]
    raw = journal_db.execute("SELECT hash, payload FROM entries WHERE seq = 3").fetchone()
    seq, ts, run_id, agent, kind, payload, prev_hash, digest, signature, key_id = journal_db.execute(
        "SELECT * FROM journal WHERE seq = 3").fetchone()
    assert (seq, run_id, agent, kind) == (3, "run-1", "clerk", "decision")
    assert ts == at(2)
    assert payload == raw[1].decode()
    assert digest == raw[0].hex() and len(prev_hash) == 64 and len(signature) == 128
    assert len(key_id) == 16
    assert journal_db.execute("SELECT payload->>'tool' FROM journal WHERE seq = 3").fetchone() == ("write_file",)
    assert journal_db.execute("SELECT count(*) FROM journal").fetchone() == (17,)


def test_decisions_view(journal_db):
    assert columns(journal_db, "decisions") == [
        "seq", "ts", "run_id", "agent", "tool", "family", "outcome", "line", "answer", "answered_by",
    ]
    rows = journal_db.execute(
        "SELECT seq, ts, run_id, agent, tool, family, outcome, line, answer, answered_by FROM decisions"
    ).fetchall()
    assert rows == [
        (3, at(2), "run-1", "clerk", "write_file", "write", "ask", 6, "once", "ada"),
        (7, at(6), "run-1", "clerk", "bash_executor", "execute", "refuse", 2, None, None),
        (9, at(8), "run-1", "clerk", "mystery", None, "ask", 6, None, None),
        (10, at(9), "run-1", "clerk", "read_file", "read", "allow", 3, None, None),
        # same call id in another run: the answer of run-1 does not leak into it
        (17, at(16), "run-2", "pal", "send_mail", "send", "ask", 6, None, None),
    ]


def test_tool_calls_view(journal_db):
    assert columns(journal_db, "tool_calls") == [
        "run_id", "call_id", "tool", "status", "error_code", "started_at", "finished_at",
    ]
    rows = journal_db.execute("SELECT * FROM tool_calls").fetchall()
    assert rows == [
        ("run-1", "c1", "write_file", "ok", None, at(4), at(5)),
        ("run-1", "c2", "bash_executor", "refused", "REFUSED", None, at(7)),
        ("run-1", "c4", "read_file", "error", "TOOL_PERMANENT", at(10), at(11)),
        ("run-1", "c5", "read_file", "running", None, at(12), None),
    ]


def test_runs_view(journal_db):
    assert columns(journal_db, "runs") == [
        "run_id", "agent", "kind", "status", "started_at", "finished_at", "entries",
    ]
    rows = journal_db.execute("SELECT * FROM runs").fetchall()
    assert rows == [
        ("run-1", "clerk", "task", "failed", at(0), at(14), 14),
        ("run-2", "pal", "chat", "open", at(15), None, 2),
    ]


def test_views_exist_on_a_fresh_journal(home):
    with Journal.open(home) as journal:
        for view in ("journal", "decisions", "tool_calls", "runs"):
            assert journal.sql(f"SELECT count(*) FROM {view}") == [(0,)]


class _Recording:
    """A DuckDB connection that keeps the SQL run through it."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.statements = con, []

    def execute(self, sql: str, *args):
        self.statements.append(sql)
        return self.con.execute(sql, *args)

    def made(self) -> int:
        return sum("CREATE OR REPLACE VIEW" in s for s in self.statements)


def test_an_open_of_an_unchanged_journal_makes_no_views_and_missing_or_older_ones_are_made(home):
    from apollia_nb.journal.views import VIEW_NAMES, VIEWS_DIGEST, create_views

    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": "t1"}, run_id="r1", agent="a")
    con = duckdb.connect(str(home.journal_db))
    try:
        unchanged = _Recording(con)
        create_views(unchanged)
        assert unchanged.made() == 0
        con.execute("DROP VIEW runs")  # one missing: all are made again
        missing = _Recording(con)
        create_views(missing)
        assert missing.made() == len(VIEW_NAMES)
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        con.execute("UPDATE meta SET value = 'older' WHERE key = 'views'")  # made by other SQL
        older = _Recording(con)
        create_views(older)
        assert older.made() == len(VIEW_NAMES)
        assert con.execute("SELECT value FROM meta WHERE key = 'views'").fetchone() == (VIEWS_DIGEST,)
    finally:
        con.close()
    with Journal.open(home) as journal:  # and the journal opens on them as always
        assert journal.sql("SELECT run_id FROM runs") == [("r1",)]
