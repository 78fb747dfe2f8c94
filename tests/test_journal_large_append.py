"""One acknowledged append larger than one copy into journal.db can take.

The copy from journal.log into journal.db is made in pieces bounded by entries and payload
bytes, each one transaction that also stores the frontier of the prefix it ends. So an
``append_many`` of any size is copied within the database's memory cap, and a kill -9
between two pieces leaves a consistent prefix that the next open completes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import duckdb

from apollia_nb.journal import Draft, Journal, verify_home, verify_journal
from apollia_nb.journal.store import COPY_PIECE_BYTES, copy_pieces

PAYLOAD = 2000  # bytes of argument text per entry


def _drafts(n: int, tag: str = "a") -> list[Draft]:
    return [Draft("tool_call", {"tool": "read", "call_id": f"{tag}-{i}", "arguments": {"x": "y" * PAYLOAD}},
                  f"run-{tag}-{i // 50}", "clerk") for i in range(n)]


def _db(home, sql: str):
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_copy_pieces_are_bounded_by_entries_and_bytes():
    rows = [(i + 1, "", None, None, "plan", b"x" * size) for i, size in enumerate([3, 3, 3, 10, 1, 1, 1, 1])]
    pieces = copy_pieces(rows, entries=3, max_bytes=6)
    assert [[r[0] for r in p] for p in pieces] == [[1, 2], [3], [4], [5, 6, 7], [8]]  # 10 bytes: alone
    assert copy_pieces([], entries=3, max_bytes=6) == []


def test_an_append_too_large_for_one_copy_is_copied_and_the_home_reopens(home):
    n = 8_000  # about 16 MB of payloads: past what one copy can take within the 64 MB cap
    with Journal.open(home) as journal:
        entries = journal.append_many(_drafts(n))
        assert len(copy_pieces([e.as_row() for e in entries])) > 1
        assert sum(len(e.as_row()[5]) for e in entries) > 5 * COPY_PIECE_BYTES
        assert [e.seq for e in journal.entries(since_seq=n - 3)] == [n - 2, n - 1, n]  # waits for the copy
        assert verify_journal(journal).ok
        expected = {e.seq: e.hash for e in entries}
    assert _db(home, "SELECT count(*), max(seq) FROM entries") == [(n, n)]
    assert _db(home, "SELECT size FROM frontier") == [(n,)]
    assert _db(home, "SELECT count(*) FROM calls") == [(n,)]  # every call's row, from every piece
    with Journal.open(home) as journal:
        assert journal.head() == (n, expected[n])
        got = {e.seq: e.hash for e in journal.entries()}
        assert got == expected
        assert verify_journal(journal).ok
        assert journal.append("plan", {"after": True}).seq == n + 1
    assert verify_home(home).ok


def test_a_kill_between_two_pieces_is_finished_by_the_next_open(home):
    n = 2_000
    script = textwrap.dedent(f"""
        import json
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal, store
        store.COPY_PIECE_BYTES = 256 * 1024  # about 120 entries a piece
        drafts = [("tool_call", {{"tool": "read", "call_id": f"a-{{i}}", "arguments": {{"x": "y" * {PAYLOAD}}}}},
                   f"run-a-{{i // 50}}", "clerk") for i in range({n})]
        journal = Journal.open(Home.at({str(home.path)!r}))
        entries = journal.append_many(drafts)
        print(json.dumps([[e.seq, e.hash.hex()] for e in entries]), flush=True)
        journal.entries(limit=1)  # waits for the copy: the fault point kills it after its first piece
        print("survived", flush=True)
    """)
    env = {**os.environ, "APOLLIA_FAULT": "journal.after_piece:kill"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == -signal.SIGKILL, (out.stdout[-300:], out.stderr[-2000:])
    assert "survived" not in out.stdout
    # One piece committed with its own frontier: a consistent prefix, the rest only in the log.
    [(stored, top)] = _db(home, "SELECT count(*), max(seq) FROM entries")
    assert 0 < stored < n and top == stored
    assert _db(home, "SELECT size FROM frontier") == [(stored,)]
    assert verify_home(home).ok  # offline: journal.db and what the log holds beyond it
    acknowledged = {seq: h for line in out.stdout.splitlines() if line.startswith("[")
                    for seq, h in json.loads(line)}
    with Journal.open(home) as journal:
        have = {e.seq: e.hash.hex() for e in journal.entries()}
        assert sorted(have) == list(range(1, n + 1))  # the whole append: it was committed in the log
        assert all(have[seq] == h for seq, h in acknowledged.items())
        assert verify_journal(journal).ok
    assert _db(home, "SELECT count(*), max(seq) FROM entries") == [(n, n)]
    assert _db(home, "SELECT size FROM frontier") == [(n,)]
    assert _db(home, "SELECT count(*) FROM calls") == [(n,)]
    assert verify_home(home).ok
