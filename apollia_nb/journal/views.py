"""The auditor's SQL views over the ``entries`` table.

Created (``CREATE OR REPLACE``) when the journal opens and finds them missing or
made from other SQL than this module's (``meta.views`` names the SQL they were
made from, so an open of an unchanged journal makes none), and written into an
exported bundle as ``views.sql`` over ``entries.parquet``, so the same queries
work on a live ``journal.db`` and on an offline bundle (``apollia-os audit views``
prints the same script from the auditor's own install). Views only read; the raw
hashed bytes stay in ``entries``.

The payload fields the views expose are kept typed in ``entry_fields`` (one row
per entry of the kinds the views read), filled from the stored payload bytes by
the same transaction that copies the entries into ``journal.db``; so an
auditor's query is a scan of typed columns, not JSON parsing. ``entries`` stays
the source of truth: in a bundle, ``entry_fields`` is a view computing the same
columns from ``entries.parquet``, and verification reads only ``entries``.

The same transaction keeps ``calls`` (one row per call: its first decision, answer,
``tool_call`` and ``tool_result``), so ``tool_calls`` is a scan of one row per call;
in a bundle ``calls`` is a view grouping ``entry_fields`` the same way.

``ts`` columns are ``TIMESTAMPTZ`` (the stored text is UTC with ``Z``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "VIEW_NAMES", "VIEWS_SQL", "ENTRY_FIELDS_DDL", "CALLS_DDL", "FIELD_KINDS", "create_views", "copy_entry_fields",
    "rebuild_calls", "bundle_sql", "list_runs", "list_oversight", "OVERSIGHT_COLUMNS",
]

VIEW_NAMES = ("journal", "decisions", "tool_calls", "runs", "oversight", "erased")

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

#: The payload fields ``entry_fields`` keeps, in the order of ``_FIELDS_SELECT``'s list.
_PAYLOAD_FIELDS = ("call_id", "tool", "family", "outcome", "line", "answer", "answered_by", "status",
                   "error_code", "run_kind")

# One ``json_extract_string`` with a list of paths parses each payload once; an extraction per
# field parses it once per field, and DuckDB's memory for that grows with the payload (measured:
# 1,000 entries of 2 KB past a 64 MB cap).
_FIELDS_SELECT = """
SELECT seq, kind, CAST(ts AS TIMESTAMPTZ) AS ts, run_id, agent,
       f[1] AS call_id, f[2] AS tool, f[3] AS family, f[4] AS outcome,
       TRY_CAST(f[5] AS INTEGER) AS line, f[6] AS answer, f[7] AS answered_by,
       f[8] AS status, f[9] AS error_code, f[10] AS run_kind
FROM (SELECT seq, kind, ts, run_id, agent, json_extract_string(CAST(decode(payload) AS JSON), [{paths}]) AS f
      FROM entries WHERE kind IN ({kinds}){where})
""".replace("{kinds}", ", ".join(f"'{k}'" for k in FIELD_KINDS)).replace(
    "{paths}", ", ".join(f"'$.{k}'" for k in _PAYLOAD_FIELDS))


#: ``calls``: one row per call (per ``run_id`` and ``call_id``; entries with no ``call_id``
#: form one row per run and kind), with the first decision, answer, ``tool_call`` and
#: ``tool_result`` of that call — each group of columns taken from the entry at its ``*_seq``.
_CALL_PARTS: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    # (kind, seq column, ((column, type, entry_fields expression), ...))
    ("decision", "decision_seq", (("decided_at", "TIMESTAMPTZ", "ts"), ("decision_tool", "VARCHAR", "tool"),
                                  ("family", "VARCHAR", "family"), ("outcome", "VARCHAR", "outcome"))),
    ("answer", "answer_seq", (("answer", "VARCHAR", "answer"), ("answered_by", "VARCHAR", "answered_by"))),
    ("tool_call", "call_seq", (("started_at", "TIMESTAMPTZ", "ts"), ("call_tool", "VARCHAR", "tool"))),
    ("tool_result", "result_seq", (("finished_at", "TIMESTAMPTZ", "ts"), ("result_tool", "VARCHAR", "tool"),
                                   ("status", "VARCHAR", "status"), ("error_code", "VARCHAR", "error_code"))),
)
#: Columns computed from the stored ones (virtual in journal.db, computed in a bundle).
_CALL_DERIVED = (("tool", "VARCHAR", "coalesce(call_tool, result_tool, decision_tool)"),
                 ("duration", "INTERVAL", "finished_at - started_at"))
_CALL_STORED = ["k", "run_id", "call_id"] + [c for _, seq, cols in _CALL_PARTS for c in (seq, *(n for n, _, _ in cols))]

CALLS_DDL = "CREATE TABLE IF NOT EXISTS calls (\n        k VARCHAR PRIMARY KEY,\n        run_id VARCHAR,\n" \
    "        call_id VARCHAR,\n" + "".join(
        f"        {seq} BIGINT,\n" + "".join(f"        {n} {t},\n" for n, t, _ in cols) for _, seq, cols in _CALL_PARTS
    ) + ",\n".join(f"        {n} {t} GENERATED ALWAYS AS ({e}) VIRTUAL" for n, t, e in _CALL_DERIVED) + ")"

_CALLS_SELECT = (
    "\nSELECT to_json([run_id, call_id, CASE WHEN call_id IS NULL THEN kind END])::VARCHAR AS k,\n"
    "       any_value(run_id) AS run_id, any_value(call_id) AS call_id,\n"
    + ",\n".join(
        f"       min(seq) FILTER (WHERE kind = '{kind}') AS {seq},\n"
        + ",\n".join(f"       arg_min_null({e}, seq) FILTER (WHERE kind = '{kind}') AS {n}" for n, _, e in cols)
        for kind, seq, cols in _CALL_PARTS)
    + "\nFROM entry_fields WHERE kind IN ('decision', 'answer', 'tool_call', 'tool_result'){where}\n"
    "GROUP BY run_id, call_id, CASE WHEN call_id IS NULL THEN kind END\n"
)

# Entries are copied in seq order, so a call's first entry of a kind is the one copied first:
# a later copy fills a group of columns only where its seq is still NULL.
_CALLS_MERGE = (
    f"INSERT INTO calls ({', '.join(_CALL_STORED)})" + _CALLS_SELECT.replace("{where}", " AND seq BETWEEN ? AND ?")
    + "ON CONFLICT (k) DO UPDATE SET " + ", ".join(
        f"{c} = CASE WHEN calls.{seq} IS NULL THEN excluded.{c} ELSE calls.{c} END"
        for _, seq, cols in _CALL_PARTS for c in (*(n for n, _, _ in cols), seq))
)


def copy_entry_fields(con: Any, first: int | None = None, last: int | None = None) -> None:
    """Fill ``entry_fields`` and ``calls`` from the stored entries with seq ``first..last`` (default: all).

    Runs inside the caller's transaction (the one that copies those entries); ``first..last``
    must come after every entry already copied (entries are copied in seq order)."""
    if first is None:
        con.execute("INSERT INTO entry_fields " + _FIELDS_SELECT.replace("{where}", ""))
        rebuild_calls(con)
    else:
        con.execute("INSERT INTO entry_fields " + _FIELDS_SELECT.replace("{where}", " AND seq BETWEEN ? AND ?"),
                    [first, last])
        con.execute(_CALLS_MERGE, [first, last])


def rebuild_calls(con: Any, step: int = 65_536) -> None:
    """Recompute ``calls`` from ``entry_fields`` (inside the caller's transaction).

    Merged range by range in seq order, as copies merge them, so the memory it needs is
    that of ``step`` entries however long the journal is."""
    con.execute("DELETE FROM calls")
    (last,) = con.execute("SELECT coalesce(max(seq), 0) FROM entry_fields").fetchone()
    for first in range(1, last + 1, step):
        con.execute(_CALLS_MERGE, [first, min(last, first + step - 1)])


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

#: ``erased``: one row per payload field erased from an entry (``audit erase``: its value and salt gone,
#: its commitment kept); in ``journal``'s payload such a field is absent, so reading it gives NULL.
_ERASED = """
CREATE OR REPLACE VIEW erased AS
SELECT seq, CAST(ts AS TIMESTAMPTZ) AS ts, run_id, agent, kind, unnest(json_keys(p, '$."@erased"')) AS field
FROM (SELECT seq, ts, run_id, agent, kind, CAST(decode(payload) AS JSON) AS p FROM entries
      WHERE contains(decode(payload), '"@erased":'))
WHERE json_exists(p, '$."@salts"') AND json_exists(p, '$."@erased"')
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
SELECT
    run_id,
    call_id,
    coalesce(call_tool, result_tool) AS tool,
    coalesce(status, 'running') AS status,
    error_code,
    started_at,
    finished_at
FROM calls
WHERE call_seq IS NOT NULL OR result_seq IS NOT NULL
ORDER BY coalesce(call_seq, result_seq)
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

#: ``oversight``: one row per answer a person gave to a card (``answer``), per approval short of the
#: approvers a policy needs (``approval``) and per answer refused (``answer_refused``): which card, when
#: it was asked (the call's first ``ask`` decision), when and by whom it was answered, their role and how
#: they authenticated, how long the card waited, and the digest of what they were shown (NULL where the
#: entry names none). A plan's approval or rejection (a ``plan`` entry carrying ``approved``) is a row too:
#: ``event`` ``plan``, ``card`` the task, ``answer`` ``approve`` or ``reject``, asked when the plan it
#: answers was journaled (the task's last ``plan`` entry before it without ``approved``), ``digest`` the
#: plan's digest. Answers are few beside calls, so their fields are read from the payload here.
_OVERSIGHT = """
CREATE OR REPLACE VIEW oversight AS
WITH a AS (
    SELECT seq, kind, CAST(ts AS TIMESTAMPTZ) AS ts, run_id, agent,
           json_extract_string(CAST(decode(payload) AS JSON), ['$.decision_id', '$.call_id', '$.answer',
               '$.answered_by', '$.by', '$.by_role', '$.auth', '$.digest', '$.for', '$.until', '$.code']) AS f
    FROM entries WHERE kind IN ('answer', 'approval', 'answer_refused')
), d AS (
    SELECT run_id, call_id, ts, tool, family
    FROM entry_fields WHERE kind = 'decision' AND outcome = 'ask'
    QUALIFY row_number() OVER (PARTITION BY run_id, call_id ORDER BY seq) = 1
), p AS (
    SELECT seq, ts, run_id, agent, f,
           last_value(CASE WHEN f[2] IS NULL THEN ts END IGNORE NULLS) OVER (
               PARTITION BY run_id, f[1] ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS asked
    FROM (SELECT seq, CAST(ts AS TIMESTAMPTZ) AS ts, run_id, agent,
                 json_extract_string(CAST(decode(payload) AS JSON), ['$.task_id', '$.approved', '$.by',
                     '$.by_role', '$.auth', '$.digest']) AS f
          FROM entries WHERE kind = 'plan')
)
SELECT
    a.seq,
    a.f[1] AS card,
    a.kind AS event,
    a.run_id,
    a.agent,
    d.tool,
    d.family,
    d.ts AS asked_at,
    a.ts AS answered_at,
    a.ts - d.ts AS waited,
    a.f[3] AS answer,
    coalesce(a.f[4], a.f[5]) AS answered_by,
    a.f[6] AS by_role,
    a.f[7] AS auth,
    a.f[8] AS digest,
    a.f[9] AS consent_for,
    CAST(a.f[10] AS TIMESTAMPTZ) AS consent_until,
    a.f[11] AS refused_code
FROM a
LEFT JOIN d
  ON d.run_id IS NOT DISTINCT FROM a.run_id AND d.call_id = a.f[2]
UNION ALL
SELECT
    p.seq,
    p.f[1] AS card,
    'plan' AS event,
    p.run_id,
    p.agent,
    NULL AS tool,
    NULL AS family,
    p.asked AS asked_at,
    p.ts AS answered_at,
    p.ts - p.asked AS waited,
    CASE p.f[2] WHEN 'true' THEN 'approve' ELSE 'reject' END AS answer,
    p.f[3] AS answered_by,
    p.f[4] AS by_role,
    p.f[5] AS auth,
    p.f[6] AS digest,
    NULL AS consent_for,
    NULL AS consent_until,
    NULL AS refused_code
FROM p
WHERE p.f[2] IS NOT NULL
ORDER BY seq
"""

VIEWS_SQL: tuple[str, ...] = (_JOURNAL, _DECISIONS, _TOOL_CALLS, _RUNS, _OVERSIGHT, _ERASED)


#: The SQL the views are made from, as ``meta.views`` records it.
VIEWS_DIGEST = hashlib.sha256("\n".join(VIEWS_SQL).encode()).hexdigest()[:32]


def create_views(con: Any) -> None:
    """(Re)create every view on a DuckDB connection whose database has ``entries`` and ``meta``, unless all
    of them are there, made from this SQL (recreating them costs more than the rest of an open's checks)."""
    made = con.execute("SELECT value FROM meta WHERE key = 'views'").fetchone()
    if made is not None and made[0] == VIEWS_DIGEST:
        marks = ", ".join("?" for _ in VIEW_NAMES)
        (present,) = con.execute(
            f"SELECT count(*) FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
            f"AND view_name IN ({marks})", list(VIEW_NAMES)).fetchone()
        if present == len(VIEW_NAMES):
            return
    for sql in VIEWS_SQL:
        con.execute(sql)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('views', ?)", [VIEWS_DIGEST])


_RUN_COLUMNS = ("run_id", "agent", "kind", "status", "started_at", "finished_at", "entries")


def _utc(value: Any) -> str | None:
    if not isinstance(value, datetime):
        return value
    return value.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def list_runs(journal: Any) -> list[dict[str, Any]]:
    """The ``runs`` view as JSON-ready rows, oldest first (times in UTC, ``...Z``)."""
    rows = journal.sql(f"SELECT {', '.join(_RUN_COLUMNS)} FROM runs")
    return [{k: _utc(v) for k, v in zip(_RUN_COLUMNS, row, strict=True)} for row in rows]


#: The columns ``list_oversight`` returns (``waited_seconds``: the view's ``waited`` in seconds).
OVERSIGHT_COLUMNS = ("seq", "card", "event", "run_id", "agent", "tool", "family", "asked_at", "answered_at",
                     "waited_seconds", "answer", "answered_by", "by_role", "auth", "digest", "consent_for",
                     "consent_until", "refused_code")


def list_oversight(journal: Any, *, since_seq: int | None = None, since: datetime | None = None) -> list[dict[str, Any]]:
    """The ``oversight`` view as JSON-ready rows, oldest first: those after entry ``since_seq``, or answered at
    or after ``since`` (times in UTC, ``...Z``)."""
    where: list[str] = []
    params: list[Any] = []
    if since_seq is not None:
        where.append("seq > ?")
        params.append(int(since_seq))
    if since is not None:
        where.append("answered_at >= CAST(? AS TIMESTAMPTZ)")
        params.append(since.astimezone(timezone.utc).isoformat())
    select = ", ".join("epoch(waited) AS waited_seconds" if c == "waited_seconds" else c for c in OVERSIGHT_COLUMNS)
    rows = journal.sql(f"SELECT {select} FROM oversight" + (" WHERE " + " AND ".join(where) if where else "")
                       + " ORDER BY seq", params or None)
    return [{k: _utc(v) for k, v in zip(OVERSIGHT_COLUMNS, row, strict=True)} for row in rows]


def bundle_sql(directory: Any = None) -> str:
    """A script for the ``duckdb`` CLI that maps a bundle's Parquet files and adds the views.

    The Parquet files are named relative to the bundle (run it there), or by their absolute path
    inside ``directory`` when one is given (``apollia-os audit views --bundle DIR``). The script
    is SQL only: no dot-command, nothing that writes, attaches or installs."""
    def parquet(name: str) -> str:
        if directory is None:
            return f"'{name}'"
        from pathlib import Path

        return "'" + str(Path(directory).resolve() / name).replace("'", "''") + "'"

    head = (
        "-- The audit bundle's views, from apollia-os:  duckdb -cmd \"$(apollia-os audit views --bundle .)\"\n"
        f"CREATE OR REPLACE VIEW entries AS SELECT * FROM read_parquet({parquet('entries.parquet')});\n"
        f"CREATE OR REPLACE VIEW checkpoints AS SELECT * FROM read_parquet({parquet('checkpoints.parquet')});\n"
        "-- The payload fields the views read (journal.db keeps them as a table):\n"
        "CREATE OR REPLACE VIEW entry_fields AS" + _FIELDS_SELECT.replace("{where}", "").rstrip() + ";\n"
        "-- One row per call (journal.db keeps it as a table):\n"
        "CREATE OR REPLACE VIEW calls AS SELECT *, "
        + ", ".join(f"{e} AS {n}" for n, _, e in _CALL_DERIVED)
        + " FROM (" + _CALLS_SELECT.replace("{where}", "").strip() + ");\n"
    )
    return head + "".join(sql.strip() + ";\n" for sql in VIEWS_SQL)
