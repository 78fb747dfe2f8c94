"""The apollia panel in a real browser: Debian's Chromium, driven by playwright-core, against a
real JupyterLab started from a fresh virtual environment that holds only the built wheel.

The browser opens a notebook, opens the panel with its shortcut (it says how to load the
extension, which this kernel has not loaded yet), runs every cell: the extension loads,
an agent is registered, two tasks of that agent start and each asks before it writes, and
a cell ``await``s the first — the kernel's main shell is busy. While it is, the panel shows
both cards told apart by their tasks' goals and ids (the tab's badge says 2, a number even
with the panel open; each card has a notification), and a click on ``once`` on the first
card answers it: its notification goes, the busy cell finishes, the cell's own card shows
the answer. A task of another agent then waits for its plan to be approved while a cell
blocks its thread in ``join()``: the plan is edited and approved in the panel, and the
cell finishes. The verification badge follows the journal's new entries without a click.
axe-core finds no WCAG 2 AA violation in the panel in the light and the dark theme. Last,
a second notebook's kernel joins an ``apollia-os serve`` (started by the fixture): its
task runs on the server, and a click on the card's ``once`` in the cell answers it there.
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
from served_helpers import lab_env, start_lab, start_serve, stop

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".test-peers" / "playwright" / "node_modules" / "playwright-core"
AXE = ROOT / ".test-peers" / "playwright" / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / ".test-artifacts"
DRIVER = Path(__file__).with_name("lab_panel_browser.mjs")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and PLAYWRIGHT.is_dir() and AXE.is_file()),
    reason="needs Chromium, playwright-core and axe-core: run `bash dev/install-test-browser.sh`")

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


TIDIER = '''%%apollia agent
name = "tidier"
description = "Tidies the notes folder after approval"
instructions = "You tidy the notes folder."

[model]
provider = "scripted"

[[model.script.planner]]
steps = ["List the notes", "Say they are tidy"]

[workspace]
root = "notes"'''


def _notebook(work: Path) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    cells = [
        f"import os, pathlib\nwork = pathlib.Path({str(work)!r})\nos.environ['APOLLIA_HOME'] = str(work / 'home')\n"
        "os.chdir(work)\n(work / 'notes').mkdir(exist_ok=True)\n"
        "(work / 'notes' / 'meeting.txt').write_text('Launch moved from Wednesday to Friday.\\n');",
        '%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"',
        MANIFEST,
        f"%%apollia task clerk\n{GOAL_1}",
        "first = _",
        f"%%apollia task clerk\n{GOAL_2}",
        'second = _\nresult = await first\nprint("RUN", result.status, result.result)',
        TIDIER,
        "%%apollia task tidier --approve-plan\nTidy the notes folder",
        # join() blocks the kernel's main thread until the plan is approved (from the panel) and the task ends
        'plan_task = _\nplan_task.join(120)\nprint("PLAN", plan_task.status, [s["description"] for s in plan_task.steps])',
        "%%apollia sql\nSELECT tool, answer, answered_by FROM decisions WHERE tool = 'write_file'",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb, {"TASK_CELL": 3, "SECOND_TASK_CELL": 5, "AWAIT_CELL": 6, "JOIN_CELL": 9, "SQL_CELL": 10}


GOAL_1 = "Summarise the meeting notes into summary.txt"
GOAL_2 = "Summarise the launch notes for the team"
SERVED_MANIFEST = MANIFEST.replace("%%apollia agent\n", "").replace('root = "notes"', "root = {root!r}")


def _served_notebook(work: Path, home: Path) -> nbformat.NotebookNode:
    """A kernel that joins `apollia-os serve`: a task of the server's agent, its card answered by a click."""
    manifest = SERVED_MANIFEST.replace("{root!r}", json.dumps(str(work / "served-notes")))
    cells = [
        f"import os\nos.environ['APOLLIA_HOME'] = {str(home)!r}\nos.chdir({str(work)!r})",
        '%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"\n'
        "from apollia_nb.sdk.client import Client\n"
        f"Client.from_home({str(home)!r}).register_agent({manifest!r});",
        "%%apollia task clerk\nSummarise the meeting notes for everyone",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


@pytest.fixture
def lab(wheel_venv, tmp_path):
    """``jupyter lab`` of the fresh venv: no browser, 127.0.0.1, a random port, a token, a temporary root."""
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    nb, cells = _notebook(work)
    nbformat.write(nb, root / "panel.ipynb")
    served_home = tmp_path / "served-home"
    (work / "served-notes").mkdir()
    (work / "served-notes" / "meeting.txt").write_text("Launch moved from Wednesday to Friday.\n")
    nbformat.write(_served_notebook(work, served_home), root / "served.ipynb")
    token = uuid.uuid4().hex
    env = lab_env(tmp_path, wheel_venv)
    log_path = tmp_path / "server.log"
    # The shared home's server, as a user starts it (from the same venv).
    served = start_serve(wheel_venv, served_home, work, env)
    process = None
    try:
        with log_path.open("w") as log:
            process, info = start_lab(wheel_venv, root, env, token, log, log_path)
            yield {"url": info["url"], "token": token, "process": process, "work": work, "cells": cells,
                   "tmp": tmp_path, "log": log_path, "venv": wheel_venv, "served_home": served_home,
                   "served": served}
    finally:
        stop(process, served)
        served.stdout.close()


# A hang guard: the test's time includes building the wheel's environment when it is the first to use
# it, and JupyterLab with Chromium take minutes on a loaded machine (2 cores at load 12: over 300 s).
@pytest.mark.timeout(1200)
def test_once_clicked_in_the_panel_answers_while_a_cell_awaits_the_task(lab, monkeypatch):
    # The server runs the wheel's code, not this clone's.
    probe = subprocess.run([str(lab["venv"] / "bin" / "python"), "-c", "import apollia_nb; print(apollia_nb.__file__)"],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=lab["tmp"])
    assert str(lab["venv"]) in probe.stdout, probe

    ARTIFACTS.mkdir(exist_ok=True)
    user_data = lab["tmp"] / "chromium-profile"  # a new profile for every run
    env = {**os.environ, "LAB_URL": lab["url"], "LAB_TOKEN": lab["token"], "NOTEBOOK": "panel.ipynb",
           "SERVED_NOTEBOOK": "served.ipynb", "GOAL_1": GOAL_1, "GOAL_2": GOAL_2,
           "PLAYWRIGHT_CORE": str(PLAYWRIGHT), "AXE": str(AXE), "USER_DATA_DIR": str(user_data),
           "ARTIFACTS": str(ARTIFACTS), **{k: str(v) for k, v in lab["cells"].items()}}
    started = time.monotonic()
    ran = subprocess.run(["node", str(DRIVER)], capture_output=True, text=True, timeout=300, env=env)
    took = time.monotonic() - started
    lines = ran.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {}
    (ARTIFACTS / "panel-browser.json").write_text(json.dumps(out, indent=1))  # what the browser read, for a look
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
    # Two cards alike but for their task: each says its goal, its task, run and card ids.
    goals = {c["goal"] for c in out["cards"]}
    assert goals == {f"task: {GOAL_1}", f"task: {GOAL_2}"}, out["cards"]
    assert len({c["ids"] for c in out["cards"]}) == 2 and all(" · card pd" in c["ids"] or "card " in c["ids"]
                                                             for c in out["cards"]), out["cards"]
    # The tab's count: a number, a small badge, with the panel open.
    assert out["badge"] == "2" and out["badgeStyle"]["content"] == '"2"', out["badgeStyle"]
    assert out["badgeStyle"]["width"] < 40 and out["badgeStyle"]["height"] < 20, out["badgeStyle"]
    assert out["notification"] and "clerk asks to use write_file" in out["notification"], out["notification"]
    # Each card had its notification, naming its goal; the answered card's went with the answer.
    assert any(GOAL_2 in t for t in out["toastsBeforeAnswer"]), out["toastsBeforeAnswer"]
    assert not any(GOAL_1[:30] in t for t in out["toastsAfterAnswer"]), out["toastsAfterAnswer"]
    # The plan: in the inbox while the cell blocks in join(); approved as edited from the panel.
    assert "*" in out["joinBusyAtApprove"], out["joinBusyAtApprove"]
    assert out["planGoal"] == "task: Tidy the notes folder" and out["planBadge"] == "2", out
    assert "PLAN completed ['Check that the notes are tidy']" in out["joinOutput"], out["joinOutput"]
    assert "waiting · waiting" not in out["runsWhilePlanWaits"] and \
        "waiting for its plan to be approved" in out["runsWhilePlanWaits"], out["runsWhilePlanWaits"]
    # The verification followed the journal without a click, never claiming more than it checked.
    assert out["verifyFollowed"] == f"verified: all {out['journalSize']} entries", out
    assert all(int(n) <= int(size) for n, size in out["verifyClaims"]), out["verifyClaims"]
    # Both themes pass WCAG 2 AA (axe-core), a waiting card and the served banner included.
    for name in ("axeLight", "axeDark", "axeServed"):
        assert out[name]["violations"] == [], (name, json.dumps(out[name], indent=1)[:4000])
        assert out[name]["passes"] > 0
    # The last card answered: the badge is gone.
    assert out["badgeAfterAll"] is None, out["badgeAfterAll"]
    # A kernel that joined `apollia-os serve`: the server task's card is answered by a click in the cell.
    assert "completed" in out["servedOutput"], out["servedOutput"]
    # One answer, frozen in every view: the panel, the cell's card; the busy cell finished.
    assert out["panelAnswered"].startswith("answered once by ann at "), out["panelAnswered"]
    assert "RUN completed Wrote summary.txt." in out["awaitOutput"], out["awaitOutput"]
    assert "Answered" in out["cellCard"] and "once" in out["cellCard"] and "ann" in out["cellCard"]
    assert "write_file" in out["sqlOutput"] and "once" in out["sqlOutput"] and "ann" in out["sqlOutput"]
    assert "answer=once" in out["runEntries"], out["runEntries"]
    from apollia_nb.sdk.client import Client

    with Client.from_home(lab["served_home"]) as api:
        [served_task] = api.tasks()
        assert served_task.status == "completed"
        answers = [e for e in api.entries(limit=1000).entries if e.kind == "answer"]
        assert [(e.payload["answer"], e.payload["answered_by"]) for e in answers] == [("once", "ann")]
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
        statuses = sorted(s for (s,) in rt.journal.sql("SELECT status FROM runs"))
        assert len(statuses) == 3 and statuses.count("completed") >= 2, statuses
        assert sorted(rt.journal.sql("SELECT answer, answered_by FROM decisions WHERE tool = 'write_file'")) == \
            [("once", "ann"), ("refuse", "ann")]
