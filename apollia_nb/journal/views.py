"""The auditor's SQL views over the ``entries`` table.

Created (``CREATE OR REPLACE``) each time the journal opens, and written into an
exported bundle as ``views.sql`` over ``entries.parquet``, so the same queries
work on a live ``journal.db`` and on an offline bundle. Views only read; the raw
hashed bytes stay in ``entries``.

The payload fields the views expose are kept typed in ``entry_fields`` (one row
per entry of the kinds the views read), filled from the stored payload bytes by
the same transaction that copies the entries into ``journal.db``; so an
auditor's query is a scan of typed columns, not JSON parsing. ``entries`` stays
the source of truth: in a bundle, ``entry_fields`` is a view computing the same
columns from ``entries.parquet``, and verification reads only ``entries``.

``ts`` columns are ``TIMESTAMPTZ`` (the stored text is UTC with ``Z``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = [
    "VIEW_NAMES", "VIEWS_SQL", "ENTRY_FIELDS_DDL", "FIELD_KINDS", "create_views", "copy_entry_fields",
    "bundle_sql", "list_runs",
]

VIEW_NAMES = ("journal", "decisions", "tool_calls", "runs")

#: The entry kinds whose payload fields the views read.
FIELD_KINDS = ("decision", "answer", "tool_call", "tool_result", "run_open", "run_seal")

ENTRY_FIELDS_DDL = """CREATE TABLE IF NOT EXISTS entry_fields (
        seq BIGINT NOT NULL,
        kind VARCHAR NOT NULL,
        ts TIMESTAMPTZ,
        run_id VARCHAR,
        agent VARCHAR,
        call_id VARCHAR,
        tool VARCHAR,
        family VARCHAR,
        outcome VARCHAR,
        line INTEGER,
        answer VARCHAR,
        answered_by VARCHAR,
        status VARCHAR,
        error_code VARCHAR,
        run_kind VARCHAR)"""

_FIELDS_SELECT = """
SELECT seq, kind, CAST(ts AS TIMESTAMPTZ) AS ts, run_id, agent,
       p->>'call_id' AS call_id, p->>'tool' AS tool, p->>'family' AS family, p->>'outcome' AS outcome,
       TRY_CAST(p->>'line' AS INTEGER) AS line, p->>'answer' AS answer, p->>'answered_by' AS answered_by,
       p->>'status' AS status, p->>'error_code' AS error_code, p->>'run_kind' AS run_kind
FROM (SELECT seq, kind, ts, run_id, agent, CAST(decode(payload) AS JSON) AS p
      FROM entries WHERE kind IN ({kinds}){where})
""".replace("{kinds}", ", ".join(f"'{k}'" for k in FIELD_KINDS))


def copy_entry_fields(con: Any, first: int | None = None, last: int | None = None) -> None:
    """Fill ``entry_fields`` from the stored entries with seq ``first..last`` (default: all).

    Runs inside the caller's transaction (the one that copies those entries)."""
    if first is None:
        con.execute("INSERT INTO entry_fields " + _FIELDS_SELECT.replace("{where}", ""))
    else:
        con.execute("INSERT INTO entry_fields " + _FIELDS_SELECT.replace("{where}", " AND seq BETWEEN ? AND ?"),
                    [first, last])


_JOURNAL = """
CREATE OR REPLACE VIEW journal AS
SELECT
    seq,
    CAST(ts AS TIMESTAMPTZ) AS ts,
    run_id,
    agent,
    kind,
    CAST(decode(payload) AS JSON) AS payload,
    lower(hex(prev_hash)) AS prev_hash,
    lower(hex(hash)) AS hash,
    lower(hex(signature)) AS signature,
    key_id
FROM entries
"""

_DECISIONS = """
CREATE OR REPLACE VIEW decisions AS
WITH a AS (
    SELECT run_id, call_id, answer, answered_by
    FROM entry_fields WHERE kind = 'answer'
    QUALIFY row_number() OVER (PARTITION BY run_id, call_id ORDER BY seq) = 1
)
SELECT
    d.seq,
    d.ts,
    d.run_id,
    d.agent,
    d.tool,
    d.family,
    d.outcome,
    d.line,
    a.answer,
    a.answered_by
FROM entry_fields d
LEFT JOIN a
  ON a.run_id IS NOT DISTINCT FROM d.run_id AND a.call_id = d.call_id
WHERE d.kind = 'decision'
ORDER BY d.seq
"""

_TOOL_CALLS = """
CREATE OR REPLACE VIEW tool_calls AS
WITH g AS (
    -- One pass over the typed fields: per call, the seq of its first tool_call and of its
    -- first tool_result (a call_id that is NULL never pairs a call with a result); only two
    -- integers per call are aggregated, the fields are then read by seq.
    SELECT min(seq) FILTER (WHERE kind = 'tool_call') AS call_seq,
           min(seq) FILTER (WHERE kind = 'tool_result') AS result_seq
    FROM entry_fields WHERE kind IN ('tool_call', 'tool_result')
    GROUP BY run_id, call_id, CASE WHEN call_id IS NULL THEN kind END
)
SELECT
    coalesce(c.run_id, r.run_id) AS run_id,
    coalesce(c.call_id, r.call_id) AS call_id,
    coalesce(c.tool, r.tool) AS tool,
    coalesce(r.status, 'running') AS status,
    r.error_code,
    c.ts AS started_at,
    r.ts AS finished_at
FROM g
LEFT JOIN entry_fields c ON c.seq = g.call_seq
LEFT JOIN entry_fields r ON r.seq = g.result_seq
ORDER BY coalesce(g.call_seq, g.result_seq)
"""

_RUNS = """
CREATE OR REPLACE VIEW runs AS
WITH o AS (
    SELECT run_id, agent, run_kind, ts
    FROM entry_fields WHERE kind = 'run_open' AND run_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY seq) = 1
), s AS (
    SELECT run_id, status, ts
    FROM entry_fields WHERE kind = 'run_seal' AND run_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY seq) = 1
), n AS (
    SELECT run_id, count(*) AS entries, min(seq) AS first_seq, min(ts) AS first_ts,
           any_value(agent) AS any_agent
    FROM entries WHERE run_id IS NOT NULL GROUP BY run_id
)
SELECT
    n.run_id,
    coalesce(o.agent, n.any_agent) AS agent,
    o.run_kind AS kind,
    coalesce(s.status, 'open') AS status,
    coalesce(o.ts, CAST(n.first_ts AS TIMESTAMPTZ)) AS started_at,
    s.ts AS finished_at,
    n.entries
FROM n
LEFT JOIN o USING (run_id)
LEFT JOIN s USING (run_id)
ORDER BY n.first_seq
"""

VIEWS_SQL: tuple[str, ...] = (_JOURNAL, _DECISIONS, _TOOL_CALLS, _RUNS)


def create_views(con: object) -> None:
    """(Re)create every view on a DuckDB connection that has an ``entries`` table."""
    for sql in VIEWS_SQL:
        con.execute(sql)  # type: ignore[attr-defined]


_RUN_COLUMNS = ("run_id", "agent", "kind", "status", "started_at", "finished_at", "entries")


def _utc(value: Any) -> str | None:
    if not isinstance(value, datetime):
        return value
    return value.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def list_runs(journal: Any) -> list[dict[str, Any]]:
    """The ``runs`` view as JSON-ready rows, oldest first (times in UTC, ``...Z``)."""
    rows = journal.sql(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs")
    return [{k: _utc(v) for k, v in zip(_RUN_COLUMNS, row, strict=True)} for row in rows]


def bundle_sql() -> str:
    """A script for the ``duckdb`` CLI that maps a bundle's Parquet files and adds the views."""
    head = (
        "-- Run inside an exported audit bundle:  duckdb -init views.sql\n"
        "CREATE OR REPLACE VIEW entries AS SELECT * FROM read_parquet('entries.parquet');\n"
        "CREATE OR REPLACE VIEW checkpoints AS SELECT * FROM read_parquet('checkpoints.parquet');\n"
        "-- The payload fields the views read (journal.db keeps them as a table):\n"
        "CREATE OR REPLACE VIEW entry_fields AS" + _FIELDS_SELECT.replace("{where}", "").rstrip() + ";\n"
    )
    return head + "".join(sql.strip() + ";\n" for sql in VIEWS_SQL)
