"""MCP servers as governed tools: ``mcp:<server>/<tool>`` over stdio or streamable HTTP.

One ``McpSource`` per ``[mcp.servers.NAME]``. Nothing starts at boot: the
server is started (stdio) or connected (HTTP) the first time an agent that
names one of its tools registers, and its tool list is cached. Each tool
becomes a ``ToolDef`` — unless its name could pass for something else (the
host's own requests, another namespace, a path: ``tool_name_problem``), when it
is not offered, logged and warned about (``TOOL_NAME_REFUSED``) — whose family
comes **only** from the operator's ``families`` table (a tool left out is
unclassified: asked every time, never with ``always``); the server's MCP
annotations (``readOnlyHint`` …) are kept as hints for the consent card and
never read by governance.

The connection lives in a background task started in the runtime's task
group (``_serve``): it enters the SDK's ``Client`` — which owns the
transport, the server process and the session's own tasks — and holds it
until told to stop, so every task has an owner and the server is stopped by
``aclose()``. Tool calls from the engine's tasks go through the same
``Client`` (its dispatcher is anyio-safe across tasks of one loop).

Robustness, all of it visible as the project's errors:

    the server answers isError            PermanentToolError with its text
    a protocol error (unknown tool …)     PermanentToolError with its message
    no answer within timeout_secs         ToolTimeout (transient); connection dropped
    the connection closes (crash, exit)   TransientToolError; connection dropped
    anything else from the transport      TransientToolError; connection dropped

A dropped connection is started again on the next use; a server that exits
between calls is noticed at once (its stream ends) and restarted before the
next request is sent, so only a call in flight at the moment of a crash
fails. A stdio server's standard error goes to ``<home>/logs/mcp-<name>.log``.

What the server asks of the host (the client declares elicitation, sampling
and roots; see docs/federation.md) is tied to the call in flight (``_owner``)
and governed there: a question becomes a card of the run
(``_on_elicit``), a model call is decided by ``decide()`` and spends the run's
model and budget (``_on_sample``), roots are the calling agent's workspace.
Progress goes to the task and, at most once a second, to the journal
(``_Inflight``); log messages go to the server's log file; ``list_changed``
reads the tool list again (``_refresher``); a task-augmented tool is polled
as a long-running call (``_call_as_task``).

``import mcp`` is slow (about 0.6 s), so it happens only when a server is used.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import math
import os
import re
import time
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb.errors import ApolliaError, PermanentToolError, ToolNameRefused, ToolTimeout, TransientToolError
from apollia_nb.federation.config import McpServerConfig
from apollia_nb.federation.mcp_requests import (
    ELICITATION, SAMPLING, elicitation_action, sampling_arguments, shown_request,
)
from apollia_nb.federation.base import check_connection_allowed, named_tools
from apollia_nb.runtime.outputs import secret_values

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.tools import ToolDef

__all__ = ["McpSource", "tool_output", "tool_hints", "tool_name_problem", "screen_tools", "CLOSE_WAIT_SECS", "SERVER_TOOLS",
           "RESERVED_NAMES"]

#: How long ``aclose()`` waits for connections to shut down (a stdio server gets
#: its stdin closed, then SIGTERM, then SIGKILL within about 4 s).
CLOSE_WAIT_SECS = 10.0
_LIST_PAGES = 100
#: At most one ``tool_progress`` journal entry per call this often (the last one is always kept).
PROGRESS_JOURNAL_SECS = 1.0
#: A long-running (task-augmented) call's polling interval bounds, seconds.
_POLL_MIN, _POLL_MAX = 0.2, 5.0
#: How long the server keeps a task's result for us, milliseconds.
_TASK_TTL_MS = 3_600_000
#: The backstop of a federated call: the call bounds itself (start, answer, a person's answer, a task).
_BACKSTOP_SECS = 86_400.0
#: The host's own requests on a server's connection, offered to agents as ``mcp:<server>/<request>``.
SERVER_TOOLS = ("resources/list", "resources/read", "prompts/list", "prompts/get")
#: Names no tool of a server may take, in any case or Unicode form: the host's own requests, and what the
#: server asks of the host (its questions and model calls are shown under these names).
RESERVED_NAMES = (*SERVER_TOOLS, ELICITATION, SAMPLING, "roots/list")
_RESERVED = {n.casefold(): n for n in RESERVED_NAMES}
#: The tool names this client accepts: the MCP revision 2025-11-25's rule (a SHOULD there, a MUST here).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: The prefixes of the tool namespaces (``mcp:<server>/…``, ``rest:<host>/…``).
_NAMESPACES = ("mcp:", "rest:")
_HINT_KEYS = ("title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


# --- pure conversions -------------------------------------------------------------------


def tool_hints(tool: Any) -> dict[str, Any] | None:
    """A listed tool's MCP annotations as a plain dict of hints (wire names), or None."""
    hints: dict[str, Any] = {}
    annotations = getattr(tool, "annotations", None)
    if annotations is not None:
        dumped = annotations.model_dump(by_alias=True, exclude_none=True)
        hints.update({k: dumped[k] for k in _HINT_KEYS if k in dumped})
    title = getattr(tool, "title", None)
    if title and "title" not in hints:
        hints["title"] = title
    return hints or None


def tool_name_problem(name: Any) -> str | None:
    """Why a server's tool may not be offered under ``name``, or None when it may.

    A name is 1 to 128 characters of ``A-Z a-z 0-9 _ . -`` (the MCP revision
    2025-11-25's rule). The reason names what the name could pass for, first:
    one of the host's own requests or the server's requests to the host (in any
    case, after NFKC normalisation), another tool namespace; then control
    characters and white space, a path, a path component, a name Unicode
    normalisation changes, and any other character or length off the rule.
    """
    if not isinstance(name, str) or not name:
        return "an empty name"
    folded = unicodedata.normalize("NFKC", name).casefold()
    reserved = _RESERVED.get(folded)
    if reserved is not None:
        return f"it could pass for the host's request {reserved!r}"
    if folded.startswith(_NAMESPACES):
        return "it names another tool namespace"
    if any(unicodedata.category(c)[0] in "CZ" for c in name) or any(c.isspace() for c in name):
        return "it holds a control character or white space"
    if "/" in name or "\\" in name or "/" in folded or "\\" in folded:
        return "it is a path"
    if set(name) == {"."}:
        return "it is a path component"
    if unicodedata.normalize("NFKC", name) != name:
        return "Unicode normalisation (NFKC) changes it: it could pass for another name"
    if not _TOOL_NAME.fullmatch(name):
        return "it is not 1 to 128 characters of A-Z, a-z, 0-9, '_', '.' and '-'"
    return None


def screen_tools(tools: list[Any]) -> tuple[list[Any], dict[str, str]]:
    """A listing's tools split into those that may be offered and those refused (name: why).

    A name listed more than once is refused every time: which of its schemas would run is not the
    person's to guess."""
    counts: dict[Any, int] = {}
    for tool in tools:
        counts[getattr(tool, "name", None)] = counts.get(getattr(tool, "name", None), 0) + 1
    kept: list[Any] = []
    refused: dict[str, str] = {}
    for tool in tools:
        name = getattr(tool, "name", None)
        why = tool_name_problem(name)
        if why is None and counts[name] > 1:
            why = "the server lists it more than once"
        if why is None:
            kept.append(tool)
        else:
            refused[str(name)] = why
    return kept, refused


def _media(kind: str, data: Any, declared: Any) -> dict[str, Any]:
    """An image or audio block (MCP 2025-11-25: ``{"type", "data": base64, "mimeType"}``) as its
    descriptor, by the digest of its bytes. An image whose bytes are PNG, JPEG, GIF or WebP is the
    runtime's image descriptor (``image_descriptor``: held for a model that reads images; its
    ``mime_type`` is what the bytes are, whatever the server declared); any other image, and audio,
    is ``{"type", "mime_type" (as declared), "bytes", "sha256"}``, never given to a model. Data that
    is not base64 is ``{"type", "mime_type", "bytes": None}``: nothing is named by it."""
    import hashlib

    from apollia_nb.runtime.outputs import image_descriptor

    try:
        raw = base64.b64decode(data if isinstance(data, (str, bytes)) else "", validate=True)
    except (ValueError, TypeError):
        return {"type": kind, "mime_type": declared, "bytes": None}
    if kind == "image":
        image = image_descriptor(raw)
        if image is not None:
            return image
    return {"type": kind, "mime_type": declared, "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def _block(block: Any) -> Any:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return _media(kind, getattr(block, "data", None), getattr(block, "mime_type", None))
    if kind == "resource_link":
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name,
                "mime_type": getattr(block, "mime_type", None)}
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        out: dict[str, Any] = {"type": "resource", "uri": str(resource.uri),
                               "mime_type": getattr(resource, "mime_type", None)}
        if text is not None:
            out["text"] = text
        else:
            blob = getattr(resource, "blob", "") or ""
            out["bytes"] = len(blob) * 3 // 4
            media = _media("image", blob, out["mime_type"])
            if "sha256" in media and "width" in media:  # an embedded image: described like an image block
                out["image"] = media
        return out
    from apollia_nb.runtime.tools import to_jsonable

    return to_jsonable(getattr(block, "model_dump", lambda **_: block)(by_alias=True, exclude_none=True))


def tool_output(result: Any) -> Any:
    """A ``CallToolResult`` as the tool's JSON output.

    The structured content when the server gave one; else the text of a single
    text block; else a list with each text block as a string and every other
    block summarised: images and audio by their descriptors (``_media``: the
    bytes are named by digest, never part of the output; an image is held for a
    model that reads images), resources by URI, with their text when textual.
    """
    from apollia_nb.runtime.tools import to_jsonable

    if getattr(result, "structured_content", None) is not None:
        return to_jsonable(result.structured_content)
    blocks = [_block(b) for b in (result.content or [])]
    if not blocks:
        return None
    if len(blocks) == 1 and isinstance(blocks[0], str):
        return blocks[0]
    return blocks


def _error_text(result: Any) -> str:
    texts = [b.text for b in (result.content or []) if getattr(b, "type", None) == "text"]
    return "\n".join(texts).strip() or "the server reported an error without a message"


# --- the connection -----------------------------------------------------------------------


class _WatchedRead:
    """A transport's read stream that says when it ends (the server went away)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> "_WatchedRead":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except (StopAsyncIteration, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> "_WatchedRead":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:  # ``last_context`` and the like
        return getattr(self._inner, name)


@asynccontextmanager
async def _watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedRead(read_stream, on_end), write_stream


@dataclass(eq=False)
class _Live:
    """One started connection: usable until ``stop`` is set."""

    stop: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    client: Any = None
    tools: list[Any] = field(default_factory=list)
    reason: str = ""
    changed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.stop.is_set()

    def drop(self, reason: str) -> None:
        """Stop this connection (the first reason given is the one logged)."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()


@dataclass(eq=False)
class _Inflight:
    """One call of a server's tool in flight: who made it, its deadline, its progress."""

    scope: Any  # the ``CallScope`` of the approved call, or None outside a governed call
    tool: str
    timeout: float
    deadline: anyio.CancelScope | None = None
    last: dict[str, Any] | None = None
    journaled_at: float = -math.inf
    unjournaled: bool = False
    holds: int = 0

    def hold(self) -> None:
        """No deadline while a person answers or a long-running task works."""
        self.holds += 1
        if self.deadline is not None:
            self.deadline.deadline = math.inf

    def release(self) -> None:
        self.holds -= 1
        if self.holds == 0 and self.deadline is not None:
            self.deadline.deadline = anyio.current_time() + self.timeout

    @contextmanager
    def held(self) -> Iterator[None]:
        self.hold()
        try:
            yield
        finally:
            self.release()

    def on_progress(self, source: "McpSource") -> Callable[..., Any]:
        async def progress(value: float, total: float | None, message: str | None) -> None:
            self.report(source, progress=value, total=total, message=message)
        return progress

    def report(self, source: "McpSource", **what: Any) -> None:
        """Shown at once on the task (its JSON and its events); journaled at most once a second."""
        if self.scope is None:
            return
        from apollia_nb.runtime.governed import run_of

        self.last = {"call_id": self.scope.call_id, "tool": self.tool,
                     **{k: v for k, v in what.items() if v is not None}}
        run, _ = run_of(self.scope.rt, self.scope.run_id)
        if run is not None:
            run.r.progress = self.last
            self.scope.rt.events.notify(run)
        now = time.monotonic()
        if now - self.journaled_at >= PROGRESS_JOURNAL_SECS:
            self._journal()
            self.journaled_at = now
        else:
            self.unjournaled = True

    def flush(self, source: "McpSource") -> None:
        """The call ended: its last progress is journaled, and the task shows none."""
        if self.scope is None or self.last is None:
            return
        if self.unjournaled:
            self._journal()
        from apollia_nb.runtime.governed import run_of

        run, _ = run_of(self.scope.rt, self.scope.run_id)
        if run is not None and run.r.progress is self.last:
            run.r.progress = None
            self.scope.rt.events.notify(run)

    def _journal(self) -> None:
        self.unjournaled = False
        self.scope.rt.journal.append_soon("tool_progress", dict(self.last or {}), run_id=self.scope.run_id,
                                          agent=self.scope.agent.name)


def _schema(tool: Any) -> dict[str, Any]:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    if not isinstance(schema.get("properties"), Mapping):
        schema["properties"] = {}
    return schema


def _task_support(tool: Any) -> str | None:
    execution = getattr(tool, "execution", None)
    return getattr(execution, "task_support", None) if execution is not None else None


def _dumped(item: Any) -> dict[str, Any]:
    from apollia_nb.runtime.tools import to_jsonable

    return to_jsonable(item.model_dump(mode="json", exclude_none=True))


def _contents(item: Any) -> dict[str, Any]:
    """A resource's contents: its text, or a blob's text when it is UTF-8, else its size."""
    out: dict[str, Any] = {"uri": str(item.uri), "mime_type": getattr(item, "mime_type", None)}
    text = getattr(item, "text", None)
    if text is not None:
        out["text"] = text
        return out
    try:
        raw = base64.b64decode(getattr(item, "blob", "") or "", validate=False)
    except (ValueError, TypeError):
        raw = b""
    try:
        out["text"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        out["bytes"] = len(raw)
    return out


async def _raw_request(session: Any, method: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """A request whose result the SDK does not model on this protocol revision (task-augmented calls)."""
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)
    if timeout is not None:
        opts["timeout"] = timeout
    return await session._dispatcher.send_raw_request(method, data.get("params"), opts)


class McpSource:
    """The tools of one configured MCP server, and its connection."""

    def __init__(self, rt: Any, config: McpServerConfig) -> None:
        self._rt = rt
        self.config = config
        self.server = config.name
        self.name = f"mcp:{config.name}"
        self.log_path: Path = Path(rt.home.logs_dir) / f"mcp-{config.name}.log"
        self._lock = anyio.Lock()
        self._live: _Live | None = None
        self._running: set[_Live] = set()
        self._listing: list[Any] | None = None
        self._tooldefs: dict[str, ToolDef] = {}
        self._closed = False
        self._inflight: dict[str, _Inflight] = {}
        self._log: Any = None
        self._rooted: str | None = None  # the workspace last offered as the roots
        #: The server's tools not offered, by the name it listed them under: why (``tool_name_problem``).
        self.refused: dict[str, str] = {}
        #: How many times the tool list was read (once per connection, again on every ``list_changed``).
        self.listings = 0

    # -- what the runtime calls ------------------------------------------------------------

    async def tools(self, manifest: Any) -> "list[ToolDef]":
        """The server's tools this agent names; starts the server the first time one is named."""
        wanted = named_tools(manifest, self.name + "/")
        if not wanted:
            return []
        check_connection_allowed(self._rt, self.server)
        if self._listing is None:
            live = await self._connection()
            self._listing = list(live.tools)
        by_name = {f"{self.name}/{t.name}": t for t in self._listing}
        own = {f"{self.name}/{n}": n for n in SERVER_TOOLS}  # the host's requests: never a server's tool
        refused = {name: self.refused[name[len(self.name) + 1:]] for name in wanted
                   if name not in own and name not in by_name and name[len(self.name) + 1:] in self.refused}
        required = [name for name in refused if name in getattr(manifest, "tools_required", ())]
        said = {name: f"{name} is not offered ({ToolNameRefused.code}): {why}" for name, why in refused.items()}
        if required:
            raise ToolNameRefused("; ".join(said[name] for name in required))
        for name in refused:
            self._rt.events.emit("warning", f"agent {getattr(manifest, 'name', '?')}: {said[name]}")
        return [self._server_tooldef(own[name]) if name in own else self._tooldef(by_name[name])
                for name in wanted if name in by_name or name in own]

    async def offered(self) -> list[str]:
        """The names (``mcp:<server>/<tool>``) of the server's tools that may be offered, in the order
        listed; the server is started (or reached) the first time. Refused names are not among them."""
        check_connection_allowed(self._rt, self.server)
        if self._listing is None:
            live = await self._connection()
            self._listing = list(live.tools)
        return [f"{self.name}/{t.name}" for t in self._listing]

    async def aclose(self) -> None:
        """Stop the server (or close the HTTP session); wait for it to be gone."""
        self._closed = True
        for live in list(self._running):
            live.drop("the runtime is closing")
        with anyio.move_on_after(CLOSE_WAIT_SECS):
            for live in list(self._running):
                await live.done.wait()

    # -- tools -----------------------------------------------------------------------------

    def _tooldef(self, tool: Any) -> "ToolDef":
        from apollia_nb.runtime.tools import ToolDef

        name = f"{self.name}/{tool.name}"
        cached = self._tooldefs.get(name)
        if cached is not None:
            return cached
        schema = _schema(tool)
        long_running = _task_support(tool) in ("required", "optional")

        async def call(**arguments: Any) -> Any:
            return await self._call(tool.name, arguments, as_task=long_running)

        call.__name__ = tool.name.replace("-", "_").replace(".", "_")
        tooldef = ToolDef(
            name=name,
            family=self.config.families.get(tool.name),
            fn=call,
            parameters=schema,
            description=tool.description or "",
            # A backstop: the call bounds starting the server, the answer, a person's answer, a task itself.
            timeout_secs=_BACKSTOP_SECS,
            connection=self.server,
            annotations=dict(tool_hints(tool) or {}),  # updated in place when the server's list changes
        )
        self._tooldefs[name] = tooldef
        return tooldef

    def _server_tooldef(self, what: str) -> "ToolDef":
        """``mcp:<server>/resources/list|read``, ``prompts/list|get``: the host reads what the server offers."""
        from apollia_nb.runtime.tools import ToolDef

        name = f"{self.name}/{what}"
        cached = self._tooldefs.get(name)
        if cached is not None:
            return cached
        cursor = {"cursor": {"type": "string", "description": "the next page's cursor from the last answer"}}
        shapes: dict[str, tuple[dict[str, Any], list[str], str]] = {
            "resources/list": (cursor, [], "List the resources this server offers (URI, name, MIME type)."),
            "resources/read": ({"uri": {"type": "string", "description": "the resource's URI (as listed, or "
                                        "a resource link a tool returned)"}}, ["uri"],
                               "Read one of this server's resources by URI."),
            "prompts/list": (cursor, [], "List the prompts this server offers."),
            "prompts/get": ({"name": {"type": "string"}, "arguments": {"type": "object"}}, ["name"],
                            "Get one of this server's prompts, filled in with its arguments."),
        }
        properties, required, description = shapes[what]

        async def call(**arguments: Any) -> Any:
            return await self._server_request(what, arguments)

        call.__name__ = what.replace("/", "_")
        tooldef = ToolDef(
            name=name, family=self.config.families.get(what), fn=call,
            parameters={"type": "object", "properties": properties, "required": required,
                        "additionalProperties": False},
            description=description, timeout_secs=_BACKSTOP_SECS, connection=self.server,
            annotations={},  # the host's own request: no server said anything about it
        )
        self._tooldefs[name] = tooldef
        return tooldef

    async def _server_request(self, what: str, arguments: dict[str, Any]) -> Any:
        from apollia_nb.runtime.tools import to_jsonable

        async def ask(client: Any) -> Any:
            if what == "resources/list":
                page = await client.list_resources(cursor=arguments.get("cursor"), cache_mode="bypass")
                return {"resources": [_dumped(r) for r in page.resources], "next_cursor": page.next_cursor}
            if what == "resources/read":
                result = await client.read_resource(str(arguments["uri"]), cache_mode="bypass")
                return [_contents(c) for c in result.contents]
            if what == "prompts/list":
                page = await client.list_prompts(cursor=arguments.get("cursor"), cache_mode="bypass")
                return {"prompts": [_dumped(p) for p in page.prompts], "next_cursor": page.next_cursor}
            args = {str(k): str(v) for k, v in (arguments.get("arguments") or {}).items()}
            result = await client.get_prompt(str(arguments["name"]), args)
            return {"description": result.description,
                    "messages": [{"role": m.role, "content": _block(m.content)} for m in result.messages]}

        return to_jsonable(await self._guarded(what, ask))

    async def _call(self, tool: str, arguments: dict[str, Any], *, as_task: bool = False) -> Any:
        """One call of the server's tool: watched for progress, questions and model calls from the server."""
        from apollia_nb.runtime.governed import current_call

        scope = current_call.get()
        inflight = _Inflight(scope=scope, tool=f"{self.name}/{tool}", timeout=self.config.timeout_secs)
        key = scope.call_id if scope is not None else f"anon-{id(inflight)}"
        self._inflight[key] = inflight
        try:
            async def ask(client: Any) -> Any:
                await self._offer_roots(client, scope)
                if as_task:
                    return await self._call_as_task(client, tool, arguments, inflight)
                return await client.call_tool(tool, arguments, read_timeout_seconds=_BACKSTOP_SECS,
                                              progress_callback=inflight.on_progress(self))

            result = await self._guarded(tool, ask, inflight)
        finally:
            self._inflight.pop(key, None)
            inflight.flush(self)
        if result.is_error:
            raise PermanentToolError(f"{self.name}/{tool}: {_error_text(result)}")
        return tool_output(result)

    async def _guarded(self, tool: str, ask: Callable[[Any], Any], inflight: "_Inflight | None" = None) -> Any:
        """Run one request on the connection; its failures as the project's errors (see the module)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        live = await self._connection()
        label = f"{self.name}/{tool}"
        timeout = self.config.timeout_secs
        late = f"{tool} did not answer within {timeout:g} s"
        again = "the server is restarted on next use"
        deadline = anyio.CancelScope(deadline=anyio.current_time() + timeout)
        if inflight is not None:
            inflight.deadline = deadline
        try:
            with deadline:
                result = await ask(live.client)
            if deadline.cancelled_caught:
                raise TimeoutError
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                live.drop(late)
                raise ToolTimeout(f"{self.name}/{late}; {again}") from None
            if exc.code == CONNECTION_CLOSED:
                live.drop(f"the connection closed during a call of {tool}")
                closed = f"{label}: the server closed the connection; {again}{self._log_hint()}"
                raise TransientToolError(closed) from None
            raise PermanentToolError(f"{label}: {exc.message}") from None
        except ValidationError as exc:
            raise PermanentToolError(
                f"{label}: the server's answer is not a valid MCP result ({exc.error_count()} problems)") from None
        except TimeoutError:
            live.drop(late)
            raise ToolTimeout(f"{self.name}/{late}; {again}") from None
        except ApolliaError:
            raise
        except Exception as exc:  # the transport failed under the call
            live.drop(f"the transport failed during a call of {tool}: {_describe(exc)}")
            raise TransientToolError(f"{label}: {_describe(exc)}; {again}") from None
        return result

    async def _call_as_task(self, client: Any, tool: str, arguments: dict[str, Any], inflight: "_Inflight") -> Any:
        """A task-augmented call: created, polled until it ends (no deadline while it works), its result
        fetched; cancelled on the server when the call is cancelled (the run was)."""
        from mcp_types import CallToolResult, CreateTaskResult, GetTaskResult

        session = client.session
        timeout = self.config.timeout_secs
        raw = await _raw_request(session, "tools/call", {"name": tool, "arguments": arguments,
                                                         "task": {"ttl": _TASK_TTL_MS}}, timeout)
        if "task" not in raw:  # the server ran it at once
            return CallToolResult.model_validate(raw, by_name=False)
        task = CreateTaskResult.model_validate(raw, by_name=False).task
        inflight.hold()  # a long-running call: each request is bounded, the wait is not
        try:
            status = task
            while status.status in ("working",):
                inflight.report(self, status=status.status, message=status.status_message)
                poll = (status.poll_interval or 1000) / 1000
                await anyio.sleep(min(max(poll, _POLL_MIN), _POLL_MAX))
                got = await _raw_request(session, "tasks/get", {"taskId": task.task_id}, timeout)
                status = GetTaskResult.model_validate(got, by_name=False)
            inflight.report(self, status=status.status, message=status.status_message)
            if status.status in ("failed", "cancelled"):
                raise PermanentToolError(f"{self.name}/{tool}: the task {status.status}"
                                         + (f": {status.status_message}" if status.status_message else ""))
            # completed, or input_required: the result request carries the server's questions, then the result.
            payload = await _raw_request(session, "tasks/result", {"taskId": task.task_id}, None)
            return CallToolResult.model_validate(payload, by_name=False)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                try:
                    await _raw_request(session, "tasks/cancel", {"taskId": task.task_id}, 5)
                    inflight.report(self, status="cancelled", message="cancelled with its run")
                except Exception:
                    pass
            raise

    # -- what the server asks of the host ----------------------------------------------------

    def _owner(self) -> "_Inflight | None":
        """The call a server's request belongs to: the caller's (a request carried in its result), else
        the only call in flight on this connection. None when it cannot be told: the request is refused."""
        from apollia_nb.runtime.governed import current_call

        scope = current_call.get()
        if scope is not None and scope.call_id in self._inflight:
            return self._inflight[scope.call_id]
        owned = [i for i in self._inflight.values() if i.scope is not None]
        return owned[0] if len(owned) == 1 else None

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        import mcp_types as t
        from pydantic import ValidationError
        from apollia_nb.governance.decision import Answer, Decision, Outcome
        from apollia_nb.runtime.governed import governed_request

        owner = self._owner()
        if owner is None or owner.scope is None:
            self._log_line("refused a question that no single call of this connection asked")
            return t.ElicitResult(action="decline")
        shown = params.model_dump(by_alias=True, exclude_none=True, mode="json")
        arguments: dict[str, Any] = {"mode": shown.get("mode", "form"), "message": shown.get("message", "")}
        for key in ("requestedSchema", "url", "elicitationId"):
            if key in shown:
                arguments[key] = shown[key]
        # Captured as shown from here on (decision, card, pending decision, journal): a sensitive
        # field's default and the configured tokens redacted.
        arguments = shown_request(arguments, secret_values(self._rt.config))
        asked = Decision(Outcome.ASK, 0, (Answer.ONCE, Answer.REFUSE),
                         reason=f"{self.name} asks the person, during {owner.tool}: {arguments['message']}")
        with owner.held():
            call_id, _, card = await governed_request(
                self._rt, owner.scope, tool=f"{self.name}/{ELICITATION}", family=None, arguments=arguments,
                connection=self.server, decided=asked, timeout_secs=self.config.input_timeout_secs,
                request=ELICITATION)
        assert card is not None
        action = elicitation_action(card.answer_value, card.answered_by)
        content = card.delivered_values if action == "accept" else None  # in clear to the server that asked
        try:
            result = t.ElicitResult(action=action, content=content)  # type: ignore[arg-type]  # validated here
        except ValidationError:  # not sent, and its values not repeated in any message
            self._log_line("an answer the protocol cannot carry was not sent: the question is cancelled")
            action, content = "cancel", None
            result = t.ElicitResult(action=action)  # type: ignore[arg-type]  # "cancel"
        self._journal_result(owner, call_id, f"{self.name}/{ELICITATION}",
                             {"action": action, **({"content": card.values} if content is not None else {})})
        return result

    async def _on_sample(self, context: Any, params: Any) -> Any:
        import mcp_types as t
        from apollia_nb.governance.decision import Outcome
        from apollia_nb.runtime.governed import governed_request, run_of
        from apollia_nb.runtime.models.base import Message

        owner = self._owner()
        tool = f"{self.name}/{SAMPLING}"
        if owner is None or owner.scope is None:
            self._log_line("refused a model call that no single call of this connection asked for")
            return t.ErrorData(code=-1, message="the host cannot tell which call asks for this model call")
        scope = owner.scope
        arguments = shown_request(sampling_arguments(params.model_dump(by_alias=True, exclude_none=True,
                                                                      mode="json")), secret_values(self._rt.config))
        with owner.held():
            call_id, decision, _ = await governed_request(
                self._rt, scope, tool=tool, family=self.config.families.get(SAMPLING), arguments=arguments,
                connection=self.server, timeout_secs=self.config.input_timeout_secs, request=SAMPLING)
        if decision.outcome is Outcome.REFUSE:
            self._journal_result(owner, call_id, tool, None, status="refused", error_code="REFUSED")
            return t.ErrorData(code=-1, message=f"the user refused the model call: {decision.reason}")
        from apollia_nb.runtime.governed import commit_entries

        await commit_entries(self._rt, scope.run_id, scope.agent, [("tool_call", {"call_id": call_id, "tool": tool,
                                                                            "arguments": arguments})])
        run, _ = run_of(self._rt, scope.run_id)
        messages = [Message(role="system", content=arguments["systemPrompt"])] if arguments.get("systemPrompt") else []
        messages += [Message(role="assistant" if m["role"] == "assistant" else "user", content=m["text"])
                     for m in arguments["messages"]]
        try:
            if run is not None:
                run._spend()  # counted against the run's budget like any model turn
            model = run.model if run is not None else scope.agent.model
            response = await model.complete("actor", messages)
            if run is not None:
                run.count_model_call(response.usage)  # and its tokens against the run's token budget
        except ApolliaError as exc:
            self._journal_result(owner, call_id, tool, {"message": exc.message}, status="error", error_code=exc.code)
            return t.ErrorData(code=-1, message=exc.message)
        model_name = str(getattr(model, "name", None) or getattr(scope.agent.manifest, "model_name", None)
                         or "apollia-nb")
        self._journal_result(owner, call_id, tool, {"text": response.text, "model": model_name})
        return t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text=response.text),
                                     model=model_name, stop_reason="endTurn")

    async def _on_roots(self, context: Any) -> Any:
        """Only the workspace of the agent whose call is in flight; none when no single call is."""
        import mcp_types as t

        owner = self._owner()
        if owner is None or owner.scope is None:
            return t.ListRootsResult(roots=[])
        workspace = Path(owner.scope.agent.workspace)
        return t.ListRootsResult(roots=[t.Root(uri=workspace.resolve().as_uri(), name="workspace")])  # type: ignore[arg-type]  # pydantic reads the URL

    async def _offer_roots(self, client: Any, scope: Any) -> None:
        """Before a call of another workspace's agent, tell a handshake-era server its roots changed,
        so it asks again while that call is in flight (and hears that agent's workspace)."""
        import warnings

        from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

        if not self.config.roots or scope is None or client.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return
        workspace = str(Path(scope.agent.workspace).resolve())
        if self._rooted == workspace:
            return
        self._rooted = workspace
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated by the stateless revision only
            await client.send_roots_list_changed()

    async def _on_log(self, params: Any) -> None:
        data = params.data if isinstance(params.data, str) else repr(params.data)
        self._log_line(f"[{params.level}]{' ' + params.logger if params.logger else ''} {data}")

    def _log_line(self, text: str) -> None:
        errlog = self._log
        if errlog is not None:
            _note(errlog, text)

    def _journal_result(self, owner: "_Inflight", call_id: str, tool: str, output: Any, *, status: str = "ok",
                        error_code: str | None = None) -> None:
        from apollia_nb.runtime.governed import NULL_DIGEST, capped_output

        assert owner.scope is not None
        shown, digest, _ = capped_output(output) if output is not None else (None, NULL_DIGEST, False)
        payload = {"call_id": call_id, "tool": tool, "status": status, "output": shown, "output_digest": digest,
                   **({"error_code": error_code} if error_code else {})}
        self._rt.journal.append_soon("tool_result", payload, run_id=owner.scope.run_id, agent=owner.scope.agent.name)

    async def _on_message(self, live: _Live, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            live.changed.set()  # also while the first listing is under way: read again once it is done

    async def _listener(self, live: _Live) -> None:
        """On the stateless revision (2026-07-28) change notifications come on a ``subscriptions/listen``
        stream; earlier revisions send ``notifications/tools/list_changed`` on the connection itself."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        client = live.client
        tools_cap = getattr(client.server_capabilities, "tools", None)
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not getattr(tools_cap, "list_changed", False):
            return
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _ in subscription:
                    live.changed.set()
        except Exception as exc:
            self._log_line(f"list changes are not followed: {_describe(exc)}")

    async def _refresher(self, live: _Live) -> None:
        """Read the tool list again whenever the server says it changed."""
        while True:
            await live.changed.wait()
            live.changed = anyio.Event()
            try:
                with anyio.fail_after(self.config.timeout_secs):
                    tools = await _list_tools(live.client)
            except Exception as exc:
                self._log_line(f"the tool list changed but could not be read: {_describe(exc)}")
                continue
            self._apply_listing(live, tools)

    def _apply_listing(self, live: _Live, tools: list[Any]) -> None:
        """A new listing: new tools are offered to agents registered from now on (unclassified until the
        configuration names them); a known tool's schema and hints are updated on its ToolDef, and its
        next card says it changed."""
        self.listings += 1
        tools = self._screen(tools)
        live.tools = list(tools)
        self._listing = list(tools)
        for tool in tools:
            tooldef = self._tooldefs.get(f"{self.name}/{tool.name}")
            if tooldef is None or tooldef.annotations is None:  # (an MCP tool's hints are always a dict)
                continue
            hints, schema = dict(tool_hints(tool) or {}), _schema(tool)
            if hints != {k: v for k, v in tooldef.annotations.items() if k != "changed"} \
                    or schema != tooldef.parameters:
                tooldef.annotations.clear()
                tooldef.annotations.update(hints, changed=True)
                tooldef.parameters.clear()
                tooldef.parameters.update(schema)
                from apollia_nb.runtime.governed import forget_sensitive_parts

                forget_sensitive_parts(tooldef)  # what its arguments hold that is sensitive is read anew
                self._log_line(f"{tool.name}: its schema or annotations changed")

    def _screen(self, tools: list[Any]) -> list[Any]:
        """The listed tools that may be offered; each name refused is logged and warned about once
        (``TOOL_NAME_REFUSED``), and stays in ``refused`` while the server lists it."""
        kept, refused = screen_tools(tools)
        for name, why in refused.items():
            if self.refused.get(name) != why:
                text = f"{ToolNameRefused.code}: the tool {name!r} is not offered: {why}"
                self._log_line(text)
                self._rt.events.emit("warning", f"{self.name}: {text}")
        self.refused = refused
        return kept

    def _log_hint(self) -> str:
        return f" (see {self.log_path})" if self.config.transport == "stdio" else ""

    def _verb(self) -> str:
        return "started" if self.config.transport == "stdio" else "reached"

    # -- the connection --------------------------------------------------------------------

    async def _connection(self) -> _Live:
        """The live connection, started (again) when there is none or the last one ended."""
        async with self._lock:
            live = self._live
            if live is not None and live.usable:
                return live
            if self._closed:
                raise TransientToolError(f"{self.name}: the runtime is closing")
            check_connection_allowed(self._rt, self.server)
            live = _Live()
            timeout = self.config.start_timeout_secs
            from apollia_nb.runtime.governed import current_call

            # The connection's tasks must not inherit the call that happens to start it: a server's
            # request is tied to a call only through the call's own task (see ``_owner``).
            unowned = current_call.set(None)
            try:
                with anyio.fail_after(timeout):
                    await self._rt.start_owned(functools.partial(self._serve, live))
            except TimeoutError:
                raise TransientToolError(f"{self.name}: the server could not be {self._verb()} within "
                                         f"{timeout:g} s{self._log_hint()}") from None
            except ApolliaError:
                raise
            except Exception as exc:
                raise TransientToolError(f"{self.name}: the server could not be {self._verb()}: "
                                         f"{_describe(exc)}{self._log_hint()}") from None
            finally:
                current_call.reset(unowned)
            self._live = live
            return live

    async def _serve(self, live: _Live, *, task_status: Any) -> None:
        """Own one connection: enter the client, report it started, hold it until told to stop."""
        started = False
        self._running.add(live)
        errlog = None
        try:
            from mcp import Client
            from mcp_types import Implementation

            errlog = self._log = self._open_log()
            if self.config.transport == "stdio":
                transport = self._stdio_transport(errlog)
            else:
                transport = self._http_transport()
            client = Client(
                _watched(transport, lambda: live.drop("the server exited or closed its output")),
                cache=None,
                client_info=Implementation(name="apollia-nb", version=_version()),
                read_timeout_seconds=self.config.timeout_secs,
                elicitation_callback=self._on_elicit,
                sampling_callback=self._on_sample,
                list_roots_callback=self._on_roots if self.config.roots else None,
                logging_callback=self._on_log,
                log_level="info",
                message_handler=functools.partial(self._on_message, live),
            )
            async with client:
                live.tools = self._screen(await _list_tools(client))
                self.listings += 1
                self._rooted = None  # a new connection has heard no roots yet
                live.client = client
                _note(errlog, f"connected: protocol {client.protocol_version}")
                task_status.started()
                started = True
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._refresher, live)
                    tg.start_soon(self._listener, live)
                    await live.stop.wait()
                    tg.cancel_scope.cancel()
            if errlog is not None:
                _note(errlog, f"stopped: {live.reason or 'done'}")
        except Exception as exc:
            if not started:
                raise
            if errlog is not None:  # the connection ended badly; the runtime carries on
                _note(errlog, f"connection ended: {_describe(exc)}")
        finally:
            live.stop.set()
            live.done.set()
            self._running.discard(live)
            if errlog is not None:
                errlog.close()

    def _open_log(self) -> Any:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        errlog = open(self.log_path, "a", encoding="utf-8", buffering=1)
        shown = " ".join([self.config.command or "", *self.config.args]) or (self.config.url or "")
        _note(errlog, f"starting {shown}")
        return errlog

    def _stdio_transport(self, errlog: Any) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        cwd = self.config.cwd
        if cwd is not None and not os.path.isabs(cwd):
            cwd = str(Path(self._rt.home.path) / cwd)
        params = StdioServerParameters(
            command=self.config.command or "", args=list(self.config.args),
            env=dict(self.config.env) or None, cwd=cwd,
        )
        return stdio_client(params, errlog=errlog)

    def _http_transport(self) -> Any:
        import httpx2  # the MCP SDK's HTTP client library
        from mcp.client.streamable_http import streamable_http_client

        headers = dict(self.config.headers)
        if self.config.token_env:
            token = os.environ.get(self.config.token_env)
            if not token:
                raise PermanentToolError(f"{self.name}: the environment variable {self.config.token_env} is not set")
            headers["Authorization"] = f"Bearer {token}"
        # The SDK's recommended timeouts: 30 s to connect and write, 300 s to read an open event stream.
        http_client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
        return _owning(http_client, streamable_http_client(self.config.url or "", http_client=http_client))


@asynccontextmanager
async def _owning(http_client: Any, transport: Any) -> AsyncIterator[Any]:
    """The streamable HTTP transport with its HTTP client closed after it."""
    async with http_client:
        async with transport as streams:
            yield streams


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _note(errlog: Any, text: str) -> None:
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    try:
        errlog.write(f"--- apollia-nb {stamp}: {text}\n")
        errlog.flush()
    except (OSError, ValueError):
        pass


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    if isinstance(exc, ApolliaError):
        return exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@functools.cache
def _version() -> str:
    try:
        from importlib.metadata import version

        return version("apollia-nb")
    except Exception:
        return "0"
