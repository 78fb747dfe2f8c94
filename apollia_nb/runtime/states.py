"""Every state machine of the runtime: the states, the legal moves, one function.

Tasks, agent processes, chat sessions and tool circuit breakers each move
through a small set of states; inside a task's record, its phase (plan,
approve, execute, critic, done) and each step of its plan do too. The legal moves are written down here as data —
one frozen table per machine — and every change of state in the runtime goes
through :func:`transition`, which either returns the new state or raises
:class:`~apollia_nb.errors.InvalidTransition` and changes nothing. Keeping the
tables as data is what lets the docs draw the diagrams from them
(``dev/docs/make_state_diagrams.py``) and lets a test prove the two agree.

The functions here are pure: they take a machine and states and answer. The
objects that own a state (the registry, the task engine, a session, a breaker)
hold it themselves; :class:`StateCell` is a minimal such holder.

States are string enums, equal to their strings (``TaskStatus.RUNNING ==
"running"``), so they go to the journal, DuckDB and JSON as they are, and a
state read back as a plain string is accepted by every function here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import Generic, TypeVar

from apollia_nb.errors import InvalidTransition

__all__ = [
    "TaskStatus",
    "TaskPhase",
    "StepStatus",
    "ProcessState",
    "SessionState",
    "BreakerState",
    "Machine",
    "TASK",
    "PHASE",
    "STEP",
    "PROCESS",
    "SESSION",
    "BREAKER",
    "MACHINES",
    "RECORD_MACHINES",
    "TASK_TRANSITIONS",
    "PHASE_TRANSITIONS",
    "STEP_TRANSITIONS",
    "PROCESS_TRANSITIONS",
    "SESSION_TRANSITIONS",
    "BREAKER_TRANSITIONS",
    "transition",
    "can_transition",
    "is_terminal",
    "allowed",
    "StateCell",
]


class TaskStatus(StrEnum):
    """Where a task stands. ``waiting`` means waiting on a human."""

    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskPhase(StrEnum):
    """Where a task's engine stands: planning, waiting on its plan's approval, running its
    steps, asking its critic, or finished (whatever its status)."""

    PLAN = "plan"
    APPROVE = "approve"
    EXECUTE = "execute"
    CRITIC = "critic"
    DONE = "done"


class StepStatus(StrEnum):
    """Where one step of a task's plan stands."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ProcessState(StrEnum):
    """Where an agent process stands in the registry."""

    INITIALIZING = "initializing"
    ACTIVE = "active"
    DEGRADED = "degraded"
    STOPPING = "stopping"
    STOPPED = "stopped"


class SessionState(StrEnum):
    """Where a chat session stands. ``processing`` means an exchange is in flight."""

    ACTIVE = "active"
    PROCESSING = "processing"
    PAUSED = "paused"
    CLOSED = "closed"


class BreakerState(StrEnum):
    """Where a tool's circuit breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


S = TypeVar("S", bound=StrEnum)


def _freeze(table: Mapping[S, frozenset[S]]) -> Mapping[S, frozenset[S]]:
    return MappingProxyType(dict(table))


T = TaskStatus
TASK_TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = _freeze(
    {
        T.PENDING: frozenset({T.RUNNING, T.CANCELLED, T.FAILED}),
        T.RUNNING: frozenset({T.WAITING, T.COMPLETED, T.FAILED, T.CANCELLED}),
        T.WAITING: frozenset({T.RUNNING, T.FAILED, T.CANCELLED}),
        T.COMPLETED: frozenset(),
        T.FAILED: frozenset(),
        T.CANCELLED: frozenset(),
    }
)

PH = TaskPhase
PHASE_TRANSITIONS: Mapping[TaskPhase, frozenset[TaskPhase]] = _freeze(
    {
        # A run ends (DONE) from any phase: sealed completed, failed or cancelled.
        PH.PLAN: frozenset({PH.APPROVE, PH.EXECUTE, PH.DONE}),
        PH.APPROVE: frozenset({PH.EXECUTE, PH.DONE}),  # approved; rejected ends the run
        PH.EXECUTE: frozenset({PH.CRITIC, PH.DONE}),
        PH.CRITIC: frozenset({PH.PLAN, PH.DONE}),  # not accepted: planned again
        PH.DONE: frozenset(),
    }
)

ST = StepStatus
STEP_TRANSITIONS: Mapping[StepStatus, frozenset[StepStatus]] = _freeze(
    {
        # A step not started when its run ends stays pending; a new plan brings new steps.
        ST.PENDING: frozenset({ST.RUNNING}),
        ST.RUNNING: frozenset({ST.DONE, ST.FAILED, ST.CANCELLED}),
        ST.DONE: frozenset(),
        ST.FAILED: frozenset(),
        ST.CANCELLED: frozenset(),
    }
)

P = ProcessState
PROCESS_TRANSITIONS: Mapping[ProcessState, frozenset[ProcessState]] = _freeze(
    {
        # No INITIALIZING -> STOPPED: a startup failure goes through STOPPING.
        P.INITIALIZING: frozenset({P.ACTIVE, P.DEGRADED, P.STOPPING}),
        P.ACTIVE: frozenset({P.DEGRADED, P.STOPPING}),
        # Permitted, but the runtime never makes this move on its own.
        P.DEGRADED: frozenset({P.ACTIVE, P.STOPPING}),
        P.STOPPING: frozenset({P.STOPPED}),
        P.STOPPED: frozenset({P.INITIALIZING}),  # restart
    }
)

SS = SessionState
SESSION_TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = _freeze(
    {
        SS.ACTIVE: frozenset({SS.PROCESSING, SS.PAUSED, SS.CLOSED}),
        # PROCESSING -> ACTIVE is both "the exchange ended" and crash recovery.
        SS.PROCESSING: frozenset({SS.ACTIVE, SS.PAUSED, SS.CLOSED}),
        SS.PAUSED: frozenset({SS.PROCESSING, SS.ACTIVE, SS.CLOSED}),
        SS.CLOSED: frozenset(),
    }
)

B = BreakerState
BREAKER_TRANSITIONS: Mapping[BreakerState, frozenset[BreakerState]] = _freeze(
    {
        B.CLOSED: frozenset({B.OPEN}),
        B.OPEN: frozenset({B.HALF_OPEN}),
        B.HALF_OPEN: frozenset({B.CLOSED, B.OPEN}),
    }
)

del T, PH, ST, P, SS, B


@dataclass(frozen=True, eq=False)
class Machine(Generic[S]):
    """A state machine as a value: its name, its states, its table of moves.

    ``table`` maps every state to the set of states it may move to; a state
    with an empty set is terminal. ``initial`` is where a new instance starts.
    """

    name: str
    states: type[S]
    table: Mapping[S, frozenset[S]]
    initial: S

    def __post_init__(self) -> None:
        members = set(self.states)
        if set(self.table) != members:
            raise ValueError(f"{self.name}: the table must list every state exactly once")
        for source, targets in self.table.items():
            if not targets <= members or source in targets:
                raise ValueError(f"{self.name}: bad targets for {source.value!r}")
        if self.initial not in members:
            raise ValueError(f"{self.name}: initial state is not a state")

    def parse(self, value: S | str) -> S:
        """The member for ``value``; a string that names no state raises
        :class:`InvalidTransition`, as does a member of another machine's enum."""
        if isinstance(value, Enum) and not isinstance(value, self.states):
            raise InvalidTransition(
                f"{self.name}: {type(value).__name__}.{value.name} is not a {self.name} state"
            ) from None
        try:
            return self.states(value)
        except ValueError:
            known = ", ".join(s.value for s in self.states)
            raise InvalidTransition(
                f"{self.name}: unknown state {value!r} (states: {known})"
            ) from None

    def __repr__(self) -> str:
        return f"Machine({self.name!r})"


TASK: Machine[TaskStatus] = Machine("task", TaskStatus, TASK_TRANSITIONS, TaskStatus.PENDING)
PROCESS: Machine[ProcessState] = Machine(
    "process", ProcessState, PROCESS_TRANSITIONS, ProcessState.INITIALIZING
)
SESSION: Machine[SessionState] = Machine(
    "session", SessionState, SESSION_TRANSITIONS, SessionState.ACTIVE
)
BREAKER: Machine[BreakerState] = Machine(
    "breaker", BreakerState, BREAKER_TRANSITIONS, BreakerState.CLOSED
)

PHASE: Machine[TaskPhase] = Machine("phase", TaskPhase, PHASE_TRANSITIONS, TaskPhase.PLAN)
STEP: Machine[StepStatus] = Machine("step", StepStatus, STEP_TRANSITIONS, StepStatus.PENDING)

MACHINES: tuple[Machine, ...] = (TASK, PROCESS, SESSION, BREAKER)
#: The machines inside a task's record (``runtime/tasks.py``, ``TaskRecord``): its phase and its steps.
RECORD_MACHINES: tuple[Machine, ...] = (PHASE, STEP)


def _describe(states: frozenset[S] | set[S], machine: Machine[S]) -> str:
    if not states:
        return "nothing (terminal)"
    order = list(machine.states)
    return ", ".join(s.value for s in sorted(states, key=order.index))


def allowed(machine: Machine[S], current: S | str) -> frozenset[S]:
    """The states ``current`` may move to (empty for a terminal state)."""
    return machine.table[machine.parse(current)]


def can_transition(machine: Machine[S], current: S | str, target: S | str) -> bool:
    """Whether ``current -> target`` is a legal move. Unknown states answer False."""
    try:
        transition(machine, current, target)
    except InvalidTransition:
        return False
    return True


def is_terminal(machine: Machine[S], state: S | str) -> bool:
    """Whether nothing leaves ``state``. An unknown state raises InvalidTransition."""
    return not machine.table[machine.parse(state)]


def transition(machine: Machine[S], current: S | str, target: S | str) -> S:
    """Check the move ``current -> target`` and return ``target`` as a member.

    Raises :class:`InvalidTransition` when the move is not in the table —
    including a move to the same state — or when either state is unknown. The
    message names the machine, both states and what ``current`` allows.
    """
    source = machine.parse(current)
    goal = machine.parse(target)
    exits = machine.table[source]
    if goal not in exits:
        raise InvalidTransition(
            f"{machine.name}: cannot move from {source.value!r} to {goal.value!r}; "
            f"allowed from {source.value!r}: {_describe(exits, machine)}"
        ) from None
    return goal


class StateCell(Generic[S]):
    """A mutable holder of one state of one machine.

    ``move`` goes through :func:`transition`; an illegal move raises and leaves
    ``state`` as it was.
    """

    __slots__ = ("machine", "_state")

    def __init__(self, machine: Machine[S], initial: S | str | None = None) -> None:
        self.machine = machine
        self._state: S = machine.initial if initial is None else machine.parse(initial)

    @property
    def state(self) -> S:
        return self._state

    def can_move(self, target: S | str) -> bool:
        return can_transition(self.machine, self._state, target)

    def move(self, target: S | str) -> S:
        self._state = transition(self.machine, self._state, target)
        return self._state

    @property
    def terminal(self) -> bool:
        return is_terminal(self.machine, self._state)

    def __repr__(self) -> str:
        return f"StateCell({self.machine.name}, {self._state.value!r})"
