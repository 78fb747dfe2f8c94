"""The task engine (Scenario A): plan → actor loop → critic → re-plan, under one ceiling.

Every model turn and every tool call is one step of the budget, checked inside
the actor loop, so the ceiling stops the agent (``failed``, ``BUDGET_EXCEEDED``).
Every tool call goes through ``governed_call``; a refused call fails its step
(and the task: a plan whose step failed is not carried on). Waiting for a
person is a plain await — it consumes no budget. An unattended run suspends at
the first call that would ask: the record (plan, position, the step's history,
the calls still to make) is saved in ``runtime.db`` and the run is resumed from
that call when the decision is answered, in this process or after a restart.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb import faults
from apollia_nb.errors import ApolliaError, BudgetExceeded, Rejected
from apollia_nb.runtime.governed import NULL_DIGEST
from apollia_nb.runtime.states import TASK, TaskStatus, can_transition

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.agents import Agent
    from apollia_nb.runtime.capabilities import TaskHost

__all__ = ["TaskRun", "new_task_record", "task_json", "recovery"]

_TERMINAL = {TaskStatus.COMPLETED.value, TaskStatus.FAILED.value, TaskStatus.CANCELLED.value}


def new_task_record(
    *, task_id: str, run_id: str, agent: str, goal: str, ceiling: int, watched: bool,
    grants: list[str], approve_plan: bool, warnings: list[str], created_at: str,
) -> dict[str, Any]:
    return {
        "id": task_id, "run_id": run_id, "agent": agent, "goal": goal, "status": TaskStatus.PENDING.value,
        "error": None, "result": None, "warnings": warnings, "watched": watched, "grants": grants,
        "approve_plan": approve_plan, "budget": {"used": 0, "ceiling": ceiling},
        "phase": "plan", "plan": [], "steps": [], "step_index": 0, "attempt": 0,
        "feedback": [], "messages": [], "queued_calls": [], "awaiting": None,
        "plan_decision": None, "verdict": None, "created_at": created_at, "updated_at": created_at,
    }


def task_json(record: dict[str, Any]) -> dict[str, Any]:
    """The task as the REST API and the SDK show it."""
    return {
        "id": record["id"], "run_id": record["run_id"], "agent": record["agent"], "goal": record["goal"],
        "status": record["status"], "error": record["error"], "steps": record["steps"],
        "budget": dict(record["budget"]), "result": record["result"], "warnings": list(record["warnings"]),
        "plan": list(record["plan"]), "verdict": record.get("verdict"),
        "awaiting_plan_approval": record["phase"] == "approve" and record["status"] == "waiting",
        "progress": record.get("progress"),
        "created_at": record["created_at"], "updated_at": record["updated_at"],
    }


def recovery(
    *, status: str, unattended: bool, awaiting: bool, decision: str | None, answered_by: str | None,
    opened: bool, call_started: bool, sealed: bool, plan_answered: bool = False,
) -> str:
    """What a restart does with a task record it finds unfinished (pure: what the three stores say in,
    an action out). See docs/runtime.md, "Acknowledged means durable".

    ``decision``: the state of the decision the record waits on (``pending``, ``answered`` — expired
    counts as answered ``refuse`` —, ``unknown``, ``unreadable``) or None when it waits on none.
    ``opened``/``call_started``/``sealed``: the journal holds the run's ``run_open``, a ``tool_call`` or
    ``tool_result`` of the awaited call, its ``run_seal``; ``plan_answered``: the answer to the plan the
    run waits on.

    ========================================  ==========================================
    the stores say                            the restart
    ========================================  ==========================================
    the journal sealed the run                ``sealed``: the record takes the seal's status
    submitted unattended, nothing journaled   ``start``: the run starts now
    suspended, its decision pending           ``park``: it waits on, listed as before
    its decision answered, the call not made  ``resume`` (``cancel`` when a cancel answered it)
    its plan answered (journaled)             ``resume``: the answer is taken
    its decision is gone                      ``lost``: failed ``INTERRUPTED``
    anything else (it was running)            ``interrupt``: failed ``INTERRUPTED``
    ========================================  ==========================================
    """
    if sealed:
        return "sealed"
    if status == TaskStatus.PENDING.value:
        return "start" if unattended and not opened else "interrupt"
    parked = status == TaskStatus.WAITING.value and unattended
    if not awaiting:  # waiting on its plan's approval, or cut short
        if parked and plan_answered:
            return "resume"
        return "park" if parked else "interrupt"
    if decision in ("pending", "unreadable"):
        return "park" if parked else "interrupt"
    if decision == "unknown":
        return "lost"
    if call_started or not unattended:  # the tool may have run; a watched run's model was not saved
        return "interrupt"
    return "cancel" if answered_by == "cancel" else "resume"


class _Suspend(Exception):
    """Raised inside the engine to park an unattended run; the record is saved first."""


class TaskRun:
    """Drives one task's record through the engine. Resumable from its record."""

    def __init__(self, rt: "TaskHost", agent: "Agent", record: dict[str, Any]) -> None:
        self.rt = rt
        self.agent = agent
        self.r = record
        self.done = anyio.Event()
        self.plan_answer: tuple[str, str | None, list[str] | None] | None = None
        self._active = False
        self._history: list[Any] | None = None
        self._turn_entry: tuple[str, dict[str, Any]] | None = None
        self._plan_event = anyio.Event()
        self._model_instance: Any = None

    # ---------------------------------------------------------------- helpers
    @property
    def id(self) -> str:
        return self.r["id"]

    @property
    def status(self) -> str:
        return self.r["status"]

    @property
    def model(self) -> Any:
        """This run's model: a scripted agent's script plays from the beginning for every task."""
        if self._model_instance is None:
            self._model_instance = self.rt._run_model(self.agent, self.r.get("model_state"))
        return self._model_instance

    def _set_status(self, status: TaskStatus) -> None:
        if self.r["status"] == status.value:
            return
        if not can_transition(TASK, self.r["status"], status):
            return  # terminal already (e.g. cancelled while a step finished)
        self.r["status"] = status.value
        self._save()
        self.rt._notify(self)

    def _save(self) -> None:
        self.r["updated_at"] = self.rt.now_iso()
        self.rt.records.save_task(self.r, self.r["updated_at"])

    async def _journal(self, kind: str, payload: dict[str, Any]) -> None:
        await self.rt.journal.append_async(kind, payload, run_id=self.r["run_id"], agent=self.agent.name)

    def _journal_soon(self, kind: str, payload: dict[str, Any]) -> None:
        """Hand an entry that records what happened (a model's answer, the plan, a verdict) to the
        journal's writer without waiting: it is committed before anything later of the run, so
        before any call it leads to and before the run's seal (``Journal.append_soon``)."""
        self.rt.journal.append_soon(kind, payload, run_id=self.r["run_id"], agent=self.agent.name)

    def _spend(self) -> None:
        budget = self.r["budget"]
        if budget["used"] >= budget["ceiling"]:
            raise BudgetExceeded(f"the step ceiling of {budget['ceiling']} was reached")
        budget["used"] += 1

    async def _status_entry(self, status: str) -> None:
        await self._journal("task_status", {"task_id": self.id, "status": status})

    # ---------------------------------------------------------------- main
    async def run(self) -> None:
        """Run (or resume) until completed, failed, cancelled or suspended."""
        self._active = True
        suspended = False
        try:
            if self.r["status"] == TaskStatus.PENDING.value:
                # One commit for both: the run is open and running in the journal before its record says so.
                await self.rt.journal.append_many_async([
                    (kind, payload, self.r["run_id"], self.agent.name) for kind, payload in (
                        ("run_open", {"run_kind": "task", "goal": self.r["goal"], "task_id": self.id}),
                        ("task_status", {"task_id": self.id, "status": "running"}))])
                self._set_status(TaskStatus.RUNNING)
            await self._drive()
        except _Suspend:
            suspended = True  # no await until _active is false: an answer arriving now must resume it
            return
        except BudgetExceeded as exc:
            await self._finish(TaskStatus.FAILED, error=exc)
        except Rejected as exc:
            await self._finish(TaskStatus.FAILED, error=exc)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._finish(TaskStatus.CANCELLED, error=None)
            raise
        except ApolliaError as exc:
            await self._finish(TaskStatus.FAILED, error=exc)
        except Exception as exc:  # a bug must still end the run visibly, never silently
            await self._finish(TaskStatus.FAILED, error=ApolliaError(f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self._active = False  # from here an answer resumes the run anew
            if self.r["status"] in _TERMINAL:
                self.done.set()
                self.rt._wake(self.id)  # the status changed before the closing checkpoint; now it is done
            else:
                if suspended:
                    # Suspended means recorded (a restart finds it, with what it needs to resume)
                    # before whoever waits for it to settle is told.
                    with anyio.CancelScope(shield=True):
                        await self.rt._recorded(f"suspended task {self.id}")
                    faults.point("suspend.after_record")
                self.rt._notify(self)  # suspended: parked with nothing running

    async def _drive(self) -> None:
        while True:
            phase = self.r["phase"]
            if phase == "plan":
                await self._plan()
            elif phase == "approve":
                await self._await_plan_approval()
            elif phase == "execute":
                finished = await self._execute()
                if not finished:
                    return  # step failed → task failed already
            elif phase == "critic":
                if await self._critic():
                    return
            else:  # pragma: no cover - records are written by this module only
                raise ApolliaError(f"unknown task phase {phase!r}")

    async def _finish(self, status: TaskStatus, *, error: ApolliaError | None, result: Any = None) -> None:
        if self.r["status"] in _TERMINAL:
            return
        try:
            await self._seal(status, error=error, result=result)
        except ApolliaError as exc:
            # The journal refused the closing entries (it is closed, or its server went away): the run
            # still ends, failed, and says why; the unsealed trace shows as incomplete on replay.
            self.r["error"] = {"code": exc.code, "message": f"the run could not be sealed: {exc.message}"}
            self.r["queued_calls"] = []
            self.r["phase"] = "done"
            self._set_status(TaskStatus.FAILED)
            self.rt._emit("warning", f"task {self.id}: {exc}")

    async def _seal(self, status: TaskStatus, *, error: ApolliaError | None, result: Any) -> None:
        last: list[tuple[str, dict[str, Any]]] = []  # the run's last entries, committed with its seal
        if self._turn_entry is not None:  # the ceiling stopped the run before the turn's first call
            last.append(self._turn_entry)
        for queued in self.r["queued_calls"]:
            # Calls the model asked for that will never run: say so, so the trace stays complete.
            last.append(("tool_result", {
                "call_id": queued["call_id"], "tool": queued["name"], "status": "skipped",
                "error_code": error.code if error is not None else "CANCELLED", "output": None,
                "output_digest": NULL_DIGEST,
            }))
        self.r["error"] = error.to_dict() if error is not None else None
        if result is not None:
            self.r["result"] = result
        self.r["phase"] = "done"
        for step in self.r["steps"]:
            if step["status"] == "running":  # the step the run ended in ends with it
                step["status"] = "cancelled" if status is TaskStatus.CANCELLED else "failed"
        payload: dict[str, Any] = {"task_id": self.id, "status": status.value}
        if error is not None:
            payload["error"] = error.to_dict()
        last.append(("task_status", payload))
        seal: dict[str, Any] = {"status": status.value}
        if error is not None:
            seal["error"] = error.to_dict()
        # One commit for the last entries and the seal (which counts the entries before it), then the
        # closing checkpoint signed: the run ends once it is signed, while journal.db stores it.
        _, stored = await self.rt.journal.seal_async(self.r["run_id"], self.agent.name, last, seal)
        self._turn_entry = None
        self.r["queued_calls"] = []
        faults.point("run.after_seal")
        self._set_status(status)
        self.rt._closing_checkpoint(self.r["run_id"], stored)

    # ---------------------------------------------------------------- phases
    async def _plan(self) -> None:
        from apollia_nb.runtime.models.base import PLAN_TOOL, Message, parse_plan

        self._spend()
        messages = [Message(role="system", content=self.agent.system_prompt("planner"))]
        if self.r["feedback"]:
            messages.append(Message(role="user", content="The critic did not accept the last attempt: "
                                    + "; ".join(self.r["feedback"])))
        messages.append(Message(role="user", content=self.r["goal"]))
        response = await self._model("planner", messages, [PLAN_TOOL])
        steps = parse_plan(response)
        if not steps:
            steps = [self.r["goal"]]
        self.r["plan"] = steps
        self.r["steps"] = [{"index": i, "description": s, "status": "pending", "tool_calls": [], "text": None}
                           for i, s in enumerate(steps)]
        self.r["step_index"] = 0
        self.r["messages"] = []
        self.r["queued_calls"] = []
        self._journal_soon("plan", {"task_id": self.id, "steps": steps, "attempt": self.r["attempt"]})
        self.r["phase"] = "approve" if self.r["approve_plan"] else "execute"
        # Not saved here: a running task is saved at its status changes and when it
        # suspends; one its process loses mid-run is failed at the next start (the
        # journal holds its whole trace), so a progress save would buy nothing.
        self.rt._notify(self)

    async def _await_plan_approval(self) -> None:
        if self.plan_answer is None:
            self._set_status(TaskStatus.WAITING)
            await self._status_entry("waiting")
            if not self.r["watched"] and self.rt.suspend_unattended and self.plan_answer is None:
                raise _Suspend()
            await self._plan_event.wait()
        assert self.plan_answer is not None
        verdict, reason, edited = self.plan_answer
        self.plan_answer = None
        self._plan_event = anyio.Event()
        self._set_status(TaskStatus.RUNNING)
        if verdict == "reject":  # the answer was journaled when it was given (answer_plan)
            self.r["plan_decision"] = {"approved": False, "reason": reason}
            raise Rejected(f"the plan was rejected: {reason or 'no reason given'}")
        if edited:
            self.r["plan"] = list(edited)
            self.r["steps"] = [{"index": i, "description": s, "status": "pending", "tool_calls": [], "text": None}
                               for i, s in enumerate(edited)]
        self.r["plan_decision"] = {"approved": True, "edited": bool(edited)}
        await self._status_entry("running")
        self.r["phase"] = "execute"
        self._save()

    def answer_plan(self, verdict: str, reason: str | None = None, steps: list[str] | None = None) -> None:
        """Take the answer to the plan: journaled (durable when this returns, so a restart finds it),
        then the run is woken. A second answer before the run took the first is a ``Conflict``."""
        from apollia_nb.errors import Conflict

        if self.plan_answer is not None:
            raise Conflict(f"the plan of task {self.id} was already answered")
        if verdict == "reject":
            payload: dict[str, Any] = {"task_id": self.id, "approved": False, "reason": reason}
        else:
            payload = {"task_id": self.id, "approved": True, "steps": list(steps or self.r["plan"])}
        self.rt.journal.append("plan", payload, run_id=self.r["run_id"], agent=self.agent.name)
        self.plan_answer = (verdict, reason, steps)
        self._plan_event.set()

    def plan_answer_from(self, payload: dict[str, Any]) -> None:
        """At a restart: the answer to the plan as journaled (``answer_plan``), not yet taken by the run."""
        if not payload["approved"]:
            self.plan_answer = ("reject", payload.get("reason"), None)
        else:
            steps = list(payload["steps"])
            self.plan_answer = ("approve", None, steps if steps != self.r["plan"] else None)

    async def _execute(self) -> bool:
        """Run the remaining steps. False when a step failed (the task is then failed)."""
        from apollia_nb.runtime.models.base import Message, reasoning_text

        while self.r["step_index"] < len(self.r["plan"]):
            index = self.r["step_index"]
            step = self.r["steps"][index]
            if step["status"] == "pending":
                step["status"] = "running"
                self.r["messages"] = []
                self._history = []
                self._push(Message(role="system", content=self.agent.system_prompt("actor")))
                self._push(Message(role="user", content=f"Goal: {self.r['goal']}\n"
                                   f"Step {index + 1} of {len(self.r['plan'])}: {step['description']}"))
                self.rt._notify(self)
            while True:
                if self.r["queued_calls"] or self.r["awaiting"]:
                    failed = await self._work_queued_calls(step)
                    if failed is not None:
                        step["status"] = "failed"
                        await self._finish(TaskStatus.FAILED, error=failed)
                        return False
                    continue
                self._spend()
                response = await self._model("actor", list(self._messages()), self.agent.tool_specs())
                self._push(Message(role="assistant", content=response.text, tool_calls=response.tool_calls,
                                   reasoning=response.reasoning))
                if response.reasoning:
                    step.setdefault("reasoning", []).append(reasoning_text(response.reasoning))
                if response.tool_calls:
                    self.r["queued_calls"] = [
                        {"call_id": tc.id, "name": tc.name, "arguments": dict(tc.arguments), "counted": False}
                        for tc in response.tool_calls
                    ]
                    continue
                step["status"] = "done"
                step["text"] = response.text
                self.r["result"] = response.text
                break
            self.r["step_index"] = index + 1
            self.r["messages"] = []
            self._history = []
            self.rt._notify(self)  # saved at the next status change or suspension (see _plan)
        self.r["phase"] = "critic"
        return True

    async def _work_queued_calls(self, step: dict[str, Any]) -> ApolliaError | None:
        """Make the queued calls of the last model turn, in order. Returns the failure of the step, if any."""
        from apollia_nb.errors import Refused
        from apollia_nb.runtime.governed import continue_after_answer, governed_call
        from apollia_nb.runtime.models.base import Message

        while self.r["queued_calls"]:
            queued = self.r["queued_calls"][0]
            if self.r["awaiting"]:
                card = self.rt._card(self.r["awaiting"])
                if card is None or card.waiting:
                    if not self.r["watched"] and self.rt.suspend_unattended:
                        raise _Suspend()
                    assert card is not None
                    await card.wait()
                    if card.waiting:  # released unanswered (nobody watches any more): suspend
                        self._save()
                        raise _Suspend()
                self._set_status(TaskStatus.RUNNING)
                await self._status_entry("running")
                faults.point("resume.after_running")
                result = await continue_after_answer(self.rt, self.agent, card)
                self.r["awaiting"] = None
            else:
                if not queued["counted"]:
                    self._spend()
                    queued["counted"] = True
                mode = "watched" if (self.r["watched"] or not self.rt.suspend_unattended) else "unattended"
                waiting_hook = self._on_waiting
                prefix = [self._turn_entry] if self._turn_entry is not None else []
                self._turn_entry = None
                result = await governed_call(
                    self.rt, self.agent, run_id=self.r["run_id"], call_id=queued["call_id"],
                    name=queued["name"], arguments=queued["arguments"], mode=mode,
                    grants=frozenset(self.r["grants"]), task_id=self.id, waiting_hook=waiting_hook,
                    prefix=prefix,
                )
                if self.r["awaiting"] and result.status != "waiting":
                    self.r["awaiting"] = None  # a watched wait ended with the answer
                    self._set_status(TaskStatus.RUNNING)
                    await self._status_entry("running")
                if result.status == "waiting":
                    assert result.card is not None
                    faults.point("suspend.before_record")
                    self.r["awaiting"] = result.card.id
                    self._set_status(TaskStatus.WAITING)
                    await self._status_entry("waiting")
                    self._save()
                    if result.card.waiting:  # no await between this check and leaving: no lost answer
                        raise _Suspend()
                    continue
            self.r["queued_calls"].pop(0)
            step["tool_calls"].append({"call_id": result.call_id, "tool": result.tool, "status": result.status,
                                       "error_code": result.error_code})
            self._push(Message(role="tool", content=result.for_model(), tool_call_id=result.call_id,
                               name=result.tool))
            self.rt._notify(self)
            if result.status == "refused":
                return Refused(f"{result.tool}: {result.error_message}")
        return None

    def _messages(self) -> list[Any]:
        """The step's history as model messages, kept incrementally (rebuilt only after a resume)."""
        if self._history is None or len(self._history) != len(self.r["messages"]):
            self._history = [_unmsg(m) for m in self.r["messages"]]
        return self._history

    def _push(self, message: Any) -> None:
        self._messages()
        self.r["messages"].append(_msg(message))
        self._history.append(message)

    async def _on_waiting(self, card: Any) -> None:
        """A watched run is about to wait on a card: show it as waiting."""
        self.r["awaiting"] = card.id
        self._set_status(TaskStatus.WAITING)
        await self._status_entry("waiting")

    async def _critic(self) -> bool:
        """True when the task finished (passed); False to re-plan."""
        from apollia_nb.runtime.models.base import VERDICT_TOOL, Message, parse_verdict

        self._spend()
        summary = "\n".join(
            f"{s['index'] + 1}. {s['description']}: {s['status']}"
            + (f" — {s['text']}" if s.get("text") else "")
            for s in self.r["steps"]
        )
        messages = [
            Message(role="system", content=self.agent.system_prompt("critic")),
            Message(role="user", content=f"Goal: {self.r['goal']}\nWhat was done:\n{summary}"),
        ]
        response = await self._model("critic", messages, [VERDICT_TOOL])
        verdict, reasons = parse_verdict(response)
        self.r["verdict"] = {"verdict": verdict, "reasons": list(reasons)}
        self._journal_soon("verdict", {"task_id": self.id, "verdict": verdict, "reasons": list(reasons),
                                        "attempt": self.r["attempt"]})
        if verdict == "pass":
            await self._finish(TaskStatus.COMPLETED, error=None, result=self.r["result"])
            return True
        self.r["feedback"] = list(reasons) or ["the critic failed the result"]
        self.r["attempt"] += 1
        self.r["phase"] = "plan"
        self._save()
        return False

    async def _model(self, role: str, messages: list[Any], tools: list[Any]) -> Any:
        from apollia_nb.runtime.models.base import ToolCallRequest

        response = await self.model.complete(role, messages, tools)
        state = self.rt._model_state(self.model)
        if state is not None:
            self.r["model_state"] = state  # saved with the record: a resumed run continues its script
        turn = self.r.setdefault("turns", 0) + 1
        self.r["turns"] = turn
        # Call ids are the engine's own (unique within the run), whatever the provider sent.
        calls = tuple(
            ToolCallRequest(id=f"c{turn}-{i + 1}", name=tc.name, arguments=dict(tc.arguments))
            for i, tc in enumerate(response.tool_calls)
        )
        response = replace(response, tool_calls=calls)
        listed = [{"call_id": tc.id, "name": tc.name, "arguments": dict(tc.arguments)} for tc in response.tool_calls]
        payload: dict[str, Any] = {"role": role, "turn": turn, "text": response.text, "tool_calls": listed}
        if role != "actor":
            # The planner's and critic's calls are structured answers (submit_plan, submit_verdict), not tools.
            payload = {"role": role, "turn": turn, "text": response.text, "tool_calls": [], "structured": listed}
        payload.update(turn_extras(response))
        if role == "actor" and calls:
            # Committed together with the first call's decision, before anything it asked for runs.
            self._turn_entry = ("model_response", payload)
        else:
            self._journal_soon("model_response", payload)
        return response


def turn_extras(response: Any) -> dict[str, Any]:
    """What a model turn's journal entry carries beside its text and calls, when there is any:
    ``usage`` (the provider's token counts) and ``reasoning`` (its parts, never the answer;
    signatures and redacted data as the provider sent them) with ``reasoning_digest``, the digest
    of the whole; past the output cap the reasoning is cut like an output, the digest still the whole's."""
    from apollia_nb.runtime.governed import _capped

    extras: dict[str, Any] = {}
    if response.usage:
        extras["usage"] = _json_copy(dict(response.usage))
    if response.reasoning:
        parts = [part.to_json() for part in response.reasoning]
        extras["reasoning"], extras["reasoning_digest"], _ = _capped(parts)
    return extras


def _msg(message: Any) -> dict[str, Any]:
    """A ``Message`` as the plain dict stored in the task's record (``_unmsg`` reads it back)."""
    out = {
        "role": message.role,
        "content": message.content,
        "tool_calls": [{"id": tc.id, "name": tc.name, "arguments": _json_copy(tc.arguments)}
                       for tc in message.tool_calls],
        "tool_call_id": message.tool_call_id,
        "name": message.name,
    }
    if message.reasoning:  # sent back to the provider with the turn after a resume too
        out["reasoning"] = [part.to_json() for part in message.reasoning]
    return out


def _json_copy(value: Any) -> Any:
    """``copy.deepcopy`` of a JSON value (what a model's call arguments are), without its memo;
    anything else is deep-copied as before."""
    kind = type(value)
    if kind is dict:
        return {key: _json_copy(item) for key, item in value.items()}
    if kind is list:
        return [_json_copy(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def _unmsg(data: dict[str, Any]) -> Any:
    from apollia_nb.runtime.models.base import Message, ReasoningPart, ToolCallRequest

    calls = tuple(ToolCallRequest(**tc) for tc in data.get("tool_calls") or ())
    reasoning = tuple(ReasoningPart.from_json(p) for p in data.get("reasoning") or ())
    return Message(role=data["role"], content=data.get("content") or "", tool_calls=calls,
                   tool_call_id=data.get("tool_call_id"), name=data.get("name"), reasoning=reasoning)


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, default=str)


def task_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """A task record as one row of a batch's results: status, result, error code, run id, steps used."""
    error = record.get("error") or None
    return {"status": record["status"], "result": record.get("result"),
            "error_code": error.get("code") if error else None, "run_id": record.get("run_id"),
            "steps_used": record.get("budget", {}).get("used", 0)}
