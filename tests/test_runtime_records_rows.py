"""runtime.db: a group's rows of one table are written by one statement, each row as its last write."""

from __future__ import annotations

import pytest

from apollia_nb.errors import Conflict
from apollia_nb.runtime.records import ROWS_MAX, UPDATE_ROWS_MIN, RuntimeRecords
from test_runtime_records_group import _held, _record, _rows


class _Statements:
    """The real connection of a ``RuntimeRecords``, keeping each statement that writes rows."""

    def __init__(self, con) -> None:
        self._con = con
        self.writes: list[str] = []

    def execute(self, sql: str, *args):
        if sql.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            self.writes.append(sql)
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)

    def into(self, table: str) -> list[str]:
        """The writing statements of ``table``."""
        return [s for s in self.writes if f" {table} " in f" {s} " or f" {table}(" in s]


@pytest.fixture
def records(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    records._con = _Statements(records._con)
    yield records
    records.close()


def test_keys_taken_and_answered_in_one_group_are_two_statements_and_each_row_is_its_last_write(home, records):
    """Twenty keys taken, then answered, and twenty tasks submitted while the writer is busy: one
    statement for the keys taken, one for their answers, one for the tasks (not one per row)."""
    spy = records._con
    _, release = _held(records)
    futures = [records.remember_response("decide", f"k{i}", "fp", 0, {}, float(i), new_row=True)
               for i in range(20)]
    futures += [records.remember_response("decide", f"k{i}", "fp", 200, {"i": i}, float(i)) for i in range(20)]
    futures += [records.save_task(_record(f"t{i}"), "2026-12-07T00:00:00Z", acknowledged=True) for i in range(20)]
    release.set()
    assert [f.result(10) for f in futures] == [None] * 60
    assert len(spy.into("idempotency")) == 2
    assert len(spy.into("tasks")) == 1
    records.flush()
    records.close()
    assert _rows(home, "SELECT key, status, response FROM idempotency ORDER BY created_at, key") == [
        (f"k{i}", 200, f'{{"i": {i}}}') for i in range(20)]
    assert _rows(home, "SELECT count(*) FROM tasks") == [(20,)]


def test_a_row_written_twice_in_a_group_starts_a_new_statement_and_its_last_write_wins(home, records):
    """Keys k0 … k5 answered, then k0 … k5 answered again, in one group: a statement cannot write one
    row twice, so the second answers are a statement of their own, after the first: each key holds
    its last answer."""
    spy = records._con
    count = max(UPDATE_ROWS_MIN, 6)
    taken = [records.remember_response("s", f"k{i}", "fp", 0, {}, 1.0, new_row=True) for i in range(count)]
    assert [f.result(10) for f in taken] == [None] * count
    _, release = _held(records)
    futures = [records.remember_response("s", f"k{i}", "fp", 200, {"n": 1}, 1.0) for i in range(count)]
    futures += [records.remember_response("s", f"k{i}", "fp", 200, {"n": 2}, 2.0) for i in range(count)]
    release.set()
    assert [f.result(10) for f in futures] == [None] * 2 * count
    assert len([s for s in spy.into("idempotency") if s.startswith("UPDATE")]) == 2
    assert all(records.remembered_response("s", f"k{i}") == (200, {"n": 2}) for i in range(count))


def test_a_task_submitted_twice_among_new_rows_of_a_group_is_conflict_and_the_others_commit(home, records):
    """One statement for the new rows fails on the row that is there already: the group is rolled
    back and each written on its own, so only that submit is CONFLICT and its row stays as it was."""
    assert records.save_task(_record("t1"), "2026-12-07T00:00:00Z", acknowledged=True).result(10) is None
    spy = records._con
    _, release = _held(records)
    futures = {tid: records.save_task(_record(tid, "running"), "2026-12-07T00:00:01Z", acknowledged=True)
               for tid in ("t2", "t1", "t3")}
    release.set()
    assert futures["t2"].result(10) is None and futures["t3"].result(10) is None
    with pytest.raises(Conflict):
        futures["t1"].result(10)
    assert any(s.count("(?, ?, ?, ?, ?)") == 3 for s in spy.into("tasks"))  # tried as one statement first
    assert {t["id"]: t["status"] for t in records.tasks()} == {"t1": "pending", "t2": "running", "t3": "running"}


def test_a_few_rows_to_update_are_updated_one_by_one(home, records):
    """Fewer than ``UPDATE_ROWS_MIN`` rows to update: one ``UPDATE`` each (cheaper than one of them all)."""
    spy = records._con
    count = UPDATE_ROWS_MIN - 1
    taken = [records.remember_response("s", f"k{i}", "fp", 0, {}, 1.0, new_row=True) for i in range(count)]
    assert [f.result(10) for f in taken] == [None] * count
    _, release = _held(records)
    futures = [records.remember_response("s", f"k{i}", "fp", 200, {"i": i}, 2.0) for i in range(count)]
    release.set()
    assert [f.result(10) for f in futures] == [None] * count
    assert len([s for s in spy.into("idempotency") if s.startswith("UPDATE")]) == count
    assert all(records.remembered_response("s", f"k{i}") == (200, {"i": i}) for i in range(count))


def test_more_rows_than_a_statement_takes_are_written_by_several(home, records):
    """A group holds up to 256 writes; one statement writes at most ``ROWS_MAX`` rows."""
    spy = records._con
    _, release = _held(records)
    count = ROWS_MAX * 2 + 1
    futures = [records.remember_response("s", f"k{i}", "fp", 0, {}, float(i), new_row=True) for i in range(count)]
    release.set()
    assert all(f.result(10) is None for f in futures)
    assert len(spy.into("idempotency")) == 3
    assert len(records.remembered_keys()) == count


def test_snapshots_held_for_later_are_written_together_each_row_as_its_last_snapshot(home, records, monkeypatch):
    """Task states written as runs go (nobody waits) are held, a later snapshot of a row replacing the
    earlier; a flush then writes every held row together: one UPDATE (which finds none of these new rows)
    and one INSERT."""
    monkeypatch.setattr("apollia_nb.runtime.records.DEFER_SECS", 60.0)  # held until the flush
    spy = records._con
    for i in range(10):
        records.save_task(_record(f"t{i}", "running"), "2026-12-07T00:00:00Z")
    for i in range(0, 10, 2):
        records.save_task(_record(f"t{i}", "completed"), "2026-12-07T00:00:01Z")
    records.flush()
    assert [s.split(None, 1)[0] for s in spy.into("tasks")] == ["UPDATE", "INSERT"]
    assert {t["id"]: t["status"] for t in records.tasks()} == {
        f"t{i}": "completed" if i % 2 == 0 else "running" for i in range(10)}


def test_rows_to_update_of_which_some_are_not_there_are_updated_and_the_others_inserted(home, records):
    """One ``UPDATE`` for the rows, then one ``INSERT`` of those it did not find: every row as written."""
    spy = records._con
    count = max(UPDATE_ROWS_MIN, 6)
    for i in range(0, count, 2):
        assert records.remember_response("s", f"k{i}", "fp", 0, {}, 1.0, new_row=True).result(10) is None
    _, release = _held(records)
    futures = [records.remember_response("s", f"k{i}", "fp", 200, {"i": i}, 2.0) for i in range(count)]
    release.set()
    assert [f.result(10) for f in futures] == [None] * count
    last = [s for s in spy.into("idempotency")][-2:]
    assert [s.split(None, 1)[0] for s in last] == ["UPDATE", "INSERT"] and last[1].count("(?") == count // 2
    assert all(records.remembered_response("s", f"k{i}") == (200, {"i": i}) for i in range(count))
