"""Offline replay: take a good trace, break one thing, and read the verdict.

Traces are built by hand as the runtime writes them (``Trace`` below): a list of
``(kind, payload)`` events that a test edits, then numbers and seals with
``Trace.entries()`` — so an edit made before sealing is a consistent rewrite
(the seal counts what is there) and an edit made after is a trace cut or holed.
The last tests run a real task through the runtime and replay its journal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from apollia_nb.journal.replay import DIVERGENCE_KINDS, Divergence, ReplayResult, replay_entries

RUN = "run-7f3a"
AGENT = "clerk"


# --------------------------------------------------------------------- building traces


@dataclass(frozen=True)
class E:
    """A journal entry as replay reads it."""

    seq: int
    kind: str
    payload: bytes
    run_id: str
    agent: str

    def data(self) -> dict[str, Any]:
        return json.loads(self.payload)


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest(output: Any) -> str:
    text = json.dumps(output, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def tool_call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": call_id, "name": name, "arguments": arguments}


@dataclass
class Trace:
    """A run's events in order; payloads are plain dicts a test may edit."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    turn: int = 0

    def add(self, kind: str, payload: dict[str, Any]) -> "Trace":
        self.events.append((kind, payload))
        return self

    def open(self, goal: str = "Summarise the notes") -> "Trace":
        return self.add("run_open", {"run_kind": "task", "goal": goal, "task_id": "task-1"})

    def status(self, status: str) -> "Trace":
        return self.add("task_status", {"task_id": "task-1", "status": status})

    def respond(self, role: str, *calls: dict[str, Any], text: str = "") -> "Trace":
        self.turn += 1
        payload: dict[str, Any] = {"role": role, "turn": self.turn, "text": text, "tool_calls": list(calls)}
        if role in ("planner", "critic"):  # structured answers, not tools
            payload["tool_calls"] = []
            payload["structured"] = list(calls)
        return self.add("model_response", payload)

    def decide(self, call: dict[str, Any], outcome: str = "allow", **changes: Any) -> "Trace":
        answers = ["once", "always", "refuse"] if outcome == "ask" else []
        payload = {"call_id": call["call_id"], "tool": call["name"], "family": "read",
                   "arguments": dict(call["arguments"]), "outcome": outcome, "line": 3,
                   "answers": answers, "reason": f"{outcome} by the test policy"}
        return self.add("decision", {**payload, **changes})

    def answer(self, call: dict[str, Any], answer: str = "once") -> "Trace":
        return self.add("answer", {"call_id": call["call_id"], "decision_id": f"d-{call['call_id']}",
                                   "answer": answer, "answered_by": "ana"})

    def start(self, call: dict[str, Any], **arguments: Any) -> "Trace":
        return self.add("tool_call", {"call_id": call["call_id"], "tool": call["name"],
                                      "arguments": arguments or dict(call["arguments"])})

    def result(self, call: dict[str, Any], output: Any, status: str = "ok", **extra: Any) -> "Trace":
        return self.add("tool_result", {"call_id": call["call_id"], "tool": call["name"], "status": status,
                                        "output": output, "output_digest": digest(output), **extra})

    def run(self, call: dict[str, Any], output: Any) -> "Trace":
        """An allowed call that ran: decision, start, result."""
        return self.decide(call).start(call).result(call, output)

    def finish(self, status: str = "completed") -> "Trace":
        return self.status(status)

    # ---- editing
    def index(self, kind: str, call_id: str | None = None, nth: int = 0) -> int:
        hits = [i for i, (k, p) in enumerate(self.events)
                if k == kind and (call_id is None or p.get("call_id") == call_id)]
        return hits[nth]

    def payload(self, kind: str, call_id: str | None = None, nth: int = 0) -> dict[str, Any]:
        return self.events[self.index(kind, call_id, nth)][1]

    def drop(self, kind: str, call_id: str | None = None) -> "Trace":
        del self.events[self.index(kind, call_id)]
        return self

    # ---- numbering
    def entries(self, *, seal: bool = True, status: str = "completed") -> list[E]:
        out = [E(i + 1, kind, canonical(payload), RUN, AGENT) for i, (kind, payload) in enumerate(self.events)]
        if seal:
            out.append(E(len(out) + 1, "run_seal", canonical({"status": status, "entries": len(out)}), RUN, AGENT))
        return out


READ = tool_call("c2-1", "read_file", path="notes.txt")
LIST = tool_call("c2-2", "list_dir", path=".")
WRITE = tool_call("c3-1", "write_file", path="summary.txt", content="All fine.")
NOTES = "Tuesday: all fine.\nWednesday: all fine."
LISTING = {"path": ".", "entries": [{"name": "notes.txt", "type": "file", "size": 39}]}


def good() -> Trace:
    """A completed task: a plan, two read calls, an asked write answered once, a passing critic.

    seq  1 run_open               12 model_response (actor, c3-1)
         2 task_status running    13 decision c3-1 (ask)
         3 model_response planner 14 task_status waiting
         4 plan                   15 answer c3-1 once
         5 model_response (actor) 16 task_status running
         6 decision c2-1          17 tool_call c3-1
         7 tool_call c2-1         18 tool_result c3-1
         8 tool_result c2-1       19 model_response (actor, text)
         9 decision c2-2          20 model_response critic
        10 tool_call c2-2         21 verdict
        11 tool_result c2-2       22 task_status completed
                                  23 run_seal (entries 22)
    """
    t = Trace().open().status("running")
    t.respond("planner", tool_call("p1", "submit_plan", steps=["Read the notes", "Write a summary"]))
    t.add("plan", {"task_id": "task-1", "steps": ["Read the notes", "Write a summary"], "attempt": 1})
    t.respond("actor", READ, LIST).run(READ, NOTES).run(LIST, LISTING)
    t.respond("actor", WRITE, text="Writing the summary.")
    t.decide(WRITE, "ask").status("waiting").answer(WRITE, "once").status("running")
    t.start(WRITE).result(WRITE, {"path": "summary.txt", "bytes": 9})
    t.respond("actor", text="Summary written.")
    t.respond("critic", tool_call("v1", "submit_verdict", verdict="pass"))
    t.add("verdict", {"task_id": "task-1", "verdict": "pass", "reasons": [], "attempt": 1})
    return t.finish("completed")


def replay(entries: list[E]) -> ReplayResult:
    return replay_entries(RUN, entries)


def only(result: ReplayResult) -> Divergence:
    assert len(result.divergences) == 1, result.to_dict()
    return result.divergences[0]


# --------------------------------------------------------------------- identical


def test_the_good_trace_is_identical():
    entries = good().entries()
    assert [e.kind for e in entries][:3] == ["run_open", "task_status", "model_response"]
    assert entries[-1].data() == {"status": "completed", "entries": 22}
    result = replay(entries)
    assert result.verdict == "identical", result.to_dict()
    assert (result.divergences, result.missing) == ((), ())
    assert (result.responses, result.calls, result.entries) == (5, 3, 23)
    assert result.exit_code == 0


def test_refused_and_skipped_calls_are_identical():
    shell = tool_call("c1-1", "bash_executor", command="rm -rf build")
    later = tool_call("c1-2", "read_file", path="notes.txt")
    t = Trace().open().status("running").respond("actor", shell, later)
    t.decide(shell, "refuse", family="execute", line=1)
    t.result(shell, None, status="refused", error_code="REFUSED")  # refused: no tool_call
    t.result(later, None, status="skipped", error_code="REFUSED")  # never ran: the step failed first
    t.finish("failed")
    result = replay(t.entries(status="failed"))
    assert result.verdict == "identical", result.to_dict()
    assert result.calls == 2


def test_an_answered_refusal_and_an_unknown_tool_are_identical():
    send = tool_call("c1-1", "http_request", url="https://example.org")
    bogus = tool_call("c2-1", "no_such_tool", x=1)
    t = Trace().open().respond("actor", send)
    t.decide(send, "ask").answer(send, "refuse").result(send, None, status="refused", error_code="REFUSED")
    t.respond("actor", bogus).result(bogus, None, status="error", error_code="UNKNOWN_TOOL")  # never decided
    t.respond("actor", text="Gave up.").finish()
    assert replay(t.entries()).verdict == "identical"


def test_a_result_truncated_in_the_journal_keeps_the_digest_of_the_whole():
    big = "x" * 40_000
    t = good()
    result = t.payload("tool_result", "c2-1")
    result["output"] = {"truncated": True, "size": len(json.dumps(big)), "head": json.dumps(big)[:16_384]}
    result["output_digest"] = digest(big)
    assert digest(result["output"]) != result["output_digest"]
    assert replay(t.entries()).verdict == "identical"


def test_the_runtime_may_fill_in_declared_defaults_before_deciding():
    bare = tool_call("c2-2", "list_dir")  # the model left out path; the runtime fills in "."
    t = good()
    response = t.payload("model_response", nth=1)
    response["tool_calls"][1] = bare
    assert replay(t.entries()).verdict == "identical"


# --------------------------------------------------------------------- each divergence kind


def test_a_call_nobody_handled_is_a_missing_output_at_the_next_response():
    t = good()
    for kind in ("decision", "tool_call", "tool_result"):
        t.drop(kind, "c2-2")
    entries = t.entries()
    result = replay(entries)
    assert result.verdict == "diverged" and result.exit_code == 1
    d = only(result)
    next_response = [e.seq for e in entries if e.kind == "model_response"][2]
    assert (d.kind, d.position, d.call_id) == ("missing_output", next_response, "c2-2")
    assert (d.expected, d.found) == ("an output of list_dir", "the next model response")


def test_a_call_asked_last_with_no_output_is_missing_at_the_seal():
    t = Trace().open().respond("actor", tool_call("c1-1", "read_file", path="summary.txt")).finish("failed")
    entries = t.entries(status="failed")
    d = only(replay(entries))
    assert (d.kind, d.position, d.call_id) == ("missing_output", 4, "c1-1")
    assert (d.expected, d.found) == ("an output of read_file", "the end of the run")


def test_a_second_output_is_an_extra_output():
    t = good()
    at = t.index("tool_result", "c2-1") + 1
    t.events.insert(at, ("tool_result", dict(t.payload("tool_result", "c2-1"))))
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("extra_output", at + 1, "c2-1")
    assert (d.expected, d.found) == ("one output", "a second output")


def test_an_output_no_response_asked_for_is_an_extra_output():
    t = good()
    ghost = tool_call("c9-9", "delete_file", path="notes.txt")
    at = t.index("tool_result", "c2-2") + 1
    t.events[at:at] = [("tool_call", {"call_id": "c9-9", "tool": "delete_file", "arguments": ghost["arguments"]})]
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("extra_output", at + 1, "c9-9")
    assert (d.expected, d.found) == ("no call", "delete_file started")


def test_a_tool_that_ran_although_refused_is_an_extra_output():
    t = good()
    t.payload("decision", "c2-1")["outcome"] = "refuse"
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("extra_output", 7, "c2-1")
    assert (d.expected, d.found) == ("no start (the call was refused)", "read_file started")


def test_an_answer_to_a_call_that_was_not_asked_is_an_extra_output():
    t = good()
    t.events.insert(t.index("tool_call", "c2-1"), ("answer", {"call_id": "c2-1", "decision_id": "d-x",
                                                              "answer": "once", "answered_by": "ana"}))
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("extra_output", 7, "c2-1")
    assert d.expected == "no answer (the decision was 'allow')"


def test_a_tool_started_with_other_arguments_is_an_arguments_mismatch():
    t = good()
    t.payload("tool_call", "c2-1")["arguments"] = {"path": "../secrets.txt"}
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("arguments_mismatch", 7, "c2-1")
    assert d.expected == {"tool": "read_file", "arguments": {"path": "notes.txt"}}
    assert d.found == {"tool": "read_file", "arguments": {"path": "../secrets.txt"}}


def test_a_decision_on_other_arguments_or_another_tool_is_an_arguments_mismatch():
    t = good()
    t.payload("decision", "c3-1")["arguments"] = {"path": "summary.txt", "content": "Something else."}
    t.payload("decision", "c2-2")["tool"] = "delete_file"
    result = replay(t.entries())
    assert [(d.kind, d.position, d.call_id) for d in result.divergences] == [
        ("arguments_mismatch", 9, "c2-2"),
        ("arguments_mismatch", 13, "c3-1"),  # the decision differs from the request
        ("arguments_mismatch", 17, "c3-1"),  # and the tool started with other arguments than decided
    ]
    assert result.divergences[0].found == {"tool": "delete_file", "arguments": {"path": "."}}


def test_calls_handled_out_of_the_order_asked_is_an_order_divergence():
    t = good()
    first = t.events[5:8]  # c2-1: decision, tool_call, tool_result
    t.events[5:11] = t.events[8:11] + first
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("order", 6, "c2-2")
    assert (d.expected, d.found) == ("c2-1 handled first", "c2-2 handled first")


def test_a_result_before_its_start_is_an_order_divergence():
    t = good()
    start, result = t.index("tool_call", "c2-1"), t.index("tool_result", "c2-1")
    t.events[start], t.events[result] = t.events[result], t.events[start]
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("order", 7, "c2-1")
    assert (d.expected, d.found) == ("the call started before its output", "an output first")


def test_a_tool_started_without_its_decision_or_its_answer_is_an_order_divergence():
    t = good()
    t.drop("decision", "c2-1")
    t.drop("answer", "c3-1")
    result = replay(t.entries())
    assert [(d.kind, d.position, d.call_id, d.found) for d in result.divergences] == [
        ("order", 6, "c2-1", "read_file started undecided"),
        ("order", 15, "c3-1", "write_file started unanswered"),
    ]


def test_an_output_after_the_next_response_is_an_order_divergence_not_a_missing_one():
    t = good()
    late = t.events.pop(t.index("tool_result", "c2-2"))
    t.events.insert(t.index("model_response", nth=2) + 1, late)
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("order", 12, "c2-2")
    assert d.expected == "a call of the latest response"


def test_an_output_that_does_not_hash_to_its_digest_is_an_output_digest_divergence():
    t = good()
    t.payload("tool_result", "c2-1")["output"] = "Tuesday: all on fire."
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("output_digest", 8, "c2-1")
    assert d.expected == digest(NOTES)
    assert d.found == digest("Tuesday: all on fire.")


def test_an_answer_before_its_decision_is_an_order_divergence():
    t = good()
    answer = t.events.pop(t.index("answer", "c3-1"))
    t.events.insert(t.index("decision", "c3-1"), answer)
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("order", 13, "c3-1")
    assert (d.expected, d.found) == ("the decision before its answer", "an answer 'once' first")


def test_a_second_decision_and_a_repeated_call_id_are_extra_outputs():
    t = good()
    t.events.insert(t.index("decision", "c2-1") + 1, ("decision", dict(t.payload("decision", "c2-1"))))
    t.payload("model_response", nth=3)["tool_calls"] = [READ]  # asks c2-1 again, which is then never handled
    result = replay(t.entries())
    assert [(d.kind, d.position, d.call_id, d.found) for d in result.divergences] == [
        ("extra_output", 7, "c2-1", "a second decision"),
        ("extra_output", 20, "c2-1", "a repeated call id"),
        ("missing_output", 21, "c2-1", "the next model response"),
    ]


def test_an_output_naming_another_tool_is_an_arguments_mismatch():
    t = good()
    t.payload("tool_result", "c2-2")["tool"] = "delete_file"
    d = only(replay(t.entries()))
    assert (d.kind, d.position, d.call_id) == ("arguments_mismatch", 11, "c2-2")
    assert (d.expected, d.found) == ({"tool": "list_dir"}, {"tool": "delete_file"})


def test_one_edit_per_kind_yields_exactly_the_kinds_the_module_names():
    t = good()
    t.payload("tool_result", "c2-1")["output"] = "changed"                       # output_digest
    t.payload("tool_call", "c2-2")["arguments"] = {"path": "/"}                  # arguments_mismatch
    t.drop("answer", "c3-1")                                                     # order
    t.payload("model_response", nth=3)["tool_calls"] = [tool_call("c4-1", "read_file", path="x")]  # missing_output
    t.add("tool_result", {"call_id": "c9-9", "tool": "x", "status": "ok", "output": 1,
                          "output_digest": digest(1)})                           # extra_output
    t.payload("model_response", nth=3).update(reasoning=[{"source": "thinking", "text": "changed"}],
                                              reasoning_digest=digest([]))      # reasoning_digest
    result = replay(t.entries())
    assert [d.kind for d in result.divergences] == [
        "output_digest", "arguments_mismatch", "order", "reasoning_digest", "missing_output", "extra_output"]
    assert sorted(DIVERGENCE_KINDS) == sorted(d.kind for d in result.divergences)


def test_several_divergences_are_all_reported_in_trace_order():
    t = good()
    t.payload("tool_result", "c3-1")["output"] = {"path": "summary.txt", "bytes": 9000}
    t.payload("tool_call", "c2-2")["arguments"] = {"path": "/"}
    for kind in ("decision", "tool_call", "tool_result"):
        t.drop(kind, "c2-1")
    result = replay(t.entries())
    assert result.verdict == "diverged"
    assert [(d.kind, d.position, d.call_id) for d in result.divergences] == [
        ("arguments_mismatch", 7, "c2-2"),
        ("missing_output", 9, "c2-1"),
        ("output_digest", 15, "c3-1"),
    ]


# --------------------------------------------------------------------- incomplete


def test_a_trace_without_its_start_is_incomplete():
    t = good()
    t.drop("run_open")
    result = replay(t.entries())
    assert result.verdict == "incomplete" and result.exit_code == 2
    assert result.missing == ("the trace lacks its start (run_open)",)


def test_a_run_cut_short_is_incomplete():
    entries = good().entries()[:11]  # stopped after c2-2's result: no seal
    result = replay(entries)
    assert result.verdict == "incomplete"
    assert result.missing == ("the trace lacks its end (run_seal)",)
    assert result.divergences == ()


def test_a_run_cut_while_a_tool_ran_lacks_its_end_and_that_output():
    result = replay(good().entries()[:17])  # write_file started, nothing after
    assert result.missing == ("the trace lacks its end (run_seal)",
                              "call c3-1 (write_file) started and has no output")


def test_a_seal_counting_more_entries_than_present_is_incomplete():
    entries = good().entries()
    del entries[12]  # the decision on c3-1, from the middle
    result = replay(entries)
    assert result.verdict == "incomplete"
    assert result.missing == ("the seal counts 22 entries before it, the trace has 21",)


def test_a_tool_that_started_and_has_no_result_is_incomplete():
    t = good()
    t.drop("tool_result", "c3-1")
    result = replay(t.entries())  # sealed consistently, but the output is not there
    assert result.verdict == "incomplete"
    assert result.missing == ("call c3-1 (write_file) started and has no output",)


def test_incomplete_wins_over_diverged_and_keeps_the_divergences():
    t = good()
    t.payload("tool_result", "c2-1")["output"] = "tampered"
    result = replay(t.entries()[:15])
    assert result.verdict == "incomplete" and result.exit_code == 2
    assert [(d.kind, d.position) for d in result.divergences] == [("output_digest", 8)]


def test_no_entries_at_all_is_incomplete():
    result = replay([])
    assert result.verdict == "incomplete"
    assert result.missing == ("the trace lacks its start (run_open)", "the trace lacks its end (run_seal)")


# --------------------------------------------------------------------- input and output


def test_entries_given_out_of_order_are_sorted():
    entries = good().entries()
    tampered = dataclasses.replace(entries[7], payload=canonical({**entries[7].data(), "output": "x"}))
    broken = entries[:7] + [tampered] + entries[8:]
    for seed in range(5):
        shuffled = list(entries)
        random.Random(seed).shuffle(shuffled)
        assert replay(shuffled) == replay(entries)
        random.Random(seed).shuffle(broken)
        assert replay(broken).divergences[0].position == 8


def test_the_exit_code_follows_the_verdict():
    t = good()
    assert replay(t.entries()).exit_code == 0
    t.payload("tool_result", "c2-1")["output"] = "x"
    assert replay(t.entries()).exit_code == 1
    assert replay(t.entries()[:-1]).exit_code == 2


def test_to_dict_is_json_serialisable():
    t = good()
    t.payload("tool_call", "c2-1")["arguments"] = {"path": "élan.txt"}
    result = replay(t.entries()[:-1])
    data = json.loads(json.dumps(result.to_dict()))
    assert data["run_id"] == RUN and data["verdict"] == "incomplete"
    assert data["divergences"] == [{
        "position": 7, "kind": "arguments_mismatch", "call_id": "c2-1",
        "expected": {"tool": "read_file", "arguments": {"path": "notes.txt"}},
        "found": {"tool": "read_file", "arguments": {"path": "élan.txt"}},
    }]
    assert data["missing"] == ["the trace lacks its end (run_seal)"]
    assert (data["responses"], data["calls"], data["entries"]) == (5, 3, 22)


# --------------------------------------------------------------------- a real journal


@pytest.mark.anyio
async def test_a_real_run_replays_identical_and_a_tampered_copy_diverges(home):
    from apollia_nb.runtime import Runtime
    from runtime_helpers import call, manifest

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("read_file", path="note.txt"), call("list_dir")]}, {"text": "Read it."}],
            critic=[{"verdict": "pass"}],
        ))
        (rt.agent("clerk").workspace / "note.txt").write_text("all fine")
        task = await (await rt.submit("clerk", "Read the note"))
        assert task.status == "completed", task.error
        result = rt.replay(task.run_id)
        assert result.verdict == "identical", result.to_dict()
        assert result.calls == 2 and result.exit_code == 0
        entries = rt.journal.entries(run_id=task.run_id)

    assert [e.kind for e in entries].count("tool_result") == 2
    first = next(e for e in entries if e.kind == "tool_result")
    recorded = json.loads(first.payload)
    assert recorded["output"] == "all fine"
    forged = dataclasses.replace(first, payload=canonical({**recorded, "output": "all on fire"}))
    copy = [forged if e.seq == first.seq else e for e in entries]
    result = replay_entries(task.run_id, copy)
    assert result.verdict == "diverged" and result.exit_code == 1
    d = only(result)
    assert (d.kind, d.position, d.call_id) == ("output_digest", first.seq, recorded["call_id"])
    assert (d.expected, d.found) == (recorded["output_digest"], digest("all on fire"))


@pytest.mark.anyio
@pytest.mark.parametrize("answer, status", [("once", "completed"), ("refuse", "failed")])
async def test_real_runs_with_an_answered_card_replay_identical(home, answer, status):
    from apollia_nb.runtime import Runtime
    from runtime_helpers import call, manifest

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("write_file", path="a.txt", content="hi"), call("list_dir")]},
                   {"text": "Wrote it."}],
            critic=[{"verdict": "pass"}],
        ))
        handle = await rt.submit("clerk", "Write a file")
        await handle.settled()
        handle.pending[0].answer(answer)
        task = await handle
        assert task.status == status
        statuses = [json.loads(e.payload)["status"] for e in rt.journal.entries(run_id=task.run_id)
                    if e.kind == "tool_result"]
        assert statuses == (["ok", "ok"] if answer == "once" else ["refused", "skipped"])
        result = rt.replay(task.run_id)
        assert result.verdict == "identical", result.to_dict()


def test_the_null_digest_constant_is_the_digest_of_no_output():
    from apollia_nb.runtime.governed import NULL_DIGEST
    from apollia_nb.runtime.tools import output_digest

    assert NULL_DIGEST == output_digest(None)


def _server_request_trace(*, inside: bool) -> Trace:
    """A call whose MCP server asked a question while it ran (``caused_by``), or after it ended."""
    outer = tool_call("c1-1", "mcp:vault/login")
    asked = tool_call("req-1", "mcp:vault/elicitation/create", mode="form", message="Sign in")
    t = Trace().open().status("running").respond("actor", outer).decide(outer).start(outer)
    request = [("decision", {"call_id": "req-1", "tool": asked["name"], "family": None,
                             "arguments": dict(asked["arguments"]), "outcome": "ask", "line": 0,
                             "answers": ["once", "refuse"], "reason": "the server asks", "caused_by": "c1-1"}),
               ("answer", {"call_id": "req-1", "decision_id": "pd-1", "answer": "once", "answered_by": "ana",
                           "values": {"user": "ada", "password": "[redacted]"}}),
               ("tool_progress", {"call_id": "c1-1", "tool": outer["name"], "progress": 1}),
               ("tool_result", {"call_id": "req-1", "tool": asked["name"], "status": "ok",
                                "output": {"action": "accept"}, "output_digest": digest({"action": "accept"})})]
    if inside:
        for kind, payload in request:
            t.add(kind, payload)
        t.result(outer, "signed in")
    else:
        t.result(outer, "signed in")
        for kind, payload in request:
            t.add(kind, payload)
    return t.respond("actor", text="in").finish()


def test_a_servers_request_inside_its_call_is_identical_and_outside_it_is_out_of_order():
    assert replay_entries(RUN, _server_request_trace(inside=True).entries()).verdict == "identical"
    late = replay_entries(RUN, _server_request_trace(inside=False).entries())
    assert late.verdict == "diverged"
    assert {(d.kind, d.call_id) for d in late.divergences} == {("order", "req-1")}
    twice = _server_request_trace(inside=True)
    twice.events.insert(twice.index("tool_result", "req-1"), twice.events[twice.index("answer", "req-1")])
    again = replay_entries(RUN, twice.entries())
    assert [(d.kind, d.found) for d in again.divergences] == [("order", "answer")]
