"""The journal's commit path as a table: every move of the writer and the copier, every illegal move,
and what a crash leaves at each step (``apollia_nb/journal/commit.py``), without threads or files."""

from __future__ import annotations

import importlib.util
import random
import shutil
from pathlib import Path

import pytest

from apollia_nb.errors import InvalidTransition
from apollia_nb.journal.commit import (
    COPIER_TRANSITIONS,
    CRASH_POINTS,
    IMPORT_BATCH,
    IMPORT_IDLE_SECS,
    TRIGGERS,
    WRITER_TRANSITIONS,
    Acknowledge,
    AwaitCopy,
    Close,
    CommitCore,
    CopierState,
    Copied,
    CopyBroke,
    CopyRefused,
    CopyRows,
    CopyStart,
    CrashOutcome,
    Drained,
    FailGroup,
    Hurry,
    JobQueued,
    JobTaken,
    LogFailed,
    LogSynced,
    ReleaseWaiters,
    ResetLog,
    Seal,
    Sequenced,
    Stop,
    WakeCopier,
    WriteLog,
    WriterState,
    crash,
)

ROOT = Path(__file__).resolve().parents[1]
W, C = WriterState, CopierState


def writer_in(state: WriterState) -> CommitCore:
    """A core whose writer is in ``state``, on a head of 3 entries all copied."""
    core = CommitCore(3)
    if state is W.CLOSED:
        core.handle(Close())
    if state in (W.GROUPING, W.DRAINING, W.LOGGING):
        core.handle(Sequenced(4, 2))
    if state is W.DRAINING:
        core.handle(Seal(fits=False))
    if state is W.LOGGING:
        core.handle(Seal(fits=True))
    assert core.writer is state
    return core


def copier_in(state: CopierState) -> CommitCore:
    """A core whose copier is in ``state``, with entries 1..2 acknowledged and not copied."""
    core = CommitCore(0)
    for event in (Sequenced(1, 2), Seal(fits=True), LogSynced(now=1.0)):
        core.handle(event)
    if state is C.STOPPED:
        core.handle(Stop())
    if state in (C.COPYING, C.RETRYING, C.BROKEN):
        core.handle(CopyStart())
    if state is C.RETRYING:
        core.handle(CopyRefused(retry_at=2.0))
    if state is C.BROKEN:
        core.handle(CopyBroke())
    assert core.copier is state
    return core


def event_for(trigger: str, core: CommitCore):
    """An event that names ``trigger``, with data that fits ``core``."""
    return {
        "sequenced": lambda: Sequenced(core.sequenced + 1, 1),
        "seal": lambda: Seal(fits=True),
        "seal_full": lambda: Seal(fits=False),
        "drained": lambda: Drained(),
        "log_synced": lambda: LogSynced(now=5.0),
        "log_failed": lambda: LogFailed(),
        "close": lambda: Close(),
        "copy_start": lambda: CopyStart(),
        "copied": lambda: Copied(core.copying),
        "copy_refused": lambda: CopyRefused(retry_at=9.0),
        "copy_broke": lambda: CopyBroke(),
        "stop": lambda: Stop(),
    }[trigger]()


def snapshot(core: CommitCore) -> dict[str, object]:
    return {name: getattr(core, name) for name in CommitCore.__slots__}


WRITER_TRIGGERS = sorted({t for role, ts in TRIGGERS.values() if role == "writer" for t in ts})
COPIER_TRIGGERS = sorted({t for role, ts in TRIGGERS.values() if role == "copier" for t in ts})


def test_the_tables_name_every_state_and_only_known_triggers():
    assert set(WRITER_TRANSITIONS) == set(WriterState)
    assert set(COPIER_TRANSITIONS) == set(CopierState)
    assert {t for moves in WRITER_TRANSITIONS.values() for t in moves} == set(WRITER_TRIGGERS)
    assert {t for moves in COPIER_TRANSITIONS.values() for t in moves} == set(COPIER_TRIGGERS)
    assert WRITER_TRANSITIONS[W.CLOSED] == {} and COPIER_TRANSITIONS[C.STOPPED] == {}
    with pytest.raises(TypeError):  # the tables are data nobody changes at run time
        WRITER_TRANSITIONS[W.IDLE]["close"] = W.IDLE  # type: ignore[index]


@pytest.mark.parametrize("state", list(WriterState))
@pytest.mark.parametrize("trigger", WRITER_TRIGGERS)
def test_every_writer_move_is_the_tables(state, trigger):
    core = writer_in(state)
    target = WRITER_TRANSITIONS[state].get(trigger)
    before = snapshot(core)
    if target is None:
        with pytest.raises(InvalidTransition) as info:
            core.handle(event_for(trigger, core))
        assert info.value.code == "INVALID_TRANSITION"
        assert snapshot(core) == before  # an illegal move changes nothing
    else:
        core.handle(event_for(trigger, core))
        assert core.writer is target
        assert core.copier is C.IDLE  # the writer's events leave the copier alone


@pytest.mark.parametrize("state", list(CopierState))
@pytest.mark.parametrize("trigger", COPIER_TRIGGERS)
def test_every_copier_move_is_the_tables(state, trigger):
    core = copier_in(state)
    target = COPIER_TRANSITIONS[state].get(trigger)
    before = snapshot(core)
    if target is None:
        with pytest.raises(InvalidTransition):
            core.handle(event_for(trigger, core))
        assert snapshot(core) == before
    else:
        core.handle(event_for(trigger, core))
        assert core.copier is target
        assert core.writer is W.IDLE


def test_a_group_is_written_once_sealed_and_acknowledged_once_synced():
    core = CommitCore(10)
    assert core.handle(Sequenced(11, 2)) == []
    assert core.handle(Sequenced(13, 1, waiting=False)) == []  # an append_soon entry rides along
    assert (core.sequenced, core.acknowledged, core.copied) == (13, 10, 10)
    assert core.handle(Seal(fits=True)) == [WriteLog(11, 13)]
    assert core.acknowledged == 10  # written is not acknowledged: nobody is told before the sync
    actions = core.handle(LogSynced(now=7.0))
    assert actions == [WakeCopier(), Acknowledge(11, 13, crowded=False)]  # the first entries pending
    assert (core.acknowledged, core.pending, core.last_commit) == (13, 3, 7.0)
    assert (core.transactions, core.largest_batch) == (1, 3)
    # the next group starts after it; a second one does not wake the copier again
    core.handle(Sequenced(14, 1))
    core.handle(Seal(fits=True))
    assert core.handle(LogSynced(now=7.001)) == [Acknowledge(14, 14, crowded=False)]


def test_a_group_several_appenders_wait_for_is_crowded():
    core = CommitCore(0)
    core.handle(Sequenced(1, 1))
    core.handle(Sequenced(2, 1))
    core.handle(Sequenced(3, 1, waiting=False))
    core.handle(Seal(fits=True))
    assert core.crowded
    assert core.handle(LogSynced(now=1.0))[-1] == Acknowledge(1, 3, crowded=True)
    core.handle(Sequenced(4, 1))
    core.handle(Sequenced(5, 1, waiting=False))
    core.handle(Seal(fits=True))
    assert not core.crowded  # one appender waits: the next may lead its own commit


def test_a_failed_record_acknowledges_nothing_and_its_seqs_are_given_again():
    core = CommitCore(4)
    core.handle(Sequenced(5, 3))
    assert core.handle(Seal(fits=True)) == [WriteLog(5, 7)]
    assert core.handle(LogFailed()) == [FailGroup(5, 7)]
    assert (core.writer, core.sequenced, core.acknowledged, core.pending) == (W.IDLE, 4, 4, 0)
    with pytest.raises(InvalidTransition):  # seq 8 would leave a hole
        core.handle(Sequenced(8, 1))
    core.handle(Sequenced(5, 1))
    core.handle(LogFailed())  # refused before its record was written (a broken or refusing journal)
    assert (core.writer, core.sequenced) == (W.IDLE, 4)


def test_a_record_the_log_has_no_room_for_waits_for_the_copy_then_starts_the_log_over():
    core = CommitCore(0)
    core.handle(Sequenced(1, 5))
    core.handle(Seal(fits=True))
    core.handle(LogSynced(now=1.0))
    core.handle(Sequenced(6, 2))
    assert core.handle(Seal(fits=False)) == [AwaitCopy(5)]
    with pytest.raises(InvalidTransition):  # journal.db lacks 1..5: the log must not start over
        core.handle(Drained())
    assert core.writer is W.DRAINING
    assert core.copy_due(now=1.0) is False and core.want(5)  # the drain asks for the copy
    assert core.copy_due(now=1.0)
    assert core.handle(CopyStart()) == [CopyRows(1, 5)]
    assert core.handle(Copied(5)) == [ReleaseWaiters()]
    assert core.handle(Drained()) == [ResetLog(), WriteLog(6, 7)]
    assert core.handle(LogSynced(now=2.0))[-1] == Acknowledge(6, 7, crowded=False)
    # the drain failing (the copy refused) fails the group instead
    core.handle(Sequenced(8, 1))
    core.handle(Seal(fits=False))
    assert core.handle(LogFailed()) == [FailGroup(8, 8)]


def test_half_a_log_asks_for_a_copy_once_until_the_log_starts_over():
    core = CommitCore(0)
    core.handle(Sequenced(1, 1))
    core.handle(Seal(fits=True))
    core.handle(LogSynced(now=0.0))
    core.handle(CopyStart())
    core.handle(Copied(1))
    core.handle(Sequenced(2, 1))
    core.handle(Seal(fits=True))
    assert core.handle(LogSynced(now=0.0, half_full=True)) == [WakeCopier(), Acknowledge(2, 2, crowded=False)]
    assert core.early_copy and core.wanted == 2 and core.copy_due(now=0.0)
    core.handle(Sequenced(3, 1))
    core.handle(Seal(fits=True))
    assert core.handle(LogSynced(now=0.0, half_full=True)) == [Acknowledge(3, 3, crowded=False)]
    core.handle(CopyStart())
    core.handle(Copied(3))
    core.handle(Sequenced(4, 1))
    core.handle(Seal(fits=False))
    core.handle(Drained())
    assert not core.early_copy  # a new log: half of it asks again


def test_a_full_batch_wakes_the_copier():
    core = CommitCore(0)
    core.handle(Sequenced(1, 1))
    core.handle(Seal(fits=True))
    assert WakeCopier() in core.handle(LogSynced(now=0.0))
    core.handle(Sequenced(2, IMPORT_BATCH - 2))
    core.handle(Seal(fits=True))
    assert WakeCopier() not in core.handle(LogSynced(now=0.0))  # one short of a batch
    core.handle(Sequenced(IMPORT_BATCH, 1))
    core.handle(Seal(fits=True))
    assert WakeCopier() in core.handle(LogSynced(now=0.0))
    assert core.copy_due(now=0.0)


@pytest.mark.parametrize("now, wanted, retry_at, due, wait", [
    (1.0, 0, 0.0, False, IMPORT_IDLE_SECS),  # just committed: waits for the journal to go idle
    (1.0 + IMPORT_IDLE_SECS, 0, 0.0, True, 0.001),  # idle long enough
    (1.0, 2, 0.0, True, IMPORT_IDLE_SECS),  # somebody waits for seq 2
    (1.0 + IMPORT_IDLE_SECS, 0, 3.0, False, 3.0 - 1.0 - IMPORT_IDLE_SECS),  # a refused copy is not due again
    (1.0, 2, 3.0, True, 2.0),  # ... unless somebody waits
])
def test_when_a_copy_is_due(now, wanted, retry_at, due, wait):
    core = copier_in(C.IDLE)  # 2 entries acknowledged at 1.0, none copied
    core.wanted, core.retry_at = wanted, retry_at
    assert core.copy_due(now) is due
    assert core.copy_wait(now) == pytest.approx(wait)


def test_nothing_to_copy_is_never_due_and_a_broken_copier_copies_nothing():
    core = CommitCore(7)
    assert not core.copy_due(100.0) and core.copy_wait(100.0) is None
    with pytest.raises(InvalidTransition):
        core.handle(CopyStart())
    broken = copier_in(C.BROKEN)
    broken.wanted = 2
    assert not broken.copy_due(100.0) and broken.copy_wait(100.0) is None
    assert broken.failed_attempt == broken.attempts == 1


def test_a_refused_copy_keeps_the_entries_pending_and_is_retried():
    core = copier_in(C.COPYING)
    core.want(2)
    assert core.handle(CopyRefused(retry_at=3.0)) == [ReleaseWaiters()]
    assert (core.copied, core.pending, core.wanted, core.failed_attempt) == (0, 2, 0, 1)
    assert not core.copy_due(2.0) and core.copy_due(3.0)
    assert core.handle(CopyStart()) == [CopyRows(1, 2)]
    assert core.attempts == 2
    with pytest.raises(InvalidTransition):  # a copy ends where it was started
        core.handle(Copied(1))
    core.handle(Copied(2))
    assert (core.copier, core.copied, core.pending, core.copies) == (C.IDLE, 2, 0, 1)


def test_a_refused_copy_counts_the_pieces_it_stored():
    core = copier_in(C.COPYING)
    core.handle(CopyRefused(retry_at=3.0, stored=1))
    assert (core.copied, core.pending) == (1, 1)
    assert core.handle(CopyStart()) == [CopyRows(2, 2)]
    with pytest.raises(InvalidTransition):
        core.handle(CopyRefused(retry_at=3.0, stored=5))  # beyond the copy


def test_an_event_the_core_does_not_know_is_refused():
    with pytest.raises(InvalidTransition):
        CommitCore().handle(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidTransition):
        CommitCore().handle(Sequenced(1, 0))  # no entries


def test_the_seqs_never_pass_each_other_whatever_legal_events_come():
    rng = random.Random(7)
    core = CommitCore(0)
    for _ in range(5000):
        role = rng.choice(("writer", "copier"))
        moves = WRITER_TRANSITIONS[core.writer] if role == "writer" else COPIER_TRANSITIONS[core.copier]
        triggers = [t for t in moves if t not in ("close", "stop", "copy_broke")]  # ends the walk
        if not triggers:
            continue
        event = event_for(rng.choice(triggers), core)
        if isinstance(event, Seal) and rng.random() < 0.5:
            event = Seal(fits=not event.fits)
        try:
            core.handle(event)
        except InvalidTransition:
            continue  # e.g. a drain before the copy, a copy with nothing pending
        assert core.sequenced >= core.acknowledged >= core.copied >= 0
        assert core.copying >= core.copied and core.pending == core.acknowledged - core.copied
    assert core.acknowledged > 0 and core.copies > 0


def test_a_held_back_job_waits_for_the_journal_to_go_idle_or_for_somebody_to_ask():
    core = CommitCore(0, idle=0.1)
    core.handle(Sequenced(1, 1))
    core.handle(Seal(fits=True))
    core.handle(LogSynced(now=1.0))
    assert core.handle(JobQueued(lazy=True)) == [WakeCopier()]  # a run's closing checkpoint
    assert (core.jobs, core.held) == (1, 1)
    assert not core.jobs_due(now=1.05) and core.copy_wait(now=1.05) == pytest.approx(0.05)
    assert core.jobs_due(now=1.1)  # idle: it runs
    assert core.handle(Hurry()) == [WakeCopier()] and core.held == 0 and core.jobs_due(now=1.0)
    assert core.handle(Hurry()) == []  # nothing held back: nobody to wake
    core.handle(JobTaken())
    assert (core.jobs, core.held, core.jobs_due(now=100.0)) == (0, 0, False)


def test_a_job_is_held_back_only_behind_held_back_jobs():
    core = CommitCore(0)
    core.handle(JobQueued(lazy=False))  # a cosignature: at once
    core.handle(JobQueued(lazy=True))  # behind a job that runs at once: runs with it
    assert (core.jobs, core.held) == (2, 0) and core.jobs_due(now=0.0)
    core.handle(JobTaken())
    core.handle(JobTaken())
    core.handle(JobQueued(lazy=True))
    core.handle(JobQueued(lazy=True))
    core.handle(JobQueued(lazy=False))  # not held: the ones before it run first, at once
    assert (core.jobs, core.held) == (3, 2) and core.jobs_due(now=0.0)
    core.handle(JobTaken())
    assert (core.jobs, core.held) == (2, 1)
    with pytest.raises(InvalidTransition):
        CommitCore().handle(JobTaken())  # no job queued


def test_a_stopped_copier_takes_no_job_and_forgets_those_it_held():
    core = CommitCore(0)
    core.handle(JobQueued(lazy=True))
    core.handle(Stop())
    assert (core.jobs, core.held) == (0, 0)
    before = snapshot(core)
    with pytest.raises(InvalidTransition):
        core.handle(JobQueued())
    assert snapshot(core) == before


# ---------------------------------------------------------------------- crash windows
def test_a_crash_while_idle_loses_nothing_acknowledged():
    core = copier_in(C.IDLE)
    assert crash(core) == CrashOutcome(2, (2, 2), (0, 0), crash(core).recovery)
    assert "take the log's entries" in crash(core).recovery
    copied = CommitCore(5)
    assert crash(copied).db == (5, 5) and "nothing to take" in crash(copied).recovery


def test_a_crash_while_the_record_is_written_may_keep_it_or_not_and_told_nobody():
    core = writer_in(W.LOGGING)  # entries 4..5 being written over a head of 3
    outcome = crash(core, "journal.log")
    assert outcome.acknowledged == 3 and outcome.log == (3, 5) and outcome.db == (3, 3)
    assert "torn" in outcome.recovery
    assert crash(core) == outcome  # the writer's state says where it is


@pytest.mark.parametrize("state", [W.GROUPING, W.DRAINING])
def test_a_crash_before_the_record_is_written_leaves_the_head(state):
    core = writer_in(state)
    outcome = crash(core)
    assert outcome.acknowledged == 3 and outcome.log == (3, 3)
    with pytest.raises(InvalidTransition):  # nothing is written to the log in this state
        crash(core, "journal.log")


@pytest.mark.parametrize("point", ["journal.db", "journal.before_frontier", "journal.after_piece"])
def test_a_crash_inside_a_copy_leaves_a_prefix_of_it(point):
    core = copier_in(C.COPYING)
    outcome = crash(core, point)
    assert outcome.acknowledged == 2 and outcome.log == (2, 2) and outcome.db == (0, 2)
    assert outcome.recovery == CRASH_POINTS[point][2]


def test_a_crash_after_a_copy_committed_leaves_it_whole():
    core = copier_in(C.COPYING)
    assert crash(core, "journal.after_copy").db == (2, 2)
    with pytest.raises(InvalidTransition):
        crash(copier_in(C.IDLE), "journal.after_copy")


def test_every_crash_point_is_a_fault_point_the_code_arms():
    """The crash table names the places the crash tests use: each is marked in the journal's code."""
    text = "".join((ROOT / "apollia_nb" / "journal" / name).read_text() for name in ("store.py", "tail.py"))
    for point in CRASH_POINTS:
        if point.startswith("journal.") and point not in ("journal.log", "journal.db"):
            assert f'faults.point("{point}")' in text, point
    assert 'fault_point("journal.log")' in text and "fault_point(self.path.name)" in text


# ---------------------------------------------------------------------- the doc
def _generator():
    path = ROOT / "dev" / "docs" / "make_journal_commit_table.py"
    spec = importlib.util.spec_from_file_location("make_journal_commit_table", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_prints_the_tables():
    assert _generator().main(["--check"]) == 0, "run: python dev/docs/make_journal_commit_table.py"


def test_every_move_is_a_row_of_the_doc():
    text = _generator().render()
    for table in (WRITER_TRANSITIONS, COPIER_TRANSITIONS):
        for state, moves in table.items():
            for trigger, target in moves.items():
                assert f"| {state.value} | `{trigger}` | {target.value} |" in text


def test_the_check_fails_on_a_drifted_doc(tmp_path, capsys):
    gen = _generator()
    doc = tmp_path / "journal.md"
    shutil.copy(ROOT / "docs" / "journal.md", doc)
    text = doc.read_text(encoding="utf-8")
    row = "| logging | `log_synced` | idle |"
    assert row in text
    doc.write_text(text.replace(row, "| logging | `log_synced` | closed |"), encoding="utf-8")
    assert gen.main(["--check", "--doc", str(doc)]) == 1
    assert "differs from the tables" in capsys.readouterr().err
    assert gen.main(["--doc", str(doc)]) == 0
    assert row in doc.read_text(encoding="utf-8")


def test_the_batch_and_idle_time_are_the_shells_to_set():
    core = CommitCore(0, batch=2, idle=30.0)
    core.handle(Sequenced(1, 1))
    core.handle(Seal(fits=True))
    core.handle(LogSynced(now=0.0))
    assert not core.copy_due(now=29.0) and core.copy_wait(now=0.0) == pytest.approx(30.0)
    core.handle(Sequenced(2, 1))
    core.handle(Seal(fits=True))
    assert WakeCopier() in core.handle(LogSynced(now=0.0)) and core.copy_due(now=0.0)


# ---------------------------------------------------------------------- the shell drives the core
def test_an_open_journal_moves_its_core_through_every_commit_and_copy(tmp_path):
    """A real journal (files, threads, DuckDB): what it acknowledged and copied is what its core says."""
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal

    with Journal.open(Home.at(tmp_path / "home")) as journal:
        core = journal._core
        assert (core.writer, core.copier, core.acknowledged) == (W.IDLE, C.IDLE, 0)
        journal.append("plan", {"n": 1})
        soon = journal.append_soon("plan", {"n": 2}, run_id="r")
        journal.append_many([("plan", {"n": 3}), ("plan", {"n": 4})])
        soon.result(timeout=30)
        assert core.acknowledged == journal.head()[0] == 4 and core.sequenced == 4
        assert core.writer is W.IDLE
        assert [e.seq for e in journal.entries()] == [1, 2, 3, 4]  # a read waits for the copy
        assert core.copied == 4 and core.pending == 0 and core.copier is C.IDLE
        assert journal.stats == {"transactions": core.transactions, "largest_batch": core.largest_batch,
                                 "imports": core.copies}
    assert (core.writer, core.copier) == (W.CLOSED, C.STOPPED)
    with Journal.open(Home.at(tmp_path / "home")) as journal:  # the next open starts at the head
        assert journal._core.acknowledged == journal._core.copied == 4
        journal.append("plan", {"n": 5})
        assert journal._core.acknowledged == 5


@pytest.mark.parametrize("point", ["journal.before_frontier", "journal.after_piece", "journal.after_copy"])
def test_a_process_killed_at_a_crash_point_leaves_what_the_table_says(tmp_path, point):
    """A real process appends 4 entries over a stored head of 1 and is killed (``APOLLIA_FAULT``) at
    ``point`` while copying them: journal.db holds what ``crash`` says it may, the log everything
    acknowledged, and the next open takes the rest."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    from apollia_nb.dbutil import connect_locked
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal
    from apollia_nb.journal.tail import read_tail, tail_path
    from apollia_nb.journal.verify import verify_journal

    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 0})
    script = textwrap.dedent(f"""
        import json
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal, store
        store.COPY_PIECE_BYTES = 1024  # one entry a piece: a copy of 4 is 4 pieces
        journal = Journal.open(Home.at({str(home.path)!r}))
        entries = journal.append_many([("plan", {{"n": i, "text": "x" * 2000}}, "run-1", "clerk")
                                       for i in range(1, 5)])
        print(json.dumps([[e.seq, e.hash.hex()] for e in entries]), flush=True)
        journal.entries()  # waits for the copy: killed at the crash point
        print("survived", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "APOLLIA_FAULT": f"{point}:kill"})
    assert out.returncode == -signal.SIGKILL, (out.stdout[-300:], out.stderr[-2000:])
    assert "survived" not in out.stdout
    acknowledged = json.loads(out.stdout.splitlines()[0])

    core = CommitCore(1)  # the same moves, as data: 2..5 acknowledged, their copy under way
    for event in (Sequenced(2, 4), Seal(fits=True), LogSynced(now=0.0), CopyStart()):
        core.handle(event)
    predicted = crash(core, point)
    assert predicted.acknowledged == acknowledged[-1][0] == 5
    con = connect_locked(home.journal_db, read_only=True)
    try:
        [(held,)] = con.execute("SELECT coalesce(max(seq), 0) FROM entries").fetchall()
        [(frontier,)] = con.execute("SELECT size FROM frontier").fetchall()
    finally:
        con.close()
    assert predicted.db[0] <= held <= predicted.db[1] and frontier == held  # a prefix, its frontier with it
    assert {"journal.before_frontier": held == 1, "journal.after_piece": 1 < held < 5,
            "journal.after_copy": held == 5}[point], held
    log = read_tail(tail_path(home.journal_db))
    assert [[r[0], bytes(r[7]).hex()] for r in log.rows if r[0] > 1] == acknowledged  # all of it durable
    with Journal.open(home) as journal:
        assert [[e.seq, e.hash.hex()] for e in journal.entries(since_seq=1)] == acknowledged
        assert journal._core.acknowledged == journal._core.copied == journal.head()[0] == 5
        assert verify_journal(journal).ok
