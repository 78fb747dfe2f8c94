"""runtime.db: writes queued while the writer commits form one transaction, each told as on its own."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import duckdb
import pytest

from apollia_nb.dbutil import FAULT_ENV
from apollia_nb.errors import Conflict, StorageFull
from apollia_nb.runtime.records import RuntimeRecords


class _Transactions:
    """The real connection of a ``RuntimeRecords``, counting the transactions it commits: each
    ``COMMIT`` and each statement that changes rows outside ``BEGIN`` … ``COMMIT`` (DuckDB's autocommit)."""

    def __init__(self, con) -> None:
        self._con = con
        self.open = False
        self.commits = 0

    def _seen(self, sql: str) -> None:
        verb = sql.split(None, 1)[0].upper()
        if verb in ("BEGIN", "BEGIN TRANSACTION"):
            self.open = True
        elif verb in ("COMMIT", "ROLLBACK"):
            self.commits += verb == "COMMIT"
            self.open = False
        elif verb in ("INSERT", "UPDATE", "DELETE") and not self.open:
            self.commits += 1

    def execute(self, sql: str, *args):
        self._seen(sql)
        return self._con.execute(sql, *args)

    def executemany(self, sql: str, *args):
        self._seen(sql)
        return self._con.executemany(sql, *args)

    def begin(self):
        self.open = True
        return self._con.begin()

    def commit(self):
        self.commits += 1
        self.open = False
        return self._con.commit()

    def rollback(self):
        self.open = False
        return self._con.rollback()

    def __getattr__(self, name):
        return getattr(self._con, name)


def _held(records: RuntimeRecords) -> tuple[threading.Event, threading.Event]:
    """The writer held inside a write of its own until the second event is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(10)

    records._write(hold)
    assert held.wait(10)
    return held, release


def _rows(home, query: str) -> list[tuple]:
    con = duckdb.connect(str(home.runtime_db), read_only=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def _record(task_id: str, status: str = "pending") -> dict:
    return {"id": task_id, "agent": "clerk", "status": status}


def test_acknowledged_writes_queued_while_the_writer_commits_share_one_commit(home):
    """Twenty keys taken and answered while the writer is busy: one commit for all, each told once it is in."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    spy = records._con = _Transactions(records._con)
    try:
        _, release = _held(records)
        futures = [records.remember_response("decide", f"k{i}", "fp", 0, {}, float(i), new_row=True)
                   for i in range(10)]
        futures += [records.remember_response("decide", f"k{i}", "fp", 200, {"i": i}, float(i)) for i in range(10)]
        records.save_task(_record("t1", "running"), "2026-12-07T00:00:00Z")  # held for later: not waited for
        assert not any(f.done() for f in futures)
        release.set()
        for f in futures:
            assert f.result(10) is None
        assert spy.commits == 1
        records.flush()
    finally:
        records.close()
    assert _rows(home, "SELECT key, status, response FROM idempotency ORDER BY created_at, key") == [
        (f"k{i}", 200, f'{{"i": {i}}}') for i in range(10)]
    assert _rows(home, "SELECT id, status FROM tasks") == [("t1", "running")]


def test_a_write_of_a_group_that_fails_is_told_alone_and_the_others_are_committed(home):
    """A task id submitted twice inside a group: that submit is CONFLICT, the writes around it commit."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        assert records.save_task(_record("t1"), "2026-12-07T00:00:00Z", acknowledged=True).result(10) is None
        _, release = _held(records)
        before = records.remember_response("s", "a", "fp", 200, {}, 1.0, new_row=True)
        again = records.save_task(_record("t1", "running"), "2026-12-07T00:00:01Z", acknowledged=True)
        after = records.save_task(_record("t2"), "2026-12-07T00:00:02Z", acknowledged=True)
        release.set()
        assert before.result(10) is None and after.result(10) is None
        with pytest.raises(Conflict):
            again.result(10)
        assert {t["id"]: t["status"] for t in records.tasks()} == {"t1": "pending", "t2": "pending"}
    finally:
        records.close()


def test_a_key_taken_again_whose_row_is_there_is_rewritten_in_a_group_and_alone(home):
    """A key row inserted first: one that is there already (a key forgotten in memory only) is updated,
    inside a group (which then commits each on its own) and outside one."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        assert records.remember_response("s", "a", "fp", 200, {"n": 1}, 1.0).result(10) is None
        assert records.remember_response("s", "a", "fp2", 0, {}, 2.0, new_row=True).result(10) is None
        assert records.remembered_response("s", "a") == (0, {})
        _, release = _held(records)
        futures = [records.remember_response("s", "a", "fp3", 0, {"n": 3}, 3.0, new_row=True),
                   records.remember_response("s", "b", "fp", 0, {}, 3.0, new_row=True)]
        release.set()
        assert [f.result(10) for f in futures] == [None, None]
        assert records.remembered_response("s", "a") == (0, {"n": 3})
        assert [k[:2] for k in records.remembered_keys()] == [("s", "a"), ("s", "b")]
    finally:
        records.close()


def test_a_group_the_disk_refuses_tells_each_acknowledged_write_and_keeps_the_others(home, monkeypatch):
    """The disk refuses while a group waits: every acknowledged write is told STORAGE_FULL and leaves
    no row; the writes nobody waits for are kept and committed, in order, once the disk takes them."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        _, release = _held(records)
        monkeypatch.setenv(FAULT_ENV, "runtime.db:ENOSPC")
        acknowledged = [records.save_task(_record(f"a{i}"), "2026-12-07T00:00:00Z", acknowledged=True)
                        for i in range(3)]
        for i in range(3):
            records.memory_set("clerk", "k", i)  # the last one wins, once written
        records.save_task(_record("a0", "running"), "2026-12-07T00:00:01Z")  # a snapshot of a refused row
        release.set()
        for f in acknowledged:
            with pytest.raises(StorageFull):
                f.result(10)
        assert records.kept >= 1
        with pytest.raises(StorageFull):
            records.flush()
        monkeypatch.delenv(FAULT_ENV)
        records.flush()
        assert records.kept == 0
        assert records.memory_get("clerk") == {"k": 2}
    finally:
        records.close()
    assert _rows(home, "SELECT id, status FROM tasks") == [("a0", "running")]  # only the later snapshot


def test_a_batch_queued_among_other_writes_commits_in_its_own_transaction(home):
    """A batch makes its own transaction (it and its items, or neither): queued in a group it is
    committed on its own, and the writes around it are committed too."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        _, release = _held(records)
        key = records.remember_response("s", "k", "fp", 0, {}, 1.0, new_row=True)
        batch: Future[None] = records.save_batch(
            {"id": "b1", "agent": "clerk", "status": "running"},
            [{"index": 0, "task_id": "t1", "key": "x", "item": {"x": 1}, "goal": "g"}], "2026-12-07T00:00:00Z")
        task = records.save_task(_record("t1"), "2026-12-07T00:00:01Z", acknowledged=True)
        release.set()
        assert [f.result(10) for f in (key, batch, task)] == [None, None, None]
        assert [i["task_id"] for i in records.batch_items("b1")] == ["t1"]
        assert records.task("t1") is not None
    finally:
        records.close()


def test_a_reader_never_sees_a_group_before_its_commit(home):
    """A read waits for the group's commit: what it returns is committed (its flush came after)."""
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        _, release = _held(records)
        futures = [records.save_task(_record(f"t{i}"), "2026-12-07T00:00:00Z", acknowledged=True) for i in range(20)]
        seen: list[int] = []
        reader = threading.Thread(target=lambda: seen.append(len(records.tasks())))
        reader.start()
        release.set()
        reader.join(10)
        assert all(f.result(10) is None for f in futures)
        assert seen == [20]
    finally:
        records.close()
