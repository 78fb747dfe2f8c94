"""The state machines: every legal move allowed, every other move refused, docs in step.

The expected moves are written out by hand from the documented state machines,
not read from the tables, so a wrong table fails here.
"""

from __future__ import annotations

import importlib.util
import itertools
import shutil
from pathlib import Path
from types import MappingProxyType

import pytest

from apollia_nb.errors import Conflict, InvalidTransition
from apollia_nb.runtime.states import (
    BREAKER,
    MACHINES,
    PROCESS,
    SESSION,
    TASK,
    BreakerState,
    Machine,
    ProcessState,
    SessionState,
    StateCell,
    TaskStatus,
    allowed,
    can_transition,
    is_terminal,
    transition,
)

ROOT = Path(__file__).resolve().parents[1]

LEGAL: dict[str, set[tuple[str, str]]] = {
    "task": {
        ("pending", "running"),
        ("pending", "cancelled"),
        ("pending", "failed"),
        ("running", "waiting"),
        ("running", "completed"),
        ("running", "failed"),
        ("running", "cancelled"),
        ("waiting", "running"),
        ("waiting", "failed"),
        ("waiting", "cancelled"),
    },
    "process": {
        ("initializing", "active"),
        ("initializing", "degraded"),
        ("initializing", "stopping"),
        ("active", "degraded"),
        ("active", "stopping"),
        ("degraded", "active"),
        ("degraded", "stopping"),
        ("stopping", "stopped"),
        ("stopped", "initializing"),
    },
    "session": {
        ("active", "processing"),
        ("active", "paused"),
        ("active", "closed"),
        ("processing", "active"),
        ("processing", "paused"),
        ("processing", "closed"),
        ("paused", "processing"),
        ("paused", "active"),
        ("paused", "closed"),
    },
    "breaker": {
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
        ("half_open", "open"),
    },
}

STATES: dict[str, list[str]] = {
    "task": ["pending", "running", "waiting", "completed", "failed", "cancelled"],
    "process": ["initializing", "active", "degraded", "stopping", "stopped"],
    "session": ["active", "processing", "paused", "closed"],
    "breaker": ["closed", "open", "half_open"],
}

TERMINAL: dict[str, set[str]] = {
    "task": {"completed", "failed", "cancelled"},
    "process": set(),
    "session": {"closed"},
    "breaker": set(),
}

BY_NAME: dict[str, Machine] = {"task": TASK, "process": PROCESS, "session": SESSION, "breaker": BREAKER}

LEGAL_CASES = [(m, a, b) for m in LEGAL for a, b in sorted(LEGAL[m])]
ILLEGAL_CASES = [
    (m, a, b)
    for m in STATES
    for a, b in itertools.product(STATES[m], repeat=2)
    if (a, b) not in LEGAL[m]
]


def test_enums_are_their_strings():
    assert [s.value for s in TaskStatus] == STATES["task"]
    assert [s.value for s in ProcessState] == STATES["process"]
    assert [s.value for s in SessionState] == STATES["session"]
    assert [s.value for s in BreakerState] == STATES["breaker"]
    assert TaskStatus.RUNNING == "running"
    assert str(BreakerState.HALF_OPEN) == "half_open"
    assert MACHINES == (TASK, PROCESS, SESSION, BREAKER)


@pytest.mark.parametrize(("machine", "current", "target"), LEGAL_CASES)
def test_every_legal_move_is_allowed(machine, current, target):
    m = BY_NAME[machine]
    result = transition(m, current, target)
    assert result == target
    assert isinstance(result, m.states)
    assert transition(m, m.states(current), m.states(target)) is m.states(target)
    assert can_transition(m, current, target)
    cell = StateCell(m, current)
    assert cell.move(target) == target
    assert cell.state == target


@pytest.mark.parametrize(("machine", "current", "target"), ILLEGAL_CASES)
def test_every_illegal_move_is_refused_and_changes_nothing(machine, current, target):
    m = BY_NAME[machine]
    assert not can_transition(m, current, target)
    cell = StateCell(m, current)
    with pytest.raises(InvalidTransition) as info:
        cell.move(target)
    assert cell.state == current
    err = info.value
    assert err.code == "INVALID_TRANSITION"
    assert isinstance(err, Conflict) and err.http_status == 409
    assert err.__cause__ is None and err.__suppress_context__
    assert machine in err.message
    assert repr(current) in err.message and repr(target) in err.message


def test_message_lists_what_is_allowed():
    with pytest.raises(InvalidTransition) as info:
        transition(PROCESS, "stopping", "active")
    assert str(info.value) == (
        "INVALID_TRANSITION: process: cannot move from 'stopping' to 'active'; "
        "allowed from 'stopping': stopped"
    )
    with pytest.raises(InvalidTransition, match="nothing \\(terminal\\)"):
        transition(TASK, TaskStatus.COMPLETED, TaskStatus.RUNNING)


def test_startup_failure_cannot_skip_stopping():
    with pytest.raises(InvalidTransition):
        transition(PROCESS, ProcessState.INITIALIZING, ProcessState.STOPPED)
    cell = StateCell(PROCESS)
    assert cell.state is ProcessState.INITIALIZING
    cell.move("stopping")
    cell.move("stopped")
    cell.move("initializing")  # restart
    assert cell.state is ProcessState.INITIALIZING


def test_crash_recovery_moves_processing_session_to_active():
    assert transition(SESSION, "processing", "active") is SessionState.ACTIVE


def test_rejected_approval_fails_a_waiting_task():
    assert transition(TASK, "waiting", "failed") is TaskStatus.FAILED
    assert not can_transition(TASK, "completed", "failed")


@pytest.mark.parametrize("machine", sorted(STATES))
def test_terminal_states_have_no_exits(machine):
    m = BY_NAME[machine]
    for state in STATES[machine]:
        assert is_terminal(m, state) == (state in TERMINAL[machine])
        exits = {b for a, b in LEGAL[machine] if a == state}
        assert allowed(m, state) == exits
        assert StateCell(m, state).terminal == (state in TERMINAL[machine])


@pytest.mark.parametrize("machine", sorted(STATES))
@pytest.mark.parametrize("bad", ["", "RUNNING", "bogus", "half-open", None, 3])
def test_unknown_states_are_refused_not_key_errors(machine, bad):
    m = BY_NAME[machine]
    good = STATES[machine][0]
    with pytest.raises(InvalidTransition, match="unknown state"):
        transition(m, bad, good)
    with pytest.raises(InvalidTransition, match="unknown state"):
        transition(m, good, bad)
    with pytest.raises(InvalidTransition):
        is_terminal(m, bad)
    if bad is not None:  # StateCell(m, None) means "start at the initial state"
        with pytest.raises(InvalidTransition):
            StateCell(m, bad)
    assert not can_transition(m, bad, good)
    cell = StateCell(m, good)
    with pytest.raises(InvalidTransition):
        cell.move(bad)
    assert cell.state == good


def test_a_member_of_another_machine_is_refused():
    # SessionState.ACTIVE == "active" == ProcessState.ACTIVE as strings, but a
    # member of the wrong enum is a mistake, not a coincidence to accept.
    with pytest.raises(InvalidTransition, match="not a process state"):
        transition(PROCESS, SessionState.ACTIVE, ProcessState.DEGRADED)
    assert transition(PROCESS, "active", ProcessState.DEGRADED) is ProcessState.DEGRADED


def test_tables_are_frozen():
    for m in MACHINES:
        assert isinstance(m.table, MappingProxyType)
        with pytest.raises(TypeError):
            m.table[m.initial] = frozenset()  # type: ignore[index]
        for targets in m.table.values():
            assert isinstance(targets, frozenset)
    with pytest.raises(AttributeError):
        TASK.name = "other"  # type: ignore[misc]


def test_machine_rejects_an_incomplete_table():
    with pytest.raises(ValueError, match="every state"):
        Machine("bad", BreakerState, MappingProxyType({BreakerState.CLOSED: frozenset()}), BreakerState.CLOSED)
    with pytest.raises(ValueError, match="bad targets"):
        Machine(
            "bad",
            BreakerState,
            MappingProxyType({s: frozenset({s}) for s in BreakerState}),
            BreakerState.CLOSED,
        )


# --- the generated diagrams -------------------------------------------------------


def _generator():
    path = ROOT / "dev" / "docs" / "make_state_diagrams.py"
    spec = importlib.util.spec_from_file_location("make_state_diagrams", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_diagrams_match_the_tables():
    gen = _generator()
    assert gen.main(["--check"]) == 0, "run: python dev/docs/make_state_diagrams.py"


def test_diagram_edges_are_the_legal_moves():
    gen = _generator()
    for name, machine in BY_NAME.items():
        block = gen.mermaid(machine)
        edges = {
            tuple(line.strip().split(" --> "))
            for line in block.splitlines()
            if " --> " in line and "[*]" not in line
        }
        assert edges == LEGAL[name]
        assert f"[*] --> {machine.initial.value}" in block


def test_check_fails_on_a_drifted_doc(tmp_path, capsys):
    gen = _generator()
    doc = tmp_path / "state-machines.md"
    shutil.copy(ROOT / "docs" / "state-machines.md", doc)
    text = doc.read_text(encoding="utf-8")
    assert "    stopping --> stopped\n" in text
    doc.write_text(text.replace("    stopping --> stopped\n", "    initializing --> stopped\n"), encoding="utf-8")
    assert gen.main(["--check", "--doc", str(doc)]) == 1
    assert "differ from the tables" in capsys.readouterr().err
    assert gen.main(["--doc", str(doc)]) == 0  # regenerate
    assert doc.read_text(encoding="utf-8") == text
    assert gen.main(["--check", "--doc", str(doc)]) == 0


def test_generator_refuses_a_doc_without_markers(tmp_path, capsys):
    gen = _generator()
    doc = tmp_path / "plain.md"
    doc.write_text("# no markers\n", encoding="utf-8")
    assert gen.main(["--doc", str(doc)]) == 2
    assert "diagrams:start" in capsys.readouterr().err
    assert doc.read_text(encoding="utf-8") == "# no markers\n"


@pytest.mark.parametrize("machine", sorted(STATES))
def test_a_cell_can_move_exactly_where_the_table_allows(machine):
    m = BY_NAME[machine]
    for current in m.states:
        cell = StateCell(m, current)
        for target in m.states:
            assert cell.can_move(target) == (target in m.table[current])
            assert cell.can_move(target.value) == (target in m.table[current])
        assert cell.state is current  # asking moves nothing
    assert not StateCell(m).can_move("bogus")


def test_messages_name_the_machine_and_the_bad_state():
    with pytest.raises(InvalidTransition) as info:
        transition(TASK, "bogus", "running")
    known = ", ".join(s.value for s in TaskStatus)
    assert info.value.message == f"task: unknown state 'bogus' (states: {known})"
    with pytest.raises(InvalidTransition) as info:
        transition(PROCESS, SessionState.ACTIVE, "degraded")
    assert info.value.message == "process: SessionState.ACTIVE is not a process state"
    with pytest.raises(InvalidTransition) as info:
        transition(TASK, "completed", "running")
    assert info.value.message.endswith("allowed from 'completed': nothing (terminal)")
    assert repr(StateCell(TASK, "running")) == "StateCell(task, 'running')"


def test_a_machine_whose_initial_state_is_not_a_state_is_refused():
    with pytest.raises(ValueError, match="^process: initial state is not a state$"):
        Machine("process", ProcessState, PROCESS.table, TaskStatus.PENDING)


def test_machines_are_compared_by_identity_and_hashable():
    twin = Machine("task", TaskStatus, TASK.table, TaskStatus.PENDING)
    assert twin != TASK and TASK == TASK
    assert {TASK: 1, twin: 2}[TASK] == 1
    assert len(set(MACHINES)) == len(MACHINES)
    assert repr(TASK) == "Machine('task')"


def test_bad_table_messages_are_exact():
    with pytest.raises(ValueError) as info:
        Machine("bad", BreakerState, MappingProxyType({BreakerState.CLOSED: frozenset()}), BreakerState.CLOSED)
    assert str(info.value) == "bad: the table must list every state exactly once"
    table = {s: frozenset() for s in BreakerState} | {BreakerState.OPEN: frozenset({BreakerState.OPEN})}
    with pytest.raises(ValueError) as info:
        Machine("bad", BreakerState, MappingProxyType(table), BreakerState.CLOSED)
    assert str(info.value) == "bad: bad targets for 'open'"


def test_message_lists_several_allowed_states_in_table_order():
    with pytest.raises(InvalidTransition) as info:
        transition(TASK, TaskStatus.PENDING, TaskStatus.COMPLETED)
    allowed_text = info.value.message.split("allowed from 'pending': ")[1]
    expected = [s.value for s in TaskStatus if s in TASK.table[TaskStatus.PENDING]]
    assert len(expected) > 1
    assert allowed_text == ", ".join(expected)
