"""``%%apollia sql``: read-only SQL over the journal's views, in the kernel that holds ``journal.db``."""

from __future__ import annotations

import http.server
import threading

import pytest

from apollia_nb.errors import BadInput
from apollia_nb.notebook.handles import SqlRows
from apollia_nb.notebook.magics import ApolliaMagicError
from apollia_nb.notebook.sql import check_read_only
from runtime_helpers import call, manifest

WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]


from notebook_fixtures import ip  # noqa: F401 - the fixture


@pytest.fixture
def ran(ip):
    """A completed task whose write was asked and answered once."""
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk", "write").join(10, settled=True)
    task.pending[0].answer("once")
    return task.join(10)


def journal(ip):
    return ip.magics_manager.registry["ApolliaMagics"].runtime.rt.journal


@pytest.mark.parametrize("query", [
    "DELETE FROM entries",
    "INSERT INTO entries SELECT * FROM entries",
    "UPDATE entries SET agent = 'x'",
    "DROP VIEW decisions",
    "DROP TABLE entries",
    "CREATE TABLE copy AS SELECT * FROM entries",
    "ATTACH '{tmp}/other.db' AS other",
    "COPY (SELECT * FROM journal) TO '{tmp}/out.csv'",
    "COPY entries TO '{tmp}/out.csv'",
    "EXPORT DATABASE '{tmp}/dump'",
    "SELECT 1; DELETE FROM entries",
    "SELECT 1; SELECT 2",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "SET threads = 1",
    "BEGIN TRANSACTION",
    "CHECKPOINT",
    "LOAD json",
    "EXPLAIN ANALYZE DELETE FROM entries",
    "VACUUM",
])
def test_anything_but_one_read_query_is_refused_and_nothing_is_written(ip, ran, tmp_path, query):
    query = query.format(tmp=tmp_path)
    before = journal(ip).sql("SELECT count(*), max(seq) FROM entries")
    with pytest.raises(ApolliaMagicError) as info:
        ip.run_cell_magic("apollia", "sql", query)
    assert info.value.code == "BAD_INPUT"
    assert info.value._render_traceback_()[0].startswith("BAD_INPUT: ")
    assert journal(ip).sql("SELECT count(*), max(seq) FROM entries") == before
    views = {name for (name,) in journal(ip).sql("SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert {"decisions", "journal", "runs", "tool_calls"} <= views
    tables = {name for (name,) in journal(ip).sql("SELECT table_name FROM duckdb_tables()")}
    assert "copy" not in tables and "entries" in tables
    assert list(tmp_path.glob("out.csv")) == [] and not (tmp_path / "other.db").exists()
    assert not (tmp_path / "dump").exists()
    assert ip.run_line_magic("apollia", "verify").ok


def test_refusals_say_why():
    assert "DELETE statements are refused" in str_error(check_read_only, "delete from entries")
    assert "one statement per cell, found 2" in str_error(check_read_only, "select 1; select 2")
    assert "no SQL query" in str_error(check_read_only, "   ")
    assert "does not parse" in str_error(check_read_only, "SELEKT 1")


def str_error(fn, *args) -> str:
    with pytest.raises(BadInput) as info:
        fn(*args)
    return info.value.message


@pytest.mark.parametrize("query", [
    "SELECT * FROM decisions",
    "  with d as (select * from decisions) select * from d  ",
    "FROM decisions",
    "DESCRIBE decisions",
    "SHOW TABLES",
    "SUMMARIZE decisions",
    "EXPLAIN SELECT * FROM decisions",
    "SELECT 'a;b' AS semicolons -- a comment; DELETE FROM entries",
])
def test_read_queries_pass_the_check(query):
    assert check_read_only(query)


def test_a_select_returns_a_dataframe_with_the_rows(ip, ran, capsys):
    pytest.importorskip("pandas")
    frame = ip.run_cell_magic("apollia", "sql",
                             "SELECT tool, family, outcome, line, answer, answered_by FROM decisions "
                             f"WHERE run_id = '{ran.run_id}' ORDER BY seq")
    assert list(frame.columns) == ["tool", "family", "outcome", "line", "answer", "answered_by"]
    user = ip.magics_manager.registry["ApolliaMagics"].runtime.user
    assert frame.to_dict("records") == [
        {"tool": "write_file", "family": "write", "outcome": "ask", "line": 6, "answer": "once", "answered_by": user}
    ]
    assert capsys.readouterr().out.strip() == "1 row"
    runs = ip.run_cell_magic("apollia", "sql", "SELECT run_id, status FROM runs")
    assert runs.to_dict("records") == [{"run_id": ran.run_id, "status": "completed"}]
    assert capsys.readouterr().out.strip() == "1 row"


def test_without_pandas_rows_come_back_as_a_list_with_an_html_table(ip, ran, capsys, monkeypatch):
    import apollia_nb.notebook.sql as sql

    monkeypatch.setattr(sql, "_has_pandas", lambda: False)
    rows = ip.run_cell_magic("apollia", "sql", "SELECT kind, count(*) AS n FROM journal GROUP BY kind ORDER BY kind")
    assert isinstance(rows, SqlRows)
    assert rows.columns == ["kind", "n"]
    counted = dict(rows)
    assert counted["decision"] == 1 and counted["run_seal"] == 1
    html = rows._repr_html_()
    assert "<table" in html and f"{len(rows)} rows" in html
    assert f"({len(rows)} rows)" in repr(rows)


def test_a_failing_query_is_bad_input_and_the_journal_goes_on(ip, ran):
    with pytest.raises(ApolliaMagicError) as info:
        ip.run_cell_magic("apollia", "sql", "SELECT no_such_column FROM journal")
    assert info.value.code == "BAD_INPUT" and "the query failed" in info.value.message
    ip.run_cell_magic("apollia", "agent", manifest("scribe"))
    assert ip.run_cell_magic("apollia", "task scribe", "after").join(10).status == "completed"


def test_sql_is_a_cell_magic(ip):
    with pytest.raises(ApolliaMagicError) as info:
        ip.run_line_magic("apollia", "sql")
    assert info.value.code == "BAD_INPUT"


# --- the SQL surface reads the journal and nothing else -------------------------------------------

OUTSIDE = "only the journal's tables and views can be read here"


def refused(ip, query: str, line: str = "sql") -> str:
    """The one-line ``BAD_INPUT`` a cell gets for ``query`` (no traceback)."""
    with pytest.raises(ApolliaMagicError) as info:
        ip.run_cell_magic("apollia", line, query)
    assert info.value.code == "BAD_INPUT"
    [line] = info.value._render_traceback_()
    assert line.startswith("BAD_INPUT: ") and "\n" not in line
    return info.value.message


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT content FROM read_text('/etc/hostname')",
    "SELECT * FROM read_csv('/etc/passwd', sep = ':', header = false)",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_json('/etc/passwd')",
    "SELECT * FROM read_parquet('/etc/passwd')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT file FROM glob('{home}/keys/*')",
    "SELECT content FROM read_blob('{home}/keys/journal.key')",
    "SELECT * FROM read_text('{home}/apollia.toml')",
    "SELECT * FROM journal, read_text('/etc/passwd') LIMIT 1",
    "WITH f AS (SELECT * FROM read_text('/etc/passwd')) SELECT count(*) FROM decisions, f",
])
def test_a_select_cannot_read_a_file(ip, ran, home, query):
    message = refused(ip, query.format(home=home.path))
    assert OUTSIDE in message
    assert "root:" not in message and "PRIVATE" not in message
    assert ip.run_line_magic("apollia", "verify").ok


def test_a_python_variable_is_not_scanned_by_name(ip, ran):
    pd = pytest.importorskip("pandas")
    ip.user_ns["secrets_frame"] = pd.DataFrame({"x": ["s3cr3t"]})
    message = refused(ip, "SELECT * FROM secrets_frame")
    assert "s3cr3t" not in message


@pytest.mark.parametrize("query", [
    "COPY (SELECT * FROM journal) TO '{tmp}/x.csv'",
    "ATTACH '{tmp}/x.db' AS x",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "EXPORT DATABASE '{tmp}/x'",
    "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')",
    "CALL read_text('/etc/passwd')",
    "DELETE FROM journal",
    "SELECT 1; SELECT * FROM read_text('/etc/passwd')",
])
def test_statements_that_reach_outside_are_refused_and_create_nothing(ip, ran, tmp_path, query):
    refused(ip, query.format(tmp=tmp_path))
    assert list(tmp_path.glob("x*")) == []
    cursor = journal(ip).cursor()
    try:
        assert cursor.execute("SELECT current_setting('enable_external_access')").fetchone() == (False,)
    finally:
        cursor.close()


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/csv")
        self.end_headers()
        self.wfile.write(b"a,b\n1,2\n")

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def recorder():
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    handler = type("Recorder", (_Recorder,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_csv('{url}/data.csv')",
    "SELECT * FROM '{url}/data.csv'",
    "SELECT * FROM read_parquet('{url}/data.parquet')",
    "SELECT * FROM read_text('{url}/data.txt')",
])
def test_a_url_is_never_fetched(ip, ran, recorder, query):
    url, seen = recorder
    message = refused(ip, query.format(url=url))
    assert OUTSIDE in message or "does not exist" in message
    assert seen == []


def test_the_journal_views_still_answer_joins_and_aggregates(ip, ran):
    pytest.importorskip("pandas")
    frame = ip.run_cell_magic("apollia", "sql", """
        SELECT r.run_id, r.status, count(d.seq) AS decisions, count(t.call_id) AS calls,
               max(j.seq) AS last_seq
        FROM runs r
        LEFT JOIN decisions d USING (run_id)
        LEFT JOIN tool_calls t USING (run_id)
        JOIN journal j USING (run_id)
        GROUP BY ALL""")
    [row] = frame.to_dict("records")
    assert row["run_id"] == ran.run_id and row["status"] == "completed" and row["decisions"] > 0
    described = ip.run_cell_magic("apollia", "sql", "SELECT * FROM query_table('decisions')")
    assert len(described) == 1


def test_a_null_is_none_in_the_frame_and_in_the_rows(ip, ran, monkeypatch):
    pytest.importorskip("pandas")
    query = ("SELECT * FROM (VALUES (1, 'a', 1.5, TIMESTAMPTZ '2026-01-01 00:00:00+00'), "
             "(NULL, NULL, NULL, NULL)) t(i, s, f, ts)")
    frame = ip.run_cell_magic("apollia", "sql", query)
    assert frame.to_dict("records")[1] == {"i": None, "s": None, "f": None, "ts": None}
    assert "NaN" not in frame.to_string() and "NaT" not in frame.to_string() and "<NA>" not in frame.to_string()
    assert frame["i"].iloc[0] == 1
    answers = ip.run_cell_magic("apollia", "sql", "SELECT answer FROM decisions WHERE answer IS NULL "
                                "UNION ALL SELECT NULL")
    assert answers["answer"].tolist() == [None]

    import apollia_nb.notebook.sql as sql

    monkeypatch.setattr(sql, "_has_pandas", lambda: False)
    rows = ip.run_cell_magic("apollia", "sql", query)
    assert rows[1] == (None, None, None, None)
    assert "<td></td>" in rows._repr_html_()


def test_a_long_query_is_stopped_at_its_timeout_and_the_journal_goes_on(ip, ran):
    import time

    began = time.monotonic()
    message = refused(ip, "SELECT count(*) FROM range(1000000000000) a", "sql --timeout 0.5")
    assert "ran longer than 0.5 s" in message and time.monotonic() - began < 30
    assert ip.run_cell_magic("apollia", "sql", "SELECT count(*) AS n FROM runs")["n"].tolist() == [1]
    assert "positive" in refused(ip, "SELECT 1", "sql --timeout -1")
