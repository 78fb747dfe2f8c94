"""Signed checkpoints: C2SP tlog-checkpoint bodies in C2SP signed notes."""

from __future__ import annotations

import base64
import hashlib

import nacl.signing
import pytest

from apollia_nb.errors import BadInput, IntegrityError
from apollia_nb.journal.checkpoint import (
    MAX_SIGNATURES,
    Checkpoint,
    CheckpointError,
    NoteSignature,
    NoteSigner,
    NoteVerifier,
    key_id,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
    verify_note,
)
from apollia_nb.journal.merkle import EMPTY_ROOT

EM = "\u2014"
ROOT = hashlib.sha256(b"a root").digest()


def _signer(name: str = "apollia.example/journal", seed: int = 1) -> NoteSigner:
    return NoteSigner(name, nacl.signing.SigningKey(bytes([seed]) * 32))


SIGNER = _signer()
VERIFIER = NoteVerifier.from_key(SIGNER.verifier_key())
CP = Checkpoint("apollia.example/journal", 1234, ROOT)
NOTE = SIGNER.sign(CP.body())


# --- published examples -------------------------------------------------------------

# From the package documentation and tests of golang.org/x/mod/sumdb/note
# (sumdb/note/note.go and note_test.go): the "PeterNeumann" note, its verifier and
# signer keys, and the second signature by "EnochRoot".
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_PETER_SIG = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
GO_NOTE = GO_TEXT + "\n" + GO_PETER_SIG
GO_ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
GO_ENOCH_SIG = (
    "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)

# From the C2SP signed-note specification (c2sp.org/signed-note, signed-note.md in
# the C2SP/C2SP repository). The specification publishes no verifier key for it.
C2SP_NOTE = (
    "Ognuno sta solo sul cuor della terra\n"
    "trafitto da un raggio di sole:\n"
    "\n"
    "ed è subito sera.\n"
    "\n"
    "— quasimodo.example/salvatore NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+EhfLW9oJKONrMouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n"
)

# From the C2SP tlog-checkpoint specification (c2sp.org/tlog-checkpoint).
C2SP_CHECKPOINT = (
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    "\n"
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)


def test_go_note_example_verifies_with_its_published_key() -> None:
    verifier = NoteVerifier.from_key(GO_VKEY)
    assert verifier.name == "PeterNeumann"
    assert verifier.key_id == bytes.fromhex("c74f20a3")
    assert verifier.key() == GO_VKEY
    assert verify_note(GO_NOTE, [verifier]) == GO_TEXT
    assert verify_note(GO_NOTE.encode("utf-8"), [verifier]) == GO_TEXT
    with pytest.raises(CheckpointError):
        verify_note(GO_NOTE.replace("cryptography", "cryptographY"), [verifier])


def test_signing_with_the_go_signer_key_reproduces_the_published_note() -> None:
    seed = base64.b64decode(GO_SKEY.split("+", 4)[4])
    assert seed[0] == 0x01
    signer = NoteSigner("PeterNeumann", nacl.signing.SigningKey(seed[1:]))
    assert signer.key_id == bytes.fromhex("c74f20a3")
    assert signer.verifier_key() == GO_VKEY
    assert signer.sign(GO_TEXT) == GO_NOTE


def test_go_two_signature_note() -> None:
    peter, enoch = NoteVerifier.from_key(GO_VKEY), NoteVerifier.from_key(GO_ENOCH_VKEY)
    note = GO_TEXT + "\n" + GO_PETER_SIG + GO_ENOCH_SIG
    assert verify_note(note, [peter]) == GO_TEXT
    assert verify_note(note, [enoch]) == GO_TEXT
    assert verify_note(note, [peter, enoch]) == GO_TEXT
    with pytest.raises(CheckpointError, match="no signature from a known key"):
        verify_note(note, [])
    body, sigs = parse_note(note)
    assert body == GO_TEXT
    assert [(s.name, s.key_id.hex()) for s in sigs] == [
        ("PeterNeumann", "c74f20a3"),
        ("EnochRoot", "af0cfe78"),
    ]
    assert "".join(s.line() for s in sigs) == GO_PETER_SIG + GO_ENOCH_SIG
    # A corrupted signature from a known key rejects the note, even next to a good one.
    bad_enoch = GO_ENOCH_SIG[:60] + "ABCD" + GO_ENOCH_SIG[60:]
    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(GO_TEXT + "\n" + GO_PETER_SIG + bad_enoch, [peter, enoch])
    # ...but it is only an unknown signature to a verifier that does not know Enoch.
    assert verify_note(GO_TEXT + "\n" + GO_PETER_SIG + bad_enoch, [peter]) == GO_TEXT


def test_c2sp_signed_note_example_parses() -> None:
    body, sigs = parse_note(C2SP_NOTE)
    # The text is split from the signatures at the *last* blank line.
    assert body == (
        "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned è subito sera.\n"
    )
    assert len(sigs) == 1
    assert sigs[0].name == "quasimodo.example/salvatore"
    assert sigs[0].key_id == bytes.fromhex("367ba04b")
    assert len(sigs[0].signature) == 64
    assert body + "\n" + sigs[0].line() == C2SP_NOTE
    with pytest.raises(CheckpointError):
        verify_note(C2SP_NOTE, [VERIFIER])


def test_c2sp_checkpoint_example_parses() -> None:
    body, sigs = parse_note(C2SP_CHECKPOINT)
    cp = parse_checkpoint(body)
    assert cp.origin == "example.com/behind-the-sofa"
    assert cp.size == 20852163
    assert cp.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert cp.extensions == ()
    assert cp.body() == body
    assert sigs[0].name == cp.origin and len(sigs[0].signature) == 64


# --- keys ---------------------------------------------------------------------------


def test_key_id_is_truncated_sha256_of_name_newline_alg_key() -> None:
    pub = bytes(nacl.signing.SigningKey(b"\x01" * 32).verify_key)
    assert SIGNER.public_key == pub
    want = hashlib.sha256(SIGNER.name.encode() + b"\n\x01" + pub).digest()[:4]
    assert SIGNER.key_id == want == key_id(SIGNER.name, pub)
    name, hex_id, b64 = SIGNER.verifier_key().split("+")
    assert (name, hex_id, base64.b64decode(b64)) == (SIGNER.name, want.hex(), b"\x01" + pub)
    assert VERIFIER == SIGNER.verifier()


def test_verifier_key_manglings_are_rejected() -> None:
    # Every proper substring and every single-character change of a good key.
    NoteVerifier.from_key(GO_VKEY)
    bad = {GO_VKEY[i:j] for i in range(len(GO_VKEY) + 1) for j in range(i + 1, len(GO_VKEY) + 1)}
    bad.discard(GO_VKEY)
    bad |= {GO_VKEY[:i] + chr(ord(c) + 1) + GO_VKEY[i + 1 :] for i, c in enumerate(GO_VKEY)}
    bad |= {
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",  # wrong length
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # unknown algorithm
        GO_VKEY.upper(),
        GO_VKEY + "\n",
        " " + GO_VKEY,
    }
    for key in bad:
        with pytest.raises(BadInput):
            NoteVerifier.from_key(key)
            pytest.fail(f"accepted {key!r}")


@pytest.mark.parametrize("name", ["", "a b", "a+b", "tab\there", "nbsp\u00a0x", "line\nbreak"])
def test_invalid_key_names_are_refused(name: str) -> None:
    with pytest.raises(BadInput):
        NoteSigner(name, nacl.signing.SigningKey(b"\x02" * 32))
    with pytest.raises(BadInput):
        NoteVerifier(name, b"\x00" * 32)


def test_signer_refuses_bodies_that_cannot_be_notes() -> None:
    for body in ("no newline", "ctrl\x07\n", "cr\r\n", ""):
        with pytest.raises(BadInput):
            SIGNER.sign(body)


# --- checkpoints: round trips and tampering ---------------------------------------------


@pytest.mark.parametrize(
    "cp",
    [
        CP,
        Checkpoint("apollia.example/journal", 0, EMPTY_ROOT),
        Checkpoint("o", (1 << 64) - 1, ROOT, ("ext one", "— looks like a signature")),
        Checkpoint("apollia.example/ünïcode", 7, ROOT, ("x",)),
    ],
    ids=["plain", "empty-tree", "extensions", "unicode-origin"],
)
def test_checkpoint_round_trip(cp: Checkpoint) -> None:
    note = SIGNER.sign(cp.body())
    assert open_checkpoint(note, [VERIFIER]) == cp
    assert open_checkpoint(note, [VERIFIER], origin=cp.origin) == cp
    assert parse_checkpoint(cp.body()) == cp


def test_checkpoint_body_format() -> None:
    cp = Checkpoint("example.com/log", 42, ROOT, ("a", "b"))
    assert cp.body() == f"example.com/log\n42\n{base64.b64encode(ROOT).decode()}\na\nb\n"
    note = SIGNER.sign(cp.body())
    assert note.startswith(cp.body() + "\n" + EM + " apollia.example/journal ")
    assert note.endswith("\n") and note.count("\n") == cp.body().count("\n") + 2


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1
    return text.replace(old, new, 1)


def test_tampering_with_any_part_fails() -> None:
    cp = Checkpoint("apollia.example/journal", 1234, ROOT, ("ext",))
    note = SIGNER.sign(cp.body())
    root_b64 = base64.b64encode(ROOT).decode()
    other_root = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    body, sigs = parse_note(note)
    sig = sigs[0]
    flipped = NoteSignature(sig.name, sig.key_id, bytes([sig.signature[0] ^ 1]) + sig.signature[1:])
    tampered = {
        "origin": _replace_once(note, "apollia.example/journal\n", "apollia.example/journaL\n"),
        "size": _replace_once(note, "\n1234\n", "\n1235\n"),
        "truncated size": _replace_once(note, "\n1234\n", "\n1233\n"),
        "root": _replace_once(note, root_b64, other_root),
        "extension": _replace_once(note, "\next\n", "\nexT\n"),
        "dropped extension": _replace_once(note, "\next\n", "\n"),
        "added extension": _replace_once(note, "\next\n", "\next\nmore\n"),
        "signature": body + "\n" + flipped.line(),
    }
    for what, text in tampered.items():
        with pytest.raises(CheckpointError) as err:
            open_checkpoint(text, [VERIFIER])
            pytest.fail(f"{what} verified")
        assert err.value.code == "INTEGRITY_FAILURE"
    assert open_checkpoint(note, [VERIFIER]) == cp


def test_wrong_key_and_wrong_origin_fail() -> None:
    same_name_other_key = _signer(seed=2)
    with pytest.raises(CheckpointError, match="no signature from a known key"):
        open_checkpoint(NOTE, [same_name_other_key.verifier()])
    with pytest.raises(CheckpointError, match="no signature from a known key"):
        open_checkpoint(NOTE, [_signer("someone.else", seed=1).verifier()])
    with pytest.raises(CheckpointError, match="origin"):
        open_checkpoint(NOTE, [VERIFIER], origin="another.example/log")
    # Signed by someone we do not know, claiming our name: an unknown key, not ours.
    forged = same_name_other_key.sign(CP.body())
    with pytest.raises(CheckpointError):
        open_checkpoint(forged, [VERIFIER])


def test_signature_with_known_name_and_id_but_wrong_bytes_is_an_error() -> None:
    body, _ = parse_note(NOTE)
    # A good signature by another key, relabelled with our name and key id.
    other = _signer(seed=3).signature(body)
    relabelled = NoteSignature(SIGNER.name, SIGNER.key_id, other.signature)
    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(body + "\n" + relabelled.line(), [VERIFIER])
    # A truncated Ed25519 signature under our key id is a failure, not an unknown key.
    short = NoteSignature(SIGNER.name, SIGNER.key_id, other.signature[:40])
    with pytest.raises(CheckpointError, match="invalid signature"):
        verify_note(body + "\n" + short.line() + NOTE[len(body) + 1 :], [VERIFIER])


def test_unknown_signatures_are_kept_but_ignored() -> None:
    stranger = _signer("stranger.example", seed=9)
    body = CP.body()
    both = body + "\n" + stranger.signature(body).line() + SIGNER.signature(body).line()
    assert open_checkpoint(both, [VERIFIER]) == CP
    _, sigs = parse_note(both)
    assert [s.name for s in sigs] == ["stranger.example", SIGNER.name]
    # Garbage under an unknown key is ignored too (same name, different key id).
    junk = NoteSignature(SIGNER.name, b"\x00\x00\x00\x00", b"\x01" * 64)
    assert verify_note(body + "\n" + junk.line() + SIGNER.signature(body).line(), [VERIFIER]) == body
    # Only unknown signatures: rejected.
    with pytest.raises(CheckpointError, match="no signature from a known key"):
        open_checkpoint(stranger.sign(body), [VERIFIER])


def test_note_with_many_signatures() -> None:
    line = SIGNER.signature(CP.body()).line()
    ok = CP.body() + "\n" + line * MAX_SIGNATURES
    assert open_checkpoint(ok, [VERIFIER]) == CP
    with pytest.raises(CheckpointError, match="more than"):
        open_checkpoint(CP.body() + "\n" + line * (MAX_SIGNATURES + 1), [VERIFIER])


# --- malformed notes ----------------------------------------------------------------

_BODY, _SIGS = parse_note(NOTE)
_LINE = _SIGS[0].line()
_B64 = _LINE.split(" ")[2].rstrip("\n")

MALFORMED_NOTES = {
    "body only": _BODY,
    "body and blank line": _BODY + "\n",
    "no blank line": _BODY + _LINE,
    "missing trailing newline": NOTE[:-1],
    "trailing blank line": NOTE + "\n",
    "plain hyphen": _BODY + "\n" + _LINE.replace(EM, "-", 1),
    "en dash": _BODY + "\n" + _LINE.replace(EM, "\u2013", 1),
    "no space after dash": _BODY + "\n" + _LINE.replace(EM + " ", EM, 1),
    "two spaces after name": _BODY + "\n" + _LINE.replace(" " + _B64, "  " + _B64),
    "bad base64": _BODY + "\n" + _LINE.replace(_B64, _B64[:-4] + "*!*="),
    "unpadded base64": _BODY + "\n" + _LINE.replace(_B64, _B64.rstrip("=")),
    "empty signature": _BODY + "\n" + EM + " " + SIGNER.name + " \n",
    "key id only": _BODY + "\n" + EM + " " + SIGNER.name + " " + base64.b64encode(SIGNER.key_id).decode() + "\n",
    "short key id": _BODY + "\n" + EM + " " + SIGNER.name + " " + base64.b64encode(b"\x01\x02\x03").decode() + "\n",
    "bad name": _BODY + "\n" + EM + " Bad Name " + _B64 + "\n",
    "name with plus": _BODY + "\n" + EM + " a+b " + _B64 + "\n",
    "no name": _BODY + "\n" + EM + " " + _B64 + "\n",
    "unexpected line after signatures": NOTE + "Unexpected line.\n",
    "control character in body": "\x01" + NOTE,
    "carriage returns": NOTE.replace("\n", "\r\n"),
    "tab in body": NOTE.replace("\n", "\t\n", 1),
    "empty": "",
}


@pytest.mark.parametrize("text", MALFORMED_NOTES.values(), ids=MALFORMED_NOTES.keys())
def test_malformed_notes_are_rejected(text: str) -> None:
    with pytest.raises(CheckpointError) as err:
        verify_note(text, [VERIFIER])
    assert err.value.code == "INTEGRITY_FAILURE"
    assert isinstance(err.value, IntegrityError)


def test_invalid_utf8_and_surrogates_are_rejected() -> None:
    with pytest.raises(CheckpointError):
        verify_note(b"\xff" + NOTE.encode("utf-8"), [VERIFIER])
    with pytest.raises(CheckpointError):
        parse_note("\udc80" + NOTE)


# --- strict checkpoint bodies -------------------------------------------------------

R64 = base64.b64encode(ROOT).decode()
# The same 32 bytes with non-zero padding bits: decodes, but is not the canonical encoding.
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
R64_NONCANONICAL = R64[:-2] + _ALPHABET[_ALPHABET.index(R64[-2]) ^ 1] + "="
R64_URLSAFE = base64.urlsafe_b64encode(b"\xfb" * 32).decode()

BAD_BODIES = {
    "no trailing newline": f"o\n1\n{R64}",
    "two lines": "o\n1\n",
    "empty origin": f"\n1\n{R64}\n",
    "leading zero": f"o\n01\n{R64}\n",
    "double zero": f"o\n00\n{R64}\n",
    "plus sign": f"o\n+1\n{R64}\n",
    "minus sign": f"o\n-1\n{R64}\n",
    "space in size": f"o\n 1\n{R64}\n",
    "underscore in size": f"o\n1_000\n{R64}\n",
    "non-ascii digit": f"o\n\u0661\n{R64}\n",
    "hex size": f"o\n0x10\n{R64}\n",
    "empty size": f"o\n\n{R64}\n",
    "size over 64 bits": f"o\n{1 << 64}\n{R64}\n",
    "short root": f"o\n1\n{base64.b64encode(ROOT[:31]).decode()}\n",
    "long root": f"o\n1\n{base64.b64encode(ROOT + b'x').decode()}\n",
    "unpadded root": f"o\n1\n{R64.rstrip('=')}\n",
    "non-canonical root": f"o\n1\n{R64_NONCANONICAL}\n",
    "urlsafe root": f"o\n1\n{R64_URLSAFE}\n",
    "empty extension": f"o\n1\n{R64}\n\n",
    "empty middle extension": f"o\n1\n{R64}\na\n\nb\n",
    "control char in extension": f"o\n1\n{R64}\na\x00\n",
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_malformed_checkpoint_bodies_are_rejected(body: str) -> None:
    with pytest.raises(CheckpointError):
        parse_checkpoint(body)


def test_signed_malformed_body_is_rejected_after_verification() -> None:
    note = SIGNER.sign(f"o\n01\n{R64}\n")
    assert verify_note(note, [VERIFIER]) == f"o\n01\n{R64}\n"
    with pytest.raises(CheckpointError, match="leading zeros"):
        open_checkpoint(note, [VERIFIER])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"origin": "", "size": 1, "root": ROOT},
        {"origin": "a\nb", "size": 1, "root": ROOT},
        {"origin": "o", "size": -1, "root": ROOT},
        {"origin": "o", "size": True, "root": ROOT},
        {"origin": "o", "size": 1 << 64, "root": ROOT},
        {"origin": "o", "size": 1, "root": ROOT[:31]},
        {"origin": "o", "size": 1, "root": ROOT.hex()},
        {"origin": "o", "size": 1, "root": ROOT, "extensions": ("",)},
        {"origin": "o", "size": 1, "root": ROOT, "extensions": ("a\nb",)},
        {"origin": "o", "size": 1, "root": ROOT, "extensions": ["a"]},
    ],
)
def test_checkpoint_values_are_validated_on_construction(kwargs: dict) -> None:
    with pytest.raises(CheckpointError):
        Checkpoint(**kwargs)
