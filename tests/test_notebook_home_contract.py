"""One notebook, two homes: the magics and the widgets behave the same on an owned home and in a kernel that
joined `apollia-os serve`.

``owner``: a real IPython (in this process) whose kernel owns a fresh home; its agent is declared with
``%%apollia agent`` and runs in the kernel. ``served``: a real `apollia-os serve` subprocess owns the home and
the same IPython joins it; the agent is registered on the server (its REST API) and runs there. Each test
asks the magics, the handles and the widgets the same thing and expects the same answer; only where the
agent ``runs`` differs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from apollia_nb.notebook.handles import NotebookTask, Report
from apollia_nb.notebook.magics import ApolliaMagicError
from runtime_helpers import call, manifest

WAIT = 60
WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]
USER = "ann"


@dataclass
class Kernel:
    ip: Any
    runs: str  # where the agent declared by ``declare`` runs
    declare: Callable[[str], None]  # a manifest's text: the agent, where this home's agents are registered


def _load(shell: Any) -> None:
    shell.run_line_magic("load_ext", "apollia_nb")
    shell.run_line_magic("config", f'ApolliaMagics.user = "{USER}"')


def _unload(shell: Any) -> None:
    from apollia_nb.notebook.extension import unload_ipython_extension

    unload_ipython_extension(shell)
    shell.extension_manager.loaded.discard("apollia_nb")
    shell.config.pop("ApolliaMagics", None)


@pytest.fixture(params=["owner", "served"])
def kernel(request: pytest.FixtureRequest, tmp_path, monkeypatch, capsys) -> Iterator[Kernel]:
    from IPython.testing import globalipapp

    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("APOLLIA_HOME", str(home))
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    if request.param == "owner":
        _load(shell)
        capsys.readouterr()
        try:
            yield Kernel(shell, "kernel", lambda text: shell.run_cell_magic("apollia", "agent", text))
        finally:
            _unload(shell)
        return
    from test_shared_home import serve, stop

    from apollia_nb.sdk.client import Client

    server = serve(home)
    loaded = False
    try:
        with Client.from_home(home) as api:
            _load(shell)
            loaded = True
            capsys.readouterr()
            assert shell.magics_manager.registry["ApolliaMagics"].runtime.rt.server is not None  # joined
            yield Kernel(shell, "server", lambda text: api.register_agent(text) and None)
    finally:
        if loaded:
            _unload(shell)
        stop(server)


def clerk(**kw: Any) -> str:
    return manifest("clerk", workspace=os.getcwd(), **kw)


def until(check: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < end, "not within the time allowed"
        time.sleep(0.05)


@pytest.fixture
def fast_follow(monkeypatch):
    """A view of a task that runs elsewhere looks at it again every 0.1 s (the default is 2 s)."""
    from apollia_nb.notebook import home

    monkeypatch.setattr(home, "SERVED_VIEW_POLL_SECS", 0.1)


def test_agents_lists_the_agent_and_where_it_runs(kernel):
    kernel.declare(clerk())
    listed = kernel.ip.run_line_magic("apollia", "agents")
    assert isinstance(listed, Report)
    assert [(a["name"], a["runs"], a["state"]) for a in listed.data] == [("clerk", kernel.runs, "active")]
    assert "runs" in listed.text and kernel.runs in listed.text
    runtime = kernel.ip.magics_manager.registry["ApolliaMagics"].runtime
    assert runtime.home.agents() == listed.data  # the magic asks the kernel's one view of the home
    with pytest.raises(ApolliaMagicError) as info:  # an agent neither the kernel nor the home has
        kernel.ip.run_cell_magic("apollia", "task ghost", "boo")
    assert info.value.code == "UNKNOWN_AGENT"


def test_a_task_is_answered_from_code_and_awaited(kernel):
    kernel.declare(clerk(actor=WRITE))
    task = kernel.ip.run_cell_magic("apollia", "task clerk", "Write a.txt\n")
    assert isinstance(task, NotebookTask)
    assert (task.runs, task.agent, task.goal) == (kernel.runs, "clerk", "Write a.txt")
    task.join(WAIT, settled=True)  # the cell returned although the run needs a person
    assert task.status == "waiting"
    [card] = task.pending
    assert (card.tool, card.family, tuple(card.answers), card.waiting) == (
        "write_file", "write", ("once", "always", "refuse"), True)
    assert [c.id for c in task.cards] == [card.id]
    card.answer("once")
    assert not card.waiting and card.answered_by == USER
    assert task.join(WAIT).status == "completed"
    assert task.result == "Wrote a.txt."
    assert task.pending == []
    [decision] = task.decisions()
    assert (decision["tool"], decision["answer"], decision["answered_by"]) == ("write_file", "once", USER)
    assert (task.to_dict()["status"], task.budget["used"] > 0) == ("completed", True)
    assert repr(task).startswith(f"Task {task.id} (clerk): completed")
    assert open("a.txt").read() == "hello"  # the agent wrote in its workspace, wherever it ran


def test_a_task_is_awaitable_from_a_cell(kernel):
    import asyncio

    kernel.declare(clerk())
    task = kernel.ip.run_cell_magic("apollia", "task clerk", "say done")
    assert isinstance(task, NotebookTask) and task.runs == kernel.runs
    done = asyncio.run(asyncio.wait_for(task.wait(), WAIT))
    assert done is task and task.status == "completed"


def test_a_click_on_the_tasks_card_answers_it_and_the_view_follows_to_the_end(kernel, fast_follow):
    kernel.declare(clerk(actor=WRITE))
    task = kernel.ip.run_cell_magic("apollia", "task clerk", "Write a.txt")
    task.join(WAIT, settled=True)
    view = task.widget  # the same view wherever the task runs: its card has buttons, not pills
    assert type(view).__name__ == "RunView"
    [card] = view.cards.values()
    assert list(card.buttons)[:3] == ["once", "always", "refuse"] and card.snap["tool"] == "write_file"
    card.buttons["refuse"].click()
    assert card.frozen and f"by {USER}" in card.state.value, (card.state.value, card.error.value)
    assert task.join(WAIT).status == "failed"  # the write was refused
    until(lambda: view.final)
    assert "failed" in view.header.value
    [decision] = task.decisions()
    assert (decision["answer"], decision["answered_by"]) == ("refuse", USER)
    assert not os.path.exists("a.txt")


def test_a_card_answered_from_code_freezes_its_view(kernel, fast_follow):
    kernel.declare(clerk(actor=WRITE))
    task = kernel.ip.run_cell_magic("apollia", "task clerk", "Write a.txt")
    task.join(WAIT, settled=True)
    view = task.widget
    [card_view] = view.cards.values()
    [card] = task.pending
    card.answer("once")  # not through this view
    until(lambda: card_view.frozen)
    assert card_view.button_row.layout.display == "none"
    assert task.join(WAIT).status == "completed"
    until(lambda: view.final)


def test_a_plan_is_approved_by_a_click(kernel, fast_follow):
    kernel.declare(clerk(planner=[{"steps": ["Say done"]}]))
    task = kernel.ip.run_cell_magic("apollia", "task clerk --approve-plan", "Plan, then say done")
    until(lambda: task.awaiting_plan_approval)
    view = task.widget
    until(lambda: view.plan_view is not None)
    assert view.plan_view.edited_steps() == ["Say done"]
    view.plan_view.approve_button.click()
    assert view.plan_view.decided == "approved", view.plan_view.error.value
    assert task.join(WAIT).status == "completed"
    assert not task.awaiting_plan_approval


def test_a_plan_is_rejected_from_code(kernel):
    kernel.declare(clerk(planner=[{"steps": ["Say done"]}]))
    task = kernel.ip.run_cell_magic("apollia", "task clerk --approve-plan", "Plan, then say done")
    assert isinstance(task, NotebookTask) and task.runs == kernel.runs
    until(lambda: task.awaiting_plan_approval)
    task.reject_plan("not today")
    assert task.join(WAIT).status == "failed"
    assert task.error["code"] == "REJECTED"


def test_a_task_is_cancelled_from_code(kernel):
    kernel.declare(clerk(actor=WRITE))
    task = kernel.ip.run_cell_magic("apollia", "task clerk", "Write a.txt")
    assert isinstance(task, NotebookTask) and task.runs == kernel.runs
    task.join(WAIT, settled=True)
    assert task.cancel() is task
    assert task.join(WAIT).status == "cancelled"
