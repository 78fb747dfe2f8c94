"""Write the REST API reference into docs/rest-api.md from the app's OpenAPI document.

Everything between ``<!-- reference:start -->`` and ``<!-- reference:end -->``
is generated: the routes with their statuses, parameters, bodies, responses
and errors, the schemas, and the error codes (from the error tree). The prose
above the markers is written by hand.

    python dev/docs/make_rest_reference.py           # rewrite the doc
    python dev/docs/make_rest_reference.py --check   # exit 1 if the doc has drifted

The test suite runs the check, so a change to a route or a model without
regenerating the doc fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

START = "<!-- reference:start -->"
END = "<!-- reference:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "rest-api.md"
_METHOD_ORDER = {"get": 0, "post": 1, "put": 2, "delete": 3}


def document() -> dict[str, Any]:
    from apollia_nb.api.app import create_app

    return create_app(None, token="reference").openapi()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def type_of(schema: dict[str, Any]) -> str:
    """A schema as a short type expression: ``Task``, ``list[string]``, ``"once" | "always"``, ``integer | null``."""
    if not schema:
        return "any"
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{name.lower()}-schema)"
    if "const" in schema:
        return f'`"{schema["const"]}"`'
    if "enum" in schema:
        return " \\| ".join(f'`"{v}"`' for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(type_of(s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"list[{type_of(schema.get('items', {}))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"object[string, {type_of(extra)}]" if isinstance(extra, dict) and extra else "object"
    if isinstance(kind, list):
        return " \\| ".join(kind)
    return str(kind or "any")


def _constraints(schema: dict[str, Any]) -> str:
    words = []
    for key, word in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"), ("maxLength", "length ≤"),
                      ("minItems", "items ≥"), ("maxItems", "items ≤")):
        if key in schema:
            words.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        words.append(f"pattern `{schema['pattern']}`".replace("|", "\\|"))
    for option in schema.get("anyOf", []):
        if option.get("type") != "null":
            inner = _constraints(option)
            if inner:
                words.append(inner)
    if "default" in schema:
        default = schema["default"]
        words.append("default " + ("`null`" if default is None else f"`{str(default).lower()}`"
                                   if isinstance(default, bool) else f"`{default!r}`".replace("'", '"')))
    return ", ".join(words)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _schema_table(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    if not props:
        return [f"Type: {type_of(schema)}."]
    required = set(schema.get("required", []))
    lines = ["| field | type | required | notes |", "|---|---|---|---|"]
    for name, prop in props.items():
        notes = "; ".join(x for x in (_cell(prop.get("description", "")), _constraints(prop)) if x)
        lines.append(f"| `{name}` | {type_of(prop)} | {'yes' if name in required else 'no'} | {notes} |")
    return lines


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    ops = [(path, method, op) for path, item in doc["paths"].items() for method, op in item.items()]
    return ops  # in the order the app declares them


def _success(op: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    code = next(c for c in op["responses"] if c.startswith("2"))
    return code, op["responses"][code]


def _response_type(response: dict[str, Any]) -> str:
    content = response.get("content", {})
    if "text/event-stream" in content:
        items = content["text/event-stream"].get("x-itemSchema", {}).get("oneOf", [])
        events = [f'`{i["properties"]["event"]["const"]}` ({type_of(i["properties"]["data"]["contentSchema"])})'
                  for i in items]
        return "server-sent events: " + ", ".join(events)
    if "application/json" in content:
        return type_of(content["application/json"]["schema"])
    return "no body"


def render_operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", "", f"{op.get('summary', '')}." if op.get("summary") else ""]
    if op.get("description"):
        out += ["", op["description"]]
    out += ["", "Auth: " + ("bearer token." if op.get("security") else "none.")]
    params = op.get("parameters", [])
    if params:
        out += ["", "| parameter | in | type | required | notes |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            notes = "; ".join(x for x in (_cell(p.get("description", "")), _constraints(schema)) if x)
            out.append(f"| `{p['name']}` | {p['in']} | {type_of(schema)} | "
                       f"{'yes' if p.get('required') else 'no'} | {notes} |")
    body = op.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        out += ["", f"Body ({'required' if body.get('required') else 'optional'}): {type_of(schema)}."]
    code, response = _success(op)
    out += ["", f"Success: **{code}** — {_response_type(response)}."]
    errors = [c for c in op["responses"] if c.startswith(("4", "5"))]
    if errors:
        out += ["", "Errors: " + ", ".join(f"**{c}**" for c in sorted(errors)) + " (`{\"code\", \"message\"}`)."]
    return out


def render_errors() -> list[str]:
    from apollia_nb import errors
    from apollia_nb.sdk import errors as http_errors

    rows: list[tuple[str, int, str, str]] = []
    todo = [errors.ApolliaError]
    while todo:
        cls = todo.pop(0)
        if cls.__module__ not in (errors.__name__, http_errors.__name__):
            continue  # only the project's own tree, whatever else is loaded
        rows.append((cls.code, cls.http_status, cls.__name__, cls.__bases__[0].__name__))
        todo.extend(cls.__subclasses__())
    lines = ["| code | HTTP status | SDK exception | kind of |", "|---|---|---|---|"]
    for code, status, name, base in rows:
        home = "sdk.errors" if code in http_errors.HTTP_ONLY_CODES else "errors"
        kind = "" if name == "ApolliaError" else f"`{base}`"
        lines.append(f"| `{code}` | {status} | `{home}.{name}` | {kind} |")
    return lines


def render() -> str:
    doc = document()
    ops = _operations(doc)
    parts = ["<!-- Generated by dev/docs/make_rest_reference.py from the OpenAPI document; do not edit by hand. -->",
             "", f"OpenAPI {doc['openapi']}, API version {doc['info']['version']}.", "", "## Routes", "",
             "| method | path | success | does |", "|---|---|---|---|"]
    for path, method, op in ops:
        code, _ = _success(op)
        parts.append(f"| {method.upper()} | `{path}` | {code} | {_cell(op.get('summary', ''))} |")
    tags: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, method, op in ops:
        tags.setdefault((op.get("tags") or ["other"])[0], []).append((path, method, op))
    for tag, group in tags.items():
        parts += ["", f"## {tag[:1].upper()}{tag[1:]}"]
        for path, method, op in group:
            parts += ["", *render_operation(path, method, op)]
    parts += ["", "## Schemas"]
    for name, schema in sorted(doc["components"]["schemas"].items()):
        if name == "HTTPValidationError" or name == "ValidationError":
            continue
        parts += ["", f"### {name} (schema)", ""]
        if schema.get("description"):
            parts += [_cell(schema["description"]), ""]
        parts += _schema_table(schema)
    parts += ["", "## Error codes", "",
              "Every error response is `{\"code\", \"message\"}` with one of these codes; the same codes "
              "name a failed task's `error` and a chat exchange's. The code is stable; the SDK raises the "
              "exception named here (`from apollia_nb.sdk import errors`).", "", *render_errors()]
    return "\n".join(line.rstrip() for line in parts)


def rewrite(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"{DOC} lacks the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{render()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is not up to date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = rewrite(text)
    if args.check:
        if new != text:
            print(f"{DOC} is out of date: run python dev/docs/make_rest_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
