"""Signed checkpoints: C2SP tlog-checkpoint bodies inside C2SP signed notes.

A checkpoint is the journal's Merkle tree head — origin, tree size, root hash —
signed with Ed25519 so it can be exported and kept elsewhere. A verifier holding
one detects a journal that was truncated or rewritten after it was signed. The
format is the one transparency logs use (c2sp.org/tlog-checkpoint,
c2sp.org/signed-note, golang.org/x/mod/sumdb/note), so standard tooling reads it.

Checkpoint body (note text)::

    <origin>\\n
    <tree size, decimal, no leading zeros>\\n
    <base64 root hash>\\n
    [<extension line>\\n ...]

Signed note: the body, a blank line, then one or more signature lines::

    — <key name> <base64(4-byte key id || 64-byte Ed25519 signature)>\\n

The dash is U+2014 EM DASH. The key id is the first four bytes of
SHA-256(key name || 0x0A || 0x01 || 32-byte public key), and a verifier key is
written ``<name>+<8 hex key id>+<base64(0x01 || public key)>``.

Verification follows the spec: signatures from unknown keys (name and key id
not both matching a known key) are kept but ignored; a signature from a known
key that fails is an error; a note with no verified signature is rejected.
Malformed notes and failed verification raise :class:`CheckpointError`
(INTEGRITY_FAILURE); malformed key strings and names raise
:class:`~apollia_nb.errors.BadInput`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

from apollia_nb.errors import BadInput, IntegrityError

__all__ = [
    "CheckpointError",
    "Checkpoint",
    "parse_checkpoint",
    "NoteSignature",
    "NoteSigner",
    "NoteVerifier",
    "key_id",
    "parse_note",
    "verify_note",
    "open_checkpoint",
    "MAX_SIGNATURES",
]

ALG_ED25519 = 0x01
MAX_SIGNATURES = 100
_SIG_PREFIX = "\u2014 "  # EM DASH, SPACE
_MAX_SIZE = (1 << 64) - 1
_SIZE_RE = re.compile(r"0|[1-9][0-9]{0,19}")  # 2^64 - 1 has 20 digits; no longer run becomes an int
_KEY_ID_RE = re.compile(r"[0-9a-fA-F]{8}")
_CONTROL_RE = re.compile(r"[\x00-\x09\x0b-\x1f]")


class CheckpointError(IntegrityError):
    """A checkpoint or signed note is malformed or does not verify (INTEGRITY_FAILURE)."""


# --- small strict helpers -------------------------------------------------------


def _b64decode(text: str) -> bytes | None:
    """Standard base64 (RFC 4648 §4), padded and canonical; None when it is not."""
    try:
        raw = binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != text:
        return None
    return raw


def _b64encode(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _valid_key_name(name: object) -> bool:
    """Non-empty, no Unicode spaces, no '+', no control characters."""
    return (
        isinstance(name, str)
        and name != ""
        and "+" not in name
        and not any(ch.isspace() for ch in name)
        and _CONTROL_RE.search(name) is None
        and _utf8_ok(name)
    )


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _clean_text(text: str) -> bool:
    """Valid UTF-8 with no ASCII control characters other than newline."""
    return _CONTROL_RE.search(text) is None and _utf8_ok(text)


def key_id(name: str, public_key: bytes) -> bytes:
    """The 4-byte Ed25519 key id: SHA-256(name || 0x0A || 0x01 || public key)[:4]."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ALG_ED25519]) + public_key).digest()[:4]


# --- checkpoint bodies ----------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: who (origin), how many leaves (size), and the Merkle root."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.origin, str) or not self.origin:
            raise CheckpointError("checkpoint origin must be a non-empty string")
        if "\n" in self.origin or not _clean_text(self.origin):
            raise CheckpointError("checkpoint origin must be one line without control characters")
        if (
            not isinstance(self.size, int)
            or isinstance(self.size, bool)
            or not 0 <= self.size <= _MAX_SIZE
        ):
            raise CheckpointError(f"checkpoint size must be an integer in [0, 2^64), got {self.size!r}")
        if not isinstance(self.root, bytes) or len(self.root) != 32:
            raise CheckpointError("checkpoint root must be 32 bytes")
        if not isinstance(self.extensions, tuple):
            raise CheckpointError("checkpoint extensions must be a tuple of strings")
        for line in self.extensions:
            if not isinstance(line, str) or not line or "\n" in line or not _clean_text(line):
                raise CheckpointError("checkpoint extension lines must be non-empty single lines")

    def body(self) -> str:
        """The note text: origin, size, base64 root, extension lines, each ending in newline."""
        lines = [self.origin, str(self.size), _b64encode(self.root), *self.extensions]
        return "".join(line + "\n" for line in lines)


def parse_checkpoint(body: str) -> Checkpoint:
    """Parse a checkpoint body strictly (c2sp.org/tlog-checkpoint)."""
    if not isinstance(body, str) or not body.endswith("\n"):
        raise CheckpointError("checkpoint body must end with a newline")
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointError("checkpoint body needs origin, size and root hash lines")
    origin, size_text, root_text, *extensions = lines
    if not origin:
        raise CheckpointError("checkpoint origin is empty")
    if not _SIZE_RE.fullmatch(size_text):
        raise CheckpointError(f"checkpoint size {size_text[:40]!r} is not a decimal of at most 20 digits "
                              "without leading zeros")
    size = int(size_text)
    if size > _MAX_SIZE:
        raise CheckpointError("checkpoint size does not fit in 64 bits")
    root = _b64decode(root_text)
    if root is None or len(root) != 32:
        raise CheckpointError("checkpoint root is not the base64 of 32 bytes")
    if any(line == "" for line in extensions):
        raise CheckpointError("checkpoint extension lines must be non-empty")
    return Checkpoint(origin, size, root, tuple(extensions))


# --- keys -----------------------------------------------------------------------


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: key name, 4-byte key id, and the signature bytes after it."""

    name: str
    key_id: bytes
    signature: bytes

    def line(self) -> str:
        """The signature line as it appears in a note, newline included."""
        return f"{_SIG_PREFIX}{self.name} {_b64encode(self.key_id + self.signature)}\n"


class NoteSigner:
    """Signs note texts with an Ed25519 key under a key name."""

    def __init__(self, name: str, signing_key: nacl.signing.SigningKey) -> None:
        if not _valid_key_name(name):
            raise BadInput(f"invalid note key name {name!r}: non-empty, no spaces, no '+'")
        if not isinstance(signing_key, nacl.signing.SigningKey):
            raise BadInput("signing_key must be a nacl.signing.SigningKey")
        self.name = name
        self._signing_key = signing_key
        self.public_key: bytes = bytes(signing_key.verify_key)
        self.key_id: bytes = key_id(name, self.public_key)

    def verifier_key(self) -> str:
        """``<name>+<8 hex key id>+<base64(0x01 || public key)>``."""
        return f"{self.name}+{self.key_id.hex()}+{_b64encode(bytes([ALG_ED25519]) + self.public_key)}"

    def verifier(self) -> NoteVerifier:
        return NoteVerifier(self.name, self.public_key)

    def signature(self, body: str) -> NoteSignature:
        """The signature of a note text, not yet placed in a note."""
        if not isinstance(body, str) or not body.endswith("\n"):
            raise BadInput("note text must end with a newline")
        if not _clean_text(body):
            raise BadInput("note text must be UTF-8 without control characters other than newline")
        sig = self._signing_key.sign(body.encode("utf-8")).signature
        return NoteSignature(self.name, self.key_id, sig)

    def sign(self, body: str) -> str:
        """The whole signed note: body, blank line, one signature line."""
        return body + "\n" + self.signature(body).line()

    def __repr__(self) -> str:
        return f"NoteSigner({self.name!r}, key_id={self.key_id.hex()})"


@dataclass(frozen=True)
class NoteVerifier:
    """A known Ed25519 key under a key name; ``key_id`` is derived from both."""

    name: str
    public_key: bytes

    def __post_init__(self) -> None:
        if not _valid_key_name(self.name):
            raise BadInput(f"invalid note key name {self.name!r}: non-empty, no spaces, no '+'")
        if not isinstance(self.public_key, bytes) or len(self.public_key) != 32:
            raise BadInput("an Ed25519 public key is 32 bytes")

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.public_key)

    @classmethod
    def from_key(cls, vkey: str) -> NoteVerifier:
        """Parse ``<name>+<8 hex key id>+<base64(0x01 || 32-byte public key)>``."""
        if not isinstance(vkey, str):
            raise BadInput("verifier key must be a string")
        parts = vkey.split("+", 2)
        if len(parts) != 3:
            raise BadInput("malformed verifier key: want <name>+<key id>+<key>")
        name, id_hex, key_b64 = parts
        if not _valid_key_name(name):
            raise BadInput(f"malformed verifier key: invalid name {name!r}")
        if not _KEY_ID_RE.fullmatch(id_hex):
            raise BadInput("malformed verifier key: key id must be 8 hex digits")
        raw = _b64decode(key_b64)
        if not raw:
            raise BadInput("malformed verifier key: key is not base64")
        if raw[0] != ALG_ED25519:
            raise BadInput(f"unsupported verifier key algorithm {raw[0]:#04x}")
        if len(raw) != 33:
            raise BadInput("malformed verifier key: an Ed25519 key is 32 bytes")
        verifier = cls(name, raw[1:])
        if verifier.key_id != bytes.fromhex(id_hex):
            raise BadInput("verifier key id does not match its name and key")
        return verifier

    def key(self) -> str:
        """The verifier key string this verifier was (or could be) parsed from."""
        return f"{self.name}+{self.key_id.hex()}+{_b64encode(bytes([ALG_ED25519]) + self.public_key)}"

    def verifies(self, body: str, signature: NoteSignature) -> bool:
        """Whether ``signature`` is this key's valid signature of ``body``."""
        if signature.name != self.name or signature.key_id != self.key_id:
            return False
        if len(signature.signature) != 64:
            return False
        try:
            nacl.signing.VerifyKey(self.public_key).verify(body.encode("utf-8"), signature.signature)
        except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError):
            return False
        return True


# --- notes ----------------------------------------------------------------------


def _note_text(text: str | bytes) -> str:
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError("malformed note: not valid UTF-8") from None
    if not isinstance(text, str):
        raise CheckpointError("a signed note must be text")
    return text


def parse_note(text: str | bytes) -> tuple[str, list[NoteSignature]]:
    """Split a signed note into its text and signature lines, checking only syntax.

    The text is everything up to and including the newline before the last blank
    line. Nothing is verified here; use :func:`verify_note`. Bytes must be UTF-8.
    """
    text = _note_text(text)
    if not _clean_text(text):
        raise CheckpointError("malformed note: control characters or invalid UTF-8")
    split = text.rfind("\n\n")
    if split < 0:
        raise CheckpointError("malformed note: no blank line before the signatures")
    body, block = text[: split + 1], text[split + 2 :]
    if not block or not block.endswith("\n"):
        raise CheckpointError("malformed note: signature block missing or not ending in newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise CheckpointError(f"malformed note: more than {MAX_SIGNATURES} signatures")
    signatures: list[NoteSignature] = []
    for line in lines:
        if not line.startswith(_SIG_PREFIX):
            raise CheckpointError("malformed note: signature line does not start with '\u2014 '")
        name, sep, sig_b64 = line[len(_SIG_PREFIX) :].partition(" ")
        if not sep or not _valid_key_name(name):
            raise CheckpointError("malformed note: bad key name in signature line")
        raw = _b64decode(sig_b64)
        if raw is None or len(raw) < 5:
            raise CheckpointError("malformed note: signature is not base64 of a key id and signature")
        signatures.append(NoteSignature(name, raw[:4], raw[4:]))
    return body, signatures


def verify_note(text: str | bytes, verifiers: Sequence[NoteVerifier]) -> str:
    """Return the note text when a known key's signature verifies.

    A signature whose key name and key id both match a known verifier must
    verify, or the whole note is rejected. Other signatures are ignored.
    Raises :class:`CheckpointError`.
    """
    body, signatures = parse_note(text)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified = 0
    for sig in signatures:
        verifier = known.get((sig.name, sig.key_id))
        if verifier is None:
            continue
        if not verifier.verifies(body, sig):
            raise CheckpointError(f"invalid signature for key {sig.name}+{sig.key_id.hex()}")
        verified += 1
    if not verified:
        raise CheckpointError("note has no signature from a known key")
    return body


def open_checkpoint(
    text: str | bytes, verifiers: Sequence[NoteVerifier], *, origin: str | None = None
) -> Checkpoint:
    """Verify a signed checkpoint note and parse its body.

    With ``origin``, the checkpoint must also name that origin.
    """
    checkpoint = parse_checkpoint(verify_note(text, verifiers))
    if origin is not None and checkpoint.origin != origin:
        raise CheckpointError(f"checkpoint origin {checkpoint.origin!r} is not {origin!r}")
    return checkpoint
