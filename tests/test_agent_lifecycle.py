"""The agent process state machine as the registry enforces it, and the tool breaker in a run."""

from __future__ import annotations

import json

import anyio
import pytest

from apollia_nb.errors import AgentUnavailable, InvalidTransition, ManifestInvalid, TransientToolError, UnknownAgent, UnknownTool
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.scripted import ScriptedModel
from apollia_nb.runtime.tools import ToolDef
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio


async def test_registration_ends_active(home):
    async with Runtime(home) as rt:
        agent = await rt.register_agent(manifest(required=["read_file"]))
        assert agent.state.state == "active" and agent.warnings == []
        assert agent.to_dict()["tools"] == ["read_file"]


async def test_optional_tools_that_do_not_resolve_leave_the_agent_degraded(home):
    async with Runtime(home) as rt:
        agent = await rt.register_agent(manifest(required=["read_file"], optional=["mcp:notes/search"]))
        assert agent.state.state == "degraded"
        assert "mcp:notes/search" in agent.warnings[0]


async def test_a_missing_required_tool_is_a_startup_failure_that_goes_through_stopping(home):
    async with Runtime(home) as rt:
        with pytest.raises(UnknownTool):
            await rt.register_agent(manifest(required=["no_such_tool"]))
        assert rt.agents() == []


async def test_packages_that_fail_to_install_degrade_the_agent_and_keep_the_installer_error(home, monkeypatch):
    from loopback_host import LoopbackHost

    with LoopbackHost(lambda method, path: (404, "text/plain", b"")) as index:  # an index that has nothing
        monkeypatch.setenv("APOLLIA_PIP_INDEX_URL", f"{index.url}/simple")
        async with Runtime(home) as rt:
            agent = await rt.register_agent(manifest(packages=["apollia-test-absent==1.0"]))
        assert agent.state.state == "degraded"
        assert "installing apollia-test-absent==1.0 failed" in agent.warnings[0]
        assert (home.agents_dir / "clerk" / "venv").is_dir()  # the agent's own environment under the home


async def test_a_degraded_agent_accepts_tasks_with_a_warning_and_never_becomes_active_on_its_own(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(optional=["missing_tool"]))
        task = await (await rt.submit("clerk", "work"))
        assert task.status == "completed"
        assert task.record["warnings"] and "degraded" in task.record["warnings"][0]
        assert rt.agent("clerk").state.state == "degraded"


async def test_submission_is_refused_for_a_stopped_agent(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        await rt.stop_agent("clerk")
        with pytest.raises(AgentUnavailable):
            await rt.submit("clerk", "work")


async def test_an_invalid_transition_is_an_error_to_the_caller_and_is_not_recorded(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        await rt.stop_agent("clerk")
        with pytest.raises(InvalidTransition):
            await rt.stop_agent("clerk")
        assert rt.agent("clerk").state.state == "stopped"
        assert [a["state"] for a in rt.records.agents()] == ["stopped"]


async def test_restart_goes_stopped_initializing_active(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"text": "first"}, {"text": "second"}]))
        assert (await (await rt.submit("clerk", "once"))).result == "first"
        await rt.stop_agent("clerk")
        moves = []
        rt.subscribe(lambda kind, obj: moves.append(obj.state.state.value) if kind == "agent" else None)
        agent = await rt.start_agent("clerk")
        assert agent.state.state == "active"
        again = await (await rt.submit("clerk", "again"))
        assert again.status == "completed" and again.result == "first"  # every task plays the script anew


async def test_stopping_drains_in_flight_work_then_cancels_it(home):
    gate = anyio.Event()

    async def slow(role, messages, tools):
        await gate.wait()
        return {"text": "late"}

    text = manifest() + "[runtime]\ndrain_timeout_secs = 0.2\n"
    async with Runtime(home) as rt:
        await rt.register_agent(text, model=ScriptedModel.from_function(slow))
        handle = await rt.submit("clerk", "hang")
        await anyio.sleep(0)
        agent = await rt.stop_agent("clerk")
        assert agent.state.state == "stopped"
        task = await handle
        assert task.status == "cancelled"


async def test_stopping_lets_a_run_that_finishes_within_the_drain_timeout_complete(home):
    gate = anyio.Event()

    async def quick(role, messages, tools):
        await gate.wait()
        return {"text": "finished"} if role == "actor" else ({"steps": ["x"]} if role == "planner" else {"verdict": "pass"})

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(), model=ScriptedModel.from_function(quick))
        handle = await rt.submit("clerk", "work")
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.stop_agent, "clerk")
            await anyio.sleep(0.01)
            gate.set()
        assert (await handle).status == "completed"


async def test_three_transient_failures_open_the_breaker_and_the_fourth_call_fails_fast(home):
    ran = []

    def flaky(query: str) -> str:
        """Looks something up somewhere flaky."""
        ran.append(query)
        raise TransientToolError("upstream is down")

    turns = [{"tool_calls": [call("flaky", query=str(i))]} for i in range(4)]
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=turns), tools=[ToolDef.from_function(flaky, family="read")])
        task = await (await rt.submit("clerk", "look"))
        codes = [json.loads(e.payload).get("error_code") for e in rt.journal.entries(run_id=task.run_id)
                 if e.kind == "tool_result"]
        assert codes == ["TOOL_TRANSIENT"] * 3 + ["CIRCUIT_OPEN"]
        assert len(ran) == 3


async def test_bad_input_gets_stable_codes_and_nothing_is_half_written(home):
    async with Runtime(home) as rt:
        with pytest.raises(ManifestInvalid) as err:
            await rt.register_agent('name = "clerk"\nauto_approve = true\n')
        assert "line 2" in err.value.message or ":2" in err.value.message
        with pytest.raises(UnknownAgent):
            await rt.submit("ghost", "boo")
        assert rt.records.agents() == [] and rt.records.tasks() == []
