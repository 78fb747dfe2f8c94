"""Tool declaration, the registry, argument ordering, and invoke: classification, timeout, breaker."""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Any, Literal, Optional

import anyio
import httpx
import pytest

from apollia_nb import errors
from apollia_nb.governance.decision import Family
from apollia_nb.runtime.breaker import COOLDOWN_SECS, Breakers
from apollia_nb.runtime.states import BreakerState
from apollia_nb.runtime.tools import (
    ToolDef,
    ToolOutcome,
    ToolRegistry,
    canonical_json,
    classify_error,
    invoke,
    order_arguments,
    schema_from_signature,
    tool,
    to_jsonable,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- declaring -------------------------------------------------------------------------


def test_schema_from_signature_types_order_and_required() -> None:
    def search(
        query: str,
        limit: int = 10,
        score: float = 0.5,
        exact: bool = False,
        tags: list[str] | None = None,
        filters: dict = {},  # noqa: B006 - a default shown in the schema
        mode: Literal["fast", "full"] = "fast",
        extra: Optional[int] = None,
        anything=None,
    ) -> list[str]:
        """Search the notes.

        Longer text that is not the description.

        Args:
            query: words to look for
            limit: at most this many results
        """
        return []

    td = ToolDef.from_function(search, "read")
    assert td.family is Family.READ
    assert td.description == "Search the notes."
    params = td.parameters
    assert list(params["properties"]) == ["query", "limit", "score", "exact", "tags", "filters", "mode", "extra", "anything"]
    assert td.parameter_names[0] == "query"
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "words to look for"}
    assert props["limit"] == {"type": "integer", "default": 10, "description": "at most this many results"}
    assert props["score"] == {"type": "number", "default": 0.5}
    assert props["exact"] == {"type": "boolean", "default": False}
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "default": None}
    assert props["filters"] == {"type": "object", "default": {}}
    assert props["mode"] == {"enum": ["fast", "full"], "type": "string", "default": "fast"}
    assert props["extra"] == {"type": ["integer", "null"], "default": None}
    assert props["anything"] == {"default": None}
    assert td.spec() == {"name": "search", "description": "Search the notes.", "parameters": params}
    assert td.spec()["parameters"] is not params  # a copy: the model cannot change the tool


def test_tool_decorator_keeps_the_function_callable() -> None:
    @tool(family=Family.WRITE, name="note_write", timeout_secs=5)
    def write(path: str, content: str) -> str:
        return f"{path}:{content}"

    assert isinstance(write, ToolDef)
    assert (write.name, write.family, write.timeout_secs) == ("note_write", Family.WRITE, 5)
    assert write(path="a", content="b") == "a:b"

    @tool
    def unclassified(x: int) -> int:
        return x

    assert unclassified.family is None and unclassified.name == "unclassified"


def test_tool_functions_take_named_parameters_only() -> None:
    def star(*names: str) -> None: ...
    def kw(**options: Any) -> None: ...
    def posonly(a: int, /) -> None: ...

    for fn in (star, kw, posonly):
        with pytest.raises(errors.BadInput, match="named parameter"):
            schema_from_signature(fn)


def test_tooldef_validates_itself() -> None:
    with pytest.raises(errors.BadInput, match="invalid tool name"):
        ToolDef("has space", None, lambda: None)
    with pytest.raises(errors.BadInput, match="unknown family 'writes'"):
        ToolDef("t", "writes", lambda: None)  # type: ignore[arg-type]
    with pytest.raises(errors.BadInput, match="timeout_secs"):
        ToolDef("t", None, lambda: None, timeout_secs=0)
    with pytest.raises(errors.BadInput, match="callable"):
        ToolDef("t", None, "not callable")  # type: ignore[arg-type]
    with pytest.raises(errors.BadInput, match="JSON Schema object"):
        ToolDef("t", None, lambda: None, parameters={"type": "array"})
    federated = ToolDef("mcp:notes/search", "read", lambda **kw: kw, connection="notes")
    assert federated.family is Family.READ and federated.connection == "notes"


# --- the registry -------------------------------------------------------------------------


def _noop(path: str) -> str:
    return path


def test_registry_register_get_names_specs() -> None:
    registry = ToolRegistry()
    a = registry.add_function(_noop, "read", name="a")
    b = registry.register(ToolDef.from_function(_noop, "write", name="b"))
    assert registry.names() == ["a", "b"]
    assert registry.get("a") is a and "b" in registry and len(registry) == 2
    assert [s["name"] for s in registry.specs(["b", "a"])] == ["b", "a"]
    assert [s["name"] for s in registry.specs()] == ["a", "b"]
    with pytest.raises(errors.BadInput, match="already registered"):
        registry.register(ToolDef.from_function(_noop, "read", name="a"))
    with pytest.raises(errors.UnknownTool) as caught:
        registry.get("nope")
    assert caught.value.code == "UNKNOWN_TOOL"
    registry.unregister("a")
    assert registry.names() == ["b"] and b in list(registry)
    with pytest.raises(errors.UnknownTool):
        registry.unregister("a")


def test_registry_resolve_required_and_optional() -> None:
    registry = ToolRegistry([ToolDef.from_function(_noop, "read", name=n) for n in ("a", "b", "c")])
    resolved, missing = registry.resolve(["b", "a"], ["c", "mcp:notes/search", "a"])
    assert resolved == ("b", "a", "c")
    assert missing == ("mcp:notes/search",)
    with pytest.raises(errors.UnknownTool, match="'x', 'y'"):
        registry.resolve(["a", "x", "y"], [])


# --- ordering arguments ---------------------------------------------------------------


def _write(path: str, content: str, mode: str = "w", count: int = 1, ratio: float = 1.0) -> None: ...


WRITE = ToolDef.from_function(_write, "write")


def test_order_arguments_returns_declared_order_with_defaults() -> None:
    ordered = order_arguments(WRITE, {"content": "x", "ratio": 2, "path": "a.txt"})
    assert list(ordered) == ["path", "content", "mode", "count", "ratio"]
    assert ordered == {"path": "a.txt", "content": "x", "mode": "w", "count": 1, "ratio": 2}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"content": "x"}, '_write: missing required argument "path"'),
        ({"path": "a", "content": "x", "contnt": "y"}, '_write: unknown argument "contnt" (parameters: path, content, mode, count, ratio)'),
        ({"path": 3, "content": "x"}, '_write: argument "path" must be string, got integer'),
        ({"path": "a", "content": "x", "count": True}, '_write: argument "count" must be integer, got boolean'),
        ({"path": "a", "content": "x", "count": 1.5}, '_write: argument "count" must be integer, got number'),
        ({"path": "a", "content": "x", "ratio": "1"}, '_write: argument "ratio" must be number, got string'),
        ({"path": None, "content": "x"}, '_write: argument "path" must be string, got null'),
        (["a", "x"], "_write: arguments must be an object, got array"),
    ],
)
def test_order_arguments_errors_name_the_argument(arguments: Any, message: str) -> None:
    with pytest.raises(errors.BadArgument) as caught:
        order_arguments(WRITE, arguments)
    assert caught.value.code == "BAD_ARGUMENT"
    assert caught.value.message == message


def test_order_arguments_checks_enums_unions_and_items() -> None:
    def fetch(url: str, method: Literal["GET", "POST"] = "GET", body: str | dict | None = None, ids: list[int] = []) -> None: ...  # noqa: B006

    td = ToolDef.from_function(fetch, "send")
    assert order_arguments(td, {"url": "u", "body": {"a": 1}})["body"] == {"a": 1}
    with pytest.raises(errors.BadArgument, match='"method" must be one of "GET", "POST", got string'):
        order_arguments(td, {"url": "u", "method": "BREW"})
    with pytest.raises(errors.BadArgument, match='"body" must be string or object or null, got integer'):
        order_arguments(td, {"url": "u", "body": 3})
    with pytest.raises(errors.BadArgument, match='"ids" must be array of integer, got array'):
        order_arguments(td, {"url": "u", "ids": [1, "2"]})


def test_order_arguments_allows_extra_only_when_the_schema_does() -> None:
    open_schema = ToolDef(
        "mcp:s/t", "read", lambda **kw: kw,
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": True},
    )
    assert order_arguments(open_schema, {"z": 1, "q": "x"}) == {"q": "x", "z": 1}
    assert list(order_arguments(open_schema, {"z": 1, "q": "x"})) == ["q", "z"]


# --- invoke ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_invoke_sync_tool_runs_in_a_worker_thread() -> None:
    seen: list[int] = []

    def add(a: int, b: int = 2) -> dict[str, int]:
        seen.append(threading.get_ident())
        return {"sum": a + b}

    outcome = await invoke(ToolDef.from_function(add, "read"), {"a": 1}, breakers=Breakers())
    assert outcome.status == "ok" and outcome.ok
    assert outcome.output == {"sum": 3}
    assert outcome.error is None and outcome.error_code is None
    assert seen and seen[0] != threading.get_ident()
    assert outcome.output_digest == hashlib.sha256(b'{"sum":3}').hexdigest()
    assert outcome.duration_ms >= 0
    assert outcome.to_dict()["error"] is None


@pytest.mark.anyio
async def test_invoke_async_tool() -> None:
    async def greet(name: str) -> str:
        await anyio.lowlevel.checkpoint()
        return f"hello {name}"

    outcome = await invoke(ToolDef.from_function(greet, "conversation"), {"name": "ada"}, breakers=Breakers())
    assert (outcome.status, outcome.output) == ("ok", "hello ada")
    assert outcome.output_digest == hashlib.sha256(json.dumps("hello ada").encode()).hexdigest()


@pytest.mark.anyio
async def test_invoke_timeout_is_a_transient_tool_timeout() -> None:
    never = anyio.Event()

    async def hang() -> None:
        await never.wait()

    breakers = Breakers()
    outcome = await invoke(ToolDef.from_function(hang, "read", timeout_secs=60), {}, breakers=breakers, timeout_secs=0.01)
    assert outcome.status == "error"
    assert outcome.error_code == "TOOL_TIMEOUT"
    assert isinstance(outcome.error, errors.ToolTimeout)
    assert outcome.transient
    assert "0.01 s" in outcome.error.message
    assert breakers.get("hang").consecutive_failures == 1


@pytest.mark.anyio
async def test_invoke_uses_the_tools_own_timeout() -> None:
    never = anyio.Event()

    async def hang() -> None:
        await never.wait()

    outcome = await invoke(ToolDef.from_function(hang, "read", timeout_secs=0.01), {}, breakers=Breakers())
    assert outcome.error_code == "TOOL_TIMEOUT"


def _raiser(exc: BaseException):
    def body() -> None:
        raise exc

    return body


def _status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://host.test/x")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError(f"status {status}", request=request, response=response)


CASES = [
    (errors.TransientToolError("flapping"), "TOOL_TRANSIENT", True),
    (errors.PermanentToolError("nope"), "TOOL_PERMANENT", False),
    (errors.PathEscape("outside"), "PATH_ESCAPE", False),
    (errors.BadArgument("bad"), "BAD_ARGUMENT", False),
    (errors.Refused("no"), "REFUSED", False),
    (TimeoutError(), "TOOL_TIMEOUT", True),
    (ConnectionError("reset"), "TOOL_TRANSIENT", True),
    (ConnectionRefusedError(111, "Connection refused"), "TOOL_TRANSIENT", True),
    (httpx.ConnectError("refused"), "TOOL_TRANSIENT", True),
    (httpx.ReadTimeout("slow"), "TOOL_TIMEOUT", True),
    (_status_error(503), "TOOL_TRANSIENT", True),
    (_status_error(429), "TOOL_TRANSIENT", True),
    (_status_error(404), "TOOL_PERMANENT", False),
    (FileNotFoundError(2, "No such file or directory", "x.txt"), "TOOL_PERMANENT", False),
    (IsADirectoryError(21, "Is a directory", "d"), "TOOL_PERMANENT", False),
    (PermissionError(13, "Permission denied", "/root"), "TOOL_PERMANENT", False),
    (ValueError("bad value"), "TOOL_PERMANENT", False),
    (KeyError("k"), "TOOL_PERMANENT", False),
    (TypeError("unsupported operand"), "TOOL_PERMANENT", False),
    (RuntimeError("boom"), "TOOL_PERMANENT", False),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("exc", "code", "transient"), CASES, ids=[type(c[0]).__name__ + "-" + c[1] for c in CASES])
async def test_invoke_classifies_each_failure(exc: BaseException, code: str, transient: bool) -> None:
    breakers = Breakers()
    td = ToolDef.from_function(_raiser(exc), None, name="flaky")
    outcome = await invoke(td, {}, breakers=breakers)
    assert outcome.status == "error"
    assert outcome.error_code == code == outcome.error.code
    assert outcome.output is None
    assert outcome.transient is transient
    assert breakers.get("flaky").consecutive_failures == (1 if transient else 0)
    assert outcome.to_dict()["error"]["code"] == code


def test_classified_messages_keep_the_cause() -> None:
    assert classify_error(RuntimeError("boom"), tool="t").message == "t: RuntimeError: boom"
    assert classify_error(KeyError("k"), tool="t").message == "t: not found: k"
    fnf = classify_error(FileNotFoundError(2, "No such file or directory", "x.txt"), tool="t")
    assert fnf.message == "t: No such file or directory: x.txt"
    assert classify_error(_status_error(404), tool="t").message == "t: HTTP 404 from http://host.test/x"
    original = errors.PathEscape("outside")
    assert classify_error(original) is original


@pytest.mark.anyio
async def test_arguments_that_do_not_bind_are_bad_argument_and_the_body_never_runs() -> None:
    calls: list[str] = []

    def body(y: str) -> None:
        calls.append(y)

    # A hand-written schema that disagrees with the function.
    td = ToolDef("mismatch", "read", body, parameters={"type": "object", "properties": {"x": {"type": "string"}}})
    breakers = Breakers()
    outcome = await invoke(td, {"x": "1"}, breakers=breakers)
    assert outcome.error_code == "BAD_ARGUMENT"
    assert calls == []
    outcome = await invoke(td, {"x": 1}, breakers=breakers)
    assert outcome.error_code == "BAD_ARGUMENT" and "must be string" in outcome.error.message
    assert breakers.get("mismatch").consecutive_failures == 0


def _kw(x, y=1): ...
def _posonly(x, /, y): ...
def _posonly_default(x=0, /, *, k): ...
def _kwonly(*, k): ...
def _varkw(a, **kw): ...
def _varargs(x, *args): ...


@pytest.mark.parametrize("fn", [_kw, _posonly, _posonly_default, _kwonly, _varkw, _varargs])
@pytest.mark.parametrize("arguments", [{}, {"x": 1}, {"y": 2}, {"x": 1, "y": 2}, {"x": 1, "z": 3}, {"k": 1},
                                       {"a": 1, "q": 2}, {"args": 1}, {"x": 1, "args": 2}, {"kw": 1}])
def test_whether_arguments_bind_is_what_signature_bind_says(fn, arguments) -> None:
    """The fast check of a call's arguments against its body agrees with ``inspect.Signature.bind``."""
    import inspect

    from apollia_nb.runtime.tools import _check_binds

    try:
        inspect.signature(fn).bind(**arguments)
        binds = True
    except TypeError:
        binds = False
    if binds:
        _check_binds(fn, arguments)
    else:
        with pytest.raises(errors.BadArgument):
            _check_binds(fn, arguments)


@pytest.mark.anyio
async def test_results_are_made_json() -> None:
    class Thing:
        def __repr__(self) -> str:
            return "<Thing>"

    def body() -> Any:
        return {"set": {3, 1, 2}, "tuple": (1, "a"), "thing": Thing(), "nan": float("nan"), 7: b"bytes", "fam": Family.READ}

    outcome = await invoke(ToolDef.from_function(body, "read"), {}, breakers=Breakers())
    assert outcome.output == {"set": [1, 2, 3], "tuple": [1, "a"], "thing": "<Thing>", "nan": "nan", "7": "bytes", "fam": "read"}
    assert outcome.output_digest == hashlib.sha256(canonical_json(outcome.output).encode()).hexdigest()
    assert to_jsonable("x" * 5) == "xxxxx"


@pytest.mark.anyio
async def test_breaker_opens_after_three_transient_failures_then_fails_fast() -> None:
    clock = FakeClock()
    breakers = Breakers(clock=clock)
    calls: list[int] = []
    healthy = False

    def flaky() -> str:
        calls.append(1)
        if not healthy:
            raise ConnectionError("upstream down")
        return "ok"

    td = ToolDef.from_function(flaky, "read")
    for _ in range(3):
        outcome = await invoke(td, {}, breakers=breakers)
        assert outcome.error_code == "TOOL_TRANSIENT"
    assert breakers.get("flaky").state is BreakerState.OPEN
    assert len(calls) == 3

    outcome = await invoke(td, {}, breakers=breakers)
    assert outcome.status == "error" and outcome.error_code == "CIRCUIT_OPEN"
    assert isinstance(outcome.error, errors.CircuitOpen)
    assert len(calls) == 3  # failed fast: the body did not run

    other = await invoke(ToolDef.from_function(lambda: 1, "read", name="other"), {}, breakers=breakers)
    assert other.ok  # one breaker per tool

    clock.now += COOLDOWN_SECS
    healthy = True
    outcome = await invoke(td, {}, breakers=breakers)
    assert outcome.ok and len(calls) == 4
    assert breakers.get("flaky").state is BreakerState.CLOSED


@pytest.mark.anyio
async def test_permanent_errors_do_not_count_and_success_resets() -> None:
    breakers = Breakers()
    plan = ["transient", "transient", "permanent", "permanent", "permanent", "ok", "transient", "transient"]
    calls: list[str] = []

    def body() -> str:
        step = plan[len(calls)]
        calls.append(step)
        if step == "transient":
            raise errors.TransientToolError("blip")
        if step == "permanent":
            raise ValueError("bad input")
        return "fine"

    td = ToolDef.from_function(body, "read", name="mixed")
    codes = [(await invoke(td, {}, breakers=breakers)).error_code for _ in plan]
    assert codes == ["TOOL_TRANSIENT", "TOOL_TRANSIENT", "TOOL_PERMANENT", "TOOL_PERMANENT", "TOOL_PERMANENT",
                     None, "TOOL_TRANSIENT", "TOOL_TRANSIENT"]
    breaker = breakers.get("mixed")
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 2
    assert len(calls) == len(plan)


@pytest.mark.anyio
async def test_cancellation_from_outside_propagates_and_records_nothing() -> None:
    never = anyio.Event()
    breakers = Breakers()
    with anyio.CancelScope() as scope:

        async def body() -> None:
            scope.cancel()
            await never.wait()

        await invoke(ToolDef.from_function(body, "read", name="cancelled"), {}, breakers=breakers)
        pytest.fail("invoke returned although its caller was cancelled")
    assert scope.cancelled_caught
    assert breakers.get("cancelled").consecutive_failures == 0


def test_outcome_is_frozen() -> None:
    outcome = ToolOutcome("ok", 1, None, None, "d", 0.1)
    with pytest.raises(AttributeError):
        outcome.status = "error"  # type: ignore[misc]


def test_tool_decorator_accepts_the_family_positionally() -> None:
    @tool("read")
    def peek(path: str) -> str:
        return path

    assert peek.family is Family.READ and peek.name == "peek"


def test_numpy_like_scalars_become_numbers() -> None:
    class Scalar:
        shape = ()

        def item(self) -> int:
            return 5

    assert to_jsonable({"n": Scalar()}) == {"n": 5}
