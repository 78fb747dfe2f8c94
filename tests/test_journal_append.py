"""Appending to the journal: contiguity, durability, exact bytes, concurrency, group commit, refusals."""

from __future__ import annotations

import asyncio
import json
import math
import os
import stat
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apollia_nb.errors import BadInput, Conflict, HomeLocked, IntegrityError, NotFound, StorageFull
from apollia_nb.journal import Draft, Journal, verify_journal
from apollia_nb.journal.entry import GENESIS_HASH, canonical_json, entry_hash
from apollia_nb.journal.merkle import root, leaf_hash

PY = sys.executable


def _rows(path) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(
            "SELECT seq, ts, run_id, agent, kind, payload, prev_hash, hash, signature, key_id "
            "FROM entries ORDER BY seq"
        ).fetchall()
    finally:
        con.close()


def test_appends_are_contiguous_and_chained(home):
    with Journal.open(home) as journal:
        assert journal.head() == (0, GENESIS_HASH)
        entries = [journal.append("decision", {"call_id": str(i)}, run_id="r1", agent="clerk") for i in range(25)]
        assert [e.seq for e in entries] == list(range(1, 26))
        assert entries[0].prev_hash == GENESIS_HASH
        for before, after in zip(entries, entries[1:]):
            assert after.prev_hash == before.hash
        for e in entries:
            assert e.hash == e.computed_hash()
            assert e.key_id == journal.key_id
        assert journal.head() == (25, entries[-1].hash)
        assert journal.entries() == entries
    rows = _rows(home.journal_db)
    assert [r[0] for r in rows] == list(range(1, 26))


def test_timestamps_are_utc_text_with_microseconds_exactly_as_hashed(home):
    t0 = datetime(2026, 11, 29, 12, 34, 56, 120000, tzinfo=timezone(timedelta(hours=2)))
    with Journal.open(home, clock=lambda: t0, entry_format="1") as journal:
        entry = journal.append("plan", {"steps": []})
    assert entry.ts == "2026-11-29T10:34:56.120000Z"
    assert entry.hash == entry_hash(1, entry.ts, None, None, "plan", entry.payload, GENESIS_HASH)


def test_payload_is_stored_as_the_exact_canonical_bytes(home):
    payload = {"b": 1, "a": "é – ü", "c": [1.5, None, True], "nested": {"z": 0, "y": "\n"}}
    expected = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()
    assert canonical_json(payload) == expected
    with Journal.open(home, entry_format="1") as journal:  # format 2 stores salts beside the fields
        entry = journal.append("tool_call", payload, run_id="r", agent="a")
        assert entry.payload == expected
        assert entry.data() == payload
    (row,) = _rows(home.journal_db)
    assert row[5] == expected
    assert row[7] == entry_hash(1, row[1], "r", "a", "tool_call", expected, GENESIS_HASH)


@pytest.mark.parametrize(
    "payload",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": {1, 2}},
        {"x": object()},
        {1: "int key"},
        {"x": {"deep": b"bytes"}},
        {"x": "\ud800"},
        ["not", "an", "object"],
        "text",
    ],
    ids=["nan", "inf", "set", "object", "int-key", "bytes", "lone-surrogate", "list", "str"],
)
def test_non_json_payload_is_refused_and_nothing_is_written(home, payload):
    with Journal.open(home) as journal:
        journal.append("plan", {"ok": True})
        with pytest.raises(BadInput) as info:
            journal.append("plan", payload)
        assert info.value.code == "BAD_INPUT"
        assert journal.head()[0] == 1
        assert journal.append("plan", {"ok": True}).seq == 2
    assert [r[0] for r in _rows(home.journal_db)] == [1, 2]


@pytest.mark.parametrize(
    "kwargs",
    [{"kind": "Bad Kind"}, {"kind": ""}, {"kind": 3}, {"run_id": 7}, {"agent": b"x"}],
)
def test_bad_columns_are_refused(home, kwargs):
    args = {"kind": "plan", "payload": {}, **kwargs}
    with Journal.open(home) as journal:
        with pytest.raises(BadInput):
            journal.append(args.pop("kind"), args.pop("payload"), **args)
        assert journal.head()[0] == 0


def test_append_many_is_atomic(home):
    with Journal.open(home) as journal:
        with pytest.raises(BadInput):
            journal.append_many([("plan", {"a": 1}), Draft("plan", {"b": math.nan})])
        assert journal.head()[0] == 0
        entries = journal.append_many([("plan", {"a": 1}), Draft("run_seal", {"status": "done", "entries": 1}, "r", "x")])
        assert [e.seq for e in entries] == [1, 2]
        assert entries[1].run_id == "r" and entries[1].agent == "x"
        assert journal.stats["transactions"] == 1
        assert journal.append_many([]) == []


def test_append_is_durable_when_it_returns(home):
    """A child appends and kills itself (SIGKILL) the moment append returns; the entry is there."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        journal = Journal.open(Home.at({str(home.path)!r}))
        entry = journal.append("tool_call", {{"call_id": "c1", "tool": "t", "arguments": {{}}}}, run_id="r1")
        os.write(1, f"{{entry.seq}} {{entry.hash.hex()}}\\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    seq, digest = out.stdout.split()
    with Journal.open(home) as journal:
        entry = journal.get(int(seq))
        assert entry.hash.hex() == digest
        assert entry.data() == {"call_id": "c1", "tool": "t", "arguments": {}}
        assert verify_journal(journal).ok


def test_concurrent_appends_from_16_threads_form_one_valid_chain(home):
    per_thread = 40
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    with Journal.open(home) as journal:

        def worker(n: int) -> None:
            try:
                barrier.wait()
                for i in range(per_thread):
                    journal.append("tool_call", {"thread": n, "i": i}, run_id=f"run-{n}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        total = 16 * per_thread
        assert journal.head()[0] == total
        seen = {(e.data()["thread"], e.data()["i"]) for e in journal.entries()}
        assert seen == {(n, i) for n in range(16) for i in range(per_thread)}
        for n in range(16):  # each thread's appends keep their order
            assert [e.data()["i"] for e in journal.entries(run_id=f"run-{n}")] == list(range(per_thread))
        report = verify_journal(journal)
        assert report.ok and report.entries == total
        # Group commit: waiting appenders share transactions.
        assert journal.stats["transactions"] <= total // 2
        assert journal.stats["largest_batch"] > 1


def test_concurrent_appends_from_asyncio_tasks_share_one_commit(home):
    """The writer's clock is gated until every task has queued: at most two transactions."""
    gate = threading.Event()

    def clock() -> datetime:
        gate.wait(timeout=30)
        return datetime.now(timezone.utc)

    async def main(journal: Journal) -> list:
        async def open_gate() -> None:
            gate.set()

        tasks = [journal.append_async("decision", {"i": i}, run_id="r") for i in range(16)]
        results = await asyncio.gather(*tasks, open_gate())
        return results[:16]

    with Journal.open(home, clock=clock) as journal:
        entries = asyncio.run(main(journal))
        assert sorted(e.seq for e in entries) == list(range(1, 17))
        assert sorted(e.data()["i"] for e in entries) == list(range(16))
        assert journal.stats["transactions"] <= 2
        assert journal.stats["largest_batch"] >= 8
        assert verify_journal(journal).ok


def test_append_async_does_not_block_the_event_loop(home):
    """While the writer is held, the loop still runs the task that releases it."""
    gate = threading.Event()
    taken = threading.Event()

    def clock() -> datetime:
        taken.set()
        if not gate.wait(timeout=30):
            raise TimeoutError("the event loop was blocked")
        return datetime.now(timezone.utc)

    async def main(journal: Journal):
        append = asyncio.ensure_future(journal.append_async("plan", {"steps": ["a"]}))
        # The loop must stay free while the writer holds the entry, or this never returns.
        await asyncio.get_running_loop().run_in_executor(None, taken.wait)
        assert not append.done()
        gate.set()
        return await append

    with Journal.open(home, clock=clock) as journal:
        entry = asyncio.run(main(journal))
        assert entry.seq == 1
        assert journal.entries() == [entry]


def test_a_cancelled_queued_append_is_not_written(home):
    gate = threading.Event()
    taken = threading.Event()

    def clock() -> datetime:
        taken.set()
        gate.wait(timeout=30)
        return datetime.now(timezone.utc)

    async def main(journal: Journal) -> None:
        first = asyncio.ensure_future(journal.append_async("plan", {"n": 1}))
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, taken.wait)  # writer holds entry 1
        second = asyncio.ensure_future(journal.append_async("plan", {"n": 2}))
        await asyncio.sleep(0)  # a yield, not a wait: the task runs up to its queued future
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second  # by now its queued request is cancelled too
        gate.set()
        assert (await first).seq == 1

    with Journal.open(home, clock=clock) as journal:
        asyncio.run(main(journal))
        assert [e.data() for e in journal.entries()] == [{"n": 1}]
        assert journal.append("plan", {"n": 3}).seq == 2


def test_a_failed_commit_raises_and_writes_nothing_of_its_group(home, monkeypatch):
    """The disk fails half-way through a group's record: nothing of it is written, the next commit works."""
    import errno

    from apollia_nb.journal import tail as tail_module

    real_pwrite = os.pwrite
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})

        def half_then_fail(fd, data, offset):
            if not any(data):
                return real_pwrite(fd, data, offset)  # the writer zeroing what it wrote
            real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(tail_module.os, "pwrite", half_then_fail)
        with pytest.raises(StorageFull) as info:
            journal.append_many([("plan", {"n": 2}), ("plan", {"n": 3})])
        assert info.value.code == "STORAGE_FULL"
        assert "nothing of it was recorded" in info.value.message
        assert "No space left" in info.value.message
        assert journal.head()[0] == 1
        monkeypatch.setattr(tail_module.os, "pwrite", real_pwrite)
        assert journal.append("plan", {"n": 4}).seq == 2
        assert [e.data() for e in journal.entries()] == [{"n": 1}, {"n": 4}]
    with Journal.open(home) as journal:
        assert [e.data() for e in journal.entries()] == [{"n": 1}, {"n": 4}]
        assert verify_journal(journal).ok


def test_an_entry_written_behind_the_journals_back_breaks_it_and_nothing_is_lost(home):
    """Someone inserts seq 2 into journal.db directly: the copy of the real seq 2 fails, the
    journal refuses from then on (fail closed), and the committed entries stay in journal.log."""
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
        cursor = journal.cursor()
        try:
            cursor.execute("INSERT INTO entries SELECT 2, ts, run_id, agent, kind, payload, prev_hash, "
                           "hash, signature, key_id FROM entries WHERE seq = 1")
        finally:
            cursor.close()
        committed = journal.append_many([("plan", {"n": 2}), ("plan", {"n": 3})])  # durable in the log
        assert [e.seq for e in committed] == [2, 3]
        with pytest.raises(IntegrityError, match="kept there"):
            journal.entries()
        with pytest.raises(IntegrityError, match="nothing of them was written"):
            journal.append("plan", {"n": 4})
        with pytest.raises(IntegrityError):
            journal.close()
    log = home.journal_db.with_suffix(".log")
    before = log.read_bytes()
    assert before
    with pytest.raises(IntegrityError, match="is not the entry journal.db holds"):
        Journal.open(home)
    assert log.read_bytes() == before  # refused, and nothing changed


def test_entries_filters(home):
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task"}, run_id="a", agent="x")
        journal.append("decision", {"call_id": "1"}, run_id="a", agent="x")
        journal.append("run_open", {"run_kind": "chat"}, run_id="b", agent="y")
        journal.append("decision", {"call_id": "2"}, run_id="b", agent="y")
        assert [e.seq for e in journal.entries(run_id="a")] == [1, 2]
        assert [e.seq for e in journal.entries(since_seq=2)] == [3, 4]
        assert [e.seq for e in journal.entries(kinds=["decision"])] == [2, 4]
        assert [e.seq for e in journal.entries(run_id="b", kinds=["decision"])] == [4]
        assert journal.entries(kinds=[]) == []
        assert [e.seq for e in journal.entries(limit=1, since_seq=1)] == [2]
        assert journal.get(3).run_id == "b"
        with pytest.raises(NotFound):
            journal.get(9)


def test_keys_are_created_once_with_private_mode(home):
    with Journal.open(home) as journal:
        public = journal.public_key()
    key = home.keys_dir / "journal.key"
    pub = home.keys_dir / "journal.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(pub.stat().st_mode) == 0o644
    seed_text = key.read_text()
    with Journal.open(home) as journal:
        assert journal.public_key() == public
    assert key.read_text() == seed_text


def test_checkpoints_proofs_and_close(home):
    with Journal.open(home) as journal:
        for i in range(10):
            journal.append("decision", {"i": i})
        note = journal.checkpoint()
        assert journal.checkpoint() == note  # nothing new: the same checkpoint
        assert journal.latest_checkpoint() == note
        hashes = [e.hash for e in journal.entries()]
        from apollia_nb.journal.checkpoint import open_checkpoint

        cp = open_checkpoint(note, [journal.verifier()], origin=journal.origin)
        assert (cp.size, cp.root) == (10, root([leaf_hash(h) for h in hashes]))
        proof = journal.inclusion_proof(4)
        assert proof.tree_size == 10 and proof.entry_hash == hashes[3]
        proof.verify(journal.verifier())
        journal.append("decision", {"i": 10})
        newer = journal.inclusion_proof(11)  # writes a checkpoint that covers it
        assert newer.tree_size == 11
        assert journal.inclusion_proof(4, checkpoint=note).tree_size == 10
        consistency = journal.consistency_proof(10)
        assert (consistency.old_size, consistency.new_size) == (10, 11)
        assert consistency.old_root == cp.root
        with pytest.raises(NotFound):
            journal.inclusion_proof(12)
        with pytest.raises(BadInput):
            journal.inclusion_proof(0)
        journal.append("decision", {"i": 11})
    # close wrote a checkpoint over all 12 entries
    with Journal.open(home) as journal:
        latest = open_checkpoint(journal.latest_checkpoint(), [journal.verifier()])
        assert latest.size == 12
        sizes = [s for s, _, _ in journal.checkpoints()]
    assert sizes == [10, 11, 12]
    with Journal.open(home):
        pass  # nothing appended: no new checkpoint
    con = duckdb.connect(str(home.journal_db), read_only=True)
    assert con.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 3
    con.close()


def test_closed_journal_refuses_appends(home):
    journal = Journal.open(home)
    journal.close()
    journal.close()  # idempotent
    with pytest.raises(Conflict):
        journal.append("plan", {})


def test_open_without_create_needs_a_journal(home):
    with pytest.raises(NotFound):
        Journal.open(home, create=False)
    assert not home.journal_db.exists()


def test_second_open_in_the_same_process_is_refused(home):
    with Journal.open(home):
        with pytest.raises(HomeLocked) as info:
            Journal.open(home)
        assert str(os.getpid()) in info.value.message


def test_second_process_gets_home_locked_naming_the_pid(home):
    script = textwrap.dedent(
        f"""
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        from apollia_nb.errors import HomeLocked
        try:
            Journal.open(Home.at({str(home.path)!r}))
        except HomeLocked as exc:
            print(exc.code, exc.message)
        """
    )
    with Journal.open(home):
        out = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("HOME_LOCKED"), out.stderr
    assert f"process {os.getpid()}" in out.stdout
    assert "apollia-os serve" in out.stdout


@settings(max_examples=500, deadline=None)
@given(moment=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                           timezones=st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-1439, 1439))))
def test_a_timestamp_is_written_as_strftime_writes_it_in_utc(moment):
    """The timestamp is hashed: its text must not depend on which way it was formatted."""
    from apollia_nb.journal.entry import format_ts

    assert format_ts(moment) == moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert format_ts(moment.astimezone(timezone.utc)) == format_ts(moment)
