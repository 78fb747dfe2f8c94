"""A task's record: typed, JSON only at the edge, every status, phase and step move through its machine.

The legal moves of the phase and step machines are written out by hand, not read from the
tables, so a wrong table fails here. A status the engine would move illegally raises and
changes nothing; "waiting" as people see it is derived from the record; a cancel that meets
a run's end being sealed finds the end as sealed, sealed once.
"""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path

import anyio
import pytest

from apollia_nb.errors import HomeFileCorrupt, InvalidTransition
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.states import PHASE, RECORD_MACHINES, STEP, StateCell, StepStatus, TaskPhase, TaskStatus
from apollia_nb.runtime.tasks import StepRecord, TaskRecord, new_task_record, task_json
from runtime_helpers import call, manifest

ROOT = Path(__file__).resolve().parents[1]

LEGAL = {
    "phase": {
        ("plan", "approve"), ("plan", "execute"), ("plan", "done"),
        ("approve", "execute"), ("approve", "done"),
        ("execute", "critic"), ("execute", "done"),
        ("critic", "plan"), ("critic", "done"),
    },
    "step": {
        ("pending", "running"),
        ("running", "done"), ("running", "failed"), ("running", "cancelled"),
    },
}
STATES = {
    "phase": ["plan", "approve", "execute", "critic", "done"],
    "step": ["pending", "running", "done", "failed", "cancelled"],
}
BY_NAME = {"phase": PHASE, "step": STEP}
ILLEGAL = [(m, a, b) for m in STATES for a, b in itertools.product(STATES[m], repeat=2) if (a, b) not in LEGAL[m]]


def record(**changes) -> TaskRecord:
    r = TaskRecord.new(task_id="task-1", run_id="run-1", agent="clerk", goal="g", ceiling=5, watched=True,
                       grants=[], approve_plan=False, warnings=[], created_at="2026-01-01T00:00:00Z")
    for key, value in changes.items():
        setattr(r, key, value)
    return r


# --- the tables ----------------------------------------------------------------------------


def test_the_record_machines_are_the_phase_and_the_step():
    assert RECORD_MACHINES == (PHASE, STEP)
    assert [s.value for s in TaskPhase] == STATES["phase"]
    assert [s.value for s in StepStatus] == STATES["step"]
    assert (PHASE.initial, STEP.initial) == (TaskPhase.PLAN, StepStatus.PENDING)


@pytest.mark.parametrize(("machine", "current", "target"), [(m, a, b) for m in LEGAL for a, b in sorted(LEGAL[m])])
def test_every_legal_move_of_a_phase_or_a_step(machine, current, target):
    if machine == "phase":
        r = record(phase=TaskPhase(current))
        r.move_phase(TaskPhase(target))
        assert r.phase is TaskPhase(target)
    else:
        step = StepRecord(index=0, description="d", status=StepStatus(current))
        step.move(StepStatus(target))
        assert step.status is StepStatus(target)
    assert StateCell(BY_NAME[machine], current).move(target) == target


@pytest.mark.parametrize(("machine", "current", "target"), ILLEGAL)
def test_every_illegal_move_of_a_phase_or_a_step_raises_and_changes_nothing(machine, current, target):
    if machine == "phase":
        r = record(phase=TaskPhase(current))
        before = r.to_json()
        with pytest.raises(InvalidTransition) as info:
            r.move_phase(TaskPhase(target))
        assert r.to_json() == before
    else:
        step = StepRecord(index=0, description="d", status=StepStatus(current))
        before = step.to_json()
        with pytest.raises(InvalidTransition) as info:
            step.move(StepStatus(target))
        assert step.to_json() == before
    assert info.value.code == "INVALID_TRANSITION"
    assert f"{machine}: cannot move from {current!r} to {target!r}" in info.value.message


@pytest.mark.parametrize("current", list(TaskStatus))
@pytest.mark.parametrize("target", list(TaskStatus))
def test_a_records_status_moves_only_where_the_task_table_allows(current, target):
    r = record(status=current)
    before = r.to_json()
    legal = target in {
        TaskStatus.PENDING: {"running", "cancelled", "failed"},
        TaskStatus.RUNNING: {"waiting", "completed", "failed", "cancelled"},
        TaskStatus.WAITING: {"running", "failed", "cancelled"},
    }.get(current, set())
    if legal:
        r.move(target)
        assert r.status is target
    else:
        with pytest.raises(InvalidTransition):
            r.move(target)
        assert r.to_json() == before


# --- JSON at the edge ---------------------------------------------------------------------------


def test_a_new_record_is_the_json_runtime_db_always_stored():
    assert list(new_task_record(task_id="t", run_id="r", agent="a", goal="g", ceiling=3, watched=False,
                                grants=["read"], approve_plan=True, warnings=["w"], created_at="now")) == [
        "id", "run_id", "agent", "goal", "status", "error", "result", "warnings", "watched", "grants",
        "approve_plan", "budget", "phase", "plan", "steps", "step_index", "attempt", "feedback", "messages",
        "queued_calls", "awaiting", "plan_decision", "verdict", "created_at", "updated_at"]
    data = json.loads(json.dumps(record(turns=3, model_state={"actor": 2}, steps=[
        StepRecord(0, "a", StepStatus.DONE, [{"call_id": "c1"}], "ok", ["thought"])]).to_json()))
    again = TaskRecord.from_json(data)
    assert json.dumps(again.to_json()) == json.dumps(data)  # byte for byte
    assert data["steps"][0] == {"index": 0, "description": "a", "status": "done", "tool_calls": [{"call_id": "c1"}],
                                "text": "ok", "reasoning": ["thought"]}


@pytest.mark.parametrize("damage", [
    {"status": "paused"}, {"phase": "review"}, {"budget": None}, {"surprise": 1},
    {"steps": [{"index": 0, "description": "a", "status": "maybe", "tool_calls": [], "text": None}]},
])
def test_a_record_that_does_not_read_is_refused_never_guessed(damage):
    data = {**record().to_json(), **damage}
    with pytest.raises(HomeFileCorrupt, match="runtime.db: the record of task 'task-1' does not read"):
        TaskRecord.from_json(data)
    data = record().to_json()
    del data["phase"]
    with pytest.raises(HomeFileCorrupt):
        TaskRecord.from_json(data)


@pytest.mark.anyio
async def test_runtime_db_holds_the_record_a_run_ended_with(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("memory_save", key="k", value="v")]},
                                                {"text": "saved"}]))
        handle = await (await rt.submit("clerk", "Save a note"))
        assert handle.status == "completed", handle.error
        await rt.committed()
        stored = rt.records.task(handle.id)
        assert stored == handle.record and handle.to_dict() == task_json(stored)
        assert stored["phase"] == "done" and [s["status"] for s in stored["steps"]] == ["done"] * len(stored["steps"])
        assert stored["turns"] >= 2


# --- illegal moves raise ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_engine_never_skips_an_illegal_move_of_a_finished_task(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "done"}]))
        handle = await (await rt.submit("clerk", "Finish"))
        assert handle.status == "completed"
        run = rt._finished[handle.id]
        before = run.r.to_json()
        for target in (TaskStatus.RUNNING, TaskStatus.CANCELLED, TaskStatus.COMPLETED):
            with pytest.raises(InvalidTransition, match="task: cannot move from 'completed'"):
                run._set_status(target)
        assert run.r.to_json() == before


# --- waiting is derived --------------------------------------------------------------------


def test_waiting_is_derived_from_the_record():
    r = record(status=TaskStatus.RUNNING)
    assert (r.waiting, r.shown_status) == (False, "running")
    r.asking.add("dec-1")  # a question asked during a call in flight
    assert (r.waiting, r.shown_status, r.to_json()["status"]) == (True, "waiting", "running")
    assert "asking" not in r.to_json() and TaskRecord.from_json(r.to_json()).asking == set()
    r.asking.clear()
    r.move(TaskStatus.WAITING)
    r.move_phase(TaskPhase.APPROVE)
    assert r.waiting and r.awaiting_plan_approval and r.to_json()["status"] == "waiting"
    r.move(TaskStatus.CANCELLED)
    r.asking.add("dec-2")
    assert (r.waiting, r.shown_status, r.awaiting_plan_approval) == (False, "cancelled", False)


@pytest.mark.anyio
async def test_a_question_during_a_call_shows_the_task_waiting_and_runtime_db_running(home):
    from test_federation_mcp_client import E, everything, next_card
    from test_federation_support import write_config

    write_config(home, servers={"everything": everything(families={"trigger-elicitation-request": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call(f"{E}/trigger-elicitation-request")]},
                                                {"text": "asked"}],
                                         required=[f"{E}/trigger-elicitation-request"]))
        handle = await rt.submit("clerk", "Ask me")
        card = await next_card(rt, handle, f"{E}/elicitation/create")
        assert handle.status == "waiting" and handle.to_dict()["status"] == "waiting"
        assert handle.record["status"] == "running"  # what a restart must find: a call in flight
        rt._runs[handle.id]._save()
        await rt.committed()
        assert rt.records.task(handle.id)["status"] == "running"
        card.answer("refuse")
        await handle
        assert handle.status == "completed", handle.error
        assert rt.records.task(handle.id)["status"] == "completed"


# --- the first end stands ------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_cancel_that_meets_the_seal_of_a_completion_finds_it_completed_sealed_once(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "done"}]))
        journal = rt.journal
        sealing, release = anyio.Event(), anyio.Event()
        real_seal = journal.seal_async

        async def seal_then_hold(*args, **kwargs):
            # The seal is committed; the run has not heard so yet when the cancel arrives.
            result = await real_seal(*args, **kwargs)
            sealing.set()
            await release.wait()
            return result

        journal.seal_async = seal_then_hold
        handle = await rt.submit("clerk", "Finish")
        await sealing.wait()
        run = rt._runs[handle.id]
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.cancel, handle.id)
            while not run.scope.cancel_called:  # the cancel has reached the run
                await anyio.lowlevel.checkpoint()
            release.set()
        assert handle.status == "completed" and handle.error is None
        seals = [json.loads(e.payload) for e in journal.entries(run_id=handle.run_id) if e.kind == "run_seal"]
        assert [s["status"] for s in seals] == ["completed"]
        await rt.committed()
        assert rt.records.task(handle.id)["status"] == "completed"
        assert rt.verify().ok


# --- nothing writes a status or a phase beside the machines ------------------------------------


def test_no_module_writes_a_status_or_a_phase_outside_the_machines():
    """``x["status"] = ...`` / ``x.status = ...`` (and ``phase``) anywhere in the package: only in states.py,
    in the record classes, or with a value the machine gave (``transition(...)``)."""
    inside = {("apollia_nb/runtime/states.py", None), ("apollia_nb/runtime/tasks.py", "TaskRecord"),
              ("apollia_nb/runtime/tasks.py", "StepRecord")}
    # Not records of a machine: how one chat exchange's stream ended (Exchange), a card's row in the panel.
    not_records = {("apollia_nb/runtime/chat.py", "Exchange"), ("apollia_nb/runtime/chat.py", "Session"),
                   ("apollia_nb/notebook/panel.py", None)}
    found = []
    for path in sorted((ROOT / "apollia_nb").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls_name, node in _assignments(tree):
            if (rel, None) in inside or (rel, cls_name) in inside | not_records:
                continue
            if _from_the_machine(node.value):
                continue
            found.extend(f"{rel}:{node.lineno}" for target in _targets(node) if _names_a_state(target))
    assert found == []


def _assignments(tree):
    def walk(node, cls):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                yield name, child
            yield from walk(child, name)
    yield from walk(tree, None)


def _targets(node):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            yield from target.elts
        else:
            yield target


def _names_a_state(target) -> bool:
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
        return target.slice.value in ("status", "phase")
    return isinstance(target, ast.Attribute) and target.attr in ("status", "phase")


def _from_the_machine(value) -> bool:
    while isinstance(value, ast.Attribute):  # transition(...).value
        value = value.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "transition"


def test_the_walk_finds_a_status_written_beside_the_machine():
    tree = ast.parse("def f(run):\n    run.r['status'] = 'waiting'\n    run.r.phase = 'done'\n"
                     "    run.r.status = transition(TASK, run.r.status, 'running')\n")
    hits = [node.lineno for _, node in _assignments(tree) if not _from_the_machine(node.value)
            for target in _targets(node) if _names_a_state(target)]
    assert hits == [2, 3]
