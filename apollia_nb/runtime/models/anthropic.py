"""The ``anthropic`` provider: the Messages API (``POST {base_url}/v1/messages``).

Its shape differs from chat-completions in three ways this module translates:
system prompts travel beside the messages (``system``), tool calls are
``tool_use`` content blocks of the assistant, and tool results are
``tool_result`` blocks of a *user* message (consecutive results, and a user
message that follows them, share one user message, results first).

The stream is server-sent events: ``message_start``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta`` or
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop
reason, usage) and ``message_stop``; ``ping`` and unknown events are ignored,
an ``error`` event fails the turn (``overloaded_error`` and ``api_error`` are
transient). Translation and parsing are pure; HTTP lives in :mod:`.base`.
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

__all__ = [
    "AnthropicModel",
    "AnthropicStreamParser",
    "to_anthropic_messages",
    "to_anthropic_tools",
    "DEFAULT_BASE_URL",
    "API_VERSION",
]

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_KEY_ENV = "ANTHROPIC_API_KEY"
API_VERSION = "2023-06-01"
PROVIDER = "anthropic"
_TABLE_KEYS = (
    "provider",
    "base_url",
    "model",
    "api_key_env",
    "max_tokens",
    "timeout_secs",
    "temperature",
    "max_retries",
    "force_tools",
)
_TRANSIENT_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def to_anthropic_messages(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` in the Messages API shape.

    System messages are joined (blank line between) into ``system``. An
    assistant message with neither text nor tool calls is left out: the API
    refuses empty turns.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []
    open_results: list[dict[str, Any]] | None = None  # the content list of the last tool-result user message
    for m in messages:
        if m.role == "system":
            system.append(m.content)
            continue
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if open_results is not None and all(b["type"] == "tool_result" for b in open_results):
                open_results.append(block)
            else:
                open_results = [block]
                out.append({"role": "user", "content": open_results})
            continue
        if m.role == "user":
            if open_results is not None and m.content:
                open_results.append({"type": "text", "text": m.content})
            else:
                out.append({"role": "user", "content": m.content})
            open_results = None
            continue
        open_results = None
        blocks: list[dict[str, Any]] = []
        if m.content:
            blocks.append({"type": "text", "text": m.content})
        for call in m.tool_calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        if not blocks:
            continue
        out.append({"role": "assistant", "content": blocks if m.tool_calls else m.content})
    return ("\n\n".join(system) if system else None), out


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def _error(error: Any) -> Exception:
    """An ``error`` event (or an error body inside a 200)."""
    kind = error.get("type", "") if isinstance(error, dict) else ""
    message = error.get("message", "") if isinstance(error, dict) else str(error)
    text = f"{PROVIDER}: {kind or 'error'}: {message}"
    return ModelTransient(text) if kind in _TRANSIENT_ERRORS else ModelPermanent(text)


@dataclass
class _Block:
    kind: str  # "text", "tool_use" or anything else (ignored)
    id: str = ""
    name: str = ""
    fragments: list[str] = field(default_factory=list)


class AnthropicStreamParser:
    """Messages API events in, stream events out. Sans-IO."""

    def __init__(self) -> None:
        self.done = False
        self._blocks: dict[int, _Block] = {}
        self._text: list[str] = []
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] = {}

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]:
        payload = loads_json(data, PROVIDER)
        if not isinstance(payload, dict):
            raise ModelPermanent(f"{PROVIDER}: an event is not a JSON object: {data[:200]!r}")
        kind = payload.get("type") or event
        try:
            return self._feed(kind, payload)
        except (KeyError, TypeError, AttributeError):
            raise ModelPermanent(f"{PROVIDER}: malformed {kind} event: {data[:200]!r}") from None

    def _feed(self, kind: str | None, payload: dict[str, Any]) -> list[StreamEvent]:
        if kind == "message_start":
            self._usage.update(payload["message"].get("usage") or {})
        elif kind == "content_block_start":
            return self._start(payload["index"], payload["content_block"])
        elif kind == "content_block_delta":
            return self._delta(payload["index"], payload["delta"])
        elif kind == "message_delta":
            reason = payload.get("delta", {}).get("stop_reason")
            if reason:
                self._stop_reason = reason
            self._usage.update(payload.get("usage") or {})
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise _error(payload.get("error"))
        return []  # ping, content_block_stop and events this version does not know

    def _start(self, index: int, block: dict[str, Any]) -> list[StreamEvent]:
        kind = block["type"]
        if kind == "tool_use":
            started = self._blocks[index] = _Block("tool_use", id=block["id"], name=block["name"])
            events: list[StreamEvent] = [ToolCallStarted(started.id, started.name)]
            initial = block.get("input")
            if initial:  # a complete input given up front rather than streamed
                started.fragments.append(json.dumps(initial, ensure_ascii=False))
                events.append(ToolCallArgumentsDelta(started.id, started.fragments[-1]))
            return events
        self._blocks[index] = _Block(kind)
        if kind == "text" and block.get("text"):
            self._text.append(block["text"])
            return [TextDelta(block["text"])]
        return []

    def _delta(self, index: int, delta: dict[str, Any]) -> list[StreamEvent]:
        block = self._blocks.get(index)
        if block is None:
            raise ModelPermanent(f"{PROVIDER}: a delta for content block {index}, which never started")
        if delta["type"] == "text_delta" and block.kind == "text":
            self._text.append(delta["text"])
            return [TextDelta(delta["text"])] if delta["text"] else []
        if delta["type"] == "input_json_delta" and block.kind == "tool_use":
            block.fragments.append(delta["partial_json"])
            return [ToolCallArgumentsDelta(block.id, delta["partial_json"])] if delta["partial_json"] else []
        return []  # thinking, signatures, citations: not part of the reply

    def feed_json(self, body: Any) -> list[StreamEvent]:
        """A whole (non-streamed) message."""
        if not isinstance(body, dict):
            raise ModelPermanent(f"{PROVIDER}: the response is not a JSON object")
        if body.get("type") == "error":
            raise _error(body.get("error"))
        content = body.get("content")
        if not isinstance(content, list):
            raise ModelPermanent(f"{PROVIDER}: the response has no content list")
        events: list[StreamEvent] = []
        try:
            self._usage.update(body.get("usage") or {})
            for index, block in enumerate(content):
                if block["type"] == "tool_use":
                    events += self._start(index, dict(block, input={}))
                    whole = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    events += self._delta(index, whole)
                else:
                    events += self._start(index, block)
        except (KeyError, TypeError, AttributeError):
            raise ModelPermanent(f"{PROVIDER}: malformed message content") from None
        self._stop_reason = body.get("stop_reason")
        self.done = True
        return events

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ModelTransient(f"{PROVIDER}: the stream ended before message_stop")
        calls = tuple(
            ToolCallRequest(b.id, b.name, decode_arguments("".join(b.fragments), PROVIDER, b.name))
            for _, b in sorted(self._blocks.items())
            if b.kind == "tool_use"
        )
        return ModelResponse(
            text="".join(self._text), tool_calls=calls, stop_reason=self._stop_reason, usage=self._usage or None
        )


class AnthropicModel(HttpProvider):
    """A provider for the Anthropic Messages API.

    With ``force_tools`` (the default), a planner or critic offered exactly one
    tool is made to call a tool (``tool_choice: {"type": "any"}``).
    """

    PROVIDER = PROVIDER
    ENDPOINT = "/v1/messages"
    PARSER = AnthropicStreamParser

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        max_tokens: int = 4096,
        timeout_secs: float = 60.0,
        temperature: float | None = None,
        force_tools: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.max_tokens = max_tokens
        self.timeout_secs = timeout_secs
        self.temperature = temperature
        self.force_tools = force_tools
        self.retry = retry or RetryPolicy()
        self.name = f"{PROVIDER}:{model}"

    @classmethod
    def from_table(
        cls, table: Mapping[str, Any], env: Mapping[str, str], where: str = "model", *, retry: RetryPolicy | None = None
    ) -> AnthropicModel:
        """Build from a manifest's ``[model]`` table (``provider = "anthropic"``)."""
        check_keys(table, _TABLE_KEYS, where)
        model = field_value(table, "model", "str", where)
        key_env = field_value(table, "api_key_env", "str", where, DEFAULT_KEY_ENV)
        api_key = env.get(key_env)
        if not api_key:
            raise ManifestInvalid(f"{where}.api_key_env: environment variable {key_env} is not set")
        for key in ("max_tokens", "timeout_secs"):
            value = field_value(table, key, "int" if key == "max_tokens" else "number", where, 1)
            if value <= 0:
                raise ManifestInvalid(f"{where}.{key}: must be positive, got {value!r}")
        max_retries = field_value(table, "max_retries", "int", where, RetryPolicy.max_retries)
        if max_retries < 0:
            raise ManifestInvalid(f"{where}.max_retries: must not be negative, got {max_retries!r}")
        base = retry or RetryPolicy()
        return cls(
            model=model,
            api_key=api_key,
            base_url=field_value(table, "base_url", "str", where, DEFAULT_BASE_URL),
            max_tokens=field_value(table, "max_tokens", "int", where, 4096),
            timeout_secs=float(field_value(table, "timeout_secs", "number", where, 60.0)),
            temperature=field_value(table, "temperature", "number", where, None),
            force_tools=field_value(table, "force_tools", "bool", where, True),
            retry=RetryPolicy(max_retries, base.backoff_base_secs, base.max_delay_secs, base.sleep),
        )

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        system, translated = to_anthropic_messages(messages)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": translated,
            "stream": True,
        }
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = to_anthropic_tools(tools)
            if self.force_tools and role in ("planner", "critic") and len(tools) == 1:
                body["tool_choice"] = {"type": "any"}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    def request_headers(self) -> dict[str, str]:
        return {
            "x-api-key": self.api_key,
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
            "accept": "text/event-stream, application/json",
        }

