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


def _holding(home, monkeypatch, secs: float) -> RuntimeRecords:
    """Records of ``home`` whose running task and session states are held ``secs`` (``DEFER_SECS``)."""
    import apollia_nb.runtime.records as records_module

    monkeypatch.setattr(records_module, "DEFER_SECS", secs)
    home.ensure()
    return RuntimeRecords(home.runtime_db)


def _rows(home, query: str) -> list[tuple]:
    """``query`` over ``runtime.db`` once its records are closed, read-only."""
    con = duckdb.connect(str(home.runtime_db), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def _counting_runs(records: RuntimeRecords, monkeypatch) -> tuple[list[float], threading.Event]:
    """Every row write the writer commits, as the moment it ran (``time.monotonic``; rows written by one
    statement count one each); the event is set at each."""
    import time

    ran: list[float] = []
    each = threading.Event()
    real, real_rows = records._run, records._rows_now
    together: list[int] = []

    def rows_now(rows) -> None:
        real_rows(rows)
        together.append(len(rows))

    def counted(run) -> None:
        real(run)
        ran.extend([time.monotonic()] * (together.pop() if together else 1))
        each.set()

    monkeypatch.setattr(records, "_run", counted)
    monkeypatch.setattr(records, "_rows_now", rows_now)
    return ran, each


def test_a_write_nobody_waits_for_is_held_and_a_later_snapshot_of_its_row_replaces_it(home, monkeypatch):
    """A task that starts and ends within DEFER_SECS costs one row write: its last snapshot."""
    import time

    records = _holding(home, monkeypatch, 0.3)
    try:
        ran, each = _counting_runs(records, monkeypatch)
        t0 = time.monotonic()
        records.save_task(_record("t1", "running"), "2026-11-30T00:00:00Z")
        records.save_task(_record("t1", "completed"), "2026-11-30T00:00:01Z")
        records.save_task(_record("t2", "running"), "2026-11-30T00:00:02Z")  # another row: held too, after t1
        assert each.wait(10)
        assert ran[0] - t0 >= 0.3  # held, not committed at once
        deadline = time.monotonic() + 10
        while len(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert len(ran) == 2  # t1 once (its last snapshot), then t2
        assert [t["status"] for t in records.tasks()] == ["completed", "running"]
    finally:
        records.close()


def test_an_agents_memory_is_written_at_once_after_the_held_writes_before_it(home, monkeypatch):
    """What a tool saved (``memory_save``) is not held: it is committed at once, in order."""
    import time

    records = _holding(home, monkeypatch, 60.0)
    try:
        ran, each = _counting_runs(records, monkeypatch)
        t0 = time.monotonic()
        records.save_task(_record("t1", "running"), "2026-11-30T00:00:00Z")
        records.memory_set("clerk", "k", 1)
        deadline = time.monotonic() + 10
        while len(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(ran) == 2 and ran[-1] - t0 < 10  # both, long before DEFER_SECS
    finally:
        records.close()
    assert _rows(home, "SELECT value FROM memory") == [("1",)]
    assert _rows(home, "SELECT status FROM tasks") == [("running",)]


def test_a_read_a_flush_and_the_close_commit_held_writes_at_once(home, monkeypatch):
    import time

    records = _holding(home, monkeypatch, 60.0)
    try:
        t0 = time.monotonic()
        records.save_task(_record("t1", "running"), "2026-11-30T00:00:00Z")
        assert records.task("t1")["status"] == "running"  # the read committed it first
        records.save_task(_record("t1", "completed"), "2026-11-30T00:00:01Z")
        records.flush()
        records.memory_set("clerk", "k", 2)
        assert time.monotonic() - t0 < 30
    finally:
        records.close()  # commits the memory row
    assert time.monotonic() - t0 < 30
    assert _rows(home, "SELECT status FROM tasks WHERE id = 't1'") == [("completed",)]
    assert _rows(home, "SELECT value FROM memory WHERE agent = 'clerk' AND key = 'k'") == [("2",)]


def test_an_acknowledged_write_commits_the_held_writes_queued_before_it_first(home, monkeypatch):
    records = _holding(home, monkeypatch, 60.0)
    try:
        order: list[str] = []
        real = records._upsert_now

        def seen(table, keys, values, **kw):
            real(table, keys, values, **kw)
            order.append(f"{table}:{'/'.join(map(str, keys.values()))}")

        monkeypatch.setattr(records, "_upsert_now", seen)
        records.save_task(_record("t1", "running"), "2026-11-30T00:00:00Z")
        records.memory_set("clerk", "k", 1)
        records.save_task(_record("t2"), "2026-11-30T00:00:01Z", acknowledged=True).result(timeout=30)
        assert order == ["tasks:t1", "memory:clerk/k", "tasks:t2"]
    finally:
        records.close()


def test_submitting_a_task_whose_row_exists_is_a_conflict_and_keeps_the_row(home):
    """A new task's row is inserted, never written over an existing one (an id reused across sessions)."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        records.save_task(_record("t1", "completed", result="the first"), "2026-11-30T00:00:00Z",
                          acknowledged=True).result(timeout=30)
        again = records.save_task(_record("t1", "pending"), "2026-11-30T00:00:01Z", acknowledged=True)
        with pytest.raises(Conflict, match="task t1 exists already"):
            again.result(timeout=30)
        assert records.task("t1") == _record("t1", "completed", result="the first")
        records.save_task(_record("t1", "running"), "2026-11-30T00:00:02Z")  # an update of a row: fine
        assert records.task("t1")["status"] == "running"
    finally:
        records.close()


@pytest.mark.anyio
async def test_a_task_id_taken_in_an_earlier_session_cannot_be_submitted_again(home):
    from apollia_nb.runtime import Runtime
    from runtime_helpers import manifest

    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        first = await (await rt.submit("clerk", "the first", task_id="task-kept"))
        assert first.status == "completed"
    async with Runtime(home) as rt:  # a new session: the finished task is only in runtime.db
        with pytest.raises(Conflict, match="task task-kept exists already"):
            await rt.submit("clerk", "another", task_id="task-kept")
        kept = rt.records.task("task-kept")
        assert (kept["goal"], kept["status"]) == ("the first", "completed")
