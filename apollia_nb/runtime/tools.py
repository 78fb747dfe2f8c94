"""Tools: how they are declared, looked up, checked, and the one place a tool body runs.

``ToolDef`` is a frozen value: a name, a family of action (or ``None``,
unclassified), a callable taking keyword arguments, and the JSON Schema of
its parameters. The declared order of the parameters matters: the first one
is the "first argument" that fine rules match a prefix against, so
``order_arguments`` returns arguments in that order before ``decide()`` sees
them.

``invoke`` is the edge where a tool's own exceptions become the project's
errors (httpx's ``map_exceptions`` habit): whatever a body raises, the caller
gets a ``ToolOutcome`` with a stable error code, and the tool's circuit
breaker is told whether the failure was transient. It never raises for a
failure of the tool, not even when the breaker is open (``CIRCUIT_OPEN``
outcome), so the engine has one path for every result. Only cancellation
from outside propagates.

Classification (after a body raised):

    project errors (ApolliaError)             kept as they are
    TimeoutError, our timeout, httpx timeout  ToolTimeout (transient)
    ConnectionError, network OSError,
      httpx network / remote-protocol error   TransientToolError
    httpx status error 429 or 5xx             TransientToolError
    httpx status error other 4xx              PermanentToolError
    arguments that do not bind to the body    BadArgument (checked before it runs)
    anything else (FileNotFoundError,
      PermissionError, ValueError, KeyError…) PermanentToolError with the message

Transient versus permanent is ``breaker.classify``'s answer, so the breaker
and the outcome never disagree.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import math
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from apollia_nb.errors import (
    ApolliaError,
    BadArgument,
    BadInput,
    CircuitOpen,
    PermanentToolError,
    ToolTimeout,
    TransientToolError,
    UnknownTool,
)
from apollia_nb.governance.decision import Family
from apollia_nb.runtime import workers
from apollia_nb.runtime.breaker import PERMANENT, SUCCESS, TRANSIENT, Breakers, classify
from apollia_nb.runtime.outputs import clean_text, json_value

__all__ = [
    "DEFAULT_TIMEOUT_SECS",
    "ToolDef",
    "tool",
    "ToolRegistry",
    "ToolOutcome",
    "order_arguments",
    "invoke",
    "classify_error",
    "to_jsonable",
    "canonical_json",
    "output_digest",
    "text_digest",
    "schema_from_signature",
]

DEFAULT_TIMEOUT_SECS = 30.0
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/@-]{0,199}")


# --- declaring tools ------------------------------------------------------------------


def _family(value: Family | str | None) -> Family | None:
    if value is None or isinstance(value, Family):
        return value
    try:
        return Family(value)
    except ValueError:
        known = ", ".join(f.value for f in Family)
        raise BadInput(f"unknown family {value!r} (one of {known}, or None for unclassified)") from None


@dataclass(frozen=True)
class ToolDef:
    """A tool the runtime can call.

    ``parameters`` is a JSON Schema object whose ``properties`` are in declared
    order; the first is the "first argument". ``connection`` names the MCP
    server or host a federated tool goes through (organisation policy can
    refuse it). ``annotations`` are MCP hints, shown on cards, never trusted.
    ``resolve_path`` is set on file tools: the function that turns their first
    argument into the file they act on (``paths.resolve_tool_path``), the same
    one the tool body uses, so governance matches deny rules on that file.
    ``shell`` is set on an ``execute`` tool whose first argument is a shell command
    run by bash (``bash_executor``): only such a call can be allowed by an allow
    rule or answered ``always``. Any other execute tool (``python_executor``, a
    custom or federated one) is asked every time: the simple-command check proves
    nothing about code in another language.
    ``aliases`` turns the first argument into the other spellings of what the tool
    acts on, read by the tool's own parser (``http_request``: the URL as the HTTP
    client reads it); deny rules are matched against them too (``Call.aliases``).
    """

    name: str
    family: Family | None
    fn: Callable[..., Any] = field(repr=False)
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        hash=False,
    )
    description: str = ""
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    connection: str | None = None
    annotations: dict[str, Any] | None = field(default=None, hash=False)
    resolve_path: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)
    shell: bool = False
    aliases: Callable[[Any], tuple[str, ...]] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOOL_NAME.fullmatch(self.name):
            raise BadInput(f"invalid tool name {self.name!r}: letters, digits and _ . : / @ - only, no spaces")
        object.__setattr__(self, "family", _family(self.family))
        if not callable(self.fn):
            raise BadInput(f"tool {self.name!r}: fn must be callable")
        if (
            not isinstance(self.parameters, dict)
            or self.parameters.get("type", "object") != "object"
            or not isinstance(self.parameters.get("properties", {}), dict)
        ):
            raise BadInput(f"tool {self.name!r}: parameters must be a JSON Schema object with properties")
        timeout = self.timeout_secs
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
            raise BadInput(f"tool {self.name!r}: timeout_secs must be a positive number, got {timeout!r}")
        if not isinstance(self.shell, bool):
            raise BadInput(f"tool {self.name!r}: shell must be True or False, got {self.shell!r}")

    @property
    def parameter_names(self) -> tuple[str, ...]:
        """Declared parameter names, in order; the first is the "first argument"."""
        return tuple(self.parameters.get("properties", {}))

    def spec(self) -> dict[str, Any]:
        """What a model is shown: ``{name, description, parameters}``."""
        return {"name": self.name, "description": self.description, "parameters": copy.deepcopy(self.parameters)}

    def __call__(self, **kwargs: Any) -> Any:
        """Call the body directly, ungoverned (for tests and plain Python use)."""
        return self.fn(**kwargs)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        family: Family | str | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_secs: float = DEFAULT_TIMEOUT_SECS,
        connection: str | None = None,
        annotations: dict[str, Any] | None = None,
        resolve_path: Callable[[Any], Any] | None = None,
        shell: bool = False,
        aliases: Callable[[Any], tuple[str, ...]] | None = None,
    ) -> "ToolDef":
        """Build a tool from a plain function: schema from its signature and type hints,
        description from its docstring's first paragraph."""
        doc = inspect.getdoc(fn) or ""
        summary = doc.split("\n\n", 1)[0].strip() if doc else ""
        return cls(
            name=name or getattr(fn, "__name__", ""),  # type: ignore[arg-type]  # a function has a name
            family=family,  # type: ignore[arg-type]  # ToolDef reads a family's name
            fn=fn,
            parameters=schema_from_signature(fn),
            description=summary if description is None else description,
            timeout_secs=timeout_secs,
            connection=connection,
            annotations=annotations,
            resolve_path=resolve_path,
            shell=shell,
            aliases=aliases,
        )


def tool(
    fn: Callable[..., Any] | Family | str | None = None,
    *,
    family: Family | str | None = None,
    name: str | None = None,
    description: str | None = None,
    timeout_secs: float = DEFAULT_TIMEOUT_SECS,
    connection: str | None = None,
) -> Any:
    """Decorator: ``@tool(family="read")`` turns a function into a ``ToolDef``.

    Bare ``@tool`` declares an unclassified tool (asked every time). The result
    is still callable with keyword arguments.
    """

    def build(func: Callable[..., Any]) -> ToolDef:
        return ToolDef.from_function(
            func, family, name=name, description=description, timeout_secs=timeout_secs, connection=connection
        )

    if isinstance(fn, (str, Family)):  # @tool("read"): the family given positionally
        family, fn = fn, None
    return build(fn) if fn is not None else build


_SIMPLE_TYPES: dict[Any, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}


def _schema_for(annotation: Any) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any or annotation is object:
        return {}
    if annotation is type(None) or annotation is None:
        return {"type": "null"}
    if annotation in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        present = [a for a in args if a is not type(None)]
        inner = _schema_for(present[0]) if len(present) == 1 else {"anyOf": [_schema_for(a) for a in present]}
        if len(present) == len(args):
            return inner
        if isinstance(inner.get("type"), str) and "anyOf" not in inner:
            return {**inner, "type": [inner["type"], "null"]}
        if not inner:
            return {}
        if "anyOf" in inner:
            return {"anyOf": [*inner["anyOf"], {"type": "null"}]}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is Literal:
        kinds = {_SIMPLE_TYPES.get(type(a)) for a in args}
        schema: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema
    if annotation in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, Sequence, Iterable):
        schema = {"type": "array"}
        if args and origin is not tuple and args[0] is not Any:
            schema["items"] = _schema_for(args[0])
        return schema
    if annotation in (dict, Mapping) or origin in (dict, Mapping, typing.MutableMapping):
        return {"type": "object"}
    return {}


def _doc_params(doc: str) -> dict[str, str]:
    """``name: text`` lines under an ``Args:`` / ``Parameters:`` heading of a docstring."""
    found: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if not stripped or (not line.startswith((" ", "\t")) and stripped.endswith(":")):
                if found:
                    in_args = False
                continue
            match = re.match(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", stripped)
            if match:
                found[match.group(1)] = match.group(2).strip()
    return found


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """JSON Schema object for a function's keyword-callable parameters, in declared order.

    Required = parameters without defaults. ``*args``, ``**kwargs`` and
    positional-only parameters are refused: tools are called with named arguments.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise BadInput(f"cannot read the signature of {fn!r}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    described = _doc_params(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise BadInput(
                f"tool function {getattr(fn, '__name__', fn)!r}: parameter {param.name!r} must be "
                "a named parameter (no *args, **kwargs or positional-only parameters)"
            )
        schema = _schema_for(hints.get(param.name, param.annotation))
        if param.default is param.empty:
            required.append(param.name)
        else:
            try:
                json.dumps(param.default)
                schema["default"] = param.default
            except (TypeError, ValueError):
                pass
        if param.name in described:
            schema["description"] = described[param.name]
        properties[param.name] = schema
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# --- the registry -------------------------------------------------------------------


class ToolRegistry:
    """Tools by name. One registry per runtime; an agent gets the subset it resolved."""

    def __init__(self, tools: Iterable[ToolDef] = ()) -> None:
        self._tools: dict[str, ToolDef] = {}
        for tooldef in tools:
            self.register(tooldef)

    def register(self, tooldef: ToolDef) -> ToolDef:
        """Add a tool. A second tool with the same name is ``BAD_INPUT``."""
        if not isinstance(tooldef, ToolDef):
            raise BadInput(f"register() takes a ToolDef (use ToolDef.from_function), got {type(tooldef).__name__}")
        if tooldef.name in self._tools:
            raise BadInput(f"a tool named {tooldef.name!r} is already registered")
        self._tools[tooldef.name] = tooldef
        return tooldef

    def add_function(self, fn: Callable[..., Any], family: Family | str | None = None, **options: Any) -> ToolDef:
        """Register a plain Python function as a tool (``ToolDef.from_function`` options)."""
        return self.register(ToolDef.from_function(fn, family, **options))

    def unregister(self, name: str) -> None:
        """Remove a tool (e.g. when an MCP server goes away); unknown is ``UNKNOWN_TOOL``."""
        self.get(name)
        del self._tools[name]

    def get(self, name: str) -> ToolDef:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownTool(f"no tool named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> typing.Iterator[ToolDef]:
        return iter(list(self._tools.values()))

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._tools)

    def specs(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Model-facing specs of the named tools (all when ``names`` is None)."""
        chosen = self._tools.keys() if names is None else names
        return [self.get(name).spec() for name in chosen]

    def resolve(
        self, required: Iterable[str], optional: Iterable[str] = ()
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The tools an agent declared: ``(resolved_names, missing_optional)``.

        ``resolved_names`` are the required tools then the optional ones that
        exist, in declared order, without repeats. A missing required tool is
        ``UNKNOWN_TOOL`` naming every missing one; missing optional tools are
        returned so the caller can mark the agent degraded.
        """
        required = list(required)
        missing = [name for name in required if name not in self._tools]
        if missing:
            shown = ", ".join(repr(n) for n in missing)
            raise UnknownTool(f"required tool{'s' if len(missing) > 1 else ''} not available: {shown}")
        resolved = list(dict.fromkeys(required))
        missing_optional: list[str] = []
        for name in optional:
            if name not in self._tools:
                missing_optional.append(name)
            elif name not in resolved:
                resolved.append(name)
        return tuple(resolved), tuple(missing_optional)


# --- checking arguments -------------------------------------------------------------

_JSON_TYPE_NAMES = {
    str: "string", bool: "boolean", int: "integer", float: "number",
    list: "array", tuple: "array", dict: "object", type(None): "null",
}


def _json_type(value: Any) -> str:
    for kind, name in _JSON_TYPE_NAMES.items():
        if type(value) is kind:
            return name
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _is_type(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, (list, tuple))
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "null":
        return value is None
    return True


def _matches(value: Any, schema: Mapping[str, Any]) -> bool:
    if type(schema) is not dict and not isinstance(schema, Mapping):
        return True
    if "anyOf" in schema and not any(_matches(value, s) for s in schema["anyOf"]):
        return False
    if "oneOf" in schema and not any(_matches(value, s) for s in schema["oneOf"]):
        return False
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is_type(value, k) for k in kinds):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    items = schema.get("items")
    if items is not None and isinstance(items, Mapping) and isinstance(value, (list, tuple)):
        return all(_matches(item, items) for item in value)
    return True


def _expected(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_expected(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), Mapping) and schema["items"].get("type"):
        return f"array of {_expected(schema['items'])}"
    return str(kind)


def order_arguments(tooldef: ToolDef, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check arguments against the declared parameters; return them in declared order.

    Missing parameters with a default get it, so the decision, the card and the
    journal show what the tool will run with. Missing required, unknown, or
    wrong-typed arguments are ``BAD_ARGUMENT`` naming the argument.
    """
    if arguments is None:
        arguments = {}
    if type(arguments) is not dict and not isinstance(arguments, Mapping):
        raise BadArgument(f"{tooldef.name}: arguments must be an object, got {_json_type(arguments)}")
    properties: dict[str, Any] = tooldef.parameters.get("properties", {})
    required = tooldef.parameters.get("required", [])
    for key in arguments:
        if not isinstance(key, str):
            raise BadArgument(f"{tooldef.name}: argument names must be strings, got {key!r}")
    extra = [key for key in arguments if key not in properties]
    if extra and not tooldef.parameters.get("additionalProperties", False):
        known = ", ".join(properties) or "none"
        raise BadArgument(f'{tooldef.name}: unknown argument "{extra[0]}" (parameters: {known})')
    missing = [key for key in required if key not in arguments]
    if missing:
        raise BadArgument(f'{tooldef.name}: missing required argument "{missing[0]}"')
    ordered: dict[str, Any] = {}
    for key, schema in properties.items():
        if key in arguments:
            value = arguments[key]
            if not _matches(value, schema):
                raise BadArgument(
                    f'{tooldef.name}: argument "{key}" must be {_expected(schema)}, got {_json_type(value)}'
                )
            ordered[key] = value
        elif (type(schema) is dict or isinstance(schema, Mapping)) and "default" in schema:
            ordered[key] = copy.deepcopy(schema["default"])
    for key in extra:
        ordered[key] = arguments[key]
    return ordered


@functools.lru_cache(maxsize=1024)
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature``, once per function (it costs tens of µs, on every call otherwise)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=1024)
def _keywords(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str]] | None:
    """The names ``fn`` takes by keyword and those it requires, when that is all binding asks
    (no ``**kwargs``, no positional-only parameter without a default); else None."""
    signature = _signature(fn)
    if signature is None:
        return None
    names: set[str] = set()
    required: set[str] = set()
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD or (p.kind is p.POSITIONAL_ONLY and p.default is p.empty):
            return None
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.add(p.name)
            if p.default is p.empty:
                required.add(p.name)
    return frozenset(names), frozenset(required)


def _check_binds(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> None:
    try:
        keywords = _keywords(fn)
    except TypeError:  # an unhashable callable
        keywords = None
    if keywords is not None and keywords[1] <= arguments.keys() and arguments.keys() <= keywords[0]:
        return  # binds (what ``Signature.bind`` would find, without its cost)
    try:
        signature = _signature(fn)
    except TypeError:  # an unhashable callable
        signature = inspect.signature(fn)
    if signature is None:
        return
    try:
        signature.bind(**arguments)
    except TypeError as exc:
        raise BadArgument(f"{getattr(fn, '__name__', 'tool')}: {exc}") from None


# --- results --------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """A JSON value for a tool's result, whatever the tool returned (``outputs.json_value``)."""
    return json_value(value)


#: ``json.dumps`` with the options below builds this encoder anew on every call; it is made once.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def canonical_json(value: Any) -> str:
    """The canonical JSON text a digest is computed over
    (``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)``)."""
    return _CANONICAL.encode(value)


def output_digest(value: Any) -> str:
    """SHA-256 hex of the canonical JSON of an output."""
    return text_digest(canonical_json(value))


def text_digest(text: str) -> str:
    """SHA-256 hex of a canonical JSON text already made (``canonical_json``): one encoding, not two."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ToolOutcome:
    """How one invocation ended. ``output`` is JSON-able; ``None`` on error."""

    status: Literal["ok", "error"]
    output: Any = field(default=None, hash=False)
    error: ApolliaError | None = field(default=None, compare=False)
    error_code: str | None = None
    output_digest: str = ""
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def transient(self) -> bool:
        """True when the failure is worth retrying later (it counted on the breaker)."""
        return self.error is not None and classify(self.error) == TRANSIENT

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "output": self.output,
            "error": self.error.to_dict() if self.error is not None else None,
            "output_digest": self.output_digest,
            "duration_ms": self.duration_ms,
        }


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000.0, 3)


def _failed(error: ApolliaError, started: float) -> ToolOutcome:
    error.message = clean_text(error.message if isinstance(error.message, str) else repr(error.message))
    return ToolOutcome("error", None, error, error.code, output_digest(None), _ms(started))


# --- classification and invocation --------------------------------------------------


def classify_error(exc: BaseException, *, tool: str = "tool", timeout_secs: float | None = None) -> ApolliaError:
    """Map an exception a tool body raised to the project's error (see the module docstring)."""
    if isinstance(exc, ApolliaError):
        return exc
    httpx = sys.modules.get("httpx")  # an httpx error exists only if httpx was imported
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError) or (httpx is not None and isinstance(exc, httpx.TimeoutException)):
        if timeout_secs is not None and not str(exc):
            return ToolTimeout(f"{tool} did not finish within {timeout_secs:g} s")
        return ToolTimeout(f"{tool} timed out: {detail}")
    if httpx is not None and isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        message = f"{tool}: HTTP {status} from {exc.request.url}"
        if status == 429 or status >= 500:
            return TransientToolError(message)
        return PermanentToolError(message)
    if classify(exc) == TRANSIENT:
        return TransientToolError(f"{tool}: {type(exc).__name__}: {detail}")
    if isinstance(exc, KeyError):
        return PermanentToolError(f"{tool}: not found: {exc.args[0] if exc.args else detail}")
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return PermanentToolError(f"{tool}: {exc.strerror}{where}")
    return PermanentToolError(f"{tool}: {type(exc).__name__}: {detail}")


def is_async_body(fn: Callable[..., Any]) -> bool:
    """Whether a tool's body is a coroutine function (run on the event loop, not in a worker thread)."""
    return _is_async(fn)


def _is_async(fn: Callable[..., Any]) -> bool:
    try:
        return _is_async_cached(fn)
    except TypeError:  # an unhashable callable
        return _coroutine_function(fn)


def _coroutine_function(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


@functools.lru_cache(maxsize=1024)
def _is_async_cached(fn: Callable[..., Any]) -> bool:
    """``_coroutine_function``, once per function (a tool's body does not change kind)."""
    return _coroutine_function(fn)


async def _run_body(fn: Callable[..., Any], arguments: dict[str, Any], timeout: float,
                    before: Callable[[], Any] | None = None) -> tuple[Any, float | None]:
    """The body's result and ``perf_counter()`` as it started (None: when ``invoke`` started)."""
    if _is_async(fn):
        if before is not None:
            await _before(before)
        started = time.perf_counter() if before is not None else None
        with anyio.fail_after(timeout):
            result = await fn(**arguments)
            if inspect.isawaitable(result):
                result = await result
        return result, started
    # A sync body runs in a worker thread. Threads cannot be interrupted: on
    # timeout the call returns at once and the thread's late result is dropped.
    # The arguments are bound here: a tool's own ``timeout`` parameter is the tool's.
    result, begun = await workers.run_after(before, functools.partial(fn, **arguments), timeout=timeout)
    if inspect.isawaitable(result):
        left = timeout - (time.perf_counter() - begun)
        with anyio.fail_after(max(0.0, left)):
            result = await result
    return result, begun if before is not None else None


async def _before(before: Callable[[], Any]) -> None:
    """Run ``before`` in a worker thread (no timeout); its failure is ``BeforeFailed``."""
    await workers.run_after(before, _nothing, timeout=math.inf)


def _nothing() -> None:
    return None


async def invoke(
    tooldef: ToolDef,
    arguments: Mapping[str, Any] | None,
    *,
    breakers: Breakers,
    timeout_secs: float | None = None,
    before: Callable[[], Any] | None = None,
    checked: bool = False,
) -> ToolOutcome:
    """Run one approved call: check arguments, pass the breaker, run under the timeout.

    Never raises for a failure of the tool: bad arguments (``BAD_ARGUMENT``, the
    body never runs, the breaker is untouched), an open breaker
    (``CIRCUIT_OPEN``, the body never runs) and every error of the body come
    back as an error outcome. Only transient failures count on the breaker.

    ``before``: a blocking function that must be done before the body may run (the
    journal's commit of the call), run once the arguments are checked and the breaker
    asked, whatever they said; for a synchronous body in the body's own worker thread,
    just before it, so the body starts without a hand-off back to the event loop. Its
    failure is raised as it is (``workers.BeforeFailed`` unwrapped), the body never
    runs and the breaker is told nothing; the tool's timeout counts from the body's
    start. Cancelled while ``before`` runs, it runs to its end and the body never starts.

    ``checked``: ``arguments`` are ``order_arguments(tooldef, ...)`` already, made for this call.
    """
    started = time.perf_counter()
    try:
        ordered = arguments if checked and type(arguments) is dict else order_arguments(tooldef, arguments)
        _check_binds(tooldef.fn, ordered)
    except BadArgument as exc:
        if before is not None:
            await _unwrapped(_before(before))
        return _failed(exc, started)
    breaker = breakers.get(tooldef.name)
    try:
        ticket = breaker.admit()
    except CircuitOpen as exc:
        if before is not None:
            await _unwrapped(_before(before))
        return _failed(exc, started)
    timeout = tooldef.timeout_secs if timeout_secs is None else timeout_secs
    unmade: BaseException | None = None
    try:
        result, body_started = await _run_body(tooldef.fn, ordered, timeout, before)
    except workers.BeforeFailed as failed:  # nothing ran: the ticket is left unrecorded, like a cancelled call
        unmade = failed.error
    except (Exception, SystemExit) as exc:  # a body that calls sys.exit() ends its call, not the runtime
        try:
            error = classify_error(exc, tool=tooldef.name, timeout_secs=timeout)
        except Exception:  # an exception whose str() raises
            error = PermanentToolError(f"{tooldef.name}: {type(exc).__name__}")
        breaker.record(ticket, TRANSIENT if classify(error) == TRANSIENT else PERMANENT)
        return _failed(error, started)
    if unmade is not None:
        raise unmade  # outside the handler: it keeps its own cause and context
    if body_started is not None:
        started = body_started
    try:
        output = json_value(result)
        digest = output_digest(output)
    except Exception as exc:  # json_value is total; this is the last line of defence
        breaker.record(ticket, PERMANENT)
        return _failed(PermanentToolError(f"{tooldef.name}: its output cannot be recorded "
                                          f"({type(exc).__name__})"), started)
    breaker.record(ticket, SUCCESS)
    return ToolOutcome("ok", output, None, None, digest, _ms(started))


async def _unwrapped(step: Any) -> None:
    unmade: BaseException | None = None
    try:
        await step
    except workers.BeforeFailed as failed:
        unmade = failed.error
    if unmade is not None:
        raise unmade
