"""`Runtime.blocking()`: plain synchronous Python, with cards answered from code."""

from __future__ import annotations

from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest


def test_blocking_runtime_runs_a_task_that_asks_and_finishes_it(home):
    with Runtime.blocking(home.path) as rt:
        rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]},
                                          {"text": "ok"}]))
        task = rt.run("clerk", "write a.txt")  # returns once a person is needed
        assert task.status == "waiting"
        [card] = task.pending
        assert card.tool == "write_file"
        rt.answer(card.id, "once", by="script")
        task = rt.wait(task)
        assert (task.status, task.result) == ("completed", "ok")
        assert rt.verify().ok
    # Closed: the home can be owned again.
    with Runtime.blocking(home.path) as rt:
        assert [a.name for a in rt.agents()] == ["clerk"]
