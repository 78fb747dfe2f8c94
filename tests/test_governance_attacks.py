"""Attacks on governance through its public surfaces: a real Runtime, a scripted agent, a real
workspace and home. Each test asserts the effect an attacker wanted did not happen."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.governance.decision import Call, GovernanceView, Rule, decide
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.tools import ToolDef
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

# Python that bash reads as one simple command `1 or '\;import os;…#'`: Python runs the import.
SMUGGLED_PYTHON = "1 or '\\'';open('MARKER', 'w').close()#'"


def decisions(rt, run_id):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == "decision"]


async def test_python_code_is_never_allowed_by_a_command_rule(home):
    async with Runtime(home) as rt:
        rt.governance.set_developer_mode(True, by="test")
        rt.governance.add_rule("python_executor", "allow", prefix="1", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("python_executor", code=SMUGGLED_PYTHON)]},
                                                {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        handle = await rt.submit("clerk", "Compute")
        await handle.settled()
        assert not (workspace / "MARKER").exists()
        assert handle.status == "waiting"
        [card] = handle.pending
        assert (card.line, card.answers) == (4, ("once", "refuse"))
        assert "not a shell command" in card.reason
        card.answer("refuse")
        await handle.settled()
        assert not (workspace / "MARKER").exists()


async def test_always_is_not_offered_for_python_code(home):
    async with Runtime(home) as rt:
        rt.governance.set_developer_mode(True, by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("python_executor", code="1")]},
                                                {"tool_calls": [call("python_executor", code=SMUGGLED_PYTHON)]},
                                                {"text": "done"}]))
        handle = await rt.submit("clerk", "Compute")
        await handle.settled()
        [card] = handle.pending
        assert card.arguments == {"code": "1"} and card.answers == ("once", "refuse")
        with pytest.raises(BadAnswer):
            card.answer("always")
        assert not [r for r in rt.governance.rules() if r.effect == "allow"]
        card.answer("once")
        await handle.settled()
        [second] = [c for c in handle.pending if c.waiting]
        assert second.arguments == {"code": SMUGGLED_PYTHON}
        assert not (rt.agent("clerk").workspace / "MARKER").exists()


def test_decide_allows_by_rule_only_a_shell_command():
    view = GovernanceView(developer_mode=True, rules=(Rule("run", "allow", "1"),))
    shell = decide(Call("a", "run", "execute", {"code": SMUGGLED_PYTHON}), view)
    other = decide(Call("a", "run", "execute", {"code": SMUGGLED_PYTHON}, shell=False), view)
    plain = decide(Call("a", "run", "execute", {"code": "1"}, shell=False), GovernanceView(developer_mode=True))
    assert shell.outcome == "allow"  # bash would run `1` with two arguments: nothing else
    assert (other.outcome, other.line, other.answers) == ("ask", 4, ("once", "refuse"))
    assert (plain.outcome, plain.answers) == ("ask", ("once", "refuse"))


async def test_a_deny_prefix_sees_every_path_inside_a_list_or_mapping_argument(home):
    removed: list[str] = []

    def delete_many(paths: list) -> dict:
        """Delete files by name."""
        for name in paths if isinstance(paths, list) else paths.values():
            for leaf in name if isinstance(name, list) else [name]:
                removed.append(leaf)
        return {"deleted": len(removed)}

    tooldef = ToolDef.from_function(delete_many, "write")
    deleted = ToolDef.from_function(lambda targets: removed.extend(targets["keep"]["files"]) or {},
                                    "write", name="delete_by_map")
    attempts = [("delete_many", {"paths": ["notes.txt", "secrets/key"]}),
                ("delete_many", {"paths": [["notes.txt", "secrets/key"]]}),
                ("delete_by_map", {"targets": {"keep": {"files": ["secrets/k"]}}})]
    async with Runtime(home) as rt:
        rt.governance.add_rule("delete_many", "deny", prefix="secrets/", by="test")
        rt.governance.add_rule("delete_by_map", "deny", prefix="secrets/", by="test")
        for n, (name, arguments) in enumerate(attempts):
            rt.governance.grant_consent(f"a{n}", "write", by="test")
            await rt.register_agent(
                manifest(f"a{n}", actor=[{"tool_calls": [call(name, **arguments)]}, {"text": "done"}],
                         optional=[name]),
                tools=[tooldef, deleted])
            task = await (await rt.submit(f"a{n}", "Tidy up"))
            assert task.status == "failed" and task.error["code"] == "REFUSED", (name, arguments)
            assert [d["line"] for d in decisions(rt, task.run_id)] == [2]
        assert removed == []


def test_a_container_too_large_or_deep_to_read_matches_every_deny_rule():
    view = GovernanceView(rules=(Rule("t", "deny", "secrets/"),))
    deep: list = ["x"]
    for _ in range(20):
        deep = [deep]
    many = [f"f{i}" for i in range(5000)]
    for argument in (deep, many, {"k": deep}):
        assert decide(Call("a", "t", "write", {"p": argument}), view).line == 2
    assert decide(Call("a", "t", "write", {"p": ["a", "b"]}), view).outcome == "ask"


async def test_a_hard_link_to_a_home_file_is_out_of_reach_of_the_file_tools(home):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("read_file", path="notes.txt")]},
                                                {"tool_calls": [call("write_file", path="rules.db", content="x")]},
                                                {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        key = home.path / "keys" / "journal.key"
        governance_db = home.path / "governance.db"
        before = governance_db.read_bytes()
        # What one approved `ln ~/.apollia/keys/journal.key notes.txt` would leave behind.
        os.link(key, workspace / "notes.txt")
        os.link(governance_db, workspace / "rules.db")
        task = await (await rt.submit("clerk", "Read the notes"))
        results = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id) if e.kind == "tool_result"]
        assert [r.get("error_code") for r in results] == ["PATH_IN_HOME", "PATH_IN_HOME"]
        journaled = "\n".join(bytes(e.payload).decode("utf-8") for e in rt.journal.entries())
        assert key.read_text().strip() not in journaled
        assert governance_db.read_bytes() == before
        assert rt.governance.view().readable


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def test_a_background_job_does_not_outlive_the_approved_command(home):
    command = "(sleep 30; touch MARKER) >/dev/null 2>&1 & echo $!"
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("bash_executor", command=command)]},
                                                {"text": "done"}]))
        handle = await rt.submit("clerk", "Start it")
        await handle.settled()
        [card] = handle.pending
        card.answer("once")
        await handle.settled()
        assert handle.status == "completed"
        [result] = [json.loads(e.payload) for e in rt.journal.entries(run_id=handle.run_id)
                    if e.kind == "tool_result"]
        pid = int(result["output"]["stdout"])
        with anyio.fail_after(10):  # SIGKILL is sent when the call ends; its delivery is not instant
            while _running(pid):
                await anyio.sleep(0.01)
        assert not (rt.agent("clerk").workspace / "MARKER").exists()


@pytest.fixture
def listener():
    """A real HTTP server on 127.0.0.1 that records every request it receives."""
    import http.server
    import threading

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("spelling", [
    "http://127.1:{port}/secret",
    "HTTP://user:pw@127.0.0.1:{port}/secret",
    "http://example.org\\@127.0.0.1:{port}/secret",
    "http://0x7f.0.0.1:{port}/secret",
    "http://[::ffff:127.0.0.1]:{port}/secret",
])
async def test_a_deny_rule_on_a_url_sees_where_the_request_goes(home, listener, spelling):
    port, seen = listener
    url = spelling.format(port=port)
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "send", by="test")
        rt.governance.add_rule("http_request", "deny", prefix=f"http://127.0.0.1:{port}/", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("http_request", url=url)]}, {"text": "done"}]))
        task = await (await rt.submit("clerk", "Fetch"))
        assert task.status == "failed" and task.error["code"] in ("REFUSED", "BAD_ARGUMENT"), url
        assert seen == []


async def test_the_url_the_rule_names_is_refused_in_any_case_and_others_are_sent(home, listener):
    port, seen = listener
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "send", by="test")
        rt.governance.add_rule("http_request", "deny", prefix=f"HTTP://LOCALHOST:{port}/Secret", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("http_request", url=f"http://127.0.0.1:{port}/public")]},
            {"tool_calls": [call("http_request", url=f"http://localhost.:{port}/Secret")]},
            {"text": "done"}]))
        task = await (await rt.submit("clerk", "Fetch"))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert seen == ["/public"]


@pytest.mark.parametrize("target", [".git/config", "sub/.git/hooks/pre-commit", ".GIT/config", ".git"])
async def test_a_write_into_a_git_directory_is_asked_despite_a_write_consent(home, target):
    config = '[core]\n\tfsmonitor = "touch MARKER; false"\n'
    async with Runtime(home) as rt:
        rt.governance.set_developer_mode(True, by="test")
        rt.governance.grant_consent("clerk", "write", by="test")
        rt.governance.add_rule("bash_executor", "allow", prefix="git status", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path=target, content=config)]},
            {"tool_calls": [call("bash_executor", command="git status")]},
            {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        subprocess.run(["git", "init", "-q", str(workspace)], check=True)
        (workspace / "notes.txt").write_text("notes")
        before = (workspace / ".git" / "config").read_text()
        handle = await rt.submit("clerk", "Tidy the repository")
        await handle.settled()
        assert handle.status == "waiting"
        [card] = handle.pending
        assert (card.tool, card.line, card.answers) == ("write_file", 5, ("once", "refuse"))
        assert ".git directory" in card.reason
        card.answer("refuse")
        await handle.settled()
        assert (workspace / ".git" / "config").read_text() == before
        assert not (workspace / "MARKER").exists()


async def test_other_writes_keep_their_consent(home):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path=".gitignore", content="*.pyc\n")]},
            {"tool_calls": [call("write_file", path="docs/git/notes.md", content="x")]},
            {"text": "done"}]))
        task = await (await rt.submit("clerk", "Write"))
        assert task.status == "completed", task.error
        assert [d["outcome"] for d in decisions(rt, task.run_id)] == ["allow", "allow"]


async def test_an_undeclared_argument_put_first_does_not_hide_the_one_a_deny_rule_names(home):
    read: list[str] = []

    async def fetch(**arguments):
        read.extend(str(v) for v in arguments.values())
        return {"ok": True}

    # A federated tool whose schema admits any argument, as an MCP server may declare it.
    loose = ToolDef(name="mcp:fs/read", family="read", fn=fetch,
                    parameters={"type": "object", "properties": {}, "additionalProperties": True})
    async with Runtime(home) as rt:
        rt.governance.add_rule("mcp:fs/read", "deny", prefix="secrets/", by="test")
        await rt.register_agent(
            manifest(actor=[{"tool_calls": [call("mcp:fs/read", encoding="utf-8", path="secrets/key")]},
                            {"text": "done"}], optional=["mcp:fs/read"]),
            tools=[loose])
        task = await (await rt.submit("clerk", "Read"))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert [d["line"] for d in decisions(rt, task.run_id)] == [2]
        assert read == []


async def test_a_deny_rule_names_its_tool_in_any_case_an_allow_rule_exactly(home):
    async with Runtime(home) as rt:
        rt.governance.set_developer_mode(True, by="test")
        rt.governance.add_rule("Read_File", "deny", prefix="secrets/", by="test")
        rt.governance.add_rule("BASH_EXECUTOR", "allow", prefix="ls", by="test")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("read_file", path="secrets/key")]},
                                                {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        (workspace / "secrets").mkdir()
        (workspace / "secrets" / "key").write_text("the secret itself")
        task = await (await rt.submit("clerk", "Read"))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        [decision] = decisions(rt, task.run_id)
        assert decision["line"] == 2 and "'Read_File'" in decision["reason"]
        journaled = "\n".join(bytes(e.payload).decode("utf-8") for e in rt.journal.entries())
        assert "the secret itself" not in journaled
    view = GovernanceView(developer_mode=True, rules=(Rule("BASH_EXECUTOR", "allow", "ls"),))
    assert decide(Call("a", "bash_executor", "execute", {"command": "ls"}), view).outcome == "ask"
