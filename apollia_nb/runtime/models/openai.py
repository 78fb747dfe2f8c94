"""The ``openai`` provider: any OpenAI-compatible chat-completions endpoint.

OpenAI itself, Ollama (``http://127.0.0.1:11434/v1``), vLLM and the llama.cpp
server all speak the same wire format: ``POST {base_url}/chat/completions``
with ``stream: true``, answered by server-sent events whose ``data:`` lines are
JSON chunks (``choices[0].delta``) and end with ``data: [DONE]``. Tool call
fragments are keyed by ``index``: the first carries the call's ``id`` and
``function.name``, the later ones append to ``function.arguments``. A server
that answers with one JSON document instead of a stream is read as well.

The translation in both directions is pure (:func:`to_openai_messages`,
:class:`OpenAIStreamParser`); the HTTP edge, error classification and retries
live in :mod:`.base`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apollia_nb.errors import ManifestInvalid, ModelPermanent, ModelTransient

from .base import (
    HttpProvider,
    Message,
    ModelResponse,
    RetryPolicy,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    check_keys,
    decode_arguments,
    field_value,
    loads_json,
)

__all__ = ["OpenAIModel", "OpenAIStreamParser", "to_openai_messages", "to_openai_tools", "DEFAULT_BASE_URL"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER = "openai"
_TABLE_KEYS = (
    "provider",
    "base_url",
    "model",
    "api_key_env",
    "timeout_secs",
    "temperature",
    "max_tokens",
    "max_retries",
    "force_tools",
)
_TRANSIENT_ERROR_WORDS = ("server_error", "rate_limit", "overloaded", "timeout", "unavailable")


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Provider-neutral messages in the chat-completions shape."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                        }
                        for c in m.tool_calls
                    ],
                }
            )
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def _stream_error(error: Any) -> Exception:
    """An ``{"error": ...}`` object inside a 200 response."""
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind = f"{error.get('type', '')} {error.get('code', '')}".lower()
    else:
        message, kind = str(error), ""
    if any(word in kind for word in _TRANSIENT_ERROR_WORDS):
        return ModelTransient(f"{PROVIDER}: the server reported an error: {message}")
    return ModelPermanent(f"{PROVIDER}: the server reported an error: {message}")


@dataclass
class _PartialCall:
    id: str
    name: str = ""
    started: bool = False
    fragments: list[str] = field(default_factory=list)


class OpenAIStreamParser:
    """Chat-completions chunks in, stream events out. Sans-IO."""

    def __init__(self) -> None:
        self.done = False
        self._text: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]:
        if data.strip() == "[DONE]":
            self.done = True
            return []
        chunk = loads_json(data, PROVIDER)
        if not isinstance(chunk, dict):
            raise ModelPermanent(f"{PROVIDER}: a stream chunk is not a JSON object: {data[:200]!r}")
        return self._feed_chunk(chunk)

    def _feed_chunk(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        if "error" in chunk:
            raise _stream_error(chunk["error"])
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise ModelPermanent(f"{PROVIDER}: choices is not a list")
        events: list[StreamEvent] = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ModelPermanent(f"{PROVIDER}: delta is not an object")
            content = delta.get("content")
            if isinstance(content, str) and content:
                self._text.append(content)
                events.append(TextDelta(content))
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                events.extend(self._feed_call(position, fragment))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def _feed_call(self, position: int, fragment: Any) -> list[StreamEvent]:
        if not isinstance(fragment, dict):
            raise ModelPermanent(f"{PROVIDER}: a tool call fragment is not an object: {fragment!r}")
        index = fragment.get("index", position)
        function = fragment.get("function") or {}
        if not isinstance(function, dict):
            raise ModelPermanent(f"{PROVIDER}: a tool call's function is not an object: {function!r}")
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _PartialCall(id=fragment.get("id") or f"call_{index}")
        if not call.name and function.get("name"):
            call.name = function["name"]
        events: list[StreamEvent] = []
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        if arguments:
            call.fragments.append(arguments)
        if not call.started and call.name:
            call.started = True
            events.append(ToolCallStarted(call.id, call.name))
            events.extend(ToolCallArgumentsDelta(call.id, f) for f in call.fragments)
        elif call.started and arguments:
            events.append(ToolCallArgumentsDelta(call.id, arguments))
        return events

    def feed_json(self, body: Any) -> list[StreamEvent]:
        """A whole (non-streamed) chat completion."""
        if not isinstance(body, dict):
            raise ModelPermanent(f"{PROVIDER}: the response is not a JSON object")
        if "error" in body:
            raise _stream_error(body["error"])
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ModelPermanent(f"{PROVIDER}: the response has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ModelPermanent(f"{PROVIDER}: the response's first choice has no message")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ModelPermanent(f"{PROVIDER}: tool_calls is not a list")
        delta = {
            "content": message.get("content"),
            "tool_calls": [dict(c, index=i) if isinstance(c, dict) else c for i, c in enumerate(calls)],
        }
        chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": choices[0].get("finish_reason")}]}
        if "usage" in body:
            chunk["usage"] = body["usage"]
        events = self._feed_chunk(chunk)
        self.done = True
        return events

    def finish(self) -> ModelResponse:
        if not self.done and self._finish_reason is None:
            raise ModelTransient(f"{PROVIDER}: the stream ended before the reply was complete")
        calls = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise ModelPermanent(f"{PROVIDER}: tool call {partial.id} has no function name")
            arguments = decode_arguments("".join(partial.fragments), PROVIDER, partial.name)
            calls.append(ToolCallRequest(partial.id, partial.name, arguments))
        return ModelResponse(
            text="".join(self._text), tool_calls=tuple(calls), stop_reason=self._finish_reason, usage=self._usage
        )


class OpenAIModel(HttpProvider):
    """A provider for an OpenAI-compatible ``/chat/completions`` endpoint.

    ``api_key`` None sends no ``Authorization`` header (Ollama, local vLLM).
    With ``force_tools`` (the default), a planner or critic offered exactly one
    tool is made to call it (``tool_choice: "required"``).
    """

    PROVIDER = PROVIDER
    ENDPOINT = "/chat/completions"
    PARSER = OpenAIStreamParser

    def __init__(
        self,
        *,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        timeout_secs: float = 60.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        force_tools: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_secs = timeout_secs
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.force_tools = force_tools
        self.retry = retry or RetryPolicy()
        self.name = f"{PROVIDER}:{model}"

    @classmethod
    def from_table(
        cls, table: Mapping[str, Any], env: Mapping[str, str], where: str = "model", *, retry: RetryPolicy | None = None
    ) -> OpenAIModel:
        """Build from a manifest's ``[model]`` table (``provider = "openai"``)."""
        check_keys(table, _TABLE_KEYS, where)
        model = field_value(table, "model", "str", where)
        key_env = field_value(table, "api_key_env", "str", where, None)
        api_key = None
        if key_env is not None:
            api_key = env.get(key_env)
            if not api_key:
                raise ManifestInvalid(f"{where}.api_key_env: environment variable {key_env} is not set")
        timeout = field_value(table, "timeout_secs", "number", where, 60.0)
        if timeout <= 0:
            raise ManifestInvalid(f"{where}.timeout_secs: must be positive, got {timeout!r}")
        max_tokens = field_value(table, "max_tokens", "int", where, None)
        if max_tokens is not None and max_tokens <= 0:
            raise ManifestInvalid(f"{where}.max_tokens: must be positive, got {max_tokens!r}")
        max_retries = field_value(table, "max_retries", "int", where, RetryPolicy.max_retries)
        if max_retries < 0:
            raise ManifestInvalid(f"{where}.max_retries: must not be negative, got {max_retries!r}")
        base = retry or RetryPolicy()
        return cls(
            model=model,
            base_url=field_value(table, "base_url", "str", where, DEFAULT_BASE_URL),
            api_key=api_key,
            timeout_secs=float(timeout),
            temperature=field_value(table, "temperature", "number", where, None),
            max_tokens=max_tokens,
            force_tools=field_value(table, "force_tools", "bool", where, True),
            retry=RetryPolicy(max_retries, base.backoff_base_secs, base.max_delay_secs, base.sleep),
        )

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages), "stream": True}
        if tools:
            body["tools"] = to_openai_tools(tools)
            if self.force_tools and role in ("planner", "critic") and len(tools) == 1:
                body["tool_choice"] = "required"
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

