"""The auditor's SQL views over the ``entries`` table.

Created (``CREATE OR REPLACE``) each time the journal opens, and written into an
exported bundle as ``views.sql`` over ``entries.parquet``, so the same queries
work on a live ``journal.db`` and on an offline bundle. Views only read; the raw
hashed bytes stay in ``entries``.

``ts`` columns are ``TIMESTAMPTZ`` (the stored text is UTC with ``Z``). Payload
fields are read with DuckDB's JSON operators from the canonical payload bytes.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

__all__ = ["VIEW_NAMES", "VIEWS_SQL", "create_views", "bundle_sql", "list_runs"]

VIEW_NAMES = ("journal", "decisions", "tool_calls", "runs")

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
WITH d AS (
    SELECT seq, ts, run_id, agent, CAST(decode(payload) AS JSON) AS p
    FROM entries WHERE kind = 'decision'
), a AS (
    SELECT run_id, p->>'call_id' AS call_id, p->>'answer' AS answer,
           p->>'answered_by' AS answered_by
    FROM (SELECT seq, run_id, CAST(decode(payload) AS JSON) AS p
          FROM entries WHERE kind = 'answer')
    QUALIFY row_number() OVER (PARTITION BY run_id, p->>'call_id' ORDER BY seq) = 1
)
SELECT
    d.seq,
    CAST(d.ts AS TIMESTAMPTZ) AS ts,
    d.run_id,
    d.agent,
    d.p->>'tool' AS tool,
    d.p->>'family' AS family,
    d.p->>'outcome' AS outcome,
    TRY_CAST(d.p->>'line' AS INTEGER) AS line,
    a.answer,
    a.answered_by
FROM d
LEFT JOIN a
  ON a.run_id IS NOT DISTINCT FROM d.run_id AND a.call_id = (d.p->>'call_id')  -- DuckDB 1.x: = binds before ->>
ORDER BY d.seq
"""

_TOOL_CALLS = """
CREATE OR REPLACE VIEW tool_calls AS
WITH c AS (
    SELECT run_id, p->>'call_id' AS call_id, p->>'tool' AS tool, ts, seq
    FROM (SELECT seq, ts, run_id, CAST(decode(payload) AS JSON) AS p
          FROM entries WHERE kind = 'tool_call')
    QUALIFY row_number() OVER (PARTITION BY run_id, p->>'call_id' ORDER BY seq) = 1
), r AS (
    SELECT run_id, p->>'call_id' AS call_id, p->>'tool' AS tool,
           p->>'status' AS status, p->>'error_code' AS error_code, ts, seq
    FROM (SELECT seq, ts, run_id, CAST(decode(payload) AS JSON) AS p
          FROM entries WHERE kind = 'tool_result')
    QUALIFY row_number() OVER (PARTITION BY run_id, p->>'call_id' ORDER BY seq) = 1
)
SELECT
    coalesce(c.run_id, r.run_id) AS run_id,
    coalesce(c.call_id, r.call_id) AS call_id,
    coalesce(c.tool, r.tool) AS tool,
    coalesce(r.status, 'running') AS status,
    r.error_code,
    CAST(c.ts AS TIMESTAMPTZ) AS started_at,
    CAST(r.ts AS TIMESTAMPTZ) AS finished_at
FROM c
FULL OUTER JOIN r
  ON r.run_id IS NOT DISTINCT FROM c.run_id AND r.call_id = c.call_id
ORDER BY coalesce(c.seq, r.seq)
"""

_RUNS = """
CREATE OR REPLACE VIEW runs AS
WITH o AS (
    SELECT run_id, agent, CAST(decode(payload) AS JSON)->>'run_kind' AS run_kind, ts
    FROM entries WHERE kind = 'run_open' AND run_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY seq) = 1
), s AS (
    SELECT run_id, CAST(decode(payload) AS JSON)->>'status' AS status, ts
    FROM entries WHERE kind = 'run_seal' AND run_id IS NOT NULL
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
    CAST(coalesce(o.ts, n.first_ts) AS TIMESTAMPTZ) AS started_at,
    CAST(s.ts AS TIMESTAMPTZ) AS finished_at,
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
    )
    return head + "".join(sql.strip() + ";\n" for sql in VIEWS_SQL)
