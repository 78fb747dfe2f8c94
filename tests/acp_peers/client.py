"""A small ACP client (the Python ACP SDK) for the proxy's tests.

``client.py PROMPT_JSON -- COMMAND…``: starts COMMAND (the proxy, or an agent) over stdio,
initializes, opens a session, sends one prompt and prints one JSON object: the agent's reply
(``reply``), every tool call update the client saw (``updates``) and whether a permission request
ever reached the client (``asked_client``). With ``ACP_TEST_CANCEL_WHEN=FILE`` it cancels the prompt turn
(``session/cancel``) once FILE exists.
"""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, text_block
from acp.schema import AllowedOutcome, RequestPermissionResponse
from acp.stdio import spawn_agent_process


class TestClient:
    def __init__(self) -> None:
        self.reply: list[str] = []
        self.updates: list[dict] = []
        self.asked = 0

    def on_connect(self, conn) -> None:
        pass

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        self.asked += 1  # the proxy answers these itself: one here is a failure of the test
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))

    async def session_update(self, session_id, update, **kwargs):
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk":
            self.reply.append(update.content.text)
        elif kind in ("tool_call", "tool_call_update"):
            self.updates.append({"kind": kind, "id": update.tool_call_id, "status": update.status})


async def main() -> None:
    prompt = sys.argv[1]
    command = sys.argv[sys.argv.index("--") + 1:]
    client = TestClient()
    async with spawn_agent_process(client, command[0], *command[1:], env=dict(os.environ)) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=[text_block(prompt)]))
        cancel_when = os.environ.get("ACP_TEST_CANCEL_WHEN")  # a file the test makes once a decision waits
        if cancel_when:
            while not os.path.exists(cancel_when) and not turn.done():
                await asyncio.sleep(0.02)
            await conn.cancel(session_id=session.session_id)
        response = await turn
    print(json.dumps({"reply": json.loads("".join(client.reply)), "updates": client.updates,
                      "asked_client": client.asked, "stop": response.stop_reason}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
