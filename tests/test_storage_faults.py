"""A full disk, a read-only file system, an I/O error: stable codes, nothing acknowledged lost, recovery
without a restart. The home lives on a real small tmpfs that a filler file fills; EIO and EROFS, which a
tmpfs cannot produce, come from the ``APOLLIA_STORAGE_FAULT`` fault point."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import duckdb
import pytest

from apollia_nb.dbutil import FAULT_ENV, fault_point, needs_reopen, storage_error
from apollia_nb.errors import StorageError, StorageFull
from apollia_nb.home import Home
from apollia_nb.journal import Journal, verify_journal
from apollia_nb.journal import tail as tail_module
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.records import RuntimeRecords
from runtime_helpers import manifest
from storage_helpers import Filler, small_disk

pytestmark = pytest.mark.anyio
SCRIBE = manifest("scribe") + "# " + "notes " * 2000 + "\n"


@pytest.fixture
def disk(tmp_path):
    with small_disk(tmp_path / "disk") as where:
        yield where


def _record(task_id: str, status: str = "pending", **extra) -> dict:
    return {"id": task_id, "agent": "clerk", "status": status, **extra}


def _rows(path, sql):
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --- telling storage faults apart -----------------------------------------------------------------


def test_the_words_duckdb_and_the_system_use_give_stable_codes():
    wal = duckdb.TransactionException(
        'TransactionContext Error: Failed to commit: Could not write file "/h/runtime.db.wal": '
        "No space left on device")
    assert isinstance(storage_error(wal, "x"), StorageFull)
    assert storage_error(wal, "x").http_status == 507
    assert storage_error(OSError(errno.ENOSPC, "No space left on device"), "x").code == "STORAGE_FULL"
    assert storage_error(OSError(errno.EDQUOT, "Disk quota exceeded"), "x").code == "STORAGE_FULL"
    erofs = storage_error(OSError(errno.EROFS, "Read-only file system"), "x")
    assert erofs.code == "STORAGE_ERROR" and erofs.http_status == 503 and "read-only" in erofs.message
    assert storage_error(OSError(errno.EIO, "Input/output error"), "x").code == "STORAGE_ERROR"
    fatal = duckdb.FatalException('FATAL Error: Failed to create checkpoint because of error: Could not '
                                  'write file "/h/journal.db": Input/output error')
    assert storage_error(fatal, "x").code == "STORAGE_ERROR" and needs_reopen(fatal)
    assert storage_error(duckdb.ConstraintException("Duplicate key \"seq: 2\""), "x") is None
    assert storage_error(ValueError("bad"), "x") is None
    assert storage_error(FileNotFoundError(errno.ENOENT, "No such file or directory"), "x") is None
    assert not needs_reopen(wal)


def test_the_fault_point_raises_only_for_its_file(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "runtime.db:EIO, journal.log:erofs")
    with pytest.raises(OSError) as caught:
        fault_point("runtime.db")
    assert caught.value.errno == errno.EIO
    with pytest.raises(OSError) as caught:
        fault_point("journal.log")
    assert caught.value.errno == errno.EROFS
    fault_point("journal.db")  # not named: nothing
    monkeypatch.delenv(FAULT_ENV)
    fault_point("runtime.db")


# --- runtime.db -----------------------------------------------------------------------------------


def test_runtime_db_on_a_full_disk_keeps_refused_writes_and_writes_them_once_space_is_back(disk):
    home = Home.at(disk / "home")
    home.ensure()
    filler = Filler(disk)
    records = RuntimeRecords(home.runtime_db)
    try:
        records.save_task(_record("t1", "completed"), "2026-12-01T00:00:00Z")
        records.flush()
        filler.fill()
        refused = []
        for i in range(200):  # the WAL's last page may take the first small rows
            records.save_task(_record(f"k{i}", "running", pad="x" * 4000), f"2026-12-01T00:01:{i % 60:02d}Z")
            try:
                records.flush()
            except StorageFull as exc:
                refused.append(exc)
                break
        assert refused, "the full disk took every write"
        assert "no space left" in refused[0].message and refused[0].http_status == 507
        kept = records.kept
        assert kept >= 1
        with pytest.raises(StorageFull):  # every flush is told while anything is kept, not only the first
            records.flush()
        with pytest.raises(StorageFull):  # so is a reader: the rows it would read are not all there
            records.task("t1")
        acknowledged = records.save_task(_record("ack", "pending", pad="y" * 4000), "2026-12-01T00:02:00Z",
                                         acknowledged=True)
        with pytest.raises(StorageFull):
            acknowledged.result(timeout=30)
        records.save_task(_record("k0", "completed"), "2026-12-01T00:03:00Z")  # replaces the kept snapshot

        filler.free()
        records.flush()  # retried in order, without a restart
        assert records.kept == 0
        assert records.task("t1")["status"] == "completed"
        assert records.task("k0")["status"] == "completed"
        assert records.task("ack") is None  # refused and told: never written later
        written = {t["id"] for t in records.tasks()}
    finally:
        records.close()
    assert {r[0] for r in _rows(home.runtime_db, "SELECT id FROM tasks")} == written
    assert "ack" not in written and {"t1", "k0"} <= written


def test_runtime_db_retries_by_itself_when_nobody_flushes(disk):
    home = Home.at(disk / "home")
    home.ensure()
    filler = Filler(disk)
    records = RuntimeRecords(home.runtime_db)
    try:
        filler.fill()
        for i in range(50):
            records.memory_set("clerk", f"k{i}", "z" * 4000)
        # STORAGE_FULL, or STORAGE_ERROR when a checkpoint the disk refused invalidated the database
        with pytest.raises(StorageError):
            records.flush()
        assert records.kept
        filler.free()
        deadline = time.monotonic() + 30
        while records.kept and time.monotonic() < deadline:  # the writer's own retry, RETRY_SECS apart
            time.sleep(0.05)
        assert records.kept == 0
        assert len(records.memory_get("clerk")) == 50
    finally:
        records.close()


def test_runtime_db_invalidated_by_a_failed_checkpoint_is_opened_again(disk):
    """DuckDB invalidates a database whose checkpoint the disk refused; the writer reopens it."""
    home = Home.at(disk / "home")
    home.ensure()
    filler = Filler(disk)
    records = RuntimeRecords(home.runtime_db)
    try:
        records.save_task(_record("t0", "completed"), "2026-12-01T00:00:00Z")
        records.flush()
        records._con.execute("SET checkpoint_threshold = '16KB'")  # every commit checkpoints
        filler.fill()
        for i in range(50):
            records.save_task(_record(f"t{i + 1}", "running", pad=os.urandom(3000).hex()), "2026-12-01T00:01:00Z")
            try:
                records.flush()
            except StorageError:
                break
        assert records.kept
        filler.free()
        records.flush()
        assert records.kept == 0
        assert records.task("t0")["status"] == "completed"
        assert records.task(f"t{i + 1}")["status"] == "running"
        records.save_task(_record("after", "completed"), "2026-12-01T00:02:00Z")
        assert records.task("after")["status"] == "completed"
    finally:
        records.close()
    ids = {r[0] for r in _rows(home.runtime_db, "SELECT id FROM tasks")}
    assert {"t0", f"t{i + 1}", "after"} <= ids


def test_runtime_db_io_and_read_only_faults_give_storage_error(home, monkeypatch):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        for code, words in (("EIO", "refused the write"), ("EROFS", "read-only")):
            monkeypatch.setenv(FAULT_ENV, f"runtime.db:{code}")
            done = records.save_task(_record(f"ack-{code}"), "2026-12-01T00:00:00Z", acknowledged=True)
            with pytest.raises(StorageError) as caught:
                done.result(timeout=30)
            assert caught.value.code == "STORAGE_ERROR" and words in caught.value.message
            records.save_agent("clerk", "x", "active", [], "2026-12-01T00:00:00Z")
            with pytest.raises(StorageError):
                records.flush()
            monkeypatch.delenv(FAULT_ENV)
            records.flush()
            assert records.task(f"ack-{code}") is None
            assert [a["name"] for a in records.agents()] == ["clerk"]
    finally:
        records.close()


# --- the journal ----------------------------------------------------------------------------------


def test_the_journal_on_a_full_disk_keeps_committing_into_its_log_and_copies_once_space_is_back(disk):
    home = Home.at(disk / "home")
    filler = Filler(disk)
    with Journal.open(home) as journal:
        first = journal.append("plan", {"n": 0})
        assert [e.seq for e in journal.entries()] == [1]
        filler.fill()
        # journal.log is preallocated: commits need no new block and go on.
        committed = [first] + [journal.append("plan", {"n": i, "pad": "p" * 2000}) for i in range(1, 200)]
        with pytest.raises(StorageFull) as caught:  # the copy into journal.db cannot be made: reads say so
            journal.entries()
        assert "kept there" in caught.value.message
        filler.free()
        assert [e.seq for e in journal.entries()] == [e.seq for e in committed]  # copied, no restart
        committed.append(journal.append("plan", {"n": "after"}))
        assert verify_journal(journal).ok
    with Journal.open(home) as journal:
        assert [e.hash for e in journal.entries()] == [e.hash for e in committed]
        assert verify_journal(journal).ok


def test_a_full_log_that_cannot_be_copied_refuses_appends_and_recovers(disk, monkeypatch):
    monkeypatch.setattr(tail_module, "PREALLOCATE", 16 * 1024)
    home = Home.at(disk / "home")
    filler = Filler(disk)
    with Journal.open(home) as journal:
        committed = [journal.append("plan", {"n": 0})]
        filler.fill()
        refused = None
        for i in range(1, 400):
            try:
                committed.append(journal.append("plan", {"n": i, "pad": "q" * 1500}))
            except StorageFull as exc:
                refused = exc
                break
        assert refused is not None and refused.http_status == 507
        head = journal.head()
        assert head[0] == committed[-1].seq  # the refused append took no seq
        filler.free()
        committed.append(journal.append("plan", {"n": "after"}))  # the writer recovered by itself
        assert committed[-1].seq == head[0] + 1
        assert [e.seq for e in journal.entries()] == list(range(1, head[0] + 2))
    with Journal.open(home) as journal:
        assert [e.hash for e in journal.entries()] == [e.hash for e in committed]
        assert verify_journal(journal).ok


def test_a_journal_db_invalidated_by_a_failed_checkpoint_is_opened_again(disk, monkeypatch):
    home = Home.at(disk / "home")
    filler = Filler(disk)
    # Every copy checkpoints: set before the journal locks its database's settings (the first open only).
    from apollia_nb.journal import store

    opened: list[object] = []

    def lock_down(con, *settings):
        extra = () if opened else ("SET checkpoint_threshold = '16KB'",)
        opened.append(con)
        real_lock_down(con, *settings, *extra)

    real_lock_down = store.lock_down
    monkeypatch.setattr(store, "lock_down", lock_down)
    with Journal.open(home) as journal:
        committed = [journal.append("plan", {"n": 0})]
        journal.entries()
        filler.fill()
        for i in range(1, 100):
            committed.append(journal.append("plan", {"n": i, "pad": os.urandom(1000).hex()}))
        with pytest.raises(StorageError):
            journal.entries()
        filler.free()
        assert [e.seq for e in journal.entries()] == [e.seq for e in committed]
        # opened again, and locked to itself again: SQL there still reads the journal and nothing else
        assert len(opened) == 2
        assert journal.sql("SELECT current_setting('enable_external_access'), "
                           "current_setting('lock_configuration')") == [(False, True)]
        committed.append(journal.append("plan", {"n": "after"}))
        assert verify_journal(journal).ok
    with Journal.open(home) as journal:
        assert [e.hash for e in journal.entries()] == [e.hash for e in committed]


def test_journal_log_io_and_read_only_faults_give_storage_error_and_the_next_append_works(home, monkeypatch):
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
        for code in ("EIO", "EROFS"):
            monkeypatch.setenv(FAULT_ENV, f"journal.log:{code}")
            with pytest.raises(StorageError) as caught:
                journal.append("plan", {"n": code})
            assert caught.value.code == "STORAGE_ERROR"
            monkeypatch.delenv(FAULT_ENV)
        assert journal.append("plan", {"n": 2}).seq == 2
        monkeypatch.setenv(FAULT_ENV, "journal.db:EIO")
        journal.append("plan", {"n": 3})  # committed in the log; its copy is refused
        with pytest.raises(StorageError):
            journal.entries()
        monkeypatch.delenv(FAULT_ENV)
        assert [e.data()["n"] for e in journal.entries()] == [1, 2, 3]
        assert verify_journal(journal).ok


# --- the runtime ----------------------------------------------------------------------------------


async def test_the_runtime_refuses_new_work_with_storage_full_and_takes_it_again_once_space_is_back(disk):
    home = Home.at(disk / "home")
    filler = Filler(disk)
    acknowledged = []
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        task = await (await rt.submit("clerk", "Before the disk filled"))
        assert task.status == "completed"
        acknowledged.append(task.id)
        filler.fill()
        refused = None
        for i in range(100):
            try:
                handle = await rt.submit("clerk", f"While full {i} " + "g" * 3000)
            except StorageFull as exc:
                refused = exc
                break
            acknowledged.append(handle.id)
        assert refused is not None and refused.code == "STORAGE_FULL"
        assert len(rt.tasks()) == len(acknowledged)  # the refused task is nowhere
        with pytest.raises(StorageFull):  # (a row larger than the slack of the WAL's last page)
            await rt.register_agent(SCRIBE)
        assert [a.name for a in rt.agents()] == ["clerk"]
        filler.free()
        later = await (await rt.submit("clerk", "After space came back"))
        assert later.status == "completed", later.error
        acknowledged.append(later.id)
        await rt.register_agent(SCRIBE)
        for handle in rt.tasks():
            await handle.settled()
    async with Runtime(home) as rt:
        recorded = {t["id"]: t for t in rt.records.tasks()}
        assert set(recorded) == set(acknowledged)  # every acknowledged task, and only those
        assert recorded[later.id]["status"] == "completed"
        # Runs acknowledged while the disk was full ran then: their entries went to the preallocated
        # journal.log, their rows were kept and written later; only their checkpoints had to wait.
        assert {t["status"] for t in recorded.values()} == {"completed"}, recorded
        assert sorted(a.name for a in rt.agents()) == ["clerk", "scribe"]
        assert rt.verify().ok


# --- as a user meets it: `apollia-os serve` and the CLI -------------------------------------------


def test_serve_on_a_full_disk_answers_507_never_202_or_500_and_recovers_without_a_restart(disk):
    import httpx

    from test_api_serve import cli, start, stop

    home = disk / "home"
    filler = Filler(disk)
    proc, _ = start(home)
    acknowledged: list[str] = []
    try:
        info = json.loads((home / "server.json").read_text())
        api = httpx.Client(base_url=info["url"] + "/api/v1", headers={"Authorization": f"Bearer {info['token']}"},
                           timeout=60)
        assert api.post("/agents", json={"manifest": manifest()}).status_code == 201
        first = api.post("/tasks", json={"agent": "clerk", "goal": "Before the disk filled"})
        assert first.status_code == 202
        acknowledged.append(first.json()["id"])
        assert api.get(f"/tasks/{acknowledged[0]}/wait", params={"until": "finished"}).json()["status"] == "completed"

        filler.fill()
        answers = []
        for i in range(100):
            answer = api.post("/tasks", json={"agent": "clerk", "goal": f"While full {i} " + "g" * 3000})
            answers.append(answer.status_code)
            if answer.status_code == 202:
                acknowledged.append(answer.json()["id"])
                continue
            break
        assert answers[-1] == 507, answers
        assert answer.json()["code"] == "STORAGE_FULL" and "nothing of it was recorded" in answer.json()["message"]
        from concurrent.futures import ThreadPoolExecutor

        def submit(i: int) -> httpx.Response:  # under load: concurrent submits share the writers
            return api.post("/tasks", json={"agent": "clerk", "goal": f"Burst {i} " + "b" * 3000})

        with ThreadPoolExecutor(8) as pool:
            burst = list(pool.map(submit, range(24)))
        assert {r.status_code for r in burst} <= {202, 507}, [(r.status_code, r.text) for r in burst]
        assert 507 in {r.status_code for r in burst}
        acknowledged += [r.json()["id"] for r in burst if r.status_code == 202]
        from apollia_nb.sdk import Client, errors

        with Client(info["url"], info["token"]) as sdk, pytest.raises(errors.StorageFull):  # the SDK's class
            sdk.submit("clerk", "Through the SDK while full " + "c" * 3000)
        agent = api.post("/agents", json={"manifest": SCRIBE})
        assert agent.status_code == 507 and agent.json()["code"] == "STORAGE_FULL", agent.text
        assert [a["name"] for a in api.get("/agents").json()] == ["clerk"]

        filler.free()
        later = api.post("/tasks", json={"agent": "clerk", "goal": "After space came back"})
        assert later.status_code == 202, later.text
        acknowledged.append(later.json()["id"])
        done = api.get(f"/tasks/{acknowledged[-1]}/wait", params={"until": "finished"}).json()
        assert done["status"] == "completed", done
        assert api.post("/agents", json={"manifest": SCRIBE}).status_code == 201
        for task_id in acknowledged:
            assert api.get(f"/tasks/{task_id}/wait", params={"until": "finished"}).status_code == 200
        api.close()
    finally:
        filler.free()
        assert stop(proc) == 0

    proc, _ = start(home)  # every acknowledged task is still there after a restart
    try:
        info = json.loads((home / "server.json").read_text())
        with httpx.Client(base_url=info["url"] + "/api/v1",
                          headers={"Authorization": f"Bearer {info['token']}"}, timeout=60) as api:
            for task_id in acknowledged:
                got = api.get(f"/tasks/{task_id}")
                assert got.status_code == 200, (task_id, got.text)
                assert got.json()["status"] in ("completed", "failed")
            assert api.get(f"/tasks/{acknowledged[-1]}").json()["status"] == "completed"
    finally:
        assert stop(proc) == 0
    verified = cli("audit", "verify", home=home)
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr


def test_the_cli_on_a_full_disk_prints_one_line_with_storage_full_and_exits_non_zero(disk, tmp_path):
    from test_api_serve import cli

    home = disk / "home"
    small = tmp_path / "clerk.toml"
    small.write_text(manifest())
    assert cli("agents", "register", str(small), home=home).returncode == 0
    big = tmp_path / "scribe.toml"
    big.write_text(SCRIBE)
    filler = Filler(disk)
    filler.fill()
    try:
        refused = cli("agents", "register", str(big), home=home)
    finally:
        filler.free()
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "STORAGE_FULL: " in lines[0], refused.stderr
    assert "Traceback" not in refused.stderr
    assert cli("agents", "register", str(big), home=home).returncode == 0


# --- governance.db --------------------------------------------------------------------------------


def test_a_governance_change_on_a_full_disk_is_refused_with_storage_full_and_the_next_one_works(disk):
    from apollia_nb.governance.store import GovernanceStore

    home = Home.at(disk / "home")
    home.ensure()
    store = GovernanceStore(home)
    store.keep_open()
    filler = Filler(disk)
    try:
        store.add_rule("read_file", "deny", by="test")
        filler.fill()
        refused = None
        for i in range(100):
            try:
                store.add_rule("write_file", "deny", prefix=f"{i}/" + "d" * 3000, by="test")
            except StorageFull as exc:
                refused = exc
                break
        assert refused is not None and "governance.db did not take the change" in refused.message
        assert store.view().readable  # a refused write leaves what is in effect readable
        filler.free()
        store.add_rule("list_dir", "deny", by="test")
        assert {"read_file", "list_dir"} <= {r.tool for r in store.rules()}
        assert store.view().readable
    finally:
        filler.free()
        store.close()


# --- a crash after storage faults -----------------------------------------------------------------

CRASH_AFTER_FAULTS = """
import os, sys
sys.path.insert(0, {tests!r})
from apollia_nb.errors import StorageError
from apollia_nb.home import Home
from apollia_nb.journal import Journal
from apollia_nb.runtime.records import RuntimeRecords
from storage_helpers import Filler

disk = {disk!r}
home = Home.at(disk + "/home")
home.ensure()
journal = Journal.open(home)
records = RuntimeRecords(home.runtime_db)
filler = Filler(__import__("pathlib").Path(disk))
journal.append("plan", {{"n": 0}})
journal.entries()
records.save_task({{"id": "t0", "agent": "a", "status": "completed"}}, "2026-12-01T00:00:00Z")
records.flush()
filler.fill()
for i in range(1, 60):
    journal.append("plan", {{"n": i, "pad": "r" * 1500}})
    records.save_task({{"id": f"t{{i}}", "agent": "a", "status": "running", "pad": "s" * 3000}}, "2026-12-01T00:00:01Z")
refused = 0
for read in (journal.entries, records.flush):
    try:
        read()
    except StorageError:
        refused += 1
filler.free()
journal.append("plan", {{"n": "after"}})
journal.entries()
records.save_task({{"id": "after", "agent": "a", "status": "completed"}}, "2026-12-01T00:00:02Z")
records.flush()
print(refused, journal.head()[0], flush=True)
os._exit(0)  # no close: what is committed is in the WAL and journal.log
"""


def test_a_crash_after_refused_writes_loses_nothing_committed(disk):
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", CRASH_AFTER_FAULTS.format(tests=tests, disk=str(disk))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused, head = map(int, done.stdout.split())
    assert refused == 2 and head == 61  # both refused while full; every append committed
    home = Home.at(disk / "home")
    with Journal.open(home) as journal:
        assert [e.seq for e in journal.entries()] == list(range(1, 62))
        assert verify_journal(journal).ok
    ids = {r[0] for r in _rows(home.runtime_db, "SELECT id FROM tasks")}
    assert ids == {"t0", "after", *(f"t{i}" for i in range(1, 60))}


def test_a_home_on_a_read_only_file_system_gives_storage_error_in_one_line_and_works_once_writable(tmp_path):
    from test_api_serve import APOLLIA, cli

    from storage_helpers import ext4_disk, remount

    path = tmp_path / "clerk.toml"
    path.write_text(manifest())
    with ext4_disk(tmp_path / "ext4", tmp_path / "ext4.img") as where:
        home = where / "home"
        assert cli("agents", "register", str(path), home=home).returncode == 0
        remount(where, read_only=True)
        try:
            refused = cli("agents", "register", str(path), home=home)
            served = subprocess.run([*APOLLIA, "serve", "--home", str(home), "--port", "0"],
                                    capture_output=True, text=True, timeout=120)
            for answer in (refused, served):
                assert answer.returncode == 3, answer.stderr
                lines = answer.stderr.strip().splitlines()
                assert len(lines) == 1 and "STORAGE_ERROR: " in lines[0] and "read-only" in lines[0], answer.stderr
            with pytest.raises(StorageError, match="read-only"):  # and in Python
                anyio.run(Runtime(Home.at(home)).__aenter__)
        finally:
            remount(where, read_only=False)
        listed = cli("agents", "list", home=home)
        assert listed.returncode == 0 and "clerk" in listed.stdout, listed.stderr
        verified = cli("audit", "verify", home=home)
        assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_run_whose_closing_checkpoint_the_disk_refuses_keeps_its_outcome(home, monkeypatch):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        warnings = []
        told = anyio.Event()

        def listen(kind, data):
            if kind == "warning":
                warnings.append(data)
                if "closing checkpoint was not stored" in str(data):
                    told.set()

        rt.subscribe(listen)
        monkeypatch.setenv(FAULT_ENV, "journal.db:ENOSPC")  # journal.log takes the entries; journal.db nothing
        task = await (await rt.submit("clerk", "Finish while journal.db refuses"))
        assert task.status == "completed", task.error  # the run ends once its checkpoint is signed
        with anyio.fail_after(30):  # the store is refused after that, and said so
            await told.wait()
        assert rt.journal.latest_checkpoint() is None, "a checkpoint journal.db refused is not read back"
        with pytest.raises(StorageFull):
            rt.journal.entries(run_id=task.run_id)
        monkeypatch.delenv(FAULT_ENV)
        kinds = [e.kind for e in rt.journal.entries(run_id=task.run_id)]
        assert kinds[0] == "run_open" and kinds[-1] == "run_seal"
        assert rt.verify().ok


def test_a_governance_db_invalidated_by_a_failed_checkpoint_is_opened_again(disk):
    from apollia_nb.governance.store import GovernanceStore

    home = Home.at(disk / "home")
    home.ensure()
    store = GovernanceStore(home)
    filler = Filler(disk)
    try:
        store.add_rule("read_file", "deny", by="test")
        assert store.keep_open()
        store._keeper.execute("SET checkpoint_threshold = '1KB'")  # every commit checkpoints
        filler.fill()
        refused = None
        for i in range(100):
            try:
                store.add_rule("write_file", "deny", prefix=f"{i}/" + os.urandom(1500).hex(), by="test")
            except StorageError as exc:
                refused = exc
                break
        assert refused is not None
        filler.free()
        store.add_rule("list_dir", "deny", by="test")  # no restart: the invalidated database is opened again
        assert {"read_file", "list_dir"} <= {r.tool for r in store.rules()}
        assert store.view().readable
    finally:
        filler.free()
        store.close()


def test_a_copy_reported_failed_that_duckdb_committed_is_not_copied_twice(home, monkeypatch):
    """DuckDB can raise for a commit that reached its WAL (the checkpoint after it failed): the retry
    drops what journal.db already holds, after checking it is the very same entries."""
    with Journal.open(home) as journal:
        committed = [journal.append("plan", {"n": i}) for i in range(3)]
        real_insert = journal._insert
        calls = []

        def committed_then_refused(rows):
            calls.append(len(rows))
            real_insert(rows)
            if len(calls) == 1:
                raise duckdb.FatalException('FATAL Error: Failed to create checkpoint because of error: Could '
                                            f'not write file "{home.journal_db}": No space left on device')

        monkeypatch.setattr(journal, "_insert", committed_then_refused)
        with pytest.raises(StorageFull):
            journal.entries()
        committed += [journal.append("plan", {"n": 3})]
        assert [e.seq for e in journal.entries()] == [1, 2, 3, 4]  # no duplicate key, nothing broken
        assert calls == [3, 1]  # the retry copied only the entry journal.db lacked
        assert verify_journal(journal).ok
    with Journal.open(home) as journal:
        assert [e.hash for e in journal.entries()] == [e.hash for e in committed]


def test_a_refused_submit_that_duckdb_committed_after_all_is_undone(home, monkeypatch):
    home.ensure()
    records = RuntimeRecords(home.runtime_db)
    try:
        real = records._upsert_now

        def committed_then_invalidated(table, keys, values, **kw):
            real(table, keys, values, **kw)
            raise duckdb.FatalException('FATAL Error: Failed to create checkpoint because of error: Could not '
                                        f'write file "{home.runtime_db}": No space left on device')

        monkeypatch.setattr(records, "_upsert_now", committed_then_invalidated)
        done = records.save_task(_record("t1"), "2026-12-01T00:00:00Z", acknowledged=True)
        with pytest.raises(StorageFull):
            done.result(timeout=30)
        monkeypatch.setattr(records, "_upsert_now", real)
        records.flush()  # the kept undo ran (after opening runtime.db again)
        assert records.task("t1") is None  # the caller was told it was refused: it never appears
    finally:
        records.close()
    assert _rows(home.runtime_db, "SELECT id FROM tasks") == []


async def test_a_run_ends_once_its_checkpoint_is_signed_and_readers_wait_for_its_store(home):
    """journal.db is slow to store the closing checkpoint: the run's outcome does not wait for it,
    whoever reads checkpoints does (nobody reads one that is not stored), and the witnesses would be
    told only once it is stored."""
    import threading

    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        journal = rt.journal
        held, release = threading.Event(), threading.Event()
        store = journal._store_checkpoint

        def slow_store(cp, note):
            held.set()
            assert release.wait(timeout=30)
            return store(cp, note)

        journal._store_checkpoint = slow_store
        task = await (await rt.submit("clerk", "Finish while journal.db is slow"))
        assert task.status == "completed", task.error
        task_head = journal.head()[0]
        assert not release.is_set()  # returned while the store cannot have finished
        assert await anyio.to_thread.run_sync(held.wait, 30)  # the copier is storing it
        read: list = []
        reader = threading.Thread(target=lambda: read.append(journal.latest_checkpoint()))
        reader.start()
        reader.join(timeout=0.2)
        assert reader.is_alive() and not read  # the reader waits for the store
        release.set()
        await anyio.to_thread.run_sync(reader.join, 30)
        size = int(read[0].splitlines()[1])
        assert size == task_head  # covers the run, its seal included
        assert journal.checkpoints()[-1][2] == read[0]
        assert rt.verify().ok
