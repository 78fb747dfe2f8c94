"""DuckDB at the edge: its lock conflict as a message that names the holder; a database locked to itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from apollia_nb.errors import HomeLocked

__all__ = ["LOCKED_SETTINGS", "lock_down", "lock_holder_pid", "raise_if_locked"]

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


def lock_down(con: Any) -> None:
    """Lock a DuckDB instance to its own data (see ``LOCKED_SETTINGS``); it cannot be undone."""
    for statement in LOCKED_SETTINGS:
        con.execute(statement)
