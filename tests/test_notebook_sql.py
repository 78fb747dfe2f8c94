"""``%%apollia sql``: read-only SQL over the journal's views, in the kernel that holds ``journal.db``."""

from __future__ import annotations

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
