"""journal.log: commits land there first, are copied into journal.db in batches, and survive crashes.

The log is security-relevant parsing: a torn last write is dropped, anything else that
is wrong (damage before the end, a forged entry, another journal's log, an entry that
contradicts journal.db) refuses the open and changes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime

import duckdb
import pytest

from apollia_nb.errors import Conflict, IntegrityError, StorageError, StorageFull
from apollia_nb.journal import Journal, verify_journal
from apollia_nb.journal import tail as tail_module
from apollia_nb.journal.export import export_home
from apollia_nb.journal.store import IMPORT_BATCH
from apollia_nb.journal.tail import encode_rows, read_tail
from apollia_nb.journal.verify import verify_home


def _log(home):
    return home.journal_db.with_suffix(".log")


def _db_seqs(home) -> list[int]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT seq FROM entries ORDER BY seq").fetchall()]
    finally:
        con.close()


def _until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def crash(home, groups: list[int]) -> None:
    """A child process appends groups of entries (sizes given) and is killed with SIGKILL."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        journal = Journal.open(Home.at({str(home.path)!r}))
        n = 0
        for size in {groups!r}:
            journal.append_many([("plan", {{"n": n + i}}, "run-1", "clerk") for i in range(size)])
            n += size
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr


def _records(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of each record in a log's bytes (zeros follow the last)."""
    spans, offset = [], 0
    while offset < len(data) and data[offset : offset + 4] == tail_module.MAGIC:
        length = int.from_bytes(data[offset + 4 : offset + 8], "big")
        end = offset + 40 + length
        spans.append((offset, end))
        offset = end
    return spans


def _rewrite_last_entry(data: bytes, change) -> bytes:
    """The log with its last record's last row changed by ``change(row)`` and a valid checksum."""
    offset, end = _records(data)[-1]
    body = json.loads(data[offset + 40 : end])
    change(body[-1])
    rows = tail_module._decode_body(json.dumps(body).encode())
    return data[:offset] + encode_rows(rows) + b"\0" * 4096


# --- the happy path --------------------------------------------------------------------------


def test_a_commit_is_a_record_of_the_log_and_reads_see_it(home):
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
        journal.append_many([("plan", {"n": 2}), ("plan", {"n": 3})])
        assert [r[0] for r in read_tail(_log(home)).rows] == [1, 2, 3]
        assert [e.data()["n"] for e in journal.entries()] == [1, 2, 3]  # a read copies first
        assert journal.stats["imports"] >= 1
        cursor = journal.cursor()
        try:
            assert cursor.execute("SELECT count(*) FROM entries").fetchone()[0] == 3
        finally:
            cursor.close()


def test_a_clean_close_leaves_everything_in_journal_db_and_no_log(home):
    with Journal.open(home) as journal:
        for i in range(10):
            journal.append("plan", {"n": i})
    assert not _log(home).exists()
    assert _db_seqs(home) == list(range(1, 11))
    report = verify_home(home)
    assert report.ok and report.entries == 10


def test_the_writer_copies_a_full_batch_and_when_idle_without_a_read(home):
    with Journal.open(home) as journal:
        journal.append_many([("plan", {"n": i}) for i in range(IMPORT_BATCH)])
        _until(lambda: journal.stats["imports"] >= 1, "the batch copy")
        journal.append("plan", {"n": "last"})
        _until(lambda: journal.stats["imports"] >= 2, "the idle copy")


def test_the_log_starts_over_when_full_once_everything_is_copied(home, monkeypatch):
    monkeypatch.setattr(tail_module, "PREALLOCATE", 8192)
    with Journal.open(home) as journal:
        for i in range(60):  # several times what 8 KiB holds
            journal.append("plan", {"n": i, "text": "x" * 200})
        assert _log(home).stat().st_size < 8192 + 4096
        left = read_tail(_log(home)).rows
        assert left and left[-1][0] == 60 and left[0][0] > 1  # only the latest records remain
        assert [e.data()["n"] for e in journal.entries()] == list(range(60))
        assert verify_journal(journal).ok


# --- crashes -------------------------------------------------------------------------------


def test_a_crash_leaves_committed_entries_in_the_log_and_the_next_open_copies_them(home, tmp_path):
    crash(home, [1, 3, 2, 4])
    log = _log(home)
    left = read_tail(log)
    assert [r[0] for r in left.rows] == list(range(1, 11))  # all ten committed, none copied yet
    before = log.read_bytes()

    # Offline readers take them from the log and write nothing.
    report = verify_home(home)
    assert report.ok and report.entries == 10
    exported = export_home(home, tmp_path / "bundle")
    assert exported.entries == 10
    assert log.read_bytes() == before

    with Journal.open(home) as journal:
        assert read_tail(log).rows == []  # copied, and the log started over
        entries = journal.entries()
        assert [e.data()["n"] for e in entries] == list(range(10))
        assert all(e.run_id == "run-1" for e in entries)
        assert verify_journal(journal).ok
        assert journal.append("plan", {"n": 10}).seq == 11
    assert _db_seqs(home) == list(range(1, 12))


def test_a_torn_last_record_is_dropped_and_the_rest_is_kept(home):
    crash(home, [2, 2])
    log = _log(home)
    data = log.read_bytes()
    offset, end = _records(data)[-1]
    record = data[offset:end]
    zeros = b"\0" * 4096
    torn_writes = {
        "body cut short": record[:-7],
        "header cut short": record[:20],
        "header half written": b"AJ",
        "all zeros": b"",
    }
    for what, torn in torn_writes.items():
        log.write_bytes(data[:end] + torn + zeros)
        read = read_tail(log)
        assert [r[0] for r in read.rows] == [1, 2, 3, 4], what
        assert read.torn == bool(torn), what
        assert verify_home(home).entries == 4, what
    with Journal.open(home) as journal:
        assert journal.head()[0] == 4
        assert read_tail(log).rows == []
        assert journal.append("plan", {"n": 4}).seq == 5
        assert verify_journal(journal).ok


def test_a_torn_last_record_whose_checksum_fails_is_dropped(home):
    crash(home, [2, 2])
    log = _log(home)
    data = bytearray(log.read_bytes())
    _, end = _records(bytes(data))[-1]
    data[end - 3] ^= 0x01  # the last record's body; only zeros follow it
    log.write_bytes(bytes(data))
    with Journal.open(home) as journal:
        assert journal.head()[0] == 2


def test_damage_before_the_end_refuses_the_open_and_changes_nothing(home):
    crash(home, [2, 2])
    log = _log(home)
    data = bytearray(log.read_bytes())
    data[45] ^= 0x01  # inside the first record's body; a second record follows
    log.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="damaged at byte 0"):
        Journal.open(home)
    assert log.read_bytes() == bytes(data)
    assert _db_seqs(home) == []  # nothing was copied
    report = verify_home(home)
    assert (report.ok, report.entries, report.first_bad_seq, report.checked_checkpoints) == (False, 0, None, 0)
    assert "damaged at byte 0" in report.problem and report.summary() == f"FAILED: {report.problem}"
    data[45] ^= 0x01
    data[0:4] = b"XXXX"  # a header that is not a record's
    log.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="no valid header"):
        Journal.open(home)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda row: row.__setitem__(5, "eyJuIjo5OX0="), "does not hash to its stored hash"),  # payload {"n":99}
        (lambda row: row.__setitem__(8, "00" * 64), "not signed by this journal's key"),
        (lambda row: row.__setitem__(9, "someone-else"), "not signed by this journal's key"),
        (lambda row: row.__setitem__(0, row[0] + 1), "does not continue the journal"),
    ],
    ids=["payload", "signature", "key-id", "seq"],
)
def test_a_forged_entry_in_the_log_refuses_the_open(home, change, message):
    crash(home, [2, 2])
    log = _log(home)
    forged = _rewrite_last_entry(log.read_bytes(), change)
    log.write_bytes(forged)
    with pytest.raises(IntegrityError, match=message):
        Journal.open(home)
    assert log.read_bytes() == forged


def test_another_journals_log_refuses_the_open(home, tmp_path):
    from apollia_nb.home import Home

    other = Home.at(tmp_path / "other")
    crash(other, [3])
    with Journal.open(home) as journal:
        journal.append("plan", {"mine": True})
    _log(home).write_bytes(_log(other).read_bytes())
    with pytest.raises(IntegrityError):
        Journal.open(home)
    assert _db_seqs(home) == [1]


def test_entries_already_copied_must_be_the_very_same(home):
    """A crash between a copy and the log's truncation: the log repeats entries journal.db holds."""
    crash(home, [2, 3])
    log = _log(home)
    data = log.read_bytes()
    with Journal.open(home):
        pass  # copies the five, removes the log
    assert not log.exists()
    log.write_bytes(data)
    with Journal.open(home) as journal:  # the same entries again: taken as already there
        assert journal.head()[0] == 5
        assert [e.data()["n"] for e in journal.entries()] == list(range(5))
    log.write_bytes(_rewrite_last_entry(data, lambda row: row.__setitem__(5, "eyJuIjo5OX0=")))
    with pytest.raises(IntegrityError, match="is not the entry journal.db holds"):
        Journal.open(home)
    assert not verify_home(home).ok


# --- failures while running --------------------------------------------------------------------


def test_a_failed_sync_writes_nothing_and_the_next_commit_works(home, monkeypatch):
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})

        def failing_sync(fd):
            raise OSError(errno.EIO, "Input/output error")

        real = os.fdatasync
        monkeypatch.setattr(tail_module.os, "fdatasync", failing_sync)
        with pytest.raises(StorageError, match="nothing of it was recorded") as caught:
            journal.append("plan", {"n": 2})
        assert caught.value.code == "STORAGE_ERROR"
        monkeypatch.setattr(tail_module.os, "fdatasync", real)
        assert journal.append("plan", {"n": 3}).seq == 2
        assert [e.data()["n"] for e in journal.entries()] == [1, 3]


def test_append_soon_commits_in_order_before_anything_later(home):
    with Journal.open(home) as journal:
        future = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1", agent="clerk")
        later = journal.append("tool_call", {"call_id": "c2"}, run_id="r1", agent="clerk")
        assert future.done()  # committed before the later append returned
        [entry] = future.result()
        assert entry.seq < later.seq
        assert [e.kind for e in journal.entries(run_id="r1")] == ["tool_result", "tool_call"]
        assert journal.run_size("r1") == 2


def _no_space(fd, data, offset):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_append_soon_stops_its_run_and_only_its_run(home, monkeypatch):
    real_pwrite = os.pwrite
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")

        monkeypatch.setattr(tail_module.os, "pwrite", _no_space)
        future = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
        with pytest.raises(StorageFull):
            future.result(timeout=10)
        monkeypatch.setattr(tail_module.os, "pwrite", real_pwrite)
        with pytest.raises(StorageFull, match="run r1 cannot go on"):
            journal.append("tool_call", {"call_id": "c2"}, run_id="r1")
        assert journal.append("run_open", {"run_kind": "task"}, run_id="r2").seq == 2
        assert [e.run_id for e in journal.entries()] == ["r1", "r2"]


def test_a_run_whose_handed_over_entry_failed_cannot_be_sealed_and_nothing_is_written(home, monkeypatch):
    import asyncio

    real_pwrite = os.pwrite
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")
        monkeypatch.setattr(tail_module.os, "pwrite", _no_space)
        with pytest.raises(StorageFull):
            journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1").result(timeout=10)
        monkeypatch.setattr(tail_module.os, "pwrite", real_pwrite)
        head = journal.head()
        with pytest.raises(StorageFull, match="run r1 cannot go on"):
            asyncio.run(journal.seal_async("r1", None, [("task_status", {"status": "failed"})],
                                           {"status": "failed"}))
        with pytest.raises(StorageFull, match="run r1 cannot go on"):  # nothing but the seal: refused too
            asyncio.run(journal.seal_async("r1", None, [], {"status": "failed"}))
        assert journal.head() == head


def test_a_seal_takes_the_entries_handed_over_before_it_into_its_own_commit(home, monkeypatch):
    """What the run handed over (``append_soon``) and its end are one commit, one sync; the seal
    counts them, and the closing checkpoint covers the seal."""
    import asyncio

    from apollia_nb.journal import store as store_module

    monkeypatch.setattr(store_module, "SOON_WAIT_SECS", 5.0)  # however slow this thread, nobody commits them first
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")
        before = journal.stats["transactions"]
        journal.append_soon("model_response", {"text": "done"}, run_id="r1")
        journal.append_soon("verdict", {"verdict": "pass"}, run_id="r1")
        written, stored = asyncio.run(journal.seal_async("r1", "clerk", [("task_status", {"status": "completed"})],
                                                         {"status": "completed"}))
        assert journal.stats["transactions"] == before + 1
        assert [e.kind for e in journal.entries(run_id="r1")] == ["run_open", "model_response", "verdict",
                                                                  "task_status", "run_seal"]
        assert written[-1].data() == {"status": "completed", "entries": 4}
        note = stored.result(timeout=30)
        assert journal.checkpoints()[-1][0] == written[-1].seq and journal.latest_checkpoint() == note


def _sealed_run(journal):
    import asyncio

    journal.append("run_open", {"run_kind": "task"}, run_id="r1")
    written, stored = asyncio.run(journal.seal_async("r1", None, [], {"status": "completed"}))
    return written[-1], stored


def test_a_runs_closing_checkpoint_is_stored_once_the_journal_is_idle_not_as_the_run_ends(home, monkeypatch):
    """Its DuckDB write would hold the interpreter lock while the run that just ended finishes: the
    copier stores it once no commit came for ``IMPORT_IDLE_SECS``, nobody asking meanwhile."""
    from apollia_nb.journal import store as store_module

    monkeypatch.setattr(store_module, "IMPORT_IDLE_SECS", 30.0)
    with Journal.open(home) as journal:
        seal, stored = _sealed_run(journal)
        with pytest.raises(FutureTimeout):
            stored.result(timeout=0.3)  # held back: the journal was committed to just now
    monkeypatch.setattr(store_module, "IMPORT_IDLE_SECS", 0.05)
    with Journal.open(home) as journal:
        seal, stored = _sealed_run(journal)
        note = stored.result(timeout=30)  # idle: stored without anyone asking
        assert journal.latest_checkpoint() == note and journal.checkpoints()[-1][0] == seal.seq


@pytest.mark.parametrize("ask", ["latest_checkpoint", "checkpoint", "checkpoints", "inclusion_proof", "close"])
def test_whoever_needs_a_held_back_closing_checkpoint_has_it_stored_at_once(home, monkeypatch, ask):
    from apollia_nb.journal import store as store_module

    monkeypatch.setattr(store_module, "IMPORT_IDLE_SECS", 30.0)  # it would wait that long otherwise
    journal = Journal.open(home)
    seal, stored = _sealed_run(journal)
    started = time.monotonic()
    if ask == "close":
        journal.close()
    else:
        if ask == "inclusion_proof":
            assert journal.inclusion_proof(seal.seq).tree_size == seal.seq
        else:
            getattr(journal, ask)()
        assert journal.checkpoints()[-1][0] == seal.seq
        journal.close()
    assert stored.result(timeout=0) and time.monotonic() - started < 10
    with Journal.open(home) as again:
        assert again.checkpoints()[-1][0] == seal.seq and verify_journal(again).ok


def test_a_seal_counts_the_entries_a_run_had_before_the_journal_was_opened_again(home):
    import asyncio

    with Journal.open(home) as journal:
        journal.append_many([("run_open", {"run_kind": "task"}, "r1"), ("plan", {"n": 1}, "r1"),
                             ("plan", {"n": 2}, "r2")])
    with Journal.open(home) as journal:
        journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
        written, stored = asyncio.run(journal.seal_async("r1", None, [], {"status": "completed"}))
        assert [e.kind for e in written] == ["run_seal"] and written[0].data()["entries"] == 3
        stored.result(timeout=30)
        assert verify_journal(journal).ok


def test_without_fdatasync_pwrite_or_fallocate_the_log_still_commits(home, monkeypatch):
    """As on macOS (no fdatasync, no posix_fallocate) or Windows (no pwrite): the nearest call stands in."""
    script = textwrap.dedent(
        f"""
        import os, signal
        for name in ("fdatasync", "pwrite", "posix_fallocate"):
            if hasattr(os, name):
                delattr(os, name)
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        journal = Journal.open(Home.at({str(home.path)!r}))
        for i in range(3):
            journal.append("plan", {{"n": i}})
        journal.append_many([("plan", {{"n": 3}}), ("plan", {{"n": 4}})])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert [r[0] for r in read_tail(_log(home)).rows] == [1, 2, 3, 4, 5]
    for name in ("fdatasync", "pwrite", "posix_fallocate"):
        monkeypatch.delattr(os, name, raising=False)
    with Journal.open(home) as journal:
        assert [e.data()["n"] for e in journal.entries()] == [0, 1, 2, 3, 4]
        assert journal.append("plan", {"n": 5}).seq == 6
        assert verify_journal(journal).ok
    assert not _log(home).exists()


def test_the_log_writes_its_zeros_ahead_once_a_piece_and_the_records_read_back(tmp_path, monkeypatch):
    """Preallocated space is written (zeros) a ``ZERO_AHEAD`` piece at a time: the first as the log
    starts, each next one with the record that reaches it, so the records' syncs are overwrites;
    what the file holds is unchanged."""
    from apollia_nb.journal.tail import TailLog

    monkeypatch.setattr(tail_module, "PREALLOCATE", 64 * 1024)
    monkeypatch.setattr(tail_module, "ZERO_AHEAD", 16 * 1024)
    writes: list[tuple[int, int, bool]] = []  # (offset, length, all zeros)
    real_pwrite = os.pwrite

    def seen(fd, data, offset):
        writes.append((offset, len(data), not any(data)))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(tail_module.os, "pwrite", seen)
    log = TailLog(tmp_path / "journal.log")
    rows = [(i, "2026-12-04T00:00:00.000000Z", "r1", "a", "plan", b"x" * 1000, b"\0" * 32, b"\1" * 32,
             b"\2" * 64, "k") for i in range(1, 31)]  # about 51 KB of records
    for row in rows:
        log.append([row])
    log.close()
    zeros = [(offset, length) for offset, length, blank in writes if blank]
    ends = [offset + length for offset, length in zeros]
    assert ends == [16384, 32768, 49152, 65536]  # each piece once, up to the preallocated end
    assert zeros[0] == (0, 16384)  # the first as the file is made (synced with its preallocation)
    assert all(offset % 16384 for offset, _ in zeros[1:])  # the others right after the record reaching them
    assert len(writes) == 30 + 4
    read = read_tail(tmp_path / "journal.log")
    assert [r[0] for r in read.rows] == list(range(1, 31)) and not read.torn
    assert (tmp_path / "journal.log").stat().st_size == 64 * 1024


def test_zeros_the_disk_refuses_ahead_do_not_fail_the_commit(tmp_path, monkeypatch):
    from apollia_nb.journal.tail import TailLog

    real_pwrite = os.pwrite

    def no_room_for_zeros(fd, data, offset):
        if not any(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(tail_module.os, "pwrite", no_room_for_zeros)
    log = TailLog(tmp_path / "journal.log")
    log.append([(1, "2026-12-04T00:00:00.000000Z", None, None, "plan", b"{}", b"\0" * 32, b"\1" * 32,
                 b"\2" * 64, "k")])
    log.close()
    assert [r[0] for r in read_tail(tmp_path / "journal.log").rows] == [1]


# --- the parser against arbitrary damage ------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _valid_log() -> tuple[bytes, list[tuple]]:
    """A log of four records (1, 3, 2 and 1 entries) signed by a real key, with zeros after."""
    from apollia_nb.journal.entry import GENESIS_HASH, canonical_payload, entry_hash
    from apollia_nb.journal.keys import JournalKey

    key = JournalKey.from_seed(bytes(range(32)))
    rows, prev, seq, data = [], GENESIS_HASH, 0, b""
    for size in (1, 3, 2, 1):
        group = []
        for _ in range(size):
            seq += 1
            payload = canonical_payload({"n": seq, "text": "AJT1 inside a payload" if seq == 3 else "x"})
            h = entry_hash(seq, "2026-11-30T00:00:00.000000Z", "r", "a", "plan", payload, prev)
            group.append((seq, "2026-11-30T00:00:00.000000Z", "r", "a", "plan", payload, prev, h, key.sign(h),
                          key.key_id))
            prev = h
        rows += group
        data += encode_rows(group)
    return data + b"\0" * 512, rows


VALID_LOG, VALID_ROWS = _valid_log()

damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(VALID_LOG) - 1), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, len(VALID_LOG)), st.just(0)),
    st.tuples(st.just("garbage"), st.integers(0, len(VALID_LOG)), st.binary(min_size=1, max_size=64)),
)


def _damaged(steps) -> bytes:
    data = bytearray(VALID_LOG)
    for kind, at, arg in steps:
        at = min(at, len(data))
        if kind == "flip" and at < len(data):
            data[at] ^= arg
        elif kind == "cut":
            del data[at:]
        elif kind == "garbage":
            data[at : at + len(arg)] = arg
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(damage, min_size=1, max_size=3))
def test_any_damage_gives_a_refusal_or_a_prefix_of_the_true_entries(tmp_path, steps):
    """Whatever is done to the bytes, the reader refuses or returns entries that were written,
    in order, from the first: never an entry nobody wrote, never another error."""
    path = tmp_path / "journal.log"
    path.write_bytes(_damaged(steps))
    try:
        read = read_tail(path)
    except IntegrityError:
        return
    assert read.rows == VALID_ROWS[: len(read.rows)]


# --------------------------------------------------------------------------- who commits


def _committing_threads(journal: Journal) -> list[str]:
    """The names of the threads that sequence each request from now on (the clock is read there,
    once per request: its entries share their moment)."""
    seen: list[str] = []
    real = journal._clock

    def clock() -> datetime:
        seen.append(threading.current_thread().name)
        return real()

    journal._clock = clock
    return seen


def test_a_blocking_append_commits_in_its_own_thread_with_the_soon_entries_before_it(home):
    """Nobody else commits: the appender sequences and commits itself, taking the run's handed-over
    result with it in one transaction (one sync), in the order they were handed over."""
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")
        seen = _committing_threads(journal)
        before = journal.stats["transactions"]
        results = []

        def call() -> None:
            soon = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
            results.append(journal.append_many([("decision", {"call_id": "c2"}, "r1"), ("tool_call", {"call_id": "c2"}, "r1")]))
            results.append(soon.result(timeout=0))  # done: committed with the append that returned

        worker = threading.Thread(target=call, name="tool-worker")
        worker.start()
        worker.join()
        assert seen == ["tool-worker"] * 2  # the soon entry's request, then the appender's own
        assert journal.stats["transactions"] == before + 1
        assert [e.kind for e in journal.entries(run_id="r1")] == ["run_open", "tool_result", "decision", "tool_call"]
        assert [e.seq for e in results[1] + results[0]] == [2, 3, 4]
        assert verify_journal(journal).ok


def test_a_lone_soon_entry_is_committed_by_the_writer_after_a_short_wait(home):
    """Nothing follows it: the writer commits it itself, no earlier than SOON_WAIT_SECS after it was
    handed over (an appender could have taken it until then) and without anyone asking."""
    from apollia_nb.journal.store import SOON_WAIT_SECS

    with Journal.open(home) as journal:
        seen = _committing_threads(journal)
        handed = time.monotonic()
        future = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
        [entry] = future.result(timeout=10)
        assert time.monotonic() - handed >= SOON_WAIT_SECS
        assert entry.seq == 1 and seen == [journal._thread.name]
    with Journal.open(home) as journal:
        assert [e.kind for e in journal.entries()] == ["tool_result"]


def test_while_commits_keep_coming_append_soon_does_not_wake_the_writer_and_is_still_committed(home):
    """After a commit the writer looks at the queue by itself every SOON_WAIT_SECS (for
    WRITER_POLL_SECS): a tool's result handed over then wakes nobody, and a lone one is still
    committed by the writer, no earlier than SOON_WAIT_SECS after it was handed over."""
    from apollia_nb.journal.store import SOON_WAIT_SECS, WRITER_POLL_SECS

    assert WRITER_POLL_SECS > 0.01
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")
        woken: list[int] = []
        real = journal._queue_cond.notify
        journal._queue_cond.notify = lambda n=1: (woken.append(n), real(n))[1]
        try:
            for i in range(40):  # as a run does: a result handed over, then the next call's commit
                journal.append_soon("tool_result", {"call_id": f"c{i}"}, run_id="r1")
                journal.append("tool_call", {"call_id": f"c{i + 1}"}, run_id="r1")
                time.sleep(0.003)  # longer than a soon entry waits: a writer woken for it would sleep again
            assert len(woken) <= 4  # (a writer between two of its own waits may be woken; 40 before)
            handed = time.monotonic()
            [lone] = journal.append_soon("tool_result", {"call_id": "last"}, run_id="r1").result(timeout=10)
            waited = time.monotonic() - handed
        finally:
            del journal._queue_cond.notify
        assert SOON_WAIT_SECS <= waited < 5
        assert lone.seq == 82
        assert verify_journal(journal).ok


def test_an_append_waits_for_whoever_commits_and_keeps_the_order_of_a_job_before_it(home):
    """The writer is busy (a checkpoint job it runs is held): an append from another thread does not
    commit past it; the checkpoint describes the entries before the append, the append follows."""
    held, release = threading.Event(), threading.Event()
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
        sign = journal._sign_checkpoint

        def slow_sign():
            held.set()
            assert release.wait(timeout=30)
            return sign()

        journal._sign_checkpoint = slow_sign
        notes: list[str] = []
        checkpointer = threading.Thread(target=lambda: notes.append(journal.checkpoint()))
        checkpointer.start()
        assert held.wait(timeout=30)
        appended: list = []
        appender = threading.Thread(target=lambda: appended.append(journal.append("plan", {"n": 2})))
        appender.start()
        appender.join(timeout=0.2)
        assert appender.is_alive() and not appended  # it waits for the writer's job to end
        release.set()
        checkpointer.join(timeout=30)
        appender.join(timeout=30)
        assert appended[0].seq == 2
        assert journal.checkpoints()[-1][0] == 1 and parse_size(notes[0]) == 1
        assert verify_journal(journal).ok


def parse_size(note: str) -> int:
    return int(note.splitlines()[1])


def test_appends_soon_appends_and_checkpoints_from_many_threads_form_one_valid_chain(home):
    """Blocking appends lead commits or hand over, soon entries ride along, checkpoints come
    between: every entry once, each thread's in the order it made them, every checkpoint a prefix."""
    threads, rounds = 8, 30
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)
    with Journal.open(home) as journal:

        def work(n: int) -> None:
            try:
                barrier.wait()
                for i in range(rounds):
                    soon = journal.append_soon("tool_result", {"n": n, "i": i, "soon": True}, run_id=f"r{n}")
                    journal.append_many([("decision", {"n": n, "i": i}, f"r{n}"), ("tool_call", {"n": n, "i": i}, f"r{n}")])
                    assert soon.done()
                    if i % 10 == 9:
                        journal.checkpoint()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
        assert journal.head()[0] == threads * rounds * 3
        for n in range(threads):
            kinds = [(e.kind, e.data()["i"]) for e in journal.entries(run_id=f"r{n}")]
            assert kinds == [(k, i) for i in range(rounds) for k in ("tool_result", "decision", "tool_call")]
        report = verify_journal(journal)
        assert report.ok and report.entries == threads * rounds * 3
        assert journal.stats["transactions"] < threads * rounds * 2  # soon entries shared commits


def test_a_commit_that_fails_in_the_appenders_thread_fails_it_and_the_soon_entry_it_took(home, monkeypatch):
    real_pwrite = os.pwrite
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="r1")

        soon = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
        monkeypatch.setattr(tail_module.os, "pwrite", _no_space)
        with pytest.raises(StorageFull):
            journal.append("decision", {"call_id": "c2"}, run_id="r2")
        with pytest.raises(StorageFull):
            soon.result(timeout=0)
        monkeypatch.setattr(tail_module.os, "pwrite", real_pwrite)
        with pytest.raises(StorageFull, match="run r1 cannot go on"):
            journal.append("tool_call", {"call_id": "c3"}, run_id="r1")
        assert journal.append("decision", {"call_id": "c4"}, run_id="r2").seq == 2
    with Journal.open(home) as journal:
        assert [(e.kind, e.run_id) for e in journal.entries()] == [("run_open", "r1"), ("decision", "r2")]
        assert verify_journal(journal).ok


def test_an_append_led_while_the_journal_closes_is_committed_before_it_closes(home):
    """close() comes while an appender commits in its own thread: the entry it returned is kept."""
    entered, go_on = threading.Event(), threading.Event()
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
        real = journal._clock

        def clock():
            if threading.current_thread().name == "appender":
                entered.set()
                assert go_on.wait(timeout=30)
            return real()

        journal._clock = clock
        done: list = []
        appender = threading.Thread(target=lambda: done.append(journal.append("plan", {"n": 2})), name="appender")
        appender.start()
        assert entered.wait(timeout=30)
        closer = threading.Thread(target=journal.close)
        closer.start()
        closer.join(timeout=0.2)
        assert closer.is_alive()  # close waits for the commit in progress
        go_on.set()
        appender.join(timeout=30)
        closer.join(timeout=30)
        assert done[0].seq == 2
        with pytest.raises(Conflict):
            journal.append("plan", {"n": 3})
    with Journal.open(home) as journal:
        assert [e.data()["n"] for e in journal.entries()] == [1, 2]
        assert verify_journal(journal).ok


def test_a_soon_entry_handed_over_while_the_writer_waits_on_an_earlier_ones_time_is_still_committed(home):
    """The writer is not woken for a soon entry while it waits for an earlier one's time: it looks at
    the queue again when that time comes, and commits the later one at its own time."""
    from apollia_nb.journal.store import SOON_WAIT_SECS

    with Journal.open(home) as journal:
        seen = _committing_threads(journal)
        first = journal.append_soon("tool_result", {"call_id": "c1"}, run_id="r1")
        journal.append("decision", {"call_id": "c2"}, run_id="r1")  # takes the first with it
        assert first.done() and seen == [threading.current_thread().name] * 2
        handed = time.monotonic()
        second = journal.append_soon("tool_result", {"call_id": "c2"}, run_id="r1")
        [entry] = second.result(timeout=10)
        assert time.monotonic() - handed >= SOON_WAIT_SECS
        assert entry.seq == 3 and seen[2:] == [journal._thread.name]


def test_appenders_that_waited_together_leave_their_next_commits_to_the_writer(home):
    """After a commit that served several waiting appenders, a blocking append queues for the writer
    (one group for all who wait) instead of leading a small commit of its own; once commits serve
    one appender again, it leads again."""
    gate, entered = threading.Event(), threading.Event()
    with Journal.open(home) as journal:
        seen = _committing_threads(journal)
        real = journal._clock

        def clock():
            if threading.current_thread().name == "A" and not gate.is_set():
                entered.set()
                assert gate.wait(timeout=30)
            return real()

        journal._clock = clock
        threads = [threading.Thread(target=journal.append, args=("plan", {"who": name}), name=name)
                   for name in ("A", "B", "C")]
        threads[0].start()  # A leads, and is held while it holds the commit
        assert entered.wait(timeout=30)
        deadline = time.monotonic() + 30
        for thread in threads[1:]:
            thread.start()
        while len(journal._queue) < 2 and time.monotonic() < deadline:  # B and C wait in line
            time.sleep(0.001)
        gate.set()
        for thread in threads:
            thread.join(timeout=30)
        writer = journal._thread.name
        assert seen[-2:] == [writer, writer] and journal.stats["largest_batch"] == 2
        journal.append("plan", {"who": "main"})  # the last commit served two: it queues
        assert seen[-1] == writer
        journal.append("plan", {"who": "main again"})  # the last served one: it leads
        assert seen[-1] == threading.current_thread().name
        assert [e.data()["who"] for e in journal.entries()][-2:] == ["main", "main again"]
