"""Erased bytes leave the files: DuckDB files compacted from their live rows, ``journal.log`` rewritten.

Real DuckDB files, real journals and runtimes, real processes killed at the scrub's fault points
(``APOLLIA_FAULT``); every absence is proved by ``scan_home`` over every file of the home.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from apollia_nb.dbutil import connect_locked
from apollia_nb.errors import BadInput, Conflict, HomeFileCorrupt, HomeLocked, IntegrityError
from apollia_nb.home import Home
from apollia_nb.journal.scrub import compact_duckdb, leftovers, rewrite_log, scrub_home, scrub_path
from apollia_nb.journal.store import Journal
from apollia_nb.journal.tail import MAGIC, encode_rows, read_tail, tail_path
from apollia_nb.journal.verify import verify_home
from scan_home import assert_absent, find_everywhere, needle_forms

CANARY = "canary-Zq81-Jürgen-\"quoted\"-7f3a"


def _bytes_in(path: Path, needle: str) -> bool:
    return needle.encode() in path.read_bytes()


def _child(script: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_FAULT"}
    if fault:
        env["APOLLIA_FAULT"] = fault
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], check=False, capture_output=True, text=True,
                          timeout=120, env=env)


# ------------------------------------------------------------------------------ the scanner itself
def test_the_scanner_finds_a_needle_in_every_form_a_home_file_can_hold(tmp_path):
    home = tmp_path / "home"
    (home / "exports").mkdir(parents=True)
    text = CANARY.encode()
    # base64 inside a longer text, at each of the three alignments (as journal.log's payloads)
    for shift in range(3):
        (home / f"b64-{shift}.txt").write_bytes(b"xx" + base64.b64encode(b"p" * shift + text + b"tail") + b"xx")
    (home / "escaped.json").write_text(json.dumps({"v": CANARY}))  # ensure_ascii: J\u00fcrgen, \"quoted\"
    (home / "wide.txt").write_bytes(CANARY.encode("utf-16-le"))
    (home / "exports" / "dump.gz").write_bytes(gzip.compress(text * 3))
    found = {(hit.file.name, hit.form.split(" of ")[0], hit.where) for hit in find_everywhere(home, CANARY)}
    for shift in range(3):
        assert any(f == f"b64-{shift}.txt" and form.startswith("base64@") for f, form, _ in found), found
    assert ("escaped.json", "json", "") in found
    assert ("wide.txt", "utf-16-le", "") in found
    assert ("dump.gz", "raw", "gzip member") in found
    with pytest.raises(AssertionError, match="escaped.json"):
        assert_absent(home, CANARY)
    with pytest.raises(ValueError):
        needle_forms(b"short")


def test_the_scanner_reads_compressed_duckdb_and_parquet_values_row_by_row(tmp_path):
    """A value DuckDB or Parquet compressed away from the file's bytes is still found, as a live value."""
    home = tmp_path / "home"
    home.mkdir()
    con = duckdb.connect(str(home / "some.db"))
    con.execute("PRAGMA force_compression = 'dict_fsst'")  # one of DuckDB's own choices for text
    con.execute("CREATE TABLE t (id INTEGER, v VARCHAR)")
    con.execute("INSERT INTO t SELECT i, lpad((i % 50)::VARCHAR, 5, '0') || ' ' || ? || ' ' || "
                "lpad((i * 7919 % 10007)::VARCHAR, 5, '0') FROM range(20000) AS r(i)", [CANARY])
    con.execute("CHECKPOINT")
    # a long prefix keeps the value out of the Parquet statistics (min/max): only compressed pages hold it
    con.execute(f"COPY (SELECT id, repeat('p', 400) || (id % 3)::VARCHAR || v AS v FROM t) "
                f"TO '{home / 'export.parquet'}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()
    for name in ("some.db", "export.parquet"):
        assert not _bytes_in(home / name, CANARY)  # a byte scan alone would call it absent
    hits = find_everywhere(home, CANARY)
    assert any(h.file.name == "some.db" and h.where == "table t, column v, row 0" for h in hits), hits[:5]
    assert any(h.file.name == "export.parquet" and h.where.startswith("parquet, column v") for h in hits)


def test_the_scanner_decodes_journal_log_payloads_and_reports_links_out_of_the_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    payload = json.dumps({"v": CANARY}, ensure_ascii=False).encode()
    row = (1, "2026-01-01T00:00:00.000000Z", None, None, "plan", payload, bytes(32), bytes(32), bytes(64), "k")
    (home / "journal.log").write_bytes(encode_rows([row]) + bytes(8))
    outside = tmp_path / "outside.txt"
    outside.write_text("nothing")
    (home / "link").symlink_to(outside)
    hits = find_everywhere(home, CANARY)
    assert any(h.where == "log entry 1, payload" and h.form == "json-utf8" for h in hits), hits
    assert any(h.file.name == "journal.log" and h.form.startswith("base64@") for h in hits)
    assert any(h.form == "symlink" for h in hits)


# ------------------------------------------------------------------------------ compact_duckdb
def _canary_file(path: Path) -> None:
    """A DuckDB file whose live rows no longer hold the canary, though its bytes do: one row deleted,
    one updated (its old version), one in a table dropped; then CHECKPOINT, FORCE CHECKPOINT, VACUUM."""
    con = connect_locked(path)
    con.execute("CREATE TABLE kept (id INTEGER PRIMARY KEY, b BLOB NOT NULL, v VARCHAR)")
    con.execute("CREATE TABLE gone (v VARCHAR)")
    con.execute("CREATE VIEW kept_view AS SELECT id, v FROM kept")
    con.execute("INSERT INTO kept SELECT i, ('row-' || i || '-' || repeat('x', 40))::BLOB, "
                "'text ' || i || repeat('y', 40) FROM range(3000) AS r(i) WHERE i NOT IN (10, 20)")
    con.execute("INSERT INTO kept VALUES (10, ?, 'plain'), (20, 'plain', ?)",
                [f"blob {CANARY} a".encode(), f"varchar {CANARY} b"])
    con.execute("INSERT INTO gone VALUES (?)", [f"dropped {CANARY} c"])
    con.close()
    con = connect_locked(path)
    con.execute("DELETE FROM kept WHERE id = 10")
    con.execute("UPDATE kept SET v = 'updated' WHERE id = 20")
    con.execute("DROP TABLE gone")
    for statement in ("CHECKPOINT", "FORCE CHECKPOINT", "VACUUM"):
        con.execute(statement)
    con.close()


def test_checkpoint_and_vacuum_leave_deleted_bytes_that_compaction_removes(tmp_path):
    path = tmp_path / "data.db"
    _canary_file(path)
    os.chmod(path, 0o600)
    assert _bytes_in(path, CANARY)  # what DuckDB 2.0 leaves after a delete, an update, a drop and all three
    assert not [h for h in find_everywhere(tmp_path, CANARY) if h.offset is None]  # no live row holds it
    con = duckdb.connect(str(path))
    catalog = con.execute("SELECT table_name, sql FROM duckdb_tables() UNION ALL "
                          "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()
    live = con.execute("SELECT * FROM kept ORDER BY id").fetchall()
    con.close()

    done = compact_duckdb(path)

    assert_absent(tmp_path, CANARY)
    assert done.rows == {"kept": 2999} and done.bytes_after <= done.bytes_before
    assert (path.stat().st_mode & 0o777) == 0o600 and not leftovers(path)
    con = connect_locked(path)
    try:
        assert con.execute("SELECT table_name, sql FROM duckdb_tables() UNION ALL SELECT view_name, sql FROM "
                           "duckdb_views() WHERE NOT internal ORDER BY 1").fetchall() == catalog
        assert con.execute("SELECT * FROM kept ORDER BY id").fetchall() == live
        with pytest.raises(duckdb.ConstraintException):  # the primary key came along
            con.execute("INSERT INTO kept VALUES (1, 'b', 'dup')")
        [(tags,)] = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = 'data'").fetchall()
        assert tags["storage_version"] == "v1.4.0+"  # the storage format it had: older clients still open it
    finally:
        con.close()


def _journal_with_scratch(home: Home) -> tuple[int, bytes]:
    """A journal of entries and checkpoints, and a canary written into its ``meta`` table and deleted."""
    with Journal.open(home) as journal:
        for i in range(50):
            journal.append("plan", {"n": i, "note": "x" * 30}, run_id="run-1", agent="clerk")
        journal.checkpoint()
        head = journal.head()
    con = connect_locked(home.journal_db)
    con.execute("INSERT INTO meta VALUES ('scratch', ?)", [CANARY])
    con.close()
    con = connect_locked(home.journal_db)
    con.execute("DELETE FROM meta WHERE key = 'scratch'")
    con.close()
    assert _bytes_in(home.journal_db, CANARY)
    return head


def test_a_compacted_journal_opens_verifies_and_goes_on(tmp_path):
    home = Home.at(tmp_path / "home")
    head = _journal_with_scratch(home)
    compact_duckdb(home.journal_db)
    assert_absent(home.path, CANARY)
    report = verify_home(home)
    assert report.ok, report
    with Journal.open(home) as journal:
        assert journal.head() == head
        assert journal.append("plan", {"after": True}).seq == head[0] + 1
        journal.inclusion_proof(3)
    assert verify_home(home).ok


def test_compaction_refuses_a_file_somebody_holds_and_changes_nothing(tmp_path):
    home = Home.at(tmp_path / "home")
    _journal_with_scratch(home)
    with Journal.open(home):
        with pytest.raises(Conflict, match="open in this process"):
            compact_duckdb(home.journal_db)
        with pytest.raises(Conflict):
            rewrite_log(tail_path(home.journal_db), lambda row: row)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from apollia_nb.home import Home
            from apollia_nb.journal.store import Journal
            journal = Journal.open(Home.at({str(home.path)!r}))
            print("open", flush=True)
            sys.stdin.readline()
            journal.close()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(HomeLocked, match=f"process {holder.pid}"):
            compact_duckdb(home.journal_db)
        with pytest.raises(HomeLocked):
            rewrite_log(tail_path(home.journal_db), lambda row: row)
        assert tail_path(home.journal_db).exists()  # the holder's log, left alone
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    assert not leftovers(home.journal_db)
    assert _bytes_in(home.journal_db, CANARY)  # untouched by the refusals
    with pytest.raises(BadInput):
        compact_duckdb(home.path / "nothing.db")


def test_compaction_refuses_a_link_and_a_file_that_is_not_a_database(tmp_path):
    real = tmp_path / "real.db"
    _canary_file(real)
    link = tmp_path / "link.db"
    link.symlink_to(real)
    with pytest.raises(BadInput, match="link"):
        compact_duckdb(link)
    assert link.is_symlink() and _bytes_in(real, CANARY)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database " * 1000)
    with pytest.raises(HomeFileCorrupt, match="junk.db"):
        compact_duckdb(junk)
    assert junk.read_bytes() == b"not a database " * 1000 and not leftovers(junk)


def test_a_file_a_killed_writer_left_with_its_wal_is_compacted_with_what_the_wal_committed(tmp_path):
    """The WAL is replayed into the copy and gone after it: a delete only in the WAL takes the value too."""
    path = tmp_path / "data.db"
    out = _child(f"""
        import os, signal
        from pathlib import Path
        from apollia_nb.dbutil import connect_locked
        con = connect_locked(Path({str(path)!r}))
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v VARCHAR)")
        con.execute("INSERT INTO t VALUES (1, ?), (2, 'kept')", [{CANARY!r}])
        con.execute("CHECKPOINT")
        con.execute("DELETE FROM t WHERE id = 1")
        con.execute("INSERT INTO t VALUES (3, 'after')")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert path.with_name("data.db.wal").exists() and _bytes_in(path, CANARY)
    done = compact_duckdb(path)
    assert done.rows == {"t": 2}
    assert not path.with_name("data.db.wal").exists()
    assert_absent(tmp_path, CANARY)
    con = connect_locked(path, read_only=True)
    try:
        assert con.execute("SELECT * FROM t ORDER BY id").fetchall() == [(2, "kept"), (3, "after")]
    finally:
        con.close()


def test_leftovers_of_an_interrupted_compaction_and_of_a_killed_query_are_removed_by_the_next(tmp_path):
    home = Home.at(tmp_path / "home")
    _journal_with_scratch(home)
    scrub_path(home.journal_db).write_bytes(home.journal_db.read_bytes())  # as a crash before the rename leaves it
    assert [p.name for p in leftovers(home.journal_db)] == ["journal.db.scrub"]
    spill = home.path / "journal.db.tmp"  # DuckDB's spill folder, as a process killed in a large query leaves it
    spill.mkdir()
    (spill / "duckdb_temp_storage_DEFAULT-0.tmp").write_bytes(CANARY.encode() * 100)
    compact_duckdb(home.journal_db)
    assert not leftovers(home.journal_db) and not spill.exists()
    assert_absent(home.path, CANARY)


@pytest.mark.anyio
async def test_runtime_db_compacted_keeps_its_records_and_its_claims(tmp_path):
    """An agent registered again with another manifest: the old manifest's bytes stay in runtime.db
    until compaction; after it the runtime opens with every record and no claimed change missing."""
    from apollia_nb.runtime import Runtime
    from runtime_helpers import call, manifest

    keeper = manifest("keeper", actor=[{"tool_calls": [call("memory_save", key="colour", value="green")]},
                                       {"text": "Saved."}])
    home = tmp_path / "home"
    rt = await Runtime.open(home)
    try:
        await rt.register_agent(keeper + f"# {CANARY}\n")
        handle = await rt.submit("keeper", "Keep it")
        await handle
        assert handle.status == "completed", handle.error
    finally:
        await rt.aclose()  # checkpointed: the manifest is in runtime.db's blocks
    rt = await Runtime.open(home)
    try:
        await rt.register_agent(keeper)  # replaces the row: the live manifest no longer holds it
    finally:
        await rt.aclose()
    runtime_db = home / "runtime.db"

    def records() -> list:
        con = connect_locked(runtime_db, read_only=True)
        try:
            return [con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()
                    for table in ("agents", "tasks", "memory", "home_facts")]
        finally:
            con.close()

    before = records()
    stale = [h for h in find_everywhere(home, CANARY) if h.file.name.startswith("runtime.db")]
    assert stale and all(h.offset is not None for h in stale), stale  # in its bytes, in no live row

    done = scrub_home(Home.at(home), names=("runtime.db",))

    assert [d.path.name for d in done] == ["runtime.db"]
    assert not [h for h in find_everywhere(home, CANARY) if h.file.name.startswith("runtime.db")]
    assert records() == before
    rt = await Runtime.open(home)  # its claims (runtime.db.acks) still match: no HOME_FILE_ROLLED_BACK
    try:
        handle = await rt.submit("keeper", "Keep it again")
        await handle
        assert handle.status == "completed", handle.error
    finally:
        await rt.aclose()


# ------------------------------------------------------------------------------ crash windows
_COMPACT = """
    from pathlib import Path
    from apollia_nb.journal.scrub import compact_duckdb
    compact_duckdb(Path({path!r}))
    print("survived", flush=True)
"""


@pytest.mark.parametrize("point", ["scrub.before_rename", "scrub.after_rename"])
def test_a_compaction_killed_at_its_crash_points_leaves_a_journal_that_opens_and_verifies(tmp_path, point):
    home = Home.at(tmp_path / "home")
    head = _journal_with_scratch(home)
    out = _child(_COMPACT.format(path=str(home.journal_db)), f"{point}:kill")
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert "survived" not in out.stdout
    if point == "scrub.before_rename":  # the old file, and the finished copy not yet renamed
        assert _bytes_in(home.journal_db, CANARY)
        assert [p.name for p in leftovers(home.journal_db)] == ["journal.db.scrub"]
    else:  # the new file
        assert not leftovers(home.journal_db)
        assert_absent(home.path, CANARY)
    assert verify_home(home).ok
    with Journal.open(home) as journal:
        assert journal.head() == head
        journal.append("plan", {"after": point})
    compact_duckdb(home.journal_db)  # the erase run again finishes the job
    assert_absent(home.path, CANARY)
    assert verify_home(home).ok


def test_a_compaction_that_fails_before_the_rename_keeps_the_old_file_and_removes_the_new(tmp_path):
    home = Home.at(tmp_path / "home")
    head = _journal_with_scratch(home)
    out = _child(_COMPACT.format(path=str(home.journal_db)), "scrub.before_rename:full")
    assert out.returncode == 1 and "STORAGE_FULL" in out.stderr, out.stderr[-2000:]
    assert not leftovers(home.journal_db)
    assert _bytes_in(home.journal_db, CANARY)
    with Journal.open(home) as journal:
        assert journal.head() == head


# ------------------------------------------------------------------------------ rewrite_log
def _crashed_with_log(home: Home, entries: int = 6) -> list[list]:
    """A journal process killed with its last entries only in journal.log (no copy into journal.db);
    returns the acknowledged (seq, hash)."""
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 0})
    out = _child(f"""
        import json, os, signal
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal, store
        store.IMPORT_IDLE_SECS = 3600.0
        store.IMPORT_BATCH = 10_000
        journal = Journal.open(Home.at({str(home.path)!r}))
        done = journal.append_many([("plan", {{"n": i, "note": "y" * 20}}, "run-1", "clerk")
                                    for i in range(1, {entries})])
        print(json.dumps([[e.seq, e.hash.hex()] for e in done]), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[0])


def _tear(log: Path, secret: str) -> None:
    """Add what a crash in the middle of a record's write leaves: a header, part of a body holding
    ``secret``, a checksum that fails; zeros after it."""
    data = log.read_bytes()
    end = len(data.rstrip(b"\0"))
    body = json.dumps([[99, "t", None, None, "plan", base64.b64encode(secret.encode()).decode()]]).encode()
    torn = struct.pack(">4sI32s", MAGIC, len(body) + 500, hashlib.sha256(b"other").digest()) + body
    log.write_bytes(data[:end] + torn + bytes(len(data) - end))


def test_rewrite_log_drops_a_torn_write_and_the_journal_still_recovers_its_entries(tmp_path):
    home = Home.at(tmp_path / "home")
    acknowledged = _crashed_with_log(home)
    log = tail_path(home.journal_db)
    _tear(log, CANARY)
    first = read_tail(log)
    assert first.torn and not first.cut
    assert any(h.file.name == "journal.log" for h in find_everywhere(home.path, CANARY))

    done = rewrite_log(log, lambda row: row)

    assert done.rows == len(first.rows) and done.changed == 0 and done.torn_bytes > 0 and done.records >= 1
    again = read_tail(log)
    assert again.rows == first.rows and not again.torn and not again.cut  # the log's own reading holds
    assert_absent(home.path, CANARY)
    assert verify_home(home).ok  # offline: journal.db and the log
    with Journal.open(home) as journal:  # the recovery takes the log's entries
        have = {e.seq: e.hash.hex() for e in journal.entries()}
        assert all(have[seq] == h for seq, h in acknowledged)
    assert verify_home(home).ok


def test_rewrite_log_changes_payloads_keeps_records_and_refuses_any_other_change(tmp_path):
    home = Home.at(tmp_path / "home")
    _crashed_with_log(home)
    log = tail_path(home.journal_db)
    rows = read_tail(log).rows
    seq = rows[-1][0]
    before = log.read_bytes()

    def move(row):
        return (*row[:7], b"\0" * 32, *row[8:]) if row[0] == seq else row

    with pytest.raises(BadInput, match=f"entry {seq}"):
        rewrite_log(log, move)
    assert log.read_bytes() == before and not leftovers(log)

    def erase(row):
        return (*row[:5], b'{"erased":true}', *row[6:]) if row[0] == seq else row

    done = rewrite_log(log, erase)
    assert done.changed == 1 and done.rows == len(rows)
    after = read_tail(log).rows
    assert [r[5] for r in after] == [r[5] if r[0] != seq else b'{"erased":true}' for r in rows]
    assert [r[:5] + r[6:] for r in after] == [r[:5] + r[6:] for r in rows]
    # the current format hashes the payload: the journal refuses the changed entry (the erasure format
    # commits to payloads through salted hashes instead, so its rewrite verifies)
    with pytest.raises(IntegrityError, match=f"entry {seq}"):
        Journal.open(home)


def test_rewrite_log_refuses_a_cut_log_or_a_link_and_leaves_it(tmp_path):
    home = Home.at(tmp_path / "home")
    _crashed_with_log(home)
    log = tail_path(home.journal_db)
    data = log.read_bytes()
    log.write_bytes(data[:len(data.rstrip(b"\0")) - 5])  # the end of the file inside the last record
    cut = log.read_bytes()
    with pytest.raises(IntegrityError, match="cut"):
        rewrite_log(log, lambda row: row)
    assert log.read_bytes() == cut and not leftovers(log)
    assert rewrite_log(tmp_path / "none.log", lambda row: row).rows == 0  # no log: nothing to do
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(cut)
    link = tmp_path / "linked.log"
    link.symlink_to(elsewhere)
    with pytest.raises(BadInput, match="link"):
        rewrite_log(link, lambda row: row)
    assert link.is_symlink() and elsewhere.read_bytes() == cut


_REWRITE = """
    from pathlib import Path
    from apollia_nb.journal.scrub import rewrite_log
    rewrite_log(Path({path!r}), lambda row: row)
    print("survived", flush=True)
"""


@pytest.mark.parametrize("point", ["scrub.log_before_rename", "scrub.log_after_rename"])
def test_a_log_rewrite_killed_at_its_crash_points_leaves_a_log_the_journal_recovers(tmp_path, point):
    home = Home.at(tmp_path / "home")
    acknowledged = _crashed_with_log(home)
    log = tail_path(home.journal_db)
    _tear(log, CANARY)
    out = _child(_REWRITE.format(path=str(log)), f"{point}:kill")
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    if point == "scrub.log_before_rename":  # the old log, torn write and all, and the new one beside it
        assert any(h.file == log for h in find_everywhere(home.path, CANARY))
        assert [p.name for p in leftovers(log)] == ["journal.log.scrub"]
    else:
        assert not leftovers(log)
        assert_absent(home.path, CANARY)
    assert verify_home(home).ok
    rewrite_log(log, lambda row: row)  # run again: finishes (and removes the leftover)
    assert_absent(home.path, CANARY)
    with Journal.open(home) as journal:
        have = {e.seq: e.hash.hex() for e in journal.entries()}
        assert all(have[seq] == h for seq, h in acknowledged)
    assert verify_home(home).ok
