"""The facts a home's record is read from are kept in ``runtime.db`` between opens.

Opening a home reads only the journal entries after the kept facts, and only while
the entry they end at is still the journal's (same seq, same hash); anything else
— no facts, facts that do not parse, facts of another chain — reads every entry.
Real homes: a real ``Journal`` and a real ``Runtime`` on disk.
"""

from __future__ import annotations

import dataclasses

import duckdb
import pytest

from apollia_nb.home import Home
from apollia_nb.journal import Journal
from apollia_nb.journal.accounting import FILE_CREATED, HomeFacts, read_home_facts, read_home_record
from apollia_nb.runtime import Runtime


def kept(home: Home) -> HomeFacts | None:
    con = duckdb.connect(str(home.runtime_db), read_only=True)
    try:
        rows = con.execute("SELECT facts FROM home_facts WHERE id = 1").fetchall()
    finally:
        con.close()
    return HomeFacts.from_json(rows[0][0]) if rows else None


def keep(home: Home, text: str) -> None:
    con = duckdb.connect(str(home.runtime_db))
    try:
        con.execute("UPDATE home_facts SET facts = ? WHERE id = 1", [text])
    finally:
        con.close()


async def open_close(home: Home) -> int:
    async with Runtime(home) as rt:
        return rt.journal.head()[0]


def test_facts_name_the_entry_they_end_at_and_round_trip(home: Home) -> None:
    with Journal.open(home) as journal:
        assert read_home_facts(journal).seq == 0  # no entries: nothing to keep
        journal.append(FILE_CREATED, {"file": "runtime.db"})
        journal.append("policy_loaded", {"status": "accepted"})
        facts = read_home_facts(journal)
        assert (facts.seq, facts.hash) == journal.head()
        assert facts.files == ({"file": "runtime.db"},) and facts.policy == (2, "policy_loaded", {"status": "accepted"})
        assert facts.record() == read_home_record(journal)
        assert facts.record().runtime_db and facts.record().policy
    assert HomeFacts.from_json(facts.to_json()) == facts
    for bad in (None, "", "[]", "{}", '{"seq": 0, "hash": "", "kinds": [], "files": [], "policy": null}',
                facts.to_json().replace('"hash": "', '"hash": "zz'), '{"seq": 1, "hash": "00", "kinds": [1], '
                '"files": [], "policy": null}'):
        assert HomeFacts.from_json(bad) is None, bad


def test_only_the_entries_after_kept_facts_are_read_while_their_last_entry_is_unchanged(home: Home) -> None:
    with Journal.open(home) as journal:
        journal.append(FILE_CREATED, {"file": "runtime.db"})
        journal.append("task_status", {"task_id": "t-1", "status": "running"}, run_id="r-1")
        base = read_home_facts(journal)
        # A fact no entry up to base.seq holds: read back, it shows those entries were not read again.
        marked = dataclasses.replace(base, kinds=base.kinds | {"devmode_changed"})
        journal.append(FILE_CREATED, {"file": "governance.db", "id": "g-1"})
        journal.append("policy_refused", {"status": "refused"})
        later = read_home_facts(journal, since=marked)
        assert "devmode_changed" in later.kinds and later.seq == journal.head()[0] == 4
        assert later.files == ({"file": "runtime.db"}, {"file": "governance.db", "id": "g-1"})
        assert later.policy == (4, "policy_refused", {"status": "refused"})
        record = later.record()
        assert record.governance_db and record.governance_id == "g-1" and record.policy
        # Facts whose last entry is not the journal's (another chain, or past its end) are not used.
        for other in (dataclasses.replace(marked, hash=bytes(32)), dataclasses.replace(marked, seq=9)):
            again = read_home_facts(journal, since=other)
            assert "devmode_changed" not in again.kinds
            assert again.record() == read_home_record(journal)


@pytest.mark.anyio
async def test_a_runtime_keeps_the_facts_it_read_and_the_next_open_starts_from_them(home: Home) -> None:
    await open_close(home)  # a new home: nothing to keep yet, then runtime.db is recorded
    head = await open_close(home)
    facts = kept(home)
    assert facts is not None and facts.seq == head and facts.files == ({"file": "runtime.db"},)

    async with Runtime(home) as rt:  # governance.db is made (and recorded) after the kept facts
        rt.governance.grant_consent("clerk", "write", by="ann")
    await open_close(home)
    facts = kept(home)
    assert facts is not None and [f["file"] for f in facts.files] == ["runtime.db", "governance.db"]

    home.governance_db.unlink()  # lost: the kept facts still say it existed, so it is damage
    async with Runtime(home) as rt:
        view = rt.governance.view()
        assert not view.readable and "governance.db is missing" in view.unreadable_reason
    assert not home.governance_db.exists()


@pytest.mark.anyio
async def test_kept_facts_that_do_not_read_are_replaced_by_a_full_read(home: Home) -> None:
    await open_close(home)
    await open_close(home)
    keep(home, "not the facts")
    head = await open_close(home)  # every entry read again, and the facts kept anew
    facts = kept(home)
    assert facts is not None and facts.seq == head and facts.files == ({"file": "runtime.db"},)
