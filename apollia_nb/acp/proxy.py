"""``apollia-os acp-proxy -- AGENT_COMMAND…``: an ACP client and an ACP agent, with the home between.

The proxy starts the agent command and relays newline-delimited JSON-RPC both ways over stdio
(the Agent Client Protocol, schema v1.19.0, protocol version 1). Two of the agent's messages are
the home's business:

* ``session/request_permission`` is answered by the proxy and never reaches the client: the tool
  call is decided by ``decide()`` as the built-in tool of its kind (``acp.mapping``); ``ask`` becomes
  a pending decision of the home (answerable over REST, the CLI, the panel, a notebook card) that the
  agent waits on for up to ``ask_timeout`` seconds, then it is refused by ``timeout``. The decision
  (and a person's answer) is journaled before the agent hears it; the response's ``_meta.apollia``
  says why (``outcome``, ``reason``, ``decision``);
* ``session/update`` with ``tool_call`` or ``tool_call_update`` is journaled (``tool_call``, then
  ``tool_progress`` while it runs, ``tool_result`` when it ends) and passed on: what the agent
  runs without asking is on the record too.

Every message is relayed as the JSON the proxy read and decided on, written again: a batch is
taken apart into its messages (no permission request hides in one), a key given twice is given
once, a permission request sent as a notification and a line that is not JSON are not passed on.

A ``session/cancel`` from the client ends the session's waits: the agent is answered ``cancelled``
(as the protocol asks of a client) and the waiting decisions are refused by ``system``.

Each proxied agent is an agent of the home, ``acp-<command>--<project>``, registered when the
proxy starts, its workspace the project folder. Fail closed: a home that cannot be opened (missing,
held by a process with no server, damaged) or an agent that cannot be registered leaves the relay
running and every permission rejected with the reason; a decision that cannot be journaled is a
rejection too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from apollia_nb.acp.mapping import acp_call, agent_name, permission_outcome
from apollia_nb.errors import ApolliaError
from apollia_nb.governance.decision import Decision, Outcome

__all__ = ["ASK_TIMEOUT_SECS", "SOURCE", "AcpGovernor", "run_proxy"]

#: How long an asked permission waits for a person by default (a conversation's card waits as long).
ASK_TIMEOUT_SECS = 300.0
#: What the entries the proxy writes say they come from.
SOURCE = "acp"
#: How long past its ask timeout a permission may take before the agent is told no: the home did not answer.
GRACE_SECS = 30.0
#: The longest JSON-RPC line relayed (an agent's file contents ride on its messages).
MAX_LINE = 64 * 1024 * 1024


def _log(text: str) -> None:
    print(f"apollia-os acp-proxy: {text}", file=sys.stderr, flush=True)


@dataclass
class _Session:
    run_id: str
    waits: set[anyio.CancelScope] = field(default_factory=set)
    tools: dict[str, str] = field(default_factory=dict)  # toolCallId: the tool it was decided as
    kinds: dict[str, str] = field(default_factory=dict)  # toolCallId: its ACP kind, as first said


class AcpGovernor:
    """The home's side of the proxy: decides permissions, asks, journals the agent's tool calls.

    ``rt`` is an open ``Runtime`` (owner or client of a served home) and ``agent`` the registered
    agent; with ``why`` instead (the home could not be opened), every permission is rejected."""

    def __init__(self, rt: Any, agent: Any, *, connection: str, ask_timeout: float = ASK_TIMEOUT_SECS,
                 why: str | None = None) -> None:
        self.rt = rt
        self.agent = agent
        self.connection = connection
        self.ask_timeout = ask_timeout
        self.why = why
        self.sessions: dict[str, _Session] = {}

    @classmethod
    def closed(cls, why: str, *, connection: str) -> AcpGovernor:
        return cls(None, None, connection=connection, why=why)

    def session(self, session_id: str) -> _Session:
        found = self.sessions.get(session_id)
        if found is None:
            found = self.sessions[session_id] = _Session(run_id=f"acp-{uuid.uuid4().hex[:12]}")
        return found

    def cancel(self, session_id: str) -> None:
        """The client cancelled the prompt turn: the session's waits end (answered ``cancelled``)."""
        found = self.sessions.get(session_id)
        for scope in list(found.waits) if found is not None else []:
            scope.cancel()

    async def permission(self, params: Any) -> dict[str, Any]:
        """The result of a ``session/request_permission``: decided, asked if need be, journaled."""
        options = params.get("options") if isinstance(params, dict) else None
        tool_call = params.get("toolCall") if isinstance(params, dict) else None
        session_id = params.get("sessionId") if isinstance(params, dict) else None
        refused = Decision(Outcome.REFUSE, 0, reason="")
        if self.why is not None:
            return self._answer(options, refused, None, f"the home cannot decide: {self.why}")
        if not isinstance(tool_call, dict) or not isinstance(session_id, str):
            return self._answer(options, refused, None, "the request names no session or tool call")
        session = self.session(session_id)
        scope = anyio.CancelScope()
        session.waits.add(scope)
        try:
            with scope:
                return await self._decide(session, tool_call, options)
            return {"outcome": {"outcome": "cancelled"},
                    "_meta": {"apollia": {"outcome": "cancelled", "reason": "the client cancelled the prompt turn"}}}
        except ApolliaError as exc:  # the journal or governance refused: never an allow
            return self._answer(options, refused, None, f"{exc.code}: {exc.message}")
        except Exception as exc:
            return self._answer(options, refused, None, f"the home could not decide: {type(exc).__name__}: {exc}")
        finally:
            session.waits.discard(scope)

    async def _decide(self, session: _Session, tool_call: dict[str, Any], options: Any) -> dict[str, Any]:
        from apollia_nb.governance.decision import decide
        from apollia_nb.runtime.governed import CallScope, governed_request
        from apollia_nb.runtime.outputs import redact, secret_values
        from apollia_nb.runtime.paths import code_places

        rt, agent = self.rt, self.agent
        found = acp_call(agent.name, tool_call, workspace=str(agent.workspace), home=str(rt.home.path),
                         connection=self.connection, code_places=code_places())
        arguments = dict(redact(found.arguments, secret_values(rt.config)))  # as shown: no configured token
        if found.call is None:  # the path is refused before anything is decided, like our file tools'
            decision = Decision(Outcome.REFUSE, 0, reason=found.problem or "refused")
        else:
            decision = decide(found.call, rt.governance.view())
        tool_call_id = str(tool_call.get("toolCallId") or uuid.uuid4().hex[:12])
        session.tools[tool_call_id] = found.tool
        session.kinds.setdefault(tool_call_id, _kind(tool_call))
        hints = {k: v for k, v in (("title", tool_call.get("title")), ("kind", tool_call.get("kind")))
                 if isinstance(v, str)}
        scope = CallScope(rt, agent, session.run_id, tool_call_id, found.tool)
        _, carried, card = await governed_request(
            rt, scope, tool=found.tool, family=found.family.value if found.family else None, arguments=arguments,
            connection=self.connection, hints=hints or None, decided=decision, timeout_secs=self.ask_timeout,
            fields={"source": SOURCE, "source_tool": _kind(tool_call)})
        answer = card.answer_value if card is not None else None
        reason = decision.reason if card is None else f"{decision.reason}; {carried.reason}"
        return self._answer(options, carried, answer, reason, card_id=card.id if card is not None else None)

    def unanswered(self, params: Any) -> dict[str, Any]:
        """The answer when the home gave none in time (it stopped answering): a rejection."""
        options = params.get("options") if isinstance(params, dict) else None
        return self._answer(options, Decision(Outcome.REFUSE, 0, reason=""), None,
                            f"the home did not answer within {self.ask_timeout + GRACE_SECS:g} s")

    @staticmethod
    def _answer(options: Any, decision: Decision, answer: str | None, reason: str,
                card_id: str | None = None) -> dict[str, Any]:
        outcome, chosen = permission_outcome(options, decision, answer)
        if decision.outcome is Outcome.ALLOW and chosen == "reject":
            reason = f"{reason}; the agent offers no one-time allow, so none is given"
        meta: dict[str, Any] = {"outcome": chosen, "reason": reason, "line": decision.line}
        if answer is not None:
            meta["answer"] = answer
        if card_id is not None:
            meta["decision"] = card_id
        if chosen == "reject":
            _log(f"rejected: {reason}")
        return {"outcome": outcome, "_meta": {"apollia": meta}}

    def reported(self, params: Any) -> None:
        """A ``session/update`` the agent sent: its tool calls go to the journal (before the client sees them)."""
        if self.why is not None or not isinstance(params, dict):
            return
        update, session_id = params.get("update"), params.get("sessionId")
        if not isinstance(update, dict) or not isinstance(session_id, str):
            return
        what = update.get("sessionUpdate")
        if what not in ("tool_call", "tool_call_update"):
            return
        try:
            for kind, payload in self._entries(self.session(session_id), update, first=what == "tool_call"):
                self.rt.journal.append_soon(kind, payload, run_id=self.session(session_id).run_id,
                                            agent=self.agent.name)
        except Exception as exc:  # the relay goes on; what could not be journaled is said
            _log(f"a tool call the agent reported could not be journaled: {exc}")

    def _entries(self, session: _Session, update: dict[str, Any], *, first: bool) -> list[tuple[str, dict[str, Any]]]:
        from apollia_nb.acp.mapping import KIND_TOOLS
        from apollia_nb.runtime.governed import NULL_DIGEST, capped_output
        from apollia_nb.runtime.outputs import redact, secret_values

        secrets = secret_values(self.rt.config)
        call_id = str(update.get("toolCallId") or "")
        kind = update.get("kind")
        said = session.kinds.setdefault(call_id, _kind(update)) if isinstance(kind, str) and kind \
            else session.kinds.get(call_id, "other")
        tool = session.tools.get(call_id)
        if tool is None and isinstance(kind, str):
            tool = KIND_TOOLS[kind][0] if kind in KIND_TOOLS else f"acp:{kind if kind.isidentifier() else 'other'}"
            session.tools[call_id] = tool
        tool = tool or "acp:other"
        out: list[tuple[str, dict[str, Any]]] = []
        raw = update.get("rawInput")
        title = update.get("title")
        if first:
            arguments = dict(redact(raw if isinstance(raw, dict) else ({} if raw is None else {"input": raw}), secrets))
            out.append(("tool_call", {"call_id": call_id, "tool": tool, "arguments": arguments, "source": SOURCE,
                                      "source_tool": said,
                                      **({"title": title} if isinstance(title, str) else {})}))
        status = update.get("status")
        if status in ("completed", "failed"):
            output = update.get("rawOutput")
            if output is None and update.get("content") is not None:
                output = update.get("content")
            shown = redact(output, secrets) if output is not None else None
            kept, digest, _ = capped_output(shown) if shown is not None else (None, NULL_DIGEST, False)
            out.append(("tool_result", {"call_id": call_id, "tool": tool, "status": "ok" if status == "completed"
                                        else "error", "output": kept, "output_digest": digest, "source": SOURCE,
                                        "source_tool": said,
                                        **({"error_code": "TOOL_ERROR"} if status == "failed" else {})}))
        elif not first:
            shown_update = {k: v for k, v in update.items() if k in ("status", "title", "kind", "rawInput")}
            out.append(("tool_progress", {"call_id": call_id, "tool": tool, "source": SOURCE,
                                          "source_tool": said,
                                          **dict(redact(shown_update, secrets))}))
        return out


def _kind(tool_call: dict[str, Any]) -> str:
    """The agent's own name for what a call does (its ACP ``kind``), as journaled in ``source_tool``."""
    kind = tool_call.get("kind")
    return kind if isinstance(kind, str) and kind else "other"


# --- the relay -------------------------------------------------------------------------------


class _Lines:
    """Newline-delimited messages from a byte stream."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        from anyio.streams.buffered import BufferedByteReceiveStream

        self._buffered = BufferedByteReceiveStream(stream)

    async def next(self) -> bytes | None:
        try:
            return await self._buffered.receive_until(b"\n", MAX_LINE)
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return None


def _messages(line: bytes) -> list[Any] | None:
    """The JSON-RPC messages of one line: a batch is taken apart, so that no request hides in one;
    None for a line that is not JSON."""
    try:
        parsed = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return list(parsed) if isinstance(parsed, list) else [parsed]


def _encoded(message: Any) -> bytes:
    """A message as relayed: the JSON the proxy read, written again (what the proxy decided on is
    what the other side reads; a key given twice is given once)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def _relay(governor: AcpGovernor, command: Sequence[str], client_in: anyio.abc.ByteReceiveStream,
                 client_out: Callable[[bytes], Any], *, cwd: str | None = None) -> int:
    """Relay between the client (``client_in``, ``client_out``) and the agent process until one ends."""
    process = await anyio.open_process(list(command), stdin=-1, stdout=-1, stderr=None, cwd=cwd)
    assert process.stdin is not None and process.stdout is not None
    to_agent = anyio.Lock()
    to_client = anyio.Lock()

    async def send_agent(data: bytes) -> None:
        async with to_agent:
            await process.stdin.send(data + b"\n")  # type: ignore[union-attr]

    async def send_client(data: bytes) -> None:
        async with to_client:
            await client_out(data + b"\n")

    async def answer_permission(message: dict[str, Any], tg: anyio.abc.TaskGroup) -> None:
        # Whatever happens to the home meanwhile (a server that stops answering), the agent hears a
        # rejection once the wait and a grace have passed; the decision may still land in the home.
        params = message.get("params")
        found: list[dict[str, Any]] = []
        decided = anyio.Event()

        async def decide() -> None:
            found.append(await governor.permission(params))
            decided.set()

        tg.start_soon(decide)
        with anyio.move_on_after(governor.ask_timeout + GRACE_SECS):
            await decided.wait()
        result = found[0] if found else governor.unanswered(params)
        await send_agent(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode())

    async def from_agent(tg: anyio.abc.TaskGroup) -> None:
        lines = _Lines(process.stdout)  # type: ignore[arg-type]
        while (line := await lines.next()) is not None:
            messages = _messages(line)
            if messages is None:
                _log("a line of the agent's output that is not JSON was not passed on")
                continue
            for message in messages:
                if isinstance(message, dict) and message.get("method") == "session/request_permission":
                    if "id" in message:
                        tg.start_soon(answer_permission, message, tg)
                    else:
                        _log("a permission request sent as a notification was not passed on")
                    continue
                if isinstance(message, dict) and message.get("method") == "session/update":
                    governor.reported(message.get("params"))
                await send_client(_encoded(message))

    async def from_client() -> None:
        lines = _Lines(client_in)
        while (line := await lines.next()) is not None:
            for message in _messages(line) or []:
                if isinstance(message, dict) and message.get("method") == "session/cancel":
                    params = message.get("params")
                    if isinstance(params, dict) and isinstance(params.get("sessionId"), str):
                        governor.cancel(params["sessionId"])
                try:
                    await send_agent(_encoded(message))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return
        await process.stdin.aclose()  # type: ignore[union-attr]  # the client is gone: so is the agent's input

    async with process:
        async with anyio.create_task_group() as tg:
            async def client_side() -> None:
                await from_client()

            tg.start_soon(client_side)
            await from_agent(tg)  # the agent's output ended: it exited or closed it
            tg.cancel_scope.cancel()
        with anyio.move_on_after(10):
            return await process.wait()
        process.terminate()
        return await process.wait()


def _manifest(name: str, command: Sequence[str], workspace: Path) -> str:
    shown = " ".join(command)[:200]
    return "\n".join([
        f'name = {json.dumps(name)}',
        f'description = {json.dumps("an ACP agent run through apollia-os acp-proxy: " + shown)}',
        "[workspace]",
        f"root = {json.dumps(str(workspace))}",
        "",
    ])


async def open_governor(stack: contextlib.AsyncExitStack, home: str | None, command: Sequence[str],
                        project: Path, ask_timeout: float) -> AcpGovernor:
    """The governor for ``command`` run for ``project``, its runtime held open by ``stack``; one that
    rejects every permission, saying why, when the home cannot be opened or the agent registered."""
    from apollia_nb.errors import HomeFileMissing
    from apollia_nb.federation import open_sources
    from apollia_nb.home import Home
    from apollia_nb.runtime import Runtime

    name = agent_name(command, project.name)
    connection = "acp:" + name[len("acp-"):].split("--")[0]
    try:
        where = Home.at(home, create=False)
        if not where.path.is_dir():
            raise HomeFileMissing(f"there is no home at {where.path}: point --home (or $APOLLIA_HOME) at one")
        rt = await stack.enter_async_context(Runtime(where, tool_sources=open_sources))
        agent = await rt.register_agent(_manifest(name, command, project))
        return AcpGovernor(rt, agent, connection=connection, ask_timeout=ask_timeout)
    except Exception as exc:
        why = f"{exc.code}: {exc.message}" if isinstance(exc, ApolliaError) else f"{type(exc).__name__}: {exc}"
        _log(f"every permission is rejected: {why}")
        return AcpGovernor.closed(why, connection=connection)


async def run_proxy(command: Sequence[str], *, home: str | None = None, project: Path | None = None,
                    ask_timeout: float = ASK_TIMEOUT_SECS) -> int:
    """Proxy this process's stdio to ``command``; the agent's exit status."""
    project = (project or Path.cwd()).resolve()
    stdin = anyio.wrap_file(sys.stdin.buffer)
    out = sys.stdout.buffer

    class _Stdin(anyio.abc.ByteReceiveStream):
        async def receive(self, max_bytes: int = 65536) -> bytes:
            data = await stdin.read1(max_bytes)
            if not data:
                raise anyio.EndOfStream
            return data

        async def aclose(self) -> None:
            pass

    async def write(data: bytes) -> None:
        await anyio.to_thread.run_sync(lambda: (out.write(data), out.flush()))

    async with contextlib.AsyncExitStack() as stack:
        governor = await open_governor(stack, home, command, project, ask_timeout)
        return await _relay(governor, command, _Stdin(), write, cwd=os.getcwd())
