"""The tour works whether the reader clicks the card or runs the cells: in a real Jupyter kernel (nbclient),
the card's `once` button is clicked right after the task cell, and then every later cell of the tour runs
as written, without an error. A different answer afterwards is refused in one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from notebook_fixtures import ip  # noqa: F401 - the fixture

TOUR = Path(__file__).resolve().parents[1] / "notebooks" / "01-tour.ipynb"
CLICK = """\
__task = _
__task.join(60, settled=True)
[__card] = __task.pending
__card.widget.buttons["once"].click()  # what the browser's click on the card runs in the kernel
"""


def text_of(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o["text"])
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
        elif o.get("output_type") == "error":
            out.append("\n".join(o["traceback"]))
    return "".join(out)


def test_clicking_once_and_then_running_every_next_cell_of_the_tour(tmp_path):
    nb = nbformat.read(TOUR, as_version=4)
    [at] = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith("%%apollia task")]
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(CLICK))  # the reader clicks before running on
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                client.execute_cell(cell, index)  # raises CellExecutionError on any error output
        [shown] = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("[card]")]
        assert "once by ann" in text_of(shown), text_of(shown)
        other = nbformat.v4.new_code_cell('card.answer("refuse")')
        nb.cells.append(other)
        with pytest.raises(CellExecutionError) as refused:
            client.execute_cell(other, len(nb.cells) - 1)
    [error] = [o for o in other.outputs if o["output_type"] == "error"]
    assert error["ename"] == "Conflict"
    assert len(error["traceback"]) == 1 and error["traceback"][0].startswith("CONFLICT: already answered once by ann at ")
    assert "Traceback" not in str(refused.value)
    done = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("task.status")]
    assert "'completed'" in text_of(done[0])


def test_a_card_answered_again_the_same_is_quiet_and_another_answer_is_one_line(ip):
    from apollia_nb.errors import Conflict
    from runtime_helpers import call, manifest

    ip.run_cell_magic("apollia", "agent", manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
    task = ip.run_cell_magic("apollia", "task clerk", "write").join(10, settled=True)
    [card] = task.pending
    assert card.answer("once") is card
    assert card.answer("once") is card  # again, the same: nothing changes
    assert task.join(10).status == "completed"
    with pytest.raises(Conflict) as other:
        card.answer("refuse")
    assert other.value._render_traceback_() == [
        f"CONFLICT: already answered once by {card.answered_by} at {card.answered_at}"]
    assert [c.answer_value for c in task.cards] == ["once"] and task.pending == []
    answers = [d for d in task.decisions() if d["answer"]]
    assert len(answers) == 1  # answered (and journaled) once


def test_a_failed_task_shows_the_step_it_failed_in_as_failed_not_running(ip):
    from runtime_helpers import call, manifest

    looking = [{"tool_calls": [call("list_dir", path=".")]}] * 5
    ip.run_cell_magic("apollia", "agent", manifest(actor=looking))
    task = ip.run_cell_magic("apollia", "task clerk --max-steps 3", "look around").join(10)
    assert task.status == "failed" and task.error["code"] == "BUDGET_EXCEEDED"
    assert [s["status"] for s in task.steps] == ["failed"]
    view = task.widget
    assert "running" not in view.timeline.value and "failed" in view.timeline.value
    assert "[failed] look around" in task._repr_mimebundle_()["text/plain"]
