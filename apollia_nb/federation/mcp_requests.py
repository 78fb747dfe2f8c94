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
or ``"format": "password"`` in its schema — whose value is journaled as
``"[redacted]"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apollia_nb.errors import BadAnswer

__all__ = [
    "ELICITATION",
    "SAMPLING",
    "REDACTED",
    "is_elicitation",
    "check_form_values",
    "redact_form_values",
    "elicitation_action",
    "sampling_arguments",
]

#: The request names under which a server's requests are decided and shown: ``mcp:<server>/<name>``.
ELICITATION = "elicitation/create"
SAMPLING = "sampling/createMessage"
REDACTED = "[redacted]"

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
    expected = _TYPES.get(kind) if isinstance(kind, str) else None
    if expected is not None and (not isinstance(value, expected) or (kind != "boolean" and isinstance(value, bool))):
        raise BadAnswer(f"the form's field {name!r} takes a {kind}, not {value!r}")
    allowed = _allowed(field)
    if allowed is not None and not isinstance(value, list) and value not in allowed:
        raise BadAnswer(f"the form's field {name!r} takes one of {allowed}, not {value!r}")
    if kind == "array":
        items = field.get("items") if isinstance(field.get("items"), Mapping) else {}
        choices = _allowed(items)
        for item in value:
            if choices is not None and item not in choices:
                raise BadAnswer(f"the form's field {name!r} takes items among {choices}, not {item!r}")
        for bound, ok in (("minItems", lambda b: len(value) >= b), ("maxItems", lambda b: len(value) <= b)):
            if isinstance(field.get(bound), int) and not ok(field[bound]):
                raise BadAnswer(f"the form's field {name!r} takes {bound} {field[bound]}, got {len(value)} items")
    if kind in ("integer", "number"):
        if isinstance(field.get("minimum"), (int, float)) and value < field["minimum"]:
            raise BadAnswer(f"the form's field {name!r} takes at least {field['minimum']}, not {value!r}")
        if isinstance(field.get("maximum"), (int, float)) and value > field["maximum"]:
            raise BadAnswer(f"the form's field {name!r} takes at most {field['maximum']}, not {value!r}")


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
        _check_value(name, field, value)
    return given


def _sensitive(field: Any) -> bool:
    return isinstance(field, Mapping) and (field.get("writeOnly") is True or field.get("format") == "password")


def redact_form_values(arguments: Mapping[str, Any], values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The values as journaled: a field the form marks sensitive reads ``"[redacted]"``."""
    if values is None:
        return None
    schema = arguments.get("requestedSchema")
    fields = _fields(schema if isinstance(schema, Mapping) else None)
    return {k: (REDACTED if _sensitive(fields.get(k)) else v) for k, v in values.items()}


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
