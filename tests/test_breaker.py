"""The tool circuit breaker, driven by a fake clock: no sleeps, no timers."""

from __future__ import annotations

import errno
import inspect
import socket

import anyio
import httpx
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from apollia_nb import errors
from apollia_nb.runtime import breaker as breaker_module
from apollia_nb.runtime.breaker import (
    COOLDOWN_SECS,
    THRESHOLD,
    Breakers,
    BreakerStatus,
    CircuitBreaker,
    Ticket,
    classify,
)
from apollia_nb.runtime.states import BreakerState

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, secs: float) -> None:
        self.now += secs


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker("http_request", clock)


def fail(b: CircuitBreaker, times: int, outcome: str = "transient") -> None:
    for _ in range(times):
        b.record(b.admit(), outcome)


def open_breaker(b: CircuitBreaker) -> None:
    fail(b, THRESHOLD)
    assert b.state is OPEN


def facts(b: CircuitBreaker) -> tuple:
    return (b.state, b.consecutive_failures, b.opened_at, b.round)


class Tool:
    """A stand-in tool that counts how often it actually ran."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, exc: Exception | None = None) -> str:
        self.calls += 1
        if exc is not None:
            raise exc
        return "ok"


# --- fixed rules --------------------------------------------------------------------


def test_threshold_and_cooldown_are_fixed_constants():
    assert THRESHOLD == 3
    assert COOLDOWN_SECS == 30.0
    assert list(inspect.signature(CircuitBreaker).parameters) == ["tool", "clock"]
    assert list(inspect.signature(Breakers).parameters) == ["clock"]


def test_a_new_breaker_is_closed(breaker):
    assert breaker.state is CLOSED
    assert breaker.consecutive_failures == 0
    assert breaker.opened_at is None
    assert breaker.status() == BreakerStatus("http_request", CLOSED, 0, None, None)


# --- counting -----------------------------------------------------------------------


def test_opens_after_exactly_three_consecutive_transient_failures(breaker, clock):
    fail(breaker, 2)
    assert breaker.state is CLOSED
    assert breaker.consecutive_failures == 2
    breaker.admit()  # still admits
    fail(breaker, 1)
    assert breaker.state is OPEN
    assert breaker.consecutive_failures == 3
    assert breaker.opened_at == clock.now


def test_permanent_failures_neither_count_nor_reset(breaker):
    fail(breaker, 2)
    fail(breaker, 5, "permanent")
    assert breaker.state is CLOSED
    assert breaker.consecutive_failures == 2
    fail(breaker, 1)
    assert breaker.state is OPEN


def test_a_single_success_resets_the_counter(breaker):
    fail(breaker, 2)
    breaker.record(breaker.admit(), "success")
    assert breaker.consecutive_failures == 0
    fail(breaker, 2)
    assert breaker.state is CLOSED
    assert breaker.consecutive_failures == 2


def test_concurrent_closed_calls_count_in_the_order_results_arrive(breaker):
    tickets = [breaker.admit() for _ in range(4)]
    breaker.record(tickets[0], "transient")
    breaker.record(tickets[1], "transient")
    breaker.record(tickets[2], "success")
    breaker.record(tickets[3], "transient")
    assert (breaker.state, breaker.consecutive_failures) == (CLOSED, 1)


# --- open ---------------------------------------------------------------------------


def test_open_fails_fast_without_calling_the_tool(breaker, clock):
    open_breaker(breaker)
    before = facts(breaker)
    tool = Tool()
    clock.advance(12.5)
    with pytest.raises(errors.CircuitOpen) as info:
        with breaker.guard():
            tool()
    assert tool.calls == 0
    assert facts(breaker) == before
    err = info.value
    assert err.code == "CIRCUIT_OPEN"
    assert "'http_request'" in err.message
    assert "17.5 s" in err.message
    assert err.message == "tool 'http_request' failed 3 times in a row; its circuit is open for another 17.5 s"


def test_stays_open_indefinitely_when_nobody_calls(breaker, clock):
    open_breaker(breaker)
    opened = breaker.opened_at
    clock.advance(3600)
    assert breaker.state is OPEN  # reading the state never moves it
    status = breaker.status()
    assert (status.state, status.retry_in, status.opened_at) == (OPEN, 0.0, opened)
    assert breaker.state is OPEN
    breaker.admit()
    assert breaker.state is HALF_OPEN


def test_cooldown_boundary(breaker, clock):
    open_breaker(breaker)
    clock.advance(COOLDOWN_SECS - 1e-6)
    with pytest.raises(errors.CircuitOpen):
        breaker.admit()
    assert breaker.state is OPEN
    clock.advance(1e-6)
    ticket = breaker.admit()
    assert breaker.state is HALF_OPEN
    assert ticket.state is HALF_OPEN
    assert ticket.tool == "http_request"


# --- half-open ----------------------------------------------------------------------


def half_open(b: CircuitBreaker, clock: FakeClock, calls: int) -> list[Ticket]:
    open_breaker(b)
    clock.advance(COOLDOWN_SECS)
    tickets = [b.admit() for _ in range(calls)]
    assert b.state is HALF_OPEN
    return tickets


def test_half_open_admits_every_concurrent_call(breaker, clock):
    tickets = half_open(breaker, clock, 10)
    assert len({t.round for t in tickets}) == 1
    assert all(t.state is HALF_OPEN for t in tickets)


def test_first_success_closes_and_late_results_are_ignored(breaker, clock):
    first, second, third = half_open(breaker, clock, 3)
    breaker.record(second, "success")
    assert breaker.state is CLOSED
    assert breaker.consecutive_failures == 0
    assert breaker.opened_at is None
    decided = facts(breaker)
    breaker.record(first, "transient")
    breaker.record(third, "transient")
    assert facts(breaker) == decided
    fail(breaker, 2)  # fresh calls count from zero
    assert (breaker.state, breaker.consecutive_failures) == (CLOSED, 2)


def test_first_transient_failure_reopens_with_a_new_cooldown(breaker, clock):
    tickets = half_open(breaker, clock, 3)
    clock.advance(5)
    breaker.record(tickets[0], "transient")
    assert breaker.state is OPEN
    assert breaker.opened_at == clock.now
    decided = facts(breaker)
    breaker.record(tickets[1], "success")
    breaker.record(tickets[2], "success")
    assert facts(breaker) == decided
    clock.advance(COOLDOWN_SECS - 1)
    with pytest.raises(errors.CircuitOpen):
        breaker.admit()
    clock.advance(1)
    breaker.admit()
    assert breaker.state is HALF_OPEN


def test_permanent_failure_does_not_decide_a_half_open_round(breaker, clock):
    first, second = half_open(breaker, clock, 2)
    breaker.record(first, "permanent")
    assert breaker.state is HALF_OPEN
    third = breaker.admit()  # still admitting
    breaker.record(third, "success")
    assert breaker.state is CLOSED
    breaker.record(second, "transient")
    assert breaker.state is CLOSED


def test_results_of_closed_calls_arriving_after_opening_are_ignored(breaker, clock):
    tickets = [breaker.admit() for _ in range(5)]
    for t in tickets[:3]:
        breaker.record(t, "transient")
    assert breaker.state is OPEN
    decided = facts(breaker)
    breaker.record(tickets[3], "success")
    breaker.record(tickets[4], "transient")
    assert facts(breaker) == decided
    # ... and still ignored once a later round is under way.
    clock.advance(COOLDOWN_SECS)
    probe = breaker.admit()
    stale = breaker.admit()
    breaker.record(probe, "success")
    breaker.record(stale, "transient")
    assert (breaker.state, breaker.consecutive_failures) == (CLOSED, 0)


# --- misuse -------------------------------------------------------------------------


def test_record_refuses_misuse_and_changes_nothing(breaker, clock):
    other = CircuitBreaker("read_file", clock)
    ticket = breaker.admit()
    before = facts(breaker)
    with pytest.raises(ValueError, match="outcome"):
        breaker.record(ticket, "flaky")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'read_file'"):
        breaker.record(other.admit(), "transient")
    assert facts(breaker) == before
    assert not ticket.spent
    breaker.record(ticket, "transient")
    assert ticket.spent
    with pytest.raises(ValueError, match="already recorded"):
        breaker.record(ticket, "transient")
    assert breaker.consecutive_failures == 1


# --- guard --------------------------------------------------------------------------


def test_guard_records_success_and_classified_failures(breaker):
    tool = Tool()
    with breaker.guard():
        tool()
    for _ in range(2):
        with pytest.raises(errors.ToolTimeout):
            with breaker.guard():
                tool(errors.ToolTimeout("slow"))
    with pytest.raises(errors.BadArgument):
        with breaker.guard():
            tool(errors.BadArgument("path missing"))
    assert (breaker.state, breaker.consecutive_failures) == (CLOSED, 2)
    with pytest.raises(ConnectionResetError):
        with breaker.guard():
            tool(ConnectionResetError())
    assert breaker.state is OPEN
    assert tool.calls == 5


def test_guard_records_nothing_when_the_call_is_cancelled(breaker, clock):
    half_open(breaker, clock, 1)  # a probe that never reports
    ran = []

    async def main() -> None:
        with anyio.CancelScope() as scope:
            with breaker.guard() as ticket:
                ran.append(ticket)
                scope.cancel()
                await anyio.lowlevel.checkpoint()
            ran.append("not reached")

    anyio.run(main)
    assert len(ran) == 1 and not ran[0].spent
    assert breaker.state is HALF_OPEN  # the round is still undecided
    with breaker.guard():
        pass
    assert breaker.state is CLOSED


# --- registry -----------------------------------------------------------------------


def test_breakers_are_keyed_by_tool(clock):
    breakers = Breakers(clock)
    assert "bash_executor" not in breakers
    flaky = breakers.get("http_request")
    assert breakers.get("http_request") is flaky
    open_breaker(flaky)
    steady = breakers.get("read_file")
    assert steady.state is CLOSED
    with steady.guard():
        pass
    with pytest.raises(errors.CircuitOpen, match="http_request"):
        breakers.get("http_request").admit()
    assert len(breakers) == 2
    assert [(s.tool, s.state) for s in breakers.statuses()] == [
        ("http_request", OPEN),
        ("read_file", CLOSED),
    ]
    clock.advance(10)
    assert breakers.statuses()[0].retry_in == pytest.approx(20.0)


# --- classify -----------------------------------------------------------------------


def _http_status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "https://example.invalid/")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError("status", request=request, response=response)


@pytest.mark.parametrize(
    "exc",
    [
        errors.TransientToolError("flaky"),
        errors.ToolTimeout("slow"),
        errors.ModelTransient("429"),
        TimeoutError(),
        ConnectionError(),
        ConnectionRefusedError(),
        socket.gaierror(socket.EAI_AGAIN, "temporary failure in name resolution"),
        OSError(errno.ENETUNREACH, "network is unreachable"),
        OSError(errno.ETIMEDOUT, "timed out"),
        OSError(errno.EHOSTDOWN, "host is down"),
        OSError(errno.EHOSTUNREACH, "no route to host"),
        OSError(errno.ENETDOWN, "network is down"),
        OSError(errno.ENETRESET, "connection reset by network"),
        OSError(errno.ECONNABORTED, "connection aborted"),
        OSError(errno.EPIPE, "broken pipe"),
        httpx.ConnectTimeout("slow"),
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("server hung up"),
        _http_status_error(429),
        _http_status_error(500),
        _http_status_error(503),
        _http_status_error(599),
    ],
    ids=repr,
)
def test_classify_transient(exc):
    assert classify(exc) == "transient"


@pytest.mark.parametrize(
    "exc",
    [
        errors.BadInput("bad"),
        errors.BadArgument("bad"),
        errors.Refused("no"),
        errors.PermanentToolError("broken"),
        errors.PathEscape("../etc"),
        errors.ToolError("generic"),
        errors.ModelPermanent("400"),
        errors.CircuitOpen("open"),
        errors.BudgetExceeded("out"),
        FileNotFoundError(errno.ENOENT, "missing"),
        PermissionError(errno.EACCES, "denied"),
        OSError("no errno"),
        ValueError("bad"),
        KeyError("k"),
        httpx.UnsupportedProtocol("ftp"),
        _http_status_error(404),
        _http_status_error(499),
        _http_status_error(428),
    ],
    ids=repr,
)
def test_classify_permanent(exc):
    assert classify(exc) == "permanent"


def test_module_exports():
    assert set(breaker_module.__all__) >= {
        "THRESHOLD",
        "COOLDOWN_SECS",
        "Ticket",
        "CircuitBreaker",
        "Breakers",
        "classify",
    }


# --- against a reference model ----------------------------------------------------


class Model:
    """The rules restated plainly: a set of live tickets instead of round numbers.

    A ticket is live from admission until the state next changes; only live
    tickets' results count.
    """

    def __init__(self) -> None:
        self.state = "closed"
        self.failures = 0
        self.opened_at: float | None = None
        self.live: set[int] = set()

    def change(self, state: str) -> None:
        self.state = state
        self.live = set()

    def admit(self, now: float, ticket_id: int) -> bool:
        if self.state == "open":
            if now < self.opened_at + 30:
                return False
            self.change("half_open")
        self.live.add(ticket_id)
        return True

    def record(self, now: float, ticket_id: int, outcome: str) -> None:
        if ticket_id not in self.live:
            return
        self.live.discard(ticket_id)
        if outcome == "permanent":
            return
        if outcome == "success":
            self.failures = 0
            if self.state == "half_open":
                self.change("closed")
                self.opened_at = None
            return
        self.failures += 1
        if self.state == "half_open" or self.failures >= 3:
            self.change("open")
            self.opened_at = now


class BreakerVersusModel(RuleBasedStateMachine):
    tickets = Bundle("tickets")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(0.0)
        self.breaker = CircuitBreaker("tool", self.clock)
        self.model = Model()
        self.next_id = 0

    @rule(target=tickets)
    def admit(self):
        self.next_id += 1
        expected = self.model.admit(self.clock.now, self.next_id)
        try:
            ticket = self.breaker.admit()
        except errors.CircuitOpen:
            assert not expected
            return None
        assert expected
        return (self.next_id, ticket)

    @rule(entry=consumes(tickets), outcome=st.sampled_from(["success", "transient", "permanent"]))
    def record(self, entry, outcome):
        if entry is None:
            return
        ticket_id, ticket = entry
        self.model.record(self.clock.now, ticket_id, outcome)
        self.breaker.record(ticket, outcome)

    @rule(secs=st.sampled_from([0.5, 1.0, 10.0, 29.0, 29.5, 30.0, 45.0, 3600.0]))
    def advance(self, secs):
        self.clock.advance(secs)

    @invariant()
    def agrees(self):
        assert self.breaker.state.value == self.model.state
        assert self.breaker.consecutive_failures == self.model.failures
        assert self.breaker.opened_at == self.model.opened_at


BreakerVersusModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_breaker_matches_reference_model = BreakerVersusModel.TestCase


# --- what a breaker and a ticket show -------------------------------------------------


def test_the_round_starts_at_zero_and_counts_every_change_of_state(breaker, clock):
    assert breaker.round == 0
    stale = breaker.admit()
    assert stale.round == 0
    open_breaker(breaker)
    assert breaker.round == 1
    clock.advance(COOLDOWN_SECS)
    probe = breaker.admit()
    assert (breaker.round, probe.round) == (2, 2)
    breaker.record(probe, "success")
    assert (breaker.state, breaker.round) == (CLOSED, 3)
    breaker.record(stale, "transient")  # its round has passed: ignored
    assert breaker.consecutive_failures == 0


def test_a_registry_knows_which_tools_have_a_breaker(clock):
    breakers = Breakers(clock)
    assert "read_file" not in breakers
    breakers.get("read_file")
    assert "read_file" in breakers
    assert "http_request" not in breakers
    assert 7 not in breakers


def test_repr_of_a_breaker_and_a_ticket(breaker):
    ticket = breaker.admit()
    assert repr(ticket) == "Ticket('http_request', round=0, state='closed')"
    breaker.record(ticket, "transient")
    assert repr(breaker) == "CircuitBreaker('http_request', state='closed', failures=1)"


def test_a_status_is_a_frozen_value(breaker):
    status = breaker.status()
    with pytest.raises(AttributeError):
        status.state = OPEN  # type: ignore[misc]
    assert status == breaker.status()


def test_misuse_messages_are_exact(breaker, clock):
    ticket = breaker.admit()
    with pytest.raises(ValueError) as info:
        breaker.record(ticket, "flaky")  # type: ignore[arg-type]
    assert str(info.value) == "outcome must be one of ['permanent', 'success', 'transient'], not 'flaky'"
    other = CircuitBreaker("read_file", clock)
    with pytest.raises(ValueError) as info:
        breaker.record(other.admit(), "success")
    assert str(info.value) == "ticket for tool 'read_file' given to the breaker of 'http_request'"
    breaker.record(ticket, "success")
    with pytest.raises(ValueError) as info:
        breaker.record(ticket, "success")
    assert str(info.value) == "Ticket('http_request', round=0, state='closed') was already recorded"


class _LibraryError(OSError):
    """An ``OSError`` subclass of a library: Python does not map its errno to ``ConnectionError`` and the like."""


@pytest.mark.parametrize(
    "name",
    ["ECONNABORTED", "ECONNREFUSED", "ECONNRESET", "EHOSTDOWN", "EHOSTUNREACH", "ENETDOWN", "ENETRESET",
     "ENETUNREACH", "EPIPE", "ETIMEDOUT"],
)
def test_every_network_errno_is_transient_whatever_the_exception_class(name):
    exc = _LibraryError(getattr(errno, name), name)
    assert not isinstance(exc, (ConnectionError, TimeoutError))
    assert classify(exc) == "transient"
    assert classify(_LibraryError(errno.ENOENT, "missing")) == "permanent"
