"""A batch's group answer approves only what the group showed: the cards that offer the answer, with the
arguments shown, as they were when the person looked; anything else is refused and answers nothing."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

from apollia_nb.errors import BadAnswer, BadInput, Conflict
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.batch import group_cards
from apollia_nb.runtime.models.scripted import ScriptedModel

pytestmark = pytest.mark.anyio
WRITER = manifest("writer")
_PATH = re.compile(r"Write (\S+) after (\w+)")


def writer_model(gates: dict[str, anyio.Event] | None = None) -> ScriptedModel:
    """Each item writes ``x`` into its path; an item whose gate is named waits for that gate first."""

    async def actor(role: str, messages: Any, tools: Any) -> Any:
        if role != "actor":
            return None
        found = _PATH.search(" ".join(m.content for m in messages if m.content))
        if found is None:
            return {"text": "no item"}
        path, gate = found.groups()
        if any(m.role == "tool" for m in messages):
            return {"text": f"wrote {path}"}
        if gates and gate in gates:
            await gates[gate].wait()
        return {"tool_calls": [call("write_file", path=path, content="x")]}

    return ScriptedModel.from_function(actor)


async def waiting(batch: Any, count: int) -> None:
    with anyio.fail_after(30):
        while len(batch.pending) < count:
            await anyio.sleep(0.02)


def answers_in_journal(rt: Any) -> list[tuple[str, str]]:
    return [(p["decision_id"], p["answer"]) for p in
            (json.loads(e.payload) for e in rt.journal.entries() if e.kind == "answer")]


async def test_always_over_a_group_never_reaches_a_card_that_does_not_offer_it_nor_other_arguments(home):
    """A file in the workspace and one in ``.git`` (which never offers ``always``): two groups, each shown with its
    arguments; ``always`` answers the first only, and is refused (answering nothing) on the second."""
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER, model=writer_model())
        batch = await rt.batch("writer", [{"path": "notes.txt"}, {"path": ".git/config"}],
                               goal="Write {path} after nothing")
        await waiting(batch, 2)
        groups = {c["arguments"]["path"]: g for g in batch.pending_groups() for c in g["calls"]}
        assert set(groups) == {"notes.txt", ".git/config"}
        notes, git = groups["notes.txt"], groups[".git/config"]
        assert notes["answers"] == ["once", "always", "refuse"] and git["answers"] == ["once", "refuse"]
        assert (notes["agent"], notes["tool"], notes["family"]) == ("writer", "write_file", "write")
        assert [c["arguments"] for c in notes["calls"]] == [{"path": "notes.txt", "content": "x"}]

        with pytest.raises(BadAnswer, match="not on offer"):
            batch.answer_group(git, "always", by="lead")
        assert len(batch.pending) == 2 and answers_in_journal(rt) == []  # nothing answered

        [notes_card] = notes["cards"]
        assert batch.answer_group(notes, "always", by="lead") == [notes_card.id]
        [left] = batch.pending
        assert left.arguments["path"] == ".git/config" and left.waiting
        assert answers_in_journal(rt) == [(notes_card.id, "always")]

        assert batch.answer_group(git, "refuse", by="lead") == [left.id]
        with anyio.fail_after(30):
            await batch
        rows = {r["key"]: r for r in batch.rows()}
        assert (rows[0]["status"], rows[1]["status"]) == ("completed", "failed")
        assert (home.path.parent / "work" / "notes.txt").read_text() == "x"
        assert not (home.path.parent / "work" / ".git" / "config").exists()
        assert rt.verify().ok


async def test_a_card_that_joins_the_group_after_it_was_shown_makes_the_answer_answer_nothing(home):
    gates = {"gate": anyio.Event()}
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER, model=writer_model(gates))
        batch = await rt.batch("writer", [{"path": "same.txt", "gate": "nothing"},
                                          {"path": "same.txt", "gate": "gate"}], goal="Write {path} after {gate}")
        await waiting(batch, 1)
        [shown] = batch.pending_groups()  # the person looks: one card
        assert len(shown["cards"]) == 1
        gates["gate"].set()  # a second card with the same question arrives before the click
        await waiting(batch, 2)
        [now] = batch.pending_groups()
        assert now["key"] == shown["key"] and now["digest"] != shown["digest"] and len(now["cards"]) == 2
        for answer in ("once", "always", "refuse"):  # refusing answers only what was shown, too
            with pytest.raises(Conflict, match="nothing was answered"):
                batch.answer_group(shown, answer, by="lead")
            with pytest.raises(Conflict):
                batch.answer_group(shown["digest"], answer, by="lead")
        assert len(batch.pending) == 2 and answers_in_journal(rt) == []

        assert sorted(batch.answer_group(now, "once", by="lead")) == sorted(c.id for c in now["cards"])
        with anyio.fail_after(30):
            await batch
        assert batch.counts()["completed"] == 2


async def test_a_card_answered_elsewhere_makes_the_group_answer_nothing_and_refuse_answers_the_group(home):
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER, model=writer_model())
        batch = await rt.batch("writer", [{"path": "a.txt"}] * 3, goal="Write {path} after nothing")
        await waiting(batch, 3)
        [shown] = batch.pending_groups()
        first, *others = shown["cards"]
        rt.answer(first.id, "once", by="someone-else")
        with pytest.raises(Conflict):
            batch.answer_group(shown, "refuse", by="lead")
        assert all(c.waiting for c in others) and answers_in_journal(rt) == [(first.id, "once")]

        [now] = batch.pending_groups()
        assert sorted(batch.answer_group(now, "refuse", by="lead")) == sorted(c.id for c in others)
        with anyio.fail_after(30):
            await batch
        assert sorted(r["status"] for r in batch.rows()) == ["completed", "failed", "failed"]
        assert rt.verify().ok


async def test_a_group_answer_needs_the_group_as_shown(home):
    async with Runtime(home) as rt:
        await rt.register_agent(WRITER, model=writer_model())
        batch = await rt.batch("writer", [{"path": "a.txt"}], goal="Write {path} after nothing")
        await waiting(batch, 1)
        for bad in ("write_file", "", None, {"tool": "write_file", "family": "write"}, "A" * 64):
            with pytest.raises(BadInput, match="pending_groups"):
                batch.answer_group(bad, "once", by="lead")
        with pytest.raises(Conflict):  # a digest of no group waiting
            batch.answer_group("0" * 64, "once", by="lead")
        with pytest.raises(TypeError):  # the call by tool and family is gone
            batch.answer_group("write_file", "write", "once")
        assert len(batch.pending) == 1 and answers_in_journal(rt) == []
        await batch.cancel()


@dataclass
class _Card:
    id: str
    agent: str
    tool: str = "write_file"
    family: str | None = "write"
    line: int = 6
    answers: tuple[str, ...] = ("once", "always", "refuse")
    arguments: dict[str, Any] = field(default_factory=lambda: {"path": "a.txt"})
    path: str | None = "a.txt"


def test_cards_group_only_when_everything_that_gives_an_answer_its_meaning_is_the_same():
    base = _Card("d-1", "clerk")
    neighbours = [
        _Card("d-2", "other"),  # another agent: an `always` would be another agent's consent
        _Card("d-3", "clerk", family="send"),  # another family: another consent
        _Card("d-4", "clerk", answers=("once", "refuse")),  # `always` not on offer
        _Card("d-5", "clerk", line=4),  # another line: `always` writes a rule, not a consent
        _Card("d-8", "clerk", tool="delete_file"),
    ]
    groups = group_cards([base, *neighbours])
    assert len(groups) == 6 and all(len(g["cards"]) == 1 for g in groups)
    # Other arguments, or the same words resolving elsewhere: the same question, each call listed as it is.
    [together] = group_cards([base, _Card("d-9", "clerk"), _Card("d-6", "clerk", arguments={"path": "b.txt"}),
                              _Card("d-7", "clerk", path="sub/a.txt")])
    assert [c.id for c in together["cards"]] == ["d-1", "d-9", "d-6", "d-7"]
    assert together["calls"] == [
        {"id": "d-1", "arguments": {"path": "a.txt"}, "path": "a.txt"},
        {"id": "d-9", "arguments": {"path": "a.txt"}, "path": "a.txt"},
        {"id": "d-6", "arguments": {"path": "b.txt"}, "path": "a.txt"},
        {"id": "d-7", "arguments": {"path": "a.txt"}, "path": "sub/a.txt"}]
    assert together["answers"] == ["once", "always", "refuse"]
    [alone] = group_cards([base])
    assert alone["key"] == together["key"] and alone["digest"] != together["digest"]
    four = [_Card("d-7", "clerk", path="sub/a.txt"), _Card("d-6", "clerk", arguments={"path": "b.txt"}),
            _Card("d-9", "clerk"), base]
    assert group_cards(four)[0]["digest"] == together["digest"]  # order does not matter
    # The digest covers each card's call: the same ids asking something else are another group as shown.
    changed = [base, _Card("d-9", "clerk"), _Card("d-6", "clerk", arguments={"path": "c.txt"}),
               _Card("d-7", "clerk", path="sub/a.txt")]
    assert group_cards(changed)[0]["digest"] != together["digest"]


def test_the_widget_shows_the_arguments_and_a_stale_click_answers_nothing(ip):  # noqa: F811
    ip.run_cell_magic("apollia", "agent", manifest("writer", actor=[
        {"tool_calls": [call("write_file", path="out.txt", content="x")]}, {"text": "Wrote."}]))
    ip.user_ns["items"] = [{"n": n} for n in range(2)]
    batch = ip.run_cell_magic("apollia", "batch writer --over items --concurrency 2", "Write item {n}")
    deadline = time.monotonic() + 30
    while sum(g["count"] for g in batch.pending_groups()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    batch.widget.refresh()
    [row] = batch.widget.groups.children
    heading, arguments = row.children
    assert "out.txt" in arguments.value and "writer" in heading.children[0].value
    [group] = batch.pending_groups()
    assert [c["arguments"] for c in group["calls"]] == [{"path": "out.txt", "content": "x"}] * 2
    assert group["count"] == 2
    rt = batch._bridge.rt
    batch._bridge.call(rt.answer, group["ids"][0], "once", by="someone-else")  # answered elsewhere
    heading.children[2].click()  # "always" on the row as drawn: refused, nothing answered
    assert "CONFLICT" in batch.widget.message.value
    [left] = batch.pending_groups()
    assert left["ids"] == group["ids"][1:]
    answers = batch._bridge.call(lambda: [json.loads(e.payload)["answer"] for e in rt.journal.entries()
                                          if e.kind == "answer"])
    assert answers == ["once"]
    [row] = batch.widget.groups.children  # drawn again with the group as it is now
    row.children[0].children[1].click()  # "once × 1"
    assert batch.widget.message.value == ""
    batch.join(timeout=30)
    assert batch.status == "completed"
