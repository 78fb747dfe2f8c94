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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb import faults
from apollia_nb.errors import ApolliaError, BudgetExceeded, HomeFileCorrupt, InvalidTransition, Rejected
from apollia_nb.journal.subjects import subjects_field
from apollia_nb.runtime.governed import NULL_DIGEST
from apollia_nb.runtime.states import (
    PHASE, STEP, TASK, StepStatus, TaskPhase, TaskStatus, is_terminal, transition,
)

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.agents import Agent
    from apollia_nb.runtime.capabilities import TaskHost

__all__ = ["TaskRun", "TaskRecord", "StepRecord", "Budget", "new_task_record", "task_json", "recovery"]


@dataclass
class StepRecord:
    """One step of a task's plan. ``status`` moves only through :meth:`move` (the ``STEP`` machine)."""

    index: int
    description: str
    status: StepStatus = StepStatus.PENDING
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    text: str | None = None
    reasoning: list[str] = field(default_factory=list)  # the model's reasoning in this step, when it gave any

    def move(self, target: StepStatus) -> None:
        """Through the machine: an illegal move raises ``INVALID_TRANSITION`` and changes nothing."""
        self.status = transition(STEP, self.status, target)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "description": self.description, "status": self.status.value,
                               "tool_calls": self.tool_calls, "text": self.text}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StepRecord":
        return cls(index=int(data["index"]), description=str(data["description"]),
                   status=STEP.parse(data["status"]), tool_calls=list(data["tool_calls"]),
                   text=data["text"], reasoning=list(data.get("reasoning") or ()))


def new_steps(plan: list[str]) -> list[StepRecord]:
    return [StepRecord(index=i, description=s) for i, s in enumerate(plan)]


@dataclass
class Budget:
    """A task's steps: ``used`` of ``ceiling`` (every model turn and every tool call is one), and with
    a token budget (``[budget] max_tokens``) its tokens: ``tokens`` of ``token_ceiling`` (the input and
    output tokens of every model turn, as the provider reported them), ``unmetered`` the first turn
    whose provider reported none (the budget can then no longer be kept)."""

    used: int
    ceiling: int
    tokens: int = 0
    token_ceiling: int | None = None
    unmetered: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"used": self.used, "ceiling": self.ceiling}
        if self.token_ceiling is not None:
            out["tokens"] = {"used": self.tokens, "ceiling": self.token_ceiling, "unmetered_turn": self.unmetered}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Budget":
        tokens = data.get("tokens")
        if tokens is None:
            return cls(used=int(data["used"]), ceiling=int(data["ceiling"]))
        unmetered = tokens["unmetered_turn"]
        return cls(used=int(data["used"]), ceiling=int(data["ceiling"]), tokens=int(tokens["used"]),
                   token_ceiling=int(tokens["ceiling"]), unmetered=None if unmetered is None else int(unmetered))

    def count_turn(self, turn: int, usage: Mapping[str, Any] | None) -> None:
        """Count a model turn's tokens (nothing without a token budget). A turn whose provider
        reported no usage leaves the budget unknowable: the next step refuses (fail closed)."""
        if self.token_ceiling is None:
            return
        from apollia_nb.runtime.models.base import usage_tokens

        counted = usage_tokens(usage)
        if counted is None:
            if self.unmetered is None:
                self.unmetered = turn
        else:
            self.tokens += counted

    def check(self) -> None:
        """Before a step: ``BUDGET_EXCEEDED`` once a ceiling is reached (steps), passed (tokens), or a
        turn went unmetered under a token budget."""
        if self.used >= self.ceiling:
            raise BudgetExceeded(f"the step ceiling of {self.ceiling} was reached")
        if self.token_ceiling is None:
            return
        if self.unmetered is not None:
            raise BudgetExceeded(
                f"the token budget of {self.token_ceiling} cannot be kept: the provider reported no token usage "
                f"for model turn {self.unmetered} ({self.tokens} tokens counted before it); ask the provider for "
                "usage ([model] stream_usage = true) or remove [budget] max_tokens")
        if self.tokens > self.token_ceiling:
            raise BudgetExceeded(f"the token budget of {self.token_ceiling} was passed: {self.tokens} input and "
                                 "output tokens used")


#: The keys of a task's record, in the order ``runtime.db`` and the journal have them.
_KEYS = ("id", "run_id", "agent", "goal", "status", "error", "result", "warnings", "watched", "grants",
         "approve_plan", "budget", "phase", "plan", "steps", "step_index", "attempt", "feedback", "messages",
         "queued_calls", "awaiting", "plan_decision", "verdict", "created_at", "updated_at")
_OPTIONAL = ("model_state", "turns", "progress", "started_by")


@dataclass(eq=False)
class TaskRecord:
    """A task as the engine holds it. JSON only at the edge: :meth:`to_json` is the row ``runtime.db``
    stores (and what a restart reads back with :meth:`from_json`).

    ``status`` and ``phase`` move only through :meth:`move` and :meth:`move_phase`, each a state
    machine of ``states.py``: an illegal move raises ``INVALID_TRANSITION`` and changes nothing.
    Whether a person is waited on is derived, never written: :attr:`waiting` (a decision or a plan
    the run is suspended or waits on, or a question asked during a call still in flight, ``asking``)."""

    id: str
    run_id: str
    agent: str
    goal: str
    status: TaskStatus
    error: dict[str, Any] | None
    result: Any
    warnings: list[str]
    watched: bool
    grants: list[str]
    approve_plan: bool
    budget: Budget
    phase: TaskPhase
    plan: list[str]
    steps: list[StepRecord]
    step_index: int
    attempt: int
    feedback: list[str]
    messages: list[dict[str, Any]]
    queued_calls: list[dict[str, Any]]
    awaiting: str | None
    plan_decision: dict[str, Any] | None
    verdict: dict[str, Any] | None
    created_at: str
    updated_at: str
    model_state: Any = None  # a scripted model's place in its script (a resumed run continues it)
    turns: int = 0  # model turns taken (the engine's call ids count them)
    progress: dict[str, Any] | None = None  # the last progress a long-running call reported
    #: Who started the run: the person of the REST request that submitted it, else the local owner.
    #: Four eyes (``governance/approvals.py``) keeps them from approving its calls.
    started_by: str | None = None
    #: Cards of questions asked during a call still in flight (a server's question, its model call):
    #: shown as waiting, never saved — a restart must find the run as it was, running.
    asking: set[str] = field(default_factory=set)

    @classmethod
    def new(
        cls, *, task_id: str, run_id: str, agent: str, goal: str, ceiling: int, watched: bool,
        grants: list[str], approve_plan: bool, warnings: list[str], created_at: str,
    ) -> "TaskRecord":
        """A task just submitted: ``pending``, to plan, nothing spent."""
        return cls(
            id=task_id, run_id=run_id, agent=agent, goal=goal, status=TASK.initial, error=None, result=None,
            warnings=warnings, watched=watched, grants=grants, approve_plan=approve_plan,
            budget=Budget(used=0, ceiling=ceiling), phase=PHASE.initial, plan=[], steps=[], step_index=0,
            attempt=0, feedback=[], messages=[], queued_calls=[], awaiting=None, plan_decision=None,
            verdict=None, created_at=created_at, updated_at=created_at,
        )

    # ------------------------------------------------------------------ the machines
    def move(self, target: TaskStatus) -> None:
        """Through the ``TASK`` machine: an illegal move (the same status included) raises."""
        self.status = transition(TASK, self.status, target)

    def move_phase(self, target: TaskPhase) -> None:
        """Through the ``PHASE`` machine: an illegal move (the same phase included) raises."""
        self.phase = transition(PHASE, self.phase, target)

    @property
    def finished(self) -> bool:
        return is_terminal(TASK, self.status)

    @property
    def waiting(self) -> bool:
        """Waiting on a person: suspended or waiting on a decision or its plan, or a question asked
        during a call still in flight."""
        return not self.finished and (self.status is TaskStatus.WAITING or bool(self.asking))

    @property
    def shown_status(self) -> str:
        """The status people see: ``waiting`` while :attr:`waiting`, else the machine's."""
        return TaskStatus.WAITING.value if self.waiting else self.status.value

    @property
    def awaiting_plan_approval(self) -> bool:
        return self.phase is TaskPhase.APPROVE and self.status is TaskStatus.WAITING

    def end_as_sealed(self, status: TaskStatus | str, error: dict[str, Any] | None) -> None:
        """Take the end the journal sealed (a restart that finds a run sealed, its record written before
        the end): the moves the run made, through the machines — a record still ``pending`` or
        ``waiting`` was running when it ended."""
        target = TASK.parse(status)
        if self.status is not TaskStatus.RUNNING and target not in TASK.table[self.status]:
            self.move(TaskStatus.RUNNING)
        self.move(target)
        self.error = error
        if self.phase is not TaskPhase.DONE:
            self.move_phase(TaskPhase.DONE)
        self.queued_calls = []
        self.awaiting = None

    # ------------------------------------------------------------------ the edge
    def to_json(self) -> dict[str, Any]:
        """The record as ``runtime.db`` stores it (the machine's status; ``asking`` is never saved)."""
        out: dict[str, Any] = {
            "id": self.id, "run_id": self.run_id, "agent": self.agent, "goal": self.goal,
            "status": self.status.value, "error": self.error, "result": self.result, "warnings": self.warnings,
            "watched": self.watched, "grants": self.grants, "approve_plan": self.approve_plan,
            "budget": self.budget.to_json(), "phase": self.phase.value, "plan": self.plan,
            "steps": [s.to_json() for s in self.steps], "step_index": self.step_index, "attempt": self.attempt,
            "feedback": self.feedback, "messages": self.messages, "queued_calls": self.queued_calls,
            "awaiting": self.awaiting, "plan_decision": self.plan_decision, "verdict": self.verdict,
            "created_at": self.created_at, "updated_at": self.updated_at,
        }
        if self.model_state is not None:
            out["model_state"] = self.model_state
        if self.turns:
            out["turns"] = self.turns
        if self.progress is not None:
            out["progress"] = self.progress
        if self.started_by is not None:
            out["started_by"] = self.started_by
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TaskRecord":
        """A record as ``runtime.db`` stores it. One that does not read (a key missing or unknown, a
        status or phase no machine has) is ``HOME_FILE_CORRUPT``: it is never guessed at."""
        try:
            unknown = set(data) - set(_KEYS) - set(_OPTIONAL)
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)}")
            budget = data["budget"]
            return cls(
                id=str(data["id"]), run_id=str(data["run_id"]), agent=str(data["agent"]), goal=str(data["goal"]),
                status=TASK.parse(data["status"]), error=data["error"], result=data["result"],
                warnings=list(data["warnings"]), watched=bool(data["watched"]), grants=list(data["grants"]),
                approve_plan=bool(data["approve_plan"]),
                budget=Budget.from_json(budget),
                phase=PHASE.parse(data["phase"]), plan=list(data["plan"]),
                steps=[StepRecord.from_json(s) for s in data["steps"]], step_index=int(data["step_index"]),
                attempt=int(data["attempt"]), feedback=list(data["feedback"]), messages=list(data["messages"]),
                queued_calls=list(data["queued_calls"]), awaiting=data["awaiting"],
                plan_decision=data["plan_decision"], verdict=data["verdict"],
                created_at=str(data["created_at"]), updated_at=str(data["updated_at"]),
                model_state=data.get("model_state"), turns=int(data.get("turns") or 0),
                progress=data.get("progress"),
                started_by=str(data["started_by"]) if data.get("started_by") is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError, InvalidTransition) as exc:
            what = data.get("id") if isinstance(data, Mapping) else None
            raise HomeFileCorrupt(f"runtime.db: the record of task {what!r} does not read ({exc}); "
                                  "restore runtime.db from a backup") from None


def new_task_record(
    *, task_id: str, run_id: str, agent: str, goal: str, ceiling: int, watched: bool,
    grants: list[str], approve_plan: bool, warnings: list[str], created_at: str,
) -> dict[str, Any]:
    """A new task's record as ``runtime.db`` stores it (``TaskRecord.new`` is the record itself)."""
    return TaskRecord.new(task_id=task_id, run_id=run_id, agent=agent, goal=goal, ceiling=ceiling,
                          watched=watched, grants=grants, approve_plan=approve_plan, warnings=warnings,
                          created_at=created_at).to_json()


def as_record(record: "TaskRecord | Mapping[str, Any]") -> TaskRecord:
    """A record, from ``runtime.db``'s JSON when that is what is given."""
    return record if isinstance(record, TaskRecord) else TaskRecord.from_json(record)


def _plan_digest(r: TaskRecord) -> str:
    from apollia_nb.governance.approvals import plan_digest

    return plan_digest(task_id=r.id, run_id=r.run_id, agent=r.agent, steps=r.plan)


def task_json(record: "TaskRecord | Mapping[str, Any]") -> dict[str, Any]:
    """The task as the REST API and the SDK show it."""
    r = as_record(record)
    return {
        "id": r.id, "run_id": r.run_id, "agent": r.agent, "goal": r.goal,
        "status": r.shown_status, "error": r.error, "steps": [s.to_json() for s in r.steps],
        "budget": r.budget.to_json(), "result": r.result, "warnings": list(r.warnings),
        "plan": list(r.plan), "verdict": r.verdict,
        "awaiting_plan_approval": r.awaiting_plan_approval,
        "plan_digest": _plan_digest(r) if r.awaiting_plan_approval else None,
        "started_by": r.started_by,
        "progress": r.progress,
        "created_at": r.created_at, "updated_at": r.updated_at,
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

    def __init__(self, rt: "TaskHost", agent: "Agent", record: TaskRecord) -> None:
        self.rt = rt
        self.agent = agent
        self.r = record
        self.done = anyio.Event()
        self.plan_answer: tuple[str, str | None, list[str] | None] | None = None
        self._active = False
        self._history: list[Any] | None = None
        self._turn_entry: tuple[str, dict[str, Any]] | None = None
        # The last turn's calls: in clear for their tools (this process's memory only), and as shown
        # (what the record keeps in runtime.db: the journal's redaction, ``governed.shown_call``).
        self._clear_calls: dict[str, dict[str, Any]] = {}
        self._shown_calls: dict[str, dict[str, Any]] = {}
        self._plan_event = anyio.Event()
        self._model_instance: Any = None
        self._ending: TaskStatus | None = None  # the end being sealed (``_finish``), once decided
        if record.status is TaskStatus.PENDING and record.budget.token_ceiling is None:
            record.budget.token_ceiling = agent.manifest.max_tokens  # fixed when the run is submitted

    # ---------------------------------------------------------------- helpers
    @property
    def id(self) -> str:
        return self.r.id

    @property
    def status(self) -> str:
        """What people see (``waiting`` derived from the record, see ``TaskRecord.waiting``)."""
        return self.r.shown_status

    @property
    def model(self) -> Any:
        """This run's model: a scripted agent's script plays from the beginning for every task."""
        if self._model_instance is None:
            self._model_instance = self.rt.run_model(self.agent, self.r.model_state)
        return self._model_instance

    def _set_status(self, status: TaskStatus) -> None:
        """Move the task's status through its machine, save and tell: an illegal move (a finished
        task, the status it has already) raises ``INVALID_TRANSITION`` and changes nothing."""
        self.r.move(status)
        self._save()
        self.rt.events.notify(self)

    def _save(self) -> None:
        self.r.updated_at = self.rt.now_iso()
        self.rt.records.save_task(self.r.to_json(), self.r.updated_at)

    async def _journal(self, kind: str, payload: dict[str, Any]) -> None:
        await self.rt.journal.append_async(kind, payload, run_id=self.r.run_id, agent=self.agent.name)

    def _journal_soon(self, kind: str, payload: dict[str, Any]) -> None:
        """Hand an entry that records what happened (a model's answer, the plan, a verdict) to the
        journal's writer without waiting: it is committed before anything later of the run, so
        before any call it leads to and before the run's seal (``Journal.append_soon``)."""
        self.rt.journal.append_soon(kind, payload, run_id=self.r.run_id, agent=self.agent.name)

    def _spend(self) -> None:
        self.r.budget.check()
        self.r.budget.used += 1

    def count_model_call(self, usage: Mapping[str, Any] | None) -> None:
        """A model call made for the run besides its own turns (an MCP server's sampling request, a
        step already spent): its tokens count against the token budget like a turn's; one without
        usage leaves the budget unknown from the run's last turn on."""
        self.r.budget.count_turn(self.r.turns, usage)

    async def _status_entry(self, status: str) -> None:
        await self._journal("task_status", {"task_id": self.id, "status": status})

    # ---------------------------------------------------------------- main
    async def run(self) -> None:
        """Run (or resume) until completed, failed, cancelled or suspended."""
        self._active = True
        suspended = False
        try:
            if self.r.finished or self._ending is not None:
                return  # ended (a cancel closed it while it was suspended): nothing to resume
            if self.r.status is TaskStatus.PENDING:
                # One commit for both: the run is open and running in the journal before its record says so.
                await self.rt.journal.append_many_async([
                    (kind, payload, self.r.run_id, self.agent.name) for kind, payload in (
                        ("run_open", {"run_kind": "task", "goal": self.r.goal, "task_id": self.id}),
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
            if self.r.finished:
                self.done.set()
                self.rt.events.wake(self.id)  # the status changed before the closing checkpoint; now it is done
            else:
                if suspended:
                    # Suspended means recorded (a restart finds it, with what it needs to resume)
                    # before whoever waits for it to settle is told.
                    with anyio.CancelScope(shield=True):
                        await self.rt.recorded(f"suspended task {self.id}")
                    faults.point("suspend.after_record")
                self.rt.events.notify(self)  # suspended: parked with nothing running

    async def _drive(self) -> None:
        while True:
            phase = self.r.phase
            if phase is TaskPhase.PLAN:
                await self._plan()
            elif phase is TaskPhase.APPROVE:
                await self._await_plan_approval()
            elif phase is TaskPhase.EXECUTE:
                finished = await self._execute()
                if not finished:
                    return  # step failed → task failed already
            elif phase is TaskPhase.CRITIC:
                if await self._critic():
                    return
            else:  # done: the run ended (a record read back as it was sealed)
                return

    async def _finish(self, status: TaskStatus, *, error: ApolliaError | None, result: Any = None) -> None:
        """End the run with ``status``, once. The first end decided stands: a cancel that arrives
        while the run's end is being sealed (or after it) changes nothing, and is not sealed again."""
        if self.r.finished or self._ending is not None:
            return
        self._ending = status
        try:
            await self._seal(status, error=error, result=result)
        except ApolliaError as exc:
            if self.r.finished:  # sealed and recorded: what failed after (its checkpoint) is not the run's end
                self.rt.events.emit("warning", f"task {self.id}: {exc}")
                return
            # The journal refused the closing entries (it is closed, or its server went away): the run
            # still ends, failed, and says why; the unsealed trace shows as incomplete on replay.
            self.r.error = {"code": exc.code, "message": f"the run could not be sealed: {exc.message}"}
            self.r.queued_calls = []
            if self.r.phase is not TaskPhase.DONE:
                self.r.move_phase(TaskPhase.DONE)
            self._set_status(TaskStatus.FAILED)
            self.rt.events.emit("warning", f"task {self.id}: {exc}")

    async def _seal(self, status: TaskStatus, *, error: ApolliaError | None, result: Any) -> None:
        last: list[tuple[str, dict[str, Any]]] = []  # the run's last entries, committed with its seal
        if self._turn_entry is not None:  # the ceiling stopped the run before the turn's first call
            last.append(self._turn_entry)
        for queued in self.r.queued_calls:
            # Calls the model asked for that will never run: say so, so the trace stays complete.
            last.append(("tool_result", {
                "call_id": queued["call_id"], "tool": queued["name"], "status": "skipped",
                "error_code": error.code if error is not None else "CANCELLED", "output": None,
                "output_digest": NULL_DIGEST,
            }))
        self.r.error = error.to_dict() if error is not None else None
        if result is not None:
            self.r.result = result
        if self.r.phase is not TaskPhase.DONE:
            self.r.move_phase(TaskPhase.DONE)
        for step in self.r.steps:
            if step.status is StepStatus.RUNNING:  # the step the run ended in ends with it
                step.move(StepStatus.CANCELLED if status is TaskStatus.CANCELLED else StepStatus.FAILED)
        payload: dict[str, Any] = {"task_id": self.id, "status": status.value}
        if error is not None:
            payload["error"] = error.to_dict()
        last.append(("task_status", payload))
        seal: dict[str, Any] = {"status": status.value}
        if error is not None:
            seal["error"] = error.to_dict()
        # One commit for the last entries and the seal (which counts the entries before it), then the
        # closing checkpoint signed: the run ends once it is signed, while journal.db stores it.
        # Shielded: a seal once handed over is waited for, so the record ends as the journal has it
        # (a cancel arriving meanwhile finds the run ended, see _finish).
        with anyio.CancelScope(shield=True):
            _, stored = await self.rt.journal.seal_async(self.r.run_id, self.agent.name, last, seal)
        self._turn_entry = None
        self.r.queued_calls = []
        faults.point("run.after_seal")
        self._set_status(status)
        self.rt.closing_checkpoint(self.r.run_id, stored)

    # ---------------------------------------------------------------- phases
    async def _plan(self) -> None:
        from apollia_nb.runtime.models.base import PLAN_TOOL, Message, parse_plan

        self._spend()
        messages = [Message(role="system", content=self.agent.system_prompt("planner"))]
        if self.r.feedback:
            messages.append(Message(role="user", content="The critic did not accept the last attempt: "
                                    + "; ".join(self.r.feedback)))
        messages.append(Message(role="user", content=self.r.goal))
        response = await self._model("planner", messages, [PLAN_TOOL])
        steps = parse_plan(response)
        if not steps:
            steps = [self.r.goal]
        self.r.plan = steps
        self.r.steps = new_steps(steps)
        self.r.step_index = 0
        self.r.messages = []
        self.r.queued_calls = []
        self._journal_soon("plan", {"task_id": self.id, "steps": steps, "attempt": self.r.attempt})
        self.r.move_phase(TaskPhase.APPROVE if self.r.approve_plan else TaskPhase.EXECUTE)
        # Not saved here: a running task is saved at its status changes and when it
        # suspends; one its process loses mid-run is failed at the next start (the
        # journal holds its whole trace), so a progress save would buy nothing.
        self.rt.events.notify(self)

    async def _await_plan_approval(self) -> None:
        if self.plan_answer is None:
            if self.r.status is not TaskStatus.WAITING:  # resumed parked, it waits already
                self._set_status(TaskStatus.WAITING)
            await self._status_entry("waiting")
            if not self.r.watched and self.rt.suspend_unattended and self.plan_answer is None:
                raise _Suspend()
            await self._plan_event.wait()
        assert self.plan_answer is not None
        verdict, reason, edited = self.plan_answer
        self.plan_answer = None
        self._plan_event = anyio.Event()
        self._set_status(TaskStatus.RUNNING)
        if verdict == "reject":  # the answer was journaled when it was given (answer_plan)
            self.r.plan_decision = {"approved": False, "reason": reason}
            raise Rejected(f"the plan was rejected: {reason or 'no reason given'}")
        if edited:
            self.r.plan = list(edited)
            self.r.steps = new_steps(self.r.plan)
        self.r.plan_decision = {"approved": True, "edited": bool(edited)}
        await self._status_entry("running")
        self.r.move_phase(TaskPhase.EXECUTE)
        self._save()

    @property
    def plan_digest(self) -> str:
        """The digest of the plan as shown for approval (``governance/approvals.py``)."""
        from apollia_nb.governance.approvals import plan_digest

        return plan_digest(task_id=self.id, run_id=self.r.run_id, agent=self.agent.name, steps=self.r.plan)

    def answer_plan(self, verdict: str, reason: str | None = None, steps: list[str] | None = None, *,
                    by: str | None = None, digest: str | None = None) -> None:
        """Take the answer to the plan: journaled (durable when this returns, so a restart finds it),
        then the run is woken. A second answer before the run took the first is a ``Conflict``; an
        answer naming the digest of another plan than the one shown is ``STALE_APPROVAL``.

        The entry names who answered (``by``, and ``by_role``/``auth`` over REST) and ``digest``: the
        digest of the steps that run (those shown, or the edited ones), and ``shown_digest`` of those
        shown when they were edited."""
        from apollia_nb.errors import Conflict, StaleApproval
        from apollia_nb.governance.acting import ACTING
        from apollia_nb.governance.approvals import plan_digest

        shown = self.plan_digest
        if self.plan_answer is not None:
            raise self.plan_refused(verdict, Conflict(f"the plan of task {self.id} was already answered"),
                                    by=by, digest=digest, shown=shown)
        if digest is not None and digest != shown:
            raise self.plan_refused(verdict, StaleApproval(
                f"the plan of task {self.id} shown now has the digest {shown}, not {digest}: read it again "
                "before answering"), by=by, digest=digest, shown=shown)
        actor = ACTING.get()
        who: dict[str, Any] = {"by": by if by is not None else actor[0] if actor else "user"}
        if actor is not None:
            who.update(by_role=actor[1], auth=actor[2])
        if verdict == "reject":
            payload: dict[str, Any] = {"task_id": self.id, "approved": False, "reason": reason, **who,
                                       "digest": shown}
        else:
            run = list(steps or self.r.plan)
            payload = {"task_id": self.id, "approved": True, "steps": run, **who,
                       "digest": plan_digest(task_id=self.id, run_id=self.r.run_id, agent=self.agent.name,
                                             steps=run)}
            if run != self.r.plan:
                payload["shown_digest"] = shown
        self.rt.journal.append("plan", payload, run_id=self.r.run_id, agent=self.agent.name)
        self.plan_answer = (verdict, reason, steps)
        self._plan_event.set()

    def plan_refused(self, verdict: str, exc: ApolliaError, *, by: str | None, digest: str | None,
                     shown: str | None = None) -> ApolliaError:
        """An answer to this task's plan refused (``plan_answer_refused``): journaled, returned to raise.
        ``shown``: the digest of the plan shown for approval, when one is."""
        return plan_answer_refused(self.rt.journal, exc, run_id=self.r.run_id, agent=self.agent.name,
                                   subject={"task_id": self.id}, answer=verdict, by=by, digest=shown,
                                   given_digest=digest)

    def plan_answer_from(self, payload: dict[str, Any]) -> None:
        """At a restart: the answer to the plan as journaled (``answer_plan``), not yet taken by the run."""
        if not payload["approved"]:
            self.plan_answer = ("reject", payload.get("reason"), None)
        else:
            steps = list(payload["steps"])
            self.plan_answer = ("approve", None, steps if steps != self.r.plan else None)

    async def _execute(self) -> bool:
        """Run the remaining steps. False when a step failed (the task is then failed)."""
        from apollia_nb.runtime.models.base import Message, reasoning_text

        while self.r.step_index < len(self.r.plan):
            index = self.r.step_index
            step = self.r.steps[index]
            if step.status is StepStatus.PENDING:
                step.move(StepStatus.RUNNING)
                self.r.messages = []
                self._history = []
                self._push(Message(role="system", content=self.agent.system_prompt("actor")))
                self._push(Message(role="user", content=f"Goal: {self.r.goal}\n"
                                   f"Step {index + 1} of {len(self.r.plan)}: {step.description}"))
                self.rt.events.notify(self)
            while True:
                if self.r.queued_calls or self.r.awaiting:
                    failed = await self._work_queued_calls(step)
                    if failed is not None:
                        step.move(StepStatus.FAILED)
                        await self._finish(TaskStatus.FAILED, error=failed)
                        return False
                    continue
                self._spend()
                response = await self._model("actor", list(self._messages()), self.agent.tool_specs())
                self._push(Message(role="assistant", content=response.text, tool_calls=response.tool_calls,
                                   reasoning=response.reasoning))
                if response.reasoning:
                    step.reasoning.append(reasoning_text(response.reasoning))
                if response.tool_calls:
                    self.r.queued_calls = [
                        {"call_id": tc.id, "name": tc.name, "arguments": self._shown_calls.get(tc.id, tc.arguments),
                         "counted": False, **({"redacted": True} if tc.id in self._clear_calls else {})}
                        for tc in response.tool_calls
                    ]
                    continue
                step.move(StepStatus.DONE)
                step.text = response.text
                self.r.result = response.text
                break
            self.r.step_index = index + 1
            self.r.messages = []
            self._history = []
            self.rt.events.notify(self)  # saved at the next status change or suspension (see _plan)
        self.r.move_phase(TaskPhase.CRITIC)
        return True

    async def _work_queued_calls(self, step: StepRecord) -> ApolliaError | None:
        """Make the queued calls of the last model turn, in order. Returns the failure of the step, if any."""
        from apollia_nb.errors import Refused
        from apollia_nb.runtime.governed import continue_after_answer, governed_call, lost_call
        from apollia_nb.runtime.models.base import Message

        while self.r.queued_calls:
            queued = self.r.queued_calls[0]
            if self.r.awaiting:
                card = self.rt.card(self.r.awaiting)
                if card is None or card.waiting:
                    if not self.r.watched and self.rt.suspend_unattended:
                        raise _Suspend()
                    assert card is not None
                    await card.wait()
                    if card.waiting:  # released unanswered (nobody watches any more): suspend
                        self._save()
                        raise _Suspend()
                if self.r.status is TaskStatus.WAITING:  # running already when a restart resumed it
                    self._set_status(TaskStatus.RUNNING)
                await self._status_entry("running")
                faults.point("resume.after_running")
                result = await continue_after_answer(self.rt, self.agent, card)
                self.r.awaiting = None
            else:
                if not queued["counted"]:
                    self._spend()
                    queued["counted"] = True
                mode = "watched" if (self.r.watched or not self.rt.suspend_unattended) else "unattended"
                waiting_hook = self._on_waiting
                prefix = [self._turn_entry] if self._turn_entry is not None else []
                self._turn_entry = None
                clear = self._clear_calls.pop(queued["call_id"], None)
                if clear is None and queued.get("redacted"):  # its clear arguments ended with their process
                    result = await lost_call(self.rt, self.agent, run_id=self.r.run_id, call_id=queued["call_id"],
                                             name=queued["name"], arguments=queued["arguments"], prefix=prefix)
                else:
                    result = await governed_call(
                        self.rt, self.agent, run_id=self.r.run_id, call_id=queued["call_id"],
                        name=queued["name"], arguments=clear if clear is not None else queued["arguments"],
                        mode=mode, grants=frozenset(self.r.grants), task_id=self.id, waiting_hook=waiting_hook,  # type: ignore[arg-type]  # watched or unattended
                        prefix=prefix,
                    )
                if self.r.awaiting and result.status != "waiting":
                    self.r.awaiting = None  # a watched wait ended with the answer
                    self._set_status(TaskStatus.RUNNING)
                    await self._status_entry("running")
                if result.status == "waiting":
                    assert result.card is not None
                    faults.point("suspend.before_record")
                    self.r.awaiting = result.card.id
                    if self.r.status is not TaskStatus.WAITING:  # a watched wait shows it waiting already
                        self._set_status(TaskStatus.WAITING)
                    await self._status_entry("waiting")
                    self._save()
                    if result.card.waiting:  # no await between this check and leaving: no lost answer
                        raise _Suspend()
                    continue
            self.r.queued_calls.pop(0)
            step.tool_calls.append({"call_id": result.call_id, "tool": result.tool, "status": result.status,
                                       "error_code": result.error_code})
            self._push(Message(role="tool", content=result.for_model(), tool_call_id=result.call_id,
                               name=result.tool))
            self.rt.events.notify(self)
            if result.status == "refused":
                return Refused(f"{result.tool}: {result.error_message}")
        return None

    def _messages(self) -> list[Any]:
        """The step's history as model messages, kept incrementally (rebuilt only after a resume)."""
        if self._history is None or len(self._history) != len(self.r.messages):
            self._history = [_unmsg(m) for m in self.r.messages]
        return self._history

    def _push(self, message: Any) -> None:
        self._messages()
        kept = _msg(message)
        for tc in kept["tool_calls"]:  # the record keeps a call's arguments as shown; the model's turn stays whole
            if tc["id"] in self._shown_calls:
                tc["arguments"] = _json_copy(self._shown_calls[tc["id"]])
        self.r.messages.append(kept)
        self._history.append(message)  # type: ignore[union-attr]  # _messages() made it

    async def _on_waiting(self, card: Any) -> None:
        """A watched run is about to wait on a card: show it as waiting."""
        self.r.awaiting = card.id
        self._set_status(TaskStatus.WAITING)
        await self._status_entry("waiting")

    async def _critic(self) -> bool:
        """True when the task finished (passed); False to re-plan."""
        from apollia_nb.runtime.models.base import VERDICT_TOOL, Message, parse_verdict

        self._spend()
        summary = "\n".join(
            f"{s.index + 1}. {s.description}: {s.status.value}"
            + (f" — {s.text}" if s.text else "")
            for s in self.r.steps
        )
        messages = [
            Message(role="system", content=self.agent.system_prompt("critic")),
            Message(role="user", content=f"Goal: {self.r.goal}\nWhat was done:\n{summary}"),
        ]
        response = await self._model("critic", messages, [VERDICT_TOOL])
        verdict, reasons = parse_verdict(response)
        self.r.verdict = {"verdict": verdict, "reasons": list(reasons)}
        self._journal_soon("verdict", {"task_id": self.id, "verdict": verdict, "reasons": list(reasons),
                                        "attempt": self.r.attempt})
        if verdict == "pass":
            await self._finish(TaskStatus.COMPLETED, error=None, result=self.r.result)
            return True
        self.r.feedback = list(reasons) or ["the critic failed the result"]
        self.r.attempt += 1
        self.r.move_phase(TaskPhase.PLAN)
        self._save()
        return False

    async def _model(self, role: str, messages: list[Any], tools: list[Any]) -> Any:
        from apollia_nb.runtime.governed import shown_tool_calls
        from apollia_nb.runtime.models.base import ToolCallRequest

        response = await self.model.complete(role, messages, tools)
        state = self.rt.model_state(self.model)
        if state is not None:
            self.r.model_state = state  # saved with the record: a resumed run continues its script
        turn = self.r.turns + 1
        self.r.turns = turn
        self.r.budget.count_turn(turn, response.usage)
        # Call ids are the engine's own (unique within the run), whatever the provider sent.
        calls = tuple(
            ToolCallRequest(id=f"c{turn}-{i + 1}", name=tc.name, arguments=dict(tc.arguments))
            for i, tc in enumerate(response.tool_calls)
        )
        response = replace(response, tool_calls=calls)
        listed = [{"call_id": tc.id, "name": tc.name, "arguments": dict(tc.arguments)} for tc in response.tool_calls]
        tags = calls_subjects(self.rt, self.agent, listed)
        shown = shown_tool_calls(self.rt, self.agent, listed)  # journaled as the calls' decisions show them
        self._shown_calls = {s["call_id"]: s["arguments"] for s, c in zip(shown, listed)
                             if s["arguments"] is not c["arguments"]}
        self._clear_calls = {c["call_id"]: c["arguments"] for c in listed if c["call_id"] in self._shown_calls}
        listed = shown
        payload: dict[str, Any] = {"role": role, "turn": turn, "text": response.text, "tool_calls": listed}
        if role != "actor":
            # The planner's and critic's calls are structured answers (submit_plan, submit_verdict), not tools.
            payload = {"role": role, "turn": turn, "text": response.text, "tool_calls": [], "structured": listed}
        payload.update(turn_extras(response))
        if role == "actor":  # the calls' subjects: the arguments it lists are theirs (journal.subjects)
            payload.update(subjects_field("model_response", tags, payload))
        if role == "actor" and calls:
            # Committed together with the first call's decision, before anything it asked for runs.
            self._turn_entry = ("model_response", payload)
        else:
            self._journal_soon("model_response", payload)
        return response


def plan_answer_refused(journal: Any, exc: ApolliaError, *, run_id: str, agent: str, subject: dict[str, Any],
                        answer: str, by: str | None, digest: str | None,
                        given_digest: str | None = None) -> ApolliaError:
    """Journal a plan answer refused (``answer_refused``: ``subject`` — ``task_id`` or ``session_id`` —, the
    ``answer`` given, who gave it, the ``code`` and ``reason``, the ``digest`` of the plan shown when one
    is, the one given) and return ``exc``. A refusal the journal does not take is refused all the same."""
    from apollia_nb.governance.acting import ACTING

    actor = ACTING.get()
    payload: dict[str, Any] = {
        **subject, "plan": True, "answer": answer,
        "by": by if by is not None else actor[0] if actor is not None else "user",
        **({"person": actor[0], "by_role": actor[1], "auth": actor[2]} if actor is not None else {}),
        "code": exc.code, "reason": exc.message, "digest": digest,
        **({"given_digest": given_digest} if given_digest is not None else {})}
    try:
        journal.append("answer_refused", payload, run_id=run_id, agent=agent)
    except Exception as journal_error:  # noqa: BLE001 - refused either way
        exc.__context__ = journal_error
    return exc


def calls_subjects(rt: Any, agent: Any, listed: list[dict[str, Any]]) -> tuple[str, ...]:
    """The data subjects (keyed digests) of the calls a model turn asks for; an unknown tool has none."""
    from apollia_nb.runtime.governed import subject_tags

    found: set[str] = set()
    for tc in listed:
        try:
            tooldef = agent.tools.get(tc["name"])
        except ApolliaError:
            continue
        if isinstance(tc.get("arguments"), dict):
            found.update(subject_tags(rt, tooldef, tc["arguments"]))
    return tuple(sorted(found))


def turn_extras(response: Any) -> dict[str, Any]:
    """What a model turn's journal entry carries beside its text and calls, when there is any:
    ``usage`` (the provider's token counts) and ``reasoning`` (its parts, never the answer;
    signatures and redacted data as the provider sent them) with ``reasoning_digest``, the digest
    of the whole; past the output cap the reasoning is cut like an output, the digest still the whole's."""
    from apollia_nb.runtime.governed import capped_output

    extras: dict[str, Any] = {}
    if response.usage:
        extras["usage"] = _json_copy(dict(response.usage))
    if response.reasoning:
        parts = [part.to_json() for part in response.reasoning]
        extras["reasoning"], extras["reasoning_digest"], _ = capped_output(parts)
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


def dumps(record: "TaskRecord | Mapping[str, Any]") -> str:
    return json.dumps(as_record(record).to_json(), default=str)


def task_summary(record: "TaskRecord | Mapping[str, Any]") -> dict[str, Any]:
    """A task record as one row of a batch's results: status, result, error code, run id, steps used."""
    r = as_record(record)
    return {"status": r.shown_status, "result": r.result,
            "error_code": r.error.get("code") if r.error else None, "run_id": r.run_id,
            "steps_used": r.budget.used}
