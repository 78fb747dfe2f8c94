"""The server's agents, in a kernel that joined ``apollia-os serve``.

A kernel whose home is owned by ``apollia-os serve`` runs its own agents here
and is a client of the server for everything else. The server's agents are
listed beside this kernel's (``%apollia agents``, column ``runs``), and a task
for one of them (``%%apollia task AGENT``, when no agent of that name is
registered in this kernel) is submitted to the server and runs there. Its
handle is a ``ServerTask``: awaitable, ``.status``, ``.pending`` cards
answerable from code (``card.answer("once")``), ``.to_dict()``, all read and
answered over the server's REST API. It shows as a live widget (``ServerRunView``):
its waiting cards have buttons that answer on the server, its plan can be
approved or rejected there, and it is looked at again every few seconds until
the task ends; a displayed ``ServerCard`` has the same buttons. Text and HTML
are the fallbacks.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from apollia_nb.notebook import render
from apollia_nb.notebook.handles import Displayable, TaskFields

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime
    from apollia_nb.runtime.remote import ServerApi

__all__ = ["server_api", "server_agents", "ServerTask", "ServerCard", "Elsewhere", "elsewhere"]

#: How often the server's inbox and runs are looked at for changes made in other processes.
SERVED_POLL_SECS = 2.0
#: How long one wait for a server task is held by the server before it is asked again.
WAIT_SECS = 25.0
#: How often a displayed server task is looked at again while it runs.
SERVED_VIEW_POLL_SECS = 2.0
_FINISHED = ("completed", "failed", "cancelled")
_lock = threading.Lock()


def server_api(bridge: "KernelRuntime") -> "ServerApi | None":
    """The REST API of the server this kernel joined (one per kernel runtime), or None for an owner."""
    from apollia_nb.runtime.remote import ServerApi

    address = bridge.rt.server
    if address is None:
        return None
    with _lock:
        api = getattr(bridge, "_server_api", None)
        if api is None:
            api = ServerApi(address, timeout=WAIT_SECS + 30)
            setattr(bridge, "_server_api", api)  # one per kernel runtime; closed with it (bridge.close)
        return api


def server_agents(bridge: "KernelRuntime") -> list[dict[str, Any]]:
    """The server's agents (``Agent.to_dict()`` as the server sends it); none for an owner."""
    api = server_api(bridge)
    return [] if api is None else list(api("agents"))


class Elsewhere:
    """What the home holds beyond this kernel's own runtime, for the side panel: nothing for a kernel that
    owns the home (its runtime is the home's), the server's agents, tasks and waiting decisions for a
    kernel that joined `apollia-os serve`. Chosen once per kernel (``elsewhere``); the panel only asks."""

    #: The panel's ``mode``; where what is listed from here runs.
    mode = "owner"
    runs = "kernel"
    url: str | None = None

    def __init__(self, bridge: "KernelRuntime") -> None:
        self._bridge = bridge

    async def state(self) -> dict[str, Any]:
        """``{"agents", "tasks", "pending"}``: what is not this kernel's, and every waiting decision."""
        return {"agents": [], "tasks": [], "pending": self._bridge.rt.pending_decisions()}

    async def changes(self, changed: Any) -> None:
        """Call ``changed()`` whenever something changes there that this kernel is not told of: never."""
        return None

    async def answer_plan(self, task_id: str, verdict: str, steps: list[str] | None,
                          reason: str) -> dict[str, Any]:
        from apollia_nb.errors import UnknownTask

        raise UnknownTask(f"no task {task_id!r}")

    async def verify(self) -> dict[str, Any]:
        import anyio

        return (await anyio.to_thread.run_sync(self._bridge.rt.verify)).to_dict()


class _Server(Elsewhere):
    """The server this kernel joined, over its REST API (in worker threads)."""

    mode = "served"
    runs = "server"

    def __init__(self, bridge: "KernelRuntime", api: "ServerApi") -> None:
        super().__init__(bridge)
        self._api = api
        self.url = api.url

    async def state(self) -> dict[str, Any]:
        import anyio

        api = self._api
        return await anyio.to_thread.run_sync(lambda: {
            "agents": list(api("agents")), "tasks": list(api("tasks", None, None)), "pending": list(api("pending"))})

    async def changes(self, changed: Any) -> None:
        """The server's inbox and runs change in other processes too: look every few seconds."""
        import anyio

        api = self._api

        def fingerprint() -> tuple[Any, ...]:
            pending = tuple(sorted(p["id"] for p in api("pending")))
            tasks = tuple(sorted((t["id"], t["status"], t["updated_at"]) for t in api("tasks", None, None)))
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

    async def answer_plan(self, task_id: str, verdict: str, steps: list[str] | None,
                          reason: str) -> dict[str, Any]:
        import anyio

        if verdict == "approve":
            return await anyio.to_thread.run_sync(self._api, "approve_plan", task_id, steps)
        return await anyio.to_thread.run_sync(self._api, "reject_plan", task_id, reason)

    async def verify(self) -> dict[str, Any]:
        import anyio

        return dict(await anyio.to_thread.run_sync(self._api, "verify"))


def elsewhere(bridge: "KernelRuntime") -> Elsewhere:
    """The rest of the home as this kernel sees it: the server's share when it joined one, else nothing."""
    api = server_api(bridge)
    return Elsewhere(bridge) if api is None else _Server(bridge, api)


class ServerCard(Displayable):
    """A decision a server task waits on: ``card.answer("once" | "always" | "refuse")``."""

    def __init__(self, bridge: "KernelRuntime", api: "ServerApi", data: dict[str, Any]) -> None:
        self._bridge = bridge
        self._api = api
        self._data = data

    def __getattr__(self, name: str) -> Any:
        data = self.__dict__.get("_data") or {}
        if name in data:
            return data[name]
        raise AttributeError(name)

    @property
    def waiting(self) -> bool:
        return self._data.get("answer") is None

    def answer(self, answer: str, by: str | None = None, reason: str | None = None, *,
               lasting: str | None = None) -> "ServerCard":
        """Answer it on the server (validated, journaled, applied once); the server's run resumes.
        ``lasting`` ("8h"): how long the standing consent of ``always`` lasts (default: until revoked)."""
        self._data = self._api("decide", self._data["id"], answer, reason, by or self._bridge.user, None, lasting)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dict(self._data)

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import ConsentCardView

        def answer(value: str, lasting: str | None = None) -> dict[str, Any]:
            return self.answer(value, lasting=lasting).to_dict()

        return ConsentCardView(self._bridge, dict(self._data), answer_with=answer)

    def _text(self) -> str:
        return render.card_text(self._data)

    def _html(self) -> str:
        return render.card_html(self._data)


class ServerTask(TaskFields):
    """A task running on the server. ``await task`` returns it finished; ``.status``, ``.pending``."""

    runs = "server"

    def __init__(self, bridge: "KernelRuntime", api: "ServerApi", submitted: dict[str, Any]) -> None:
        self._bridge = bridge
        self._api = api
        self.id: str = submitted["id"]
        first = self.to_dict()
        self.run_id: str = first["run_id"]
        self.agent: str = first["agent"]
        self.goal: str = first["goal"]

    def to_dict(self) -> dict[str, Any]:
        """The task's JSON as the server has it now."""
        return self._api("task", self.id)

    @property
    def status(self) -> str:
        return self.to_dict()["status"]

    @property
    def pending(self) -> list[ServerCard]:
        """This task's waiting decisions, each answerable with ``card.answer(...)``."""
        return [ServerCard(self._bridge, self._api, p) for p in self._api("pending") if p.get("task_id") == self.id]

    @property
    def awaiting_plan_approval(self) -> bool:
        return bool(self.to_dict()["awaiting_plan_approval"])

    def approve_plan(self, steps: list[str] | None = None) -> None:
        self._api("approve_plan", self.id, steps)

    def reject_plan(self, reason: str) -> None:
        self._api("reject_plan", self.id, reason)

    def cancel(self) -> "ServerTask":
        self._api("cancel", self.id)
        return self

    def _until(self, until: str, timeout: float | None = None) -> dict[str, Any]:
        """Long-poll the server until the task is finished (or settled), or ``timeout`` seconds pass."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = WAIT_SECS if deadline is None else max(0.0, min(WAIT_SECS, deadline - time.monotonic()))
            task = self._api("wait", self.id, until, wait)
            if task["status"] in _FINISHED or (until == "settled" and task["status"] == "waiting"):
                return task
            if deadline is not None and time.monotonic() >= deadline:
                from apollia_nb.errors import Expired

                raise Expired(f"task {self.id} is still {task['status']} after {timeout} s")

    async def wait(self) -> "ServerTask":
        """Until the task is completed, failed or cancelled."""
        await asyncio.to_thread(self._until, "finished")
        self.refresh_display()
        return self

    async def settled(self) -> "ServerTask":
        """Until the task is finished or waiting on a person (then answer ``task.pending``)."""
        await asyncio.to_thread(self._until, "settled")
        self.refresh_display()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def join(self, timeout: float | None = None, *, settled: bool = False) -> "ServerTask":
        """Block this thread until finished (or settled)."""
        self._until("settled" if settled else "finished", timeout)
        self.refresh_display()
        return self

    def decisions(self) -> list[dict[str, Any]]:
        """This run's rows of the journal's ``decisions`` view (the server's chain), in order."""
        return self._bridge.decisions(self.run_id)

    def _state(self) -> dict[str, Any]:
        """The task, its waiting cards and its decisions, as the server has them now (for its view)."""
        return {"task": self.to_dict(), "pending": [c.to_dict() for c in self.pending], "decisions": self.decisions()}

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import ServerRunView

        return ServerRunView(self._bridge, self, poll_secs=SERVED_VIEW_POLL_SECS)

    def _text(self) -> str:
        return render.task_text(self.to_dict(), self.decisions()) + "\n  runs on the server"

    def _html(self) -> str:
        waiting = [c.to_dict() for c in self.pending]
        return render.task_html(self.to_dict(), waiting, self.decisions())
