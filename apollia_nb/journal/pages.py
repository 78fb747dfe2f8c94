"""A page of journal entries read in bounded memory, however long the journal is.

``Journal.entries(since_seq=S, limit=N)`` is one ``ORDER BY seq LIMIT N`` over
every entry after ``S``: DuckDB keeps the best ``N`` of all of them, which at a
million entries needs more than the journal's capped memory. Seqs are
consecutive, so the entries of a page without a run filter are those of one
seq range: :func:`entry_page` reads ``S < seq <= S + N`` (and, filtered by kind,
further ranges of ``RANGE`` seqs until the page is full or the head is passed).
A run's entries are few: filtered by run, the journal's own query is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apollia_nb.journal.entry import Entry

__all__ = ["entry_page", "RANGE"]

#: The most seqs one read of a kind-filtered page spans.
RANGE = 50_000


def entry_page(journal: Any, *, run_id: str | None = None, since_seq: int | None = None,
               kinds: Iterable[str] | None = None, limit: int) -> list["Entry"]:
    """As ``journal.entries(run_id, since_seq, kinds, limit)``, reading one seq range at a time."""
    from apollia_nb.journal.entry import Entry
    from apollia_nb.journal.store import _COLUMNS

    if run_id is not None:
        return journal.entries(run_id=run_id, since_seq=since_seq, kinds=kinds, limit=limit)
    kinds = None if kinds is None else list(kinds)
    if kinds == [] or limit <= 0:
        return []
    head = journal.head()[0]  # read first: the cursor sees at least every entry up to it
    low = max(int(since_seq or 0), 0)
    where = "" if kinds is None else f" AND kind IN ({', '.join('?' for _ in kinds)})"
    out: list[Entry] = []
    cursor = journal.cursor()
    try:
        while len(out) < limit and low < head:
            want = limit - len(out)
            high = min(low + (want if kinds is None else max(want, RANGE)), head)
            rows = cursor.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE seq > ? AND seq <= ?{where} ORDER BY seq LIMIT {int(want)}",
                [low, high, *(kinds or [])]).fetchall()
            out.extend(Entry.from_row(r) for r in rows)
            low = high
    finally:
        cursor.close()
    return out
