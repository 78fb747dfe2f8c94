"""The tour notebook, run through a real JupyterLab server: its kernel, its websocket, a real widget click.

JupyterLab starts with the arguments ``dev/lab.sh`` gives it (the root it serves, the page it
opens), but headless: no browser, 127.0.0.1, a random port, a token, and a temporary root
holding a copy of the tour in ``notebooks/``. The test checks the page it would open is the
tour's, opens a session for the notebook through the REST API and executes its cells in order over the kernel's
websocket, as JupyterLab does. Where the tour answers the consent card from code,
the test first clicks the card's ``once`` button — a widget comm message, as the
browser sends it — and then runs that cell too, as a reader who clicks and then runs
every cell does: the same answer again is quiet, and the rest of the tour runs on unchanged. Then the server is
shut down through its API, and the journal the kernel left is verified offline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

websocket = pytest.importorskip("websocket")  # websocket-client, a dependency of jupyter_server

ROOT = Path(__file__).resolve().parents[1]
TOUR_PATH = "notebooks/01-tour.ipynb"  # where dev/lab.sh's JupyterLab opens, from the clone's root
TOUR = ROOT / TOUR_PATH
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
ANSWER_CELL = 'card.answer("once")'
DEADLINE = 120.0


def _lines(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def _decode(frame: str | bytes) -> dict[str, Any]:
    """A message of the server's JSON websocket protocol (binary when it carries buffers)."""
    if isinstance(frame, str):
        return json.loads(frame)
    count = int.from_bytes(frame[:4], "big")
    offsets = [int.from_bytes(frame[4 * (i + 1):4 * (i + 2)], "big") for i in range(count)]
    end = offsets[1] if count > 1 else len(frame)
    return json.loads(frame[offsets[0]:end])


class KernelSocket:
    """The kernel's channels over the server's websocket, as a browser uses them."""

    def __init__(self, url: str, token: str) -> None:
        self.session = uuid.uuid4().hex
        self.ws = websocket.create_connection(f"{url}?session_id={self.session}",
                                              header=[f"Authorization: token {token}"], timeout=DEADLINE)
        self.iopub: list[dict[str, Any]] = []

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": msg_type, "session": self.session, "username": "ann",
                  "date": "2026-01-01T00:00:00.000000Z", "version": "5.3"}
        self.ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content,
                                 "channel": channel, "buffers": []}))
        return msg_id

    def reply(self, msg_id: str, msg_type: str) -> dict[str, Any]:
        """Read until the shell reply to ``msg_id`` and then its ``idle`` status; iopub is kept in ``self.iopub``."""
        reply = None
        idle = False
        end = time.monotonic() + DEADLINE
        while reply is None or not idle:
            if time.monotonic() > end:
                raise TimeoutError(f"no {msg_type} for {msg_id}")
            msg = _decode(self.ws.recv())
            parent = msg.get("parent_header", {}).get("msg_id")
            if msg["channel"] == "iopub":
                self.iopub.append(msg)
                if parent == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            elif msg["channel"] == "shell" and parent == msg_id and msg["msg_type"] == msg_type:
                reply = msg
        return reply

    def execute(self, code: str) -> dict[str, Any]:
        msg_id = self.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False,
                                               "stop_on_error": True})
        reply = self.reply(msg_id, "execute_reply")
        reply["outputs"] = [m for m in self.iopub if m.get("parent_header", {}).get("msg_id") == msg_id
                            and m["msg_type"] in ("stream", "display_data", "execute_result", "error")]
        return reply

    def click(self, comm_id: str) -> None:
        """What a browser sends when a widget button is clicked (handled before the next request)."""
        self.send("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})

    def close(self) -> None:
        self.ws.close()


def _text(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for msg in outputs:
        content = msg["content"]
        parts.append(content.get("text", "") if msg["msg_type"] == "stream"
                     else _lines(content.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def lab_sh_arguments(cwd: Path) -> list[str]:
    """The arguments ``dev/lab.sh`` gives ``jupyter lab`` when it runs in ``cwd`` (not as root, none of its own)."""
    script = (ROOT / "dev" / "lab.sh").read_text()
    [line] = [line for line in script.splitlines() if line.startswith("exec .venv/bin/jupyter lab ")]
    assignments = [line for line in script.splitlines() if re.fullmatch(r"\w+=\S+", line)]  # e.g. tour=...
    expand = "\n".join(["lab=()", *assignments, line.replace("exec .venv/bin/jupyter lab ", "printf '%s\\0' ", 1)])
    out = subprocess.run(["bash", "-u", "-c", expand], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.split("\0")[:-1]


@contextlib.contextmanager
def jupyterlab(root: Path, tmp_path: Path):
    """JupyterLab started in ``root`` as ``dev/lab.sh`` starts it, without a browser, on a random port."""
    token = uuid.uuid4().hex
    runtime_dir = tmp_path / "runtime"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
    env.update({
        "JUPYTER_RUNTIME_DIR": str(runtime_dir), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_PLATFORM_DIRS": "1",
        "IPYTHONDIR": str(tmp_path / "ipython"), "TMPDIR": str(tmp_path),
        "APOLLIA_HOME": str(tmp_path / "unused-home"),  # the tour makes its own home under TMPDIR
    })
    log_path = tmp_path / "server.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", *lab_sh_arguments(root), "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", f"--IdentityProvider.token={token}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        info_file = runtime_dir / f"jpserver-{process.pid}.json"
        opener = runtime_dir / f"jpserver-{process.pid}-open.html"  # the page a browser would open
        end = time.monotonic() + DEADLINE
        while not (info_file.exists() and opener.exists()):  # written once the server listens
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < end, "the server did not start"
            time.sleep(0.1)
        info = json.loads(info_file.read_text())
        client = httpx.Client(base_url=info["url"].rstrip("/"), headers={"Authorization": f"token {token}"},
                              timeout=DEADLINE)
        yield {"client": client, "token": token, "info": info, "root": root, "process": process,
               "tmp": tmp_path, "opener": opener, "log": log_path}
        client.close()
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
        log.close()


@pytest.fixture
def server(tmp_path):
    """JupyterLab as ``dev/lab.sh`` starts it, rooted in a folder holding a copy of the tour in ``notebooks/``."""
    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(TOUR, root / TOUR_PATH)
    with jupyterlab(root, tmp_path) as started:
        yield started


def test_the_tour_runs_in_a_real_server_kernel_and_a_click_answers_its_card(server, monkeypatch):
    client, process = server["client"], server["process"]
    assert client.get("/api/status").status_code == 200
    # What a browser would open: JupyterLab on the tour.
    assert f"/lab/tree/{TOUR_PATH}?" in server["opener"].read_text()
    assert client.get(f"/lab/tree/{TOUR_PATH}").status_code == 200
    assert httpx.get(f"{client.base_url}/api/sessions").status_code == 403  # without the token

    created = client.post("/api/sessions", json={"path": TOUR_PATH, "type": "notebook", "name": TOUR.name,
                                                 "kernel": {"name": "python3"}})
    assert created.status_code == 201, created.text
    kernel_id = created.json()["kernel"]["id"]
    ws_url = server["info"]["url"].replace("http://", "ws://").rstrip("/") + f"/api/kernels/{kernel_id}/channels"
    kernel = KernelSocket(ws_url, server["token"])
    try:
        assert kernel.reply(kernel.send("kernel_info_request", {}), "kernel_info_reply")["content"]["status"] == "ok"
        cells = [_lines(c["source"]) for c in json.loads(TOUR.read_text())["cells"] if c["cell_type"] == "code"]
        assert ANSWER_CELL in cells
        results: dict[str, dict[str, Any]] = {}
        clicked = None
        for code in cells:
            if code == ANSWER_CELL:  # the reader clicks `once`, then runs the answering cell anyway:
                clicked = _click_once(kernel)  # the same answer again is quiet, not a Conflict
            reply = kernel.execute(code)
            assert reply["content"]["status"] == "ok", (code, reply["content"], _text(reply["outputs"]))
            results[code.splitlines()[0]] = reply
    finally:
        kernel.close()

    # The run view is a live widget, with its text and HTML beside it.
    [view] = [m for m in results["%%apollia task clerk"]["outputs"] if m["msg_type"] == "display_data"]
    assert WIDGET_MIME in view["content"]["data"] and "text/html" in view["content"]["data"]
    assert "waiting (answers: once/always/refuse)" in _text(results["[card] = task.cards"]["outputs"])
    # The click answered the card: its buttons were disabled, the run went on, and it completed.
    assert clicked is not None and _disabled(kernel.iopub, clicked)
    final = _text(results["task.status, task.result, task.budget"]["outputs"])
    assert final.startswith("('completed', 'Wrote summary.txt.'"), final
    assert _text(results["print((tour / \"notes\" / \"summary.txt\").read_text())"]["outputs"]) == \
        "Launch moves to Friday.\n"
    decisions = _text(results["%%apollia sql"]["outputs"])
    assert "write_file" in decisions and "once" in decisions and "ann" in decisions
    assert "verified:" in _text(results["%apollia verify"]["outputs"])
    assert "identical" in _text(results["%apollia replay {task.run_id}"]["outputs"])

    # Shut the server down through its API: the kernel exits and closes its home.
    assert client.post("/api/shutdown").status_code in (200, 202, 204)
    assert process.wait(timeout=60) == 0

    from apollia_nb.runtime import Runtime

    [home] = [p / "home" for p in server["tmp"].glob("apollia-tour-*")]
    monkeypatch.chdir(home.parent)  # the folder the tour ran in: the clerk's relative workspace is there
    with Runtime.blocking(home) as rt:
        assert rt.verify().ok
        [(run_id, status)] = rt.journal.sql("SELECT run_id, status FROM runs")
        assert status == "completed"
        assert rt.journal.sql("SELECT answer, answered_by FROM decisions WHERE tool = 'write_file'") == \
            [("once", "ann")]
        assert rt.replay(run_id).verdict == "identical"


def _widget_states(iopub: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every widget model the kernel opened, with its state as last updated."""
    states: dict[str, dict[str, Any]] = {}
    for msg in iopub:
        content = msg["content"]
        if msg["msg_type"] == "comm_open" and content.get("target_name") == "jupyter.widget":
            states[content["comm_id"]] = dict(content["data"]["state"])
        elif msg["msg_type"] == "comm_msg" and content["comm_id"] in states:
            data = content["data"]
            if data.get("method") in ("update", "echo_update"):
                states[content["comm_id"]].update(data.get("state", {}))
    return states


def _click_once(kernel: KernelSocket) -> str:
    """Click the consent card's ``once`` button, the only one on offer so far; return its model id."""
    states = _widget_states(kernel.iopub)
    [button] = [comm_id for comm_id, state in states.items()
                if state.get("_model_name") == "ButtonModel" and state.get("description") == "once"]
    assert not states[button].get("disabled")
    kernel.click(button)
    return button


def _disabled(iopub: list[dict[str, Any]], comm_id: str) -> bool:
    return bool(_widget_states(iopub)[comm_id].get("disabled"))


def test_dev_lab_sh_installs_and_opens_jupyterlab_on_the_tour_as_the_readme_says():
    script = ROOT / "dev" / "lab.sh"
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lines = [line.strip() for line in script.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert any(".venv/bin/python -m pip install" in line and "-e ." in line for line in lines)
    assert lines[-1].startswith('exec .venv/bin/jupyter lab ${lab[@]+"${lab[@]}"} ') and lines[-1].endswith(' "$@"')
    assert 'lab+=(--allow-root)' in lines and any('"$(id -u)" = 0' in line for line in lines)  # root works, said
    assert "APOLLIA_HOME" not in script.read_text()  # the tour makes its own home
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^bash dev/\S+", readme, flags=re.MULTILINE)
    assert commands[:2] == ["bash dev/lab.sh", "bash dev/test.sh"], commands
    assert "apollia-os demo" in readme


def test_dev_lab_sh_serves_the_clone_and_opens_the_tour_whose_links_all_resolve(tmp_path):
    """Started from the clone as dev/lab.sh starts it: the file browser holds the clone's root, so the
    docs the tour points at open; the URL it prints and the page it opens are the tour's."""
    arguments = lab_sh_arguments(ROOT)
    # A file to open among them would narrow the root to the file's folder.
    assert not any(a.endswith(".ipynb") and not a.startswith("--") for a in arguments), arguments
    with jupyterlab(ROOT, tmp_path) as started:
        client = started["client"]
        assert Path(started["info"]["root_dir"]) == ROOT
        assert f"/lab/tree/{TOUR_PATH}?token=" in started["opener"].read_text()
        printed = started["log"].read_text()
        assert re.search(rf"http://127\.0\.0\.1:\d+/lab/tree/{re.escape(TOUR_PATH)}\?token=", printed), printed
        listing = client.get("/api/contents", params={"content": 1}).json()
        assert {"README.md", "docs", "notebooks"} <= {item["name"] for item in listing["content"]}
        for name in ("docs/index.md", "README.md", TOUR_PATH):
            assert client.get(f"/api/contents/{name}", params={"content": 0}).status_code == 200, name
        # Every link in the tour's markdown opens from where the tour is, in this server.
        tour = json.loads(TOUR.read_text())
        links = [target for cell in tour["cells"] if cell["cell_type"] == "markdown"
                 for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _lines(cell["source"]))
                 if "://" not in target]
        assert any(link.startswith("../docs/") for link in links), links
        for link in links:
            path = os.path.normpath(Path(TOUR_PATH).parent / link)
            assert not path.startswith(".."), link
            assert client.get(f"/api/contents/{path}", params={"content": 0}).status_code == 200, link
