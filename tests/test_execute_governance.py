"""Executing code through a real Runtime: builtins that evaluate their words, and ``always``.

A scripted agent in developer mode sends shell commands to ``bash_executor`` in a real
workspace. A builtin that bash would evaluate is never allowed by a rule naming it, and
``always`` is never offered where the rule it writes would allow more than the question.
"""

from __future__ import annotations

import json

import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio


def decisions(rt, run_id):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == "decision"]


def actor(*commands: str) -> list[dict]:
    """One step that runs the commands one after another, then says it is done."""
    return [{"tool_calls": [call("bash_executor", command=c)]} for c in commands] + [{"text": "done"}]


async def developer_runtime(rt, *commands: str, allow: tuple[str, ...] = ()) -> None:
    rt.governance.set_developer_mode(True, by="test")
    for prefix in allow:
        rt.governance.add_rule("bash_executor", "allow", prefix=prefix, by="test")
    await rt.register_agent(manifest(actor=actor(*commands)))


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("printf -v 'a[$(touch MARKER)]' x", "printf"),
        ("test -v 'a[$(touch MARKER)]'", "test"),
        ("trap 'touch MARKER' EXIT", "trap"),
        ("command touch MARKER", "command"),
    ],
)
async def test_a_builtin_that_evaluates_its_words_is_asked_despite_an_allow_rule(home, command, rule):
    async with Runtime(home) as rt:
        await developer_runtime(rt, command, allow=(rule,))
        workspace = rt.agent("clerk").workspace
        handle = await rt.submit("clerk", "Run it")
        await handle.settled()
        assert handle.status == "waiting"
        [card] = handle.pending
        assert (card.line, card.answers) == (4, ("once", "refuse"))
        assert card.reason.startswith("executes code; not a single simple command")
        assert f"the shell builtin {rule!r} may evaluate its arguments as code" in card.reason
        assert not (workspace / "MARKER").exists()
        card.answer("refuse")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert not (workspace / "MARKER").exists()
        [decision] = decisions(rt, task.run_id)
        assert (decision["outcome"], decision["line"]) == ("ask", 4)


async def test_the_same_words_after_a_program_on_disk_run_as_allowed_and_evaluate_nothing(home):
    async with Runtime(home) as rt:
        await developer_runtime(rt, "/usr/bin/printf -v 'a[$(touch MARKER)]' x", allow=("/usr/bin/printf",))
        task = await (await rt.submit("clerk", "Run it"))
        assert task.status == "completed", task.error
        assert decisions(rt, task.run_id)[0]["outcome"] == "allow"
        assert not (rt.agent("clerk").workspace / "MARKER").exists()


async def test_a_deny_rule_sees_the_program_inside_an_evaluated_word(home):
    async with Runtime(home) as rt:
        await developer_runtime(rt, "printf -v 'a[$(rm -rf data)]' x", allow=("printf",))
        rt.governance.add_rule("bash_executor", "deny", prefix="rm", by="test")
        (rt.agent("clerk").workspace / "data").mkdir()
        task = await (await rt.submit("clerk", "Run it"))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert decisions(rt, task.run_id)[0]["line"] == 2
        assert (rt.agent("clerk").workspace / "data").is_dir()


@pytest.mark.parametrize(
    ("question", "wider"),
    [("env", "env rm -rf data"), ("find .", "find . -delete"), ("timeout 9", "timeout 9 rm -rf data")],
)
async def test_always_is_not_offered_where_its_rule_would_allow_more(home, question, wider):
    async with Runtime(home) as rt:
        await developer_runtime(rt, question, wider)
        workspace = rt.agent("clerk").workspace
        (workspace / "data").mkdir()
        (workspace / "data" / "keep.txt").write_text("keep")
        handle = await rt.submit("clerk", "Look, then clean up")
        await handle.settled()
        [card] = handle.pending
        assert card.arguments == {"command": question}
        assert (card.line, card.answers) == (4, ("once", "refuse"))
        assert "no always:" in card.reason and "would allow more than this command" in card.reason
        with pytest.raises(BadAnswer):
            card.answer("always")
        assert not [r for r in rt.governance.rules() if r.effect == "allow"]
        card.answer("once")
        await handle.settled()
        assert handle.status == "waiting", handle.status
        # The wider command is asked again, not allowed by anything the first answer left.
        [second] = [c for c in handle.pending if c.waiting]
        assert second.arguments == {"command": wider} and second.line == 4
        second.answer("refuse")
        task = await handle
        assert task.status == "failed"
        assert (workspace / "data" / "keep.txt").read_text() == "keep"
        assert [d["outcome"] for d in decisions(rt, task.run_id)] == ["ask", "ask"]


async def test_always_on_a_plain_reading_command_writes_its_rule_and_covers_it_next_time(home):
    async with Runtime(home) as rt:
        await developer_runtime(rt, "ls -la", "ls -la data")
        (rt.agent("clerk").workspace / "data").mkdir()
        handle = await rt.submit("clerk", "List")
        await handle.settled()
        [card] = handle.pending
        assert card.answers == ("once", "always", "refuse")
        card.answer("always")
        task = await handle
        assert task.status == "completed", task.error
        assert [(r.prefix, r.agent) for r in rt.governance.rules() if r.effect == "allow"] == [("ls -la", "clerk")]
        assert [(d["outcome"], d["line"]) for d in decisions(rt, task.run_id)] == [("ask", 4), ("allow", 4)]
