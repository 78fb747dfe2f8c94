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
"""

from __future__ import annotations

import re
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["check_read_only", "run_query", "QueryResult"]

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


def run_query(journal: Any, query: str, *, want_frame: bool = True) -> QueryResult:
    """Check ``query`` and run it read-only on a cursor of the journal's database."""
    import duckdb

    statement = check_read_only(query)
    cursor = journal.cursor()
    try:
        cursor.execute("BEGIN TRANSACTION READ ONLY")
        try:
            cursor.execute(statement)
            columns = [d[0] for d in cursor.description or ()]
            frame = None
            if want_frame and _has_pandas():
                frame = cursor.fetchdf()
                rows = [tuple(r) for r in frame.itertuples(index=False, name=None)]
            else:
                rows = cursor.fetchall()
        except duckdb.Error as exc:
            raise BadInput(f"the query failed: {exc}") from None
        finally:
            cursor.execute("ROLLBACK")
    finally:
        cursor.close()
    return QueryResult(columns, rows, frame)


def _has_pandas() -> bool:
    import importlib.util

    return importlib.util.find_spec("pandas") is not None
