"""What the panel's inbox says of each question: which task (goal, task and run ids) a card belongs to,
plans waiting for approval answered from the panel, a verification that follows the journal, and why a
kernel has no home (the real reason, not the command that just failed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest
from test_notebook_panel import WAIT, WRITE, ask, open_panel, runtime, served  # noqa: F401 - the fixture

from apollia_nb.notebook import panel

DONE = [{"text": "Done."}]


def test_cards_of_two_tasks_say_their_goal_task_run_and_card(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE + WRITE))
    first = ip.run_cell_magic("apollia", "task clerk", "Summarise the Monday notes").join(WAIT, settled=True)
    second = ip.run_cell_magic("apollia", "task clerk", "Summarise the Friday notes").join(WAIT, settled=True)
    p, comm = open_panel(ip)
    inbox = ask(p, comm, "s1", op="snapshot")["data"]["inbox"]
    cards = {i["task_id"]: i for i in inbox if i["kind"] == "card"}
    assert set(cards) == {first.id, second.id}
    for task, goal in ((first, "Summarise the Monday notes"), (second, "Summarise the Friday notes")):
        item = cards[task.id]
        [card] = task.pending
        assert (item["goal"], item["owner"], item["run_id"], item["id"]) == (goal, "task", task.run_id, card.id)
    for task in (first, second):
        task.pending[0].answer("refuse")


def test_a_chat_card_carries_the_chats_first_message_as_its_goal(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "write a for me")
    exchange.join(WAIT, settled=True)
    p, comm = open_panel(ip)
    [item] = ask(p, comm, "s1", op="snapshot")["data"]["inbox"]
    assert (item["kind"], item["owner"], item["goal"], item["session_id"]) == (
        "card", "chat", "write a for me", exchange.session.id)
    exchange.pending[0].answer("refuse")


def plan_task(ip, goal="Tidy the notes"):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["Look at the notes"]}], actor=DONE))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", goal)
    task.join(WAIT, settled=True)
    assert task.awaiting_plan_approval
    return task


def test_a_plan_waiting_for_approval_is_in_the_inbox_and_approved_there_as_edited(ip):
    task = plan_task(ip)
    view = task.widget.plan_view  # the cell's plan widget
    p, comm = open_panel(ip)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    [plan] = [i for i in data["inbox"] if i["kind"] == "plan"]
    assert (plan["id"], plan["task_id"], plan["run_id"], plan["agent"], plan["goal"], plan["steps"], plan["runs"]) == (
        task.id, task.id, task.run_id, "clerk", "Tidy the notes", ["Look at the notes"], "kernel")
    [run] = data["runs"]
    assert run["awaiting_plan_approval"] is True and run["status"] == "waiting"

    reply = ask(p, comm, "p1", op="approve_plan", task_id=task.id, steps=["  Read every note  "])
    assert reply["ok"] is True, reply
    assert reply["data"]["decided"] == "approved (edited)" and reply["data"]["by"] == runtime(ip).user
    done = task.join(WAIT)
    assert done.status == "completed"
    assert [s["description"] for s in done.to_dict()["steps"]] == ["Read every note"]
    assert not [i for i in ask(p, comm, "s2", op="snapshot")["data"]["inbox"] if i["kind"] == "plan"]
    assert view is not None and view.approve_button.disabled and "approved" in view.state.value  # the cell's too

    again = ask(p, comm, "p2", op="approve_plan", task_id=task.id)
    assert again["ok"] is False and again["error"]["code"] == "CONFLICT"


def test_a_plan_rejected_from_the_panel_ends_the_task_with_the_reason(ip):
    task = plan_task(ip)
    p, comm = open_panel(ip)
    reply = ask(p, comm, "p1", op="reject_plan", task_id=task.id, reason="not today")
    assert reply["ok"] is True and reply["data"]["decided"] == "rejected: not today"
    done = task.join(WAIT)
    assert done.status in ("failed", "cancelled") and done.status != "completed"
    rows = runtime(ip).rt.journal.sql("SELECT payload FROM entries WHERE run_id = ? AND kind LIKE 'plan%'",
                                      [task.run_id])
    assert any("not today" in str(r[0]) for r in rows), rows


@pytest.mark.parametrize("request_, code", [
    ({"id": "x", "op": "approve_plan"}, "BAD_INPUT"),  # which task?
    ({"id": "x", "op": "approve_plan", "task_id": ""}, "BAD_INPUT"),
    ({"id": "x", "op": "approve_plan", "task_id": "t", "steps": []}, "BAD_INPUT"),  # a plan needs a step
    ({"id": "x", "op": "approve_plan", "task_id": "t", "steps": ["ok", "  "]}, "BAD_INPUT"),
    ({"id": "x", "op": "approve_plan", "task_id": "t", "steps": ["ok", 3]}, "BAD_INPUT"),
    ({"id": "x", "op": "approve_plan", "task_id": "t", "steps": "one step"}, "BAD_INPUT"),
    ({"id": "x", "op": "approve_plan", "task_id": "t", "steps": ["x" * 10_001]}, "BAD_INPUT"),
    ({"id": "x", "op": "reject_plan", "task_id": "t", "reason": 7}, "BAD_INPUT"),
    ({"id": "x", "op": "reject_plan", "task_id": "t", "reason": "x" * 10_001}, "BAD_INPUT"),
    ({"id": "x", "op": "approve_plan", "task_id": "task-nope"}, "UNKNOWN_TASK"),
    ({"id": "x", "op": "reject_plan", "task_id": "task-nope", "reason": "no"}, "UNKNOWN_TASK"),
])
def test_bad_plan_answers_get_a_stable_code_and_leave_the_plan_waiting(ip, request_, code):
    task = plan_task(ip)
    if request_.get("task_id") == "t":
        request_ = {**request_, "task_id": task.id}
    p, comm = open_panel(ip)
    reply = ask(p, comm, "x", **{k: v for k, v in request_.items() if k != "id"})
    assert reply["ok"] is False and reply["error"]["code"] == code, reply
    answers = [r for r in runtime(ip).rt.journal.sql("SELECT payload FROM entries WHERE kind = 'plan' AND run_id = ?",
                                                      [task.run_id]) if "approved" in str(r[0])]
    assert answers == []  # no answer journaled
    assert task.awaiting_plan_approval and task.status == "waiting"
    task.reject_plan("done testing")


def test_a_task_not_waiting_on_its_plan_cannot_be_approved_or_rejected(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk", "Write a.txt").join(WAIT, settled=True)  # waits on a card
    p, comm = open_panel(ip)
    for op in ("approve_plan", "reject_plan"):
        reply = ask(p, comm, op, op=op, task_id=task.id)
        assert reply["ok"] is False and reply["error"]["code"] == "CONFLICT", reply
    assert [c.tool for c in task.pending] == ["write_file"]
    task.pending[0].answer("refuse")


def test_the_verification_follows_new_entries_and_never_claims_more_than_it_checked(ip, monkeypatch):
    monkeypatch.setattr(panel, "REVERIFY_MIN_SECS", 0.0)
    p, comm = open_panel(ip)
    home = panel.PanelHome.of(runtime(ip))
    first = ask(p, comm, "v1", op="verify")["data"]
    assert first["state"] == "ok"
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    waiting = ip.run_cell_magic("apollia", "task clerk", "Write a.txt").join(WAIT, settled=True)
    rt = runtime(ip).rt
    size = rt.journal.head()[0]
    assert size > first["checked_size"]
    snap = ask(p, comm, "s1", op="snapshot")["data"]["journal"]
    assert snap["verify"]["checked_size"] is None or snap["verify"]["checked_size"] <= snap["size"]
    # Each snapshot asks for another verification; it comes without a click and covers the new entries.
    end, n = time.monotonic() + WAIT, 0
    while True:
        n += 1
        journal = ask(p, comm, f"s-{n}", op="snapshot")["data"]["journal"]
        assert journal["verify"]["state"] in ("ok", "running") and journal["verify"]["checked_size"] <= journal["size"]
        if journal["verify"]["state"] == "ok" and journal["verify"]["checked_size"] == journal["size"] >= size:
            break
        assert time.monotonic() < end, journal["verify"]
    waiting.pending[0].answer("refuse")


def test_a_verification_that_follows_entries_is_spaced_after_the_last(ip, monkeypatch):
    monkeypatch.setattr(panel, "REVERIFY_MIN_SECS", 3600.0)
    p, comm = open_panel(ip)
    home = panel.PanelHome.of(runtime(ip))
    assert ask(p, comm, "v1", op="verify")["data"]["state"] == "ok"
    checked = home.verification["checked_size"]
    ip.run_cell_magic("apollia", "agent", manifest(actor=DONE))
    ip.run_cell_magic("apollia", "task clerk", "Say done").join(WAIT)
    snap = ask(p, comm, "s1", op="snapshot")["data"]["journal"]
    assert snap["size"] > checked
    assert snap["verify"] == {**snap["verify"], "state": "ok", "checked_size": checked}  # no more than it checked
    assert home._reverify is not None  # scheduled, not started
    assert ask(p, comm, "v2", op="verify")["data"]["checked_size"] == runtime(ip).rt.journal.head()[0]  # a click


def test_a_kernel_whose_home_another_kernel_holds_says_so_and_names_the_notebook(ip, tmp_path):
    other = tmp_path / "held-home"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from apollia_nb.home import Home, OwnerLock; "
         "OwnerLock(Home.at(sys.argv[1])).acquire(); print('held', flush=True); sys.stdin.read()", str(other)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "JPY_SESSION_NAME": "/work/analysis.ipynb"})
    try:
        assert holder.stdout.readline().strip() == "held"
        p, comm = open_panel(ip)
        ask(p, comm, "s0", op="snapshot")
        try:
            ip.run_line_magic("config", f'ApolliaMagics.home = "{other}"')  # closes this home, fails to open that one
        except Exception:
            pass
        reply = ask(p, comm, "s1", op="snapshot")
        assert reply["ok"] is False and reply["error"]["code"] == "HOME_LOCKED", reply
        message = reply["error"]["message"]
        assert f"process {holder.pid}" in message and str(other) in message
        assert "the notebook /work/analysis.ipynb" in message and "Shut Down Kernel" in message
        assert "%config ApolliaMagics.home" in message and "no home is open" not in message
    finally:
        holder.stdin.close()
        holder.wait(timeout=WAIT)
    # Freed: the next `%apollia` opens it, and the panel finds it.
    ip.run_line_magic("apollia", "status")
    assert ask(p, comm, "s2", op="snapshot")["data"]["home"] == str(other)


def test_without_a_failure_the_panel_still_says_no_home_is_open(ip):
    p, comm = open_panel(ip)
    ip.magics_manager.registry["ApolliaMagics"].close_home()
    reply = ask(p, comm, "s1", op="snapshot")
    assert reply["error"]["code"] == "CONFLICT" and "no home is open" in reply["error"]["message"]


def test_home_locked_words_name_the_notebook_when_known():
    said = panel.home_locked_words("the home /h is owned by process 7.", "/w/a.ipynb")
    assert said.startswith("the home /h is owned by process 7. ") and "the notebook /w/a.ipynb" in said
    unknown = panel.home_locked_words("the home /h is owned by process 7.", None)
    assert "the other kernel or process" in unknown and "%config ApolliaMagics.home" in unknown


# --- served: plans of the server's tasks ------------------------------------------------------------


def test_served_a_server_tasks_plan_is_in_the_inbox_and_approved_over_rest(served):
    ip, api = served
    api.register_agent(manifest("clerk", planner=[{"steps": ["Look at the notes"]}], actor=DONE,
                                workspace=os.getcwd()))
    submitted = api.submit("clerk", "Tidy the shared notes", approve_plan=True)
    task = api.wait(submitted.id, timeout=WAIT)
    assert task.awaiting_plan_approval
    p, comm = open_panel(ip)
    [plan] = [i for i in ask(p, comm, "s1", op="snapshot")["data"]["inbox"] if i["kind"] == "plan"]
    assert (plan["task_id"], plan["runs"], plan["goal"]) == (submitted.id, "server", "Tidy the shared notes")
    reply = ask(p, comm, "p1", op="approve_plan", task_id=submitted.id)
    assert reply["ok"] is True and reply["data"]["decided"] == "approved", reply
    assert api.wait(submitted.id, until="finished", timeout=WAIT).status == "completed"
    again = ask(p, comm, "p2", op="reject_plan", task_id=submitted.id, reason="late")
    assert again["ok"] is False and again["error"]["code"] == "CONFLICT"


# --- served: a server task's cards, clicked in the kernel that joined the server -------------------------


def test_served_a_server_tasks_card_is_answered_by_a_click_in_the_cell(served, monkeypatch):
    from apollia_nb.notebook import home as home_mod
    from apollia_nb.notebook.handles import NotebookTask

    monkeypatch.setattr(home_mod, "SERVED_VIEW_POLL_SECS", 0.2)
    ip, api = served
    api.register_agent(manifest("clerk", actor=WRITE, workspace=os.getcwd()))
    task = ip.run_cell_magic("apollia", "task clerk", "Write a.txt")  # the server's agent: runs there
    assert isinstance(task, NotebookTask) and task.runs == "server"
    task.join(WAIT, settled=True)
    view = task.widget  # what the cell shows: buttons, not pills (the same view as a task of the kernel)
    assert type(view).__name__ == "RunView"
    [card] = view.cards.values()
    assert list(card.buttons) == ["once", "always", "refuse"] and card.snap["tool"] == "write_file"
    card.buttons["once"].click()  # answered over the server's REST API
    assert card.frozen and "by ann" in card.state.value, (card.state.value, card.error.value)
    assert task.join(WAIT).status == "completed"
    answers = [e for e in api.entries(limit=1000).entries if e.kind == "answer"]
    assert [(e.payload["answer"], e.payload["answered_by"]) for e in answers] == [("once", "ann")]
    end = time.monotonic() + WAIT
    while not view.final:  # the view follows the server until the task ends
        assert time.monotonic() < end
        time.sleep(0.05)
    assert "completed" in view.header.value

    # A second click anywhere is refused with a stable code, never a second answer.
    from apollia_nb.notebook.widgets import ConsentCardView

    stale = {**card.snap, "answer": None, "answered_by": None, "answered_at": None}  # displayed before the answer
    late = ConsentCardView(runtime(ip), stale, answer_with=task._task.answerer(stale["id"]))
    late.buttons["refuse"].click()
    assert "CONFLICT" in late.error.value and not late.frozen


def test_served_a_card_answered_by_another_client_freezes_in_the_cell(served, monkeypatch):
    from apollia_nb.notebook import home as home_mod

    monkeypatch.setattr(home_mod, "SERVED_VIEW_POLL_SECS", 0.2)
    ip, api = served
    api.register_agent(manifest("clerk", actor=WRITE, workspace=os.getcwd()))
    task = ip.run_cell_magic("apollia", "task clerk", "Write a.txt")
    task.join(WAIT, settled=True)
    view = task.widget
    [card] = view.cards.values()
    api.decide(card.snap["id"], "refuse", by="bob")
    end = time.monotonic() + WAIT
    while not card.frozen:
        assert time.monotonic() < end
        time.sleep(0.05)
    assert "by bob" in card.state.value and card.button_row.layout.display == "none"
    task.join(WAIT)
