"""`%%apollia batch`: in IPython (the handle, its groups, its results) and rendered in a real kernel."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from batch_helpers import GOAL, item_frame
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WRITER = manifest("writer", actor=[{"tool_calls": [call("write_file", path="out.txt", content="x")]},
                                   {"text": "Wrote."}])


def test_the_magic_runs_a_batch_over_a_variable_and_answers_a_group(ip):  # noqa: F811
    ip.run_cell_magic("apollia", "agent", WRITER)
    ip.user_ns["frame"] = item_frame(6, every=1)
    batch = ip.run_cell_magic("apollia", "batch writer --over frame --concurrency 2", GOAL)
    assert batch.widget is not None  # the live view exists from the start
    deadline = time.monotonic() + 30
    while batch.counts()["waiting"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    [group] = batch.pending_groups()
    assert (group["tool"], group["family"], group["count"]) == ("write_file", "write", 6)
    assert "write_file (write) × 6" in repr(batch)
    batch.widget.refresh()
    [row] = batch.widget.groups.children
    heading, arguments = row.children
    assert "out.txt" in arguments.value  # the arguments the answer applies to are shown
    assert [b.description for b in heading.children[1:]] == ["once × 6", "always", "refuse × 6"]
    heading.children[2].click()  # "always": the whole group is released
    batch.join(timeout=30)
    results = batch.results()
    assert batch.status == "completed" and list(results["status"]) == ["completed"] * 6
    assert batch.widget.bar.value == 6 and batch.widget.bar.bar_style == "success"
    assert list(results["key"]) == [f"row-{i}" for i in range(6)]

    with pytest.raises(Exception, match="no variable 'missing'"):
        ip.run_cell_magic("apollia", "batch writer --over missing", GOAL)
    with pytest.raises(Exception, match="BAD_INPUT"):
        ip.run_cell_magic("apollia", "batch writer --over frame", "Use {colour}")


nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def test_the_progress_widget_is_rendered_in_a_real_kernel(home, tmp_path, monkeypatch):
    prefix = tmp_path / "jupyter-prefix"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "python3"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    cells = [
        "%load_ext apollia_nb",
        "%%apollia agent\n" + manifest("clerk"),
        "import pandas as pd\nitems = pd.DataFrame({'path': ['a.md', 'b.md', 'c.md']})",
        "%%apollia batch clerk --over items --concurrency 2\nSummarise {path}",
        "batch = _\nbatch = await batch\nprint(batch.status, list(batch.results()['goal']))",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60,
                                     resources={"metadata": {"path": str(tmp_path / "work")}})
    client.execute()
    [shown] = [o for o in nb.cells[3].outputs if o["output_type"] in ("execute_result", "display_data")]
    assert WIDGET_MIME in shown["data"] and {"text/plain", "text/html"} <= set(shown["data"])
    assert shown["data"]["text/plain"].startswith("Batch batch-")
    assert "completed · done 3 / 3" in shown["data"]["text/plain"]  # brought up to date when awaited
    printed = "".join(o.get("text", "") for o in nb.cells[4].outputs if o["output_type"] == "stream")
    assert printed.strip() == "completed ['Summarise a.md', 'Summarise b.md', 'Summarise c.md']"
