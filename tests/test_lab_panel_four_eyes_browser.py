"""Four eyes end to end, over REST and in the apollia panel of a real JupyterLab in Debian's Chromium.

A served home (``apollia-os serve`` of a fresh virtual environment holding the built wheel) has an
organisation policy that asks four eyes of every write. ann (runner and approver) starts a run over
REST and her own approval is refused 403 ``FORBIDDEN``; the owner starts another. A notebook's kernel
joins the home (the owner's token, its answers named bob): its panel says who answers from it, shows
why the owner's own run is not theirs to approve (only ``refuse`` is offered), and approves ann's run
with a click. The journal names both: ann's refused approval and bob's answer.

Installed by ``dev/install-test-browser.sh`` (``dev/test.sh`` runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import nbformat
import pytest
from runtime_helpers import call, manifest
from served_helpers import (
    api_client,
    lab_env,
    read_json,
    start_lab,
    start_serve,
    stop,
    until,
)

from apollia_nb.governance.policy import keygen, sign

ROOT = Path(__file__).resolve().parents[1]
PLAYWRIGHT = ROOT / ".test-peers" / "playwright" / "node_modules" / "playwright-core"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / ".test-artifacts"
DRIVER = Path(__file__).with_name("lab_panel_four_eyes.mjs")

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and PLAYWRIGHT.is_dir()),
                                reason="needs Chromium and playwright-core: run `bash dev/install-test-browser.sh`")


@pytest.fixture
def four_eyes_lab(wheel_venv, tmp_path):
    """A served home with four eyes on writes, and ``jupyter lab`` of the same venv, each on a random port."""
    root, work, home = tmp_path / "root", tmp_path / "work", tmp_path / "home"
    for folder in (root, work / "notes", home / "policy"):
        folder.mkdir(parents=True)
    _, public = keygen(tmp_path / "org.key")
    (home / "policy" / "organisation.toml").write_bytes(b"[approvals.families.write]\nfour_eyes = true\n")
    sign(home / "policy" / "organisation.toml", tmp_path / "org.key")
    (home / "apollia.toml").write_text(f'[policy]\ntrusted_keys = ["{public}"]\n')
    cells = [f"import os\nos.environ['APOLLIA_HOME'] = {str(home)!r}\nos.chdir({str(work)!r})",
             '%load_ext apollia_nb\n%config ApolliaMagics.user = "bob"', "%apollia pending"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "four-eyes.ipynb")
    token = uuid.uuid4().hex
    env = lab_env(tmp_path, wheel_venv)
    served = start_serve(wheel_venv, home, work, env)
    log_path = tmp_path / "lab.log"
    lab = None
    try:
        server = until(lambda: read_json(home / "server.json"), bool)
        with log_path.open("w") as log:
            lab, info = start_lab(wheel_venv, root, env, token, log, log_path)
            yield {"url": info["url"], "token": token, "server": server, "work": work, "tmp": tmp_path,
                   "log": log_path}
    finally:
        stop(lab, served)
        served.stdout.close()


# A hang guard: the test's time includes building the wheel's environment when it is the first to use
# it, and JupyterLab with Chromium take minutes on a loaded machine (2 cores at load 12: over 300 s).
@pytest.mark.timeout(1200)
def test_four_eyes_ann_may_not_approve_her_run_bob_approves_it_in_the_panel(four_eyes_lab):
    lab = four_eyes_lab
    root = str(lab["work"] / "notes")
    writer = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}],
                      workspace=root)
    with api_client(lab["server"]["url"], lab["server"]["token"]) as owner:
        made = owner.post("/people", json={"name": "ann", "roles": ["runner", "approver"]})
        assert made.status_code == 201, made.text
        assert owner.post("/agents", json={"manifest": writer}).status_code == 201
        with api_client(lab["server"]["url"], made.json()["token"]) as ann:
            hers = ann.post("/tasks", json={"agent": "clerk", "goal": "Write for ann", "watched": False}).json()
            theirs = owner.post("/tasks", json={"agent": "clerk", "goal": "Write for the owner", "watched": False}).json()
            pending = until(lambda: {p["task_id"]: p for p in owner.get("/pending-decisions").json()},
                             lambda by_task: {hers["id"], theirs["id"]} <= set(by_task))
            refused = ann.post("/pending-decisions/decide", json={"id": pending[hers["id"]]["id"], "answer": "once"})
            assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN", refused.text
            assert "four eyes" in refused.json()["message"]

        ARTIFACTS.mkdir(exist_ok=True)
        env = {**os.environ, "LAB_URL": lab["url"], "LAB_TOKEN": lab["token"], "NOTEBOOK": "four-eyes.ipynb",
               "PLAYWRIGHT_CORE": str(PLAYWRIGHT), "USER_DATA_DIR": str(lab["tmp"] / "chromium-profile"),
               "ARTIFACTS": str(ARTIFACTS), "OTHERS_CARD": pending[hers["id"]]["id"],
               "OWN_CARD": pending[theirs["id"]]["id"]}
        ran = subprocess.run(["node", str(DRIVER)], capture_output=True, text=True, timeout=300, env=env)
        lines = ran.stdout.strip().splitlines()
        out = json.loads(lines[-1]) if lines else {}
        (ARTIFACTS / "panel-four-eyes.json").write_text(json.dumps(out, indent=1))  # what the browser read
        assert ran.returncode == 0 and out.get("ok"), (ran.stderr[-3000:], json.dumps(out, indent=1)[:4000],
                                                       lab["log"].read_text()[-3000:])
        # The panel: who answers from it; the owner's own run shows why, with refuse alone; ann's run is theirs.
        assert out["me"] == "you: owner (admin)", out
        assert out["ownWhy"].startswith("Four eyes: you (owner) started this run"), out
        assert out["ownAnswers"] == ["refuse"], out
        assert out["othersWhy"] == 0 and out["othersAnswers"] == ["once", "always", "refuse"], out
        assert out["othersError"] == 0, out
        done = until(lambda: owner.get(f"/tasks/{hers['id']}").json(), lambda t: t["status"] == "completed")
        assert done["started_by"] == "ann"
        until(lambda: owner.get(f"/tasks/{theirs['id']}").json(), lambda t: t["status"] == "failed")
        entries = owner.get("/audit/entries", params={"run_id": hers["run_id"], "limit": 1000}).json()["entries"]
    refusals = [e["payload"] for e in entries if e["kind"] == "answer_refused"]
    answers = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert [(r["person"], r["by_role"], r["code"]) for r in refusals] == [("ann", "runner+approver", "FORBIDDEN")]
    assert [(a["answer"], a["answered_by"], a["auth"]) for a in answers] == [("once", "bob", "owner")]
    assert (lab["work"] / "notes" / "a.txt").read_text() == "one"
