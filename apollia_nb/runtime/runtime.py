"""``Runtime``: the object model every surface drives (notebook, REST API, CLI, plain Python).

One ``Runtime`` owns one home: the owner lock, the journal, the governance
store, ``runtime.db``. Runs are background tasks owned by the runtime's task
group; a submission returns a ``TaskHandle`` at once. Use it as::

    async with Runtime(home) as rt:
        agent = await rt.register_agent(MANIFEST)
        handle = await rt.submit("clerk", "Write the summary")
        for card in handle.pending: card.answer("once")
        task = await handle

or, where no ``async with`` can span the session (a notebook kernel),
``rt = await Runtime.open(home)`` … ``await rt.aclose()``. ``Runtime.blocking()``
gives a small synchronous facade over a private event loop.
"""

from __future__ import annotations

import asyncio
import json
import datetime as _dt
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import anyio

from apollia_nb import faults
from apollia_nb.errors import (
    AgentUnavailable,
    ApolliaError,
    BadAnswer,
    BadInput,
    Conflict,
    Expired,
    Forbidden,
    GovernanceUnreadable,
    HomeLocked,
    Interrupted,
    OutcomeUnknown,
    StaleApproval,
    StorageError,
    UnknownAgent,
    UnknownDecision,
    UnknownTask,
)
from apollia_nb.governance.acting import ACTING
from apollia_nb.governance.approvals import local_person
from apollia_nb.home import Home, OwnerLock
from apollia_nb.runtime.acknowledged import journal_submitted, rebuild_lost_tasks
from apollia_nb.runtime.agents import Agent, custom_tools, install_packages, new_state, startup_failure
from apollia_nb.runtime.cards import QUESTION, Card
from apollia_nb.runtime.events import Events
from apollia_nb.runtime.states import ProcessState, TaskPhase, TaskStatus
from apollia_nb.runtime.tasks import TaskRecord, TaskRun, recovery, task_json

if TYPE_CHECKING:  # pragma: no cover
    from concurrent.futures import Future

    from apollia_nb.governance.contract import GovernanceFace
    from apollia_nb.governance.store import GovernanceStore
    from apollia_nb.journal.contract import JournalFace
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime.capabilities import RecordsFace
    from apollia_nb.runtime.records import RuntimeRecords

__all__ = ["Runtime", "TaskHandle"]


def _open_if_present(home: Home) -> "RuntimeRecords | None":
    """``runtime.db`` opened when it exists and opens; None otherwise (nothing is created here)."""
    from apollia_nb.runtime.records import open_records

    if not home.runtime_db.exists():
        return None
    try:
        return open_records(home)
    except ApolliaError:  # damaged or refused: ``open_records`` raises it again where the home expects it
        return None


def _utc_iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


#: Finished tasks kept in memory, most recent last, so a read right after the end needs no query.
#: Older ones are read back from ``runtime.db``: memory does not grow with the tasks a runtime ran.
FINISHED_KEPT = 256


class _Ask(NamedTuple):
    """An answer given to a waiting decision, to record (``Runtime._record_answers``)."""

    decision_id: str
    answer: str
    by: str
    reason: str | None
    values: dict[str, Any] | None
    actor: tuple[str, str, str] | None = None  # (by, role, auth) of the REST request that gave it (``ACTING``)
    digest: str | None = None  # the digest of the card as its answerer saw it (``governance/approvals.py``)
    expires_in: Any = None  # the approval's lifetime in seconds, or
    expires_at: Any = None  # its end (ISO 8601)
    lasting: str | None = None  # how long the standing consent of an ``always`` lasts ("8h"; None: until revoked)
    after: Any = None  # a commit under way, awaited before the answer is journaled (a REST request's key taken)


async def _committed_before(after: Future[None] | None, done: asyncio.Future[Any]) -> bool:
    """Whether what an answer waits on (``_Ask.after``) is committed; when it failed, the answer's waiter
    is told its error (nothing of the answer is recorded)."""
    if after is None:
        return True
    try:
        await asyncio.wrap_future(after)
    except Exception as exc:  # noqa: BLE001 - the waiter hears it: its answer was refused
        if not done.done():
            done.set_exception(exc)
        return False
    faults.point("answer.after_key")  # its key committed, the answer not yet journaled
    return True


class _Finished:
    """A finished task as ``runtime.db`` recorded it: what a ``TaskHandle`` reads, nothing runs."""

    _active = False

    def __init__(self, record: TaskRecord) -> None:
        self.r = record
        self.id = record.id
        self.done = _SetEvent()

    @property
    def status(self) -> str:
        return self.r.shown_status


class _SetEvent:
    """An event that has happened (usable outside an event loop, unlike ``anyio.Event``)."""

    def is_set(self) -> bool:
        return True

    async def wait(self) -> None:
        return None


class TaskHandle:
    """A submitted task: ``await handle`` returns it finished; ``.status``, ``.pending``, ``.to_dict()``.

    A handle holds its run: it reads the same task after the runtime has let go of it."""

    def __init__(self, rt: "Runtime", task_id: str, run: "TaskRun | _Finished | None" = None) -> None:
        self._rt = rt
        self.id = task_id
        self._held = run if run is not None else rt._runs[task_id]

    @property
    def _run(self) -> Any:
        return self._held

    @property
    def record(self) -> dict[str, Any]:
        """The task's record as ``runtime.db`` stores it (a copy: it changes through the runtime only)."""
        return self._run.r.to_json()

    @property
    def status(self) -> str:
        return self._run.status

    @property
    def run_id(self) -> str:
        return self._run.r.run_id

    @property
    def error(self) -> dict[str, str] | None:
        return self._run.r.error

    @property
    def result(self) -> Any:
        return self._run.r.result

    @property
    def pending(self) -> list[Card]:
        """This task's waiting cards, each answerable with ``card.answer(...)``."""
        return [c for c in self._rt._cards.values() if c.task_id == self.id and c.waiting]

    @property
    def awaiting_plan_approval(self) -> bool:
        return self._run.r.awaiting_plan_approval

    def approve_plan(self, steps: list[str] | None = None, *, by: str | None = None,
                     digest: str | None = None) -> None:
        self._rt.approve_plan(self.id, steps, by=by, digest=digest)

    def reject_plan(self, reason: str, *, by: str | None = None) -> None:
        self._rt.reject_plan(self.id, reason, by=by)

    def to_dict(self) -> dict[str, Any]:
        return task_json(self._run.r)

    async def wait(self) -> "TaskHandle":
        """Until the task is completed, failed or cancelled."""
        await self._run.done.wait()
        return self

    async def settled(self) -> "TaskHandle":
        """Until the task is finished or waiting on a person."""
        run = self._run
        while not (run.done.is_set() or self._parked()):
            await self._rt.events.changed(self.id).wait()
        return self

    async def unwatch(self) -> "TaskHandle":
        """Nobody watches this task any more: it goes on as an unattended one.

        A run waiting on a person suspends at once, its decision left pending
        (answered later with ``Runtime.answer`` or ``apollia-os pending decide``,
        also after a restart); otherwise the next call that would ask suspends it."""
        run = self._run
        if run.r.watched and not run.done.is_set():
            run.r.watched = False
            run._save()
            waiting = [c for c in self.pending]
            for card in waiting:
                card._release()
            if waiting:
                await self.settled()
        return self

    def _parked(self) -> bool:
        """Waiting on a person right now: a card or the plan is open (watched), or the run is suspended."""
        run = self._run
        if self.status != "waiting":
            return False
        if not run.r.watched:
            return not run._active
        return bool(self.pending) or self.awaiting_plan_approval

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def __repr__(self) -> str:
        budget = self._run.r.budget
        return f"<Task {self.id} {self._run.r.agent} {self.status} steps {budget.used}/{budget.ceiling}>"


class Runtime:
    """Owns a home and runs governed agents in it."""

    # The two homes behind one contract (docs/architecture.md): the owner's stores and a client's
    # remote stores are both assigned here, and the type checker holds each to its face.
    journal: "JournalFace"
    governance: "GovernanceFace"
    records: "RecordsFace"

    def __init__(
        self,
        home: Home | str | Path | None = None,
        *,
        clock: Callable[[], float] = time.time,
        suspend_unattended: bool = True,
        chat_card_timeout: float | None = None,
        namespace: Callable[[], Any] | None = None,
        server: Any = None,
        tool_sources: Callable[["Runtime"], Sequence[Any]] | None = None,
    ) -> None:
        self.home = home if isinstance(home, Home) else Home.at(home)
        # What opens the tool sources apollia.toml names ([mcp.servers], [hosts]): handed in by the surface
        # that opens the runtime (``apollia_nb.federation.open_sources``), which lives above the runtime.
        self._open_tool_sources = tool_sources
        # A ServerAddress: be a client of that server without looking for it in the home (a batch's
        # worker on a Dask cluster, runtime/dask_engine.py, whose home holds only the journal's public key).
        self._server_given = server
        self.namespace = namespace  # the kernel's user namespace: enables the notebook_* built-ins
        self.clock = clock
        self.suspend_unattended = suspend_unattended
        self.chat_card_timeout = chat_card_timeout  # None: the fixed five minutes
        self._lock = OwnerLock(self.home)
        self._agents: dict[str, Agent] = {}
        self._identities: dict[str, dict[str, Any]] = {}  # what each agent here was registered as (review_identity)
        self._registering: set[str] = set()  # names a registration is under way for (register_agent)
        self._runs: dict[str, TaskRun] = {}  # tasks not finished (running, waiting, suspended)
        self._finished: OrderedDict[str, TaskRun] = OrderedDict()  # the last FINISHED_KEPT finished
        self._cards: dict[str, Card] = {}
        #: Answers journaled that governance.db did not store (a storage fault between the two), by decision:
        #: the journal is the record, so answering one again stores it and never journals a second answer.
        self._unstored_answers: dict[str, dict[str, Any]] = {}
        #: Approvals given so far to decisions that need several people (``approvers``), by decision: each
        #: ``{"by", ...}`` as journaled (``approval``); a restart reads them back from the journal.
        self._approvals: dict[str, list[dict[str, Any]]] = {}
        self._starters: dict[str, str] = {}  # a client's run → who opened it ("": nobody named), ``_run_starter``
        # Answers are recorded one group at a time (``_record_answers``), from the loop or from a thread.
        self._answers_lock = threading.RLock()
        self._asks: list[tuple[_Ask, asyncio.Future[dict[str, Any]]]] = []  # ``answer_async``: not yet taken
        self._unstored: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []  # ``open_card_async``: not yet taken
        self._storing = False  # a group of pending decisions is being stored off the loop
        self._asked: set[str] = set()  # decisions of the group being recorded off the loop
        self._asks_idle: anyio.Event | None = None  # set when that group is delivered
        self.batch_handles: dict[str, Any] = {}  # runtime/batch.py: this process's batches, by id
        self._recovered: list[TaskRun] = []  # runs a restart started or resumed (drained on close)
        self._tg: Any = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopped = anyio.Event()
        #: What happens here, told to whoever listens; who waits for a task to change.
        self.events = Events()
        self.sessions: Any = None
        self.tool_sources: list[Any] = []
        self.witnesses: Any = None  # journal.witness_sender.CosignSender when apollia.toml names witnesses
        self.telemetry: Any = None  # runtime.telemetry.TelemetryExporter when [telemetry] enabled = true
        self.opened = False

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "Runtime":
        self._cm = anyio.create_task_group()
        self._tg = await self._cm.__aenter__()
        try:
            await self._boot()
        except BaseException:
            self._tg.cancel_scope.cancel()
            await self._cm.__aexit__(None, None, None)
            self._shutdown_files()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._stop_everything()
            self._tg.cancel_scope.cancel()
            await self._cm.__aexit__(None, None, None)
        finally:
            self._shutdown_files()

    @classmethod
    async def open(cls, home: Home | str | Path | None = None, **kwargs: Any) -> "Runtime":
        """Open for a long-lived event loop (a kernel): runs are owned by a supervisor task."""
        rt = cls(home, **kwargs)
        ready = anyio.Event()
        failure: list[BaseException] = []

        async def supervise() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    rt._tg = tg
                    try:
                        await rt._boot()
                    except BaseException as exc:
                        failure.append(exc)
                        ready.set()
                        raise
                    ready.set()
                    await rt._stopped.wait()
                    tg.cancel_scope.cancel()
            finally:
                rt._shutdown_files()

        rt._supervisor = asyncio.get_running_loop().create_task(supervise())
        await ready.wait()
        if failure:
            try:
                await rt._supervisor
            except BaseException:
                pass
            raise failure[0]
        return rt

    async def aclose(self) -> None:
        if self._supervisor is None:
            raise RuntimeError("use `async with Runtime(...)` or close through its context")
        await self._stop_everything()
        self._stopped.set()
        try:
            await self._supervisor
        except asyncio.CancelledError:
            pass

    async def _boot(self) -> None:
        from apollia_nb.config import load_config
        from apollia_nb.governance.store import GovernanceStore
        from apollia_nb.journal.store import Journal
        from apollia_nb.runtime.breaker import Breakers
        from apollia_nb.journal.accounting import FILE_CREATED, HomeFacts, check_runtime_db, read_home_facts
        from apollia_nb.runtime.records import RuntimeRecords, open_records

        self.mode = "owner"
        server = self._server_given
        try:
            if server is None:
                self._lock.acquire()
        except HomeLocked as locked:  # owned: by `apollia-os serve` (become its client) or HOME_LOCKED
            from apollia_nb.runtime.remote import find_server

            server = find_server(self.home, locked)
        except OSError as exc:  # the owner lock cannot be written: a full or read-only disk
            from apollia_nb.dbutil import storage_error

            raise storage_error(exc, f"the home {self.home.path} could not be opened") or exc from exc
        self.config = load_config(self.home.config_path)
        if server is not None:  # docs/shared-home.md
            from apollia_nb.runtime.remote import RemoteHome

            self._remote = RemoteHome(self.home, server)
            self.mode = "client"
            self.journal, self.governance = self._remote.journal, self._remote.governance
            self.records = RuntimeRecords(Path(":memory:"))  # this process's agents, tasks and sessions only
        else:
            # The home's files are accounted for by its journal (journal/accounting.py): a key that
            # is not the journal's, or a runtime.db it records that is gone or damaged, stops here.
            self.journal = Journal.open(self.home)
            records: RuntimeRecords | None = None
            try:
                # runtime.db keeps the facts the home record was last read from: only the entries
                # after them are read (a missing or damaged runtime.db is reported below, as always).
                records = _open_if_present(self.home)
                facts = read_home_facts(
                    self.journal, since=HomeFacts.from_json(records.home_facts()) if records else None)
                record = facts.record()
                check_runtime_db(self.home, record)
                self.governance = store = GovernanceStore.open(
                    self.home, self.journal, record=record, trusted_keys=None,  # re-read from apollia.toml as it changes
                    clock=lambda: _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc),
                )
                store.view()  # loads (and journals) the policy state now
                store.keep_open()  # the owner keeps governance.db open: per-operation connections are cheap
                self.records = records if records is not None else open_records(self.home)
                if facts.seq:
                    self.records.keep_home_facts(facts.to_json())
                if "runtime.db" not in record.recorded:
                    self.journal.append(FILE_CREATED, {"file": "runtime.db"})
            except BaseException:
                governance = getattr(self, "governance", None)
                if governance is not None:
                    governance.close()
                if records is not None:
                    records.close()
                self.journal.close()
                raise
        self.witnesses = None
        if server is None:
            self._start_witnesses()
        self.breakers = Breakers()
        self.opened = True
        from apollia_nb.runtime.chat import Sessions

        self.tool_sources = []
        if self.config.mcp_servers or self.config.hosts:
            if self._open_tool_sources is None:  # refused, never silently without the tools it names
                raise BadInput(
                    f"{self.home.config_path} names tool sources ([mcp.servers], [hosts]) and this runtime was "
                    "opened without them: open it with tool_sources=apollia_nb.federation.open_sources")
            self.tool_sources = list(self._open_tool_sources(self))
        await self._restore()
        from apollia_nb.runtime.batch import restore_batches

        await restore_batches(self)
        self.sessions = Sessions(self)
        if self.mode == "client":  # answers given elsewhere; the server expires overdue decisions
            from apollia_nb.runtime.remote import watch_answers

            self._tg.start_soon(watch_answers, self, self._remote)
        elif self.config.hitl_timeout_hours is not None:
            self._tg.start_soon(self._expiry_scanner)

    async def _stop_everything(self) -> None:
        """Closing the runtime: cancel what is running; suspended runs and agents stay as recorded."""
        if not self.opened:
            return
        recovered = [run for run in self._recovered if run._active]
        if recovered:  # what a restart finished for an earlier process: let it settle, within the drain time
            with anyio.move_on_after(self.config.drain_timeout_secs):
                for run in recovered:
                    await TaskHandle(self, run.id).settled()
        for source in getattr(self, "tool_sources", []):
            with anyio.CancelScope(shield=True):
                try:
                    await source.aclose()
                except Exception as exc:  # a source that cannot close must not keep the home open
                    self.events.emit("warning", f"closing {getattr(source, 'name', 'a tool source')}: {exc}")
        for run in list(self._runs.values()):
            scope = getattr(run, "scope", None)
            if run._active and scope is not None:
                scope.cancel()
        for run in list(self._runs.values()):
            if run._active:
                with anyio.move_on_after(5):
                    await run.done.wait()
        if self.sessions is not None:
            for session in self.sessions.all():
                if session._scope is not None:
                    session._scope.cancel()

    def _start_witnesses(self) -> None:
        """The thread sending this journal's checkpoints to ``[[journal.witnesses]]`` (docs/journal.md),
        and the one exporting its spans when ``[telemetry]`` is enabled (docs/evidence.md)."""
        try:
            if "telemetry" in self.config.raw:
                from apollia_nb.runtime.telemetry import start_telemetry

                self.telemetry = start_telemetry(self.journal, self.config.raw, str(self.home.config_path))
            if "journal" not in self.config.raw:  # no [journal] table: no witnesses (nothing to import)
                return
            from apollia_nb.journal.witness_sender import CosignSender, parse_witnesses

            witnesses = parse_witnesses(self.config.raw, str(self.home.config_path))
            if witnesses:
                self.witnesses = CosignSender(cast("Journal", self.journal), witnesses)  # the owner's
                self.witnesses.start()
        except BaseException:
            if self.telemetry is not None:
                self.telemetry.close()
            self.governance.close()
            self.journal.close()
            self.records.close()
            raise

    def witness_status(self) -> list[dict[str, Any]] | None:
        """Each configured witness's state (None when the home names no witness, or this process is a client)."""
        return self.witnesses.status() if getattr(self, "witnesses", None) is not None else None

    def _shutdown_files(self) -> None:
        if not self.opened:
            self._lock.release()
            return
        self.opened = False
        if self.witnesses is not None:
            self.witnesses.close()
        if self.telemetry is not None:  # its last entries read before the journal closes
            self.telemetry.close()
        try:
            self.governance.close()
            self.journal.close()
        finally:
            try:
                self.records.close()
            finally:
                self._lock.release()

    async def start_owned(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Start ``fn`` as a background task owned by the runtime (``anyio`` ``TaskGroup.start``
        semantics: returns what it passes to ``task_status.started``). Cancelled on close."""
        return await self._tg.start(fn, *args)

    # ------------------------------------------------------------------ clocks and notifications
    def now_iso(self) -> str:
        return _utc_iso(self.clock())

    def subscribe(self, listener: Callable[[str, Any], None]) -> Callable[[], None]:
        """Call ``listener(kind, obj)`` on every task/card/session change. Returns an unsubscribe function."""
        return self.events.subscribe(listener)

    def start_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` as a background task owned by the runtime (cancelled on close)."""
        self._tg.start_soon(fn, *args)

    def closing_checkpoint(self, run_id: str, stored: "Future[str]") -> None:
        """A run's closing checkpoint is signed (``journal.seal_async``): once ``journal.db`` has
        stored it, the witnesses are told; a store the disk refuses (``STORAGE_*``) is a warning
        (the run keeps its outcome; the next checkpoint covers its entries)."""
        loop = asyncio.get_running_loop()

        def landed(future: Any) -> None:
            try:
                loop.call_soon_threadsafe(self._checkpoint_stored, run_id, future)
            except RuntimeError:  # the loop closed first: nobody is left to tell
                pass

        stored.add_done_callback(landed)

    def _checkpoint_stored(self, run_id: str, stored: Any) -> None:
        error = stored.exception()
        if error is not None:
            self.events.emit("warning", f"run {run_id}: its closing checkpoint was not stored: {error}")
        elif self.witnesses is not None:
            self.witnesses.notify()

    # ------------------------------------------------------------------ agents
    async def register_agent(
        self, manifest: Any, *, tools: Sequence[Any] = (), model: Any = None, cwd: Path | None = None,
        keep_consents: bool | None = None,
    ) -> Agent:
        """Register an agent from a manifest text, path or ``Manifest``; one of that name already
        registered is replaced when stopped or idle (``_check_replaceable``: no task running or waiting
        for it, no chat exchange in progress), and is ``CONFLICT`` naming how to stop it otherwise.

        Its workspace is resolved here, once (``cwd``, default the current directory; ``..`` and
        symbolic links followed), and kept with the agent: a later process restores it there.
        Every registration — here, through REST, the SDK, a notebook cell, the CLI, or a client of
        ``apollia-os serve`` — goes through ``review_identity``: tools, workspace or model that widen
        what the agent's standing consents were given for need the operator's choice
        (``keep_consents=True`` keeps them, ``False`` revokes them; without one it is
        ``CONSENTS_TO_REVIEW`` showing the difference). The choice is journaled (``consents_review``)."""
        from apollia_nb.runtime.manifest import Manifest, load_manifest, parse_manifest

        if isinstance(manifest, Manifest):
            parsed = manifest
        elif isinstance(manifest, Path):
            parsed = load_manifest(manifest)
        else:
            parsed = parse_manifest(str(manifest))
        if parsed.name in self._registering:
            raise Conflict(f"agent {parsed.name!r} is being registered by another request: "
                           "register it again once that one has answered")
        self._registering.add(parsed.name)
        try:
            existing = self._agents.get(parsed.name)
            workspace = parsed.workspace_path(cwd)
            if existing is not None and existing.state.state != ProcessState.STOPPED:
                self._check_replaceable(existing)
                # Reviewed before it stops: a registration the review refuses (CONSENTS_TO_REVIEW) leaves the
                # agent as it was; the review in ``_register`` then finds the same identity and changes nothing.
                try:
                    self._review(parsed.name, self._identity_of(parsed, workspace, tools), keep=keep_consents,
                                 replacing=True)
                except GovernanceUnreadable:
                    pass  # ``_register`` holds its consents back and says so
                await self.stop_agent(parsed.name)
            return await self._register(parsed, tools=tools, model=model, workspace=workspace,
                                        written=parsed.workspace_path(cwd, resolve=False), keep=keep_consents,
                                        cell=existing.state if existing else None)
        finally:
            self._registering.discard(parsed.name)

    def _check_replaceable(self, agent: Agent) -> None:
        """``CONFLICT`` unless ``agent`` is idle: no task of it pending, running or waiting (on a person,
        a plan approval or a pending decision), no chat exchange of it in progress, not between states."""
        name = agent.name
        state = agent.state.state
        stop = (f"stop it first (`apollia-os agents stop {name}`, `%apollia stop {name}` in a notebook, "
                f"POST /api/v1/agents/{name}/stop), then register it again")
        if state not in (ProcessState.ACTIVE, ProcessState.DEGRADED):
            raise Conflict(f"agent {name!r} is {state.value}: register it again once it is stopped")
        busy = sorted(f"{r.id} ({r.status})" for r in agent.inflight
                      if r.status not in ("completed", "failed", "cancelled"))
        if busy:
            raise Conflict(f"agent {name!r} is busy: {len(busy)} task(s) running or waiting for it "
                           f"({', '.join(busy)}); answer or cancel them, or {stop}")
        sessions = self.sessions.all() if self.sessions is not None else []
        talking = sorted(s.id for s in sessions if s.agent is agent and s.state == "processing")
        if talking:
            raise Conflict(f"agent {name!r} is busy: a chat exchange is in progress in {', '.join(talking)}; "
                           f"wait for its reply, or {stop}")

    @staticmethod
    def _identity_of(manifest: Any, workspace: Path, tools: Sequence[Any]) -> dict[str, Any]:
        """What an agent's standing consents are given for: its tools, resolved workspace and model."""
        from apollia_nb.runtime.manifest import agent_identity
        from apollia_nb.runtime.tools import ToolDef

        names = [t.name if isinstance(t, ToolDef) else ToolDef.from_function(t).name for t in tools]
        return agent_identity(manifest, workspace, names)

    async def _register(self, manifest: Any, *, tools: Sequence[Any], model: Any, workspace: Path,
                        written: Path | None = None, keep: bool | None = None, cell: Any = None,
                        identity: dict[str, Any] | None = None) -> Agent:
        """Review what the agent's consents are given for, then start it (registration, restore, restart)."""
        if identity is None:
            identity = self._identity_of(manifest, workspace, tools)
        try:
            self.review_identity(manifest.name, identity, keep=keep)
            self._consents_store().hold_back_consents(manifest.name, False)
        except GovernanceUnreadable as exc:
            # What its consents were given for cannot be checked: none applies to it in this process
            # until it is registered again with governance readable (they do not apply meanwhile anyway).
            self._consents_store().hold_back_consents(manifest.name, True)
            self.events.emit("warning", f"agent {manifest.name}: its standing consents are held back until it is "
                                  f"registered again: {exc.message}")
        agent = await self._start_agent(manifest, tools=tools, model=model, workspace=workspace,
                                        written=written, cell=cell)
        self._identities[manifest.name] = identity
        return agent

    def _consents_store(self) -> Any:
        return self._remote.governance if self.mode == "client" else self._owned()

    def review_identity(self, agent: str, identity: dict[str, Any], *, keep: bool | None = None) -> dict[str, Any]:
        """The one review of what an agent's standing consents are given for (its tools, resolved
        workspace and model), for every registration path. A client asks its server, whose
        ``Runtime`` runs this. ``GovernanceStore.bind_identity`` compares and records; an agent of that
        name running in the owner with another identity is ``CONFLICT`` (stop it there first)."""
        return self._review(agent, identity, keep=keep)

    def _review(self, agent: str, identity: dict[str, Any], *, keep: bool | None = None,
                replacing: bool = False) -> dict[str, Any]:
        """``review_identity``; ``replacing``: the agent running here is the one being replaced, idle."""
        from apollia_nb.governance.store import identity_digest

        if self.mode == "client":
            return self._remote.governance.bind_identity(agent, identity, keep=keep)
        own = self._agents.get(agent)
        fallback = self._identities.get(agent)
        if (not replacing and own is not None and own.state.state != ProcessState.STOPPED and fallback is not None
                and identity_digest(fallback) != identity_digest(identity)):
            raise Conflict(f"agent {agent!r} is registered ({own.state.state.value}) in the process that owns "
                           "the home with other tools, workspace or model: stop it there first")
        if fallback is None:
            fallback = self._recorded_identity(agent)
        return self._owned().bind_identity(agent, identity, keep=keep, fallback=fallback)

    def _recorded_identity(self, agent: str) -> dict[str, Any] | None:
        """An agent recorded in ``runtime.db`` by a version that did not record identities: what its
        manifest says (its workspace as recorded, else resolved here, as that version did)."""
        from apollia_nb.runtime.manifest import agent_identity, parse_manifest

        row = next((r for r in self.records.agents() if r["name"] == agent), None)
        if row is None:
            return None
        try:
            before = parse_manifest(row["manifest"])
        except ApolliaError:
            return None
        return agent_identity(before, row.get("workspace") or before.workspace_path())

    async def _start_agent(self, manifest: Any, *, tools: Sequence[Any], model: Any, workspace: Path,
                           written: Path | None = None, cell: Any = None) -> Agent:
        from apollia_nb.runtime.builtins import builtin_tools
        from apollia_nb.runtime.manifest import check_script_tools
        from apollia_nb.runtime.models import build_model
        from apollia_nb.runtime.paths import check_workspace_apart_from_home
        from apollia_nb.runtime.tools import ToolDef, ToolRegistry

        if cell is None:
            cell = new_state()
        else:
            cell.move(ProcessState.INITIALIZING)
        warnings: list[str] = []
        try:
            for place in {workspace, written or workspace}:  # as resolved, and as written (a link inside the home)
                check_workspace_apart_from_home(place, self.home.path, agent=f"agent {manifest.name!r}")
            memory = self.records.memory_get(manifest.name)  # raises STORAGE_* while runtime.db refuses writes
            workspace.mkdir(parents=True, exist_ok=True)
            registry = ToolRegistry()
            for tooldef in builtin_tools(workspace, memory=_PersistedMemory(self, manifest.name, memory),
                                         profile_sink=lambda fact: None, namespace=self.namespace,
                                         home=self.home.path, http_proxy=self.config.http_proxy):
                registry.register(tooldef)
            for source in self.tool_sources:
                # Federated tools (MCP servers, host REST APIs): a source that fails leaves its tools
                # unresolved (an optional one degrades the agent; a required one fails the start).
                try:
                    for tooldef in await source.tools(manifest):
                        if tooldef.name not in registry:
                            registry.register(tooldef)
                except ApolliaError as exc:
                    warnings.append(f"{getattr(source, 'name', 'tool source')}: {exc.message}")
            custom: list[str] = []
            for item in tools:
                tooldef = item if isinstance(item, ToolDef) else ToolDef.from_function(item)
                registry.register(tooldef)
                custom.append(tooldef.name)
            if manifest.tools_required or manifest.tools_optional:
                resolved, missing = registry.resolve(manifest.tools_required, manifest.tools_optional)
                offered = tuple(dict.fromkeys([*resolved, *custom]))
                if missing:
                    warnings.append("optional tools did not resolve: " + ", ".join(missing))
            else:
                offered = tuple(registry.names())
            if model is None:  # a script's calls name tools the agent has (federated ones resolve at start)
                check_script_tools(manifest, offered)
            provider = model if model is not None else build_model(manifest.model)
        except ApolliaError as exc:
            if warnings:  # e.g. a tool source that could not give its tools, and why
                exc.message = f"{exc.message} ({'; '.join(warnings)})"
            raise startup_failure(cell, exc) from None
        error = await anyio.to_thread.run_sync(  # a worker thread only when there is something to install
            install_packages, self.home.agents_dir / manifest.name / "venv", manifest.python_packages
        ) if manifest.python_packages else None
        if error:
            warnings.append(error)
        if manifest.python_packages:
            from apollia_nb.journal.store import Draft

            await self.journal.append_many_async([Draft(
                "packages_install",
                {"agent": manifest.name, "packages": list(manifest.python_packages),
                 "outcome": "failed" if error else "installed", **({"error": error} if error else {})},
                None, manifest.name)])
        agent = Agent(manifest=manifest, model=provider, tools=registry, workspace=workspace,
                      offered=offered, state=cell, warnings=warnings, memory=memory,
                      custom_model=model is not None)
        cell.move(ProcessState.DEGRADED if warnings else ProcessState.ACTIVE)
        previous = self._agents.get(manifest.name)
        self._agents[manifest.name] = agent
        recorded = self.records.save_agent(manifest.name, manifest.source_text, cell.state.value, warnings,
                                           self.now_iso(), acknowledged=True, workspace=str(workspace))
        try:
            await asyncio.wrap_future(recorded)  # type: ignore[arg-type]  # registered means recorded: refused (507/503) otherwise
        except ApolliaError as exc:
            if previous is None:
                del self._agents[manifest.name]
            else:
                self._agents[manifest.name] = previous
            raise startup_failure(cell, exc) from None
        self.events.emit("agent", agent)
        return agent

    def find_agent(self, name: str) -> Agent | None:
        """The agent registered here under ``name``, or None."""
        return self._agents.get(name)

    def agents(self) -> list[Agent]:
        return [self._agents[name] for name in sorted(self._agents)]

    @property
    def server(self) -> Any:
        """The ``apollia-os serve`` this runtime is a client of (``url``, ``token``, ``pid``), or None."""
        remote = getattr(self, "_remote", None)
        return remote.address if self.mode == "client" and remote is not None else None

    def agent(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            raise UnknownAgent(f"no agent named {name!r}: {self._registered_names(name)}") from None

    def _registered_names(self, asked: Any) -> str:
        """The agents registered here, for an ``UNKNOWN_AGENT`` message (or how to register one)."""
        import difflib

        if not self._agents:
            return ("no agent is registered; register one from its TOML manifest with `apollia-os agents register "
                    "FILE`, a `%%apollia agent` cell, POST /api/v1/agents or Runtime.register_agent")
        names = sorted(self._agents)
        shown = ", ".join(f"{n} ({self._agents[n].state.state.value})" for n in names[:20])
        more = f" and {len(names) - 20} more" if len(names) > 20 else ""
        close = difflib.get_close_matches(asked, names, n=1) if isinstance(asked, str) else []
        return (f"did you mean {close[0]}? " if close else "") + f"the registered agents are {shown}{more}"

    async def stop_agent(self, name: str, *, drain: bool = True) -> Agent:
        """``stopping`` → drain in-flight runs up to ``drain_timeout_secs`` → cancel the rest → ``stopped``."""
        agent = self.agent(name)
        agent.state.move(ProcessState.STOPPING)
        self.records.set_agent_state(name, agent.state.state.value)
        self.events.emit("agent", agent)
        timeout = agent.manifest.drain_timeout_secs or self.config.drain_timeout_secs
        running = [r for r in agent.inflight if r.status not in ("completed", "failed", "cancelled")]
        if drain and running:
            with anyio.move_on_after(timeout):
                for run in running:
                    if run.status != "waiting":
                        await run.done.wait()
        for run in list(agent.inflight):
            scope = getattr(run, "scope", None)
            if scope is not None and run.status not in ("completed", "failed", "cancelled"):
                scope.cancel()
        agent.state.move(ProcessState.STOPPED)
        self.records.set_agent_state(name, agent.state.state.value)
        await self.recorded(f"agent {name} stopped", acknowledged=True)
        self.events.emit("agent", agent)
        return agent

    async def start_agent(self, name: str) -> Agent:
        """Restart a stopped agent: ``stopped → initializing → active | degraded``."""
        agent = self.agent(name)
        if agent.state.state != ProcessState.STOPPED:
            raise Conflict(f"agent {name!r} is {agent.state.state.value}; only a stopped agent can be started")
        return await self._register(agent.manifest, tools=custom_tools(agent),
                                    model=agent.model if agent.custom_model else None, workspace=agent.workspace,
                                    cell=agent.state, identity=self._identities.get(name))

    # ------------------------------------------------------------------ tasks
    async def submit(
        self, agent: str, goal: str, *, max_steps: int | None = None, watched: bool = True,
        grants: Sequence[str] = (), approve_plan: bool = False, task_id: str | None = None,
        after: Future[None] | None = None,
    ) -> TaskHandle:
        """Submit a task; returns at once. Refused (``AGENT_UNAVAILABLE``) unless the agent can take work.

        ``task_id``: the id to give it (a batch names its items' tasks when it records them). ``after``: a
        ``runtime.db`` commit under way that the task's row must not be committed without (a REST request's
        ``Idempotency-Key`` taken): its row is queued behind it, and refused with it."""
        from apollia_nb.governance.decision import Family

        the_agent = self.agent(agent)
        warnings = the_agent.check_accepts_work()
        if not isinstance(goal, str) or not goal.strip():
            raise BadInput("a task needs a goal")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise BadInput("max_steps must be a positive integer")
        try:
            grant_list = sorted({Family(g).value for g in grants})
        except ValueError as exc:
            raise BadInput(f"unknown family in grants: {exc}") from None
        if task_id is None:
            task_id = f"task-{uuid.uuid4().hex[:12]}"
        elif task_id in self._runs or task_id in self._finished:
            raise Conflict(f"task {task_id} exists already")
        record = TaskRecord.new(
            task_id=task_id, run_id=f"run-{uuid.uuid4().hex[:12]}", agent=agent, goal=goal,
            ceiling=max_steps or the_agent.manifest.max_steps, watched=watched, grants=grant_list,
            approve_plan=approve_plan, warnings=warnings, created_at=self.now_iso(),
        )
        actor = ACTING.get()
        record.started_by = actor[0] if actor is not None else local_person()
        recorded = self.records.save_task(record.to_json(), record.created_at, acknowledged=True, after=after)
        run = TaskRun(self, the_agent, record)
        self._runs[task_id] = run
        self._claim(run)  # in flight already: a stop drains it, nobody spawns it twice
        try:
            await asyncio.wrap_future(recorded)  # type: ignore[arg-type]  # submitted means recorded (waited for off the loop)
            await journal_submitted(self, record.to_json())  # and journaled: a runtime.db that loses it is told
        except BaseException:  # not recorded (STORAGE_FULL / STORAGE_ERROR), or cancelled: not submitted either
            self._runs.pop(task_id, None)
            run.agent.inflight.discard(run)
            run._active = False
            raise
        faults.point("submit.after_commit")
        if run.status == TaskStatus.PENDING.value:
            self._start(run)
        else:  # cancelled while it was being recorded
            run.agent.inflight.discard(run)
            run._active = False
            self._retire(run)
        return TaskHandle(self, task_id, run)

    # ------------------------------------------------------------------ batches (runtime/batch.py)
    async def batch(self, agent: str, items: Any, *, goal: Any, concurrency: int = 4,
                    max_steps: int | None = None, key: Any = None, engine: str = "local",
                    scheduler: Any = None, server_url: str | None = None, batch_id: str | None = None) -> Any:
        """Run ``agent`` over ``items``, each item an unattended task; returns a ``BatchHandle`` at once.

        ``engine="dask"``: the items run on the ``dask.distributed`` cluster at ``scheduler`` (an
        address or a ``distributed.Client``), each worker a client of this home's server."""
        from apollia_nb.runtime.batch import start_batch

        return await start_batch(self, agent, items, goal=goal, concurrency=concurrency, max_steps=max_steps,
                                 key=key, engine=engine, scheduler=scheduler, server_url=server_url,
                                 batch_id=batch_id)

    def get_batch(self, batch_id: str) -> Any:
        """A batch of this home (``UNKNOWN_BATCH`` otherwise)."""
        from apollia_nb.runtime.batch import find_batch

        return find_batch(self, batch_id)

    def batches(self) -> list[Any]:
        from apollia_nb.runtime.batch import all_batches

        return all_batches(self)

    def _spawn(self, run: TaskRun) -> None:
        self._claim(run)
        self._start(run)

    def _claim(self, run: TaskRun) -> None:
        run.agent.inflight.add(run)
        run._active = True  # from now, not only once the task starts: no one may spawn it twice

    def _start(self, run: TaskRun) -> None:
        agent = run.agent

        async def owned() -> None:
            with anyio.CancelScope() as scope:
                run.scope = scope  # type: ignore[attr-defined]
                try:
                    await run.run()
                finally:
                    finished = run.status in ("completed", "failed", "cancelled")
                    if finished:
                        agent.inflight.discard(run)
                    if finished:
                        self._retire(run)

        self._tg.start_soon(owned)

    def _retire(self, run: TaskRun) -> None:
        """A finished run leaves the live table; its answered cards go with it (runtime.db keeps the task)."""
        if self._runs.get(run.id) is run:
            del self._runs[run.id]
        answered = [c for c in self._cards.values() if c.task_id == run.id and not c.waiting]
        for card in answered:
            del self._cards[card.id]
        run.retired_cards = tuple(answered)  # type: ignore[attr-defined]  # kept with the run while it stays in memory (``cards_of``)
        self.events.forget(run.id)
        self._finished[run.id] = run
        self._finished.move_to_end(run.id)
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)

    def run_of(self, task_id: str) -> TaskRun | None:
        """The run of a task of this process: not finished, or among the last finished (else None)."""
        return self._runs.get(task_id) or self._finished.get(task_id)

    def unfinished_runs(self) -> list[TaskRun]:
        """The runs of this process not finished yet (running, waiting, suspended)."""
        return list(self._runs.values())

    def cards_of(self, task_id: str) -> list[Any]:
        """Every card of a task this process ran, answered or waiting, oldest first (a finished
        task's answered cards while it is among the last ``FINISHED_KEPT``)."""
        run = self._finished.get(task_id)
        return [*getattr(run, "retired_cards", ()), *(c for c in self._cards.values() if c.task_id == task_id)]

    def task(self, task_id: str) -> TaskHandle:
        """This process's task, or a finished one as ``runtime.db`` holds it. ``UNKNOWN_TASK`` otherwise."""
        run: TaskRun | _Finished | None = self._runs.get(task_id) or self._finished.get(task_id)
        if run is None:
            stored = self.records.task(task_id) if isinstance(task_id, str) else None
            if stored is None or stored["status"] not in ("completed", "failed", "cancelled"):
                raise UnknownTask(f"no task {task_id!r}")
            run = _Finished(TaskRecord.from_json(stored))
        return TaskHandle(self, task_id, run)

    def tasks(self) -> list[TaskHandle]:
        """This process's tasks in memory, oldest first: every one not finished, and the last
        ``FINISHED_KEPT`` finished (older ones: ``task(id)``, or ``records.tasks()`` for all)."""
        runs = sorted([*self._finished.values(), *self._runs.values()],
                      key=lambda run: (run.r.created_at, run.id))
        return [TaskHandle(self, run.id, run) for run in runs]

    async def cancel(self, task_id: str) -> TaskHandle:
        await self._answers_delivered()  # an answer being recorded reaches its card first
        handle = self.task(task_id)
        run = handle._run
        if run.status in ("completed", "failed", "cancelled"):
            raise Conflict(f"task {task_id} is already {run.status}")
        scope = getattr(run, "scope", None)
        if run._active and scope is not None:
            for card in [c for c in self._cards.values() if c.task_id == task_id and c.waiting]:
                self._record_answer(card.id, "refuse", by="cancel", reason="the task was cancelled")
                card._resolve("refuse", "cancel", self.now_iso())
            scope.cancel()
            await run.done.wait()
        else:  # suspended: nothing runs; close it here
            for card in [c for c in self._cards.values() if c.task_id == task_id and c.waiting]:
                self._record_answer(card.id, "refuse", by="cancel", reason="the task was cancelled")
                card._resolve("refuse", "cancel", self.now_iso())
            await run._finish(TaskStatus.CANCELLED, error=None)
            run.done.set()
            run.agent.inflight.discard(run)
            self._retire(run)
        return handle

    def approve_plan(self, task_id: str, steps: list[str] | None = None, *, by: str | None = None,
                     digest: str | None = None) -> None:
        """Approve a task's plan (``steps``: edited). Journaled with who approved and the plan's digest;
        ``digest``: the plan's as shown to them (another is ``STALE_APPROVAL``)."""
        run = self._plan_run(task_id, "approve", by=by, digest=digest)
        if steps is not None and (not isinstance(steps, list) or not all(isinstance(s, str) and s for s in steps)):
            raise BadInput("edited steps must be a non-empty list of strings")
        self._answer_plan(run, "approve", None, steps, by=by, digest=digest)

    def reject_plan(self, task_id: str, reason: str, *, by: str | None = None) -> None:
        run = self._plan_run(task_id, "reject", by=by)
        self._answer_plan(run, "reject", reason or "no reason given", None, by=by)

    def _plan_run(self, task_id: str, verdict: str, *, by: str | None, digest: str | None = None) -> TaskRun:
        """The run whose plan ``verdict`` answers; an answer to a plan not waiting (answered and taken up
        already, or never asked) is refused ``CONFLICT`` and journaled (``TaskRun.plan_refused``)."""
        run = self.task(task_id)._run
        if isinstance(run, _Finished):  # finished and let go: its run is sealed, nothing more is journaled in it
            raise Conflict(f"task {task_id} is not waiting for plan approval (it is {run.status})")
        if not run.r.awaiting_plan_approval:
            raise run.plan_refused(verdict, Conflict(f"task {task_id} is not waiting for plan approval"), by=by,
                                   digest=digest)
        return run

    def _answer_plan(self, run: TaskRun, verdict: str, reason: str | None, steps: list[str] | None, *,
                     by: str | None = None, digest: str | None = None) -> None:
        run.answer_plan(verdict, reason, steps, by=by, digest=digest)  # journaled: a restart takes it if the run does not
        if not _is_running(run):
            faults.point("answer.before_resume")
            self._spawn(run)

    # ------------------------------------------------------------------ cards and pending decisions
    def open_card(self, *, agent: Agent, run_id: str, call_id: str, tool: str, family: str | None,
                   arguments: dict[str, Any], decision: Any, task_id: str | None, session_id: str | None,
                   hints: dict[str, Any] | None, request: str | None = None, stored: Any = None) -> Card:
        """List a call as waiting for a person (its pending decision stored in governance.db) and show its
        card. ``stored``: the pending decision, stored already (``open_card_async``)."""
        pending = stored if stored is not None else self._store_pending(
            agent=agent, run_id=run_id, call_id=call_id, tool=tool, family=family, arguments=arguments,
            decision=decision, task_id=task_id, session_id=session_id)
        card = Card(
            id=pending.id, run_id=run_id, agent=agent.name, tool=tool, family=family, arguments=arguments,
            answers=tuple(a.value for a in decision.answers), reason=decision.reason, line=decision.line,
            call_id=call_id, created_at=pending.to_dict()["created_at"], task_id=task_id, session_id=session_id,
            hints=hints, request=request, _runtime=self,
        )
        self._cards[card.id] = card
        self.events.emit("card", card)
        return card

    async def open_card_async(self, **call: Any) -> Card:
        """``open_card`` for an event loop that serves many at once (a task's or a chat's call that asks):
        the pending decision is stored in governance.db by a worker thread while the loop goes on, and
        those asked for while a group is being stored form the next group (one governance.db commit for
        all). The card is shown once its decision is stored, as ``open_card`` shows it, and never without
        it (a store that fails raises here, and the call is not made). A client's runtime asks its server."""
        if self.mode == "client":
            return self.open_card(**call)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._unstored.append((call, done))
        with anyio.CancelScope(shield=True):  # once stored, its card is shown: nothing waits unlisted
            if not self._storing:  # nobody stores a group now: this call does, until none is left
                await self._store_groups()
            stored = await done
        return self.open_card(**call, stored=stored)

    async def _store_groups(self) -> None:
        self._storing = True
        try:
            while self._unstored:
                group, self._unstored = self._unstored, []
                try:
                    results: list[Any] = await anyio.to_thread.run_sync(
                        self._owned().add_pending_many, [self._pending_of(**call) for call, _ in group])
                except Exception as exc:  # noqa: BLE001 - unreadable or refused: every waiter hears it
                    results = [exc] * len(group)
                for (_, done), result in zip(group, results):
                    if not done.done():
                        if isinstance(result, BaseException):
                            done.set_exception(result)
                        else:
                            done.set_result(result)
        finally:
            self._storing = False

    def _store_pending(self, **call: Any) -> Any:
        """The call's pending decision, stored in governance.db (``GovernanceStore.add_pending``)."""
        return self.governance.add_pending(**self._pending_of(**call))

    @staticmethod
    def _pending_of(*, agent: Agent, run_id: str, call_id: str, tool: str, family: str | None,
                    arguments: dict[str, Any], decision: Any, task_id: str | None, session_id: str | None,
                    **_shown: Any) -> dict[str, Any]:
        """What governance.db stores of a call that asks (``GovernanceStore.add_pending``'s arguments)."""
        return dict(run_id=run_id, task_id=task_id or session_id, agent=agent.name, tool=tool, family=family,
                    arguments=arguments, answers=[a.value for a in decision.answers], reason=decision.reason,
                    line=decision.line, call_id=call_id)

    def open_decision(self, *, agent: Agent, run_id: str, call_id: str, tool: str, family: str | None,
                      arguments: dict[str, Any], decision: Any) -> Card:
        """A pending decision for a call decided outside a task or chat (another agent's call, asked
        through its hook: ``apollia_nb/hooks``): listed and answerable like any other; the caller waits
        on the returned card and carries out (or refuses) the call itself."""
        return self.open_card(agent=agent, run_id=run_id, call_id=call_id, tool=tool, family=family,
                               arguments=arguments, decision=decision, task_id=None, session_id=None, hints=None)

    def _owned(self) -> "GovernanceStore":
        """The owner's governance store: answers are stored by the owner (a client's go to its server)."""
        return cast("GovernanceStore", self.governance)

    def card(self, card_id: str) -> Card | None:
        return self._cards.get(card_id)

    @property
    def pending(self) -> list[Card]:
        """Every waiting card in this home, oldest first."""
        return sorted((c for c in self._cards.values() if c.waiting), key=lambda c: c.created_at)

    def pending_decisions(self) -> list[dict[str, Any]]:
        """Waiting decisions, each with its tool's hints (MCP annotations) when this process has its card."""
        out = []
        for p in self.governance.pending():
            card = self._cards.get(p.id)
            out.append(shown_decision(p.to_dict(), hints=card.hints if card is not None else None,
                                      may_answer=self.may_answer(p)))
        return out

    # ------------------------------------------------------------------ who may approve (governance/approvals.py)
    def _requirement(self, tool: str, family: Any) -> Any:
        """What the organisation policy requires of approvals of a call (``[approvals]``). A policy
        that cannot be read requires what cannot be given: nobody approves (fail closed)."""
        from apollia_nb.governance.approvals import Requirement, requirement

        view = self.governance.view()
        if not view.readable:
            raise GovernanceUnreadable(f"governance cannot be read, so nobody may approve a call: "
                                       f"{view.unreadable_reason or 'unreadable'}")
        if view.policy is None:
            return Requirement()
        return requirement(view.policy.approvals, tool, getattr(family, "value", family))

    def started_by(self, task_id: str | None, run_id: str | None = None) -> str | None:
        """Who started the task or session ``task_id`` (None: not known here). With ``run_id`` (a waiting
        decision's run): a task or session of this runtime counts only when that run is its own; the run of a
        client of this home (a kernel, the CLI) is the person its ``run_open`` names (``started_by``, stamped
        by the server from the person's token; none for the owner's)."""
        run = self._runs.get(task_id or "") or self._finished.get(task_id or "")
        if run is not None and (run_id is None or run.r.run_id == run_id):
            return run.r.started_by
        session = None
        if run is None and self.sessions is not None and task_id:
            try:
                session = self.sessions.get(task_id)
            except ApolliaError:
                session = None
        if session is not None and (run_id is None or session.r.get("run_id") == run_id):
            started = session.r.get("started_by")
            return str(started) if started is not None else None
        return self._run_starter(run_id) if run_id else None

    def _run_starter(self, run_id: str) -> str | None:
        """The ``started_by`` of the run's ``run_open`` in the journal (kept once read: it never changes)."""
        known = self._starters.get(run_id)
        if known is not None:
            return known or None
        first = self.journal.entries(run_id=run_id, limit=1)
        if not first:
            return None
        started = first[0].data().get("started_by") if first[0].kind == "run_open" else None
        self._starters[run_id] = started if isinstance(started, str) else ""
        return started if isinstance(started, str) else None

    def may_answer(self, decision: Any) -> dict[str, Any] | None:
        """Who may answer a waiting decision (a card or a pending decision); None when governance cannot
        be read (nobody may approve then)."""
        from apollia_nb.governance.approvals import may_answer

        try:
            req = self._requirement(decision.tool, decision.family)
        except GovernanceUnreadable:
            return None
        task_id = getattr(decision, "task_id", None) or getattr(decision, "session_id", None)
        run_id = getattr(decision, "run_id", None) if not req.plain else None
        try:
            started = self.started_by(task_id, run_id)
        except ApolliaError:  # the run's opening cannot be read here: what is shown says nobody in particular
            started = None
        started = started or (local_person() if req.four_eyes else None)
        return may_answer(req, started_by=started,
                          approved_by=[a["by"] for a in self._approvals.get(decision.id, [])])

    def answer(self, decision_id: str, answer: str, *, by: str = "user", reason: str | None = None,
               values: dict[str, Any] | None = None, digest: str | None = None, expires_in: Any = None,
               expires_at: Any = None, lasting: str | None = None) -> dict[str, Any]:
        """Answer a waiting decision: validated, journaled, applied once; the run resumes.

        ``values``: a server's question (elicitation) answered ``once`` — the form's fields.
        ``digest``: the decision's digest as shown to whoever answers (another: ``STALE_APPROVAL``);
        ``expires_in`` (seconds) / ``expires_at`` (ISO 8601): when an approval ends."""
        answered = self._record_answer(decision_id, answer, by=by, reason=reason, values=values, digest=digest,
                                       expires_in=expires_in, expires_at=expires_at, lasting=lasting)
        self.deliver_answer(answered, values)
        card = self._cards.get(decision_id)
        return shown_decision(answered, hints=answered.get("hints", card.hints if card is not None else None))

    def deliver_answer(self, answered: dict[str, Any], values: dict[str, Any] | None = None) -> None:
        """An answered decision reaches its card when it is this process's: it resolves, its run resumes."""
        card = self._cards.get(answered["id"])
        if answered.get("status") == "pending":  # one approval of several: the card waits for the others
            if card is not None:
                self.events.emit("card", card)
            return
        if card is not None and card.waiting:
            card.values = values if answered["answer"] == "once" else None
            card.expires_at = answered.get("expires_at")
            card.approved_digest = answered.get("digest")
            card._resolve(answered["answer"], answered["answered_by"], answered["answered_at"] or self.now_iso())
            self.events.emit("card", card)
            run = self._runs.get(card.task_id or "")
            if run is not None and run.status == "waiting" and not _is_running(run):
                faults.point("answer.before_resume")
                self._spawn(run)

    async def answer_async(self, decision_id: str, answer: str, *, by: str = "user", reason: str | None = None,
                           values: dict[str, Any] | None = None, digest: str | None = None,
                           expires_in: Any = None, expires_at: Any = None,
                           lasting: str | None = None, after: Future[None] | None = None) -> dict[str, Any]:
        """``answer`` for an event loop that serves many people at once (the REST API).

        The answer is recorded off the loop, and answers given while a group is being recorded
        form the next group: one read of their decisions, one journal commit of their ``answer``
        entries, one governance.db commit storing them (``_record_answers``). Each is acknowledged
        as ``answer`` acknowledges one: once journaled and stored; its run then resumes. Once
        queued, an answer is recorded whatever happens to the request that gave it. ``after``: what
        must be committed before the answer is journaled (the request's ``Idempotency-Key`` taken, its
        commit meanwhile under way); when it fails the answer is refused with its error, nothing done."""
        if self.mode == "client":
            if after is not None:
                await asyncio.wrap_future(after)
            return self.answer(decision_id, answer, by=by, reason=reason, values=values, digest=digest,
                               expires_in=expires_in, expires_at=expires_at, lasting=lasting)
        done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._asks.append((_Ask(decision_id, answer, by, reason, values, ACTING.get(), digest, expires_in,
                                expires_at, lasting, after), done))
        if self._asks_idle is None:  # nobody records a group now: this request does, until none is left
            with anyio.CancelScope(shield=True):
                await self._record_asks()
        answered = await done
        card = self._cards.get(decision_id)
        return shown_decision(answered, hints=answered.get("hints", card.hints if card is not None else None))

    async def _record_asks(self) -> None:
        idle = self._asks_idle = anyio.Event()
        try:
            while self._asks:
                group, self._asks = self._asks, []
                group = [(ask, done) for ask, done in group if await _committed_before(ask.after, done)]
                if not group:
                    continue
                self._asked = {ask.decision_id for ask, _ in group}
                try:
                    results: list[Any] = await anyio.to_thread.run_sync(
                        self._record_answers, [ask for ask, _ in group])
                except BaseException as exc:  # noqa: BLE001 - every waiter hears it
                    results = [exc] * len(group)
                for (ask, done), result in zip(group, results):
                    if not isinstance(result, BaseException):
                        try:
                            self.deliver_answer(result, ask.values)
                        except Exception as exc:  # noqa: BLE001 - recorded; its waiter hears why it did not resume
                            result = exc
                    if done.done():
                        continue
                    if isinstance(result, BaseException):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
                self._asked = set()
        finally:
            self._asked, self._asks_idle = set(), None
            idle.set()

    async def _answers_delivered(self) -> None:
        """Until the group of answers being recorded off the loop (if any) has reached its cards."""
        idle = self._asks_idle
        if idle is not None:
            with anyio.CancelScope(shield=True):
                await idle.wait()

    def _record_answer(self, decision_id: str, answer: str, *, by: str, reason: str | None,
                       values: dict[str, Any] | None = None, digest: str | None = None, expires_in: Any = None,
                       expires_at: Any = None, lasting: str | None = None) -> dict[str, Any]:
        """Validate, journal (before the effect), store, and apply ``always``."""
        if self.mode == "client":  # the server records it, in one step (docs/shared-home.md)
            if values is not None:
                raise BadAnswer("a server's question is answered in the process that runs its call")
            terms = {k: v for k, v in (("digest", digest), ("expires_in", expires_in), ("expires_at", expires_at),
                                       ("for", lasting)) if v is not None}
            return self._remote.governance.record_answer(decision_id, answer, by=by, reason=reason, **terms)
        (result,) = self._record_answers([_Ask(decision_id, answer, by, reason, values, ACTING.get(), digest,
                                               expires_in, expires_at, lasting)])
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    def _record_answers(self, asks: Sequence["_Ask"]) -> list[dict[str, Any] | BaseException]:
        """Answers given together, in order: each validated, all journaled in one commit (before the
        effect), all stored in one governance.db commit, then ``always`` applied. Each gets its
        decision as answered or its error; an answer a decision already had in the group is a
        ``CONFLICT``, as it would be after it. Thread-safe: one group at a time."""
        from apollia_nb.runtime.questions import check_form_values

        results: list[dict[str, Any] | BaseException | None] = [None] * len(asks)
        with self._answers_lock:
            try:
                found = self._owned().get_pending_many([ask.decision_id for ask in asks])
            except Exception as exc:  # noqa: BLE001 - unreadable: nothing is answered
                return [exc] * len(asks)
            new: list[tuple[int, Any, dict[str, Any]]] = []  # to journal, then store
            again: list[tuple[int, Any, dict[str, Any]]] = []  # journaled before, not stored: store only
            taken: dict[str, dict[str, Any]] = {}
            for i, ask in enumerate(asks):
                decision_id, answer = ask.decision_id, ask.answer
                pending = None
                try:
                    pending = found.get(decision_id)
                    if pending is None:
                        raise UnknownDecision(f"no pending decision has the id {decision_id!r}")
                    first = taken.get(decision_id)
                    if first is not None:
                        raise Conflict(f"decision {decision_id} was already answered ({first['answer']} by "
                                       f"{first['answered_by']})")
                    if pending.status != "pending":
                        self._unstored_answers.pop(decision_id, None)
                        raise Conflict(f"decision {decision_id} was already answered ({pending.answer} by "
                                       f"{pending.answered_by})")
                    journaled = self._unstored_answers.get(decision_id)
                    if journaled is not None:  # answered once already (in the journal): stored now, never journaled again
                        if answer != journaled["answer"]:
                            raise Conflict(f"decision {decision_id} was already answered ({journaled['answer']} by "
                                           f"{journaled['answered_by']}); that answer is journaled, not yet stored")
                        again.append((i, pending, journaled))
                        taken[decision_id] = journaled
                        continue
                    if answer not in [a.value for a in pending.answers]:
                        offered = ", ".join(a.value for a in pending.answers)
                        raise BadAnswer(f"{answer!r} is not on offer for {decision_id}; answers: {offered}")
                    shown: dict[str, Any] = {}
                    values = ask.values
                    card = self._cards.get(decision_id)
                    if card is not None and card.request == QUESTION and answer == "once":  # a server's question
                        values = check_form_values(card.arguments, values)
                        shown = {"values": card.shown_values(values)} if values is not None else {}
                    elif values is not None:
                        raise BadAnswer(f"values answer a server's question; {decision_id} asks about {pending.tool}")
                    terms = {**self._approval_terms(ask, pending), **self._consent_terms(ask, pending)}
                    if terms.get("status") == "pending":  # one approval of several: journaled, the card waits
                        results[i] = terms
                        continue
                except Exception as exc:  # noqa: BLE001 - this answer's error; the others go on
                    if pending is not None and isinstance(exc, (Conflict, Forbidden)):
                        exc = self._refused_answer(ask, pending, exc)
                    results[i] = exc
                    continue
                payload = {"call_id": pending.call_id, "decision_id": decision_id, "answer": answer,
                           "answered_by": ask.by, **({"reason": ask.reason} if ask.reason else {}), **shown,
                           **({"by_role": ask.actor[1], "auth": ask.actor[2]} if ask.actor else {}), **terms}
                new.append((i, pending, payload))
                taken[decision_id] = payload
            if new:
                try:
                    self.journal.append_many([("answer", payload, pending.run_id, pending.agent)
                                              for _, pending, payload in new])
                except Exception as exc:  # noqa: BLE001 - not journaled: none of them is answered
                    for i, _, _ in new:
                        results[i] = exc
                    new = []
                for _, pending, payload in new:
                    self._unstored_answers[pending.id] = payload
            self._store_answers(sorted(again + new, key=lambda item: item[0]), results)
        return results  # type: ignore[return-value]

    def _store_answers(self, journaled: list[tuple[int, Any, dict[str, Any]]],
                       results: list[dict[str, Any] | BaseException | None]) -> None:
        """Store journaled answers in governance.db (one commit) and apply ``always``. When governance.db
        refuses one the answer stands (journaled; a restart stores it): ``OUTCOME_UNKNOWN``, and answering
        again stores it."""
        if not journaled:
            return
        try:
            faults.point("answer.after_journal")
            stored: list[Any] = self._owned().answer_pending_many(
                [(pending.id, payload["answer"], payload["answered_by"], payload.get("reason"))
                 for _, pending, payload in journaled])
        except Exception as exc:  # noqa: BLE001 - every one of them is journaled, none stored
            stored = [exc] * len(journaled)
        done = []
        for (i, pending, payload), answered in zip(journaled, stored):
            if isinstance(answered, Exception):
                unknown = OutcomeUnknown(
                    f"the answer {payload['answer']} to {pending.id} is journaled, but governance.db did not store "
                    f"it ({answered}): answer it again the same way (or send the request again with the same "
                    "Idempotency-Key) to store it; it is not journaled twice")
                unknown.__cause__ = answered
                results[i] = unknown
                continue
            self._unstored_answers.pop(pending.id, None)
            self._approvals.pop(pending.id, None)
            done.append((i, pending, payload, answered))
        if not done:
            return
        faults.point("answer.after_commit")
        for i, pending, payload, answered in done:
            try:
                if payload["answer"] == "always":  # journaled as given by whoever gave it, not this group's recorder
                    actor = ACTING.set((payload["answered_by"], payload["by_role"], payload["auth"])
                                       if "auth" in payload else None)
                    try:
                        self._apply_always(pending, by=payload["answered_by"], until=payload.get("until"))
                    finally:
                        ACTING.reset(actor)
                results[i] = {**answered.to_dict(), **{k: payload[k] for k in ("expires_at", "approved_by")
                                                        if k in payload}}
            except Exception as exc:  # noqa: BLE001 - stored; its consent or rule is not
                results[i] = exc

    def _approval_terms(self, ask: "_Ask", pending: Any) -> dict[str, Any]:
        """What binds an answer to the action (``governance/approvals.py``): the ``digest`` of the card as
        shown (an answer naming another is ``STALE_APPROVAL``), the approval's end (``expires_at``), and
        who approved when the policy asks for four eyes or several approvers: ``FORBIDDEN`` for the run's
        starter or a second approval by one person. An approval short of the number needed is journaled
        (``approval``) and returned as the decision still ``pending``; the last one answers it."""
        from apollia_nb.governance.approvals import APPROVING, expiry, may_answer, refusal

        digest = pending.digest
        if ask.digest is not None and ask.digest != digest:
            raise StaleApproval(f"decision {pending.id} shows the digest {digest}, not {ask.digest}: what was "
                                "answered is not what it asks now; read it again before answering")
        terms: dict[str, Any] = {"digest": digest}
        if ask.answer not in APPROVING:
            if ask.expires_in is not None or ask.expires_at is not None:
                raise BadInput("a refusal does not expire: expires_in and expires_at go with once or always")
            return terms
        ends = expiry(self.clock(), expires_in=ask.expires_in, expires_at=ask.expires_at)
        if ends is not None:
            terms["expires_at"] = ends
        req = self._requirement(pending.tool, pending.family)
        if req.plain:
            return terms
        who = ask.actor[0] if ask.actor is not None else local_person()
        started = self.started_by(pending.task_id, pending.run_id) or local_person()
        earlier = self._approvals.get(pending.id, [])
        why = refusal(req, started_by=started, by=who, approved_by=[a["by"] for a in earlier], local=local_person())
        if why is not None:
            raise Forbidden(why)
        approval = {"by": who, "answer": ask.answer, **terms,
                    **({"by_role": ask.actor[1], "auth": ask.actor[2]} if ask.actor else {})}
        approved_by = [*(a["by"] for a in earlier), who]
        if len(approved_by) < req.approvers:
            self.journal.append("approval", {"call_id": pending.call_id, "decision_id": pending.id, **approval,
                                             "approved_by": approved_by, "needed": req.approvers},
                                run_id=pending.run_id, agent=pending.agent)
            self._approvals.setdefault(pending.id, []).append(approval)
            return {**pending.to_dict(), "may_answer": may_answer(req, started_by=started, approved_by=approved_by)}
        if req.approvers > 1:
            terms["approved_by"] = approved_by
            ends_all = [e for e in (*(a.get("expires_at") for a in earlier), ends) if e is not None]
            if ends_all:  # the approval holds while every approver's does
                terms["expires_at"] = min(ends_all)
        return terms

    def _refused_answer(self, ask: "_Ask", pending: Any, exc: ApolliaError) -> ApolliaError:
        """Journal an answer refused (``answer_refused``: who, with what, why) and return its error. When
        the journal refuses the entry the answer is refused all the same."""
        payload = {"call_id": pending.call_id, "decision_id": pending.id, "answer": ask.answer, "by": ask.by,
                   **({"by_role": ask.actor[1], "auth": ask.actor[2], "person": ask.actor[0]} if ask.actor else {}),
                   "code": exc.code, "reason": exc.message, "digest": pending.digest,
                   **({"given_digest": ask.digest} if ask.digest is not None else {})}
        try:
            self.journal.append("answer_refused", payload, run_id=pending.run_id, agent=pending.agent)
        except Exception as journal_error:  # noqa: BLE001 - refused either way
            exc.__context__ = journal_error
        return exc

    def _consent_terms(self, ask: "_Ask", pending: Any) -> dict[str, Any]:
        """How long the standing consent of an ``always`` lasts (``lasting``: "8h", journaled as ``for`` and
        ``until``, counted from the runtime's clock); nothing when it is given until revoked. ``BAD_DURATION``
        for a lifetime that does not read, or one given with another answer or for a command's rule."""
        from apollia_nb.errors import BadDuration
        from apollia_nb.governance.store import parse_lifetime

        if ask.lasting is None:
            return {}
        if ask.answer != "always":
            raise BadDuration(f"a lifetime ({ask.lasting!r}) goes with always only, not with {ask.answer}")
        if pending.line == 4:
            raise BadDuration("always for a command adds a fine allow rule, which has no lifetime: answer always "
                              "without one, or once")
        lifetime = parse_lifetime(ask.lasting)
        if lifetime is None:
            return {"for": "until revoked"}
        ends = _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc) + lifetime
        return {"for": ask.lasting.strip().lower(), "until": ends.isoformat().replace("+00:00", "Z")}

    def _apply_always(self, pending: Any, *, by: str, until: str | None = None) -> None:
        """``always``: the allow rule for a simple command (line 4), else the standing consent (until ``until``,
        ISO 8601, as journaled with the answer; None: until revoked), naming its card. Idempotent."""
        if pending.line == 4:
            command = next(iter(pending.arguments.values()), None)
            self.governance.add_rule(pending.tool, "allow", prefix=str(command), agent=pending.agent, by=by)
        elif pending.family is not None:
            ends = _dt.datetime.fromisoformat(until) if until is not None else None
            if ends is not None and ends <= _dt.datetime.fromtimestamp(self.clock(), _dt.timezone.utc):
                return  # it ended before it could be stored (a restart long after the answer): nothing to give
            self.governance.grant_consent(pending.agent, pending.family, by=by, until=ends, card=pending.id)

    def expire_overdue(self) -> list[str]:
        """Refuse decisions older than ``[hitl] timeout_hours`` (no-op when unset). Returns their ids."""
        hours = self.config.hitl_timeout_hours
        if hours is None:
            return []
        limit = self.clock() - hours * 3600
        expired = []
        try:
            waiting = self.governance.pending()
        except GovernanceUnreadable:  # fail closed: nothing is expired, the decisions stay waiting
            return []
        for p in waiting:
            if p.id in self._asked:  # being answered now: the person's answer stands
                continue
            created = p.created_at
            if created.tzinfo is None:
                created = created.replace(tzinfo=_dt.timezone.utc)
            if created.timestamp() <= limit:
                self.answer(p.id, "refuse", by="timeout", reason=f"unanswered for {hours:g} h")
                expired.append(p.id)
        return expired

    async def _expiry_scanner(self) -> None:
        while True:
            self.expire_overdue()
            await anyio.sleep(self.config.hitl_scan_interval_secs)

    # ------------------------------------------------------------------ restart
    async def _restore(self) -> None:
        """Re-register persisted agents, reload suspended tasks, close runs a crash cut short."""
        for row in self.records.agents():
            if row["state"] == ProcessState.STOPPED.value:
                continue
            # imported only with an agent to restore: about 2 ms of CPU (the manifest reader and
            # tomllib) that opening a home without one does not pay
            from apollia_nb.runtime.manifest import parse_manifest

            try:
                manifest = parse_manifest(row["manifest"])
                # The workspace resolved when it was registered, not from this process's directory.
                workspace = Path(row["workspace"]) if row.get("workspace") else manifest.workspace_path()
                await self._register(manifest, tools=(), model=None, workspace=workspace)
            except ApolliaError as exc:
                self.records.set_agent_state(row["name"], ProcessState.STOPPED.value)
                self.events.emit("warning", f"agent {row['name']} did not start: {exc}")
        await rebuild_lost_tasks(self)  # tasks runtime.db acknowledged and lost with its write-ahead log
        try:
            pending_by_id: dict[str, Any] | None = {p.id: p for p in self.governance.pending()}
        except GovernanceUnreadable as exc:
            pending_by_id = None
            self.events.emit("warning", f"pending decisions cannot be read: {exc.message}")
        for stored in self.records.tasks(unfinished=True):
            record = TaskRecord.from_json(stored)
            agent = self._agents.get(record.agent)
            if agent is None:
                continue
            run = TaskRun(self, agent, record)
            self._runs[record.id] = run
            await self._recover(run, pending_by_id)

    async def _recover(self, run: TaskRun, pending_by_id: dict[str, Any] | None) -> None:
        """Bring one unfinished task to what the stores acknowledged (``recovery`` decides; this applies).

        Reads the decision the record waits on and the run's trace. An answer the
        journal holds but governance.db does not (a crash between the two) is
        stored now: the journal is the record of what was answered."""
        record = run.r
        awaiting = record.awaiting
        decision, state = None, None
        if awaiting:
            if pending_by_id is None:
                state = "unreadable"
            elif awaiting in pending_by_id:
                decision, state = pending_by_id[awaiting], "pending"
            else:
                try:
                    decision, state = self.governance.get_pending(awaiting), "answered"
                except UnknownDecision:
                    state = "unknown"
                except GovernanceUnreadable:
                    state = "unreadable"
        trace = self.journal.entries(run_id=record.run_id, kinds=[
            "run_open", "model_response", "plan", "answer", "approval", "tool_call", "tool_result", "run_seal"])
        payloads = [(e.kind, _payload(e)) for e in trace]
        if state == "pending":
            journaled = [p for k, p in payloads if k == "answer" and p.get("decision_id") == awaiting]
            if journaled:
                a = journaled[-1]
                decision = self._owned().answer_pending(awaiting, a["answer"], by=a["answered_by"],  # type: ignore[arg-type]
                                                          reason=a.get("reason"))
                state = "answered"
        call_id = decision.call_id if decision is not None else None
        seals = [p for k, p in payloads if k == "run_seal"]
        plans = [p for k, p in payloads if k == "plan"]
        plan_answer = plans[-1] if record.phase is TaskPhase.APPROVE and plans and "approved" in plans[-1] else None
        action = recovery(
            status=record.status.value, unattended=not record.watched,
            awaiting=bool(awaiting), decision=state,
            answered_by=decision.answered_by if decision is not None else None,
            opened=any(k == "run_open" for k, _ in payloads),
            call_started=call_id is not None and any(
                k in ("tool_call", "tool_result") and p.get("call_id") == call_id for k, p in payloads),
            sealed=bool(seals), plan_answered=plan_answer is not None,
        )
        agent = run.agent
        if action in ("park", "resume"):
            if decision is not None:
                card = self._cards[decision.id] = self._restored_card(decision, record, agent)
                answers = [p for k, p in payloads if k == "answer" and p.get("decision_id") == decision.id]
                if answers and card.answer_value is not None:  # the approval's terms, as journaled
                    card.expires_at = answers[-1].get("expires_at")
                    card.approved_digest = answers[-1].get("digest")
                elif card.answer_value is None:  # approvals given so far, of several needed
                    approvals = [{k: v for k, v in p.items() if k not in ("call_id", "decision_id", "approved_by",
                                                                          "needed")}
                                 for k, p in payloads if k == "approval" and p.get("decision_id") == decision.id]
                    if approvals:
                        self._approvals[decision.id] = approvals
            elif action == "resume" and plan_answer is not None:
                run.plan_answer_from(plan_answer)
            if action == "resume" and decision is not None and decision.answer is not None \
                    and decision.answer.value == "always":
                until = next((p.get("until") for k, p in reversed(payloads)
                              if k == "answer" and p.get("decision_id") == decision.id), None)
                self._apply_always(decision, by=decision.answered_by or "restart", until=until)
            agent.inflight.add(run)
            if action == "resume":
                self._recovered.append(run)
                self._spawn(run)
        elif action == "start":
            self._recovered.append(run)
            self._spawn(run)
        elif action == "sealed":  # the run ended (its record is written off the loop and missed the end)
            seal = seals[-1]
            record.end_as_sealed(seal["status"], seal.get("error"))
            if seal["status"] == TaskStatus.COMPLETED.value:  # the result: the actor's last answer
                texts = [p["text"] for k, p in payloads
                         if k == "model_response" and p.get("role") == "actor" and not p.get("tool_calls")]
                record.result = texts[-1] if texts else record.result
            run._save()
            run.done.set()
        elif action == "cancel":
            await run._finish(TaskStatus.CANCELLED, error=None)
            run.done.set()
        else:  # interrupt, lost: it cannot be continued safely; its open decisions close with it
            why = ("the process that owned this run ended before it finished" if action == "interrupt" else
                   f"the decision this run waited on ({awaiting}) is not in governance.db")
            try:
                still_open = self.governance.pending(run_id=record.run_id)
            except GovernanceUnreadable:
                still_open = []
            for p in still_open:
                try:
                    self._record_answer(p.id, "refuse", by="restart", reason=why)
                except ApolliaError as exc:
                    self.events.emit("warning", f"decision {p.id} of task {record.id}: {exc.message}")
            await run._finish(TaskStatus.FAILED, error=Interrupted(why))
            run.done.set()
            self._retire(run)

    def _restored_card(self, p: Any, record: TaskRecord, agent: Agent) -> Card:
        d = p.to_dict()
        card = Card(
            id=p.id, run_id=p.run_id, agent=p.agent, tool=p.tool, family=d["family"],
            arguments=dict(p.arguments), answers=tuple(d["answers"]), reason=p.reason, line=p.line,
            call_id=p.call_id or "", created_at=d["created_at"], task_id=record.id, _runtime=self,
            hints=agent.tools.get(p.tool).annotations if p.tool in agent.tools else None,
        )
        if p.answer is not None:
            card._resolve(p.answer.value, p.answered_by or "", d.get("answered_at") or self.now_iso())
        return card

    async def committed(self) -> None:
        """Wait until ``runtime.db`` holds every row written so far; raises when a write failed.

        For a surface about to acknowledge a change (the REST API's write routes)."""
        await self.recorded("a change about to be acknowledged", acknowledged=True)

    async def recorded(self, what: str, *, acknowledged: bool = False) -> None:
        """Wait until ``runtime.db`` holds every row written so far (off the loop).

        ``acknowledged``: the caller is about to tell someone ``what`` is done (a
        submission, a registration): a failed write is raised, nothing is acknowledged.
        Otherwise a failed write does not undo what already happened (the journal
        holds it); it is reported as a warning, so the run goes on and whoever
        listens is told that a restart may not find ``what``."""
        try:
            await self.records.flush_async()
        except Exception as exc:
            if acknowledged:
                raise
            self.events.emit("warning", f"runtime.db could not record {what}: {exc}")

    @staticmethod
    def run_model(agent: Agent, saved: Any = None) -> Any:
        """The model one task or chat session talks to.

        A model that can start over (``fresh()``, e.g. ``scripted``) gives each run
        its own playthrough, restored from ``saved`` (the run's recorded
        ``state()``) when the run resumes; any other model is the agent's own."""
        fresh = getattr(agent.model, "fresh", None)
        if not callable(fresh):
            return agent.model
        model = fresh()
        if saved:
            model.restore(saved)
        return model

    @staticmethod
    def model_state(model: Any) -> Any:
        state = getattr(model, "state", None)
        return state() if callable(getattr(model, "fresh", None)) and callable(state) else None

    # ------------------------------------------------------------------ audit
    def verify(self) -> Any:
        from apollia_nb.journal.verify import verify_journal

        return verify_journal(self.journal)

    def replay(self, run_id: str) -> Any:
        from apollia_nb.journal.replay import replay_entries

        return replay_entries(run_id, self.journal.entries(run_id=run_id))

    # ------------------------------------------------------------------ sync facade
    @classmethod
    def blocking(cls, home: Home | str | Path | None = None, **kwargs: Any) -> "BlockingRuntime":
        return BlockingRuntime(home, **kwargs)


#: A decision's JSON on every face, in this order: the owner's runtime, and `GET /pending-decisions` and
#: `POST /pending-decisions/decide` of a served home (``wire/schemas.py`` ``PendingDecision``).
DECISION_FIELDS = (
    "id", "run_id", "task_id", "agent", "tool", "family", "arguments", "answers", "created_at", "status", "answer",
    "answered_by", "answered_at", "answer_reason", "reason", "line", "call_id", "hints", "digest", "may_answer",
    "expires_at",
)


def shown_decision(decision: dict[str, Any], *, hints: Any, may_answer: Any = None) -> dict[str, Any]:
    """A waiting or answered decision as it is shown (``DECISION_FIELDS``): its tool's ``hints``, who may
    answer it (``may_answer``: the decision's own when it has one, as an approval short of the number
    needed does; null once answered) and when the approval given ends (``expires_at``, null: never)."""
    shown = {**decision, "hints": hints, "may_answer": decision.get("may_answer", may_answer)}
    return {field: shown.get(field) for field in DECISION_FIELDS}


def _is_running(run: TaskRun) -> bool:
    return run._active


def _payload(entry: Any) -> dict[str, Any]:
    import json

    payload = entry.payload
    return json.loads(payload) if isinstance(payload, (str, bytes)) else dict(payload)


class _PersistedMemory(dict):  # type: ignore[type-arg]
    """The agent's memory: a dict that writes through to ``runtime.db``."""

    def __init__(self, rt: Runtime, agent: str, initial: dict[str, Any]) -> None:
        super().__init__(initial)
        self._rt = rt
        self._agent = agent

    def __setitem__(self, key: str, value: Any) -> None:
        saved = self._rt.records.memory_set(self._agent, key, value, acknowledged=True)
        if saved is not None:
            saved.result()  # committed before the tool says saved (a refused write fails the call)
        super().__setitem__(key, value)


class BlockingRuntime:
    """A synchronous facade: a private event loop in a thread runs the ``Runtime``."""

    def __init__(self, home: Home | str | Path | None = None, **kwargs: Any) -> None:
        from anyio.from_thread import start_blocking_portal

        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        try:
            self.rt: Runtime = self._portal.call(lambda: Runtime.open(home, **kwargs))
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def register_agent(self, manifest: Any, **kw: Any) -> Agent:
        return self._portal.call(lambda: self.rt.register_agent(manifest, **kw))

    def submit(self, agent: str, goal: str, **kw: Any) -> TaskHandle:
        return self._portal.call(lambda: self.rt.submit(agent, goal, **kw))

    def wait(self, handle: TaskHandle) -> TaskHandle:
        return self._portal.call(handle.wait)

    def settled(self, handle: TaskHandle) -> TaskHandle:
        return self._portal.call(handle.settled)

    def run(self, agent: str, goal: str, **kw: Any) -> TaskHandle:
        """Submit and wait until finished or waiting on a person."""
        return self.settled(self.submit(agent, goal, **kw))

    def answer(self, decision_id: str, answer: str, **kw: Any) -> dict[str, Any]:
        return self._portal.call(lambda: _sync(self.rt.answer, decision_id, answer, **kw))

    def stop_agent(self, name: str) -> Agent:
        return self._portal.call(lambda: self.rt.stop_agent(name))

    def batch(self, agent: str, items: Any, **kw: Any) -> Any:
        """``Runtime.batch``; wait with ``wait(handle)``."""
        return self._portal.call(lambda: self.rt.batch(agent, items, **kw))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rt, name)

    def close(self) -> None:
        try:
            self._portal.call(self.rt.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> "BlockingRuntime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)
