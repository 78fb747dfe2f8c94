"""Pages of the journal read in bounded memory: the same entries as ``Journal.entries``, one seq range
at a time, and the REST API's journal pages still answer when the journal is far larger than the
memory its database may use."""

from __future__ import annotations

import itertools

import httpx

import apollia_nb.journal.store as store
from apollia_nb import dbutil
from apollia_nb.api.server import ServerThread
from apollia_nb.home import Home
from apollia_nb.journal.pages import entry_page
from apollia_nb.journal.store import Draft, Journal

TOKEN = "test-token-pages"
KINDS = ["decision", "tool_call", "tool_result", "note"]


def fill(journal: Journal, n: int, text: str = "", kinds: list[str] = KINDS, runs: bool = True) -> None:
    for start in range(0, n, 1000):
        journal.append_many(Draft(kinds[i % len(kinds)], {"i": i, "text": text},
                                  f"run-{i // 40}" if runs and i % 7 else None, "clerk")
                            for i in range(start, min(n, start + 1000)))


def test_a_page_holds_the_entries_the_journal_gives_for_every_filter(tmp_path):
    with Journal.open(Home.at(tmp_path / "home")) as journal:
        fill(journal, 2_345)
        head = journal.head()[0]
        for since, limit, kinds, run in itertools.product(
                (None, 0, 1, 999, 2_300, head, head + 5), (1, 7, 1000), (None, [], ["note"], ["note", "decision"]),
                (None, "run-3", "run-none")):
            want = journal.entries(run_id=run, since_seq=since, kinds=kinds, limit=limit)
            assert entry_page(journal, run_id=run, since_seq=since, kinds=kinds, limit=limit) == want, \
                (since, limit, kinds, run)


def test_the_apis_journal_pages_answer_on_a_journal_larger_than_its_memory(tmp_path, monkeypatch):
    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        fill(journal, 30_000, "x" * 200, kinds=["note", "remark", "memo", "aside"], runs=False)
    # The server's journal database may use 16 MB: less than the journal (30,000 entries of 200 bytes and
    # their hashes and signatures), which one ORDER BY seq LIMIT over every entry needs.
    monkeypatch.setattr(store, "limit_memory", lambda con, limit=None: dbutil.limit_memory(con, "16MB"))
    with ServerThread(home, token=TOKEN) as server, httpx.Client(
            base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as api:
        public = api.get("/audit/entries", params={"since_seq": 0, "limit": 1000})
        assert public.status_code == 200, public.text
        assert [e["seq"] for e in public.json()["entries"]] == list(range(1, 1001))
        assert public.json()["next_since_seq"] == 1000
        internal = api.get("/internal/journal/entries", params={"since_seq": 0, "limit": 10_000})
        assert internal.status_code == 200, internal.text
        assert [e["seq"] for e in internal.json()["entries"]] == list(range(1, 10_001))
        notes = api.get("/internal/journal/entries", params={"since_seq": 0, "limit": 1000, "kinds": ["aside"]})
        assert notes.status_code == 200, notes.text
        assert [e["seq"] for e in notes.json()["entries"]] == list(range(4, 4001, 4))
