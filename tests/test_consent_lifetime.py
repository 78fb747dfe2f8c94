"""Standing consents with a lifetime: ``always for 8h`` or until revoked.

A consent given for a while applies to calls decided before its end and to none after it (the runtime's
clock, injected here); its end is journaled (``consent_expired``) when the home's owner first notices it,
on the next call; a revocation is journaled and applies to the next call; an end that does not read is
never taken as "forever"; a lifetime that does not read is refused with ``BAD_DURATION`` and changes
nothing. ``apollia-os consents list`` shows who gave each consent, when, from which card and until when,
over a home the command owns and over a served one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadDuration
from apollia_nb.governance.decision import Family
from apollia_nb.governance.store import GovernanceStore, parse_lifetime
from apollia_nb.home import Home
from apollia_nb.journal import Journal
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from test_governance_store import RecordingJournal

pytestmark = pytest.mark.anyio

START = 1_800_000_000.0  # the runtime's clock at the start of each test (seconds since the epoch)
APOLLIA = [sys.executable, "-m", "apollia_nb"]


def _writes(n: int) -> list[dict[str, Any]]:
    """An actor script of ``n`` tasks, each writing one file and then saying it is done."""
    turns: list[dict[str, Any]] = []
    for i in range(n):
        turns += [{"tool_calls": [call("write_file", path=f"f{i}.txt", content="x")]}, {"text": "Done."}]
    return turns


def _payloads(rt: Any, *kinds: str) -> list[tuple[int, str, dict[str, Any]]]:
    return [(e.seq, e.kind, json.loads(e.payload)) for e in rt.journal.entries(kinds=list(kinds))]


async def _task(rt: Any) -> Any:
    handle = await rt.submit("clerk", "Write a file", watched=False)
    await handle.settled()
    return handle


# --- reading a lifetime -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("30m", timedelta(minutes=30)), ("90min", timedelta(minutes=90)), ("8h", timedelta(hours=8)),
    (" 24H ", timedelta(hours=24)), ("7d", timedelta(days=7)), ("366d", timedelta(days=366)),
    ("until revoked", None), ("Until Revoked", None), (None, None),
])
def test_a_lifetime_reads_as_minutes_hours_or_days_or_until_revoked(text, expected):
    assert parse_lifetime(text) == expected


@pytest.mark.parametrize("text", [
    "", "8", "h", "0h", "00h", "-1h", "+1h", "1.5h", "1e3h", "8 hours", "8hours", "8h30m", "8s", "1w", "367d",
    "9999999d", "forever", "never", "until", "8h; rm -rf /", "８h", "8h\x00", 8, 8.0, ["8h"],
])
def test_a_lifetime_that_does_not_read_is_bad_duration(text):
    with pytest.raises(BadDuration) as info:
        parse_lifetime(text)
    assert info.value.code == "BAD_DURATION" and info.value.http_status == 422


# --- in force until its end, on the runtime's clock ----------------------------------------------------


async def test_a_timed_consent_applies_before_its_end_and_stops_at_it(home):
    now = [START]
    async with Runtime(home, clock=lambda: now[0]) as rt:
        await rt.register_agent(manifest(actor=_writes(4)))
        first = await _task(rt)
        [card] = rt.pending_decisions()
        answered = rt.answer(card["id"], "always", by="ann", lasting="1h")
        assert answered["answer"] == "always"
        assert (await first).status == "completed"
        ends = datetime.fromtimestamp(START + 3600, timezone.utc)
        [consent] = rt.governance.consents()
        assert consent.to_dict() == {
            "agent": "clerk", "family": "write", "granted_by": "ann",
            "granted_at": datetime.fromtimestamp(START, timezone.utc).isoformat().replace("+00:00", "Z"),
            "card": card["id"], "until": ends.isoformat().replace("+00:00", "Z"), "state": "in force"}

        now[0] = START + 3599  # a second before its end: no card
        second = await _task(rt)
        assert second.status == "completed" and rt.pending_decisions() == []
        assert _payloads(rt, "consent_expired") == []

        now[0] = START + 3600  # at its end: the next call asks again
        third = await _task(rt)
        assert third.status == "waiting" and len(rt.pending_decisions()) == 1
        assert rt.governance.consents() == []
        [(expired_seq, _, expired)] = _payloads(rt, "consent_expired")
        assert {k: expired[k] for k in ("agent", "family", "until", "granted_by", "card", "noticed_at")} == {
            "agent": "clerk", "family": "write", "until": consent.to_dict()["until"], "granted_by": "ann",
            "card": card["id"], "noticed_at": consent.to_dict()["until"]}
        # noticed by the call after the end, before that call was decided
        asked = [seq for seq, _, p in _payloads(rt, "decision") if p["outcome"] == "ask"]
        assert asked[0] < expired_seq < asked[1]

        now[0] = START + 7200  # noticed once: later calls journal nothing more
        rt.answer(rt.pending_decisions()[0]["id"], "once", by="ann")
        assert (await third).status == "completed"
        fourth = await _task(rt)
        assert fourth.status == "waiting"
        assert len(_payloads(rt, "consent_expired")) == 1

    [(_, _, answer)] = [a for a in _payloads_of(home, "answer") if a[2]["answer"] == "always"]
    assert (answer["for"], answer["until"]) == ("1h", consent.to_dict()["until"])
    [(_, _, granted)] = _payloads_of(home, "consent_granted")
    assert (granted["card"], granted["until"], granted["by"]) == (card["id"], consent.to_dict()["until"], "ann")


def _payloads_of(home: Home, kind: str) -> list[tuple[int, str, dict[str, Any]]]:
    journal = Journal.open(home)
    try:
        return [(e.seq, e.kind, json.loads(e.payload)) for e in journal.entries(kinds=[kind])]
    finally:
        journal.close()


async def test_an_ended_consent_is_journaled_once_after_a_restart_and_not_applied(home):
    now = [START]
    async with Runtime(home, clock=lambda: now[0]) as rt:
        await rt.register_agent(manifest(actor=_writes(2)))
        first = await _task(rt)
        rt.answer(rt.pending_decisions()[0]["id"], "always", by="ann", lasting="30m")
        await first
    now[0] = START + 1800 + 1  # the home was closed when it ended
    async with Runtime(home, clock=lambda: now[0]) as rt:
        second = await _task(rt)
        assert second.status == "waiting"
        assert rt.governance.consents() == []
        assert len(_payloads(rt, "consent_expired")) == 1


async def test_a_revoked_consent_is_journaled_and_the_next_call_asks(home):
    async with Runtime(home, clock=lambda: START) as rt:
        await rt.register_agent(manifest(actor=_writes(3)))
        first = await _task(rt)
        rt.answer(rt.pending_decisions()[0]["id"], "always", by="ann", lasting="until revoked")
        await first
        [consent] = rt.governance.consents()
        assert consent.until is None and consent.state == "in force"
        assert (await _task(rt)).status == "completed"
        rt.governance.revoke_consent("clerk", "write", by="bob")
        third = await _task(rt)
        assert third.status == "waiting"
        [(_, _, revoked)] = _payloads(rt, "consent_revoked")
        assert (revoked["agent"], revoked["family"], revoked["by"]) == ("clerk", "write", "bob")
        assert _payloads(rt, "consent_expired") == []


async def test_a_longer_always_replaces_a_shorter_one_and_a_shorter_one_changes_nothing(home):
    now = [START]
    async with Runtime(home, clock=lambda: now[0]) as rt:
        store = rt.governance
        ends = datetime.fromtimestamp(START, timezone.utc)
        short = store.grant_consent("clerk", "write", by="ann", until=ends + timedelta(hours=1), card="pd-a")
        long = store.grant_consent("clerk", "write", by="bob", until=ends + timedelta(hours=8), card="pd-b")
        assert (long.granted_by, long.card) == ("bob", "pd-b")
        assert store.grant_consent("clerk", "write", by="cy", until=ends + timedelta(hours=2)) == long
        forever = store.grant_consent("clerk", "write", by="dee")
        assert forever.until is None
        assert store.grant_consent("clerk", "write", by="eve", until=ends + timedelta(hours=9)) == forever
        granted = [p for _, _, p in _payloads(rt, "consent_granted")]
        assert [p["by"] for p in granted] == ["ann", "bob", "dee"]
        assert granted[1]["replaces"] == {"granted_by": "ann", "until": _z(short.until), "state": "in force"}
        with pytest.raises(BadDuration):  # an end in the past is not a consent
            store.grant_consent("clerk", "send", by="ann", until=ends - timedelta(seconds=1))
        with pytest.raises(BadDuration):  # an end without its zone is not read as anything
            store.grant_consent("clerk", "send", by="ann", until=datetime(2099, 1, 1))
        assert [c.family for c in store.consents()] == [Family.WRITE]


def _z(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


# --- what does not read never applies -----------------------------------------------------------------


@pytest.mark.parametrize("until", [
    "soon", "", "2999-01-01T00:00:00", "2999-01-01", "infinity", "9999-99-99T00:00:00Z", "null", "0",
])
def test_an_end_that_does_not_read_never_applies(home, until):
    journal = Journal.open(home)
    clock = datetime.fromtimestamp(START, timezone.utc)
    store = GovernanceStore.open(home, journal, clock=lambda: clock)
    try:
        store.grant_consent("clerk", "write", by="ann", until=clock + timedelta(hours=8), card="pd-x")
        store.grant_consent("clerk", "send", by="ann")
        store.close()
        con = duckdb.connect(str(home.governance_db))
        con.execute("UPDATE consents SET until = ? WHERE family = 'write'", [until])
        con.close()
        view = store.view()
        assert view.readable and view.consents == frozenset({("clerk", Family.SEND)})
        states = {c.family.value: c.state for c in store.consents()}
        assert states == {"write": "unreadable", "send": "in force"}
    finally:
        store.close()
        journal.close()


def test_an_ended_consent_stays_out_when_its_end_cannot_be_journaled(home):
    sink = RecordingJournal()
    clock = [datetime.fromtimestamp(START, timezone.utc)]
    store = GovernanceStore(home, journal=sink, clock=lambda: clock[0])
    store.grant_consent("clerk", "write", by="ann", until=clock[0] + timedelta(minutes=5))
    assert ("clerk", Family.WRITE) in store.view().consents
    clock[0] += timedelta(minutes=5)
    sink.fail = OSError("the journal refuses")
    for _ in range(3):  # refused each time: never applied meanwhile
        assert store.view().consents == frozenset()
    assert "consent_expired" not in sink.kinds
    sink.fail = None
    assert store.view().consents == frozenset()
    assert sink.kinds.count("consent_expired") == 1
    assert store.consents() == []


def test_a_database_from_before_ends_were_kept_reads_its_consents_as_until_revoked(home):
    sink = RecordingJournal()
    clock = datetime.fromtimestamp(START, timezone.utc)
    store = GovernanceStore(home, journal=sink, clock=lambda: clock)
    store.grant_consent("clerk", "write", by="ann")
    con = duckdb.connect(str(home.governance_db))
    con.execute("ALTER TABLE consents DROP COLUMN until")
    con.execute("ALTER TABLE consents DROP COLUMN card")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.close()
    store = GovernanceStore(home, journal=sink, clock=lambda: clock)
    assert store.view().consents == frozenset({("clerk", Family.WRITE)})
    [old] = store.consents()
    assert (old.until, old.card, old.state) == (None, None, "in force")
    store.grant_consent("clerk", "send", by="ann", until=clock + timedelta(hours=1), card="pd-y")
    con = duckdb.connect(str(home.governance_db), read_only=True)
    version = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    con.close()
    assert version == ("2",)  # a version that reads only 1 refuses it rather than apply the end as forever
    assert {c.family.value: c.until for c in store.consents()} == {"send": clock + timedelta(hours=1),
                                                                    "write": None}


# --- answers that carry a lifetime ---------------------------------------------------------------------


async def test_a_lifetime_goes_with_always_for_a_family_only(home):
    async with Runtime(home, clock=lambda: START) as rt:
        await rt.register_agent(manifest(actor=_writes(1)))
        handle = await _task(rt)
        [card] = rt.pending_decisions()
        for answer, lasting in (("once", "8h"), ("refuse", "8h"), ("always", "8 hours"), ("always", "0m")):
            with pytest.raises(BadDuration):
                rt.answer(card["id"], answer, by="ann", lasting=lasting)
        assert [p["id"] for p in rt.pending_decisions()] == [card["id"]]  # still waiting, nothing answered
        assert _payloads(rt, "answer", "consent_granted") == []
        rt.answer(card["id"], "always", by="ann", lasting="8h")
        assert (await handle).status == "completed"


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _cli(home: Home, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([*APOLLIA, *args, "--home", str(home.path)], capture_output=True, text=True,
                          timeout=120, env=env)


def _wait_pending(client: httpx.Client, n: int) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + 60
    while len(pending := client.get("/pending-decisions").json()) < n:
        assert time.monotonic() < deadline, pending
        time.sleep(0.05)
    return pending


def test_rest_answers_carry_a_lifetime_and_bad_ones_are_bad_duration(home):
    with ServerThread(home, token="t-" + "a" * 40) as srv, _client(srv.url, srv.token) as api:
        assert api.post("/agents", json={"manifest": manifest(actor=_writes(1))}).status_code == 201
        assert api.post("/tasks", json={"agent": "clerk", "goal": "Write"}).status_code == 202
        [card] = _wait_pending(api, 1)
        for body in ({"answer": "always", "for": "8 hours"}, {"answer": "always", "for": "-8h"},
                     {"answer": "always", "for": "400d"}, {"answer": "once", "for": "8h"},
                     {"answer": "always", "for": 8}):
            refused = api.post("/pending-decisions/decide", json={"id": card["id"], **body})
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] in ("BAD_DURATION", "BAD_INPUT"), refused.text
        assert refused.json()["code"] == "BAD_INPUT"  # not text: refused as malformed before it is read
        assert [p["id"] for p in api.get("/pending-decisions").json()] == [card["id"]]
        answered = api.post("/pending-decisions/decide", json={"id": card["id"], "answer": "always", "for": "8h"})
        assert answered.status_code == 200, answered.text
        [consent] = api.get("/governance/consents").json()
        assert (consent["card"], consent["state"], consent["granted_by"]) == (card["id"], "in force", "api")
        assert consent["until"] is not None and consent["until"].endswith("Z")
        entries = api.get("/audit/entries", params={"limit": 1000}).json()["entries"]
    assert [e["payload"]["for"] for e in entries if e["kind"] == "answer"] == ["8h"]
    assert sum(e["kind"] == "answer" for e in entries) == 1  # the refused ones journaled no answer


async def test_consents_list_over_an_owned_and_a_served_home(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=_writes(1)))
        first = await _task(rt)
        [card] = rt.pending_decisions()
        rt.answer(card["id"], "always", by="ann", lasting="8h")
        await first
        rt.governance.grant_consent("archivist", "send", by="bob")
    [until] = [c.to_dict()["until"] for c in GovernanceStore(home).consents() if c.agent == "clerk"]

    def check(listed: subprocess.CompletedProcess[str], agent_only: subprocess.CompletedProcess[str],
              text: subprocess.CompletedProcess[str]) -> None:
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        assert [(r["agent"], r["family"], r["granted_by"], r["card"], r["until"], r["state"]) for r in rows] == [
            ("archivist", "send", "bob", None, None, "in force"),
            ("clerk", "write", "ann", card["id"], until, "in force")]
        assert all(r["granted_at"] for r in rows)
        assert [r["agent"] for r in json.loads(agent_only.stdout)] == ["clerk"]
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0].split() == ["AGENT", "FAMILY", "GIVEN", "BY", "AT", "CARD", "ENDS"]
        assert "until revoked" in lines[1] and lines[1].split()[:3] == ["archivist", "send", "bob"]
        assert card["id"] in lines[2] and until in lines[2] and lines[2].split()[:3] == ["clerk", "write", "ann"]

    check(_cli(home, "consents", "list", "--json"), _cli(home, "consents", "list", "--agent", "clerk", "--json"),
          _cli(home, "consents", "list"))
    refused = _cli(home, "consents", "list", "--agent", "Not An Agent")
    assert refused.returncode == 3 and "BAD_INPUT" in refused.stderr
    with ServerThread(home, token="t-" + "b" * 40):
        check(_cli(home, "consents", "list", "--json"),
              _cli(home, "consents", "list", "--agent", "clerk", "--json"), _cli(home, "consents", "list"))
        revoked = _cli(home, "consents", "revoke", "clerk", "write", "--by", "cy")
        assert revoked.returncode == 0, revoked.stderr
        left = _cli(home, "consents", "list", "--agent", "clerk", "--json")
        assert json.loads(left.stdout) == []


async def test_pending_decide_for_gives_a_timed_consent_and_refuses_a_bad_one(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=_writes(1)))
        await _task(rt)
        [card] = rt.pending_decisions()
    bad = _cli(home, "pending", "decide", card["id"], "always", "--for", "eight hours")
    assert bad.returncode == 3 and "BAD_DURATION" in bad.stderr
    good = _cli(home, "pending", "decide", card["id"], "always", "--for", "2d", "--json")
    assert good.returncode == 0, good.stderr
    [consent] = GovernanceStore(home).consents()
    assert consent.card == card["id"] and consent.until is not None
    assert timedelta(days=2) - timedelta(minutes=5) < consent.until - consent.granted_at <= timedelta(days=2)


def test_a_store_that_journals_nothing_leaves_an_ended_consent_out_and_records_nothing(home):
    clock = [datetime.fromtimestamp(START, timezone.utc)]
    owner = GovernanceStore(home, journal=RecordingJournal(), clock=lambda: clock[0])
    owner.grant_consent("clerk", "write", by="ann", until=clock[0] + timedelta(hours=1))
    reader = GovernanceStore(home, clock=lambda: clock[0])  # another process reading (no journal)
    assert ("clerk", Family.WRITE) in reader.view().consents
    clock[0] += timedelta(hours=1)
    assert reader.view().consents == frozenset()  # the same snapshot, rebuilt at its end
    [ended] = reader.consents()
    assert ended.state == "ended" and ended.to_dict()["state"] == "ended"  # listed, not applied, not removed


# --- the notebook's card ----------------------------------------------------------------------------------

from notebook_fixtures import ip  # noqa: E402,F401 - the fixture


def test_the_notebook_card_offers_how_long_always_lasts(ip):
    from apollia_nb.notebook.widgets import LIFETIMES

    ip.run_cell_magic("apollia", "agent", manifest(actor=_writes(1)))
    task = ip.run_cell_magic("apollia", "task clerk", "do it").join(10, settled=True)
    [view] = task.widget.cards.values()
    assert view.lifetime is not None and list(view.lifetime.options) == list(LIFETIMES)
    row = list(view.button_row.children)
    assert row.index(view.lifetime) == row.index(view.buttons["always"]) + 1
    assert view.lifetime.value is None  # until revoked unless chosen
    view.lifetime.value = "8h"
    view.buttons["always"].click()
    assert task.join(10).status == "completed"
    assert view.frozen and view.lifetime.disabled
    rt = ip.magics_manager.registry["ApolliaMagics"].runtime
    [consent] = rt.call(lambda: rt.rt.governance.consents())
    assert consent.card == view.snap["id"]
    assert timedelta(hours=8) - timedelta(minutes=5) < consent.until - consent.granted_at <= timedelta(hours=8)


async def test_a_client_of_a_served_home_gives_a_timed_consent_through_its_server(home):
    ends = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2)
    with ServerThread(home, token="t-" + "c" * 40) as srv, _client(srv.url, srv.token) as api:
        async with Runtime(home) as rt:
            assert rt.mode == "client"
            given = rt.governance.grant_consent("clerk", "send", by="ann", until=ends, card="pd-z")
            assert (given.until, given.card) == (ends, "pd-z")
            [listed] = rt.governance.consents()
            assert (listed.until, listed.card, listed.state) == (ends, "pd-z", "in force")
        [served] = api.get("/governance/consents").json()
    assert (served["until"], served["card"]) == (_z(ends), "pd-z")
