"""Scrubbing a home's files: erased bytes leave the files, not only the rows.

Removing a value from a row is not enough to remove its bytes. DuckDB keeps a deleted or
updated row's old version in the file (a delete marks the row; an update writes a new
version elsewhere), and neither ``CHECKPOINT``, ``FORCE CHECKPOINT`` nor ``VACUUM`` gives the
blocks back or overwrites them (measured with DuckDB 2.0.1: a canary deleted, then each of
the three run and the file closed, is still in the file's bytes). ``journal.log`` is an
append-only file whose records stay after they are copied into ``journal.db``. So:

``compact_duckdb(path)``
    Rewrites a DuckDB file from its live rows only: ``ATTACH`` a new file beside it (same
    storage version), ``COPY FROM DATABASE`` old to new (tables, constraints, views), check
    that the new file holds the very same catalog and rows (count and a hash of every row
    of every table), close both, remove what DuckDB spilled beside the file
    (``<file>.tmp/duckdb_temp*``, left by a process killed in a large query), ``fsync`` the
    new file, rename it over the old one and ``fsync`` the folder. No freed block or old row version survives: the new file was
    written from the live rows and nothing else.

``rewrite_log(path, transform)``
    Rewrites ``journal.log`` with each row passed through ``transform`` (the same change the
    caller made to those rows in ``journal.db``: the next open compares the log's rows with
    the stored ones and refuses a difference). Record boundaries are kept; a torn last record
    (a write a crash interrupted, never acknowledged) is dropped as every reader drops it;
    a log that was cut or is damaged is refused and left as it is. New file, ``fsync``,
    rename, ``fsync`` of the folder.

Crash safety. Both write the new file under a name of their own (``journal.db.scrub``,
``journal.log.scrub``) and rename it over the old one; a crash before the rename leaves the
old file (and the unfinished new one, which the next call removes first: ``leftovers`` names
them, and until then it may hold the very bytes being erased), a crash after it the new one:
never neither. The fault points ``scrub.before_rename`` / ``scrub.after_rename`` (DuckDB
files) and ``scrub.log_before_rename`` / ``scrub.log_after_rename`` mark those windows.

Contract for callers (the erase command)
    * Nothing may have the file open while it is scrubbed. DuckDB allows one process per file
      (another process holding it is ``HOME_LOCKED``), and in this process a file open
      elsewhere (a ``Journal``, the runtime's records) is ``CONFLICT``: the open instance is
      locked to its own data and cannot ``ATTACH``, and renaming a file under a live writer
      would lose its later writes. Hold the home's owner lock (``home.OwnerLock``) around
      the whole erase.
    * So the journal is scrubbed while it is closed, not under its writer lock: the owner
      changes the rows (live, through the journal, or offline), then closes the journal —
      ``Journal.close`` copies everything into ``journal.db`` and removes ``journal.log`` —
      then calls ``compact_duckdb(home.journal_db)`` and opens it again. ``rewrite_log`` is
      for a log that is still there with the journal closed (a previous owner's crash): call
      it with the same row change before compacting, or open the journal once (which copies
      the log in and starts it over) and change the rows then.
    * ``scrub_home(home)`` does the DuckDB part for every database file of a home
      (``journal.db``, ``runtime.db``, ``governance.db``) and removes leftovers; call it last.
    * A live owner that wants to change rows without a close (a served home) needs the
      journal itself to do it (``Journal.rewrite_payloads(changes)``: a job on its copier
      after a drain, then the log started over under the commit lock); the bytes still leave
      ``journal.db`` only at its next compaction, which needs the close.

What this does not reach: copies outside the home's files (backups, file-system
snapshots, blocks the file system freed when a file shrank or was replaced, an SSD's
remapped cells). ``tests/scan_home.py`` proves absence in every file of a home.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apollia_nb import faults
from apollia_nb.dbutil import STORAGE_VERSION, raise_if_locked, storage_error
from apollia_nb.errors import ApolliaError, BadInput, Conflict, IntegrityError, StorageError
from apollia_nb.home import damaged_file

__all__ = [
    "SCRUB_SUFFIX",
    "Compacted",
    "LogRewrite",
    "compact_duckdb",
    "leftovers",
    "remove_leftovers",
    "rewrite_log",
    "scrub_home",
]

#: The new file is written beside the old one under this suffix, then renamed over it.
SCRUB_SUFFIX = ".scrub"
#: The connection the compaction makes: a configuration nobody else in the process uses, so a
#: file already open in this process (which DuckDB would otherwise hand back, shared) is refused.
_CONFIG: dict[str, Any] = {"custom_user_agent": "apollia-nb-scrub", "threads": 1}
#: DuckDB's own memory for the copy (it spills to a temporary folder beside the file beyond it).
_MEMORY_LIMIT = "64MB"
#: The journal row's columns that a rewrite of the log must leave as they are: seq, ts, run_id,
#: agent, kind, prev_hash, hash, signature, key_id (everything but the payload, index 5).
_FIXED_COLUMNS = (0, 1, 2, 3, 4, 6, 7, 8, 9)


@dataclass(frozen=True)
class Compacted:
    """What ``compact_duckdb`` did: the file, its size before and after, and its tables' rows."""

    path: Path
    bytes_before: int
    bytes_after: int
    rows: dict[str, int]


@dataclass(frozen=True)
class LogRewrite:
    """What ``rewrite_log`` did: records and rows written, rows the transform changed, and the
    bytes of a torn last record dropped."""

    path: Path
    records: int
    rows: int
    changed: int
    torn_bytes: int


def scrub_path(path: Path) -> Path:
    """``journal.db`` → ``journal.db.scrub`` (beside it)."""
    return path.with_name(path.name + SCRUB_SUFFIX)


def leftovers(path: Path) -> list[Path]:
    """The unfinished new file (and DuckDB's side files of it) a crashed scrub of ``path`` left."""
    new = scrub_path(Path(path))
    found = [p for p in (new, new.with_name(new.name + ".wal")) if p.exists() or p.is_symlink()]
    tmp = new.with_name(new.name + ".tmp")
    if tmp.is_dir():
        found.append(tmp)
    return found


def remove_leftovers(path: Path) -> list[Path]:
    """Remove what ``leftovers`` names (the folder is synced after); returns what was removed."""
    gone = leftovers(path)
    for item in gone:
        if item.is_dir() and not item.is_symlink():
            for child in sorted(item.rglob("*"), reverse=True):
                child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
            item.rmdir()
        else:
            item.unlink()
    if gone:
        _fsync_dir(Path(path).parent)
    return gone


# ---------------------------------------------------------------------------------------- DuckDB
def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _catalog(con: Any, database: str) -> list[tuple[Any, ...]]:
    """What a database defines: tables, views, constraints, indexes and sequences, as comparable rows."""
    out: list[tuple[Any, ...]] = []
    for kind, sql in (
        ("table", "SELECT schema_name, table_name, sql FROM duckdb_tables() WHERE database_name = ?"),
        ("view", "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE database_name = ? AND NOT internal"),
        ("constraint", ("SELECT schema_name, table_name, constraint_type || ' ' || coalesce(constraint_text, '') "
                        "FROM duckdb_constraints() WHERE database_name = ?")),
        ("index", "SELECT schema_name, index_name, sql FROM duckdb_indexes() WHERE database_name = ?"),
        ("sequence", ("SELECT schema_name, sequence_name, start_value::VARCHAR FROM duckdb_sequences() "
                      "WHERE database_name = ?")),
    ):
        out.extend((kind, *row) for row in con.execute(sql, [database]).fetchall())
    return sorted(out, key=repr)


def _tables(con: Any, database: str) -> list[tuple[str, str]]:
    return [(s, t) for s, t in con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY 1, 2",
        [database]).fetchall()]


def _fingerprint(con: Any, database: str, schema: str, table: str) -> tuple[int, int]:
    """Rows of a table and a hash over them all (order-free)."""
    name = f"{_quote(database)}.{_quote(schema)}.{_quote(table)}"
    [(count, digest)] = con.execute(f"SELECT count(*), coalesce(bit_xor(hash(t)), 0) FROM {name} AS t").fetchall()
    return int(count), int(digest)


def compact_duckdb(path: Path) -> Compacted:
    """Rewrite the DuckDB file ``path`` from its live rows, so no freed block or old row version
    survives in it (see the module). Crash-safe: the old file or the new one, never neither.

    Raises ``HomeLocked`` when another process holds the file, ``Conflict`` when it is open in
    this process, ``BadInput`` when there is no such file (or it is a link), ``HomeFileCorrupt``
    when DuckDB cannot open it, ``IntegrityError`` when the new file
    does not hold the very same catalog and rows, and the disk's ``STORAGE_*`` errors; in each
    case the old file is left as it was and the unfinished new one removed."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():  # a link would be replaced by a file, its target left as it was
        raise BadInput(f"{path} is not a database file (a link, a folder or nothing)")
    before, mode = path.stat().st_size, path.stat().st_mode
    new = scrub_path(path)
    remove_leftovers(path)
    try:
        con = _connect_alone(path, "compacted")
        try:
            con.execute(f"SET memory_limit = '{_MEMORY_LIMIT}'")
            [(old,)] = con.execute("SELECT current_database()").fetchall()
            tags = con.execute("SELECT tags FROM duckdb_databases() WHERE database_name = ?", [old]).fetchone()
            version = str((tags[0] if tags else {}).get("storage_version") or STORAGE_VERSION).rstrip("+")
            con.execute(f"ATTACH '{_sql_text(str(new))}' AS scrub_new (STORAGE_VERSION '{_sql_text(version)}')")
            try:
                con.execute(f"COPY FROM DATABASE {_quote(old)} TO scrub_new")
                rows = _check_copy(con, old, "scrub_new", path)
            finally:
                con.execute("DETACH scrub_new")
            con.execute("CHECKPOINT")
        finally:
            con.close()
        _remove_spill(path)
        for side in (path.with_name(path.name + ".wal"), new.with_name(new.name + ".wal")):
            if side.exists():  # a close checkpoints and removes it; one left would be replayed onto the new file
                raise StorageError(f"{side.name} in {path.parent} is still there after the copy was closed; "
                                   f"{path.name} was left as it was")
        os.chmod(new, stat.S_IMODE(mode))
        _fsync_file(new)
        faults.point("scrub.before_rename")
        os.replace(new, path)
        faults.point("scrub.after_rename")
        _fsync_dir(path.parent)
    except BaseException as exc:
        _discard(path, new)
        _raise_storage(exc, f"{path.name} could not be compacted (it was left as it was)")
        raise
    return Compacted(path, before, path.stat().st_size, rows)


def _connect_alone(path: Path, what: str) -> Any:
    """A connection to ``path`` nobody else has: ``HomeLocked`` when another process holds the file,
    ``Conflict`` when this process has it open (a ``Journal``, the runtime's records)."""
    import duckdb  # lazy: 110 ms at import

    try:
        return duckdb.connect(str(path), config=dict(_CONFIG))
    except duckdb.ConnectionException as exc:
        if "different configuration" in str(exc):
            raise Conflict(f"{path.name} in {path.parent} is open in this process (PID {os.getpid()}); "
                           f"close it before it is {what}") from None
        raise_if_locked(exc, path)
        raise
    except duckdb.Error as exc:
        raise_if_locked(exc, path)
        if storage_error(exc, "") is not None:
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged_file(path, f"it cannot be opened: {first}") from None


def _check_copy(con: Any, old: str, new: str, path: Path) -> dict[str, int]:
    """Raise ``IntegrityError`` unless ``new`` defines what ``old`` does and holds the same rows."""
    if _catalog(con, old) != _catalog(con, new):
        raise IntegrityError(f"the compacted copy of {path.name} does not define what it does; "
                             f"{path.name} was left as it was")
    rows: dict[str, int] = {}
    for schema, table in _tables(con, old):
        want = _fingerprint(con, old, schema, table)
        if _fingerprint(con, new, schema, table) != want:
            raise IntegrityError(f"the compacted copy of {path.name} does not hold the rows of {table}; "
                                 f"{path.name} was left as it was")
        rows[table if schema == "main" else f"{schema}.{table}"] = want[0]
    return rows


def _remove_spill(path: Path) -> None:
    """Remove what DuckDB spilled beside ``path`` (``<file>.tmp/duckdb_temp*``: intermediates of a large
    query, rows among them) and a process killed meanwhile left; nobody holds the file now."""
    spill = path.with_name(path.name + ".tmp")
    if spill.is_symlink() or not spill.is_dir():
        return
    for item in spill.iterdir():
        if item.name.startswith("duckdb_temp") and (item.is_symlink() or item.is_file()):
            item.unlink()
    if not any(spill.iterdir()):
        spill.rmdir()


def _discard(path: Path, new: Path) -> None:
    """After a failure before the rename: the unfinished new file goes (the old one stays)."""
    try:
        if new.exists() and path.exists():
            remove_leftovers(path)
    except OSError:
        pass  # the next compaction removes it first


def _sql_text(text: str) -> str:
    return text.replace("'", "''")


def scrub_home(home: Any, names: Iterable[str] = ("journal.db", "runtime.db", "governance.db")) -> list[Compacted]:
    """Compact every database file of ``home`` that exists (``compact_duckdb``); nothing may hold them."""
    done = []
    for name in names:
        path = Path(home.path) / name
        if path.is_file():
            done.append(compact_duckdb(path))
        else:
            remove_leftovers(path)
    return done


# ---------------------------------------------------------------------------------------- the log
def rewrite_log(path: Path, transform: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> LogRewrite:
    """Rewrite ``journal.log`` (``path``) with every row passed through ``transform`` (see the module).

    ``transform`` takes a row in the journal's column order (``seq, ts, run_id, agent, kind,
    payload, prev_hash, hash, signature, key_id``) and returns it, with only its payload
    changed: a change to any other column is ``BadInput`` and nothing is written (an erasure
    never changes what is hashed). A missing log is left missing. A log that is damaged or was
    cut raises ``IntegrityError`` and is left as it is (``apollia-os home repair`` settles it).
    A journal open on it (``journal.db`` beside it held by a process: ``HomeLocked``; by this
    one: ``Conflict``) is refused: its writer would go on writing into the file replaced."""
    from apollia_nb.journal.tail import encode_rows, read_tail

    path = Path(path)
    new = scrub_path(path)
    remove_leftovers(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise BadInput(f"{path} is not a journal log (a link or a folder); it is left as it is")
    if not path.exists():
        return LogRewrite(path, 0, 0, 0, 0)
    database = path.with_suffix(".db")
    if database.is_file():  # its journal's writer holds journal.db while it writes the log
        _connect_alone(database, "rewritten").close()
    read = read_tail(path)  # the one reading of the log, record by record: damage before the end raises here
    if read.cut:
        raise IntegrityError(f"{path} was cut (acknowledged entries after the cut may be gone); it is left as "
                             "it is: settle that first (`apollia-os home repair --lost-entries`)")
    records: list[bytes] = []
    rows = changed = 0
    for count in read.records:  # each record rewritten as one, as its commit wrote it
        out = []
        for row in read.rows[rows:rows + count]:
            after = tuple(transform(row))
            if len(after) != len(row) or any(after[i] != row[i] for i in _FIXED_COLUMNS):
                raise BadInput(f"the rewrite of {path.name} changed more than the payload of entry {row[0]}; "
                               "nothing was written")
            if not isinstance(after[5], (bytes, bytearray)):
                raise BadInput(f"the rewritten payload of entry {row[0]} is not bytes; nothing was written")
            changed += after[5] != row[5]
            out.append((*after[:5], bytes(after[5]), *after[6:]))
        records.append(encode_rows(out))
        rows += len(out)
    if rows != len(read.rows):
        raise IntegrityError(f"{path} reads as {len(read.rows)} rows but {rows} were found; nothing was written")
    torn = read.data_end - read.valid_length
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        os.fchmod(fd, mode)
        try:
            for record in records:
                _write_all(fd, record)
            _write_all(fd, b"\0")  # the zero its writer leaves after the last record: not cut
            os.fsync(fd)
        finally:
            os.close(fd)
        faults.point("scrub.log_before_rename")
        os.replace(new, path)
        faults.point("scrub.log_after_rename")
        _fsync_dir(path.parent)
    except BaseException as exc:
        try:
            if new.exists():
                new.unlink()
        except OSError:
            pass  # the next rewrite removes it first
        _raise_storage(exc, f"{path.name} could not be rewritten (it was left as it was)")
        raise
    return LogRewrite(path, len(records), rows, changed, max(torn, 0))


# ---------------------------------------------------------------------------------------- the disk
def _raise_storage(exc: BaseException, what: str) -> None:
    """Raise the ``STORAGE_*`` error for the disk refusing a write; return for anything else."""
    if isinstance(exc, ApolliaError) or not isinstance(exc, Exception):
        return
    error = storage_error(exc, what)
    if error is not None and error is not exc:
        raise error from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    from apollia_nb.journal.tail import _fsync_dir as fsync_dir  # the log writer's own

    fsync_dir(directory)
