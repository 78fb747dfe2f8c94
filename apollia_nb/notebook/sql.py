"""``%%apollia sql``: read-only SQL over the journal's views, in the process that holds ``journal.db``.

The rules (one ``SELECT`` or ``EXPLAIN`` of one, a read-only transaction, a
database that reads nothing but the journal, a time limit) are the journal's
(``apollia_nb.journal.sql``); a served home's server runs a client's query under
the same rules. Here the result becomes a pandas DataFrame when pandas is
installed; a NULL comes back as ``None``, in the rows and in the DataFrame (a
column holding one becomes ``object``).
"""

from __future__ import annotations

import importlib
from typing import Any

from apollia_nb.journal.sql import DEFAULT_TIMEOUT, check_read_only, read_only_query

__all__ = ["DEFAULT_TIMEOUT", "check_read_only", "run_query", "QueryResult"]


class QueryResult:
    """Columns and rows of a query, and a pandas DataFrame when pandas is installed."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]], frame: Any = None) -> None:
        self.columns = columns
        self.rows = rows
        self.frame = frame


def run_query(journal: Any, query: str, *, want_frame: bool = True,
              timeout: float | None = DEFAULT_TIMEOUT, params: Any = None) -> QueryResult:
    """Check ``query`` and run it read-only on the journal (``journal.sql.read_only_query``), for ``timeout``
    seconds at most; with ``want_frame`` and pandas installed, the rows as a DataFrame too."""
    framed = want_frame and _has_pandas()
    columns, rows, frame = read_only_query(journal, query, timeout=timeout, params=params, frame=framed)
    if framed:
        if frame is None:  # run where the journal is stored: its rows, framed here
            pandas = importlib.import_module("pandas")  # optional: installed by the user, never a dependency
            frame = pandas.DataFrame(rows, columns=columns)
        frame = _nulls_as_none(frame)
        return QueryResult(columns, [tuple(r) for r in frame.itertuples(index=False, name=None)], frame)
    return QueryResult(columns, list(rows or []))


def _nulls_as_none(frame: Any) -> Any:
    """The frame with every NULL as ``None`` (pandas would show NaN, NaT or <NA> by column type)."""
    for i in range(frame.shape[1]):
        column = frame.iloc[:, i]
        missing = column.isna()
        if missing.any():
            frame.isetitem(i, column.astype(object).where(~missing, None))
    return frame


def _has_pandas() -> bool:
    import importlib.util

    return importlib.util.find_spec("pandas") is not None
