"""Opening a journal: its schema, migrations, and recovery of what a previous owner left.

``store.Journal.open`` connects to ``journal.db`` (``connect_journal``: a file DuckDB cannot
open is ``HOME_FILE_CORRUPT``), creates the schema and views (``prepare``), reads the head and
Merkle frontier stored with the entries (``load``, a constant amount of work) and migrates a
journal written before the frontier or the ``calls`` table was kept. Then it takes what the
previous owner committed to ``journal.log`` and had not copied yet (``examine_tail``): entries
``journal.db`` already holds must be the very same; the others must continue the chain, hash
to their stored hash and carry this journal's signature; a log whose end was cut, or a stored
checkpoint larger than what the journal holds, says acknowledged entries are gone
(``truncation_problems``: ``JOURNAL_TRUNCATED``), and ``apollia-os home repair --lost-entries``
records that loss (``loss_rows``: signed ``entry_lost`` entries and a ``home_repaired`` one).
Offline readers of a journal nobody holds (``audit verify``, ``audit export``,
``home repair --lost-entries`` without ``--yes``) read the same log without writing anything
(``read_with_tail``, ``examine_loss``).

Everything here reads, checks and computes; the writes a recovery makes (the rows taken from
the log, the record of a loss) are made by the journal's copy path (``store.Journal._insert``),
so they are stored as every copy is: in pieces, each with its frontier.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from apollia_nb.dbutil import connect_locked
from apollia_nb.errors import (
    BadInput,
    HomeFileCorrupt,
    HomeLocked,
    IntegrityError,
    JournalTruncated,
)
from apollia_nb.home import Home, damaged_file
from apollia_nb.journal import keys as _keys
from apollia_nb.journal.entry import GENESIS_HASH, Entry, canonical_payload, entry_hash, format_ts
from apollia_nb.journal.merkle import MerkleAccumulator, leaf_hash
from apollia_nb.journal.tail import TailRead, read_tail, tail_path
from apollia_nb.journal.views import CALLS_DDL, ENTRY_FIELDS_DDL, copy_entry_fields, create_views, rebuild_calls

__all__ = [
    "FORMAT_VERSION",
    "COLUMNS",
    "SCHEMA",
    "SEQ_RANGE",
    "COMPARE_RANGE",
    "ENTRY_LOST",
    "LOSS_ACTION",
    "TailEntries",
    "Loaded",
    "TailRecovery",
    "connect_journal",
    "prepare",
    "journal_format",
    "FORMATS",
    "FORMAT_WHOLE_PAYLOAD",
    "load",
    "migrate",
    "migrate_calls",
    "store_frontier",
    "examine_tail",
    "loss_rows",
    "entries_with_tail",
    "read_with_tail",
    "examine_loss",
    "is_loss_record",
    "truncation_problems",
    "stored_rows",
]

#: The entry format of a journal made now: its entries commit to salted payload fields
#: (``entry.seal_payload``), so a field can be erased and the chain still verifies.
FORMAT_VERSION = "2"
#: The format of journals made before: each entry hashes its payload whole. They keep it.
FORMAT_WHOLE_PAYLOAD = "1"
FORMATS = (FORMAT_WHOLE_PAYLOAD, FORMAT_VERSION)
COLUMNS = "seq, ts, run_id, agent, kind, payload, prev_hash, hash, signature, key_id"

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (
        key VARCHAR PRIMARY KEY,
        value VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS entries (
        seq BIGINT PRIMARY KEY,
        ts VARCHAR NOT NULL,
        run_id VARCHAR,
        agent VARCHAR,
        kind VARCHAR NOT NULL,
        payload BLOB NOT NULL,
        prev_hash BLOB NOT NULL,
        hash BLOB NOT NULL,
        signature BLOB NOT NULL,
        key_id VARCHAR NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        size BIGINT PRIMARY KEY,
        root BLOB NOT NULL,
        note VARCHAR NOT NULL,
        created_at VARCHAR NOT NULL)""",
    # Witness cosignatures of stored checkpoints (journal/witness.py): the note signature
    # line a witness returned, by checkpoint size and the witness's verifier key.
    """CREATE TABLE IF NOT EXISTS checkpoint_cosignatures (
        size BIGINT NOT NULL,
        witness VARCHAR NOT NULL,
        timestamp BIGINT NOT NULL,
        signature VARCHAR NOT NULL,
        created_at VARCHAR NOT NULL,
        PRIMARY KEY (size, witness))""",
    """CREATE TABLE IF NOT EXISTS frontier (
        id INTEGER PRIMARY KEY,
        size BIGINT NOT NULL,
        last_hash BLOB NOT NULL,
        root BLOB NOT NULL,
        hashes BLOB NOT NULL)""",
    ENTRY_FIELDS_DDL,
    CALLS_DDL,
)

#: Rows per range when journal.db is read in seq order (a sort of this many rows stays small).
SEQ_RANGE = 65_536
#: Seqs of stored entries read back at a time to compare them with the log's.
COMPARE_RANGE = 2048

#: The kinds a repair of lost entries writes (``Journal.open(record_loss=...)``): one ``entry_lost`` per seq
#: known to be lost, then the ``home_repaired`` entry with ``action`` ``record_lost_entries``.
ENTRY_LOST = "entry_lost"
LOSS_ACTION = "record_lost_entries"


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------------- opening and migrating
def connect_journal(home: Home) -> duckdb.DuckDBPyConnection:
    """``connect_locked`` on ``journal.db``; a file DuckDB cannot open is ``HOME_FILE_CORRUPT``
    (``home.damaged_file``: the file and its repair)."""
    path = home.journal_db
    try:
        return connect_locked(path)
    except HomeLocked:
        raise
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged_file(path, f"it cannot be opened: {first}", home=home.path) from None


def prepare(con: duckdb.DuckDBPyConnection, new_format: str = FORMAT_VERSION) -> str:
    """Create the schema and views if missing; return the log's origin. A journal made now
    takes ``new_format`` (``FORMATS``); one made before keeps the format it has."""
    if new_format not in FORMATS:
        raise BadInput(f"journal format {new_format!r} is not one of {', '.join(FORMATS)}")
    con.begin()
    try:
        for ddl in SCHEMA:
            con.execute(ddl)
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if "format" not in meta:
            origin = f"apollia-nb/{os.urandom(8).hex()}"
            con.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("format", new_format), ("origin", origin), ("created_at", format_ts(_utcnow()))],
            )
            meta = {"format": new_format, "origin": origin}
        if meta["format"] not in FORMATS:
            raise IntegrityError(f"journal format {meta['format']!r} is not supported "
                                 f"(this version reads {' and '.join(FORMATS)})")
        create_views(con)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return meta["origin"]


def journal_format(con: duckdb.DuckDBPyConnection) -> str:
    """The journal's entry format (``meta.format``, one of ``FORMATS``)."""
    row = con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
    if row is None or row[0] not in FORMATS:
        raise IntegrityError(f"journal format {row[0] if row else None!r} is not supported")
    return str(row[0])


@dataclass
class Loaded:
    """What ``load`` read: how many entries ``journal.db`` holds, what is wrong with its stored
    frontier (or None), the head and Merkle frontier to go on from, and the newest checkpoint."""

    count: int
    problem: str | None
    acc: MerkleAccumulator
    head: tuple[int, bytes]
    latest: tuple[int, str] | None


def load(con: duckdb.DuckDBPyConnection, path: Path,
         rebuild: Callable[[duckdb.DuckDBPyConnection], None] = rebuild_calls) -> Loaded:
    """Read the head and Merkle frontier stored with the entries (a constant amount of work).

    When the stored frontier does not describe the entries, ``problem`` says what is wrong
    (raised by ``examine_tail`` once it has compared the log with the stored rows). A journal
    from before the frontier was kept is migrated once: its hashes are read in seq ranges, and
    the frontier and ``entry_fields`` stored; one from before ``calls`` was kept has it computed
    (``rebuild``: ``views.rebuild_calls``)."""
    [(count, max_seq)] = con.execute("SELECT count(*), coalesce(max(seq), 0) FROM entries").fetchall()
    row = con.execute("SELECT size, last_hash, root, hashes FROM frontier WHERE id = 1").fetchone()
    kept = con.execute("SELECT value FROM meta WHERE key = 'frontier'").fetchone()
    newest = con.execute("SELECT size, note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
    latest = (int(newest[0]), newest[1]) if newest else None

    def wrong(problem: str) -> Loaded:
        return Loaded(count, problem, MerkleAccumulator(), (0, GENESIS_HASH), latest)

    if row is None and kept is None:
        acc, last = migrate(con, path, count)
        return Loaded(count, None, acc, (count, last), latest)
    if row is None:
        return wrong("the stored head (the Merkle frontier) is missing")
    size, last_hash, root_, hashes = int(row[0]), bytes(row[1]), bytes(row[2]), bytes(row[3])
    if count != size or max_seq != size:
        return wrong(f"the stored head covers {size} entries, but it holds {count} "
                     f"(the highest seq is {max_seq})")
    try:
        acc = MerkleAccumulator.from_state(size, [hashes[i:i + 32] for i in range(0, len(hashes), 32)])
    except BadInput as exc:
        return wrong(f"the stored Merkle frontier is malformed ({exc.message})")
    if acc.root() != root_:
        return wrong("the stored Merkle frontier does not have the stored root")
    stored = con.execute("SELECT hash FROM entries WHERE seq = ?", [size]).fetchone() if size else None
    if (bytes(stored[0]) if stored else GENESIS_HASH) != last_hash:
        return wrong(f"the stored head hash is not the hash of entry {size}")
    if con.execute("SELECT value FROM meta WHERE key = 'calls'").fetchone() is None:
        migrate_calls(con, rebuild)
    return Loaded(count, None, acc, (size, last_hash), latest)


def migrate(con: duckdb.DuckDBPyConnection, path: Path, count: int) -> tuple[MerkleAccumulator, bytes]:
    """Compute and store the frontier and ``entry_fields`` of a journal that has none; returns the
    frontier and the last entry's hash."""
    acc = MerkleAccumulator()
    prev = GENESIS_HASH
    expected = 1
    while expected <= count:
        rows = con.execute("SELECT seq, hash FROM entries WHERE seq >= ? AND seq < ? ORDER BY seq",
                           [expected, expected + SEQ_RANGE]).fetchall()
        for seq, h in rows:
            if seq != expected:
                break
            prev = bytes(h)
            acc.append(leaf_hash(prev))
            expected += 1
        if len(rows) != SEQ_RANGE or expected <= count and rows[-1][0] != expected - 1:
            break
    if expected != count + 1:
        raise IntegrityError(
            f"{path} is not contiguous: entry {expected} is missing or duplicated; "
            "run `apollia-os audit verify`"
        )
    con.begin()
    try:
        con.execute("DELETE FROM entry_fields")
        copy_entry_fields(con)  # and calls
        store_frontier(con, acc, prev)
        con.execute("INSERT INTO meta VALUES ('frontier', '1')")
        con.execute("INSERT OR REPLACE INTO meta VALUES ('calls', '1')")
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return acc, prev


def migrate_calls(con: duckdb.DuckDBPyConnection,
                  rebuild: Callable[[duckdb.DuckDBPyConnection], None] = rebuild_calls) -> None:
    """Compute ``calls`` of a journal written before it was kept, from its ``entry_fields``."""
    con.begin()
    try:
        rebuild(con)
        con.execute("INSERT INTO meta VALUES ('calls', '1')")
        con.commit()
    except BaseException:
        con.rollback()
        raise


def store_frontier(con: duckdb.DuckDBPyConnection, acc: MerkleAccumulator, last_hash: bytes) -> None:
    """Write the head and frontier row (inside the caller's transaction)."""
    values = [acc.size, last_hash, acc.root(), b"".join(acc.hashes)]
    updated = con.execute("UPDATE frontier SET size = ?, last_hash = ?, root = ?, hashes = ? WHERE id = 1",
                          values).fetchone()
    if updated is None or updated[0] == 0:
        con.execute("INSERT INTO frontier VALUES (1, ?, ?, ?, ?)", values)


# ---------------------------------------------------------------------- the log a previous owner left
@dataclass
class TailRecovery:
    """What ``examine_tail`` found in ``journal.log``: the read, the entries to take (checked),
    the head they end at, and why more was acknowledged than the journal holds (``problems``)."""

    read: TailRead
    fresh: list[Entry]
    head: tuple[int, bytes]
    problems: list[str]


def examine_tail(con: duckdb.DuckDBPyConnection, path: Path, key: _keys.JournalKey, loaded: Loaded,
                 record_loss: dict[str, Any] | None) -> TailRecovery:
    """Check what a previous owner left in ``journal.log`` against ``journal.db``; change nothing.

    Entries already in ``journal.db`` (a crash between a copy and the log's
    truncation) must be the very same entries. The others must continue the
    chain, hash to their stored hash and carry this journal's signature.
    Anything else raises ``IntegrityError``; a stored frontier that does not describe the
    entries (``loaded.problem``) is ``HomeFileCorrupt``; a journal that acknowledged more than
    it holds is ``JournalTruncated`` unless ``record_loss`` asks to record the loss, and asking
    for that when nothing is lost is ``BadInput``.
    """
    log = tail_path(path)
    read = read_tail(log)
    count, problem = loaded.count, loaded.problem
    copied = [row for row in read.rows if row[0] <= count]
    stored = stored_rows(con, copied)
    for row in copied:
        if stored.get(row[0]) != Entry.from_row(row):
            raise IntegrityError(
                f"{log}: entry {row[0]} is not the entry {path.name} holds at that place; "
                "nothing was changed (run `apollia-os audit verify`)"
            )
    if problem is not None:
        raise HomeFileCorrupt(
            f"{path} is inconsistent: {problem}; nothing was changed. Run `apollia-os audit verify "
            f"--home {path.parent}`, then restore {path.name} from a backup, or archive it and "
            f"start a new chain with `apollia-os home repair --archive-journal --home {path.parent}`"
        )
    seq, prev = loaded.head
    verify_key = key.verify_key
    fresh: list[Entry] = []
    for row in read.rows:
        entry = Entry.from_row(row)
        if not fresh and entry.seq <= count:
            continue
        if entry.seq != seq + 1 or entry.prev_hash != prev:
            raise IntegrityError(
                f"{log}: entry {entry.seq} does not continue the journal (its head is {seq}); "
                "nothing was changed"
            )
        if entry.computed_hash() != entry.hash:
            raise IntegrityError(f"{log}: entry {entry.seq} does not hash to its stored hash; nothing was changed")
        try:
            if entry.key_id != key.key_id:
                raise ValueError(entry.key_id)
            verify_key.verify(entry.hash, entry.signature)
        except Exception as exc:
            raise IntegrityError(
                f"{log}: entry {entry.seq} is not signed by this journal's key; nothing was changed"
            ) from exc
        fresh.append(entry)
        seq, prev = entry.seq, entry.hash
    last = fresh[-1].as_row() if fresh else con.execute(
        f"SELECT {COLUMNS} FROM entries WHERE seq = ?", [seq]).fetchone()
    problems = truncation_problems(seq, last is not None and is_loss_record(last[4], last[5]), read,
                                   loaded.latest[0] if loaded.latest else None, log)
    if problems and record_loss is None:
        raise JournalTruncated(
            f"{path.parent}: the journal holds {seq} entries but acknowledged more: {'; '.join(problems)}. "
            "Nothing was changed and it takes no entry until this is settled (a seq is never given twice). "
            f"Restore the home from a backup, or see what is lost with `apollia-os home repair --lost-entries "
            f"--home {path.parent}` and record the loss with `--yes`"
        )
    if record_loss is not None and not problems:
        raise BadInput(f"the journal in {path.parent} holds every entry it acknowledged: nothing to repair")
    return TailRecovery(read, fresh, (seq, prev), problems)


def loss_rows(con: duckdb.DuckDBPyConnection, head: tuple[int, bytes], latest: tuple[int, str] | None,
              recovery: TailRecovery, extra: dict[str, Any], key: _keys.JournalKey,
              clock: Callable[[], datetime]) -> list[tuple[Any, ...]]:
    """The signed rows that record in ``journal.db`` that acknowledged entries are gone, without
    giving their seqs again (stored by the caller in one transaction, before the log starts over).

    Every seq known to be lost (up to the newest stored checkpoint, or the highest seq the cut
    record of the log still shows) gets a signed ``entry_lost`` entry naming the lost range, and
    a ``home_repaired`` entry (``action`` ``record_lost_entries``) follows them: what was kept,
    the range, whether ``journal.log`` was cut (what followed the cut, beyond the witnessed range,
    left no trace), the stored checkpoints that covered lost entries (they no longer verify;
    ``audit verify`` shows them as superseded by this record) and ``extra``. A crash before the
    transaction leaves everything as it was, after it the cut is accounted for."""
    read, problems = recovery.read, recovery.problems
    seq, prev = head
    lost_to = max(seq, latest[0] if latest else 0, read.cut_seen or 0)
    lost = [seq + 1, lost_to] if lost_to > seq else None
    superseded = [{"size": int(size), "root": bytes(root).hex()} for size, root in con.execute(
        "SELECT size, root FROM checkpoints WHERE size > ? ORDER BY size", [seq]).fetchall()]
    payload = {
        **extra, "file": "journal.log", "action": LOSS_ACTION, "problem": "; ".join(problems),
        "kept": seq, "lost": lost, "cut": bool(read.cut),
        "cut_after": (read.rows[-1][0] if read.rows else 0) if read.cut else None,
        "checkpoints": superseded,
    }
    items = [(ENTRY_LOST, canonical_payload({"lost": lost})) for _ in range(lost_to - seq)]
    items.append(("home_repaired", canonical_payload(payload)))
    ts = format_ts(clock())
    rows = []
    for kind, data in items:
        seq += 1
        h = entry_hash(seq, ts, None, None, kind, data, prev)
        rows.append(Entry(seq, ts, None, None, kind, data, prev, h, key.sign(h), key.key_id).as_row())
        prev = h
    return rows


# ---------------------------------------------------------------------- offline readers
class TailEntries(NamedTuple):
    """What an offline reader of a journal nobody holds sees (``read_with_tail``)."""

    #: the journal's entries as a SQL table expression (``entries``, or its union with the log's)
    expression: str
    #: the highest seq ``journal.db`` and ``journal.log`` hold together
    head: int
    #: what the log itself says of entries missing after ``head`` (``truncation_problems``: it was
    #: cut), or None; a stored checkpoint larger than ``head`` is for the verifier to report
    cut: str | None


def entries_with_tail(con: duckdb.DuckDBPyConnection, db_path: Path) -> str:
    """For a read-only connection to a journal nobody holds: its entries as a SQL table expression.

    Usually ``entries``. When the last owner died before copying its last
    commits from ``journal.log`` into ``journal.db``, those entries are put in a
    temporary table and the expression is the union of both, so offline readers
    (``audit verify``, ``audit export``) see every committed entry without
    writing anything. Raises ``IntegrityError`` when the log is damaged before
    its end, or holds a different entry where ``journal.db`` already has one.
    """
    return read_with_tail(con, db_path).expression


def read_with_tail(con: duckdb.DuckDBPyConnection, db_path: Path) -> TailEntries:
    """``entries_with_tail``, with the head it ends at and what says entries are missing after it.

    A log that holds nothing ``journal.db`` lacks (a crash after the last copy) adds nothing:
    the expression is ``entries``."""
    read = read_tail(tail_path(db_path))
    (max_seq,) = con.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchall()[0]
    copied = [row for row in read.rows if row[0] <= max_seq]
    stored = stored_rows(con, copied)
    for row in copied:
        if stored.get(row[0]) != Entry.from_row(row):
            raise IntegrityError(
                f"{tail_path(db_path)}: entry {row[0]} is not the entry {Path(db_path).name} holds at that place"
            )
    fresh = [row for row in read.rows if row[0] > max_seq]
    expression = "entries"
    if fresh:  # nothing to add when journal.db holds everything the log has
        con.execute(f"CREATE OR REPLACE TEMP TABLE tail_entries AS SELECT {COLUMNS} FROM main.entries LIMIT 0")
        con.executemany(f"INSERT INTO temp.tail_entries ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", fresh)
        expression = f"(SELECT {COLUMNS} FROM main.entries UNION ALL SELECT {COLUMNS} FROM temp.tail_entries)"
    if fresh:
        head, recorded = int(fresh[-1][0]), is_loss_record(fresh[-1][4], fresh[-1][5])
    else:
        last = con.execute("SELECT seq, kind, payload FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        head, recorded = (int(last[0]), is_loss_record(last[1], last[2])) if last else (0, False)
    problems = truncation_problems(head, recorded, read, None, tail_path(db_path))
    return TailEntries(expression, head, problems[0] if problems else None)


def examine_loss(db_path: Path) -> dict[str, Any]:
    """What a repair of lost entries would record, read from a ``journal.db`` nobody holds (read-only).

    ``kept``: the entries ``journal.db`` and ``journal.log`` hold together; ``problems``: why more
    were acknowledged (empty: nothing to repair); ``lost``: the seq range known lost (up to the
    newest stored checkpoint) or None; ``cut`` and ``cut_after``: whether the log was cut and after
    which entry; ``checkpoints``: the stored checkpoints that covered lost entries; ``open_runs``:
    runs with a ``run_open`` kept and no ``run_seal`` (their later entries may be among the lost)."""
    con = connect_locked(Path(db_path), read_only=True)
    try:
        tail = read_with_tail(con, Path(db_path))
        read = read_tail(tail_path(db_path))
        latest = con.execute("SELECT max(size) FROM checkpoints").fetchone()
        size = int(latest[0]) if latest and latest[0] is not None else None
        last = con.execute(f"SELECT kind, payload FROM {tail.expression} WHERE seq = ?", [tail.head]).fetchone()
        problems = truncation_problems(tail.head, last is not None and is_loss_record(last[0], last[1]), read,
                                       size, tail_path(db_path))
        checkpoints = [int(s) for (s,) in con.execute(
            "SELECT size FROM checkpoints WHERE size > ? ORDER BY size", [tail.head]).fetchall()]
        open_runs = [r for (r,) in con.execute(
            f"SELECT run_id FROM {tail.expression} WHERE kind = 'run_open' AND run_id IS NOT NULL "
            f"EXCEPT SELECT run_id FROM {tail.expression} WHERE kind = 'run_seal' ORDER BY 1").fetchall()]
        kept_runs = {r for (r,) in con.execute(
            f"SELECT DISTINCT run_id FROM {tail.expression} WHERE run_id IS NOT NULL").fetchall()}
    finally:
        con.close()
    lost_to = max([tail.head, *checkpoints, read.cut_seen or 0])
    return {"kept": tail.head, "problems": problems,
            "lost": [tail.head + 1, lost_to] if lost_to > tail.head else None,
            "cut": bool(read.cut), "cut_after": (read.rows[-1][0] if read.rows else 0) if read.cut else None,
            "cut_seen": read.cut_seen, "checkpoints": checkpoints, "open_runs": open_runs,
            "kept_runs": sorted(kept_runs)}


def is_loss_record(kind: str, payload: bytes) -> bool:
    """Whether an entry is the record of a repair of lost entries."""
    if kind != "home_repaired":
        return False
    try:
        return json.loads(bytes(payload)).get("action") == LOSS_ACTION
    except (ValueError, AttributeError):
        return False


def truncation_problems(head: int, head_is_loss: bool, read: TailRead, checkpoint_size: int | None,
                        log: Path) -> list[str]:
    """Why the journal acknowledged more than the ``head`` entries it holds (pure; empty when nothing says so).

    The durable witnesses: the newest stored checkpoint (signed once its entries were
    committed: it may be larger than ``journal.db`` but never than what was acknowledged),
    and ``journal.log`` itself (a log the end of the file cuts: its writer always leaves a zero
    after the last record, so records after the cut may be gone). A head that is a recorded
    loss (``home_repaired``, written in the same copy as its ``entry_lost`` entries) is a cut
    already accounted for: the repair starts the log over next."""
    problems = []
    if checkpoint_size is not None and int(checkpoint_size) > head:
        problems.append(f"the newest stored checkpoint covers {int(checkpoint_size)} entries, "
                        f"the journal holds {head}")
    if read.cut and not head_is_loss:
        last = read.rows[-1][0] if read.rows else None
        after = f"after entry {last}" if last is not None else "before its first record"
        problems.append(f"{log.name} was cut {after} (it ends at byte {read.size} without the zero its writer "
                        "leaves after the last record): entries committed after the cut may be gone")
    return problems


def stored_rows(con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]]) -> dict[int, Entry]:
    """The entries ``journal.db`` holds at the seqs of these log rows (to compare them whole)."""
    if not rows:
        return {}
    low, high = min(r[0] for r in rows), max(r[0] for r in rows)
    stored: dict[int, Entry] = {}
    for first in range(low, high + 1, COMPARE_RANGE):  # in ranges: the memory stays bounded
        found = con.execute(f"SELECT {COLUMNS} FROM entries WHERE seq BETWEEN ? AND ?",
                            [first, min(high, first + COMPARE_RANGE - 1)]).fetchall()
        stored.update((int(r[0]), Entry.from_row(r)) for r in found)
    return stored
