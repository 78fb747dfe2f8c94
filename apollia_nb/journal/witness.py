"""Witness cosignatures: C2SP tlog-cosignature/v1 and the tlog-witness protocol, pure.

A witness keeps, for every log it trusts, the latest checkpoint it cosigned. It
cosigns a new checkpoint only when a consistency proof shows that the new tree
extends the one it holds, so a log whose key holder rewrites, rolls back or
forks its history cannot get that history cosigned.

Cosignature (c2sp.org/tlog-cosignature, Ed25519 type): a note signature line ::

    — <witness name> base64(4-byte key id || u64be(timestamp) || 64-byte Ed25519 signature)

where the key id is SHA-256(name || 0x0A || 0x04 || public key)[:4] and the
signature is over ::

    cosignature/v1\\n
    time <timestamp>\\n
    <checkpoint body, final newline included>

A witness verifier key is ``<name>+<8 hex key id>+<base64(0x04 || public key)>``.
The signed message does not hold the witness's name: two keys with one public key are
one witness, however they are named, and count once toward a quorum.

add-checkpoint request (c2sp.org/tlog-witness, as revised in July 2026) ::

    old <size>\\n
    <base64 consistency proof hash>\\n   (zero to 63 lines)
    \\n
    <signed checkpoint note>

Everything here is values in, values out: :func:`witness_decide` is the
witness's whole decision given what it holds; :func:`check_cosigned` is the
auditor's check of a journal's checkpoints and cosignatures.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nacl.exceptions
import nacl.signing

from apollia_nb.errors import BadInput
from apollia_nb.journal.checkpoint import (
    Checkpoint,
    CheckpointError,
    NoteSignature,
    NoteVerifier,
    parse_checkpoint,
    parse_note,
    verify_note,
)
from apollia_nb.journal.merkle import (
    EMPTY_ROOT,
    HASH_SIZE,
    ProofError,
    verify_consistency,
)

__all__ = [
    "ALG_COSIGNATURE_V1",
    "MAX_PROOF_LINES",
    "MAX_WITNESSED_SIZE",
    "AddCheckpoint",
    "Cosignature",
    "CosignatureVerifier",
    "CosignedCheck",
    "Cosigner",
    "WitnessAnswer",
    "WitnessRecord",
    "check_cosigned",
    "cosigned_message",
    "format_add_checkpoint",
    "parse_add_checkpoint",
    "parse_cosignature_lines",
    "witness_decide",
]

ALG_COSIGNATURE_V1 = 0x04
MAX_PROOF_LINES = 63
_SIG_PREFIX = "\u2014 "
#: At most 20 digits: 2^64 - 1 has 20 (and a longer run of digits is never turned into an int).
_OLD_RE = re.compile(r"old (0|[1-9][0-9]{0,19})")
_MAX_U64 = (1 << 64) - 1
#: The largest tree size a witness records (its database keeps signed 64-bit integers).
MAX_WITNESSED_SIZE = (1 << 63) - 1
_KEY_ID_RE = re.compile(r"[0-9a-fA-F]{8}")
_MAX_TIME = (1 << 63) - 1


def _key_id(name: str, public_key: bytes) -> bytes:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ALG_COSIGNATURE_V1]) + public_key).digest()[:4]


def cosigned_message(body: str, timestamp: int) -> bytes:
    """The bytes a cosignature/v1 signs: header line, time line, the checkpoint body."""
    return f"cosignature/v1\ntime {timestamp}\n{body}".encode()


@dataclass(frozen=True)
class Cosignature:
    """One witness's cosignature of one checkpoint body."""

    name: str
    key_id: bytes
    timestamp: int
    signature: bytes

    def line(self) -> str:
        raw = self.key_id + struct.pack(">Q", self.timestamp) + self.signature
        return f"{_SIG_PREFIX}{self.name} {base64.b64encode(raw).decode('ascii')}\n"

    @classmethod
    def from_note_signature(cls, sig: NoteSignature) -> Cosignature | None:
        """The cosignature a note signature line carries; None when it is not 8 + 64 bytes."""
        if len(sig.signature) != 8 + 64:
            return None
        (timestamp,) = struct.unpack(">Q", sig.signature[:8])
        return cls(sig.name, sig.key_id, timestamp, sig.signature[8:])


class Cosigner:
    """A witness's signing key under its name."""

    def __init__(self, name: str, signing_key: nacl.signing.SigningKey) -> None:
        self.verifier = CosignatureVerifier(name, bytes(signing_key.verify_key))  # checks the name
        self.name = name
        self._signing_key = signing_key

    def verifier_key(self) -> str:
        return self.verifier.key()

    def cosign(self, body: str, timestamp: int) -> Cosignature:
        # tlog-witness: the timestamp of an add-checkpoint cosignature must not be zero.
        if not isinstance(timestamp, int) or not 1 <= timestamp <= _MAX_TIME:
            raise BadInput(f"a cosignature time is a POSIX timestamp from 1 to 2^63 - 1, got {timestamp!r}")
        sig = self._signing_key.sign(cosigned_message(body, timestamp)).signature
        return Cosignature(self.name, self.verifier.key_id, timestamp, sig)


@dataclass(frozen=True)
class CosignatureVerifier:
    """A witness's public key (signature type 0x04) under its name."""

    name: str
    public_key: bytes

    def __post_init__(self) -> None:
        NoteVerifier(self.name, self.public_key)  # same rules for names and key sizes

    @property
    def key_id(self) -> bytes:
        return _key_id(self.name, self.public_key)

    def key(self) -> str:
        raw = bytes([ALG_COSIGNATURE_V1]) + self.public_key
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(raw).decode('ascii')}"

    @classmethod
    def from_key(cls, vkey: str) -> CosignatureVerifier:
        """Parse ``<name>+<8 hex key id>+<base64(0x04 || 32-byte public key)>``."""
        if not isinstance(vkey, str):
            raise BadInput("witness key must be a string")
        parts = vkey.strip().split("+", 2)
        if len(parts) != 3:
            raise BadInput(f"malformed witness key {vkey!r}: want <name>+<key id>+<key>")
        name, id_hex, key_b64 = parts
        if not _KEY_ID_RE.fullmatch(id_hex):
            raise BadInput(f"malformed witness key {vkey!r}: the key id must be 8 hex digits")
        try:
            raw = base64.b64decode(key_b64, validate=True)
        except ValueError:
            raise BadInput(f"malformed witness key {vkey!r}: the key is not base64") from None
        if len(raw) != 33 or raw[0] != ALG_COSIGNATURE_V1:
            raise BadInput(f"witness key {vkey!r} is not a cosignature/v1 key (type 0x04, 32-byte Ed25519)")
        verifier = cls(name, raw[1:])
        if verifier.key_id != bytes.fromhex(id_hex):
            raise BadInput(f"witness key {vkey!r}: the key id does not match its name and key")
        return verifier

    def matches(self, cosig: Cosignature) -> bool:
        return cosig.name == self.name and cosig.key_id == self.key_id

    def verifies(self, body: str, cosig: Cosignature) -> bool:
        """Whether ``cosig`` is this witness's valid cosignature of checkpoint ``body``."""
        if not self.matches(cosig) or len(cosig.signature) != 64 or cosig.timestamp > _MAX_TIME:
            return False
        try:
            nacl.signing.VerifyKey(self.public_key).verify(cosigned_message(body, cosig.timestamp), cosig.signature)
        except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
            return False
        return True


def parse_cosignature_lines(text: str) -> list[Cosignature]:
    """Signature lines (a witness's 200 response, or a stored line) as cosignatures.

    Lines of other signature types (not 4 + 8 + 64 bytes) are skipped; a line that is
    not a note signature line raises :class:`CheckpointError`."""
    if not isinstance(text, str) or not text.endswith("\n") or not text.startswith(_SIG_PREFIX):
        raise CheckpointError("cosignatures are note signature lines, each ending in a newline")
    # parse_note needs a body: any one-line text does, signatures are not checked here.
    _, sigs = parse_note("x\n\n" + text)
    return [c for s in sigs if (c := Cosignature.from_note_signature(s)) is not None]


# --- the tlog-witness request ---------------------------------------------------------


@dataclass(frozen=True)
class AddCheckpoint:
    """An add-checkpoint request: old size, consistency proof, signed checkpoint note."""

    old_size: int
    proof: tuple[bytes, ...]
    note: str


def format_add_checkpoint(old_size: int, proof: Sequence[bytes], note: str) -> bytes:
    lines = [f"old {old_size}", *(base64.b64encode(h).decode("ascii") for h in proof), ""]
    return ("\n".join(lines) + "\n" + note).encode("utf-8")


def parse_add_checkpoint(data: bytes) -> AddCheckpoint:
    """Parse a request body strictly; anything malformed raises :class:`BadInput` (a 400)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("the request is not UTF-8") from None
    head, sep, note = text.partition("\n\n")
    if not sep:
        raise BadInput("the request has no empty line before the checkpoint")
    lines = head.split("\n")
    match = _OLD_RE.fullmatch(lines[0])
    if match is None:
        raise BadInput("the request must start with 'old <size>': a decimal of at most 20 digits, "
                       "without leading zeros or a sign")
    old = int(match.group(1))
    if old > _MAX_U64:
        raise BadInput("the old size does not fit in 64 bits")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise BadInput(f"more than {MAX_PROOF_LINES} consistency proof lines")
    proof = []
    for line in lines[1:]:
        try:
            h = base64.b64decode(line, validate=True)
        except ValueError:
            raise BadInput("a consistency proof line is not base64") from None
        if len(h) != HASH_SIZE or base64.b64encode(h).decode("ascii") != line:
            raise BadInput(f"a consistency proof line is not the base64 of {HASH_SIZE} bytes")
        proof.append(h)
    return AddCheckpoint(old, tuple(proof), note)


# --- the witness's decision -------------------------------------------------------------


@dataclass(frozen=True)
class WitnessRecord:
    """What a witness holds for one origin: the latest checkpoint it cosigned."""

    size: int
    root: bytes
    note: str


@dataclass(frozen=True)
class WitnessAnswer:
    """The HTTP status and body of an answer; ``record`` is what to store before a 200."""

    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"
    record: WitnessRecord | None = None
    checkpoint: Checkpoint | None = None


def witness_decide(
    request: bytes,
    *,
    trusted: Mapping[str, Sequence[NoteVerifier]],
    held: Mapping[str, WitnessRecord] | None = None,
    lookup: Any = None,
) -> WitnessAnswer:
    """Decide an add-checkpoint request given the trusted log keys (by origin) and what is held.

    ``held`` maps origin to the latest cosigned record (or use ``lookup(origin)``). Returns the
    answer; on 200 its ``record`` must be stored (atomically with the lookup) before replying
    and the caller adds its cosignature of ``checkpoint``."""
    try:
        req = parse_add_checkpoint(request)
        body, _ = parse_note(req.note)
        cp = parse_checkpoint(body)
    except (BadInput, CheckpointError) as exc:
        return WitnessAnswer(400, f"{exc.message}\n")
    keys = trusted.get(cp.origin)
    if not keys:
        return WitnessAnswer(404, f"unknown log origin {cp.origin!r}\n")
    try:
        verify_note(req.note, keys)
    except CheckpointError as exc:
        return WitnessAnswer(403, f"the checkpoint is not signed by a key trusted for {cp.origin}: {exc.message}\n")
    if req.old_size > cp.size:
        return WitnessAnswer(400, f"old size {req.old_size} is larger than the checkpoint size {cp.size}\n")
    if cp.size > MAX_WITNESSED_SIZE:
        return WitnessAnswer(400, f"this witness records tree sizes up to 2^63 - 1, not {cp.size}\n")
    record = lookup(cp.origin) if lookup is not None else (held or {}).get(cp.origin)
    current = record.size if record is not None else 0
    if req.old_size != current:
        return WitnessAnswer(409, f"{current}\n", "text/x.tlog.size")
    if cp.size == 0 and cp.root != EMPTY_ROOT:
        return WitnessAnswer(422, "a checkpoint of size 0 must have the empty tree's root hash\n")
    if req.old_size == 0:
        if req.proof:
            return WitnessAnswer(422, "a proof from size 0 must be empty\n")
    elif req.old_size == cp.size:
        assert record is not None  # current == old_size > 0
        if record.root != cp.root:
            return WitnessAnswer(422, f"the witness holds another root hash for size {cp.size}: a fork\n")
        if req.proof:
            return WitnessAnswer(422, "equal sizes need an empty consistency proof\n")
    else:
        assert record is not None
        try:
            verify_consistency(record.size, cp.size, record.root, cp.root, list(req.proof))
        except ProofError as exc:
            return WitnessAnswer(422, f"the consistency proof does not verify: {exc.message}\n")
    return WitnessAnswer(200, "", record=WitnessRecord(cp.size, cp.root, req.note), checkpoint=cp)


# --- the auditor's check ----------------------------------------------------------------


@dataclass(frozen=True)
class CosignedCheck:
    """Whether the newest checkpoint covers the journal and carries ``quorum`` valid cosignatures."""

    ok: bool
    size: int | None
    quorum: int
    cosigned_by: tuple[str, ...]
    missing: tuple[str, ...]
    problem: str | None
    witnesses: tuple[dict[str, Any], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checkpoint_size": self.size,
            "quorum": self.quorum,
            "cosigned_by": list(self.cosigned_by),
            "missing": list(self.missing),
            "problem": self.problem,
            "witnesses": [dict(w) for w in self.witnesses],
        }


def check_cosigned(
    *,
    entries: int,
    checkpoints: Sequence[tuple[int, bytes, str]],
    cosignatures: Sequence[tuple[int, str]],
    witnesses: Sequence[str],
    quorum: int | None = None,
) -> CosignedCheck:
    """The auditor's witness check over a journal that otherwise verified.

    ``checkpoints`` are the stored ``(size, root, note)`` rows, ``cosignatures`` the
    stored ``(size, line)`` rows, ``witnesses`` the auditor's witness verifier keys.
    The newest checkpoint must cover all ``entries`` (nothing after it is witnessed)
    and carry valid cosignatures from at least ``quorum`` (default: all) witnesses.
    Each witness's newest valid cosigned size is reported beside.

    Witnesses are told apart by public key, not by their place in ``witnesses`` nor by
    name (a cosignature signs no name): a key given twice, under one name or two, is
    one witness and counts once, and ``quorum`` may not exceed the distinct ones."""
    verifiers: list[CosignatureVerifier] = []
    named: dict[bytes, int] = {}
    for w in witnesses:
        v = CosignatureVerifier.from_key(w)
        named[v.public_key] = named.get(v.public_key, 0) + 1
        if named[v.public_key] == 1:
            verifiers.append(v)
    if not verifiers:
        raise BadInput("name at least one witness key")
    need = len(verifiers) if quorum is None else quorum
    if type(need) is not int or not 1 <= need <= len(verifiers):
        twice = [f"{v.name} ({named[v.public_key]} times)" for v in verifiers if named[v.public_key] > 1]
        told = f"; the same witness key was given more than once: {', '.join(twice)}" if twice else ""
        raise BadInput(f"--quorum must be between 1 and the {len(verifiers)} distinct witness key(s) given, "
                       f"got {quorum!r}{told}")
    bodies: dict[int, str] = {}
    for size, _root, note in checkpoints:
        try:
            bodies[int(size)] = parse_note(note)[0]
        except CheckpointError:
            continue
    valid: dict[str, set[int]] = {v.key(): set() for v in verifiers}
    for size, line in cosignatures:
        body = bodies.get(int(size))
        if body is None:
            continue
        try:
            cosigs = parse_cosignature_lines(line)
        except CheckpointError:
            continue
        for cosig in cosigs:
            for v in verifiers:
                if v.verifies(body, cosig):
                    valid[v.key()].add(int(size))
    newest = max(bodies) if bodies else None
    report = tuple({"key": v.key(), "name": v.name,
                    "cosigned_size": max(valid[v.key()]) if valid[v.key()] else None} for v in verifiers)
    if newest is None:
        return CosignedCheck(False, None, need, (), tuple(v.key() for v in verifiers),
                             "the journal has no checkpoint", report)
    by = tuple(v.key() for v in verifiers if newest in valid[v.key()])
    missing = tuple(v.key() for v in verifiers if newest not in valid[v.key()])
    if newest < entries:
        return CosignedCheck(False, newest, need, by, missing,
                             f"entries {newest + 1}..{entries} are after the newest checkpoint (size {newest}): "
                             "no witness has seen them", report)
    if len(by) < need:
        names = ", ".join(
            f"{w['name']} (its newest cosignature: "
            f"{'none' if w['cosigned_size'] is None else 'size ' + str(w['cosigned_size'])})"
            for w in report if w["key"] in missing)
        return CosignedCheck(False, newest, need, by, missing,
                             f"the checkpoint of size {newest} has {len(by)} of the {need} cosignature(s) "
                             f"required; missing: {names}", report)
    return CosignedCheck(True, newest, need, by, missing, None, report)
