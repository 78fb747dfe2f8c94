"""The pure text and HTML of the notebook views (the fallbacks a saved notebook shows)."""

from __future__ import annotations

import datetime as dt

from apollia_nb.notebook import render

STATUS = {"home": "/h", "journal_seq": 42, "journal_head": "ab" * 32, "developer_mode": False,
          "policy": "none", "policy_reason": "no policy deposited"}

CARD = {
    "id": "pd-1", "run_id": "run-1", "task_id": None, "session_id": "chat-1", "agent": "clerk",
    "tool": "mcp:notes/search", "family": None, "arguments": {"query": "<b>q</b>"}, "answers": ["once", "refuse"],
    "reason": "unclassified tool", "line": 6, "call_id": "s1-1", "created_at": "2026-01-01T00:00:00Z",
    "hints": {"readOnlyHint": True}, "answer": None, "answered_by": None, "answered_at": None,
}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()


def test_status_line_names_home_head_devmode_and_policy():
    assert render.status_line(STATUS) == (
        "apollia: home /h · journal #42 abababababab · developer mode off · policy none")
    assert "journal empty" in render.status_line({**STATUS, "journal_seq": 0})
    assert "developer mode on" in render.status_line({**STATUS, "developer_mode": True})
    assert render.status_line({**STATUS, "policy": "accepted"}).endswith("policy accepted")
    refused = render.status_line({**STATUS, "policy": "refused", "policy_reason": "not signed"})
    assert refused.endswith("policy refused (not signed)")


def test_the_countdown_runs_from_the_card_creation_for_five_minutes():
    assert render.seconds_left("2026-01-01T00:00:00Z", T0, 300) == 300
    assert render.countdown_text("2026-01-01T00:00:00Z", T0 + 61, 300) == \
        "refused automatically in 3:59 unless answered"
    assert render.seconds_left("2026-01-01T00:00:00.500000Z", T0 + 400, 300) == 0
    assert render.countdown_text("2026-01-01T00:00:00Z", T0 + 300, 300).startswith("unanswered")


def test_a_card_shows_who_what_why_hints_and_only_its_answers():
    text = render.card_text(CARD, now=T0 + 10, timeout=300)
    assert "clerk → mcp:notes/search (unclassified)" in text
    assert "asked by line 6: unclassified tool" in text
    assert 'query = <b>q</b>' in text and "hints (not trusted)" in text
    assert "waiting (answers: once/refuse)" in text and "4:50" in text
    html = render.card_html(CARD, now=T0 + 10, timeout=300)
    assert "&lt;b&gt;q&lt;/b&gt;" in html and "<b>q</b>" not in html  # escaped
    assert "always" not in html and "unclassified" in html and "readOnlyHint" in html
    answered = {**CARD, "answer": "refuse", "answered_by": "ann", "answered_at": "2026-01-01T00:01:00Z"}
    assert "answered refuse by ann at 2026-01-01T00:01:00Z" in render.card_text(answered)
    assert "refused automatically" not in render.card_html(answered, now=T0, timeout=300)


def test_long_arguments_fold_but_stay_whole():
    html = render.arguments_html({"content": "y" * 1000, "path": "a.txt"})
    assert html.count("<details>") == 1 and "y" * 1000 in html and "1000 characters" in html


def test_task_text_lists_steps_calls_decisions_verdict_and_error():
    snap = {
        "id": "task-1", "run_id": "run-1", "agent": "clerk", "goal": "g", "status": "failed",
        "budget": {"used": 3, "ceiling": 3}, "warnings": [], "result": None, "awaiting_plan_approval": False,
        "steps": [{"index": 0, "description": "write", "status": "failed",
                   "tool_calls": [{"call_id": "c1", "tool": "write_file", "status": "refused",
                                   "error_code": "REFUSED"}]}],
        "verdict": None, "error": {"code": "REFUSED", "message": "write_file: refused by ann"},
    }
    decisions = [{"seq": 5, "tool": "write_file", "family": "write", "outcome": "ask", "line": 6,
                  "answer": "refuse", "answered_by": "ann"}]
    text = render.task_text(snap, decisions)
    assert text.splitlines()[0] == "Task task-1 (clerk): failed · steps 3/3 · run run-1"
    assert "write_file: refused REFUSED" in text
    assert "write_file (write): ask by line 6, answered refuse by ann" in text
    assert "error REFUSED: write_file: refused by ann" in text
    html = render.task_html(snap, (), decisions)
    assert "REFUSED: write_file" in html and "budget 3/3" in html and "width:100%" in html


def test_tables_count_their_rows():
    text = render.table_text(["a", "b"], [(1, None), (2, b"\x01")], "caption")
    assert text.splitlines()[0] == "caption" and text.endswith("(2 rows)") and "01" in text
    assert "1 row<" in render.table_html(["a"], [(1,)])


def test_replay_and_verify_words():
    result = {"run_id": "run-1", "verdict": "diverged", "responses": 2, "calls": 1, "entries": 9, "missing": [],
              "divergences": [{"position": 3, "kind": "tool_result", "call_id": "c1-1", "expected": "ok",
                               "found": "error"}]}
    assert "at 3 (tool_result, call c1-1): expected ok, found error" in render.replay_text(result)
    bad = {"ok": False, "entries": 4, "first_bad_seq": 5, "problem": "hash mismatch", "checked_checkpoints": 0}
    assert "FAILED at seq 5: hash mismatch (4 good leading entries)" in render.verify_text(bad, STATUS)
    assert "FAILED" in render.verify_html(bad, STATUS)


def test_a_servers_question_says_how_to_answer_it_with_values():
    question = {**CARD, "tool": "mcp:notes/elicitation/create", "hints": None, "request": "elicitation/create",
                "arguments": {"mode": "form", "message": "Which notebook?", "requestedSchema": {"type": "object"}}}
    assert 'card.answer("once", values={...})' in render.card_text(question)
    assert "values={...}" in render.card_html(question)
    assert "values=" not in render.card_text(CARD)  # a tool call's card: no form to fill in
    lookalike = {**question, "request": None}  # a tool call named like a question is not one
    assert "question from the server" not in render.card_text(lookalike)
    assert "question from the server" not in render.card_html(lookalike)
    url = {**question, "arguments": {"mode": "url", "message": "Sign in", "url": "https://example.test/"}}
    assert "values=" not in render.card_text(url)
    assert "values=" not in render.card_text({**question, "answer": "once", "answered_by": "ada"})
