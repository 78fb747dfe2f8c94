"""The apollia panel in a real browser: Debian's Chromium, driven by playwright-core, against a
real JupyterLab started from a fresh virtual environment that holds only the built wheel.

The browser opens a notebook, opens the panel with its shortcut (it says how to load the
extension, which this kernel has not loaded yet), runs every cell: the extension loads,
an agent is registered, a task starts and asks before it writes, and the next cell
``await``s the task — the kernel's main shell is busy. While it is, the panel shows the
card (and its badge and notification), and a click on ``once`` there answers it: the busy
cell finishes with the run completed, the cell's own card shows the answer, and the
journal has it (in the panel's entries of the run, in SQL, and verified offline).
Screenshots of the panel are saved under ``.test-artifacts/`` (the test prints where).

Installed by ``dev/install-test-browser.sh`` (``dev/test.sh`` runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".test-peers" / "playwright" / "node_modules" / "playwright-core"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / ".test-artifacts"
DRIVER = Path(__file__).with_name("lab_panel_browser.mjs")
DEADLINE = 120.0

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and PLAYWRIGHT.is_dir()),
    reason="needs Chromium and playwright-core: run `bash dev/install-test-browser.sh`")

MANIFEST = '''%%apollia agent
name = "clerk"
description = "Keeps the notes folder tidy"
instructions = "You keep the notes folder tidy."

[model]
provider = "scripted"

[[model.script.planner]]
steps = ["Read the meeting notes", "Write a summary file"]

[[model.script.actor]]
tool_calls = [{ name = "read_file", arguments = { path = "meeting.txt" } }]

[[model.script.actor]]
text = "The notes say the launch moves to Friday."

[[model.script.actor]]
tool_calls = [{ name = "write_file", arguments = { path = "summary.txt", content = "Launch moves to Friday." } }]

[[model.script.actor]]
text = "Wrote summary.txt."

[[model.script.critic]]
verdict = "pass"

[tools]
required = ["read_file", "write_file"]

[workspace]
root = "notes"'''


def _notebook(work: Path) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    cells = [
        f"import os, pathlib\nwork = pathlib.Path({str(work)!r})\nos.environ['APOLLIA_HOME'] = str(work / 'home')\n"
        "os.chdir(work)\n(work / 'notes').mkdir(exist_ok=True)\n"
        "(work / 'notes' / 'meeting.txt').write_text('Launch moved from Wednesday to Friday.\\n');",
        '%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"',
        MANIFEST,
        "%%apollia task clerk\nSummarise the meeting notes into summary.txt",
        'task = _\nresult = await task\nprint("RUN", result.status, result.result)',
        "%%apollia sql\nSELECT tool, answer, answered_by FROM decisions WHERE tool = 'write_file'",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb, {"TASK_CELL": 3, "AWAIT_CELL": 4, "SQL_CELL": 5}


@pytest.fixture
def lab(wheel_venv, tmp_path):
    """``jupyter lab`` of the fresh venv: no browser, 127.0.0.1, a random port, a token, a temporary root."""
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    nb, cells = _notebook(work)
    nbformat.write(nb, root / "panel.ipynb")
    token = uuid.uuid4().hex
    runtime_dir = tmp_path / "runtime"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "APOLLIA")) and k != "PYTHONPATH"}
    env.update({
        "JUPYTER_RUNTIME_DIR": str(runtime_dir), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_PLATFORM_DIRS": "1",
        "IPYTHONDIR": str(tmp_path / "ipython"), "TMPDIR": str(tmp_path),
        "APOLLIA_HOME": str(tmp_path / "unused-home"),
        "PATH": f"{wheel_venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
    })
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [str(wheel_venv / "bin" / "python"), "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        info_file = runtime_dir / f"jpserver-{process.pid}.json"
        end = time.monotonic() + DEADLINE
        while not info_file.exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < end, "the server did not start"
            time.sleep(0.1)
        info = json.loads(info_file.read_text())
        yield {"url": info["url"], "token": token, "process": process, "work": work, "cells": cells,
               "tmp": tmp_path, "log": log_path, "venv": wheel_venv}
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
        log.close()


def test_once_clicked_in_the_panel_answers_while_a_cell_awaits_the_task(lab, monkeypatch):
    # The server runs the wheel's code, not this clone's.
    probe = subprocess.run([str(lab["venv"] / "bin" / "python"), "-c", "import apollia_nb; print(apollia_nb.__file__)"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=lab["tmp"])
    assert str(lab["venv"]) in probe.stdout, probe

    ARTIFACTS.mkdir(exist_ok=True)
    user_data = lab["tmp"] / "chromium-profile"  # a new profile for every run
    env = {**os.environ, "LAB_URL": lab["url"], "LAB_TOKEN": lab["token"], "NOTEBOOK": "panel.ipynb",
           "PLAYWRIGHT_CORE": str(PLAYWRIGHT), "USER_DATA_DIR": str(user_data), "ARTIFACTS": str(ARTIFACTS),
           **{k: str(v) for k, v in lab["cells"].items()}}
    started = time.monotonic()
    ran = subprocess.run(["node", str(DRIVER)], capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - started
    lines = ran.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {}
    print(f"\npanel screenshots: {ARTIFACTS / 'panel-waiting.png'}, {out.get('screenshot')} (browser part {took:.1f} s)")
    assert ran.returncode == 0 and out.get("ok"), (ran.stderr[-3000:], json.dumps(out, indent=1)[:6000],
                                                   lab["log"].read_text()[-3000:])

    # The command, in the palette with its shortcut; the panel said how to load the extension.
    assert out["command"] == {"has": True, "label": "Open the apollia panel", "keys": ["Alt Shift P"]}
    assert "%load_ext apollia_nb" in out["notLoaded"]
    # The card waited in the panel, in full, while the awaiting cell was busy; badge and notification.
    assert "*" in out["busyBeforeClick"] and "*" in out["busyAtClick"], out
    card = out["cardText"]
    for part in ("clerk", "write_file", "write", "summary.txt", "Launch moves to Friday.", "once", "always"):
        assert part in card, (part, card)
    assert out["badge"] == "1"
    assert out["notification"] and "clerk asks to use write_file" in out["notification"], out["notification"]
    # One answer, frozen in every view: the panel, the cell's card; the busy cell finished.
    assert out["panelAnswered"].startswith("answered once by ann at "), out["panelAnswered"]
    assert "RUN completed Wrote summary.txt." in out["awaitOutput"], out["awaitOutput"]
    assert "Answered" in out["cellCard"] and "once" in out["cellCard"] and "ann" in out["cellCard"]
    assert "write_file" in out["sqlOutput"] and "once" in out["sqlOutput"] and "ann" in out["sqlOutput"]
    assert "answer=once" in out["runEntries"], out["runEntries"]
    assert Path(out["screenshot"]).is_file()
    # The dark theme recolours the panel (JupyterLab's CSS variables, nothing hard-coded).
    light, dark = out["lightColours"], out["darkColours"]
    assert all(a != b for a, b in zip(light, dark)), (light, dark)

    # Offline, once the server is gone: the journal verifies and holds the one answer.
    import httpx

    httpx.post(f"{lab['url']}api/shutdown", headers={"Authorization": f"token {lab['token']}"}, timeout=30)
    assert lab["process"].wait(timeout=60) == 0
    from apollia_nb.runtime import Runtime

    monkeypatch.chdir(lab["work"])
    with Runtime.blocking(lab["work"] / "home") as rt:
        assert rt.verify().ok
        assert rt.journal.sql("SELECT status FROM runs") == [("completed",)]
        assert rt.journal.sql("SELECT answer, answered_by FROM decisions WHERE tool = 'write_file'") == \
            [("once", "ann")]
