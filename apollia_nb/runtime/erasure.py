"""``apollia-os audit erase``: erase payload fields from a home's journal and every copy of them.

The home must not be in use (the erase owns it: ``OwnerLock``; a running runtime or server
is ``HOME_LOCKED``). In order, each step safe to repeat:

1. the journal (format 2) is opened and a signed ``erasure`` entry appended naming what goes
   (``journal.erasure``), then closed: everything is in ``journal.db`` and ``journal.log``
   is gone;
2. the values still present of every field an erasure names are looked up, and their text
   is replaced by ``[erased]`` wherever the runtime's records copy it (``runtime.db``: task,
   session and batch records, the model state, memory, remembered REST answers;
   ``governance.db``: the consent cards' arguments and reasons);
3. ``journal.db``'s rows lose those fields (``journal.erasure.apply_erasures``);
4. every DuckDB file of the home is rewritten from its live rows (``journal.scrub.scrub_home``),
   so no freed block or old row version keeps the bytes.

A crash anywhere leaves a home that opens and verifies; the next erase finishes what an
erasure entry names and is still present.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from apollia_nb.errors import BadInput, NotFound
from apollia_nb.home import Home, OwnerLock

__all__ = ["Erased", "erase_home", "subject_targets", "ERASED_TEXT", "needles_of"]

#: What a copy of an erased value reads in the runtime's records.
ERASED_TEXT = "[erased]"
#: Strings shorter than this inside an erased value are not looked for in the records (they
#: would match unrelated text); the value's whole text always is.
MIN_NEEDLE = 6

#: ``runtime.db``'s text columns that may hold a copy of a tool's arguments or output.
_RUNTIME_COLUMNS = (
    ("tasks", "record"), ("sessions", "record"), ("batches", "record"), ("batch_items", "item"),
    ("batch_items", "goal"), ("model_state", "state"), ("memory", "value"), ("idempotency", "response"),
)

#: ``governance.db``'s: a consent card's call as it was put to a person, kept after its answer.
_GOVERNANCE_COLUMNS = (("pending_decisions", "arguments"), ("pending_decisions", "reason"))


@dataclass
class Erased:
    """What an erase did: its ``erasure`` entry's seq, the fields erased now by seq (an earlier
    interrupted erase's included), the runtime rows changed, the files rewritten."""

    seq: int
    erased: dict[int, list[str]]
    runtime_rows: int = 0
    scrubbed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"erasure_seq": self.seq, "erased": [{"seq": s, "fields": f} for s, f in sorted(self.erased.items())],
                "fields": sum(len(f) for f in self.erased.values()), "runtime_rows": self.runtime_rows,
                "scrubbed": self.scrubbed}


def needles_of(values: Iterable[Any]) -> list[str]:
    """The texts to look for: each value's canonical JSON (a string: itself) and every string
    inside it of at least ``MIN_NEEDLE`` characters; longest first."""
    from apollia_nb.journal.entry import canonical_json

    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            if len(value) >= MIN_NEEDLE:
                found.add(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for value in values:
        if isinstance(value, str):
            if value:
                found.add(value)
        else:
            text = canonical_json(value).decode("utf-8")
            if len(text) >= MIN_NEEDLE:
                found.add(text)
        walk(value)
    return sorted(found, key=lambda s: (-len(s), s))


def _forms(needle: str) -> list[str]:
    """A text as a record may hold it: raw, JSON-escaped (ASCII or not)."""
    forms = {needle, json.dumps(needle)[1:-1], json.dumps(needle, ensure_ascii=False)[1:-1]}
    return sorted(forms, key=lambda s: (-len(s), s))


def scrub_runtime_records(home: Home, needles: list[str]) -> int:
    """Replace every copy of ``needles`` in ``runtime.db``'s records and in the consent cards
    ``governance.db`` keeps (a call's arguments, the reason shown) by ``ERASED_TEXT``; rows changed."""
    return (_scrub_columns(home.path / "runtime.db", _RUNTIME_COLUMNS, needles)
            + _scrub_columns(home.governance_db, _GOVERNANCE_COLUMNS, needles))


def _scrub_columns(path: Any, columns: Iterable[tuple[str, str]], needles: list[str]) -> int:
    from apollia_nb.dbutil import connect_locked

    if not needles or not path.exists():
        return 0
    con = connect_locked(path)
    changed = 0
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        con.begin()
        try:
            for table, column in columns:
                if table not in tables:
                    continue
                rows = con.execute(f'SELECT rowid, "{column}" FROM "{table}"').fetchall()
                for rowid, text in rows:
                    if not isinstance(text, str):
                        continue
                    new = text
                    for needle in needles:
                        for form in _forms(needle):
                            if form and form in new:
                                new = new.replace(form, ERASED_TEXT)
                    if new != text:
                        con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', [new, rowid])
                        changed += 1
            con.commit()
        except BaseException:
            con.rollback()
            raise
    finally:
        con.close()
    return changed


def _default_scrub(home: Home) -> list[str]:
    from apollia_nb.journal.scrub import scrub_home

    return [str(getattr(c, "path", c)) for c in scrub_home(home)]


def erase_home(home: Home, *, seq: int | None = None, field_path: str | None = None, subject: str | None = None,
               reason: str, by: str, scrub: Callable[[Home], list[str]] | None = None) -> Erased:
    """Erase ``field_path`` of entry ``seq`` (or every field of it), or every field tagged with the
    data subject ``subject`` across runs (``journal.subjects``), as the module docstring says.

    ``BadInput`` for a format 1 journal, an entry of a kind never erased, a field the entry
    does not have, or no reason; ``NotFound`` for no such entry, or no field left of the
    subject (nothing is appended then); ``HOME_LOCKED`` when the home is in use."""
    from apollia_nb.dbutil import connect_locked
    from apollia_nb.journal.erasure import (
        ERASURE_KIND, apply_erasures, erasure_payload, erased_values, named_by, pending, targets_of_entry)
    from apollia_nb.journal.store import Journal

    if (seq is None) == (subject is None):
        raise BadInput("say what to erase: --seq N [--field PATH] or --subject ID")
    if subject is not None and field_path is not None:
        raise BadInput("--field names a field of the entry --seq names")
    if subject is not None and (not isinstance(subject, str) or not subject):
        raise BadInput("a data subject's id is a non-empty string")
    if not isinstance(reason, str) or not reason.strip():
        raise BadInput("an erasure needs a reason (--reason TEXT)")
    with OwnerLock(home):
        with Journal.open(home, create=False) as journal:
            if not journal.sealed:
                raise BadInput(
                    f"the journal in {home.path} is of format {journal.format}: each entry hashes its payload "
                    "whole, so nothing in it can be erased without breaking the chain (homes made now use "
                    "format 2, salted commitments per field)")
            if subject is not None:
                digest, targets = subject_targets(home, journal, subject)
                payload = erasure_payload(targets, by=by, reason=reason, subject=digest)
            else:
                assert seq is not None
                payload = erasure_payload([targets_of_entry(journal.get(seq), field_path)], by=by, reason=reason)
            entry = journal.append(ERASURE_KIND, payload)
        con = connect_locked(home.journal_db)
        try:
            named = named_by(Entry for Entry in _erasures(con))
            stored = {s: bytes(p) for s, p in con.execute(
                "SELECT seq, payload FROM entries WHERE seq IN (SELECT unnest(?))", [sorted(named)]).fetchall()}
        finally:
            con.close()
        todo = pending(named, stored)
        values = [v for s, fields in todo.items() for v in erased_values(stored[s], fields)]
        rows = scrub_runtime_records(home, needles_of(values))
        con = connect_locked(home.journal_db)
        try:
            erased = apply_erasures(con)
        finally:
            con.close()
        scrubbed = (scrub or _default_scrub)(home)
    return Erased(entry.seq, erased, rows, scrubbed)


def subject_targets(home: Home, journal: Any, subject: str) -> tuple[str, list[Any]]:
    """The keyed digest of ``subject`` and, of every entry tagged with it, the fields still present.

    ``NotFound`` (naming no id) when the home has no subject key (no call was ever tagged) or no
    entry has a field of that subject left: nothing is erased then."""
    from apollia_nb.journal.erasure import UNERASABLE_KINDS, Target
    from apollia_nb.journal.subjects import (
        SUBJECT_KEY_FILE, SUBJECTS_FIELD, TAGGED_FIELDS, fields_of_subject, subject_digest, subject_secret)

    secret = subject_secret(home.keys_dir, create=False)
    if secret is None:
        raise NotFound(f"no field of this journal is tagged with a data subject (the home has no "
                       f"keys/{SUBJECT_KEY_FILE}: no tool call named one); erase by --seq N [--field PATH]")
    digest = subject_digest(secret, subject)
    targets: list[Any] = []
    tagged = 0
    # The digest is hex, stored as written: only entries whose stored bytes hold it are parsed.
    for entry in journal.entries(kinds=sorted(TAGGED_FIELDS)):
        if entry.kind in UNERASABLE_KINDS or digest.encode() not in (entry.stored or b""):
            continue
        data = entry.data()
        fields = fields_of_subject(data, digest)
        if fields:
            tagged += 1
        left = sorted(f for f in fields if f in data and f != SUBJECTS_FIELD)
        if left:
            targets.append(Target(entry.seq, tuple(left)))
    if not targets:
        raise NotFound("no field of this journal is tagged with that data subject" if not tagged else
                       f"every field tagged with that data subject ({tagged} entries) is erased already")
    return digest, targets


def _erasures(con: Any) -> list[Any]:
    from apollia_nb.journal.entry import Entry
    from apollia_nb.journal.recovery import COLUMNS

    return [Entry.from_row(r) for r in con.execute(
        f"SELECT {COLUMNS} FROM entries WHERE kind = 'erasure' ORDER BY seq").fetchall()]
