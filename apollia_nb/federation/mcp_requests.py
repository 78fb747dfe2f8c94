"""What an MCP server asks of its host, as plain values: questions (elicitation) and model calls (sampling).

Pure: no I/O, no ``mcp`` import. The connection (``federation.mcp``) turns the
SDK's request objects into these values, puts them on a card or through
``decide()``, and turns the answer back into the protocol's.

An elicitation card's ``arguments`` are::

    {"mode": "form", "message": ..., "requestedSchema": {...}}      form mode
    {"mode": "url", "message": ..., "url": ..., "elicitationId": ...} URL mode

A form is answered ``once`` with its values (checked here against the form:
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

from apollia_nb.errors import BadAnswer
from apollia_nb.runtime.cards import (
    MODEL_CALL,
    QUESTION,
    REDACTED,
    redact_schema,
    redact_sensitive,
    sensitive,
)
from apollia_nb.runtime.outputs import redact

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

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "boolean": (bool,), "integer": (int,), "number": (int, float), "array": (list,),
}


def is_elicitation(tool: str) -> bool:
    return tool.startswith("mcp:") and tool.endswith("/" + ELICITATION)


def _fields(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    props = (schema or {}).get("properties")
    return props if isinstance(props, Mapping) else {}


def _allowed(field: Mapping[str, Any]) -> list[Any] | None:
    if isinstance(field.get("enum"), list):
        return list(field["enum"])
    for key in ("oneOf", "anyOf"):
        options = field.get(key)
        if isinstance(options, list) and all(isinstance(o, Mapping) and "const" in o for o in options):
            return [o["const"] for o in options]
    return None


def _check_value(name: str, field: Mapping[str, Any], value: Any) -> None:
    kind = field.get("type")
    hidden = sensitive(field) or sensitive(field.get("items"))

    def shown(v: Any) -> str:  # a refusal never repeats a sensitive value
        return REDACTED if hidden else repr(v)

    expected = _TYPES.get(kind) if isinstance(kind, str) else None
    if expected is not None and (not isinstance(value, expected) or (kind != "boolean" and isinstance(value, bool))):
        raise BadAnswer(f"the form's field {name!r} takes a {kind}, not {shown(value)}")
    allowed = _allowed(field)
    if allowed is not None and not isinstance(value, list) and value not in allowed:
        raise BadAnswer(f"the form's field {name!r} takes one of {allowed}, not {shown(value)}")
    if kind == "array":
        items: Mapping[str, Any] = field.get("items") if isinstance(field.get("items"), Mapping) else {}  # type: ignore[assignment]  # a Mapping
        choices = _allowed(items)
        for item in value:
            if choices is not None and item not in choices:
                raise BadAnswer(f"the form's field {name!r} takes items among {choices}, not {shown(item)}")
        for bound, ok in (("minItems", lambda b: len(value) >= b), ("maxItems", lambda b: len(value) <= b)):
            if isinstance(field.get(bound), int) and not ok(field[bound]):
                raise BadAnswer(f"the form's field {name!r} takes {bound} {field[bound]}, got {len(value)} items")
    if kind in ("integer", "number"):
        if isinstance(field.get("minimum"), (int, float)) and value < field["minimum"]:
            raise BadAnswer(f"the form's field {name!r} takes at least {field['minimum']}, not {shown(value)}")
        if isinstance(field.get("maximum"), (int, float)) and value > field["maximum"]:
            raise BadAnswer(f"the form's field {name!r} takes at most {field['maximum']}, not {shown(value)}")


def check_form_values(arguments: Mapping[str, Any], values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The values an elicitation card is answered ``once`` with, checked against its form.

    ``BAD_ANSWER`` names the field at fault (a required one missing, an unknown one,
    a wrong type, a value not on offer); a URL-mode card takes no values.
    """
    if arguments.get("mode") == "url":
        if values:
            raise BadAnswer("a URL elicitation takes no values: answer once when the page was visited")
        return None
    schema = arguments.get("requestedSchema")
    fields = _fields(schema if isinstance(schema, Mapping) else None)
    given = dict(values or {})
    if not isinstance(values, (Mapping, type(None))):
        raise BadAnswer("values must be an object of the form's fields")
    unknown = sorted(k for k in given if k not in fields)
    if unknown:
        raise BadAnswer(f"the form has no field {unknown[0]!r} (fields: {', '.join(fields)})")
    required = (schema or {}).get("required", []) if isinstance(schema, Mapping) else []
    missing = [k for k in required if k not in given]
    if missing:
        raise BadAnswer(f"the form requires {', '.join(repr(m) for m in missing)}")
    for name, value in given.items():
        field = fields[name] if isinstance(fields[name], Mapping) else {}
        if not _carried(value):
            raise BadAnswer(f"the form's field {name!r} takes a string, number, boolean or list of strings, "
                            f"not {'an object' if isinstance(value, Mapping) else type(value).__name__}")
        _check_value(name, field, value)
    return given


def _carried(value: Any) -> bool:
    """A value the protocol's answer carries: a string, number, boolean or list of strings (or null)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


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
