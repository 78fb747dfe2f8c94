"""``runtime.db``: agents, tasks, batches, chat sessions, agent memory and the REST API's idempotency keys, persisted.

The owner process holds one connection for its lifetime. Rows are written at
state changes and when a run suspends, so a restart finds registered agents,
suspended tasks (with everything needed to resume them) and sessions. Values
that are not scalars are stored as JSON text.

Writes do not block the caller (the runtime's event loop): each is serialised at
once (a snapshot of the record as it is now) and handed, in order, to one
writer thread. A task's or a session's state written as it runs (nobody
waits for it) is committed within ``DEFER_SECS`` rather than at once, and a
later snapshot of the same row replaces it meanwhile: a task that starts and
ends within that time costs one row write, not one per state, and the writes
stay out of the way of the run's own commits. Other writes (an agent's memory,
a batch) are committed at once, with the held ones before them. Reads wait for
the writes queued before them, so a read sees every earlier write. ``flush()``
/ ``await flush_async()`` wait until everything queued is committed: the
runtime does so where a row must be
durable before anyone is told (a run suspended). A write whose caller must
know it is committed before answering (a task submitted, an agent registered)
is ``acknowledged``: it returns a future of its own commit, and a failure
reaches that caller and is not retried, so nobody is told of a row that is
not there and no row appears that a caller was told was refused.

When the disk refuses a write (full, read-only, I/O error), the write is kept,
in order, with every later one behind it, and tried again (``RETRY_SECS``
apart, and at every flush or acknowledged write) until it succeeds: the
writer recovers by itself once space is back. Meanwhile flushes and reads
raise ``STORAGE_FULL`` / ``STORAGE_ERROR``. A kept write for a row is replaced
by a later full snapshot of the same row, so what is kept stays bounded by the
rows changed. A failure that is not the disk's is raised once, by the next
read or flush, and not retried.

DuckDB commits into ``runtime.db.wal`` and copies into ``runtime.db`` at a
checkpoint (on close, or when the log grows large). A WAL that is lost (a
backup or a copy that left it behind, a file system that kept the file and not
its log) takes every commit since the last checkpoint with it, and nothing in
``runtime.db`` itself says so. The journal does: every task ``submit``
acknowledges has a ``task_submitted`` entry, and the journal's mark (row 2 of
``home_facts``) holds the journal's head up to which every submitted task was found here (written at each
start). A file that lost its log lost the mark with the rows, so the next start
reads the journal from the older mark and finds the tasks that are gone
(``runtime/acknowledged.py``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

from apollia_nb.dbutil import fault_point, limit_memory, needs_reopen, storage_error
from apollia_nb.errors import HomeFileRolledBack, StorageError
from apollia_nb.home import check_whole, damage_error, damaged_file

__all__ = ["RuntimeRecords", "RETRY_SECS", "open_records", "rolled_back", "REBUILT_FROM_JOURNAL", "CLAIMS_SUFFIX"]

#: The claims file beside ``runtime.db``: how many changes, by table, it committed and acknowledged.
CLAIMS_SUFFIX = ".acks"
_CLAIMS_SIZE = 512  # written in place, padded: one sector
_COUNTS_ROW = 3  # the row of ``home_facts`` that holds the same counts, committed with the changes

#: How often the writer tries again a write the disk refused, while nothing else asks it to.
RETRY_SECS = 0.5

#: The most writes the writer commits in one transaction (those queued while it committed the last group).
GROUP_MAX = 256

#: How long a task's or a session's state written as it runs may stay queued before it is committed
#: (a flush, a read, any other write or the close commits it at once). A later snapshot replaces it.
DEFER_SECS = 0.25


#: The most rows of one table the writer's group writes in one statement (see ``_Row``).
ROWS_MAX = 64
#: The fewest rows to update that the group writes with one statement: an ``UPDATE … FROM (VALUES …)`` costs
#: about as much as four single-row ``UPDATE``s (measured: 2.1 ms of CPU with its commit for one row, 2.9 for
#: eight, against 1.2 and 4.4 one by one), so fewer are updated one by one. New rows are always inserted together.
UPDATE_ROWS_MIN = 5


class _Row(NamedTuple):
    """A row an upsert writes, as data (``RuntimeRecords._upsert``): in the writer's group, rows
    queued one after another for one table, with the same columns and the same ``mode``, are
    written by one statement (a statement costs about half a millisecond of DuckDB's time
    whatever its size; a row in a statement of many about a tenth of that; ``UPDATE_ROWS_MIN``)."""

    table: str
    keys: tuple[str, ...]  # the key's columns
    columns: tuple[str, ...]  # the other columns written
    values: tuple[Any, ...]  # the keys' values, then the columns'
    mode: str  # "upsert": update the row, else insert it; "insert": a new row (one there already fails)


class _Write(NamedTuple):
    """One queued write: ``run`` (None: only a flush), the row it writes (``key``), whether it
    writes the whole row (``whole``: a later one replaces it), and ``done`` for an acknowledged
    write or a flush. ``row``: the same write as data, when it is an upsert (``_Row``)."""

    run: Callable[[], None] | None
    key: Hashable | None = None
    whole: bool = True
    done: Future[None] | None = None
    acknowledged: bool = False
    undo: Callable[[], None] | None = None
    defer: bool = False  # a state snapshot that may wait DEFER_SECS (a later one replaces it)
    alone: bool = False  # makes its own transaction: never committed in a group with others
    row: "_Row | None" = None
    after: "Future[None] | None" = None  # an acknowledged write queued before it: refused, this one is refused too


def _refused_before(item: _Write) -> BaseException | None:
    """Why the write ``item`` depends on (``after``, queued before it) was refused; None when it was not
    (committed, or in the same group as ``item``: committed or refused with it)."""
    after = item.after
    if after is None or not after.done():
        return None
    return after.exception()


_STOP = _Write(None)


def _hold(held: OrderedDict[Hashable, _Write], item: _Write) -> None:
    """Add a write to ``held`` (kept or deferred writes, in order): a whole row replaces the write
    held for its row, in its place; any other write runs after it."""
    key = item.key if item.key is not None else object()
    earlier = held.get(key)
    if earlier is None or item.whole:
        held[key] = item
    else:
        first, then = earlier.run, item.run
        assert first is not None and then is not None
        held[key] = earlier._replace(run=lambda: (first(), then()), row=None)  # type: ignore[arg-type]  # its value is not read

_SCHEMA = """
CREATE TABLE IF NOT EXISTS home_facts (
    id INTEGER PRIMARY KEY,
    facts VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
    name VARCHAR PRIMARY KEY,
    manifest VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    warnings VARCHAR NOT NULL,
    registered_at VARCHAR NOT NULL
);
ALTER TABLE agents ADD COLUMN IF NOT EXISTS workspace VARCHAR;
CREATE TABLE IF NOT EXISTS tasks (
    id VARCHAR PRIMARY KEY,
    agent VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    record VARCHAR NOT NULL,
    updated_at VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id VARCHAR PRIMARY KEY,
    agent VARCHAR NOT NULL,
    state VARCHAR NOT NULL,
    parent_id VARCHAR,
    record VARCHAR NOT NULL,
    updated_at VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS memory (
    agent VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value VARCHAR NOT NULL,
    PRIMARY KEY (agent, key)
);
CREATE TABLE IF NOT EXISTS model_state (
    agent VARCHAR PRIMARY KEY,
    state VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency (
    scope VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    status INTEGER NOT NULL,
    response VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE TABLE IF NOT EXISTS batches (
    id VARCHAR PRIMARY KEY,
    agent VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    record VARCHAR NOT NULL,
    updated_at VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_items (
    batch_id VARCHAR NOT NULL,
    idx INTEGER NOT NULL,
    task_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    item VARCHAR NOT NULL,
    goal VARCHAR NOT NULL,
    error VARCHAR,
    PRIMARY KEY (batch_id, idx)
);
"""


def _statements(writes: list[_Write]) -> list[list[_Write]]:
    """A group's writes as the statements that write them, in the order to run: the rows of one kind (table,
    keys, columns, mode) gathered into one statement (at most ``ROWS_MAX``), ahead of the rows of other
    kinds queued between them, such as a task's row queued behind its request's key and the next request's
    key behind it. Only the order of writes to other rows changes, inside the group's one transaction:
    a write that is not a row, or a second write of a row already gathered, first runs what was gathered,
    so every row's writes, and every write that is not a row, keep their place."""
    out: list[list[_Write]] = []
    gathered: dict[tuple[Any, ...], list[_Write]] = {}  # by kind, in the order each kind first came
    keys: set[Hashable] = set()

    def close() -> None:
        out.extend(gathered.values())
        gathered.clear()
        keys.clear()

    for write in writes:
        if write.row is None:
            close()
            out.append([write])
            continue
        if write.key in keys:
            close()
        kind = write.row[:3] + write.row[4:]  # table, keys, columns, mode
        run = gathered.setdefault(kind, [])
        run.append(write)
        keys.add(write.key)
        if len(run) == ROWS_MAX:
            out.append(gathered.pop(kind))
            keys.difference_update(w.key for w in run)
    close()
    return out


class RuntimeRecords:
    """Thin persistence for the runtime. Thread-safe (one lock around one connection)."""

    def __init__(self, path: Path) -> None:
        import duckdb

        from apollia_nb.dbutil import limit_memory, raise_if_locked

        self.path = path
        try:
            self._con = duckdb.connect(str(path))
        except duckdb.IOException as exc:
            raise_if_locked(exc, path)
            raise storage_error(exc, f"{path.name} could not be opened") or exc from None
        try:
            # Records are single rows; DuckDB's worker threads only add per-statement cost.
            self._con.execute("SET threads = 1")
            limit_memory(self._con)  # a long-lived owner's cache stays bounded
            self._con.execute(_SCHEMA)
        except duckdb.Error as exc:  # a new file on a full disk
            self._con.close()
            raise storage_error(exc, f"{path.name} could not be opened") or exc from None
        self._lock = threading.RLock()  # one statement (or the writer's one group) at a time on the connection
        self._writes: queue.SimpleQueue[_Write] = queue.SimpleQueue()
        self._submit_lock = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None  # a failure that is not the disk's, for the next flush
        self._kept: OrderedDict[Hashable, _Write] = OrderedDict()  # refused by the disk, in order
        self._kept_error: StorageError | None = None  # why the first kept write was refused
        self._deferred: OrderedDict[Hashable, _Write] = OrderedDict()  # queued, not yet due, in order
        self._deferred_since = 0.0  # when the oldest deferred write was queued (monotonic)
        self._reopen_needed = False
        self._in_group = False  # the writer's group transaction is open (see _group)
        # (a database in memory, a client's, claims nothing: it has no log to lose)
        self._claims = None if str(path) == ":memory:" else path.with_name(path.name + CLAIMS_SUFFIX)
        self._claims_fd: int | None = None
        self._file_id, self._counts = self._load_counts()
        self._stored_counts = dict(self._counts)  # as this file held them when it was opened
        self._unsealed = False  # changes committed and not yet counted in the claims file
        self._uncounted = False  # changes committed whose counts runtime.db does not hold yet
        self._writer = threading.Thread(target=self._run_writes, name=f"runtime-records:{path}", daemon=True)
        self._writer.start()
        atexit.register(self.close)  # a process that ends without closing still commits what is queued

    # --- what was acknowledged (a lost write-ahead log is found at the next open) ------------------
    def _load_counts(self) -> tuple[str, dict[str, int]]:
        """This file's id and its committed changes by table (``home_facts`` row 3). A file without them
        (new, or made before they were kept) gets an id, checkpointed at once: the id is never only in
        the write-ahead log, so a file that lost its log still knows it is the file the claims speak of."""
        import duckdb

        rows = self._con.execute("SELECT facts FROM home_facts WHERE id = ?", [_COUNTS_ROW]).fetchall()
        try:
            kept = json.loads(rows[0][0])
            return str(kept["file"]), {str(k): int(v) for k, v in kept["counts"].items()}
        except (IndexError, ValueError, TypeError, KeyError, AttributeError):
            pass
        file_id = uuid.uuid4().hex
        try:
            self._con.execute("INSERT OR REPLACE INTO home_facts VALUES (?, ?)",
                              [_COUNTS_ROW, json.dumps({"file": file_id, "counts": {}})])
            self._con.execute("CHECKPOINT")
        except duckdb.Error as exc:  # a full disk
            self._con.close()
            raise storage_error(exc, f"{self.path.name} could not be opened") or exc from None
        return file_id, {}

    def lost_changes(self) -> dict[str, int]:
        """Pure but for two reads: how many acknowledged changes, by table, the claims file (what was
        acknowledged, ``runtime.db.acks``) counts beyond what this file holds. Empty when nothing is lost,
        or when the claims are not this file's (another file, none, or unreadable: nothing can be told)."""
        if self._claims is None:
            return {}
        try:
            claimed = json.loads(self._claims.read_bytes())
            if str(claimed["file"]) != self._file_id:
                return {}
            counts = {str(k): int(v) for k, v in claimed["counts"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}
        return {t: n - self._stored_counts.get(t, 0) for t, n in counts.items() if n > self._stored_counts.get(t, 0)}

    def _tally(self, item: _Write, changed: Any = None) -> None:
        """Count a committed write (by its table) among the changes to claim; ``changed`` (what the write
        returned) ``False``: it changed nothing worth claiming (a row written again as it was, a delete)."""
        table = item.key[0] if isinstance(item.key, tuple) and item.key else "idempotency"
        if table != "home_facts" and self._claims is not None and changed is not False:
            self._counts[table] = self._counts.get(table, 0) + 1
            self._unsealed = True

    def _counts_now(self) -> None:
        """Write the counts into ``home_facts`` row 3 (in the writer's transaction when one is open)."""
        with self._lock:
            self._con.execute("UPDATE home_facts SET facts = ? WHERE id = ?",
                              [json.dumps({"file": self._file_id, "counts": self._counts}), _COUNTS_ROW])

    def _seal(self) -> None:
        """Before anyone is told: the counts committed in ``runtime.db`` (unless the write's own
        transaction committed them), then written into the claims file. Never more is claimed than is
        committed; a failure leaves the claims behind (a later seal catches up) and never fails what it
        follows. The claims file is not synced: a process killed (``kill -9``) leaves what it wrote in the
        page cache, which is what a later open reads; after a power loss it may tell less, never more."""
        if not self._unsealed:
            return
        try:
            if self._uncounted:
                self._run(self._counts_now)
                self._uncounted = False
            data = json.dumps({"file": self._file_id, "counts": self._counts}).encode()
            if self._claims_fd is None:
                self._claims_fd = os.open(self._claims, os.O_WRONLY | os.O_CREAT, 0o600)  # type: ignore[arg-type]  # claims are kept only for a file
            os.pwrite(self._claims_fd, data.ljust(_CLAIMS_SIZE), 0)
            if len(data) > _CLAIMS_SIZE:
                os.ftruncate(self._claims_fd, len(data))
        except Exception:  # noqa: BLE001 - the next seal tries again
            return
        self._unsealed = False

    def _run_counted(self, item: _Write) -> None:
        """Run one write with the counts in its own transaction (one commit, one sync of the log) and
        count it; a write that cannot run in a transaction (a new row that was there after all) is run
        as before, its counts written by the next seal."""
        assert item.run is not None
        if self._claims is None or self._in_group or self._reopen_needed:
            self._tally(item, self._run(item.run))
            self._uncounted = self._uncounted or self._unsealed
            return
        before = dict(self._counts), self._unsealed, self._uncounted
        with self._lock:
            con = self._con
            try:
                con.execute("BEGIN TRANSACTION")
                self._in_group = True
                try:
                    self._tally(item, self._run(item.run))
                    if self._unsealed:
                        self._counts_now()
                finally:
                    self._in_group = False
                con.execute("COMMIT")
                self._uncounted = False
                return
            except BaseException:  # noqa: BLE001 - as before: on its own, then the counts
                self._counts, self._unsealed, self._uncounted = before
                try:
                    con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - a failed commit ended the transaction
                    pass
        self._tally(item, self._run(item.run))
        self._uncounted = self._uncounted or self._unsealed

    def close(self) -> None:
        """Commit what is queued (trying once more what the disk refused), then close."""
        with self._submit_lock:
            if self._closed:
                return
            self._closed = True
            self._writes.put(_STOP)
        atexit.unregister(self.close)
        self._writer.join()
        with self._lock:
            try:
                self._con.close()
            except Exception:  # noqa: BLE001 - an invalidated database: its WAL holds what it committed
                pass
        if self._claims_fd is not None:
            os.close(self._claims_fd)
            self._claims_fd = None

    @property
    def kept(self) -> int:
        """Writes the disk refused that the writer still holds to try again."""
        return len(self._kept)

    # --- the writer ------------------------------------------------------
    def _run_writes(self) -> None:
        while True:
            if self._unsealed and not self._deferred and not self._kept and self._writes.empty():
                self._seal()  # idle: what nobody waited for is claimed too
            timeout = RETRY_SECS if self._kept else None
            if self._deferred:
                due = self._deferred_since + DEFER_SECS - time.monotonic()
                if due <= 0:
                    self._commit_deferred()
                    continue
                timeout = due if timeout is None else min(timeout, due)
            try:
                item = self._writes.get(timeout=timeout)
            except queue.Empty:
                if self._kept:
                    self._retry()
                continue
            items = [item]
            while len(items) < GROUP_MAX and items[-1] is not _STOP:
                try:
                    items.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            if self._group(items):
                if items[-1] is _STOP:
                    self._retry()
                    self._seal()
                    return
                continue
            for item in items:
                if self._handle(item):
                    return

    def _handle(self, item: _Write) -> bool:
        """One queued item on its own (its own transaction); True when it is the writer's stop."""
        if item.defer and not item.acknowledged:
            self._defer(item)
            return False
        self._commit_deferred()  # everything queued before, in order, first
        if item is _STOP:
            self._retry()
            self._seal()
            return True
        if item.run is None:  # a flush
            self._retry()
            self._settle(item.done)
        elif item.acknowledged:
            self._retry()
            self._run_acknowledged(item)
        else:
            self._now(item)
        return False

    def _group(self, items: list[_Write], *, due: bool = False) -> bool:
        """Commit the writes of ``items`` (queued together, in order) in one transaction, with the
        held writes that go before them (all of them when ``due``), then tell each who waits, in
        order: what ``_handle`` does item by item, with one commit (one sync of the log) for all.

        Returns False, having changed nothing, when there is no group to make (fewer than two
        writes, one that makes its own transaction, anything kept from the disk) or when a write
        of the group failed (rolled back: each is then tried on its own, as it would have been).
        A commit the disk refused is a refusal of every write of the group, each handled as
        ``_handle`` handles its own refused commit."""
        if self._kept or self._reopen_needed:
            return False
        deferred = OrderedDict(self._deferred)
        since = self._deferred_since
        plan: list[tuple[_Write, bool]] = []  # (a write or a flush, held): in the order of commit
        if due:
            plan += [(w, True) for w in deferred.values()]
            deferred.clear()
        for item in items:
            if item.defer and not item.acknowledged:
                if not deferred:
                    since = time.monotonic()
                _hold(deferred, item)
                continue
            plan += [(w, True) for w in deferred.values()]
            deferred.clear()
            if item is not _STOP:
                plan.append((item, False))
        writes = [w for w, _ in plan if w.run is not None]
        if len(writes) < 2 or any(w.alone or _refused_before(w) is not None for w in writes):
            return False
        with self._lock:
            con = self._con
            try:
                con.execute("BEGIN TRANSACTION")
            except Exception:  # noqa: BLE001 - each on its own says what is wrong
                return False
            self._in_group = True
            before = dict(self._counts), self._unsealed
            try:
                self._run_together(writes)
                if self._unsealed:
                    self._counts_now()  # in the same transaction: no commit of its own
            except BaseException:  # noqa: BLE001 - rolled back: each is tried on its own
                self._counts, self._unsealed = before
                self._in_group = False
                try:
                    con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001
                    self._reopen_needed = True
                return False
            self._in_group = False
            try:
                con.execute("COMMIT")
                failure: BaseException | None = None
            except BaseException as exc:  # noqa: BLE001
                failure = exc
                self._counts, self._unsealed = before
                if needs_reopen(exc):
                    self._reopen_needed = True
        if failure is not None and storage_error(failure, "") is None and damage_error(failure, self.path) is None:
            if not self._reopen_needed:
                try:
                    with self._lock:
                        con.execute("ROLLBACK")
                except Exception:  # noqa: BLE001 - the failed commit ended the transaction
                    pass
                return False  # not the disk: each on its own says what it is
        self._deferred, self._deferred_since = deferred, since
        if failure is None:
            self._uncounted = False
            self._seal()
        for write, _held in plan:
            if write.run is None:
                self._settle(write.done)
            elif failure is None:
                if write.acknowledged:
                    assert write.done is not None
                    write.done.set_result(None)
            elif write.acknowledged:
                self._refused_acknowledged(write, failure)
            else:
                self._refused(write, failure)
        return True

    def _run_together(self, writes: list[_Write]) -> None:
        """Run a group's writes, in its open transaction, and count them: the rows of one table (same
        columns, same mode, each row once) as one statement (``_statements``). Raises what a write raises
        (the group is then rolled back and each tried alone)."""
        for run in _statements(writes):
            first = run[0]
            if len(run) == 1 or (first.row is not None and first.row.mode == "upsert"
                                 and len(run) < UPDATE_ROWS_MIN):
                for write in run:
                    assert write.run is not None
                    self._tally(write, self._run(write.run))
            else:
                batch = [w.row for w in run]
                self._run(lambda: self._rows_now(batch))  # type: ignore[arg-type]  # each has its row
                for write in run:
                    self._tally(write)

    def _rows_now(self, rows: list[_Row]) -> None:
        """Write rows of one table (same columns, same mode, distinct keys) together: an upsert's with one
        ``UPDATE … FROM (VALUES …)``, then the rows it did not find with one ``INSERT`` (the row updated,
        else inserted: what ``_upsert_now`` does); a new row's with the ``INSERT`` alone (a row already
        there fails the statement)."""
        first = rows[0]
        keys, columns = first.keys, first.columns
        if first.mode == "upsert":
            names = [f"k{i}" for i in range(len(keys))] + [f"c{i}" for i in range(len(columns))]
            marks = "(" + ", ".join("?" for _ in names) + ")"
            sql = (f"UPDATE {first.table} AS t SET " + ", ".join(f"{c} = v.c{i}" for i, c in enumerate(columns))
                   + f" FROM (VALUES {', '.join([marks] * len(rows))}) AS v({', '.join(names)}) WHERE "
                   + " AND ".join(f"t.{k} = v.k{i}" for i, k in enumerate(keys))
                   + " RETURNING " + ", ".join(f"t.{k}" for k in keys))
            with self._lock:
                found = {tuple(r) for r in self._con.execute(sql, [v for row in rows for v in row.values]).fetchall()}
            rows = [row for row in rows if tuple(row.values[:len(keys)]) not in found]
            if not rows:
                return
        names = [*keys, *columns]
        marks = "(" + ", ".join("?" for _ in names) + ")"
        with self._lock:
            self._con.execute(f"INSERT INTO {first.table} ({', '.join(names)}) VALUES {', '.join([marks] * len(rows))}",
                              [value for row in rows for value in row.values])

    def _defer(self, item: _Write) -> None:
        """Hold a write nobody waits for until ``DEFER_SECS`` after the oldest held one (see the
        module); a whole snapshot of a row replaces what is held for that row, in its place."""
        if not self._deferred:
            self._deferred_since = time.monotonic()
        _hold(self._deferred, item)

    def _commit_deferred(self) -> None:
        """Commit the held writes, in order (behind what the disk refused, if anything is kept)."""
        if self._group([], due=True):
            return
        while self._deferred:
            self._now(self._deferred.popitem(last=False)[1])

    def _now(self, item: _Write) -> None:
        """A write nobody waits for, now: behind what the disk refused (in order, tried with it), else tried."""
        if self._kept:
            self._keep(item)
        else:
            self._attempt(item)

    def _attempt(self, item: _Write) -> None:
        try:
            assert item.run is not None
            changed = self._run(item.run)
        except BaseException as exc:
            self._refused(item, exc)
            return
        self._tally(item, changed)  # nobody waits: its counts are committed when the writer falls idle
        self._uncounted = self._uncounted or self._unsealed

    def _refused(self, item: _Write, exc: BaseException) -> None:
        """A write nobody waits for failed: kept when the disk refused it, else reported once."""
        damaged = damage_error(exc, self.path)
        exc = damaged if damaged is not None else exc
        error = storage_error(exc, f"{self.path.name} could not record a change")
        if error is None:  # kept for the next read or flush: never lost
            if self._error is None:
                self._error = exc
        else:
            self._kept_error = error
            self._keep(item)

    def _run_acknowledged(self, item: _Write) -> None:
        """Try once: the caller is told either way and nothing of a refused write is kept. A write whose
        ``after`` was refused is refused with its error, not tried."""
        assert item.done is not None and item.run is not None
        before = _refused_before(item)
        if before is not None:
            item.done.set_exception(before)
            return
        try:
            self._run_counted(item)
        except BaseException as exc:
            self._refused_acknowledged(item, exc)
            return
        if item.whole and item.key is not None:
            self._kept.pop(item.key, None)  # an older snapshot of the row must not overwrite this one
        self._seal()
        item.done.set_result(None)

    def _refused_acknowledged(self, item: _Write, exc: BaseException) -> None:
        """An acknowledged write failed: its caller is told, and nothing of it is kept."""
        assert item.done is not None
        damaged = damage_error(exc, self.path)
        exc = damaged if damaged is not None else exc
        what = (f"the {item.key[0].rstrip('s')} {' '.join(map(str, item.key[1:]))}"
                if isinstance(item.key, tuple) else "it")
        error = storage_error(exc, f"{self.path.name} could not record {what}")
        if needs_reopen(exc) and item.undo is not None:
            # DuckDB may have committed it after all (the WAL took it, the checkpoint did
            # not): remove it, retried like any kept write, so a refused row never appears.
            self._kept_error = error
            self._keep(_Write(item.undo, item.key))
        item.done.set_exception(error or exc)

    def _keep(self, item: _Write) -> None:
        _hold(self._kept, item)

    def _retry(self) -> None:
        """Try the kept writes again in order; stop at the first the disk still refuses."""
        if self._reopen_needed and not self._kept:  # invalidated with nothing kept: readers need it open
            try:
                self._reopen()
            except Exception:  # noqa: BLE001 - tried again at the next flush; readers are told meanwhile
                pass
        while self._kept:
            key, kept = next(iter(self._kept.items()))
            assert kept.run is not None
            try:
                changed = self._run(kept.run)
            except BaseException as exc:
                error = storage_error(exc, f"{self.path.name} could not record {len(self._kept)} change(s) "
                                           "(kept and tried again until the disk takes them)")
                if error is None:  # not the disk: reported once, like any failed write
                    self._kept.pop(key)
                    if self._error is None:
                        self._error = exc
                    continue
                self._kept_error = error
                return
            self._kept.pop(key)
            self._tally(kept, changed)
            self._uncounted = self._uncounted or self._unsealed
        self._kept_error = None

    def _run(self, run: Callable[[], Any]) -> Any:
        """Run a write (its result: ``False`` when it changed nothing worth claiming)."""
        if self._reopen_needed:
            self._reopen()
        fault_point(self.path.name)
        try:
            return run()
        except BaseException as exc:
            if needs_reopen(exc):
                self._reopen_needed = True
            damaged = damage_error(exc, self.path)  # a block that does not read: named, never a traceback
            if damaged is not None:
                raise damaged from None
            raise

    def _reopen(self) -> None:
        """Open ``runtime.db`` again after DuckDB invalidated it (a checkpoint the disk refused)."""
        import duckdb

        with self._lock:
            try:
                self._con.close()
            except Exception:  # noqa: BLE001
                pass
            self._con = duckdb.connect(str(self.path))
            self._con.execute("SET threads = 1")
            limit_memory(self._con)
            self._reopen_needed = False

    def _settle(self, done: Future[None] | None) -> None:
        if done is None:
            return
        if self._kept:  # every flush is told while anything is kept
            assert self._kept_error is not None
            done.set_exception(type(self._kept_error)(self._kept_error.message))
            return
        error, self._error = self._error, None
        if error is not None:  # reported once, to the first who waits
            done.set_exception(error)
        else:
            self._seal()
            done.set_result(None)

    def _write(self, write: Callable[[], None], key: Hashable | None = None, *, whole: bool = True,
               acknowledged: bool = False, undo: Callable[[], None] | None = None,
               defer: bool = False, alone: bool = False, row: _Row | None = None,
               after: Future[None] | None = None) -> Future[None] | None:
        done: Future[None] | None = Future() if acknowledged else None
        with self._submit_lock:
            if self._closed:
                from apollia_nb.errors import Conflict

                raise Conflict(f"{self.path} is closed")
            self._writes.put(_Write(write, key, whole, done, acknowledged, undo, defer, alone, row,
                                    after if acknowledged else None))
        return done

    def _flush_future(self) -> Future[None]:
        done: Future[None] = Future()
        with self._submit_lock:
            if self._closed:
                done.set_result(None)  # close() committed everything
            else:
                self._writes.put(_Write(None, done=done))
        return done

    def flush(self) -> None:
        """Wait until every write queued so far is committed (raises a failed write's error)."""
        if threading.current_thread() is self._writer:
            return
        self._flush_future().result()

    async def flush_async(self) -> None:
        """``flush`` for the event loop: waits without blocking it."""
        await asyncio.wrap_future(self._flush_future())

    def _exec(self, sql: str, params: list[Any] | tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        self.flush()  # a read sees every write queued before it
        with self._lock:
            if self._reopen_needed:
                raise StorageError(f"{self.path.name} could not be opened again after a failed write; "
                                   "the writer tries again at its next write")
            try:
                cur = self._con.execute(sql, params)
            except Exception as exc:
                damaged = damage_error(exc, self.path)  # a block that does not read: named, never a traceback
                if damaged is not None:
                    raise damaged from None
                raise
            try:
                return cur.fetchall()
            except Exception as exc:  # statements without a result set
                damaged = damage_error(exc, self.path)
                if damaged is not None:
                    raise damaged from None
                return []

    def _upsert(self, table: str, keys: dict[str, Any], values: dict[str, Any], *,
                acknowledged: bool = False, new_row: bool = False, insert: bool = False,
                defer: bool = False, after: Future[None] | None = None) -> Future[None] | None:
        """Queue: update the row with these keys, or insert it (one transaction).

        An ``UPDATE`` costs about a quarter of DuckDB's ``INSERT OR REPLACE``
        (measured 0.5 ms against 1.7-2.2 ms), and rows are mostly rewritten.
        ``new_row``: nothing had these keys, so a refused acknowledged write is undone by a delete, and the
        row is inserted first (an ``UPDATE`` finds its row by reading the table, so one that finds nothing
        costs more as the table grows); should a row with these keys be there after all, it is updated.
        ``insert``: only insert (half the cost of a missed ``UPDATE`` and an ``INSERT``); a row
        with these keys already there is ``CONFLICT`` and stays as it was. ``defer``: a state
        snapshot that may wait ``DEFER_SECS`` (see the module). ``after``: the future of an acknowledged write
        queued before this one (acknowledged too) that must not be refused without it: when it was, this
        one is refused with its error and not written; in one group with it, both commit or neither.
        """
        def undo() -> None:
            with self._lock:
                self._con.execute(f"DELETE FROM {table} WHERE {' AND '.join(f'{c} = ?' for c in keys)}",
                                  list(keys.values()))

        row = _Row(table, tuple(keys), tuple(values), (*keys.values(), *values.values()),
                   "insert" if insert or new_row else "upsert")
        return self._write(lambda: self._upsert_now(table, keys, values, insert=insert, new_row=new_row),
                           (table, *keys.values()),
                           acknowledged=acknowledged, undo=undo if new_row else None, defer=defer, row=row,
                           after=after)

    def _upsert_now(self, table: str, keys: dict[str, Any], values: dict[str, Any], *, insert: bool = False,
                    new_row: bool = False) -> None:
        import duckdb

        sets = ", ".join(f"{c} = ?" for c in values)
        where = " AND ".join(f"{c} = ?" for c in keys)
        columns = [*keys, *values]
        # Each statement is its own transaction (DuckDB's autocommit): an explicit BEGIN and COMMIT
        # cost a quarter of a millisecond more, and with one writer thread an UPDATE that found
        # nothing followed by the INSERT is what one transaction would do (a crash between them
        # leaves nothing, as one before them would).
        with self._lock:
            con = self._con
            try:
                count = 0
                if new_row and not insert:
                    try:
                        con.execute(f"INSERT INTO {table} ({', '.join(columns)}) "
                                    f"VALUES ({', '.join('?' for _ in columns)})", [*keys.values(), *values.values()])
                        return
                    except duckdb.ConstraintException:
                        if self._in_group:
                            raise  # in a transaction (a group): it is aborted, the group tries each on its own
                if not insert:
                    (count,) = con.execute(f"UPDATE {table} SET {sets} WHERE {where}",  # type: ignore[misc]  # an UPDATE returns its count
                                           [*values.values(), *keys.values()]).fetchone()
                if not count:
                    con.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                                [*keys.values(), *values.values()])
            except BaseException as exc:
                if insert and isinstance(exc, duckdb.ConstraintException):
                    from apollia_nb.errors import Conflict

                    what = " ".join(map(str, keys.values()))
                    raise Conflict(f"{table.rstrip('s')} {what} exists already") from None
                raise

    # the home's facts ---------------------------------------------------
    def home_facts(self) -> str | None:
        """The facts the home record was last read from (``journal.accounting.HomeFacts``, as JSON)."""
        rows = self._exec("SELECT facts FROM home_facts WHERE id = 1")
        return str(rows[0][0]) if rows else None

    def keep_home_facts(self, facts: str) -> None:
        """Queue the facts for the next open (a cache of the journal's entries: losing it costs a scan)."""
        self._upsert("home_facts", {"id": 1}, {"facts": facts})

    # the journal's mark (runtime/acknowledged.py) -----------------------------
    def journal_mark(self) -> tuple[int, str] | None:
        """``(seq, hash hex)`` of the journal entry up to which every submitted task was found here
        (kept beside the home's facts, row 2); None when none is kept or it does not read."""
        rows = self._exec("SELECT facts FROM home_facts WHERE id = 2")
        try:
            mark = json.loads(rows[0][0]) if rows else None
            return (int(mark["seq"]), str(mark["hash"])) if mark is not None else None
        except (ValueError, TypeError, KeyError):
            return None  # read from the start of the journal: a mark is a shortcut, never a record

    def keep_journal_mark(self, seq: int, digest: str) -> None:
        """Queue the mark (written after the rows it vouches for, so a lost log loses it with them)."""
        self._upsert("home_facts", {"id": 2}, {"facts": json.dumps({"seq": seq, "hash": digest})})

    def missing_tasks(self, task_ids: list[str]) -> set[str]:
        """Those of ``task_ids`` that have no row."""
        if not task_ids:
            return set()
        rows = self._exec("SELECT id FROM tasks WHERE list_contains(?, id)", [task_ids])
        return set(task_ids) - {r[0] for r in rows}

    # agents -------------------------------------------------------------
    def save_agent(self, name: str, manifest: str, state: str, warnings: list[str], at: str, *,
                   acknowledged: bool = False, workspace: str | None = None) -> Future[None] | None:
        """Queue the agent's row; ``acknowledged``: returns the future of its commit (see the module).
        ``workspace``: the folder resolved when it was registered (a restart keeps it)."""
        values = {"manifest": manifest, "state": state, "warnings": json.dumps(warnings), "workspace": workspace}

        def write() -> bool:
            with self._lock:
                row = self._con.execute("SELECT manifest, state, warnings, workspace FROM agents WHERE name = ?",
                                        [name]).fetchone()
                if row is not None and tuple(row) == tuple(values.values()):
                    return False  # as it is (a start registering its agents again): nothing to claim
                self._upsert_now("agents", {"name": name}, {**values, "registered_at": at})
                return True

        return self._write(write, ("agents", name), acknowledged=acknowledged)  # type: ignore[arg-type]  # what it returns is not read

    def set_agent_state(self, name: str, state: str) -> None:
        def write() -> None:
            with self._lock:
                self._con.execute("UPDATE agents SET state = ? WHERE name = ?", [state, name])

        self._write(write, ("agents", name), whole=False)

    def agents(self) -> list[dict[str, Any]]:
        rows = self._exec("SELECT name, manifest, state, warnings, registered_at, workspace FROM agents ORDER BY name")
        return [
            {"name": r[0], "manifest": r[1], "state": r[2], "warnings": json.loads(r[3]), "registered_at": r[4],
             "workspace": r[5]}
            for r in rows
        ]

    # tasks --------------------------------------------------------------
    def save_task(self, record: dict[str, Any], at: str, *, acknowledged: bool = False,
                  after: Future[None] | None = None) -> Future[None] | None:
        """Queue the task's row; ``acknowledged``: returns the future of its commit (see the module).
        ``after``: an acknowledged write queued before it (a REST request's key taken) without which the row
        is refused (see ``_upsert``)."""
        # Acknowledged: a task being submitted, whose row is new (a row with its id is a conflict).
        return self._upsert("tasks", {"id": record["id"]},
                            {"agent": record["agent"], "status": record["status"],
                             "record": json.dumps(record, default=str), "updated_at": at},
                            acknowledged=acknowledged, new_row=acknowledged, insert=acknowledged,
                            defer=not acknowledged, after=after)

    def tasks(self, status: str | None = None, *, unfinished: bool = False) -> list[dict[str, Any]]:
        """Task records, oldest update first; ``unfinished``: only those not completed, failed or
        cancelled (what a restart restores, read without the records of every finished task)."""
        if unfinished:
            rows = self._exec("SELECT record FROM tasks WHERE status NOT IN ('completed', 'failed', 'cancelled') "
                              "ORDER BY updated_at")
        elif status is None:
            rows = self._exec("SELECT record FROM tasks ORDER BY updated_at")
        else:
            rows = self._exec("SELECT record FROM tasks WHERE status = ? ORDER BY updated_at", [status])
        return [json.loads(r[0]) for r in rows]

    def task(self, task_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT record FROM tasks WHERE id = ?", [task_id])
        return json.loads(rows[0][0]) if rows else None

    # sessions -----------------------------------------------------------
    def save_session(self, record: dict[str, Any], at: str) -> None:
        self._upsert("sessions", {"id": record["id"]},
                     {"agent": record["agent"], "state": record["state"], "parent_id": record.get("parent_id"),
                      "record": json.dumps(record, default=str), "updated_at": at}, defer=True)

    def sessions(self) -> list[dict[str, Any]]:
        return [json.loads(r[0]) for r in self._exec("SELECT record FROM sessions ORDER BY updated_at")]

    # memory ---------------------------------------------------------------
    # (A run's place in a scripted model's script is kept in its task or session record;
    # the model_state table of earlier homes is no longer read.)
    def memory_get(self, agent: str) -> dict[str, Any]:
        rows = self._exec("SELECT key, value FROM memory WHERE agent = ?", [agent])
        return {k: json.loads(v) for k, v in rows}

    def memory_set(self, agent: str, key: str, value: Any, *, acknowledged: bool = False) -> Future[None] | None:
        """Queue the value; ``acknowledged``: returns the future of its commit (see the module)."""
        return self._upsert("memory", {"agent": agent, "key": key}, {"value": json.dumps(value, default=str)},
                            acknowledged=acknowledged)

    # the REST API's idempotency keys ----------------------------------------
    def remember_response(self, scope: str, key: str, fingerprint: str, status: int,
                          response: dict[str, Any], at: float, *, new_row: bool = False) -> Future[None]:
        """Queue the row of ``key`` (acknowledged: returns the future of its commit, see the module).

        ``new_row``: the key is being taken, so a refused write leaves no row."""
        done = self._upsert("idempotency", {"scope": scope, "key": key},
                            {"fingerprint": fingerprint, "status": status, "response": json.dumps(response),
                             "created_at": at}, acknowledged=True, new_row=new_row)
        assert done is not None
        return done

    def remembered_keys(self) -> list[tuple[str, str, str, int, float]]:
        """``(scope, key, fingerprint, status, created_at)`` of every remembered response, oldest first."""
        rows = self._exec("SELECT scope, key, fingerprint, status, created_at FROM idempotency "
                          "ORDER BY created_at, key")
        return [(r[0], r[1], r[2], int(r[3]), float(r[4])) for r in rows]

    def remembered_response(self, scope: str, key: str) -> tuple[int, dict[str, Any]] | None:
        rows = self._exec("SELECT status, response FROM idempotency WHERE scope = ? AND key = ?", [scope, key])
        return (int(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def forget_responses(self, keys: list[tuple[str, str]]) -> None:
        """Queue: forget the responses of these ``(scope, key)`` pairs."""
        if not keys:
            return

        def write() -> bool:
            with self._lock:
                self._con.executemany("DELETE FROM idempotency WHERE scope = ? AND key = ?", keys)
            return False  # a forgotten key coming back with a lost log is a request answered once more

        self._write(write)  # type: ignore[arg-type]  # what it returns is not read

    # batches (runtime/batch.py) -------------------------------------------
    def save_batch(self, record: dict[str, Any], items: list[dict[str, Any]], at: str) -> Future[None]:
        """Queue the batch and all its items in one transaction (acknowledged: returns the future
        of its commit; a refused write leaves neither)."""
        rows = [[record["id"], i["index"], i["task_id"], json.dumps(i["key"], default=str),
                 json.dumps(i["item"], default=str), i["goal"], None] for i in items]

        def write() -> None:
            with self._lock:
                con = self._con
                con.begin()
                try:
                    con.execute("INSERT INTO batches (id, agent, status, record, updated_at) VALUES (?, ?, ?, ?, ?)",
                                [record["id"], record["agent"], record["status"], json.dumps(record), at])
                    if rows:
                        con.executemany("INSERT INTO batch_items VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                    con.commit()
                except BaseException:
                    try:
                        con.rollback()
                    except Exception:  # noqa: BLE001 - a failed commit already ended the transaction
                        pass
                    raise

        def undo() -> None:
            with self._lock:
                self._con.execute("DELETE FROM batch_items WHERE batch_id = ?", [record["id"]])
                self._con.execute("DELETE FROM batches WHERE id = ?", [record["id"]])

        done = self._write(write, ("batches", record["id"]), acknowledged=True, undo=undo, alone=True)
        assert done is not None
        return done

    def set_batch(self, record: dict[str, Any], at: str, *, acknowledged: bool = False) -> Future[None] | None:
        """Queue the batch's row as it is now (its items are not rewritten)."""
        return self._upsert("batches", {"id": record["id"]},
                            {"agent": record["agent"], "status": record["status"], "record": json.dumps(record),
                             "updated_at": at}, acknowledged=acknowledged)

    def set_batch_item_error(self, batch_id: str, index: int, error: dict[str, str] | None) -> None:
        def write() -> None:
            with self._lock:
                self._con.execute("UPDATE batch_items SET error = ? WHERE batch_id = ? AND idx = ?",
                                  [json.dumps(error) if error else None, batch_id, index])

        self._write(write, ("batch_items", batch_id, index), whole=False)

    def batches(self) -> list[dict[str, Any]]:
        return [json.loads(r[0]) for r in self._exec("SELECT record FROM batches ORDER BY updated_at, id")]

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        rows = self._exec("SELECT record FROM batches WHERE id = ?", [batch_id])
        return json.loads(rows[0][0]) if rows else None

    def batch_items(self, batch_id: str) -> list[dict[str, Any]]:
        rows = self._exec("SELECT idx, task_id, key, item, goal, error FROM batch_items WHERE batch_id = ? "
                          "ORDER BY idx", [batch_id])
        return [{"index": r[0], "task_id": r[1], "key": json.loads(r[2]), "item": json.loads(r[3]), "goal": r[4],
                 "error": json.loads(r[5]) if r[5] else None} for r in rows]

    def task_ids(self) -> set[str]:
        """The id of every task recorded."""
        return {r[0] for r in self._exec("SELECT id FROM tasks")}


def open_records(home: Any) -> RuntimeRecords:
    """``RuntimeRecords`` on ``home.runtime_db``, every block of it read once (``home.check_whole``): a
    file DuckDB cannot open or read whole is ``HOME_FILE_CORRUPT`` (named, with the command that
    recovers), never a traceback, and nothing was changed."""
    import duckdb

    try:
        records = RuntimeRecords(home.runtime_db)
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged_file(home.runtime_db, f"it cannot be opened: {first}", home=home.path) from None
    try:
        with records._lock:
            check_whole(records._con, home.runtime_db)
        lost = {table: n for table, n in records.lost_changes().items() if table not in REBUILT_FROM_JOURNAL}
        if lost:
            raise rolled_back(home, lost)
    except BaseException:
        records.close()
        raise
    return records


#: Tables whose acknowledged rows a start rebuilds from the journal when ``runtime.db`` lost them
#: (``runtime/acknowledged.py``); a loss of any other is refused at the open.
REBUILT_FROM_JOURNAL = frozenset({"tasks"})
_WHAT = {"agents": "agent registrations or states", "sessions": "chat sessions", "memory": "agents' memory",
         "idempotency": "Idempotency-Key answers", "batches": "batches", "batch_items": "batch items"}


def rolled_back(home: Any, lost: dict[str, int]) -> HomeFileRolledBack:
    """``HOME_FILE_ROLLED_BACK``: what ``runtime.db`` acknowledged and no longer holds, and the way on."""
    what = ", ".join(f"{n} change(s) to {_WHAT.get(t, t)}" for t, n in sorted(lost.items()))
    path = home.runtime_db
    return HomeFileRolledBack(
        f"{path} holds less than it acknowledged: {what} committed and acknowledged are not in it (its "
        f"write-ahead log {path.name}.wal was lost or cut after they were made); nothing was changed. Restore "
        f"{path.name} together with {path.name}.wal from a backup taken with both, or start it anew on purpose "
        f"with `apollia-os home repair --new-runtime-db --home {home.path}` (registered agents, tasks and "
        "sessions are lost; the file is moved aside, journaled)")
