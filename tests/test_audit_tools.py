"""The auditor's tools through the CLI: kept checkpoints and bundles, proofs, a pinned key, refused exports.

A home's journal is rewritten the way only its key holder can (history cut at
an entry and re-signed, checkpoints included): plain ``audit verify`` passes,
and each tool an auditor holds something for catches it and says where.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys

import duckdb
import pytest

from apollia_nb.cli import main
from apollia_nb.journal import Draft, Journal
from apollia_nb.journal.audit import read_tlog_proof

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def fill(home, start: int, stop: int, run: str = "run-1") -> None:
    with Journal.open(home) as journal:
        journal.append_many(Draft("decision", {"i": i}, run, "clerk") for i in range(start, stop))


def cut(home, seq: int) -> None:
    """Drop the entries from ``seq`` on and the checkpoints that cover them, and everything the journal
    derives from its entries (so it derives them again on open): a journal that looks as if it ended there."""
    con = duckdb.connect(str(home.journal_db))
    con.execute("DELETE FROM entries WHERE seq >= ?", [seq])
    con.execute("DELETE FROM checkpoints WHERE size >= ?", [seq])
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name NOT IN "
                                "('entries', 'checkpoints', 'meta')").fetchall():
        con.execute(f'DROP TABLE "{table}"')
    con.execute("DELETE FROM meta WHERE key NOT IN ('format', 'origin', 'created_at')")
    con.close()


def rewrite_from(home, seq: int, count: int) -> None:
    """What the key holder can do: cut the journal at ``seq`` and append other entries, re-signed."""
    cut(home, seq)
    fill(home, 1000, 1000 + count, run="run-forged")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def kept(home, tmp_path, capsys):
    """A journal of 10 entries whose checkpoints at 4 and 10 (and a bundle at 10) were kept, then 5 more."""
    h = ["--home", str(home.path)]
    Journal.open(home, entry_format="1").close()  # payloads hashed whole, as the verifier below hashes them
    fill(home, 0, 4)
    assert run(capsys, "audit", "checkpoint", *h, "--out", str(tmp_path / "cp4.txt"))[0] == 0
    fill(home, 4, 10)
    assert run(capsys, "audit", "checkpoint", *h, "--out", str(tmp_path / "cp10.txt"))[0] == 0
    assert run(capsys, "audit", "export", *h, str(tmp_path / "bundle10"))[0] == 0
    fill(home, 10, 15)
    return home, h, tmp_path


def test_consistency_from_a_kept_checkpoint(kept, capsys):
    _, h, kept_dir = kept
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "cp10.txt"), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] and doc["old"]["size"] == 10 and doc["new"]["size"] == 15 and doc["path"]
    from apollia_nb.journal.merkle import verify_consistency

    verify_consistency(10, 15, bytes.fromhex(doc["old"]["root"]), bytes.fromhex(doc["new"]["root"]),
                       [bytes.fromhex(p) for p in doc["path"]])
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "bundle10"),
                       "--from", str(kept_dir / "cp4.txt"))
    assert code == 0 and out.startswith("ok: the journal (15 entries) extends")


def test_a_rewrite_passes_verify_but_not_what_the_auditor_kept(kept, capsys):
    home, h, kept_dir = kept
    rewrite_from(home, 7, 9)
    assert run(capsys, "audit", "verify", *h)[0] == 0  # re-signed: the journal alone cannot tell
    code, out, _ = run(capsys, "audit", "verify", *h, "--checkpoint", str(kept_dir / "cp10.txt"))
    assert code == 1 and "unknown seq" not in out
    assert out.startswith("FAILED: the given checkpoint (size 10): the first 10 entries do not have its Merkle "
                          "root (history was rewritten within seqs 1..10")
    # One kept checkpoint bounds the first seq that differs; two narrow it; a kept bundle names it.
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "cp10.txt"), "--json")
    assert code == 1
    assert json.loads(out) | {"kept": None, "problem": None} == {
        "ok": False, "entries": 15, "first_bad_seq": None, "differs_within": [1, 10], "problem": None,
        "kept": None}
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "cp10.txt"),
                       "--from", str(kept_dir / "cp4.txt"))
    assert code == 1 and out.startswith("FAILED within seqs 5..10: ")
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "bundle10"), "--json")
    assert code == 1 and json.loads(out)["first_bad_seq"] == 7 and json.loads(out)["differs_within"] == [7, 7]
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "bundle10"))
    assert out.startswith("FAILED at seq 7: entry 7 is not the entry the bundle")
    # A proof against the kept tree cannot be made from the rewritten journal.
    code, out, _ = run(capsys, "audit", "prove", "3", *h, "--against", str(kept_dir / "cp10.txt"))
    assert code == 1 and out.startswith("FAILED within seqs 1..10")


def test_a_cut_tail_is_named_against_a_kept_bundle(kept, capsys):
    home, h, kept_dir = kept
    cut(home, 8)
    Journal.open(home).close()  # opened once since, by its owner
    assert run(capsys, "audit", "verify", *h)[0] == 0
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "cp10.txt"))
    assert code == 1 and out.startswith(f"FAILED within seqs 1..8: the checkpoint {kept_dir / 'cp10.txt'} covers 10 "
                                        "entries, the journal holds 7")
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(kept_dir / "bundle10"))
    assert code == 1 and out.startswith("FAILED at seq 8: the bundle")


def test_a_checkpoint_of_another_log_is_no_evidence(kept, tmp_path, capsys):
    _, h, _ = kept
    from apollia_nb.home import Home

    other = Home.at(tmp_path / "other")
    fill(other, 0, 3)
    assert run(capsys, "audit", "checkpoint", "--home", str(other.path), "--out", str(tmp_path / "x.txt"))[0] == 0
    code, out, _ = run(capsys, "audit", "consistency", *h, "--from", str(tmp_path / "x.txt"))
    assert code == 1 and out.startswith(f"FAILED: the checkpoint {tmp_path / 'x.txt'} is not a checkpoint of this "
                                        "journal under its key")
    code, _, err = run(capsys, "audit", "consistency", *h, "--from", str(tmp_path / "missing.txt"))
    assert code == 3 and "BAD_INPUT" in err


def test_prove_against_a_kept_checkpoint_and_as_tlog_proof(kept, capsys):
    _, h, kept_dir = kept
    code, out, _ = run(capsys, "audit", "prove", "6", *h, "--against", str(kept_dir / "cp10.txt"), "--format",
                       "json")
    doc = json.loads(out)
    assert code == 0 and doc["tree_size"] == 10 and doc["leaf_index"] == 5
    assert doc["checkpoint"] == (kept_dir / "cp10.txt").read_text()
    assert base64.b64decode(doc["stored"]["payload_base64"]) == b'{"i":5}'
    code, text, _ = run(capsys, "audit", "prove", "6", *h, "--format", "tlog-proof")
    assert code == 0
    proof = read_tlog_proof(text)
    assert proof.index == 5 and hashlib.sha256(proof.extra).hexdigest() == doc["entry_hash"]
    _, size, root_b64 = proof.checkpoint.split("\n")[:3]
    assert size == "15" and text.startswith("c2sp.org/tlog-proof@v1\nextra ")
    leaf = hashlib.sha256(b"\x00" + hashlib.sha256(proof.extra).digest()).digest()
    assert _fold(proof.index, 15, leaf, list(proof.path)) == base64.b64decode(root_b64)
    code, _, err = run(capsys, "audit", "prove", "12", *h, "--against", str(kept_dir / "cp10.txt"))
    assert code == 3 and "BAD_INPUT" in err and "not covered by a checkpoint of size 10" in err


def test_a_pinned_key_catches_a_replaced_key_pair(kept, capsys):
    home, h, _ = kept
    code, vkey, _ = run(capsys, "audit", "verifier-key", *h)
    vkey = vkey.strip()
    with Journal.open(home) as journal:
        assert vkey == journal.verifier_key()
    assert run(capsys, "audit", "verify", *h, "--key", vkey)[0] == 0
    # The key pair is replaced and the whole journal rebuilt under it: it verifies on its own.
    shutil.rmtree(home.keys_dir)
    home.journal_db.unlink()
    fill(home, 0, 15)
    assert run(capsys, "audit", "verify", *h)[0] == 0
    code, out, _ = run(capsys, "audit", "verify", *h, "--key", vkey, "--json")
    assert code == 1
    report = json.loads(out)
    assert report["ok"] is False and report["first_bad_seq"] == 1
    assert report["problem"].startswith("the journal is not signed by the pinned key: its key differs")
    code, _, err = run(capsys, "audit", "verify", *h, "--key", "not-a-key")
    assert code == 3 and "BAD_INPUT" in err


def test_export_refuses_a_journal_that_does_not_verify(kept, tmp_path, capsys):
    home, h, _ = kept
    con = duckdb.connect(str(home.journal_db))
    con.execute("UPDATE entries SET agent = 'mallory' WHERE seq = 9")
    con.close()
    code, out, err = run(capsys, "audit", "export", *h, str(tmp_path / "refused"))
    assert code == 1 and out == ""
    assert "error: INTEGRITY_FAILURE: the journal does not verify (FAILED at seq 9:" in err
    assert "--allow-invalid" in err and not (tmp_path / "refused").exists()
    code, out, _ = run(capsys, "audit", "export", *h, str(tmp_path / "marked"), "--allow-invalid", "--json")
    assert code == 0 and json.loads(out)["verified"] is False
    meta = json.loads((tmp_path / "marked" / "meta.json").read_text())
    assert meta["verified"] is False and meta["invalid"]["first_bad_seq"] == 9
    code, out, _ = run(capsys, "audit", "verify", "--bundle", str(tmp_path / "marked"))
    assert code == 1 and out.startswith("FAILED at seq 9:") and "exported marked invalid (meta.json)" in out


def test_a_bundle_marked_invalid_fails_even_when_its_files_verify(kept, capsys):
    _, _, kept_dir = kept
    bundle = kept_dir / "bundle10"
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["verified"] is True and meta["invalid"] is None
    assert run(capsys, "audit", "verify", "--bundle", str(bundle))[0] == 0
    meta.update(verified=False, invalid={"first_bad_seq": 3, "problem": "entry 3: hash does not match"})
    (bundle / "meta.json").write_text(json.dumps(meta))
    code, out, _ = run(capsys, "audit", "verify", "--bundle", str(bundle), "--json")
    report = json.loads(out)
    assert code == 1 and report["first_bad_seq"] == 3 and "exported marked invalid" in report["problem"]


# --- a home a kernel owns ---------------------------------------------------------------------------


@pytest.fixture
def kernel_path(tmp_path, monkeypatch):
    prefix = tmp_path / "jupyter-prefix"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "python3"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return prefix


def test_a_home_a_kernel_owns_says_which_kernel_and_how_to_audit(home, kernel_path, tmp_path):
    from jupyter_client import KernelManager

    fill(home, 0, 3)
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
    env["APOLLIA_HOME"] = str(home.path)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=str(tmp_path))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        assert kc.execute_interactive("%load_ext apollia_nb", timeout=60)["content"]["status"] == "ok"
        pid = json.loads(home.owner_lock_path.read_text())["pid"]
        said = ""
        for command in (["audit", "verify"], ["audit", "export", str(tmp_path / "b")], ["audit", "checkpoint"],
                        ["agents", "list"]):
            out = subprocess.run([*APOLLIA, *command], capture_output=True, text=True, env=env, timeout=60)
            assert out.returncode == 3, (command, out.stderr)
            assert f"error: HOME_LOCKED: `apollia-os {' '.join(command[:2])}` cannot read the home" in out.stderr
            assert f"a Jupyter kernel owns it (process {pid}, connection file {km.connection_file}" in out.stderr
            assert "%apollia verify" in out.stderr and "shut that kernel down" in out.stderr
            said = out.stderr
        # The way out the message gives, as it gives it: a bundle written from the notebook, audited here.
        code = said.split("`from apollia_nb.notebook", 1)[1].split("` writes a bundle", 1)[0]
        bundle = tmp_path / "bundle"
        done = kc.execute_interactive(f"import os; os.chdir({str(tmp_path)!r})\nfrom apollia_nb.notebook{code}",
                                      timeout=60)
        assert done["content"]["status"] == "ok"
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    out = subprocess.run([*APOLLIA, "audit", "verify", "--bundle", str(bundle)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok: ")


# --- an independent check, from docs/journal.md's formulas alone ---------------------------------


def _f(value) -> bytes:
    if value is None:
        return b"\x00"
    data = value if isinstance(value, bytes) else value.encode("utf-8")
    return b"\x01" + len(data).to_bytes(4, "big") + data


def _fold(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2, as the doc points to it."""
    fn, sn, r = index, size - 1, leaf
    for p in path:
        assert sn != 0
        if fn & 1 or fn == sn:
            r = hashlib.sha256(b"\x01" + p + r).digest()
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            r = hashlib.sha256(b"\x01" + r + p).digest()
        fn >>= 1
        sn >>= 1
    assert sn == 0
    return r


def test_an_independent_verifier_written_from_the_doc(kept, capsys):
    from nacl.signing import VerifyKey

    _, h, _ = kept
    vkey = run(capsys, "audit", "verifier-key", *h)[1].strip()
    name, key_hash_hex, key_b64 = vkey.split("+", 2)
    raw_key = base64.b64decode(key_b64)
    assert raw_key[0] == 1 and len(raw_key) == 33
    public_key = raw_key[1:]
    key_hash = hashlib.sha256(name.encode() + b"\n" + b"\x01" + public_key).digest()[:4]
    assert key_hash.hex() == key_hash_hex
    doc = json.loads(run(capsys, "audit", "prove", "6", *h, "--json")[1])
    stored = doc["stored"]
    payload = base64.b64decode(stored["payload_base64"])
    encoding = (b"apollia-nb/journal-entry/v1\n" + stored["seq"].to_bytes(8, "big") + _f(stored["ts"])
                + _f(stored["run_id"]) + _f(stored["agent"]) + _f(stored["kind"]) + _f(payload)
                + bytes.fromhex(stored["prev_hash"]))
    assert base64.b64decode(doc["hashed_base64"]) == encoding
    entry_hash = hashlib.sha256(encoding).digest()
    assert entry_hash.hex() == stored["hash"] == doc["entry_hash"]
    assert stored["key_id"] == hashlib.sha256(public_key).digest()[:8].hex()
    VerifyKey(public_key).verify(entry_hash, bytes.fromhex(stored["signature"]))
    leaf = hashlib.sha256(b"\x00" + entry_hash).digest()
    assert leaf.hex() == doc["leaf_hash"] and doc["leaf_index"] == stored["seq"] - 1
    root = _fold(doc["leaf_index"], doc["tree_size"], leaf, [bytes.fromhex(p) for p in doc["path"]])
    # The note: the body through its last newline is signed; "— name base64(4-byte key hash || signature)".
    note = doc["checkpoint"]
    body, _, signatures = note.partition("\n\n")
    body += "\n"
    origin, size, root_b64 = body.split("\n")[:3]
    assert origin == name and int(size) == doc["tree_size"] and base64.b64decode(root_b64) == root
    assert root.hex() == doc["root"]
    lines = [line for line in signatures.split("\n") if line]
    assert lines and all(line.startswith("\u2014 ") for line in lines)
    sig_name, sig_b64 = lines[0][2:].split(" ")
    raw_sig = base64.b64decode(sig_b64)
    assert sig_name == name and raw_sig[:4] == key_hash and len(raw_sig) == 68
    VerifyKey(public_key).verify(body.encode("utf-8"), raw_sig[4:])


def test_the_checkpoint_of_an_empty_journal_has_the_documented_root(tmp_path, capsys):
    from apollia_nb.home import Home

    empty = Home.at(tmp_path / "empty")
    Journal.open(empty).close()
    code, out, _ = run(capsys, "audit", "checkpoint", "--home", str(empty.path), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["size"] == 0
    assert doc["root"] == hashlib.sha256(b"").hexdigest()
    assert doc["note"].split("\n")[2] == "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="


@pytest.mark.parametrize("text, says", [
    ("c2sp.org/tlog-proof@v2\nindex 0\n\nnote\n", "the first line"),
    ("c2sp.org/tlog-proof@v1\nindex 01\n\nnote\n", "bad index"),
    ("c2sp.org/tlog-proof@v1\nextra !!\nindex 0\n\nnote\n", "extra is not base64"),
    ("c2sp.org/tlog-proof@v1\nindex 0\nAAAA\n\nnote\n", "not a 32-byte hash"),
    ("c2sp.org/tlog-proof@v1\nextra AAAA\n\nnote\n", "no `index N` line"),
    ("c2sp.org/tlog-proof@v1\nindex 0\n", "blank line"),
])
def test_a_malformed_tlog_proof_is_refused(text, says):
    from apollia_nb.errors import BadInput

    with pytest.raises(BadInput, match=says):
        read_tlog_proof(text)
