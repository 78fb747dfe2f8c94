"""The model provider interface: values, stream events, structured outputs.

Every provider (``scripted``, ``openai``, ``anthropic``) speaks this one small
interface so the task engine and chat never know which model they talk to:

* ``complete(role, messages, tools)`` returns one :class:`ModelResponse`;
* ``stream(role, messages, tools)`` yields :data:`StreamEvent` values and ends
  with :class:`Completed`, which carries the same response ``complete`` returns.

Structured outputs (a plan, a verdict) are asked for by offering one tool: the
planner :data:`PLAN_TOOL`, the critic :data:`VERDICT_TOOL`. A provider set to
answer them natively (``structured = "native"``) sends the tool's parameters as a
JSON schema instead and turns the JSON answer back into a call of that tool
(:func:`structured_tool`, :func:`structured_stream`), so :func:`parse_plan` /
:func:`parse_verdict` read the answer the same way either way, or raise
``ModelPermanent``.

The second half of this module is the plumbing the HTTP providers share: a
sans-IO server-sent-events decoder, the HTTP error classification
(429/5xx/timeouts are transient, other 4xx permanent), ``Retry-After`` parsing
and one retrying request loop. httpx is imported only when a request is made,
so the offline ``scripted`` provider never pays for it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol, runtime_checkable

from apollia_nb.errors import BadInput, ManifestInvalid, ModelError, ModelPermanent, ModelTransient

__all__ = [
    "ROLES",
    "ToolSpec",
    "ToolCallRequest",
    "Message",
    "ModelResponse",
    "ReasoningPart",
    "TextDelta",
    "ReasoningDelta",
    "reasoning_text",
    "ToolCallStarted",
    "ToolCallArgumentsDelta",
    "Completed",
    "StreamEvent",
    "ModelProvider",
    "PLAN_TOOL",
    "VERDICT_TOOL",
    "parse_plan",
    "parse_verdict",
    "collect",
    "response_events",
    "check_role",
    "STRUCTURED_MODES",
    "structured_tool",
    "structured_response",
    "structured_stream",
    "tool_images",
    "usage_tokens",
]

Role = Literal["planner", "actor", "critic"]
ROLES: tuple[str, ...] = ("planner", "actor", "critic")
MessageRole = Literal["system", "user", "assistant", "tool"]
_MESSAGE_ROLES = frozenset({"system", "user", "assistant", "tool"})


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model. ``parameters`` is a JSON Schema object; do not mutate it."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCallRequest:
    """A tool call the model asked for. ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.arguments, dict):
            raise BadInput(f"tool call {self.id!r}: arguments must be an object, not {type(self.arguments).__name__}")


#: Where a reasoning part came from: its wire field, which decides how it goes back.
ReasoningSource = Literal[
    "thinking", "redacted_thinking", "reasoning_content", "reasoning", "reasoning_details", "content",
    "reasoning_item",
]
_REASONING_SOURCES = frozenset(
    {"thinking", "redacted_thinking", "reasoning_content", "reasoning", "reasoning_details", "content",
     "reasoning_item"}
)


@dataclass(frozen=True)
class ReasoningPart:
    """One part of a model's reasoning: never the answer, kept beside it.

    ``text`` is what the model thought, as far as the provider shows it.
    ``signature`` (Anthropic's thinking signature, OpenRouter's) and ``redacted``
    (Anthropic's ``redacted_thinking`` data, OpenRouter's encrypted reasoning) are
    opaque: kept byte for byte and sent back as they came. ``source`` names the wire
    field the part arrived in (``thinking``, ``redacted_thinking``,
    ``reasoning_content``, ``reasoning``, ``reasoning_details``, ``content`` for
    thinking parts and ``<think>`` tags inside the content, or ``reasoning_item`` for a
    Responses API reasoning item); ``detail`` is an OpenRouter ``reasoning_details``
    object, or a Responses API reasoning item, as the server sent it.
    """

    text: str = ""
    signature: str | None = None
    redacted: str | None = None
    source: ReasoningSource = "thinking"
    detail: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise BadInput(f"a reasoning part's text must be a string, not {type(self.text).__name__}")
        for name in ("signature", "redacted"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise BadInput(f"a reasoning part's {name} must be a string, not {type(value).__name__}")
        if self.source not in _REASONING_SOURCES:
            raise BadInput(f"a reasoning part's source {self.source!r} is not one this version knows")
        if self.detail is not None and not isinstance(self.detail, dict):
            raise BadInput("a reasoning part's detail must be an object")

    def to_json(self) -> dict[str, Any]:
        """The part as a JSON object (only the fields it has), as journaled and saved with a run."""
        out: dict[str, Any] = {"source": self.source, "text": self.text}
        if self.signature is not None:
            out["signature"] = self.signature
        if self.redacted is not None:
            out["redacted"] = self.redacted
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReasoningPart:
        if not isinstance(data, Mapping):
            raise BadInput("a reasoning part must be an object")
        return cls(text=data.get("text", ""), signature=data.get("signature"), redacted=data.get("redacted"),
                   source=data.get("source", "thinking"), detail=data.get("detail"))


#: What stands, in the readable reasoning, for a part the provider keeps opaque (Anthropic's
#: ``redacted_thinking``, an encrypted reasoning item or detail without a summary): never its bytes.
REDACTED_REASONING = "[redacted reasoning]"


def reasoning_text(parts: Sequence[ReasoningPart]) -> str:
    """The readable reasoning of a turn: its parts' texts, a blank line between them; a part with no
    text but opaque data (``redacted``) reads ``REDACTED_REASONING``."""
    return "\n\n".join(p.text if p.text else REDACTED_REASONING for p in parts if p.text or p.redacted)


@dataclass(frozen=True)
class Message:
    """One message of a conversation, in provider-neutral form.

    ``tool_calls`` only on ``assistant`` messages; ``tool_call_id`` (required) and
    ``name`` (the tool's name) on ``tool`` messages, whose ``content`` is the result.
    ``reasoning`` only on ``assistant`` messages: the reasoning of that turn, sent
    back where the provider requires it (Anthropic's signed thinking blocks before
    the tool calls they led to; DeepSeek's ``reasoning_content`` and OpenRouter's
    ``reasoning_details`` of a turn that called tools).
    """

    role: MessageRole
    content: str = ""
    tool_calls: tuple[ToolCallRequest, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: tuple[ReasoningPart, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in _MESSAGE_ROLES:
            raise BadInput(f"message role {self.role!r} is not one of system, user, assistant, tool")
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if not isinstance(self.reasoning, tuple):
            object.__setattr__(self, "reasoning", tuple(self.reasoning))
        if self.tool_calls and self.role != "assistant":
            raise BadInput(f"a {self.role} message cannot carry tool calls")
        if self.reasoning and self.role != "assistant":
            raise BadInput(f"a {self.role} message cannot carry reasoning")
        if self.role == "tool" and not self.tool_call_id:
            raise BadInput("a tool message needs the tool_call_id it answers")


@dataclass(frozen=True)
class ModelResponse:
    """One model turn: its text, the tool calls it asks for, why it stopped, token usage,
    and its reasoning (never part of ``text``).

    ``stop_reason`` is the provider's own word (``"stop"``/``"tool_calls"`` for
    openai and scripted, ``"end_turn"``/``"tool_use"``/``"max_tokens"`` for anthropic).
    """

    text: str
    tool_calls: tuple[ToolCallRequest, ...] = ()
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None
    reasoning: tuple[ReasoningPart, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.reasoning, tuple):
            object.__setattr__(self, "reasoning", tuple(self.reasoning))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_tokens(usage: Mapping[str, Any] | None) -> int | None:
    """The input and output tokens of one turn together, from a provider's own ``usage``; None when
    it says nothing that can be counted (no usage, a count missing or not a whole number).

    Chat completions: ``prompt_tokens + completion_tokens``. Anthropic and the Responses API:
    ``input_tokens + output_tokens``, plus Anthropic's ``cache_creation_input_tokens`` and
    ``cache_read_input_tokens`` (its ``input_tokens`` leaves the cached ones out; the Responses API
    counts them in ``input_tokens`` already). Reasoning tokens are output tokens in all three. A usage
    with only ``total_tokens`` gives that."""
    if not isinstance(usage, Mapping):
        return None
    for into, out in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
        if into in usage or out in usage:
            first, second = _count(usage.get(into)), _count(usage.get(out))
            if first is None or second is None:
                return None
            cached = 0
            for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
                if usage.get(key) is not None:
                    extra = _count(usage.get(key))
                    if extra is None:
                        return None
                    cached += extra
            return first + second + cached
    return _count(usage.get("total_tokens"))


# --------------------------------------------------------------------------- stream events


@dataclass(frozen=True)
class TextDelta:
    """A piece of the reply's text; the pieces concatenate to ``ModelResponse.text``."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's reasoning as it streams (never part of the text)."""

    text: str


@dataclass(frozen=True)
class ToolCallStarted:
    """The model began a tool call; its arguments follow as deltas with the same id."""

    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    """A fragment of a tool call's JSON arguments, as the provider sent it."""

    id: str
    fragment: str


@dataclass(frozen=True)
class Completed:
    """The last event of every stream: the whole turn."""

    response: ModelResponse


StreamEvent = TextDelta | ReasoningDelta | ToolCallStarted | ToolCallArgumentsDelta | Completed


@runtime_checkable
class ModelProvider(Protocol):
    """What the task engine and chat use. ``role`` is planner, actor or critic."""

    name: str

    async def complete(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> ModelResponse: ...

    def stream(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[StreamEvent]: ...


def check_role(role: str) -> None:
    """Refuse a role no provider knows (chat turns use ``"actor"``)."""
    if role not in ROLES:
        raise BadInput(f"model role {role!r} is not one of planner, actor, critic")


async def collect(events: AsyncIterator[StreamEvent]) -> ModelResponse:
    """Drain a stream and return its :class:`Completed` response (closing the stream)."""
    try:
        async for event in events:
            if isinstance(event, Completed):
                return event.response
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    raise ModelPermanent("the model's stream ended without a completed response")


_WORD = re.compile(r"\s*\S+\s*|\s+")


def response_events(response: ModelResponse) -> list[StreamEvent]:
    """The events that stream a finished response: its text word by word (each
    word with its trailing whitespace), each tool call with its arguments as one
    JSON fragment, then :class:`Completed`; reasoning, when there is any, first, one
    delta per part. Deterministic."""
    events: list[StreamEvent] = [ReasoningDelta(p.text) for p in response.reasoning if p.text]
    events += [TextDelta(m.group(0)) for m in _WORD.finditer(response.text)]
    for call in response.tool_calls:
        events.append(ToolCallStarted(call.id, call.name))
        events.append(ToolCallArgumentsDelta(call.id, json.dumps(call.arguments, ensure_ascii=False)))
    events.append(Completed(response))
    return events


# --------------------------------------------------------------------------- structured outputs

PLAN_TOOL = ToolSpec(
    name="submit_plan",
    description=(
        "Submit your plan: the ordered steps that achieve the goal. "
        "Each step is one short imperative sentence."
    ),
    parameters={
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "The steps, in the order they are to be done.",
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
)

VERDICT_TOOL = ToolSpec(
    name="submit_verdict",
    description=(
        "Submit your verdict on whether the goal was achieved: "
        '"pass" if it was, "fail" with the reasons if it was not.'
    ),
    parameters={
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "fail"]},
            "reasons": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Why the goal is not achieved (may be empty on pass).",
            },
        },
        "required": ["verdict", "reasons"],
        "additionalProperties": False,
    },
)


def _structured_call(response: ModelResponse, tool: ToolSpec) -> dict[str, Any]:
    for call in response.tool_calls:
        if call.name == tool.name:
            return call.arguments
    called = ", ".join(c.name for c in response.tool_calls) or "no tool"
    raise ModelPermanent(f"expected a call to {tool.name}, the model called {called}")


def parse_plan(response: ModelResponse) -> list[str]:
    """The steps of the first ``submit_plan`` call: a non-empty list of non-empty strings."""
    steps = _structured_call(response, PLAN_TOOL).get("steps")
    if not isinstance(steps, list) or not steps:
        raise ModelPermanent("submit_plan: steps must be a non-empty list of strings")
    for i, step in enumerate(steps):
        if not isinstance(step, str) or not step.strip():
            raise ModelPermanent(f"submit_plan: steps[{i}] must be a non-empty string, got {step!r}")
    return list(steps)


def parse_verdict(response: ModelResponse) -> tuple[Literal["pass", "fail"], list[str]]:
    """The ``(verdict, reasons)`` of the first ``submit_verdict`` call; missing reasons are ``[]``."""
    args = _structured_call(response, VERDICT_TOOL)
    verdict = args.get("verdict")
    if verdict not in ("pass", "fail"):
        raise ModelPermanent(f'submit_verdict: verdict must be "pass" or "fail", got {verdict!r}')
    reasons = args.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise ModelPermanent("submit_verdict: reasons must be a list of strings")
    return verdict, list(reasons)


#: How a provider asks for a plan or a verdict: as a JSON schema the model's answer must follow
#: (``native``), or as the one tool the model must call (``tools``).
STRUCTURED_MODES = ("native", "tools")
_STRUCTURED = {PLAN_TOOL.name: PLAN_TOOL, VERDICT_TOOL.name: VERDICT_TOOL}
#: The id of the call a native structured answer becomes (the task engine gives calls its own ids).
STRUCTURED_CALL_ID = "structured-1"


def structured_tool(role: str, tools: Sequence[ToolSpec]) -> ToolSpec | None:
    """The structured output a turn asks for: :data:`PLAN_TOOL` or :data:`VERDICT_TOOL` when a
    planner or critic is offered that tool alone; None for any other turn (an actor turn, chat
    plan-mode offering read-only tools beside ``submit_plan``)."""
    if role not in ("planner", "critic") or len(tools) != 1:
        return None
    known = _STRUCTURED.get(tools[0].name)
    return known if known is not None and known == tools[0] else None


def structured_response(response: ModelResponse, tool: ToolSpec, provider: str) -> ModelResponse:
    """A native structured answer (its text, a JSON object) as the call of ``tool`` it stands for,
    so ``parse_plan`` / ``parse_verdict`` read it as they read the tool-call form. Text that is not
    a JSON object (a refusal, a cut answer) is ``MODEL_PERMANENT`` with what the model said."""
    text = response.text.strip()
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        why = f" (stopped: {response.stop_reason})" if response.stop_reason not in (None, "stop") else ""
        raise ModelPermanent(
            f"{provider}: the structured answer for {tool.name} is not a JSON object{why}: {text[:300]!r}")
    return ModelResponse(text="", tool_calls=(ToolCallRequest(STRUCTURED_CALL_ID, tool.name, value),),
                         stop_reason=response.stop_reason, usage=response.usage, reasoning=response.reasoning)


_NATIVE_HINT = ('; the server may not offer structured output as a JSON schema: '
                'set [model] structured = "tools" to ask for it as a tool call')


async def structured_stream(
    events: AsyncIterator[StreamEvent], tool: ToolSpec, provider: str
) -> AsyncGenerator[StreamEvent, None]:
    """The events of a native structured turn as those of the tool-call form: the answer's text
    streams as the arguments of one call of ``tool`` (``ToolCallStarted`` before its first
    piece), reasoning passes through, and ``Completed`` carries :func:`structured_response`.
    A request the server refuses with HTTP 400 is ``MODEL_PERMANENT`` saying how to fall back:
    no second request is sent on its own."""
    started = False
    try:
        async with aclosing(events) as inner:  # type: ignore[type-var]
            async for event in inner:
                if isinstance(event, TextDelta):
                    if not started:
                        started = True
                        yield ToolCallStarted(STRUCTURED_CALL_ID, tool.name)
                    yield ToolCallArgumentsDelta(STRUCTURED_CALL_ID, event.text)
                elif isinstance(event, Completed):
                    yield Completed(structured_response(event.response, tool, provider))
                else:
                    yield event
    except ModelPermanent as exc:
        if "HTTP 400" not in exc.message or started:
            raise
        raise ModelPermanent(exc.message + _NATIVE_HINT) from None


def tool_images(message: Message) -> list[tuple[dict[str, Any], bytes]]:
    """The images a tool message's result carries, with their bytes: each image descriptor
    (``{"type": "image", "mime_type", "sha256", ...}``, as :func:`~apollia_nb.runtime.outputs.json_value`
    makes it) found in the result whose bytes this process still holds. Nothing for other
    messages, results that are not JSON, or images no longer held (they stay described as text)."""
    if message.role != "tool" or '"image"' not in message.content:
        return []
    from apollia_nb.runtime.outputs import image_bytes, image_descriptors

    try:
        value = json.loads(message.content)
    except ValueError:
        return []
    found = []
    for descriptor in image_descriptors(value):
        data = image_bytes(descriptor)
        if data is not None:
            found.append((descriptor, data))
    return found


# --------------------------------------------------------------------------- manifest validation

_REQUIRED: Any = object()


def check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    """Every key of ``table`` must be in ``allowed``; the error names the first that is not."""
    for key in table:
        if key not in allowed:
            raise ManifestInvalid(f"{where}.{key}: unknown key (expected one of {', '.join(allowed)})")


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "str":
        return isinstance(value, str)
    if kind == "table":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list | tuple)
    raise AssertionError(kind)


_KIND_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "number": "a number",
    "str": "a string",
    "table": "a table",
    "list": "an array",
}


def field_value(table: Mapping[str, Any], key: str, kind: str, where: str, default: Any = _REQUIRED) -> Any:
    """``table[key]`` checked to be of ``kind`` (bool, int, number, str, table, list)."""
    if key not in table:
        if default is _REQUIRED:
            raise ManifestInvalid(f"{where}.{key}: missing required key")
        return default
    value = table[key]
    if not _type_ok(value, kind):
        raise ManifestInvalid(f"{where}.{key}: must be {_KIND_WORDS[kind]}, got {value!r}")
    return value


# --------------------------------------------------------------------------- HTTP plumbing


class SSEDecoder:
    """Server-sent events, sans-IO: feed lines (without their line ending),
    get ``(event, data)`` pairs at each blank line. Comments are skipped."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str | None, str] | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def close(self) -> tuple[str | None, str] | None:
        """An event left pending when the stream ended without its blank line."""
        return self._dispatch()

    def _dispatch(self) -> tuple[str | None, str] | None:
        event, data = self._event, self._data
        self._event, self._data = None, []
        if not data:
            return None
        return event, "\n".join(data)


class StreamParser(Protocol):
    """A provider's sans-IO reading of one response."""

    done: bool

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]: ...

    def feed_json(self, body: Any) -> list[StreamEvent]: ...

    def finish(self) -> ModelResponse: ...


def loads_json(data: str, provider: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise ModelPermanent(f"{provider}: the server sent malformed JSON: {data[:200]!r}") from None


def typed_event(event: str | None, data: str, provider: str) -> tuple[Any, dict[str, Any]]:
    """A server-sent event of an API whose events are typed objects (Anthropic, the Responses
    API): its ``type`` (else the SSE event name) and the object; one that is no JSON object is
    ``MODEL_PERMANENT``."""
    payload = loads_json(data, provider)
    if not isinstance(payload, dict):
        raise ModelPermanent(f"{provider}: an event is not a JSON object: {data[:200]!r}")
    return payload.get("type") or event, payload


def decode_arguments(raw: str, provider: str, name: str) -> dict[str, Any]:
    """A tool call's JSON arguments; empty means ``{}``; anything but an object is permanent."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ModelPermanent(f"{provider}: malformed JSON arguments for tool {name}: {raw[:200]!r}") from None
    if not isinstance(value, dict):
        raise ModelPermanent(f"{provider}: arguments for tool {name} are not a JSON object: {raw[:200]!r}")
    return value


def server_message(body: bytes) -> str:
    """The human message in an error body, whatever the server's dialect."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500] or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            if isinstance(data.get(key), str):
                return data[key]
    return text[:500]


def retry_after_secs(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def is_transient_status(status: int) -> bool:
    """429, 408 and every 5xx (Anthropic's 529 included) are worth retrying."""
    return status in (408, 429) or status >= 500


class AttemptFailed(Exception):
    """One HTTP attempt failed: the error to raise and, for a transient one, the wait asked for."""

    def __init__(self, error: ModelError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def status_failure(provider: str, status: int, body: bytes, headers: Mapping[str, str]) -> AttemptFailed:
    message = f"{provider}: HTTP {status}: {server_message(body)}"
    if is_transient_status(status):
        return AttemptFailed(ModelTransient(message), retry_after_secs(headers))
    return AttemptFailed(ModelPermanent(message))


Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of transient failures that happen before any event was yielded.

    The wait is the server's ``Retry-After`` when it sends one, else
    ``backoff_base_secs * 2**attempt``; never more than ``max_delay_secs``.
    ``sleep`` is injectable so tests never wait.
    """

    max_retries: int = 2
    backoff_base_secs: float = 0.5
    max_delay_secs: float = 30.0
    sleep: Sleep | None = None

    def delay(self, attempt: int, retry_after: float | None) -> float:
        wanted = retry_after if retry_after is not None else self.backoff_base_secs * (2**attempt)
        return min(self.max_delay_secs, wanted)


@dataclass(frozen=True)
class HttpRequest:
    provider: str
    url: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    timeout_secs: float


@functools.cache
def _ssl_context() -> Any:
    """One TLS context for every request: building it costs ~50 ms, a client ~0.2 ms."""
    import httpx

    return httpx.create_ssl_context()


async def _sse_lines(lines: AsyncIterator[str], parser: StreamParser) -> AsyncGenerator[StreamEvent, None]:
    decoder = SSEDecoder()
    async for line in lines:
        item = decoder.feed(line)
        if item is not None:
            for event in parser.feed_sse(*item):
                yield event
        if parser.done:
            return
    tail = decoder.close()
    if tail is not None:
        for event in parser.feed_sse(*tail):
            yield event


async def _lines_of(text: str) -> AsyncGenerator[str, None]:
    for line in text.splitlines():
        yield line
    yield ""


async def _one_attempt(request: HttpRequest, parser: StreamParser) -> AsyncGenerator[StreamEvent, None]:
    """One POST: a server-sent event stream, or one JSON document, read by ``parser``."""
    import httpx

    try:
        client = httpx.AsyncClient(timeout=httpx.Timeout(request.timeout_secs), verify=_ssl_context())
        body = dict(request.body)
        async with client, client.stream("POST", request.url, headers=dict(request.headers), json=body) as resp:
            if resp.status_code >= 400:
                raise status_failure(request.provider, resp.status_code, await resp.aread(), resp.headers)
            if "event-stream" in resp.headers.get("content-type", ""):
                events = _sse_lines(resp.aiter_lines(), parser)
            else:
                text = (await resp.aread()).decode("utf-8", "replace")
                if text.lstrip().startswith(("data:", "event:")):  # SSE sent with the wrong content type
                    events = _sse_lines(_lines_of(text), parser)
                else:
                    events = _aiter(parser.feed_json(loads_json(text, request.provider)))
            async with aclosing(events):
                async for event in events:
                    yield event
    except httpx.TimeoutException as exc:
        raise AttemptFailed(
            ModelTransient(f"{request.provider}: no answer within {request.timeout_secs:g} s ({type(exc).__name__})")
        ) from None
    except httpx.TransportError as exc:
        raise AttemptFailed(
            ModelTransient(f"{request.provider}: cannot reach {request.url}: {type(exc).__name__}: {exc}")
        ) from None
    yield Completed(parser.finish())


async def _aiter(events: list[StreamEvent]) -> AsyncGenerator[StreamEvent, None]:
    for event in events:
        yield event


async def http_stream(
    request: HttpRequest, make_parser: Callable[[], StreamParser], retry: RetryPolicy
) -> AsyncGenerator[StreamEvent, None]:
    """POST ``request`` and yield its events, retrying transient failures that
    happen before the first event (a half-delivered reply is never replayed)."""
    attempt = 0
    while True:
        emitted = False
        try:
            async with aclosing(_one_attempt(request, make_parser())) as events:
                async for event in events:
                    emitted = True
                    yield event
            return
        except AttemptFailed as failed:
            if emitted or not failed.error.transient or attempt >= retry.max_retries:
                raise failed.error from None
            delay = retry.delay(attempt, failed.retry_after)
        if retry.sleep is None:
            import anyio

            await anyio.sleep(delay)
        else:
            await retry.sleep(delay)
        attempt += 1


class HttpProvider:
    """What the HTTP providers share: ``complete`` drains ``stream``, which POSTs to
    ``base_url + ENDPOINT`` and parses the reply with ``PARSER``. Subclasses give
    ``PROVIDER``, ``ENDPOINT``, ``PARSER``, ``request_headers()`` and ``request_body()``."""

    PROVIDER: str
    ENDPOINT: str
    PARSER: Callable[[], StreamParser]
    base_url: str
    timeout_secs: float
    retry: RetryPolicy

    def request_headers(self) -> dict[str, str]:  # pragma: no cover - every provider overrides it
        raise NotImplementedError

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        raise NotImplementedError  # pragma: no cover

    async def complete(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> ModelResponse:
        return await collect(self.stream(role, messages, tools))

    def native_structured(self, role: str, tools: Sequence[ToolSpec]) -> ToolSpec | None:
        """The plan or verdict this turn asks for as a JSON schema, when the provider is set to
        ``structured = "native"``; None when it is asked for as a tool call."""
        if getattr(self, "structured", "tools") != "native":
            return None
        return structured_tool(role, tools)

    async def stream(
        self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()
    ) -> AsyncGenerator[StreamEvent, None]:
        check_role(role)
        request = HttpRequest(
            provider=self.PROVIDER,
            url=f"{self.base_url}{self.ENDPOINT}",
            headers=self.request_headers(),
            body=self.request_body(role, messages, tools),
            timeout_secs=self.timeout_secs,
        )
        events: AsyncIterator[StreamEvent] = http_stream(request, self.PARSER, self.retry)
        target = self.native_structured(role, tools)
        if target is not None:
            events = structured_stream(events, target, self.PROVIDER)
        async with aclosing(events) as inner:  # type: ignore[type-var]
            async for event in inner:
                yield event
