"""Erasing payload fields from a journal of format 2 (salted commitments per field).

An entry of format 2 hashes the commitments to its payload's fields, never their values
(``entry.seal_payload``), so a field's value and salt can leave the stored payload while the
entry's hash, signature, Merkle leaf, checkpoints and witness cosignatures stay as they are:
the commitment stays, under ``"@erased"`` (``entry.erase_sealed``).

An erasure is recorded before anything is removed: a signed ``erasure`` entry names what goes
(by seq and field, never the value), by whom and why::

    {"erased": [{"seq": 12, "fields": ["output"]}, ...], "by": "...", "reason": "...",
     "subject": "<keyed digest of the subject id, or absent>"}

Then the rows change (``apply_erasures``: the entries' payloads, the typed ``entry_fields``
and ``calls`` the views read), in one transaction, with the journal closed. A crash between
the entry and the change leaves fields an erasure names still present, which verifies (the
next erase of the home finishes them: ``pending``); a field removed without an erasure entry
naming it is what ``verify`` reports as tampering.

The functions here take values and return values, except ``apply_erasures`` (a DuckDB
connection to a closed ``journal.db``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apollia_nb.errors import BadInput, NotFound
from apollia_nb.journal.entry import Entry, erase_sealed, is_sealed, readable_payload

__all__ = [
    "ERASURE_KIND",
    "UNERASABLE_KINDS",
    "Target",
    "targets_of_entry",
    "erasure_payload",
    "named_by",
    "pending",
    "apply_erasures",
]

ERASURE_KIND = "erasure"
#: Kinds whose fields are never erased: the journal's own records of erasures and repairs.
UNERASABLE_KINDS = frozenset({ERASURE_KIND, "home_repaired", "entry_lost"})


@dataclass(frozen=True)
class Target:
    """Fields of one entry to erase."""

    seq: int
    fields: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "fields": list(self.fields)}


def targets_of_entry(entry: Entry, field: str | None = None) -> Target:
    """What ``--seq N [--field PATH]`` erases of ``entry``: the named field, or every field it
    still has. ``BadInput`` for an entry of format 1, a kind that is never erased, or a field
    the entry does not have (an erased one is named again, which changes nothing)."""
    if entry.kind in UNERASABLE_KINDS:
        raise BadInput(f"entry {entry.seq} is an {entry.kind!r} entry: the journal's own record, never erased")
    if entry.stored is None or not is_sealed(entry.stored):
        raise BadInput(f"entry {entry.seq} hashes its payload whole (journal format 1): none of its fields "
                       "can be erased without breaking the chain")
    present = sorted(entry.data())
    if field is None:
        if not present:
            raise BadInput(f"entry {entry.seq} has no field left to erase")
        return Target(entry.seq, tuple(present))
    if field not in present and field not in entry.erased():
        known = ", ".join(present) or "none"
        raise BadInput(f"entry {entry.seq} ({entry.kind}) has no field {field!r} (its fields: {known})")
    return Target(entry.seq, (field,))


def erasure_payload(targets: Sequence[Target], *, by: str, reason: str,
                    subject: str | None = None) -> dict[str, Any]:
    """The ``erasure`` entry's payload (never a value: seqs and field names, who, why)."""
    if not isinstance(reason, str) or not reason.strip():
        raise BadInput("an erasure needs a reason (--reason TEXT)")
    if not targets:
        raise NotFound("nothing to erase")
    merged: dict[int, set[str]] = {}
    for target in targets:
        merged.setdefault(target.seq, set()).update(target.fields)
    payload: dict[str, Any] = {
        "erased": [{"seq": seq, "fields": sorted(fields)} for seq, fields in sorted(merged.items())],
        "by": by,
        "reason": reason.strip(),
    }
    if subject is not None:
        payload["subject"] = subject
    return payload


def named_by(erasures: Iterable[Entry]) -> dict[int, set[str]]:
    """The fields ``erasure`` entries name, by seq (each only when it names an earlier entry)."""
    named: dict[int, set[str]] = {}
    for entry in erasures:
        if entry.kind != ERASURE_KIND:
            continue
        for item in entry.data().get("erased") or ():
            if isinstance(item, dict) and type(item.get("seq")) is int and item["seq"] < entry.seq:
                named.setdefault(item["seq"], set()).update(f for f in item.get("fields") or () if isinstance(f, str))
    return named


def pending(named: Mapping[int, set[str]], stored: Mapping[int, bytes]) -> dict[int, list[str]]:
    """Of the fields erasures name, those a stored payload (by seq) still has."""
    out: dict[int, list[str]] = {}
    for seq, fields in named.items():
        payload = stored.get(seq)
        if payload is None or not is_sealed(payload):
            continue
        left = sorted(set(readable_payload(payload)) & fields)
        if left:
            out[seq] = left
    return out


def apply_erasures(con: Any) -> dict[int, list[str]]:
    """Remove, from a closed ``journal.db`` (``con`` its only connection, read-write), every field an
    ``erasure`` entry names that is still there: the entry's stored payload loses the value and
    salt (the commitment stays), and its ``entry_fields`` row and the ``calls`` rows are computed
    again from what is left. One transaction; returns what it erased, by seq."""
    from apollia_nb.journal.recovery import COLUMNS
    from apollia_nb.journal.views import _FIELDS_SELECT, rebuild_calls

    con.begin()
    try:
        erasures = [Entry.from_row(r) for r in con.execute(
            f"SELECT {COLUMNS} FROM entries WHERE kind = ? ORDER BY seq", [ERASURE_KIND]).fetchall()]
        named = named_by(erasures)
        stored: dict[int, bytes] = {}
        for seq in sorted(named):
            row = con.execute("SELECT payload FROM entries WHERE seq = ?", [seq]).fetchone()
            if row is not None:
                stored[seq] = bytes(row[0])
        todo = pending(named, stored)
        for seq, fields in sorted(todo.items()):
            con.execute("UPDATE entries SET payload = ? WHERE seq = ?", [erase_sealed(stored[seq], fields), seq])
            con.execute("DELETE FROM entry_fields WHERE seq = ?", [seq])
            con.execute("INSERT INTO entry_fields " + _FIELDS_SELECT.replace("{where}", " AND seq = ?"), [seq])
        if todo:
            rebuild_calls(con)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return todo


def erased_values(stored: bytes, fields: Iterable[str]) -> list[Any]:
    """The values of ``fields`` in a stored payload (to find their copies elsewhere before they go)."""
    data = json.loads(stored)
    return [data[f] for f in fields if isinstance(data, dict) and f in data]
