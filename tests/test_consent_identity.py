"""A standing consent belongs to what it was given for: the agent's tools, its resolved workspace and
its model, whichever process registers the agent again.

Real parts: a real `apollia-os serve` subprocess owning the home and a client ``Runtime`` in this
process (the script that joins a served home), owner runtimes on real DuckDB files, and
`apollia-os run` as a subprocess started from another folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from apollia_nb.errors import Conflict, ConsentsToReview
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def writer(workspace: str | None = None, *, tools=("write_file",), path: str = "out.txt") -> str:
    return manifest("clerk", required=list(tools), workspace=workspace,
                    actor=[{"tool_calls": [call("write_file", path=path, content="hi")]}, {"text": "Wrote it."}])


def deleter(workspace: str, path: str = "keep.txt") -> str:
    return manifest("clerk", required=["write_file", "delete_file"], workspace=workspace,
                    actor=[{"tool_calls": [call("delete_file", path=path)]}, {"text": "Deleted it."}])


def kinds(rt: Runtime, kind: str) -> list[dict]:
    return [json.loads(e.payload) for e in rt.journal.entries() if e.kind == kind]


def consents(rt: Runtime) -> list[str]:
    return sorted(c.family.value for c in rt.governance.consents() if c.agent == "clerk")


@pytest.fixture
def folders(tmp_path):
    a, b = tmp_path / "projects" / "a", tmp_path / "projects" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    (b / "keep.txt").write_text("precious")
    return a, b


@pytest.fixture
def served(home, tmp_path):
    """`apollia-os serve` owning the home, started from its own folder; its SDK client."""
    cwd = tmp_path / "server-cwd"
    cwd.mkdir()
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home.path), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert proc.stdout.readline(), proc.stderr.read()  # one line once it listens
        with Client.from_home(home.path) as api:
            yield api
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


def _always_for_the_servers_clerk(api: Client, workspace: Path) -> None:
    api.register_agent(writer(str(workspace)))
    task = api.submit("clerk", "Write out.txt")
    assert api.wait(task.id).status == "waiting"
    [pending] = api.pending()
    api.decide(pending.id, "always")
    assert api.wait(task.id, until="finished").status == "completed"
    assert [(c.agent, c.family) for c in api.consents()] == [("clerk", "write")]


async def test_a_client_of_a_served_home_cannot_carry_a_consent_to_other_tools_and_another_workspace(
        home, served, folders):
    a, b = folders
    api = served
    _always_for_the_servers_clerk(api, a)
    api.stop_agent("clerk")
    async with Runtime(home) as client:
        assert client.mode == "client"
        with pytest.raises(ConsentsToReview) as info:
            await client.register_agent(deleter(str(b)))
        message = info.value.message
        assert "delete_file" in message and str(b) in message and "write" in message
        assert client.agents() == []

        # Dropped: the consent is gone for everyone, and deleting in b asks.
        await client.register_agent(deleter(str(b)), keep_consents=False)
        assert consents(client) == []
        handle = await client.submit("clerk", "Delete keep.txt")
        await handle.settled()
        assert handle.status == "waiting" and [c.tool for c in handle.pending] == ["delete_file"]
        assert (b / "keep.txt").read_text() == "precious"
        [review] = kinds(client, "consents_review")
        assert review["choice"] == "dropped" and review["consents"] == ["write"]
        assert set(review["difference"]) == {"tools", "workspace"}
        handle.pending[0].answer("refuse")
        with anyio.fail_after(30):
            await handle
    assert [c.agent for c in api.consents()] == []


async def test_the_public_route_and_a_client_share_one_review(home, served, folders):
    a, b = folders
    async with Runtime(home) as client:
        await client.register_agent(writer(str(a)))
        client.governance.grant_consent("clerk", "write", by="test")
        with pytest.raises(ConsentsToReview):  # the server's own registration of the same name
            served.register_agent(deleter(str(b)))
        assert [c.agent for c in served.consents()] == ["clerk"]


async def test_a_client_cannot_register_another_identity_under_a_name_the_server_runs(home, served, folders):
    a, b = folders
    served.register_agent(writer(str(a)))
    async with Runtime(home) as client:
        with pytest.raises(Conflict) as info:
            await client.register_agent(writer(str(b)))
        assert info.value.code == "CONFLICT" and "stop it there first" in info.value.message
        await client.register_agent(writer(str(a)))  # the same agent: a second process may run it
        assert client.agent("clerk").workspace == a.resolve()


async def test_a_workspace_of_dot_is_resolved_once_and_kept_by_later_processes(home, folders, monkeypatch):
    a, b = folders
    monkeypatch.chdir(a)
    async with Runtime(home) as rt:
        await rt.register_agent(writer())  # [workspace] root = "." (the default)
        assert rt.agent("clerk").workspace == a.resolve()
        rt.governance.grant_consent("clerk", "write", by="test")

    # `apollia-os run` from folder b: the agent restored in a, where its consent was given.
    done = subprocess.run([*APOLLIA, "run", "clerk", "Write out.txt", "--unattended", "--json"],
                          capture_output=True, text=True, cwd=b, timeout=120,
                          env={**os.environ, "APOLLIA_HOME": str(home.path)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert (a / "out.txt").read_text() == "hi" and not (b / "out.txt").exists()
    [bound] = [e for e in await _entries(home) if e["kind"] == "agent_identity"]
    assert bound["payload"]["identity"]["workspace"] == str(a.resolve())

    # The same manifest registered from folder b is another workspace: the consent is reviewed.
    monkeypatch.chdir(b)
    async with Runtime(home) as rt:
        assert rt.agent("clerk").workspace == a.resolve()
        await rt.stop_agent("clerk")
        with pytest.raises(ConsentsToReview) as info:
            await rt.register_agent(writer())
        assert f'workspace: "{a.resolve()}" -> "{b.resolve()}"' in info.value.message
        assert rt.agent("clerk").state.state == "stopped" and consents(rt) == ["write"]


async def _entries(home) -> list[dict]:
    async with Runtime(home) as rt:
        return [{"kind": e.kind, "payload": json.loads(e.payload)} for e in rt.journal.entries()]


@pytest.mark.parametrize("spelling", ["{a}/sub/../", "{link_to_a}"])
async def test_the_same_folder_spelled_otherwise_is_the_same_workspace(home, folders, spelling):
    a, _ = folders
    (a / "sub").mkdir()
    link = a.parent / "link-to-a"
    link.symlink_to(a)
    async with Runtime(home) as rt:
        await rt.register_agent(writer(str(a)))
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.stop_agent("clerk")
        await rt.register_agent(writer(spelling.format(a=a, link_to_a=link)))
        assert rt.agent("clerk").workspace == a.resolve()
        assert consents(rt) == ["write"] and kinds(rt, "consents_review") == []


@pytest.mark.parametrize("where", ["link", "parent", "other"])
async def test_another_folder_a_parent_or_a_link_elsewhere_is_reviewed_from_a_client(home, served, folders, where):
    a, b = folders
    link = a.parent / "link-to-b"
    link.symlink_to(b)
    workspace = {"link": link, "parent": a.parent, "other": b}[where]
    async with Runtime(home) as client:
        await client.register_agent(writer(str(a)))
        client.governance.grant_consent("clerk", "write", by="test")
        await client.stop_agent("clerk")
    async with Runtime(home) as client:  # a later client process: nothing of the first in its memory
        with pytest.raises(ConsentsToReview) as info:
            await client.register_agent(writer(str(workspace)))
        assert str(workspace.resolve()) in info.value.message
        await client.register_agent(writer(str(workspace)), keep_consents=True)
        assert consents(client) == ["write"]
        assert kinds(client, "consents_review")[-1]["choice"] == "kept"


async def test_reordered_tools_are_not_wider_and_fewer_tools_narrow_the_consent(home, folders):
    a, _ = folders
    async with Runtime(home) as rt:
        await rt.register_agent(writer(str(a), tools=("write_file", "delete_file")))
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.stop_agent("clerk")
        await rt.register_agent(writer(str(a), tools=("delete_file", "write_file")))  # reordered
        assert kinds(rt, "agent_identity")[-1]["identity"]["tools"] == ["delete_file", "write_file"]
        assert len(kinds(rt, "agent_identity")) == 1
        await rt.stop_agent("clerk")
        await rt.register_agent(writer(str(a), tools=("write_file",)))  # narrower: kept without asking
        assert consents(rt) == ["write"] and kinds(rt, "consents_review") == []
        assert kinds(rt, "agent_identity")[-1]["difference"]["tools"]["after"] == ["write_file"]
        await rt.stop_agent("clerk")
        with pytest.raises(ConsentsToReview):  # back to the wider set: the narrower one is what stands now
            await rt.register_agent(writer(str(a), tools=("write_file", "delete_file")))


async def test_an_identity_that_does_not_read_applies_no_consent_and_is_reviewed(home, folders):
    import duckdb

    from apollia_nb.governance.decision import Call, Family, decide

    a, _ = folders
    async with Runtime(home) as rt:
        await rt.register_agent(writer(str(a)))
        rt.governance.grant_consent("clerk", "write", by="test")
        assert ("clerk", Family.WRITE) in rt.governance.view().consents
        await rt.stop_agent("clerk")
    con = duckdb.connect(str(home.governance_db))
    con.execute("UPDATE agent_identities SET identity = replace(identity, ?, ?)", [str(a), str(a.parent)])
    con.close()
    async with Runtime(home) as rt:
        view = rt.governance.view()
        assert view.readable and ("clerk", Family.WRITE) not in view.consents
        asked = decide(Call(agent="clerk", tool="write_file", family=Family.WRITE, arguments={"path": "x"}), view)
        assert asked.outcome == "ask"
        with pytest.raises(ConsentsToReview) as info:
            await rt.register_agent(writer(str(a)))
        assert "does not read" in info.value.message
        await rt.register_agent(writer(str(a)), keep_consents=True)
        assert ("clerk", Family.WRITE) in rt.governance.view().consents


async def test_an_agent_registered_while_governance_cannot_be_read_gets_no_consent_until_registered_again(
        home, folders):
    from apollia_nb.governance.decision import Family

    a, b = folders
    async with Runtime(home) as rt:
        await rt.register_agent(writer(str(a)))
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.stop_agent("clerk")
        aside = home.governance_db.with_name("governance.db.aside")
        home.governance_db.rename(aside)  # governance cannot be read: the review cannot run
        warnings = []
        rt.subscribe(lambda kind, obj: warnings.append(obj) if kind == "warning" else None)
        await rt.register_agent(deleter(str(b)))  # reading goes on; its consents are held back
        assert any("held back" in w for w in warnings)
        aside.rename(home.governance_db)
        view = rt.governance.view()
        assert view.readable and ("clerk", Family.WRITE) not in view.consents
        assert consents(rt) == ["write"]  # still recorded, for the identity it was given for
        await rt.stop_agent("clerk")
        with pytest.raises(ConsentsToReview):
            await rt.register_agent(deleter(str(b)))
        await rt.register_agent(writer(str(a)))  # what the consent was given for: it applies again
        assert ("clerk", Family.WRITE) in rt.governance.view().consents
