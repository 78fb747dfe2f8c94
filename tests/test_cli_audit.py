"""``apollia-os audit``: verify, checkpoint, prove, export — through ``main`` and once as a process."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pytest

from apollia_nb.cli import main
from apollia_nb.home import OwnerLock
from apollia_nb.journal import Draft, Journal
from apollia_nb.journal.checkpoint import NoteVerifier, open_checkpoint
from apollia_nb.journal.merkle import leaf_hash, verify_inclusion


@pytest.fixture
def filled(home):
    with Journal.open(home) as journal:
        journal.append_many(Draft("decision", {"i": i}, "run-1", "clerk") for i in range(40))
        vkey = journal.verifier_key()
    return home, vkey


def test_verify_clean(filled, capsys):
    home, _ = filled
    assert main(["audit", "verify", "--home", str(home.path)]) == 0
    assert capsys.readouterr().out.startswith("ok: 40 entries verified")
    assert main(["audit", "verify", "--home", str(home.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ok": True, "entries": 40, "first_bad_seq": None, "problem": None, "checked_checkpoints": 1,
        "format": "2",
    }


def test_verify_a_tampered_journal_exits_1(filled, capsys):
    home, _ = filled
    con = duckdb.connect(str(home.journal_db))
    con.execute("UPDATE entries SET agent = 'mallory' WHERE seq = 17")
    con.close()
    assert main(["audit", "verify", "--home", str(home.path)]) == 1
    assert "FAILED at seq 17: entry 17: hash does not match its contents" in capsys.readouterr().out


def test_verify_without_a_journal_is_an_error(home, capsys):
    assert main(["audit", "verify", "--home", str(home.path)]) == 3
    assert "error: NOT_FOUND" in capsys.readouterr().err
    assert not home.journal_db.exists()


def test_checkpoint_prints_and_writes_a_signed_note(filled, tmp_path, capsys):
    home, vkey = filled
    out = tmp_path / "cp.txt"
    assert main(["audit", "checkpoint", "--home", str(home.path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    cp = open_checkpoint(printed, [NoteVerifier.from_key(vkey)])
    assert cp.size == 40
    assert main(["audit", "verify", "--home", str(home.path), "--checkpoint", str(out)]) == 0
    capsys.readouterr()
    assert main(["audit", "checkpoint", "--home", str(home.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["size"] == 40 and data["root"] == cp.root.hex() and data["note"] == printed


def test_checkpoint_needs_the_journal_free(filled, capsys):
    home, _ = filled
    with Journal.open(home):  # journal.db is held (here by this process)
        assert main(["audit", "checkpoint", "--home", str(home.path)]) == 3
    assert "HOME_LOCKED" in capsys.readouterr().err
    with OwnerLock(home):  # after the command: the home is free again
        pass


def test_prove_prints_a_verified_inclusion_proof(filled, capsys):
    home, vkey = filled
    assert main(["audit", "prove", "12", "--home", str(home.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seq"] == 12 and data["leaf_index"] == 11 and data["tree_size"] == 40
    assert data["entry"]["payload"] == {"i": 11}
    cp = open_checkpoint(data["checkpoint"], [NoteVerifier.from_key(vkey)])
    entry_hash = bytes.fromhex(data["entry_hash"])
    assert bytes.fromhex(data["leaf_hash"]) == leaf_hash(entry_hash)
    verify_inclusion(11, cp.size, leaf_hash(entry_hash), [bytes.fromhex(h) for h in data["path"]], cp.root)
    assert main(["audit", "prove", "12", "--home", str(home.path)]) == 0
    text = capsys.readouterr().out
    assert "the proof verifies" in text and data["root"] in text


def test_prove_an_unknown_seq_is_an_error(filled, capsys):
    home, _ = filled
    assert main(["audit", "prove", "41", "--home", str(home.path)]) == 3
    assert "NOT_FOUND" in capsys.readouterr().err
    assert main(["audit", "prove", "0", "--home", str(home.path)]) == 3
    assert "BAD_INPUT" in capsys.readouterr().err


def test_export_then_verify_the_bundle(filled, tmp_path, capsys):
    home, _ = filled
    bundle = tmp_path / "bundle"
    assert main(["audit", "export", "--format", "parquet", str(bundle), "--home", str(home.path)]) == 0
    assert "exported 40 entries" in capsys.readouterr().out
    assert (bundle / "entries.parquet").exists() and (bundle / "README.md").exists()
    assert main(["audit", "verify", "--bundle", str(bundle), "--checkpoint", str(bundle / "checkpoint.txt")]) == 0
    assert "ok: 40 entries" in capsys.readouterr().out
    assert main(["audit", "export", str(bundle), "--home", str(home.path)]) == 3
    assert "BAD_INPUT" in capsys.readouterr().err


def test_verify_as_a_process(filled, tmp_path):
    home, _ = filled
    ok = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", str(home.path)],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: 40 entries")
    con = duckdb.connect(str(home.journal_db))
    con.execute("DELETE FROM entries WHERE seq = 33")
    con.close()
    bad = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", str(home.path)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "FAILED at seq 33" in bad.stdout
