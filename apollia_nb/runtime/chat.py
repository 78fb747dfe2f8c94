"""Chat sessions (Scenario B): streamed replies, plan-mode, pause / inject / resume, fork, children.

States ``active``, ``processing``, ``paused``, ``closed``. A message starts an
*exchange* — model turns and governed tool calls until the model answers with
text — run as a background task owned by the runtime; its events (text deltas,
tool calls, cards, the reply) are kept on the exchange so any number of
viewers can follow it. A second message while ``processing`` is refused
(``SESSION_BUSY``). Cards in a conversation resolve to ``refuse`` after exactly
five minutes. ``pause`` stops the exchange at the next safe point (between
model turns and tool calls); ``inject`` adds a user message; ``resume``
continues. In plan-mode a message first gets a plan (the planner may use
read-only tools only); nothing else runs until the user approves (optionally
edited) or rejects it. ``close`` cancels the exchange in flight; ``closed`` is
terminal and the history stays readable. Sessions are persisted in
``runtime.db``; one left ``processing`` by a crash is not reloaded at boot, and
``resume`` brings it back as ``active``.

Each session is one journal run (``run_kind`` ``chat``), sealed at close.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb.errors import BadInput, Conflict, SessionBusy, SessionClosed, UnknownSession
from apollia_nb.governance.decision import READ_ONLY_FAMILIES
from apollia_nb.runtime.states import SESSION, SessionState, StateCell

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.agents import Agent
    from apollia_nb.runtime.cards import Card
    from apollia_nb.runtime.capabilities import ChatHost

__all__ = ["Session", "Exchange", "Sessions"]


@dataclass(eq=False)
class Exchange:
    """One message's work. ``events`` grows as it runs; ``await exchange`` gives the reply."""

    id: str
    message: str
    events: list[dict[str, Any]] = field(default_factory=list)
    reply: str | None = None
    status: str = "running"  # running | paused | done | cancelled | failed
    error: dict[str, str] | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event, repr=False)
    _done: anyio.Event = field(default_factory=anyio.Event, repr=False)

    def _push(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def _end(self, status: str) -> None:
        self.status = status
        self._push({"type": "end", "status": status, "reply": self.reply, "error": self.error})
        self._done.set()

    async def stream(self, start: int = 0):  # type: ignore[no-untyped-def]
        """Every event from the first (or from index ``start``), then live ones until the
        exchange ends or pauses. A resumed exchange goes on in the same object: stream it
        again from ``start=len(events seen)`` to follow it past a pause."""
        index = start
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                yield event
                if event["type"] in ("end", "paused"):
                    return
            await self._changed.wait()

    @property
    def text(self) -> str:
        return "".join(e["text"] for e in self.events if e["type"] == "text")

    async def wait(self) -> "Exchange":
        await self._done.wait()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()


class Session:
    def __init__(self, sessions: "Sessions", agent: "Agent", record: dict[str, Any]) -> None:
        self._sessions = sessions
        self.agent = agent
        self.r = record
        self.cell = StateCell(SESSION, record["state"])
        self.exchange: Exchange | None = None
        self._scope: anyio.CancelScope | None = None
        self._pause_requested = False
        # The session's own playthrough of a scripted agent's script: its turns consume it in order.
        self.model = sessions.rt.run_model(agent, record.get("model_state"))

    # ------------------------------------------------------------------ views
    @property
    def id(self) -> str:
        return self.r["id"]

    @property
    def state(self) -> str:
        return self.cell.state.value

    @property
    def history(self) -> list[dict[str, Any]]:
        return list(self.r["history"])

    @property
    def pending(self) -> list["Card"]:
        return [c for c in self._sessions.rt.pending if c.session_id == self.id]

    @property
    def pending_plan(self) -> list[str] | None:
        return self.r.get("pending_plan")

    @property
    def children(self) -> list["Session"]:
        return [self._sessions.get(cid) for cid in self.r["children"]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "agent": self.agent.name, "state": self.state, "plan_mode": self.r["plan_mode"],
            "parent_id": self.r.get("parent_id"), "forked_from": self.r.get("forked_from"),
            "children": list(self.r["children"]), "history": self.history, "run_id": self.r["run_id"],
            "pending_plan": self.pending_plan, "created_at": self.r["created_at"],
            "plan_digest": self._plan_digest(self.pending_plan) if self.pending_plan is not None else None,
        }

    # ------------------------------------------------------------------ moves
    def _move(self, target: SessionState) -> None:
        self.cell.move(target)
        self.r["state"] = self.cell.state.value
        self._save()
        self._sessions.rt.events.emit("session", self)

    def _save(self) -> None:
        rt = self._sessions.rt
        rt.records.save_session(self.r, rt.now_iso())

    def _check_open(self) -> None:
        if self.cell.state == SessionState.CLOSED:
            raise SessionClosed(f"session {self.id} is closed; its history stays readable")

    def send(self, text: str) -> Exchange:
        """Start an exchange for a user message; returns it at once (stream it or await it)."""
        self._check_open()
        if not isinstance(text, str) or not text.strip():
            raise BadInput("a message needs text")
        if self.cell.state == SessionState.PROCESSING:
            raise SessionBusy(f"session {self.id} is still answering; wait for it or pause it")
        if self.cell.state == SessionState.PAUSED:
            raise Conflict(f"session {self.id} is paused: inject a message or resume it")
        if self.pending_plan is not None:
            raise Conflict(f"session {self.id} has a plan waiting: approve or reject it first")
        self.r["plan_approved"] = False  # a new message in plan-mode needs a plan of its own
        self._append({"role": "user", "content": text})
        return self._start(text, planning=self.planning)

    @property
    def planning(self) -> bool:
        """Plan-mode with no approved plan in force: only read-only tools are offered and run.

        A property of the session, not of an exchange: pause, resume, inject and a restart
        read it again; only ``approve_plan`` lifts it, for the exchange that runs the plan."""
        return bool(self.r["plan_mode"]) and not self.r.get("plan_approved", False)

    def inject(self, text: str, *, message_id: str | None = None) -> None:
        """Add a user message; the next turn (after resume) sees it. ``message_id``: the id the message is
        stored with (named before it is added, so a retry can find it in the history)."""
        self._check_open()
        if not isinstance(text, str) or not text.strip():
            raise BadInput("a message needs text")
        self._append({"role": "user", "content": text, "injected": True,
                      **({"id": message_id} if message_id is not None else {})})
        self._journal_status("injected")

    def pause(self) -> None:
        """Stop the exchange in flight at the next safe point."""
        self._check_open()
        if self.cell.state == SessionState.PAUSED:
            return
        if self.cell.state == SessionState.PROCESSING:
            self._pause_requested = True
        else:
            self._move(SessionState.PAUSED)
            self._journal_status("paused")

    def resume(self) -> Exchange | None:
        """Continue a paused exchange (or return to ``active`` when nothing was interrupted)."""
        self._check_open()
        if self.cell.state == SessionState.PROCESSING and self.exchange is None:
            # Left processing by a crash: back to active, nothing to continue.
            self._move(SessionState.ACTIVE)
            self._journal_status("active")
            return None
        if self.cell.state != SessionState.PAUSED:
            raise Conflict(f"session {self.id} is {self.state}, not paused")
        if self.exchange is not None and self.exchange.status == "paused":
            self._move(SessionState.PROCESSING)
            return self._start(self.exchange.message, planning=self.planning, resume=True)
        self._move(SessionState.ACTIVE)
        self._journal_status("active")
        return None

    async def close(self) -> None:
        """Cancel the exchange in flight; ``closed`` is terminal."""
        if self.cell.state == SessionState.CLOSED:
            return
        if self._scope is not None:
            self._scope.cancel()
            if self.exchange is not None:
                await self.exchange.wait()
        if self.exchange is not None and self.exchange.status == "paused":
            self.exchange._end("cancelled")  # interrupted and never to be resumed: it ends here
        for card in self.pending:
            self._sessions.rt.answer(card.id, "refuse", by="close", reason="the session was closed")
        self._move(SessionState.CLOSED)
        rt = self._sessions.rt
        _, stored = await rt.journal.seal_async(
            self.r["run_id"], self.agent.name,
            [("session_status", {"session_id": self.id, "status": "closed"})], {"status": "closed"})
        rt.closing_checkpoint(self.r["run_id"], stored)

    def approve_plan(self, steps: list[str] | None = None, *, digest: str | None = None) -> Exchange:
        """Run the proposed plan (optionally edited). ``digest``: the ``plan_digest`` of the plan as shown
        to whoever approves it; another is ``STALE_APPROVAL`` (journaled ``answer_refused``)."""
        plan = self._plan_to_answer("approve", digest)
        if steps is not None:
            if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s for s in steps):
                raise BadInput("edited steps must be a non-empty list of strings")
            plan = steps
        self.r["pending_plan"] = None
        self.r["approved_plan"] = plan
        self.r["plan_approved"] = True
        self._journal("plan", {"session_id": self.id, "approved": True, "steps": plan, "edited": steps is not None,
                               **_plan_answerer(), "digest": self._plan_digest(plan)})
        self._append({"role": "user", "content": "Approved plan:\n" + "\n".join(f"{i + 1}. {s}" for i, s in enumerate(plan))})
        return self._start("(approved plan)", planning=False)

    def reject_plan(self, reason: str = "") -> None:
        shown = self._plan_to_answer("reject")
        self.r["pending_plan"] = None
        self._journal("plan", {"session_id": self.id, "approved": False, "reason": reason, **_plan_answerer(),
                               "digest": self._plan_digest(shown)})
        self._append({"role": "user", "content": f"Plan rejected: {reason}" if reason else "Plan rejected."})
        self._save()

    def _plan_digest(self, steps: list[str]) -> str:
        from apollia_nb.governance.approvals import plan_digest

        return plan_digest(task_id=self.id, run_id=self.r["run_id"], agent=self.agent.name, steps=steps)

    def _plan_to_answer(self, verdict: str, digest: str | None = None) -> list[str]:
        """The plan ``verdict`` answers. An answer to no plan waiting (answered already) is ``CONFLICT``, one
        naming the digest of another plan ``STALE_APPROVAL``: each journaled ``answer_refused``."""
        from apollia_nb.errors import StaleApproval
        from apollia_nb.runtime.tasks import plan_answer_refused

        self._check_open()
        plan = self.pending_plan
        if plan is None:
            raise plan_answer_refused(self._sessions.rt.journal, Conflict(f"session {self.id} has no plan waiting"),
                                      run_id=self.r["run_id"], agent=self.agent.name,
                                      subject={"session_id": self.id}, answer=verdict, by=None, digest=None,
                                      given_digest=digest)
        if self.cell.state == SessionState.PROCESSING:
            raise SessionBusy(f"session {self.id} is still answering")
        shown = self._plan_digest(list(plan))
        if digest is not None and digest != shown:
            raise plan_answer_refused(self._sessions.rt.journal, StaleApproval(
                f"the plan of session {self.id} shown now has the digest {shown}, not {digest}: read it again "
                "before answering"), run_id=self.r["run_id"], agent=self.agent.name,
                subject={"session_id": self.id}, answer=verdict, by=None, digest=shown, given_digest=digest)
        return list(plan)

    # ------------------------------------------------------------------ the exchange
    def _append(self, message: dict[str, Any]) -> None:
        self.r["history"].append(message)
        self._save()

    def _journal(self, kind: str, payload: dict[str, Any]) -> None:
        self._sessions.rt.journal.append(kind, payload, run_id=self.r["run_id"], agent=self.agent.name)

    def _journal_status(self, status: str) -> None:
        self._journal("session_status", {"session_id": self.id, "status": status})

    def _start(self, message: str, *, planning: bool, resume: bool = False) -> Exchange:
        if not resume:
            self.exchange = Exchange(id=f"x-{uuid.uuid4().hex[:8]}", message=message)
            self._move(SessionState.PROCESSING)
        else:
            assert self.exchange is not None
            self.exchange.status = "running"
        self._journal_status("processing")
        exchange = self.exchange
        assert exchange is not None
        rt = self._sessions.rt

        async def owned() -> None:
            with anyio.CancelScope() as scope:
                self._scope = scope
                try:
                    await self._run_exchange(exchange, planning)
                except Exception as exc:  # reported on the exchange; the session stays usable
                    from apollia_nb.errors import ApolliaError

                    err = exc if isinstance(exc, ApolliaError) else ApolliaError(f"{type(exc).__name__}: {exc}")
                    exchange.error = err.to_dict()
                    self._finish_exchange(exchange, "failed")
            if scope.cancelled_caught and exchange.status == "running":
                with anyio.CancelScope(shield=True):
                    exchange._end("cancelled")
            self._scope = None

        rt.start_soon(owned)
        return exchange

    def _finish_exchange(self, exchange: Exchange, status: str) -> None:
        if self.cell.state == SessionState.PROCESSING:
            self._move(SessionState.ACTIVE)
            self._journal_status("active")
        exchange._end(status)

    def _safe_point(self, exchange: Exchange) -> bool:
        """At a safe point: honour a pause. True when the exchange must stop here."""
        if not self._pause_requested:
            return False
        self._pause_requested = False
        exchange.status = "paused"
        exchange._push({"type": "paused"})
        self._move(SessionState.PAUSED)
        self._journal_status("paused")
        return True

    def _messages(self, role: str) -> list[Any]:
        from apollia_nb.runtime.models.base import Message, ReasoningPart, ToolCallRequest

        out = [Message(role="system", content=self.agent.system_prompt(role))]
        for m in self.r["history"]:
            calls = tuple(ToolCallRequest(**tc) for tc in m.get("tool_calls") or ())
            reasoning = tuple(ReasoningPart.from_json(p) for p in m.get("reasoning") or ())
            out.append(Message(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                               tool_call_id=m.get("tool_call_id"), name=m.get("name"), reasoning=reasoning))
        return out

    def _tools(self, planning: bool) -> list[Any]:
        from apollia_nb.runtime.models.base import PLAN_TOOL

        specs = self.agent.tool_specs()
        if not planning:
            return specs
        readonly = [s for s in specs if self.agent.tools.get(s.name).family in READ_ONLY_FAMILIES]
        return [*readonly, PLAN_TOOL]

    async def _run_exchange(self, exchange: Exchange, planning: bool) -> None:
        from apollia_nb.runtime.governed import NULL_DIGEST, governed_call, shown_tool_calls
        from apollia_nb.runtime.models.base import (
            REDACTED_REASONING, Completed, ReasoningDelta, TextDelta, ToolCallStarted, parse_plan,
        )
        from apollia_nb.runtime.tasks import calls_subjects, turn_extras

        rt = self._sessions.rt
        while True:
            planning = planning or self.planning  # never less than the session's plan-mode
            role = "planner" if planning else "actor"
            if self._safe_point(exchange):
                return
            response = None
            async for event in self.model.stream(role, self._messages(role), self._tools(planning)):
                if isinstance(event, TextDelta):
                    exchange._push({"type": "text", "text": event.text})
                elif isinstance(event, ReasoningDelta):
                    exchange._push({"type": "reasoning", "text": event.text})
                elif isinstance(event, ToolCallStarted):
                    exchange._push({"type": "tool_call_started", "name": event.name})
                elif isinstance(event, Completed):
                    response = event.response
            assert response is not None
            if any(part.redacted and not part.text for part in response.reasoning):  # shown as such, never its data
                before = any(e["type"] == "reasoning" for e in exchange.events)
                exchange._push({"type": "reasoning", "text": ("\n\n" if before else "") + REDACTED_REASONING})
            state = rt.model_state(self.model)
            if state is not None:
                self.r["model_state"] = state  # saved with the session's record
            self.r["turns"] = self.r.get("turns", 0) + 1
            turn = self.r["turns"]
            calls = [
                {"id": f"s{turn}-{i + 1}", "name": tc.name, "arguments": dict(tc.arguments)}
                for i, tc in enumerate(response.tool_calls)
            ]
            # Journaled and kept in the session's history as the calls' decisions show them.
            shown = {c["call_id"]: c["arguments"] for c in shown_tool_calls(rt, self.agent, [
                {"call_id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in calls])}
            turned: dict[str, Any] = {
                "role": role, "turn": turn, "text": response.text,
                "tool_calls": [{"call_id": c["id"], "name": c["name"], "arguments": shown[c["id"]]} for c in calls
                               if c["name"] != "submit_plan"],
                **turn_extras(response),
            }
            from apollia_nb.journal.subjects import subjects_field

            turned.update(subjects_field("model_response", calls_subjects(rt, self.agent, calls), turned))
            await rt.journal.append_async("model_response", turned, run_id=self.r["run_id"], agent=self.agent.name)
            plan_call = next((c for c in calls if c["name"] == "submit_plan"), None)
            if planning and plan_call is not None:
                steps = parse_plan(response)
                self.r["pending_plan"] = steps
                self._append({"role": "assistant", "content": response.text or "Proposed plan:\n"
                              + "\n".join(f"{i + 1}. {s}" for i, s in enumerate(steps))})
                self._journal("plan", {"session_id": self.id, "proposed": steps})
                exchange._push({"type": "plan", "steps": steps})
                exchange.reply = self.r["history"][-1]["content"]
                self._finish_exchange(exchange, "done")
                return
            tool_calls = [c for c in calls if c["name"] != "submit_plan"]
            said: dict[str, Any] = {"role": "assistant", "content": response.text,
                                    "tool_calls": [{**c, "arguments": shown[c["id"]]} for c in tool_calls]}
            if response.reasoning:  # goes back to the provider with the next turn (signed thinking)
                said["reasoning"] = [part.to_json() for part in response.reasoning]
            self._append(said)
            if not tool_calls:
                exchange.reply = response.text
                self._finish_exchange(exchange, "done")
                return
            for c in tool_calls:
                if self._safe_point(exchange):
                    # The rest of this turn's calls are not made: tell the model so.
                    for rest in tool_calls[tool_calls.index(c):]:
                        self._append({"role": "tool", "content": '{"skipped": "paused"}',
                                      "tool_call_id": rest["id"], "name": rest["name"]})
                        await rt.journal.append_async("tool_result", {
                            "call_id": rest["id"], "tool": rest["name"], "status": "skipped",
                            "error_code": "PAUSED", "output": None,
                            "output_digest": NULL_DIGEST,
                        }, run_id=self.r["run_id"], agent=self.agent.name)
                    return
                allowed_names = {s.name for s in self._tools(planning)}
                if planning and c["name"] not in allowed_names:
                    from apollia_nb.runtime.governed import CallResult

                    result = CallResult(c["id"], c["name"], "refused", error_code="REFUSED",  # type: ignore[arg-type]  # a call's fields are str
                                        error_message="only read-only tools before the plan is approved")
                    await rt.journal.append_async("tool_result", {
                        "call_id": c["id"], "tool": c["name"], "status": "refused", "error_code": "REFUSED",
                        "output": None,
                        "output_digest": NULL_DIGEST,
                    }, run_id=self.r["run_id"], agent=self.agent.name)
                else:
                    async def on_wait(card: Any) -> None:
                        exchange._push({"type": "card", "card": card.to_dict()})

                    result = await governed_call(
                        rt, self.agent, run_id=self.r["run_id"], call_id=c["id"], name=c["name"],  # type: ignore[arg-type]  # as above
                        arguments=c["arguments"], mode="chat", session_id=self.id, waiting_hook=on_wait,  # type: ignore[arg-type]  # as above
                    )
                exchange._push({"type": "tool_result", "call_id": c["id"], "tool": c["name"],
                                "status": result.status, "error_code": result.error_code})
                self._append({"role": "tool", "content": result.for_model(), "tool_call_id": c["id"],
                              "name": c["name"]})


class Sessions:
    """The runtime's chat sessions."""

    def __init__(self, rt: "ChatHost") -> None:
        self.rt = rt
        self._sessions: dict[str, Session] = {}
        self._unloaded: dict[str, dict[str, Any]] = {}
        for record in rt.records.sessions():
            agent = rt.find_agent(record["agent"])
            if record["state"] == SessionState.PROCESSING.value or agent is None:
                self._unloaded[record["id"]] = record  # not reloaded at boot; resume brings it back
                continue
            self._sessions[record["id"]] = Session(self, agent, record)

    def open(self, agent: str, *, plan_mode: bool = False, parent_id: str | None = None,
             history: list[dict[str, Any]] | None = None, forked_from: str | None = None,
             session_id: str | None = None) -> Session:
        """A new session; ``session_id``: the id it gets (named before it is opened, so a retry can find it;
        an id in use is ``CONFLICT``)."""
        the_agent = self.rt.agent(agent)
        the_agent.check_accepts_work()
        if session_id is None:
            session_id = f"chat-{uuid.uuid4().hex[:12]}"
        elif session_id in self._sessions or session_id in self._unloaded:
            raise Conflict(f"session {session_id} exists already")
        record = {
            "id": session_id, "agent": agent, "state": SessionState.ACTIVE.value, "plan_mode": plan_mode,
            "parent_id": parent_id, "forked_from": forked_from, "children": [],
            "history": list(history or []), "run_id": f"run-{uuid.uuid4().hex[:12]}",
            "pending_plan": None, "created_at": self.rt.now_iso(), "started_by": _starter(),
        }
        if forked_from is not None:  # a fork goes on with the script from where its source stands
            source = self.get(forked_from)
            state = self.rt.model_state(source.model)
            if state is not None:
                record["model_state"] = state
        session = Session(self, the_agent, record)
        self._sessions[session_id] = session
        self.rt.journal.append("run_open", {"run_kind": "chat", "session_id": session_id,
                                            **({"parent_id": parent_id} if parent_id else {}),
                                            **({"forked_from": forked_from} if forked_from else {})},
                               run_id=record["run_id"], agent=agent)  # type: ignore[arg-type]  # a run id is a str
        session._save()
        if parent_id is not None:
            parent = self.get(parent_id)
            parent.r["children"].append(session_id)
            parent._save()
        return session

    def get(self, session_id: str) -> Session:
        if session_id in self._sessions:
            return self._sessions[session_id]
        if session_id in self._unloaded:
            raise Conflict(f"session {session_id} was left processing by a crash: resume it")
        raise UnknownSession(f"no session {session_id!r}")

    def view(self, session_id: str) -> dict[str, Any]:
        """The session's JSON (``Session.to_dict``); one left ``processing`` by a crash as it was stored."""
        record = self._unloaded.get(session_id)
        if record is None:
            return self.get(session_id).to_dict()
        return {"id": session_id, "agent": record["agent"], "state": record["state"],
                "plan_mode": record["plan_mode"], "parent_id": record.get("parent_id"),
                "forked_from": record.get("forked_from"), "children": list(record["children"]),
                "history": list(record["history"]), "run_id": record["run_id"],
                "pending_plan": record.get("pending_plan"), "created_at": record["created_at"],
                "plan_digest": _stored_plan_digest(session_id, record)}

    def resume(self, session_id: str) -> Session:
        """Bring back a session left ``processing`` by a crash, as ``active``."""
        if session_id in self._unloaded:
            record = self._unloaded.pop(session_id)
            agent = self.rt.agent(record["agent"])
            session = Session(self, agent, record)
            self._sessions[session_id] = session
            session.resume()
            return session
        session = self.get(session_id)
        session.resume()
        return session

    def fork(self, session_id: str, *, new_id: str | None = None) -> Session:
        """A new session with a copy of this one's history (``new_id``: its id, as ``open``'s ``session_id``)."""
        source = self.get(session_id)
        if source.state == SessionState.PROCESSING.value:
            raise SessionBusy(f"session {session_id} is still answering; fork it when it is done")
        return self.open(source.agent.name, plan_mode=source.r["plan_mode"],
                         history=[dict(m) for m in source.r["history"]], forked_from=session_id, session_id=new_id)

    def spawn_child(self, parent_id: str, agent: str | None = None, *, plan_mode: bool | None = None) -> Session:
        """A child session. A child of a plan-mode session is plan-mode: always while the parent has
        no approved plan in force (``plan_mode=False`` is then ``CONFLICT``), and by default after."""
        parent = self.get(parent_id)
        parent._check_open()
        if plan_mode is None:
            plan_mode = bool(parent.r["plan_mode"])
        elif not plan_mode and parent.planning:
            raise Conflict(f"session {parent_id} is in plan-mode with no approved plan: its children are plan-mode")
        return self.open(agent or parent.agent.name, plan_mode=plan_mode, parent_id=parent_id)

    def all(self) -> list[Session]:
        return list(self._sessions.values())

    def _after_answer(self, card: "Card") -> None:
        """Cards in chat are awaited in place; nothing to resume."""


def _stored_plan_digest(session_id: str, record: dict[str, Any]) -> str | None:
    """The ``plan_digest`` of a stored session's waiting plan (``Session.to_dict``'s), None when none waits."""
    from apollia_nb.governance.approvals import plan_digest

    plan = record.get("pending_plan")
    if plan is None:
        return None
    return plan_digest(task_id=session_id, run_id=record["run_id"], agent=record["agent"], steps=list(plan))


def _plan_answerer() -> dict[str, Any]:
    """Who answers a plan, for its ``plan`` entry: the REST request's person (``by``, ``by_role``, ``auth``),
    else ``user`` (a kernel)."""
    from apollia_nb.governance.acting import ACTING

    actor = ACTING.get()
    return {"by": actor[0], "by_role": actor[1], "auth": actor[2]} if actor is not None else {"by": "user"}


def _starter() -> str:
    """Who starts a session: the REST request's person, else the local owner (four eyes reads it)."""
    from apollia_nb.governance.acting import ACTING
    from apollia_nb.governance.approvals import local_person

    actor = ACTING.get()
    return actor[0] if actor is not None else local_person()
