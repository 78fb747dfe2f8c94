"""Verify a journal offline: every hash, link, key id and signature, and every checkpoint.

The core, :func:`verify_rows`, is pure over rows and keys; thin readers feed it
from a ``journal.db`` file (:func:`verify_file`, :func:`verify_home`), an open
:class:`~apollia_nb.journal.store.Journal` (:func:`verify_journal`) or an exported
bundle (:func:`verify_bundle`).

Checks, for entries in ``seq`` order:

1. ``seq`` runs 1, 2, 3, … with no gap and no duplicate;
2. ``prev_hash`` is the previous entry's ``hash`` (32 zero bytes for seq 1);
3. ``hash`` is the SHA-256 of the entry's encoding (``entry.entry_hash``; for a salted
   payload, format 2, ``entry.entry_hash_v2`` over the commitments its present fields'
   values and salts give, with the commitments of its erased fields);
4. ``key_id`` names the journal key, and ``signature`` is its valid Ed25519
   signature of ``hash``;
5. every stored checkpoint and the given external one verifies as a signed note
   under the journal's key and origin, and the first ``size`` entry hashes have
   exactly its Merkle root; a checkpoint larger than the journal means entries
   were deleted from its end;
6. a field erased from a salted payload (value and salt gone, commitment kept) is named by
   a later ``erasure`` entry; one that is not was removed behind the journal's back.

The result names the first bad sequence number. Signatures dominate the cost
(libsodium's Ed25519 verify ≈ 18,000–20,000/s on one core, ed25519-zebra's about
1.35× that, against ≈ 6 µs an entry for everything else), so large journals verify
them in a pool of worker processes while this process checks hashes, links and roots.
"""

from __future__ import annotations

import functools
import json as _json
import os
import queue
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from apollia_nb.dbutil import MEMORY_LIMIT, limit_memory
from apollia_nb.errors import BadInput, IntegrityError, NotFound
from apollia_nb.journal.bundle import BUNDLE_FILES, read_bundle_key, read_bundle_meta
from apollia_nb.journal.checkpoint import Checkpoint, NoteVerifier, open_checkpoint
from apollia_nb.journal.entry import (
    GENESIS_HASH,
    SALTS_KEY,
    entry_hash,
    entry_hash_v2,
    sealed_committed,
    sliced_committed,
)
from apollia_nb.journal.merkle import EMPTY_ROOT, MerkleAccumulator, leaf_hash

if TYPE_CHECKING:
    from apollia_nb.home import Home
    from apollia_nb.journal.contract import JournalFace

__all__ = [
    "VerifyReport",
    "verify_rows",
    "verify_journal",
    "verify_file",
    "verify_home",
    "verify_bundle",
    "cosigned_rows_of_file",
    "cosigned_rows_of_bundle",
    "PARALLEL_MIN",
    "CHUNK",
]

#: Below this many entries signatures are checked inline (a worker costs ~0.1 s to start).
PARALLEL_MIN = 8_000
#: Rows per chunk read from DuckDB and handed to a worker.
CHUNK = 2_500
#: Chunks a worker holds unanswered at most (the reader waits for room: memory stays bounded).
INFLIGHT = 4
#: Rows per seq range read from DuckDB (each range is sorted on its own, so the sort stays small).
RANGE = 50_000
#: DuckDB's memory while a closed ``journal.db`` is read as stored (no sort: only the blocks
#: being read are held, and its cache of blocks read before stays this small).
STREAM_MEMORY = "8MB"

_COLUMNS = "seq, ts, run_id, agent, kind, payload, prev_hash, hash, signature, key_id"
_SALTS_MARK = b'"@salts":'


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a verification.

    ``entries``: how many leading entries passed every check (all of them when
    ``ok``); ``first_bad_seq``: the first entry that did not (for a deleted tail,
    the first missing seq; None when only a checkpoint's root or signature
    failed, which does not say where); ``problem``: what was wrong;
    ``checked_checkpoints``: stored and given checkpoints that verified;
    ``notes``: what did not go as planned without changing the outcome (a
    signature worker that failed, whose signatures this process checked);
    ``losses``: the losses of acknowledged entries a repair recorded in the
    journal (``apollia-os home repair --lost-entries``), each the record's
    ``seq``, the entries ``kept`` before it, the ``lost`` seq range (its
    ``entry_lost`` entries; None when only a cut log said so), whether
    ``journal.log`` was ``cut``, and the stored ``superseded`` checkpoints that
    covered lost entries (not verified against the new entries, by design).
    """

    ok: bool
    entries: int
    first_bad_seq: int | None
    problem: str | None
    checked_checkpoints: int
    notes: tuple[str, ...] = ()
    losses: tuple[dict[str, Any], ...] = ()
    #: payload fields erased (value and salt gone, commitment verified), each named by an ``erasure`` entry
    erased: int = 0
    #: the journal's entry format when the reader knows it (``meta.format``): "1" whole payloads, "2" salted
    format: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ok": self.ok,
            "entries": self.entries,
            "first_bad_seq": self.first_bad_seq,
            "problem": self.problem,
            "checked_checkpoints": self.checked_checkpoints,
        }
        if self.notes:  # only when something went wrong on the way
            data["notes"] = list(self.notes)
        if self.losses:  # only when a repair recorded a loss
            data["losses"] = [dict(loss) for loss in self.losses]
        if self.format is not None:
            data["format"] = self.format
        if self.erased:
            data["erased"] = self.erased
        return data

    def summary(self) -> str:
        return (self._outcome() + "".join(f"\nnote: {note}" for note in self.notes)
                + "".join(f"\nloss: {_loss_text(loss)}" for loss in self.losses))

    def _outcome(self) -> str:
        if self.ok:
            text = (
                f"ok: {self.entries} entries verified (chain, hashes, signatures), "
                f"{self.checked_checkpoints} checkpoint(s)"
            )
            if self.format is not None:
                text += f"; format {self.format} ({_FORMAT_WORDS.get(self.format, 'unknown')})"
            if self.erased:
                text += f"; {self.erased} field(s) erased (commitments verified, payloads gone)"
            return text
        if self.first_bad_seq is None:  # a checkpoint or key failed without pointing at one entry
            return f"FAILED: {self.problem}"
        return f"FAILED at seq {self.first_bad_seq}: {self.problem}"


_FORMAT_WORDS = {"1": "payloads hashed whole: nothing can be erased",
                 "2": "salted commitments per payload field: fields can be erased"}


def _loss_text(loss: dict[str, Any]) -> str:
    lost = loss.get("lost")
    text = f"entry {loss.get('seq')} records that acknowledged entries were lost after entry {loss.get('kept')}"
    if lost:
        text += f": entries {lost[0]}..{lost[1]} are `entry_lost` placeholders"
    if loss.get("cut"):
        text += "; journal.log had been cut, and what followed the cut left no trace"
    if loss.get("superseded"):
        text += f"; stored checkpoint(s) of size {', '.join(map(str, loss['superseded']))} covered lost entries"
    return text


#: A repair's record of lost entries: a ``home_repaired`` entry with this ``action`` (store.LOSS_ACTION).
_LOSS_ACTION = "record_lost_entries"


# --- signatures (checked in worker processes for large journals) ----------------------
#
# Workers are plain ``python -m apollia_nb.journal.verify --signature-worker``
# subprocesses, not a multiprocessing pool: nothing of the caller's ``__main__``
# is re-imported (scripts without a main guard, notebooks), and a worker loads
# only this module and PyNaCl. Wire format, all integers big-endian:
#   parent → worker: public key (32 bytes), then per chunk u32 count and
#                    count × (64-byte signature, 32-byte hash)
#   worker → parent: per chunk, i64 index of the first item that does not verify, -1 when all do
# An item is laid out as libsodium's signed message (signature then message), so each is
# checked straight from a slice of the chunk: no object per entry on either side.


_SIGNED = 64 + 32  # one item: signature, then the hash it signs
_COUNT = struct.Struct(">I")
_ANSWER = struct.Struct(">q")


class _Batch(NamedTuple):
    """One chunk's signatures to check: the seqs, and their items end to end (``_SIGNED`` bytes each)."""

    seqs: list[int]
    body: bytes


def _batch(chunk: Sequence[Sequence[Any]]) -> _Batch:
    """The signature items of a chunk's well-formed rows; a hash or signature of the wrong size
    (or type) is replaced by bytes that cannot verify, so it fails where it is checked."""
    rows = [r for r in chunk if len(r) == 10 and isinstance(r[0], int)]
    seqs = [r[0] for r in rows]
    signatures, digests = [r[8] for r in rows], [r[7] for r in rows]
    if (set(map(type, signatures)) == {bytes} == set(map(type, digests))
            and set(map(len, signatures)) == {64} and set(map(len, digests)) == {32}):  # as DuckDB returns them
        return _Batch(seqs, b"".join(map(bytes.__add__, signatures, digests)))
    items = []
    for signature, digest in zip(map(_as_bytes, signatures), map(_as_bytes, digests)):
        items.append((signature if len(signature) == 64 else bytes(64))
                     + (digest if len(digest) == 32 else b"\xff" * 32))
    return _Batch(seqs, b"".join(items))


#: Set to ``pynacl`` to check signatures with PyNaCl's own libsodium even where the system has one.
LIBSODIUM_ENV = "APOLLIA_LIBSODIUM"
#: Set to ``libsodium`` to check signatures with libsodium only (the system's, else PyNaCl's),
#: never with ed25519-zebra.
CHECKER_ENV = "APOLLIA_ED25519"


@functools.cache
def _system_verify() -> Any | None:
    """The system libsodium's ``crypto_sign_verify_detached`` (called on pointers into a chunk), or None.

    It is the function PyNaCl's bundled libsodium runs, with the same rules, in a build about 8 %
    faster here; None (PyNaCl's is used) when there is none, it does not load, ``APOLLIA_LIBSODIUM``
    is ``pynacl``, or it fails the self-test of :func:`_self_test`."""
    import ctypes
    import ctypes.util

    if os.environ.get(LIBSODIUM_ENV) == "pynacl":
        return None
    name = ctypes.util.find_library("sodium")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        verify = lib.crypto_sign_verify_detached
    except (OSError, AttributeError):
        return None
    if lib.sodium_init() < 0:
        return None
    verify.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_char_p)
    verify.restype = ctypes.c_int
    return verify if _self_test(verify) else None


def _self_test(verify: Any) -> bool:
    """Does ``verify`` (called as libsodium's detached verify) accept a good signature and refuse a changed one,
    a non-canonical S (S + L), a small-order R and a changed message, as PyNaCl's does?"""
    from nacl.signing import SigningKey

    key = SigningKey(bytes(range(32)))
    public, message = bytes(key.verify_key), bytes(range(32, 64))
    good = key.sign(message).signature
    s_plus_l = (int.from_bytes(good[32:], "little") + _ORDER).to_bytes(32, "little")
    bad = [good[:10] + bytes([good[10] ^ 1]) + good[11:], good[:32] + s_plus_l,
           bytes([1]) + bytes(31) + good[32:]]
    return (verify(good, message, 32, public) == 0
            and all(verify(b, message, 32, public) != 0 for b in bad)
            and verify(good, message[:-1] + b"\x00", 32, public) != 0)


_ORDER = 2**252 + 27742317777372353535851937790883648493  # L, the order of the Ed25519 base point
_P = 2**255 - 19  # the field's prime
_Y = 2**255 - 1  # an encoding without its sign bit: the point's y
#: y of the points of small order (orders 1, 2, 4 and 8) as encoded, with the two non-canonical
#: encodings of them that fit in 255 bits (p and p + 1): the blocklist of libsodium's
#: ``ge25519_has_small_order``, which ignores the sign bit.
_SMALL_ORDER_Y = frozenset((
    0, 1, _P - 1, _P, _P + 1,
    2707385501144840649318225287225658788936804267575313519463743609750303402022,
    55188659117513257062467267217118295137698188065244968500265048394206261417927,
))


def _of_small_order(encoded: bytes) -> bool:
    """Is ``encoded`` (32 bytes) one of the encodings libsodium refuses as an R or a key for being
    of small order?

    libsodium also refuses a key that is not canonical (y ≥ p) and an R that is not the canonical
    encoding of the point its equation finds; ZIP-215 reads those modulo p. The only ones a
    signer could make pass an equation are those of points whose discrete log is known — the
    small-order points, whose non-canonical encodings (p, p + 1) are in the blocklist."""
    return int.from_bytes(encoded, "little") & _Y in _SMALL_ORDER_Y


def _zebra_with_libsodiums_checks(ed_verify: Any) -> Any:
    """ed25519-zebra's verify behind the check libsodium makes and ZIP-215 does not (R not of small
    order), called as libsodium's ``crypto_sign_verify_detached`` (for :func:`_self_test`). ZIP-215
    itself refuses an S that is not below L, as libsodium does."""

    def verify(signature: bytes, message: bytes, size: int, public: bytes) -> int:
        if _of_small_order(signature[:32]):
            return -1
        return 0 if ed_verify(signature, message[:size], public) is True else -1

    return verify


@functools.cache
def _zebra_verify() -> Any | None:
    """ed25519-zebra's Ed25519 verify (``ed_verify(signature, message, key) -> bool``), or None: it is
    not installed, ``APOLLIA_ED25519`` is ``libsodium``, ``APOLLIA_LIBSODIUM`` is ``pynacl``, or,
    behind libsodium's small-order check, it fails the self-test of :func:`_self_test`.

    About 1.35× libsodium's speed here (curve25519-dalek's arithmetic). Its equation is ZIP-215's
    cofactored one: it also accepts a signature whose R has a small-order component, which only the
    holder of the journal's private key can make (the one who can sign anything anyway)."""
    if os.environ.get(CHECKER_ENV) == "libsodium" or os.environ.get(LIBSODIUM_ENV) == "pynacl":
        return None
    try:
        from ed25519_zebra import ed_verify
    except ImportError:
        return None
    return ed_verify if _self_test(_zebra_with_libsodiums_checks(ed_verify)) else None


def _first_bad_index(public_key: bytes, body: bytes) -> int | None:
    """The index of the first item of ``body`` whose signature does not verify, or None.

    An incomplete item at the end (fewer than ``_SIGNED`` bytes) does not verify."""
    whole = len(body) // _SIGNED
    zebra = _zebra_verify()
    if zebra is not None:
        if _of_small_order(public_key):
            return 0 if body else None
        for i, at in enumerate(range(0, whole * _SIGNED, _SIGNED)):
            if _of_small_order(body[at:at + 32]) or zebra(body[at:at + 64], body[at + 64:at + _SIGNED],
                                                          public_key) is not True:
                return i
        return whole if len(body) % _SIGNED else None

    verify = _system_verify()
    if verify is not None:
        import ctypes

        keep = ctypes.c_char_p(body)  # holds body; its address is that of body's bytes
        base = ctypes.cast(keep, ctypes.c_void_p).value or 0
        for i, at in enumerate(range(base, base + whole * _SIGNED, _SIGNED)):
            if verify(at, at + 64, 32, public_key) != 0:
                return i
        return whole if len(body) % _SIGNED else None

    from nacl.bindings import crypto_sign_open
    from nacl.exceptions import CryptoError

    for i, at in enumerate(range(0, len(body), _SIGNED)):
        try:
            crypto_sign_open(body[at:at + _SIGNED], public_key)
        except (CryptoError, ValueError, TypeError):
            return i
    return None


def _first_bad_signature(public_key: bytes, batch: _Batch) -> int | None:
    """The seq of the first entry of ``batch`` whose signature does not verify, or None."""
    index = _first_bad_index(public_key, batch.body)
    return None if index is None else batch.seqs[index]


def _read_exact(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _worker_main() -> None:
    """Verify chunks from stdin, answer each on stdout (see the wire format above)."""
    from apollia_nb import faults

    faults.point("verify.signature_worker")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    public_key = _read_exact(stdin, 32)
    if public_key is None:
        return
    while (head := _read_exact(stdin, _COUNT.size)) is not None:
        (count,) = _COUNT.unpack(head)
        body = _read_exact(stdin, count * _SIGNED)
        if body is None:
            return
        bad = _first_bad_index(public_key, body)
        stdout.write(_ANSWER.pack(-1 if bad is None else bad))
        stdout.flush()


class _Worker:
    """One signature-checking subprocess, fed by a thread so the caller never blocks on a pipe.

    At most ``INFLIGHT`` chunks are handed over and not answered yet (``submit`` waits for
    room), and a chunk is let go once its answer is read: memory stays the same however
    long the journal is. Chunks a dead worker never answered are checked here."""

    def __init__(self, public_key: bytes) -> None:
        import apollia_nb

        env = dict(os.environ)
        root = str(Path(apollia_nb.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "apollia_nb.journal.verify", "--signature-worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        )
        self.public_key = public_key
        self.bad: list[int] = []
        self._pending: deque[_Batch] = deque()
        self._lock = threading.Lock()
        self._room = threading.Semaphore(INFLIGHT)
        self._dead = False
        self._left = 0  # chunks handed over and never answered, checked here at the end
        self._inline = 0  # chunks this process checked because the worker had died
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queue.put(public_key)
        self._feeder = threading.Thread(target=self._feed, name="journal-verify-feeder", daemon=True)
        self._reader = threading.Thread(target=self._read, name="journal-verify-reader", daemon=True)
        self._feeder.start()
        self._reader.start()

    def _feed(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            while (data := self._queue.get()) is not None:
                stdin.write(data)
                stdin.flush()
        except OSError:  # the worker died; its unanswered chunks are checked inline
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while (answer := _read_exact(out, _ANSWER.size)) is not None:
                (index,) = _ANSWER.unpack(answer)
                with self._lock:
                    if not self._pending:
                        break
                    batch = self._pending.popleft()
                    if index >= 0:
                        self.bad.append(batch.seqs[index])
                self._room.release()
        except (OSError, ValueError):
            pass
        finally:
            self._dead = True
            for _ in range(INFLIGHT):  # nobody waits for room from a worker that answers no more
                self._room.release()

    def submit(self, batch: _Batch) -> None:
        self._room.acquire()
        with self._lock:
            if not self._dead:
                self._pending.append(batch)
                self._queue.put(_COUNT.pack(len(batch.seqs)) + batch.body)
                return
        # Checked here, so it holds no room: a dead worker's later chunks never wait for any.
        self._room.release()
        self._inline += 1
        seq = _first_bad_signature(self.public_key, batch)
        if seq is not None:
            self.bad.append(seq)

    def failure(self) -> str | None:
        """Why this worker did not check all it was given (after ``results``), or None."""
        status = self.proc.returncode
        if status == 0 and not self._inline and not self._left:
            return None
        how = f"was killed by signal {-status}" if status is not None and status < 0 else f"exited with status {status}"
        return (f"a signature worker (pid {self.proc.pid}) {how}; the {self._inline + self._left} chunk(s) of "
                "signatures it did not check were checked in this process")

    def results(self, public_key: bytes) -> list[int]:
        """First bad seq of each chunk that had one; chunks a dead worker left are checked here."""
        self._queue.put(None)
        self._feeder.join()
        self._reader.join()
        self.proc.wait()
        with self._lock:
            left, self._pending = list(self._pending), deque()
        self._left = len(left)
        for batch in left:
            seq = _first_bad_signature(public_key, batch)
            if seq is not None:
                self.bad.append(seq)
        return self.bad

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._queue.put(None)
        self._feeder.join()
        self._reader.join()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _as_bytes(value: object) -> bytes:
    if type(value) is bytes:
        return value
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else b""


# --- the core ----------------------------------------------------------------------


@dataclass
class _Target:
    """A checkpoint to check against the entry hashes while scanning."""

    label: str
    checkpoint: Checkpoint
    verified: bool = False


@dataclass
class _Failure:
    seq: int | None
    problem: str

    def key(self) -> tuple[int, int]:
        # Known seqs first, lowest first; unknown ones after.
        return (0, self.seq) if self.seq is not None else (1, 0)


@dataclass
class _Scan:
    public_key: bytes
    key_id: str
    targets: dict[int, list[_Target]]
    count: int = 0
    prev: bytes = GENESIS_HASH
    acc: MerkleAccumulator | None = None
    failure: _Failure | None = None
    bad_signature_seqs: list[int] = field(default_factory=list)
    losses: list[dict[str, Any]] = field(default_factory=list)
    #: fields found erased, by seq; and the (seq, field) pairs ``erasure`` entries name, with the erasure's seq
    erased: dict[int, list[str]] = field(default_factory=dict)
    named: dict[tuple[int, str], int] = field(default_factory=dict)

    def hash_of(self, seq: int, ts: Any, run_id: Any, agent: Any, kind: Any, payload: bytes,
                prev_hash: bytes) -> bytes:
        """The entry's hash from its columns: format 2 for a salted payload (keeping what it says
        was erased, and what an ``erasure`` entry names), version 1 otherwise. ``ValueError``
        naming the field for a salted payload that does not hold together."""
        if _SALTS_MARK not in payload:
            return entry_hash(seq, ts, run_id, agent, kind, payload, prev_hash)
        if kind != "erasure":  # an erasure's list of what it erased is read from it parsed, below
            sliced = sliced_committed(payload)  # the stored bytes' own spans, when laid out as written
            if sliced is not None:
                if sliced[1]:
                    self.erased[seq] = sliced[1]
                return entry_hash_v2(seq, ts, run_id, agent, kind, sliced[0], prev_hash)
        data = _json.loads(payload)
        if type(data) is not dict or SALTS_KEY not in data:
            return entry_hash(seq, ts, run_id, agent, kind, payload, prev_hash)
        committed, gone = sealed_committed(payload, data)  # also: the very bytes it was stored as
        erasure = data.get("erased") if kind == "erasure" else None
        digest = entry_hash_v2(seq, ts, run_id, agent, kind, committed, prev_hash)
        if gone:
            self.erased[seq] = list(gone)
        if erasure is not None:
            self._named(seq, erasure)
        return digest

    def _named(self, seq: int, erased: Any) -> None:
        """Keep what an ``erasure`` entry names (checked against its hash before it counts)."""
        if not isinstance(erased, list):
            return
        for item in erased:
            if isinstance(item, dict) and type(item.get("seq")) is int and isinstance(item.get("fields"), list):
                for name in item["fields"]:
                    if isinstance(name, str) and item["seq"] < seq:
                        self.named.setdefault((item["seq"], name), seq)

    def fail(self, seq: int | None, problem: str) -> None:
        self.failure = _Failure(seq, problem)

    def rows(self, chunk: Sequence[Sequence[Any]]) -> None:
        """Check a chunk's rows in order, as :meth:`row` checks each, up to the first that fails.

        Rows as DuckDB returns them (a tuple of ten, ``seq`` an int, ``payload``, ``prev_hash``
        and ``hash`` bytes) that pass are checked in this one loop, their leaves added to the
        Merkle tree together; any other row goes through :meth:`row`, which says what is wrong."""
        key_id, targets, acc = self.key_id, self.targets, self.acc
        leaves: list[bytes] = []
        expected, prev = self.count + 1, self.prev
        for r in chunk:
            if type(r) is tuple and len(r) == 10:
                seq, ts, run_id, agent, kind, payload, prev_hash, digest, _sig, kid = r
                if (type(seq) is int and seq == expected and type(prev_hash) is bytes and prev_hash == prev
                        and type(digest) is bytes and type(payload) is bytes and kid == key_id):
                    try:
                        computed = self.hash_of(seq, ts, run_id, agent, kind, payload, prev_hash)
                    except Exception:  # noqa: BLE001 - row() checks it again and says what is wrong
                        computed = None
                    if computed == digest:
                        prev, expected = digest, seq + 1
                        if kind == "home_repaired":
                            self._loss(seq, payload)
                        if acc is not None:
                            leaves.append(leaf_hash(digest))
                            if seq in targets:
                                self.count, self.prev = seq, prev
                                acc.extend(leaves)
                                leaves.clear()
                                for target in targets[seq]:
                                    self._check_root(target)
                        continue
            self.count, self.prev = expected - 1, prev
            if acc is not None:
                acc.extend(leaves)
                leaves.clear()
            self.row(r)
            if self.failure is not None:
                return
            expected, prev = self.count + 1, self.prev
        self.count, self.prev = expected - 1, prev
        if acc is not None:
            acc.extend(leaves)

    def row(self, row: Sequence[Any]) -> None:
        """Check one row's sequence, link, hash and key id, and feed the Merkle tree."""
        expected = self.count + 1
        try:
            seq, ts, run_id, agent, kind, payload, prev_hash, digest, _sig, kid = row
        except (TypeError, ValueError):
            return self.fail(expected, f"entry {expected} is malformed (not the ten journal columns)")
        if seq != expected:
            if isinstance(seq, int) and seq < expected:
                return self.fail(seq, f"entry {seq} appears more than once")
            found = "no sequence number" if seq is None else f"seq {seq}"
            return self.fail(expected, f"entry {expected} is missing (the next entry has {found})")
        prev_hash, digest = _as_bytes(prev_hash), _as_bytes(digest)
        if prev_hash != self.prev:
            return self.fail(seq, f"entry {seq}: prev_hash does not match the hash of entry {seq - 1}"
                             if seq > 1 else "entry 1: prev_hash is not the genesis value (32 zero bytes)")
        if payload is not None and _SALTS_MARK in _as_bytes(payload):
            try:
                computed = self.hash_of(seq, ts, run_id, agent, kind, _as_bytes(payload), prev_hash)
            except ValueError as exc:
                return self.fail(seq, f"entry {seq}: its salted payload does not hold together: {exc}")
            except (TypeError, AttributeError, OverflowError, RecursionError):
                return self.fail(seq, f"entry {seq} has a column of the wrong type")
        else:
            try:
                computed = entry_hash(seq, ts, run_id, agent, kind, _as_bytes(payload) if payload is not None else None,  # type: ignore[arg-type]  # None raises TypeError, caught below
                                      prev_hash)
            except (TypeError, ValueError, AttributeError, OverflowError):
                return self.fail(seq, f"entry {seq} has a column of the wrong type")
        if computed != digest:
            return self.fail(seq, f"entry {seq}: hash does not match its contents")
        if kid != self.key_id:
            return self.fail(seq, f"entry {seq}: key id {kid!r} is not the journal key {self.key_id}")
        self.count = seq
        self.prev = digest
        if kind == "home_repaired":
            self._loss(seq, payload)
        if self.acc is not None:
            self.acc.append(leaf_hash(digest))
            for target in self.targets.get(seq, ()):
                self._check_root(target)

    def _loss(self, seq: int, payload: Any) -> None:
        """Keep a repair's record of lost entries (its hash was checked; its signature is checked with the rest)."""
        import json

        try:
            data = json.loads(_as_bytes(payload))
        except ValueError:
            return
        if not isinstance(data, dict) or data.get("action") != _LOSS_ACTION:
            return
        lost = data.get("lost")
        self.losses.append({
            "seq": seq, "kept": data.get("kept"), "lost": lost if isinstance(lost, list) else None,
            "cut": bool(data.get("cut")),
            "checkpoints": [(c["size"], c["root"]) for c in data.get("checkpoints") or ()
                            if isinstance(c, dict) and type(c.get("size")) is int and isinstance(c.get("root"), str)],
        })

    def _check_root(self, target: _Target) -> None:
        root = self.acc.root() if self.acc is not None else EMPTY_ROOT
        if root == target.checkpoint.root:
            target.verified = True


def _open_targets(
    public_key: bytes,
    origin: str,
    checkpoints: Sequence[tuple[int, bytes, str]],
    external: str | None,
) -> tuple[list[_Target], list[_Failure]]:
    verifier = NoteVerifier(origin, public_key)
    targets: list[_Target] = []
    failures: list[_Failure] = []
    labelled: list[tuple[str, str, tuple[int, bytes] | None]] = [
        (f"stored checkpoint of size {size}", note, (size, _as_bytes(root_)))
        for size, root_, note in checkpoints
    ]
    if external is not None:
        labelled.append(("the given checkpoint", external, None))
    for label, note, stored in labelled:
        try:
            cp = open_checkpoint(note, [verifier], origin=origin)
        except IntegrityError as exc:
            failures.append(_Failure(None, f"{label}: {exc.message}"))
            continue
        if stored is not None and (cp.size, cp.root) != stored:
            failures.append(_Failure(None, f"{label}: the checkpoints row does not match its signed note"))
            continue
        targets.append(_Target(f"{label}" if stored else f"{label} (size {cp.size})", cp))
    return targets, failures


def verify_rows(
    chunks: Iterable[Sequence[Sequence[Any]]],
    *,
    public_key: bytes,
    origin: str,
    checkpoints: Sequence[tuple[int, bytes, str]] = (),
    external: str | None = None,
    total: int | None = None,
    workers: int = 2,
    parallel_min: int = PARALLEL_MIN,
) -> VerifyReport:
    """Verify entry rows (``Entry.COLUMNS`` order, ascending seq, in chunks).

    ``checkpoints`` are stored ``(size, root, note)`` rows; ``external`` is a
    checkpoint note kept elsewhere. ``total`` (the number of rows, when known)
    decides whether signatures are checked in ``workers`` processes.
    """
    from apollia_nb.journal.keys import key_id as _key_id

    if not isinstance(public_key, bytes) or len(public_key) != 32:
        raise BadInput("the journal public key must be 32 bytes")
    targets, failures = _open_targets(public_key, origin, checkpoints, external)
    by_size: dict[int, list[_Target]] = {}
    for t in targets:
        by_size.setdefault(t.checkpoint.size, []).append(t)
    scan = _Scan(public_key, _key_id(public_key), by_size)
    if by_size:
        scan.acc = MerkleAccumulator()
        for t in by_size.get(0, ()):
            scan._check_root(t)

    pool: list[_Worker] = []
    notes: list[str] = []
    try:
        if workers > 1 and total is not None and total >= parallel_min:
            try:
                for _ in range(workers):
                    pool.append(_Worker(public_key))
            except OSError as exc:  # no interpreter to start: the workers there are (maybe none) do it
                notes.append(f"{workers - len(pool)} signature worker(s) could not start ({exc}); "
                             "their signatures were checked in this process")
        # The workers check the signatures in turn (each waits only while it holds INFLIGHT
        # chunks) while this process checks hashes, links and roots: chunk i goes to worker
        # i % shares, and a share past the pool is this process's (with one worker this
        # process takes every other chunk's signatures too; with none, every chunk's).
        shares = len(pool) + 1 if len(pool) == 1 else len(pool)
        for i, chunk in enumerate(chunks):
            batch = _batch(chunk)
            if pool and (share := i % shares) < len(pool):
                pool[share].submit(batch)
            else:
                bad = _first_bad_signature(public_key, batch)
                if bad is not None:
                    scan.bad_signature_seqs.append(bad)
            scan.rows(chunk)
            if scan.failure is not None or scan.bad_signature_seqs:
                break
        for worker in pool:
            scan.bad_signature_seqs.extend(worker.results(public_key))
            if (why := worker.failure()) is not None:
                notes.append(why)
    finally:
        for worker in pool:
            worker.kill()

    if scan.failure is not None:
        failures.append(scan.failure)
    erased = 0
    for seq, names in sorted(scan.erased.items()):
        if scan.failure is not None and scan.failure.seq is not None and seq >= scan.failure.seq:
            break  # only what verified counts
        unnamed = [name for name in names if (seq, name) not in scan.named]
        if unnamed:
            failures.append(_Failure(seq, f"entry {seq}: field(s) {', '.join(map(repr, sorted(unnamed)))} were "
                                          "removed without an erasure entry naming them"))
            break
        erased += len(names)
    for seq in scan.bad_signature_seqs:
        if isinstance(seq, int):
            failures.append(_Failure(seq, f"entry {seq}: signature does not verify under the journal key"))
    entry_failed = any(f.seq is not None for f in failures)
    # Stored checkpoints a recorded loss names (size and root) covered entries that are gone: they are
    # superseded by that record, not checked against the placeholders.
    superseded = {(size, root): loss["seq"] for loss in scan.losses for size, root in loss["checkpoints"]}
    superseded_sizes: dict[int, list[int]] = {}
    if not entry_failed:
        n = scan.count
        for t in targets:
            excused = superseded.get((t.checkpoint.size, t.checkpoint.root.hex()))
            if excused is not None and t.label.startswith("stored") and t.checkpoint.size <= n:
                superseded_sizes.setdefault(excused, []).append(t.checkpoint.size)
                continue
            size = t.checkpoint.size
            if size > n:
                failures.append(_Failure(
                    n + 1,
                    f"entry {n + 1} is missing: {t.label} covers {size} entries, the journal holds {n}",
                ))
            elif not t.verified:
                failures.append(_Failure(
                    None,
                    f"{t.label}: the first {size} entries do not have its Merkle root "
                    f"(history was rewritten within seqs 1..{size}; `apollia-os audit consistency` with "
                    "more kept checkpoints or a kept bundle narrows it down)" if size else
                    f"{t.label}: its root is not the root of the empty tree",
                ))
    checked = sum(1 for t in targets if t.verified)
    losses = tuple({"seq": loss["seq"], "kept": loss["kept"], "lost": loss["lost"], "cut": loss["cut"],
                    "superseded": sorted(superseded_sizes.get(loss["seq"], []))} for loss in scan.losses)
    if failures:
        first = min(failures, key=_Failure.key)
        good = scan.count if first.seq is None else min(scan.count, first.seq - 1)
        return VerifyReport(False, good, first.seq, first.problem, checked, tuple(notes), losses, erased)
    return VerifyReport(True, scan.count, None, None, checked, tuple(notes), losses, erased)


# --- readers -----------------------------------------------------------------------


def _chunks(cursor: Any, size: int = CHUNK) -> Iterator[list[tuple[Any, ...]]]:
    while True:
        rows = cursor.fetchmany(size)
        if not rows:
            return
        yield rows


def _ranged_chunks(con: Any, entries: str, high: int, size: int = CHUNK,
                   span: int = RANGE) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``entries`` in seq order, read one seq range at a time.

    DuckDB sorts each range alone, so memory does not grow with the journal (one
    ``ORDER BY seq`` over every row materialises them all). Rows below seq 1 come
    first and rows without a seq last, where one sort over everything puts them."""
    yield from _chunks(con.execute(f"SELECT {_COLUMNS} FROM {entries} WHERE seq < 1 ORDER BY seq"), size)
    low = 1
    while low <= high:
        yield from _chunks(con.execute(
            f"SELECT {_COLUMNS} FROM {entries} WHERE seq BETWEEN ? AND ? ORDER BY seq", [low, low + span - 1]), size)
        low += span
    yield from _chunks(con.execute(f"SELECT {_COLUMNS} FROM {entries} WHERE seq IS NULL"), size)


def _verify_connection(
    con: Any,
    *,
    entries: str,
    checkpoints: str | None,
    public_key: bytes,
    origin: str,
    external: str | None,
    workers: int,
    memory: tuple[str, str] | None = None,
) -> VerifyReport:
    """Verify ``entries`` from one snapshot: first as the rows are stored, then, unless that
    verified, in seq order.

    A journal's rows are stored in seq order, so one scan without a sort reads them in it,
    a block at a time. When that pass verifies, its rows ran 1, 2, 3, … once each: the rows
    in seq order are those same rows, and the report is the one they give. Anything else (a
    failure, rows stored out of order, DuckDB short of memory) is decided by reading in seq
    ranges, as before, so the verdict and the entry it names are always those of the seq
    order. ``memory``: DuckDB's memory limit for each pass (set only on a connection of
    the verifier's own)."""
    import duckdb

    con.begin()
    try:
        total, high = con.execute(f"SELECT count(*), coalesce(max(seq), 0) FROM {entries}").fetchone()
        stored = (
            [(int(s), bytes(r), n) for s, r, n in
             con.execute(f"SELECT size, root, note FROM {checkpoints} ORDER BY size").fetchall()]
            if checkpoints else []
        )

        def verify(chunks: Iterable[Sequence[Sequence[Any]]]) -> VerifyReport:
            return verify_rows(chunks, public_key=public_key, origin=origin, checkpoints=stored,
                               external=external, total=total, workers=workers)

        if memory is not None:
            limit_memory(con, memory[0])
        try:
            report = verify(_chunks(con.execute(f"SELECT {_COLUMNS} FROM {entries}")))
        except duckdb.OutOfMemoryException:
            if memory is None:
                raise
            # A row larger than the first pass's limit. The file is read-only here, so a new
            # snapshot of it is the same one.
            con.rollback()
            con.begin()
            report = None
        if report is None or not report.ok:
            if memory is not None:
                limit_memory(con, memory[1])
            report = verify(_ranged_chunks(con, entries, int(high)))
        return report
    finally:
        con.commit()


def verify_file(
    path: Path,
    *,
    public_key: bytes,
    external: str | None = None,
    workers: int = 2,
) -> VerifyReport:
    """Verify a closed ``journal.db`` (opened read-only) under ``public_key``.

    Entries its last owner committed to ``journal.log`` but had not copied yet
    (a crash) are verified with the others."""
    from apollia_nb.journal.store import connect_locked, read_with_tail

    if not Path(path).exists():
        raise NotFound(f"no journal at {path}")
    con = connect_locked(Path(path), read_only=True)
    try:
        limit_memory(con)
        row = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()
        if row is None:
            return VerifyReport(False, 0, None, "the journal has no origin in its meta table", 0)
        try:
            tail = read_with_tail(con, Path(path))
        except IntegrityError as exc:
            return VerifyReport(False, 0, None, exc.message, 0)
        con.execute("SET threads = 1")  # one reader: this process hashes, its workers check signatures
        fmt = con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        report = _verify_connection(
            con, entries=tail.expression, checkpoints="checkpoints", public_key=public_key,
            origin=row[0], external=external, workers=workers, memory=(STREAM_MEMORY, MEMORY_LIMIT),
        )
        report = replace(report, format=None if fmt is None else str(fmt[0]))
        if tail.cut is None:
            return report
        if report.ok:  # every entry there verifies, but the log says entries after them are gone
            return replace(report, ok=False, first_bad_seq=tail.head + 1,
                           problem=f"entry {tail.head + 1} and later may be missing: {tail.cut}")
        return replace(report, problem=f"{report.problem}; and {tail.cut}")
    finally:
        con.close()


def verify_home(home: Home, *, external: str | None = None, workers: int = 2) -> VerifyReport:
    """Verify ``home.journal_db`` under the home's public key (``keys/journal.pub``)."""
    from apollia_nb.journal.keys import load_public_key

    if not home.journal_db.exists():
        raise NotFound(f"no journal at {home.journal_db}")
    return verify_file(home.journal_db, public_key=load_public_key(home), external=external, workers=workers)


def verify_journal(journal: JournalFace, checkpoint: str | None = None, *, workers: int = 2) -> VerifyReport:
    """Verify an open journal from one consistent snapshot of its rows, read in seq ranges
    through a cursor of its own (memory does not grow with the journal).

    A journal whose own entries and stored checkpoints do not verify (no ``checkpoint``
    given) is told so (``Journal.refuse_appends``): from then on it refuses every append
    with ``INTEGRITY_FAILURE``, so nothing governed runs on a broken chain; reads go on."""
    paged = getattr(journal, "verify_paged", None)
    if paged is not None:  # stored elsewhere (a served home's client): verified here, a page at a time
        report: VerifyReport = paged(checkpoint)
        return report
    cursor = getattr(journal, "cursor")()
    try:
        report = _verify_connection(
            cursor, entries="entries", checkpoints="checkpoints", public_key=journal.public_key(),
            origin=journal.origin, external=checkpoint, workers=workers,
        )
    finally:
        cursor.close()
    fmt = getattr(journal, "format", None)
    report = replace(report, format=fmt if isinstance(fmt, str) else None)
    refuse = getattr(journal, "refuse_appends", None)
    if not report.ok and checkpoint is None and refuse is not None:
        # Its own entries and stored checkpoints do not verify: it takes no more (fail closed).
        refuse(IntegrityError(
            f"the journal does not verify ({report.summary()}); it takes no more entries, so nothing governed "
            "runs. Stop the process and run `apollia-os audit verify`"))
    return report


def verify_bundle(directory: Path, *, external: str | None = None, workers: int = 2) -> VerifyReport:
    """Verify an exported bundle (``entries.parquet``, ``checkpoints.parquet``, ``journal.vkey``)."""
    import duckdb

    directory = Path(directory)
    for name in (BUNDLE_FILES["entries"], BUNDLE_FILES["vkey"]):
        if not (directory / name).exists():
            raise NotFound(f"{directory} is not an audit bundle: {name} is missing")
    verifier = read_bundle_key(directory)
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")
    try:
        def quoted(name: str) -> str:
            return "read_parquet('" + str(directory / name).replace("'", "''") + "')"

        cps = directory / BUNDLE_FILES["checkpoints"]
        report = _verify_connection(
            con,
            entries=quoted(BUNDLE_FILES["entries"]),
            checkpoints=quoted(BUNDLE_FILES["checkpoints"]) if cps.exists() else None,
            public_key=verifier.public_key,
            origin=verifier.name,
            external=external,
            workers=workers,
        )
    finally:
        con.close()
    meta = read_bundle_meta(directory)
    fmt = meta.get("format")
    return _marked(replace(report, format=fmt if isinstance(fmt, str) else None), meta.get("invalid"))


def _marked(report: VerifyReport, invalid: object) -> VerifyReport:
    """A bundle exported with ``--allow-invalid`` fails verification whatever its files say."""
    if not invalid:
        return report
    seq = invalid.get("first_bad_seq") if isinstance(invalid, dict) else None
    seq = seq if type(seq) is int else None  # anything else (a hand-edited meta.json) points at no entry
    said = invalid.get("problem") if isinstance(invalid, dict) else None
    note = f"the bundle was exported marked invalid (meta.json): the journal failed verification: {said}"
    if not report.ok:
        return replace(report, problem=f"{report.problem}; {note}")
    return replace(report, ok=False, entries=0 if seq is None else min(report.entries, max(seq - 1, 0)),
                   first_bad_seq=seq, problem=note)


# --- witness cosignatures (audit verify --witness) -----------------------------------------


def cosigned_rows_of_file(path: Path) -> tuple[list[tuple[int, bytes, str]], list[tuple[int, str]]]:
    """A closed ``journal.db``'s checkpoints ``(size, root, note)`` and cosignatures ``(size, line)``;
    a journal written before cosignatures were kept has none."""
    from apollia_nb.journal.store import connect_locked

    con = connect_locked(Path(path), read_only=True)
    try:
        cps = [(int(s), bytes(r), n) for s, r, n in
               con.execute("SELECT size, root, note FROM checkpoints ORDER BY size").fetchall()]
        has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'checkpoint_cosignatures'"
                          ).fetchone()[0]
        cos = ([(int(s), line) for s, line in
                con.execute("SELECT size, signature FROM checkpoint_cosignatures ORDER BY size").fetchall()]
               if has else [])
        return cps, cos
    finally:
        con.close()


def cosigned_rows_of_bundle(directory: Path) -> tuple[list[tuple[int, bytes, str]], list[tuple[int, str]]]:
    """As :func:`cosigned_rows_of_file`, from a bundle's ``checkpoints.parquet`` and ``cosignatures.parquet``."""
    import duckdb

    directory = Path(directory)
    con = duckdb.connect(":memory:")
    try:
        def rows(name: str, columns: str) -> list[tuple[Any, ...]]:
            path = directory / BUNDLE_FILES[name]
            if not path.exists():
                return []
            return con.execute(f"SELECT {columns} FROM read_parquet(?) ORDER BY size", [str(path)]).fetchall()

        cps = [(int(s), bytes(r), n) for s, r, n in rows("checkpoints", "size, root, note")]
        cos = [(int(s), line) for s, line in rows("cosignatures", "size, signature")]
        return cps, cos
    finally:
        con.close()


if __name__ == "__main__" and sys.argv[1:] == ["--signature-worker"]:
    _worker_main()
