"""MCP servers as governed tools: ``mcp:<server>/<tool>`` over stdio or streamable HTTP.

One ``McpSource`` per ``[mcp.servers.NAME]``. Nothing starts at boot: the
server is started (stdio) or connected (HTTP) the first time an agent that
names one of its tools registers, and its tool list is cached. Each tool
becomes a ``ToolDef`` whose family comes **only** from the operator's
``families`` table (a tool left out is unclassified: asked every time, never
with ``always``); the server's MCP annotations (``readOnlyHint`` …) are kept
as hints for the consent card and never read by governance.

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

``import mcp`` is slow (about 0.6 s), so it happens only when a server is used.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb.errors import ApolliaError, PermanentToolError, ToolTimeout, TransientToolError
from apollia_nb.federation.config import McpServerConfig
from apollia_nb.federation.sources import check_connection_allowed, named_tools

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.tools import ToolDef

__all__ = ["McpSource", "tool_output", "tool_hints", "CLOSE_WAIT_SECS"]

#: How long ``aclose()`` waits for connections to shut down (a stdio server gets
#: its stdin closed, then SIGTERM, then SIGKILL within about 4 s).
CLOSE_WAIT_SECS = 10.0
_LIST_PAGES = 100
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


def _block(block: Any) -> Any:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        try:
            size = len(base64.b64decode(block.data, validate=False))
        except (ValueError, TypeError):
            size = None
        return {"type": kind, "mime_type": block.mime_type, "bytes": size}
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
        return out
    from apollia_nb.runtime.tools import to_jsonable

    return to_jsonable(getattr(block, "model_dump", lambda **_: block)(by_alias=True, exclude_none=True))


def tool_output(result: Any) -> Any:
    """A ``CallToolResult`` as the tool's JSON output.

    The structured content when the server gave one; else the text of a single
    text block; else a list with each text block as a string and every other
    block summarised (images and audio by type, MIME type and size — their
    bytes are not passed on; resources by URI, with their text when textual).
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

    @property
    def usable(self) -> bool:
        return self.client is not None and not self.stop.is_set()

    def drop(self, reason: str) -> None:
        """Stop this connection (the first reason given is the one logged)."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()


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
        return [self._tooldef(by_name[name]) for name in wanted if name in by_name]

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
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        if not isinstance(schema.get("properties"), Mapping):
            schema["properties"] = {}

        async def call(**arguments: Any) -> Any:
            return await self._call(tool.name, arguments)

        call.__name__ = tool.name.replace("-", "_").replace(".", "_")
        tooldef = ToolDef(
            name=name,
            family=self.config.families.get(tool.name),
            fn=call,
            parameters=schema,
            description=tool.description or "",
            # A backstop: the call bounds starting the server and waiting for the answer itself.
            timeout_secs=self.config.start_timeout_secs + self.config.timeout_secs + 5,
            connection=self.server,
            annotations=tool_hints(tool),
        )
        self._tooldefs[name] = tooldef
        return tooldef

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        live = await self._connection()
        label = f"{self.name}/{tool}"
        timeout = self.config.timeout_secs
        late = f"{tool} did not answer within {timeout:g} s"
        again = "the server is restarted on next use"
        try:
            result = await live.client.call_tool(tool, arguments, read_timeout_seconds=timeout)
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
        except Exception as exc:  # the transport failed under the call
            live.drop(f"the transport failed during a call of {tool}: {_describe(exc)}")
            raise TransientToolError(f"{label}: {_describe(exc)}; {again}") from None
        if result.is_error:
            raise PermanentToolError(f"{label}: {_error_text(result)}")
        return tool_output(result)

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

            if self.config.transport == "stdio":
                errlog = self._open_log()
                transport = self._stdio_transport(errlog)
            else:
                transport = self._http_transport()
            client = Client(
                _watched(transport, lambda: live.drop("the server exited or closed its output")),
                cache=None,
                client_info=Implementation(name="apollia-nb", version=_version()),
                read_timeout_seconds=self.config.timeout_secs,
            )
            async with client:
                live.tools = await _list_tools(client)
                live.client = client
                task_status.started()
                started = True
                await live.stop.wait()
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
        shown = " ".join([self.config.command or "", *self.config.args])
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
