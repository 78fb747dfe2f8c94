"""The ``anthropic`` provider: the Messages API (``POST {base_url}/v1/messages``).

Its shape differs from chat-completions in three ways this module translates:
system prompts travel beside the messages (``system``), tool calls are
``tool_use`` content blocks of the assistant, and tool results are
``tool_result`` blocks of a *user* message (consecutive results, and a user
message that follows them, share one user message, results first).

The stream is server-sent events: ``message_start``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``,
``input_json_delta``, ``thinking_delta``, ``signature_delta``) /
``content_block_stop``, then ``message_delta`` (stop reason, usage, cumulative)
and ``message_stop``; ``ping`` and unknown events are ignored, an ``error``
event fails the turn (``overloaded_error`` and ``api_error`` are transient).

``thinking`` and ``redacted_thinking`` blocks are the turn's reasoning
(:class:`~.base.ReasoningPart`, signature and redacted data kept opaque); they
go back, before the text and tool calls, in the assistant message of the next
request, as the API requires when thinking is on. A turn that stops with
``pause_turn`` is continued: its content is sent back as the assistant's and
the model asked again, at most :data:`MAX_PAUSES` times, one response in the end.
Translation and parsing are pure; HTTP lives in :mod:`.base`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from .kit import *  # noqa: F403 - the providers' one vocabulary (see .kit)

__all__ = [
    "AnthropicModel",
    "AnthropicStreamParser",
    "to_anthropic_messages",
    "to_anthropic_tools",
    "DEFAULT_BASE_URL",
    "API_VERSION",
    "MAX_PAUSES",
    "DEFAULT_THINKING_BUDGET",
]

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_KEY_ENV = "ANTHROPIC_API_KEY"
API_VERSION = "2023-06-01"
PROVIDER = "anthropic"
MAX_PAUSES = 5  # continuations of one turn paused by the server (pause_turn)
DEFAULT_THINKING_BUDGET = 2048  # thinking = true
MIN_THINKING_BUDGET = 1024  # the API's floor
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
    "thinking",
    "structured",
    "images",
)
_TRANSIENT_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


def to_anthropic_messages(
    messages: Sequence[Message], *, images: bool = False
) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` in the Messages API shape.

    System messages are joined (blank line between) into ``system``. An
    assistant message with neither text nor tool calls is left out: the API
    refuses empty turns. With ``images``, a tool result that carries images is a
    ``tool_result`` whose content is its text, then one ``image`` block per image.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []
    open_results: list[dict[str, Any]] | None = None  # the content list of the last tool-result user message
    for m in messages:
        if m.role == "system":
            system.append(m.content)
            continue
        if m.role == "tool":
            found = tool_images(m) if images else []
            content: Any = m.content
            if found:
                content = [{"type": "text", "text": m.content}] + [
                    {"type": "image", "source": {"type": "base64", "media_type": d["mime_type"],
                                                 "data": base64.b64encode(data).decode("ascii")}}
                    for d, data in found
                ]
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": content}
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
        thinking = _thinking_blocks(m.reasoning)
        out.append({"role": "assistant", "content": thinking + blocks if m.tool_calls or thinking else m.content})
    return ("\n\n".join(system) if system else None), out


def _thinking_blocks(parts: Sequence[ReasoningPart]) -> list[dict[str, Any]]:
    """The turn's signed thinking, as the API gave it: it must precede the tool_use blocks it led to.
    Reasoning from other providers, or thinking without its signature, cannot be sent back."""
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if part.source == "thinking" and part.signature is not None:
            blocks.append({"type": "thinking", "thinking": part.text, "signature": part.signature})
        elif part.source == "redacted_thinking" and part.redacted is not None:
            blocks.append({"type": "redacted_thinking", "data": part.redacted})
    return blocks


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
    kind: str  # "text", "tool_use", "thinking", "redacted_thinking" or another (kept to be sent back)
    raw: dict[str, Any]  # the block as it started
    id: str = ""
    name: str = ""
    fragments: list[str] = field(default_factory=list)  # input JSON (tool_use, server tool use)
    text: list[str] = field(default_factory=list)  # text or thinking
    signature: list[str] = field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        """The block whole, as it goes back in an assistant message."""
        block = dict(self.raw)
        if self.kind == "text":
            block["text"] = "".join(self.text)
        elif self.kind == "thinking":
            block["thinking"] = "".join(self.text)
            block["signature"] = "".join(self.signature)
        elif self.fragments:
            block["input"] = decode_arguments("".join(self.fragments), PROVIDER, self.name or self.kind)
        return block


def _cumulative(usage: dict[str, Any], given: Any) -> None:
    """``message_delta`` counts are cumulative (input tokens too, with server tools): they replace
    what ``message_start`` said; a count it leaves out or sends as null keeps the earlier one."""
    if given is None:
        return
    if not isinstance(given, dict):
        raise TypeError("usage is not an object")
    for key, value in given.items():
        if value is not None:
            usage[key] = value


class AnthropicStreamParser:
    """Messages API events in, stream events out. Sans-IO."""

    def __init__(self) -> None:
        self.done = False
        self._blocks: dict[int, _Block] = {}
        self._text: list[str] = []
        self._stop_reason: str | None = None
        self._usage: dict[str, Any] = {}

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]:
        kind, payload = typed_event(event, data, PROVIDER)
        try:
            return self._feed(kind, payload)
        except (KeyError, TypeError, AttributeError):
            raise ModelPermanent(f"{PROVIDER}: malformed {kind} event: {data[:200]!r}") from None

    def _feed(self, kind: str | None, payload: dict[str, Any]) -> list[StreamEvent]:
        if kind == "message_start":
            _cumulative(self._usage, payload["message"].get("usage"))
        elif kind == "content_block_start":
            return self._start(payload["index"], payload["content_block"])
        elif kind == "content_block_delta":
            return self._delta(payload["index"], payload["delta"])
        elif kind == "message_delta":
            reason = payload.get("delta", {}).get("stop_reason")
            if reason:
                self._stop_reason = reason
            _cumulative(self._usage, payload.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise _error(payload.get("error"))
        return []  # ping, content_block_stop and events this version does not know

    def _start(self, index: int, block: dict[str, Any]) -> list[StreamEvent]:
        kind = block["type"]
        if not isinstance(kind, str):
            raise TypeError("block type")
        if kind == "tool_use":
            started = self._blocks[index] = _Block("tool_use", dict(block), id=block["id"], name=block["name"])
            events: list[StreamEvent] = [ToolCallStarted(started.id, started.name)]
            initial = block.get("input")
            if initial:  # a complete input given up front rather than streamed
                started.fragments.append(json.dumps(initial, ensure_ascii=False))
                events.append(ToolCallArgumentsDelta(started.id, started.fragments[-1]))
            return events
        new = self._blocks[index] = _Block(kind, dict(block), name=str(block.get("name", "")))
        if kind == "text" and block.get("text"):
            new.text.append(block["text"])
            self._text.append(block["text"])
            return [TextDelta(block["text"])]
        if kind == "thinking":
            if block.get("signature"):
                new.signature.append(block["signature"])
            if block.get("thinking"):
                new.text.append(block["thinking"])
                return [ReasoningDelta(block["thinking"])]
        if kind == "redacted_thinking" and not isinstance(block["data"], str):
            raise TypeError("redacted data")
        if isinstance(block.get("input"), dict) and block["input"]:  # a server tool's whole input
            new.fragments.append(json.dumps(block["input"], ensure_ascii=False))
        return []

    def _delta(self, index: int, delta: dict[str, Any]) -> list[StreamEvent]:
        block = self._blocks.get(index)
        if block is None:
            raise ModelPermanent(f"{PROVIDER}: a delta for content block {index}, which never started")
        kind = delta["type"]
        if kind == "text_delta" and block.kind == "text":
            block.text.append(delta["text"])
            self._text.append(delta["text"])
            return [TextDelta(delta["text"])] if delta["text"] else []
        if kind == "input_json_delta" and block.kind != "text":
            block.fragments.append(delta["partial_json"])
            if block.kind == "tool_use" and delta["partial_json"]:
                return [ToolCallArgumentsDelta(block.id, delta["partial_json"])]
            return []
        if kind == "thinking_delta" and block.kind == "thinking":
            block.text.append(delta["thinking"])
            return [ReasoningDelta(delta["thinking"])] if delta["thinking"] else []
        if kind == "signature_delta" and block.kind == "thinking":
            if not isinstance(delta["signature"], str):
                raise TypeError("signature")
            block.signature.append(delta["signature"])
        return []  # citations and deltas this version does not know

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
            _cumulative(self._usage, body.get("usage"))
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

    def content(self) -> list[dict[str, Any]]:
        """The message's content blocks whole, in order, as they go back to the API."""
        return [block.wire() for _, block in sorted(self._blocks.items())]

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ModelTransient(f"{PROVIDER}: the stream ended before message_stop")
        blocks = [b for _, b in sorted(self._blocks.items())]
        calls = tuple(
            ToolCallRequest(b.id, b.name, decode_arguments("".join(b.fragments), PROVIDER, b.name))
            for b in blocks
            if b.kind == "tool_use"
        )
        reasoning = []
        for b in blocks:
            if b.kind == "thinking":
                reasoning.append(ReasoningPart(text="".join(b.text), signature="".join(b.signature) or None,
                                               source="thinking"))
            elif b.kind == "redacted_thinking":
                reasoning.append(ReasoningPart(redacted=b.raw["data"], source="redacted_thinking"))
        return ModelResponse(
            text="".join(self._text), tool_calls=calls, stop_reason=self._stop_reason, usage=self._usage or None,
            reasoning=tuple(reasoning),
        )


def merge_turn(responses: Sequence[ModelResponse]) -> ModelResponse:
    """One turn made of the responses of a paused turn and its continuations: text, calls and
    reasoning in order, the last stop reason, token counts added up (each request is billed)."""
    usage: dict[str, Any] = {}
    for response in responses:
        for key, value in (response.usage or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool) and isinstance(usage.get(key), int | float):
                usage[key] += value
            else:
                usage[key] = value
    return ModelResponse(
        text="".join(r.text for r in responses),
        tool_calls=tuple(c for r in responses for c in r.tool_calls),
        stop_reason=responses[-1].stop_reason,
        usage=usage or None,
        reasoning=tuple(p for r in responses for p in r.reasoning),
    )


class AnthropicModel(HttpProvider):
    """A provider for the Anthropic Messages API.

    With ``force_tools`` (the default), a planner or critic offered exactly one
    tool is made to call a tool (``tool_choice: {"type": "any"}``), except with
    thinking on: the API refuses forced tool use then, and the choice stays the
    model's. ``thinking_budget`` (tokens) turns extended thinking on.
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
        thinking_budget: int | None = None,
        images: bool = False,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.base_url = base_url.rstrip("/")
        self.max_tokens = max_tokens
        self.timeout_secs = timeout_secs
        self.temperature = temperature
        self.force_tools = force_tools
        self.thinking_budget = thinking_budget
        self.images = images
        self.retry = retry or RetryPolicy()
        self.name = f"{PROVIDER}:{model}"

    @classmethod
    def from_table(
        cls, table: Mapping[str, Any], env: Mapping[str, str], where: str = "model", *, retry: RetryPolicy | None = None
    ) -> AnthropicModel:
        """Build from a manifest's ``[model]`` table (``provider = "anthropic"``)."""
        check_keys(table, _TABLE_KEYS, where)
        model = field_value(table, "model", "str", where)
        for key in ("max_tokens", "timeout_secs"):
            value = field_value(table, key, "int" if key == "max_tokens" else "number", where, 1)
            if value <= 0:
                raise ManifestInvalid(f"{where}.{key}: must be positive, got {value!r}")
        max_retries = field_value(table, "max_retries", "int", where, RetryPolicy.max_retries)
        if max_retries < 0:
            raise ManifestInvalid(f"{where}.max_retries: must not be negative, got {max_retries!r}")
        max_tokens = field_value(table, "max_tokens", "int", where, 4096)
        temperature = field_value(table, "temperature", "number", where, None)
        budget = _thinking_budget(table, where, max_tokens, temperature)
        if field_value(table, "structured", "str", where, "tools") != "tools":
            raise ManifestInvalid(f"{where}.structured: anthropic answers plans and verdicts as tool calls only "
                                  f'(structured = "tools"), got {table["structured"]!r}')
        key_env = field_value(table, "api_key_env", "str", where, DEFAULT_KEY_ENV)
        api_key = env.get(key_env)
        if not api_key:
            raise ModelKeyMissing(f"{where}.api_key_env: environment variable {key_env} is not set; "
                                  "set it in the environment the kernel or server starts from")
        base = retry or RetryPolicy()
        return cls(
            model=model,
            api_key=api_key,
            base_url=field_value(table, "base_url", "str", where, DEFAULT_BASE_URL),
            max_tokens=max_tokens,
            timeout_secs=float(field_value(table, "timeout_secs", "number", where, 60.0)),
            temperature=temperature,
            force_tools=field_value(table, "force_tools", "bool", where, True),
            thinking_budget=budget,
            images=field_value(table, "images", "bool", where, False),
            retry=RetryPolicy(max_retries, base.backoff_base_secs, base.max_delay_secs, base.sleep),
        )

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        system, translated = to_anthropic_messages(messages, images=self.images)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": translated,
            "stream": True,
        }
        if system is not None:
            body["system"] = system
        if self.thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        if tools:
            body["tools"] = to_anthropic_tools(tools)
            forced = self.force_tools and role in ("planner", "critic") and len(tools) == 1
            if forced and self.thinking_budget is None:
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

    async def stream(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        """One turn. A response that stops with ``pause_turn`` is continued: the content so far goes
        back as the assistant's and the model is asked again (at most ``MAX_PAUSES`` times); the
        events of every response stream through, then one :class:`Completed` with the whole turn."""
        check_role(role)
        body = self.request_body(role, messages, tools)
        asked = list(body["messages"])
        sent_back: list[dict[str, Any]] = []
        responses: list[ModelResponse] = []
        for _ in range(MAX_PAUSES + 1):
            parsers: list[AnthropicStreamParser] = []

            def parser() -> AnthropicStreamParser:
                parsers.append(AnthropicStreamParser())
                return parsers[-1]

            request = HttpRequest(provider=PROVIDER, url=f"{self.base_url}{self.ENDPOINT}",
                                  headers=self.request_headers(), body=body, timeout_secs=self.timeout_secs)
            response: ModelResponse | None = None
            async with aclosing(http_stream(request, parser, self.retry)) as events:
                async for event in events:
                    if isinstance(event, Completed):
                        response = event.response
                    else:
                        yield event
            assert response is not None  # http_stream ends with Completed or raises
            responses.append(response)
            if response.stop_reason != "pause_turn":
                yield Completed(merge_turn(responses))
                return
            sent_back += parsers[-1].content()
            body = dict(body, messages=[*asked, {"role": "assistant", "content": list(sent_back)}])
        raise ModelPermanent(f"{PROVIDER}: the model paused its turn {MAX_PAUSES + 1} times without finishing it")


def _thinking_budget(table: Mapping[str, Any], where: str, max_tokens: int, temperature: Any) -> int | None:
    """``thinking``: true (a budget of ``DEFAULT_THINKING_BUDGET`` tokens), false, or a budget in
    tokens; at least the API's 1024 and less than ``max_tokens``; not with a temperature."""
    if "thinking" not in table:
        return None
    value = table["thinking"]
    if value is False:
        return None
    if value is True:
        budget = DEFAULT_THINKING_BUDGET
    elif isinstance(value, int) and not isinstance(value, bool):
        budget = value
    else:
        raise ManifestInvalid(f"{where}.thinking: must be true, false or a budget in tokens, got {value!r}")
    if budget < MIN_THINKING_BUDGET:
        raise ManifestInvalid(f"{where}.thinking: a budget of at least {MIN_THINKING_BUDGET} tokens, got {budget}")
    if budget >= max_tokens:
        raise ManifestInvalid(f"{where}.thinking: the budget ({budget}) must be less than max_tokens ({max_tokens})")
    if temperature is not None:
        raise ManifestInvalid(f"{where}.thinking: the API refuses a temperature with thinking on; "
                              "leave temperature out")
    return budget
