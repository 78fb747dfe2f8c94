"""A home's files, accounted for by its journal and checked when the home is opened.

The journal is the home's signed record, so it is also the record of which
files the home has had. Once the journal says a file existed, its absence is
damage, never "nothing there yet":

``home_file_created``
    ``{"file": "runtime.db"}`` or ``{"file": "governance.db", "id": ...}``,
    appended when the file is first made, or first seen by a version that
    keeps this record. ``id`` is the random ``store_id`` kept in the
    database's ``meta`` table, so a database put in the place of the one the
    home had is told apart from it.
``home_repaired``
    an operator replaced a lost or damaged file on purpose
    (``apollia-os home repair``); the payload names the file, what was done and
    where the old one was moved.
older entries
    a journal written before these records still tells: runs and task or
    session status imply ``runtime.db``; rule, consent and developer-mode
    changes imply ``governance.db``.

The signing key is checked against the journal's entries: a journal with
entries and no ``keys/journal.key`` is ``HOME_FILE_MISSING``; a key that did
not sign the last entry is ``HOME_KEY_MISMATCH``. A new key is never put on an
old chain: the operator restores the key, or archives the journal
(``apollia-os home repair --archive-journal``) and a new chain starts.

The owner's ``runtime.db`` keeps the ``HomeFacts`` the record was last read
from, with the seq and hash of the entry they end at; ``read_home_facts`` reads
only the entries after them while the journal still holds that entry (anything
else reads every entry), so opening a home does not scan a journal that grows.

``runtime.records.open_records`` maps a ``runtime.db`` DuckDB cannot open to
``HOME_FILE_CORRUPT``. ``home_record`` and ``fold_home_facts`` are pure (rows in, a value out); the rest are the thin
edges that read files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb

from apollia_nb.dbutil import connect_locked
from apollia_nb.errors import HomeFileCorrupt, HomeFileMissing, HomeKeyMismatch, HomeLocked, IntegrityError
from apollia_nb.home import Home
from apollia_nb.journal import keys
from apollia_nb.journal.entry import readable_payload
from apollia_nb.journal.tail import read_tail, tail_path

__all__ = [
    "HomeFacts",
    "HomeRecord",
    "fold_home_facts",
    "home_record",
    "read_home_facts",
    "read_home_record",
    "read_home_record_offline",
    "check_runtime_db",
    "check_key",
    "repair_hint",
    "last_key_id",
    "FILE_CREATED",
    "REPAIRED",
    "RUNTIME_KINDS",
    "GOVERNANCE_KINDS",
    "POLICY_KINDS",
]

FILE_CREATED = "home_file_created"
REPAIRED = "home_repaired"
#: Entries that only a runtime with ``runtime.db`` writes.
RUNTIME_KINDS = ("run_open", "task_status", "session_status")
#: Entries of changes kept in ``governance.db``.
GOVERNANCE_KINDS = ("rule_added", "rule_removed", "consent_granted", "consent_revoked", "devmode_changed")
#: Entries of the organisation policy's state, the last of which says whether one is deposited.
POLICY_KINDS = ("policy_loaded", "policy_refused", "policy_removed")


class _Readable(Protocol):
    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]: ...


@dataclass(frozen=True)
class HomeRecord:
    """What the journal says the home has had.

    ``governance_id`` is the ``store_id`` of the ``governance.db`` last
    recorded (None: recorded without one, by older code). ``policy``: an
    organisation policy was deposited and has not been removed on purpose.
    ``recorded``: the files with a ``home_file_created`` or ``home_repaired``
    entry.
    """

    runtime_db: bool = False
    governance_db: bool = False
    governance_id: str | None = None
    policy: bool = False
    recorded: frozenset[str] = frozenset()


def home_record(kinds: Iterable[str], files: Iterable[Mapping[str, Any]],
                last_policy: tuple[str, Mapping[str, Any]] | None) -> HomeRecord:
    """Pure: the kinds present in the journal, the payloads of its file entries (in
    order) and its last policy entry (kind, payload) → a ``HomeRecord``."""
    present = set(kinds)
    recorded: set[str] = set()
    governance_id: str | None = None
    for payload in files:
        name = payload.get("file")
        if not isinstance(name, str):
            continue
        recorded.add(name)
        if name == "governance.db":
            gid = payload.get("id")
            governance_id = gid if isinstance(gid, str) else None
    policy = False
    if last_policy is not None:
        kind, payload = last_policy
        policy = kind != "policy_removed" and payload.get("status") in ("accepted", "refused")
    return HomeRecord(
        runtime_db="runtime.db" in recorded or bool(present & set(RUNTIME_KINDS)),
        governance_db="governance.db" in recorded or bool(present & set(GOVERNANCE_KINDS)),
        governance_id=governance_id,
        policy=policy,
        recorded=frozenset(recorded),
    )


def _payload(raw: Any) -> dict[str, Any]:
    """An entry's payload as a reader sees it (a salted payload's fields alone)."""
    try:
        value = readable_payload(bytes(raw))
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class HomeFacts:
    """What ``home_record`` is computed from, read from the journal's entries 1 to ``seq``.

    ``hash`` is the hash of entry ``seq``: facts kept between opens (``runtime.db``,
    ``RuntimeRecords.keep_home_facts``) are taken only while the journal still has
    that entry, and then only the entries after it are read. ``kinds``: the
    runtime and governance kinds present; ``files``: the payloads of the file
    entries in order; ``policy``: the last policy entry (seq, kind, payload).
    ``seq`` 0: facts that are not to be kept (the journal's last entries were not
    in ``journal.db`` yet).
    """

    seq: int = 0
    hash: bytes = b""
    kinds: frozenset[str] = frozenset()
    files: tuple[Mapping[str, Any], ...] = ()
    policy: tuple[int, str, Mapping[str, Any]] | None = None

    def record(self) -> HomeRecord:
        return home_record(self.kinds, self.files, self.policy[1:] if self.policy else None)

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "hash": self.hash.hex(), "kinds": sorted(self.kinds),
                           "files": list(self.files), "policy": list(self.policy) if self.policy else None})

    @classmethod
    def from_json(cls, text: str | None) -> HomeFacts | None:
        """Facts written by ``to_json``; None for anything else (the entries are read again)."""
        try:
            data = json.loads(text or "")
            policy = data["policy"]
            facts = cls(int(data["seq"]), bytes.fromhex(data["hash"]), frozenset(data["kinds"]),
                        tuple(data["files"]), (int(policy[0]), str(policy[1]), policy[2]) if policy else None)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None
        kinds_ok = all(isinstance(k, str) for k in facts.kinds)
        dicts_ok = all(isinstance(f, dict) for f in facts.files) and (
            facts.policy is None or isinstance(facts.policy[2], dict))
        return facts if facts.seq > 0 and kinds_ok and dicts_ok else None


def fold_home_facts(base: HomeFacts, found: Iterable[tuple[str, int, Any]], payloads: Mapping[int, Any],
                    seq: int, hash_: bytes) -> HomeFacts:
    """Pure: ``base`` and what the entries after it hold → the facts as of entry ``seq``.

    ``found``: (kind, its last seq, the seqs of its file entries) per kind present after ``base``;
    ``payloads``: the payload of each entry named there (raw bytes)."""
    found = list(found)
    file_seqs = sorted(int(s) for _, _, seqs in found for s in seqs or ())
    last = max(((int(s), kind) for kind, s, _ in found if kind in POLICY_KINDS), default=None)
    return HomeFacts(
        seq=seq, hash=hash_,
        kinds=base.kinds | {kind for kind, _, _ in found if kind in RUNTIME_KINDS or kind in GOVERNANCE_KINDS},
        files=(*base.files, *(_payload(payloads[s]) for s in file_seqs)),
        policy=(last[0], last[1], _payload(payloads[last[0]])) if last else base.policy,
    )


def _head(journal: _Readable) -> tuple[int, bytes]:
    head = getattr(journal, "head", None)
    if callable(head):
        size, last = head()
        return int(size), bytes(last)
    row = journal.sql("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1")
    return (int(row[0][0]), bytes(row[0][1])) if row else (0, b"")


def _hash_at(journal: _Readable, seq: int) -> bytes | None:
    row = journal.sql("SELECT hash FROM entries WHERE seq = ?", [seq])
    return bytes(row[0][0]) if row else None


def read_home_facts(journal: _Readable, since: HomeFacts | None = None) -> HomeFacts:
    """The ``HomeFacts`` of an open journal: ``since`` (facts kept earlier) and the entries after it.

    ``since`` is used only while entry ``since.seq`` is still there with the same hash (the same
    chain); otherwise every entry is read. One scan of the kinds of the entries read (no payload),
    then the payloads of the few entries it names (the file records, the last policy entry) by seq."""
    size, last = _head(journal)
    kept = size > 0 and _hash_at(journal, size) == last  # every entry is in journal.db: the facts can be kept
    if since is not None and not (kept and since.seq <= size and _hash_at(journal, since.seq) == since.hash):
        since = None
    base = since or HomeFacts()
    wanted = (*RUNTIME_KINDS, *GOVERNANCE_KINDS, FILE_CREATED, REPAIRED, *POLICY_KINDS)
    marks = ", ".join("?" for _ in wanted)
    found = journal.sql(
        "SELECT kind, max(seq), list(seq) FILTER (WHERE kind IN (?, ?)) "
        f"FROM entries WHERE seq > ? AND seq <= ? AND kind IN ({marks}) GROUP BY kind",
        [FILE_CREATED, REPAIRED, base.seq, size if kept else 2**62, *wanted])
    file_seqs = {int(s) for _, _, seqs in found for s in seqs or ()}
    policy_seqs = [int(s) for kind, s, _ in found if kind in POLICY_KINDS]
    named = sorted(file_seqs | ({max(policy_seqs)} if policy_seqs else set()))
    payloads: dict[int, Any] = {}
    if named:
        payloads = {int(seq): payload for seq, payload in journal.sql(
            f"SELECT seq, payload FROM entries WHERE seq IN ({', '.join('?' for _ in named)})", named)}
    return fold_home_facts(base, found, payloads, size if kept else 0, last if kept else b"")


def read_home_record(journal: _Readable) -> HomeRecord:
    """The ``HomeRecord`` of an open journal, read from all its entries."""
    return read_home_facts(journal).record()


def repair_hint(home: Home, flag: str) -> str:
    return f"restore it from a backup, or start over on purpose with `apollia-os home repair {flag} --home {home.path}`"


def check_runtime_db(home: Home, record: HomeRecord) -> None:
    """``HOME_FILE_MISSING`` when the journal records ``runtime.db`` and it is gone."""
    path = home.runtime_db
    if record.runtime_db and not path.exists() and not path.is_symlink():
        raise HomeFileMissing(
            f"{path} is missing, but the journal records that it existed (the home's agents, tasks and "
            f"sessions were kept there); {repair_hint(home, '--new-runtime-db')} (journaled)"
        )


def check_key(home: Home, last_key_id: str | None) -> Any:
    """The journal's signing key, checked against the key id of its last entry.

    ``last_key_id`` None: the journal has no entries, so a missing key is
    created. Otherwise the key must exist (``HOME_FILE_MISSING``), be readable
    (``HOME_FILE_CORRUPT``) and be the one that signed it (``HOME_KEY_MISMATCH``).
    """
    key_path = home.keys_dir / keys.KEY_FILE
    restore = (f"restore {key_path} from a backup, or archive this journal and start a new chain with "
               f"`apollia-os home repair --archive-journal --home {home.path}`; a new key is never put on an old chain")
    if last_key_id is None:
        try:
            return keys.load_or_create(home)
        except IntegrityError as exc:
            raise HomeFileCorrupt(f"{exc.message}; {restore}") from None
    if not key_path.exists() and not key_path.is_symlink():
        signed = f" signed by key {last_key_id}" if last_key_id else ""
        raise HomeFileMissing(f"{key_path} is missing, but the journal holds entries{signed}; {restore}")
    try:
        key = keys.load_or_create(home)
    except IntegrityError as exc:
        raise HomeFileCorrupt(f"{exc.message}; {restore}") from None
    except OSError as exc:
        raise HomeFileCorrupt(f"{key_path} cannot be read: {exc.strerror or exc}; {restore}") from None
    if last_key_id and key.key_id != last_key_id:
        raise HomeKeyMismatch(
            f"{key_path} (key {key.key_id}) is not the key that signed the journal's last entry "
            f"(key {last_key_id}); {restore}"
        )
    return key


def last_key_id(con: Any, db_path: Path) -> str | None:
    """The key id of the last entry in ``journal.db``; ``""`` when it has none but its
    ``journal.log`` holds entries (not yet checked: the journal's recovery checks their
    signatures, so only the key's presence is required); None for a journal with no entries."""
    row = con.execute("SELECT key_id FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
    if row:
        return str(row[0])
    try:
        tail = read_tail(tail_path(db_path))
    except IntegrityError:
        return None  # a damaged log is reported by the journal's own recovery
    return "" if tail.rows else None


class _Connection:
    def __init__(self, con: Any) -> None:
        self._con = con

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self._con.execute(query, params).fetchall()


def read_home_record_offline(home: Home) -> HomeRecord | None:
    """The ``HomeRecord`` of a home nobody holds, read without writing anything.

    An empty record when there is no journal; None when another process holds
    the journal (its owner's view is the one in force) or it cannot be read.
    """
    if not home.journal_db.exists():
        return HomeRecord()
    try:
        con = connect_locked(home.journal_db, read_only=True)
    except (HomeLocked, duckdb.Error):
        return None
    try:
        return read_home_record(_Connection(con))
    except duckdb.Error:
        return None
    finally:
        con.close()
