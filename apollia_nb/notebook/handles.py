"""What the magics return: handles on tasks, cards, chat sessions and exchanges, and reports.

Each handle wraps a runtime object that lives on the runtime's own loop
(``bridge.py``) and reaches it only through ``KernelRuntime.call``, so it is
safe to use from a cell, a widget click or a test thread. Handles are
awaitable from any asyncio loop (a cell's ``await``) and can also be waited
for from plain code (``join``). Every handle displays as its live widget
(unless ``show_widgets`` is off) together with ``text/plain`` and
``text/html`` fallbacks; when its view reaches a final state (a task or an
exchange ended, a card answered) the displayed output is updated in place, so
a saved notebook shows how things ended, not how they began.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from apollia_nb.notebook import render

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = [
    "Displayable",
    "Report",
    "AgentInfo",
    "NotebookCard",
    "NotebookTask",
    "NotebookSession",
    "NotebookExchange",
    "PendingInbox",
    "JournalReport",
    "SqlRows",
]


class Displayable:
    """Rich display: the widget view (when enabled) plus ``text/plain`` and ``text/html``."""

    _bridge: "KernelRuntime"
    _view: Any = None

    def _text(self) -> str:
        raise NotImplementedError

    def _html(self) -> str:
        raise NotImplementedError

    def _make_widget(self) -> Any:
        return None

    @property
    def widget(self) -> Any:
        """The live ipywidgets view (created on first use), or None."""
        if self._view is None:
            self._view = self._make_widget()
            if self._view is not None:
                self._view.on_final = self.refresh_display
        return self._view

    def _ipython_display_(self) -> None:
        """Display with a display id, so ``refresh_display`` can bring the fallbacks up to date."""
        import uuid

        from IPython.display import display

        display_id = uuid.uuid4().hex
        self._display_ids = [*getattr(self, "_display_ids", ()), display_id]
        display(self._repr_mimebundle_(), raw=True, display_id=display_id)

    def refresh_display(self) -> None:
        """Re-send what was displayed with the current state.

        The view calls it when it is final, and awaiting a task or exchange calls
        it on return, inside the awaiting cell: a front end that only listens to
        the running cell (a headless run, nbclient) still gets the final state
        when the run ended between two cells."""
        ids = getattr(self, "_display_ids", ())
        if not ids:
            return
        from IPython.display import update_display

        bundle = self._repr_mimebundle_()
        for display_id in ids:
            update_display(bundle, raw=True, display_id=display_id)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {}
        bridge = getattr(self, "_bridge", None)  # a Report has none: it shows no widget
        if bridge is not None and bridge.show_widgets:
            view = self.widget
            if view is not None:
                bundle.update(view.box._repr_mimebundle_() or {})
        bundle["text/plain"] = self._text()
        bundle["text/html"] = self._html()
        return bundle

    def __repr__(self) -> str:
        return self._text()


class Report(Displayable):
    """A static result (a table, a line): ``.data`` holds it as plain Python values."""

    def __init__(self, text: str, html: str, data: Any = None) -> None:
        self.text = text
        self.html = html
        self.data = data

    def _text(self) -> str:
        return self.text

    def _html(self) -> str:
        return self.html

    @classmethod
    def table(cls, columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str,
              data: Any = None) -> "Report":
        return cls(render.table_text(columns, rows, caption), render.table_html(columns, rows, caption),
                   data if data is not None else [dict(zip(columns, r)) for r in rows])


class AgentInfo(Report):
    """A registered agent as it is now (``.data`` is ``Agent.to_dict()``)."""

    def __init__(self, agent: dict[str, Any]) -> None:
        super().__init__(render.agent_text(agent), render.agent_html(agent), agent)

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def state(self) -> str:
        return self.data["state"]


class SqlRows(list):  # type: ignore[type-arg]
    """Rows of a ``%%apollia sql`` query when pandas is not installed; ``.columns`` names them."""

    def __init__(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        super().__init__(tuple(r) for r in rows)
        self.columns = list(columns)

    def _repr_html_(self) -> str:
        return render.table_html(self.columns, self)

    def __repr__(self) -> str:
        return render.table_text(self.columns, self)


# --- cards -----------------------------------------------------------------------------


class NotebookCard(Displayable):
    """A waiting decision: ``card.answer("once" | "always" | "refuse")`` from code or by a click."""

    _FIELDS = ("id", "run_id", "task_id", "session_id", "agent", "tool", "family", "arguments", "answers",
               "reason", "line", "call_id", "created_at", "hints", "answer_value", "answered_by", "answered_at")

    def __init__(self, bridge: "KernelRuntime", card: Any) -> None:
        self._bridge = bridge
        self._card = card

    def __getattr__(self, name: str) -> Any:
        if name in NotebookCard._FIELDS:
            return getattr(self._card, name)
        raise AttributeError(name)

    @property
    def waiting(self) -> bool:
        return self._card.answer_value is None

    def answer(self, answer: str, by: str | None = None, reason: str | None = None, *,
               lasting: str | None = None) -> "NotebookCard":
        """Answer it (only an answer on offer; validated, journaled, applied once); the run resumes.
        ``lasting`` ("8h"): how long the standing consent of ``always`` lasts (default: until revoked)."""
        extra = {"lasting": lasting} if lasting is not None else {}
        self._bridge.call(lambda: self._card.answer(answer, by=by or self._bridge.user, reason=reason, **extra))
        return self

    def to_dict(self) -> dict[str, Any]:
        return self._bridge.call(lambda: copy.deepcopy(self._card.to_dict()))

    def _timeout(self) -> float:
        return self._bridge.chat_card_timeout

    def _text(self) -> str:
        return render.card_text(self.to_dict(), now=self._bridge.rt.clock(), timeout=self._timeout())

    def _html(self) -> str:
        return render.card_html(self.to_dict(), now=self._bridge.rt.clock(), timeout=self._timeout())

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import ConsentCardView
        return ConsentCardView(self._bridge, self.to_dict())


# --- tasks -----------------------------------------------------------------------------


class TaskFields(Displayable):
    """A task's JSON fields as properties, read from ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def error(self) -> dict[str, str] | None:
        return self.to_dict()["error"]

    @property
    def result(self) -> Any:
        return self.to_dict()["result"]

    @property
    def budget(self) -> dict[str, int]:
        return self.to_dict()["budget"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.to_dict()["steps"]


class NotebookTask(TaskFields):
    """A submitted task. ``await task`` returns it finished; ``.status``, ``.pending``, ``.to_dict()``.

    Wherever it runs (``runs``: ``"kernel"``, this kernel's runtime, or ``"server"``, the server a
    kernel joined), it is read, answered and shown the same way (``notebook/home.py``)."""

    def __init__(self, bridge: "KernelRuntime", task: Any) -> None:
        self._bridge = bridge
        self._task = task
        self.id: str = task.id
        self.runs: str = task.runs
        first = self.to_dict()
        self.run_id: str = first["run_id"]
        self.agent: str = first["agent"]
        self.goal: str = first["goal"]

    def to_dict(self) -> dict[str, Any]:
        """The task's JSON (+ goal, plan, verdict, awaiting_plan_approval, timestamps), copied."""
        return self._task.to_dict()

    @property
    def status(self) -> str:
        return self._task.status

    @property
    def pending(self) -> list[NotebookCard]:
        """This task's waiting cards, each answerable with ``card.answer(...)``."""
        return [NotebookCard(self._bridge, c) for c in self._task.pending()]

    @property
    def cards(self) -> list[NotebookCard]:
        """Every card of this task, answered or waiting, oldest first (``pending``: the waiting ones)."""
        return [NotebookCard(self._bridge, c) for c in self._task.cards()]

    @property
    def awaiting_plan_approval(self) -> bool:
        return self._task.awaiting_plan_approval

    def approve_plan(self, steps: list[str] | None = None) -> None:
        self._task.approve_plan(steps)

    def reject_plan(self, reason: str) -> None:
        self._task.reject_plan(reason)

    def cancel(self) -> "NotebookTask":
        self._task.cancel()
        return self

    async def wait(self) -> "NotebookTask":
        """Until the task is completed, failed or cancelled."""
        await self._task.wait()
        self.refresh_display()
        return self

    async def settled(self) -> "NotebookTask":
        """Until the task is finished or waiting on a person (then answer ``task.pending``)."""
        await self._task.settled()
        self.refresh_display()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def join(self, timeout: float | None = None, *, settled: bool = False) -> "NotebookTask":
        """Block this thread until finished (or settled). Never while a card waits on a click in this kernel."""
        self._task.join(timeout, settled=settled)
        self.refresh_display()
        return self

    def _waiting_cards(self) -> list[dict[str, Any]]:
        return self._task.waiting_cards()

    def decisions(self) -> list[dict[str, Any]]:
        """This run's rows of the journal's ``decisions`` view (the home's one chain), in order."""
        return self._bridge.decisions(self.run_id)

    def _text(self) -> str:
        where = "\n  runs on the server" if self.runs == "server" else ""
        return render.task_text(self.to_dict(), self.decisions()) + where

    def _html(self) -> str:
        return render.task_html(self.to_dict(), self._waiting_cards(), self.decisions())

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import RunView
        return RunView(self._bridge, self, self._task)


# --- chat ------------------------------------------------------------------------------


class NotebookSession(Displayable):
    """A chat session: ``send``, ``pause``, ``inject``, ``resume``, plan approval, ``fork``, ``close``."""

    def __init__(self, bridge: "KernelRuntime", session: Any) -> None:
        self._bridge = bridge
        self._session = session
        self.id: str = session.id
        self.agent: str = session.agent.name

    def _call(self, fn: Any, *args: Any) -> Any:
        return self._bridge.call(fn, *args)

    def to_dict(self) -> dict[str, Any]:
        return self._call(lambda: copy.deepcopy(self._session.to_dict()))

    @property
    def state(self) -> str:
        return self._call(lambda: self._session.state)

    @property
    def history(self) -> list[dict[str, Any]]:
        return self._call(lambda: copy.deepcopy(self._session.history))

    @property
    def pending(self) -> list[NotebookCard]:
        bridge = self._bridge
        return self._call(lambda: [NotebookCard(bridge, c) for c in self._session.pending])

    @property
    def pending_plan(self) -> list[str] | None:
        return self._call(lambda: copy.deepcopy(self._session.pending_plan))

    def _exchange(self, exchange: Any) -> "NotebookExchange | None":
        return None if exchange is None else NotebookExchange(self._bridge, self, exchange)

    def send(self, text: str) -> "NotebookExchange":
        return self._exchange(self._call(self._session.send, text))  # type: ignore[return-value]

    def pause(self) -> None:
        self._call(self._session.pause)

    def inject(self, text: str) -> None:
        self._call(self._session.inject, text)

    def resume(self) -> "NotebookExchange | None":
        return self._exchange(self._call(self._session.resume))

    def approve_plan(self, steps: list[str] | None = None) -> "NotebookExchange":
        return self._exchange(self._call(self._session.approve_plan, steps))  # type: ignore[return-value]

    def reject_plan(self, reason: str = "") -> None:
        self._call(self._session.reject_plan, reason)

    def fork(self) -> "NotebookSession":
        return NotebookSession(self._bridge, self._call(self._bridge.rt.sessions.fork, self.id))

    def close(self) -> None:
        self._bridge.block(self._session.close)

    def _text(self) -> str:
        d = self.to_dict()
        return f"Chat {d['id']} with {d['agent']}: {d['state']} · {len(d['history'])} messages"

    def _html(self) -> str:
        d = self.to_dict()
        return (f"<div class='apollia-session'><b>{render._e(d['agent'])}</b> · chat <code>{render._e(d['id'])}</code> "
                f"{render.badge(d['state'])} · {len(d['history'])} messages</div>")


class NotebookExchange(Displayable):
    """One message's work in a session: streams into its chat view; ``await`` it for the reply."""

    def __init__(self, bridge: "KernelRuntime", session: NotebookSession, exchange: Any) -> None:
        self._bridge = bridge
        self.session = session
        self._exchange = exchange
        self.id: str = exchange.id
        self.message: str = exchange.message

    def _get(self, name: str) -> Any:
        return self._bridge.call(lambda: copy.deepcopy(getattr(self._exchange, name)))

    @property
    def status(self) -> str:
        return self._get("status")

    @property
    def reply(self) -> str | None:
        return self._get("reply")

    @property
    def error(self) -> dict[str, str] | None:
        return self._get("error")

    @property
    def events(self) -> list[dict[str, Any]]:
        return self._get("events")

    @property
    def text(self) -> str:
        return "".join(e["text"] for e in self.events if e["type"] == "text")

    @property
    def pending(self) -> list[NotebookCard]:
        return self.session.pending

    async def _until_settled(self) -> None:
        """On the runtime's loop: until the exchange ends, pauses, or a card of it waits."""
        session = self.session._session
        async for event in self._exchange.stream():
            if event["type"] == "card" and any(c.id == event["card"]["id"] for c in session.pending):
                return

    async def wait(self) -> "NotebookExchange":
        """Until the exchange ends (replied, failed or cancelled)."""
        await self._bridge.wait_for(self._exchange.wait)
        self.refresh_display()
        return self

    async def settled(self) -> "NotebookExchange":
        """Until the exchange ends, pauses, or waits on a card (then answer ``exchange.pending``)."""
        await self._bridge.wait_for(self._until_settled)
        self.refresh_display()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def join(self, timeout: float | None = None, *, settled: bool = False) -> "NotebookExchange":
        """Block this thread until the exchange ends (or settles). Never while a card waits on a click here."""
        self._bridge.block(self._until_settled if settled else self._exchange.wait, timeout=timeout)
        self.refresh_display()
        return self

    def _text(self) -> str:
        return render.exchange_text(self.session.to_dict(), self.message, self.events)

    def _html(self) -> str:
        return render.exchange_html(self.session.to_dict(), self.message, self.events)

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import ChatView
        return ChatView(self._bridge, self)


# --- the home's inbox and journal --------------------------------------------------------


class PendingInbox(Displayable):
    """Every waiting decision of the home, answerable; iterate it for ``NotebookCard``s."""

    def __init__(self, bridge: "KernelRuntime") -> None:
        self._bridge = bridge

    @property
    def cards(self) -> list[NotebookCard]:
        bridge = self._bridge
        return bridge.call(lambda: [NotebookCard(bridge, c) for c in bridge.rt.pending])

    def __iter__(self) -> Iterator[NotebookCard]:
        return iter(self.cards)

    def __len__(self) -> int:
        return len(self.cards)

    def __getitem__(self, index: int) -> NotebookCard:
        return self.cards[index]

    def _snaps(self) -> list[dict[str, Any]]:
        rt = self._bridge.rt
        return self._bridge.call(lambda: [copy.deepcopy(c.to_dict()) for c in rt.pending])

    def _text(self) -> str:
        snaps = self._snaps()
        if not snaps:
            return "No pending decisions."
        now, timeout = self._bridge.rt.clock(), self._bridge.chat_card_timeout
        return f"{len(snaps)} pending decision(s)\n" + "\n".join(
            render.card_text(s, now=now, timeout=timeout) for s in snaps)

    def _html(self) -> str:
        snaps = self._snaps()
        if not snaps:
            return "<div class='apollia-inbox'>No pending decisions.</div>"
        now, timeout = self._bridge.rt.clock(), self._bridge.chat_card_timeout
        return (f"<div class='apollia-inbox'><b>{len(snaps)} pending decision(s)</b>"
                + "".join(render.card_html(s, now=now, timeout=timeout) for s in snaps) + "</div>")

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import InboxView
        return InboxView(self._bridge)


JOURNAL_TAIL = 10


class JournalReport(Displayable):
    """The journal's verification state, its head and its latest entries; ``.ok``, ``.report``."""

    def __init__(self, bridge: "KernelRuntime") -> None:
        self._bridge = bridge
        self.refresh()

    def refresh(self) -> "JournalReport":
        """Verify the journal again and re-read its head and tail."""
        rt = self._bridge.rt
        self.report: dict[str, Any] = self._bridge.call(lambda: rt.verify().to_dict())
        self.head = self._bridge.status()
        self.tail = [tuple(str(v) if v is not None else None for v in row) for row in reversed(self._bridge.call(
            lambda: rt.journal.sql(
                f"SELECT seq, ts, run_id, agent, kind FROM entries ORDER BY seq DESC LIMIT {JOURNAL_TAIL}"))
        )]
        return self

    @property
    def ok(self) -> bool:
        return bool(self.report["ok"])

    def _text(self) -> str:
        return render.verify_text(self.report, self.head)

    def _html(self) -> str:
        return render.verify_html(self.report, self.head, render.TAIL_COLUMNS, self.tail)

    def _make_widget(self) -> Any:
        from apollia_nb.notebook.widgets import JournalView
        return JournalView(self._bridge, self)
