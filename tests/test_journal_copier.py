"""The copier: committed entries reach journal.db on a thread of their own.

The writer acknowledges an append once its record of journal.log is synced; a second
thread copies committed entries into journal.db meanwhile. So a commit never waits for a
copy (unless the log is full), a read waits for the copy of everything committed before
it, and a kill -9 in the middle of a background copy loses nothing acknowledged.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import duckdb
import pytest

from apollia_nb.journal import Journal, verify_journal
from apollia_nb.journal import tail as tail_module
from apollia_nb.journal.store import IMPORT_BATCH
from apollia_nb.journal.tail import read_tail
from apollia_nb.journal.verify import verify_home


def _db(home, sql: str):
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


class _HeldCopy:
    """Holds the journal's next copy into journal.db inside its transaction until released."""

    def __init__(self, journal: Journal, monkeypatch) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        real = journal._insert

        def held(rows):
            self.threads.append(threading.current_thread().name)
            self.started.set()
            assert self.release.wait(30), "the copy was never released"
            return real(rows)

        monkeypatch.setattr(journal, "_insert", held)


def _batch(n: int, tag: str):
    return [("plan", {"n": i, "tag": tag}, "run-1", "clerk") for i in range(n)]


def test_commits_go_on_while_a_copy_is_in_progress(home, monkeypatch):
    with Journal.open(home) as journal:
        held = _HeldCopy(journal, monkeypatch)
        try:
            journal.append_many(_batch(IMPORT_BATCH, "first"))  # a full batch: the copy starts
            assert held.started.wait(10), "no copy started after a full batch"
            # The copy is held inside journal.db's transaction; appends are acknowledged all the same.
            later = [journal.append_soon("plan", {"n": i}, run_id="run-1").result(timeout=5)[0] for i in range(20)]
            assert [e.seq for e in later] == list(range(IMPORT_BATCH + 1, IMPORT_BATCH + 21))
            assert [r[0] for r in read_tail(home.journal_db.with_suffix(".log")).rows][-1] == later[-1].seq
        finally:
            held.release.set()
        assert held.threads[0] != f"journal-writer:{journal.path}"
        # A read waits for the copy of everything committed before it.
        assert [e.seq for e in journal.entries()] == list(range(1, IMPORT_BATCH + 21))
        assert verify_journal(journal).ok
    assert _db(home, "SELECT count(*), max(seq) FROM entries") == [(IMPORT_BATCH + 20, IMPORT_BATCH + 20)]
    assert _db(home, "SELECT size FROM frontier") == [(IMPORT_BATCH + 20,)]


def test_a_read_waits_for_a_copy_in_progress_and_sees_every_committed_entry(home, monkeypatch):
    with Journal.open(home) as journal:
        held = _HeldCopy(journal, monkeypatch)
        journal.append_many(_batch(IMPORT_BATCH, "first"))
        assert held.started.wait(10)
        tail = journal.append("plan", {"n": "after"}, run_id="run-1")  # committed during the copy
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.extend(e.seq for e in journal.entries(since_seq=500)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not seen  # the read waits: journal.db does not hold everything yet
        held.release.set()
        reader.join(10)
        assert seen == list(range(501, tail.seq + 1))
        # A checkpoint signed meanwhile describes the committed prefix and is stored by the copier.
        note = journal.checkpoint()
        assert journal.checkpoints()[-1][2] == note and journal.checkpoints()[-1][0] == tail.seq


def test_closing_during_a_copy_finishes_it_and_leaves_no_log(home, monkeypatch):
    journal = Journal.open(home)
    held = _HeldCopy(journal, monkeypatch)
    journal.append_many(_batch(IMPORT_BATCH, "first"))
    assert held.started.wait(10)
    last = journal.append("plan", {"n": "last"})
    closer = threading.Thread(target=journal.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # close waits for the copy, then copies the rest
    held.release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert not home.journal_db.with_suffix(".log").exists()
    assert _db(home, "SELECT max(seq) FROM entries") == [(last.seq,)]
    assert _db(home, "SELECT max(size) FROM checkpoints") == [(last.seq,)]
    assert verify_home(home).ok


def test_a_full_log_waits_for_the_copy_then_starts_over(home, monkeypatch):
    monkeypatch.setattr(tail_module, "PREALLOCATE", 8192)
    with Journal.open(home) as journal:
        entries = [journal.append("plan", {"n": i, "text": "x" * 200}) for i in range(60)]
        assert [e.hash for e in journal.entries()] == [e.hash for e in entries]
        assert read_tail(home.journal_db.with_suffix(".log")).rows[0][0] > 1  # started over
        assert verify_journal(journal).ok


def _crash_during_background_copy(home, point: str) -> tuple[list[list], str]:
    """A child appends all but one entry of a batch, then one entry at a time, printing each
    acknowledged (seq, hash), until the fault point in the copier kills it: the copier starts
    the copy once the batch is full (no idle copies) while the writer goes on committing."""
    script = textwrap.dedent(f"""
        import json
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal, store
        store.IMPORT_IDLE_SECS = 3600.0  # only the full batch starts the copy
        journal = Journal.open(Home.at({str(home.path)!r}))
        first = journal.append_many([("plan", {{"n": i}}, "run-1", "clerk") for i in range({IMPORT_BATCH - 1})])
        print(json.dumps([[e.seq, e.hash.hex()] for e in first]), flush=True)
        for i in range(20000):  # no read: only the copier's own batch copy reaches the fault point
            e = journal.append("plan", {{"more": i}}, run_id="run-1", agent="clerk")
            print(json.dumps([[e.seq, e.hash.hex()]]), flush=True)
        print("survived", flush=True)
    """)
    env = {**os.environ, "APOLLIA_FAULT": f"{point}:kill"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == -signal.SIGKILL, (out.stdout[-300:], out.stderr)
    assert "survived" not in out.stdout
    acknowledged: list[list] = []
    for line in out.stdout.splitlines():
        try:
            acknowledged.extend(json.loads(line))
        except json.JSONDecodeError:  # the last line, cut by the kill: acknowledged, not counted here
            pass
    return acknowledged, out.stdout


@pytest.mark.parametrize("point", ["journal.before_frontier", "journal.after_copy"])
def test_a_kill_in_the_middle_of_a_background_copy_loses_nothing_acknowledged(home, point):
    acknowledged, _ = _crash_during_background_copy(home, point)
    assert len(acknowledged) >= IMPORT_BATCH - 1
    (stored,) = _db(home, "SELECT count(*) FROM entries")[0]
    [(frontier_size,)] = _db(home, "SELECT size FROM frontier")
    if point == "journal.before_frontier":
        assert stored == 0 and frontier_size == 0  # the copy was not committed, nor its frontier
    else:
        assert stored >= IMPORT_BATCH and frontier_size == stored  # committed together
    assert verify_home(home).ok  # offline: journal.db and what the log holds beyond it
    with Journal.open(home) as journal:
        have = {e.seq: e.hash.hex() for e in journal.entries()}
        assert all(have.get(seq) == h for seq, h in acknowledged)
        assert journal.head()[0] >= acknowledged[-1][0]
        assert verify_journal(journal).ok
        assert journal.append("plan", {"n": "after"}).seq == journal.head()[0]
    assert verify_home(home).ok


def test_a_log_half_full_is_copied_before_it_fills(home, monkeypatch):
    """No full batch and no idle time: once half the log is used, the copier copies anyway, so
    the log can start over when full without the writer waiting for a copy."""
    from apollia_nb.journal import store as store_module

    monkeypatch.setattr(tail_module, "PREALLOCATE", 64 * 1024)
    monkeypatch.setattr(store_module, "IMPORT_IDLE_SECS", 3600.0)
    with Journal.open(home) as journal:
        log = journal._tail
        n = 0
        while 2 * log.length < log.capacity:
            assert journal.stats["imports"] == 0
            journal.append("plan", {"n": n, "text": "x" * 1000})
            n += 1
        assert n < IMPORT_BATCH
        deadline = time.monotonic() + 10
        while journal.stats["imports"] == 0:
            assert time.monotonic() < deadline, "the half-full log was not copied"
            time.sleep(0.01)
        assert [e.seq for e in journal.entries()] == list(range(1, n + 1))


def test_a_checkpoint_is_signed_between_commits_and_stored_without_holding_the_writer(home, monkeypatch):
    with Journal.open(home) as journal:
        held = _HeldCopy(journal, monkeypatch)
        journal.append_many(_batch(IMPORT_BATCH, "first"))
        assert held.started.wait(10)
        stored = journal._submit(None, journal._sign_checkpoint).result(timeout=5)  # signed by the writer
        assert not stored.done()  # its store waits behind the copy the copier is making ...
        after = journal.append_soon("plan", {"n": "after"}, run_id="run-1").result(timeout=5)[0]  # ... not the writer
        held.release.set()
        notes = [stored.result(timeout=10)]
        [(size, _root, note)] = journal.checkpoints()
        assert notes == [note] and size == IMPORT_BATCH < after.seq  # the prefix committed when it was signed
        assert journal.inclusion_proof(IMPORT_BATCH, note).tree_size == IMPORT_BATCH


def _running_query(cursor):
    """Start a query on ``cursor`` in a thread that runs until interrupted; the event is set once it runs."""
    running, outcome = threading.Event(), []

    def mark(x):
        running.set()
        return x

    cursor.create_function("mark", mark, ["BIGINT"], "BIGINT")

    def query():
        try:  # mark(0) is called once, as DuckDB plans the query (it folds the constant); the scan is DuckDB's own
            cursor.execute("SELECT count(*) FROM range(100000000000) t(x) WHERE x >= mark(0)").fetchall()
        except duckdb.Error as exc:
            outcome.append(exc)

    thread = threading.Thread(target=query, daemon=True)
    thread.start()
    assert running.wait(10), "the query never ran"
    return thread, outcome


def _beside_a_running_query(journal, action) -> None:
    """Run ``action`` while a query runs on a cursor ``journal.cursor()`` handed out; the query must
    end interrupted (DuckDB's ``InterruptException``)."""
    cursor = journal.cursor()
    thread, outcome = _running_query(cursor)
    try:
        action()
    finally:
        with contextlib.suppress(duckdb.Error):  # (a failing action must not leave the query running)
            cursor.interrupt()
    thread.join(10)
    assert not thread.is_alive() and isinstance(outcome[0], duckdb.InterruptException)


def test_closing_while_a_handed_out_cursor_runs_a_query_interrupts_it_and_closes(home):
    journal = Journal.open(home)
    last = journal.append("plan", {"n": 1})
    _beside_a_running_query(journal, journal.close)  # DuckDB refuses to close a busy connection: close interrupts
    with pytest.raises(Exception, match="journal .* is closed"):
        journal.cursor()
    with Journal.open(home) as again:  # closed for real: it opens again, nothing lost
        assert again.head()[0] == last.seq and verify_journal(again).ok


def test_reopening_while_a_handed_out_cursor_runs_a_query_interrupts_it_and_the_journal_goes_on(home):
    # DuckDB invalidates journal.db when a write it could not finish fails (a full disk); the copier then
    # opens it again. A query still running on a cursor handed out by cursor() (an auditor's, a verify's)
    # kept the old connection open, so the reopen failed and every later copy, read and close failed with it.
    journal = Journal.open(home)
    first = journal.append("plan", {"n": 1})
    _beside_a_running_query(journal, journal._reopen)  # what the copier runs after an invalidating failure
    second = journal.append("plan", {"n": 2})
    assert journal.sql("SELECT seq FROM entries ORDER BY seq") == [(first.seq,), (second.seq,)]
    with journal.cursor() as fresh:
        assert fresh.execute("SELECT count(*) FROM entries").fetchone() == (2,)
    journal.close()
    with Journal.open(home) as again:
        assert again.head()[0] == second.seq and verify_journal(again).ok


def test_closing_during_a_verify_stops_the_verify_not_the_close(home, monkeypatch):
    from apollia_nb.journal import verify as verify_module

    journal = Journal.open(home)
    journal.append_many(_batch(50, "v"))
    reading, result, held = threading.Event(), [], []
    real = verify_module._verify_connection

    def slow(cursor, **kw):  # the verify holds its cursor, as one over a large journal does
        held.append(cursor)
        thread, outcome = _running_query(cursor)
        reading.set()
        thread.join(30)
        raise outcome[0]

    monkeypatch.setattr(verify_module, "_verify_connection", slow)

    def run():
        try:
            result.append(verify_journal(journal))
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            result.append(exc)

    verifier = threading.Thread(target=run)
    verifier.start()
    assert reading.wait(10)
    try:
        journal.close()
    finally:
        with contextlib.suppress(duckdb.Error):
            held[0].interrupt()
    verifier.join(10)
    assert isinstance(result[0], duckdb.InterruptException)  # an error, never a report
    monkeypatch.setattr(verify_module, "_verify_connection", real)
    assert verify_home(home).ok
