"""The kernel end of the JupyterLab side panel: the comm target ``apollia.panel``.

``%load_ext apollia_nb`` registers the target (nothing else: no import here is
heavy); the panel opens a comm to it and talks in requests and replies::

    front → kernel   {"id": "r1", "op": "snapshot"}
                     {"id": "r2", "op": "answer", "card_id": "…", "answer": "once"}   ("for": "8h" with always)
                     {"id": "r3", "op": "entries", "run_id": "…", "limit": 50}
                     {"id": "r4", "op": "verify"}
                     {"id": "r5", "op": "approve_plan", "task_id": "…", "steps": ["…"]}   (steps: as edited, or absent)
                     {"id": "r6", "op": "reject_plan", "task_id": "…", "reason": "…"}
    kernel → front   {"id": "r1", "ok": true, "data": …}
                     {"id": "r2", "ok": false, "error": {"code": "CONFLICT", "message": …, "answered": {…}}}
                     {"event": "changed", "version": 7}      (pushed; at most ``1 / PUSH_INTERVAL`` a second,
                                                              from the panel's first request on)
    at %load_ext     a comm the kernel opens on the target with {"event": "loaded"}, closed at once

Where a message is handled: JupyterLab sends a comm's messages over a kernel
subshell (ipykernel 7), so a handler may run on a subshell's thread, or on the
kernel's main thread. Either way it only parses the request and hands it to the
runtime's loop (``KernelRuntime.start``): the runtime is touched only there,
and the reply is sent from there when the work is done (``publish``: parented
to no request, so ipykernel keeps routing each of the panel's messages to the
subshell it names). Nothing here waits on the kernel's main thread, so a cell
that is busy, even one that blocks its thread, does not hold the panel.

A snapshot's inbox holds the waiting cards and the plans waiting for approval
(``plan_item``); each card carries its task's or chat's goal (``with_goals``)
so cards of several runs are told apart. The journal's verification follows
the journal: when entries arrive after a verification, another one starts,
at most one at a time and spaced by a few times the last one's duration, and
until it is done the snapshot says how many of the entries were checked.

The pure parts (``parse_request``, ``run_summary``, ``inbox_item``,
``plan_item``, ``with_goals``, ``error_reply``, ``home_locked_words``) take and
return plain values; ``PanelHome`` and ``PanelComm``
are the shells.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = [
    "TARGET", "OPS", "PUSH_INTERVAL", "LATEST_ENTRIES", "MAX_ENTRIES",
    "Request", "OkReply", "ErrorReply", "ChangedEvent",
    "parse_request", "error_reply", "run_summary", "inbox_item", "plan_item", "with_goals", "home_locked_words",
    "PanelHome", "PanelComm", "publish", "register", "announce", "unregister",
]

#: The comm target the panel opens.
TARGET = "apollia.panel"
Op = Literal["snapshot", "answer", "entries", "verify", "approve_plan", "reject_plan"]
OPS: tuple[str, ...] = ("snapshot", "answer", "entries", "verify", "approve_plan", "reject_plan")
#: The shortest time between two ``changed`` pushes (changes in between are coalesced into one).
PUSH_INTERVAL = 0.25
#: How many of the journal's newest entries a snapshot carries.
LATEST_ENTRIES = 20
#: The most entries one ``entries`` request returns (the default: ``DEFAULT_ENTRIES``).
MAX_ENTRIES = 500
DEFAULT_ENTRIES = 50
#: A verification that follows new entries starts at least this long after the last one ended,
#: and at least ``REVERIFY_FACTOR`` times as long as the last one took (a big journal is not
#: verified over and over).
REVERIFY_MIN_SECS = 1.0
REVERIFY_FACTOR = 4.0
#: The most steps an edited plan may have, and the longest step or reason.
MAX_STEPS = 200
_MAX_TEXT = 10_000
_FINISHED = ("completed", "failed", "cancelled")
_MAX_ID = 200


# --- the wire format ----------------------------------------------------------------------------


class Request(TypedDict, total=False):
    id: str
    op: Op
    card_id: str
    answer: str
    lasting: str  # sent as ``for``: how long the standing consent of ``always`` lasts ("8h")
    reason: str
    run_id: str
    limit: int
    task_id: str
    steps: list[str]


class OkReply(TypedDict):
    id: str | None
    ok: Literal[True]
    data: Any


class ErrorBody(TypedDict, total=False):
    code: str
    message: str
    answered: dict[str, Any]


class ErrorReply(TypedDict):
    id: str | None
    ok: Literal[False]
    error: ErrorBody


class ChangedEvent(TypedDict):
    event: Literal["changed"]
    version: int


def _text(data: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    from apollia_nb.errors import BadInput

    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_ID:
        raise BadInput(f"`{key}` must be a non-empty string of at most {_MAX_ID} characters")
    return value


def parse_request(data: Any) -> Request:
    """A request checked field by field; ``BAD_INPUT`` (or ``BAD_ANSWER``) naming what is wrong."""
    from apollia_nb.errors import BadAnswer, BadInput

    if not isinstance(data, dict):
        raise BadInput("a panel request is a JSON object with `id` and `op`")
    request: Request = {"id": _text(data, "id")}  # type: ignore[typeddict-item]
    op = data.get("op")
    if op not in OPS:
        raise BadInput(f"unknown op {op!r}; ops: {', '.join(OPS)}")
    request["op"] = op
    if op == "answer":
        ids = [k for k in ("card_id", "decision_id") if data.get(k) is not None]
        if len(ids) != 1:
            raise BadInput("an answer names exactly one of `card_id` and `decision_id`")
        request["card_id"] = _text(data, ids[0])  # type: ignore[typeddict-item]
        answer = data.get("answer")
        if not isinstance(answer, str) or not answer:
            raise BadAnswer("`answer` must be one of the answers the card offers")
        request["answer"] = answer
        lasting = data.get("for")
        if lasting is not None:
            if not isinstance(lasting, str) or len(lasting) > 64:
                from apollia_nb.errors import BadDuration

                raise BadDuration("`for` is how long always lasts, such as '8h', as a string")
            request["lasting"] = lasting
        _reason(data, request)
    elif op in ("approve_plan", "reject_plan"):
        request["task_id"] = _text(data, "task_id")  # type: ignore[typeddict-item]
        if op == "reject_plan":
            _reason(data, request)
        elif data.get("steps") is not None:
            steps = data["steps"]
            if (not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS
                    or not all(isinstance(x, str) and x.strip() and len(x) <= _MAX_TEXT for x in steps)):
                raise BadInput(f"`steps` must be a list of 1 to {MAX_STEPS} non-empty strings "
                               f"of at most {_MAX_TEXT} characters (a plan needs at least one step)")
            request["steps"] = [x.strip() for x in steps]
    elif op == "entries":
        request["run_id"] = _text(data, "run_id")  # type: ignore[typeddict-item]
        limit = data.get("limit", DEFAULT_ENTRIES)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ENTRIES:
            raise BadInput(f"`limit` must be an integer from 1 to {MAX_ENTRIES}")
        request["limit"] = limit
    return request


def _reason(data: dict[str, Any], request: Request) -> None:
    from apollia_nb.errors import BadInput

    reason = data.get("reason")
    if reason is not None:
        if not isinstance(reason, str) or len(reason) > _MAX_TEXT:
            raise BadInput(f"`reason` must be a string of at most {_MAX_TEXT} characters")
        request["reason"] = reason


def request_id(data: Any) -> str | None:
    """The request's ``id`` when it has a usable one (a reply to a malformed request still names it)."""
    value = data.get("id") if isinstance(data, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= _MAX_ID else None


def ok_reply(rid: str | None, data: Any) -> OkReply:
    return {"id": rid, "ok": True, "data": data}


def error_reply(rid: str | None, exc: BaseException, answered: dict[str, Any] | None = None) -> ErrorReply:
    """An error as the panel shows it: the stable code of an ``ApolliaError``; anything else ``INTERNAL``."""
    from apollia_nb.errors import ApolliaError

    if isinstance(exc, ApolliaError):
        body: ErrorBody = {"code": exc.code, "message": exc.message}
    else:
        body = {"code": "INTERNAL", "message": f"{type(exc).__name__}: {exc}"}
    if answered is not None:
        body["answered"] = answered
    return {"id": rid, "ok": False, "error": body}


# --- the snapshot's parts (pure) -------------------------------------------------------------------


def _current_step(steps: list[dict[str, Any]]) -> str | None:
    for step in steps:
        if step.get("status") in ("running", "waiting"):
            return f"Step {step['index'] + 1} of {len(steps)}: {step['description']}"
    for step in steps:
        if step.get("status") == "pending":
            return f"Step {step['index'] + 1} of {len(steps)}: {step['description']}"
    return None


#: The most characters of a step's reasoning a run's row carries (the rest is in the notebook and the journal).
REASONING_SHOWN = 4000


def latest_reasoning(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reasoning of the last step that has any, as a run's row shows it folded: ``{"step"
    (counted from 1), "text" (at most ``REASONING_SHOWN`` characters), "chars" (the whole's)}``.
    Opaque reasoning reads as ``[redacted reasoning]`` (``reasoning_text``), never its bytes."""
    for step in reversed(steps):
        texts = [t for t in step.get("reasoning") or () if isinstance(t, str) and t]
        if texts:
            text = "\n\n".join(texts)
            return {"step": int(step.get("index", 0)) + 1, "text": text[:REASONING_SHOWN], "chars": len(text)}
    return None


def run_summary(task: dict[str, Any], *, runs: str = "kernel", waiting_cards: int = 0) -> dict[str, Any]:
    """One row of the panel's runs from a task's JSON (the REST API's ``Task``)."""
    status = task["status"]
    budget = task.get("budget") or {}
    return {
        "id": task["id"], "run_id": task["run_id"], "kind": "task", "agent": task["agent"], "status": status,
        "title": task.get("goal", ""), "budget": {"used": budget.get("used", 0), "max": budget.get("ceiling", 0)},
        "step": None if status in _FINISHED else _current_step(task.get("steps") or []),
        "reasoning": latest_reasoning(task.get("steps") or []),
        "waiting": status == "waiting", "waiting_cards": waiting_cards,
        "awaiting_plan_approval": bool(task.get("awaiting_plan_approval")),
        "finished_at": task.get("updated_at") if status in _FINISHED else None,
        "created_at": task.get("created_at"), "runs": runs,
    }


def chat_summary(session: dict[str, Any], *, waiting_cards: int = 0, runs: str = "kernel") -> dict[str, Any]:
    """One row of the panel's runs from a chat session's JSON (the REST API's ``Session``)."""
    history = session.get("history") or []
    first = next((m.get("content") for m in history if m.get("role") == "user"), None)
    state = session["state"]
    return {
        "id": session["id"], "run_id": session["run_id"], "kind": "chat", "agent": session["agent"],
        "status": state, "title": first if isinstance(first, str) else "", "budget": None,
        "step": None, "reasoning": None, "waiting": waiting_cards > 0 or bool(session.get("pending_plan")),
        "waiting_cards": waiting_cards, "awaiting_plan_approval": bool(session.get("pending_plan")),
        "finished_at": None, "created_at": session.get("created_at"), "runs": runs,
    }


def inbox_item(decision: dict[str, Any], card: dict[str, Any] | None = None, *, runs: str = "kernel") -> dict[str, Any]:
    """One inbox row: the REST API's ``PendingDecision`` (or a card's JSON), with what only a card knows
    (MCP hints, session, resolved path) and ``answered`` (``{answer, by, at}`` or None)."""
    item = {**(card or {}), **decision}
    if card is not None:
        for key in ("hints", "session_id", "path"):
            item[key] = card.get(key)
        if decision.get("answer") is None and card.get("answer") is not None:  # the card knows it first
            for key in ("answer", "answered_by", "answered_at"):
                item[key] = card.get(key)
    item.setdefault("hints", None)
    item.setdefault("session_id", None)
    item.setdefault("path", None)
    item["asked_at"] = item.get("created_at")
    answer = item.get("answer")
    item["answered"] = None if answer is None else {"answer": answer, "by": item.get("answered_by"),
                                                     "at": item.get("answered_at")}
    if answer is None:
        item["status"] = "pending"
    elif item.get("status") not in ("answered", "expired"):
        item["status"] = "answered"
    item["runs"] = runs
    return item


def me_of(mode: str, told: dict[str, Any] | None = None) -> dict[str, Any]:
    """Who answers from this panel, as four eyes counts them: in a kernel that owns the home, the local
    user (the home's owner); in one that joined a served home, who the server says its token is (``told``:
    ``GET /people/me``'s ``{name, roles, auth}``). A kernel the server has not told (``told`` None: it
    could not be asked) is named ``unknown`` (``auth`` ``unknown``: no person's name) and claims no role:
    the server decides each answer."""
    from apollia_nb.governance.approvals import local_person

    if mode == "owner":
        return {"name": local_person(), "role": "owner of this home", "auth": "local"}
    if not isinstance(told, dict) or not isinstance(told.get("name"), str) or not told["name"]:
        return {"name": "unknown", "role": "the server could not be asked who this kernel is; "
                                         "it decides who may answer", "auth": "unknown"}
    roles = [r for r in told.get("roles") or [] if isinstance(r, str)]
    auth = str(told.get("auth") or "unknown")
    held = ", ".join(roles) if roles else "no role on this home"
    role = f"hub user: {held}" if auth == "hub" else held
    return {"name": told["name"], "role": role, "auth": auth, "roles": roles}


def yours(item: dict[str, Any], me: str | None) -> dict[str, Any]:
    """What ``me`` may answer a waiting card (``answers``), and why not the others (``why``, None when
    every answer on offer is theirs): read from the card's ``may_answer``. Refusing is always theirs.
    ``me`` None (who this panel is, unknown): every answer is offered and the server decides."""
    answers = list(item.get("answers") or [])
    if item.get("answered") is not None or "may_answer" not in item or me is None:
        return {"answers": answers, "why": None}
    may = item.get("may_answer")
    refuse = [a for a in answers if a == "refuse"]
    if not isinstance(may, dict):  # governance cannot be read: nobody approves now
        return {"answers": refuse, "why": "Governance cannot be read now, so no approval is accepted; "
                                           "you may refuse."}
    from apollia_nb.governance.approvals import local_person, person_key

    local = local_person()
    mine = person_key(me, local)
    if mine not in {person_key(x, local) for x in may.get("excluded") or []}:
        return {"answers": answers, "why": None}
    if may.get("four_eyes") and mine == person_key(may.get("started_by"), local):
        why = (f"Four eyes: you ({me}) started this run, so another person with the approver role must "
               "approve it. You may refuse it.")
    else:
        needed = may.get("approvals_needed")
        why = (f"You ({me}) approved this already; it needs {needed} more approval"
               f"{'' if needed == 1 else 's'} from other people. You may refuse it.")
    return {"answers": refuse, "why": why}


def plan_item(task: dict[str, Any], *, runs: str = "kernel") -> dict[str, Any]:
    """One inbox row for a task waiting for its plan to be approved (the REST API's ``Task``)."""
    return {
        "kind": "plan", "id": task["id"], "task_id": task["id"], "run_id": task["run_id"], "agent": task["agent"],
        "goal": task.get("goal", ""), "steps": list(task.get("plan") or ()), "asked_at": task.get("updated_at"),
        "status": "pending", "runs": runs,
    }


def with_goals(inbox: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each card with the goal of the task (or the first message of the chat) it belongs to, and
    ``owner``: ``task`` or ``chat`` (``None`` when the run is not listed, its goal then ``None``)."""
    titles = {(r["kind"], r["id"]): r.get("title") for r in runs}
    out = []
    for item in inbox:
        task_id, session_id = item.get("task_id"), item.get("session_id")
        owner = "chat" if session_id else "task" if task_id else None
        key = (owner, session_id or task_id)
        out.append({**item, "kind": "card", "owner": owner, "goal": titles.get(key)})
    return out


def home_locked_words(message: str, notebook: str | None) -> str:
    """What a kernel whose home another process owns says: the reason, and what to do in a notebook."""
    holder = f"the notebook {notebook}" if notebook else "the other kernel or process"
    return (f"{message} In a notebook: shut down the kernel of {holder} (Kernel › Shut Down Kernel there), "
            "then run `%apollia status` here; or give this kernel a home of its own: "
            "`%config ApolliaMagics.home = \"/path/to/another/home\"`, then `%apollia status`.")


def _holder_notebook(lock: Any) -> str | None:
    """The notebook whose kernel holds the home (``JPY_SESSION_NAME`` of the holder, where the
    system lets us read it), or None."""
    import json

    try:
        pid = int(json.loads(lock.read_text())["pid"])
        environ = open(f"/proc/{pid}/environ", "rb").read()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for item in environ.split(b"\0"):
        if item.startswith(b"JPY_SESSION_NAME="):
            name = item.split(b"=", 1)[1].decode("utf-8", "replace").strip()
            return name[:_MAX_ID] or None
    return None


def kernel_error(exc: Any, home: Any) -> Any:
    """The error that kept this kernel's home from opening, as the panel shows it: ``HOME_LOCKED``
    names the notebook that holds the home when it can, and says how to free it or use another."""
    from apollia_nb.errors import HomeLocked

    if not isinstance(exc, HomeLocked):
        return exc
    return HomeLocked(home_locked_words(exc.message, _holder_notebook(home.owner_lock_path)))


def _entry_json(row: tuple[Any, ...]) -> dict[str, Any]:
    from apollia_nb.journal.entry import Entry

    return Entry.from_row(row).to_dict()


# --- the kernel's side: one per open home -----------------------------------------------------------


class PanelHome:
    """What every panel of one kernel shares: the change counter, the pushes, the verification state.

    Attached to the ``KernelRuntime`` it serves (``PanelHome.of(bridge)``);
    it subscribes to the runtime's notifications on the runtime's thread and
    pushes one ``changed`` event to every open panel per ``PUSH_INTERVAL`` at most.
    """

    def __init__(self, bridge: KernelRuntime) -> None:
        self.bridge = bridge
        self.version = 0
        self.panels: list[PanelComm] = []
        self.verification: dict[str, Any] = {"state": "unknown", "checked_size": None, "first_bad_seq": None,
                                             "problem": None, "checked_at": None}
        self._verifying: Any = None  # the running verification's future (runtime's loop)
        self._reverify: Any = None  # a verification that follows new entries, scheduled (runtime's loop)
        self._next_verify_at = 0.0  # (monotonic) not before then
        self._lock = threading.Lock()
        self._last_push = 0.0
        self._timer: Any = None
        self._poller: Any = None
        self.elsewhere = bridge.home  # the rest of the home (the server's share), chosen once per kernel
        self._unsubscribe = bridge.call(bridge.rt.subscribe, self._on_change)

    @classmethod
    def of(cls, bridge: KernelRuntime) -> PanelHome:
        with _homes_lock:
            home = bridge.panel_home
            if home is None:
                home = bridge.panel_home = cls(bridge)
            return home

    # ------------------------------------------------------------------ panels and pushes
    def add(self, panel: PanelComm) -> None:
        with self._lock:
            if panel not in self.panels:
                self.panels.append(panel)
            if self._poller is None:  # changes made elsewhere in the home (none for an owner)
                self._poller = self.bridge.start(self.elsewhere.changes, self.changed)

    def remove(self, panel: PanelComm) -> None:
        with self._lock:
            if panel in self.panels:
                self.panels.remove(panel)
            poller = self._poller if not self.panels else None
            if poller is not None:
                self._poller = None
        if poller is not None:
            poller.cancel()

    def _on_change(self, kind: str, obj: Any) -> None:  # on the runtime's thread
        if kind == "warning":
            return
        self.changed()

    def changed(self) -> None:
        """Count a change and push it (coalesced); callable from any thread."""
        with self._lock:
            self.version += 1
            if self._timer is not None:
                return
            delay = max(0.0, self._last_push + PUSH_INTERVAL - time.monotonic())
            loop = self.bridge.loop.loop
            try:
                self._timer = loop.call_soon_threadsafe(self._schedule, delay)
            except RuntimeError:  # the runtime's loop is closed: nothing to push
                self._timer = None

    def _schedule(self, delay: float) -> None:  # on the runtime's loop
        with self._lock:
            if self._timer is not None:  # (None: closed meanwhile)
                self._timer = self.bridge.loop.loop.call_later(delay, self._push)

    def _push(self) -> None:  # on the runtime's loop
        with self._lock:
            self._timer = None
            self._last_push = time.monotonic()
            version = self.version
            panels = list(self.panels)
        event: ChangedEvent = {"event": "changed", "version": version}
        for panel in panels:
            panel.push(event)

    def close(self) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            poller, self._poller = self._poller, None
            reverify, self._reverify = self._reverify, None
            panels, self.panels = list(self.panels), []
        if poller is not None:
            poller.cancel()
        if reverify is not None:
            reverify.cancel()
        if timer is not None:
            timer.cancel()
        for panel in panels:  # told to ask again: the next request finds the home as it is then
            panel.released(self.version + 1)
        if self.bridge.loop.running:
            try:
                self.bridge.loop.call(self._unsubscribe)
            except ValueError:  # already unsubscribed
                pass

    # ------------------------------------------------------------------ the operations (runtime's loop)
    async def handle(self, request: Request) -> Any:
        op = request["op"]
        if op == "snapshot":
            return await self.snapshot()
        if op == "answer":
            return self.answer(request["card_id"], request["answer"], request.get("reason"), request.get("lasting"))
        if op == "entries":
            return await self.entries(request["run_id"], request["limit"])
        if op == "approve_plan":
            return await self.answer_plan(request["task_id"], "approve", request.get("steps"), None)
        if op == "reject_plan":
            return await self.answer_plan(request["task_id"], "reject", None, request.get("reason"))
        return await self.verify()

    async def snapshot(self) -> dict[str, Any]:
        import anyio

        from apollia_nb.errors import ApolliaError

        rt = self.bridge.rt
        there = self.elsewhere
        problems: list[dict[str, str]] = []
        cards = {c.id: c.to_dict() for c in rt.pending}  # waiting: tasks' and chats'
        for handle in rt.tasks():  # with the answered cards of the tasks in memory
            for card in rt.cards_of(handle.id):
                cards.setdefault(card.id, card.to_dict())
        waiting_by_run: dict[str, int] = {}
        for card in cards.values():
            if card.get("answer") is None:
                owner = card.get("task_id") or card.get("session_id") or ""
                waiting_by_run[owner] = waiting_by_run.get(owner, 0) + 1
        agents = [{**a.to_dict(), "runs": "kernel"} for a in rt.agents()]
        tasks = [h.to_dict() for h in rt.tasks()]
        runs = [run_summary(t, waiting_cards=waiting_by_run.get(t["id"], 0)) for t in tasks]
        runs += [chat_summary(s.to_dict(), waiting_cards=waiting_by_run.get(s.id, 0)) for s in rt.sessions.all()]
        plans = [plan_item(t) for t in tasks if t.get("awaiting_plan_approval")]
        waiting: list[dict[str, Any]] = []
        try:
            state = await there.state()
            agents += [{**a, "runs": there.runs} for a in state["agents"]]
            local = {r["id"] for r in runs}
            remote = [t for t in state["tasks"] if t["id"] not in local]
            runs += [run_summary(t, runs=there.runs) for t in remote]
            plans += [plan_item(t, runs=there.runs) for t in remote if t.get("awaiting_plan_approval")]
            waiting = state["pending"]
        except ApolliaError as exc:  # shown, never hidden: the inbox cannot be read now
            problems.append({"part": "inbox", "code": exc.code, "message": exc.message})
            waiting = [c for c in cards.values() if c.get("answer") is None]
        inbox = [inbox_item(d, cards.get(d["id"]), runs="kernel" if d["id"] in cards else there.runs)
                 for d in waiting]
        listed = {d["id"] for d in waiting}
        answered = sorted((c for c in cards.values() if c.get("answer") is not None and c["id"] not in listed),
                          key=lambda c: c.get("answered_at") or "", reverse=True)[:LATEST_ENTRIES]
        inbox += [inbox_item(c, c) for c in answered]
        try:  # a joined kernel asks the server who its token is (once: the home keeps the answer)
            told = await there.me()
        except ApolliaError as exc:  # unknown, never assumed: the server decides each answer
            told = None
            problems.append({"part": "you", "code": exc.code, "message": exc.message})
        me = me_of(there.mode, told)
        mine = None if me["auth"] == "unknown" else me["name"]
        inbox = [{**item, "you": yours(item, mine)} for item in with_goals(inbox, runs)] + plans
        runs.sort(key=lambda r: (r["finished_at"] is not None, r.get("created_at") or "", r["id"]))
        try:
            journal = await anyio.to_thread.run_sync(self._journal_head)
        except ApolliaError as exc:
            problems.append({"part": "journal", "code": exc.code, "message": exc.message})
            journal = {"size": None, "head": None, "root": None, "last_checkpoint": None, "latest": []}
        if self.verification["state"] == "unknown":
            self.start_verify()
        elif self._behind(journal["size"]):
            self._verify_soon()
        journal["verify"] = dict(self.verification)
        return {
            "mode": there.mode, "home": str(rt.home.path), "server": there.url,
            "kernel_agents_only": there.mode == "owner", "user": self.bridge.user, "me": me,
            "version": self.version,
            "agents": agents, "runs": runs, "inbox": inbox, "journal": journal, "problems": problems,
        }

    def _journal_head(self) -> dict[str, Any]:  # in a worker thread: the journal's reads are thread-safe
        """The journal as of one head: its latest entries and last checkpoint are read up to that head,
        so entries appended while it is read wait for the next snapshot instead of running ahead of it."""
        from apollia_nb.journal.entry import Entry

        journal = self.bridge.rt.journal
        seq, digest = journal.head()
        checkpoints = [c for c in journal.checkpoints() if c[0] <= seq]
        last = None
        if checkpoints:
            size, root, note = checkpoints[-1]
            last = {"size": size, "root": bytes(root).hex(), "note": note}
        rows = journal.sql(f"SELECT {', '.join(Entry.COLUMNS)} FROM entries WHERE seq <= ? "
                           f"ORDER BY seq DESC LIMIT {LATEST_ENTRIES}", [seq])
        return {"size": seq, "head": bytes(digest).hex(), "root": last["root"] if last else None,
                "last_checkpoint": last, "latest": [_entry_json(r) for r in rows]}

    def answer(self, card_id: str, answer: str, reason: str | None, lasting: str | None = None) -> dict[str, Any]:
        """The one path every answer takes (``Runtime.answer``: validated, journaled, applied once);
        ``lasting``: how long the standing consent of ``always`` lasts."""
        from apollia_nb.errors import Conflict

        rt = self.bridge.rt
        extra = {"lasting": lasting} if lasting is not None else {}
        try:
            answered = rt.answer(card_id, answer, by=self.bridge.user, reason=reason, **extra)
        except Conflict as exc:
            raise _AlreadyAnswered(exc, self._answered(card_id)) from None
        return inbox_item(answered)

    async def answer_plan(self, task_id: str, verdict: str, steps: list[str] | None,
                          reason: str | None) -> dict[str, Any]:
        """Approve (as proposed, or as edited) or reject a plan: a task of this kernel through the
        runtime, as the cell's plan widget does; a task of the server through its REST API."""
        from apollia_nb.errors import UnknownTask

        rt = self.bridge.rt
        reason = (reason or "").strip() or None
        try:
            rt.task(task_id)
        except UnknownTask:  # not this kernel's: the server's, when it joined one (UNKNOWN_TASK otherwise)
            task = await self.elsewhere.answer_plan(task_id, verdict, steps, reason or "no reason given")
        else:
            if verdict == "approve":
                rt.approve_plan(task_id, steps)
            else:
                rt.reject_plan(task_id, reason or "no reason given")
            task = rt.task(task_id).to_dict()
        self.changed()
        words = ("approved (edited)" if steps is not None else "approved") if verdict == "approve" \
            else f"rejected: {reason or 'no reason given'}"
        return {"task_id": task_id, "decided": words, "by": self.bridge.user, "status": task["status"]}

    def _answered(self, card_id: str) -> dict[str, Any] | None:
        try:
            stored = self.bridge.rt.governance.get_pending(card_id).to_dict()
        except Exception:  # unreadable now: the message still says who answered
            return None
        if stored.get("answer") is None:
            return None
        return {"answer": stored["answer"], "by": stored.get("answered_by"), "at": stored.get("answered_at")}

    async def entries(self, run_id: str, limit: int) -> dict[str, Any]:
        import anyio

        from apollia_nb.errors import UnknownRun
        from apollia_nb.journal.entry import Entry

        journal = self.bridge.rt.journal
        rows = await anyio.to_thread.run_sync(lambda: journal.sql(
            f"SELECT {', '.join(Entry.COLUMNS)} FROM entries WHERE run_id = ? ORDER BY seq DESC LIMIT ?",
            [run_id, limit + 1]))
        if not rows:
            raise UnknownRun(f"the journal holds no entry of run {run_id!r}")
        return {"run_id": run_id, "entries": [_entry_json(r) for r in rows[:limit]], "more": len(rows) > limit}

    def _behind(self, size: Any) -> bool:
        """The journal has entries the last (good) verification did not check."""
        v = self.verification
        checked = v.get("checked_size")
        return (v["state"] == "ok" and isinstance(size, int) and isinstance(checked, int) and size > checked)

    def _verify_soon(self) -> None:  # on the runtime's loop
        """Verify again once the spacing after the last verification has passed (once: coalesced)."""
        with self._lock:
            if self._reverify is not None or (self._verifying is not None and not self._verifying.done()):
                return
            delay = max(0.0, self._next_verify_at - time.monotonic())
            self._reverify = self.bridge.loop.loop.call_later(delay, self._verify_now)

    def _verify_now(self) -> None:  # on the runtime's loop
        with self._lock:
            self._reverify = None
        try:
            self.start_verify()
        except Exception:  # the home is closing: nothing to verify any more
            pass

    def start_verify(self) -> Any:
        """Start a verification unless one runs; the future of the one that runs."""
        with self._lock:
            if self._verifying is None or self._verifying.done():
                self.verification = {**self.verification, "state": "running"}
                self._verifying = self.bridge.start(self._verify)
            return self._verifying

    async def verify(self) -> dict[str, Any]:
        import asyncio

        await asyncio.wrap_future(self.start_verify())
        return dict(self.verification)

    async def _verify(self) -> None:
        rt = self.bridge.rt
        started = time.monotonic()
        try:
            report = await self.elsewhere.verify()  # the server's journal, or this kernel's own
        except Exception as exc:  # could not be verified: not ok (fail closed)
            state = {"state": "failed", "checked_size": None, "first_bad_seq": None,
                     "problem": f"the journal could not be verified: {exc}"}
        else:
            state = {"state": "ok" if report["ok"] else "failed", "checked_size": report["entries"],
                     "first_bad_seq": report["first_bad_seq"], "problem": report["problem"]}
        self.verification = {**state, "checked_at": rt.now_iso()}
        ended = time.monotonic()
        self._next_verify_at = ended + max(REVERIFY_MIN_SECS, REVERIFY_FACTOR * (ended - started))
        self.changed()


class _AlreadyAnswered(Exception):
    """A second answer: the ``Conflict`` it met, and who answered first."""

    def __init__(self, conflict: Exception, answered: dict[str, Any] | None) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict
        self.answered = answered


_homes_lock = threading.Lock()


# --- one open panel -------------------------------------------------------------------------------


class PanelComm:
    """One comm the panel opened: each message becomes a request handled on the runtime's loop.

    ``comm`` is what ipykernel hands a comm target (``send``, ``on_msg``,
    ``on_close``); ``home`` returns the kernel's open ``KernelRuntime``.
    Pushes start with the panel's first request.
    """

    def __init__(self, comm: Any, home: Callable[[], KernelRuntime]) -> None:
        self.comm = comm
        self._home = home
        self._panel_home: PanelHome | None = None
        self._asked = False
        self._closed = False
        comm.on_msg(self._on_msg)
        comm.on_close(self._on_close)

    # ------------------------------------------------------------------ receiving (any thread)
    def _on_msg(self, msg: dict[str, Any]) -> None:
        self.receive(msg.get("content", {}).get("data"))

    def receive(self, data: Any) -> Any:
        """Handle one request; returns the future of its reply (already sent when it is done)."""
        import concurrent.futures

        self._asked = True
        rid = request_id(data)
        try:
            request = parse_request(data)
            panel_home = self.attach()
            future = panel_home.bridge.start(panel_home.handle, request)
        except Exception as exc:
            self._send(error_reply(rid, exc))
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            done.set_exception(exc)
            return done
        future.add_done_callback(lambda f: self._reply(rid, f))
        return future

    def attach(self) -> PanelHome:
        """The ``PanelHome`` of the kernel's open home (a new one after the home was reopened)."""
        bridge = self._home()
        panel_home = PanelHome.of(bridge)
        if panel_home is not self._panel_home:
            if self._panel_home is not None:
                self._panel_home.remove(self)
            self._panel_home = panel_home
            panel_home.add(self)
        return panel_home

    def _reply(self, rid: str | None, future: Any) -> None:
        if future.cancelled():
            from apollia_nb.errors import Interrupted

            self._send(error_reply(rid, Interrupted("the home was closed before the request was done")))
            return
        exc = future.exception()
        if isinstance(exc, _AlreadyAnswered):
            self._send(error_reply(rid, exc.conflict, exc.answered))
        elif exc is not None:
            self._send(error_reply(rid, exc))
        else:
            self._send(ok_reply(rid, future.result()))

    # ------------------------------------------------------------------ sending (any thread)
    def push(self, event: ChangedEvent) -> None:
        if self._asked:
            self._send(event)

    def _send(self, data: Any) -> None:
        if self._closed:
            return
        try:
            publish(self.comm, data)
        except Exception:  # the kernel is going away: nobody listens any more
            import logging

            logging.getLogger("apollia_nb.notebook").debug("a panel message was not sent", exc_info=True)

    def released(self, version: int) -> None:
        """The home this panel was attached to closed."""
        self._panel_home = None
        self.push({"event": "changed", "version": version})

    def _on_close(self, msg: Any = None) -> None:
        self.detach()

    def detach(self) -> None:
        self._closed = True
        if self._panel_home is not None:
            panel_home, self._panel_home = self._panel_home, None
            panel_home.remove(self)


def publish(comm: Any, data: Any) -> None:
    """Send ``data`` on the comm (from any thread), parented to no request.

    ipykernel 7 routes a comm's incoming messages to the subshell of the request
    its last outgoing message was parented to, whatever subshell the front end
    names; a reply parented to a request that came over the main shell would so
    pull the panel's next messages onto the main shell, where a busy cell holds
    them. Sent without a parent, each message of the panel goes where its own
    header says. (JupyterLab hands a comm's messages to the comm whatever their
    parent; the replies carry the request's ``id``.) ipykernel's IOPub sending is
    thread-safe. A comm that is not ipykernel's (a test's) is sent to as it is.
    """
    kernel = getattr(comm, "kernel", None)
    session = getattr(kernel, "session", None)
    socket = getattr(kernel, "iopub_socket", None)
    if session is None or socket is None:
        comm.send(data)
        return
    from ipykernel.jsonutil import json_clean

    session.send(socket, "comm_msg", json_clean({"data": data, "comm_id": comm.comm_id}),
                 parent={}, ident=comm.topic)


# --- registering the target -----------------------------------------------------------------------


def register(ipython: Any, home: Callable[[], KernelRuntime]) -> bool:
    """Register the comm target in this shell's kernel; False outside a kernel (a terminal IPython)."""
    manager = getattr(getattr(ipython, "kernel", None), "comm_manager", None)
    if manager is None:
        return False

    def opened(comm: Any, msg: dict[str, Any]) -> None:
        PanelComm(comm, home)  # it answers from its first request on (a snapshot, as a rule)

    manager.register_target(TARGET, opened)
    return True


def announce(ipython: Any) -> bool:
    """Tell a front end that the target is there: a comm the kernel opens on ``TARGET`` with
    ``{"event": "loaded"}`` and closes at once (a panel opened before ``%load_ext`` opens its comm again)."""
    if getattr(getattr(ipython, "kernel", None), "comm_manager", None) is None:
        return False
    from comm import create_comm

    create_comm(target_name=TARGET, data={"event": "loaded"}).close()
    return True


def unregister(ipython: Any) -> None:
    manager = getattr(getattr(ipython, "kernel", None), "comm_manager", None)
    if manager is not None and TARGET in getattr(manager, "targets", {}):
        manager.unregister_target(TARGET, None)

