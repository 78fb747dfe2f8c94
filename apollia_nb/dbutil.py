"""DuckDB at the edge: turning its lock conflict into a message that names the holder."""

from __future__ import annotations

import re
from pathlib import Path

from apollia_nb.errors import HomeLocked

__all__ = ["lock_holder_pid", "raise_if_locked"]

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
