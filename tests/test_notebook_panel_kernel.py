"""The side panel's mechanism in a real kernel: its comm over a kernel subshell answers while a cell is busy.

A real ipykernel (``jupyter_client``), the extension loaded on a fresh home,
a task whose tool asks. The test plays JupyterLab's part: it opens the panel's
comm on a subshell (``create_subshell_request`` on the control channel, then
``subshell_id`` in the header of the comm's messages, as JupyterLab 4.6 does
by default) and reads the replies from IOPub.
"""

from __future__ import annotations

import json
import queue
import sys
import time
import uuid

import pytest
from runtime_helpers import call, manifest

jupyter_client = pytest.importorskip("jupyter_client")

WAIT = 30.0
WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]
WRITE_B = [{"tool_calls": [call("write_file", path="b.txt", content="hello")]}, {"text": "Wrote b.txt."}]


class Kernel:
    """A client of one real kernel that keeps every IOPub message it reads, in order."""

    def __init__(self, kc) -> None:
        self.kc = kc
        self.iopub: list[dict] = []
        self._read = 0

    def _next(self, deadline: float) -> dict:
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"nothing came in time; IOPub so far: {self.summary()}") from None
            self.iopub.append(msg)
            return msg

    def until(self, predicate, timeout: float = WAIT) -> dict:
        """The first IOPub message (not seen by an earlier call) that matches."""
        deadline = time.monotonic() + timeout
        while True:
            while self._read < len(self.iopub):
                msg = self.iopub[self._read]
                self._read += 1
                if predicate(msg):
                    return msg
            if time.monotonic() > deadline:
                raise AssertionError(f"no such message in time; IOPub so far: {self.summary()}")
            self._next(deadline)

    def summary(self) -> list:
        return [(m["msg_type"], m["content"].get("execution_state") or m["content"].get("data")
                 or m["content"].get("text") or m["content"].get("ename")) for m in self.iopub[-30:]]

    def position(self, msg: dict) -> int:
        return next(i for i, m in enumerate(self.iopub) if m["header"]["msg_id"] == msg["header"]["msg_id"])

    # ------------------------------------------------------------------ the shell
    def execute(self, code: str) -> str:
        return self.kc.execute(code)

    def finished(self, msg_id: str, timeout: float = WAIT) -> dict:
        """The cell's ``idle`` status (it ran to its end)."""
        return self.until(lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                          and m["content"]["execution_state"] == "idle", timeout)

    def run(self, code: str) -> str:
        """Run a cell to its end; its text output (errors fail the test)."""
        msg_id = self.execute(code)
        self.finished(msg_id)
        out = [m for m in self.iopub if m["parent_header"].get("msg_id") == msg_id]
        errors = [m["content"] for m in out if m["msg_type"] == "error"]
        assert not errors, errors
        return "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream") + "".join(
            m["content"]["data"].get("text/plain", "") for m in out if m["msg_type"] == "execute_result")

    def create_subshell(self) -> str:
        request = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(request)
        while True:
            reply = self.kc.control_channel.get_msg(timeout=WAIT)
            if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                assert reply["content"]["status"] == "ok", reply["content"]
                return reply["content"]["subshell_id"]

    def comm(self, msg_type: str, content: dict, subshell_id: str | None) -> None:
        msg = self.kc.session.msg(msg_type, content)
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)


class Panel:
    """What JupyterLab does with the panel's comm: it opens it and sends its first request before the
    comm's subshell is ready, so both go over the main shell; ``over(subshell)`` then sends the rest there."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.subshell_id: str | None = None
        self.comm_id = uuid.uuid4().hex
        kernel.comm("comm_open", {"comm_id": self.comm_id, "target_name": "apollia.panel", "data": {}}, None)
        first = self.reply(self.send(op="snapshot"))
        assert first["content"]["data"]["ok"] is True, first["content"]["data"]

    def over(self, subshell_id: str) -> Panel:
        self.subshell_id = subshell_id
        return self

    def _mine(self, msg: dict) -> bool:
        return msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == self.comm_id

    def send(self, **request) -> str:
        rid = uuid.uuid4().hex
        self.kernel.comm("comm_msg", {"comm_id": self.comm_id, "data": {"id": rid, **request}}, self.subshell_id)
        return rid

    def reply(self, rid: str, timeout: float = WAIT) -> dict:
        return self.kernel.until(lambda m: self._mine(m) and m["content"]["data"].get("id") == rid, timeout)


@pytest.fixture
def kernel(home, tmp_path, monkeypatch):
    from jupyter_client import KernelManager

    specs = tmp_path / "jupyter" / "kernels" / "apollia-test"
    specs.mkdir(parents=True)
    (specs / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    km = KernelManager(kernel_name="apollia-test")
    km.start_kernel(cwd=str(tmp_path / "work"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        k = Kernel(kc)
        k.run('%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"')
        yield k
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def submit(kernel: Kernel, name: str, actor: list, goal: str) -> None:
    kernel.run("%%apollia agent\n" + manifest(name, actor=actor))
    kernel.run(f"%%apollia task {name}\n{goal}")
    kernel.run(f"{name} = _\nawait {name}.settled()\nprint({name}.status)")


def data_of(msg: dict) -> dict:
    return msg["content"]["data"]


def printed(kernel: Kernel, msg_id: str) -> str:
    """What a cell printed: its stdout, which ipykernel may send in more than one message (a flush can
    fall between the writes of one ``print``); anything on stderr fails the test."""
    streams = [m["content"] for m in kernel.iopub
               if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"]
    assert [s["text"] for s in streams if s["name"] != "stdout"] == []
    return "".join(s["text"] for s in streams)


def test_the_panel_answers_over_a_subshell_while_a_cell_awaits_the_task(kernel, home, tmp_path):
    # `%load_ext` (the fixture's) announced the target: a comm of the kernel's, opened and closed.
    [announced] = [m for m in kernel.iopub if m["msg_type"] == "comm_open"]
    assert announced["content"]["target_name"] == "apollia.panel"
    assert announced["content"]["data"] == {"event": "loaded"}
    [closed] = [m for m in kernel.iopub if m["msg_type"] == "comm_close"]
    assert closed["content"]["comm_id"] == announced["content"]["comm_id"]

    submit(kernel, "clerk", WRITE, "Write a.txt")
    panel = Panel(kernel).over(kernel.create_subshell())  # opened when the kernel was ready
    main = Panel(kernel)  # a second panel's comm, all on the main shell
    busy = kernel.execute("clerk = await clerk\nprint('done', clerk.status)")  # the main shell is busy from here
    kernel.until(lambda m: m["parent_header"].get("msg_id") == busy and m["msg_type"] == "execute_input")

    snapshot = data_of(panel.reply(panel.send(op="snapshot")))
    assert snapshot["ok"] is True, snapshot
    [item] = snapshot["data"]["inbox"]
    assert (item["agent"], item["tool"], item["family"], item["answered"]) == ("clerk", "write_file", "write", None)
    [run] = snapshot["data"]["runs"]
    assert run["status"] == "waiting" and run["waiting"] is True

    # ipykernel 7 also handles comm messages on the main shell while an async cell awaits: a panel
    # without a subshell is answered during `await task` (not during a cell that blocks its thread).
    during = main.reply(main.send(op="snapshot"))
    assert data_of(during)["ok"] is True and data_of(during)["data"]["inbox"][0]["id"] == item["id"]

    answered = data_of(panel.reply(panel.send(op="answer", card_id=item["id"], answer="once")))
    assert answered["ok"] is True, answered
    assert answered["data"]["answered"]["by"] == "ann"

    idle = kernel.finished(busy)  # the busy cell ends: the run completed
    # While it awaited, the cell's card widget was updated to say who answered (a widget state update) …
    frozen = [m for m in kernel.iopub if m["msg_type"] == "comm_msg"
              and str(m["content"]["data"].get("state", {}).get("value", "")).startswith("Answered ")]
    assert frozen and "by ann" in frozen[0]["content"]["data"]["state"]["value"]
    assert kernel.position(during) < kernel.position(frozen[0]) < kernel.position(idle)
    assert printed(kernel, busy) == "done completed\n"
    assert (tmp_path / "work" / "a.txt").read_text() == "hello"
    decisions = kernel.run("print([(d['answer'], d['answered_by']) for d in clerk.decisions()])")
    assert decisions.strip() == "[('once', 'ann')]"  # the journal has the answer
    # The cell's card froze with who answered: its widget and the displayed fallback say so.
    assert "answered once by ann" in kernel.run("print(clerk._text())")


def test_a_cell_that_blocks_its_thread_holds_the_main_shell_but_not_the_subshell(kernel, tmp_path):
    submit(kernel, "scribe", WRITE_B, "Write b.txt")
    card_id = kernel.run("print(scribe.pending[0].id)").strip()
    main = Panel(kernel)  # a comm on the main shell, as a front end without subshells has it
    panel = Panel(kernel).over(kernel.create_subshell())  # its first request went over the main shell

    busy = kernel.execute("scribe.join(60)\nprint('joined', scribe.status)")  # blocks the kernel's main thread
    kernel.until(lambda m: m["parent_header"].get("msg_id") == busy and m["msg_type"] == "execute_input")
    held = main.send(op="snapshot")  # queued behind the busy cell
    answered = panel.reply(panel.send(op="answer", card_id=card_id, answer="once"))
    assert data_of(answered)["ok"] is True, data_of(answered)
    idle = kernel.finished(busy)  # the answer released the blocked cell
    late = main.reply(held)
    # The main shell's request was handled only after the cell ended; the subshell's while it ran.
    assert kernel.position(answered) < kernel.position(idle) < kernel.position(late)
    assert data_of(late)["ok"] is True and data_of(late)["data"]["inbox"][0]["answered"]["by"] == "ann"
    assert printed(kernel, busy) == "joined completed\n"
    assert (tmp_path / "work" / "b.txt").read_text() == "hello"
    # The panel's replies and pushes are parented to no request: ipykernel then routes each message
    # of the panel to the subshell its header names (a reply parented to the first request, which came
    # over the main shell, would have pulled the answer onto the blocked main shell).
    sent = [m for m in kernel.iopub if panel._mine(m) or main._mine(m)]
    assert sent and all(m["parent_header"] == {} for m in sent)
