"""Journal entries as OCSF events (``apollia-os audit export --format ocsf``), one JSON object a line.

Pure: entries in, dicts out (no clock, no I/O). One event per journal entry it maps, so each
event's ``record_integrity`` attestation is that entry's hash and Ed25519 signature:

- ``decision`` → API Activity (6003) with the ``ai_operation`` profile and ``ai_agent``:
  ``allow`` is disposition Allowed, ``ask`` Delayed (held for a person), ``refuse`` Blocked;
- ``answer`` → API Activity: ``once`` / ``always`` Approved, ``refuse`` Blocked;
- ``answer_refused`` (an answer a person may not give, or that came too late) and ``approval_refused``
  (an approval that no longer carries out its call: used, expired, stale, changed) → API Activity,
  disposition Blocked, the refusal's code in ``status_code``;
- ``consent_granted`` / ``consent_revoked`` / ``consent_expired`` / ``devmode_changed`` → Authorize
  Session (3003);
- ``person_added`` / ``person_revoked`` / ``person_rotated`` → Account Change (3001): Create, Disable,
  Password Reset (a new token), the person's roles as the user's groups;
- ``erasure`` → Datastore Activity (6005), Delete: which entries' fields were erased, by whom, why
  (never a value).

The schema followed is OCSF 1.9.0-dev (the ``ai_operation`` profile of 1.8, the ``ai_agent``
object, the ``attestation`` object and ``record_integrity`` profile of 1.9); docs/evidence.md
gives the field mapping. OCSF's ``digital_signature`` has no attribute for the signature's
bytes, so they ride in ``unmapped.apollia_journal`` with every column the entry hash covers:
with the journal's verifier key alone a reader recomputes the hash and checks the signature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

__all__ = ["OCSF_VERSION", "KINDS", "ocsf_event", "ocsf_events"]

OCSF_VERSION = "1.9.0-dev"

#: Journal kinds that become OCSF events.
KINDS = frozenset({"decision", "answer", "answer_refused", "approval_refused", "consent_granted",
                   "consent_revoked", "consent_expired", "devmode_changed", "person_added", "person_revoked",
                   "person_rotated", "erasure"})
_PEOPLE_ACTIVITIES = {"person_added": (1, "Create"), "person_revoked": (5, "Disable"),
                      "person_rotated": (4, "Password Reset")}
_REFUSALS = ("answer_refused", "approval_refused")

_DISPOSITIONS = {"Allowed": 1, "Blocked": 2, "Approved": 8, "Delayed": 14}
_ACTIVITIES = {"read": (2, "Read"), "write": (3, "Update")}


def _ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


def _integrity(entry: Any, origin: str, key_id: str) -> list[dict[str, Any]]:
    attestation: dict[str, Any] = {
        "uid": f"{origin}#{entry.seq}",
        "chain_uid": origin,
        "authority_uid": key_id,
        "fingerprint": {"algorithm_id": 3, "algorithm": "SHA-256", "value": bytes(entry.hash).hex(),
                        "serialization_id": 99, "serialization": "apollia-nb/journal-entry/v1"},
        "signatures": [{"algorithm_id": 99, "algorithm": "Ed25519", "serialization_id": 1,
                        "serialization": "Flat", "developer_uid": key_id,
                        "digest": {"algorithm_id": 3, "algorithm": "SHA-256",
                                   "value": bytes(entry.hash).hex()}}],
    }
    if entry.seq > 1:
        attestation["prev_event"] = {"uid": f"{origin}#{entry.seq - 1}",
                                     "fingerprint": {"algorithm_id": 3, "algorithm": "SHA-256",
                                                     "value": bytes(entry.prev_hash).hex()}}
    return [attestation]


def _journal_columns(entry: Any) -> dict[str, Any]:
    return {"seq": int(entry.seq), "ts": entry.ts, "run_id": entry.run_id, "agent": entry.agent,
            "kind": entry.kind,
            "payload_base64": base64.b64encode(bytes(getattr(entry, "row_payload", entry.payload))).decode(),
            "prev_hash": bytes(entry.prev_hash).hex(), "hash": bytes(entry.hash).hex(),
            "signature_base64": base64.b64encode(bytes(entry.signature)).decode(), "key_id": entry.key_id}


def _base(entry: Any, origin: str, key_id: str, class_uid: int, class_name: str,
          category: tuple[int, str], activity: tuple[int, str], profiles: list[str]) -> dict[str, Any]:
    return {
        "category_uid": category[0], "category_name": category[1],
        "class_uid": class_uid, "class_name": class_name,
        "activity_id": activity[0], "activity_name": activity[1],
        "type_uid": class_uid * 100 + activity[0], "type_name": f"{class_name}: {activity[1]}",
        "time": _ms(entry.ts),
        "severity_id": 1, "severity": "Informational",
        "metadata": {
            "version": OCSF_VERSION,
            "product": {"name": "apollia-nb", "vendor_name": "apollia-nb", "uid": origin},
            "profiles": profiles,
            "uid": f"{origin}#{entry.seq}",
            "sequence": int(entry.seq),
            "log_name": "journal",
            "original_time": entry.ts,
        },
        "attestation_list": _integrity(entry, origin, key_id),
        "unmapped": {"apollia_journal": _journal_columns(entry)},
    }


def _agent(entry: Any) -> dict[str, Any]:
    agent: dict[str, Any] = {"type_id": 1, "type": "Native"}
    if entry.agent:
        agent["uid"] = agent["name"] = entry.agent
    if entry.run_id:
        agent["instance_uid"] = entry.run_id
    return agent


def ocsf_event(entry: Any, origin: str, key_id: str, tools: dict[str, dict[str, Any]] | None = None
               ) -> dict[str, Any] | None:
    """The OCSF event of one journal entry, or None for a kind that maps to none.

    ``tools`` (call id → the call's decision payload) lets an answer name its tool; it is
    filled as decisions pass."""
    if entry.kind not in KINDS:
        return None
    try:
        payload = json.loads(entry.payload)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    if entry.kind in _PEOPLE_ACTIVITIES:
        return _account_change(entry, payload, origin, key_id)
    if entry.kind == "erasure":
        return _erasure(entry, payload, origin, key_id)
    if entry.kind in ("decision", "answer", *_REFUSALS):
        known = tools if tools is not None else {}
        if entry.kind == "decision":
            call = payload
            if isinstance(payload.get("call_id"), str):
                known[payload["call_id"]] = payload
            outcome = payload.get("outcome")
            disposition = {"allow": "Allowed", "ask": "Delayed"}.get(str(outcome), "Blocked")
            status = (1, "Success") if outcome == "allow" else (99, "Other") if outcome == "ask" else (2, "Failure")
            detail = str(payload.get("reason", ""))
        elif entry.kind in _REFUSALS:
            call = known.get(str(payload.get("call_id")), {})
            disposition, status = "Blocked", (2, "Failure")
            who = payload.get("by") if entry.kind == "answer_refused" else payload.get("answered_by")
            given = (f"answer {payload.get('answer')} by {who}" if entry.kind == "answer_refused"
                     else f"approval by {who}")
            detail = f"{given} refused: {payload.get('reason', '')}"
        else:
            call = known.get(str(payload.get("call_id")), {})
            disposition = "Blocked" if payload.get("answer") == "refuse" else "Approved"
            status = (2, "Failure") if disposition == "Blocked" else (1, "Success")
            detail = f"answered {payload.get('answer')} by {payload.get('answered_by')}"
        family = call.get("family")
        activity = _ACTIVITIES.get(str(family), (99, "Other"))
        event = _base(entry, origin, key_id, 6003, "API Activity", (6, "Application Activity"), activity,
                      ["ai_operation", "record_integrity"])
        tool = str(call.get("tool") or payload.get("tool") or "unknown")
        event.update({
            "actor": {"app_name": entry.agent or "apollia-nb",
                      **({"invoked_by": str(payload["source"])} if isinstance(payload.get("source"), str) else {})},
            "api": {"operation": tool, "service": {"name": str(call.get("connection") or "apollia-nb")},
                    "request": {"uid": str(payload.get("call_id", ""))}},
            "src_endpoint": {"name": "apollia-nb", "uid": origin},
            "disposition_id": _DISPOSITIONS[disposition], "disposition": disposition,
            "action_id": 2 if disposition == "Blocked" else 1 if disposition != "Delayed" else 99,
            "action": "Denied" if disposition == "Blocked" else "Allowed" if disposition != "Delayed" else "Other",
            "status_id": status[0], "status": status[1], "status_detail": detail,
            "ai_agent": _agent(entry),
        })
        if entry.kind == "answer":
            event["actor"]["user"] = {"name": str(payload.get("answered_by"))}
        elif entry.kind in _REFUSALS:
            code = payload.get("code") if entry.kind == "answer_refused" else payload.get("why")
            event["status_code"] = str(code or "unknown")
            event["actor"]["user"] = _person(payload.get("by") if entry.kind == "answer_refused"
                                             else payload.get("answered_by"), payload)
        return event
    granted = entry.kind in ("consent_granted",) or (entry.kind == "devmode_changed" and payload.get("enabled") is True)
    activity = (1, "Assign Privileges") if granted else (99, "Other")
    event = _base(entry, origin, key_id, 3003, "Authorize Session", (3, "Identity & Access Management"), activity,
                  ["record_integrity"])
    by = payload.get("by") or payload.get("answered_by") or "unknown"
    privilege = (f"{payload.get('family')}" if entry.kind != "devmode_changed" else "developer_mode")
    # a consent that ran out ended by itself: the actor is the home, noticing it on the next call
    actor = ({"app_name": "apollia-nb"} if entry.kind == "consent_expired" else {"user": _person(by, payload)})
    event.update({
        "user": {"name": str(payload.get("agent") or entry.agent or "*"), "type_id": 99, "type": "AI agent"},
        "actor": actor,
        "privileges": [privilege],
        "status_id": 1, "status": "Success",
        "status_detail": entry.kind if granted else f"{entry.kind}: {privilege} no longer held",
    })
    if entry.kind == "consent_expired":
        event["status_detail"] += (f" (given by {payload.get('granted_by')}, from card {payload.get('card')}, "
                                   f"ended {payload.get('until')})")
    return event


def _person(name: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """The acting person as an OCSF user: their name, and the role they acted with as a group."""
    user: dict[str, Any] = {"name": str(name or "unknown")}
    if isinstance(payload.get("by_role"), str) and payload["by_role"]:
        user["groups"] = [{"name": role} for role in payload["by_role"].split("+")]
    return user


def _account_change(entry: Any, payload: dict[str, Any], origin: str, key_id: str) -> dict[str, Any]:
    """A person added, revoked or given a new token: Account Change (3001), the person as ``user``."""
    activity = _PEOPLE_ACTIVITIES[entry.kind]
    event = _base(entry, origin, key_id, 3001, "Account Change", (3, "Identity & Access Management"), activity,
                  ["record_integrity"])
    roles = [str(r) for r in payload.get("roles") or () if isinstance(r, str)]
    name = str(payload.get("name") or "unknown")
    event.update({
        "user": {"name": name, "uid": name, "type_id": 1, "type": "User", "groups": [{"name": r} for r in roles]},
        "actor": {"user": _person(payload.get("by"), payload)},
        "status_id": 1, "status": "Success",
        "status_detail": f"{entry.kind}: {name} ({', '.join(roles) or 'no role'}) by {payload.get('by')}"
                         + (f" ({payload['auth']})" if isinstance(payload.get("auth"), str) else ""),
    })
    return event


def _erasure(entry: Any, payload: dict[str, Any], origin: str, key_id: str) -> dict[str, Any]:
    """Fields erased from journal entries: Datastore Activity (6005), Delete; names seqs and fields only."""
    event = _base(entry, origin, key_id, 6005, "Datastore Activity", (6, "Application Activity"), (7, "Delete"),
                  ["record_integrity"])
    erased = [item for item in payload.get("erased") or () if isinstance(item, dict)]
    named = "; ".join(f"entry {item.get('seq')}: {', '.join(str(f) for f in item.get('fields') or ())}"
                      for item in erased)
    event.update({
        "actor": {"user": _person(payload.get("by"), payload)},
        "src_endpoint": {"name": "apollia-nb", "uid": origin},
        "database": {"name": "journal", "type_id": 99, "type": "Other"},
        "status_id": 1, "status": "Success",
        "status_detail": f"erased {named}" if named else "erased nothing",
        "message": str(payload.get("reason", "")),
    })
    return event


def ocsf_events(entries: Iterable[Any], origin: str, key_id: str) -> Iterator[dict[str, Any]]:
    """The OCSF events of ``entries`` (in seq order), skipping the kinds that map to none."""
    tools: dict[str, dict[str, Any]] = {}
    for entry in entries:
        event = ocsf_event(entry, origin, key_id, tools)
        if event is not None:
            yield event
