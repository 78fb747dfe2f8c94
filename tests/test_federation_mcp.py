"""MCP servers as governed tools, through the real runtime.

Third-party servers run as users run them, each from its own installation
(``dev/install-test-mcp-servers.sh``): ``mcp-server-time`` from PyPI in its own
virtual environment and ``@modelcontextprotocol/server-filesystem`` from npm,
both over stdio. A small faulty server (the project's own MCP SDK) crashes and
hangs on demand.
"""

from __future__ import annotations

import os

import pytest

from apollia_nb.errors import UnknownTool
from apollia_nb.governance.policy import keygen, sign
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from test_federation_support import (
    FILESYSTEM_JS,
    TIME_PYTHON,
    answer_all,
    decisions,
    faulty_server,
    node,
    require_peer,
    results,
    write_config,
)

pytestmark = pytest.mark.anyio


def time_server(**extra):
    return {"command": str(require_peer(TIME_PYTHON)), "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
            **extra}


def filesystem_server(root, **extra):
    return {"command": node(), "args": [str(require_peer(FILESYSTEM_JS)), str(root)], **extra}


async def test_unclassified_tool_is_asked_every_time_never_with_always(home, tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    (root / "plan.txt").write_text("ship on friday")
    # roots = false: the server keeps the directory it was given (offered roots would replace it)
    write_config(home, servers={"files": filesystem_server(root, roots=False)})
    async with Runtime(home, tool_sources=open_sources) as rt:
        read = call("mcp:files/read_text_file", path=str(root / "plan.txt"))
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [read]}, {"tool_calls": [read]}, {"text": "read twice"}],
            required=["mcp:files/read_text_file"]))
        handle = await rt.submit("clerk", "Read the plan twice")
        cards = await answer_all(rt, handle, "once")
        assert handle.status == "completed", handle.error
        assert [c.tool for c in cards] == ["mcp:files/read_text_file"] * 2  # asked again: no standing answer
        for card in cards:
            assert card.family is None and card.answers == ("once", "refuse") and card.line == 6
            assert card.hints["readOnlyHint"] is True  # shown as a hint, not trusted to classify
        assert [r["output"] for r in results(rt, handle.run_id)] == [{"content": "ship on friday"}] * 2
        assert rt.governance.consents() == []


async def test_classified_read_tool_runs_unattended_without_asking(home):
    write_config(home, servers={"time": time_server(families={"get_current_time": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:time/get_current_time", timezone="UTC")]}, {"text": "it is late"}],
            required=["mcp:time/get_current_time"]))
        handle = await rt.submit("clerk", "What time is it?", watched=False)
        await handle
        assert handle.status == "completed", handle.error
        assert rt.pending_decisions() == []
        [decided] = decisions(rt, handle.run_id)
        shown = (decided["outcome"], decided["line"], decided["family"], decided["connection"])
        assert shown == ("allow", 3, "read", "time")
        [result] = results(rt, handle.run_id)
        assert result["status"] == "ok" and result["output"]["timezone"] == "UTC"


async def test_annotations_are_shown_on_the_card_and_never_classify(home):
    # The server says get_current_time is read-only; the operator says it writes. The operator wins.
    write_config(home, servers={"time": time_server(families={"get_current_time": "write"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:time/get_current_time", timezone="UTC"),
                                   call("mcp:time/convert_time", source_timezone="UTC", time="12:00",
                                        target_timezone="Europe/Paris")]},
                   {"text": "done"}],
            required=["mcp:time/get_current_time", "mcp:time/convert_time"]))
        tools = {name: agent.tools.get(name) for name in agent.offered}
        assert tools["mcp:time/get_current_time"].family.value == "write"
        assert tools["mcp:time/convert_time"].family is None
        handle = await rt.submit("clerk", "Time in Paris at noon UTC")
        cards = await answer_all(rt, handle, "once")
        assert handle.status == "completed", handle.error
        by_tool = {c.tool: c for c in cards}
        written = by_tool["mcp:time/get_current_time"]
        assert (written.family, written.answers) == ("write", ("once", "always", "refuse"))
        assert written.hints == {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True,
                                 "openWorldHint": False}
        unclassified = by_tool["mcp:time/convert_time"]
        assert (unclassified.family, unclassified.answers) == (None, ("once", "refuse"))
        assert unclassified.hints["readOnlyHint"] is True


async def test_an_error_result_is_a_permanent_failure_with_the_servers_words(home, tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    write_config(home, servers={"files": filesystem_server(root, families={"read_text_file": "read"})})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:files/read_text_file", path="/etc/hostname")]}, {"text": "denied"}],
            required=["mcp:files/read_text_file"]))
        handle = await rt.submit("clerk", "Read outside the root")
        await handle
        [result] = results(rt, handle.run_id)
        assert result["status"] == "error" and result["error_code"] == "TOOL_PERMANENT"
        assert "Access denied" in result["output"]["message"]
        assert rt.breakers.get("mcp:files/read_text_file").consecutive_failures == 0


async def _deposit_policy(home, tmp_path, policy_text):
    _, public = keygen(tmp_path / "org.key")
    home.policy_path.parent.mkdir(parents=True, exist_ok=True)
    home.policy_path.write_text(policy_text, encoding="utf-8")
    sign(home.policy_path, tmp_path / "org.key")
    return public


async def test_a_connection_refused_by_policy_never_starts_its_server(home, tmp_path):
    faulty, marker = faulty_server(tmp_path)
    public = await _deposit_policy(home, tmp_path, '[refuse]\nconnections = ["faulty"]\n')
    write_config(home, servers={"faulty": faulty}, trusted_keys=[public])
    async with Runtime(home, tool_sources=open_sources) as rt:
        assert rt.governance.policy_state().status == "accepted"
        agent = await rt.register_agent(manifest(optional=["mcp:faulty/echo"]))
        assert agent.state.state.value == "degraded"
        assert any("organisation policy refuses the connection 'faulty'" in w for w in agent.warnings)
        assert "mcp:faulty/echo" not in agent.offered
        with pytest.raises(UnknownTool):
            await rt.register_agent(manifest(name="strict", required=["mcp:faulty/echo"]))
    assert not marker.exists()
    assert not (home.logs_dir / "mcp-faulty.log").exists()


async def test_unresolved_tools_degrade_or_fail_the_agent(home, tmp_path):
    write_config(home, servers={
        "time": time_server(),
        "gone": {"command": str(tmp_path / "no-such-server"), "start_timeout_secs": 10},
    })
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(manifest(
            required=["mcp:time/get_current_time"], optional=["mcp:time/no_such_tool", "mcp:gone/anything"]))
        assert agent.state.state.value == "degraded"
        assert "mcp:time/get_current_time" in agent.offered
        joined = "\n".join(agent.warnings)
        assert "optional tools did not resolve: mcp:time/no_such_tool, mcp:gone/anything" in joined
        assert "mcp:gone: the server could not be started" in joined
        with pytest.raises(UnknownTool, match="mcp:time/no_such_tool"):
            await rt.register_agent(manifest(name="strict", required=["mcp:time/no_such_tool"]))


async def test_a_crash_mid_call_is_transient_and_the_server_restarts_on_next_use(home, tmp_path):
    faulty, marker = faulty_server(tmp_path)
    write_config(home, servers={"faulty": faulty})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:faulty/pid")]}, {"tool_calls": [call("mcp:faulty/crash")]},
                   {"tool_calls": [call("mcp:faulty/pid")]}, {"text": "survived"}],
            required=["mcp:faulty/pid", "mcp:faulty/crash"]))
        handle = await rt.submit("clerk", "Crash the server once")
        await handle
        first, crashed, second = results(rt, handle.run_id)
        assert crashed["status"] == "error" and crashed["error_code"] == "TOOL_TRANSIENT"
        assert "closed the connection" in crashed["output"]["message"]
        assert first["output"]["pid"] != second["output"]["pid"]
        assert marker.read_text().split() == [str(first["output"]["pid"]), str(second["output"]["pid"])]
        assert rt.breakers.get("mcp:faulty/crash").consecutive_failures == 1  # counted by its breaker
        last_pid = second["output"]["pid"]
    with pytest.raises(ProcessLookupError):  # closing the runtime stopped the server
        os.kill(last_pid, 0)


async def test_a_hanging_server_times_out_and_is_restarted(home, tmp_path):
    faulty, marker = faulty_server(tmp_path, timeout_secs=1)
    write_config(home, servers={"faulty": faulty})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(
            actor=[{"tool_calls": [call("mcp:faulty/hang")]}, {"tool_calls": [call("mcp:faulty/echo", text="back")]},
                   {"text": "done"}],
            required=["mcp:faulty/hang", "mcp:faulty/echo"]))
        handle = await rt.submit("clerk", "Wait forever, then echo")
        await handle
        hung, echoed = results(rt, handle.run_id)
        assert hung["error_code"] == "TOOL_TIMEOUT"
        assert "did not answer within 1 s" in hung["output"]["message"]
        assert rt.breakers.get("mcp:faulty/hang").consecutive_failures == 1
        assert echoed["status"] == "ok" and echoed["output"] == {"result": "back"}
        assert len(marker.read_text().split()) == 2  # started at registration, again after the timeout


async def test_a_stdio_servers_stderr_goes_to_its_log_file(home, tmp_path, capfd):
    faulty, marker = faulty_server(tmp_path)
    write_config(home, servers={"faulty": faulty})
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(manifest(required=["mcp:faulty/echo"]))
        pid = marker.read_text().split()[0]
        log = (home.logs_dir / "mcp-faulty.log").read_text()
    assert f"faulty server starting pid={pid}" in log
    assert "--- apollia-nb" in log and "starting" in log
    assert "faulty server starting" not in capfd.readouterr().err
