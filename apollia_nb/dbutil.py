"""DuckDB and the disk at the edge: a lock conflict that names the holder, storage faults with stable
codes, a database locked to itself, its memory bounded."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from apollia_nb.errors import HomeLocked, StorageError, StorageFull

__all__ = [
    "CHECKPOINT_THRESHOLD",
    "FAULT_ENV",
    "LOCKED_SETTINGS",
    "MEMORY_LIMIT",
    "STORAGE_VERSION",
    "connect_locked",
    "fault_point",
    "limit_memory",
    "lock_down",
    "lock_holder_pid",
    "needs_reopen",
    "raise_if_locked",
    "storage_error",
]

#: The most memory DuckDB keeps for each of the two files the owner writes all the time,
#: ``journal.db`` and ``runtime.db``. DuckDB's default is 80 % of the machine's RAM *per
#: database*, and it keeps what it has allocated up to that limit: a long-running server's
#: memory then grows with the work it has done until it reaches the limit (measured: +30-40 MB
#: a minute under a steady load without one; with 64 MB each, the two files still took
#: 30-55 MB more by minute 10 of a soak, and were still rising). With the limit DuckDB evicts
#: cached blocks (they are on disk) and spills a large query's intermediates to a temporary
#: file beside the database; appends, lookups by key and the journal's index work as before
#: (measured: 10 million keyed rows inserted, then appended to and looked up, under 32 MB).
#: ``governance.db`` stays small and is left alone: a low limit there slowed its
#: per-operation connections many times over.
MEMORY_LIMIT = "32MB"
#: How much write-ahead log DuckDB lets grow before it checkpoints the database by itself
#: (its default is 16 MB). Until then the rows written since the last checkpoint, and the
#: old versions of the rows updated (a task's row is rewritten at each status change), are
#: held in memory: up to 17 MB of the journal's new rows and 19 MB of ``runtime.db``'s
#: updates were seen in a soak. A checkpoint of 4 MB of log costs tens of milliseconds and
#: changes nothing of what is durable (a commit is durable in the log before).
CHECKPOINT_THRESHOLD = "4MB"


def limit_memory(con: Any, limit: str = MEMORY_LIMIT) -> None:
    """Cap the memory of the database ``con`` belongs to (the settings are per database, not per connection):
    ``limit`` for what it caches, and a checkpoint each ``CHECKPOINT_THRESHOLD`` of log for what it holds
    of the writes since the last one."""
    con.execute(f"SET memory_limit = '{limit}'")
    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")

_PID = re.compile(r"\(PID (\d+)\)")


def lock_holder_pid(exc: BaseException) -> int | None:
    """The PID in DuckDB's ``Conflicting lock is held in ... (PID n)`` message, if any."""
    text = str(exc)
    if "lock" not in text.lower():
        return None
    match = _PID.search(text)
    return int(match.group(1)) if match else None


def raise_if_locked(exc: BaseException, path: Path) -> None:
    """Raise ``HomeLocked`` naming the holder when ``exc`` is DuckDB's lock conflict."""
    text = str(exc)
    if "Conflicting lock" not in text and "Could not set lock" not in text:
        return
    pid = lock_holder_pid(exc)
    who = f"process {pid}" if pid is not None else "another process"
    raise HomeLocked(
        f"{path.name} in {path.parent} is held by {who}. Stop that process, or run "
        "`apollia-os serve` so several processes can share the home, or use another --home."
    ) from None


# Applied once to a database instance after it is set up. DuckDB's settings are
# per instance, so they hold for every connection and cursor of it: SQL run there
# reads the database's own tables and nothing else. No file or URL is opened by a
# table function, COPY, ATTACH, EXPORT, INSTALL, LOAD or secret (only the
# database's own files and temporary directory stay open to DuckDB itself), no
# extension is installed or loaded behind a query, no Python variable is scanned
# by name, and no setting can be changed back (every SET and RESET fails).
LOCKED_SETTINGS = (
    "SET enable_external_access = false",
    "SET autoinstall_known_extensions = false",
    "SET autoload_known_extensions = false",
    "SET allow_community_extensions = false",
    "SET allow_persistent_secrets = false",
    "SET python_enable_replacements = false",
    "SET lock_configuration = true",
)


#: The DuckDB storage format a new ``journal.db`` is written in: the oldest DuckDB that opens it. A file
#: keeps the format it was created with, so ``duckdb`` command-line clients from 1.4 on open the journal.
STORAGE_VERSION = "v1.4.0"


def connect_locked(path: Path, *, read_only: bool = False) -> Any:
    """Connect to a DuckDB file, turning DuckDB's lock conflict into ``HomeLocked``. A file created here
    is written in the storage format of ``STORAGE_VERSION``."""
    import duckdb  # lazy: 110 ms at import, and the CLI reads this module on its error path

    try:
        con = duckdb.connect(str(path), read_only=read_only,
                             config={"storage_compatibility_version": STORAGE_VERSION})
    except duckdb.Error as exc:
        raise_if_locked(exc, path)
        raise
    con.execute("SET enable_progress_bar = false")
    return con


def lock_down(con: Any, *settings: str) -> None:
    """Apply ``settings`` (``"SET threads = 1"``), then lock the instance to its own data (``LOCKED_SETTINGS``).

    It cannot be undone. An instance locked already is left as it is: a file
    opened again while a cursor of the old connection lives gets that same
    instance back.
    """
    if con.execute("SELECT current_setting('lock_configuration')").fetchone()[0]:
        return
    for statement in (*settings, *LOCKED_SETTINGS):
        con.execute(statement)


# --- storage faults -------------------------------------------------------------------------------
#
# A full disk, a read-only file system or an I/O error reaches us as an ``OSError`` (our own
# writes: journal.log) or as a DuckDB exception whose message carries the system's words
# (DuckDB 2.0.1: ``TransactionException: ... Failed to commit: Could not write file
# "….wal": No space left on device``; a failed checkpoint is a ``FatalException`` that
# invalidates the database until it is opened again).

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: The disk (not the program) refusing: read-only, I/O error, file too large, device or NFS gone.
_STORAGE_ERRNOS = frozenset({errno.EROFS, errno.EIO, errno.EFBIG, errno.ENXIO, errno.ENODEV, errno.ESTALE})
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "disk full", "not enough space on the disk")
_STORAGE_WORDS = (
    "read-only file system", "input/output error", "could not write", "could not fsync", "could not sync",
    "could not truncate", "failed to create checkpoint", "database has been invalidated", "file too large",
)
#: ``APOLLIA_STORAGE_FAULT=runtime.db:EIO,journal.log:EROFS``: writes to those files fail with that
#: error (a fault point for the failures a test cannot make a real disk produce).
FAULT_ENV = "APOLLIA_STORAGE_FAULT"


def fault_point(name: str) -> None:
    """Raise the ``OSError`` ``$APOLLIA_STORAGE_FAULT`` asks for writes to ``name`` (if any)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for part in spec.split(","):
        target, _, code = part.strip().partition(":")
        if target == name and code:
            number = getattr(errno, code.strip().upper(), None)
            if isinstance(number, int):
                raise OSError(number, os.strerror(number), name)


def storage_error(exc: BaseException, what: str) -> StorageError | None:
    """``StorageFull`` / ``StorageError`` for an exception that is the disk refusing a write, else None.

    ``what`` says what was not recorded (it starts the message)."""
    if isinstance(exc, StorageError):
        return exc
    text = " ".join(str(exc).split())  # one line: DuckDB's fatal errors span several
    lower = text.lower()
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno not in _FULL_ERRNOS and exc.errno not in _STORAGE_ERRNOS:
            return None  # e.g. a missing file or a bad descriptor: not the disk
        full = exc.errno in _FULL_ERRNOS
        if not full and exc.errno == errno.EROFS:
            return StorageError(f"{what}: the file system is read-only ({text}); nothing of it was recorded. "
                                "Make the home writable again; writes resume by themselves.")
    elif any(word in lower for word in _FULL_WORDS):
        full = True
    elif any(word in lower for word in _STORAGE_WORDS):
        full = False
    else:
        return None
    if full:
        return StorageFull(f"{what}: no space left on the disk ({text}); nothing of it was recorded. "
                           "Free space and retry; writes resume by themselves.")
    return StorageError(f"{what}: the disk refused the write ({text}); nothing of it was recorded. "
                        "Retry later; writes resume by themselves once the disk takes them.")


def needs_reopen(exc: BaseException) -> bool:
    """True when DuckDB invalidated the database after a failed write: it must be opened again."""
    for err in (exc, exc.__cause__):
        if err is not None and (type(err).__name__ == "FatalException"
                                or "database has been invalidated" in str(err)):
            return True
    return False
