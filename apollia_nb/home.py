"""The home folder: where it is, what it holds, and which process owns it.

Resolution: ``--home DIR``, else ``$APOLLIA_HOME``, else ``~/.apollia``.

DuckDB lets one process hold a database file, so a home has one owner process.
Ownership is an advisory ``flock`` on ``owner.lock``; the holder writes its pid
and command line into the file so a second process can say who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from apollia_nb.errors import HomeLocked

__all__ = ["Home", "resolve_home", "OwnerLock"]


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
