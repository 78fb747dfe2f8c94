"""runtime.db: a row queued behind the write it depends on (a submitted task behind its request's key) is
committed with it or after it, and refused when that write was refused, never committed without it."""

from __future__ import annotations

from concurrent.futures import Future

import duckdb
import pytest
from test_runtime_records_group import _held

from apollia_nb.errors import StorageFull
from apollia_nb.runtime.records import RuntimeRecords


class _Disk:
    """The real connection of a ``RuntimeRecords``: counts commits, and refuses (a full disk, as DuckDB says
    it) every statement on ``refused``, a table."""

    def __init__(self, con, refused: str | None = None) -> None:
        self._con = con
        self.refused = refused
        self.open = False
        self.commits = 0
        self.statements: list[str] = []

    def execute(self, sql: str, *args):
        verb = sql.split(None, 1)[0].upper()
        self.statements.append(" ".join(sql.split()[:3]))
        if self.refused is not None and f" {self.refused} " in f" {sql} ":
            raise duckdb.IOException("Could not write file: No space left on device")
        if verb in ("BEGIN", "BEGIN TRANSACTION"):
            self.open = True
        elif verb in ("COMMIT", "ROLLBACK"):
            self.commits += verb == "COMMIT"
            self.open = False
        elif verb in ("INSERT", "UPDATE", "DELETE") and not self.open:
            self.commits += 1
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _task(task_id: str) -> dict:
    return {"id": task_id, "agent": "clerk", "status": "pending"}


def test_a_task_queued_behind_its_key_is_committed_with_it_in_one_transaction(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    disk = records._con = _Disk(records._con)
    try:
        _, release = _held(records)
        taken = records.remember_response("tasks", "k", "fp", 0, {"ref": {"task_id": "t1"}}, 1.0, new_row=True)
        row = records.save_task(_task("t1"), "2026-12-08T00:00:00Z", acknowledged=True, after=taken)
        release.set()
        assert taken.result(10) is None and row.result(10) is None
        assert disk.commits == 1
        assert records.remembered_response("tasks", "k") == (0, {"ref": {"task_id": "t1"}})
        assert [t["id"] for t in records.tasks()] == ["t1"]
    finally:
        records.close()


def test_a_task_whose_key_the_disk_refused_is_refused_too_though_its_own_row_would_go_in(home):
    """The key's row is refused (its table, as a disk that filled up and came back would refuse one write):
    the group is rolled back and each tried alone; the task's row, which would go in, is refused with it."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    records._con = _Disk(records._con, refused="idempotency")
    try:
        _, release = _held(records)
        taken = records.remember_response("tasks", "k", "fp", 0, {}, 1.0, new_row=True)
        row = records.save_task(_task("t1"), "2026-12-08T00:00:00Z", acknowledged=True, after=taken)
        other = records.save_task(_task("t2"), "2026-12-08T00:00:01Z", acknowledged=True)  # depends on nothing
        release.set()
        with pytest.raises(StorageFull):
            taken.result(10)
        with pytest.raises(StorageFull):
            row.result(10)
        assert other.result(10) is None
        assert [t["id"] for t in records.tasks()] == ["t2"]
    finally:
        records._con.refused = None
        records.close()


def test_a_row_queued_after_a_refused_write_alone_is_refused_without_being_written(home):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        refused: Future[None] = Future()
        refused.set_exception(StorageFull("runtime.db could not record the key"))
        with pytest.raises(StorageFull, match="could not record the key"):
            records.save_task(_task("t1"), "2026-12-08T00:00:00Z", acknowledged=True, after=refused).result(10)
        done: Future[None] = Future()
        done.set_result(None)
        assert records.save_task(_task("t2"), "2026-12-08T00:00:01Z", acknowledged=True, after=done).result(10) is None
        assert [t["id"] for t in records.tasks()] == ["t2"]
    finally:
        records.close()


def test_keys_and_tasks_queued_in_turn_are_inserted_with_one_statement_a_table_each_row_keeping_its_order(home):
    """Sixteen requests, each a key taken then its task's row behind it, met in one group: one INSERT of the
    keys and one of the tasks (not 32 statements), and a row written twice in the group holds its last write."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    disk = records._con = _Disk(records._con)
    try:
        _, release = _held(records)
        futures = []
        for i in range(16):
            taken = records.remember_response("tasks", f"k{i}", "fp", 0, {}, float(i), new_row=True)
            futures += [taken, records.save_task(_task(f"t{i}"), "2026-12-08T00:00:00Z", acknowledged=True,
                                                 after=taken)]
        futures.append(records.remember_response("tasks", "k0", "fp", 202, {"done": True}, 99.0))  # k0 again
        release.set()
        for future in futures:
            assert future.result(10) is None
        assert disk.commits == 1
        written = [s for s in disk.statements if s.split()[0] in ("INSERT", "UPDATE")]
        assert written.count("INSERT INTO idempotency") == 1 and written.count("INSERT INTO tasks") == 1, written
        assert len(written) <= 4, written  # the two INSERTs, k0's answer, the counts row
        assert records.remembered_response("tasks", "k0") == (202, {"done": True})
        assert records.remembered_response("tasks", "k15") == (0, {})
        assert len(records.tasks()) == 16
    finally:
        records.close()
