"""``apollia-os audit export --format ocsf`` for what people do: refused answers and approvals, consents that
ran out, people added, revoked and given a new token, and erasures.

Each kind is produced by the real runtime on a real home (an injected clock for the consent's end), exported
by the CLI and checked against the OCSF 1.7.0 schema files pydantic-ocsf ships, as tests/test_ocsf_export.py
checks the others: ``answer_refused`` / ``approval_refused`` are API Activity, Blocked, with the refusal's
code; ``consent_expired`` is Authorize Session like ``consent_revoked``; ``person_*`` are Account Change
(3001); ``erasure`` is Datastore Activity (6005), Delete, naming seqs and fields, never a value.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import call, manifest
from test_ocsf_export import Checker, _check_newer, _schema

from apollia_nb.cli import main
from apollia_nb.errors import StaleApproval
from apollia_nb.governance.people import OWNER, People
from apollia_nb.journal import Journal
from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio

START = 1_900_000_000.0
class PeopleChecker(Checker):
    """The export test's validator, for the classes these kinds map to as well, and each class's activities."""

    CLASSES = {6003: "api_activity", 3003: "authorize_session", 3001: "account_change", 6005: "datastore_activity"}

    def event(self, event: dict[str, Any]) -> list[str]:
        name = self.CLASSES[event["class_uid"]]
        enum = (self._chain(self.events, name).get("activity_id") or {}).get("enum") or {}
        errors = list(super().event(event))
        if str(event["activity_id"]) not in enum and event["activity_id"] not in (0, 99):
            errors.append(f"activity_id {event['activity_id']} is not one of {name}'s")
        elif str(event["activity_id"]) in enum and enum[str(event["activity_id"])]["caption"] != event["activity_name"]:
            errors.append(f"activity_name {event['activity_name']!r} is not {name}'s")
        self.errors = errors
        return errors


def _writes(n: int) -> str:
    turns: list[dict[str, Any]] = []
    for i in range(n):
        turns += [{"tool_calls": [call("write_file", path=f"f{i}.txt", content="x")]}, {"text": "Done."}]
    return manifest(actor=turns)


async def _filled(home: Any) -> None:
    """A home holding every kind these events map, each made by the runtime as a person's action makes it."""
    now = [START]
    async with Runtime(home, clock=lambda: now[0]) as rt:
        people = People(rt.governance)
        people.add("ann", ["approver", "auditor"], by=OWNER)
        people.rotate("ann", by=OWNER)
        people.revoke("ann", by=OWNER)
        await rt.register_agent(_writes(4))

        first = await rt.submit("clerk", "Write", watched=False)  # an answer naming another digest: refused
        await first.settled()
        [card] = rt.pending_decisions()
        with pytest.raises(StaleApproval):
            rt.answer(card["id"], "once", by="bob", digest="sha256:" + "0" * 64)
        rt.answer(card["id"], "always", by="bob", lasting="1h")  # a standing consent for an hour
        assert (await first).status == "completed"

        now[0] = START + 3600  # the consent has run out: the next call notices it, and asks
        second = await rt.submit("clerk", "Write", watched=False)
        await second.settled()
        [card] = rt.pending_decisions()
        rt.card(card["id"]).keep_call_arguments({"path": "other.txt", "content": "y"})  # not what it showed
        rt.answer(card["id"], "once", by="bob")  # the approval does not carry out another call: refused
        assert (await second).status == "failed"


def _export(home: Any, out: Path) -> list[dict[str, Any]]:
    assert main(["audit", "export", "--format", "ocsf", "--home", str(home.path), str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _kind(event: dict[str, Any]) -> str:
    return str(event["unmapped"]["apollia_journal"]["kind"])


async def test_each_new_kind_exports_as_a_valid_ocsf_event(home, tmp_path):
    checker = PeopleChecker(_schema())
    await _filled(home)
    events = _export(home, tmp_path / "events.jsonl")
    kinds = {_kind(e) for e in events}
    assert {"answer_refused", "approval_refused", "consent_expired", "person_added", "person_revoked",
            "person_rotated"} <= kinds
    for event in events:
        assert checker.event(event) == [], (checker.errors, event)
        _check_newer(event)


async def test_refused_answers_and_approvals_are_blocked_api_activity_with_the_refusals_code(home, tmp_path):
    await _filled(home)
    events = _export(home, tmp_path / "events.jsonl")
    [answer] = [e for e in events if _kind(e) == "answer_refused"]
    [approval] = [e for e in events if _kind(e) == "approval_refused"]
    for event in (answer, approval):
        assert (event["class_uid"], event["disposition"], event["disposition_id"], event["action"],
                event["status"]) == (6003, "Blocked", 2, "Denied", "Failure")
        assert event["api"]["operation"] == "write_file" and event["actor"]["user"]["name"] == "bob"
        assert event["ai_agent"]["uid"] == "clerk"
    assert answer["status_code"] == "STALE_APPROVAL" and "refused" in answer["status_detail"]
    assert approval["status_code"] == "changed" and "not those its approval was given for" in approval["status_detail"]


async def test_a_consent_that_ran_out_is_an_authorize_session_like_a_revocation(home, tmp_path):
    await _filled(home)
    events = _export(home, tmp_path / "events.jsonl")
    [granted] = [e for e in events if _kind(e) == "consent_granted"]
    [expired] = [e for e in events if _kind(e) == "consent_expired"]
    assert (expired["class_uid"], expired["activity_id"], expired["activity_name"]) == (3003, 99, "Other")
    assert expired["privileges"] == ["write"] and expired["user"]["name"] == "clerk"
    assert expired["actor"] == {"app_name": "apollia-nb"}  # nobody ended it: it ran out
    end = datetime.fromtimestamp(START + 3600, timezone.utc).isoformat().replace("+00:00", "Z")
    assert "given by bob" in expired["status_detail"] and end in expired["status_detail"]
    assert granted["actor"]["user"]["name"] == "bob"
    assert expired["metadata"]["sequence"] > granted["metadata"]["sequence"]


async def test_people_changes_are_account_changes_naming_the_person_their_roles_and_who(home, tmp_path):
    await _filled(home)
    events = _export(home, tmp_path / "events.jsonl")
    people = [e for e in events if e["class_uid"] == 3001]
    assert [(_kind(e), e["activity_id"], e["activity_name"]) for e in people] == [
        ("person_added", 1, "Create"), ("person_rotated", 4, "Password Reset"), ("person_revoked", 5, "Disable")]
    for event in people:
        assert event["user"]["name"] == "ann" and event["user"]["type"] == "User"
        assert event["user"]["groups"] == [{"name": "approver"}, {"name": "auditor"}]
        assert event["actor"]["user"] == {"name": "owner", "groups": [{"name": "admin"}]}
        assert event["category_name"] == "Identity & Access Management"


async def test_an_erasure_is_a_datastore_delete_naming_fields_never_values(home, tmp_path):
    await _filled(home)
    with Journal.open(home) as journal:
        [written] = [e for e in journal.entries(kinds=["tool_result"])][:1]
    assert main(["audit", "erase", "--home", str(home.path), "--seq", str(written.seq), "--field", "output",
                 "--reason", "the person asked"]) == 0
    events = _export(home, tmp_path / "events.jsonl")
    [erasure] = [e for e in events if _kind(e) == "erasure"]
    assert PeopleChecker(_schema()).event(erasure) == []
    assert (erasure["class_uid"], erasure["activity_id"], erasure["activity_name"]) == (6005, 7, "Delete")
    assert erasure["status_detail"] == f"erased entry {written.seq}: output"
    assert erasure["message"] == "the person asked" and erasure["database"]["name"] == "journal"

