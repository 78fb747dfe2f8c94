"""Read-only SQL over the journal's tables and views (``views.py``), in the process that holds ``journal.db``.

The rules of ``%%apollia sql`` and of a served home's ``POST /internal/journal/sql``;
the journal's database is open read-write in this process (DuckDB allows no second
opener), so a query runs on a cursor of that same database. Three locks keep it
read-only:

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
interrupted and fails with ``BAD_INPUT``. A journal stored elsewhere (a served
home's client, ``journal.read_query``) has the process that stores it run the
query under these same rules.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["DEFAULT_TIMEOUT", "check_read_only", "read_only_query"]

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


def read_only_query(journal: Any, query: str, *, timeout: float | None = DEFAULT_TIMEOUT, params: Any = None,
                    frame: bool = False) -> tuple[list[str], list[tuple[Any, ...]] | None, Any]:
    """Check ``query`` and run it read-only on a cursor of the journal's database, for ``timeout`` seconds at
    most: ``(columns, rows, None)``, or with ``frame`` (pandas installed) ``(columns, None, data_frame)``.
    A journal stored elsewhere runs it where it is stored: ``(columns, rows, None)`` whatever ``frame``."""
    import duckdb

    if timeout is not None and not timeout > 0:
        raise BadInput(f"the timeout must be a positive number of seconds, not {timeout!r}")
    statement = check_read_only(query)
    elsewhere = getattr(journal, "read_query", None)
    if elsewhere is not None:
        columns, found = elsewhere(statement, params, timeout if timeout is not None else DEFAULT_TIMEOUT)
        return list(columns), list(found), None
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
            if frame:
                return columns, None, cursor.fetchdf()
            return columns, cursor.fetchall(), None
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
