"""governance.db held open by the home's owner: what each operation reads, and what stays fail closed.

The owner (``keep_open``) checks the tables and id of the file it holds once; later operations
check only that the path is still that file. Pending decisions listed, answered or expired by the
owner keep the snapshot ``decide()`` reads. Anything else that changes still reloads it, and a file
put in the held one's place fails closed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from apollia_nb.errors import GovernanceUnreadable
from apollia_nb.governance.decision import Family
from apollia_nb.governance.store import GovernanceStore
from apollia_nb.home import Home


def _home(root: Path) -> Home:
    home = Home(root)
    home.ensure()
    return home


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return _home(tmp_path / "home")


@pytest.fixture
def held(home: Home) -> Iterator[GovernanceStore]:
    """The owner's store: governance.db exists (a deny rule) and is held open."""
    store = GovernanceStore(home)
    store.add_rule("write_file", "deny", "secrets/", by="ana")
    assert store.keep_open()
    assert store.view().readable
    yield store
    store.close()


def _ask(store: GovernanceStore, n: int = 0) -> str:
    return store.add_pending(f"run-{n}", f"task-{n}", "clerk", "write_file", "write", {"path": f"out{n}.txt"},
                             ["once", "always", "refuse"]).id


def test_the_owner_checks_the_tables_of_the_file_it_holds_once(held: GovernanceStore) -> None:
    _ask(held)  # the first operation on the held file checks its tables and id
    before = held.stats
    for n in range(1, 6):
        decision = _ask(held, n)
        assert held.get_pending(decision).status == "pending"
        held.answer_pending(decision, "once", by="ana")
        assert [p.id for p in held.pending()] == [held.pending()[0].id]
        held.rules()
    after = held.stats
    assert after["schema_reads"] == before["schema_reads"]
    assert after["commits"] == before["commits"] + 10


def test_a_store_that_does_not_hold_the_file_checks_its_tables_every_operation(home: Home) -> None:
    store = GovernanceStore(home)
    store.add_rule("write_file", "deny", "secrets/", by="ana")
    before = store.stats["schema_reads"]
    for n in range(3):
        store.get_pending(_ask(store, n))
    assert store.stats["schema_reads"] >= before + 6  # each of the six operations read them


def test_pending_decisions_the_owner_writes_keep_the_snapshot(held: GovernanceStore, monkeypatch) -> None:
    # A snapshot read within a timestamp tick (50 ms) of a write is read again, as another write in the same
    # tick could not be told apart; that window is not what is counted here, whatever the machine's speed.
    monkeypatch.setattr("apollia_nb.governance.store._RACY_NS", 0)
    view = held.view()
    reads = held.stats["snapshot_reads"]
    first = _ask(held, 1)
    assert held.view() == view
    held.answer_pending(first, "once", by="ana")
    assert held.view() == view
    _ask(held, 2)
    assert [d.status for d in held.expire_pending(0)] == ["expired"]
    assert held.view() == view
    assert held.stats["snapshot_reads"] == reads


def test_rules_consents_and_developer_mode_changed_between_pending_writes_are_in_the_next_view(
        held: GovernanceStore) -> None:
    held.view()
    decision = _ask(held, 1)
    held.add_rule("bash_executor", "deny", "rm", by="ana")
    assert ("bash_executor", "rm") in {(r.tool, r.prefix) for r in held.view().rules}
    held.answer_pending(decision, "always", by="ana")
    held.grant_consent("clerk", "write", by="ana")
    assert ("clerk", Family.WRITE) in held.view().consents
    _ask(held, 2)
    held.set_developer_mode(True, by="ana")
    assert held.view().developer_mode
    held.revoke_consent("clerk", "write", by="ana")
    _ask(held, 3)
    assert ("clerk", Family.WRITE) not in held.view().consents


def test_another_file_put_in_place_of_the_held_one_fails_closed_after_its_checks_were_kept(
        held: GovernanceStore, home: Home, tmp_path: Path) -> None:
    decision = _ask(held)
    held.get_pending(decision)  # the held file's checks are kept from here on
    other = _home(tmp_path / "other")
    GovernanceStore(other).add_rule("write_file", "allow", by="mallory")
    os.replace(other.governance_db, home.governance_db)
    view = held.view()
    assert not view.readable and "replaced while the home was open" in view.unreadable_reason
    with pytest.raises(GovernanceUnreadable, match="replaced while the home was open"):
        held.get_pending(decision)
    with pytest.raises(GovernanceUnreadable, match="replaced while the home was open"):
        _ask(held, 2)
    with pytest.raises(GovernanceUnreadable, match="replaced while the home was open"):
        held.answer_pending(decision, "once", by="ana")
