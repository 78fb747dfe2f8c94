"""One circuit breaker per tool name: ride out a flapping dependency, fail fast meanwhile.

The rules are fixed (they are part of the product, not settings):

* Three consecutive **transient** failures of a tool open its breaker
  (:data:`THRESHOLD`). A **permanent** failure — a bad argument, a refused
  permission, a tool error that retrying will not fix — leaves the counter
  untouched; a single success resets it to zero.
* While ``open``, :meth:`CircuitBreaker.admit` raises
  :class:`~apollia_nb.errors.CircuitOpen` and the tool is not called.
* The cooldown (:data:`COOLDOWN_SECS`) is not a timer. Nothing happens when it
  elapses; the first call that arrives after it moves the breaker to
  ``half_open``. A tool nobody calls stays ``open`` indefinitely.
* ``half_open`` admits every call that arrives. The first result of a call
  admitted in that round decides: success closes the breaker (counter reset),
  a transient failure opens it again with a fresh cooldown. A permanent failure
  decides nothing; the round stays open for the next result.

Late results are handled with admission tickets. Every ticket carries the
breaker's *round*, a number that goes up on every change of state. A result
counts only if its ticket's round is the current one, so once the first result
of a half-open round has decided, the other results of that round arrive with
an old round and change nothing — not the state, not the counter. The same
holds for calls admitted while ``closed`` whose results arrive after the
breaker opened.

The core is synchronous and takes its clock as an argument, so tests drive it
with a fake clock. A tool call looks like::

    breaker = breakers.get(tool)
    with breaker.guard():        # admit(), then record() from how the block ends
        result = await run(tool, args)
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

from apollia_nb.errors import ApolliaError, CircuitOpen, ModelError, ToolError
from apollia_nb.runtime.states import BREAKER, BreakerState, transition

__all__ = [
    "THRESHOLD",
    "COOLDOWN_SECS",
    "Outcome",
    "SUCCESS",
    "TRANSIENT",
    "PERMANENT",
    "Ticket",
    "BreakerStatus",
    "CircuitBreaker",
    "Breakers",
    "classify",
]

THRESHOLD: Final = 3
"""Consecutive transient failures that open a breaker."""

COOLDOWN_SECS: Final = 30.0
"""Seconds an open breaker refuses calls before the next call may probe."""

Outcome = Literal["success", "transient", "permanent"]
SUCCESS: Final = "success"
TRANSIENT: Final = "transient"
PERMANENT: Final = "permanent"
_OUTCOMES: Final = frozenset({SUCCESS, TRANSIENT, PERMANENT})

Clock = Callable[[], float]


class Ticket:
    """Proof that a call was admitted, to hand back to :meth:`CircuitBreaker.record`.

    A ticket is recorded at most once. It remembers the breaker's round at
    admission; a result whose round has passed is ignored.
    """

    __slots__ = ("tool", "round", "state", "_spent")

    def __init__(self, tool: str, round: int, state: BreakerState) -> None:
        self.tool = tool
        self.round = round
        self.state = state  # the state the call was admitted in: closed or half_open
        self._spent = False

    @property
    def spent(self) -> bool:
        return self._spent

    def __repr__(self) -> str:
        return f"Ticket({self.tool!r}, round={self.round}, state={self.state.value!r})"


@dataclass(frozen=True)
class BreakerStatus:
    """What a breaker looks like at one instant, for surfaces and the journal.

    ``retry_in`` is the cooldown left while ``open`` (0.0 once it has elapsed
    and the next call would probe) and None otherwise.
    """

    tool: str
    state: BreakerState
    consecutive_failures: int
    opened_at: float | None
    retry_in: float | None


class CircuitBreaker:
    """The breaker of one tool. See the module docstring for the rules."""

    def __init__(self, tool: str, clock: Clock = time.monotonic) -> None:
        self.tool = tool
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at: float | None = None
        self._round = 0

    @property
    def state(self) -> BreakerState:
        """The current state. Reading it never moves the breaker."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Transient failures since the last success (permanent ones do not count)."""
        return self._failures

    @property
    def opened_at(self) -> float | None:
        """Clock reading when the breaker last opened: the start of the cooldown.

        Set while ``open`` and ``half_open``; None while ``closed``.
        """
        return self._opened_at

    @property
    def round(self) -> int:
        """Goes up by one on every change of state; tickets carry it."""
        return self._round

    def _move(self, target: BreakerState) -> None:
        self._state = transition(BREAKER, self._state, target)
        self._round += 1

    def admit(self) -> Ticket:
        """Admit one call or raise :class:`CircuitOpen` (changing nothing).

        While ``open`` and inside the cooldown the call is refused. The first
        call at or after the end of the cooldown moves the breaker to
        ``half_open`` and is admitted; so is every call while ``half_open``.
        """
        with self._lock:
            if self._state is BreakerState.OPEN:
                assert self._opened_at is not None
                left = self._opened_at + COOLDOWN_SECS - self._clock()
                if left > 0:
                    raise CircuitOpen(
                        f"tool {self.tool!r} failed {self._failures} times in a row; "
                        f"its circuit is open for another {left:.1f} s"
                    )
                self._move(BreakerState.HALF_OPEN)
            return Ticket(self.tool, self._round, self._state)

    def record(self, ticket: Ticket, outcome: Outcome) -> None:
        """Record how an admitted call ended: ``success``, ``transient`` or ``permanent``.

        A ticket from a past round changes nothing. Raises ValueError for an
        unknown outcome, a ticket of another tool or a ticket already recorded.
        """
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {sorted(_OUTCOMES)}, not {outcome!r}")
        if ticket.tool != self.tool:
            raise ValueError(f"ticket for tool {ticket.tool!r} given to the breaker of {self.tool!r}")
        with self._lock:
            if ticket._spent:
                raise ValueError(f"{ticket!r} was already recorded")
            ticket._spent = True
            if ticket.round != self._round or outcome == PERMANENT:
                return
            if outcome == SUCCESS:
                self._failures = 0
                if self._state is BreakerState.HALF_OPEN:
                    self._move(BreakerState.CLOSED)
                    self._opened_at = None
                return
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN or self._failures >= THRESHOLD:
                self._move(BreakerState.OPEN)
                self._opened_at = self._clock()

    @contextmanager
    def guard(self) -> Iterator[Ticket]:
        """Admit, run the block, record its result.

        No exception records a success; an ``Exception`` is recorded as
        :func:`classify` says and re-raised. A ``BaseException`` that is not an
        ``Exception`` (cancellation, KeyboardInterrupt) records nothing: the
        call did not finish, so it says nothing about the tool.
        """
        ticket = self.admit()
        try:
            yield ticket
        except Exception as exc:
            self.record(ticket, classify(exc))
            raise
        self.record(ticket, SUCCESS)

    def status(self) -> BreakerStatus:
        """A snapshot of this breaker. Reading it never moves the breaker."""
        with self._lock:
            retry_in = None
            if self._state is BreakerState.OPEN:
                assert self._opened_at is not None
                retry_in = max(0.0, self._opened_at + COOLDOWN_SECS - self._clock())
            return BreakerStatus(
                self.tool, self._state, self._failures, self._opened_at, retry_in
            )

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker({self.tool!r}, state={self._state.value!r}, "
            f"failures={self._failures})"
        )


class Breakers:
    """The breakers of every tool, keyed by tool name, created on first use."""

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_tool: dict[str, CircuitBreaker] = {}

    def get(self, tool: str) -> CircuitBreaker:
        """The breaker of ``tool``; a new ``closed`` one the first time."""
        with self._lock:
            breaker = self._by_tool.get(tool)
            if breaker is None:
                breaker = self._by_tool[tool] = CircuitBreaker(tool, self._clock)
            return breaker

    def __contains__(self, tool: object) -> bool:
        return tool in self._by_tool

    def __len__(self) -> int:
        return len(self._by_tool)

    def statuses(self) -> list[BreakerStatus]:
        """A snapshot of every breaker created so far, sorted by tool name."""
        with self._lock:
            breakers = sorted(self._by_tool.values(), key=lambda b: b.tool)
        return [b.status() for b in breakers]


_NETWORK_ERRNOS: Final = frozenset(
    code
    for name in (
        "ECONNABORTED",
        "ECONNREFUSED",
        "ECONNRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "ENETUNREACH",
        "EPIPE",
        "ETIMEDOUT",
    )
    if (code := getattr(errno, name, None)) is not None
)


def classify(exc: BaseException) -> Literal["transient", "permanent"]:
    """Whether a failed call is worth counting against the tool's breaker.

    Transient: a :class:`ToolError` or :class:`ModelError` whose ``transient``
    is true (``TOOL_TRANSIENT``, ``TOOL_TIMEOUT``, ``MODEL_TRANSIENT``); a
    ``TimeoutError`` or ``ConnectionError``; a name-resolution failure; an
    ``OSError`` with a network errno; an httpx timeout, network error or
    remote protocol error, or an HTTP status error with status 429 or 5xx.
    Permanent: everything else, including every other apollia-nb error
    (``BAD_INPUT``, ``BAD_ARGUMENT``, ``REFUSED``, ``TOOL_PERMANENT``,
    ``PATH_ESCAPE``, …) and every other exception.
    """
    if isinstance(exc, (ToolError, ModelError)):
        return TRANSIENT if exc.transient else PERMANENT
    if isinstance(exc, ApolliaError):
        return PERMANENT
    if isinstance(exc, (TimeoutError, ConnectionError, socket.gaierror)):
        return TRANSIENT
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return TRANSIENT
    httpx = sys.modules.get("httpx")  # only loaded if a tool already uses it
    if httpx is not None:
        if isinstance(exc, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)):
            return TRANSIENT
        if isinstance(exc, httpx.HTTPStatusError):
            status = exc.response.status_code
            return TRANSIENT if status == 429 or status >= 500 else PERMANENT
    return PERMANENT
