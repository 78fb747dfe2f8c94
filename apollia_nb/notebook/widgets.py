"""The notebook's widgets (ipywidgets 8): consent card, plan approval, run view, chat view, inbox, journal.

Each view is a thin shell: its parts are ``HTML`` widgets filled by the pure
functions of ``render.py``, plus buttons. A view learns of changes from the
runtime's notifications (``KernelRuntime.watch``: plain snapshots, delivered
on the kernel's loop) and acts through the runtime's own calls
(``Runtime.answer``, ``approve_plan``, ``reject_plan``), so a click and a line
of code do the same thing and are journaled the same way. ``view.box`` is the
widget to display. Imported only when something is displayed.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as W

from apollia_nb.errors import ApolliaError, BadInput
from apollia_nb.notebook import render

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = ["ConsentCardView", "PlanApprovalView", "RunView", "ChatView", "InboxView", "JournalView"]

_ANSWER_STYLE = {"once": "success", "always": "info", "refuse": "danger"}
#: The answers' colours, dark enough that white text on them passes WCAG AA (4.5:1) in every theme
#: (ipywidgets' own "success"/"info" are white on light green and cyan).
_ANSWER_COLOUR = {"once": "#1a7f37", "always": "#0550ae", "refuse": "#b3261e"}
_ANSWER_TIP = {
    "once": "Allow this call only",
    "always": "Allow and remember (a standing consent for this family, or a rule for this command)",
    "refuse": "Refuse this call; the tool does not run",
}
_TERMINAL = ("completed", "failed", "cancelled")
_BOX = W.Layout(border="1px solid #d0d7de", padding="4px 8px", margin="2px 0")


#: How long an ``always`` lasts, as the select beside it offers (the value is the answer's ``lasting``).
LIFETIMES: tuple[tuple[str, str | None], ...] = (("until revoked", None), ("for 1 h", "1h"), ("for 8 h", "8h"),
                                                  ("for 24 h", "24h"))


def _nothing() -> None:
    return None


def _error_html(exc: ApolliaError) -> str:
    return f"<span style='color:#cf222e'><code>{render._e(render.error_line(exc.code, exc.message))}</code></span>"


class ConsentCardView:
    """One card: who asks for what and why, the answers on offer as buttons; frozen once answered."""

    def __init__(self, bridge: "KernelRuntime", snap: dict[str, Any], *,
                 answer_with: Callable[..., dict[str, Any]] | None = None) -> None:
        self.bridge = bridge
        self.snap = snap
        self.frozen = False
        # How a click answers: this kernel's runtime, or (a server's card) the server's REST API,
        # returning the decision as stored there.
        self._answer_with = answer_with
        self.header = W.HTML(render.card_header_html(snap))
        self.arguments = W.HTML(render.arguments_html(snap.get("arguments") or {}))
        self.reason = W.HTML(render.card_reason_html(snap))
        self.buttons: dict[str, W.Button] = {}
        for answer in snap["answers"]:
            button = W.Button(description=answer, button_style=_ANSWER_STYLE.get(answer, ""),
                              tooltip=_ANSWER_TIP.get(answer, ""))
            if answer in _ANSWER_COLOUR:
                button.style.button_color = _ANSWER_COLOUR[answer]
                button.style.text_color = "#ffffff"
            button.on_click(functools.partial(self._clicked, answer))
            self.buttons[answer] = button
        # ``always`` for a family (not a command's rule, which has no end): until revoked or for a while
        self.lifetime: W.Dropdown | None = None
        row: list[Any] = list(self.buttons.values())
        if "always" in self.buttons and snap.get("line") != 4:
            self.lifetime = W.Dropdown(options=list(LIFETIMES), value=None, description="",
                                       tooltip="how long the standing consent of always lasts",
                                       layout=W.Layout(width="9em"))
            row.insert(row.index(self.buttons["always"]) + 1, self.lifetime)
        self.button_row = W.HBox(row)
        self.state = W.HTML()
        self.error = W.HTML()
        self.box = W.VBox([self.header, self.arguments, self.reason, self.button_row, self.state, self.error],
                          layout=_BOX)
        self._stop_tick: Callable[[], None] | None = None
        self.on_final: Callable[[], None] = _nothing
        self._unwatch = bridge.watch(self._on_change)
        if snap.get("session_id") and not snap.get("answer"):
            self._stop_tick = bridge.every(1.0, self._render_state)
        self.apply(snap)

    @property
    def answers(self) -> list[str]:
        """The answers offered as buttons (exactly the card's)."""
        return list(self.buttons)

    def _clicked(self, answer: str, _button: Any = None) -> None:
        if self.frozen:
            return
        lasting = self.lifetime.value if answer == "always" and self.lifetime is not None else None
        extra = {"lasting": lasting} if lasting is not None else {}
        if self._answer_with is not None:
            try:
                stored = self._answer_with(answer, **extra)
            except ApolliaError as exc:
                self.error.value = _error_html(exc)
                return
            self.error.value = ""
            self.apply({**self.snap, **{k: stored.get(k) for k in ("answer", "answered_by", "answered_at")}})
            return
        rt = self.bridge.rt
        try:
            self.bridge.call(rt.answer, self.snap["id"], answer, by=self.bridge.user, **extra)
            self.error.value = ""
        except ApolliaError as exc:
            self.error.value = _error_html(exc)
        self._refresh()

    def _refresh(self) -> None:
        """Read the decision's stored state (it may have been answered elsewhere) and show it."""
        rt = self.bridge.rt
        try:
            stored = self.bridge.call(lambda: rt.governance.get_pending(self.snap["id"]).to_dict())
        except ApolliaError:
            return
        if stored.get("answer"):
            self.apply({**self.snap, "answer": stored["answer"], "answered_by": stored["answered_by"],
                        "answered_at": stored["answered_at"]})

    def _on_change(self, kind: str, snap: dict[str, Any]) -> None:
        if kind == "card" and snap["id"] == self.snap["id"]:
            self.apply(snap)

    def apply(self, snap: dict[str, Any]) -> None:
        if self.frozen:
            return
        self.snap = snap
        self._render_state()
        if snap.get("answer"):
            self._freeze()

    def _render_state(self) -> None:
        snap = self.snap
        if snap.get("answer"):
            self.state.value = (f"Answered {render.badge(snap['answer'])} by {render._e(snap.get('answered_by'))} "
                                f"at {render._e(snap.get('answered_at'))}")
        elif snap.get("session_id"):
            left = render.countdown_text(snap["created_at"], self.bridge.rt.clock(), self.bridge.chat_card_timeout)
            self.state.value = f"<span style='color:#9a6700'>{render._e(left)}</span>"
        else:
            self.state.value = "<span style='color:#57606a'>waiting for an answer</span>"

    def answered_elsewhere(self) -> None:
        """It no longer waits and this view did not answer it (the server's card, answered by another client)."""
        if not self.frozen:
            self.state.value = "<span style='color:#57606a'>answered elsewhere (see the run's decisions)</span>"
            self._freeze()

    def _freeze(self) -> None:
        self.frozen = True
        for button in self.buttons.values():
            button.disabled = True
        if self.lifetime is not None:
            self.lifetime.disabled = True
        self.button_row.layout.display = "none"
        if self._stop_tick is not None:
            self._stop_tick()
            self._stop_tick = None
        self._unwatch()
        self.on_final()


class PlanApprovalView:
    """The proposed steps, editable one per line; approve (as edited) or reject with a reason."""

    def __init__(self, steps: list[str], *, on_approve: Callable[[list[str] | None], Any],
                 on_reject: Callable[[str], Any]) -> None:
        self.original = list(steps)
        self.on_approve = on_approve
        self.on_reject = on_reject
        self.decided: str | None = None
        self.steps = W.Textarea(value="\n".join(steps), rows=max(3, len(steps) + 1),
                                layout=W.Layout(width="100%"))
        self.approve_button = W.Button(description="approve", button_style="success")
        self.reason = W.Text(placeholder="reason for rejecting")
        self.reject_button = W.Button(description="reject", button_style="danger")
        self.approve_button.on_click(self._approve)
        self.reject_button.on_click(self._reject)
        self.state = W.HTML()
        self.error = W.HTML()
        self.box = W.VBox([W.HTML("<b>Proposed plan</b> — one step per line; edit before approving"), self.steps,
                           W.HBox([self.approve_button, self.reason, self.reject_button]), self.state, self.error],
                          layout=_BOX)

    def edited_steps(self) -> list[str]:
        return [line.strip() for line in self.steps.value.splitlines() if line.strip()]

    def _approve(self, _button: Any = None) -> None:
        steps = self.edited_steps()
        try:
            if not steps:
                raise BadInput("a plan needs at least one step")
            edited = steps != self.original
            self.on_approve(steps if edited else None)
        except ApolliaError as exc:
            self.error.value = _error_html(exc)
            return
        self._decide("approved (edited)" if edited else "approved")

    def _reject(self, _button: Any = None) -> None:
        reason = self.reason.value.strip()
        try:
            self.on_reject(reason)
        except ApolliaError as exc:
            self.error.value = _error_html(exc)
            return
        self._decide(f"rejected: {reason or 'no reason given'}")

    def _decide(self, words: str) -> None:
        self.decided = words
        self.error.value = ""
        self.state.value = f"Plan {render._e(words)}"
        for part in (self.steps, self.approve_button, self.reason, self.reject_button):
            part.disabled = True


class RunView:
    """A task as it runs: steps and tool calls, decisions, budget bar, cards, plan approval, outcome."""

    def __init__(self, bridge: "KernelRuntime", task: Any, source: Any) -> None:
        """``task``: the ``NotebookTask``; ``source``: where it runs (``notebook/home.py``), which says how
        its cards are answered and whether its changes must be looked at again (a server's task)."""
        self.bridge = bridge
        self.task = task
        self.source = source
        self.snap = task.to_dict()
        self.header = W.HTML()
        self.budget = W.IntProgress(min=0, max=max(1, self.snap["budget"]["ceiling"]), value=0,
                                    description="budget", bar_style="info")
        self.budget_label = W.Label()
        self.timeline = W.HTML()
        self.decisions = W.HTML()
        self.outcome = W.HTML()
        self.plan_box = W.VBox()
        self.cards_box = W.VBox()
        self.cards: dict[str, ConsentCardView] = {}
        self.plan_view: PlanApprovalView | None = None
        self.on_final: Callable[[], None] = _nothing
        self.box = W.VBox([self.header, W.HBox([self.budget, self.budget_label]), self.timeline, self.decisions,
                           self.plan_box, self.cards_box, self.outcome], layout=_BOX)
        self.error = W.HTML()
        self.box.children = (*self.box.children, self.error)
        self._unwatch: Callable[[], None] | None = bridge.watch(self._on_change)
        for card in task._waiting_cards():
            self._add_card(card)
        self.apply(task.to_dict())
        # A task that runs elsewhere is looked at again until it ends (none for this kernel's own).
        self._unfollow: Callable[[], None] | None = None if self.final else source.follow(self.apply_state)

    @property
    def final(self) -> bool:
        return self.snap["status"] in _TERMINAL

    def apply_state(self, state: dict[str, Any]) -> None:
        """The task and its waiting cards as they stand where it runs (``{"task", "pending"}``), or
        ``{"error"}`` when that could not be read now: cards no longer waiting were answered elsewhere."""
        error = state.get("error")
        if error is not None:
            self.error.value = _error_html(error)
            return
        self.error.value = ""
        waiting = {p["id"] for p in state["pending"]}
        for view in self.cards.values():
            if view.snap["id"] not in waiting and not view.frozen:
                view._refresh()  # its answer as stored: by whom and when
                view.answered_elsewhere()  # (when that could not be read)
        for p in state["pending"]:
            self._add_card(p)
        self.apply(state["task"])

    def _on_change(self, kind: str, snap: dict[str, Any]) -> None:
        if kind == "task" and snap["id"] == self.task.id:
            self.apply(snap)
        elif kind == "card" and snap.get("task_id") == self.task.id and snap["id"] not in self.cards:
            if not snap.get("answer"):
                self._add_card(snap)

    def _add_card(self, snap: dict[str, Any]) -> None:
        if snap["id"] in self.cards:  # seen both in the first read and in a notification
            return
        view = ConsentCardView(self.bridge, snap, answer_with=self.source.answerer(snap["id"]))
        self.cards[snap["id"]] = view
        self.cards_box.children = (*self.cards_box.children, view.box)

    def apply(self, snap: dict[str, Any]) -> None:
        self.snap = snap
        budget = snap["budget"]
        self.header.value = render.task_header_html(snap)
        self.budget.max = max(1, budget["ceiling"])
        self.budget.value = min(budget["used"], self.budget.max)
        self.budget.bar_style = {"failed": "danger", "completed": "success"}.get(snap["status"], "info")
        self.budget_label.value = render.budget_words(snap)
        waiting = [v.snap for v in self.cards.values() if not v.frozen]
        self.timeline.value = render.timeline_html(snap, waiting)
        self.decisions.value = render.decisions_html(self.bridge.decisions(self.task.run_id))
        self.outcome.value = render.task_outcome_html(snap)
        if snap.get("awaiting_plan_approval") and self.plan_view is None:
            self.plan_view = PlanApprovalView(snap["plan"], on_approve=self.task.approve_plan,
                                              on_reject=self.task.reject_plan)
            self.plan_box.children = (self.plan_view.box,)
        elif self.plan_view is not None and self.plan_view.decided is None and not snap.get("awaiting_plan_approval"):
            self.plan_view._decide("approved elsewhere" if snap["status"] != "failed" else "answered elsewhere")
        if snap["status"] in _TERMINAL and self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
            unfollow, self._unfollow = getattr(self, "_unfollow", None), None
            if unfollow is not None:
                unfollow()
            self.on_final()


class ChatView:
    """A chat exchange streaming in: the message, tool results, cards with their countdown, the reply."""

    def __init__(self, bridge: "KernelRuntime", exchange: Any) -> None:
        """``exchange``: the ``NotebookExchange`` to stream."""
        self.bridge = bridge
        self.exchange = exchange
        self.session = exchange.session
        self.header = W.HTML()
        # Watch before reading, so a change after the read is seen. Without a kernel loop a
        # change is delivered on the runtime's thread, maybe while the read is under way: a
        # change delivered by then is kept (anything newer than it is delivered too).
        self._snap_lock = threading.Lock()
        self.session_snap: dict[str, Any] | None = None
        self._unwatch = bridge.watch(self._on_change)
        snap = self.session.to_dict()
        with self._snap_lock:
            if self.session_snap is None:
                self.session_snap = snap
                self.header.value = render.session_header_html(snap)
        self.transcript = W.HTML()
        self.cards_box = W.VBox()
        self.plan_box = W.VBox()
        self.cards: dict[str, ConsentCardView] = {}
        self.plan_view: PlanApprovalView | None = None
        self.turns: list[tuple[str, list[dict[str, Any]]]] = []
        self.followers: list[Any] = []  # one future per followed exchange; done when it ends or pauses
        self.on_final: Callable[[], None] = _nothing
        self.box = W.VBox([self.header, self.transcript, self.cards_box, self.plan_box], layout=_BOX)
        self.follow(exchange)

    def follow(self, exchange: Any) -> None:
        """Stream an exchange's events (from its first) into this view, past pauses.

        Each follower is done when the exchange ends or pauses; at a pause, the
        next follower waits for the exchange to go on (the session resumed) and
        streams what follows into the same turn."""
        events: list[dict[str, Any]] = []
        self.turns.append((exchange.message, events))
        bridge = self.bridge
        live = exchange._exchange

        async def follow(start: int) -> None:  # on the runtime's loop
            seen, last = start, None
            async for event in live.stream(start):
                seen, last = seen + 1, event["type"]
                bridge.deliver(self._on_event, events, copy.deepcopy(event))
            if last == "paused":  # (it may have been resumed already: then go_on starts at once)
                self.followers.append(bridge.start(go_on, seen))

        async def go_on(start: int) -> None:
            while len(live.events) <= start:
                await live._changed.wait()
            await follow(start)

        self.followers.append(bridge.start(follow, 0))

    def _on_event(self, events: list[dict[str, Any]], event: dict[str, Any]) -> None:
        events.append(event)
        if event["type"] == "card" and event["card"]["id"] not in self.cards:
            view = ConsentCardView(self.bridge, event["card"])
            self.cards[event["card"]["id"]] = view
            self.cards_box.children = (*self.cards_box.children, view.box)
        elif event["type"] == "plan" and self.plan_view is None:
            self.plan_view = PlanApprovalView(event["steps"], on_approve=self._approve, on_reject=self.session.reject_plan)
            self.plan_box.children = (self.plan_view.box,)
        self._render()
        if event["type"] == "end":
            self.on_final()

    def _approve(self, steps: list[str] | None) -> None:
        self.follow(self.session.approve_plan(steps))

    def _on_change(self, kind: str, snap: dict[str, Any]) -> None:
        if kind == "session" and snap["id"] == self.session.id:
            with self._snap_lock:
                self.session_snap = snap
                self.header.value = render.session_header_html(snap)
            if snap["state"] == "closed":
                self._unwatch()

    def _render(self) -> None:
        agent = self.session.agent
        self.transcript.value = "".join(
            render.exchange_body_html(agent, message, events, cards=False) for message, events in self.turns)

    @property
    def reply_text(self) -> str:
        return "".join(e["text"] for _, events in self.turns for e in events if e["type"] == "text")


class InboxView:
    """Every waiting decision of the home, each a consent card; new ones appear, answered ones freeze."""

    def __init__(self, bridge: "KernelRuntime") -> None:
        self.bridge = bridge
        self.title = W.HTML()
        self.cards_box = W.VBox()
        self.cards: dict[str, ConsentCardView] = {}
        self.on_final: Callable[[], None] = _nothing  # an inbox is never final
        self.box = W.VBox([self.title, self.cards_box])
        rt = bridge.rt
        for snap in bridge.call(lambda: [copy.deepcopy(c.to_dict()) for c in rt.pending]):
            self._add(snap)
        self._unwatch = bridge.watch(self._on_change)
        self._render_title()

    def _add(self, snap: dict[str, Any]) -> None:
        if snap["id"] in self.cards:
            return
        view = ConsentCardView(self.bridge, snap)
        self.cards[snap["id"]] = view
        self.cards_box.children = (*self.cards_box.children, view.box)

    def _on_change(self, kind: str, snap: dict[str, Any]) -> None:
        if kind != "card":
            return
        if snap["id"] in self.cards:
            self.cards[snap["id"]].apply(snap)  # before counting: its own notification may come later
        elif not snap.get("answer"):
            self._add(snap)
        self._render_title()

    @property
    def waiting(self) -> list[ConsentCardView]:
        return [v for v in self.cards.values() if not v.frozen]

    def _render_title(self) -> None:
        count = len(self.waiting)
        self.title.value = (f"<b>{count} pending decision{'s' if count != 1 else ''}</b>" if count
                            else "<b>No pending decisions.</b>")


class JournalView:
    """The journal's verification state, head and latest entries; ``verify again`` re-checks it."""

    def __init__(self, bridge: "KernelRuntime", report: Any) -> None:
        """``report``: the ``JournalReport`` shown (``refresh()`` verifies again)."""
        self.bridge = bridge
        self.report = report
        self._columns = render.TAIL_COLUMNS
        self.state = W.HTML()
        self.verify_button = W.Button(description="verify again", icon="check")
        self.verify_button.on_click(self._verify)
        self.on_final: Callable[[], None] = _nothing
        self.box = W.VBox([self.state, self.verify_button])
        self._render()

    def _verify(self, _button: Any = None) -> None:
        self.report.refresh()
        self._render()
        self.on_final()

    def _render(self) -> None:
        r = self.report
        self.state.value = render.verify_html(r.report, r.head, self._columns, r.tail)
