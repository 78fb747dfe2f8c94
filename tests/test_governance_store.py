"""governance.db: rules, consents, developer mode, pending decisions, the snapshot, fail closed."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import pytest

from apollia_nb.errors import (
    BadAnswer,
    BadInput,
    Conflict,
    GovernanceUnreadable,
    HomeLocked,
    NotFound,
    UnknownDecision,
    UnknownRule,
)
from apollia_nb.governance import Call, decide
from apollia_nb.governance.approvals import action_digest
from apollia_nb.governance.decision import Answer, Effect, Family, Outcome, Rule
from apollia_nb.governance.policy import keygen, sign
from apollia_nb.governance.store import GovernanceStore, PendingDecision, RuleRecord, _racy
from apollia_nb.home import Home


class RecordingJournal:
    """A JournalSink that records entries and can be told to fail.

    ``home_file_created`` entries (the home's record of its files) are kept
    apart in ``files``, so ``entries`` holds the governance changes alone.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, dict[str, Any], str | None]] = []
        self.files: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def append(self, kind: str, payload: dict[str, Any], *, run_id: str | None = None, agent: str | None = None) -> object:
        if self.fail is not None:
            raise self.fail
        if kind == "home_file_created":
            self.files.append(payload)
            return len(self.files)
        self.entries.append((kind, payload, agent))
        return len(self.entries)

    @property
    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.entries]


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home.at(tmp_path / "home")


@pytest.fixture
def journal() -> RecordingJournal:
    return RecordingJournal()


@pytest.fixture
def store(home: Home, journal: RecordingJournal) -> GovernanceStore:
    return GovernanceStore(home, journal, lock_timeout=0.3)


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=120, check=True,
    )


# --- an empty home ----------------------------------------------------------------


def test_an_empty_home_reads_as_empty_and_creates_nothing(tmp_path: Path) -> None:
    home = Home(tmp_path / "missing")
    store = GovernanceStore(home)
    view = store.view()
    assert view.readable and view.rules == () and view.consents == frozenset() and not view.developer_mode
    assert store.rules() == [] and store.consents() == [] and store.pending() == []
    assert store.developer_mode() is False
    assert store.expire_pending(1) == []
    assert not home.path.exists()
    store.add_rule("bash_executor", "deny", "rm", by="tester")
    assert home.governance_db.exists()
    assert [r.tool for r in store.rules()] == ["bash_executor"]


# --- fine rules -------------------------------------------------------------------


def test_add_list_remove_rules_with_metadata(store: GovernanceStore, journal: RecordingJournal) -> None:
    clock = Clock()
    store.clock = clock
    rule = store.add_rule("bash_executor", "allow", prefix="git status", agent="clerk", by="ana")
    assert isinstance(rule, RuleRecord) and isinstance(rule, Rule)
    assert rule.id and rule.id.startswith("r-")
    assert (rule.tool, rule.effect, rule.prefix, rule.agent) == ("bash_executor", Effect.ALLOW, "git status", "clerk")
    assert (rule.created_by, rule.created_at) == ("ana", clock.now)
    clock.now += timedelta(seconds=1)
    deny = store.add_rule("write_file", Effect.DENY, by="bo")
    assert deny.prefix is None and deny.agent == "*"
    assert store.rules() == [rule, deny]
    assert rule.to_dict() == {
        "id": rule.id, "tool": "bash_executor", "prefix": "git status", "effect": "allow", "agent": "clerk",
        "created_by": "ana", "created_at": "2026-01-02T03:04:05Z",
    }
    assert store.get_rule(deny.id) == deny
    removed = store.remove_rule(rule.id, by="cy")
    assert removed == rule
    assert store.rules() == [deny]
    assert journal.entries == [
        ("rule_added", {"id": rule.id, "tool": "bash_executor", "prefix": "git status", "effect": "allow",
                        "agent": "clerk", "by": "ana"}, "clerk"),
        ("rule_added", {"id": deny.id, "tool": "write_file", "prefix": None, "effect": "deny",
                        "agent": "*", "by": "bo"}, None),
        ("rule_removed", {"id": rule.id, "tool": "bash_executor", "prefix": "git status", "effect": "allow",
                          "agent": "clerk", "by": "cy"}, "clerk"),
    ]


def test_an_identical_rule_is_not_added_twice(store: GovernanceStore, journal: RecordingJournal) -> None:
    first = store.add_rule("bash_executor", "allow", "git status", "clerk", by="ana")
    again = store.add_rule("bash_executor", "allow", "git status", "clerk", by="bo")
    assert again == first
    assert len(store.rules()) == 1 and journal.kinds == ["rule_added"]
    other_scope = store.add_rule("bash_executor", "allow", "git status", "*", by="bo")
    assert other_scope.id != first.id


def test_removing_an_unknown_rule(store: GovernanceStore, journal: RecordingJournal) -> None:
    with pytest.raises(UnknownRule) as info:
        store.remove_rule("r-nope", by="ana")
    assert info.value.code == "UNKNOWN_RULE"
    store.add_rule("x", "deny", by="ana")
    with pytest.raises(UnknownRule):
        store.remove_rule("r-nope", by="ana")
    with pytest.raises(UnknownRule):
        store.get_rule("r-nope")
    assert journal.kinds == ["rule_added"]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tool": "bash_executor", "effect": "maybe"}, "effect must be 'allow' or 'deny'"),
        ({"tool": "bash_executor", "effect": "ALLOW"}, "effect must be"),
        ({"tool": "", "effect": "deny"}, "tool must be a non-empty name"),
        ({"tool": "bash executor", "effect": "deny"}, "tool must be"),
        ({"tool": "x", "effect": "deny", "agent": "Clerk"}, "agent must be '*' or a name"),
        ({"tool": "x", "effect": "deny", "agent": ""}, "agent must be"),
        ({"tool": "x", "effect": "deny", "agent": "a/b"}, "agent must be"),
        ({"tool": "x", "effect": "deny", "prefix": 3}, "prefix must be text"),
        ({"tool": "x", "effect": "deny", "by": " "}, "'by' must name who"),
    ],
)
def test_bad_rules_are_refused_and_nothing_is_journaled(
    store: GovernanceStore, journal: RecordingJournal, kwargs: dict[str, Any], words: str
) -> None:
    kwargs.setdefault("by", "ana")
    with pytest.raises(BadInput) as info:
        store.add_rule(**kwargs)
    assert info.value.code == "BAD_INPUT" and words in info.value.message
    assert store.rules() == [] and journal.entries == []


# --- standing consents --------------------------------------------------------------


def test_grant_list_revoke_consents(store: GovernanceStore, journal: RecordingJournal) -> None:
    store.clock = Clock()
    granted = store.grant_consent("clerk", "write", by="ana")
    assert (granted.agent, granted.family, granted.granted_by) == ("clerk", Family.WRITE, "ana")
    assert store.grant_consent("clerk", Family.WRITE, by="bo") == granted  # one per (agent, family)
    store.grant_consent("clerk", "send", by="ana")
    store.grant_consent("archivist", "read_personal", by="ana")
    assert [(c.agent, c.family.value) for c in store.consents()] == [
        ("archivist", "read_personal"), ("clerk", "send"), ("clerk", "write"),
    ]
    assert store.consents()[2].to_dict() == {
        "agent": "clerk", "family": "write", "granted_by": "ana", "granted_at": "2026-01-02T03:04:05Z",
        "card": None, "until": None, "state": "in force",
    }
    store.revoke_consent("clerk", "send", by="cy")
    assert ("clerk", Family.SEND) not in store.view().consents
    assert ("clerk", Family.WRITE) in store.view().consents
    assert journal.entries == [
        ("consent_granted", {"agent": "clerk", "family": "write", "by": "ana"}, "clerk"),
        ("consent_granted", {"agent": "clerk", "family": "send", "by": "ana"}, "clerk"),
        ("consent_granted", {"agent": "archivist", "family": "read_personal", "by": "ana"}, "archivist"),
        ("consent_revoked", {"agent": "clerk", "family": "send", "by": "cy"}, "clerk"),
    ]


@pytest.mark.parametrize(
    ("family", "words"),
    [
        ("execute", "no standing consent covers 'execute'"),
        ("profile", "no standing consent covers 'profile'"),
        ("read", "needs no consent"),
        ("memory", "needs no consent"),
        ("writing", "unknown family 'writing'"),
    ],
)
def test_consents_that_cannot_exist_are_refused(
    store: GovernanceStore, journal: RecordingJournal, family: str, words: str
) -> None:
    with pytest.raises(BadInput, match=words):
        store.grant_consent("clerk", family, by="ana")
    assert store.consents() == [] and journal.entries == []


def test_revoking_a_consent_nobody_holds(store: GovernanceStore, journal: RecordingJournal) -> None:
    with pytest.raises(NotFound) as info:
        store.revoke_consent("clerk", "write", by="ana")
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(BadInput):
        store.revoke_consent("Clerk", "write", by="ana")
    with pytest.raises(BadInput):
        store.grant_consent("clerk!", "write", by="ana")
    assert journal.entries == []


# --- developer mode -----------------------------------------------------------------


def test_developer_mode(store: GovernanceStore, journal: RecordingJournal) -> None:
    assert store.developer_mode() is False
    assert store.developer_mode_state().enabled is False
    state = store.set_developer_mode(True, by="ana")
    assert state.enabled and state.changed_by == "ana"
    assert store.developer_mode() is True and store.view().developer_mode is True
    assert store.set_developer_mode(True, by="bo").changed_by == "ana"  # no change, not journaled
    store.set_developer_mode(False, by="cy")
    assert store.developer_mode() is False
    assert store.developer_mode_state().to_dict()["changed_by"] == "cy"
    assert journal.entries == [
        ("devmode_changed", {"enabled": True, "by": "ana"}, None),
        ("devmode_changed", {"enabled": False, "by": "cy"}, None),
    ]
    with pytest.raises(BadInput):
        store.set_developer_mode("yes", by="ana")  # type: ignore[arg-type]


# --- journal first ------------------------------------------------------------------


def test_a_failing_journal_changes_nothing(store: GovernanceStore, journal: RecordingJournal) -> None:
    kept = store.add_rule("write_file", "deny", "secrets/", by="ana")
    store.grant_consent("clerk", "write", by="ana")
    before = store.view()
    journal.fail = RuntimeError("journal is full")
    with pytest.raises(RuntimeError, match="journal is full"):
        store.add_rule("bash_executor", "allow", "ls", by="ana")
    with pytest.raises(RuntimeError):
        store.remove_rule(kept.id, by="ana")
    with pytest.raises(RuntimeError):
        store.grant_consent("clerk", "send", by="ana")
    with pytest.raises(RuntimeError):
        store.revoke_consent("clerk", "write", by="ana")
    with pytest.raises(RuntimeError):
        store.set_developer_mode(True, by="ana")
    after = store.view()
    assert after == before
    assert store.rules() == [kept]
    assert [(c.agent, c.family) for c in store.consents()] == [("clerk", Family.WRITE)]
    assert store.developer_mode_state().enabled is False


def test_the_entry_is_appended_before_the_change_is_visible(home: Home) -> None:
    seen: list[list[tuple[Any, ...]]] = []

    class Peeking(RecordingJournal):
        def append(self, kind: str, payload: dict[str, Any], **kw: Any) -> object:
            # Another connection of this process sees committed rows only.
            con = duckdb.connect(str(home.governance_db))
            try:
                seen.append(con.execute("SELECT id FROM rules").fetchall())
            finally:
                con.close()
            return super().append(kind, payload, **kw)

    GovernanceStore(home).set_developer_mode(True, by="ana")  # the schema exists
    store = GovernanceStore(home, Peeking())
    first = store.add_rule("x", "deny", by="ana")
    store.add_rule("y", "deny", by="ana")
    assert seen == [[], [(first.id,)]]


# --- the snapshot -------------------------------------------------------------------


def test_view_feeds_decide(store: GovernanceStore) -> None:
    write = Call(agent="clerk", tool="write_file", family="write", arguments={"path": "notes/a.txt"})
    assert decide(write, store.view()).outcome is Outcome.ASK
    store.grant_consent("clerk", "write", by="ana")
    assert decide(write, store.view()).outcome is Outcome.ALLOW
    rule = store.add_rule("write_file", "deny", "notes/", by="ana")
    d = decide(write, store.view())
    assert (d.outcome, d.line, d.rule_id) == (Outcome.REFUSE, 2, rule.id)
    store.remove_rule(rule.id, by="ana")
    assert decide(write, store.view()).outcome is Outcome.ALLOW


def test_view_is_cheap_when_nothing_changed(store: GovernanceStore) -> None:
    store.add_rule("bash_executor", "deny", "rm", by="ana")
    store.grant_consent("clerk", "write", by="ana")
    first = store.view()
    deadline = time.monotonic() + 5
    while store._cached is None or store._cached.recheck:  # let the racy window pass
        assert time.monotonic() < deadline
        store.view()
    assert store.view() is store.view()
    samples = []
    for _ in range(20):
        start = time.perf_counter_ns()
        for _ in range(500):
            store.view()
        samples.append((time.perf_counter_ns() - start) / 500 / 1000)
    per_call_us = statistics.median(samples)
    print(f"view() unchanged: {per_call_us:.1f} us")
    assert per_call_us < 50  # ~5 us on an idle machine; generous for a loaded CI box
    assert store.view() == first


def test_another_process_changing_the_store_is_seen(store: GovernanceStore, home: Home) -> None:
    store.add_rule("write_file", "deny", "a/", by="ana")
    before = store.view()
    assert [r.prefix for r in before.rules] == ["a/"]
    code = """
        import sys
        from apollia_nb.home import Home
        from apollia_nb.governance.store import GovernanceStore
        store = GovernanceStore(Home.at(sys.argv[1]))
        rule = store.add_rule("write_file", "deny", "b/", by="other-process")
        store.grant_consent("clerk", "send", by="other-process")
        print(rule.id)
    """
    out = _python(code, str(home.path))
    new_id = out.stdout.strip()
    after = store.view()
    assert [(r.prefix, r.id) for r in after.rules][1] == ("b/", new_id)
    assert ("clerk", Family.SEND) in after.consents
    call = Call(agent="clerk", tool="write_file", family="write", arguments={"path": "b/x"})
    assert decide(call, after).outcome is Outcome.REFUSE
    _python(
        """
        import sys
        from apollia_nb.home import Home
        from apollia_nb.governance.store import GovernanceStore
        GovernanceStore(Home.at(sys.argv[1])).remove_rule(sys.argv[2], by="other-process")
        """,
        str(home.path), new_id,
    )
    assert [r.prefix for r in store.view().rules] == ["a/"]


def test_racy_window() -> None:
    now = 10_000_000_123_456_789
    assert _racy(now - 1_000_000, now)  # changed 1 ms ago: may change again unseen
    assert not _racy(now - 200_000_000, now)  # 200 ms ago: settled
    assert _racy(10_000_000_000_000_000, 10_000_001_000_000_000)  # whole seconds: coarse clock
    assert not _racy(0, now)


# --- fail closed ----------------------------------------------------------------------


def _assert_fail_closed(store: GovernanceStore, words: str) -> None:
    view = store.view()
    assert view.readable is False
    assert words in view.unreadable_reason
    sensitive = Call(agent="clerk", tool="write_file", family="write", arguments={"path": "a"})
    d = decide(sensitive, view)
    assert (d.outcome, d.line) == (Outcome.REFUSE, 0)
    reading = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "a"})
    assert decide(reading, view).outcome is Outcome.ALLOW
    for mutate in (
        lambda: store.add_rule("x", "deny", by="ana"),
        lambda: store.remove_rule("r-1", by="ana"),
        lambda: store.grant_consent("clerk", "write", by="ana"),
        lambda: store.revoke_consent("clerk", "write", by="ana"),
        lambda: store.set_developer_mode(True, by="ana"),
        lambda: store.add_pending("run", None, "clerk", "write_file", "write", {}, ["once"]),
        lambda: store.answer_pending("pd-1", "once", by="ana"),
    ):
        with pytest.raises(GovernanceUnreadable) as info:
            mutate()
        assert info.value.code == "GOVERNANCE_UNREADABLE"
    for read in (store.rules, store.consents, store.pending):
        with pytest.raises(GovernanceUnreadable):
            read()


def test_a_corrupt_database_fails_closed_and_is_never_overwritten(
    store: GovernanceStore, home: Home, journal: RecordingJournal
) -> None:
    garbage = os.urandom(4096) + b"not a duckdb file"
    home.governance_db.write_bytes(garbage)
    _assert_fail_closed(store, "not a valid DuckDB database")
    assert home.governance_db.read_bytes() == garbage
    assert journal.entries == []


def test_a_directory_in_place_of_the_database_fails_closed(store: GovernanceStore, home: Home) -> None:
    home.governance_db.mkdir()
    (home.governance_db / "keep").write_text("mine")
    _assert_fail_closed(store, "governance.db cannot be read")
    assert (home.governance_db / "keep").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions (the directory case covers it)")
def test_an_unreadable_database_fails_closed(store: GovernanceStore, home: Home) -> None:
    store.add_rule("x", "deny", by="ana")
    data = home.governance_db.read_bytes()
    home.governance_db.chmod(0)
    try:
        _assert_fail_closed(store, "governance.db")
    finally:
        home.governance_db.chmod(0o600)
    assert home.governance_db.read_bytes() == data


def test_known_deny_rules_survive_corruption_and_the_store_recovers(store: GovernanceStore, home: Home) -> None:
    deny = store.add_rule("write_file", "deny", "secrets/", by="ana")
    store.add_rule("bash_executor", "allow", "ls", by="ana")
    store.grant_consent("clerk", "write", by="ana")
    assert store.view().readable
    saved = home.governance_db.read_bytes()
    home.governance_db.write_bytes(b"\0" * 8192)
    view = store.view()
    assert not view.readable
    assert view.rules == (deny.rule,) and view.consents == frozenset()
    home.governance_db.write_bytes(saved)
    assert store.view().readable and store.view().consents == {("clerk", Family.WRITE)}


def test_a_foreign_or_newer_database_fails_closed(store: GovernanceStore, home: Home) -> None:
    con = duckdb.connect(str(home.governance_db))
    con.execute("CREATE TABLE invoices (n INTEGER)")
    con.close()
    _assert_fail_closed(store, "not a governance database (it holds invoices)")
    home.governance_db.unlink()
    store.add_rule("x", "deny", by="ana")
    con = duckdb.connect(str(home.governance_db))
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    _assert_fail_closed(store, "schema version 99, newer")


# --- the file held by another process -------------------------------------------------


@pytest.fixture
def holder(home: Home) -> Iterator[subprocess.Popen[str]]:
    """Another process holding governance.db open."""
    GovernanceStore(home).add_rule("write_file", "deny", "x/", by="ana")
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); sys.stdin.read()",
         str(home.governance_db)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield proc
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)


def test_a_held_database_raises_home_locked_naming_the_pid(
    store: GovernanceStore, holder: subprocess.Popen[str], journal: RecordingJournal
) -> None:
    with pytest.raises(HomeLocked) as info:
        store.add_rule("bash_executor", "deny", by="ana")
    assert info.value.code == "HOME_LOCKED"
    assert f"process {holder.pid}" in info.value.message
    assert journal.entries == []
    view = store.view()
    assert not view.readable and f"process {holder.pid}" in view.unreadable_reason
    holder.stdin.close()  # type: ignore[union-attr]
    holder.wait(timeout=30)
    view = store.view()
    assert view.readable and [r.prefix for r in view.rules] == ["x/"]


# --- pending decisions --------------------------------------------------------------------


def _pending(store: GovernanceStore, **kw: Any) -> PendingDecision:
    args: dict[str, Any] = dict(
        run_id="run-1", task_id="task-1", agent="clerk", tool="write_file", family="write",
        arguments={"path": "notes/a.txt", "content": "hi"}, answers=["once", "always", "refuse"],
        reason="no consent of 'clerk' for family 'write'", line=6, call_id="call-1",
    )
    args.update(kw)
    return store.add_pending(**args)


def test_pending_decisions_are_listed_answered_and_kept(store: GovernanceStore, home: Home, journal: RecordingJournal) -> None:
    clock = Clock()
    store.clock = clock
    first = _pending(store)
    clock.now += timedelta(minutes=1)
    second = _pending(store, run_id="run-2", tool="mystery", family=None, answers=["once", "refuse"], line=6)
    assert first.to_dict() == {
        "id": first.id, "run_id": "run-1", "task_id": "task-1", "agent": "clerk", "tool": "write_file",
        "family": "write", "arguments": {"path": "notes/a.txt", "content": "hi"},
        "answers": ["once", "always", "refuse"], "created_at": "2026-01-02T03:04:05Z",
        "status": "pending", "answer": None, "answered_by": None, "answered_at": None,
        "answer_reason": None, "reason": "no consent of 'clerk' for family 'write'", "line": 6,
        "call_id": "call-1",
        # What an answer approves: the call as its card shows it, bound to this decision.
        "digest": action_digest(decision_id=first.id, run_id="run-1", agent="clerk", tool="write_file",
                                call_id="call-1", arguments={"path": "notes/a.txt", "content": "hi"}),
    }
    assert first.digest.startswith("sha256:") and first.digest != second.digest
    assert second.to_dict()["family"] is None
    assert [d.id for d in store.pending()] == [first.id, second.id]
    assert [d.id for d in store.pending(run_id="run-2")] == [second.id]
    assert store.get_pending(second.id) == second

    # A restart: a new store (and a new process) finds them in the file.
    assert [d.id for d in GovernanceStore(home).pending()] == [first.id, second.id]
    out = _python(
        """
        import sys
        from apollia_nb.home import Home
        from apollia_nb.governance.store import GovernanceStore
        print(",".join(d.id for d in GovernanceStore(Home.at(sys.argv[1])).pending()))
        """,
        str(home.path),
    )
    assert out.stdout.strip() == f"{first.id},{second.id}"

    clock.now += timedelta(minutes=1)
    done = store.answer_pending(first.id, "always", by="ana", reason="fine")
    assert (done.status, done.answer, done.answered_by, done.answered_at, done.answer_reason) == (
        "answered", Answer.ALWAYS, "ana", clock.now, "fine",
    )
    assert store.get_pending(first.id) == done
    assert [d.id for d in store.pending()] == [second.id]
    assert [d.id for d in store.pending("answered")] == [first.id]
    assert len(store.pending(None)) == 2
    assert journal.entries == []  # the runtime journals asks and answers with their run


def test_answering_errors(store: GovernanceStore) -> None:
    decision = _pending(store, answers=["once", "refuse"])
    with pytest.raises(BadAnswer) as info:
        store.answer_pending(decision.id, "always", by="ana")
    assert info.value.code == "BAD_ANSWER" and "offered: once, refuse" in info.value.message
    with pytest.raises(BadAnswer):
        store.answer_pending(decision.id, "yes", by="ana")
    with pytest.raises(UnknownDecision) as unknown:
        store.answer_pending("pd-nope", "once", by="ana")
    assert unknown.value.code == "UNKNOWN_DECISION"
    with pytest.raises(UnknownDecision):
        store.get_pending("pd-nope")
    assert store.get_pending(decision.id).status == "pending"
    store.answer_pending(decision.id, Answer.REFUSE, by="ana")
    with pytest.raises(Conflict) as conflict:
        store.answer_pending(decision.id, "once", by="bo")
    assert conflict.value.code == "CONFLICT" and "already answered: refuse by ana" in conflict.value.message
    assert store.get_pending(decision.id).answer is Answer.REFUSE


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"answers": []}, "non-empty"),
        ({"answers": ["once", "maybe"]}, "drawn from once, always, refuse"),
        ({"family": "sending"}, "unknown family"),
        ({"agent": "Clerk"}, "agent must be"),
        ({"run_id": ""}, "run_id"),
        ({"arguments": {"x": object()}}, "arguments must be JSON"),
    ],
)
def test_bad_pending_decisions_are_refused(store: GovernanceStore, kw: dict[str, Any], words: str) -> None:
    with pytest.raises(BadInput, match=words):
        _pending(store, **kw)
    assert store.pending(None) == []


def test_expire_pending(store: GovernanceStore) -> None:
    clock = Clock()
    store.clock = clock
    old = _pending(store)
    clock.now += timedelta(hours=2)
    young = _pending(store)
    expired = store.expire_pending(3, now=clock.now + timedelta(hours=1, minutes=30))
    assert [d.id for d in expired] == [old.id]
    assert (expired[0].status, expired[0].answer, expired[0].answered_by) == ("expired", Answer.REFUSE, "timeout")
    assert store.get_pending(old.id) == expired[0]
    assert [d.id for d in store.pending()] == [young.id]
    with pytest.raises(Conflict, match="already expired"):
        store.answer_pending(old.id, "once", by="ana")
    assert store.expire_pending(3, now=clock.now) == []
    with pytest.raises(BadInput):
        store.expire_pending(-1)
    with pytest.raises(BadInput):
        store.pending("waiting")


# --- organisation policy through the store ------------------------------------------------

POLICY = b'[refuse]\nfamilies = ["send"]\ntools = ["danger"]\n'


def _deposit(home: Home, tmp_path: Path, data: bytes = POLICY) -> str:
    key = tmp_path / "policy.key"
    if not key.exists():
        keygen(key)
    public = (tmp_path / "policy.key.pub").read_text().strip()
    home.policy_path.write_bytes(data)
    sign(home.policy_path, key)
    home.config_path.write_text(f'[policy]\ntrusted_keys = ["{public}"]\n')
    return public


def test_an_accepted_policy_refuses_on_line_one_and_is_journaled_once(
    store: GovernanceStore, home: Home, tmp_path: Path, journal: RecordingJournal
) -> None:
    assert store.view().policy is None and store.policy_state().status == "none"
    assert journal.entries == []  # nothing deposited at first sight: nothing to record
    public = _deposit(home, tmp_path)
    view = store.view()
    assert view.readable and view.policy is not None
    d = decide(Call(agent="clerk", tool="http_request", family="send"), view)
    assert (d.outcome, d.line) == (Outcome.REFUSE, 1)
    store.view()
    assert journal.kinds == ["policy_loaded"]
    kind, payload, _ = journal.entries[0]
    assert payload["status"] == "accepted" and payload["key"] == public
    assert len(payload["digest"]) == 64
    assert payload["policy"]["refuse"]["families"] == ["send"]
    assert store.policy_state().key == public


def test_a_tampered_policy_fails_closed_and_is_journaled(
    store: GovernanceStore, home: Home, tmp_path: Path, journal: RecordingJournal
) -> None:
    _deposit(home, tmp_path)
    assert store.view().readable
    store.grant_consent("clerk", "write", by="ana")
    assert store.view().readable
    with home.policy_path.open("ab") as f:
        f.write(b"\n")
    view = store.view()
    assert not view.readable and "organisation policy is refused" in view.unreadable_reason
    write = Call(agent="clerk", tool="write_file", family="write", arguments={"path": "a"})
    assert decide(write, view).outcome is Outcome.REFUSE
    assert journal.kinds == ["policy_loaded", "consent_granted", "policy_refused"]
    assert "changed after it was signed" in journal.entries[-1][1]["reason"]
    home.policy_path.unlink()
    home.policy_sig_path.unlink()
    view = store.view()  # a policy that vanishes is not "none": still fail closed
    assert not view.readable and "organisation.toml is missing" in view.unreadable_reason
    assert "apollia-os policy remove" in view.unreadable_reason
    assert decide(write, view).outcome is Outcome.REFUSE
    assert journal.kinds[-1] == "policy_refused" and journal.entries[-1][1]["status"] == "refused"
    assert store.remove_policy(by="ana").status == "none"  # removed on purpose: journaled, then none
    assert store.view().readable
    assert journal.entries[-1] == ("policy_removed", {"by": "ana", "was": "refused", "digest": None}, None)


def test_trusted_keys_changed_in_apollia_toml_are_seen(
    store: GovernanceStore, home: Home, tmp_path: Path
) -> None:
    _deposit(home, tmp_path)
    assert store.view().readable
    home.config_path.write_text("[policy]\ntrusted_keys = []\n")
    assert "no trusted keys" in store.view().unreadable_reason


def test_explicit_trusted_keys_win(home: Home, tmp_path: Path) -> None:
    public = _deposit(home, tmp_path)
    home.config_path.write_text("")
    assert not GovernanceStore(home).view().readable
    assert GovernanceStore(home, trusted_keys=[public]).view().readable


def test_an_unjournaled_policy_state_fails_closed_until_journaled(
    home: Home, tmp_path: Path, journal: RecordingJournal
) -> None:
    _deposit(home, tmp_path)
    journal.fail = RuntimeError("journal down")
    store = GovernanceStore(home, journal)
    view = store.view()
    assert not view.readable and "cannot be journaled: journal down" in view.unreadable_reason
    journal.fail = None
    assert store.view().readable and journal.kinds == ["policy_loaded"]


def test_attaching_a_journal_records_the_policy_in_force(home: Home, tmp_path: Path) -> None:
    _deposit(home, tmp_path)
    store = GovernanceStore(home)
    assert store.view().readable
    journal = RecordingJournal()
    store.attach_journal(journal)
    store.view()
    assert journal.kinds == ["policy_loaded"]


def test_threads_and_two_stores_in_one_process_share_the_file(home: Home) -> None:
    import threading

    writer_store, reader_store = GovernanceStore(home), GovernanceStore(home)
    done = threading.Event()
    errors: list[BaseException] = []
    views = 0

    def write(n: int) -> None:
        try:
            for i in range(4):
                writer_store.add_rule(f"tool_{n}_{i}", "deny", by="ana")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def read() -> None:
        nonlocal views
        try:
            while not done.is_set():
                assert reader_store.view().readable
                views += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(n,)) for n in range(3)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    reader.join()
    assert errors == []
    assert views > 0
    assert len(reader_store.view().rules) == 12


def test_the_real_journal_takes_every_governance_kind(home: Home, tmp_path: Path) -> None:
    import json

    from apollia_nb.journal import Journal, verify_home

    public = _deposit(home, tmp_path)
    with Journal.open(home) as real:
        store = GovernanceStore(home, real)
        assert store.view().readable
        rule = store.add_rule("bash_executor", "allow", "git status", "clerk", by="ana")
        store.remove_rule(rule.id, by="ana")
        store.grant_consent("clerk", "write", by="ana")
        store.revoke_consent("clerk", "write", by="ana")
        store.set_developer_mode(True, by="ana")
        home.policy_sig_path.unlink()
        assert not store.view().readable
        entries = [(e.kind, json.loads(e.payload), e.agent) for e in real.entries()]
    assert [k for k, _, _ in entries] == [
        "policy_loaded", "home_file_created", "rule_added", "rule_removed", "consent_granted", "consent_revoked",
        "devmode_changed", "policy_refused",
    ]
    store_id = duckdb.connect(str(home.governance_db), read_only=True).execute(
        "SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0]
    assert entries[1][1] == {"file": "governance.db", "id": store_id}  # the home's record of its database
    assert entries[0][1]["key"] == public and entries[2][2] == "clerk"
    assert "not signed" in entries[-1][1]["reason"]
    assert verify_home(home).ok
