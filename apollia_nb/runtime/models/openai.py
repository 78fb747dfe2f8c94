"""The ``openai`` provider: any OpenAI-compatible chat-completions endpoint.

OpenAI itself, Ollama (``http://127.0.0.1:11434/v1``), vLLM and the llama.cpp
server all speak the same wire format: ``POST {base_url}/chat/completions``
with ``stream: true`` (and ``stream_options.include_usage``, so the last chunk
carries the token usage), answered by server-sent events whose ``data:`` lines
are JSON chunks (``choices[0].delta``) and end with ``data: [DONE]``. Tool call
fragments are keyed by ``index``: the first carries the call's ``id`` and
``function.name``, the later ones append to ``function.arguments``. A server
that answers with one JSON document instead of a stream is read as well.

Content comes as a string or as a list of parts (Mistral's reasoning models:
``{"type": "thinking", ...}`` and ``{"type": "text", ...}``), in a stream's
deltas and in a JSON reply alike; text parts are the answer, thinking parts
reasoning. Reasoning also comes in ``reasoning_content`` (DeepSeek, older
vLLM), ``reasoning`` (vLLM, Groq, Ollama, OpenRouter) and ``reasoning_details``
(OpenRouter), and as ``<think>…</think>`` at the start of the content (models
served without a reasoning parser). It is kept apart from the answer.

The translation in both directions is pure (:func:`to_openai_messages`,
:class:`OpenAIStreamParser`); the HTTP edge, error classification and retries
live in :mod:`.base`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .kit import *  # noqa: F403 - the providers' one vocabulary (see .kit)

__all__ = [
    "OpenAIModel",
    "OpenAIStreamParser",
    "ThinkSplitter",
    "to_openai_messages",
    "to_openai_tools",
    "DEFAULT_BASE_URL",
    "DEFAULT_KEY_ENV",
    "REASONING_EFFORTS",
    "APIS",
    "api_of",
    "common_settings",
    "COMMON_TABLE_KEYS",
    "image_data_url",
    "TRANSIENT_ERROR_WORDS",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
REASONING_EFFORTS = ("low", "medium", "high")
PROVIDER = "openai"
#: The ``[model]`` keys of both OpenAI APIs; each adds its own (``_TABLE_KEYS``, ``responses.TABLE_KEYS``).
COMMON_TABLE_KEYS = ("provider", "api", "base_url", "model", "api_key_env", "timeout_secs", "temperature",
                     "max_tokens", "max_retries", "force_tools", "reasoning_effort", "structured", "images")
_TABLE_KEYS = (*COMMON_TABLE_KEYS, "stream_usage")
APIS = ("chat", "responses")
#: Error types or codes inside a 200 answer (chat completions and the Responses API) worth a retry.
TRANSIENT_ERROR_WORDS = ("server_error", "rate_limit", "overloaded", "timeout", "unavailable")


def _reasoning_back(parts: Sequence[ReasoningPart]) -> dict[str, Any]:
    """What of a tool-calling turn's reasoning goes back: DeepSeek refuses the next request
    without the turn's ``reasoning_content``; OpenRouter keeps a model's reasoning across
    tool calls from its ``reasoning_details`` (signatures and encrypted data included).
    Reasoning that came in other fields is not sent (some servers refuse unknown fields)."""
    out: dict[str, Any] = {}
    content = [p.text for p in parts if p.source == "reasoning_content"]
    if content:
        out["reasoning_content"] = "".join(content)
    details = [p.detail for p in parts if p.source == "reasoning_details" and p.detail is not None]
    if details:
        out["reasoning_details"] = details
    return out


def _images_message(shown: list[tuple[Message, list[tuple[dict[str, Any], bytes]]]]) -> dict[str, Any]:
    """The user message that carries the images of the tool results before it (a tool message's
    content is text only): for each result, a line naming its call, then its images."""
    parts: list[dict[str, Any]] = []
    for message, images in shown:
        parts.append({"type": "text", "text": f"The image{'s' if len(images) > 1 else ''} of the result of "
                      f"tool call {message.tool_call_id} ({message.name or 'tool'}):"})
        for descriptor, data in images:
            url = image_data_url(descriptor, data)
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def to_openai_messages(messages: Sequence[Message], *, images: bool = False) -> list[dict[str, Any]]:
    """Provider-neutral messages in the chat-completions shape. With ``images``, the images of a
    run of tool results follow it in one user message of ``image_url`` parts."""
    out: list[dict[str, Any]] = []
    shown: list[tuple[Message, list[tuple[dict[str, Any], bytes]]]] = []
    for m in messages:
        if m.role != "tool" and shown:
            out.append(_images_message(shown))
            shown = []
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
            found = tool_images(m) if images else []
            if found:
                shown.append((m, found))
        elif m.role == "assistant" and m.tool_calls:
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    **_reasoning_back(m.reasoning),
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
    if shown:
        out.append(_images_message(shown))
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
    if any(word in kind for word in TRANSIENT_ERROR_WORDS):
        return ModelTransient(f"{PROVIDER}: the server reported an error: {message}")
    return ModelPermanent(f"{PROVIDER}: the server reported an error: {message}")


_OPEN_THINK, _CLOSE_THINK = "<think>", "</think>"


class ThinkSplitter:
    """``<think>…</think>`` at the start of a reply's content, split from the answer. Sans-IO.

    Feed the content's pieces as they stream; each call returns ``(kind, text)``
    pairs, ``kind`` ``"reasoning"`` or ``"text"``. A tag cut across pieces is held
    back until it is whole. Only a reply that *begins* with ``<think>`` (after
    whitespace) is split: a tag later in an answer is the answer's own text.
    """

    def __init__(self) -> None:
        self._held = ""
        self._state = "start"  # start → thinking → after → answer, or start → answer

    def feed(self, piece: str) -> list[tuple[str, str]]:
        buf = self._held + piece
        self._held = ""
        out: list[tuple[str, str]] = []
        if self._state == "start":
            stripped = buf.lstrip()
            if _OPEN_THINK.startswith(stripped):  # nothing yet, or the tag still cut
                self._held = buf
                return out
            if stripped.startswith(_OPEN_THINK):
                self._state = "thinking"
                buf = stripped[len(_OPEN_THINK):]
            else:
                self._state = "answer"
        if self._state == "thinking":
            end = buf.find(_CLOSE_THINK)
            if end < 0:
                keep = _partial_suffix(buf, _CLOSE_THINK)
                if keep:
                    self._held, buf = buf[-keep:], buf[:-keep]
                if buf:
                    out.append(("reasoning", buf))
                return out
            if end:
                out.append(("reasoning", buf[:end]))
            buf = buf[end + len(_CLOSE_THINK):]
            self._state = "after"
        if self._state == "after":  # the blank lines between the reasoning and the answer
            buf = buf.lstrip("\r\n")
            if not buf:
                return out
            self._state = "answer"
        if buf:
            out.append(("text", buf))
        return out

    def finish(self) -> list[tuple[str, str]]:
        """What is held back when the content ends (a tag cut short, or whitespace alone)."""
        held, self._held = self._held, ""
        if not held:
            return []
        return [("reasoning" if self._state == "thinking" else "text", held)]


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _thinking_text(part: dict[str, Any]) -> str:
    """The text of a Mistral thinking part: a list of text chunks, or a string."""
    thinking = part.get("thinking")
    if isinstance(thinking, str):
        return thinking
    if not isinstance(thinking, list):
        raise ModelPermanent(f"{PROVIDER}: a thinking part's thinking is neither text nor a list: {thinking!r}")
    pieces = []
    for chunk in thinking:
        if isinstance(chunk, str):
            pieces.append(chunk)
        elif isinstance(chunk, dict) and isinstance(chunk.get("text"), str):
            pieces.append(chunk["text"])
        else:
            raise ModelPermanent(f"{PROVIDER}: a thinking chunk is not text: {chunk!r}")
    return "".join(pieces)


def _merge_detail(into: dict[str, Any], piece: dict[str, Any]) -> None:
    """One streamed piece of an OpenRouter reasoning detail, appended to the detail of its index."""
    for key, value in piece.items():
        if key in ("text", "summary", "data", "signature") and isinstance(value, str) \
                and isinstance(into.get(key), str):
            into[key] += value
        elif value is not None or key not in into:
            into[key] = value


def _first_choice(choices: list[Any]) -> list[dict[str, Any]]:
    """Choice 0 of a chunk or completion, as a list of at most one: the choice whose ``index`` is
    0 wherever it stands; when no choice carries an index, the first. The other choices of a
    request asking for several (``n``) are never read."""
    dicts = [c for c in choices if isinstance(c, dict)]
    if any("index" in c for c in dicts):
        return [c for c in dicts if c.get("index") == 0][:1]
    return dicts[:1]


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
        self._think = ThinkSplitter()
        self._said: list[str] = []  # reasoning_content / reasoning text
        self._said_in: str | None = None  # the field it came in first
        self._details: dict[Any, dict[str, Any]] = {}  # OpenRouter reasoning_details by index
        self._in_content: list[str] = []  # thinking parts, <think> text

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]:
        if data.strip() == "[DONE]":
            self.done = True
            return self._flush()
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
        for choice in _first_choice(choices):
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise ModelPermanent(f"{PROVIDER}: delta is not an object")
            events.extend(self._feed_reasoning(delta))
            events.extend(self._feed_content(delta.get("content")))
            if isinstance(delta.get("refusal"), str):  # what a model refusing a JSON schema says
                events.extend(self._answer(delta["refusal"]))
            for position, fragment in enumerate(delta.get("tool_calls") or []):
                events.extend(self._feed_call(position, fragment))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
                events += self._flush()
        return events

    def _flush(self) -> list[StreamEvent]:
        """The content the ``<think>`` splitter held back, once the reply's content has ended."""
        events: list[StreamEvent] = []
        for kind, text in self._think.finish():
            events += self._thought(text) if kind == "reasoning" else self._answer(text)
        return events

    def _answer(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        self._text.append(text)
        return [TextDelta(text)]

    def _thought(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        self._in_content.append(text)
        return [ReasoningDelta(text)]

    def _feed_content(self, content: Any) -> list[StreamEvent]:
        """``content``: a string (``<think>`` split off its start), a list of parts, or nothing."""
        if content is None:
            return []
        events: list[StreamEvent] = []
        if isinstance(content, str):
            for kind, text in self._think.feed(content):
                events += self._thought(text) if kind == "reasoning" else self._answer(text)
            return events
        if not isinstance(content, list):
            raise ModelPermanent(f"{PROVIDER}: content is neither text nor a list of parts: {content!r}"[:300])
        for part in content:
            if isinstance(part, str):
                events += self._answer(part)
                continue
            if not isinstance(part, dict):
                raise ModelPermanent(f"{PROVIDER}: a content part is not an object: {part!r}"[:300])
            part_type = part.get("type")
            if part_type == "text":
                said = part.get("text")
                if not isinstance(said, str):
                    raise ModelPermanent(f"{PROVIDER}: a text part without text: {part!r}"[:300])
                events += self._answer(said)
            elif part_type == "thinking":
                events += self._thought(_thinking_text(part))
            # other parts (references, images) are not part of the answer
        return events

    def _feed_reasoning(self, delta: dict[str, Any]) -> list[StreamEvent]:
        """``reasoning_content`` / ``reasoning`` (one of them: some servers send both, the same
        text) and OpenRouter's ``reasoning_details`` (whose text is the same text again when a
        string field came along; kept whole to be sent back)."""
        events: list[StreamEvent] = []
        said = False
        for name in ("reasoning_content", "reasoning"):
            value = delta.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ModelPermanent(f"{PROVIDER}: {name} is not text: {value!r}"[:300])
            if not said and value:
                said = True
                self._said_in = self._said_in or name
                self._said.append(value)
                events.append(ReasoningDelta(value))
        details = delta.get("reasoning_details")
        if details is None:
            return events
        if not isinstance(details, list):
            raise ModelPermanent(f"{PROVIDER}: reasoning_details is not a list")
        for position, piece in enumerate(details):
            if not isinstance(piece, dict):
                raise ModelPermanent(f"{PROVIDER}: a reasoning detail is not an object: {piece!r}"[:300])
            key = piece.get("index", f"at-{len(self._details)}-{position}")
            if key in self._details:
                _merge_detail(self._details[key], piece)
            else:
                self._details[key] = dict(piece)
            text = piece.get("text") if piece.get("text") is not None else piece.get("summary")
            if not said and isinstance(text, str) and text:
                events.append(ReasoningDelta(text))
        return events

    def _reasoning(self) -> tuple[ReasoningPart, ...]:
        parts: list[ReasoningPart] = []
        if self._details:
            for detail in self._details.values():
                text = detail.get("text") if isinstance(detail.get("text"), str) else detail.get("summary")
                data = detail.get("data")
                signature = detail.get("signature")
                parts.append(ReasoningPart(
                    text=text if isinstance(text, str) else "",
                    signature=signature if isinstance(signature, str) else None,
                    redacted=data if isinstance(data, str) else None,
                    source="reasoning_details", detail=detail))
        elif self._said:
            parts.append(ReasoningPart(text="".join(self._said), source=self._said_in or "reasoning"))  # type: ignore[arg-type]
        if self._in_content:
            parts.append(ReasoningPart(text="".join(self._in_content), source="content"))
        return tuple(parts)

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
        first = _first_choice(choices) if isinstance(choices, list) else []
        if not first:
            raise ModelPermanent(f"{PROVIDER}: the response has no choices")
        choice = first[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise ModelPermanent(f"{PROVIDER}: the response's first choice has no message")
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise ModelPermanent(f"{PROVIDER}: tool_calls is not a list")
        delta = {
            "content": message.get("content"),
            "refusal": message.get("refusal"),
            "tool_calls": [dict(c, index=i) if isinstance(c, dict) else c for i, c in enumerate(calls)],
        }
        for name in ("reasoning_content", "reasoning", "reasoning_details"):
            if name in message:
                delta[name] = message[name]
        chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}]}
        if "usage" in body:
            chunk["usage"] = body["usage"]
        events = self._feed_chunk(chunk)
        self.done = True
        return events

    def finish(self) -> ModelResponse:
        if not self.done and self._finish_reason is None:
            raise ModelTransient(f"{PROVIDER}: the stream ended before the reply was complete")
        self._flush()
        calls = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise ModelPermanent(f"{PROVIDER}: tool call {partial.id} has no function name")
            arguments = decode_arguments("".join(partial.fragments), PROVIDER, partial.name)
            calls.append(ToolCallRequest(partial.id, partial.name, arguments))
        return ModelResponse(
            text="".join(self._text), tool_calls=tuple(calls), stop_reason=self._finish_reason, usage=self._usage,
            reasoning=self._reasoning(),
        )


def image_data_url(descriptor: Mapping[str, Any], data: bytes) -> str:
    """An image held for a model as the ``data:`` URL both OpenAI APIs take."""
    return f"data:{descriptor['mime_type']};base64,{base64.b64encode(data).decode('ascii')}"


def common_settings(
    table: Mapping[str, Any], env: Mapping[str, str], where: str, retry: RetryPolicy | None, *,
    keys: Sequence[str], structured: str,
) -> dict[str, Any]:
    """The keys both OpenAI APIs read (``model``, ``base_url``, the key, limits, retries, reasoning
    effort, ``structured`` with its default, ``images``), checked — after every key of the table is
    one of ``keys`` — as keyword arguments of either provider."""
    check_keys(table, keys, where)
    mode = field_value(table, "structured", "str", where, structured)
    if mode not in STRUCTURED_MODES:
        raise ManifestInvalid(f"{where}.structured: must be native or tools, got {mode!r}")
    model = field_value(table, "model", "str", where)
    base_url = field_value(table, "base_url", "str", where, DEFAULT_BASE_URL)
    effort = field_value(table, "reasoning_effort", "str", where, None)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ManifestInvalid(f"{where}.reasoning_effort: must be one of low, medium, high, got {effort!r}")
    timeout = field_value(table, "timeout_secs", "number", where, 60.0)
    if timeout <= 0:
        raise ManifestInvalid(f"{where}.timeout_secs: must be positive, got {timeout!r}")
    max_tokens = field_value(table, "max_tokens", "int", where, None)
    if max_tokens is not None and max_tokens <= 0:
        raise ManifestInvalid(f"{where}.max_tokens: must be positive, got {max_tokens!r}")
    max_retries = field_value(table, "max_retries", "int", where, RetryPolicy.max_retries)
    if max_retries < 0:
        raise ManifestInvalid(f"{where}.max_retries: must not be negative, got {max_retries!r}")
    # OpenAI's own endpoint always needs a key: OPENAI_API_KEY unless another is named.
    # Any other server (Ollama, vLLM, llama.cpp) gets one only when api_key_env names it.
    own = base_url.rstrip("/") == DEFAULT_BASE_URL
    key_env = field_value(table, "api_key_env", "str", where, DEFAULT_KEY_ENV if own else None)
    api_key = None
    if key_env is not None:
        api_key = env.get(key_env)
        if not api_key:
            raise ModelKeyMissing(
                f"{where}.api_key_env: environment variable {key_env} is not set"
                + ("" if "api_key_env" in table else " (the key of OpenAI's API is read from it)")
                + "; set it in the environment the kernel or server starts from"
            )
    base = retry or RetryPolicy()
    return {
        "model": model,
        "base_url": base_url,
        "api_key": api_key,
        "timeout_secs": float(timeout),
        "temperature": field_value(table, "temperature", "number", where, None),
        "max_tokens": max_tokens,
        "force_tools": field_value(table, "force_tools", "bool", where, True),
        "reasoning_effort": effort,
        "structured": mode,
        "images": field_value(table, "images", "bool", where, False),
        "retry": RetryPolicy(max_retries, base.backoff_base_secs, base.max_delay_secs, base.sleep),
    }


def api_of(table: Mapping[str, Any], where: str = "model") -> str:
    """Which OpenAI API a ``[model]`` table names (``api``: ``chat``, the default, or ``responses``)."""
    api = field_value(table, "api", "str", where, "chat")
    if api not in APIS:
        raise ManifestInvalid(f"{where}.api: must be chat or responses, got {api!r}")
    return str(api)


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
        stream_usage: bool = True,
        reasoning_effort: str | None = None,
        structured: str = "tools",
        images: bool = False,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_secs = timeout_secs
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.force_tools = force_tools
        self.stream_usage = stream_usage
        self.reasoning_effort = reasoning_effort
        self.structured = structured
        self.images = images
        self.retry = retry or RetryPolicy()
        self.name = f"{PROVIDER}:{model}"

    @classmethod
    def from_table(
        cls, table: Mapping[str, Any], env: Mapping[str, str], where: str = "model", *, retry: RetryPolicy | None = None
    ) -> Any:
        """Build from a manifest's ``[model]`` table (``provider = "openai"``, ``api = "chat"``, the
        default); ``api = "responses"`` is the Responses API provider's (``build_model`` picks it)."""
        if api_of(table, where) != "chat":
            raise ManifestInvalid(f"{where}.api: the Chat Completions provider is api = \"chat\"; "
                                  "api = \"responses\" is built by build_model (the Responses API provider)")
        return cls(
            **common_settings(table, env, where, retry, keys=_TABLE_KEYS, structured="tools"),
            stream_usage=field_value(table, "stream_usage", "bool", where, True),
        )

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages, images=self.images),
                                "stream": True}
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if self.reasoning_effort is not None:
            body["reasoning_effort"] = self.reasoning_effort
        target = self.native_structured(role, tools)
        if target is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": target.name, "description": target.description, "schema": target.parameters, "strict": True}}
        return self.offer(body, role, tools if target is None else (), to_openai_tools, "max_tokens")

    def offer(self, body: dict[str, Any], role: str, tools: Sequence[ToolSpec],
              as_tools: Any, max_tokens_key: str) -> dict[str, Any]:
        """The end of a request body both OpenAI APIs share: the tools offered (``as_tools`` gives
        them in the API's shape; a planner or critic offered one is made to call it with
        ``force_tools``), ``temperature`` and the token limit under ``max_tokens_key``."""
        if tools:
            body["tools"] = as_tools(tools)
            if self.force_tools and role in ("planner", "critic") and len(tools) == 1:
                body["tool_choice"] = "required"
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body[max_tokens_key] = self.max_tokens
        return body

    def request_headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

