"""The side panel's comm handler in a real IPython: snapshot, answer, entries, verify, pushes, bad input."""

from __future__ import annotations

import threading

import pytest
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

from apollia_nb.notebook import panel

WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]
WAIT = 10


class RecordingComm:
    """What ipykernel hands a comm target, recording what is sent (from whichever thread sends it)."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self._cv = threading.Condition()
        self.handlers: dict[str, object] = {}

    def send(self, data: dict) -> None:
        with self._cv:
            self.sent.append(data)
            self._cv.notify_all()

    def on_msg(self, fn) -> None:
        self.handlers["msg"] = fn

    def on_close(self, fn) -> None:
        self.handlers["close"] = fn

    def reply(self, rid: str) -> dict:
        with self._cv:
            assert self._cv.wait_for(lambda: any(m.get("id") == rid for m in self.sent), WAIT), self.sent
            return next(m for m in self.sent if m.get("id") == rid)

    def pushes(self) -> list[dict]:
        with self._cv:
            return [m for m in self.sent if "event" in m]

    def wait_push(self, after: int) -> dict:
        with self._cv:
            assert self._cv.wait_for(lambda: any(m.get("version", -1) > after for m in self.sent if "event" in m),
                                     WAIT), self.sent
            return [m for m in self.sent if "event" in m][-1]


def runtime(ip):
    return ip.magics_manager.registry["ApolliaMagics"].runtime


def open_panel(ip) -> tuple[panel.PanelComm, RecordingComm]:
    comm = RecordingComm()
    from apollia_nb.notebook.extension import loaded_magics, open_runtime

    magics = loaded_magics(ip)
    return panel.PanelComm(comm, lambda: open_runtime(magics)), comm  # as the registered target does


def ask(p: panel.PanelComm, comm: RecordingComm, rid: str, **fields) -> dict:
    p.receive({"id": rid, **fields})
    return comm.reply(rid)


def waiting_task(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    return ip.run_cell_magic("apollia", "task clerk", "Write a.txt").join(WAIT, settled=True)


def test_a_snapshot_shows_agents_the_waiting_run_its_card_and_the_journal(ip):
    task = waiting_task(ip)
    p, comm = open_panel(ip)
    reply = ask(p, comm, "s1", op="snapshot")
    assert reply["ok"] is True, reply
    data = reply["data"]
    assert data["mode"] == "owner" and data["server"] is None and data["kernel_agents_only"] is True
    assert data["home"] == str(runtime(ip).rt.home.path)
    [agent] = data["agents"]
    assert (agent["name"], agent["state"], agent["inflight"], agent["runs"]) == ("clerk", "active", 1, "kernel")
    [run] = data["runs"]
    assert (run["id"], run["kind"], run["agent"], run["status"], run["waiting"]) == (
        task.id, "task", "clerk", "waiting", True)
    assert run["title"] == "Write a.txt" and run["budget"]["max"] == task.budget["ceiling"]
    assert run["step"].startswith("Step 1 of 1: ") and run["finished_at"] is None and run["waiting_cards"] == 1
    [item] = data["inbox"]
    [card] = task.pending
    assert item["id"] == card.id and item["tool"] == "write_file" and item["family"] == "write"
    assert item["arguments"] == {"path": "a.txt", "content": "hello"}  # in full
    assert item["answers"] == ["once", "always", "refuse"] and item["line"] == card.line and item["reason"]
    assert item["asked_at"] == card.created_at and item["answered"] is None and item["status"] == "pending"
    journal = data["journal"]
    assert journal["size"] == runtime(ip).rt.journal.head()[0] > 0
    assert [e["seq"] for e in journal["latest"]] == sorted((e["seq"] for e in journal["latest"]), reverse=True)
    assert journal["latest"][0]["seq"] == journal["size"]
    assert journal["verify"]["state"] in ("running", "ok")
    task.pending[0].answer("refuse")


def test_answering_from_the_panel_resumes_the_run_freezes_the_cell_card_and_is_journaled(ip):
    task = waiting_task(ip)
    card_view = next(iter(task.widget.cards.values()))  # the cell's card, as displayed
    p, comm = open_panel(ip)
    [card] = task.pending
    reply = ask(p, comm, "a1", op="answer", card_id=card.id, answer="once")
    assert reply["ok"] is True, reply
    user = runtime(ip).user
    assert reply["data"]["answered"]["answer"] == "once" and reply["data"]["answered"]["by"] == user
    assert task.join(WAIT).status == "completed"
    assert card_view.frozen and f"by {user}" in card_view.state.value  # every view of the card froze
    [decision] = task.decisions()
    assert (decision["answer"], decision["answered_by"]) == ("once", user)

    # A second answer, from the panel or anywhere: refused with a stable code and who answered first.
    again = ask(p, comm, "a2", op="answer", decision_id=card.id, answer="refuse")
    assert again["ok"] is False and again["error"]["code"] == "CONFLICT"
    assert again["error"]["answered"]["answer"] == "once" and again["error"]["answered"]["by"] == user
    assert task.decisions()[0]["answer"] == "once"

    # The snapshot now shows the card answered, and by whom.
    data = ask(p, comm, "s2", op="snapshot")["data"]
    [item] = [i for i in data["inbox"] if i["id"] == card.id]
    assert item["answered"]["answer"] == "once" and item["answered"]["by"] == user and item["status"] == "answered"
    [run] = data["runs"]
    assert run["status"] == "completed" and run["finished_at"] and run["step"] is None


def test_a_click_on_the_cell_card_shows_as_answered_in_the_panel(ip):
    task = waiting_task(ip)
    p, comm = open_panel(ip)
    [card] = task.pending
    card_view = next(iter(task.widget.cards.values()))
    card_view.buttons["once"].click()
    assert task.join(WAIT).status == "completed"
    data = ask(p, comm, "s1", op="snapshot")["data"]
    [item] = [i for i in data["inbox"] if i["id"] == card.id]
    assert item["answered"]["by"] == runtime(ip).user and item["answered"]["at"]
    late = ask(p, comm, "a1", op="answer", card_id=card.id, answer="once")
    assert late["ok"] is False and late["error"]["code"] == "CONFLICT"


def test_a_chat_waiting_on_a_card_shows_in_runs_and_inbox_and_is_answered_from_the_panel(ip):
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "write a")
    exchange.join(WAIT, settled=True)
    [card] = exchange.pending
    p, comm = open_panel(ip)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    [chat] = [r for r in data["runs"] if r["kind"] == "chat"]
    assert (chat["id"], chat["agent"], chat["title"], chat["waiting"], chat["waiting_cards"]) == (
        exchange.session.id, "clerk", "write a", True, 1)
    [item] = data["inbox"]
    assert item["id"] == card.id and item["session_id"] == exchange.session.id and item["answered"] is None
    assert ask(p, comm, "a1", op="answer", card_id=card.id, answer="once")["ok"] is True
    assert exchange.join(WAIT).reply == "Wrote a.txt."


def test_changes_are_pushed(ip):
    p, comm = open_panel(ip)
    ask(p, comm, "s0", op="snapshot")  # attaches the panel
    before = panel.PanelHome.of(runtime(ip)).version
    task = waiting_task(ip)  # an agent registered, a task submitted, a card opened
    event = comm.wait_push(before)
    assert event["event"] == "changed" and event["version"] > before
    task.pending[0].answer("refuse")
    task.join(WAIT)


def test_a_burst_of_changes_is_coalesced_into_at_most_two_pushes(ip):
    p, comm = open_panel(ip)
    ask(p, comm, "s0", op="snapshot")
    home = panel.PanelHome.of(runtime(ip))
    ask(p, comm, "v0", op="verify")  # the first snapshot's verification is over …
    comm.wait_push(home.version - 1)  # … and its change pushed: nothing else is under way
    start = len(comm.pushes())
    for _ in range(50):
        home.changed()
    final = home.version
    with comm._cv:
        assert comm._cv.wait_for(lambda: any(m.get("version") == final for m in comm.sent), WAIT)
    burst = comm.pushes()[start:]
    assert 1 <= len(burst) <= 2, burst  # the first at once, the rest together one interval later
    assert burst[-1]["version"] == final


def test_closing_the_home_tells_the_panel_and_a_new_home_is_found(ip, tmp_path):
    p, comm = open_panel(ip)
    ask(p, comm, "s0", op="snapshot")
    pushed = len(comm.pushes())
    ip.run_line_magic("config", f'ApolliaMagics.home = "{tmp_path / "other"}"')  # closes, opens another
    with comm._cv:
        assert comm._cv.wait_for(lambda: len([m for m in comm.sent if "event" in m]) > pushed, WAIT)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    assert data["home"] == str(tmp_path / "other")


def test_a_verification_that_cannot_run_is_failed_never_ok(ip, monkeypatch):
    from apollia_nb.errors import StorageError

    rt = runtime(ip).rt

    def broken():
        raise StorageError("the disk refused the read")

    monkeypatch.setattr(rt, "verify", broken)
    p, comm = open_panel(ip)
    reply = ask(p, comm, "v1", op="verify")
    assert reply["ok"] is True
    assert reply["data"]["state"] == "failed" and "the disk refused the read" in reply["data"]["problem"]


def test_an_unreadable_inbox_is_reported_not_hidden(ip, monkeypatch):
    from apollia_nb.errors import GovernanceUnreadable

    task = waiting_task(ip)
    rt = runtime(ip).rt

    def unreadable():
        raise GovernanceUnreadable("governance.db cannot be read")

    monkeypatch.setattr(rt, "pending_decisions", unreadable)
    p, comm = open_panel(ip)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    assert data["problems"] == [{"part": "inbox", "code": "GOVERNANCE_UNREADABLE",
                                 "message": "governance.db cannot be read"}]
    assert [i["id"] for i in data["inbox"]] == [c.id for c in task.pending]  # this kernel's waiting cards
    monkeypatch.undo()
    task.pending[0].answer("refuse")


def test_entries_of_a_run_newest_first_and_bounded(ip):
    task = waiting_task(ip)
    task.pending[0].answer("once")
    task.join(WAIT)
    p, comm = open_panel(ip)
    reply = ask(p, comm, "e1", op="entries", run_id=task.run_id, limit=3)
    assert reply["ok"] is True, reply
    entries = reply["data"]["entries"]
    assert len(entries) == 3 and reply["data"]["more"] is True
    assert all(e["run_id"] == task.run_id for e in entries)
    assert [e["seq"] for e in entries] == sorted((e["seq"] for e in entries), reverse=True)
    every = ask(p, comm, "e2", op="entries", run_id=task.run_id, limit=500)["data"]
    assert every["more"] is False and "answer" in [e["kind"] for e in every["entries"]]
    assert every["entries"][:3] == entries
    unknown = ask(p, comm, "e3", op="entries", run_id="run-nope")
    assert unknown["ok"] is False and unknown["error"]["code"] == "UNKNOWN_RUN"


def test_verify_runs_off_the_loop_and_reports(ip):
    p, comm = open_panel(ip)
    reply = ask(p, comm, "v1", op="verify")
    assert reply["ok"] is True, reply
    rt = runtime(ip).rt
    assert reply["data"]["state"] == "ok" and reply["data"]["checked_size"] == rt.journal.head()[0]
    assert reply["data"]["first_bad_seq"] is None
    data = ask(p, comm, "s1", op="snapshot")["data"]
    assert data["journal"]["verify"]["state"] == "ok"


@pytest.mark.parametrize("request_, code", [
    ("not an object", "BAD_INPUT"),
    ({"op": "snapshot"}, "BAD_INPUT"),  # no id
    ({"id": "x", "op": "launch"}, "BAD_INPUT"),
    ({"id": "x", "op": "answer", "answer": "once"}, "BAD_INPUT"),  # which card?
    ({"id": "x", "op": "answer", "card_id": "a", "decision_id": "b", "answer": "once"}, "BAD_INPUT"),
    ({"id": "x", "op": "answer", "card_id": "a"}, "BAD_ANSWER"),
    ({"id": "x", "op": "answer", "card_id": "nope", "answer": "once"}, "UNKNOWN_DECISION"),
    ({"id": "x", "op": "entries", "run_id": "r", "limit": 0}, "BAD_INPUT"),
    ({"id": "x", "op": "entries", "run_id": "r", "limit": True}, "BAD_INPUT"),
    ({"id": "x", "op": "entries"}, "BAD_INPUT"),
])
def test_bad_requests_get_a_stable_code_and_change_nothing(ip, request_, code):
    p, comm = open_panel(ip)
    before = runtime(ip).rt.journal.head()
    p.receive(request_)
    rid = request_.get("id") if isinstance(request_, dict) else None
    with comm._cv:
        assert comm._cv.wait_for(lambda: any(m.get("ok") is False for m in comm.sent), WAIT)
    [reply] = [m for m in comm.sent if "ok" in m]
    assert reply["id"] == rid and reply["error"]["code"] == code, reply
    assert reply["error"]["message"]
    assert runtime(ip).rt.journal.head() == before


def test_a_snapshot_describes_one_head_even_when_an_entry_lands_while_it_is_read(ip, monkeypatch):
    task = waiting_task(ip)
    rt = runtime(ip).rt
    real_head, landed = rt.journal.head, []

    def head_then_an_append():  # the window: the head is read, then another writer appends
        seen = real_head()
        if not landed:
            landed.append(rt.journal.append("note", {"text": "landed meanwhile"}))
        return seen

    p, comm = open_panel(ip)
    monkeypatch.setattr(rt.journal, "head", head_then_an_append)
    journal = ask(p, comm, "s1", op="snapshot")["data"]["journal"]
    monkeypatch.undo()
    assert landed, "the snapshot never read the head"
    size = journal["size"]
    assert rt.journal.head()[0] == size + 1  # the entry landed after the head the snapshot read
    assert journal["latest"][0]["seq"] == size and all(e["seq"] <= size for e in journal["latest"])
    assert journal["head"] == bytes(rt.journal.get(size).hash).hex()
    assert journal["last_checkpoint"] is None or journal["last_checkpoint"]["size"] <= size
    following = ask(p, comm, "s2", op="snapshot")["data"]["journal"]  # the next snapshot shows it
    assert following["size"] == size + 1 and following["latest"][0]["kind"] == "note"
    task.pending[0].answer("refuse")


def test_a_bad_answer_is_refused_and_the_card_still_waits(ip):
    task = waiting_task(ip)
    p, comm = open_panel(ip)
    [card] = task.pending
    reply = ask(p, comm, "a1", op="answer", card_id=card.id, answer="maybe")
    assert reply["ok"] is False and reply["error"]["code"] == "BAD_ANSWER"
    assert task.status == "waiting" and [c.id for c in task.pending] == [card.id]
    card.answer("refuse")


def test_without_an_open_home_the_panel_is_told(ip):
    p, comm = open_panel(ip)
    ip.magics_manager.registry["ApolliaMagics"].close_home()
    reply = ask(p, comm, "s1", op="snapshot")
    assert reply["ok"] is False and reply["error"]["code"] == "CONFLICT"
    assert "`%load_ext apollia_nb` or `%apollia` opens it" in reply["error"]["message"]


# --- served: the kernel joined `apollia-os serve` ----------------------------------------------------


@pytest.fixture
def served(tmp_path, monkeypatch, capsys):
    """A real `apollia-os serve` on a fresh home, and a real IPython that joined it (in this process)."""
    from IPython.testing import globalipapp
    from test_shared_home import serve, stop

    from apollia_nb.notebook.extension import unload_ipython_extension
    from apollia_nb.sdk.client import Client

    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("APOLLIA_HOME", str(home))
    server = serve(home)
    shell = None
    try:
        with Client.from_home(home) as api:
            globalipapp.start_ipython()
            shell = globalipapp.get_ipython()
            shell.run_line_magic("load_ext", "apollia_nb")
            shell.run_line_magic("config", 'ApolliaMagics.user = "ann"')
            capsys.readouterr()
            yield shell, api
    finally:
        if shell is not None:
            unload_ipython_extension(shell)
            shell.extension_manager.loaded.discard("apollia_nb")
            shell.config.pop("ApolliaMagics", None)
        stop(server)


def test_served_the_panel_shows_the_servers_inbox_and_answers_there(served):
    ip, api = served
    assert runtime(ip).rt.server is not None  # joined, not owner
    import os

    api.register_agent(manifest("clerk", actor=WRITE, workspace=os.getcwd()))  # the work folder beside the home
    submitted = api.submit("clerk", "Write a.txt")  # another client's run: unattended, on the server
    assert api.wait(submitted.id, timeout=WAIT).status == "waiting"
    p, comm = open_panel(ip)
    data = ask(p, comm, "s1", op="snapshot")["data"]
    assert data["mode"] == "served" and data["server"] and data["kernel_agents_only"] is False
    assert [(a["name"], a["runs"]) for a in data["agents"]] == [("clerk", "server")]
    [run] = data["runs"]
    assert (run["id"], run["runs"], run["status"], run["waiting"]) == (submitted.id, "server", "waiting", True)
    [item] = data["inbox"]
    [decision] = api.pending()
    assert (item["id"], item["runs"], item["tool"], item["answered"]) == (decision.id, "server", "write_file", None)

    before = panel.PanelHome.of(runtime(ip)).version
    reply = ask(p, comm, "a1", op="answer", card_id=decision.id, answer="once")
    assert reply["ok"] is True, reply
    assert reply["data"]["answered"]["by"] == "ann"
    done = api.wait(submitted.id, until="finished", timeout=WAIT)
    assert done.status == "completed"
    answers = [e for e in api.entries(limit=1000).entries if e.kind == "answer"]
    assert [(e.payload["answer"], e.payload["answered_by"]) for e in answers] == [("once", "ann")]

    again = ask(p, comm, "a2", op="answer", card_id=decision.id, answer="refuse")
    assert again["ok"] is False and again["error"]["code"] == "CONFLICT"
    assert again["error"]["answered"] == {"answer": "once", "by": "ann", "at": again["error"]["answered"]["at"]}

    # A change made elsewhere (another client's new run) reaches the panel as a push.
    second = api.submit("clerk", "Write a.txt again")
    api.wait(second.id, timeout=WAIT)
    assert comm.wait_push(before)["event"] == "changed"
    inbox = ask(p, comm, "s2", op="snapshot")["data"]["inbox"]
    assert [i["task_id"] for i in inbox if i["answered"] is None] == [second.id]
    api.cancel(second.id)
