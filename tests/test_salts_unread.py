"""A journal's salts (format 2) never reach a reader, on an owned or a served home.

Each payload field is committed through a salt stored beside it (``"@salts"``; an erased field's commitment
under ``"@erased"``). Every reading surface answers the fields alone: the owner's ``Journal.entries``, a
client runtime's entries, the internal journal routes' append and page answers, the public
``/audit/entries`` and ``/audit/verify``, the SDK, verification reports and OCSF events' mapped fields.
Only what a verifier needs keeps the stored bytes (the entries read ``stored``, an export's pages), and
those still verify. A served verification says what the owner's does: the format, the erased fields, the
losses a repair recorded. Against real parts: the home's DuckDB journal, a server on 127.0.0.1 (port 0), the
public SDK.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import httpx
import pytest
from test_served_call_answers import call_body

from apollia_nb.api.server import ServerThread
from apollia_nb.journal.ocsf import ocsf_events
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client

pytestmark = pytest.mark.anyio

TOKEN = "salts-unread-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PAYLOADS = [{"text": "ü", "n": 1}, {"path": "a.txt", "output": "secret-ish"}, {"a": [1, 2], "b": None}]


def _stored_salts(home: Any) -> list[str]:
    """Every salt the journal file holds (read from the file itself, as no reader may show it)."""
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        rows = con.execute("SELECT payload FROM entries").fetchall()
    finally:
        con.close()
    salts = []
    for (payload,) in rows:
        data = json.loads(bytes(payload))
        salts.extend(data.get("@salts", {}).values())
        salts.extend(data.get("@erased", {}).values())
    return salts


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    return json.dumps(value, ensure_ascii=False, default=str)


def assert_unsalted(where: str, answer: Any, salts: list[str]) -> None:
    text = _text(answer)
    assert "@salts" not in text and "@erased" not in text, (where, text[:400])
    shown = [s for s in salts if s in text]
    assert not shown, (where, shown[:3], text[:400])


def _ocsf_fields(entries: list[Any], origin: str, key_id: str) -> list[dict[str, Any]]:
    """OCSF events without ``payload_base64`` (documented to carry the stored bytes for a verifier)."""
    return [_dropped(event) for event in ocsf_events(entries, origin, key_id)]


def _dropped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _dropped(v) for k, v in value.items() if k != "payload_base64"}
    if isinstance(value, list):
        return [_dropped(v) for v in value]
    return value


async def _journal_a_few(home: Any) -> None:
    async with Runtime(home) as rt:
        assert rt.journal.format == "2"
        for i, payload in enumerate(PAYLOADS):
            rt.journal.append("note", payload, run_id=f"run-{i % 2}", agent="clerk")


async def _walk_owned(home: Any) -> None:
    salts = _stored_salts(home)
    assert len(salts) >= sum(len(p) for p in PAYLOADS)  # the journal does hold salts: the scan can fail
    async with Runtime(home) as rt:
        entries = rt.journal.entries()
        notes = [e for e in entries if e.kind == "note"]
        assert [e.data() for e in notes] == PAYLOADS
        for e in entries:
            assert_unsalted(f"entry {e.seq} payload", e.payload, salts)
            assert_unsalted(f"entry {e.seq} to_dict", e.to_dict(), salts)
            assert e.stored is not None and b"@salts" in e.stored  # the verifier's bytes are kept
        report = rt.verify()
        assert report.ok and report.format == "2"
        assert_unsalted("verify", report.to_dict(), salts)
        assert_unsalted("replay", rt.replay("run-0").to_dict(), salts)
        assert_unsalted("ocsf", _ocsf_fields(entries, rt.journal.origin, rt.journal.key_id), salts)
        assert_unsalted("panel tail", _panel_tail(rt.journal, "run-0"), salts)


async def test_no_reading_surface_of_an_owned_or_a_served_home_shows_a_salt(home):
    await _journal_a_few(home)
    await _walk_owned(home)  # the home owned by this process
    with ServerThread(home, token=TOKEN) as srv:
        with httpx.Client(base_url=srv.url + "/api/v1", headers=AUTH, timeout=30) as http:
            added = http.post("/internal/journal/entries", json={"entries": [
                {"kind": "note", "payload": {"late": "é"}, "run_id": "run-9", "agent": None}]})
            assert added.status_code == 201
            salts = _stored_salts_served(http)
            assert salts  # the scan can fail
            answers = {
                "append": added.json(),
                "internal page": http.get("/internal/journal/entries").json(),
                "internal run page": http.get("/internal/journal/entries", params={"run_id": "run-0"}).json(),
                "internal kinds page": http.get("/internal/journal/entries", params={"kinds": ["note"]}).json(),
                "internal verify": http.post("/internal/journal/verify", json={"checkpoint": None}).json(),
                "internal head": http.get("/internal/journal/head").json(),
                "audit entries": http.get("/audit/entries").json(),
                "audit verify": http.get("/audit/verify").json(),
                "governed call": http.post("/internal/calls", json=call_body("run-c", "c1")).json(),
            }
            assert [r["kind"] for r in answers["governed call"]["entries"]][-1] in ("tool_call", "tool_result")
            for where, answer in answers.items():
                assert_unsalted(where, answer, salts)
            assert json.loads(added.json()["entries"][0]["payload"]) == {"late": "é"}
            # the internal verify answer says what the owner's does
            verify = answers["internal verify"]
            assert verify["ok"] and verify["format"] == "2" and verify["erased"] == 0 and verify["losses"] == []
            assert answers["internal head"]["format"] == "2"
        with Client(srv.url, TOKEN) as sdk:
            assert_unsalted("sdk entries", sdk.entries(limit=1000), salts)
            assert_unsalted("sdk iter", [e for e in sdk.iter_entries(page=2)], salts)
        async with Runtime(home) as client:  # a client of the server: its journal is read over HTTP
            entries = client.journal.entries()
            assert [e.data() for e in entries if e.kind == "note"][:len(PAYLOADS)] == PAYLOADS
            for e in entries:
                assert_unsalted(f"client entry {e.seq}", e.to_dict(), salts)
            in_place = client.journal.verify_in_place()
            assert in_place.ok and in_place.format == "2"
            assert_unsalted("client verify in place", in_place.to_dict(), salts)
            paged = client.journal.verify_paged(page=2)  # the stored bytes a verifier needs still come
            assert paged.ok and paged.format == "2" and paged.entries == len(entries)
            assert_unsalted("client replay", client.replay("run-0").to_dict(), salts)
            assert_unsalted("client ocsf", _ocsf_fields(entries, client.journal.origin, client.journal.key_id),
                            salts)
            assert_unsalted("client panel tail", _panel_tail(client.journal, "run-0"), salts)


def _panel_tail(journal: Any, run_id: str) -> list[dict[str, Any]]:
    """The side panel's journal tail of a run, read as the panel reads it (its own query, its entry JSON)."""
    from apollia_nb.journal.entry import Entry
    from apollia_nb.notebook.panel import _entry_json

    rows = journal.sql(f"SELECT {', '.join(Entry.COLUMNS)} FROM entries WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
                       [run_id, 10])
    assert rows
    return [_entry_json(r) for r in rows]


def _stored_salts_served(http: httpx.Client) -> list[str]:
    """The salts as a verifier reads them from the server (entries read ``stored``)."""
    rows = http.get("/internal/journal/entries", params={"stored": True}).json()["entries"]
    salts: list[str] = []
    for row in rows:
        data = json.loads(row["payload"])
        salts.extend(data.get("@salts", {}).values())
    return salts


async def test_a_served_home_after_an_erasure_shows_no_commitment_and_verifies_as_the_owner_does(home):
    from apollia_nb.journal.verify import verify_journal
    from apollia_nb.runtime.erasure import erase_home

    await _journal_a_few(home)
    async with Runtime(home) as rt:
        seq = next(e.seq for e in rt.journal.entries() if e.data() == PAYLOADS[1])
    erase_home(home, seq=seq, field_path="output", reason="asked to", by="tester")
    secrets = _stored_salts(home)  # the salts left and the erased field's commitment
    assert any(len(s) == 64 for s in secrets)  # the erased field's commitment is among them
    async with Runtime(home) as rt:
        owned = verify_journal(rt.journal)
        assert owned.ok and owned.erased == 1 and owned.format == "2"
        for e in rt.journal.entries():
            assert_unsalted(f"owned entry {e.seq}", e.to_dict(), secrets)
    with ServerThread(home, token=TOKEN) as srv:
        with httpx.Client(base_url=srv.url + "/api/v1", headers=AUTH, timeout=30) as http:
            for where, answer in {
                "internal page": http.get("/internal/journal/entries").json(),
                "internal verify": http.post("/internal/journal/verify", json={"checkpoint": None}).json(),
                "audit entries": http.get("/audit/entries").json(),
                "audit verify": http.get("/audit/verify").json(),
            }.items():
                assert_unsalted(where, answer, secrets)
            stored = http.get("/internal/journal/entries", params={"stored": True}).json()["entries"]
            assert any("@erased" in row["payload"] for row in stored)  # a verifier still gets the commitment
        async with Runtime(home) as client:
            erased = [e for e in client.journal.entries() if e.seq == seq]
            assert erased[0].data() == {"path": "a.txt"} and erased[0].erased() == ["output"]
            for report in (client.journal.verify_in_place(), client.journal.verify_paged(page=2)):
                assert (report.ok, report.erased, report.format) == (True, 1, "2")
                assert report.summary() == owned.summary()


async def test_a_served_verification_names_the_losses_a_repair_recorded_as_the_owners_does(home):
    from test_journal_truncated import _cli, _log, _record_ends, killed

    from apollia_nb.journal.verify import verify_home

    killed(home, "add(2, 'run-1', 'run_open')\nadd(2)\nj.entries()\nadd(2, 'run-2', 'run_open')\nadd(3, 'run-2')"
                 "\nj.checkpoint()")
    data = _log(home).read_bytes()
    _log(home).write_bytes(data[:_record_ends(data)[5] - 3])  # entries 6..9 were acknowledged and are gone
    done = _cli("home", "repair", "--lost-entries", "--yes", home=home)
    assert done.returncode == 0, done.stderr
    made = _cli("home", "repair", "--new-runtime-db", home=home)  # the home held a journal alone
    assert made.returncode == 0, made.stderr
    owned = verify_home(home)
    assert owned.ok and owned.losses and "loss: entry 10" in owned.summary()
    with ServerThread(home, token=TOKEN) as srv:
        with httpx.Client(base_url=srv.url + "/api/v1", headers=AUTH, timeout=30) as http:
            answer = http.post("/internal/journal/verify", json={"checkpoint": None}).json()
            assert answer["losses"] == [dict(loss) for loss in owned.losses]
        async with Runtime(home) as client:
            for report in (client.journal.verify_in_place(), client.journal.verify_paged(page=3)):
                assert report.losses == owned.losses and report.summary() == owned.summary()
