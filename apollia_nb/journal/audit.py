"""What an auditor carries away: proofs against checkpoints they kept, a pinned key, C2SP tlog-proofs.

Pure functions over values (checkpoint notes, entries, and the journal's roots
and proofs handed in as functions); the CLI (``apollia-os audit``) feeds them
from a home, a served home or a bundle.

* :func:`check_kept` — does the journal (its roots at the kept sizes) extend the
  checkpoints an auditor kept? Where it does not, the first seq that differs:
  exact when the kept material allows it (a kept bundle's entry hashes, or two
  kept checkpoints one entry apart), else the narrowest range the kept
  checkpoints bound (the first seq that differs is in ``[low, high]``).
* :func:`consistency_document` — the RFC 6962 consistency proof from the
  largest kept checkpoint to the current one, as JSON.
* :func:`proof_document`, :func:`tlog_proof` and :func:`read_tlog_proof` — an
  inclusion proof as JSON (with the entry's stored bytes, base64) and as
  ``c2sp.org/tlog-proof@v1`` text.
* :func:`pin` — a verification report under a key the auditor pinned.

Roots at older sizes and consistency paths come from the journal's own
``consistency_proof``; the rest of the Merkle work from
:mod:`apollia_nb.journal.merkle`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from apollia_nb.errors import BadInput, IntegrityError
from apollia_nb.journal.checkpoint import Checkpoint, NoteVerifier, open_checkpoint
from apollia_nb.journal.entry import Entry, stored_entry_bytes
from apollia_nb.journal.merkle import leaf_hash, root, verify_consistency

__all__ = [
    "TLOG_PROOF_HEADER",
    "Kept",
    "KeptCheck",
    "check_kept",
    "consistency_document",
    "hashed_bytes",
    "stored_entry",
    "proof_document",
    "tlog_proof",
    "TlogProof",
    "read_tlog_proof",
    "pin",
]

TLOG_PROOF_HEADER = "c2sp.org/tlog-proof@v1"


# --- checkpoints the auditor kept ----------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """One thing an auditor kept: a checkpoint note, and (from a kept bundle) the entry hashes it covered."""

    label: str
    note: str
    hashes: tuple[bytes, ...] | None = None


@dataclass(frozen=True)
class KeptCheck:
    """The journal against what the auditor kept.

    ``ok``: the journal extends every kept checkpoint. Otherwise ``first_bad_seq``
    is the first seq that differs when it can be computed, and ``low``/``high``
    bound it in every case (``low == high == first_bad_seq`` when exact);
    ``problem`` says what differs. ``largest`` is the largest kept checkpoint
    the journal extends (None when none).
    """

    ok: bool
    head: int
    problem: str | None = None
    first_bad_seq: int | None = None
    low: int | None = None
    high: int | None = None
    largest: Checkpoint | None = None
    largest_note: str | None = None
    checked: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "entries": self.head,
            "first_bad_seq": self.first_bad_seq,
            "differs_within": [self.low, self.high] if self.low is not None else None,
            "problem": self.problem,
            "kept": list(self.checked),
        }

    def where(self) -> str:
        """``at seq N`` or ``within seqs A..B`` (empty when no entry differs: a key or a note failed)."""
        if self.first_bad_seq is not None:
            return f"at seq {self.first_bad_seq}"
        if self.low is not None:
            return f"within seqs {self.low}..{self.high}"
        return ""

    def summary(self) -> str:
        where = self.where()
        return f"FAILED {where}: {self.problem}" if where else f"FAILED: {self.problem}"


def _fail(head: int, problem: str, low: int | None = None, high: int | None = None,
          checked: Sequence[str] = ()) -> KeptCheck:
    exact = low if low is not None and low == high else None
    return KeptCheck(False, head, problem, exact, low, high, checked=tuple(checked))


def check_kept(kept: Sequence[Kept], head: int, root_at: Callable[[int], bytes], verifier: NoteVerifier,
               entry_hashes: Callable[[], Sequence[bytes]]) -> KeptCheck:
    """Check that a journal of ``head`` entries extends each kept checkpoint, every one verified as a
    note signed by ``verifier`` (the journal's origin and key). ``root_at(n)`` is the Merkle root of
    the journal's first ``n`` entries (``n <= head``); ``entry_hashes()`` (seq 1, 2, …) is read only
    to compare a kept bundle's entries with the journal's."""
    opened: list[tuple[Kept, Checkpoint]] = []
    for item in kept:
        try:
            cp = open_checkpoint(item.note, [verifier], origin=verifier.name)
        except IntegrityError as exc:
            return _fail(head, f"{item.label} is not a checkpoint of this journal under its key "
                               f"{verifier.key()}: {exc.message}")
        opened.append((item, cp))
    opened.sort(key=lambda pair: pair[1].size)
    low = 0  # every seq up to low agrees with some kept checkpoint
    largest: tuple[Kept, Checkpoint] | None = None
    labels: list[str] = []
    for item, cp in opened:
        labels.append(f"{item.label} (size {cp.size})")
        if cp.size <= head and root_at(cp.size) == cp.root:
            low = cp.size
            largest = (item, cp)
            continue
        exact = _first_differing(item.hashes, entry_hashes(), cp) if item.hashes is not None else None
        if cp.size > head:
            return _fail(head, f"{item.label} covers {cp.size} entries, the journal holds {head}: "
                               f"entries were removed or rewritten (the journal does not extend it)",
                         exact if exact is not None else low + 1, exact if exact is not None else head + 1, labels)
        if exact is not None:
            return _fail(head, f"entry {exact} is not the entry {item.label} holds: history was "
                               "rewritten from there", exact, exact, labels)
        return _fail(head, f"the journal's first {cp.size} entries do not have the root of {item.label}: "
                           "history was rewritten", low + 1, cp.size, labels)
    if largest is None:
        return KeptCheck(True, head, checked=tuple(labels))
    return KeptCheck(True, head, largest=largest[1], largest_note=largest[0].note, checked=tuple(labels))


def _first_differing(kept_hashes: Sequence[bytes], entry_hashes: Sequence[bytes], cp: Checkpoint) -> int | None:
    """The first seq whose kept entry hash is not the journal's (a kept bundle), or None when they agree.
    The kept hashes count only when they are the ones the kept checkpoint signed."""
    kept = list(kept_hashes[: cp.size])
    if len(kept) != cp.size or root([leaf_hash(h) for h in kept]) != cp.root:
        return None
    for i, digest in enumerate(kept):
        if i >= len(entry_hashes) or entry_hashes[i] != digest:
            return i + 1
    return None


def consistency_document(check: KeptCheck, current_note: str, verifier: NoteVerifier,
                         prove: Callable[[int, int], Any], root_at: Callable[[int], bytes]) -> dict[str, Any]:
    """The consistency proof from the largest kept checkpoint to ``current_note``, verified here.
    ``prove(old, new)`` is the journal's ``consistency_proof`` (``old_root``, ``new_root``, ``path``)."""
    current = open_checkpoint(current_note, [verifier], origin=verifier.name)
    if root_at(current.size) != current.root:
        raise IntegrityError(f"the journal's first {current.size} entries do not have the root of its own "
                             "latest checkpoint")
    old = check.largest
    doc: dict[str, Any] = {**check.to_dict(), "new": _cp_dict(current, current_note)}
    if old is None or old.size == 0:
        doc.update(old=_cp_dict(old, check.largest_note) if old is not None else None, path=[])
        return doc
    proof = prove(old.size, current.size)
    if (proof.old_root, proof.new_root) != (old.root, current.root):
        raise IntegrityError("the consistency proof's roots are not the checkpoints' roots")
    verify_consistency(old.size, current.size, old.root, current.root, list(proof.path))
    doc.update(old=_cp_dict(old, check.largest_note), path=[h.hex() for h in proof.path])
    return doc


def _cp_dict(cp: Checkpoint, note: str | None) -> dict[str, Any]:
    return {"size": cp.size, "root": cp.root.hex(), "note": note}


# --- inclusion proofs ----------------------------------------------------------------------------


def hashed_bytes(entry: Entry) -> bytes:
    """The exact bytes whose SHA-256 is the entry hash (``docs/journal.md``, "Entry hash")."""
    return stored_entry_bytes(entry.seq, entry.ts, entry.run_id, entry.agent, entry.kind, entry.row_payload,
                              entry.prev_hash)


def stored_entry(entry: Entry) -> dict[str, Any]:
    """The entry as stored: ``payload_base64`` is the stored payload bytes, binary columns lowercase hex."""
    return {
        "seq": entry.seq, "ts": entry.ts, "run_id": entry.run_id, "agent": entry.agent, "kind": entry.kind,
        "payload_base64": base64.b64encode(entry.row_payload).decode("ascii"),
        "prev_hash": entry.prev_hash.hex(), "hash": entry.hash.hex(), "signature": entry.signature.hex(),
        "key_id": entry.key_id,
    }


def proof_document(proof: Any, entry: Entry) -> dict[str, Any]:
    """``audit prove --json``: the proof, the entry parsed (``entry``) and as stored (``stored``)."""
    return {**proof.to_dict(), "entry": entry.to_dict(), "stored": stored_entry(entry),
            "hashed_base64": base64.b64encode(hashed_bytes(entry)).decode("ascii")}


def tlog_proof(proof: Any, entry: Entry) -> str:
    """The proof as ``c2sp.org/tlog-proof@v1``: ``extra`` is the entry's hashed bytes (its SHA-256 is
    the record, the entry hash), then the 0-based index, the path (base64, lowest first), a blank
    line and the checkpoint note verbatim."""
    lines = [TLOG_PROOF_HEADER, "extra " + base64.b64encode(hashed_bytes(entry)).decode("ascii"),
             f"index {proof.leaf_index}", *(base64.b64encode(h).decode("ascii") for h in proof.path), ""]
    return "\n".join(lines) + "\n" + proof.checkpoint


@dataclass(frozen=True)
class TlogProof:
    """A parsed ``c2sp.org/tlog-proof@v1``: extra bytes (None without), 0-based index, path, the note."""

    extra: bytes | None
    index: int
    path: tuple[bytes, ...]
    checkpoint: str


def read_tlog_proof(text: str) -> TlogProof:
    """Parse a ``c2sp.org/tlog-proof@v1`` text (``BAD_INPUT`` when it is not one)."""
    head, sep, note = text.partition("\n\n")
    lines = head.split("\n")
    if not sep or not lines or lines[0] != TLOG_PROOF_HEADER:
        raise BadInput(f"not a tlog-proof: the first line must be {TLOG_PROOF_HEADER!r}, then a blank line "
                       "before the checkpoint")
    rest = lines[1:]
    extra = None
    if rest and rest[0].startswith("extra "):
        extra = _b64(rest.pop(0)[len("extra "):], "extra")
    if not rest or not rest[0].startswith("index "):
        raise BadInput("not a tlog-proof: no `index N` line")
    digits = rest.pop(0)[len("index "):]
    if not digits.isdigit() or (digits != "0" and digits.startswith("0")):
        raise BadInput(f"not a tlog-proof: bad index {digits!r}")
    path = tuple(_b64(line, "proof line") for line in rest)
    if any(len(h) != 32 for h in path):
        raise BadInput("not a tlog-proof: a proof line is not a 32-byte hash")
    return TlogProof(extra, int(digits), path, note)


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"not a tlog-proof: the {what} is not base64") from None


# --- a pinned key --------------------------------------------------------------------------------


def pin(report: Any, actual: NoteVerifier, pinned: NoteVerifier) -> Any:
    """``report`` (a ``VerifyReport`` under the journal's own key) as it stands under the key the auditor
    pinned. Another key or origin fails: every entry carries the journal's key id, so entry 1 is the
    first that does not verify under the pinned key."""
    if (actual.name, actual.public_key) == (pinned.name, pinned.public_key):
        return report
    what = "key" if actual.public_key != pinned.public_key else "origin"
    problem = (f"the journal is not signed by the pinned key: its {what} differs (journal "
               f"{actual.key()}, pinned {pinned.key()}); the key pair was replaced or this is another log")
    first = 1 if report.entries or report.first_bad_seq else None
    return replace(report, ok=False, entries=0, first_bad_seq=first, problem=problem, checked_checkpoints=0)
