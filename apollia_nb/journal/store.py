"""The journal in ``journal.db``: durable, signed, hash-chained appends with group commit.

Commits are made one at a time, in the order requests were made. Callers queue
requests and wait on a future; whoever holds the commit lock — the writer thread,
or a blocking ``append``/``append_many`` that found nobody committing and only
appends queued before it — takes every request waiting (including those that
queue while it works), sequences, hashes and signs their entries, makes them
durable as one record of ``journal.log`` (one ``pwrite`` into preallocated
space, one ``fdatasync``: see ``tail.py``), and only then resolves the futures. So an ``append`` that returned
is committed (a governed effect may follow), concurrent appenders share one
commit (group commit), and nothing is ever held unflushed. An ``append_soon``
entry waits up to ``SOON_WAIT_SECS`` in the queue for the next append to take it
into its commit, then the writer commits it.

A second thread, the copier, copies committed entries from the log into
``journal.db`` while the writer goes on committing: in batches (``IMPORT_BATCH``
entries, or when no commit came for ``IMPORT_IDLE_SECS``, or when half the log is
used, or at once when a read waits for it), one DuckDB transaction per copy. Once the journal is open the
copier makes every write to ``journal.db`` (copies, checkpoints, cosignatures),
so no commit waits for DuckDB; the writer waits for a copy only when the log is
full (it starts over once ``journal.db`` holds everything in it). Opening the
journal finishes a copy a crash interrupted; closing it leaves every entry in
``journal.db`` and no log.

What is sequenced, acknowledged and copied, and when a copy is due, is kept by the
commit path's core (``commit.CommitCore``: the writer's and the copier's states as tables,
events in, actions out, no I/O); this module is its shell: the threads, the queue and
futures, ``journal.log`` and DuckDB. It tells the core each step (``Sequenced``, ``Seal``,
``LogSynced``, ``CopyStart``, ``Copied``, ...) and carries out what it answers
(``WriteLog``, ``AwaitCopy`` then ``ResetLog``, ``Acknowledge``, ``WakeCopier``,
``CopyRows``). Opening — the schema, migrations, what a previous owner left in the log —
is ``recovery.py``.

Checkpoints are signed by the writer between two commits, so a checkpoint
always describes a committed prefix of the journal, and stored by the copier.
Reads use their own cursor; every read through the journal first waits for the
copy of everything committed before it, so it sees every entry an ``append``
has returned.

Tables (the same in both entry formats: '2', salted commitments per payload field, for a journal
made now; '1', payloads hashed whole, kept by a journal made before — see ``entry.py``)::

    meta(key PRIMARY KEY, value)            -- 'format' = '2' or '1', 'origin', 'created_at', 'frontier' = '1', 'calls' = '1',
                                            -- 'views' (the SQL the views were made from: views.VIEWS_DIGEST)
    entries(seq PRIMARY KEY, ts, run_id, agent, kind, payload BLOB,
            prev_hash BLOB, hash BLOB, signature BLOB, key_id)
    checkpoints(size PRIMARY KEY, root BLOB, note, created_at)
    checkpoint_cosignatures(size, witness, timestamp, signature, created_at)  -- PRIMARY KEY (size, witness)
    frontier(id PRIMARY KEY, size, last_hash BLOB, root BLOB, hashes BLOB)   -- one row
    entry_fields(seq, kind, ts, run_id, agent, call_id, tool, ...)          -- see views.py
    calls(k PRIMARY KEY, run_id, call_id, decision_seq, ..., status, ...)    -- one row per call, see views.py

Every copy into ``journal.db`` is made in pieces bounded by entries and payload bytes
(``COPY_PIECE_ENTRIES``, ``COPY_PIECE_BYTES``); each piece commits, in one transaction, its
entries, their ``entry_fields`` and ``calls`` rows and the ``frontier`` row of the prefix it
ends: the head (size, last hash),
the Merkle root and the compact range (one hash per set bit of the size). So
``Journal.open`` reads a constant amount however long the journal is, and
checks it against the stored entries (their count, highest seq and the last
entry's hash) before it trusts it: a frontier that does not describe the
entries is ``HOME_FILE_CORRUPT``, never rebuilt. A journal written before the
frontier was kept (no row, no ``meta.frontier``) is migrated once on open; one
written before ``calls`` was kept (no ``meta.calls``) has it computed once from
``entry_fields`` on open.

The SQL views of ``views.py`` are recreated on every open. Then the database
instance is locked to itself (``dbutil.lock_down``): whatever SQL runs on it,
through any cursor, reads only the journal's tables and views, never a file or
URL, and cannot change a setting. The journal's own work needs no more than
that (``journal.log`` is read and written by Python, not by DuckDB).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from apollia_nb import faults
from apollia_nb.dbutil import (
    MEMORY_LIMIT,
    STORAGE_VERSION,
    connect_locked,
    fault_point,
    limit_memory,
    lock_down,
    needs_reopen,
    storage_error,
)
from apollia_nb.errors import (
    BadInput,
    Conflict,
    HomeLocked,
    IntegrityError,
    NotFound,
    StorageError,
)
from apollia_nb.home import Home, damage_error
from apollia_nb.journal import accounting as _accounting
from apollia_nb.journal import keys as _keys
from apollia_nb.journal.checkpoint import (
    Checkpoint,
    NoteSigner,
    NoteVerifier,
    open_checkpoint,
)
from apollia_nb.journal.entry import (
    GENESIS_HASH,
    SALT_SIZE,
    Entry,
    canonical_payload,
    check_kind,
    check_text,
    entry_hash,
    entry_hash_v2,
    format_ts,
    seal_parts,
)
from apollia_nb.journal.merkle import (
    MerkleAccumulator,
    consistency_path,
    inclusion_path,
    leaf_hash,
    root as merkle_root,
    verify_consistency,
    verify_inclusion,
)
from apollia_nb.journal.commit import (
    IMPORT_BATCH,
    IMPORT_IDLE_SECS,
    IMPORT_RETRY_SECS,
    AwaitCopy,
    Close,
    CommitCore,
    Copied,
    CopyBroke,
    CopyRefused,
    CopyStart,
    Drained,
    Hurry,
    JobQueued,
    JobTaken,
    LogFailed,
    LogSynced,
    Seal,
    Sequenced,
    Stop,
    WakeCopier,
    WriterState,
)
from apollia_nb.journal.recovery import (
    COLUMNS,
    ENTRY_LOST,
    FORMAT_VERSION,
    FORMAT_WHOLE_PAYLOAD,
    journal_format,
    LOSS_ACTION,
    SCHEMA,
    SEQ_RANGE,
    Loaded,
    TailEntries,
    TailRecovery,
    connect_journal,
    entries_with_tail,
    examine_loss,
    examine_tail,
    is_loss_record,
    load,
    loss_rows,
    prepare,
    read_with_tail,
    store_frontier,
    stored_rows,
    truncation_problems,
)
from apollia_nb.journal.tail import TailLog, encode_rows, tail_path
from apollia_nb.journal.views import copy_entry_fields, rebuild_calls

__all__ = [
    "FORMAT_VERSION",
    "Draft",
    "Journal",
    "InclusionProof",
    "ConsistencyProof",
    "connect_locked",
    "STORAGE_VERSION",
    "entries_with_tail",
    "read_with_tail",
    "TailEntries",
    "truncation_problems",
    "ENTRY_LOST",
    "LOSS_ACTION",
    "examine_loss",
    "is_loss_record",
]

_COLUMNS = COLUMNS
_SCHEMA = SCHEMA
_stored_rows = stored_rows


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Draft(NamedTuple):
    """One entry to append with ``append_many``: ``Draft(kind, payload, run_id, agent)``."""

    kind: str
    payload: dict[str, Any]
    run_id: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class InclusionProof:
    """RFC 6962 audit path of one entry against a signed checkpoint (verified when built)."""

    seq: int
    tree_size: int
    entry_hash: bytes
    leaf_hash: bytes
    path: tuple[bytes, ...]
    root: bytes
    checkpoint: str

    @property
    def leaf_index(self) -> int:
        return self.seq - 1

    def verify(self, verifier: NoteVerifier) -> None:
        """Raise ``IntegrityError`` unless the note verifies and the path leads to its root."""
        cp = open_checkpoint(self.checkpoint, [verifier])
        if cp.size != self.tree_size or cp.root != self.root:
            raise IntegrityError("the proof's tree does not match its checkpoint")
        if leaf_hash(self.entry_hash) != self.leaf_hash:
            raise IntegrityError("the leaf hash is not the hash of the entry hash")
        verify_inclusion(self.leaf_index, self.tree_size, self.leaf_hash, list(self.path), self.root)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "leaf_index": self.leaf_index,
            "tree_size": self.tree_size,
            "entry_hash": self.entry_hash.hex(),
            "leaf_hash": self.leaf_hash.hex(),
            "path": [h.hex() for h in self.path],
            "root": self.root.hex(),
            "checkpoint": self.checkpoint,
        }


def prove_inclusion(
    seq: int, checkpoint: str | None, *, head: int, latest: tuple[int, str] | None,
    write_checkpoint: Callable[[], str], verifier: NoteVerifier, origin: str,
    hashes: Callable[[int], list[bytes]] | None,
    subtree: Callable[[int, int], bytes] | None = None, entry_hash: Callable[[int], bytes] | None = None,
) -> "InclusionProof":
    """Prove entry ``seq`` of a journal whose head is ``head`` against ``checkpoint`` (default: the
    ``latest`` ``(size, note)``, or one written by ``write_checkpoint`` when that does not cover ``seq``).
    The hashes come from ``subtree(lo, hi)`` (the Merkle Tree Hash of leaves ``lo..hi-1``) and
    ``entry_hash(seq)`` when given, else from ``hashes(size)`` (the entry hashes of seqs 1..size).
    The proof is verified before return."""
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise BadInput(f"sequence numbers start at 1, got {seq!r}")
    if seq > head:
        raise NotFound(f"the journal has no entry {seq} (head is {head})")
    if checkpoint is None:
        checkpoint = latest[1] if latest and latest[0] >= seq else write_checkpoint()
    cp = open_checkpoint(checkpoint, [verifier], origin=origin)
    if seq > cp.size:
        raise BadInput(f"entry {seq} is not covered by a checkpoint of size {cp.size}")
    if subtree is None or entry_hash is None:
        assert hashes is not None
        entries = hashes(cp.size)
        if len(entries) != cp.size:
            raise IntegrityError(f"the journal holds {len(entries)} of the {cp.size} entries asked for")
        leaves = [leaf_hash(h) for h in entries]
        subtree = lambda lo, hi: merkle_root(leaves[lo:hi])  # noqa: E731
        entry_hash = lambda s: entries[s - 1]  # noqa: E731
    this = entry_hash(seq)
    proof = InclusionProof(
        seq=seq,
        tree_size=cp.size,
        entry_hash=this,
        leaf_hash=leaf_hash(this),
        path=tuple(inclusion_path(seq - 1, cp.size, subtree)),
        root=cp.root,
        checkpoint=checkpoint,
    )
    proof.verify(verifier)
    return proof


@dataclass(frozen=True)
class ConsistencyProof:
    """RFC 6962 proof that the tree of ``new_size`` entries extends the one of ``old_size``."""

    old_size: int
    new_size: int
    old_root: bytes
    new_root: bytes
    path: tuple[bytes, ...]

    def verify(self) -> None:
        verify_consistency(self.old_size, self.new_size, self.old_root, self.new_root, list(self.path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "old_size": self.old_size,
            "new_size": self.new_size,
            "old_root": self.old_root.hex(),
            "new_root": self.new_root.hex(),
            "path": [h.hex() for h in self.path],
        }


class _Item(NamedTuple):
    kind: str
    payload: bytes  # as stored
    run_id: str | None
    agent: str | None
    committed: bytes | None = None  # format 2: the commitments the hash covers (None: the payload)
    readable: bytes | None = None  # format 2: the payload's fields alone (``Entry.payload``)


class _Request:
    """Entries to append atomically, or (``job``) a function the writer runs between batches.

    ``soon``: nobody waits on it (``append_soon``); if it fails, its runs are marked failed.
    ``seal``: ``(payload, run_id, agent)`` of a ``run_seal`` to append after ``items``, its
    ``entries`` counted as it is sequenced; a checkpoint is signed once it is committed
    (its store's future in ``stored``)."""

    __slots__ = ("items", "job", "future", "soon", "at", "seal", "stored")

    def __init__(self, items: list[_Item] | None, job: Callable[[], Any] | None = None, soon: bool = False,
                 seal: tuple[dict[str, Any], str, str | None] | None = None) -> None:
        self.items = items
        self.job = job
        self.soon = soon
        self.at = time.monotonic() if soon else 0.0
        self.future: Future[Any] = Future()
        self.seal = seal
        self.stored: Future[str] | None = None


class _Group:
    """Entries sequenced and signed for one transaction, on top of the committed head."""

    __slots__ = ("seq", "prev", "requests", "rows")

    def __init__(self, seq: int, prev: bytes) -> None:
        self.seq = seq
        self.prev = prev
        self.requests: list[tuple[_Request, list[Entry]]] = []
        self.rows: list[tuple[Any, ...]] = []


_STOP = object()
#: Most entries one group commit takes (a bound on one transaction's size and latency).
MAX_GROUP = 1024
#: How long the writer leaves ``append_soon`` entries queued for an appender to commit with its own
#: (a tool's result goes with the next call's decision: one sync, not two) before committing them itself.
SOON_WAIT_SECS = 0.002
#: For this long after a commit the writer, with nothing queued, looks at the queue again every
#: ``SOON_WAIT_SECS`` by itself, so an ``append_soon`` need not wake it (a wake-up per governed
#: call, and the interpreter lock taken from the run at its busiest); idle longer, it sleeps until
#: a request wakes it.
WRITER_POLL_SECS = 0.1
#: Rows handed to DuckDB's appender at a time (it holds the GIL while it converts them).
APPEND_SLICE = 64
#: ``IMPORT_BATCH``, ``IMPORT_IDLE_SECS`` and ``IMPORT_RETRY_SECS`` (commit.py) are read from
#: this module when a journal opens, so a test may set them here.
#: Most entries, and most payload bytes, one transaction copies into ``journal.db``: a larger
#: copy (one large ``append_many``, a long backlog) is made in pieces, each a consistent
#: prefix with its own frontier, so the copy's memory stays within the database's cap
#: (``dbutil.MEMORY_LIMIT``) whatever the size of one append.
COPY_PIECE_ENTRIES = 8192
COPY_PIECE_BYTES = 2 * 1024 * 1024
_OPEN: dict[Path, "Journal"] = {}
_OPEN_LOCK = threading.Lock()

#: How long ``close`` waits for a query still running on a handed-out cursor to stop.
CLOSE_WAIT_SECONDS = 10.0


def _close_interrupting(connection: duckdb.DuckDBPyConnection, handed: Sequence[duckdb.DuckDBPyConnection]) -> None:
    """Close ``connection``, first interrupting the query each of its ``handed`` cursors may run.

    DuckDB refuses to close a connection while one of its cursors runs a query in another
    thread (a verify or an export still reading): the query raises once interrupted, and the
    next one its cursor starts meets a closed connection. Waits at most ``CLOSE_WAIT_SECONDS``
    for a running query to stop, then raises DuckDB's ``ResourceInUseException``."""
    deadline = time.monotonic() + CLOSE_WAIT_SECONDS
    while True:
        for cursor in handed:
            try:
                cursor.interrupt()
            except duckdb.Error:  # closed already
                pass
        try:
            connection.close()
            return
        except duckdb.ResourceInUseException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


class Journal:
    """The home's journal. ``Journal.open(home)``; ``close()`` when done (or use ``with``)."""

    def __init__(
        self,
        path: Path,
        con: duckdb.DuckDBPyConnection,
        key: _keys.JournalKey,
        origin: str,
        clock: Callable[[], datetime],
    ) -> None:
        self.path = path
        self._con = con
        self._reader = con.cursor()
        self._read_lock = threading.Lock()
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()  # handed out by cursor()
        self._key = key
        self._origin = origin
        #: the journal's entry format (``recovery.FORMAT_VERSION`` for a home made now); ``sealed``:
        #: its entries commit to salted payload fields (format 2), so fields can be erased
        self.format = FORMAT_WHOLE_PAYLOAD
        self.sealed = False
        self._signer = NoteSigner(origin, key.signing_key)
        self._clock = clock
        # Requests in order, on ``_queue_cond``; whoever holds ``_commit_lock`` (the writer thread, or an
        # appender that found it free: ``append``/``append_many``) takes them from the front and commits.
        self._queue: deque[Any] = deque()
        self._queue_cond = threading.Condition(threading.Lock())
        self._commit_lock = threading.Lock()
        self._writer_looks = False  # the writer waits with a timeout: it looks at the queue again by itself
        # The commit path's state (commit.py): what is sequenced, acknowledged and copied, the writer's
        # and the copier's states. Its writer half is moved by whoever holds ``_commit_lock``, the rest
        # under ``_state_lock``; the rows, futures, files and DuckDB stay here.
        self._core = CommitCore(0)
        self._closed = False
        self._state_lock = threading.Lock()
        self._head: tuple[int, bytes] = (0, GENESIS_HASH)
        self._acc = MerkleAccumulator()
        self._latest: tuple[int, str] | None = None
        # The last checkpoint handed to the copier to store, and its size: readers of checkpoints wait
        # for it (``_stored``), the run that asked for it does not (``checkpoint_signed_async``).
        self._storing: Future[str] | None = None
        self._storing_size = -1
        self._close_error: BaseException | None = None
        self._appender = con.appender("entries")
        self._tail: TailLog | None = None
        self._pending: list[tuple[Any, ...]] = []  # in the log, not yet in journal.db (writer's)
        self._broken: BaseException | None = None  # journal.db refused a copy for a reason other than the disk
        self._refusing: IntegrityError | None = None  # its verification failed: appends refused, reads go on
        self._copy_error: StorageError | None = None  # why the last copy into journal.db failed
        self._reopen_needed = False  # DuckDB invalidated journal.db after a failed write
        self._opened_at = 0  # entries journal.db held when opened (after recovery)
        self._run_counts: dict[str, int] = {}  # entries per run appended since open
        self._run_base: dict[str, int] = {}  # entries per run before open, as asked for
        self._failed_runs: dict[str, BaseException] = {}  # runs whose append_soon failed (writer's)
        # Callbacks told each acknowledged group's entries (``observe``); replaced whole, never changed.
        self._observers: tuple[Callable[[list[Entry]], None], ...] = ()
        # The copier: a second thread, the only one that writes journal.db once the journal is
        # open (``_con``), while the writer goes on committing to the log. ``_pending``,
        # ``_jobs`` and the core's copy counters are shared through ``_copy_cond`` (on ``_state_lock``).
        self._copy_cond = threading.Condition(self._state_lock)
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()  # writes the copier makes
        # Jobs held back (a run's closing checkpoint): run with the next copy, once the journal is
        # idle or as soon as somebody waits for one of them (``_hurry``); any other job runs at once.
        self._copy_acc = self._acc  # the frontier the rows being copied end at (the copier's)
        self._stored_acc = self._acc  # the frontier journal.db holds (the copier's)
        self._copier_stop = False
        self._copier_done = False
        self._thread = threading.Thread(target=self._run_writer, name=f"journal-writer:{path}", daemon=True)
        self._copier = threading.Thread(target=self._run_copier, name=f"journal-copier:{path}", daemon=True)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        home: Home,
        *,
        create: bool = True,
        clock: Callable[[], datetime] | None = None,
        record_loss: dict[str, Any] | None = None,
        entry_format: str | None = None,
    ) -> Journal:
        """Open (or create) ``home.journal_db``; keys are created on first use.

        A journal made now has entry format ``recovery.FORMAT_VERSION`` (salted commitments per
        payload field), or ``entry_format`` when given ("1": payloads hashed whole, as journals
        made before; for tests and tools that need one); an existing journal keeps its own.

        A journal with entries needs the key that signed them
        (``accounting.check_key``: ``HOME_FILE_MISSING``, ``HOME_KEY_MISMATCH``);
        a ``journal.db`` DuckDB cannot open is ``HOME_FILE_CORRUPT``.

        Raises ``HomeLocked`` when another process (or another ``Journal`` in this
        process) holds the file, ``NotFound`` when ``create`` is false and there
        is no journal, ``IntegrityError`` when the stored sequence has a gap or
        ``journal.log`` holds entries that cannot be taken (damaged, not this
        journal's, not continuing it), and ``JournalTruncated`` when it holds fewer entries
        than it acknowledged (``truncation_problems``): it never takes a seq again.

        ``record_loss`` (``apollia-os home repair --lost-entries --yes``): open such a journal
        anyway, recording the loss first (``recovery.loss_rows``; the dict's items go into the
        record's payload, e.g. ``by``); ``BadInput`` when nothing is lost.
        """
        path = home.journal_db
        if not create and not path.exists():
            raise NotFound(f"no journal at {path}")
        home.ensure()
        resolved = path.resolve()
        with _OPEN_LOCK:
            if resolved in _OPEN:
                raise HomeLocked(
                    f"{path.name} in {path.parent} is already open in this process (PID {os.getpid()}); "
                    "use that journal, or close it first."
                )
            con = connect_journal(home)
            journal: Journal | None = None
            try:
                # Journal statements are tiny; DuckDB's worker threads only add
                # per-statement overhead (measured: 10-20% of an append).
                con.execute("SET threads = 1")
                limit_memory(con)  # the cache of a growing journal stays bounded (see dbutil)
                origin = prepare(con, entry_format or FORMAT_VERSION)
                entry_format = journal_format(con)
                key = _accounting.check_key(home, _accounting.last_key_id(con, path))
                # Every read of this database (the auditor's SQL included) reads the journal and
                # nothing else: no files, URLs or extensions, no setting changed back.
                lock_down(con)
                journal = cls(path, con, key, origin, clock or _utcnow)
                journal.format = entry_format
                journal.sealed = entry_format != FORMAT_WHOLE_PAYLOAD
                journal._recover_tail(load(con, path, rebuild_calls), record_loss)
            except BaseException as exc:
                if journal is not None and journal._tail is not None:
                    journal._tail.close()
                con.close()
                # The disk refusing a write (e.g. a full disk), or a block of journal.db that does not read.
                error = storage_error(exc, f"{path.name} could not be opened") or damage_error(exc, path, home=home.path)
                if error is None or error is exc:
                    raise
                raise error from exc
            _OPEN[resolved] = journal
        journal._copier.start()
        journal._thread.start()
        atexit.register(journal.close)
        return journal

    def _recover_tail(self, loaded: Loaded, record_loss: dict[str, Any] | None = None) -> None:
        """Take what a previous owner left in ``journal.log`` (checked by ``recovery.examine_tail``,
        which raises and changes nothing when it cannot be taken), record a loss when asked, and
        open the log."""
        self._latest = loaded.latest
        found = examine_tail(self._con, self.path, self._key, loaded, record_loss)
        self._acc, self._head = loaded.acc, loaded.head
        self._stored_acc = self._acc.copy()
        fresh = found.fresh
        if fresh:
            before = self._acc.copy()
            for entry in fresh:
                self._acc.append(leaf_hash(entry.hash))
            try:
                self._copy_acc = self._acc
                self._insert([e.as_row() for e in fresh])
            except BaseException:
                self._acc = before
                raise
            self._head = found.head
        if record_loss is not None:
            self._record_loss(found, record_loss)
        self._tail = TailLog(tail_path(self.path))  # starts the file over: everything in it is in journal.db now
        self._opened_at = self._head[0]
        self._core = CommitCore(self._head[0], batch=IMPORT_BATCH, idle=IMPORT_IDLE_SECS)

    def _record_loss(self, found: TailRecovery, extra: dict[str, Any]) -> None:
        """Record in ``journal.db`` that acknowledged entries are gone (``recovery.loss_rows``), in
        one transaction, before the log starts over."""
        rows = loss_rows(self._con, self._head, self._latest, found, extra, self._key, self._clock)
        before = self._acc.copy()
        for row in rows:
            self._acc.append(leaf_hash(bytes(row[7])))
        try:
            self._copy_acc = self._acc
            self._insert_piece(rows, self._acc.copy())
            self._stored_acc = self._acc.copy()
        except BaseException:
            self._acc = before
            raise
        self._head = (int(rows[-1][0]), bytes(rows[-1][7]))

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ identity
    @property
    def origin(self) -> str:
        """The log's origin line (``apollia-nb/<id>``), also the note signer's key name."""
        return self._origin

    @property
    def key_id(self) -> str:
        return self._key.key_id

    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key that signs entries and checkpoints."""
        return self._key.public_key

    def verifier_key(self) -> str:
        """The C2SP verifier key (``<origin>+<key id>+<base64>``) for checkpoint notes."""
        return self._signer.verifier_key()

    def verifier(self) -> NoteVerifier:
        return self._signer.verifier()

    @property
    def stats(self) -> dict[str, int]:
        """Commits since open (durable log records), the largest batch among them, and the
        copies into ``journal.db``."""
        with self._state_lock:
            core = self._core
            return {"transactions": core.transactions, "largest_batch": core.largest_batch,
                    "imports": core.copies}

    def refuse_appends(self, error: IntegrityError) -> None:
        """From now on refuse every append with ``error`` (its verification failed: the chain
        or a stored checkpoint does not hold); reads go on. The first reason stays."""
        with self._state_lock:
            if self._refusing is None:
                self._refusing = error

    @property
    def refusing(self) -> IntegrityError | None:
        """Why the journal refuses appends (``refuse_appends``), or None."""
        return self._refusing

    # ------------------------------------------------------------------ appending
    def append(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        run_id: str | None = None,
        agent: str | None = None,
    ) -> Entry:
        """Append one entry; it is committed when this returns. Thread-safe."""
        return self._append_here([_item(kind, payload, run_id, agent, self.sealed)])[0]

    def append_many(self, drafts: Iterable[Draft | tuple[Any, ...]]) -> list[Entry]:
        """Append entries atomically (consecutive seqs, one transaction); committed on return."""
        items = [_item(*Draft(*d), sealed=self.sealed) for d in drafts]
        if not items:
            return []
        return self._append_here(items)

    def _append_here(self, items: list[_Item]) -> list[Entry]:
        """A blocking append: commit in this thread when nobody commits now (no hand-off to the
        writer and back), else hand it to whoever does. Either way after every request submitted
        before it (``append_soon`` entries included), and in one group with them when they fit."""
        # (Never on the copier's thread: a commit may have to wait for the copier when the log is full.)
        if (self._core.crowded or threading.current_thread() is self._copier
                or not self._commit_lock.acquire(blocking=False)):
            return self._submit(items).result()
        request = _Request(items)
        try:
            with self._queue_cond:
                if self._closed:
                    raise Conflict(f"the journal {self.path} is closed")
                led = not any(r is _STOP or r.job is not None for r in self._queue)
            if led:
                self._lead(request)
        finally:
            self._commit_lock.release()
        if not led:  # a job is queued before it: the writer takes them in order
            return self._submit(items).result()
        with self._queue_cond:
            if self._queue:  # queued meanwhile: the writer takes them
                self._queue_cond.notify()
        return request.future.result()

    def _lead(self, request: _Request) -> None:
        """With ``_commit_lock`` held: commit the appends queued before ``request`` and ``request``
        itself, in one group when they fit (``MAX_GROUP``). Stops taking at a job or ``_STOP``
        queued meanwhile: they come after ``request``."""
        while True:
            group = self._fill(_Group(*self._head))
            if len(group.rows) < MAX_GROUP:
                self._sequence(group, request)
                self._commit(group)
                return
            self._commit(group)

    def _fill(self, group: _Group) -> _Group:
        """Sequence the appends queued at the front onto ``group``, up to ``MAX_GROUP`` entries;
        stops at a job or ``_STOP`` (they run alone, after the group)."""
        cond, queued = self._queue_cond, self._queue
        while len(group.rows) < MAX_GROUP:
            with cond:
                if not queued or queued[0] is _STOP or queued[0].job is not None:
                    break
                nxt = queued.popleft()
            self._sequence(group, nxt)
        return group

    async def append_async(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        run_id: str | None = None,
        agent: str | None = None,
    ) -> Entry:
        """``append`` for asyncio callers: awaits the commit without blocking the loop.

        Cancelled while still queued, the entry is not written; once the writer
        has taken it, it is committed whatever happens to the awaiting task.
        """
        entries = await asyncio.wrap_future(self._submit([_item(kind, payload, run_id, agent, self.sealed)]))
        return entries[0]

    async def append_many_async(self, drafts: Iterable[Draft | tuple[Any, ...]]) -> list[Entry]:
        items = [_item(*Draft(*d), sealed=self.sealed) for d in drafts]
        if not items:
            return []
        return await asyncio.wrap_future(self._submit(items))

    def append_soon(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        run_id: str,
        agent: str | None = None,
    ) -> Future[list[Entry]]:
        """Hand an entry to the writer without waiting for its commit; returns its future.

        For an entry that records what already happened (a tool's result) while
        the run goes on with what no effect depends on (the next model turn).
        The writer commits it at once, in order: every append submitted after it
        commits after it, so once any later append of the run has returned, this
        one is durable too. If it fails, every later append of the same run fails
        with its error (the run cannot go on with a hole in its trace).
        """
        if not run_id:
            raise BadInput("append_soon needs the run the entry belongs to")
        return self._submit([_item(kind, payload, run_id, agent, self.sealed)], soon=True)

    def _submit(self, items: list[_Item] | None, job: Callable[[], Any] | None = None,
                soon: bool = False) -> Future[Any]:
        return self._enqueue(_Request(items, job, soon))

    def _enqueue(self, request: _Request) -> Future[Any]:
        soon = request.soon
        with self._queue_cond:
            if self._closed:
                raise Conflict(f"the journal {self.path} is closed")
            self._queue.append(request)
            if not (soon and self._writer_looks):  # it looks again within SOON_WAIT_SECS by itself
                self._queue_cond.notify()
        return request.future

    # ------------------------------------------------------------------ the writer
    def _run_writer(self) -> None:
        """The writer thread: whenever requests are queued and nobody else commits, take them.

        ``append_soon`` requests alone in the queue wait ``SOON_WAIT_SECS`` for a
        blocking appender to take them with its own (``_append_here``); any other
        request is taken at once. While commits keep coming (``WRITER_POLL_SECS``)
        the writer is not woken for an ``append_soon``: it looks again every
        ``SOON_WAIT_SECS`` by itself and finds a lone entry in time to commit it
        ``SOON_WAIT_SECS`` after it was handed over, as when woken.
        """
        cond = self._queue_cond
        while True:
            with cond:
                while True:
                    if not self._queue:
                        if time.monotonic() - self._core.last_commit < WRITER_POLL_SECS:
                            self._wait_looking(SOON_WAIT_SECS)
                        else:
                            cond.wait()
                        continue
                    oldest = self._queue[0]
                    if oldest is _STOP or not all(r is not _STOP and r.soon for r in self._queue):
                        break
                    left = oldest.at + SOON_WAIT_SECS - time.monotonic()
                    if left <= 0:
                        break
                    self._wait_looking(left)
            with self._commit_lock:
                if self._take():
                    break
        self._finish()
        self._core.handle(Close())

    def _wait_looking(self, timeout: float) -> None:
        """With ``_queue_cond`` held: wait at most ``timeout``; ``append_soon`` does not wake it meanwhile."""
        self._writer_looks = True
        try:
            self._queue_cond.wait(timeout)
        finally:
            self._writer_looks = False

    def _take(self) -> bool:
        """With ``_commit_lock`` held: take queued requests in order, a job alone, appends in groups
        committed at once. Returns True at ``_STOP``.

        While a group is being sequenced and signed, appenders released by the
        previous commit queue again; the group takes them too (up to
        ``MAX_GROUP`` entries) before it commits, so one transaction serves
        every appender that was waiting. Nothing waits for more to come.
        """
        cond, queued = self._queue_cond, self._queue
        while True:
            with cond:
                if not queued:
                    return False
                request = queued.popleft()
            if request is _STOP:
                return True
            if request.job is not None:
                self._run_job(request)
                continue
            group = _Group(*self._head)
            self._sequence(group, request)
            self._commit(self._fill(group))

    def _run_job(self, request: _Request) -> None:
        if not request.future.set_running_or_notify_cancel():
            return
        try:
            request.future.set_result(request.job())  # type: ignore[misc]
        except BaseException as exc:  # handed to the caller, never lost
            request.future.set_exception(exc)

    def _sequence(self, group: _Group, request: _Request) -> None:
        """Number, hash and sign one request's entries onto the group (unless it was cancelled)."""
        if not request.future.set_running_or_notify_cancel():
            return
        if self._failed_runs:
            runs = [item.run_id for item in request.items or ()]  # type: ignore[union-attr]
            if request.seal is not None:
                runs.append(request.seal[1])
            for run_id in runs:
                failed = self._failed_runs.get(run_id) if run_id is not None else None
                if failed is not None:
                    cls = type(failed) if isinstance(failed, StorageError) else IntegrityError
                    request.future.set_exception(cls(
                        f"run {run_id} cannot go on: an entry it handed over earlier was not written "
                        f"({failed})"))
                    return
        try:
            items = request.items
            if request.seal is not None:  # the run's entries before its seal: committed, then in this group
                fields, sealed, agent = request.seal
                count = self.run_size(sealed) + sum(row[2] == sealed for row in group.rows) + len(items or ())
                items = [*(items or ()), _item("run_seal", {**fields, "entries": count}, sealed, agent, self.sealed)]
            seq, prev = group.seq, group.prev
            key_id, sign = self._key.key_id, self._key.sign
            ts = format_ts(self._clock())  # the request's moment: its entries are committed together
            entries = []
            for kind, payload, run_id, agent, committed, readable in items:  # type: ignore[union-attr]
                seq += 1
                if committed is None:
                    h = entry_hash(seq, ts, run_id, agent, kind, payload, prev)
                    entries.append(Entry(seq, ts, run_id, agent, kind, payload, prev, h, sign(h), key_id))
                else:
                    h = entry_hash_v2(seq, ts, run_id, agent, kind, committed, prev)
                    entries.append(Entry(seq, ts, run_id, agent, kind, readable or b"", prev, h, sign(h), key_id,
                                         payload))
                prev = h
            self._core.handle(Sequenced(group.seq + 1, len(entries), not request.soon))
        except BaseException as exc:  # this request fails alone; the group goes on
            self._mark_failed(request, exc)
            request.future.set_exception(exc)
            return
        group.seq, group.prev = seq, prev
        group.requests.append((request, entries))
        group.rows.extend(e.as_row() for e in entries)

    def _commit(self, group: _Group) -> None:
        """Write the group's record and sync it, then release every waiter (or fail them all): the
        core's ``Seal`` → ``WriteLog`` (or ``AwaitCopy``, ``Drained`` → ``ResetLog``, ``WriteLog`` when the
        log has no room) → ``LogSynced`` → ``Acknowledge``."""
        if not group.rows:
            return
        core = self._core
        try:
            tail = self._tail
            assert tail is not None
            record = encode_rows(group.rows)
            # Appenders waited together for this commit (``core.crowded``): while they do, they queue
            # for the writer to commit them in one group rather than each leading a commit of its own.
            actions = core.handle(Seal(tail.fits(len(record))))
            if self._broken is not None:
                raise self._broken
            if self._refusing is not None:
                raise self._refusing
            if isinstance(actions[0], AwaitCopy):
                self._drain()  # the file starts over only once journal.db holds all it has
                core.handle(Drained())  # ResetLog, WriteLog
                tail.reset(len(record))
            tail.write(record)
        except BaseException as exc:
            if core.writer is not WriterState.IDLE:
                core.handle(LogFailed())  # FailGroup: nothing of it counts, its seqs are given again
            what = f"the journal could not record {len(group.requests)} request(s)"
            error: BaseException = storage_error(exc, what) or IntegrityError(
                f"{what}; nothing of them was written: {exc}")
            if error is not exc:
                error.__cause__ = exc
            for request, _ in group.requests:
                self._mark_failed(request, error)
                request.future.set_exception(error)
            return
        with self._state_lock:
            for _, entries in group.requests:
                for entry in entries:
                    self._acc.append(leaf_hash(entry.hash))
            self._head = (group.seq, group.prev)
            self._pending.extend(group.rows)
            # Acknowledge (below, once the run counters are kept); WakeCopier when a copy becomes due:
            # the copier starts its idle wait, copies a full batch, or (half the log used) copies all now.
            if isinstance(core.handle(LogSynced(time.monotonic(), 2 * tail.length >= tail.capacity))[0],
                          WakeCopier):
                self._copy_cond.notify()
        counts = self._run_counts
        for row in group.rows:
            if row[2] is not None:
                if row[4] == "run_seal":  # the run's last entry: nobody asks its size again
                    counts.pop(row[2], None)
                    self._run_base.pop(row[2], None)
                else:
                    if row[4] == "run_open" and row[2] not in counts:
                        # A run's first entry, committed since open: journal.db held none of it then.
                        self._run_base.setdefault(row[2], 0)
                    counts[row[2]] = counts.get(row[2], 0) + 1
        for request, entries in group.requests:
            if request.seal is not None:  # a run's end: the closing checkpoint, signed now
                try:
                    request.stored = self._sign_checkpoint(lazy=True)
                except BaseException as exc:  # handed over as the store's failure: the run's entries stand
                    request.stored = Future()
                    request.stored.set_exception(exc)
            request.future.set_result(entries)
        observers = self._observers
        if observers:
            acknowledged = [entry for _, entries in group.requests for entry in entries]
            for observer in observers:
                try:
                    observer(acknowledged)
                except Exception:  # an observer's fault is its own: the commit stands, the writer goes on
                    pass

    def observe(self, callback: Callable[[list[Entry]], None]) -> Callable[[], None]:
        """Have ``callback`` told the entries of every group from now on, once acknowledged, in seq
        order, from the thread that committed them (the writer, or an appender leading a commit),
        with the entries already in memory: nothing is read back and no copy into ``journal.db`` is
        asked for. It must return at once (hand the entries on, never wait); what it raises is
        ignored. Returns a function that stops telling it."""
        with self._commit_lock:  # no group is being told while the set changes
            self._observers = (*self._observers, callback)

        def stop() -> None:
            with self._commit_lock:
                self._observers = tuple(o for o in self._observers if o is not callback)

        return stop

    def _mark_failed(self, request: _Request, error: BaseException) -> None:
        if request.soon:
            for item in request.items or ():
                if item.run_id is not None:
                    self._failed_runs.setdefault(item.run_id, error)

    # ------------------------------------------------------------------ the copier
    def _run_copier(self) -> None:
        """Copy committed entries from the log into ``journal.db``, off the writer's way.

        A copy takes every pending entry (``_pending``, in the log and not yet in
        ``journal.db``) with the Merkle frontier they end at, and writes them in bounded
        pieces (``_insert``), one DuckDB transaction each, while the writer goes on
        committing to the log. It copies
        when ``IMPORT_BATCH`` entries are pending, when no commit came for
        ``IMPORT_IDLE_SECS``, and at once when somebody asks for it (``CommitCore.want``:
        the writer when half the log is used; ``_drain``: a read, the log starting
        over, close). So a commit never waits for a copy unless the log is full
        and not yet copied.

        A failure leaves the entries in the log (they are committed there). When
        the disk refused the write (full, read-only, I/O error) they stay pending:
        the copier tries again ``IMPORT_RETRY_SECS`` apart and whenever somebody
        waits, opening ``journal.db`` again first when DuckDB invalidated it; until
        a copy succeeds, waiters raise the failure (``STORAGE_FULL`` /
        ``STORAGE_ERROR``) and appends go on while the log has room. Any other
        failure (journal.db holds rows the journal did not write) breaks the
        journal: later appends and reads raise, and the next open finishes the
        copy or refuses.
        """
        cond = self._copy_cond
        while True:
            with cond:
                while not self._copier_stop and not self._jobs_due() and not self._copy_due():
                    cond.wait(self._copy_wait())
                if self._copier_stop:
                    self._copier_done = True
                    self._core.handle(Stop())
                    left, self._jobs = list(self._jobs), deque()
                    cond.notify_all()
                    for _, future in left:
                        if future.set_running_or_notify_cancel():
                            future.set_exception(Conflict(f"the journal {self.path} is closed"))
                    return
                job = self._jobs.popleft() if self._jobs else None
                if job is not None:
                    self._core.handle(JobTaken())
                if job is None:
                    copy = self._core.handle(CopyStart())[0]  # CopyRows(first, last)
                    rows = list(self._pending)
                    acc = self._acc.copy()  # ends at rows[-1]: the writer extends both under this lock
            if job is not None:
                fn, future = job
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:  # handed to the caller, never lost
                        future.set_exception(exc)
                continue
            try:
                if (rows[0][0], rows[-1][0]) != (copy.first, copy.last):  # type: ignore[union-attr]
                    with cond:
                        self._broken = IntegrityError(
                            f"the log's pending entries {rows[0][0]}..{rows[-1][0]} are not the copy's "
                            f"{copy.first}..{copy.last}")  # type: ignore[union-attr]
                    raise self._broken
                self._copy(rows, acc)  # sets _broken, or _copy_error (the disk), when it raises
            except BaseException:  # kept for the waiters; the entries stay in the log
                with cond:
                    # the next waiter asks again; a refused copy is tried again IMPORT_RETRY_SECS later
                    self._core.handle(CopyBroke() if self._broken is not None
                                      else CopyRefused(time.monotonic() + IMPORT_RETRY_SECS))
                    cond.notify_all()
                continue
            with cond:
                del self._pending[:len(rows)]
                self._core.handle(Copied(rows[-1][0]))
                self._copy_error = None
                cond.notify_all()

    def _jobs_due(self) -> bool:
        """Whether the copier runs its jobs now (called holding ``_copy_cond``): ``CommitCore.jobs_due``
        (at once, unless all are held back and the journal was committed to within ``IMPORT_IDLE_SECS``)."""
        return self._core.jobs_due(time.monotonic())

    def _hurry(self) -> None:
        """Have the copier run the jobs it holds back now (somebody waits for one of them)."""
        with self._copy_cond:
            self._hold_none()

    def _hold_none(self) -> None:
        """``_hurry``, holding ``_copy_cond``."""
        if self._core.handle(Hurry()):  # WakeCopier: jobs were held back
            self._copy_cond.notify_all()

    def _copy_due(self) -> bool:
        """Whether the copier copies now (called holding ``_copy_cond``): ``CommitCore.copy_due``."""
        return self._core.copy_due(time.monotonic())

    def _copy_wait(self) -> float | None:
        """How long the copier sleeps before looking again (None: until notified): ``CommitCore.copy_wait``
        (held-back jobs run once the journal is idle)."""
        return self._core.copy_wait(time.monotonic())

    def _copy(self, rows: list[tuple[Any, ...]], acc: MerkleAccumulator) -> None:
        """One copy attempt of ``rows`` (ending at ``acc``'s size) into ``journal.db``; on the copier."""
        try:
            if self._copy_error is not None:
                kept = self._drop_copied(rows)
                self._advance_stored(rows[:len(rows) - len(kept)])
                rows = kept
            if rows:
                self._copy_acc = acc
                self._insert(rows)
            faults.point("journal.after_copy")
        except BaseException as exc:
            what = (f"{self.path.name} could not take the {len(rows)} entries committed in "
                    f"{tail_path(self.path).name} (they are kept there and copied once it can)")
            error = storage_error(exc, what)
            with self._copy_cond:
                if error is None:
                    broken = IntegrityError(
                        f"{self.path.name} could not take the entries committed in {tail_path(self.path).name}: "
                        f"{exc}; they are kept there, and the next open of the journal copies them or refuses"
                    )
                    broken.__cause__ = exc
                    self._broken = broken
                    raise broken from exc
                self._copy_error = error
            if error is exc:
                raise
            raise error from exc

    def _drain(self) -> None:
        """Wait until ``journal.db`` holds every entry committed before this call.

        Asks the copier to copy at once (whatever the batch and idle rules say).
        Raises ``INTEGRITY_FAILURE`` when the journal is broken, and the copy's
        ``STORAGE_FULL`` / ``STORAGE_ERROR`` when an attempt started after this call
        failed. Returns at once on the copier's own thread and once it has stopped
        (closed: close copies what it can itself)."""
        if threading.current_thread() is self._copier:
            return
        cond = self._copy_cond
        with cond:
            self._hold_none()  # a copy runs the jobs queued before it
            core = self._core
            target = core.acknowledged
            ticket = core.attempts
            while core.copied < target:
                if self._broken is not None:
                    raise self._broken
                if core.failed_attempt > ticket and self._copy_error is not None:
                    raise self._copy_error
                if self._copier_done:
                    return
                if core.want(target):
                    cond.notify_all()
                cond.wait()
            if self._broken is not None:
                raise self._broken

    def _on_copier(self, fn: Callable[[], Any], *, lazy: bool = False) -> Future[Any]:
        """Have the copier run ``fn`` (a write to ``journal.db``) before its next copy; its future.

        ``lazy``: not at once, but with the next copy, once no commit came for ``IMPORT_IDLE_SECS``,
        or once somebody waits for it (``_hurry``): a DuckDB write holds the interpreter lock for a
        millisecond or more, which the run that just ended needs to finish."""
        future: Future[Any] = Future()
        with self._copy_cond:
            if self._copier_done:
                raise Conflict(f"the journal {self.path} is closed")
            self._core.handle(JobQueued(lazy))  # held back only behind held-back jobs
            self._jobs.append((fn, future))
            self._copy_cond.notify_all()
        return future

    def _drop_copied(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Before retrying a failed copy: the rows ``journal.db`` does not hold yet.

        DuckDB can report a failed commit whose rows it did commit (the commit
        reached its WAL, the checkpoint after it did not). Those rows must be the
        very same entries; anything else raises ``IntegrityError``."""
        con = self._db()
        (max_seq,) = con.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchall()[0]
        copied = [row for row in rows if row[0] <= max_seq]
        if not copied:
            return rows
        stored = _stored_rows(con, copied)
        for row in copied:
            if stored.get(row[0]) != Entry.from_row(row):
                raise IntegrityError(f"entry {row[0]} is not the entry {self.path.name} holds at that place")
        return [row for row in rows if row[0] > max_seq]

    def _db(self) -> duckdb.DuckDBPyConnection:
        """The journal's write connection (the copier's once open), opened again first when DuckDB
        invalidated ``journal.db``."""
        if self._reopen_needed:
            try:
                self._reopen()
            except BaseException as exc:
                storage = storage_error(exc, f"{self.path.name} could not be opened again after a failed write")
                if storage is None or storage is exc:
                    raise
                raise storage from exc
        return self._con

    def _reopen(self) -> None:
        """Open ``journal.db`` again after a write DuckDB could not finish invalidated it.

        DuckDB marks a database whose checkpoint failed (a full disk) as unusable
        until it is opened again; what it had committed is in its WAL and comes
        back on open. Runs on the copier thread; readers wait on the read lock.
        """
        with self._read_lock:
            if self._reader is not None:
                handed = list(self._cursors)
                for old in (self._reader, self._con):
                    try:
                        _close_interrupting(old, handed)  # a query on a handed-out cursor would keep it open
                    except duckdb.ResourceInUseException:
                        raise  # still busy after CLOSE_WAIT_SECONDS: the next copy tries again
                    except Exception:  # noqa: BLE001 - an invalidated database may refuse even this
                        pass
                self._reader = None  # type: ignore[assignment]  # closed: opened again before a read
                self._cursors.clear()  # closed with their connection
            con = connect_locked(self.path)
            try:
                lock_down(con, "SET threads = 1", f"SET memory_limit = '{MEMORY_LIMIT}'")  # as on open: SQL here reads the journal and nothing else
                self._appender = con.appender("entries")
                reader = con.cursor()
            except BaseException:
                con.close()
                raise
            self._con, self._reader = con, reader
            self._reopen_needed = False

    def _note_failure(self, exc: BaseException) -> None:
        if needs_reopen(exc):
            self._reopen_needed = True

    def _advance_stored(self, rows: list[tuple[Any, ...]]) -> None:
        """Count rows ``journal.db`` turned out to hold (a commit reported failed that reached its WAL)."""
        for row in rows:
            if row[0] == self._stored_acc.size + 1:
                self._stored_acc.append(leaf_hash(bytes(row[7])))

    def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        """Copy rows into ``journal.db`` in pieces (``copy_pieces``), one transaction each.

        Each piece stores its entries, their ``entry_fields`` and ``calls`` rows and the head and
        Merkle frontier of the prefix it ends, so every committed piece leaves ``journal.db`` a
        consistent prefix of the log, and the memory of a copy does not grow with one append. A
        failure or crash between two pieces keeps the pieces committed; the log keeps the rest.
        ``_copy_acc`` is the frontier the rows end at: the last piece must end there."""
        end = self._copy_acc
        if end.size != rows[-1][0]:
            raise IntegrityError(f"the copy of entries {rows[0][0]}..{rows[-1][0]} does not end at the "
                                 f"journal's head ({end.size})")
        if rows[0][0] != self._stored_acc.size + 1:
            raise IntegrityError(f"the copy of entries {rows[0][0]}..{rows[-1][0]} does not continue "
                                 f"{self.path.name} (its head is {self._stored_acc.size})")
        pieces = copy_pieces(rows)
        for number, piece in enumerate(pieces):
            acc = self._stored_acc.copy()
            for row in piece:
                acc.append(leaf_hash(bytes(row[7])))
            if number == len(pieces) - 1 and acc.root() != end.root():
                raise IntegrityError(f"the copy of entries {rows[0][0]}..{rows[-1][0]} does not have the "
                                     "journal's Merkle root")
            self._insert_piece(piece, acc)
            self._stored_acc = acc
            if number < len(pieces) - 1:
                faults.point("journal.after_piece")

    def _insert_piece(self, rows: list[tuple[Any, ...]], acc: MerkleAccumulator) -> None:
        """Insert rows, their ``entry_fields`` and ``calls`` rows and the head and frontier ``acc``
        (which ends with them) in one transaction. A crash before the commit leaves neither (the
        log keeps the entries). See docs/journal.md for the measurement."""
        try:
            con = self._db()
            fault_point(self.path.name)
            con.begin()
            try:
                if len(rows) == 1:
                    con.execute(f"INSERT INTO entries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows[0])
                else:
                    # In slices: the appender holds the GIL while it converts rows, and the
                    # writer thread must not wait long for it between two slices.
                    for at in range(0, len(rows), APPEND_SLICE):
                        self._appender.append_rows(rows[at:at + APPEND_SLICE])
                    self._appender.flush()
                faults.point("journal.before_frontier")
                copy_entry_fields(con, rows[0][0], rows[-1][0])
                store_frontier(con, acc, bytes(rows[-1][7]))
                con.commit()
            except BaseException:
                if len(rows) > 1:
                    try:
                        self._appender.clear()
                    except Exception:  # noqa: BLE001 - an invalidated database refuses this too
                        pass
                try:
                    con.rollback()
                except Exception:  # noqa: BLE001 - a failed commit ended the transaction already
                    pass
                raise
        except BaseException as exc:
            self._note_failure(exc)
            raise

    def _finish(self) -> None:
        """On close, after every queued request: copy what is pending, write the closing checkpoint."""
        try:
            self._drain()
            size = self._acc.size
            if size and (self._latest is None or self._latest[0] < size):
                self._sign_checkpoint().result()
        except BaseException as exc:  # re-raised by close(); the log keeps what journal.db lacks
            self._close_error = exc

    # ------------------------------------------------------------------ checkpoints
    def run_size(self, run_id: str) -> int:
        """How many entries the run has, without a query for runs that began since open.

        For a run not sealed yet (what its ``run_seal`` counts): a run's counters are
        dropped when its seal is committed, so they do not accumulate over the runs
        of a long-lived process."""
        base = self._run_base.get(run_id)
        if base is None:
            with self._read_lock:  # rows up to the opening head are in journal.db since open
                if self._reader is None:
                    raise self._unreadable()
                (base,) = self._reader.execute(
                    "SELECT count(*) FROM entries WHERE run_id = ? AND seq <= ?", [run_id, self._opened_at]
                ).fetchall()[0]
            self._run_base[run_id] = base
        return base + self._run_counts.get(run_id, 0)

    async def checkpoint_async(self) -> str:
        """``checkpoint`` for asyncio callers: the writer signs it while the loop goes on."""
        return await asyncio.wrap_future(await self.checkpoint_signed_async())

    async def checkpoint_signed_async(self) -> Future[str]:
        """Sign a checkpoint of every committed entry; returns once signed, with the future of its
        store in ``journal.db`` (its note, or the store's ``STORAGE_*`` error).

        For a run's closing checkpoint: the run's outcome does not wait for ``journal.db``.
        Whoever reads checkpoints meanwhile (``latest_checkpoint``, ``checkpoints``, the
        proofs) waits for the store, so nobody reads a checkpoint that is not stored."""
        return await asyncio.wrap_future(self._submit(None, self._sign_checkpoint))

    async def seal_async(self, run_id: str, agent: str | None, before: Sequence[tuple[str, dict[str, Any]]],
                         seal: dict[str, Any]) -> tuple[list[Entry], Future[str]]:
        """End a run: ``before`` (its last entries) and its ``run_seal`` (``seal`` with ``entries``, how
        many entries the run has before the seal) in one commit, after everything handed over before
        (``append_soon`` entries included, in the same commit when they fit); then sign a
        checkpoint of every committed entry.

        Returns the entries written and the future of the checkpoint's store in ``journal.db``
        (as ``checkpoint_signed_async``): one commit and one pass of the writer for what took
        three of each. Durable when this returns; fails as an append does (``STORAGE_*``, a run
        that cannot go on)."""
        if not run_id:
            raise BadInput("seal_async needs the run it ends")
        if "entries" in seal:
            raise BadInput("the seal's entries are counted by the journal")
        items = [_item(kind, payload, run_id, agent, self.sealed) for kind, payload in before]
        _item("run_seal", {**seal, "entries": 0}, run_id, agent, self.sealed)  # bad input raises here, not when sequenced
        request = _Request(items, seal=(dict(seal), run_id, agent))
        entries = await asyncio.wrap_future(self._enqueue(request))
        assert request.stored is not None
        return entries, request.stored

    def checkpoint(self) -> str:
        """Sign and store a C2SP checkpoint of every committed entry; returns the note.

        When the latest stored checkpoint already covers every entry, returns it.
        """
        return self._submit(None, self._sign_checkpoint).result().result()

    def _sign_checkpoint(self, *, lazy: bool = False) -> Future[str]:
        """On the writer: sign the checkpoint of every committed entry and hand it to the copier
        to store; the future of the stored note (the writer goes on committing meanwhile).
        ``lazy``: a run's closing checkpoint, stored once the journal is idle (``_on_copier``)."""
        # The entries it covers may still be in journal.log only: they are committed,
        # and whoever reads journal.db after a crash reads the log too.
        size = self._acc.size
        storing = self._storing
        if storing is not None and self._storing_size == size and not (storing.done() and storing.exception()):
            if not lazy:  # somebody asks for it: a closing checkpoint held back is stored now
                self._hurry()
            return storing  # the same checkpoint, stored or on its way
        latest = self._latest
        if latest is not None and latest[0] == size:
            done: Future[str] = Future()
            done.set_result(latest[1])
            return done
        cp = Checkpoint(self._origin, size, self._acc.root())
        note = self._signer.sign(cp.body())
        storing = self._on_copier(lambda: self._store_checkpoint(cp, note), lazy=lazy)
        self._storing, self._storing_size = storing, size
        return storing

    def _stored(self) -> None:
        """Wait for the checkpoint being stored, if any (at most ``CLOSE_WAIT_SECONDS``; its
        failure was told to whoever asked for it): what is read next includes it."""
        storing = self._storing
        if storing is None or storing.done() or threading.current_thread() is self._copier:
            return
        self._hurry()
        try:
            storing.result(timeout=CLOSE_WAIT_SECONDS)
        except Exception:  # noqa: BLE001 - a refused store: the checkpoints read are those stored
            pass

    def _store_checkpoint(self, cp: Checkpoint, note: str) -> str:
        """On the copier: store a signed checkpoint; returns its note."""
        try:
            con = self._db()
            fault_point(self.path.name)
            # ON CONFLICT: a commit DuckDB reported as failed may have reached its WAL
            # (Ed25519 is deterministic, so the stored note is this very note).
            con.execute(
                "INSERT INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                [cp.size, cp.root, note, format_ts(self._clock())],
            )
        except BaseException as exc:
            self._note_failure(exc)
            error = storage_error(exc, f"the checkpoint of {cp.size} entries was not stored")
            if error is None or error is exc:
                raise
            raise error from exc
        if self._latest is None or self._latest[0] < cp.size:  # stored in the order they were signed
            self._latest = (cp.size, note)
        return note

    def latest_checkpoint(self) -> str | None:
        """The latest stored checkpoint note, or None."""
        self._stored()
        latest = self._latest
        return latest[1] if latest else None

    def checkpoints(self) -> list[tuple[int, bytes, str]]:
        """Every stored checkpoint as ``(size, root, note)``, smallest first."""
        return [
            (int(s), bytes(r), n)
            for s, r, n in self._read("SELECT size, root, note FROM checkpoints ORDER BY size")
        ]

    def add_cosignature(self, size: int, witness: str, timestamp: int, line: str) -> None:
        """Store a witness's cosignature line of the stored checkpoint of ``size`` (verified by the
        caller); a second one from the same witness for the same size replaces the first."""
        def store() -> None:
            self._db().execute(
                "INSERT OR REPLACE INTO checkpoint_cosignatures (size, witness, timestamp, signature, "
                "created_at) VALUES (?, ?, ?, ?, ?)", [size, witness, timestamp, line, format_ts(self._clock())])

        self._on_copier(store).result()

    def cosignatures(self) -> list[tuple[int, str, int, str]]:
        """Every stored cosignature as ``(size, witness key, timestamp, line)``, smallest size first."""
        return [(int(s), w, int(t), line) for s, w, t, line in self._read(
            "SELECT size, witness, timestamp, signature FROM checkpoint_cosignatures ORDER BY size, witness")]

    # ------------------------------------------------------------------ proofs
    def _subtree(self, lo: int, hi: int) -> bytes:
        """The Merkle Tree Hash of leaves ``lo..hi-1`` (entries ``lo+1..hi``), streamed from
        ``journal.db`` in seq ranges: O(log n) hashes held, whatever the range."""
        acc = MerkleAccumulator()
        start = lo + 1
        while start <= hi:
            end = min(hi, start + SEQ_RANGE - 1)
            rows = self._read("SELECT hash FROM entries WHERE seq BETWEEN ? AND ? ORDER BY seq", [start, end])
            if len(rows) != end - start + 1:
                raise IntegrityError(f"the journal holds {len(rows)} of the entries {start}..{end} asked for")
            for (h,) in rows:
                acc.append(leaf_hash(bytes(h)))
            start = end + 1
        return acc.root()

    def _entry_hash(self, seq: int) -> bytes:
        rows = self._read("SELECT hash FROM entries WHERE seq = ?", [seq])
        if not rows:
            raise IntegrityError(f"the journal holds no entry {seq}")
        return bytes(rows[0][0])

    def inclusion_proof(self, seq: int, checkpoint: str | None = None) -> InclusionProof:
        """Prove entry ``seq`` is in the tree of a checkpoint (default: the latest,
        written first when it does not cover ``seq``). The proof is verified before return.

        The hashes are read from ``journal.db`` range by range (``_subtree``), not held."""
        self._stored()
        return prove_inclusion(
            seq, checkpoint, head=self.head()[0], latest=self._latest, write_checkpoint=self.checkpoint,
            verifier=self.verifier(), origin=self._origin, hashes=None,
            subtree=self._subtree, entry_hash=self._entry_hash,
        )

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> ConsistencyProof:
        """Prove the tree of ``new_size`` entries (default: all) extends that of ``old_size``."""
        head = self.head()[0]
        new = head if new_size is None else new_size
        if not isinstance(old_size, int) or not isinstance(new, int) or not 0 < old_size <= new <= head:
            raise BadInput(f"need 0 < old_size <= new_size <= {head}, got {old_size!r}, {new!r}")
        proof = ConsistencyProof(
            old_size, new, self._subtree(0, old_size), self._subtree(0, new),
            tuple(consistency_path(old_size, new, self._subtree)),
        )
        proof.verify()
        return proof

    # ------------------------------------------------------------------ reading
    def head(self) -> tuple[int, bytes]:
        """``(seq, hash)`` of the last committed entry; ``(0, 32 zero bytes)`` when empty."""
        with self._state_lock:
            return self._head

    def _catch_up(self) -> None:
        """Have the copier copy pending entries into ``journal.db`` before a read (``_drain``).

        Every entry an append has returned is pending or copied when this is
        called, so the read that follows sees it. Raises ``STORAGE_FULL`` /
        ``STORAGE_ERROR`` while ``journal.db`` cannot take the copy, and
        ``INTEGRITY_FAILURE`` when the journal is broken.
        """
        if self._broken is not None:
            raise self._broken
        if self._reopen_needed and threading.current_thread() is not self._copier:
            try:
                self._on_copier(self._db).result()  # the reader's connection is invalidated too
            except Conflict:
                pass
        self._drain()
        self._stored()  # and the checkpoint being stored, if any

    def _unreadable(self) -> BaseException:
        if self._closed:
            return Conflict(f"the journal {self.path} is closed")
        return StorageError(f"{self.path.name} could not be opened again after a failed write; "
                            "the writer tries again at its next write")

    def _read(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        self._catch_up()
        with self._read_lock:
            if self._reader is None:
                raise self._unreadable()
            return self._reader.execute(sql, params).fetchall()

    def entries(
        self,
        run_id: str | None = None,
        since_seq: int | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[Entry]:
        """Committed entries in seq order, filtered by run, by ``seq > since_seq`` and by kind."""
        where, params = [], []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        if since_seq is not None:
            where.append("seq > ?")
            params.append(int(since_seq))  # type: ignore[arg-type]  # DuckDB takes any value
        if kinds is not None:
            kinds = list(kinds)
            if not kinds:
                return []
            where.append(f"kind IN ({', '.join('?' for _ in kinds)})")
            params.extend(kinds)
        sql = f"SELECT {_COLUMNS} FROM entries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [Entry.from_row(r) for r in self._read(sql, params)]

    def get(self, seq: int) -> Entry:
        rows = self._read(f"SELECT {_COLUMNS} FROM entries WHERE seq = ?", [seq])
        if not rows:
            raise NotFound(f"the journal has no entry {seq}")
        return Entry.from_row(rows[0])

    def snapshot_rows(self) -> tuple[list[tuple[Any, ...]], list[tuple[int, bytes, str]]]:
        """Every entry row and checkpoint row, read in one transaction (for ``verify``)."""
        self._catch_up()
        with self._read_lock:
            if self._reader is None:
                raise self._unreadable()
            cur = self._reader
            cur.begin()
            try:
                rows = cur.execute(f"SELECT {_COLUMNS} FROM entries ORDER BY seq").fetchall()
                cps = cur.execute("SELECT size, root, note FROM checkpoints ORDER BY size").fetchall()
            finally:
                cur.commit()
        return rows, [(int(s), bytes(r), n) for s, r, n in cps]

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A new DuckDB cursor on the journal's database, for the caller's own reads; close it.

        It sees every entry appended before this call (later ones once they are
        copied: ask for a new cursor to see them). Closing the journal interrupts
        a query still running on it and closes it."""
        self._catch_up()
        with self._read_lock:
            if self._reader is None:
                raise self._unreadable()
            cursor = self._reader.cursor()
            self._cursors.add(cursor)
            return cursor

    def sql(self, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read query (e.g. over the views) on the journal's reader cursor."""
        return self._read(query, params)

    # ------------------------------------------------------------------ closing
    def _close_reader(self) -> None:
        """Close the reader cursor and every cursor ``cursor()`` handed out, interrupting a query
        still running on one (``_close_interrupting``)."""
        with self._read_lock:  # a read through _read holds it: it finishes first
            reader, self._reader = self._reader, None  # type: ignore[assignment]  # as above
            handed = list(self._cursors)
        if reader is not None:
            _close_interrupting(reader, handed)

    def close(self) -> None:
        """Commit what is queued, write a checkpoint if entries were added since the last, close."""
        with self._queue_cond:
            if self._closed:
                return
            self._closed = True
            self._queue.append(_STOP)
            self._queue_cond.notify()
        atexit.unregister(self.close)
        try:
            if self._thread.is_alive():
                self._thread.join()
        finally:
            with self._copy_cond:
                self._copier_stop = True
                self._copy_cond.notify_all()
            if self._copier.is_alive():
                self._copier.join()
            self._close_reader()
            try:
                self._con.close()
            except Exception:  # noqa: BLE001 - an invalidated database: its WAL holds what it committed
                pass
            if self._tail is not None:  # removed when journal.db holds everything it has
                self._tail.close(remove=not self._pending and self._broken is None and self._close_error is None)
            with _OPEN_LOCK:
                _OPEN.pop(self.path.resolve(), None)
        if self._close_error is not None:
            error = storage_error(self._close_error, "the closing checkpoint was not written")
            raise error or IntegrityError(f"the closing checkpoint was not written: {self._close_error}")


def copy_pieces(rows: list[tuple[Any, ...]], entries: int | None = None,
                max_bytes: int | None = None) -> list[list[tuple[Any, ...]]]:
    """``rows`` cut, in order, into pieces of at most ``entries`` rows and ``max_bytes`` payload
    bytes (``COPY_PIECE_ENTRIES``, ``COPY_PIECE_BYTES``); a single larger entry is a piece alone."""
    entries = COPY_PIECE_ENTRIES if entries is None else entries
    max_bytes = COPY_PIECE_BYTES if max_bytes is None else max_bytes
    pieces: list[list[tuple[Any, ...]]] = []
    piece: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:
        n = len(row[5])
        if piece and (len(piece) >= entries or size + n > max_bytes):
            pieces.append(piece)
            piece, size = [], 0
        piece.append(row)
        size += n
    if piece:
        pieces.append(piece)
    return pieces


class _SaltSource:
    """Random bytes for salts from the OS, drawn 4 KiB at a time (a ``getrandom`` per entry cost
    about as much as its salting); a child made by ``fork`` draws its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._at = 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._buf):
                self._buf, self._at = os.urandom(max(4096, n)), 0
            out = self._buf[self._at:self._at + n]
            self._at += n
            return out

    def forget(self) -> None:
        self._buf, self._at = b"", 0


_SALTS = _SaltSource()
os.register_at_fork(after_in_child=_SALTS.forget)


def _item(kind: str, payload: dict[str, Any], run_id: str | None = None, agent: str | None = None,
          sealed: bool = False) -> _Item:
    """Validate in the caller's thread, so bad input raises there and nothing is queued. ``sealed``
    (a format 2 journal): the payload salted, one fresh salt per field, and its commitments."""
    check_kind(kind)
    check_text("run_id", run_id, nullable=True)
    check_text("agent", agent, nullable=True)
    if sealed:
        if not isinstance(payload, dict):
            raise BadInput(f"a journal payload must be a JSON object, not {type(payload).__name__}")
        stored, committed, readable = seal_parts(payload, _SALTS.take(SALT_SIZE * len(payload)))
        return _Item(kind, stored, run_id, agent, committed, readable)
    return _Item(kind, canonical_payload(payload), run_id, agent)
