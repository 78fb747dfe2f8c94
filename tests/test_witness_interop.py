"""Checkpoints with witness cosignatures, read by tools nobody on this project wrote.

Go's reference ``golang.org/x/mod/sumdb/note`` opens a checkpoint cosigned by an
``apollia-os witness serve`` process (the journal's key, and a ``note.Verifier`` for
C2SP tlog-cosignature/v1 written from the spec in ``tests/go/witnesscheck``), and
``sumdb/tlog`` checks inclusion and consistency proofs against it; ``sigstore`` (PyPI)
checks the checkpoint's signature and the cosignature's Ed25519 signature. Tampered
notes, cosignatures and proofs are rejected by each. Go and the x/mod sources come from
Debian (``dev/install-test-go.sh``); the program is built offline once per session.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from witness_helpers import WitnessProcess, cli, configure

from apollia_nb.journal import Draft, Journal
from apollia_nb.journal.checkpoint import NoteVerifier, parse_checkpoint, parse_note
from apollia_nb.journal.witness import (
    CosignatureVerifier,
    cosigned_message,
    parse_cosignature_lines,
)

GO_SOURCE = Path(__file__).parent / "go" / "witnesscheck" / "main.go"
GOPATH = "/usr/share/gocode"


@pytest.fixture(scope="session")
def witnesscheck(tmp_path_factory) -> Path:
    """The Go checker, built offline against Debian's golang.org/x/mod (once per session)."""
    go = shutil.which("go")
    if go is None or not (Path(GOPATH) / "src/golang.org/x/mod/sumdb/note").is_dir():
        pytest.fail("Go and golang.org/x/mod are missing: run `bash dev/install-test-go.sh` (dev/test.sh does)")
    out = tmp_path_factory.mktemp("go")
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH, "GOCACHE": str(out / "cache"),
           "GOPROXY": "off", "GOFLAGS": "", "CGO_ENABLED": "0"}
    started = time.monotonic()
    built = subprocess.run([go, "build", "-o", str(out / "witnesscheck"), str(GO_SOURCE)], check=False,
                           capture_output=True, text=True, env=env, timeout=300)
    assert built.returncode == 0, built.stderr
    print(f"\nwitnesscheck built in {time.monotonic() - started:.1f}s")
    return out / "witnesscheck"


@pytest.fixture
def cosigned(tmp_path):
    """A journal of 30 entries whose newest checkpoint (size 30) a witness process cosigned,
    and an older checkpoint of size 12."""
    from apollia_nb.home import Home

    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        journal.append_many(Draft("note", {"i": i}, "run-1", "clerk") for i in range(12))
        journal.checkpoint()
        journal.append_many(Draft("note", {"i": i}, "run-2", "clerk") for i in range(12, 30))
        vkey = journal.verifier_key()
    w = WitnessProcess(tmp_path / "w", vkey)
    try:
        configure(home, w)
        push = cli("witness", "push", "--home", str(home.path))
        assert push.returncode == 0, push.stdout + push.stderr
    finally:
        w.stop()
    with Journal.open(home) as journal:
        note = journal.latest_checkpoint()
        [(size, key, _ts, line)] = journal.cosignatures()
        assert (size, key) == (30, w.key)
        inclusion = journal.inclusion_proof(17, note)
        consistency = journal.consistency_proof(12, 30)
    return {"log_vkey": vkey, "witness_vkey": w.key, "note": note + line, "line": line,
            "inclusion": inclusion, "consistency": consistency}


def _check(binary: Path, data: dict) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary)], check=False, input=json.dumps(data), capture_output=True, text=True, timeout=60)


def _request(c: dict, **changes) -> dict:
    inc, con = c["inclusion"], c["consistency"]
    data = {
        "log_vkey": c["log_vkey"],
        "witness_vkeys": [c["witness_vkey"]],
        "note": c["note"],
        "inclusion": {"index": inc.leaf_index, "size": inc.tree_size, "entry_hash": inc.entry_hash.hex(),
                      "path": [h.hex() for h in inc.path]},
        "consistency": {"old_size": con.old_size, "old_root": con.old_root.hex(),
                        "path": [h.hex() for h in con.path]},
    }
    data.update(changes)
    return data


def _flip(line: str, at: int) -> str:
    """The cosignature line with one bit of its signature bytes flipped."""
    prefix, b64 = line.rstrip("\n").rsplit(" ", 1)
    raw = bytearray(base64.b64decode(b64))
    raw[at] ^= 1
    return f"{prefix} {base64.b64encode(bytes(raw)).decode()}\n"


def test_go_sumdb_note_and_tlog_accept_the_cosigned_checkpoint_and_its_proofs(witnesscheck, cosigned):
    out = _check(witnesscheck, _request(cosigned))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "note ok: 2 verified signature(s)", "inclusion ok: leaf 16 of 30", "consistency ok: 30 extends 12"]


def test_go_rejects_tampered_cosignatures_notes_and_proofs(witnesscheck, cosigned):
    body = cosigned["note"][: cosigned["note"].index("\n\n") + 1]
    signatures = cosigned["note"][len(body) + 1:]
    line = cosigned["line"]
    cases = {
        "cosignature signature bit": cosigned["note"].replace(line, _flip(line, 4 + 8 + 5)),
        "cosignature timestamp": cosigned["note"].replace(line, _flip(line, 4 + 7)),
        "checkpoint size": body.replace("\n30\n", "\n31\n", 1) + "\n" + signatures,
    }
    for what, note in cases.items():
        out = _check(witnesscheck, _request(cosigned, note=note))
        assert out.returncode == 1 and out.stdout.startswith("FAIL note"), (what, out.stdout)
    # a note without the cosignature is not accepted as cosigned
    out = _check(witnesscheck, _request(cosigned, note=cosigned["note"].replace(line, "")))
    assert out.returncode == 1 and "no verified signature from" in out.stdout
    good = _request(cosigned)
    bad_path = {**good["inclusion"], "path": [good["inclusion"]["path"][1], good["inclusion"]["path"][0],
                                             *good["inclusion"]["path"][2:]]}
    out = _check(witnesscheck, {**good, "inclusion": bad_path})
    assert out.returncode == 1 and out.stdout.splitlines()[-1].startswith("FAIL inclusion"), out.stdout
    out = _check(witnesscheck, {**good, "inclusion": {**good["inclusion"], "index": 15}})
    assert out.returncode == 1 and out.stdout.splitlines()[-1].startswith("FAIL inclusion"), out.stdout
    out = _check(witnesscheck, {**good, "consistency": {**good["consistency"], "old_root": "00" * 32}})
    assert out.returncode == 1 and out.stdout.splitlines()[-1].startswith("FAIL consistency"), out.stdout


def test_sigstore_checks_the_checkpoint_and_the_cosignature(cosigned):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    from sigstore._internal.rekor.checkpoint import SignedCheckpoint
    from sigstore._internal.trust import Keyring
    from sigstore.errors import VerificationError
    from sigstore_models.common import v1 as common_v1

    def keyring(public_key: bytes) -> Keyring:
        der = Ed25519PublicKey.from_public_bytes(public_key).public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return Keyring([common_v1.PublicKey(raw_bytes=base64.b64encode(der).decode(), key_details=common_v1.PublicKeyDetails.PKIX_ED25519)])

    log = NoteVerifier.from_key(cosigned["log_vkey"])
    witness = CosignatureVerifier.from_key(cosigned["witness_vkey"])
    signed = SignedCheckpoint.from_text(cosigned["note"])
    assert signed.checkpoint.log_size == 30 and len(signed.signed_note.signatures) == 2
    signed.signed_note.verify(keyring(log.public_key), log.key_id + bytes(28))  # the log's signature
    # the cosignature: sigstore's Ed25519 keyring over the cosignature/v1 message of the same body
    [cosig] = parse_cosignature_lines(cosigned["line"])
    [sig] = [s for s in signed.signed_note.signatures if s.sig_hash == witness.key_id]
    raw = base64.b64decode(sig.signature)
    assert int.from_bytes(raw[:8], "big") == cosig.timestamp
    message = cosigned_message(signed.signed_note.note, cosig.timestamp)
    keyring(witness.public_key).verify(key_id=b"", signature=raw[8:], data=message)
    with pytest.raises(VerificationError):  # another time, or another body, does not verify
        keyring(witness.public_key).verify(key_id=b"", signature=raw[8:],
                                           data=cosigned_message(signed.signed_note.note, cosig.timestamp + 1))
    body = signed.signed_note.note
    tampered = SignedCheckpoint.from_text(cosigned["note"].replace(body, body.replace("\n30\n", "\n29\n")))
    with pytest.raises(VerificationError):
        tampered.signed_note.verify(keyring(log.public_key), log.key_id + bytes(28))
    assert parse_checkpoint(body).size == 30 and parse_note(cosigned["note"])[0] == body
