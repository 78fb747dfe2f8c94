"""A kernel, a script or the CLI joining a served home acts as its own person, not as the home's owner.

A client of ``apollia-os serve`` sends ``$APOLLIA_TOKEN`` (a person's token), else ``$JUPYTERHUB_API_TOKEN``,
else the owner's token from ``server.json``. A ``runner``'s client runs its agents through the internal
routes, and the server holds any person's client to what a client runtime writes for the runs that person
opened: a run's ``run_open`` is stamped ``started_by`` with the person the token names, and nothing of
governance (answers, consents, rules, policy, people, erasures, checkpoints) is taken from a client. So four
eyes separates two people's kernels. The homes are served by real ``apollia-os serve`` processes on
127.0.0.1 (port 0); the clients are real ``Runtime``s in client mode and raw HTTP.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from runtime_helpers import call, manifest
from test_four_eyes import FOUR_EYES, _deposit
from test_home_contract import serving as served_by_a_process

from apollia_nb.errors import Forbidden, HomeLocked
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.remote import find_server
from apollia_nb.wire.http import client_token

OWNER = "served-identity-owner-" + "s" * 32
_IDENTITY_ENV = ("APOLLIA_TOKEN", "APOLLIA_HOME", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER", "JUPYTERHUB_API_URL",
                 "JUPYTERHUB_SERVICE_NAME")


@contextmanager
def serving(home: Path) -> Iterator[str]:
    """A real `apollia-os serve` owning ``home`` with the owner token ``OWNER``; yields its URL (the tests' own
    environment is cleared of every identity by ``clean_env`` first)."""
    with served_by_a_process(home, APOLLIA_TOKEN=OWNER):
        yield json.loads((home / "server.json").read_text())["url"]


def _client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _people(url: str, **roles: list[str]) -> dict[str, str]:
    with _client(url, OWNER) as owner:
        made = {name: owner.post("/people", json={"name": name, "roles": held}) for name, held in roles.items()}
    assert all(r.status_code == 201 for r in made.values()), [r.text for r in made.values()]
    return {name: r.json()["token"] for name, r in made.items()}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _IDENTITY_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _entries(url: str, run_id: str) -> list[dict[str, Any]]:
    with _client(url, OWNER) as owner:
        got = owner.get("/audit/entries", params={"run_id": run_id, "limit": 1000})
    assert got.status_code == 200, got.text
    return got.json()["entries"]


def _head(client: httpx.Client) -> int:
    return int(client.get("/internal/journal/head").json()["seq"])


def _draft(kind: str, run_id: str | None, **payload: Any) -> dict[str, Any]:
    return {"kind": kind, "payload": payload, "run_id": run_id, "agent": "clerk"}


def _append(client: httpx.Client, *drafts: dict[str, Any]) -> httpx.Response:
    return client.post("/internal/journal/entries", json={"entries": list(drafts)})


def _run() -> str:
    return f"run-{uuid.uuid4().hex[:12]}"


def _refused(response: httpx.Response, *words: str) -> None:
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["code"] == "FORBIDDEN", body
    for word in words:
        assert word in body["message"], body["message"]


# --- which token a client sends ---------------------------------------------------------------------


def test_a_client_sends_its_persons_token_then_the_hubs_then_the_owners(clean_env):
    assert client_token("owner-t") == "owner-t"
    assert client_token(None) is None
    clean_env.setenv("JUPYTERHUB_API_TOKEN", "hub-t")
    assert client_token("owner-t") == "hub-t"
    clean_env.setenv("APOLLIA_TOKEN", "ann-t")
    assert client_token("owner-t") == "ann-t"


def test_a_kernel_or_command_finding_the_server_carries_its_persons_token(tmp_path, clean_env):
    home = tmp_path / "home"
    with serving(home) as url:
        tokens = _people(url, ann=["runner"])
        assert find_server(Home.at(home), HomeLocked("x")).token == OWNER  # nobody named: the owner
        clean_env.setenv("JUPYTERHUB_API_TOKEN", "a-hub-token")
        assert find_server(Home.at(home), HomeLocked("x")).token == "a-hub-token"
        clean_env.setenv("APOLLIA_TOKEN", tokens["ann"])
        assert find_server(Home.at(home), HomeLocked("x")).token == tokens["ann"]


# --- four eyes across kernels -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_four_eyes_separates_two_peoples_clients_of_one_served_home(tmp_path, clean_env):
    root = tmp_path / "home"
    _deposit(SimpleNamespace(path=root), FOUR_EYES)  # type: ignore[arg-type]  # only its path is read
    work = tmp_path / "work"
    work.mkdir()
    writer = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}],
                      workspace=str(work))
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"], bob=["approver"])
        clean_env.setenv("APOLLIA_TOKEN", tokens["ann"])  # ann's kernel
        async with Runtime(root) as rt:
            assert rt.mode == "client" and rt.server.token == tokens["ann"]
            await rt.register_agent(writer)
            handle = await rt.submit("clerk", "Write a.txt", watched=False)
            with anyio.fail_after(60):
                await handle.settled()
            assert handle.status == "waiting"
            headers = {"Authorization": f"Bearer {tokens['ann']}"}
            async with httpx.AsyncClient(base_url=url + "/api/v1", headers=headers, timeout=60) as ann, \
                    httpx.AsyncClient(base_url=url + "/api/v1", timeout=60,
                                      headers={"Authorization": f"Bearer {tokens['bob']}"}) as bob:
                [pending] = [p for p in (await bob.get("/pending-decisions")).json() if p["run_id"] == handle.run_id]
                assert (pending["may_answer"]["started_by"], pending["may_answer"]["excluded"]) == ("ann", ["ann"])
                for body in ({"answer": "once"}, {"answer": "once", "by": "bob"}):
                    _refused(await ann.post("/pending-decisions/decide", json={"id": pending["id"], **body}),
                             "four eyes", "ann started this run")
                assert not (work / "a.txt").exists()
                answered = await bob.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
                assert answered.status_code == 200, answered.text
            with anyio.fail_after(60):
                await handle.wait()
            assert handle.status == "completed"
        entries = _entries(url, handle.run_id)
    [opened] = [e["payload"] for e in entries if e["kind"] == "run_open"]
    assert opened["started_by"] == "ann" and opened["task_id"] == handle.id
    [answer] = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert (answer["answered_by"], answer["by_role"], answer["answer"]) == ("bob", "approver", "once")
    refused = [e["payload"] for e in entries if e["kind"] == "answer_refused"]
    assert [(r["person"], r["code"]) for r in refused] == [("ann", "FORBIDDEN")] * 2
    assert (work / "a.txt").read_text() == "one"


# --- what a person's client may write -----------------------------------------------------------------

#: Kinds only the server writes (when it does the thing), never a client: a sample of each family.
SERVERS_KINDS = ["answer", "approval", "answer_refused", "approval_refused", "consent_granted", "consent_revoked",
                 "consent_expired", "consents_review", "agent_identity", "policy_loaded", "policy_refused",
                 "policy_removed", "person_added", "person_revoked", "erasure", "rule_added", "rule_removed",
                 "devmode_changed", "developer_mode_changed", "checkpoint", "task_submitted", "home_repaired",
                 "home_file_created", "home_damaged", "note", "some_kind_nobody_writes"]


def test_a_persons_token_appends_only_run_activity_of_the_runs_that_person_opened(tmp_path, clean_env):
    home = tmp_path / "home"
    with serving(home) as url:
        tokens = _people(url, ann=["runner", "approver", "rules"], bob=["runner"])
        with _client(url, tokens["ann"]) as ann, _client(url, tokens["bob"]) as bob, _client(url, OWNER) as owner:
            mine, theirs = _run(), _run()
            # a run opened through a person's token is that person's, whatever its payload says
            opened = _append(ann, _draft("run_open", mine, run_kind="task", task_id="task-ann", started_by="bob"))
            assert opened.status_code == 201, opened.text
            assert json.loads(opened.json()["entries"][0]["payload"])["started_by"] == "ann"
            assert _append(bob, _draft("run_open", theirs, run_kind="task", task_id="task-bob")).status_code == 201
            assert _append(ann, _draft("task_status", mine, task_id="task-ann", status="running")).status_code == 201

            head = _head(owner)
            for kind in SERVERS_KINDS:  # never from a client, not even in the person's own run
                _refused(_append(ann, _draft(kind, mine, decision_id="d", answer="once", by="ann")),
                         f"does not append {kind!r} entries")
            # one forbidden entry refuses the whole group: nothing of it is appended
            _refused(_append(ann, _draft("model_response", mine, role="actor", turn=1, text="", tool_calls=[]),
                             _draft("answer", mine, decision_id="d", answer="once")), "'answer'")
            # another person's run: no entry, no second opening, no call, no waiting decision, no read
            _refused(_append(ann, _draft("tool_result", theirs, call_id="c", tool="t", status="ok",
                                         output_digest="0" * 64)), f"run {theirs} is not one of them")
            _refused(_append(ann, _draft("run_open", theirs, run_kind="task")), "exists already")
            _refused(_append(ann, _draft("run_open", _run(), run_kind="task"),
                             _draft("tool_result", theirs, call_id="c", tool="t", status="ok", output_digest="0" * 64)),
                     "not one of them")
            _refused(_append(ann, _draft("tool_call", None, call_id="c", tool="t", arguments={})), "outside a run")
            call_body = {"call_id": "c1", "run_id": theirs, "agent": "clerk", "tool": "read_file", "family": "read",
                         "arguments": {"path": "a.txt"}, "decision": {"call_id": "c1", "arguments": {}}}
            _refused(ann.post("/internal/calls", json=call_body), "not one of them")
            _refused(ann.post("/internal/calls", json={**call_body, "run_id": mine, "before": [
                _draft("decision", mine, call_id="c0", outcome="allow")]}), "'decision'", "before a governed call")
            pending = {"run_id": theirs, "task_id": "task-bob", "agent": "clerk", "tool": "write_file",
                       "family": "write", "arguments": {"path": "a.txt"}, "answers": ["once", "refuse"]}
            _refused(ann.post("/internal/pending-decisions", json=pending), "not one of them")
            _refused(ann.post("/internal/pending-decisions", json={**pending, "run_id": mine}), "task-ann", "task-bob")
            _refused(bob.get("/internal/journal/entries", params={"run_id": mine}), "not one of them")
            _refused(bob.get("/internal/journal/run-size", params={"run_id": mine}), "not one of them")
            every = bob.get("/internal/journal/entries")  # every run's entries: an auditor's read
            assert every.status_code == 422 and "give its run_id" in every.json()["message"], every.text
            assert _head(owner) == head  # nothing of any refused request was appended

            theirs_pending = owner.post("/internal/pending-decisions", json=pending)
            assert theirs_pending.status_code == 201, theirs_pending.text
            _refused(ann.get("/internal/answers", params={"ids": [theirs_pending.json()["id"]], "timeout": 0}),
                     "not one of them")
            listed = ann.post("/internal/pending-decisions", json={**pending, "run_id": mine, "task_id": "task-ann"})
            assert listed.status_code == 201, listed.text
            assert ann.get("/internal/answers", params={"ids": [listed.json()["id"]], "timeout": 0}).json() == []
            assert bob.get("/internal/journal/run-size", params={"run_id": theirs}).json()["entries"] == 1
            assert ann.post("/internal/journal/checkpoint").status_code == 200  # signed by the server, of what it holds
            # the owner's token is held to none of it
            assert _append(owner, _draft("note", theirs, text="the owner writes what it likes")).status_code == 201


def test_a_restarted_server_still_knows_who_opened_a_run_and_a_revoked_token_stops_at_once(tmp_path, clean_env):
    home = tmp_path / "home"
    run = _run()
    with serving(home) as url:
        tokens = _people(url, ann=["runner"], bob=["runner"])
        with _client(url, tokens["ann"]) as ann:
            assert _append(ann, _draft("run_open", run, run_kind="task", task_id="task-1")).status_code == 201
    # a new server process: who opened the run is read back from the journal
    with serving(home) as url, _client(url, tokens["ann"]) as ann, _client(url, tokens["bob"]) as bob, \
            _client(url, OWNER) as owner:
        _refused(_append(bob, _draft("task_status", run, task_id="task-1", status="running")), "not one of them")
        assert _append(ann, _draft("task_status", run, task_id="task-1", status="running")).status_code == 201
        assert owner.post("/people/ann/revoke").status_code == 200
        gone = _append(ann, _draft("task_status", run, task_id="task-1", status="completed"))
        assert gone.status_code == 401 and gone.json()["code"] == "UNAUTHORIZED"
        assert tokens["ann"] not in gone.text
    assert [e["kind"] for e in _entries_after(home, run)] == ["run_open", "task_status"]


def _entries_after(home: Path, run: str) -> list[dict[str, Any]]:
    with serving(home) as url:
        return _entries(url, run)


def test_a_runners_client_may_not_forge_whose_run_it_is_through_a_task_id(tmp_path, clean_env):
    """A waiting decision of a person's run names the task its ``run_open`` named, never another's: the server
    reads who started the run from the run itself, so a self-approval stays refused."""
    root = tmp_path / "home"
    _deposit(SimpleNamespace(path=root), FOUR_EYES)  # type: ignore[arg-type]  # only its path is read
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"], bob=["runner", "approver"])
        with _client(url, tokens["ann"]) as ann, _client(url, OWNER) as owner:
            run = _run()
            assert _append(ann, _draft("run_open", run, run_kind="task", task_id="task-ann")).status_code == 201
            pending = {"run_id": run, "task_id": "task-ann", "agent": "clerk", "tool": "write_file",
                       "family": "write", "arguments": {"path": "a.txt"}, "answers": ["once", "refuse"]}
            listed = ann.post("/internal/pending-decisions", json=pending)
            assert listed.status_code == 201, listed.text
            shown = [p for p in owner.get("/pending-decisions").json() if p["id"] == listed.json()["id"]]
            assert shown[0]["may_answer"]["started_by"] == "ann"
            _refused(ann.post("/pending-decisions/decide", json={"id": listed.json()["id"], "answer": "once"}),
                     "four eyes")
            with _client(url, tokens["bob"]) as bob:
                assert bob.post("/pending-decisions/decide",
                                json={"id": listed.json()["id"], "answer": "once"}).status_code == 200


def test_a_batch_a_person_starts_runs_its_items_as_that_person(tmp_path, clean_env):
    """The items of a Dask batch carry a worker credential, not the person's token: the runs they open are still
    the person's who asked for the credential, so four eyes keeps them from approving their items' calls."""
    root = tmp_path / "home"
    _deposit(SimpleNamespace(path=root), FOUR_EYES)  # type: ignore[arg-type]  # only its path is read
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"], bob=["approver"])
        with _client(url, tokens["ann"]) as ann, _client(url, tokens["bob"]) as bob, _client(url, OWNER) as owner:
            made = ann.post("/internal/worker-tokens", json={"agent": "clerk", "batch_id": "batch-ab12", "tasks": 1})
            assert made.status_code == 201, made.text
            by_owner = owner.post("/internal/worker-tokens", json={"agent": "clerk", "batch_id": "batch-cd34",
                                                                   "tasks": 1})
            run, owners_run = _run(), _run()
            with _client(url, made.json()["token"]) as worker, _client(url, by_owner.json()["token"]) as theirs:
                opened = _append(worker, _draft("run_open", run, run_kind="task", task_id="task-ab12-0",
                                                started_by="bob"))
                assert opened.status_code == 201, opened.text
                assert json.loads(opened.json()["entries"][0]["payload"])["started_by"] == "ann"
                plain = _append(theirs, _draft("run_open", owners_run, run_kind="task", task_id="task-cd34-0",
                                               started_by="bob"))
                assert "started_by" not in json.loads(plain.json()["entries"][0]["payload"])  # the owner's: nobody
                listed = worker.post("/internal/pending-decisions", json={
                    "run_id": run, "task_id": "task-ab12-0", "agent": "clerk", "tool": "write_file",
                    "family": "write", "arguments": {"path": "a.txt"}, "answers": ["once", "refuse"]})
                assert listed.status_code == 201, listed.text
            decision = listed.json()["id"]
            _refused(ann.post("/pending-decisions/decide", json={"id": decision, "answer": "once"}), "four eyes")
            assert bob.post("/pending-decisions/decide", json={"id": decision, "answer": "once"}).status_code == 200


def test_forbidden_is_the_error_a_client_runtime_raises(tmp_path, clean_env):
    """A person's client runtime hears the server's refusal as ``FORBIDDEN`` with its reason."""
    home = tmp_path / "home"
    with serving(home) as url:
        tokens = _people(url, ann=["runner"])
        clean_env.setenv("APOLLIA_TOKEN", tokens["ann"])

        async def main() -> None:
            async with Runtime(home) as rt:
                with pytest.raises(Forbidden) as info:
                    rt.journal.append("consent_granted", {"agent": "clerk", "family": "send"}, run_id=_run())
                assert "does not append 'consent_granted' entries" in info.value.message

        anyio.run(main)


# --- a real IPython kernel joining the served home ------------------------------------------------------


def test_a_kernel_joined_with_a_persons_token_is_that_person_for_four_eyes(tmp_path, clean_env, capsys):
    """ann's kernel (IPython, ``%load_ext apollia_nb`` on a served home, ``$APOLLIA_TOKEN`` hers) runs her agent;
    her own answer from the kernel is refused, bob's over REST lets the run go on in her kernel."""
    from IPython.testing import globalipapp

    from apollia_nb.notebook.extension import unload_ipython_extension

    root, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    _deposit(SimpleNamespace(path=root), FOUR_EYES)  # type: ignore[arg-type]  # only its path is read
    clean_env.chdir(work)
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"], bob=["approver"])
        clean_env.setenv("APOLLIA_HOME", str(root))
        clean_env.setenv("APOLLIA_TOKEN", tokens["ann"])
        globalipapp.start_ipython()
        shell = globalipapp.get_ipython()
        shell.run_line_magic("load_ext", "apollia_nb")
        try:
            rt = shell.magics_manager.registry["ApolliaMagics"].runtime.rt
            assert rt.mode == "client" and rt.server.token == tokens["ann"]
            shell.run_cell_magic("apollia", "agent", manifest(
                actor=[{"tool_calls": [call("write_file", path="k.txt", content="kernel")]}, {"text": "Done."}],
                workspace=str(work)))
            task = shell.run_cell_magic("apollia", "task clerk", "Write k.txt")
            task.join(60, settled=True)
            [card] = task.pending
            with pytest.raises(Forbidden) as info:
                card.answer("once")
            assert "four eyes" in info.value.message and "ann started this run" in info.value.message
            with _client(url, tokens["bob"]) as bob:
                answered = bob.post("/pending-decisions/decide", json={"id": card.id, "answer": "once"})
                assert answered.status_code == 200, answered.text
            assert task.join(60).status == "completed"
            run_id = task.run_id
        finally:
            unload_ipython_extension(shell)
            shell.extension_manager.loaded.discard("apollia_nb")
            shell.config.pop("ApolliaMagics", None)
            capsys.readouterr()
        entries = _entries(url, run_id)
    [opened] = [e["payload"] for e in entries if e["kind"] == "run_open"]
    [answer] = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert (opened["started_by"], answer["answered_by"]) == ("ann", "bob")
    assert (work / "k.txt").read_text() == "kernel"
