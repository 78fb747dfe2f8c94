"""The home as a kernel sees it, chosen once per kernel (``kernel_home``): what the magics, widgets and
side panel talk to, never asking where the home lives.

A kernel that owns its home (``KernelHome``) has everything in its own runtime.
A kernel whose home ``apollia-os serve`` owns (``JoinedHome``) runs its own agents
and is a client of the server for everything else; the server's agents, tasks and
waiting decisions are reached through the same ``ServedRuntime`` the CLI uses
(``runtime/served.py``). Both give:

* ``agents()``: this kernel's agents (``runs: "kernel"``) and the server's (``runs: "server"``);
* ``submit(...)``: a task for an agent of this kernel runs here; for an agent only the server
  has, it runs there. Either way the result is a task (``KernelTask`` or ``ServedTask``) with
  one interface, which ``NotebookTask`` and its ``RunView`` use as they are;
* ``state()``, ``changes()``, ``answer_plan()``, ``verify()``: what the side panel shows
  beyond this kernel's own runtime (nothing for an owner).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from apollia_nb.errors import ApolliaError, Expired, Forbidden, UnknownTask

__all__ = ["KernelHome", "JoinedHome", "KernelTask", "ServedTask", "ServedCard", "kernel_home",
           "SERVED_POLL_SECS", "SERVED_VIEW_POLL_SECS"]

#: How often the server's inbox and runs are looked at for changes made in other processes.
SERVED_POLL_SECS = 2.0
#: How often a displayed server task is looked at again while it runs.
SERVED_VIEW_POLL_SECS = 2.0
_FINISHED = ("completed", "failed", "cancelled")


def kernel_home(bridge: Any) -> "KernelHome":
    """The home as ``bridge`` (a ``KernelRuntime``) sees it: the server's share when it joined one."""
    address = bridge.rt.server
    if address is None:
        return KernelHome(bridge)
    # lazy: a client of a server only (the REST client imports httpx; %load_ext imports neither, see
    # tests/test_load_ext_lazy.py)
    from apollia_nb.runtime.remote import ServerApi
    from apollia_nb.runtime.served import WAIT_SECS, ServedRuntime

    rt = bridge.rt
    return JoinedHome(bridge, ServedRuntime(ServerApi(address, timeout=WAIT_SECS + 30), journal=lambda: rt.journal))


# --- the tasks ------------------------------------------------------------------------------------------


class KernelTask:
    """A task of this kernel's runtime (a ``TaskHandle``), reached on the runtime's thread."""

    runs = "kernel"

    def __init__(self, bridge: Any, handle: Any) -> None:
        self._bridge = bridge
        self._handle = handle
        self.id: str = handle.id

    def to_dict(self) -> dict[str, Any]:
        return self._bridge.call(lambda: copy.deepcopy(self._handle.to_dict()))

    @property
    def status(self) -> str:
        return self._bridge.call(lambda: self._handle.status)

    def pending(self) -> list[Any]:
        """Its waiting cards (the runtime's ``Card``)."""
        return self._bridge.call(lambda: list(self._handle.pending))

    def cards(self) -> list[Any]:
        rt = self._bridge.rt
        return self._bridge.call(lambda: list(rt.cards_of(self.id)))

    def waiting_cards(self) -> list[dict[str, Any]]:
        return self._bridge.call(lambda: [copy.deepcopy(c.to_dict()) for c in self._handle.pending])

    @property
    def awaiting_plan_approval(self) -> bool:
        return self._bridge.call(lambda: self._handle.awaiting_plan_approval)

    def approve_plan(self, steps: list[str] | None = None) -> None:
        self._bridge.call(self._handle.approve_plan, steps)

    def reject_plan(self, reason: str) -> None:
        self._bridge.call(self._handle.reject_plan, reason)

    def cancel(self) -> None:
        self._bridge.block(self._bridge.rt.cancel, self.id)

    async def wait(self) -> None:
        await self._bridge.wait_for(self._handle.wait)

    async def settled(self) -> None:
        await self._bridge.wait_for(self._handle.settled)

    def join(self, timeout: float | None = None, *, settled: bool = False) -> None:
        self._bridge.block(self._handle.settled if settled else self._handle.wait, timeout=timeout)

    def answerer(self, card_id: str) -> Callable[..., dict[str, Any]] | None:
        """How a click on one of its cards answers: None, this kernel's runtime (the card view's own way)."""
        return None

    def follow(self, apply: Callable[[dict[str, Any]], None]) -> Callable[[], None] | None:
        """Nothing to look at again: this runtime tells its views of every change."""
        return None


class ServedCard:
    """A decision a server task waits on, as the server has it: the fields of the runtime's ``Card``
    and ``answer(...)``, answered on the server (validated, journaled and applied there)."""

    def __init__(self, served: Any, data: dict[str, Any], user: str) -> None:
        self._served = served
        self._data = data
        self._user = user

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("_data") or {}
        key = "answer" if name == "answer_value" else name
        if key in data:
            value = data[key]
            return tuple(value) if key == "answers" else value
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def answer(self, answer: str, by: str | None = None, reason: str | None = None, *,
               lasting: str | None = None) -> dict[str, Any]:
        """``lasting`` ("8h"): how long the standing consent of ``always`` lasts (default: until revoked)."""
        self._data = self._served.decide(self._data["id"], answer, reason=reason, by=by or self._user,
                                         lasting=lasting)
        return dict(self._data)


class ServedTask:
    """A task that runs on the server this kernel joined, read and answered over its REST API (blocking calls
    are made in worker threads, never on an event loop)."""

    runs = "server"

    def __init__(self, bridge: Any, served: Any, submitted: dict[str, Any]) -> None:
        self._bridge = bridge
        self._served = served
        self.id: str = submitted["id"]

    def to_dict(self) -> dict[str, Any]:
        return self._served.task(self.id)

    @property
    def status(self) -> str:
        return self.to_dict()["status"]

    def pending(self) -> list[ServedCard]:
        return [ServedCard(self._served, p, self._bridge.user) for p in self._served.pending()
                if p.get("task_id") == self.id]

    def cards(self) -> list[ServedCard]:
        """Its waiting cards (the server lists the waiting ones; the run's decisions hold the answered)."""
        return self.pending()

    def waiting_cards(self) -> list[dict[str, Any]]:
        return [c.to_dict() for c in self.pending()]

    @property
    def awaiting_plan_approval(self) -> bool:
        return bool(self.to_dict()["awaiting_plan_approval"])

    def approve_plan(self, steps: list[str] | None = None) -> None:
        self._served.approve_plan(self.id, steps)

    def reject_plan(self, reason: str) -> None:
        self._served.reject_plan(self.id, reason)

    def cancel(self) -> None:
        self._served.cancel(self.id)

    def _until(self, until: str, timeout: float | None = None) -> dict[str, Any]:
        """Long-poll the server until the task is finished (or settled), or ``timeout`` seconds pass."""
        from apollia_nb.runtime.served import WAIT_SECS  # lazy: a served task's only (see kernel_home)

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = WAIT_SECS if deadline is None else max(0.0, min(WAIT_SECS, deadline - time.monotonic()))
            task = self._served.wait(self.id, until, wait)
            if task["status"] in _FINISHED or (until == "settled" and task["status"] == "waiting"):
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise Expired(f"task {self.id} is still {task['status']} after {timeout} s")

    async def wait(self) -> None:
        await asyncio.to_thread(self._until, "finished")

    async def settled(self) -> None:
        await asyncio.to_thread(self._until, "settled")

    def join(self, timeout: float | None = None, *, settled: bool = False) -> None:
        self._until("settled" if settled else "finished", timeout)

    def answerer(self, card_id: str) -> Callable[..., dict[str, Any]]:
        """A click on one of its cards answers on the server, as ``card.answer(...)`` does."""
        served, user = self._served, self._bridge.user

        def answer(value: str, lasting: str | None = None) -> dict[str, Any]:
            return served.decide(card_id, value, reason=None, by=user, lasting=lasting)

        return answer

    def state(self) -> dict[str, Any]:
        """The task and its waiting cards as the server has them now."""
        return {"task": self.to_dict(), "pending": self.waiting_cards()}

    def follow(self, apply: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Look at the task again every ``SERVED_VIEW_POLL_SECS`` (in a worker thread) and hand ``apply`` its
        ``state()`` where views live, until it ends or the returned function is called."""
        bridge = self._bridge
        stopped = threading.Event()

        async def poll() -> None:  # on the runtime's loop; the server is asked in a worker thread
            while not stopped.is_set():
                await asyncio.sleep(SERVED_VIEW_POLL_SECS)
                try:
                    state = await asyncio.to_thread(self.state)
                except ApolliaError as exc:  # the server is away for now: said, and asked again
                    bridge.deliver(apply, {"error": exc})
                    continue
                bridge.deliver(apply, state)
                if state["task"]["status"] in _FINISHED:
                    return

        future = bridge.start(poll)

        def stop() -> None:
            stopped.set()
            future.cancel()

        return stop


def _if_allowed(read: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What ``read`` lists, or nothing when this kernel's person has no role that reads it."""
    try:
        return read()
    except Forbidden:
        return []


# --- the home -------------------------------------------------------------------------------------------


class KernelHome:
    """A kernel that owns its home: its runtime is the home's, and nothing lies beyond it."""

    #: The panel's ``mode``; where what is listed from beyond this kernel runs.
    mode = "owner"
    runs = "kernel"
    url: str | None = None

    def __init__(self, bridge: Any) -> None:
        self._bridge = bridge

    def _kernel_has(self, agent: str) -> bool:
        rt = self._bridge.rt
        return bool(self._bridge.call(lambda: any(a.name == agent for a in rt.agents())))

    def agents(self) -> list[dict[str, Any]]:
        """This kernel's agents, then those beyond it; each marked with where it ``runs``."""
        rt = self._bridge.rt
        mine = self._bridge.call(lambda: [{**a.to_dict(), "runs": "kernel"} for a in rt.agents()])
        return mine + [{**a, "runs": self.runs} for a in self._theirs()]

    def _theirs(self) -> list[dict[str, Any]]:
        return []

    def submit(self, agent: str, goal: str, *, watched: bool, max_steps: int | None,
               approve_plan: bool) -> KernelTask | ServedTask:
        """A task for ``agent``: in this kernel when it has the agent (an unknown one is ``UNKNOWN_AGENT``)."""
        bridge = self._bridge
        handle = bridge.call(bridge.rt.submit, agent, goal, max_steps=max_steps, watched=watched,
                             approve_plan=approve_plan)
        return KernelTask(bridge, handle)

    # the side panel
    async def state(self) -> dict[str, Any]:
        """``{"agents", "tasks", "pending"}``: what is not this kernel's, and every waiting decision."""
        return {"agents": [], "tasks": [], "pending": self._bridge.rt.pending_decisions()}

    async def changes(self, changed: Any) -> None:
        """Call ``changed()`` whenever something changes there that this kernel is not told of: never."""
        return None

    async def me(self) -> dict[str, Any] | None:
        """Who the server says this kernel is (``GET /people/me``); None: no server (the local user)."""
        return None

    async def answer_plan(self, task_id: str, verdict: str, steps: list[str] | None,
                          reason: str) -> dict[str, Any]:
        raise UnknownTask(f"no task {task_id!r}")

    async def verify(self) -> dict[str, Any]:
        return (await anyio.to_thread.run_sync(self._bridge.rt.verify)).to_dict()

    def close(self) -> None:
        return None


class JoinedHome(KernelHome):
    """A kernel that joined `apollia-os serve`: its own agents, and the server's through ``ServedRuntime``."""

    mode = "served"
    runs = "server"

    def __init__(self, bridge: Any, served: Any) -> None:
        super().__init__(bridge)
        self.served = served
        self.url = served.url
        self._me: dict[str, Any] | None = None

    def _theirs(self) -> list[dict[str, Any]]:
        return self.served.agents()

    def submit(self, agent: str, goal: str, *, watched: bool, max_steps: int | None,
               approve_plan: bool) -> KernelTask | ServedTask:
        """A task for an agent of this kernel runs here; for one only the server has, it runs there."""
        if not self._kernel_has(agent) and any(a["name"] == agent for a in self._theirs()):
            submitted = self.served.submit(agent, goal, watched=watched, max_steps=max_steps,
                                           approve_plan=approve_plan)
            return ServedTask(self._bridge, self.served, submitted)
        return super().submit(agent, goal, watched=watched, max_steps=max_steps, approve_plan=approve_plan)

    async def state(self) -> dict[str, Any]:
        """The server's agents, runs and waiting decisions, as far as this kernel's person may read them:
        an approver who neither runs nor audits sees the waiting decisions alone."""
        served = self.served
        return await anyio.to_thread.run_sync(lambda: {
            "agents": _if_allowed(served.agents), "tasks": _if_allowed(served.tasks), "pending": served.pending()})

    async def changes(self, changed: Any) -> None:
        """The server's inbox and runs change in other processes too: look every few seconds."""
        served = self.served

        def fingerprint() -> tuple[Any, ...]:
            pending = tuple(sorted(p["id"] for p in served.pending()))
            tasks = tuple(sorted((t["id"], t["status"], t["updated_at"]) for t in _if_allowed(served.tasks)))
            return pending, tasks

        seen: Any = None
        while True:
            try:
                now = await anyio.to_thread.run_sync(fingerprint)
            except Exception:  # the server is away for now: the snapshot will say so when asked
                now = None
            if now is not None and now != seen:
                if seen is not None:
                    changed()
                seen = now
            await anyio.sleep(SERVED_POLL_SECS)

    async def me(self) -> dict[str, Any] | None:
        """Asked once and kept for the kernel's life (its token does not change); an error is raised and
        the next call asks again."""
        if self._me is None:
            self._me = await anyio.to_thread.run_sync(self.served.me)
        return self._me

    async def answer_plan(self, task_id: str, verdict: str, steps: list[str] | None,
                          reason: str) -> dict[str, Any]:
        served = self.served
        if verdict == "approve":
            await anyio.to_thread.run_sync(functools.partial(served.approve_plan, task_id, steps))
        else:
            await anyio.to_thread.run_sync(served.reject_plan, task_id, reason)
        return await anyio.to_thread.run_sync(served.task, task_id)

    async def verify(self) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(self.served.verify)

    def close(self) -> None:
        self.served.close()
