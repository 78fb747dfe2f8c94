"""The journal's Ed25519 signing key, kept in the home's ``keys/`` folder.

Files (created on first use, never overwritten):

``keys/journal.key``
    base64 of the 32-byte Ed25519 seed and a newline, mode 0600.
``keys/journal.pub``
    base64 of the 32-byte public key and a newline, mode 0644.

A file is written under a temporary name and then hard-linked into place, so
two processes racing to create the key end up sharing the one that won, and a
crash never leaves a half-written key.

The key id stored with every entry is ``key_id(public_key)``: the first 8
bytes of SHA-256 over the raw 32-byte public key, as 16 lowercase hex digits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey, VerifyKey

from apollia_nb.errors import IntegrityError
from apollia_nb.home import Home

__all__ = [
    "KEY_FILE",
    "PUB_FILE",
    "JournalKey",
    "key_id",
    "load_or_create",
    "load_public_key",
    "read_public_key",
]

KEY_FILE = "journal.key"
PUB_FILE = "journal.pub"


def key_id(public_key: bytes) -> str:
    """16 hex digits: the first 8 bytes of SHA-256(public key)."""
    return hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class JournalKey:
    """The signing key and what is derived from it."""

    signing_key: SigningKey
    public_key: bytes
    key_id: str

    @classmethod
    def from_seed(cls, seed: bytes) -> JournalKey:
        sk = SigningKey(seed)
        pk = bytes(sk.verify_key)
        return cls(sk, pk, key_id(pk))

    def sign(self, message: bytes) -> bytes:
        return self.signing_key.sign(message).signature

    @property
    def verify_key(self) -> VerifyKey:
        return self.signing_key.verify_key


def _decode(path: Path, size: int) -> bytes:
    try:
        data = base64.b64decode(path.read_text().strip(), validate=True)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise IntegrityError(f"{path} is not base64") from None
    if len(data) != size:
        raise IntegrityError(f"{path} holds {len(data)} bytes, expected {size}")
    return data


def _write_once(path: Path, data: bytes, mode: int) -> bool:
    """Create ``path`` atomically with ``data``; False if it already exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.chmod(tmp, mode)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def load_or_create(home: Home) -> JournalKey:
    """The home's journal key, created (seed 0600, public key 0644) when missing."""
    home.keys_dir.mkdir(parents=True, exist_ok=True)
    key_path = home.keys_dir / KEY_FILE
    if not key_path.exists():
        seed = os.urandom(32)
        _write_once(key_path, base64.b64encode(seed) + b"\n", 0o600)
    key = JournalKey.from_seed(_decode(key_path, 32))
    pub_path = home.keys_dir / PUB_FILE
    if not pub_path.exists():
        _write_once(pub_path, base64.b64encode(key.public_key) + b"\n", 0o644)
    elif read_public_key(pub_path) != key.public_key:
        raise IntegrityError(f"{pub_path} does not match {key_path}")
    return key


def read_public_key(path: Path) -> bytes:
    """The raw 32-byte public key from a base64 ``journal.pub`` file."""
    return _decode(path, 32)


def load_public_key(home: Home) -> bytes:
    """The home's journal public key (from ``journal.pub``, else derived from the seed)."""
    pub_path = home.keys_dir / PUB_FILE
    if pub_path.exists():
        return read_public_key(pub_path)
    key_path = home.keys_dir / KEY_FILE
    if key_path.exists():
        return JournalKey.from_seed(_decode(key_path, 32)).public_key
    raise IntegrityError(f"no journal key in {home.keys_dir}")
