"""DuckDB at the edge: its lock conflict as a message that names the holder; its memory bounded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from apollia_nb.errors import HomeLocked

__all__ = ["MEMORY_LIMIT", "limit_memory", "lock_holder_pid", "raise_if_locked"]

#: The most memory DuckDB keeps for each of the two files the owner writes all the time,
#: ``journal.db`` and ``runtime.db``. DuckDB's default is 80 % of the machine's RAM *per
#: database*, and it keeps what it has allocated up to that limit: a long-running server's
#: memory then grows with the work it has done (measured: +30-40 MB a minute under a steady
#: load, flat with the limit). With the limit DuckDB evicts cached blocks (they are on disk)
#: and spills a large query's intermediates to a temporary file beside the database; appends,
#: lookups by key and the journal's index work as before (measured: 4 million keyed rows
#: inserted and checked under 32 MB). ``governance.db`` stays small and is left alone: a
#: low limit there slowed its per-operation connections many times over.
MEMORY_LIMIT = "64MB"


def limit_memory(con: Any, limit: str = MEMORY_LIMIT) -> None:
    """Cap the memory of the database ``con`` belongs to (the setting is per database, not per connection)."""
    con.execute(f"SET memory_limit = '{limit}'")

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
