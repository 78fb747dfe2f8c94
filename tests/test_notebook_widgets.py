"""The widgets, clicked from Python: consent cards, plan approval, run view, chat view, inbox, journal."""

from __future__ import annotations

import pytest

from apollia_nb.notebook.widgets import ChatView, ConsentCardView, InboxView, JournalView, PlanApprovalView, RunView
from runtime_helpers import call, manifest

WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]
SHELL = [{"tool_calls": [call("bash_executor", command="echo hi")]}, {"text": "Ran it."}]


from notebook_fixtures import ip  # noqa: F401 - the fixture


def runtime(ip):
    return ip.magics_manager.registry["ApolliaMagics"].runtime


def waiting_task(ip, actor, line="task clerk"):
    ip.run_cell_magic("apollia", "agent", manifest(actor=actor))
    return ip.run_cell_magic("apollia", line, "do it").join(10, settled=True)


# --- consent cards ------------------------------------------------------------------


def test_a_card_offers_exactly_the_answers_on_offer(ip):
    task = waiting_task(ip, SHELL)  # code execution without developer mode: once or refuse, never always
    view = task.widget
    assert isinstance(view, RunView)
    [card_view] = view.cards.values()
    assert isinstance(card_view, ConsentCardView)
    assert card_view.answers == ["once", "refuse"]
    assert [b.description for b in card_view.button_row.children] == ["once", "refuse"]
    assert "bash_executor" in card_view.header.value and "execute" in card_view.header.value
    assert "echo hi" in card_view.arguments.value
    assert "line 4" in card_view.reason.value
    task.pending[0].answer("refuse")


def test_clicking_an_answer_answers_the_card_and_freezes_it(ip):
    task = waiting_task(ip, WRITE)
    card_view = next(iter(task.widget.cards.values()))
    assert card_view.answers == ["once", "always", "refuse"]
    card_view.buttons["once"].click()
    assert task.join(10).status == "completed"
    assert card_view.frozen
    assert all(b.disabled for b in card_view.buttons.values())
    assert card_view.button_row.layout.display == "none"
    user = runtime(ip).user
    assert "once" in card_view.state.value and f"by {user}" in card_view.state.value
    assert task.decisions()[0]["answered_by"] == user
    card_view.buttons["refuse"].click()  # a frozen card ignores further clicks
    assert task.decisions()[0]["answer"] == "once"


def test_a_card_answered_from_code_freezes_its_widget(ip):
    task = waiting_task(ip, WRITE)
    card = task.pending[0]
    card_view = card.widget
    assert not card_view.frozen
    card.answer("refuse", by="someone-else")
    assert card_view.frozen
    assert "refuse" in card_view.state.value and "someone-else" in card_view.state.value
    assert task.join(10).status == "failed" and task.error["code"] == "REFUSED"


def test_clicking_a_card_answered_elsewhere_shows_the_conflict_and_the_answer(ip):
    task = waiting_task(ip, WRITE, "task clerk --unattended")
    card_view = task.pending[0].widget
    card_view._unwatch()  # a view that missed the notification (e.g. another window)
    runtime(ip).call(runtime(ip).rt.answer, card_view.snap["id"], "once", by="elsewhere")
    assert not card_view.frozen
    card_view.buttons["refuse"].click()
    assert "CONFLICT" in card_view.error.value
    assert card_view.frozen and "elsewhere" in card_view.state.value
    assert task.join(10).status == "completed"


def test_a_long_argument_is_folded_but_shown_in_full(ip):
    long_text = "x" * 5000
    task = waiting_task(ip, [{"tool_calls": [call("write_file", path="big.txt", content=long_text)]}])
    card_view = task.pending[0].widget
    assert "<details>" in card_view.arguments.value and long_text in card_view.arguments.value
    task.pending[0].answer("refuse")


# --- plan approval --------------------------------------------------------------------


def test_plan_approval_edit_then_approve(ip):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["one", "two"]}]))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", "work").join(10, settled=True)
    plan = task.widget.plan_view
    assert isinstance(plan, PlanApprovalView)
    assert plan.steps.value == "one\ntwo"
    plan.steps.value = "one\n  \nthree\n"
    plan.approve_button.click()
    assert plan.decided == "approved (edited)" and plan.approve_button.disabled
    assert task.join(10).status == "completed"
    assert task.to_dict()["plan"] == ["one", "three"]


def test_plan_approval_unchanged_is_approved_as_proposed(ip):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["one", "two"]}]))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", "work").join(10, settled=True)
    task.widget.plan_view.approve_button.click()
    assert task.widget.plan_view.decided == "approved"
    assert task.join(10).to_dict()["plan"] == ["one", "two"]


def test_plan_reject_with_a_reason_fails_the_task(ip):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["delete everything"]}]))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", "work").join(10, settled=True)
    plan = task.widget.plan_view
    plan.reason.value = "too broad"
    plan.reject_button.click()
    assert plan.decided == "rejected: too broad"
    task.join(10)
    assert task.status == "failed" and task.error["code"] == "REJECTED" and "too broad" in task.error["message"]


def test_an_empty_plan_is_not_approved(ip):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["one"]}]))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", "work").join(10, settled=True)
    plan = task.widget.plan_view
    plan.steps.value = "  \n"
    plan.approve_button.click()
    assert "BAD_INPUT" in plan.error.value and plan.decided is None
    assert task.awaiting_plan_approval
    task.reject_plan("done testing")
    task.join(10)


# --- run view -------------------------------------------------------------------------


def test_the_run_view_follows_the_run_to_its_end(ip):
    task = waiting_task(ip, WRITE)
    view = task.widget
    assert "waiting" in view.header.value
    assert "write_file" in view.timeline.value
    task.pending[0].answer("once")
    task.join(10)
    snap = task.to_dict()
    assert "completed" in view.header.value
    assert view.budget.value == snap["budget"]["used"] and view.budget.max == snap["budget"]["ceiling"]
    assert view.budget_label.value == f"{snap['budget']['used']}/{snap['budget']['ceiling']} steps"
    assert view.budget.bar_style == "success"
    assert "pass" in view.outcome.value and "Wrote a.txt." in view.outcome.value
    assert "write_file" in view.decisions.value and "once" in view.decisions.value


def test_the_run_view_shows_the_error_code(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=[{"text": "x"}]))
    task = ip.run_cell_magic("apollia", "task clerk --max-steps 1", "work").join(10)
    assert "BUDGET_EXCEEDED: " in task.widget.outcome.value
    assert task.widget.budget.bar_style == "danger"


# --- chat view ------------------------------------------------------------------------


def followed(view: ChatView) -> ChatView:
    """Wait until the view has every event of the exchanges it follows (each follower ends with them)."""
    for future in view.followers:
        future.result(10)
    return view


def test_the_chat_view_streams_the_reply(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=[{"text": "Hello there, how can I help?"}]))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "hi")
    view = followed(exchange.widget)
    assert isinstance(view, ChatView)
    texts = [e for _, events in view.turns for e in events if e["type"] == "text"]
    assert len(texts) > 1 and view.reply_text == "Hello there, how can I help?"
    assert "Hello there, how can I help?" in view.transcript.value and "hi" in view.transcript.value
    assert "active" in view.header.value


def test_a_chat_card_counts_down_and_is_answered_by_click(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "write a")
    view = exchange.widget
    exchange.join(10, settled=True)
    [card] = exchange.pending
    card_view = card.widget
    assert "refused automatically in 4:" in card_view.state.value or "in 5:00" in card_view.state.value
    card_view.buttons["once"].click()
    assert exchange.join(10).reply == "Wrote a.txt."
    followed(view)
    assert card_view.frozen and view.cards[card.id].frozen  # both views of the card froze
    assert "Wrote a.txt." in view.transcript.value


def test_a_plan_in_chat_is_approved_in_the_chat_view(ip):
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["look"]}], actor=[{"text": "Looked."}]))
    exchange = ip.run_cell_magic("apollia", "chat clerk --plan", "tidy")
    view = followed(exchange.widget)
    assert view.plan_view is not None and view.plan_view.steps.value == "look"
    view.plan_view.approve_button.click()
    assert exchange.session.pending_plan is None
    followed(view)
    assert len(view.turns) == 2 and "Looked." in view.transcript.value


def test_the_chat_view_follows_its_exchange_past_a_pause(ip):
    import anyio

    from apollia_nb.runtime.models.scripted import ScriptedModel

    kr = runtime(ip)
    gate = kr.call(anyio.Event)
    turns = []

    async def model(role, messages, tools):
        turns.append(role)
        if len(turns) == 1:
            await gate.wait()  # the pause is asked for while this turn runs
            return {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
        return {"text": "finished after the pause"}

    kr.block(lambda: kr.rt.register_agent(manifest(), model=ScriptedModel.from_function(model)))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "start")
    view = exchange.widget
    exchange.session.pause()
    kr.call(gate.set)
    exchange.join(10, settled=True)
    view.followers[0].result(10)  # the first follower is done at the pause
    assert exchange.session.state == "paused"
    assert view.turns[0][1][-1]["type"] == "paused"

    resumed = exchange.session.resume()
    assert resumed.join(10).reply == "finished after the pause"
    followed(view)
    assert len(view.turns) == 1  # the same exchange went on, in the same turn
    assert [e["type"] for e in view.turns[0][1]].count("paused") == 1
    assert view.turns[0][1][-1]["type"] == "end"
    assert view.reply_text == "finished after the pause"
    assert "finished after the pause" in view.transcript.value
    assert "active" in view.header.value


# --- inbox and journal ----------------------------------------------------------------


def test_the_inbox_answers_cards_of_the_whole_home(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    first = ip.run_cell_magic("apollia", "task clerk --unattended", "one").join(10, settled=True)
    inbox = ip.run_line_magic("apollia", "pending")
    view = inbox.widget
    assert isinstance(view, InboxView) and len(view.waiting) == 1
    assert "1 pending decision" in view.title.value
    second = ip.run_cell_magic("apollia", "task clerk --unattended", "two").join(10, settled=True)
    assert len(view.waiting) == 2  # a new card appears in an open inbox
    views = {v.snap["task_id"]: v for v in view.cards.values()}
    views[first.id].buttons["refuse"].click()
    views[second.id].buttons["once"].click()
    assert first.join(10).status == "failed" and second.join(10).status == "completed"
    assert view.waiting == [] and "No pending decisions." in view.title.value
    bundle = inbox._repr_mimebundle_()
    assert bundle["text/plain"] == "No pending decisions."


def test_the_journal_view_shows_its_verification_state(ip):
    ip.run_cell_magic("apollia", "agent", manifest())
    ip.run_cell_magic("apollia", "task clerk", "done").join(10)
    report = ip.run_line_magic("apollia", "verify")
    view = report.widget
    assert isinstance(view, JournalView)
    assert "verified" in view.state.value and "latest entries" in view.state.value
    before = report.report["entries"]
    ip.run_cell_magic("apollia", "task clerk", "again").join(10)
    view.verify_button.click()
    assert report.ok and report.report["entries"] > before
    assert f"{report.report['entries']} entries" in view.state.value
