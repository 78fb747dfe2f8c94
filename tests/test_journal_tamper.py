"""Tampering with a closed journal.db, as an attacker with DuckDB would, is detected at the right seq."""

from __future__ import annotations

import base64
import hashlib
import shutil

import duckdb
import pytest
from nacl.signing import SigningKey

from apollia_nb.cli import main
from apollia_nb.home import Home
from apollia_nb.journal import Draft, Journal, verify_home
from apollia_nb.journal.entry import canonical_json, entry_hash

N = 1000
POSITIONS = [1, 500, N]
KINDS = ["run_open", "decision", "answer", "tool_call", "tool_result", "model_response", "plan"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Home, str]:
    """A closed journal of N entries and the checkpoint note exported from it."""
    home = Home.at(tmp_path_factory.mktemp("base") / "home")
    with Journal.open(home, entry_format="1") as journal:  # payloads hashed whole, as the helpers below hash them
        for start in range(0, N, 100):
            journal.append_many(
                Draft(
                    KINDS[i % len(KINDS)],
                    {"i": i, "text": f"entry {i}", "nested": {"ok": i % 2 == 0}},
                    f"run-{i // 50}" if i % 10 else None,
                    "clerk" if i % 3 else None,
                )
                for i in range(start, start + 100)
            )
        note = journal.checkpoint()
    return home, note


def tampered(base_home: Home, tmp_path, *statements: tuple[str, list] | str) -> Home:
    """A copy of the base home with SQL run on its journal.db through a plain connection."""
    home = Home(tmp_path / "copy")
    shutil.copytree(base_home.path, home.path)
    con = duckdb.connect(str(home.journal_db))
    try:
        for statement in statements:
            sql, params = (statement, []) if isinstance(statement, str) else statement
            con.execute(sql, params)
    finally:
        con.close()
    return home


def row(home: Home, seq: int) -> tuple:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute("SELECT * FROM entries WHERE seq = ?", [seq]).fetchone()
    finally:
        con.close()


def test_a_clean_journal_verifies(base):
    home, note = base
    report = verify_home(home, external=note)
    assert report.ok, report
    assert report.entries == N
    assert report.first_bad_seq is None and report.problem is None
    assert report.checked_checkpoints == 2  # the stored one and the given one


_OTHER = hashlib.sha256(b"forged").digest()

# column -> SQL that changes it for the entry at ``?`` (every column of the table)
COLUMN_EDITS = {
    "seq": "UPDATE entries SET seq = 1000000 WHERE seq = ?",
    "ts": "UPDATE entries SET ts = '2001-01-01T00:00:00.000000Z' WHERE seq = ?",
    "run_id": "UPDATE entries SET run_id = CASE WHEN run_id IS NULL THEN 'forged' ELSE NULL END WHERE seq = ?",
    "agent": "UPDATE entries SET agent = CASE WHEN agent = 'mallory' THEN 'eve' ELSE 'mallory' END WHERE seq = ?",
    "kind": "UPDATE entries SET kind = CASE WHEN kind = 'verdict' THEN 'plan' ELSE 'verdict' END WHERE seq = ?",
    "payload": "UPDATE entries SET payload = CAST('{\"forged\":true}' AS BLOB) WHERE seq = ?",
    "prev_hash": f"UPDATE entries SET prev_hash = from_hex('{_OTHER.hex()}') WHERE seq = ?",
    "hash": f"UPDATE entries SET hash = from_hex('{_OTHER.hex()}') WHERE seq = ?",
    "signature": "UPDATE entries SET signature = from_hex(CASE WHEN left(hex(signature), 2) = '00' "
                 "THEN '01' ELSE '00' END || substr(hex(signature), 3)) WHERE seq = ?",
    "key_id": "UPDATE entries SET key_id = '0000000000000000' WHERE seq = ?",
}


def test_every_column_is_edited():
    from apollia_nb.journal.entry import Entry

    assert set(COLUMN_EDITS) == set(Entry.COLUMNS)


@pytest.mark.parametrize("seq", POSITIONS)
@pytest.mark.parametrize("column", list(COLUMN_EDITS))
def test_changing_any_column_fails_at_that_seq(base, tmp_path, column, seq):
    base_home, note = base
    home = tampered(base_home, tmp_path, (COLUMN_EDITS[column], [seq]))
    assert row(home, seq) != row(base_home, seq)  # the edit really changed something
    report = verify_home(home)
    assert not report.ok
    assert report.first_bad_seq == seq, report
    assert str(seq) in report.problem


@pytest.mark.parametrize("seq", POSITIONS)
def test_a_reformatted_but_equal_payload_is_detected(base, tmp_path, seq):
    """Same JSON meaning, other bytes: the verifier hashes bytes, never re-serialises."""
    base_home, _ = base
    con = duckdb.connect(str(base_home.journal_db), read_only=True)
    payload = con.execute("SELECT payload FROM entries WHERE seq = ?", [seq]).fetchone()[0]
    con.close()
    spaced = payload.replace(b",", b", ")
    assert spaced != payload
    home = tampered(base_home, tmp_path, ("UPDATE entries SET payload = ? WHERE seq = ?", [spaced, seq]))
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, seq)
    assert "hash does not match" in report.problem


@pytest.mark.parametrize("seq", POSITIONS)
def test_deleting_an_entry_fails_at_its_seq(base, tmp_path, seq):
    home = tampered(base[0], tmp_path, ("DELETE FROM entries WHERE seq = ?", [seq]))
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, seq)
    assert "missing" in report.problem


def _forged_row(home: Home, seq: int, prev: bytes, key: SigningKey, key_id: str) -> list:
    ts, payload = "2026-01-01T00:00:00.000000Z", canonical_json({"forged": True})
    digest = entry_hash(seq, ts, "run-x", "mallory", "decision", payload, prev)
    return [seq, ts, "run-x", "mallory", "decision", payload, prev, digest, key.sign(digest).signature, key_id]


@pytest.mark.parametrize("seq", [1, 500])
def test_inserting_an_entry_fails_at_the_inserted_seq(base, tmp_path, seq):
    base_home, _ = base
    prev = row(base_home, seq - 1)[7] if seq > 1 else bytes(32)
    key_id = row(base_home, 1)[9]
    forged = _forged_row(base_home, seq, prev, SigningKey.generate(), key_id)
    home = tampered(
        base_home, tmp_path,
        ("UPDATE entries SET seq = seq + 100000 WHERE seq >= ?", [seq]),
        ("UPDATE entries SET seq = seq - 99999 WHERE seq >= 100000", []),
        ("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", forged),
    )
    assert row(home, seq + 1)[7] == row(base_home, seq)[7]
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, seq)


def test_appending_a_forged_entry_fails_at_its_seq(base, tmp_path):
    base_home, _ = base
    last = row(base_home, N)
    forged = _forged_row(base_home, N + 1, last[7], SigningKey.generate(), last[9])
    home = tampered(base_home, tmp_path, ("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", forged))
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, N + 1)
    assert "signature" in report.problem


def test_a_duplicated_entry_fails_at_its_seq(base, tmp_path):
    """Without the primary key an attacker can duplicate a row; the copy is caught."""
    home = tampered(
        base[0], tmp_path,
        "CREATE TABLE e2 AS SELECT * FROM entries",
        "DROP VIEW journal", "DROP VIEW decisions", "DROP VIEW tool_calls", "DROP VIEW runs",
        "DROP TABLE entries",
        "ALTER TABLE e2 RENAME TO entries",
        "INSERT INTO entries SELECT * FROM entries WHERE seq = 300",
    )
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, 300)
    assert "more than once" in report.problem


@pytest.mark.parametrize(("i", "j"), [(1, 2), (200, 700), (999, 1000)])
def test_swapping_two_entries_fails_at_the_first(base, tmp_path, i, j):
    home = tampered(
        base[0], tmp_path,
        (f"UPDATE entries SET seq = CASE seq WHEN {i} THEN {j} + 100000 ELSE {i} + 100000 END "
         "WHERE seq IN (?, ?)", [i, j]),
        ("UPDATE entries SET seq = seq - 100000 WHERE seq > 100000", []),
    )
    assert row(home, i)[7] == row(base[0], j)[7]
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, i)


def test_truncating_the_tail_is_caught_by_the_stored_checkpoint(base, tmp_path):
    home = tampered(base[0], tmp_path, "DELETE FROM entries WHERE seq > 900")
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, 901)
    assert "covers 1000 entries" in report.problem


def test_truncating_the_tail_and_its_checkpoints_is_caught_by_an_exported_checkpoint(base, tmp_path):
    base_home, note = base
    home = tampered(base_home, tmp_path, "DELETE FROM entries WHERE seq > 900", "DELETE FROM checkpoints")
    assert verify_home(home).ok  # the journal alone cannot tell: that is what exported checkpoints are for
    report = verify_home(home, external=note)
    assert (report.ok, report.first_bad_seq) == (False, 901)
    assert "the given checkpoint" in report.problem


def _resign_from(home: Home, seq: int) -> None:
    """What an attacker holding the home's key can do: rewrite entry ``seq`` and re-sign the rest."""
    seed = base64.b64decode((home.keys_dir / "journal.key").read_text())
    key = SigningKey(seed)
    con = duckdb.connect(str(home.journal_db))
    rows = con.execute("SELECT * FROM entries WHERE seq >= ? ORDER BY seq", [seq - 1]).fetchall()
    prev = rows[0][7] if seq > 1 else bytes(32)
    for r in rows[1:] if seq > 1 else rows:
        s, ts, run_id, agent, kind, payload, _, _, _, kid = r
        if s == seq:
            payload = canonical_json({"rewritten": True})
        digest = entry_hash(s, ts, run_id, agent, kind, payload, prev)
        con.execute(
            "UPDATE entries SET payload = ?, prev_hash = ?, hash = ?, signature = ? WHERE seq = ?",
            [payload, prev, digest, key.sign(digest).signature, s],
        )
        prev = digest
    con.execute("DELETE FROM checkpoints")
    con.close()


def test_rewritten_history_with_the_stolen_key_is_caught_by_an_exported_checkpoint(base, tmp_path):
    base_home, note = base
    home = tampered(base_home, tmp_path)
    _resign_from(home, 500)
    assert verify_home(home).ok
    report = verify_home(home, external=note)
    assert not report.ok
    assert report.first_bad_seq is None  # a root says that, not where
    assert "rewritten" in report.problem


def test_an_edited_stored_checkpoint_fails(base, tmp_path):
    home = tampered(base[0], tmp_path, "UPDATE checkpoints SET note = replace(note, '\n1000\n', '\n999\n')")
    report = verify_home(home)
    assert not report.ok and "stored checkpoint" in report.problem
    home2 = tampered(base[0], tmp_path / "b", f"UPDATE checkpoints SET root = from_hex('{_OTHER.hex()}')")
    report2 = verify_home(home2)
    assert not report2.ok and "does not match its signed note" in report2.problem


def test_a_checkpoint_from_another_key_is_rejected(base, tmp_path):
    from apollia_nb.journal.checkpoint import Checkpoint, NoteSigner

    base_home, _ = base
    con = duckdb.connect(str(base_home.journal_db), read_only=True)
    origin = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()[0]
    con.close()
    forged = NoteSigner(origin, SigningKey.generate()).sign(Checkpoint(origin, 900, _OTHER).body())
    report = verify_home(base_home, external=forged)
    assert not report.ok and "the given checkpoint" in report.problem


def test_another_public_key_fails_every_entry(base, tmp_path):
    home = tampered(base[0], tmp_path)
    other = bytes(SigningKey.generate().verify_key)
    (home.keys_dir / "journal.pub").write_text(base64.b64encode(other).decode() + "\n")
    report = verify_home(home)
    assert (report.ok, report.first_bad_seq) == (False, 1)


def test_cli_verify_exits_1_naming_the_first_bad_seq(base, tmp_path, capsys):
    base_home, note = base
    home = tampered(base_home, tmp_path, (COLUMN_EDITS["payload"], [500]))
    assert main(["audit", "verify", "--home", str(home.path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED at seq 500" in out
    cp = tmp_path / "saved.checkpoint"
    cp.write_text(note)
    truncated = tampered(base_home, tmp_path / "t", "DELETE FROM entries WHERE seq > 700", "DELETE FROM checkpoints")
    assert main(["audit", "verify", "--home", str(truncated.path), "--checkpoint", str(cp), "--json"]) == 1
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["first_bad_seq"] == 701
