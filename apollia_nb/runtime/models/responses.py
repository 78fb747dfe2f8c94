"""OpenAI's Responses API (``POST {base_url}/responses``): provider ``openai`` with ``api = "responses"``.

Where chat completions keep a list of role-tagged messages, the Responses API
keeps a list of typed *items*, in and out:

* in ``input``: messages (``{"role", "content"}``), the assistant's
  ``function_call`` items (``call_id``, ``name``, ``arguments`` as a JSON string),
  their ``function_call_output`` items (``call_id``, ``output``), and the
  ``reasoning`` items of earlier turns, sent back whole;
* in ``output``: ``message`` items (``output_text`` and ``refusal`` parts),
  ``function_call`` items and ``reasoning`` items (``summary`` texts, and the
  reasoning itself opaque in ``encrypted_content``).

Requests are stateless: ``store: false`` with ``include:
["reasoning.encrypted_content"]``, so a turn's reasoning items come back whole and
go back whole, before the calls they led to, in the next request (the API refuses
a ``function_call`` of a reasoning model without the reasoning item before it when
nothing is stored). ``store = true`` keeps responses on OpenAI's side instead.

The stream is server-sent events typed by their ``type``:
``response.output_item.added`` / ``.done``, ``response.output_text.delta``,
``response.refusal.delta``, ``response.function_call_arguments.delta`` /
``.done``, ``response.reasoning_summary_text.delta``,
``response.reasoning_text.delta``, and one of ``response.completed`` /
``response.incomplete`` (the whole response, with ``usage``) or
``response.failed`` / ``error``. There is no ``[DONE]``. Everything else
(``response.created``, ``.in_progress``, content part events, annotations) is
ignored. A server answering with one JSON response is read as well.

Translation and parsing are pure; HTTP, error classification and retries live in
:mod:`.base`, shared with the chat-completions provider.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .kit import *  # noqa: F403 - the providers' one vocabulary (see .kit)
from .openai import COMMON_TABLE_KEYS, TRANSIENT_ERROR_WORDS, OpenAIModel, common_settings, image_data_url

__all__ = [
    "ResponsesModel",
    "ResponsesStreamParser",
    "to_responses_input",
    "to_responses_tools",
    "REASONING_SUMMARIES",
    "TABLE_KEYS",
]

PROVIDER = "openai"
REASONING_SUMMARIES = ("auto", "concise", "detailed")
TABLE_KEYS = (*COMMON_TABLE_KEYS, "reasoning_summary", "store")


# --------------------------------------------------------------------------- requests


def _reasoning_items(parts: Sequence[ReasoningPart]) -> list[dict[str, Any]]:
    """The turn's reasoning items, as the API gave them (their ``encrypted_content`` opaque).
    Reasoning from another provider cannot be sent back and is left out."""
    return [dict(p.detail) for p in parts if p.source == "reasoning_item" and p.detail is not None]


def to_responses_input(messages: Sequence[Message], *, images: bool = False) -> list[dict[str, Any]]:
    """Provider-neutral messages as Responses ``input`` items.

    An assistant turn becomes its reasoning items, then its text (a message), then
    one ``function_call`` item per call; a tool result becomes a
    ``function_call_output`` — with ``images``, a list of an ``input_text`` part and
    one ``input_image`` part per image the result carries.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            output: Any = m.content
            found = tool_images(m) if images else []
            if found:
                output = [{"type": "input_text", "text": m.content}] + [
                    {"type": "input_image", "image_url": image_data_url(d, data), "detail": "auto"} for d, data in found
                ]
            out.append({"type": "function_call_output", "call_id": m.tool_call_id, "output": output})
        elif m.role == "assistant":
            out += _reasoning_items(m.reasoning)
            if m.content or not m.tool_calls:
                out.append({"type": "message", "role": "assistant", "content": m.content})
            out += [
                {"type": "function_call", "call_id": c.id, "name": c.name,
                 "arguments": json.dumps(c.arguments, ensure_ascii=False)}
                for c in m.tool_calls
            ]
        else:
            out.append({"type": "message", "role": m.role, "content": m.content})
    return out


def to_responses_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Function tools. ``strict`` is false: the API makes function tools strict unless told, and a
    strict schema must list every property as required, which ordinary tools do not."""
    return [
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
         "strict": False}
        for t in tools
    ]


# --------------------------------------------------------------------------- replies


def _error(error: Any, where: str) -> Exception:
    """An error object (of ``response.failed``, an ``error`` event, or a JSON reply)."""
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        kind = f"{error.get('type', '')} {error.get('code', '')}".lower()
    else:
        message, kind = str(error), ""
    text = f"{PROVIDER}: {where}: {message}"
    return ModelTransient(text) if any(w in kind for w in TRANSIENT_ERROR_WORDS) else ModelPermanent(text)


def _stop_reason(response: Mapping[str, Any], has_calls: bool) -> str:
    """The chat-completions word for how a response ended: ``stop``, ``tool_calls``, ``length``
    (incomplete at ``max_output_tokens``) or ``content_filter``."""
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    return "tool_calls" if has_calls else "stop"


class ResponsesStreamParser:
    """Responses API events (or one JSON response) in, stream events out. Sans-IO.

    Output items are kept by their ``output_index`` as they are added, grow with their
    deltas, and are replaced by their ``done`` form; the final ``response.output``, when
    the terminal event carries it, is the last word on them.
    """

    def __init__(self) -> None:
        self.done = False
        self._items: dict[int, dict[str, Any]] = {}
        self._streamed_args: set[int] = set()
        self._response: dict[str, Any] = {}

    def feed_sse(self, event: str | None, data: str) -> list[StreamEvent]:
        kind, payload = typed_event(event, data, PROVIDER)
        try:
            return self._feed(str(kind), payload)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise ModelPermanent(f"{PROVIDER}: malformed {kind} event: {data[:200]!r}") from None

    def _feed(self, kind: str, p: dict[str, Any]) -> list[StreamEvent]:
        if kind == "response.output_item.added":
            return self._added(int(p["output_index"]), p["item"])
        if kind == "response.output_item.done":
            index = int(p["output_index"])
            added = [] if index in self._items else self._added(index, p["item"])
            self._items[index] = _checked_item(p["item"])
            return added
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            item = self._item(p, "message")
            if not isinstance(p["delta"], str):
                raise TypeError("delta")
            item["_text"] = item.get("_text", "") + p["delta"]
            return [TextDelta(p["delta"])] if p["delta"] else []
        if kind == "response.function_call_arguments.delta":
            index = int(p["output_index"])
            item = self._item(p, "function_call")
            if not isinstance(p["delta"], str):
                raise TypeError("delta")
            if index not in self._streamed_args:
                self._streamed_args.add(index)
                item["arguments"] = ""
            item["arguments"] += p["delta"]
            return [ToolCallArgumentsDelta(item["call_id"], p["delta"])] if p["delta"] else []
        if kind == "response.function_call_arguments.done":
            index = int(p["output_index"])
            item = self._item(p, "function_call")
            whole = p.get("arguments")
            events: list[StreamEvent] = []
            if isinstance(whole, str) and index not in self._streamed_args and whole:
                events.append(ToolCallArgumentsDelta(item["call_id"], whole))  # sent whole, not in pieces
            if isinstance(whole, str):
                item["arguments"] = whole
                self._streamed_args.add(index)
            return events
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            if not isinstance(p["delta"], str):
                raise TypeError("delta")
            return [ReasoningDelta(p["delta"])] if p["delta"] else []
        if kind in ("response.completed", "response.incomplete"):
            self._finished(p["response"])
            return []
        if kind == "response.failed":
            response = p.get("response") or {}
            raise _error(response.get("error") if isinstance(response, dict) else None, "the response failed")
        if kind == "error":
            raise _error(p.get("error") if isinstance(p.get("error"), dict) else p, "the server reported an error")
        return []  # response.created, .in_progress, content parts, annotations, events this version does not know

    def _item(self, p: dict[str, Any], kind: str) -> dict[str, Any]:
        index = int(p["output_index"])
        item = self._items.get(index)
        if item is None:  # a delta for an item never added: take it as begun here
            item = self._items[index] = {"type": kind, "id": p.get("item_id")}
            if kind == "function_call":
                raise ModelPermanent(f"{PROVIDER}: arguments for output item {index}, which never started")
        if item.get("type") != kind:
            raise ModelPermanent(f"{PROVIDER}: a {kind} delta for output item {index}, a {item.get('type')}")
        return item

    def _added(self, index: int, item: Any) -> list[StreamEvent]:
        item = _checked_item(item)
        self._items[index] = dict(item)
        if item["type"] == "function_call":
            events: list[StreamEvent] = [ToolCallStarted(item["call_id"], item["name"])]
            if item.get("arguments"):
                self._streamed_args.add(index)
                events.append(ToolCallArgumentsDelta(item["call_id"], item["arguments"]))
            return events
        return []

    def _finished(self, response: Any) -> None:
        if not isinstance(response, dict):
            raise TypeError("response")
        self._response = response
        output = response.get("output")
        if isinstance(output, list) and output:
            self._items = {i: _checked_item(item) for i, item in enumerate(output)}
        self.done = True

    def feed_json(self, body: Any) -> list[StreamEvent]:
        """A whole (non-streamed) response: its output items in order."""
        if not isinstance(body, dict):
            raise ModelPermanent(f"{PROVIDER}: the response is not a JSON object")
        if body.get("error"):
            raise _error(body["error"], "the response failed" if body.get("status") == "failed"
                         else "the server reported an error")
        output = body.get("output")
        if not isinstance(output, list):
            raise ModelPermanent(f"{PROVIDER}: the response has no output list")
        events: list[StreamEvent] = []
        try:
            for index, item in enumerate(output):
                item = _checked_item(item)
                events += self._added(index, item)
                if item["type"] == "message":
                    events += [TextDelta(t) for t in _message_texts(item) if t]
                elif item["type"] == "reasoning":
                    events += [ReasoningDelta(t) for t in _reasoning_texts(item) if t]
            self._finished(body)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise ModelPermanent(f"{PROVIDER}: malformed response output") from None
        return events

    def finish(self) -> ModelResponse:
        if not self.done:
            raise ModelTransient(f"{PROVIDER}: the stream ended before the response was complete")
        texts: list[str] = []
        calls: list[ToolCallRequest] = []
        reasoning: list[ReasoningPart] = []
        for _, item in sorted(self._items.items()):
            kind = item["type"]
            if kind == "message":
                texts.append(item["_text"] if "_text" in item else "".join(_message_texts(item)))
            elif kind == "function_call":
                calls.append(ToolCallRequest(item["call_id"], item["name"],
                                             decode_arguments(item.get("arguments") or "", PROVIDER, item["name"])))
            elif kind == "reasoning":
                kept = {k: v for k, v in item.items() if not k.startswith("_") and k != "status"}
                encrypted = item.get("encrypted_content")
                reasoning.append(ReasoningPart(text="\n\n".join(t for t in _reasoning_texts(item) if t),
                                               redacted=encrypted if isinstance(encrypted, str) else None,
                                               source="reasoning_item", detail=kept))
            # other items (server tools' calls) are not part of the turn's answer
        usage = self._response.get("usage")
        return ModelResponse(
            text="".join(texts), tool_calls=tuple(calls), stop_reason=_stop_reason(self._response, bool(calls)),
            usage=usage if isinstance(usage, dict) else None, reasoning=tuple(reasoning),
        )


def _checked_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise TypeError("item")
    if item["type"] == "function_call":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ModelPermanent(f"{PROVIDER}: a function_call item without its call_id or name: {item!r}"[:300])
        if item.get("arguments") is not None and not isinstance(item["arguments"], str):
            raise ModelPermanent(f"{PROVIDER}: a function_call's arguments are not a JSON string"[:300])
    return item


def _message_texts(item: Mapping[str, Any]) -> list[str]:
    """A message item's ``output_text`` and ``refusal`` parts (a refusal is what the model said)."""
    content = item.get("content") or []
    if not isinstance(content, list):
        raise ModelPermanent(f"{PROVIDER}: a message's content is not a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, dict):
            raise ModelPermanent(f"{PROVIDER}: a content part is not an object: {part!r}"[:300])
        key = {"output_text": "text", "refusal": "refusal"}.get(str(part.get("type")))
        if key is None:
            continue
        if not isinstance(part.get(key), str):
            raise ModelPermanent(f"{PROVIDER}: a {part.get('type')} part without its text: {part!r}"[:300])
        texts.append(part[key])
    return texts


def _reasoning_texts(item: Mapping[str, Any]) -> list[str]:
    """A reasoning item's readable texts: its summary, else its reasoning text (open models)."""
    texts = []
    for key in ("summary", "content"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise ModelPermanent(f"{PROVIDER}: a reasoning item's {key} is not a list")
        for part in parts:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise ModelPermanent(f"{PROVIDER}: a reasoning {key} part is not text: {part!r}"[:300])
            texts.append(part["text"])
        if texts:
            return texts
    return texts


# --------------------------------------------------------------------------- the provider


class ResponsesModel(OpenAIModel):
    """A provider for OpenAI's Responses API (the chat-completions provider's keys, key and
    headers, another endpoint and wire format).

    ``structured`` is ``"native"`` (the default: plans and verdicts asked for as
    ``text.format`` JSON schemas) or ``"tools"``; with ``force_tools`` a planner or
    critic asked in the tool form is made to call its tool (``tool_choice: "required"``).
    ``store`` keeps responses on OpenAI's side; without it (the default) every request
    carries the reasoning it needs. ``images`` gives the images of tool results to the
    model (``input_image`` parts).
    """

    ENDPOINT = "/responses"
    PARSER = ResponsesStreamParser  # type: ignore[assignment]

    def __init__(
        self,
        *,
        reasoning_summary: str | None = None,
        store: bool = False,
        structured: str = "native",
        **settings: Any,
    ) -> None:
        super().__init__(structured=structured, **settings)
        self.reasoning_summary = reasoning_summary
        self.store = store

    @classmethod
    def from_table(
        cls, table: Mapping[str, Any], env: Mapping[str, str], where: str = "model", *, retry: RetryPolicy | None = None
    ) -> ResponsesModel:
        """Build from a manifest's ``[model]`` table (``provider = "openai"``, ``api = "responses"``)."""
        settings = common_settings(table, env, where, retry, keys=TABLE_KEYS, structured="native")
        summary = field_value(table, "reasoning_summary", "str", where, None)
        if summary is not None and summary not in REASONING_SUMMARIES:
            raise ManifestInvalid(f"{where}.reasoning_summary: must be one of auto, concise, detailed, got {summary!r}")
        return cls(**settings, reasoning_summary=summary, store=field_value(table, "store", "bool", where, False))

    def request_body(self, role: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": to_responses_input(messages, images=self.images),
            "stream": True,
            "store": self.store,
        }
        if not self.store:
            body["include"] = ["reasoning.encrypted_content"]
        reasoning = {}
        if self.reasoning_effort is not None:
            reasoning["effort"] = self.reasoning_effort
        if self.reasoning_summary is not None:
            reasoning["summary"] = self.reasoning_summary
        if reasoning:
            body["reasoning"] = reasoning
        target = self.native_structured(role, tools)
        if target is not None:
            body["text"] = {"format": {"type": "json_schema", "name": target.name, "description": target.description,
                                       "schema": target.parameters, "strict": True}}
        return self.offer(body, role, tools if target is None else (), to_responses_tools, "max_output_tokens")
