"""Fake model servers on 127.0.0.1 that speak the real wire formats.

A :class:`FakeModelServer` answers each POST with the next scripted
:class:`Reply` and records every request it received, so a test can assert on
both what the provider parsed and what it sent. Replies are written with
chunked transfer encoding, one flush per chunk, so stream parsing is exercised
over real HTTP; a reply can also hang (to test timeouts) or drop the
connection mid-stream.

Builders produce replies in the OpenAI chat-completions, OpenAI Responses and
Anthropic Messages shapes. Use the ``fake_model_server`` fixture (``from fake_model_servers import
fake_model_server``) or the class as a context manager.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

__all__ = [
    "Reply",
    "RecordedRequest",
    "FakeModelServer",
    "fake_model_server",
    "sse",
    "error_reply",
    "openai_stream",
    "openai_text_chunks",
    "openai_tool_chunks",
    "openai_json",
    "anthropic_stream",
    "anthropic_text_events",
    "anthropic_tool_events",
    "anthropic_message",
    "anthropic_blocks_events",
    "thinking_block",
    "redacted_block",
    "text_block",
    "tool_block",
    "responses_stream",
    "responses_json",
    "responses_events",
    "responses_message",
    "responses_call",
    "responses_reasoning",
    "RESPONSES_USAGE",
]

HANG_LIMIT_SECS = 10.0  # a hanging reply gives up by itself after this, whatever happens


@dataclass
class Reply:
    """One scripted HTTP answer.

    ``chunks`` are written one by one (chunked encoding); ``body`` is written
    whole with a Content-Length. ``hang_before`` waits (until the server stops)
    before sending anything; ``hang_after=n`` sends n chunks then waits;
    ``drop_after=n`` sends n chunks then closes the connection without ending
    the body.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    body: bytes | None = None
    hang_before: bool = False
    hang_after: int | None = None
    drop_after: int | None = None


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # keys in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, owner: FakeModelServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.owner = owner


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence the stderr log
        pass

    def do_POST(self) -> None:  # the name http.server calls
        owner = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        owner._record(
            RecordedRequest(
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        reply = owner._next_reply()
        self.close_connection = True
        if reply.hang_before:
            owner.release.wait(HANG_LIMIT_SECS)
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("connection", "close")
        if reply.body is not None:
            self.send_header("content-length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            self.wfile.flush()
            return
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for sent, chunk in enumerate(reply.chunks):
            if reply.hang_after is not None and sent == reply.hang_after:
                self.wfile.flush()
                owner.release.wait(HANG_LIMIT_SECS)
                return
            if reply.drop_after is not None and sent == reply.drop_after:
                self.wfile.flush()
                return
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        if reply.hang_after is not None and reply.hang_after >= len(reply.chunks):
            owner.release.wait(HANG_LIMIT_SECS)
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeModelServer:
    """A threaded HTTP server on an ephemeral port of 127.0.0.1 with scripted replies.

    ``url`` is ``http://127.0.0.1:<port>``; with no reply queued it answers 500.
    """

    def __init__(self) -> None:
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def reply(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return error_reply(500, {"error": {"message": "fake server: no reply queued", "type": "server_error"}})

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def start(self) -> FakeModelServer:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="fake-model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def fake_model_server() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


# --------------------------------------------------------------------------- generic builders


def sse(events: Iterable[tuple[str | None, Any]]) -> list[bytes]:
    """One chunk per event: ``event: name`` (when given) and ``data: <json or str>``."""
    chunks = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\n" if name else ""
        chunks.append(f"{head}data: {text}\n\n".encode())
    return chunks


def error_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return Reply(status=status, headers={"content-type": "application/json", **(headers or {})}, body=raw)


# --------------------------------------------------------------------------- OpenAI chat completions


def _chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        **extra,
    }


def openai_text_chunks(pieces: Sequence[str], finish_reason: str = "stop", usage: dict | None = None) -> list[dict]:
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": p}) for p in pieces]
    chunks.append(_chunk({}, finish_reason, **({"usage": usage} if usage else {})))
    return chunks


def openai_tool_chunks(
    calls: Sequence[tuple[str, str, Sequence[str]]], *, interleave: bool = False, finish_reason: str = "tool_calls"
) -> list[dict]:
    """Tool calls ``(id, name, argument fragments)``: the first fragment of each call
    carries id and name with empty arguments, then one chunk per fragment;
    ``interleave`` alternates the calls' fragments."""
    chunks = [_chunk({"role": "assistant", "content": None})]
    for index, (call_id, name, _) in enumerate(calls):
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append(_chunk({"tool_calls": [first]}))
    per_call = [
        [_chunk({"tool_calls": [{"index": i, "function": {"arguments": f}}]}) for f in frags]
        for i, (_, _, frags) in enumerate(calls)
    ]
    if interleave:
        longest = max(len(p) for p in per_call)
        chunks += [p[j] for j in range(longest) for p in per_call if j < len(p)]
    else:
        chunks += [c for p in per_call for c in p]
    chunks.append(_chunk({}, finish_reason))
    return chunks


def openai_stream(chunks: Sequence[Any], *, done: bool = True, **reply: Any) -> Reply:
    """SSE of the chunks (dicts, or raw strings sent as they are), then ``data: [DONE]``."""
    body = sse((None, c) for c in chunks)
    if done:
        body += sse([(None, "[DONE]")])
    return Reply(headers={"content-type": "text/event-stream"}, chunks=body, **reply)


def openai_json(content: str | None = None, tool_calls: Sequence[tuple[str, str, Any]] = (), **extra: Any) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls
        ]
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        **extra,
    }
    return Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode())


# --------------------------------------------------------------------------- Anthropic messages


def _message_start(input_tokens: int = 10) -> tuple[str, dict]:
    return (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": "fake",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            },
        },
    )


def _message_end(stop_reason: str, output_tokens: int = 5, usage: dict | None = None) -> list[tuple[str, dict]]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": usage if usage is not None else {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def _text_block(index: int, pieces: Sequence[str]) -> list[tuple[str, dict]]:
    start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
    events: list[tuple[str, dict]] = [("content_block_start", start)]
    events += [
        ("content_block_delta",
         {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}})
        for p in pieces
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def _tool_block(index: int, call_id: str, name: str, fragments: Sequence[str]) -> list[tuple[str, dict]]:
    start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    events: list[tuple[str, dict]] = [
        ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
    ]
    events += [
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": f}},
        )
        for f in fragments
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def anthropic_text_events(pieces: Sequence[str], stop_reason: str = "end_turn") -> list[tuple[str, Any]]:
    return [_message_start(), ("ping", {"type": "ping"}), *_text_block(0, pieces), *_message_end(stop_reason)]


def anthropic_tool_events(
    calls: Sequence[tuple[str, str, Sequence[str]]], *, text: Sequence[str] = ()
) -> list[tuple[str, Any]]:
    """An optional text block, then one tool_use block per ``(id, name, partial_json fragments)``."""
    events: list[tuple[str, Any]] = [_message_start()]
    index = 0
    if text:
        events += _text_block(0, text)
        index = 1
    for offset, (call_id, name, fragments) in enumerate(calls):
        events += _tool_block(index + offset, call_id, name, fragments)
    events += _message_end("tool_use")
    return events


def anthropic_stream(events: Sequence[tuple[str | None, Any]], **reply: Any) -> Reply:
    return Reply(headers={"content-type": "text/event-stream"}, chunks=sse(events), **reply)


def anthropic_message(content: Sequence[dict[str, Any]], stop_reason: str = "end_turn") -> Reply:
    body = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": list(content),
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    return Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode())


# Content blocks as the Messages API streams them (extended thinking, redacted thinking,
# text, tool use): each builder takes the block's index and gives its events.


def thinking_block(pieces: Sequence[str], signature: str) -> Any:
    """A ``thinking`` block: ``thinking_delta`` pieces, then its ``signature_delta``."""

    def events(index: int) -> list[tuple[str, dict]]:
        start = {"type": "content_block_start", "index": index,
                 "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
        out: list[tuple[str, dict]] = [("content_block_start", start)]
        out += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "thinking_delta", "thinking": p}}) for p in pieces]
        out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                            "delta": {"type": "signature_delta", "signature": signature}}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    return events


def redacted_block(data: str) -> Any:
    """A ``redacted_thinking`` block: its encrypted ``data`` whole at the start, no deltas."""

    def events(index: int) -> list[tuple[str, dict]]:
        start = {"type": "content_block_start", "index": index,
                 "content_block": {"type": "redacted_thinking", "data": data}}
        return [("content_block_start", start), ("content_block_stop", {"type": "content_block_stop", "index": index})]

    return events


def text_block(pieces: Sequence[str]) -> Any:
    return lambda index: _text_block(index, pieces)


def tool_block(call_id: str, name: str, fragments: Sequence[str]) -> Any:
    return lambda index: _tool_block(index, call_id, name, fragments)


def anthropic_blocks_events(
    blocks: Sequence[Any], stop_reason: str, *, input_tokens: int = 10, end_usage: dict | None = None
) -> list[tuple[str, Any]]:
    """A whole streamed message of the given blocks (built by the block builders above)."""
    events: list[tuple[str, Any]] = [_message_start(input_tokens)]
    for index, block in enumerate(blocks):
        events += block(index)
    events += _message_end(stop_reason, usage=end_usage)
    return events


# --------------------------------------------------------------------------- OpenAI Responses API
# Written from the API reference's event and item types (openai-python's
# ``types/responses``, 2026-08): every event carries ``type`` and ``sequence_number``;
# the stream has no [DONE], it ends with response.completed / .incomplete / .failed.

RESPONSES_USAGE = {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 64}, "total_tokens": 123}


def responses_message(pieces: Sequence[str], item_id: str = "msg_1") -> Any:
    """A ``message`` item whose ``output_text`` streams in ``pieces``."""

    def build(index: int) -> tuple[list[dict], dict]:
        text = "".join(pieces)
        done = {"type": "message", "id": item_id, "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        events = [
            {"type": "response.output_item.added", "output_index": index,
             "item": {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}},
            {"type": "response.content_part.added", "item_id": item_id, "output_index": index, "content_index": 0,
             "part": {"type": "output_text", "text": "", "annotations": []}},
            *[{"type": "response.output_text.delta", "item_id": item_id, "output_index": index, "content_index": 0,
               "delta": p} for p in pieces],
            {"type": "response.output_text.done", "item_id": item_id, "output_index": index, "content_index": 0,
             "text": text},
            {"type": "response.content_part.done", "item_id": item_id, "output_index": index, "content_index": 0,
             "part": done["content"][0]},
            {"type": "response.output_item.done", "output_index": index, "item": done},
        ]
        return events, done

    return build


def responses_call(call_id: str, name: str, fragments: Sequence[str], item_id: str | None = None) -> Any:
    """A ``function_call`` item whose ``arguments`` stream in ``fragments``."""

    def build(index: int) -> tuple[list[dict], dict]:
        fc_id = item_id or f"fc_{call_id}"
        arguments = "".join(fragments)
        done = {"type": "function_call", "id": fc_id, "call_id": call_id, "name": name, "arguments": arguments,
                "status": "completed"}
        events = [
            {"type": "response.output_item.added", "output_index": index,
             "item": {**done, "arguments": "", "status": "in_progress"}},
            *[{"type": "response.function_call_arguments.delta", "item_id": fc_id, "output_index": index,
               "delta": f} for f in fragments],
            {"type": "response.function_call_arguments.done", "item_id": fc_id, "output_index": index,
             "arguments": arguments},
            {"type": "response.output_item.done", "output_index": index, "item": done},
        ]
        return events, done

    return build


def responses_reasoning(summary: Sequence[str], encrypted: str | None, item_id: str = "rs_1") -> Any:
    """A ``reasoning`` item: its summary text streams in pieces; ``encrypted_content`` comes whole
    in ``output_item.done`` (the ``added`` form has none yet)."""

    def build(index: int) -> tuple[list[dict], dict]:
        text = "".join(summary)
        done: dict[str, Any] = {"type": "reasoning", "id": item_id,
                                "summary": [{"type": "summary_text", "text": text}] if summary else []}
        if encrypted is not None:
            done["encrypted_content"] = encrypted
        events = [{"type": "response.output_item.added", "output_index": index,
                   "item": {"type": "reasoning", "id": item_id, "summary": []}}]
        if summary:
            events += [{"type": "response.reasoning_summary_part.added", "item_id": item_id, "output_index": index,
                        "summary_index": 0, "part": {"type": "summary_text", "text": ""}}]
            events += [{"type": "response.reasoning_summary_text.delta", "item_id": item_id, "output_index": index,
                        "summary_index": 0, "delta": p} for p in summary]
            events += [{"type": "response.reasoning_summary_text.done", "item_id": item_id, "output_index": index,
                        "summary_index": 0, "text": text}]
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        return events, done

    return build


def _response_object(output: list[dict], status: str, usage: dict | None, incomplete_reason: str | None,
                     error: dict | None = None) -> dict:
    return {"id": "resp_fake", "object": "response", "created_at": 0, "model": "fake", "status": status,
            "error": error, "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
            "output": output, "usage": usage}


def responses_events(items: Sequence[Any], *, status: str = "completed", usage: dict | None = RESPONSES_USAGE,
                     incomplete_reason: str | None = None) -> list[dict]:
    """A whole streamed response of the given items (built by the item builders above)."""
    events: list[dict] = [
        {"type": "response.created", "response": _response_object([], "in_progress", None, None)},
        {"type": "response.in_progress", "response": _response_object([], "in_progress", None, None)},
    ]
    output = []
    for index, item in enumerate(items):
        item_events, done = item(index)
        events += item_events
        output.append(done)
    end = "response.incomplete" if status == "incomplete" else "response.completed"
    events.append({"type": end, "response": _response_object(output, status, usage, incomplete_reason)})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def responses_stream(events: Sequence[Any], **reply: Any) -> Reply:
    """SSE of the events, each named by its type (``event: response.output_text.delta``)."""
    named = [(e.get("type") if isinstance(e, dict) else None, e) for e in events]
    return Reply(headers={"content-type": "text/event-stream"}, chunks=sse(named), **reply)


def responses_json(items: Sequence[Any], *, status: str = "completed", usage: dict | None = RESPONSES_USAGE,
                   incomplete_reason: str | None = None) -> Reply:
    """The same response as one JSON document (a server that does not stream)."""
    output = [item(index)[1] for index, item in enumerate(items)]
    body = _response_object(output, status, usage, incomplete_reason)
    return Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode())


# --------------------------------------------------------------------------- providers pointed at a fake server

def _no_retry() -> Any:
    from apollia_nb.runtime.models import RetryPolicy

    return RetryPolicy(max_retries=0)


def openai_model(server: FakeModelServer, **kw: Any) -> Any:
    """An ``openai`` (chat completions) provider of model ``m`` at the fake server; no retries unless given."""
    from apollia_nb.runtime.models.openai import OpenAIModel

    kw.setdefault("model", "m")
    kw.setdefault("retry", _no_retry())
    return OpenAIModel(base_url=f"{server.url}/v1", **kw)


def responses_model(server: FakeModelServer, **kw: Any) -> Any:
    """An ``openai`` provider with ``api = "responses"`` at the fake server; no retries unless given."""
    from apollia_nb.runtime.models.responses import ResponsesModel

    kw.setdefault("model", "m")
    kw.setdefault("retry", _no_retry())
    return ResponsesModel(base_url=f"{server.url}/v1", **kw)


def anthropic_model(server: FakeModelServer, **kw: Any) -> Any:
    """An ``anthropic`` provider of ``claude-test`` (key ``sk-ant-test``) at the fake server; no retries unless given."""
    from apollia_nb.runtime.models.anthropic import AnthropicModel

    kw.setdefault("model", "claude-test")
    kw.setdefault("api_key", "sk-ant-test")
    kw.setdefault("retry", _no_retry())
    return AnthropicModel(base_url=server.url, **kw)


# --------------------------------------------------------------------------- one task, as each provider answers it

def task_replies(kind: str, server: FakeModelServer, tool: str, fragments: Sequence[str],
                 answer: str) -> tuple[str, list[Reply]]:
    """The ``[model]`` lines of a provider at the fake server (``kind``: ``chat``, ``anthropic`` or
    ``responses``) and its replies to one task: a one-step plan, one call of ``tool`` with its
    argument ``fragments`` (id ``call_9``, ``toolu_9`` for Anthropic), ``answer``, a passing verdict."""
    plan, verdict = '{"steps": ["Plot the sales"]}', '{"verdict": "pass", "reasons": []}'
    if kind == "chat":
        return f'provider = "openai"\nmodel = "m"\nbase_url = "{server.url}/v1"\n', [
            openai_stream(openai_tool_chunks([("p", "submit_plan", [plan])])),
            openai_stream(openai_tool_chunks([("call_9", tool, list(fragments))])),
            openai_stream(openai_text_chunks([answer])),
            openai_stream(openai_tool_chunks([("v", "submit_verdict", [verdict])]))]
    if kind == "anthropic":
        return f'provider = "anthropic"\nmodel = "c"\nbase_url = "{server.url}"\n', [
            anthropic_stream(anthropic_tool_events([("p", "submit_plan", [plan])])),
            anthropic_stream(anthropic_tool_events([("toolu_9", tool, list(fragments))])),
            anthropic_stream(anthropic_text_events([answer])),
            anthropic_stream(anthropic_tool_events([("v", "submit_verdict", [verdict])]))]
    return f'provider = "openai"\napi = "responses"\nmodel = "m"\nbase_url = "{server.url}/v1"\n', [
        responses_stream(responses_events([responses_message([plan])])),
        responses_stream(responses_events([responses_call("call_9", tool, list(fragments))])),
        responses_stream(responses_events([responses_message([answer])])),
        responses_stream(responses_events([responses_message([verdict])]))]


def image_sent(kind: str, request: dict[str, Any]) -> str:
    """The image a request gave the model after the last tool result, as a ``data:`` URL."""
    if kind == "chat":
        return request["messages"][-1]["content"][1]["image_url"]["url"]
    if kind == "anthropic":
        source = request["messages"][-1]["content"][0]["content"][1]["source"]
        return f"data:{source['media_type']};base64,{source['data']}"
    return request["input"][-1]["output"][1]["image_url"]
