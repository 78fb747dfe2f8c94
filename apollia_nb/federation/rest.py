"""Host REST write-back: a host's OpenAPI 3 operations as governed tools ``rest:<host>/<operationId>``.

One ``RestSource`` per ``[hosts.NAME]``. The OpenAPI document (a JSON file,
relative to the home, or an ``http(s)://`` URL fetched when the first agent
naming one of the host's tools registers) is read once; every operation with
an ``operationId`` becomes a tool.

Arguments (pure, ``operations``): the operation's path, query and header
parameters, in that order, then the JSON request body. An object body whose
property names clash with no parameter is **flattened**: each property is an
argument. Any other body (an array, a scalar, a clash) is one argument named
``body``. Local ``$ref`` references (``#/...``) are resolved. A header
parameter named ``Authorization`` is never an argument: credentials come
only from ``token_env``.

Families: ``GET``, ``HEAD``, ``OPTIONS`` → ``read``; every other method →
``write`` when the host is on this machine (``localhost``, ``127.0.0.0/8``,
``::1``), ``send`` otherwise; ``families = { operationId = "..." }``
overrides per operation.

Paths: every path key of the document must be a path under the base URL (a
single leading ``/``, no ``.``/``..`` segments, no query or fragment), or the
document is refused when loaded. A path parameter is one segment: it is
percent-encoded (``/`` too), and a value that is empty or reads as ``.`` or
``..`` (also once or twice percent-decoded: ``%2e``, ``%252e%252e``) is
``BAD_ARGUMENT``. Before sending, the final URL's origin, path prefix and
number of segments are checked against the operation; a request that would
go anywhere else is not sent.

Calls: the token of ``token_env`` is read from the environment at each call
and sent as ``Authorization: Bearer``; it is never an argument, so it never
reaches the journal. Redirects are not followed. The body is streamed and at
most ``BODY_CAP`` bytes are read (the rest never is); a 2xx response's JSON
body is the output (text when it is not JSON; ``None`` when empty; a body
over the cap is ``{"truncated": true, "bytes_read", "text"}``). 429 and 5xx,
timeouts and connection failures are transient (counted by the tool's
breaker); any other status is permanent with the status and the start of
the host's answer.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote, urlsplit

import anyio

from apollia_nb.errors import (
    BadArgument,
    BadInput,
    PermanentToolError,
    ToolTimeout,
    TransientToolError,
)
from apollia_nb.federation.base import check_connection_allowed, named_tools
from apollia_nb.federation.config import HostConfig
from apollia_nb.governance.decision import Family
from apollia_nb.runtime.tools import ToolDef

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = [
    "Parameter",
    "Operation",
    "operations",
    "is_local",
    "family_for",
    "build_request",
    "RestSource",
]

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_OPERATION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,150}")
_TEXT_CAP = 65_536
#: Bytes of a response body read at most (JSON included); the rest is never read.
BODY_CAP = 1_048_576
_DETAIL_CAP = 500
_REF_DEPTH = 32


@dataclass(frozen=True)
class Parameter:
    name: str
    location: Literal["path", "query", "header"]
    required: bool
    schema: dict[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """One OpenAPI operation, ready to become a tool."""

    operation_id: str
    method: str
    path: str
    parameters: tuple[Parameter, ...] = ()
    body: Literal["none", "flat", "whole"] = "none"
    body_fields: tuple[str, ...] = ()
    body_required: bool = False
    schema: dict[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""


# --- reading the document (pure) ------------------------------------------------------------


def _resolve(doc: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    """``node`` with local ``$ref``s replaced by what they point to (cycles cut at a depth)."""
    if depth > _REF_DEPTH:
        return {}
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/"):
                raise BadInput(f"only local references (#/...) are supported, got {ref!r}")
            target: Any = doc
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, Mapping) or part not in target:
                    raise BadInput(f"the reference {ref!r} points to nothing")
                target = target[part]
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            resolved = _resolve(doc, target, depth + 1)
            if siblings and isinstance(resolved, Mapping):
                return {**resolved, **_resolve(doc, siblings, depth + 1)}
            return resolved
        return {k: _resolve(doc, v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(doc, v, depth + 1) for v in node]
    return node


def _described(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    out = dict(schema)
    if description and "description" not in out:
        out["description"] = description
    return out


def _operation(doc: Mapping[str, Any], path: str, method: str, item: Mapping[str, Any],
               op: Mapping[str, Any]) -> Operation | str:
    """The operation, or why it is left out."""
    op_id = op.get("operationId")
    where = f"{method.upper()} {path}"
    if not isinstance(op_id, str) or not _OPERATION_ID.fullmatch(op_id):
        return f"{where}: no usable operationId"
    merged: dict[tuple[str, str], Mapping[str, Any]] = {}
    for raw in [*item.get("parameters", []), *op.get("parameters", [])]:
        param = _resolve(doc, raw)
        if isinstance(param, Mapping) and isinstance(param.get("name"), str):
            merged[(param["name"], str(param.get("in")))] = param
    params: list[Parameter] = []
    for (name, location), param in merged.items():
        needed = bool(param.get("required", location == "path"))
        if location == "header" and name.lower() == "authorization":
            continue  # credentials come from token_env, never from arguments
        if location not in ("path", "query", "header"):
            if needed:
                return f"{op_id}: required {location} parameter {name!r} is not supported"
            continue
        schema: Mapping[str, Any] = param.get("schema") if isinstance(param.get("schema"), Mapping) else {}  # type: ignore[assignment]  # a Mapping
        params.append(Parameter(name, location, needed, dict(schema), str(param.get("description", ""))))  # type: ignore[arg-type]  # location checked above
    order = {"path": 0, "query": 1, "header": 2}
    params.sort(key=lambda p: order[p.location])  # stable: document order within a location
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        return f"{op_id}: two parameters share a name"
    for p in params:
        if p.location == "path" and "{" + p.name + "}" not in path:
            return f"{op_id}: path parameter {p.name!r} is not in {path}"

    body: Literal["none", "flat", "whole"] = "none"
    body_fields: tuple[str, ...] = ()
    body_required = False
    body_schema: dict[str, Any] = {}
    request_body = _resolve(doc, op.get("requestBody")) if op.get("requestBody") is not None else None
    if isinstance(request_body, Mapping):
        content = request_body.get("content", {})
        media = next((m for m in content if m == "application/json" or m.endswith("+json")), None)
        if media is None:
            if request_body.get("required"):
                return f"{op_id}: only JSON request bodies are supported"
        else:
            body_schema = dict(content[media].get("schema") or {})
            body_required = bool(request_body.get("required", False))
            props = body_schema.get("properties")
            if (body_schema.get("type", "object" if props else None) == "object" and isinstance(props, Mapping)
                    and props and not set(props) & set(names)):
                body, body_fields = "flat", tuple(props)
            elif "body" in names:
                return f"{op_id}: a parameter named 'body' leaves no name for the request body"
            else:
                body = "whole"

    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in params:
        properties[p.name] = _described(p.schema, p.description)
        if p.required:
            required.append(p.name)
    if body == "flat":
        body_required_fields = set(body_schema.get("required", [])) if body_required else set()
        for key in body_fields:
            properties[key] = dict(body_schema["properties"][key])
            if key in body_required_fields:
                required.append(key)
    elif body == "whole":
        properties["body"] = _described(body_schema, str(request_body.get("description", "")) if request_body else "")
        if body_required:
            required.append("body")
    description = str(op.get("summary") or op.get("description") or "")
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Operation(op_id, method.upper(), path, tuple(params), body, body_fields, body_required, schema,
                     description)


def operations(doc: Mapping[str, Any]) -> tuple[list[Operation], list[str]]:
    """Every usable operation of an OpenAPI 3 document, and a note for each one left out.

    A document that is not OpenAPI 3 (no ``openapi: 3.x``, no ``paths``) is
    ``BAD_INPUT``; so are two operations with the same ``operationId``.
    """
    if not isinstance(doc, Mapping) or not str(doc.get("openapi", "")).startswith("3."):
        raise BadInput("not an OpenAPI 3 document (its \"openapi\" field must be 3.x)")
    paths = doc.get("paths")
    if not isinstance(paths, Mapping):
        raise BadInput("the OpenAPI document has no \"paths\"")
    found: list[Operation] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for path in paths:
        _check_path_key(path)
    for path, raw_item in paths.items():
        item = _resolve(doc, raw_item)
        if not isinstance(item, Mapping):
            continue
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, Mapping):
                continue
            result = _operation(doc, str(path), method, item, op)
            if isinstance(result, str):
                skipped.append(result)
                continue
            if result.operation_id in seen:
                raise BadInput(f"the operationId {result.operation_id!r} is used twice")
            seen.add(result.operation_id)
            found.append(result)
    return found, skipped


def _check_path_key(path: object) -> None:
    """A path key is a path under the base URL: ``/`` first, no dot segments, no query or fragment.

    Anything else (``@other-host/x``, ``//other-host``, ``/a/../b``) would let the document choose
    another host or path than the one the operation names: the document is refused.
    """
    text = str(path)
    literal = re.sub(r"\{[^{}/]*\}", "p", text)
    segments = literal.split("/")[1:]
    if (not text.startswith("/") or text.startswith("//") or any(c in literal for c in "?#\\%{}")
            or any(seg in (".", "..") for seg in segments)):
        raise BadInput(f"the path {text!r} is not a path under the base URL (it must start with a single /, "
                       "with no . or .. segments, query or fragment)")


def default_base_url(doc: Mapping[str, Any]) -> str | None:
    """The first absolute ``servers[].url`` of the document, if any."""
    for server in doc.get("servers", []) or []:
        url = server.get("url") if isinstance(server, Mapping) else None
        if isinstance(url, str) and urlsplit(url).scheme in ("http", "https"):
            return url
    return None


def is_local(base_url: str) -> bool:
    """Whether the host is on this machine: ``localhost`` or a loopback address."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def family_for(op: Operation, *, local: bool, overrides: Mapping[str, Family]) -> Family:
    """GET → read; other methods → write, or send when the host is not local; overridable."""
    if op.operation_id in overrides:
        return overrides[op.operation_id]
    if op.method in _READ_METHODS:
        return Family.READ
    return Family.WRITE if local else Family.SEND


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    json: Any = field(default=None, hash=False)
    has_body: bool = False


def _text_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _path_segment(op: Operation, name: str, text: str) -> str:
    """One path parameter as one segment; a value that would be read as ``.``, ``..`` or no
    segment at all (also once or twice percent-decoded) is ``BAD_ARGUMENT``."""
    decoded = {text, unquote(text), unquote(unquote(text))}
    if decoded & {"", ".", ".."}:
        raise BadArgument(f"{op.operation_id}: the path parameter {name!r} cannot be {text!r}: "
                          "it would leave the operation's path")
    return quote(text, safe="")


def expected_prefix(op: Operation, base_url: str) -> str:
    """The path every request of the operation starts with: the base path and the template up to its
    first parameter."""
    return urlsplit(base_url.rstrip("/") + op.path.split("{", 1)[0]).path


def check_target(op: Operation, base_url: str, url: Any) -> None:
    """Refuse to send a request whose final URL left the operation (origin, path prefix, segments)."""
    base = urlsplit(base_url)
    final = urlsplit(str(url))
    path = final.path
    same = (final.scheme, final.hostname, final.port) == (base.scheme, base.hostname, base.port)
    segments = path.split("/")
    if (not same or not path.startswith(expected_prefix(op, base_url))
            or len(segments) != len(urlsplit(base_url.rstrip("/") + op.path).path.split("/"))
            or any(unquote(seg) in (".", "..") for seg in segments)):
        raise BadArgument(f"{op.operation_id}: the request would go to {final.scheme}://{final.netloc}{path}, "
                          "outside the operation's path: not sent")


def build_request(op: Operation, base_url: str, arguments: Mapping[str, Any]) -> Request:
    """The HTTP request for one call (no credentials: those are added at the edge)."""
    path = op.path
    params: dict[str, Any] = {}
    headers: dict[str, str] = {}
    for p in op.parameters:
        if p.name not in arguments or arguments[p.name] is None:
            continue
        value = arguments[p.name]
        if p.location == "path":
            path = path.replace("{" + p.name + "}", _path_segment(op, p.name, _text_value(value)))
        elif p.location == "query":
            params[p.name] = [_text_value(v) for v in value] if isinstance(value, list) else _text_value(value)
        else:
            headers[p.name] = _text_value(value)
    body: Any = None
    has_body = False
    if op.body == "flat":
        body = {k: arguments[k] for k in op.body_fields if k in arguments}
        has_body = bool(body) or op.body_required
    elif op.body == "whole" and "body" in arguments:
        body, has_body = arguments["body"], True
    return Request(op.method, base_url.rstrip("/") + path, params, headers, body, has_body)


# --- the source ---------------------------------------------------------------------------


class RestSource:
    """The operations of one host's REST API as tools."""

    def __init__(self, rt: Any, config: HostConfig) -> None:
        self._rt = rt
        self.config = config
        self.host = config.name
        self.name = f"rest:{config.name}"
        self._lock = anyio.Lock()
        self._ops: dict[str, Operation] | None = None
        self._base_url: str | None = None
        self._tooldefs: dict[str, ToolDef] = {}
        self._client: httpx.AsyncClient | None = None
        self.skipped: list[str] = []

    async def tools(self, manifest: Any) -> "list[ToolDef]":
        """The host's operations this agent names; reads the OpenAPI document the first time."""
        wanted = named_tools(manifest, self.name + "/")
        if not wanted:
            return []
        check_connection_allowed(self._rt, self.host)
        ops = await self._operations()
        out = []
        for name in wanted:
            op = ops.get(name[len(self.name) + 1:])
            if op is not None:
                out.append(self._tooldef(op))
        return out

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- the document ---------------------------------------------------------------------

    async def _operations(self) -> dict[str, Operation]:
        async with self._lock:
            if self._ops is None:
                doc = await self._document()
                try:
                    found, self.skipped = operations(doc)
                except BadInput as exc:
                    raise BadInput(f"{self.name}: {self.config.openapi}: {exc.message}") from None
                base_url = self.config.base_url or default_base_url(doc)
                if base_url is None:
                    raise BadInput(f"[hosts.{self.host}] base_url is required: the OpenAPI document names no "
                                   "absolute server URL")
                self._base_url = base_url
                self._ops = {op.operation_id: op for op in found}
            return self._ops

    async def _document(self) -> Any:
        source = self.config.openapi
        if urlsplit(source).scheme in ("http", "https"):
            return await self._fetch_document(source)
        path = Path(source).expanduser()
        if not path.is_absolute():
            path = Path(self._rt.home.path) / path
        try:
            text = await anyio.Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise BadInput(f"{self.name}: the OpenAPI document {path} cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise BadInput(f"{self.name}: the OpenAPI document {path} is not UTF-8") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{self.name}: the OpenAPI document {path} is not JSON: {exc}") from None

    async def _fetch_document(self, url: str) -> Any:
        import httpx

        headers: dict[str, str] = {}
        base = self.config.base_url
        token = os.environ.get(self.config.token_env) if self.config.token_env else None
        if token and base and _same_origin(url, base):
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = await self._http().get(url, headers=headers, timeout=self.config.timeout_secs)
        except httpx.HTTPError as exc:
            raise TransientToolError(f"{self.name}: the OpenAPI document {url} cannot be fetched: "
                                     f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise TransientToolError(f"{self.name}: the OpenAPI document {url} answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise BadInput(f"{self.name}: the OpenAPI document {url} is not JSON") from None

    def _http(self) -> "httpx.AsyncClient":
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self._client

    # -- tools -----------------------------------------------------------------------------

    def _tooldef(self, op: Operation) -> "ToolDef":
        name = f"{self.name}/{op.operation_id}"
        cached = self._tooldefs.get(name)
        if cached is not None:
            return cached
        assert self._base_url is not None
        base_url = self._base_url

        async def call(**arguments: Any) -> Any:
            return await self._call(op, arguments)

        call.__name__ = op.operation_id.replace("-", "_").replace(".", "_").replace("@", "_")
        tooldef = ToolDef(
            name=name,
            family=family_for(op, local=is_local(base_url), overrides=self.config.families),
            fn=call,
            parameters=copy.deepcopy(op.schema),
            description=op.description,
            timeout_secs=self.config.timeout_secs + 5,  # a backstop: the request has its own timeout
            connection=self.host,
            annotations={"method": op.method, "url": _without_userinfo(base_url).rstrip("/") + op.path},
        )
        self._tooldefs[name] = tooldef
        return tooldef

    async def _call(self, op: Operation, arguments: Mapping[str, Any]) -> Any:
        import httpx

        label = f"{self.name}/{op.operation_id}"
        assert self._base_url is not None
        request = build_request(op, self._base_url, arguments)
        headers = {"Accept": "application/json", **request.headers}
        if self.config.token_env:
            token = os.environ.get(self.config.token_env)
            if not token:
                raise PermanentToolError(f"{label}: the environment variable {self.config.token_env} is not set")
            headers["Authorization"] = f"Bearer {token}"
        client = self._http()
        outgoing = client.build_request(
            request.method, request.url, params=request.params, headers=headers,
            json=request.json if request.has_body else None,
            timeout=self.config.timeout_secs,
        )
        check_target(op, self._base_url, outgoing.url)
        try:
            response = await client.send(outgoing, stream=True)
            try:
                body, whole = await _read_capped(response, BODY_CAP)
            finally:
                await response.aclose()
        except httpx.TimeoutException:
            raise ToolTimeout(f"{label}: no answer within {self.config.timeout_secs:g} s") from None
        except httpx.HTTPError as exc:
            raise TransientToolError(f"{label}: {type(exc).__name__}: {exc or 'connection failed'}") from None
        status = response.status_code
        if 200 <= status < 300:
            return _response_output(response, body, whole)
        detail = _detail(response, body)
        message = f"{label}: HTTP {status}" + (f": {detail}" if detail else "")
        if status == 429 or status >= 500:
            raise TransientToolError(message)
        if 300 <= status < 400:
            message += f" (redirect to {response.headers.get('location', '?')} not followed)"
        raise PermanentToolError(message)


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


async def _read_capped(response: Any, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` bytes of the body, and whether that was all of it (the rest is never read)."""
    kept = bytearray()
    async for chunk in response.aiter_bytes():
        kept += chunk
        if len(kept) > cap:
            return bytes(kept[:cap]), False
    return bytes(kept), True


def _text(response: Any, body: bytes) -> str:
    return body.decode(response.encoding or "utf-8", errors="replace")


def _response_output(response: Any, body: bytes, whole: bool) -> Any:
    if not body:
        return None
    content_type = response.headers.get("content-type", "")
    if "json" in content_type and whole:
        try:
            return json.loads(body)
        except ValueError:
            pass
    text = _text(response, body)
    if not whole:
        return {"truncated": True, "bytes_read": len(body),
                "text": text[:_TEXT_CAP] + f"\n… [truncated: the body is larger than {BODY_CAP} bytes]"}
    if len(text) > _TEXT_CAP:
        return text[:_TEXT_CAP] + f"\n… [truncated: {len(text)} characters in all]"
    return text


def _detail(response: Any, body: bytes) -> str:
    text = _text(response, body).strip()
    return text if len(text) <= _DETAIL_CAP else text[:_DETAIL_CAP] + "…"
