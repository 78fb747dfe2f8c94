"""A tiny notebook run headless in a real kernel (nbclient): load, register, start, answer from code, await."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from runtime_helpers import call, manifest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def kernel_path(tmp_path, monkeypatch):
    """A ``python3`` kernel spec that runs this interpreter, found first on ``JUPYTER_PATH``."""
    prefix = tmp_path / "jupyter-prefix"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "python3"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    return prefix


def test_a_notebook_runs_a_governed_task_headless(home, kernel_path, tmp_path):
    agent = manifest("clerk", actor=[{"tool_calls": [call("write_file", path="summary.txt", content="ok")]},
                                     {"text": "Wrote summary.txt."}])
    cells = [
        '%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"',  # as the example notebooks begin
        "%%apollia agent\n" + agent,
        "%%apollia task clerk\nWrite the summary",
        "task = _\nawait task.settled()\nanswered = [card.answer('once') for card in task.pending]\nprint(len(answered), 'answered')",
        "task = await task\ntask.status",
        "%apollia devmode on",  # journaled after the run's own checkpoint: only closing covers it
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    work = tmp_path / "work"
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60,
                                     resources={"metadata": {"path": str(work)}})
    started = time.monotonic()
    client.execute()
    elapsed = time.monotonic() - started

    outputs = [cell.outputs for cell in nb.cells]
    status = "".join(o.get("text", "") for o in outputs[0] if o["output_type"] == "stream")
    assert status.startswith(f"apollia: home {home.path} · journal #1 ")  # what opening the new home wrote
    assert status.endswith(" · developer mode off · policy none\n") and status.count("\n") == 1
    assert "Agent clerk: active" in outputs[1][0]["data"]["text/plain"]
    [shown] = [o for o in outputs[2] if o["output_type"] in ("execute_result", "display_data")]
    assert WIDGET_MIME in shown["data"]
    assert {"text/plain", "text/html"} <= set(shown["data"])
    # Displayed when the task had just been submitted, updated in place when it completed:
    assert shown["data"]["text/plain"].startswith("Task task-")
    assert "(clerk): completed" in shown["data"]["text/plain"]
    assert "write_file (write): ask by line 6, answered once by ann" in shown["data"]["text/plain"]
    assert "Wrote summary.txt." in shown["data"]["text/html"]
    assert "".join(o.get("text", "") for o in outputs[3]).strip() == "1 answered"
    [result] = [o for o in outputs[4] if o["output_type"] == "execute_result"]
    assert result["data"]["text/plain"] == "'completed'"
    assert (work / "summary.txt").read_text() == "ok"
    assert elapsed < 45, f"the notebook took {elapsed:.1f} s"

    # The kernel has exited, closing its runtime: a checkpoint covers every entry.
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime import Runtime

    with Journal.open(home) as journal:
        first, *_, last = journal.entries()
        assert last.kind == "devmode_changed"
        assert (first.seq, first.kind) == (1, "home_file_created")
        assert f"journal #1 {first.hash.hex()[:12]} · " in status
        assert journal.checkpoints()[-1][0] == journal.head()[0]

    with Runtime.blocking(home) as rt:
        assert rt.verify().ok
        [(run_id, run_status)] = rt.journal.sql("SELECT run_id, status FROM runs")
        assert run_status == "completed"
        assert rt.replay(run_id).verdict == "identical"
