"""``governance.db``: what ``decide()`` reads, kept current, failing closed.

The store holds the fine rules, the standing consents, developer mode and the
pending decisions of unattended runs in one DuckDB file in the home, and
combines them with the organisation policy (``policy.py``) into the
``GovernanceView`` snapshot that ``decide()`` reads.

Why it is shaped this way:

* **Open per operation.** DuckDB lets one process hold a file and no other
  process open it, not even read-only. Governance writes are rare, so every
  operation connects, works and closes (≈ 15 ms), and the file is free between
  operations: a CLI in another process can change rules while a kernel runs.
  When another process holds the file at that instant, the store retries for
  up to ``lock_timeout`` seconds and then raises ``HomeLocked`` naming its PID.
  The home's owner holds the file open (``keep_open``): no other process can
  open it then, so its schema and id are checked once for the file it holds,
  and every later operation checks only that the path is still that file (a
  ``stat()``), not the tables again.
* **A cheap, current snapshot.** ``view()`` stats the files governance depends
  on (``governance.db``, its ``.wal``, ``policy/organisation.toml``, its
  ``.sig`` and ``apollia.toml``) and returns the cached view while their
  signatures (inode, size, mtime, ctime, mode) are unchanged — a few
  microseconds. Any change, by this process or another, reloads. A file
  changed less than a timestamp tick before it was read is "racy" (a second
  change in the same tick could keep the same signature), so it is read again
  on the next ``view()`` until it has aged past the window. A pending decision
  listed, answered or expired by the owner changes no row the snapshot holds,
  so the snapshot stays (its signature moves to the files as written).
* **Fail closed, never overwrite.** A ``governance.db`` that cannot be read
  (corrupt, a directory, no permission, written by a newer version) yields a
  view with ``readable=False`` and a reason; mutations raise
  ``GovernanceUnreadable`` and the file is left byte for byte as it was. A
  refused organisation policy also makes the view unreadable. Deny rules
  loaded before the file became unreadable are kept: refusing more is safe.
* **Journal first.** Each change to rules, consents or developer mode is
  appended to the journal inside the database transaction, before the change
  is committed; if the append raises, the transaction rolls back and nothing
  changes. Repeating a change that is already in effect journals nothing.
  Pending decisions are runtime state: the runtime journals the ask and the
  answer with their run, the store only keeps them across restarts.
* **Storage faults are their own error.** A change the disk refuses (full,
  read-only, I/O error) raises ``StorageFull`` / ``StorageError`` and is not in
  effect; when the journal already took its entry, the message says so. When
  DuckDB invalidates the database after such a failure, the kept connection is
  dropped and the next operation opens the file again.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apollia_nb.dbutil import lock_holder_pid, needs_reopen, raise_if_locked, storage_error
from apollia_nb.errors import (
    ApolliaError,
    BadAnswer,
    BadDuration,
    BadInput,
    Conflict,
    GovernanceUnreadable,
    NotFound,
    UnknownDecision,
    UnknownRule,
)
from apollia_nb.governance.acting import with_actor
from apollia_nb.governance.decision import (
    READ_ONLY_FAMILIES,
    Answer,
    Effect,
    Family,
    GovernanceView,
    Rule,
)
from apollia_nb.governance.policy import PolicyState, evaluate_policy, load_policy, policy_to_dict
from apollia_nb.governance.watch import FULL_CHECK_SECS, FileWatch
from apollia_nb.home import Home

if TYPE_CHECKING:  # pragma: no cover
    import duckdb

__all__ = [
    "JournalSink",
    "GovernanceStore",
    "RuleRecord",
    "ConsentRecord",
    "DeveloperMode",
    "PendingDecision",
    "SCHEMA_VERSION",
    "validate_agent",
    "identity_digest",
    "identity_difference",
    "without_consents",
    "parse_lifetime",
    "UNTIL_REVOKED",
]

#: 2: a standing consent may have an end (``consents.until``) and names the card it came from. A version
#: that reads only 1 refuses such a database rather than apply a consent with an end as given forever.
SCHEMA_VERSION = 2
#: Committed writes between two explicit checkpoints of ``governance.db``. DuckDB keeps each
#: UPDATE's version data in memory (about 130 KB for one answered decision) until a checkpoint,
#: and checkpoints by itself only once the write-ahead log reaches 16 MB — thousands of small
#: answers later, so a long-running owner's memory grew with every decision answered.
CHECKPOINT_EVERY = 64
PENDING, ANSWERED, EXPIRED = "pending", "answered", "expired"
_AGENT = re.compile(r"[a-z0-9_-]+")
_DEFAULT_LOCK_TIMEOUT = 2.0
# A file changed this recently may change again within the same timestamp tick
# without its signature changing; such a snapshot is re-read on the next view().
_RACY_NS = 50_000_000
_RACY_COARSE_NS = 2_500_000_000  # filesystems with whole-second timestamps


class JournalSink(Protocol):
    """Where governance changes are journaled (``apollia_nb.journal.Journal`` is one)."""

    def append(
        self, kind: str, payload: dict[str, Any], *, run_id: str | None = None, agent: str | None = None
    ) -> object: ...


# --- values ------------------------------------------------------------------------


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return _utc(value).isoformat().replace("+00:00", "Z")  # type: ignore[union-attr]


def _naive(value: datetime) -> datetime:
    """UTC without tzinfo, as stored in DuckDB TIMESTAMP columns."""
    return _utc(value).replace(tzinfo=None)  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class RuleRecord(Rule):
    """A stored fine rule: a ``Rule`` (with its id) plus who added it and when."""

    created_by: str = ""
    created_at: datetime | None = None

    @property
    def rule(self) -> Rule:
        return Rule(tool=self.tool, effect=self.effect, prefix=self.prefix, agent=self.agent, id=self.id)

    def to_dict(self) -> dict[str, Any]:
        """The rule's JSON plus ``created_by`` and ``created_at``."""
        return {
            "id": self.id,
            "tool": self.tool,
            "prefix": self.prefix,
            "effect": self.effect.value,
            "agent": self.agent,
            "created_by": self.created_by,
            "created_at": _iso(self.created_at),
        }


#: What a standing consent without an end lasts for: until someone revokes it.
UNTIL_REVOKED = "until revoked"
#: The longest lifetime a standing consent may be given for (longer: until revoked, on purpose).
MAX_LIFETIME = timedelta(days=366)
_LIFETIME = re.compile(r"([1-9][0-9]{0,5})\s*(m|min|h|d)")
_LIFETIME_UNIT = {"m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str | None) -> timedelta | None:
    """How long a standing consent is given for: ``"30m"``, ``"8h"``, ``"7d"`` (a whole number of minutes,
    hours or days, at most ``MAX_LIFETIME``); None or ``"until revoked"`` is None (no end).
    ``BadDuration`` for anything else: a lifetime that does not read is never read as "forever"."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise BadDuration(f"a lifetime is text such as '8h', not {text!r}")
    words = text.strip().lower()
    if words == UNTIL_REVOKED:
        return None
    found = _LIFETIME.fullmatch(words)
    if found is None:
        raise BadDuration(f"a lifetime is a whole number of minutes, hours or days such as '30m', '8h' or "
                          f"'7d' (or {UNTIL_REVOKED!r}), not {text!r}")
    lifetime = timedelta(seconds=int(found.group(1)) * _LIFETIME_UNIT[found.group(2)])
    if lifetime > MAX_LIFETIME:
        raise BadDuration(f"a lifetime of {text!r} is longer than {MAX_LIFETIME.days} days; give the consent "
                          f"{UNTIL_REVOKED!r} instead, on purpose")
    return lifetime


def _read_until(text: Any) -> tuple[datetime | None, bool]:
    """A stored end: ``(None, True)`` until revoked, ``(end, True)``, or ``(None, False)`` when it does not
    read (then the consent does not apply: an end that cannot be read is never "forever")."""
    if text is None:
        return None, True
    try:
        end = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        end = None
    if end is None or end.tzinfo is None:
        return None, False
    return end.astimezone(timezone.utc), True


@dataclass(frozen=True, slots=True)
class ConsentRecord:
    """A standing consent of one agent for one family: who gave it, when, from which card (None: given
    directly, not by answering a card) and until when (``until`` None: until revoked). ``state`` is how it
    stands when it was read: ``in force``, ``ended`` (its end has passed; the home's owner journals
    ``consent_expired`` and removes it when it first notices) or ``unreadable`` (its end does not read: it
    does not apply)."""

    agent: str
    family: Family
    granted_by: str
    granted_at: datetime
    until: datetime | None = None
    card: str | None = None
    state: str = "in force"

    def in_force(self, now: datetime) -> bool:
        """Whether it applies to a call decided at ``now``."""
        return self.state != "unreadable" and (self.until is None or _utc(now) < self.until)  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "family": self.family.value,
            "granted_by": self.granted_by,
            "granted_at": _iso(self.granted_at),
            "card": self.card,
            "until": _iso(self.until),
            "state": self.state,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConsentRecord":
        """A consent from its JSON (``to_dict``; a server of an older version sends no end: until revoked)."""
        until, readable = _read_until(data.get("until"))
        return cls(
            str(data["agent"]), Family(data["family"]), str(data["granted_by"]),
            _utc(datetime.fromisoformat(data["granted_at"])) if data.get("granted_at") else None,  # type: ignore[arg-type]
            until, data.get("card"), str(data.get("state") or ("in force" if readable else "unreadable")),
        )


@dataclass(frozen=True, slots=True)
class DeveloperMode:
    """Developer mode and its last change (``changed_by`` None: never changed)."""

    enabled: bool
    changed_by: str | None = None
    changed_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "changed_by": self.changed_by, "changed_at": _iso(self.changed_at)}


@dataclass(frozen=True, slots=True)
class PendingDecision:
    """A call of an unattended run waiting for a person.

    ``status`` is ``pending``, ``answered`` or ``expired`` (an expired decision
    is answered ``refuse`` by ``timeout``). ``reason`` is why governance asked;
    ``answer_reason`` is the person's reason, if given.
    """

    id: str
    run_id: str
    task_id: str | None
    agent: str
    tool: str
    family: Family | None
    arguments: Mapping[str, Any]
    answers: tuple[Answer, ...]
    created_at: datetime
    reason: str = ""
    line: int = 0
    call_id: str | None = None
    status: str = PENDING
    answer: Answer | None = None
    answered_by: str | None = None
    answered_at: datetime | None = None
    answer_reason: str | None = None

    @property
    def digest(self) -> str:
        """The digest of the call as its card shows it: what an answer approves (``governance/approvals.py``)."""
        from apollia_nb.governance.approvals import action_digest

        return action_digest(decision_id=self.id, run_id=self.run_id, agent=self.agent, tool=self.tool,
                             call_id=self.call_id, arguments=dict(self.arguments))

    def to_dict(self) -> dict[str, Any]:
        """The pending decision's JSON, plus its state and context."""
        return {
            "id": self.id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "agent": self.agent,
            "tool": self.tool,
            "family": self.family.value if self.family is not None else None,
            "arguments": dict(self.arguments),
            "answers": [a.value for a in self.answers],
            "created_at": _iso(self.created_at),
            "status": self.status,
            "answer": self.answer.value if self.answer is not None else None,
            "answered_by": self.answered_by,
            "answered_at": _iso(self.answered_at),
            "answer_reason": self.answer_reason,
            "reason": self.reason,
            "line": self.line,
            "call_id": self.call_id,
            "digest": self.digest,
        }


# --- validation (pure) ---------------------------------------------------------------


def validate_agent(agent: str, *, allow_all: bool = False) -> str:
    """An agent name (``[a-z0-9_-]+``), or ``*`` (every agent) when ``allow_all``."""
    if allow_all and agent == "*":
        return agent
    if not isinstance(agent, str) or not _AGENT.fullmatch(agent):
        want = "'*' or a name of [a-z0-9_-]+" if allow_all else "a name of [a-z0-9_-]+"
        raise BadInput(f"agent must be {want}, not {agent!r}")
    return agent


# --- what standing consents are given for ---------------------------------------------


_IDENTITY_KEYS = ("tools", "workspace", "model")


def _identity(identity: Any) -> dict[str, Any]:
    """An agent's identity checked: ``{"tools": [names] | ["*"], "workspace": absolute path, "model": {...}}``."""
    if not isinstance(identity, Mapping) or set(identity) != set(_IDENTITY_KEYS):
        raise BadInput(f"an agent's identity has exactly the keys {', '.join(_IDENTITY_KEYS)}")
    tools, workspace, model = identity["tools"], identity["workspace"], identity["model"]
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, str) and t for t in tools):
        raise BadInput("an agent's identity names its tools as a list of names")
    if not isinstance(workspace, str) or not os.path.isabs(workspace):
        raise BadInput(f"an agent's identity names its workspace as an absolute path, not {workspace!r}")
    if not isinstance(model, Mapping):
        raise BadInput("an agent's identity names its model as a table")
    return {"tools": sorted(set(tools)), "workspace": os.path.normpath(workspace), "model": dict(model)}


def identity_digest(identity: Mapping[str, Any]) -> str:
    """SHA-256 of the identity's canonical JSON (sorted keys, no spaces)."""
    import hashlib

    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def identity_difference(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """What changed between two identities of one agent, and whether the change widens it.

    ``{"tools"|"workspace"|"model": {"before", "after"}}`` for each key that differs. It widens when
    the tools are not a subset of those before (``["*"]`` is every tool), or the workspace or the
    model is another: a consent given for one folder says nothing of another, its parent or a
    link's target. Fewer tools alone narrows: nothing the consents covered is added."""
    difference = {key: {"before": before.get(key), "after": after.get(key)}
                  for key in _IDENTITY_KEYS if before.get(key) != after.get(key)}
    old, new = set(before.get("tools") or ()), set(after.get("tools") or ())
    narrower_tools = "*" in old or ("*" not in new and new <= old)
    widens = bool(set(difference) - {"tools"}) or ("tools" in difference and not narrower_tools)
    return difference, widens


def _read_whole(path: Path) -> tuple[Any, str] | None:
    """``(inode, problem)`` when a block of ``governance.db`` does not read (``home.check_whole``: every
    row and key, read-only), else None. Opened by nobody else yet: the store's open reads it once."""
    from apollia_nb.errors import HomeFileCorrupt
    from apollia_nb.home import check_whole, damage_error

    duckdb = _duckdb()
    if not path.is_file():
        return None
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        found = damage_error(exc, path)
        return (_inode(path), found.message) if found is not None else None
    try:
        check_whole(con, path)
    except HomeFileCorrupt as exc:
        return _inode(path), exc.message
    except duckdb.Error:
        return None  # not damage (read again, and reported, where it is used)
    finally:
        con.close()
    return None


def _read_identity(text: Any, digest: Any) -> dict[str, Any] | None:
    """A recorded identity, or None when it does not read (malformed, or not what its digest says)."""
    try:
        identity = _identity(json.loads(text))
    except (ValueError, TypeError, BadInput):
        return None
    return identity if identity_digest(identity) == digest else None


def _unreadable_identities(con: "duckdb.DuckDBPyConnection") -> set[str]:
    """The agents whose recorded identity does not read (their standing consents do not apply)."""
    if "agent_identities" not in GovernanceStore._tables(con):
        return set()
    return {agent for agent, text, digest in con.execute("SELECT agent, identity, digest FROM agent_identities")
            .fetchall() if _read_identity(text, digest) is None}


def _consent_rows(con: "duckdb.DuckDBPyConnection", now: datetime, agent: str | None = None,
                  family: Family | None = None) -> list[ConsentRecord]:
    """The standing consents stored (of ``agent``, for ``family`` when given), by agent then family, each
    with its state at ``now``. A database from before ends were kept has no ``until`` column: until revoked."""
    where, params = [], []
    if agent is not None:
        where.append("agent = ?")
        params.append(agent)
    if family is not None:
        where.append("family = ?")
        params.append(family.value)
    cursor = con.execute("SELECT * FROM consents" + (" WHERE " + " AND ".join(where) if where else "")
                         + " ORDER BY agent, family", params)
    names = [d[0] for d in cursor.description]
    out = []
    for row in cursor.fetchall():
        cells = dict(zip(names, row))
        until, readable = _read_until(cells.get("until"))
        state = "unreadable" if not readable else "ended" if until is not None and until <= now else "in force"
        out.append(ConsentRecord(cells["agent"], Family(cells["family"]), cells["granted_by"],
                                 _utc(cells["granted_at"]), until, cells.get("card"), state))  # type: ignore[arg-type]
    return out


def _without(consents: frozenset[tuple[str, Family]], agents: frozenset[str]) -> frozenset[tuple[str, Family]]:
    """``consents`` but those of ``agents``."""
    return frozenset(c for c in consents if c[0] not in agents) if agents else consents


def without_consents(view: GovernanceView, agents: frozenset[str]) -> GovernanceView:
    """``view`` with none of the standing consents of ``agents`` (the same view when none is held)."""
    kept = _without(view.consents, agents)
    return view if len(kept) == len(view.consents) else replace(view, consents=kept)


def _validate_by(by: str) -> str:
    if not isinstance(by, str) or not by.strip():
        raise BadInput("'by' must name who makes the change")
    return by


def _validate_tool(tool: str) -> str:
    if not isinstance(tool, str) or not tool or any(c.isspace() or not c.isprintable() for c in tool):
        raise BadInput(f"tool must be a non-empty name without spaces, not {tool!r}")
    return tool


def _validate_effect(effect: Effect | str) -> Effect:
    try:
        return Effect(effect)
    except ValueError:
        raise BadInput(f"effect must be 'allow' or 'deny', not {effect!r}") from None


def _validate_family(family: Family | str) -> Family:
    try:
        return Family(family)
    except ValueError:
        known = ", ".join(f.value for f in Family)
        raise BadInput(f"unknown family {family!r} (known: {known})") from None


def _consent_family(family: Family | str) -> Family:
    fam = _validate_family(family)
    if fam is Family.EXECUTE:
        raise BadInput(
            "no standing consent covers 'execute': code execution asks every time, "
            "or runs under a fine allow rule in developer mode"
        )
    if fam is Family.PROFILE:
        raise BadInput("no standing consent covers 'profile': a profile fact is asked every time")
    if fam in READ_ONLY_FAMILIES:
        raise BadInput(f"family {fam.value!r} needs no consent: it is always allowed")
    return fam


def _validate_answers(answers: Sequence[Answer | str]) -> tuple[Answer, ...]:
    try:
        out = tuple(Answer(a) for a in answers)
    except ValueError:
        raise BadInput(f"answers must be drawn from once, always, refuse: {list(answers)!r}") from None
    if not out or len(set(out)) != len(out):
        raise BadInput(f"answers must be a non-empty list without repeats: {list(answers)!r}")
    return out


def _racy(newest_ns: int, now_ns: int) -> bool:
    """Whether a file changed at ``newest_ns`` may change again unseen (same tick)."""
    if newest_ns <= 0:
        return False
    window = _RACY_COARSE_NS if newest_ns % 1_000_000_000 == 0 else _RACY_NS
    return now_ns - newest_ns < window


# --- the snapshot ------------------------------------------------------------------

_Stat = tuple[int, int, int, int, int] | tuple[str, int] | None


def _stat(path: str) -> _Stat:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return ("error", exc.errno or 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _newest(stats: Sequence[_Stat]) -> int:
    newest = 0
    for st in stats:
        if st is not None and len(st) == 5:
            newest = max(newest, st[2], st[3])  # type: ignore[misc]
    return newest


@dataclass(frozen=True)
class _DbState:
    sig: tuple[_Stat, ...]
    recheck: bool
    rules: tuple[Rule, ...] = ()
    consents: frozenset[tuple[str, Family]] = frozenset()  # those until revoked
    developer_mode: bool = False
    error: str | None = None
    timed: tuple[tuple[str, Family, datetime], ...] = ()  # those with an end: (agent, family, end)


@dataclass(frozen=True)
class _PolicySnap:
    sig: tuple[_Stat, ...]
    recheck: bool
    state: PolicyState
    journal_error: str | None = None


@dataclass(frozen=True)
class _Cached:
    sig: tuple[_Stat, ...]
    recheck: bool
    view: GovernanceView
    watch: FileWatch | None = None  # armed before ``sig`` was taken: quiet, nothing changed since
    until: float = 0.0  # when the stat() results are compared again however quiet the watch
    ends: datetime | None = None  # when the first standing consent in the view ends (the view is made again)


@dataclass(frozen=True)
class _Change:
    """One prepared mutation: what to journal (``kind`` None: nothing), then what to write."""

    kind: str | None
    payload: dict[str, Any]
    agent: str | None
    apply: Callable[["duckdb.DuckDBPyConnection"], None]
    result: Any = None
    then: tuple[tuple[str, dict[str, Any]], ...] = ()  # more entries (kind, payload), journaled after it
    view_unchanged: bool = False  # only pending decisions change: the rules, consents and developer mode stay


@dataclass(frozen=True)
class _NoChange:
    result: Any = None


# What each agent's standing consents are given for (``bind_identity``). Not in ``_TABLES``: a
# database from before it has none, and gets it with the first registration that binds one.
_IDENTITIES = """CREATE TABLE IF NOT EXISTS agent_identities (
        agent VARCHAR PRIMARY KEY, identity VARCHAR NOT NULL, digest VARCHAR NOT NULL,
        bound_at TIMESTAMP NOT NULL)"""

_SCHEMA = [
    "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    """CREATE TABLE rules (
        id VARCHAR PRIMARY KEY, tool VARCHAR NOT NULL, prefix VARCHAR, effect VARCHAR NOT NULL,
        agent VARCHAR NOT NULL, created_by VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL)""",
    """CREATE TABLE consents (
        agent VARCHAR NOT NULL, family VARCHAR NOT NULL, granted_by VARCHAR NOT NULL,
        granted_at TIMESTAMP NOT NULL, card VARCHAR, until VARCHAR, PRIMARY KEY (agent, family))""",
    """CREATE TABLE developer_mode (
        enabled BOOLEAN NOT NULL, changed_by VARCHAR NOT NULL, changed_at TIMESTAMP NOT NULL)""",
    """CREATE TABLE pending_decisions (
        id VARCHAR PRIMARY KEY, run_id VARCHAR NOT NULL, task_id VARCHAR, agent VARCHAR NOT NULL,
        tool VARCHAR NOT NULL, family VARCHAR, arguments VARCHAR NOT NULL, answers VARCHAR NOT NULL,
        reason VARCHAR NOT NULL, line INTEGER NOT NULL, call_id VARCHAR, created_at TIMESTAMP NOT NULL,
        status VARCHAR NOT NULL, answer VARCHAR, answered_by VARCHAR, answered_at TIMESTAMP,
        answer_reason VARCHAR)""",
    _IDENTITIES,
]
_TABLES = frozenset({"meta", "rules", "consents", "developer_mode", "pending_decisions"})
_PENDING_COLUMNS = (
    "id, run_id, task_id, agent, tool, family, arguments, answers, created_at, reason, line, call_id, "
    "status, answer, answered_by, answered_at, answer_reason"
)

_PATH_LOCKS: dict[str, threading.RLock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def _path_lock(path: Path) -> threading.RLock:
    """One lock per database file in this process: DuckDB shares one instance per file."""
    key = str(path)
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(key, threading.RLock())


def _duckdb() -> Any:
    import duckdb  # imported on first use: it costs ~100 ms

    return duckdb


def _row_to_rule(row: tuple[Any, ...]) -> RuleRecord:
    rid, tool, prefix, effect, agent, created_by, created_at = row
    return RuleRecord(
        tool=tool, effect=Effect(effect), prefix=prefix, agent=agent, id=rid,
        created_by=created_by, created_at=_utc(created_at),
    )


def _row_to_pending(row: tuple[Any, ...]) -> PendingDecision:
    (pid, run_id, task_id, agent, tool, family, arguments, answers, created_at, reason, line, call_id,
     status, answer, answered_by, answered_at, answer_reason) = row
    return PendingDecision(
        id=pid, run_id=run_id, task_id=task_id, agent=agent, tool=tool,
        family=Family(family) if family is not None else None,
        arguments=json.loads(arguments), answers=tuple(Answer(a) for a in json.loads(answers)),
        created_at=_utc(created_at), reason=reason, line=int(line), call_id=call_id,  # type: ignore[arg-type]
        status=status, answer=Answer(answer) if answer is not None else None,
        answered_by=answered_by, answered_at=_utc(answered_at), answer_reason=answer_reason,
    )


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class GovernanceStore:
    """``governance.db`` plus the organisation policy, as one fail-closed snapshot.

    ``trusted_keys`` None reads them from ``[policy] trusted_keys`` of
    ``apollia.toml``. ``journal`` receives every change before it takes effect.
    ``clock`` returns an aware UTC time (injected by tests).
    """

    def __init__(
        self,
        home: Home,
        journal: JournalSink | None = None,
        trusted_keys: Sequence[str] | None = None,
        *,
        lock_timeout: float = _DEFAULT_LOCK_TIMEOUT,
        clock: Callable[[], datetime] = _utcnow,
        expect_db: bool = False,
        expect_db_id: str | None = None,
        expect_policy: bool = False,
    ) -> None:
        self.home = home
        self.journal = journal
        self.trusted_keys = tuple(trusted_keys) if trusted_keys is not None else None
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.path = home.governance_db
        self._db_files = (str(self.path), str(self.path) + ".wal")
        self._policy_files = (str(home.policy_path), str(home.policy_sig_path), str(home.config_path))
        self._watched = (*self._db_files, *self._policy_files)
        self._lock = _path_lock(self.path)
        self._db: _DbState | None = None
        self._policy: _PolicySnap | None = None
        self._cached: _Cached | None = None
        self._last_rules: tuple[Rule, ...] = ()
        self._journaled_policy: tuple[str, str | None, str] | None = None
        self._keeper: Any = None
        self._keeper_ino: tuple[int, int] | None = None  # the file the keeper holds
        # (file, store id) whose schema was checked through the keeper: while the path is that file no
        # other process can change it, so its tables are not read again for each operation.
        self._checked: tuple[tuple[int, int], str | None] | None = None
        self._keep = False
        # What this home has had (from the journal, then from what this store saw):
        # a governance.db that must exist (with this id, when known) and a deposited policy.
        self._expect_db = expect_db or expect_db_id is not None
        self._expect_id = expect_db_id
        self._expect_policy = expect_policy
        self._journaled_damage: str | None = None
        self._writes = 0  # committed writes since the last checkpoint (see CHECKPOINT_EVERY)
        self._counts = {"commits": 0, "snapshot_reads": 0, "schema_reads": 0}  # see ``stats``
        self._held_back: frozenset[str] = frozenset()  # agents whose consents do not apply here
        self._ended: tuple[tuple[str, Family, datetime], ...] = ()  # ended, seen by the last view, not yet recorded

    #: ``(inode, problem)``: a block of governance.db did not read when the store opened (``_read_whole``).
    _open_problem: tuple[Any, str] | None = None

    @classmethod
    def open(cls, home: Home, journal: Any, *, record: Any = None, **kwargs: Any) -> "GovernanceStore":
        """The store of a home this process owns, checked against what ``journal`` records.

        A ``governance.db`` the journal records is expected (missing, empty or
        another database in its place: the view fails closed and mutations are
        refused); a policy it records as deposited is expected (gone: refused).
        A ``governance.db`` the journal does not record yet (a home written by
        an older version) is recorded now, with its id. ``record``: the journal's
        ``HomeRecord`` when the caller has read it already.
        """
        from apollia_nb.journal.accounting import FILE_CREATED, read_home_record

        record = record if record is not None else read_home_record(journal)
        store = cls(home, journal=journal, expect_db=record.governance_db, expect_db_id=record.governance_id,
                    expect_policy=record.policy, **kwargs)
        store._open_problem = _read_whole(store.path)  # a damaged block: fail closed from the start
        if "governance.db" not in record.recorded and store.path.exists():
            store_id = store._adopt_id()
            if store_id is not None:
                journal.append(FILE_CREATED, {"file": "governance.db", "id": store_id})
        return store

    @property
    def stats(self) -> dict[str, int]:
        """What this store did since it was made: ``commits`` (transactions that changed
        governance.db), ``snapshot_reads`` (its rules, consents and developer mode read for
        ``view()``), ``schema_reads`` (its tables checked)."""
        return dict(self._counts)

    def _adopt_id(self) -> str | None:
        """The database's ``store_id``, given one when it has none; None when it cannot be read."""
        duckdb = _duckdb()
        with self._lock:
            try:
                con = self._connect(read_only=False)
            except (GovernanceUnreadable, Conflict):
                return None
            try:
                if not self._schema_ready(con):
                    return None
                found = self._store_id(con)
                if found is None:
                    found = "g-" + secrets.token_hex(8)
                    con.execute("INSERT INTO meta VALUES ('store_id', ?)", [found])
            except (duckdb.Error, GovernanceUnreadable):
                return None
            finally:
                con.close()
                self._db = None
                self._cached = None
            self._expect_db, self._expect_id = True, found
            return found

    @staticmethod
    def _store_id(con: "duckdb.DuckDBPyConnection") -> str | None:
        row = con.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        return str(row[0]) if row else None

    def _restore_hint(self) -> str:
        return ("restore it from a backup, or start over with an empty one on purpose: "
                f"`apollia-os home repair --new-governance-db --home {self.home.path}` (journaled)")

    def _expected_problem(self, con: "duckdb.DuckDBPyConnection | None") -> str | None:
        """Why the database is not the one this home had (None: it is, or none is expected).

        ``con`` None: the file is missing. Otherwise a connection to it; an
        empty database where one was expected is a problem too.
        """
        damaged = self._open_problem
        inode = _inode(self.path) if con is not None else None
        if con is not None and damaged is not None and damaged[0] == inode:
            return damaged[1]
        if not self._expect_db:
            return None
        if con is not None and self._keeper_ino is not None and inode != self._keeper_ino:
            return (f"governance.db was replaced while the home was open (it is not the file this process "
                    f"opened); {self._restore_hint()}")
        if con is None:
            return (f"governance.db is missing, but the journal records that this home had it (its rules, "
                    f"consents and developer mode were kept there); {self._restore_hint()}")
        held = self._held(inode)
        checked = self._checked
        if held is not None and checked is not None and checked[0] == held and checked[1] is not None \
                and (self._expect_id is None or checked[1] == self._expect_id):
            return None  # the file the keeper holds, checked already: nobody else can have changed it
        if not self._schema_ready(con):
            return f"governance.db is empty, but this home had rules kept there; {self._restore_hint()}"
        found = self._store_id(con)
        if self._expect_id is not None and found != self._expect_id:
            return (f"governance.db is not the database this home had (its id is {found or 'none'}, the journal "
                    f"records {self._expect_id}): it was replaced; {self._restore_hint()}")
        if held is not None and found is not None:
            self._checked = (held, found)
        return None

    def _held(self, inode: tuple[int, int] | None) -> tuple[int, int] | None:
        """The file the keeper holds, when ``inode`` (the path's, just taken) is that file: no other
        process can open it meanwhile, and this one changes it only through this store."""
        ino = self._keeper_ino
        return ino if self._keeper is not None and ino is not None and inode == ino else None

    def _damaged(self, sig: tuple[_Stat, ...], recheck: bool, problem: str) -> _DbState:
        """The fail-closed state for a ``governance.db`` that is not the home's, journaled once
        (``home_damaged``) per problem; a journal that refuses the entry changes nothing here."""
        journal = self.journal
        if journal is not None and problem != self._journaled_damage:
            try:
                journal.append("home_damaged", {"file": "governance.db", "reason": problem})
                self._journaled_damage = problem
            except Exception:  # still fail closed; tried again on the next view()
                recheck = True
        return _DbState(sig, recheck, rules=self._last_rules, error=problem)

    def _missing(self) -> bool:
        return not self.path.exists() and not self.path.is_symlink()

    def db_problem(self) -> str | None:
        """Why ``governance.db`` cannot serve this home (missing, replaced, unreadable), or None."""
        with self._lock:
            if self._missing():
                return self._expected_problem(None)
            try:
                con = self._connect(read_only=True)
            except (GovernanceUnreadable, Conflict) as exc:
                return exc.message
            try:
                problem = self._expected_problem(con)
                if problem is None:
                    self._schema_ready(con)
                return problem
            except GovernanceUnreadable as exc:
                return exc.message
            except _duckdb().Error as exc:
                return f"governance.db cannot be read: {exc}"
            finally:
                con.close()

    def replace_db(self, *, by: str, moved_to: Path | None) -> str:
        """Start an empty ``governance.db`` on purpose (``home repair --new-governance-db``).

        The caller has moved the old file (and its ``.wal``) aside to
        ``moved_to``; the new database's id is journaled (``home_repaired``)
        before it is created. Returns the new id.
        """
        by = _validate_by(by)
        duckdb = _duckdb()
        with self._lock:
            if not self._missing():
                raise Conflict(f"{self.path} exists; move it aside first: nothing is overwritten")
            store_id = "g-" + secrets.token_hex(8)
            if self.journal is not None:
                self.journal.append("home_repaired", {
                    "file": "governance.db", "action": "new", "id": store_id, "by": by,
                    "moved_to": str(moved_to) if moved_to is not None else None,
                })
            con = duckdb.connect(str(self.path))
            try:
                self._create_schema(con, store_id)
            finally:
                con.close()
            self._expect_db, self._expect_id = True, store_id
            self._db = None
            self._cached = None
            self._last_rules = ()
            return store_id

    def keep_open(self) -> bool:
        """Hold ``governance.db`` open for this process (the home's owner) until ``close()``.

        DuckDB shares one database instance among a process's connections while
        one is open, so each operation's connection then costs well under a
        millisecond instead of reopening the file. Nothing else changes: every
        operation still runs in its own connection and transaction. A database
        that cannot be opened is not kept (the view stays fail closed). Other
        processes cannot open the file meanwhile — the owner holds the home anyway.
        """
        duckdb = _duckdb()
        with self._lock:
            self._keep = True
            if self._keeper is not None:
                return True
            if not self.path.exists():
                return False  # created by the first write; kept from the next operation on
            try:
                keeper = duckdb.connect(str(self.path))
                self._schema_ready(keeper)
            except (duckdb.Error, GovernanceUnreadable):
                try:
                    keeper.close()  # type: ignore[possibly-undefined]
                except Exception:
                    pass
                return False
            self._keeper, self._keeper_ino, self._checked = keeper, _inode(self.path), None
            return True

    def close(self) -> None:
        """Stop holding the database open (see ``keep_open``) and watching its files."""
        with self._lock:
            self._keep = False
            keeper, self._keeper = self._keeper, None
            self._keeper_ino = self._checked = None
            cached = self._cached
        if keeper is not None:
            keeper.close()
        if cached is not None and cached.watch is not None:
            cached.watch.close()  # a later view() compares stat() results and watches again

    def attach_journal(self, journal: JournalSink | None) -> None:
        """Journal changes to ``journal`` from now on (and the policy state on next ``view()``)."""
        with self._lock:
            self.journal = journal
            self._journaled_policy = None
            self._policy = None
            self._cached = None

    # --- the snapshot --------------------------------------------------------------

    def _signature(self) -> tuple[_Stat, ...]:
        a, b = self._db_files
        c, d, e = self._policy_files
        return (_stat(a), _stat(b), _stat(c), _stat(d), _stat(e))

    def view(self) -> GovernanceView:
        """The current snapshot for ``decide()``; microseconds when nothing changed.

        Unchanged files are known without a ``stat()`` while the snapshot's
        ``FileWatch`` is quiet (see ``governance/watch.py``); otherwise, and at least
        every ``FULL_CHECK_SECS``, their ``stat()`` results are compared.
        """
        cached = self._cached
        if cached is not None and not cached.recheck and (cached.ends is None or self._now() < cached.ends):
            watch = cached.watch
            if watch is not None and time.monotonic() < cached.until and watch.quiet():
                return cached.view
            if watch is None or not watch.quiet():
                watch = FileWatch(self._watched)  # armed before the stat() results it vouches for
            if cached.sig == self._signature():
                self._cached = replace(cached, watch=watch, until=time.monotonic() + FULL_CHECK_SECS)
                if cached.watch is not None and cached.watch is not watch:
                    cached.watch.close()
                return cached.view
            watch.close()
        with self._lock:
            view = self._refresh()
            if self._ended and self.journal is not None and self._record_ended(self._ended):
                view = self._refresh()  # made again from what the record left
            return view

    def policy_state(self) -> PolicyState:
        """The organisation policy as the current ``view()`` sees it."""
        self.view()
        snap = self._policy
        assert snap is not None
        return snap.state

    def _refresh(self) -> GovernanceView:
        watch = FileWatch(self._watched)  # armed first: whatever changes after the stat() results fires it
        now = time.time_ns()
        sig = self._signature()
        db_sig, policy_sig = sig[:2], sig[2:]
        db = self._db
        if db is None or db.recheck or db.sig != db_sig:
            db = self._load_db(db_sig, now)
            self._db = db
        snap = self._policy
        if snap is None or snap.recheck or snap.sig != policy_sig:
            snap = self._load_policy(policy_sig, now)
            self._policy = snap
        now_at = self._now() if db.timed else None
        view = self._combine(db, snap, now_at)
        ends = min((end for _, _, end in db.timed if now_at is not None and now_at < end), default=None)
        self._ended = tuple(t for t in db.timed if now_at is not None and t[2] <= now_at)
        old, self._cached = self._cached, _Cached(sig, db.recheck or snap.recheck, view, watch,
                                                  time.monotonic() + FULL_CHECK_SECS, ends)
        if old is not None and old.watch is not None:
            old.watch.close()
        return view

    def _combine(self, db: _DbState, snap: _PolicySnap, now: datetime | None = None) -> GovernanceView:
        """The view of ``db`` and the policy; a standing consent with an end is in it only while ``now``
        (the store's clock, taken when the view is made) is before its end."""
        reasons: list[str] = []
        if db.error is not None:
            reasons.append(db.error)
        if snap.state.status == "refused":
            reasons.append(f"the organisation policy is refused: {snap.state.reason}")
        if snap.journal_error is not None:
            reasons.append(snap.journal_error)
        policy = snap.state.policy if snap.state.status == "accepted" else None
        if reasons:
            # Fail closed: keep the deny rules known (refusing more is safe), drop the rest.
            return GovernanceView(
                rules=tuple(r for r in db.rules if r.effect is Effect.DENY),
                policy=policy, readable=False, unreadable_reason="; ".join(reasons),
            )
        consents = db.consents
        if db.timed and now is not None:
            consents = consents | {(agent, family) for agent, family, end in db.timed if now < end}
        return GovernanceView(
            rules=db.rules, consents=_without(consents, self._held_back), developer_mode=db.developer_mode,
            policy=policy,
        )

    def _record_ended(self, ended: tuple[tuple[str, Family, datetime], ...]) -> bool:
        """Journal ``consent_expired`` for each standing consent whose end has passed and remove it (the
        view leaves it out whether or not this succeeds). True when recorded; when the journal or the file
        refuses, the view is made again on the next ``view()`` and the record tried again."""
        import functools

        now = self._now()
        try:
            for agent, family, end in ended:
                self._write(functools.partial(self._expiry, agent=agent, family=family, end=end, now=now))
        except Exception:  # noqa: BLE001 - fail closed: the consent stays out of the view; tried again
            cached = self._cached
            if cached is not None:
                self._cached = replace(cached, recheck=True)
            return False
        return True

    @staticmethod
    def _expiry(con: "duckdb.DuckDBPyConnection", agent: str, family: Family, end: datetime,
                now: datetime) -> "_Change | _NoChange":
        found = _consent_rows(con, now, agent, family)
        if not found or found[0].until != end or found[0].state != "ended":
            return _NoChange()  # revoked, given again or recorded meanwhile
        record = found[0]
        payload = {"agent": agent, "family": family.value, "until": _iso(end), "granted_by": record.granted_by,
                   "granted_at": _iso(record.granted_at), "card": record.card, "noticed_at": _iso(now)}
        return _Change("consent_expired", payload, agent,
                       lambda c: c.execute("DELETE FROM consents WHERE agent = ? AND family = ?",  # type: ignore[arg-type]
                                           [agent, family.value]), record)

    def hold_back_consents(self, agent: str, held: bool) -> None:
        """In this process, apply none of ``agent``'s standing consents (``held``) or apply them again:
        an agent registered while what its consents were given for could not be checked."""
        with self._lock:
            now = self._held_back | {agent} if held else self._held_back - {agent}
            if now != self._held_back:
                self._held_back = frozenset(now)
                self._cached = None

    def _load_db(self, sig: tuple[_Stat, ...], now: int) -> _DbState:
        recheck = _racy(_newest(sig), now)
        if sig[0] is None:
            problem = self._expected_problem(None)
            if problem is not None:  # keep the deny rules known: refusing more is safe
                return self._damaged(sig, recheck, problem)
            self._last_rules = ()
            return _DbState(sig, recheck)
        duckdb = _duckdb()
        try:
            con = self._connect(read_only=True)
        except GovernanceUnreadable as exc:
            return _DbState(sig, recheck, rules=self._last_rules, error=exc.message)
        except Conflict as exc:  # HomeLocked: try again on the next view()
            return _DbState(sig, True, rules=self._last_rules, error=f"governance.db cannot be read now: {exc.message}")
        try:
            self._counts["snapshot_reads"] += 1
            problem = self._expected_problem(con)
            if problem is not None:
                return self._damaged(sig, recheck, problem)
            if not self._schema_ready(con):
                self._last_rules = ()
                return _DbState(sig, recheck)
            store_id = self._store_id(con)
            rules = tuple(
                r.rule for r in map(_row_to_rule, con.execute(
                    "SELECT id, tool, prefix, effect, agent, created_by, created_at FROM rules ORDER BY created_at, id"
                ).fetchall())
            )
            stored = _consent_rows(con, datetime.min.replace(tzinfo=timezone.utc))  # states: at the view's now
            unbound = _unreadable_identities(con)  # what those consents were given for cannot be read
            consents = frozenset((c.agent, c.family) for c in stored
                                 if c.state != "unreadable" and c.until is None and c.agent not in unbound)
            timed = tuple((c.agent, c.family, c.until) for c in stored
                          if c.state != "unreadable" and c.until is not None and c.agent not in unbound)
            row = con.execute("SELECT enabled FROM developer_mode").fetchone()
        except (duckdb.Error, ValueError) as exc:
            self._forget_invalidated(exc)
            return _DbState(sig, recheck, rules=self._last_rules, error=f"governance.db cannot be read: {exc}")
        except GovernanceUnreadable as exc:
            return _DbState(sig, recheck, rules=self._last_rules, error=exc.message)
        finally:
            con.close()
        self._last_rules = rules
        self._journaled_damage = None
        # Seen: from now on this database must stay (with this id) while the home is open.
        self._expect_db = True
        self._expect_id = self._expect_id or store_id
        return _DbState(sig, recheck, rules=rules, consents=consents, developer_mode=bool(row and row[0]),
                        timed=timed)  # type: ignore[arg-type]

    def _load_policy(self, sig: tuple[_Stat, ...], now: int) -> _PolicySnap:
        recheck = _racy(_newest(sig), now)
        state = load_policy(self.home, self.trusted_keys, expected=self._expect_policy)
        if state.status != "none":
            self._expect_policy = True  # had one: from now on its absence is refused
        seen = (state.status, state.digest, state.reason)
        journal = self.journal
        if journal is None or seen == self._journaled_policy:
            return _PolicySnap(sig, recheck, state)
        if self._journaled_policy is None and state.status == "none":
            self._journaled_policy = seen  # nothing deposited at first sight: nothing to record
            return _PolicySnap(sig, recheck, state)
        kind = "policy_refused" if state.status == "refused" else "policy_loaded"
        payload: dict[str, Any] = {"status": state.status, "reason": state.reason, "digest": state.digest}
        if state.status == "accepted":
            payload["key"] = state.key
            payload["policy"] = policy_to_dict(state.policy)  # type: ignore[arg-type]
        try:
            journal.append(kind, payload)
        except Exception as exc:  # the state is not in effect until it is journaled
            return _PolicySnap(sig, True, state, journal_error=f"the policy state cannot be journaled: {exc}")
        self._journaled_policy = seen
        return _PolicySnap(sig, recheck, state)

    def remove_policy(self, *, by: str) -> PolicyState:
        """Remove the deposited policy on purpose (journaled ``policy_removed``), then its files.

        The way back to ``none`` after a policy: without it a missing policy is
        refused. ``NotFound`` when there is no policy to remove.
        """
        by = _validate_by(by)
        with self._lock:
            files = [p for p in (self.home.policy_path, self.home.policy_sig_path) if p.exists() or p.is_symlink()]
            if not files and not self._expect_policy:
                raise NotFound(f"no organisation policy is deposited in {self.home.path}")
            before = load_policy(self.home, self.trusted_keys, expected=self._expect_policy)
            if self.journal is not None:
                self.journal.append("policy_removed", {"by": by, "was": before.status, "digest": before.digest})
            for path in files:
                path.unlink(missing_ok=True)
            self._expect_policy = False
            now = evaluate_policy(None, None, None)
            self._journaled_policy = (now.status, now.digest, now.reason)  # the removal is its record
            self._policy = None
            self._cached = None
        return self.policy_state()

    # --- connections ----------------------------------------------------------------

    def _connect(self, *, read_only: bool) -> "duckdb.DuckDBPyConnection":
        """Connect, retrying while another process holds the file; map DuckDB's errors."""
        duckdb = _duckdb()
        if self._keep and self._keeper is None and self.path.exists():
            keeper = None
            try:
                keeper = duckdb.connect(str(self.path))
                if self._schema_ready(keeper):
                    self._keeper, keeper = keeper, None
                    self._keeper_ino, self._checked = _inode(self.path), None
            except (duckdb.Error, GovernanceUnreadable):
                self._keep = False  # unreadable: per-operation connections report it, fail closed
            finally:
                if keeper is not None:
                    keeper.close()
        if self._keeper is not None:
            # Same instance as the keeper: the same configuration (read-write), no file reopen.
            return duckdb.connect(str(self.path))
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.005
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only)
            except duckdb.Error as exc:
                text = str(exc)
                locked = lock_holder_pid(exc) is not None or "Could not set lock" in text
                if not locked:
                    raise GovernanceUnreadable(f"governance.db cannot be read: {text}") from None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise_if_locked(exc, self.path)
                    raise GovernanceUnreadable(f"governance.db cannot be opened: {text}") from None
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.1)

    @staticmethod
    def _tables(con: "duckdb.DuckDBPyConnection") -> set[str]:
        rows = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = 'main'"
        ).fetchall()
        return {r[0] for r in rows}

    def _schema_ready(self, con: "duckdb.DuckDBPyConnection") -> bool:
        """True: our schema; False: an empty database. Anything else is unreadable.

        The file the keeper holds is read once: its tables are this process's to change (``_checked``)."""
        checked = self._checked
        if checked is not None and self._held(_inode(self.path)) == checked[0]:
            return True
        self._counts["schema_reads"] += 1
        tables = self._tables(con)
        if not tables:
            return False
        if "meta" not in tables:
            raise GovernanceUnreadable(
                f"governance.db is not a governance database (it holds {', '.join(sorted(tables))})"
            )
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row and str(row[0]).isdigit() else None
        if version is None:
            raise GovernanceUnreadable("governance.db has no schema version")
        if version > SCHEMA_VERSION:
            raise GovernanceUnreadable(
                f"governance.db has schema version {version}, newer than this version reads ({SCHEMA_VERSION})"
            )
        missing = _TABLES - tables
        if missing:
            raise GovernanceUnreadable(f"governance.db lacks the table(s) {', '.join(sorted(missing))}")
        held = self._held(_inode(self.path))
        if held is not None and (checked is None or checked[0] != held):
            self._checked = (held, None)  # the schema, not yet the id (``_expected_problem``)
        return True

    def _read(self, work: Callable[["duckdb.DuckDBPyConnection"], Any], empty: Any) -> Any:
        """Run a read; a missing or empty database reads as ``empty``."""
        duckdb = _duckdb()
        with self._lock:
            if self._missing():
                problem = self._expected_problem(None)
                if problem is not None:
                    raise GovernanceUnreadable(problem)
                return empty
            con = self._connect(read_only=True)
            try:
                problem = self._expected_problem(con)
                if problem is not None:
                    raise GovernanceUnreadable(problem)
                if not self._schema_ready(con):
                    return empty
                return work(con)
            except duckdb.Error as exc:
                raise GovernanceUnreadable(f"governance.db cannot be read: {exc}") from None
            finally:
                con.close()

    def _write(self, prepare: Callable[["duckdb.DuckDBPyConnection"], _Change | _NoChange]) -> Any:
        """One transaction: prepare (validate against the rows), journal, apply, commit."""
        duckdb = _duckdb()
        with self._lock:
            self.home.ensure()
            if self._missing():
                problem = self._expected_problem(None)
                if problem is not None:  # never an empty governance.db over a lost one
                    raise GovernanceUnreadable(problem)
            try:
                con = self._connect(read_only=False)
            except GovernanceUnreadable as exc:  # a full disk refusing even the file's creation
                raise storage_error(exc, "governance.db did not take the change") or exc from None
            created: str | None = None
            before, view_stays = self._db_signature(), False
            try:
                try:
                    con.execute("BEGIN TRANSACTION")
                    problem = self._expected_problem(con)
                    if problem is not None:
                        raise GovernanceUnreadable(problem)
                    if not self._schema_ready(con):
                        created = self._create_schema(con)
                    change = prepare(con)
                except duckdb.Error as exc:
                    self._forget_invalidated(exc)
                    storage = storage_error(exc, "governance.db did not take the change")
                    if storage is not None:
                        raise storage from None
                    raise GovernanceUnreadable(f"governance.db cannot be read: {exc}") from None
                if created is not None and self.journal is not None:  # the home has a governance.db from now on
                    self.journal.append("home_file_created", {"file": "governance.db", "id": created})
                if isinstance(change, _NoChange):
                    if created is not None:  # the schema stays: commit it alone
                        con.execute("COMMIT")
                        self._expect_db, self._expect_id = True, created
                    else:
                        con.execute("ROLLBACK")
                    return change.result
                if change.kind is not None and self.journal is not None:
                    self.journal.append(change.kind, with_actor(change.payload), agent=change.agent)
                    for kind, payload in change.then:
                        self.journal.append(kind, with_actor(payload), agent=change.agent)
                try:
                    change.apply(con)
                    con.execute("COMMIT")
                except duckdb.Error as exc:
                    self._forget_invalidated(exc)
                    storage = storage_error(
                        exc, "governance.db did not take the change (the journal holds the request, "
                             "not its effect)")
                    if storage is not None:
                        raise storage from None
                    raise GovernanceUnreadable(f"governance.db cannot be written: {exc}") from None
                if created is not None:
                    self._expect_db, self._expect_id = True, created
                self._writes += 1
                self._counts["commits"] += 1
                view_stays = change.view_unchanged and created is None
                return change.result
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                raise
            finally:
                con.close()
                if self._writes >= CHECKPOINT_EVERY:
                    self._checkpoint()
                self._after_write(before, view_stays)

    def _db_signature(self) -> tuple[_Stat, ...]:
        return (_stat(self._db_files[0]), _stat(self._db_files[1]))

    def _after_write(self, before: tuple[_Stat, ...], view_stays: bool) -> None:
        """After a write (under the lock): the snapshot is read again on the next ``view()``, unless the
        write changed only pending decisions of the file the keeper holds, and the snapshot was read
        from the files as they were just before it; then it stays, under the files' new signature."""
        db = self._db
        if (view_stays and db is not None and not db.recheck and db.error is None and db.sig == before
                and self._held(_inode(self.path)) is not None):
            self._db = replace(db, sig=self._db_signature())
        else:
            self._db = None
        self._cached = None

    def _checkpoint(self) -> None:
        """Checkpoint ``governance.db`` (under the lock, no transaction open): DuckDB frees the
        version data of the updates before it. A failure only delays it to the next round."""
        self._writes = 0
        con = self._keeper
        try:
            if con is None:
                con = self._connect(read_only=False)
                try:
                    con.execute("CHECKPOINT")
                finally:
                    con.close()
            else:
                con.execute("CHECKPOINT")
        except (_duckdb().Error, GovernanceUnreadable) as exc:
            self._forget_invalidated(exc)  # a checkpoint the disk refused may invalidate the database

    def _forget_invalidated(self, exc: BaseException) -> None:
        """Drop the kept connection when DuckDB invalidated the database (a write the disk refused):
        the next operation opens it again, with what it had committed."""
        if needs_reopen(exc) and self._keeper is not None:
            keeper, self._keeper = self._keeper, None
            self._keeper_ino = self._checked = None
            try:
                keeper.close()
            except Exception:  # noqa: BLE001 - an invalidated database may refuse even this
                pass

    def _create_schema(self, con: "duckdb.DuckDBPyConnection", store_id: str | None = None) -> str:
        """Create the tables and the database's random ``store_id``; returns the id."""
        for statement in _SCHEMA:
            con.execute(statement)
        store_id = store_id or "g-" + secrets.token_hex(8)
        con.execute("INSERT INTO meta VALUES ('schema_version', ?), ('store_id', ?)", [str(SCHEMA_VERSION), store_id])
        return store_id

    def _now(self) -> datetime:
        return _utc(self.clock())  # type: ignore[return-value]

    # --- fine rules -----------------------------------------------------------------

    def add_rule(
        self,
        tool: str,
        effect: Effect | str,
        prefix: str | None = None,
        agent: str = "*",
        *,
        by: str,
    ) -> RuleRecord:
        """Add a fine rule (journaled ``rule_added``); an identical rule is returned as is."""
        tool = _validate_tool(tool)
        eff = _validate_effect(effect)
        if prefix is not None and not isinstance(prefix, str):
            raise BadInput(f"prefix must be text, not {prefix!r}")
        prefix = prefix or None
        agent = validate_agent(agent, allow_all=True)
        by = _validate_by(by)
        now = self._now()

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            same = con.execute(
                "SELECT id, tool, prefix, effect, agent, created_by, created_at FROM rules "
                "WHERE tool = ? AND prefix IS NOT DISTINCT FROM ? AND effect = ? AND agent = ?",
                [tool, prefix, eff.value, agent],
            ).fetchone()
            if same is not None:
                return _NoChange(_row_to_rule(same))
            while True:
                rid = "r-" + secrets.token_hex(4)
                if con.execute("SELECT 1 FROM rules WHERE id = ?", [rid]).fetchone() is None:
                    break
            record = RuleRecord(tool=tool, effect=eff, prefix=prefix, agent=agent, id=rid, created_by=by, created_at=now)
            payload = {k: v for k, v in record.to_dict().items() if k not in ("created_by", "created_at")}
            payload["by"] = by

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute(
                    "INSERT INTO rules VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [rid, tool, prefix, eff.value, agent, by, _naive(now)],
                )

            return _Change("rule_added", payload, None if agent == "*" else agent, apply, record)

        return self._write(prepare)

    def remove_rule(self, rule_id: str, *, by: str) -> RuleRecord:
        """Remove a rule by id (journaled ``rule_removed``); ``UnknownRule`` if there is none."""
        by = _validate_by(by)

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change:
            row = con.execute(
                "SELECT id, tool, prefix, effect, agent, created_by, created_at FROM rules WHERE id = ?",
                [rule_id],
            ).fetchone()
            if row is None:
                raise UnknownRule(f"no rule has the id {rule_id!r}")
            record = _row_to_rule(row)
            payload = {k: v for k, v in record.to_dict().items() if k not in ("created_by", "created_at")}
            payload["by"] = by
            return _Change(
                "rule_removed", payload, None if record.agent == "*" else record.agent,
                lambda c: c.execute("DELETE FROM rules WHERE id = ?", [rule_id]), record,  # type: ignore[arg-type]  # what it returns is not read
            )

        return self._write(prepare)

    def rules(self) -> list[RuleRecord]:
        """Every fine rule, oldest first, with who added it and when."""
        return self._read(
            lambda con: [
                _row_to_rule(r)
                for r in con.execute(
                    "SELECT id, tool, prefix, effect, agent, created_by, created_at FROM rules ORDER BY created_at, id"
                ).fetchall()
            ],
            [],
        )

    def get_rule(self, rule_id: str) -> RuleRecord:
        for rule in self.rules():
            if rule.id == rule_id:
                return rule
        raise UnknownRule(f"no rule has the id {rule_id!r}")

    # --- standing consents ----------------------------------------------------------

    def grant_consent(self, agent: str, family: Family | str, *, by: str, until: datetime | None = None,
                      card: str | None = None) -> ConsentRecord:
        """Record a standing consent (journaled ``consent_granted``) until ``until`` (None: until revoked),
        given by answering ``card`` (None: given directly). A consent in force that lasts at least as long
        is returned as is; one that ends sooner (or has ended, or whose end does not read) is replaced."""
        agent = validate_agent(agent)
        fam = _consent_family(family)
        by = _validate_by(by)
        if until is not None and (not isinstance(until, datetime) or until.tzinfo is None):
            raise BadDuration(f"a standing consent ends at a time with its zone, not {until!r}")
        until = _utc(until)
        if card is not None and not isinstance(card, str):
            raise BadInput(f"card must be a card's id, not {card!r}")
        now = self._now()
        if until is not None and until <= now:
            raise BadDuration(f"a standing consent cannot end before it is given ({_iso(until)})")

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            columns = {name for (name,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND table_name = 'consents'").fetchall()}
            found = _consent_rows(con, now, agent, fam)
            held = found[0] if found else None
            if held is not None and held.state == "in force" and (
                    held.until is None or (until is not None and until <= held.until)):
                return _NoChange(held)
            record = ConsentRecord(agent, fam, by, now, until, card)
            payload: dict[str, Any] = {"agent": agent, "family": fam.value, "by": by}
            if card is not None:
                payload["card"] = card
            if until is not None:
                payload["until"] = _iso(until)
            if held is not None:  # what it replaces
                payload["replaces"] = {"granted_by": held.granted_by, "until": _iso(held.until), "state": held.state}

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                if not {"card", "until"} <= columns:  # a database from before ends were kept
                    c.execute("ALTER TABLE consents ADD COLUMN IF NOT EXISTS card VARCHAR")
                    c.execute("ALTER TABLE consents ADD COLUMN IF NOT EXISTS until VARCHAR")
                    c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
                c.execute("DELETE FROM consents WHERE agent = ? AND family = ?", [agent, fam.value])
                c.execute("INSERT INTO consents (agent, family, granted_by, granted_at, card, until) "
                          "VALUES (?, ?, ?, ?, ?, ?)", [agent, fam.value, by, _naive(now), card, _iso(until)])

            return _Change("consent_granted", payload, agent, apply, record)

        return self._write(prepare)

    def revoke_consent(self, agent: str, family: Family | str, *, by: str) -> ConsentRecord:
        """Revoke a standing consent (journaled ``consent_revoked``); ``NotFound`` if none. It stops applying
        on the next call."""
        agent = validate_agent(agent)
        fam = _validate_family(family)
        by = _validate_by(by)
        now = self._now()

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change:
            found = _consent_rows(con, now, agent, fam)
            if not found:
                raise NotFound(f"agent {agent!r} holds no standing consent for {fam.value!r}")
            record = found[0]
            payload: dict[str, Any] = {"agent": agent, "family": fam.value, "by": by}
            if record.card is not None:
                payload["card"] = record.card
            if record.until is not None or record.state == "unreadable":
                payload["until"] = _iso(record.until)
                payload["state"] = record.state
            return _Change(
                "consent_revoked", payload, agent,
                lambda c: c.execute("DELETE FROM consents WHERE agent = ? AND family = ?", [agent, fam.value]),  # type: ignore[arg-type]  # what it returns is not read
                record,
            )

        return self._write(prepare)

    def consents(self, agent: str | None = None) -> list[ConsentRecord]:
        """Every standing consent (of ``agent``), by agent then family: who granted it, when, from which card,
        until when, and its state now. The home's owner first records those that have ended (``view``)."""
        if agent is not None:
            agent = validate_agent(agent)
        if self.journal is not None:
            self.view()
        now = self._now()
        return self._read(lambda con: _consent_rows(con, now, agent), [])

    # --- what standing consents are given for ---------------------------------------

    def agent_identity(self, agent: str) -> dict[str, Any] | None:
        """The identity ``agent``'s standing consents are given for (None: none is recorded).
        ``GovernanceUnreadable`` when it is recorded but does not read."""
        agent = validate_agent(agent)

        def read(con: "duckdb.DuckDBPyConnection") -> dict[str, Any] | None:
            if "agent_identities" not in self._tables(con):
                return None
            row = con.execute("SELECT identity, digest FROM agent_identities WHERE agent = ?", [agent]).fetchone()
            if row is None:
                return None
            identity = _read_identity(*row)
            if identity is None:
                raise GovernanceUnreadable(f"the recorded identity of agent {agent!r} does not read")
            return identity

        return self._read(read, None)

    def bind_identity(self, agent: str, identity: Mapping[str, Any], *, keep: bool | None = None,
                      fallback: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Record ``identity`` (tools, resolved workspace, model) as what ``agent``'s standing consents are
        given for: the review every registration of an agent goes through, in the owner or through its
        server (``Runtime.review_identity``).

        The same identity changes nothing. One that widens what is recorded (``identity_difference``)
        while the agent holds standing consents is ``ConsentsToReview`` showing the difference, unless
        ``keep`` says what to do: ``True`` keeps them, ``False`` revokes them (journaled
        ``consents_review``, and ``consent_revoked`` for each dropped). A recorded identity that does
        not read counts as another one. Otherwise (no consents, or fewer tools only) the new identity
        is recorded. Each new identity is journaled (``agent_identity``). ``fallback``: what to compare
        with when nothing is recorded yet (an agent registered before identities were recorded).
        Returns ``{"agent", "identity", "digest", "review"}`` (``review`` None, or the difference,
        the consents and the choice)."""
        agent = validate_agent(agent)
        identity = _identity(identity)
        digest = identity_digest(identity)
        now = self._now()

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            from apollia_nb.errors import ConsentsToReview

            con.execute(_IDENTITIES)
            row = con.execute("SELECT identity, digest FROM agent_identities WHERE agent = ?", [agent]).fetchone()
            result = {"agent": agent, "identity": identity, "digest": digest, "review": None}
            if row is not None and row[1] == digest and _read_identity(*row) is not None:
                return _NoChange(result)
            held = sorted(f for (f,) in con.execute(
                "SELECT family FROM consents WHERE agent = ? ORDER BY family", [agent]).fetchall())
            before = _read_identity(*row) if row is not None else (
                _identity(fallback) if fallback is not None else None)
            if before is None and row is not None:
                difference: dict[str, Any] = {"identity": {
                    "before": "the recorded identity does not read", "after": identity}}
                widens = True
            elif before is None:
                difference, widens = {}, False
            else:
                difference, widens = identity_difference(before, identity)
            review: dict[str, Any] | None = None
            if widens and held:
                if keep is None:
                    shown = "; ".join(f"{key}: {json.dumps(d['before'])} -> {json.dumps(d['after'])}"
                                      for key, d in difference.items())
                    raise ConsentsToReview(
                        f"agent {agent!r} changed ({shown}) and holds standing consents for "
                        f"{', '.join(held)}: keep them (--keep-consents, keep_consents=true) or drop them "
                        "(--drop-consents, keep_consents=false)")
                review = {"difference": difference, "consents": held, "choice": "kept" if keep else "dropped"}
            result["review"] = review
            entries: list[tuple[str, dict[str, Any]]] = []
            if review is not None and not keep:
                entries += [("consent_revoked", {"agent": agent, "family": family, "by": "re-registration"})
                            for family in held]
            entries.append(("agent_identity", {
                "agent": agent, "identity": identity, "digest": digest,
                **({"difference": difference} if difference else {})}))

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                if review is not None and not keep:
                    c.execute("DELETE FROM consents WHERE agent = ?", [agent])
                c.execute("DELETE FROM agent_identities WHERE agent = ?", [agent])
                c.execute("INSERT INTO agent_identities VALUES (?, ?, ?, ?)",
                          [agent, json.dumps(identity, sort_keys=True), digest, _naive(now)])

            if review is not None:
                first, payload = "consents_review", {"agent": agent, **review}
            else:
                (first, payload), entries = entries[0], entries[1:]
            return _Change(first, payload, agent, apply, result, then=tuple(entries))

        return self._write(prepare)

    # --- developer mode -------------------------------------------------------------

    def set_developer_mode(self, enabled: bool, *, by: str) -> DeveloperMode:
        """Turn developer mode on or off (journaled ``devmode_changed`` when it changes)."""
        if not isinstance(enabled, bool):
            raise BadInput(f"enabled must be true or false, not {enabled!r}")
        by = _validate_by(by)
        now = self._now()

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            row = con.execute("SELECT enabled, changed_by, changed_at FROM developer_mode").fetchone()
            current = DeveloperMode(bool(row[0]), row[1], _utc(row[2])) if row else DeveloperMode(False)
            if current.enabled == enabled:
                return _NoChange(current)

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute("DELETE FROM developer_mode")
                c.execute("INSERT INTO developer_mode VALUES (?, ?, ?)", [enabled, by, _naive(now)])

            return _Change("devmode_changed", {"enabled": enabled, "by": by}, None, apply, DeveloperMode(enabled, by, now))

        return self._write(prepare)

    def developer_mode(self) -> bool:
        """Whether developer mode is on, as ``view()`` sees it (off when unreadable)."""
        return self.view().developer_mode

    def developer_mode_state(self) -> DeveloperMode:
        """Developer mode with who changed it last and when."""

        def work(con: "duckdb.DuckDBPyConnection") -> DeveloperMode:
            row = con.execute("SELECT enabled, changed_by, changed_at FROM developer_mode").fetchone()
            return DeveloperMode(bool(row[0]), row[1], _utc(row[2])) if row else DeveloperMode(False)

        return self._read(work, DeveloperMode(False))

    # --- pending decisions ----------------------------------------------------------

    def add_pending(
        self,
        run_id: str,
        task_id: str | None,
        agent: str,
        tool: str,
        family: Family | str | None,
        arguments: Mapping[str, Any],
        answers: Sequence[Answer | str],
        reason: str = "",
        line: int = 0,
        call_id: str | None = None,
    ) -> PendingDecision:
        """List a call of an unattended run as waiting for a person; returns it with its id."""
        (added,) = self.add_pending_many([dict(
            run_id=run_id, task_id=task_id, agent=agent, tool=tool, family=family, arguments=arguments,
            answers=answers, reason=reason, line=line, call_id=call_id)])
        if isinstance(added, ApolliaError):
            raise added
        return added

    def add_pending_many(self, calls: Sequence[Mapping[str, Any]]) -> list[PendingDecision | ApolliaError]:
        """List calls as waiting, each given by ``add_pending``'s arguments, in one transaction (one commit).

        Each gets its decision with its id, or the ``BadInput`` its arguments earn (the others are listed
        all the same). A database that cannot be read or written raises, and then none is listed."""
        results: list[PendingDecision | ApolliaError | None] = [None] * len(calls)
        rows: list[list[Any]] = []
        for i, call in enumerate(calls):
            try:
                decision, row = self._new_pending(**call)
            except ApolliaError as exc:
                results[i] = exc
                continue
            results[i] = decision
            rows.append(row)
        if not rows:
            return results  # type: ignore[return-value]

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change:
            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute(
                    f"INSERT INTO pending_decisions ({_PENDING_COLUMNS}) VALUES "
                    + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL)"] * len(rows)),
                    [value for row in rows for value in row],
                )

            return _Change(None, {}, None, apply, results, view_unchanged=True)

        return self._write(prepare)  # type: ignore[no-any-return]

    def _new_pending(self, run_id: str, task_id: str | None, agent: str, tool: str, family: Family | str | None,
                     arguments: Mapping[str, Any], answers: Sequence[Answer | str], reason: str = "",
                     line: int = 0, call_id: str | None = None) -> tuple[PendingDecision, list[Any]]:
        """A new pending decision, validated, and its row (``BadInput`` for what is not valid)."""
        if not isinstance(run_id, str) or not run_id:
            raise BadInput("run_id must be a non-empty string")
        agent = validate_agent(agent)
        tool = _validate_tool(tool)
        fam = _validate_family(family) if family is not None else None
        offered = _validate_answers(answers)
        try:
            args_json = json.dumps(dict(arguments), sort_keys=False)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"arguments must be JSON: {exc}") from None
        decision = PendingDecision(
            id="pd-" + secrets.token_hex(6), run_id=run_id, task_id=task_id, agent=agent, tool=tool,
            family=fam, arguments=json.loads(args_json), answers=offered, created_at=self._now(),
            reason=reason, line=int(line), call_id=call_id,
        )
        return decision, [decision.id, run_id, task_id, agent, tool, fam.value if fam else None, args_json,
                          json.dumps([a.value for a in offered]), _naive(decision.created_at), reason,
                          decision.line, call_id, PENDING]

    def pending(self, status: str | None = PENDING, *, run_id: str | None = None) -> list[PendingDecision]:
        """Decisions with ``status`` (None: all), oldest first, optionally of one run."""
        if status is not None and status not in (PENDING, ANSWERED, EXPIRED):
            raise BadInput(f"status must be pending, answered or expired, not {status!r}")
        where, params = [], []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        sql = f"SELECT {_PENDING_COLUMNS} FROM pending_decisions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at, id"
        return self._read(lambda con: [_row_to_pending(r) for r in con.execute(sql, params).fetchall()], [])

    def get_pending(self, decision_id: str) -> PendingDecision:
        """One decision by id; ``UnknownDecision`` if there is none."""

        def work(con: "duckdb.DuckDBPyConnection") -> PendingDecision | None:
            row = con.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending_decisions WHERE id = ?", [decision_id]
            ).fetchone()
            return _row_to_pending(row) if row else None

        found = self._read(work, None)
        if found is None:
            raise UnknownDecision(f"no pending decision has the id {decision_id!r}")
        return found

    def get_pending_many(self, decision_ids: Sequence[str]) -> dict[str, PendingDecision]:
        """The decisions of ``decision_ids`` there are, by id, read in one statement."""
        ids = sorted({d for d in decision_ids if isinstance(d, str)})
        if not ids:
            return {}
        sql = f"SELECT {_PENDING_COLUMNS} FROM pending_decisions WHERE id IN ({', '.join('?' * len(ids))})"
        return self._read(lambda con: {r[0]: _row_to_pending(r) for r in con.execute(sql, ids).fetchall()}, {})

    def answer_pending(
        self, decision_id: str, answer: Answer | str, *, by: str, reason: str | None = None
    ) -> PendingDecision:
        """Answer a waiting decision with one of its offered answers.

        ``UnknownDecision``: no such id; ``Conflict``: already answered or
        expired; ``BadAnswer``: the answer is not among the decision's answers.
        """
        (result,) = self.answer_pending_many([(decision_id, answer, by, reason)])
        if isinstance(result, ApolliaError):
            raise result
        return result

    def answer_pending_many(
        self, answers: Sequence[tuple[str, Answer | str, str, str | None]]
    ) -> list[PendingDecision | ApolliaError]:
        """Answer waiting decisions, each ``(decision_id, answer, by, reason)``, in one transaction.

        Each gets the decision as answered, or the error ``answer_pending`` raises for it (the
        others are answered all the same; the first of two answers to one decision wins). A
        database that cannot be read or written raises, and then none is answered.
        """
        now = self._now()
        results: list[PendingDecision | ApolliaError | None] = [None] * len(answers)
        wanted: list[tuple[int, str, str, str, str | None]] = []
        for i, (decision_id, answer, by, reason) in enumerate(answers):
            try:
                wanted.append((i, decision_id, _validate_by(by), getattr(answer, "value", answer), reason))
            except ApolliaError as exc:
                results[i] = exc

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            ids = sorted({w[1] for w in wanted})
            rows = con.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending_decisions WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).fetchall() if ids else []
            current = {r[0]: _row_to_pending(r) for r in rows}
            updates: list[Any] = []
            for i, decision_id, by, answer, reason in wanted:
                found = current.get(decision_id)
                if found is None:
                    results[i] = UnknownDecision(f"no pending decision has the id {decision_id!r}")
                    continue
                if found.status != PENDING:
                    results[i] = Conflict(
                        f"decision {decision_id} is already {found.status}: "
                        f"{found.answer.value if found.answer else '?'} by {found.answered_by}"
                    )
                    continue
                try:
                    chosen = Answer(answer)
                except ValueError:
                    chosen = None
                if chosen is None or chosen not in found.answers:
                    offered = ", ".join(a.value for a in found.answers)
                    results[i] = BadAnswer(f"{answer!r} is not on offer for decision {decision_id} "
                                           f"(offered: {offered})")
                    continue
                current[decision_id] = results[i] = replace(
                    found, status=ANSWERED, answer=chosen, answered_by=by, answered_at=now, answer_reason=reason
                )
                updates += [decision_id, chosen.value, by, _naive(now), reason]
            if not updates:
                return _NoChange(results)

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute(
                    "UPDATE pending_decisions AS p SET status = ?, answer = v.v_answer, answered_by = v.v_by, "
                    "answered_at = v.v_at, answer_reason = v.v_reason FROM (VALUES "
                    + ", ".join(["(?, ?, ?, ?::TIMESTAMP, ?::VARCHAR)"] * (len(updates) // 5))
                    + ") AS v(v_id, v_answer, v_by, v_at, v_reason) WHERE p.id = v.v_id AND p.status = ?",
                    [ANSWERED, *updates, PENDING],
                )

            return _Change(None, {}, None, apply, results, view_unchanged=True)

        if not wanted:
            return results  # type: ignore[return-value]
        return self._write(prepare)  # type: ignore[no-any-return]

    def expire_pending(self, timeout_hours: float, *, now: datetime | None = None) -> list[PendingDecision]:
        """Resolve to ``refuse`` every decision waiting longer than ``timeout_hours``.

        For ``[hitl] timeout_hours``; returns the decisions it expired so the
        runtime can fail their steps. Answered ``refuse`` by ``timeout``.
        """
        if not isinstance(timeout_hours, (int, float)) or timeout_hours < 0:
            raise BadInput(f"timeout_hours must be a non-negative number, not {timeout_hours!r}")
        at = _utc(now) if now is not None else self._now()
        cutoff = at - timedelta(hours=float(timeout_hours))  # type: ignore[operator]
        why = f"unanswered for {timeout_hours:g} h ([hitl] timeout_hours)"

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change | _NoChange:
            rows = con.execute(
                f"SELECT {_PENDING_COLUMNS} FROM pending_decisions WHERE status = ? AND created_at <= ? "
                "ORDER BY created_at, id",
                [PENDING, _naive(cutoff)],  # type: ignore[arg-type]  # at - timedelta is a datetime
            ).fetchall()
            expired = [
                replace(d, status=EXPIRED, answer=Answer.REFUSE, answered_by="timeout", answered_at=at, answer_reason=why)
                for d in map(_row_to_pending, rows)
            ]
            if not expired:
                return _NoChange([])

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                for d in expired:
                    c.execute(
                        "UPDATE pending_decisions SET status = ?, answer = ?, answered_by = ?, "
                        "answered_at = ?, answer_reason = ? WHERE id = ? AND status = ?",
                        [EXPIRED, Answer.REFUSE.value, "timeout", _naive(at), why, d.id, PENDING],  # type: ignore[arg-type]
                    )

            return _Change(None, {}, None, apply, expired, view_unchanged=True)

        if not self.path.exists():
            return []
        return self._write(prepare)
