"""The home folder: where it is, what it holds, and which process owns it.

Resolution: ``--home DIR``, else ``$APOLLIA_HOME``, else ``~/.apollia``.

DuckDB lets one process hold a database file, so a home has one owner process.
Ownership is an advisory ``flock`` on ``owner.lock``; the holder writes its pid
and command line into the file so a second process can say who holds it.

A database file of the home that DuckDB cannot read as it was written (a damaged
header or block, a file cut short, an empty file) is ``HOME_FILE_CORRUPT`` naming the
file and what to do (``damaged_file``), wherever it is found: when the file is
opened (``check_whole``) or by a later read (``damage_error``).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from typing import Any

from apollia_nb.errors import HomeFileCorrupt, HomeLocked

__all__ = ["Home", "resolve_home", "OwnerLock", "DATABASE_FILES", "is_damage", "damaged_file", "damage_error",
           "check_whole"]


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$APOLLIA_HOME``, else ``~/.apollia`` (absolute, not created)."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("APOLLIA_HOME")
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".apollia").resolve()


@dataclass(frozen=True)
class Home:
    """Paths inside one home. ``Home.at(...)`` resolves and creates it."""

    path: Path

    @classmethod
    def at(cls, explicit: str | os.PathLike[str] | None = None, *, create: bool = True) -> "Home":
        home = cls(resolve_home(explicit))
        if create:
            home.ensure()
        return home

    def ensure(self) -> None:
        """Create the home and its folders if missing (0700); never touches existing files."""
        for folder in (self.path, self.keys_dir, self.policy_dir):
            folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.path, self.keys_dir):
            try:
                os.chmod(folder, 0o700)
            except OSError:
                pass

    @property
    def config_path(self) -> Path:
        return self.path / "apollia.toml"

    @property
    def governance_db(self) -> Path:
        return self.path / "governance.db"

    @property
    def journal_db(self) -> Path:
        return self.path / "journal.db"

    @property
    def runtime_db(self) -> Path:
        return self.path / "runtime.db"

    @property
    def keys_dir(self) -> Path:
        return self.path / "keys"

    @property
    def policy_dir(self) -> Path:
        return self.path / "policy"

    @property
    def policy_path(self) -> Path:
        return self.policy_dir / "organisation.toml"

    @property
    def policy_sig_path(self) -> Path:
        return self.policy_dir / "organisation.toml.sig"

    @property
    def server_json(self) -> Path:
        return self.path / "server.json"

    @property
    def owner_lock_path(self) -> Path:
        return self.path / "owner.lock"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def agents_dir(self) -> Path:
        return self.path / "agents"


def _describe_holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"process {info.get('pid')} ({info.get('command', '?')}, since {info.get('since', '?')})"
    except (ValueError, AttributeError):
        return "another process"


class OwnerLock:
    """Exclusive ownership of a home for this process.

    ``OwnerLock(home).acquire()`` raises ``HomeLocked`` naming the holder when
    another process owns the home. Released on ``release()`` or process exit.
    """

    def __init__(self, home: Home) -> None:
        self.home = home
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "OwnerLock":
        if self._fd is not None:
            return self
        self.home.ensure()
        fd = os.open(self.home.owner_lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            server = ""
            if self.home.server_json.exists():
                server = " A server is running for it: connect to it (server.json) instead."
            raise HomeLocked(
                f"the home {self.home.path} is owned by {_describe_holder(holder)}.{server} "
                "Stop that process, or run `apollia-os serve` in its place so several "
                "processes can share the home, or use another --home."
            ) from None
        info = {
            "pid": os.getpid(),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200] if sys.argv else "python",
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "OwnerLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --- damaged database files ---------------------------------------------------------------------

#: The home's DuckDB files and the repair that replaces each on purpose when there is no backup.
DATABASE_FILES = {
    "journal.db": "--archive-journal",
    "runtime.db": "--new-runtime-db",
    "governance.db": "--new-governance-db",
}
#: What each file's loss costs when it is replaced (said with the repair).
_LOSS = {
    "journal.db": "the journal and its key are archived and a new chain starts, naming the old one",
    "runtime.db": "registered agents, tasks and sessions are lost",
    "governance.db": "fine rules, standing consents, developer mode and pending decisions are lost",
}
#: DuckDB's words for a file it cannot read as it was written.
_DAMAGE_WORDS = (
    "not a valid duckdb database file", "corrupt database file", "could not read enough bytes",
    "checksum", "failed to deserialize", "serialization error",
)
#: DuckDB's words for other troubles (a lock, the disk refusing a write): never called damage.
_NOT_DAMAGE_WORDS = ("could not set lock", "conflicting lock", "no space left", "read-only file system",
                     "disk quota", "permission denied")


def is_damage(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is DuckDB reporting a database file it cannot read as it
    was written: a bad header or checksum, a block past the end of a file cut short, a structure that
    does not deserialize. A lock conflict or the disk refusing a write is not damage."""
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err).__module__.split(".")[0] in ("duckdb", "_duckdb"):
            text = " ".join(str(err).split()).lower()
            if any(word in text for word in _NOT_DAMAGE_WORDS):
                return False
            if type(err).__name__ in ("SerializationException", "InternalException") or any(
                    word in text for word in _DAMAGE_WORDS):
                return True
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
    return False


def damaged_file(path: Path, problem: str, *, home: Path | None = None) -> HomeFileCorrupt:
    """``HOME_FILE_CORRUPT`` for one of the home's database files: which file, what DuckDB said, that
    nothing was changed, and what to do (restore it from a backup, else the repair that replaces it)."""
    home = home if home is not None else path.parent
    name = path.name
    repair = DATABASE_FILES.get(name)
    problem = " ".join(problem.split())[:300]
    step = f"restore {name} (and its .wal, if the backup has one) from a backup"
    if repair is not None:
        step += (f", or replace it on purpose with `apollia-os home repair {repair} --home {home}` "
                 f"({_LOSS[name]}; the damaged file is moved aside, journaled)")
    return HomeFileCorrupt(f"{path} is damaged ({problem}); nothing was changed; {step}")


def damage_error(exc: BaseException, path: Path, *, home: Path | None = None) -> HomeFileCorrupt | None:
    """``damaged_file`` for ``exc`` when it is damage (``is_damage``), else None. ``path``: the file it
    was read from; a home file named in DuckDB's message wins over it."""
    if isinstance(exc, HomeFileCorrupt):
        return exc
    if not is_damage(exc):
        return None
    text = str(exc)
    named = path
    for name in DATABASE_FILES:
        if f"/{name}\"" in text or f"/{name}'" in text:
            named = path.with_name(name)
            break
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return damaged_file(named, first, home=home)


def check_whole(con: Any, path: Path) -> None:
    """Read every block of the database behind ``con`` that holds a table's rows or a key's index
    (DuckDB checks each block's checksum as it reads it, and reads most of them only when a query
    needs them; a block past the end of a file cut short does not read either): ``HOME_FILE_CORRUPT``
    naming ``path`` when one does not read. The time it takes grows with the data (measured: about 5 ms a megabyte on one core)."""
    tables = con.execute("SELECT schema_name, table_name FROM duckdb_tables() "
                         "WHERE database_name = current_database() AND NOT temporary").fetchall()
    keys = con.execute("SELECT schema_name, table_name, constraint_column_names FROM duckdb_constraints() "
                       "WHERE database_name = current_database() "
                       "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')").fetchall()
    reads = [f"(SELECT bit_xor(hash(*COLUMNS(*))) FROM {_quoted(schema, table)})" for schema, table in tables]
    for schema, table, columns in keys:  # every key looked up through its index: the index read whole
        cols = ", ".join(_quoted(c) for c in columns)
        reads.append(f"(SELECT count(*) FROM {_quoted(schema, table)} "
                     f"WHERE ({cols}) IN (SELECT ({cols}) FROM {_quoted(schema, table)}))")
    if not reads:
        return
    try:  # one statement: each of ~20 statements cost about 1 ms of CPU when a kernel opens its home
        con.execute("SELECT " + ", ".join(reads)).fetchall()
    except Exception as exc:
        error = damage_error(exc, path)
        if error is None:
            raise
        raise error from None


def _quoted(*parts: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)
