"""Verifying a closed journal as its rows are stored: the verdict of the seq order, in bounded memory.

``audit verify`` on a home nobody holds reads ``journal.db`` once, as stored, without a sort;
only when that pass does not verify are the rows read again in seq order. Whatever order the
rows are stored in, whatever is wrong with them and however large a row is, the report is the
one the seq order gives; and the command's peak memory does not grow with the journal.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import apollia_nb
from apollia_nb.home import Home
from apollia_nb.journal import Draft, Journal, verify_home
from apollia_nb.journal import verify as verify_module
from apollia_nb.journal.export import export_home
from apollia_nb.journal.keys import key_id, load_public_key
from apollia_nb.journal.verify import VerifyReport, verify_bundle, verify_rows


def _sql(home: Home, *statements: str) -> None:
    con = duckdb.connect(str(home.journal_db))
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def _rewritten(home: Home, order: str) -> None:
    """Rewrite ``entries`` with its rows stored in ``order`` and without its key (so an edit may
    duplicate a seq or leave none), as a restore or a hostile edit might leave it."""
    con = duckdb.connect(str(home.journal_db))
    try:
        for (view,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
            con.execute(f'DROP VIEW "{view}"')  # they read entries; the verifier does not need them
        con.execute(f"CREATE TABLE shuffled AS SELECT * FROM entries ORDER BY {order}")
        con.execute("DROP TABLE entries")
        con.execute("ALTER TABLE shuffled RENAME TO entries")
        seqs = [s for (s,) in con.execute("SELECT seq FROM entries").fetchall()]
    finally:
        con.close()
    assert (seqs == sorted(seqs)) is (order == "seq")


def _in_seq_order(home: Home) -> VerifyReport:
    """The report of the rows of ``journal.db`` put in seq order here (below 1 first, none last), in one pass."""
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        rows = con.execute(f"SELECT {verify_module._COLUMNS} FROM entries").fetchall()
        origin = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()[0]
        stored = [(int(s), bytes(r), n) for s, r, n in
                  con.execute("SELECT size, root, note FROM checkpoints ORDER BY size").fetchall()]
    finally:
        con.close()
    rows.sort(key=lambda r: (2, 0) if r[0] is None else (0, r[0]) if r[0] < 1 else (1, r[0]))
    size = verify_module.CHUNK  # where a failure stops the scan: the checkpoints checked before it
    return verify_rows([rows[i:i + size] for i in range(0, len(rows), size)], public_key=load_public_key(home),
                       origin=origin, checkpoints=stored, total=len(rows))


@pytest.fixture
def journal_home(home):
    """A closed journal of 360 entries with checkpoints inside it (at 120 and 240) and at its end."""
    with Journal.open(home) as journal:
        for part in range(3):
            journal.append_many(Draft("plan", {"i": i, "part": part}, f"run-{part}", "clerk") for i in range(120))
            if part < 2:
                journal.checkpoint()
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        assert [s for (s,) in con.execute("SELECT size FROM checkpoints ORDER BY size").fetchall()] == [
            120, 240, 360]
    finally:
        con.close()
    return home


# What a hostile editor of journal.db might do, each applied to a copy stored in seq order and to
# one stored out of it, with what the seq order finds first (None: the journal verifies).
EDITS = {
    "intact": ((), None),
    "the first entry stored last": ((
        "CREATE TEMP TABLE first AS SELECT * FROM entries WHERE seq = 1", "DELETE FROM entries WHERE seq = 1",
        "INSERT INTO entries SELECT * FROM first"), None),
    "payload changed": (("UPDATE entries SET payload = '{\"i\":1}'::BLOB WHERE seq = 200",),
                        (200, "entry 200: hash does not match its contents")),
    "signature of another entry": ((
        "UPDATE entries SET signature = (SELECT signature FROM entries WHERE seq = 7) WHERE seq = 130",),
        (130, "entry 130: signature does not verify under the journal key")),
    "entry deleted": (("DELETE FROM entries WHERE seq = 55",), (55, "entry 55 is missing (the next entry has seq 56)")),
    "last entries deleted": (("DELETE FROM entries WHERE seq > 300",), (
        301, "entry 301 is missing: stored checkpoint of size 360 covers 360 entries, the journal holds 300")),
    "entry duplicated": (("INSERT INTO entries SELECT * FROM entries WHERE seq = 90",),
                         (90, "entry 90 appears more than once")),
    "seqs of two entries swapped": ((
        "UPDATE entries SET seq = -seq WHERE seq IN (40, 41)",
        "UPDATE entries SET seq = CASE seq WHEN -40 THEN 41 ELSE 40 END WHERE seq < 0"),
        (40, "entry 40: prev_hash does not match the hash of entry 39")),
    "an entry without a seq": (("UPDATE entries SET seq = NULL WHERE seq = 300",),
                               (300, "entry 300 is missing (the next entry has seq 301)")),
    "an entry with seq 0": (("UPDATE entries SET seq = 0 WHERE seq = 1",), (0, "entry 0 appears more than once")),
    "key id changed": (("UPDATE entries SET key_id = 'ed25519:0000' WHERE seq = 260",), (
        260, "entry 260: key id 'ed25519:0000' is not the journal key {key_id}")),
    "checkpoint root changed": ((("UPDATE checkpoints SET root = (SELECT root FROM checkpoints WHERE size = 120) "
                                  "WHERE size = 240"),),
                                (None, "stored checkpoint of size 240: the checkpoints row does not match its signed note")),
    "checkpoint row and note of another size": (((
        "UPDATE checkpoints SET root = (SELECT root FROM checkpoints WHERE size = 120), "
        "note = (SELECT note FROM checkpoints WHERE size = 120) WHERE size = 240"),),
        (None, "stored checkpoint of size 240: the checkpoints row does not match its signed note")),
}


def _prepared(journal_home: Home, tmp_path, name: str, edit: tuple[str, ...], *, shuffled: bool) -> Home:
    path = tmp_path / f"{name.replace(' ', '-')}-{'shuffled' if shuffled else 'in-order'}"
    shutil.copytree(journal_home.path, path)
    home = Home.at(path)
    _rewritten(home, "hash" if shuffled else "seq")
    if edit:
        _sql(home, *edit)
    return home


@pytest.mark.parametrize("name", list(EDITS))
def test_the_verdict_is_that_of_the_seq_order_whatever_order_the_rows_are_stored_in(journal_home, tmp_path, name):
    edit, found = EDITS[name]
    reports = []
    for shuffled in (False, True):
        home = _prepared(journal_home, tmp_path, name, edit, shuffled=shuffled)
        reports.append((verify_home(home), _in_seq_order(home)))
    (in_order, reference), (out_of_order, shuffled_reference) = reports
    assert in_order == reference == out_of_order == shuffled_reference
    if found is None:
        assert (in_order.ok, in_order.entries, in_order.checked_checkpoints) == (True, 360, 3)
        return
    assert in_order.ok is False
    seq, problem = found
    assert (in_order.first_bad_seq, in_order.problem) == (seq, problem.format(key_id=key_id(load_public_key(home))))


def test_rows_larger_than_the_first_pass_holds_verify_and_are_checked(home, tmp_path):
    # Payloads of about 2 MB each: more than the stored-order pass lets DuckDB hold, so the rows
    # are read again in seq order, in a new snapshot of the same read-only file.
    big = {"x": base64.b64encode(os.urandom(1_500_000)).decode()}
    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(20))
        journal.append_many(Draft("tool_result", big) for _ in range(3))
        journal.append_many(Draft("plan", {"i": i}) for i in range(20))
    assert verify_home(home) == VerifyReport(True, 43, None, None, 1)
    shutil.copytree(home.path, tmp_path / "changed")
    changed = Home.at(tmp_path / "changed")
    _sql(changed, "DROP VIEW IF EXISTS journal", "DROP VIEW IF EXISTS decisions", "DROP VIEW IF EXISTS tool_calls",
         "DROP VIEW IF EXISTS runs", "UPDATE entries SET payload = payload || 'x'::BLOB WHERE seq = 22")
    report = verify_home(changed)
    # A salted (format 2) payload with a byte appended no longer holds together; either way entry 22 is named.
    assert (report.ok, report.first_bad_seq) == (False, 22)
    assert report.problem.startswith(("entry 22: hash does not match its contents",
                                      "entry 22: its salted payload does not hold together: Extra data"))
    assert report == _in_seq_order(changed)


def test_a_bundle_whose_entries_file_is_out_of_seq_order_gets_the_seq_orders_verdict(journal_home, tmp_path):
    bundle = tmp_path / "bundle"
    export_home(journal_home, bundle)
    expected = verify_bundle(bundle)
    assert expected.ok and expected.entries == 360
    entries = bundle / "entries.parquet"
    con = duckdb.connect()
    try:
        con.execute(f"COPY (SELECT * FROM read_parquet('{entries}') ORDER BY hash) TO '{tmp_path / 'e.parquet'}' "
                    "(FORMAT parquet)")
        os.replace(tmp_path / "e.parquet", entries)
        assert [s for (s,) in con.execute(f"SELECT seq FROM read_parquet('{entries}')").fetchall()] != list(
            range(1, 361))
        con.execute(f"COPY (SELECT * REPLACE (CASE WHEN seq = 77 THEN 'x'::BLOB ELSE payload END AS payload) "
                    f"FROM read_parquet('{entries}')) TO '{tmp_path / 'e.parquet'}' (FORMAT parquet)")
    finally:
        con.close()
    assert verify_bundle(bundle) == expected
    os.replace(tmp_path / "e.parquet", entries)
    report = verify_bundle(bundle)
    assert (report.ok, report.first_bad_seq, report.problem) == (False, 77, "entry 77: hash does not match its contents")


def _journal(home: Home, entries: int) -> None:
    with Journal.open(home) as journal:
        for start in range(0, entries, 5_000):
            journal.append_many(Draft("plan", {"i": i, "text": "x" * 150}, f"run-{i // 500}", "clerk")
                                for i in range(start, min(start + 5_000, entries)))


def _peak_rss_mb(home: Home) -> float:
    """Peak RSS of ``apollia-os audit verify`` as a fresh process, measured by a small runner of its own."""
    code = ("import resource, subprocess, sys\n"
            "out = subprocess.run([sys.executable, '-m', 'apollia_nb', 'audit', 'verify', '--home', sys.argv[1]],"
            " capture_output=True, text=True)\n"
            "assert out.returncode == 0 and out.stdout.startswith('ok: '), out.stdout + out.stderr\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    root = str(Path(apollia_nb.__file__).resolve().parent.parent)  # this tree's package, as the workers run
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", code, str(home.path)], capture_output=True, text=True, check=True,
                         env=env)
    return int(out.stdout) / 1024


@pytest.mark.slow
def test_audit_verify_peak_memory_does_not_grow_with_the_journal(tmp_path):
    # Both journals are checked by signature workers; six times the entries, about the same memory
    # (reading every row of a range sorted at once held about 1.45 times as much).
    small, large = Home.at(tmp_path / "small"), Home.at(tmp_path / "large")
    _journal(small, 10_000)
    _journal(large, 60_000)
    assert 10_000 >= verify_module.PARALLEL_MIN
    small_mb, large_mb = _peak_rss_mb(small), _peak_rss_mb(large)
    assert large_mb <= 1.2 * small_mb, (small_mb, large_mb)


def test_a_merkle_accumulator_extended_by_many_leaves_is_the_one_appended_one_by_one():
    from apollia_nb.errors import BadInput
    from apollia_nb.journal.merkle import MerkleAccumulator, leaf_hash, root

    leaves = [leaf_hash(bytes([i % 256]) * 32) for i in range(1, 301)]
    for cut in (0, 1, 7, 128, 255, 300):
        one_by_one, extended = MerkleAccumulator(), MerkleAccumulator()
        for leaf in leaves[:cut]:
            one_by_one.append(leaf)
        extended.extend(leaves[:min(5, cut)])
        extended.extend(leaves[min(5, cut):cut])
        assert (extended.size, extended.hashes, extended.root()) == (cut, one_by_one.hashes, root(leaves[:cut]))
    acc = MerkleAccumulator.from_leaf_hashes(leaves[:3])
    for bad in ([leaves[3], b"short"], [leaves[3], bytearray(32)], [None]):
        with pytest.raises(BadInput):
            acc.extend(bad)  # type: ignore[arg-type]
        assert (acc.size, acc.root()) == (3, root(leaves[:3]))  # nothing added
