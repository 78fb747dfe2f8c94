"""What an MCP server asks of its host, as plain values: questions (elicitation) and model calls (sampling).

Pure: no I/O, no ``mcp`` import. The connection (``federation.mcp``) turns the
SDK's request objects into these values, puts them on a card or through
``decide()``, and turns the answer back into the protocol's.

An elicitation card's ``arguments`` are::

    {"mode": "form", "message": ..., "requestedSchema": {...}}      form mode
    {"mode": "url", "message": ..., "url": ..., "elicitationId": ...} URL mode

A form is answered ``once`` with its values (checked against the form by ``runtime.questions``:
required fields, types, enums, bounds) or ``refuse``. The journal keeps the
values given, except a field the form marks sensitive — ``"writeOnly": true``
or ``"format": "password"`` in its schema, at any depth — whose value is
journaled as ``"[redacted]"`` (the rule is the card's: ``runtime.cards``); an
answer refused as off the form never repeats a sensitive field's value. What a
form offers as a sensitive field's value (its ``default``) is shown redacted
from the moment the request arrives (``shown_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apollia_nb.runtime.cards import (
    MODEL_CALL,
    QUESTION,
    REDACTED,
    redact_schema,
    redact_sensitive,
)
from apollia_nb.runtime.outputs import redact
from apollia_nb.runtime.questions import check_form_values

__all__ = [
    "ELICITATION",
    "SAMPLING",
    "REDACTED",
    "is_elicitation",
    "check_form_values",
    "redact_form_values",
    "shown_request",
    "elicitation_action",
    "sampling_arguments",
]

#: The request names under which a server's requests are decided and shown: ``mcp:<server>/<name>``.
ELICITATION = QUESTION
SAMPLING = MODEL_CALL


def is_elicitation(tool: str) -> bool:
    return tool.startswith("mcp:") and tool.endswith("/" + ELICITATION)


def redact_form_values(arguments: Mapping[str, Any], values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The values as journaled: a field the form marks sensitive, at any depth, reads ``"[redacted]"``."""
    if values is None:
        return None
    return dict(redact_sensitive(arguments.get("requestedSchema"), dict(values)))


def shown_request(arguments: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """A server's request as decided, shown and journaled: what its form offers as a sensitive value
    (``default``, ``examples``) redacted, and every configured token (``{value: VAR}``) too."""
    out = dict(arguments)
    if "requestedSchema" in out:
        out["requestedSchema"] = redact_schema(out["requestedSchema"])
    return dict(redact(out, secrets))


def elicitation_action(answer: str | None, answered_by: str | None) -> str:
    """The protocol's answer for a card's: ``once`` accepts, ``refuse`` declines; no answer in time, or
    the call or its task cancelled, cancels."""
    if answer == "once" or answer == "always":
        return "accept"
    if answered_by in ("timeout", "system", "cancel"):
        return "cancel"
    return "decline"


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(_content_text(c) for c in content)
    kind = content.get("type") if isinstance(content, Mapping) else None
    if kind == "text":
        return str(content.get("text", ""))
    return f"[{kind or 'content'}]"


def sampling_arguments(params: Mapping[str, Any]) -> dict[str, Any]:
    """A sampling request as decided, shown and journaled: who would read what, and how much."""
    messages = [{"role": m.get("role"), "text": _content_text(m.get("content"))}
                for m in params.get("messages", []) if isinstance(m, Mapping)]
    out: dict[str, Any] = {"messages": messages}
    for key in ("systemPrompt", "maxTokens", "temperature", "includeContext", "stopSequences"):
        if params.get(key) is not None:
            out[key] = params[key]
    prefs = params.get("modelPreferences")
    if isinstance(prefs, Mapping) and prefs.get("hints"):
        out["modelHints"] = [h.get("name") for h in prefs["hints"] if isinstance(h, Mapping)]
    return out
