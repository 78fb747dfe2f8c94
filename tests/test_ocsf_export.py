"""``apollia-os audit export --format ocsf``: governed calls and consent changes as OCSF events.

The events are checked against the OCSF schema files the pydantic-ocsf package ships (the newest
there is OCSF 1.7.0): every attribute the 1.7.0 dictionary knows has its type, every object's
attributes are its own, required attributes are present and enum values are defined. The 1.8/1.9
additions (``ai_agent``, ``attestation_list``) are checked by hand against their 1.9.0-dev
definitions. One event's ``record_integrity`` is verified with the journal's verifier key alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from apollia_nb.cli import main
from apollia_nb.journal import Journal
from apollia_nb.journal.entry import entry_hash
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

SCHEMA_FILE = "schemas/v1_7_0.json"
NEWER = {"ai_agent", "attestation_list"}  # OCSF 1.9.0-dev, not in the 1.7.0 files


def _schema() -> dict[str, Any]:
    pytest.importorskip("ocsf")
    path = resources.files("ocsf").joinpath(SCHEMA_FILE)
    if not path.is_file():
        pytest.skip("pydantic-ocsf's schema files are not installed")
    return json.loads(path.read_text(encoding="utf-8"))


class Checker:
    """A small OCSF validator over the schema's source form (classes, objects, dictionary)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.events = schema["events"]
        self.objects = schema["objects"]
        self.dictionary = schema["dictionary"]["attributes"]
        self.types = schema["dictionary"]["types"]["attributes"]
        self.errors: list[str] = []
        self.categories = {c["uid"]: name for name, c in schema["categories_meta"]["attributes"].items()}

    def _chain(self, table: dict[str, Any], name: str) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        while name:
            item = table[name]
            for key, value in item.get("attributes", {}).items():
                if key == "$include":
                    continue
                if key in merged and (value or {}).get("enum") and merged[key].get("enum") is not None:
                    merged[key] = {**merged[key], "enum": {**value["enum"], **merged[key]["enum"]}}
                merged.setdefault(key, value)
            name = item.get("extends") if item.get("extends") in table else None
        return merged

    #: The OCSF classes the events may be of, by ``class_uid``.
    CLASSES = {6003: "api_activity", 3003: "authorize_session"}

    def event(self, event: dict[str, Any]) -> list[str]:
        self.errors = []
        name = self.CLASSES[event["class_uid"]]
        item = self.events[name]
        category = self.categories[event["category_uid"]]
        if event["class_uid"] != event["category_uid"] * 1000 + item["uid"] or category != item.get(
                "category", self.events[item["extends"]].get("category")):
            self.errors.append(f"class_uid {event['class_uid']} is not {name} in category {category}")
        if event["type_uid"] != event["class_uid"] * 100 + event["activity_id"]:
            self.errors.append("type_uid is not class_uid * 100 + activity_id")
        attrs = self._chain(self.events, name)
        for key in ("category_uid", "class_uid", "type_uid"):  # checked above
            attrs[key] = {**attrs.get(key, {}), "enum": None}
        self._check(event, attrs, name, skip=NEWER)
        return self.errors

    def _type_of(self, key: str) -> str | None:
        entry = self.dictionary.get(key)
        return entry.get("type") if entry else None

    def _check(self, value: dict[str, Any], attrs: dict[str, Any], where: str, skip: set[str] = frozenset()) -> None:
        for key, declared in attrs.items():
            if (declared or {}).get("requirement") == "required" and key not in value:
                self.errors.append(f"{where}: required {key} missing")
        for key, item in value.items():
            if key in skip:
                continue
            if key not in self.dictionary:
                self.errors.append(f"{where}.{key}: not an OCSF 1.7.0 attribute")
                continue
            if key not in attrs and where != "unmapped" and not key.endswith(("_dt",)):
                # profile attributes (disposition, action, ...) are in the dictionary, not the class
                if key not in {"disposition", "disposition_id", "action", "action_id", "time_dt"}:
                    self.errors.append(f"{where}.{key}: not an attribute of {where}")
            spec = {**self.dictionary[key], **(attrs.get(key) or {})}
            self._value(item, spec, f"{where}.{key}", key)

    def _value(self, item: Any, spec: dict[str, Any], where: str, key: str) -> None:
        kind = spec.get("type")
        if spec.get("is_array"):
            if not isinstance(item, list):
                self.errors.append(f"{where}: not an array")
                return
            for i, one in enumerate(item):
                self._value(one, {**spec, "is_array": False}, f"{where}[{i}]", key)
            return
        if kind in self.objects:
            if not isinstance(item, dict):
                self.errors.append(f"{where}: not an object")
                return
            if kind == "object":  # unmapped: any JSON object
                return
            self._check(item, self._chain(self.objects, kind), kind)
            return
        base = kind
        while base in self.types and self.types[base].get("type"):
            regex = self.types[base].get("regex")
            if regex and isinstance(item, str) and not re.match(regex, item):
                self.errors.append(f"{where}: {item!r} does not match {base}")
            base = self.types[base]["type"]
        python = {"string_t": str, "integer_t": int, "long_t": int, "boolean_t": bool, "float_t": (int, float),
                  "timestamp_t": int, "json_t": object}.get(base or "")
        if python is None:
            self.errors.append(f"{where}: unknown type {kind}")
        elif not isinstance(item, python) or (python is int and isinstance(item, bool)):
            self.errors.append(f"{where}: {item!r} is not {base}")
        enum = spec.get("enum")
        if enum and str(item) not in enum:
            self.errors.append(f"{where}: {item!r} is not one of {sorted(enum)}")


def _check_newer(event: dict[str, Any]) -> None:
    """The 1.9.0-dev objects, as ocsf-schema defines them (ai_agent, attestation, fingerprint,
    digital_signature, prev_event)."""
    if "ai_agent" in event:
        agent = event["ai_agent"]
        assert set(agent) <= {"uid", "instance_uid", "name", "type", "type_id", "ai_model", "version", "charter"}
        assert agent["type_id"] in (0, 1, 2, 3, 4, 99)
    for att in event["attestation_list"]:
        assert set(att) <= {"uid", "authority_uid", "signatures", "fingerprint", "prev_event", "chain_uid"}
        assert "fingerprint" in att or "signatures" in att
        assert set(att["fingerprint"]) <= {"algorithm", "algorithm_id", "encoding", "encoding_id", "serialization",
                                           "serialization_id", "value"}
        for sig in att["signatures"]:
            assert set(sig) <= {"algorithm", "algorithm_id", "certificate", "created_time", "developer_uid",
                                "digest", "serialization", "serialization_id", "state", "state_id"}
            assert "algorithm_id" in sig
        if "prev_event" in att:
            assert set(att["prev_event"]) <= {"uid", "type_uid", "fingerprint"} and "uid" in att["prev_event"]


async def _filled(home: Any) -> str:
    Journal.open(home, entry_format="1").close()  # payloads hashed whole, as the verifier below hashes them
    async with Runtime(home) as rt:
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("list_dir", path="."), call("write_file", path="a.txt", content="hi")]},
            {"tool_calls": [call("write_file", path="b.txt", content="no")]},
            {"tool_calls": [call("write_file", path="secrets/k", content="x")]}]))
        handle = await rt.submit("clerk", "Look, then write")
        await handle.settled()
        handle.pending[0].answer("once")
        await handle.settled()
        handle.pending[0].answer("refuse")
        await handle
        rt.governance.grant_consent("clerk", "write", by="ops")
        rt.governance.revoke_consent("clerk", "write", by="ops")
        rt.governance.set_developer_mode(True, by="ops")
        return rt.journal.verifier_key()


def _export(home: Any, out: Path, *args: str) -> int:
    return main(["audit", "export", "--format", "ocsf", *args, "--home", str(home.path), str(out)])


async def test_governed_calls_and_consent_changes_export_as_valid_ocsf(home, tmp_path):
    checker = Checker(_schema())
    await _filled(home)
    out = tmp_path / "events.jsonl"
    assert _export(home, out) == 0
    events = [json.loads(line) for line in out.read_text().splitlines()]
    for event in events:
        assert checker.event(event) == [], (checker.errors, event)
        _check_newer(event)
        assert event["metadata"]["version"] == "1.9.0-dev"
    api = [e for e in events if e["class_uid"] == 6003]
    seen = [(e["api"]["operation"], e["unmapped"]["apollia_journal"]["kind"], e["disposition"]) for e in api]
    assert seen == [
        ("list_dir", "decision", "Allowed"),
        ("write_file", "decision", "Delayed"),
        ("write_file", "answer", "Approved"),
        ("write_file", "decision", "Delayed"),
        ("write_file", "answer", "Blocked"),
    ]
    assert all(e["metadata"]["profiles"] == ["ai_operation", "record_integrity"] for e in api)
    assert api[0]["ai_agent"]["uid"] == "clerk" and api[0]["ai_agent"]["instance_uid"].startswith("run-")
    assert api[0]["disposition_id"] == 1 and api[2]["disposition_id"] == 8 and api[4]["disposition_id"] == 2
    assert api[2]["actor"]["user"]["name"] == "user"
    sessions = [e for e in events if e["class_uid"] == 3003]
    assert [(e["unmapped"]["apollia_journal"]["kind"], e["activity_name"]) for e in sessions] == [
        ("consent_granted", "Assign Privileges"), ("consent_revoked", "Other"), ("devmode_changed", "Assign Privileges")]
    assert sessions[0]["privileges"] == ["write"] and sessions[0]["actor"]["user"]["name"] == "ops"


async def test_a_refused_call_is_blocked_and_since_skips_what_was_exported(home, tmp_path):
    await _filled(home)
    whole = tmp_path / "all.jsonl"
    assert _export(home, whole) == 0
    events = [json.loads(line) for line in whole.read_text().splitlines()]
    refused = [e for e in events if e["unmapped"]["apollia_journal"]["kind"] == "decision"
               and e["disposition"] == "Blocked"]
    # the deny rule's call never ran: the task stopped on the refused answer before it
    assert refused == []
    middle = events[2]["metadata"]["sequence"]
    later = tmp_path / "later.jsonl"
    assert _export(home, later, "--since", str(middle)) == 0
    rest = [json.loads(line) for line in later.read_text().splitlines()]
    assert [e["metadata"]["sequence"] for e in rest] == [e["metadata"]["sequence"] for e in events[3:]]
    assert _export(home, later) == 3  # the file exists: nothing overwritten
    assert _export(home, tmp_path / "x.jsonl", "--since", "-1") != 0


async def test_a_deny_rule_refusal_is_blocked(home, tmp_path):
    async with Runtime(home) as rt:
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="secrets/k", content="x")]}]))
        await (await rt.submit("clerk", "Leak"))
    out = tmp_path / "e.jsonl"
    assert _export(home, out) == 0
    [event] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (event["disposition"], event["disposition_id"], event["action"], event["status"]) == (
        "Blocked", 2, "Denied", "Failure")
    assert Checker(_schema()).event(event) == []


async def test_one_event_s_record_integrity_verifies_with_the_verifier_key_alone(home, tmp_path):
    from nacl.signing import VerifyKey

    verifier_key = await _filled(home)
    out = tmp_path / "events.jsonl"
    assert _export(home, out) == 0
    event = json.loads(out.read_text().splitlines()[2])
    # <name>+<key hash hex>+<base64(0x01 || 32-byte Ed25519 key)> (the C2SP signed-note verifier key)
    name, key_hash, key_b64 = verifier_key.split("+", 2)
    raw = base64.b64decode(key_b64)
    assert raw[0] == 1
    [att] = event["attestation_list"]
    cols = event["unmapped"]["apollia_journal"]
    recomputed = entry_hash(cols["seq"], cols["ts"], cols["run_id"], cols["agent"], cols["kind"],
                            base64.b64decode(cols["payload_base64"]), bytes.fromhex(cols["prev_hash"]))
    assert recomputed.hex() == att["fingerprint"]["value"] == att["signatures"][0]["digest"]["value"]
    assert att["prev_event"]["fingerprint"]["value"] == cols["prev_hash"]
    VerifyKey(raw[1:]).verify(recomputed, base64.b64decode(cols["signature_base64"]))
    assert att["authority_uid"] == cols["key_id"] and att["chain_uid"] == name
    # what the event says happened is what the signed payload says
    payload = json.loads(base64.b64decode(cols["payload_base64"]))
    assert payload.get("tool") == event["api"]["operation"] or payload.get("call_id") == event["api"]["request"]["uid"]
    # one altered byte of the payload no longer verifies
    bad = bytearray(base64.b64decode(cols["payload_base64"]))
    bad[-2] ^= 1
    forged = entry_hash(cols["seq"], cols["ts"], cols["run_id"], cols["agent"], cols["kind"], bytes(bad),
                        bytes.fromhex(cols["prev_hash"]))
    assert forged.hex() != att["fingerprint"]["value"]
    assert hashlib.sha256(b"").hexdigest() != att["fingerprint"]["value"]


async def test_a_journal_that_does_not_verify_is_not_exported(home, tmp_path):
    import duckdb

    await _filled(home)
    con = duckdb.connect(str(home.path / "journal.db"))
    con.execute("UPDATE entries SET payload = ? WHERE seq = 5", [b'{"forged":true}'])
    con.close()
    out = tmp_path / "e.jsonl"
    assert _export(home, out) == 1
    assert not out.exists() and list(tmp_path.glob("e.jsonl*")) == []
    assert _export(home, out, "--allow-invalid") == 0  # asked for: written, and said so in --json
    assert out.exists() and list(tmp_path.glob("*.part")) == []
