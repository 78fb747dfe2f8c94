"""Batches: one agent over many items, each item an unattended task.

``Runtime.batch(agent, items, goal=..., concurrency=N)`` fills the goal for each
item (a ``str.format`` template over the item's fields, or a function of the
item), records the batch and all its items in ``runtime.db`` in one
acknowledged write — every item with the id its task will have — and returns a
:class:`BatchHandle` at once. A runner owned by the runtime then submits the
items in order, keeping at most ``concurrency`` of them pending or running. An
item whose run asks a person suspends (``waiting``, its decision in the pending
decisions) and does not hold a place: the others go on.

The core is values: the batch's states and legal moves are a table
(:data:`BATCH`), what an item's status is and how many items may start are
pure functions (:func:`item_status`, :func:`counts`, :func:`settle`,
:func:`room`). The runner at the edge applies them.

A restart of the owner finds the batch in ``runtime.db``: items whose task is
recorded follow the runtime's rules for tasks (a suspended one waits, one that
never started starts, one cut short while running fails ``INTERRUPTED``);
items with no task recorded are started; a cancelled or completed batch stays
as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

import anyio

from apollia_nb.errors import ApolliaError, BadAnswer, BadInput, Conflict, UnknownBatch
from apollia_nb.runtime.states import Machine, transition
from apollia_nb.runtime.tasks import task_summary

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.capabilities import BatchHost

__all__ = [
    "BATCH",
    "BATCH_TRANSITIONS",
    "ITEM_STATUSES",
    "Batch",
    "BatchHandle",
    "BatchStatus",
    "DaskBatch",
    "card_question",
    "counts",
    "fill_goals",
    "find_batch",
    "group_cards",
    "item_status",
    "normalise_items",
    "restore_batches",
    "room",
    "settle",
    "start_batch",
]


class BatchStatus(StrEnum):
    """Where a batch stands. ``running`` until every item is finished or the batch is cancelled."""

    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


_B = BatchStatus
BATCH_TRANSITIONS: Mapping[BatchStatus, frozenset[BatchStatus]] = MappingProxyType({
    _B.RUNNING: frozenset({_B.COMPLETED, _B.CANCELLED}),
    _B.COMPLETED: frozenset(),
    _B.CANCELLED: frozenset(),
})
BATCH: Machine[BatchStatus] = Machine("batch", BatchStatus, BATCH_TRANSITIONS, BatchStatus.RUNNING)

#: Every status an item shows, in the order counts are given.
ITEM_STATUSES = ("pending", "running", "waiting", "completed", "failed", "cancelled")
_FINISHED = frozenset({"completed", "failed", "cancelled"})
_ACTIVE = frozenset({"pending", "running"})

#: A group's digest (SHA-256, lowercase hex).
_DIGEST = re.compile(r"[0-9a-f]{64}")

#: The most items one batch takes.
MAX_ITEMS = 100_000


# ---------------------------------------------------------------------- the pure core
def item_status(task_status: str | None, error: Mapping[str, Any] | None, batch_status: str) -> str:
    """An item's status: its task's, once it has one; ``failed`` when it could not be submitted;
    ``cancelled`` when the batch was cancelled before it started; ``pending`` otherwise."""
    if task_status is not None:
        return task_status
    if error:
        return "failed"
    return "cancelled" if batch_status == BatchStatus.CANCELLED else "pending"


def counts(statuses: Iterable[str]) -> dict[str, int]:
    """How many items have each status (every status present, zero or not)."""
    seen = Counter(statuses)
    return {s: seen.get(s, 0) for s in ITEM_STATUSES}


def settle(status: str, tally: Mapping[str, int]) -> BatchStatus:
    """The batch's status given its items: a running batch whose items are all finished is completed."""
    current = BATCH.parse(status)
    if current is BatchStatus.RUNNING and not any(tally.get(s, 0) for s in ("pending", "running", "waiting")):
        return transition(BATCH, current, BatchStatus.COMPLETED)
    return current


def room(concurrency: int, active: int, queued: int) -> int:
    """How many queued items may start now: ``concurrency`` places, less those pending or running."""
    return max(0, min(queued, concurrency - active))


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=_plain))


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    return str(value)


def normalise_items(items: Any, key: str | Callable[[dict[str, Any]], Any] | None = None) -> list[tuple[Any, dict[str, Any]]]:
    """``(key, item)`` pairs, each item a JSON-ready dict.

    A pandas DataFrame gives its rows (the key: the row's index label); a
    mapping is one item; a scalar ``x`` becomes ``{"item": x}``. ``key`` names
    a field (or is a function of the item) to key by instead; without it, a
    list is keyed by position."""
    if isinstance(items, (str, bytes, Mapping)):
        raise BadInput("items must be an iterable of items (a list of dicts, a DataFrame), not a single value")
    pairs: list[tuple[Any, dict[str, Any]]] = []
    to_dict = getattr(items, "to_dict", None)
    if callable(to_dict) and hasattr(items, "columns") and hasattr(items, "index"):  # a DataFrame
        rows = zip(items.index, to_dict(orient="records"))
        for label, row in rows:
            pairs.append((_jsonable(label), _jsonable({str(k): v for k, v in row.items()})))
    else:
        try:
            iterator = iter(items)
        except TypeError:
            raise BadInput(f"items must be iterable, not {type(items).__name__}") from None
        for position, raw in enumerate(iterator):
            item = {str(k): v for k, v in raw.items()} if isinstance(raw, Mapping) else {"item": raw}
            pairs.append((position, _jsonable(item)))
            if len(pairs) > MAX_ITEMS:
                break
    if len(pairs) > MAX_ITEMS:
        raise BadInput(f"a batch takes at most {MAX_ITEMS} items")
    if key is not None:
        keyed = []
        for position, (_, item) in enumerate(pairs):
            if callable(key):
                value = key(item)
            elif key in item:
                value = item[key]
            else:
                raise BadInput(f"item {position} has no field {key!r} to key by")
            keyed.append((_jsonable(value), item))
        pairs = keyed
    return pairs


def fill_goals(goal: str | Callable[[dict[str, Any]], str], items: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    """Each item's goal; the first item that cannot fill it raises ``BAD_INPUT`` naming it (nothing starts)."""
    if not (isinstance(goal, str) or callable(goal)):
        raise BadInput("goal must be a template string or a function of the item")
    if isinstance(goal, str) and not goal.strip():
        raise BadInput("a batch needs a goal")
    goals = []
    for position, (item_key, item) in enumerate(items):
        try:
            text = goal.format_map(item) if isinstance(goal, str) else goal(dict(item))
        except KeyError as exc:
            raise BadInput(f"item {position} (key {item_key!r}) has no field {exc.args[0]!r} for the goal "
                           f"(its fields: {', '.join(sorted(item)) or 'none'})") from None
        except (IndexError, ValueError, AttributeError) as exc:
            raise BadInput(f"the goal template cannot be filled from item {position}: {exc}") from None
        if not isinstance(text, str) or not text.strip():
            raise BadInput(f"the goal of item {position} (key {item_key!r}) is empty")
        goals.append(text)
    return goals


def card_question(card: Any) -> dict[str, Any]:
    """What decides what an answer to a card means: who asks, for which tool and family, on which line,
    with which answers on offer. Cards of one question group together; each keeps its own call."""
    return {"agent": card.agent, "tool": card.tool, "family": card.family, "line": card.line,
            "answers": list(card.answers)}


def card_call(card: Any) -> dict[str, Any]:
    """What a card asks to do: its id, its arguments (as shown: sensitive values redacted) and the path
    they resolve to."""
    return {"id": card.id, "arguments": card.arguments, "path": card.path}


def group_cards(cards: Iterable[Any]) -> list[dict[str, Any]]:
    """Waiting cards grouped by their question (:func:`card_question`), largest group first; each group
    lists every card's call (:func:`card_call`), in the order the cards were asked.

    A group's ``key`` is the digest of its question; its ``digest`` also covers which cards it holds and
    each one's arguments and path, so an answer given to a group as shown (``BatchHandle.answer_group``)
    never reaches a card that joined it later, nor a call other than the one shown."""
    from apollia_nb.runtime.tools import canonical_json, text_digest

    groups: dict[str, dict[str, Any]] = {}
    for card in cards:
        question = card_question(card)
        key = text_digest(canonical_json(question))
        group = groups.get(key)
        if group is None:
            group = groups[key] = {"key": key, **question, "cards": []}
        group["cards"].append(card)
    for group in groups.values():
        group["calls"] = [card_call(c) for c in group["cards"]]
        shown = sorted((c["id"], text_digest(canonical_json([c["arguments"], c["path"]]))) for c in group["calls"])
        group["digest"] = text_digest(canonical_json([group["key"], shown]))
    return sorted(groups.values(), key=lambda g: (-len(g["cards"]), g["tool"], g["family"] or "", g["key"]))


# ---------------------------------------------------------------------- the runner
class Batch:
    """One batch in this process: its record, its items, the runner's queue."""

    def __init__(self, rt: BatchHost, record: dict[str, Any], items: list[dict[str, Any]],
                 started: set[int]) -> None:
        self.rt = rt
        self.r = record
        self.items = items
        self.id: str = record["id"]
        self._started = set(started)
        self._final: dict[int, dict[str, Any]] = {}
        self._by_task = {item["task_id"]: item["index"] for item in items}
        self._queue: deque[int] = deque(
            i["index"] for i in items if i["index"] not in self._started and not i["error"])
        self._changed = anyio.Event()
        self.done = anyio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        if self.status != BatchStatus.RUNNING:
            self.done.set()

    @property
    def status(self) -> str:
        return self.r["status"]

    # -- reading
    def view(self, index: int) -> dict[str, Any] | None:
        """The summary of item ``index``'s task (None before it has one)."""
        final = self._final.get(index)
        if final is not None:
            return final
        if index not in self._started:
            return None
        task_id = self.items[index]["task_id"]
        run = self.rt.run_of(task_id)
        record = run.r if run is not None else self.rt.records.task(task_id)
        if record is None:
            return None
        summary = task_summary(record)
        if summary["status"] in _FINISHED:
            self._final[index] = summary
        return summary

    def statuses(self) -> list[str]:
        out = []
        for item in self.items:
            view = self.view(item["index"])
            out.append(item_status(view["status"] if view else None, item["error"], self.status))
        return out

    def counts(self) -> dict[str, int]:
        return counts(self.statuses())

    def active(self) -> int:
        """Items started and not yet finished or waiting: those holding a place."""
        return sum(1 for i in self._started if (v := self.view(i)) is not None and v["status"] in _ACTIVE)

    # -- the runner
    def _listen(self) -> None:
        def listener(kind: str, obj: Any) -> None:
            if kind == "task" and getattr(obj, "id", None) in self._by_task:
                self._changed.set()
                self.rt.events.emit("batch", self)

        self._unsubscribe = self.rt.subscribe(listener)

    async def drive(self) -> None:
        """Submit the queued items as places free up; complete the batch once every item is finished."""
        self._listen()
        try:
            while self.status == BatchStatus.RUNNING:
                self._changed = anyio.Event()
                places = room(self.r["concurrency"], self.active(), len(self._queue))
                while places and self._queue:
                    if await self._start(self._queue.popleft()):  # an item that failed to start holds no place
                        places -= 1
                    if self.status != BatchStatus.RUNNING:
                        return
                if not self._queue:
                    status = settle(self.status, self.counts())
                    if status != self.status:
                        await self._move(status)
                        return
                await self._changed.wait()
        finally:
            if self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None

    async def _start(self, index: int) -> bool:
        """Start item ``index``; False when it could not start (it failed with the code, the others go on)."""
        item = self.items[index]
        try:
            await self.rt.submit(self.r["agent"], item["goal"], max_steps=self.r["max_steps"], watched=False,
                                 task_id=item["task_id"])
        except ApolliaError as exc:  # e.g. AGENT_UNAVAILABLE: the item fails with the code; the others go on
            self._fail_item(index, exc)
            return False
        self._started.add(index)
        self.rt.events.emit("batch", self)
        if self.status == BatchStatus.CANCELLED:  # cancelled while this one was being submitted
            await self._cancel_task(item["task_id"])
        return True

    def _fail_item(self, index: int, exc: ApolliaError) -> None:
        """An item that could not start: failed with the error's code, recorded; the batch goes on."""
        self.items[index]["error"] = {"code": exc.code, "message": exc.message}
        self.rt.records.set_batch_item_error(self.id, index, self.items[index]["error"])
        self.rt.events.emit("batch", self)

    async def _move(self, status: BatchStatus, *, acknowledged: bool = False) -> None:
        self.r["status"] = transition(BATCH, self.status, status).value
        self.r["updated_at"] = self.rt.now_iso()
        written = self.rt.records.set_batch(self.r, self.r["updated_at"], acknowledged=acknowledged)
        if written is not None:
            await asyncio.wrap_future(written)
        else:
            await self.rt.recorded(f"batch {self.id} {status.value}")
        self.done.set()
        self.rt.events.emit("batch", self)

    async def _cancel_task(self, task_id: str) -> None:
        try:
            await self.rt.cancel(task_id)
        except Conflict:  # finished meanwhile
            pass

    async def cancel(self) -> None:
        """Cancel the batch: items not started never start; every unfinished item's task is cancelled."""
        transition(BATCH, self.status, BatchStatus.CANCELLED)  # INVALID_TRANSITION once it is finished
        self._queue.clear()
        await self._move(BatchStatus.CANCELLED, acknowledged=True)
        self._changed.set()
        for index in sorted(self._started):
            view = self.view(index)
            if view is not None and view["status"] not in _FINISHED:
                await self._cancel_task(self.items[index]["task_id"])


class DaskBatch(Batch):
    """A batch whose items run on a ``dask.distributed`` cluster (``runtime/dask_engine.py``).

    Each started item is one Dask future; its status is ``running`` until the
    future is done, then the worker's summary of its task (or a failure with a
    code); the future is released then, so the cluster and the driver hold only
    the running items' tasks, however many items the batch has. An item waiting
    on a person on its worker holds its place."""

    def __init__(self, rt: BatchHost, record: dict[str, Any], items: list[dict[str, Any]], *,
                 spec: Any, client: Any, owned: bool, server: Any) -> None:
        super().__init__(rt, record, items, started=set())
        self.spec = spec
        self._server = server  # the driver's address of the server: where the batch's credential is revoked
        self.client = client
        self._owned = owned
        self._futures: dict[int, Any] = {}
        self._loop = asyncio.get_running_loop()

    def view(self, index: int) -> dict[str, Any] | None:
        final = self._final.get(index)
        if final is not None:
            return final
        if index not in self._started:
            return None
        return {"status": "running", "result": None, "error_code": None, "run_id": None, "steps_used": 0}

    def _settled(self, index: int, future: Any) -> None:  # on the Dask client's thread
        from apollia_nb.runtime.dask_engine import outcome

        summary = outcome(future)
        try:
            self._loop.call_soon_threadsafe(self._record_outcome, index, summary)
        except RuntimeError:  # the driver's loop is closed: the batch ended with its runtime
            pass

    def _record_outcome(self, index: int, summary: dict[str, Any]) -> None:
        self._final[index] = summary
        future = self._futures.pop(index, None)  # its summary is all the batch keeps of a finished item:
        if future is not None:  # the cluster forgets its task and result now, not when the batch is dropped
            with contextlib.suppress(Exception):  # a client already closed has released it
                future.release()
        if summary["status"] == "failed" and summary.get("run_id") is None:
            self.items[index]["error"] = {"code": summary["error_code"], "message": summary.get("message", "")}
        self._changed.set()
        self.rt.events.emit("batch", self)

    async def _start(self, index: int) -> bool:
        from apollia_nb.runtime.dask_engine import send_item

        item = self.items[index]
        try:
            future = send_item(self.client, self.spec, item["task_id"], item["goal"])
        except ApolliaError as exc:  # it cannot be sent (pickled): this item fails, the others go on
            self._fail_item(index, exc)
            return False
        self._futures[index] = future
        self._started.add(index)
        future.add_done_callback(lambda f, i=index: self._settled(i, f))
        self.rt.events.emit("batch", self)
        return True

    async def drive(self) -> None:
        try:
            await super().drive()
        finally:
            with anyio.CancelScope(shield=True):  # also when the runtime closes under the batch
                if self._owned:
                    await anyio.to_thread.run_sync(self.client.close)
                await _revoke(self._server, self.spec.token)  # the batch is over: so is its credential

    async def cancel(self) -> None:
        """Cancel the batch: items not started never start, the futures of unfinished ones are cancelled
        (an item already running on a worker runs to its end there; the batch counts it cancelled)."""
        transition(BATCH, self.status, BatchStatus.CANCELLED)
        self._queue.clear()
        pending = [f for i, f in self._futures.items() if i not in self._final]
        if pending:
            await anyio.to_thread.run_sync(lambda: self.client.cancel(pending))
        for index in self._started:
            self._final.setdefault(index, {"status": "cancelled", "result": None, "error_code": None,
                                           "run_id": None, "steps_used": 0})
        await self._move(BatchStatus.CANCELLED, acknowledged=True)
        self._changed.set()


async def _revoke(server: Any, credential: str) -> None:
    """End a Dask batch's worker credential; a server that cannot be told ends it when it stops."""
    from apollia_nb.runtime.dask_engine import revoke_credential

    try:
        await anyio.to_thread.run_sync(revoke_credential, server, credential)
    except ApolliaError:
        pass


class BatchHandle:
    """A batch: ``await handle`` until it is completed or cancelled; ``.counts()``, ``.results()``,
    ``.pending`` (its waiting cards), ``.pending_groups()``, ``.cancel()``, ``.to_dict()``."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch
        self.id = batch.id

    @property
    def status(self) -> str:
        return self._batch.status

    @property
    def agent(self) -> str:
        return self._batch.r["agent"]

    @property
    def task_ids(self) -> list[str]:
        """The id of each item's task, in item order (a task exists once the item started)."""
        return [item["task_id"] for item in self._batch.items]

    def counts(self) -> dict[str, int]:
        return self._batch.counts()

    def to_dict(self) -> dict[str, Any]:
        r = self._batch.r
        return {"id": self.id, "agent": r["agent"], "status": r["status"], "goal": r["goal"],
                "concurrency": r["concurrency"], "max_steps": r["max_steps"], "total": len(self._batch.items),
                "counts": self.counts(), "created_at": r["created_at"], "updated_at": r["updated_at"]}

    def rows(self) -> list[dict[str, Any]]:
        """One dict per item, in item order: what ``results()`` holds."""
        batch = self._batch
        statuses = batch.statuses()
        out = []
        for item, status in zip(batch.items, statuses):
            view = batch.view(item["index"]) or {}
            error = item["error"] or {}
            out.append({"index": item["index"], "key": item["key"], "status": status,
                        "result": view.get("result"), "error_code": view.get("error_code") or error.get("code"),
                        "run_id": view.get("run_id"), "steps_used": view.get("steps_used", 0),
                        "task_id": item["task_id"] if view else None, "goal": item["goal"]})
        return out

    def results(self) -> Any:
        """The items as a pandas DataFrame (``key, status, result, error_code, run_id, steps_used,
        task_id, goal``), as they stand now."""
        import importlib

        try:  # optional: a batch runs without pandas; only this view needs it
            pd = importlib.import_module("pandas")
        except ImportError:  # pragma: no cover - pandas is in the notebook environments
            raise BadInput("results() needs pandas (pip install pandas); rows() gives the same as dicts") from None
        columns = ["key", "status", "result", "error_code", "run_id", "steps_used", "task_id", "goal"]
        rows = self.rows()
        return pd.DataFrame([{c: r[c] for c in columns} for r in rows], columns=columns,
                            index=pd.Index([r["index"] for r in rows], name="item"))

    @property
    def pending(self) -> list[Any]:
        """This batch's waiting cards, oldest first."""
        ids = self._batch._by_task
        return [c for c in self._batch.rt.pending if c.task_id in ids]

    def pending_groups(self) -> list[dict[str, Any]]:
        """The waiting cards grouped by what an answer to them means (:func:`group_cards`), largest group first:
        ``{"key", "digest", "agent", "tool", "family", "line", "answers", "calls", "cards"}`` (``calls``: each
        card's ``{"id", "arguments", "path"}``, all of them, as the answer will apply to them)."""
        return group_cards(self.pending)

    def answer_group(self, group: Mapping[str, Any] | str, answer: str, *, by: str = "user") -> list[str]:
        """Answer every card of a group as it was shown: ``group`` is a group of :meth:`pending_groups` (or
        its ``digest``), read when the person looked.

        All or nothing: when the waiting cards no longer make that group (a card arrived with the same
        question, or one was answered elsewhere) it is ``CONFLICT``; an answer the group does not offer
        is ``BAD_ANSWER``; either way no card is answered. ``always`` answers the first card ``always``
        (the standing consent, or the rule for the command) and the others ``once``. Returns the ids
        answered."""
        digest = group.get("digest") if isinstance(group, Mapping) else group
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise BadInput("answer_group needs a group of pending_groups() (or its digest): the cards as shown")
        current = next((g for g in self.pending_groups() if g["digest"] == digest), None)
        if current is None:
            raise Conflict("the group is not waiting as it was shown (a card joined it or one was answered "
                           "meanwhile): nothing was answered; read pending_groups() again")
        if answer not in current["answers"]:
            raise BadAnswer(f"{answer!r} is not on offer for this group; answers: {', '.join(current['answers'])}")
        cards = current["cards"]
        answered = []
        for n, card in enumerate(cards):
            given = answer if answer != "always" or n == 0 else "once"
            self._batch.rt.answer(card.id, given, by=by,
                                  reason=None if given == answer else f"released by always on {cards[0].id}")
            answered.append(card.id)
        return answered

    async def cancel(self) -> BatchHandle:
        await self._batch.cancel()
        return self

    async def wait(self) -> BatchHandle:
        """Until the batch is completed or cancelled (items waiting on a person keep it running)."""
        await self._batch.done.wait()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def __repr__(self) -> str:
        c = self.counts()
        return (f"<Batch {self.id} {self.agent} {self.status} done {c['completed']} waiting {c['waiting']} "
                f"failed {c['failed']} running {c['running'] + c['pending']} of {len(self._batch.items)}>")


# ---------------------------------------------------------------------- the runtime's side
async def start_batch(rt: BatchHost, agent: str, items: Any, *, goal: str | Callable[[dict[str, Any]], str],
                      concurrency: int = 4, max_steps: int | None = None,
                      key: str | Callable[[dict[str, Any]], Any] | None = None, engine: str = "local",
                      scheduler: Any = None, server_url: str | None = None,
                      batch_id: str | None = None) -> BatchHandle:
    """Check everything, record the batch (acknowledged), start its runner; returns at once.

    ``batch_id``: the id the batch is recorded with (named before, so a retry can find it; one in use is
    ``CONFLICT``).

    ``engine="dask"`` runs the items on the Dask cluster at ``scheduler`` (``runtime/dask_engine.py``)."""
    the_agent = rt.agent(agent)
    the_agent.check_accepts_work()  # AGENT_UNAVAILABLE before anything is recorded
    if engine not in ("local", "dask"):
        raise BadInput(f"engine must be 'local' or 'dask', not {engine!r}")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 1000:
        raise BadInput("concurrency must be an integer from 1 to 1000")
    if max_steps is not None and (not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1):
        raise BadInput("max_steps must be a positive integer")
    pairs = normalise_items(items, key)
    goals = fill_goals(goal, pairs)
    if batch_id is None:
        batch_id = f"batch-{uuid.uuid4().hex[:12]}"
    elif batch_id in rt.batch_handles or rt.records.batch(batch_id) is not None:
        raise Conflict(f"batch {batch_id} exists already")
    now = rt.now_iso()
    record = {"id": batch_id, "agent": agent, "status": BatchStatus.RUNNING.value,
              "goal": goal if isinstance(goal, str) else f"<function {getattr(goal, '__name__', 'goal')}>",
              "concurrency": concurrency, "max_steps": max_steps, "created_at": now, "updated_at": now}
    task_ids = [f"task-{uuid.uuid4().hex[:12]}" for _ in pairs]
    spec = client = server = None
    if engine == "dask":
        from apollia_nb.runtime.dask_engine import (
            issue_credential,
            item_task_id,
            make_spec,
            open_client,
        )

        task_ids = [item_task_id(batch_id, n) for n in range(len(pairs))]  # what the batch's credential covers
        spec = make_spec(rt, agent, max_steps, server_url, batch_id)  # BAD_INPUT unless a served home's client
        server = cast(Any, rt).server  # the driver's address of the server, with the server's token
        credential = await anyio.to_thread.run_sync(issue_credential, server, spec, len(pairs))
        spec = dataclasses.replace(spec, token=credential)
    rows = [{"index": n, "task_id": task_ids[n], "key": k, "item": item, "goal": g,
             "error": None} for n, ((k, item), g) in enumerate(zip(pairs, goals))]
    try:
        if spec is not None:
            client, owned = await anyio.to_thread.run_sync(open_client, scheduler)
        await asyncio.wrap_future(rt.records.save_batch(record, rows, now))  # created means recorded
    except BaseException:
        with anyio.CancelScope(shield=True):
            if client is not None and owned:
                await anyio.to_thread.run_sync(client.close)
            if spec is not None:
                await _revoke(server, spec.token)
        raise
    batch = (Batch(rt, record, rows, started=set()) if client is None
             else DaskBatch(rt, record, rows, spec=spec, client=client, owned=owned, server=server))
    rt.batch_handles[batch_id] = batch
    rt.start_soon(batch.drive)
    rt.events.emit("batch", batch)
    return BatchHandle(batch)


async def restore_batches(rt: BatchHost) -> None:
    """At boot, after the tasks are restored: every running batch's runner starts again."""
    rows = [r for r in rt.records.batches() if r["status"] == BatchStatus.RUNNING.value]
    if not rows:
        return
    recorded = rt.records.task_ids()
    for record in rows:
        items = rt.records.batch_items(record["id"])
        batch = Batch(rt, record, items, started={i["index"] for i in items if i["task_id"] in recorded})
        rt.batch_handles[batch.id] = batch
        rt.start_soon(batch.drive)


def find_batch(rt: BatchHost, batch_id: str) -> BatchHandle:
    """This process's batch, or a finished one as ``runtime.db`` holds it; ``UNKNOWN_BATCH`` otherwise."""
    batch = rt.batch_handles.get(batch_id) if isinstance(batch_id, str) else None
    if batch is None:
        record = rt.records.batch(batch_id) if isinstance(batch_id, str) else None
        if record is None:
            raise UnknownBatch(f"no batch {batch_id!r}")
        items = rt.records.batch_items(batch_id)
        recorded = rt.records.task_ids()
        batch = Batch(rt, record, items, started={i["index"] for i in items if i["task_id"] in recorded})
    return BatchHandle(batch)


def all_batches(rt: BatchHost) -> list[BatchHandle]:
    """Every batch recorded in this home, oldest first."""
    return [find_batch(rt, r["id"]) for r in rt.records.batches()]
