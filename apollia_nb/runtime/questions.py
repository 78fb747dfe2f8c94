"""A question's form, and the values a person answers it with, checked.

A server's question (a card whose ``request`` is ``cards.QUESTION``) carries its form
as JSON Schema (``requestedSchema``); whoever answers it ``once`` gives the form's
values, which the runtime checks here before anything is journaled: required
fields, types, enums, bounds. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apollia_nb.errors import BadAnswer
from apollia_nb.runtime.cards import REDACTED, sensitive

__all__ = ["check_form_values"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "boolean": (bool,), "integer": (int,), "number": (int, float), "array": (list,),
}


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


def _carried(value: Any) -> bool:
    """A value the protocol's answer carries: a string, number, boolean or list of strings (or null)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


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
