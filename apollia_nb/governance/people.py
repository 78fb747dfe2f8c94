"""The people of a served home: names, roles and personal tokens, kept in ``governance.db``.

A served home has an owner token (the one ``apollia-os serve`` was started with); it is ``admin``. An
``admin`` adds people, each with one or more roles, and each gets a personal bearer token, shown once.

Why it is shaped this way:

* **Roles are a closed set.** ``runner`` (agents, tasks, chat), ``approver`` (answers, plans),
  ``rules`` (rules, consents, developer mode), ``auditor`` (read-only: journal, verify, export, SQL,
  runs), ``admin`` (people, and everything). Which route needs which role is the table of
  :mod:`apollia_nb.api.roles`.
* **Only a token's hash is kept.** A token is 32 random bytes (``secrets.token_urlsafe(32)``); its
  SHA-256 is stored. A slow password hash is for guessable secrets; a 256-bit random token cannot be
  guessed, so one SHA-256 keeps a stolen ``governance.db`` from yielding working tokens, and a lookup
  costs microseconds. Lookups compare hashes with ``hmac.compare_digest``.
* **Journal first.** Adding, revoking and rotating a person is journaled (``person_added``,
  ``person_revoked``, ``person_rotated``: the name, the roles, who did it) inside the store's
  transaction, never the token or its hash.
* **Fail closed.** A row that cannot be read (an unknown role, no hash) authenticates nobody; an
  unreadable ``governance.db`` authenticates nobody but the owner.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from apollia_nb.errors import BadInput, Conflict, NotFound
from apollia_nb.governance.store import GovernanceStore, _Change, _iso, _naive, _utc, _validate_by

if TYPE_CHECKING:
    import duckdb

__all__ = ["ROLES", "ROLE_WORDS", "Identity", "OWNER", "People", "Person", "hash_token", "login_name",
           "validate_roles"]

#: Every role, in the order the docs list them.
ROLES: tuple[str, ...] = ("runner", "approver", "rules", "auditor", "admin")
#: What each role is for, as the docs and the CLI's help say it.
ROLE_WORDS: dict[str, str] = {
    "runner": "register and stop agents, submit and cancel tasks, chat, run batches",
    "approver": "answer waiting decisions, approve or reject plans",
    "rules": "fine rules, standing consents, developer mode, the organisation policy's state",
    "auditor": "read-only: the journal, verify, export, SQL, proofs, replays, and every read of agents, runs, "
               "waiting decisions, rules, consents, developer mode, the policy and people",
    "admin": "people (add, list, revoke, rotate), and everything the other roles do",
}
_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,62}")

_PEOPLE = """CREATE TABLE IF NOT EXISTS people (
        name VARCHAR PRIMARY KEY, roles VARCHAR NOT NULL, token_hash VARCHAR NOT NULL,
        created_by VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, rotated_at TIMESTAMP,
        revoked_at TIMESTAMP)"""


@dataclass(frozen=True)
class Identity:
    """Who a request is: a person by their token, by their JupyterHub token, or the home's owner
    (``via`` ``token`` / ``hub`` / ``owner``). An identity may hold no role at all (a hub user who is no
    person of the home): every route that needs a role refuses it."""

    name: str
    roles: frozenset[str]
    via: str

    @property
    def role(self) -> str:
        """The role to record: ``admin`` when held, else the roles joined by ``+``."""
        return "admin" if "admin" in self.roles else "+".join(r for r in ROLES if r in self.roles)

    def has(self, role: str) -> bool:
        return "admin" in self.roles or role in self.roles

    def journal(self) -> dict[str, str]:
        """What the journal records of who did something."""
        return {"by": self.name, "by_role": self.role, "auth": self.via}


#: The home's owner: whoever holds the server's own token.
OWNER = Identity("owner", frozenset({"admin"}), "owner")


@dataclass(frozen=True)
class Person:
    name: str
    roles: tuple[str, ...]
    created_by: str
    created_at: datetime | None
    rotated_at: datetime | None
    revoked_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "roles": list(self.roles), "created_by": self.created_by,
                "created_at": _iso(self.created_at), "rotated_at": _iso(self.rotated_at),
                "revoked_at": _iso(self.revoked_at), "revoked": self.revoked_at is not None}


def login_name(fallback: str) -> str:
    """Who works in this process, as the journal names them: the JupyterHub user in a process a hub
    started (``$JUPYTERHUB_USER``, set by its spawner for the single-user server, its kernels and
    terminals), else the login name, else ``fallback``."""
    import getpass
    import os

    hub_user = os.environ.get("JUPYTERHUB_USER", "").strip()
    if hub_user:
        return hub_user
    try:
        return getpass.getuser() or fallback
    except Exception:  # no login name in this environment
        return fallback


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == OWNER.name:
        raise BadInput(f"a person's name is lowercase letters, digits, '_', '.', '-' (not 'owner'), not {name!r}")
    return name


def validate_roles(roles: Any) -> tuple[str, ...]:
    if isinstance(roles, str) or not isinstance(roles, Sequence) or not roles:
        raise BadInput(f"a person needs at least one role of {', '.join(ROLES)}")
    for role in roles:
        if role not in ROLES:
            raise BadInput(f"unknown role {role!r}: the roles are {', '.join(ROLES)}")
    return tuple(r for r in ROLES if r in roles)


def _row(row: tuple[Any, ...]) -> Person:
    return Person(row[0], tuple(json_roles(row[1])), row[3], _utc(row[4]), _utc(row[5]), _utc(row[6]))


def json_roles(text: Any) -> tuple[str, ...]:
    """The roles of a stored row; anything unreadable is no role at all (fail closed)."""
    if not isinstance(text, str):
        return ()
    roles = tuple(text.split(","))
    return roles if all(r in ROLES for r in roles) else ()


_COLUMNS = "name, roles, token_hash, created_by, created_at, rotated_at, revoked_at"


class People:
    """The people of the home whose governance ``store`` is given."""

    def __init__(self, store: GovernanceStore) -> None:
        self.store = store

    @staticmethod
    def _has_table(con: "duckdb.DuckDBPyConnection") -> bool:
        return "people" in GovernanceStore._tables(con)

    def list(self) -> list[Person]:
        def work(con: "duckdb.DuckDBPyConnection") -> list[Person]:
            if not self._has_table(con):
                return []
            return [_row(r) for r in con.execute(f"SELECT {_COLUMNS} FROM people ORDER BY name").fetchall()]

        return self.store._read(work, [])

    def identify(self, token: str) -> Identity | None:
        """The person whose token this is (not revoked, with readable roles), else ``None``."""
        digest = hash_token(token)

        def work(con: "duckdb.DuckDBPyConnection") -> Identity | None:
            if not self._has_table(con):
                return None
            found = None
            for name, roles, stored, revoked in con.execute(
                    "SELECT name, roles, token_hash, revoked_at FROM people").fetchall():
                if isinstance(stored, str) and hmac.compare_digest(stored.encode(), digest.encode()):
                    found = (name, roles, revoked)
            if found is None or found[2] is not None:
                return None
            roles = json_roles(found[1])
            return Identity(found[0], frozenset(roles), "token") if roles else None

        return self.store._read(work, None)

    def by_name(self, name: str, via: str) -> Identity:
        """The person named ``name`` as vouched for elsewhere (``via``, e.g. ``hub``): their roles, or no role
        at all when there is no such person, they are revoked, their row cannot be read, or ``name`` could not
        be a person's name (fail closed: a name alone never grants a role)."""
        nobody = Identity(name, frozenset(), via)
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name == OWNER.name:
            return nobody

        def work(con: "duckdb.DuckDBPyConnection") -> Identity:
            if not self._has_table(con):
                return nobody
            row = con.execute("SELECT roles, revoked_at FROM people WHERE name = ?", [name]).fetchone()
            if row is None or row[1] is not None:
                return nobody
            return Identity(name, frozenset(json_roles(row[0])), via)

        return self.store._read(work, nobody)

    def add(self, name: str, roles: Sequence[str], *, by: Identity) -> tuple[Person, str]:
        """Add a person; returns them and their token (shown once, never stored)."""
        name, roles, who = validate_name(name), validate_roles(roles), by.journal()
        _validate_by(who["by"])
        token = secrets.token_urlsafe(32)
        now = self.store._now()
        person = Person(name, roles, who["by"], now, None, None)

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change:
            con.execute(_PEOPLE)
            if con.execute("SELECT 1 FROM people WHERE name = ?", [name]).fetchone():
                raise Conflict(f"there is a person named {name!r} already (rotate their token, or revoke them)")

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute("INSERT INTO people VALUES (?, ?, ?, ?, ?, NULL, NULL)",
                          [name, ",".join(roles), hash_token(token), who["by"], _naive(now)])

            return _Change("person_added", {"name": name, "roles": list(roles), **who}, None, apply, person,
                           view_unchanged=True)

        return self.store._write(prepare), token

    def _change(self, name: str, kind: str, by: Identity, token: str | None) -> Person:
        name, who = validate_name(name), by.journal()
        now = self.store._now()

        def prepare(con: "duckdb.DuckDBPyConnection") -> _Change:
            con.execute(_PEOPLE)
            row = con.execute(f"SELECT {_COLUMNS} FROM people WHERE name = ?", [name]).fetchone()
            if row is None:
                raise NotFound(f"no person named {name!r}")
            person = _row(row)
            if person.revoked_at is not None:
                raise Conflict(f"{name!r} is revoked already")
            if token is None:
                after = Person(person.name, person.roles, person.created_by, person.created_at,
                               person.rotated_at, now)
                sql, args = "UPDATE people SET revoked_at = ? WHERE name = ?", [_naive(now), name]
            else:
                after = Person(person.name, person.roles, person.created_by, person.created_at, now, None)
                sql, args = ("UPDATE people SET token_hash = ?, rotated_at = ? WHERE name = ?",
                             [hash_token(token), _naive(now), name])

            def apply(c: "duckdb.DuckDBPyConnection") -> None:
                c.execute(sql, args)

            return _Change(kind, {"name": name, "roles": list(person.roles), **who}, None, apply, after,
                           view_unchanged=True)

        return self.store._write(prepare)

    def revoke(self, name: str, *, by: Identity) -> Person:
        """Revoke a person: their token stops working on the next request."""
        return self._change(name, "person_revoked", by, None)

    def rotate(self, name: str, *, by: Identity) -> tuple[Person, str]:
        """A new token for a person (shown once); the old one stops working on the next request."""
        token = secrets.token_urlsafe(32)
        return self._change(name, "person_rotated", by, token), token
