"""runtime.db: writes queued to one writer thread, reads see earlier writes, failures are reported."""

from __future__ import annotations

import threading

import duckdb
import pytest

from apollia_nb.errors import Conflict
from apollia_nb.runtime.records import RuntimeRecords


def _record(task_id: str, status: str = "pending", **extra) -> dict:
    return {"id": task_id, "agent": "clerk", "status": status, **extra}


def test_a_read_sees_every_write_queued_before_it(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        for i in range(50):
            records.save_task(_record("t1", "running", step=i), f"2026-11-30T00:00:{i:02d}Z")
        records.save_task(_record("t2"), "2026-11-30T00:01:00Z")
        assert records.task("t1")["step"] == 49
        assert [t["id"] for t in records.tasks()] == ["t1", "t2"]
        assert [t["id"] for t in records.tasks("pending")] == ["t2"]
    finally:
        records.close()


def test_a_record_is_snapshotted_when_it_is_saved(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        record = _record("t1", "running", steps=["a"])
        records.save_task(record, "2026-11-30T00:00:00Z")
        record["steps"].append("b")  # changed after the save, before the writer ran or not
        assert records.task("t1")["steps"] == ["a"]
    finally:
        records.close()


def test_close_commits_what_is_queued(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    for i in range(20):
        records.memory_set("clerk", f"k{i}", {"n": i})
    records.close()
    con = duckdb.connect(str(home.runtime_db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM memory").fetchone()[0] == 20
    finally:
        con.close()
    with pytest.raises(Conflict):
        records.save_task(_record("late"), "2026-11-30T00:00:00Z")


def test_a_failed_write_is_reported_once_to_the_next_reader_and_the_rest_go_on(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        records.save_task(_record("t1"), "2026-11-30T00:00:00Z")
        records._upsert("no_such_table", {"id": "x"}, {"v": 1})  # fails in the writer thread
        records.save_task(_record("t2"), "2026-11-30T00:00:01Z")  # queued after it: still written
        with pytest.raises(duckdb.Error, match="no_such_table"):
            records.flush()
        assert [t["id"] for t in records.tasks()] == ["t1", "t2"]  # reported once, then reads work
    finally:
        records.close()


def test_writes_do_not_wait_for_the_database(home):
    """The writer is held inside a write: saving more returns at once, in order when it goes on."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(10)

    try:
        records._write(hold)
        assert held.wait(10)
        for i in range(5):
            records.save_task(_record("t1", "running", step=i), f"2026-11-30T00:00:0{i}Z")  # not blocked
        release.set()
        assert records.task("t1")["step"] == 4
    finally:
        release.set()
        records.close()
