"""``%%apollia sql``: read-only SQL over the journal's views, in the process that holds ``journal.db``.

The journal's database is open read-write in this process (DuckDB allows no
second opener), so a query runs on a cursor of that same database. Two locks
keep it read-only:

1. The text is parsed by DuckDB's own parser (``duckdb.extract_statements``):
   exactly one statement, and it must be a ``SELECT`` (which covers ``WITH``,
   ``FROM``-first, ``VALUES``, ``SHOW``, ``DESCRIBE`` and ``SUMMARIZE``) or an
   ``EXPLAIN`` of one. Everything else — ``INSERT``, ``UPDATE``, ``DELETE``,
   ``DROP``, ``CREATE``, ``ATTACH``, ``COPY``, ``EXPORT``, ``PRAGMA``,
   ``CALL``, ``SET``, ``LOAD``, transactions, several statements — is refused
   with ``BAD_INPUT`` before anything runs.
2. The query runs inside ``BEGIN TRANSACTION READ ONLY`` and is rolled back,
   so even a statement the parser check let through could not change a table.
3. The database instance is locked to itself when the journal opens
   (``apollia_nb.dbutil.lock_down``): a ``SELECT`` cannot read a file or URL
   (``read_text``, ``read_csv``, ``read_parquet``, ``read_json``, ``read_blob``,
   ``glob``, ``sniff_csv``, ``'http://…'``), install or load an extension, use
   a secret, scan a Python variable, or change a setting. Such a query fails
   with ``BAD_INPUT`` saying that only the journal can be read, and nothing is
   fetched.

A query runs at most ``timeout`` seconds (``DEFAULT_TIMEOUT``); then it is
interrupted and fails with ``BAD_INPUT``. A NULL comes back as ``None``, in
the rows and in the DataFrame (a column holding one becomes ``object``).
"""

from __future__ import annotations

import importlib
import re
import threading
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["DEFAULT_TIMEOUT", "check_read_only", "run_query", "QueryResult"]

DEFAULT_TIMEOUT = 60.0

_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(ANALY[SZ]E\s+)?", re.IGNORECASE)


def _statements(query: str) -> list[Any]:
    import duckdb

    try:
        return list(duckdb.extract_statements(query))
    except duckdb.Error as exc:
        raise BadInput(f"the query does not parse: {exc}") from None


def check_read_only(query: str) -> str:
    """The single read-only statement in ``query``, or ``BAD_INPUT`` saying why it is refused."""
    import duckdb

    if not isinstance(query, str) or not query.strip():
        raise BadInput("the cell holds no SQL query")
    statements = _statements(query)
    if len(statements) != 1:
        raise BadInput(f"one statement per cell, found {len(statements)}: only a single read query runs here")
    statement = statements[0]
    kind = statement.type
    if kind == duckdb.StatementType.SELECT:
        return statement.query
    if kind == duckdb.StatementType.EXPLAIN:
        inner = _statements(_EXPLAIN.sub("", statement.query, count=1))
        if len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT:
            return statement.query
        raise BadInput("EXPLAIN is allowed only for a SELECT query")
    name = getattr(kind, "name", str(kind))
    raise BadInput(f"the journal is read-only here: {name} statements are refused (only SELECT queries run)")


class QueryResult:
    """Columns and rows of a query, and a pandas DataFrame when pandas is installed."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]], frame: Any = None) -> None:
        self.columns = columns
        self.rows = rows
        self.frame = frame


def run_query(journal: Any, query: str, *, want_frame: bool = True,
              timeout: float | None = DEFAULT_TIMEOUT, params: Any = None) -> QueryResult:
    """Check ``query`` and run it read-only on a cursor of the journal's database, for ``timeout`` seconds at most.

    A journal stored elsewhere (a served home's client) has the process that stores it run the query
    under these same rules (``journal.read_query``)."""
    import duckdb

    if timeout is not None and not timeout > 0:
        raise BadInput(f"the timeout must be a positive number of seconds, not {timeout!r}")
    statement = check_read_only(query)
    elsewhere = getattr(journal, "read_query", None)
    if elsewhere is not None:
        columns, found = elsewhere(statement, params, timeout if timeout is not None else DEFAULT_TIMEOUT)
        if want_frame and _has_pandas():
            pandas = importlib.import_module("pandas")  # optional: installed by the user, never a dependency
            frame = _nulls_as_none(pandas.DataFrame(found, columns=columns))
            return QueryResult(columns, [tuple(r) for r in frame.itertuples(index=False, name=None)], frame)
        return QueryResult(columns, found)
    cursor = journal.cursor()
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        cursor.interrupt()

    timer = threading.Timer(timeout, stop) if timeout is not None else None
    try:
        cursor.execute("BEGIN TRANSACTION READ ONLY")
        try:
            if timer is not None:
                timer.start()
            cursor.execute(statement, params)
            columns = [d[0] for d in cursor.description or ()]
            if want_frame and _has_pandas():
                frame = _nulls_as_none(cursor.fetchdf())
                rows = [tuple(r) for r in frame.itertuples(index=False, name=None)]
            else:
                frame, rows = None, cursor.fetchall()
        except duckdb.Error as exc:
            raise _query_error(exc, stopped.is_set(), timeout) from None
        finally:
            if timer is not None:
                timer.cancel()
            try:
                cursor.execute("ROLLBACK")
            except duckdb.Error:
                pass  # closing the cursor ends the read-only transaction as well
    finally:
        cursor.close()
    return QueryResult(columns, rows, frame)


def _query_error(exc: Exception, timed_out: bool, timeout: float | None) -> BadInput:
    import duckdb

    # One line: DuckDB's message without the echo of the query and its caret marker.
    lines = [ln.strip() for ln in str(exc).splitlines()]
    kept = [ln for ln in lines if ln and not ln.startswith("LINE ") and set(ln) != {"^"}]
    text = " ".join(kept) or type(exc).__name__
    first = kept[0] if kept else text
    if timed_out:
        return BadInput(f"the query ran longer than {timeout:g} s and was stopped; "
                        "narrow it, or give it more time with --timeout SECONDS")
    if isinstance(exc, duckdb.PermissionException):
        return BadInput(f"only the journal's tables and views can be read here, not files, URLs, extensions or "
                        f"settings ({first})")
    return BadInput(f"the query failed: {text}")


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
