"""Where the home a command works on lives, chosen once: ``open_home(args)``.

A home has one owner process. A command opens its home once, here, and then only
talks to what it got:

* ``OwnedHome``: nothing serves the home, so the command owns it for as long as it
  needs it (the owner lock; another owner is ``HOME_LOCKED`` naming it);
* ``ServedHome``: ``apollia-os serve`` owns it (its ``server.json`` names the lock's
  holder, alive, answering ``/health`` with this home's journal key), so the command
  is a client of that server and prints what it prints without a server.

Both give the same faces (``HomeBackend``): ``runtime()`` for the home's agents,
tasks, waiting decisions and batches (``runtime/served.py``, ``HomeRuntime``: the owner's ``Runtime`` in
this process, or the server's over its REST API, where a task then runs);
``journal()``, ``verify()``, ``verifier()`` and ``export()`` for the journal (a
served journal is verified here, under the home's own key, a page of entries at a
time; proofs are made by the server and checked here); ``governance()`` and
``policy_state()``; ``push_witnesses()``; ``exclusive()`` for what needs the home's
files to itself (``home repair``, ``policy remove``). A served home cannot lend its
files: that answer, ``HOME_LOCKED`` naming the server and how to stop it, is given
here and nowhere else.

A ``server.json`` left by a server that stopped is ``SERVER_NOT_RUNNING`` when another
live process holds the home (the command could not own it either); when nothing
holds it, the command owns the home. A read-only command on a home a Jupyter kernel
owns says which kernel, and how to audit that home.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apollia_nb.errors import BadInput, HomeLocked, NotFound
from apollia_nb.runtime.served import (
    WAIT_SECS,
    HomeRuntime,
    Progress,
    ServedRuntime,
    absolute_workspace,
    settled_counts,
)

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.home import Home
    from apollia_nb.runtime.remote import RemoteHome, ServerAddress
    from apollia_nb.runtime import Runtime

__all__ = ["open_home", "HomeBackend", "HomeRuntime", "OwnedHome", "ServedHome", "kernel_owner",
           "absolute_workspace"]

#: How long a served task whose answered decision has not resumed yet waits before it is asked again.
POLL_SECS = 0.2
#: How often a batch's progress is looked at.
PROGRESS_SECS = 0.2
#: How long `witness push` on a served home waits for the server's sender to reach every witness.
SERVED_WAIT_SECS = 10.0

class HomeBackend(Protocol):
    """One home, owned by this command or served by `apollia-os serve`: the faces every command uses."""

    home: "Home"

    def runtime(self) -> contextlib.AbstractContextManager[HomeRuntime]: ...
    def journal(self) -> contextlib.AbstractContextManager[Any]: ...
    def verify(self, external: str | None, *, witnessed: bool) -> tuple[Any, tuple[Any, Any] | None]: ...
    def verifier(self) -> Any: ...
    def export(self, directory: Path, *, allow_invalid: bool) -> tuple[Any, Any]: ...
    def governance(self, *, write: bool = False,
                   alone: str | None = None) -> contextlib.AbstractContextManager[Any]: ...
    def policy_state(self) -> tuple[Any, bool]: ...
    def push_witnesses(self, witnesses: Any, *, checkpoint: bool) -> list[dict[str, Any]]: ...
    def exclusive(self, what: str) -> contextlib.AbstractContextManager[None]: ...
    def dask_batch(self, manifest: Path, items: list[dict[str, Any]], *, progress: Progress,
                   **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


# --- choosing ------------------------------------------------------------------------------------------


def _home(args: argparse.Namespace) -> "Home":
    from apollia_nb.home import Home

    return Home.at(args.home, create=False)


def _server_of(home: "Home") -> "ServerAddress | None":
    """The ``apollia-os serve`` that owns ``home``, or None when none does."""
    from apollia_nb.errors import ServerNotRunning
    from apollia_nb.runtime.remote import _alive, _read_json, find_server

    if not home.server_json.exists():
        return None
    try:
        address = find_server(home, HomeLocked("no server"))
    except ServerNotRunning:
        holder = _read_json(home.owner_lock_path) or {}
        pid = holder.get("pid")
        if isinstance(pid, int) and _alive(pid) and kernel_owner(home) is None:  # a kernel's: says which, and how
            raise
        return None
    except HomeLocked:  # not advertised: the command owns the home, and says who holds it if another does
        return None
    return address  # its token is the person's own when there is one (``wire.http.client_token``)


@contextlib.contextmanager
def open_home(args: argparse.Namespace, *, reading: bool = False) -> Iterator[HomeBackend]:
    """The command's home, chosen once: served by `apollia-os serve`, else owned by this command.

    ``reading``: the command only reads; on a home a Jupyter kernel owns, its ``HOME_LOCKED`` says which
    kernel and how to audit that home."""
    home = _home(args)
    address = _server_of(home)
    if address is not None:
        served = ServedHome(home, address)
        try:
            yield served
        finally:
            served.close()
        return
    try:
        yield OwnedHome(home)
    except HomeLocked as exc:
        better = kernel_locked(home, _command_words(args)) if reading else None
        if better is None:
            raise
        raise better from exc


def _command_words(args: argparse.Namespace) -> str:
    action = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {action}" if action else str(args.command)


# --- a home this command owns ----------------------------------------------------------------------------


class OwnedHome:
    """The home's files, opened by this process for the command's duration."""

    def __init__(self, home: "Home") -> None:
        self.home = home

    @contextlib.contextmanager
    def runtime(self) -> Iterator[HomeRuntime]:
        rt = OwnedRuntime(self.home)
        try:
            yield rt
        finally:
            rt.close()

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        from apollia_nb.home import OwnerLock

        with OwnerLock(self.home):
            yield

    @contextlib.contextmanager
    def journal(self) -> Iterator[Any]:
        from apollia_nb.home import OwnerLock
        from apollia_nb.journal.store import Journal

        if not self.home.journal_db.exists():
            raise NotFound(f"no journal at {self.home.journal_db}")
        with OwnerLock(self.home):
            journal = Journal.open(self.home, create=False)
            try:
                yield journal
            finally:
                journal.close()

    def verify(self, external: str | None, *, witnessed: bool) -> tuple[Any, tuple[Any, Any] | None]:
        from apollia_nb.journal.verify import cosigned_rows_of_file, verify_home

        report = verify_home(self.home, external=external)
        return report, (cosigned_rows_of_file(self.home.journal_db) if witnessed else None)

    def verifier(self) -> Any:
        """The log's verifier: its origin (from ``journal.db``, read-only) and the home's public key."""
        from apollia_nb.errors import IntegrityError
        from apollia_nb.journal.checkpoint import NoteVerifier
        from apollia_nb.journal.keys import load_public_key
        from apollia_nb.journal.store import connect_locked

        if not self.home.journal_db.exists():
            raise NotFound(f"no journal at {self.home.journal_db}")
        con = connect_locked(self.home.journal_db, read_only=True)
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()
        finally:
            con.close()
        if row is None:
            raise IntegrityError(f"{self.home.journal_db} has no origin in its meta table")
        return NoteVerifier(row[0], load_public_key(self.home))

    def export(self, directory: Path, *, allow_invalid: bool) -> tuple[Any, Any]:
        from apollia_nb.journal.export import export_home
        from apollia_nb.journal.verify import verify_home

        report = verify_home(self.home)
        if not report.ok and not allow_invalid:
            return report, None
        return report, export_home(self.home, directory, invalid=None if report.ok else report.to_dict())

    @contextlib.contextmanager
    def governance(self, *, write: bool = False, alone: str | None = None) -> Iterator[Any]:
        """A store for reading (it creates nothing, and expects what the journal records), or, with
        ``write``, one on the home this command owns, journaling each change before it takes effect."""
        from apollia_nb.governance.store import GovernanceStore  # lazy: DuckDB, ~0.8 s

        if not write:
            record = _history(self.home)
            if record is None:
                yield GovernanceStore(self.home)
            else:
                yield GovernanceStore(self.home, expect_db=record.governance_db, expect_db_id=record.governance_id,
                                      expect_policy=record.policy)
            return
        from apollia_nb.home import Home, OwnerLock
        from apollia_nb.journal import Journal

        home = Home.at(self.home.path)  # a change may make the home
        with OwnerLock(home):
            journal = Journal.open(home)
            try:
                yield GovernanceStore.open(home, journal)
            finally:
                journal.close()

    def policy_state(self) -> tuple[Any, bool]:
        """The policy deposited, and whether what the home has had could be checked (its journal read)."""
        from apollia_nb.governance.policy import load_policy

        record = _history(self.home)
        return load_policy(self.home, expected=record is not None and record.policy), record is not None

    def push_witnesses(self, witnesses: Any, *, checkpoint: bool) -> list[dict[str, Any]]:
        from apollia_nb.journal.witness_sender import CosignSender

        with self.journal() as journal:
            if checkpoint:
                journal.checkpoint()
            return list(CosignSender(journal, witnesses).push())

    def dask_batch(self, manifest: Path, items: list[dict[str, Any]], *, progress: Progress,
                   **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        raise BadInput("--engine dask needs the home served by `apollia-os serve` (its workers are "
                       "clients of that server): start it, then run the batch again")


def _history(home: "Home") -> Any:
    """What the journal records the home has had (None: the journal is held by its owner)."""
    from apollia_nb.journal.accounting import read_home_record_offline  # lazy: DuckDB, ~0.8 s

    return read_home_record_offline(home)


class OwnedRuntime:
    """The home's ``Runtime``, owned by this process, on an event loop of its own (a thread): the command
    waits on it here, and Ctrl+C in this thread stops the wait at once."""

    outlives_command = False

    def __init__(self, home: "Home") -> None:
        import functools

        from anyio.from_thread import start_blocking_portal

        from apollia_nb.federation import open_sources
        from apollia_nb.runtime import Runtime

        self._cm = start_blocking_portal()
        self._portal = self._cm.__enter__()
        try:
            self.rt: Runtime = self._call(functools.partial(Runtime.open, home, tool_sources=open_sources))
            if self.rt.mode == "client":  # a server started meanwhile: its agents are not this process's
                self._call(self.rt.aclose)
                raise HomeLocked(f"the home {home.path} is now served by `apollia-os serve`: run the command again")
        except BaseException:
            self._cm.__exit__(None, None, None)
            raise

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the runtime's loop (awaited when it is a coroutine), this thread waiting."""
        future = self._portal.start_task_soon(fn, *args)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # Ctrl+C: the wait ends here; what it waited for goes on in the runtime
            raise

    def close(self) -> None:
        try:
            self._call(self.rt.aclose)
        finally:
            self._cm.__exit__(None, None, None)

    def agents(self) -> list[dict[str, Any]]:
        return self._call(lambda: [a.to_dict() for a in self.rt.agents()])

    def register_agent(self, file: Path, manifest: Any, keep: bool | None) -> dict[str, Any]:
        async def register() -> dict[str, Any]:
            return (await self.rt.register_agent(manifest, keep_consents=keep)).to_dict()

        return self._call(register)

    def stop_agent(self, name: str) -> dict[str, Any]:
        async def stop() -> dict[str, Any]:
            return (await self.rt.stop_agent(name)).to_dict()

        return self._call(stop)

    def submit(self, agent: str, goal: str, *, watched: bool, max_steps: int | None,
               approve_plan: bool) -> dict[str, Any]:
        async def submit() -> dict[str, Any]:
            handle = await self.rt.submit(agent, goal, max_steps=max_steps, watched=watched,
                                          approve_plan=approve_plan)
            return handle.to_dict()

        return self._call(submit)

    def settle(self, task_id: str) -> dict[str, Any]:
        async def settle() -> dict[str, Any]:
            handle = self.rt.task(task_id)
            while True:
                await handle.settled()
                await self.rt.committed()  # what is shown is in runtime.db: a restart finds the task as shown
                task = handle.to_dict()
                if task["status"] not in ("pending", "running"):  # it may have resumed meanwhile
                    return task

        return self._call(settle)

    def task(self, task_id: str) -> dict[str, Any]:
        return self._call(lambda: self.rt.task(task_id).to_dict())

    def pending(self) -> list[dict[str, Any]]:
        return self._call(self.rt.pending_decisions)

    def decide(self, decision_id: str, answer: str, *, reason: str | None, by: str,
               values: dict[str, Any] | None = None, lasting: str | None = None,
               terms: dict[str, Any] | None = None) -> dict[str, Any]:
        """``terms``: what binds the answer (``digest``, ``expires_in``, ``expires_at``), when given."""
        extra: dict[str, Any] = {**(terms or {}), **({"values": values} if values is not None else {})}
        if lasting is not None:
            extra["lasting"] = lasting
        return self._call(lambda: self.rt.answer(decision_id, answer, by=by, reason=reason, **extra))

    def approve_plan(self, task_id: str) -> None:
        self._call(self.rt.approve_plan, task_id)

    def reject_plan(self, task_id: str, reason: str) -> None:
        self._call(self.rt.reject_plan, task_id, reason)

    def leave(self, task_id: str) -> dict[str, Any]:
        """Nobody answers at the terminal any more: the task goes on unattended, its decision left pending."""
        import anyio

        async def leave() -> dict[str, Any]:
            handle = self.rt.task(task_id)
            with anyio.CancelScope(shield=True):
                await handle.unwatch()
                await self.rt.committed()  # the suspended task is in runtime.db before it is said to be pending
            return handle.to_dict()

        return self._call(leave)

    def goals(self, task_ids: set[str]) -> dict[str, str]:
        def goals() -> dict[str, str]:
            found: dict[str, str] = {}
            for task_id in sorted(task_ids):
                record = self.rt.records.task(task_id)
                if record and isinstance(record.get("goal"), str):
                    found[task_id] = record["goal"]
            return found

        return self._call(goals)

    def runs(self) -> list[dict[str, Any]]:
        from apollia_nb.journal.views import list_runs

        return self._call(list_runs, self.rt.journal)

    def batch(self, agent: str, items: list[dict[str, Any]], *, goal: str, concurrency: int,
              max_steps: int | None, key: str | None,
              progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async def run() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            handle = await self.rt.batch(agent, items, goal=goal, concurrency=concurrency, max_steps=max_steps,
                                         key=key)
            return await follow_batch(self.rt, handle, progress)

        return self._call(run)


async def follow_batch(rt: "Runtime", handle: Any, progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Show the progress until no item is pending or running; then the rows and the batch, as stored."""
    import anyio

    while not settled_counts(handle.counts()) and handle.status == "running":
        progress(handle.counts(), len(handle.task_ids))
        with anyio.move_on_after(PROGRESS_SECS):
            await handle
    await rt.committed()  # the results written are what runtime.db holds
    return handle.rows(), handle.to_dict()


# --- a home `apollia-os serve` owns ----------------------------------------------------------------------


class ServedHome:
    """The home through the server that owns it: its REST API and the remote stores of client mode."""

    def __init__(self, home: "Home", address: "ServerAddress") -> None:
        self.home = home
        self.address = address
        self._remote: RemoteHome | None = None

    @property
    def remote(self) -> "RemoteHome":
        if self._remote is None:
            from apollia_nb.runtime.remote import RemoteHome

            self._remote = RemoteHome(self.home, self.address)
        return self._remote

    def close(self) -> None:
        if self._remote is not None:
            self._remote.close()

    def _refuse(self, what: str) -> HomeLocked:
        """The one answer for what needs the home's files to itself while the server owns them."""
        return HomeLocked(
            f"{what} needs the home {self.home.path} to itself and `apollia-os serve` owns it ({self.address.url}, "
            f"process {self.address.pid}): stop the server (Ctrl+C where it runs, or `kill {self.address.pid}`), "
            "then run it again")

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        raise self._refuse(what)
        yield  # pragma: no cover - a generator, for the context manager

    @contextlib.contextmanager
    def runtime(self) -> Iterator[HomeRuntime]:
        from apollia_nb.runtime.remote import ServerApi

        api = ServerApi(self.address, timeout=WAIT_SECS + 30, home=self.home)
        try:
            yield ServedRuntime(api, journal=lambda: self.remote.journal)
        finally:
            api.close()

    @contextlib.contextmanager
    def journal(self) -> Iterator[Any]:
        yield self.remote.journal

    def verify(self, external: str | None, *, witnessed: bool) -> tuple[Any, tuple[Any, Any] | None]:
        journal = self.remote.journal
        checkpoints = journal.checkpoints() if witnessed else []  # before: none beyond the report
        report = journal.verify_paged(external)  # here, under the home's key, a page of entries at a time
        if not witnessed:
            return report, None
        return report, (checkpoints, [(size, line) for size, _w, _t, line in journal.cosignatures()])

    def verifier(self) -> Any:
        return self.remote.journal.verifier()  # checked against the home's key

    def export(self, directory: Path, *, allow_invalid: bool) -> tuple[Any, Any]:
        """The server verifies in place; the entries it verified are then read here a page at a time."""
        from apollia_nb.journal.export import export_streamed

        journal = self.remote.journal
        checkpoints = journal.checkpoints()
        report = journal.verify_in_place()
        if not report.ok and not allow_invalid:
            return report, None
        return report, export_streamed(journal, directory, checkpoints=checkpoints,
                                       size=report.entries if report.ok else journal.head()[0],
                                       invalid=None if report.ok else report.to_dict())

    @contextlib.contextmanager
    def governance(self, *, write: bool = False, alone: str | None = None) -> Iterator[Any]:
        if alone is not None:
            raise self._refuse(alone)
        yield self.remote.governance  # a change is journaled and stored by the server

    def policy_state(self) -> tuple[Any, bool]:
        return self.remote.governance.policy_state(), True  # what the home has had is in the server's journal

    def push_witnesses(self, witnesses: Any, *, checkpoint: bool) -> list[dict[str, Any]]:
        """The server's own sender sends them: wait (a little) and say where each stands."""
        from apollia_nb.runtime.remote import ServerApi

        if checkpoint:
            self.remote.journal.checkpoint()
        api = ServerApi(self.address, timeout=30, home=self.home)
        try:
            deadline = time.monotonic() + SERVED_WAIT_SECS
            while True:
                status = api("verify").get("witnesses") or []
                if not any(w["pending"] for w in status) or time.monotonic() > deadline:
                    return list(status)
                time.sleep(0.2)
        finally:
            api.close()

    def dask_batch(self, manifest: Path, items: list[dict[str, Any]], *, progress: Progress,
                   **kw: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """This process is a client of the server; the agent's manifest is registered here and travels to
        the workers, which run the items as clients of the same server."""
        import anyio

        from apollia_nb.federation import open_sources
        from apollia_nb.runtime import Runtime

        async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            async with Runtime(self.home, tool_sources=open_sources) as rt:
                if rt.mode != "client":  # the server stopped meanwhile
                    raise self.remote.not_running("the batch could not be sent to its workers")
                agent = await rt.register_agent(manifest, cwd=Path.cwd())
                handle = await rt.batch(agent.name, items, engine="dask", **kw)
                return await follow_batch(rt, handle, progress)

        return anyio.run(main)


# --- a home a Jupyter kernel owns ------------------------------------------------------------------------

_CONNECTION_FILE = re.compile(r"(?:^|\s)--?f(?:=|\s+)(\S+\.json)\b")


def kernel_owner(home: "Home") -> dict[str, Any] | None:
    """``{"pid", "connection_file", "since"}`` when the process that owns ``home`` (``owner.lock``) is a
    Jupyter kernel, else None. The connection file is None when its command line does not name one."""
    from apollia_nb.runtime.remote import _alive, _read_json

    holder = _read_json(home.owner_lock_path)
    if not holder or not isinstance(holder.get("pid"), int) or not _alive(holder["pid"]):
        return None
    command = str(holder.get("command", ""))
    found = _CONNECTION_FILE.search(command)
    if "kernel" not in command or ("ipykernel" not in command and found is None):
        return None
    return {"pid": holder["pid"], "connection_file": found.group(1) if found else None,
            "since": holder.get("since")}


def kernel_locked(home: "Home", command: str) -> HomeLocked | None:
    """``HOME_LOCKED`` for a read-only command on a home a kernel owns: which kernel, and how to audit."""
    kernel = kernel_owner(home)
    if kernel is None:
        return None
    where = f", connection file {kernel['connection_file']}" if kernel["connection_file"] else ""
    return HomeLocked(
        f"`apollia-os {command}` cannot read the home {home.path}: a Jupyter kernel owns it (process "
        f"{kernel['pid']}{where}, since {kernel['since'] or '?'}), and its databases open in one process at a "
        "time. To audit it now, from that notebook: `%apollia verify` checks the journal, and "
        "`from apollia_nb.notebook import kernel_runtime; from apollia_nb.journal.export import export_journal; "
        "export_journal(kernel_runtime().rt.journal, 'bundle')` writes a bundle to audit here (`apollia-os audit "
        "verify --bundle bundle`). Or shut that kernel down and run the command again. To audit a home while "
        "kernels use it, start `apollia-os serve` for it before the kernels: they become its clients and "
        "every command here works through the server."
    )
