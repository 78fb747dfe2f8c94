"""Erasure by data subject: calls tagged with whose data they carry, erased across runs by that person's id."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from apollia_nb.cli import main
from apollia_nb.errors import BadInput
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.scripted import ScriptedModel
from apollia_nb.runtime.tools import ToolDef
from runtime_helpers import call, manifest
from scan_home import assert_absent, find_everywhere

pytestmark = pytest.mark.anyio

ALICE = "cust-Alice-77310"
BOB = "cust-Bobby-55207"
#: What the CRM knows of each customer: a tool's output carries it.
RECORDS = {ALICE: "Alice Wunderlich-Oquendo", BOB: "Bobby Tarkanian-Vesely"}
BALANCES = {ALICE: "IBAN-DE44-ALICE-0001", BOB: "IBAN-DE44-BOBBY-0002"}


def crm_lookup(customer_id: str) -> dict[str, Any]:
    return {"name": RECORDS[customer_id], "tier": "gold"}


def ledger(account: str) -> dict[str, Any]:
    return {"iban": BALANCES[account]}


def weather(city: str) -> str:
    return f"sunny in {city}"


def _tools() -> list[ToolDef]:
    crm = ToolDef.from_function(crm_lookup, family="read")
    crm.parameters["properties"]["customer_id"]["x-apollia-subject"] = True  # its value is whose data it is
    return [crm, ToolDef.from_function(ledger, family="read"), ToolDef.from_function(weather, family="read")]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def _run(rt: Runtime, name: str, calls: list[dict[str, Any]]) -> None:
    if name not in [a.name for a in rt.agents()]:
        # the script given as a model, not in the manifest: a real model's turns are not in the agent's record
        await rt.register_agent(manifest(name), model=ScriptedModel(actor=[{"tool_calls": calls}, {"text": "done"}]),
                                tools=_tools())
    task = await (await rt.submit(name, "Look the customer up"))
    assert task.status == "completed", task.error


async def _work(home: Home) -> None:
    """Alice in three runs (two CRM lookups, one ledger read mapped in apollia.toml), Bob in one, weather untagged."""
    home.config_path.write_text('[subjects.tools]\nledger = "account"\n')
    async with Runtime(home) as rt:
        await _run(rt, "clerk-a", [call("crm_lookup", customer_id=ALICE)])
        await _run(rt, "clerk-b", [call("crm_lookup", customer_id=BOB), call("weather", city="Reykjavik-Nord")])
        await _run(rt, "clerk-c", [call("ledger", account=ALICE)])
        await _run(rt, "clerk-d", [call("crm_lookup", customer_id=ALICE), call("weather", city="Lisbon-Sul")])


def _payloads(home: Home) -> list[tuple[int, str, dict[str, Any]]]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        rows = con.execute("SELECT seq, kind, payload FROM entries ORDER BY seq").fetchall()
    finally:
        con.close()
    return [(s, k, json.loads(bytes(p))) for s, k, p in rows]


def _digest(home: Home, subject: str) -> str:
    key = (home.path / "keys" / "subjects.key").read_bytes()
    return "hmac-sha256:" + hmac.new(key, subject.encode(), hashlib.sha256).hexdigest()


@pytest.fixture
async def work_home(home):
    await _work(home)
    return home


async def test_calls_record_their_subjects_as_keyed_digests_never_the_id(work_home):
    home = work_home
    alice, bob = _digest(home, ALICE), _digest(home, BOB)
    tagged: dict[str, list[tuple[str, list[str]]]] = {alice: [], bob: []}
    for _, kind, payload in _payloads(home):
        for tag in payload.get("subjects", []):
            assert tag["subject"] in tagged, tag  # weather's calls carry no tag
            tagged[tag["subject"]].append((kind, tag["fields"]))
        assert ALICE not in json.dumps(payload.get("subjects")) and BOB not in json.dumps(payload.get("subjects"))
    kinds = sorted(k for k, _ in tagged[alice])
    # three calls of Alice: each its model turn, decision, tool_call and tool_result
    assert kinds == sorted(["model_response", "decision", "tool_call", "tool_result"] * 3), kinds
    assert ("tool_result", ["output", "output_digest"]) in tagged[alice]
    assert ("decision", ["arguments", "reason"]) in tagged[alice]
    assert ("model_response", ["tool_calls"]) in tagged[bob]
    assert len(tagged[bob]) == 4
    assert (home.path / "keys" / "subjects.key").stat().st_mode & 0o077 == 0


async def test_erase_one_subject_across_runs_leaves_the_others_and_verifies(work_home, capsys, tmp_path):
    home = work_home
    h = ["--home", str(home.path)]
    before = _payloads(home)
    assert find_everywhere(home.path, RECORDS[ALICE]) and find_everywhere(home.path, BALANCES[ALICE])
    code, out, err = run_cli(capsys, "audit", "erase", *h, "--subject", ALICE, "--reason", "Art. 17 request", "--json")
    assert code == 0, err
    done = json.loads(out)
    assert done["fields"] == 3 * (1 + 2 + 1 + 2), done  # per call: tool_calls, arguments+reason, arguments, output+digest
    assert len({e["seq"] for e in done["erased"]}) == 12
    after = _payloads(home)
    erasure = after[-1]
    assert erasure[1] == "erasure" and erasure[2]["subject"] == _digest(home, ALICE)
    assert ALICE not in json.dumps(erasure[2])
    # the journal verifies, counting the erased fields
    code, out, _ = run_cli(capsys, "audit", "verify", *h, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["erased"] == done["fields"], report
    # Alice's id and data are in no file of the home, nor in an export
    for value in (ALICE, RECORDS[ALICE], BALANCES[ALICE]):
        assert_absent(home.path, value)
    assert run_cli(capsys, "audit", "export", *h, str(tmp_path / "bundle"))[0] == 0
    for value in (ALICE, RECORDS[ALICE], BALANCES[ALICE]):
        assert_absent(tmp_path / "bundle", value)
    # Bob's and the untagged weather calls' are where they were
    for value in (BOB, RECORDS[BOB], "Reykjavik-Nord", "Lisbon-Sul"):
        assert find_everywhere(home.path, value), value
    untouched = [(s, k, p) for s, k, p in before if not any(
        t.get("subject") == _digest(home, ALICE) for t in p.get("subjects", []))]
    assert all(after[s - 1][2] == p for s, _, p in untouched)
    # asked again: nothing left, said so, nothing appended
    code, _, err = run_cli(capsys, "audit", "erase", *h, "--subject", ALICE, "--reason", "again")
    assert code == 3 and "NOT_FOUND" in err and "erased already" in err and ALICE not in err, err
    assert len(_payloads(home)) == len(after)
    # the runtime opens the erased home and takes work
    async with Runtime(home) as rt:
        await _run(rt, "clerk-e", [call("crm_lookup", customer_id=BOB)])


async def test_a_subject_no_tool_tagged_is_found_nowhere_and_said_so(home, capsys):
    h = ["--home", str(home.path)]
    async with Runtime(home) as rt:
        await rt.register_agent(manifest("clerk", actor=[{"tool_calls": [call("weather", city="Oslo-Vest")]},
                                                          {"text": "done"}]), tools=_tools()[2:])
        task = await (await rt.submit("clerk", "Weather"))
        assert task.status == "completed", task.error
    entries = len(_payloads(home))
    code, out, err = run_cli(capsys, "audit", "erase", *h, "--subject", "Oslo-Vest", "--reason", "asked")
    assert code == 3 and "NOT_FOUND" in err and "no tool call named one" in err, err
    assert "Oslo-Vest" not in err and not out
    assert len(_payloads(home)) == entries and not (home.path / "keys" / "subjects.key").exists()


async def test_an_unknown_subject_on_a_tagged_home_is_not_found_and_changes_nothing(work_home, capsys):
    h = ["--home", str(work_home.path)]
    entries = _payloads(work_home)
    code, _, err = run_cli(capsys, "audit", "erase", *h, "--subject", "cust-Nobody-00000", "--reason", "asked")
    assert code == 3 and "NOT_FOUND" in err and "no field of this journal is tagged with that data subject" in err
    assert _payloads(work_home) == entries


@pytest.mark.parametrize("text", [
    '[subjects]\ntools = "crm_lookup"\n',
    '[subjects.tools]\ncrm_lookup = 3\n',
    '[subjects.tools]\ncrm_lookup = []\n',
    '[subjects]\npeople = {crm_lookup = "customer_id"}\n',
])
async def test_a_subjects_table_that_does_not_read_refuses_to_open(home, text):
    home.config_path.write_text(text)
    with pytest.raises(BadInput, match="subjects"):
        async with Runtime(home):
            pass


def test_subject_with_a_field_or_with_a_seq_is_refused(home):
    from apollia_nb.runtime.erasure import erase_home

    for what in ({"subject": ALICE, "field_path": "output"}, {"subject": ALICE, "seq": 3}, {"subject": ""}):
        with pytest.raises(BadInput):
            erase_home(home, reason="asked", by="test", **what)


async def test_a_chat_sessions_calls_are_tagged_and_erased_by_subject(home, capsys):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest("chatter"), tools=_tools(), model=ScriptedModel(actor=[
            {"tool_calls": [call("crm_lookup", customer_id=ALICE)]}, {"text": "found"}]))
        session = rt.sessions.open("chatter")
        assert (await session.send("who is it?")).reply == "found"
    turns = [p for _, k, p in _payloads(home) if k == "model_response" and p.get("tool_calls")]
    assert turns and all(p["subjects"] == [{"subject": _digest(home, ALICE), "fields": ["tool_calls"]}] for p in turns)
    code, out, err = run_cli(capsys, "audit", "erase", "--home", str(home.path), "--subject", ALICE,
                             "--reason", "asked", "--json")
    assert code == 0, err
    assert run_cli(capsys, "audit", "verify", "--home", str(home.path))[0] == 0
    for value in (ALICE, RECORDS[ALICE]):
        assert_absent(home.path, value)


async def test_a_read_personal_call_answered_on_its_card_is_erased_with_its_card(home, capsys):
    async with Runtime(home) as rt:
        crm = ToolDef.from_function(crm_lookup, family="read_personal")
        crm.parameters["properties"]["customer_id"]["x-apollia-subject"] = True
        await rt.register_agent(manifest("asker"), tools=[crm], model=ScriptedModel(actor=[
            {"tool_calls": [call("crm_lookup", customer_id=BOB)]}, {"text": "done"}]))
        handle = await rt.submit("asker", "Look Bobby up", watched=False)
        await handle.settled()
        [pending] = rt.pending_decisions()
        rt.answer(pending["id"], "once", by="ops")
        task = await rt.task(handle.id)
        assert task.status == "completed", task.error
    code, out, err = run_cli(capsys, "audit", "erase", "--home", str(home.path), "--subject", BOB,
                             "--reason", "asked", "--json")
    assert code == 0, err
    assert json.loads(out)["fields"] == 6
    assert run_cli(capsys, "audit", "verify", "--home", str(home.path))[0] == 0
    for value in (BOB, RECORDS[BOB]):
        assert_absent(home.path, value)


def test_ids_are_strings_integers_or_lists_of_them_and_the_key_decides_the_digest(tmp_path):
    from apollia_nb.journal.subjects import call_subjects, subject_arguments, subject_digest, subject_secret

    key = subject_secret(tmp_path / "keys", create=True)
    assert key is not None and subject_secret(tmp_path / "keys", create=False) == key
    params = {"properties": {"who": {"type": "string", "x-apollia-subject": True}, "n": {"type": "integer"},
                             "flag": {"x-apollia-subject": "yes"}}}
    assert subject_arguments("t", params, {}) == ("who",)  # only a literal true marks it
    assert subject_arguments("t", params, {"t": ("n",)}) == ("who", "n")
    assert call_subjects(key, ("who", "n"), {"who": ["a1", "a1", 42], "n": 42}) == tuple(sorted(
        {subject_digest(key, "a1"), subject_digest(key, "42")}))
    assert call_subjects(key, ("who",), {"who": True}) == () and call_subjects(key, ("who",), {"who": ""}) == ()
    assert subject_digest(key, "a1") != subject_digest(b"\0" * 32, "a1")


async def test_a_damaged_subject_key_is_bad_input_and_erases_nothing(work_home, capsys):
    home = work_home
    (home.path / "keys" / "subjects.key").write_bytes(b"short")
    entries = _payloads(home)
    code, _, err = run_cli(capsys, "audit", "erase", "--home", str(home.path), "--subject", ALICE, "--reason", "x")
    assert code == 3 and "BAD_INPUT" in err and "32 bytes" in err, err
    assert _payloads(home) == entries
