"""A small ACP agent (the Python ACP SDK) for the proxy's tests.

A prompt's text is a JSON list of tool calls to make, each ``{"id", "kind", "title", "raw_input",
"ask": true|false}``: each is reported (``tool_call``), permission is asked when ``ask`` (options
allow_once, allow_always, reject_once, reject_always), and it is reported completed (when allowed)
or failed. The reply is one agent message: a JSON list of ``{"id", "outcome", "option", "meta"}``.
"""

import asyncio
import json

from acp import (
    PROTOCOL_VERSION,
    run_agent,
    start_tool_call,
    text_block,
    update_agent_message,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    InitializeResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    ToolCallUpdate,
)

OPTIONS = [PermissionOption(option_id="yes", name="Allow once", kind="allow_once"),
           PermissionOption(option_id="yes-always", name="Always allow", kind="allow_always"),
           PermissionOption(option_id="no", name="Reject", kind="reject_once"),
           PermissionOption(option_id="no-always", name="Always reject", kind="reject_always")]


class TestAgent:
    def __init__(self) -> None:
        self.conn: Client | None = None

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kwargs):
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd, additional_directories=None, mcp_servers=None, **kwargs):
        return NewSessionResponse(session_id="s-1")

    async def prompt(self, session_id, prompt, **kwargs):
        calls = json.loads(prompt[0].text)
        results = []
        for call in calls:
            await self.conn.session_update(session_id, start_tool_call(
                call["id"], call["title"], kind=call["kind"], status="pending", raw_input=call["raw_input"]))
            if call.get("ask", True):
                response = await self.conn.request_permission(
                    session_id=session_id, options=OPTIONS,
                    tool_call=ToolCallUpdate(tool_call_id=call["id"], title=call["title"], kind=call["kind"],
                                             raw_input=call["raw_input"]))
                outcome = response.outcome
                option = getattr(outcome, "option_id", None)
                meta = (response.field_meta or {}).get("apollia")
                results.append({"id": call["id"], "outcome": outcome.outcome, "option": option, "meta": meta})
                allowed = option in ("yes", "yes-always")
            else:
                allowed = True
                results.append({"id": call["id"], "outcome": "not asked", "option": None, "meta": None})
            if allowed:
                await self.conn.session_update(session_id, update_tool_call(
                    call["id"], status="completed", raw_output={"done": call["id"]}))
            else:
                await self.conn.session_update(session_id, update_tool_call(call["id"], status="failed"))
        await self.conn.session_update(session_id, update_agent_message(text_block(json.dumps(results))))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id, **kwargs):
        return None


if __name__ == "__main__":
    asyncio.run(run_agent(TestAgent()))
