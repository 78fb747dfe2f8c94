"""The REST API: a thin FastAPI shell over one ``Runtime``.

Every route under ``/api/v1`` calls the runtime and returns one of the models
of :mod:`apollia_nb.wire.schemas`; the app adds only what HTTP needs:

* **One error model.** Every error is ``{"code", "message"}`` with a stable
  code: an ``ApolliaError`` keeps its own code and status; request validation
  is 422 ``BAD_INPUT`` naming the field; unknown routes 404 ``NOT_FOUND``;
  a wrong method 405 ``METHOD_NOT_ALLOWED``; a missing or wrong token 401
  ``UNAUTHORIZED`` (with ``WWW-Authenticate: Bearer``); a body over the limit
  413 ``PAYLOAD_TOO_LARGE``; a write the disk refuses 507 ``STORAGE_FULL`` or
  503 ``STORAGE_ERROR`` (nothing of it was recorded). Nothing a client sends is a 500.
* **Only its own names.** Every route, ``/health`` too, refuses a ``Host`` that
  is not a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``, any port)
  or an allowed host with 421 ``HOST_NOT_ALLOWED`` (a DNS-rebinding page names
  its own host), and a browser's ``Origin`` that is neither the server's own
  nor an allowed origin with 403 ``ORIGIN_NOT_ALLOWED`` (see ``HostGuard``).
* **A bearer token** on every route but ``/health``, compared in constant time
  (the OpenAPI document and its docs page are served without one).
* **Idempotency keys** on every POST that changes something: a retry with the
  same ``Idempotency-Key`` gets the first answer (:mod:`apollia_nb.api.idempotency`).
* **No CORS** unless origins are configured.
* **Server-sent events** for a task's changes and a chat exchange's events,
  ended by the task finishing, the exchange ending or the server shutting down;
  described in the OpenAPI 3.1 document as text with an ``x-itemSchema``.

The runtime lives on the server's event loop, so runs are background tasks of
the server: ``create_app(runtime, token=...)`` wraps a runtime opened on that
loop by the caller, and ``create_app(home=..., token=...)`` opens one in the
app's lifespan (``await Runtime.open(home)``) and closes it on shutdown.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio
from fastapi import (
    APIRouter,
    BackgroundTasks,
    Body,
    Depends,
    FastAPI,
    Query,
    Request,
    Response,
)
from fastapi import Path as FastPath
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apollia_nb import __version__, faults
from apollia_nb.api import batches, hooks, people
from apollia_nb.api.deps import API_PREFIX, acting, authorize, error_responses, json_route
from apollia_nb.api.hot import HotRoutes, hot_routes
from apollia_nb.api.deps import STORAGE_STATUSES as _STORAGE_STATUSES
from apollia_nb.api.deps import closing as _closing
from apollia_nb.api.deps import error_responses as _errors
from apollia_nb.api.deps import first as _first
from apollia_nb.api.deps import runtime_of as _runtime
from apollia_nb.api.deps import stream_errors as _stream_errors
from apollia_nb.api.deps import token_matches as _token_matches
from apollia_nb.api.idempotency import (
    KEY_HEADER,
    REPLAYED_HEADER,
    Effect,
    Found,
    Idempotency,
    effect_ref,
    key_taken,
)
from apollia_nb.dbutil import storage_error
from apollia_nb.errors import (
    ApolliaError,
    BadInput,
    Conflict,
    HostNotAllowed,
    MethodNotAllowed,
    NotFound,
    OriginNotAllowed,
    PayloadTooLarge,
    Unauthorized,
    UnknownAgent,
    UnknownRun,
    UnknownTask,
)
from apollia_nb.journal.pages import entry_page
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.manifest import parse_manifest
from apollia_nb.runtime.tasks import task_json
from apollia_nb.serverinfo import is_loopback
from apollia_nb.wire import schemas as s

__all__ = ["create_app", "API_PREFIX"]

_TERMINAL = ("completed", "failed", "cancelled")

_TASK_EVENTS = {"task": "Task"}
_EXCHANGE_EVENT_SCHEMAS = {name: model.__name__ for name, model in s.EXCHANGE_EVENTS.items()}


def _with_event_schemas(app: FastAPI) -> None:
    """Add the exchange events' models to the document's components (only event streams refer to them),
    and keep the event streams' descriptions within OpenAPI 3.1."""
    from pydantic.json_schema import models_json_schema

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = generate()
            _, defs = models_json_schema([(m, "serialization") for m in s.EXCHANGE_EVENTS.values()],
                                         ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in defs.get("$defs", {}).items():
                schemas.setdefault(name, schema)
            for item in doc["paths"].values():  # FastAPI adds 3.2's generic ``itemSchema`` to event streams
                for op in item.values():
                    for response in op.get("responses", {}).values():
                        response.get("content", {}).get("text/event-stream", {}).pop("itemSchema", None)
            from apollia_nb.api.roles import with_roles

            with_roles(doc, API_PREFIX)
        return app.openapi_schema  # type: ignore[return-value]  # set above

    app.openapi = openapi  # type: ignore[method-assign]


# --- the runtime and the token -------------------------------------------------------------------

# --- idempotency keys -----------------------------------------------------------------------------


async def _idempotency_for(request: Request) -> tuple[Idempotency, bytes] | None:
    """The keys of the app's runtime and the scope of the sender's keys, for a request from the owner or a
    person (else ``None``): the owner's keys are scoped by the server's token, a person's by their name, so a
    person's retry is answered once whatever token they hold after a rotation, and never by another's keys."""
    from fastapi.security.utils import get_authorization_scheme_param

    from apollia_nb.api.deps import identity_of

    scheme, value = get_authorization_scheme_param(request.headers.get("Authorization"))
    credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=value) if value else None
    if scheme.lower() != "bearer" or credentials is None:
        return None
    state = request.app.state
    if _token_matches(request, credentials):
        scope = state.token
    else:
        identity = await identity_of(request, credentials)
        if identity is None or not identity.roles:  # no role: the route refuses it, and replays nothing
            return None
        scope = b"person\0" + str(identity.name).encode("utf-8")
    records = state.runtime.records
    if getattr(state, "idempotency", None) is None or state.idempotency.records is not records:
        state.idempotency = Idempotency(records)
    return state.idempotency, scope


# --- errors ---------------------------------------------------------------------------------------


def _error_response(exc: ApolliaError, status: int | None = None,
                    headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if exc.code == Unauthorized.code:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(exc.to_dict(), status_code=status or exc.http_status, headers=headers or None)


def _validation_message(errors: Sequence[Any]) -> str:
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            parts.append(f"the body is not valid JSON: {detail} (at character {loc[-1] if loc else '?'})")
            continue
        where = ".".join(loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request is malformed"


def _http_error(status: int, detail: Any) -> ApolliaError:
    text = detail if isinstance(detail, str) else json.dumps(detail)
    if status == 404:
        return NotFound(f"no such route: {text}" if text and text != "Not Found" else "no such route")
    if status == 405:
        return MethodNotAllowed("this route does not take that method")
    if status == 413:
        return PayloadTooLarge(text)
    if status == 401:
        return Unauthorized(text)
    if status == 400:
        return BadInput(f"the body could not be read as JSON: {text}")
    if 400 <= status < 500:
        return BadInput(text)
    return ApolliaError(text)


def _allowed_methods(request: Request) -> list[str]:
    """Every method the API takes at this path, from its OpenAPI document."""
    from starlette.routing import compile_path

    table = getattr(request.app.state, "methods_by_path", None)
    if table is None:
        table = request.app.state.methods_by_path = [
            (compile_path(path)[0], sorted(m.upper() for m in item))
            for path, item in request.app.openapi()["paths"].items()
        ]
    return sorted({m for regex, methods in table if regex.match(request.url.path) for m in methods})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApolliaError)
    async def apollia_error(request: Request, exc: ApolliaError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(BadInput(_validation_message(exc.errors())), 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = _http_error(exc.status_code, exc.detail)
        status = 422 if exc.status_code == 400 else exc.status_code  # one status for malformed input
        kept = {}
        if exc.status_code == 405:
            kept["Allow"] = ", ".join(_allowed_methods(request))
        return _error_response(err, status if status >= 400 else None, kept)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        storage = storage_error(exc, "the request could not be carried out")  # e.g. a workspace on a full disk
        if storage is not None:
            return _error_response(storage)
        return _error_response(ApolliaError(f"internal error: {type(exc).__name__}"), 500)


# --- the body limit -------------------------------------------------------------------------------


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 ``PAYLOAD_TOO_LARGE``.

    A declared ``Content-Length`` over the limit is refused before the body is
    read; a streamed body is counted as it arrives, and the route's read fails
    with the same error once it passes the limit.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"the request body is over the limit of {self.limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await _error_response(PayloadTooLarge(message))(scope, receive, send)
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise StarletteHTTPException(413, message)
            return msg

        await self.app(scope, counted, send)


def split_host(value: str) -> str | None:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lowercased; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    elif value.count(":") > 1:  # an IPv6 address needs its brackets in a Host
        return None
    else:
        name, _, port = value.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name.rstrip(".")


def host_allowed(name: str, allowed: frozenset[str]) -> bool:
    """A loopback name (``localhost``, a loopback address), or an allowed one (``*`` allows any)."""
    return name in allowed or "*" in allowed or is_loopback(name)


class HostGuard:
    """Refuse a request whose ``Host`` or ``Origin`` this server does not answer to.

    ``Host``: a loopback name (``localhost``, ``127.0.0.1`` or any loopback
    address, ``[::1]``), with any port, or one of ``allowed_hosts`` (``*``: any
    host); else 421 ``HOST_NOT_ALLOWED``. A page that rebinds its own DNS name
    to 127.0.0.1 still sends its own name, so it is refused even with the token.
    ``Origin`` (sent by browsers): the server's own (``http(s)://`` + the
    request's ``Host``) or one of ``allowed_origins`` (``*``: any); else 403
    ``ORIGIN_NOT_ALLOWED``. No ``Origin`` is a client that is not a browser page.
    """

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str] = (), allowed_origins: Sequence[str] = ()) -> None:
        self.app = app
        self.hosts = frozenset(h.strip().lower().strip("[]").rstrip(".") for h in allowed_hosts)
        self.origins = frozenset(o.strip().lower().rstrip("/") for o in allowed_origins)

    def refusal(self, headers: dict[bytes, bytes]) -> ApolliaError | None:
        raw = headers.get(b"host", b"").decode("latin-1")
        name = split_host(raw)
        if name is None or not host_allowed(name, self.hosts):
            shown = raw[:100] or "(none)"
            return HostNotAllowed(f"this server does not answer to the host {shown!r}: use 127.0.0.1 or "
                                  "localhost, or start it with --allowed-host NAME")
        origin = headers.get(b"origin")
        if origin is None:
            return None
        seen = origin.decode("latin-1").strip().lower().rstrip("/")
        own = {f"http://{raw.strip().lower()}", f"https://{raw.strip().lower()}"}
        if seen in own or seen in self.origins or "*" in self.origins:
            return None
        return OriginNotAllowed(f"browser calls from the origin {seen[:100]!r} are not allowed: start the server "
                                "with --cors-origin ORIGIN to allow them")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        refusal = self.refusal(headers)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _error_response(refusal)(scope, receive, send)


# --- helpers over the runtime ---------------------------------------------------------------------


def _task_dict(rt: Any, task_id: str) -> dict[str, Any]:
    """The task's JSON: live for this process's tasks, else as last recorded in ``runtime.db``."""
    try:
        return rt.task(task_id).to_dict()
    except UnknownTask:
        record = rt.records.task(task_id)
        if record is None:
            raise
        return task_json(record)


def _live_task(rt: Any, task_id: str) -> None:
    """404 for a task nobody knows; 409 for one that finished in an earlier process (nothing to act on)."""
    _task_dict(rt, task_id)
    if rt.run_of(task_id) is None:  # one look-up, not a list of every task
        raise Conflict(f"task {task_id} has already finished")


def _all_tasks(rt: Any) -> list[dict[str, Any]]:
    live = {h.id: h.to_dict() for h in rt.tasks()}
    out = dict(live)
    for record in rt.records.tasks():
        if record["id"] not in out:
            out[record["id"]] = task_json(record)
    return sorted(out.values(), key=lambda t: (t["created_at"], t["id"]))


def _current_segment(events: list[dict[str, Any]]) -> int:
    """Where the exchange's current stretch starts: after the last pause it has been resumed from."""
    pauses = [i for i, e in enumerate(events) if e["type"] == "paused"]
    if pauses and pauses[-1] == len(events) - 1:
        pauses = pauses[:-1]  # paused now: the stretch that ended with this pause
    return pauses[-1] + 1 if pauses else 0


async def _exchange_events(exchange: Any, start: int, closing: anyio.Event) -> AsyncIterator[ServerSentEvent]:
    index = start
    while True:
        while index < len(exchange.events):
            event = exchange.events[index]
            index += 1
            yield ServerSentEvent(event=event["type"], data=event)
            if event["type"] in ("end", "paused"):
                return
        changed = exchange._changed  # replaced on every push; read with no await since the length check
        await _first(changed, closing)
        if closing.is_set():
            return


# --- routes ---------------------------------------------------------------------------------------

public = APIRouter()
router = APIRouter(dependencies=[Depends(authorize)], responses=error_responses(401, 422))


def _route(method: str, path: str, status: int = 200, **kw: Any) -> Any:
    """A JSON route of ``router`` (``deps.json_route``)."""
    return json_route(router, method, path, status, **kw)


# How a retry with the key of a request whose answer was not recorded (a crash, a 5xx) finds what it did:
# a change of state finds its target in the state the request leaves it in (else it is carried out again,
# which is what the first did, or is refused with the state's own code); a request that creates something
# names it before it is carried out (the reference recorded with the key) and finds it by that name.

def _in_state(read: Any, done: Any, status: int = 200) -> Effect:
    """An ``Effect`` whose ``find`` answers ``read(rt, path params)`` (a dict) when ``done(rt, it)`` holds."""
    async def find(request: Request, ref: dict[str, Any] | None) -> Found | None:
        rt = request.app.state.runtime
        try:
            it = read(rt, **request.path_params)
            return (status, it, None) if done(rt, it) else None
        except ApolliaError:
            return None

    return Effect(find=find)


def _named(prefix: str, name: str, read: Any, location: str) -> Effect:
    """An ``Effect`` that names what a request creates (``{name: prefix-<hex>}``) and finds it by that name
    (``read(rt, id)``; answered 201 with its ``Location`` under ``location``)."""
    async def find(request: Request, ref: dict[str, Any] | None) -> Found | None:
        given = (ref or {}).get(name)
        if not isinstance(given, str):
            return None
        try:
            it = read(request.app.state.runtime, given)
        except ApolliaError:
            return None
        return 201, it, f"{API_PREFIX}/{location}/{given}"

    return Effect(find=find, name=lambda: {name: f"{prefix}-{uuid.uuid4().hex[:12]}"})


def _plan_answered(rt: Any, run_id: str, approved: bool, key: str, value: str) -> bool:
    """The run's last ``plan`` entry of ``key`` ``value`` is an answer ``approved`` (the journal's)."""
    plans = [json.loads(bytes(e.payload)) for e in rt.journal.entries(run_id=run_id, kinds=["plan"])]
    plans = [p for p in plans if p.get(key) == value]
    return bool(plans) and plans[-1].get("approved") is approved



@public.get("/health", response_model=s.Health, operation_id="health", tags=["health"],
            summary="Liveness (no token needed)", responses=_errors())
async def health() -> dict[str, Any]:
    return {"status": "ok", "version": __version__}



# agents

@_route("GET", "/agents", response_model=list[s.Agent], operation_id="listAgents", tags=["agents"],
        summary="Registered agents and their states")
async def list_agents(rt: Any = Depends(_runtime)) -> list[dict[str, Any]]:
    return [a.to_dict() for a in rt.agents()]


async def _find_agent(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The agent a keyed registration registered, if it did: registered and not stopped, from this manifest."""
    rt = request.app.state.runtime
    try:
        text = (await request.json())["manifest"]
        name = parse_manifest(text).name
    except (ApolliaError, ValueError, KeyError, TypeError):
        return None
    row = next((r for r in rt.records.agents() if r["name"] == name), None)
    if row is None or row["manifest"] != text or row["state"] == "stopped":
        return None
    return 201, rt.agent(name).to_dict(), f"{API_PREFIX}/agents/{name}"


@_route("POST", "/agents", 201, response_model=s.Agent, operation_id="registerAgent", tags=["agents"],
        summary="Register an agent from its TOML manifest", responses=_errors(409, 413, 422),
        effect=Effect(find=_find_agent),
        description="Ends `active`, or `degraded` when optional tools do not resolve. A name already registered "
                    "is replaced when it is stopped or idle (no task pending, running or waiting for it, no chat "
                    "exchange in progress); while it is busy 409 `CONFLICT` naming its tasks and how to stop it. "
                    "A bad manifest is 422 `MANIFEST_INVALID` naming the key; a workspace "
                    "that contains the home or lies inside it 422 `WORKSPACE_OVERLAPS_HOME`.")
async def register_agent(response: Response, body: s.ManifestIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    agent = await rt.register_agent(body.manifest, keep_consents=body.keep_consents)
    response.headers["Location"] = f"{API_PREFIX}/agents/{agent.name}"
    return agent.to_dict()


@_route("GET", "/agents/{name}", response_model=s.Agent, operation_id="getAgent", tags=["agents"],
        summary="One agent", responses=_errors(404))
async def get_agent(name: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.agent(name).to_dict()


def _agent_dict(rt: Any, name: str) -> dict[str, Any]:
    """The agent's JSON; a stopped agent a restart did not load (it loads only those not stopped) as its
    row in runtime.db holds it (its declared tools; nothing of it runs)."""
    try:
        return rt.agent(name).to_dict()
    except UnknownAgent:
        row = next((r for r in rt.records.agents() if r["name"] == name and r["state"] == "stopped"), None)
        if row is None:
            raise
    manifest = parse_manifest(row["manifest"])
    return {"name": name, "description": manifest.description, "state": "stopped", "warnings": row["warnings"],
            "tools": [*manifest.tools_required, *manifest.tools_optional], "model": manifest.model.get("provider"),
            "workspace": str(row.get("workspace") or manifest.workspace_path()), "max_steps": manifest.max_steps,
            "inflight": 0}


@_route("POST", "/agents/{name}/start", records=True, effect=_in_state(
            lambda rt, name: rt.agent(name).to_dict(), lambda rt, a: a["state"] in ("active", "degraded")),
        response_model=s.Agent, operation_id="startAgent", tags=["agents"],
        summary="Restart a stopped agent", responses=_errors(404, 409))
async def start_agent(name: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return (await rt.start_agent(name)).to_dict()


@_route("POST", "/agents/{name}/stop", response_model=s.Agent,
        effect=_in_state(_agent_dict, lambda rt, a: a["state"] == "stopped"), operation_id="stopAgent", tags=["agents"],
        summary="Stop an agent", responses=_errors(404, 409),
        description="`stopping`, then drains its running work for up to `drain_timeout_secs` and cancels the "
                    "rest; answers once the agent is `stopped`. Suspended runs stay suspended.")
async def stop_agent(name: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return (await rt.stop_agent(name)).to_dict()


# tasks

def _submission(task: dict[str, Any]) -> Found:
    return 202, {k: task[k] for k in ("id", "run_id", "status", "warnings")}, f"{API_PREFIX}/tasks/{task['id']}"


async def _find_task(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The task a keyed submission named before it was recorded, if it was."""
    task_id = (ref or {}).get("task_id")
    if not isinstance(task_id, str):
        return None
    try:
        return _submission(_task_dict(request.app.state.runtime, task_id))
    except UnknownTask:
        return None


_TASK_EFFECT = Effect(find=_find_task, name=lambda: {"task_id": f"task-{uuid.uuid4().hex[:12]}"}, early=True)


@_route("POST", "/tasks", 202, response_model=s.Submission, operation_id="submitTask", tags=["tasks"],
        summary="Submit a task", responses=_errors(404, 409, 413, 422), effect=_TASK_EFFECT,
        description="Returns at once; the run continues in the background. `watched` defaults to false over the "
                    "API: the first call that would ask suspends the run (`waiting`) and lists the decision in "
                    "`GET /pending-decisions`. 409 `AGENT_UNAVAILABLE` when the agent is initializing, stopping "
                    "or stopped; a degraded agent accepts the task with a warning.")
async def submit_task(request: Request, response: Response, body: s.TaskIn,
                      rt: Any = Depends(_runtime)) -> dict[str, Any]:
    handle = await rt.submit(body.agent, body.goal, max_steps=body.max_steps, watched=body.watched,
                             grants=list(body.grants), approve_plan=body.approve_plan,
                             task_id=effect_ref(request, "task_id"),  # named before it is recorded: a retry finds it
                             after=key_taken(request))  # its row committed with its key, or after it; never without
    response.headers["Location"] = f"{API_PREFIX}/tasks/{handle.id}"
    return _submission(handle.to_dict())[1]


@_route("GET", "/tasks", storage=True, response_model=list[s.Task], operation_id="listTasks", tags=["tasks"],
        summary="Tasks, oldest first", responses=_errors(422))
async def list_tasks(
    agent: str | None = Query(None, max_length=200, description="only this agent's tasks"),
    status: s.TaskStatus | None = Query(None, description="only tasks with this status"),
    rt: Any = Depends(_runtime),
) -> list[dict[str, Any]]:
    tasks = _all_tasks(rt)
    return [t for t in tasks if (agent is None or t["agent"] == agent) and (status is None or t["status"] == status)]


@_route("GET", "/tasks/{task_id}", storage=True, response_model=s.Task, operation_id="getTask", tags=["tasks"],
        summary="One task", responses=_errors(404))
async def get_task(task_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return _task_dict(rt, task_id)


@_route("GET", "/tasks/{task_id}/wait", response_model=s.Task, operation_id="waitTask", tags=["tasks"],
        summary="Wait until a task settles (long poll)", responses=_errors(404, 422),
        description="Answers when the task is finished (`until=finished`), or also when it is waiting on a "
                    "person with nothing running (`until=settled`, the default: a run resumed by an answer is "
                    "not settled until it parks again or ends), or when `timeout` seconds pass — whichever "
                    "comes first; the task as it then stands.")
async def wait_task(
    request: Request, task_id: str,
    until: Literal["settled", "finished"] = Query("settled"),
    timeout: float = Query(25.0, ge=0, le=300, description="seconds to wait at most"),
    rt: Any = Depends(_runtime),
) -> dict[str, Any]:
    _task_dict(rt, task_id)
    if rt.run_of(task_id) is not None:  # a task of this process (one look-up, not a list of every task)
        handle = rt.task(task_id)
        with anyio.move_on_after(timeout):
            finished = handle.wait if until == "finished" else handle.settled
            done = anyio.Event()

            async def settle() -> None:
                await finished()
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(settle)
                await _first(done, _closing(request))
                tg.cancel_scope.cancel()
    return _task_dict(rt, task_id)


@_route("POST", "/tasks/{task_id}/cancel", records=True,
        effect=_in_state(lambda rt, task_id: _task_dict(rt, task_id), lambda rt, t: t["status"] == "cancelled"),
        response_model=s.Task, operation_id="cancelTask", tags=["tasks"],
        summary="Cancel a task", responses=_errors(404, 409),
        description="A running task is cancelled at once; a waiting one has its pending decisions refused. "
                    "409 when the task has already finished.")
async def cancel_task(task_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    _live_task(rt, task_id)
    return (await rt.cancel(task_id)).to_dict()


def _task_plan_answered(approved: bool) -> Effect:
    """A task's plan answered so (its last ``plan`` entry), and no longer awaiting an answer."""
    return _in_state(lambda rt, task_id: _task_dict(rt, task_id), lambda rt, t: not t["awaiting_plan_approval"]
                     and _plan_answered(rt, t["run_id"], approved, "task_id", t["id"]), 202)


@_route("POST", "/tasks/{task_id}/plan/approve", 202, response_model=s.Task, effect=_task_plan_answered(True), operation_id="approveTaskPlan",
        tags=["tasks"], summary="Approve (optionally edit) a task's plan", responses=_errors(404, 409, 413, 422),
        description="Only while the task is `waiting` with `awaiting_plan_approval`; the run continues.")
async def approve_task_plan(task_id: str, request: Request, body: s.PlanApprovalIn | None = Body(None),
                            rt: Any = Depends(_runtime)) -> dict[str, Any]:
    _live_task(rt, task_id)
    rt.approve_plan(task_id, list(body.steps) if body is not None and body.steps is not None else None,
                    by=acting(request, None), digest=body.digest if body is not None else None)
    return _task_dict(rt, task_id)


@_route("POST", "/tasks/{task_id}/plan/reject", 202, response_model=s.Task, effect=_task_plan_answered(False), operation_id="rejectTaskPlan",
        tags=["tasks"], summary="Reject a task's plan", responses=_errors(404, 409, 413, 422),
        description="The task fails with code `REJECTED` and the reason, without calling the agent again.")
async def reject_task_plan(task_id: str, body: s.PlanRejectionIn, request: Request,
                           rt: Any = Depends(_runtime)) -> dict[str, Any]:
    _live_task(rt, task_id)
    rt.reject_plan(task_id, body.reason, by=acting(request, None))
    return _task_dict(rt, task_id)


async def _existing_task(task_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return _task_dict(rt, task_id)


@router.get("/tasks/{task_id}/events", response_class=EventSourceResponse, operation_id="taskEvents",
            tags=["tasks"], summary="A task's changes (server-sent events)", responses=_stream_errors(404, events=_TASK_EVENTS),
            description="`event: task` with the task's JSON (as `GET /tasks/{id}`) now and on every change, "
                        "until the task is completed, failed or cancelled; then the stream ends. A task waiting "
                        "on a person keeps its stream open.")
async def task_events(request: Request, task_id: str, first: dict[str, Any] = Depends(_existing_task),
                      rt: Any = Depends(_runtime)) -> AsyncIterator[ServerSentEvent]:
    closing = _closing(request)
    changed = anyio.Event()

    def listener(kind: str, obj: Any) -> None:
        if kind == "task" and getattr(obj, "id", None) == task_id:
            changed.set()

    unsubscribe = rt.subscribe(listener)
    try:
        last: dict[str, Any] | None = None
        while True:
            changed = anyio.Event()  # a change after the read below sets this one
            data = _task_dict(rt, task_id)
            if data != last:
                yield ServerSentEvent(event="task", data=data)
                last = data
            if data["status"] in _TERMINAL:
                return
            await _first(changed, closing)
            if closing.is_set():
                return
    finally:
        unsubscribe()



# sessions

def _session(rt: Any, session_id: str) -> Any:
    return rt.sessions.get(session_id)


def _session_dict(rt: Any, session_id: str) -> dict[str, Any]:
    """The session's JSON; one a crash left ``processing`` (not loaded until resumed) as stored."""
    return rt.sessions.view(session_id)


def _session_in(*states: str) -> Effect:
    return _in_state(_session_dict, lambda rt, x: x["state"] in states)


def _session_plan_answered(approved: bool) -> Effect:
    """A session's plan answered so (its last ``plan`` entry), and none waiting."""
    return _in_state(_session_dict, lambda rt, x: x["pending_plan"] is None
                     and _plan_answered(rt, x["run_id"], approved, "session_id", x["id"]), 202 if approved else 200)


async def _find_injected(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The session, when its history holds the message a keyed inject named before adding it."""
    given = (ref or {}).get("message_id")
    try:
        session = _session_dict(request.app.state.runtime, request.path_params["session_id"])
    except ApolliaError:
        return None
    found = isinstance(given, str) and any(m.get("id") == given for m in session["history"])
    return (200, session, None) if found else None


@_route("POST", "/sessions", 201, records=True, response_model=s.Session, operation_id="openSession", tags=["sessions"],
        summary="Open a chat session", responses=_errors(404, 409, 413, 422),
        effect=_named("chat", "session_id", _session_dict, "sessions"))
async def open_session(request: Request, response: Response, body: s.SessionIn,
                       rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = rt.sessions.open(body.agent, plan_mode=body.plan_mode, session_id=effect_ref(request, "session_id"))
    response.headers["Location"] = f"{API_PREFIX}/sessions/{session.id}"
    return session.to_dict()


@_route("GET", "/sessions", response_model=list[s.Session], operation_id="listSessions", tags=["sessions"],
        summary="Chat sessions of this runtime")
async def list_sessions(rt: Any = Depends(_runtime)) -> list[dict[str, Any]]:
    return [x.to_dict() for x in rt.sessions.all()]


@_route("GET", "/sessions/{session_id}", response_model=s.Session, operation_id="getSession", tags=["sessions"],
        summary="One chat session, with its history", responses=_errors(404, 409))
async def get_session(session_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return _session(rt, session_id).to_dict()


async def _start_exchange(session_id: str, body: s.MessageIn, rt: Any = Depends(_runtime)) -> Any:
    return _session(rt, session_id).send(body.text)


_EXCHANGE_EVENTS = (
    "Events, each with its JSON as `data`: `text` (`{\"text\"}`, a piece of the reply), `tool_call_started` "
    "(`{\"name\"}`), `card` (`{\"card\"}`: a decision waiting for an answer; answer it with "
    "`POST /pending-decisions/decide`), `tool_result` (`{\"call_id\", \"tool\", \"status\", \"error_code\"}`), "
    "`plan` (`{\"steps\"}`, in plan-mode), then `paused` or `end` (`{\"status\", \"reply\", \"error\"}`), "
    "after which the stream ends."
)


@router.post("/sessions/{session_id}/messages", response_class=EventSourceResponse, operation_id="sendMessage",
             tags=["sessions"], summary="Send a message and stream the exchange (server-sent events)",
             responses=_stream_errors(404, 409, 413, 422, *_STORAGE_STATUSES, events=_EXCHANGE_EVENT_SCHEMAS),
             description="409 `SESSION_BUSY` while the session is processing, `SESSION_CLOSED` once closed. "
                         + _EXCHANGE_EVENTS)
async def send_message(request: Request, exchange: Any = Depends(_start_exchange)) -> AsyncIterator[ServerSentEvent]:
    async for event in _exchange_events(exchange, 0, _closing(request)):
        yield event



async def _existing_session(session_id: str, rt: Any = Depends(_runtime)) -> Any:
    return _session(rt, session_id)


@router.get("/sessions/{session_id}/events", response_class=EventSourceResponse, operation_id="sessionEvents",
            tags=["sessions"], summary="Follow the session's current exchange (server-sent events)",
            responses=_stream_errors(404, 409, events=_EXCHANGE_EVENT_SCHEMAS),
            description="The current exchange from its start (or from where it was last resumed), then live. "
                        "Ends at once when the session has no exchange. " + _EXCHANGE_EVENTS)
async def session_events(request: Request, session: Any = Depends(_existing_session)) -> AsyncIterator[ServerSentEvent]:
    exchange = session.exchange
    if exchange is None:
        return
    async for event in _exchange_events(exchange, _current_segment(exchange.events), _closing(request)):
        yield event



@_route("POST", "/sessions/{session_id}/pause", records=True, response_model=s.Session, operation_id="pauseSession",
        effect=_session_in("paused"),
        tags=["sessions"], summary="Pause at the next safe point", responses=_errors(404, 409))
async def pause_session(session_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = _session(rt, session_id)
    session.pause()
    return session.to_dict()


@_route("POST", "/sessions/{session_id}/inject", records=True, response_model=s.Session, operation_id="injectMessage",
        tags=["sessions"], summary="Add a user message (seen by the next turn)", responses=_errors(404, 409, 413, 422),
        effect=Effect(find=_find_injected, name=lambda: {"message_id": f"msg-{uuid.uuid4().hex[:12]}"}))
async def inject_message(request: Request, session_id: str, body: s.MessageIn,
                         rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = _session(rt, session_id)
    session.inject(body.text, message_id=effect_ref(request, "message_id"))
    return session.to_dict()


@_route("POST", "/sessions/{session_id}/resume", 202, records=True, effect=_session_in("active", "processing"),
        response_model=s.Session, operation_id="resumeSession",
        tags=["sessions"], summary="Resume a paused session", responses=_errors(404, 409),
        description="A paused exchange continues in the background (follow it with `GET /sessions/{id}/events`); "
                    "a session left `processing` by a crash comes back `active`.")
async def resume_session(session_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.sessions.resume(session_id).to_dict()


@_route("POST", "/sessions/{session_id}/fork", 201, records=True, response_model=s.Session, operation_id="forkSession",
        tags=["sessions"], summary="A new session with a copy of this one's history", responses=_errors(404, 409),
        effect=_named("chat", "fork_id", _session_dict, "sessions"))
async def fork_session(request: Request, response: Response, session_id: str,
                       rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = rt.sessions.fork(session_id, new_id=effect_ref(request, "fork_id"))
    response.headers["Location"] = f"{API_PREFIX}/sessions/{session.id}"
    return session.to_dict()


@_route("POST", "/sessions/{session_id}/close", records=True, response_model=s.Session, operation_id="closeSession",
        effect=_session_in("closed"),
        tags=["sessions"], summary="Close (cancels the exchange in flight; terminal)", responses=_errors(404, 409))
async def close_session(session_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = _session(rt, session_id)
    await session.close()
    return session.to_dict()


@_route("POST", "/sessions/{session_id}/plan/approve", 202, records=True, response_model=s.Session,
        effect=_session_plan_answered(True),
        operation_id="approveSessionPlan", tags=["sessions"], summary="Approve (optionally edit) the proposed plan",
        responses=_errors(404, 409, 413, 422),
        description="The plan runs as a new exchange in the background; follow it with `GET /sessions/{id}/events`.")
async def approve_session_plan(session_id: str, body: s.PlanApprovalIn | None = Body(None),
                               rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = _session(rt, session_id)
    session.approve_plan(list(body.steps) if body is not None and body.steps is not None else None,
                         digest=body.digest if body is not None else None)
    return session.to_dict()


@_route("POST", "/sessions/{session_id}/plan/reject", records=True, effect=_session_plan_answered(False),
        response_model=s.Session, operation_id="rejectSessionPlan",
        tags=["sessions"], summary="Reject the proposed plan", responses=_errors(404, 409, 413, 422))
async def reject_session_plan(session_id: str, body: s.PlanRejectionIn, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    session = _session(rt, session_id)
    session.reject_plan(body.reason)
    return session.to_dict()


# pending decisions

@_route("GET", "/pending-decisions", response_model=list[s.PendingDecision], operation_id="listPendingDecisions",
        tags=["pending decisions"], summary="Decisions waiting for a person, oldest first")
async def list_pending(rt: Any = Depends(_runtime)) -> list[dict[str, Any]]:
    return rt.pending_decisions()


async def _find_answer(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The decision as answered, when it holds the answer a keyed request gave (else it is answered again:
    an answer the journal holds already is stored, never journaled twice)."""
    rt = request.app.state.runtime
    try:
        body = await request.json()
        decision = rt.governance.get_pending(body["id"])
    except (ApolliaError, ValueError, KeyError, TypeError):
        return None
    answered = decision.to_dict()
    if answered.get("answer") != body.get("answer"):
        return None
    cards = rt.cards_of(decision.task_id) if decision.task_id else []
    card = next((c for c in cards if c.id == decision.id), None)
    return 200, {**answered, "hints": card.hints if card is not None else None}, None


@_route("POST", "/pending-decisions/decide", response_model=s.PendingDecision, operation_id="decide",
        tags=["pending decisions"], summary="Answer a waiting decision; its run resumes",
        responses=_errors(403, 404, 409, 413, 422), effect=Effect(find=_find_answer, early=True),
        description="Validated, journaled, then applied: `once`/`always` let the call run (`always` also records "
                    "the standing consent, or the allow rule for a simple command in developer mode), `refuse` "
                    "refuses it and fails its step. 422 `BAD_ANSWER` for an answer not on offer, 404 "
                    "`UNKNOWN_DECISION`, 409 `CONFLICT` when it was already answered, 409 `STALE_APPROVAL` when "
                    "`digest` is not the decision's, 403 `FORBIDDEN` when the policy's four eyes or approvers "
                    "keep this person from approving it (each refusal journaled `answer_refused`). An approval "
                    "is used once, for this call; with `expires_in`/`expires_at` the call is refused after it "
                    "ends. When the policy needs several approvers, an approval short of them is journaled "
                    "`approval` and the decision stays `pending`.")
async def decide(body: s.DecideIn, background: BackgroundTasks, request: Request,
                 rt: Any = Depends(_runtime)) -> dict[str, Any]:
    extra: dict[str, Any] = {"values": body.values} if body.values is not None else {}
    extra.update({k: v for k, v in (("digest", body.digest), ("expires_in", body.expires_in),
                                    ("expires_at", body.expires_at)) if v is not None})
    if body.lasting is not None:  # `always` for a while: the standing consent ends then
        extra["lasting"] = body.lasting
    # Committed (journaled and stored) when it returns; answers given meanwhile share the commits. Its
    # Idempotency-Key (if any) is committed before the answer is journaled, while the answer waits its turn.
    answered = await rt.answer_async(body.id, body.answer, by=acting(request, body.by), reason=body.reason,
                                     after=key_taken(request), **extra)
    faults.point("decide.after_commit")
    background.add_task(_after_decide_response)
    return answered


async def _after_decide_response() -> None:
    faults.point("decide.after_response")  # the 200 is sent; the resumed run has not run a step yet


# governance

@_route("GET", "/governance/rules", response_model=list[s.Rule], operation_id="listRules", tags=["governance"],
        summary="Fine rules, oldest first")
async def list_rules(rt: Any = Depends(_runtime)) -> list[dict[str, Any]]:
    return [r.to_dict() for r in rt.governance.rules()]


async def _find_rule(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The rule a keyed request added, if it is stored (else it is added again: the same rule, once)."""
    try:
        body = s.RuleIn.model_validate(await request.json())
    except ValueError:
        return None
    for rule in request.app.state.runtime.governance.rules():
        seen = rule.to_dict()
        if (seen["tool"], seen["effect"], seen["prefix"] or None, seen["agent"]) == (
                body.tool, body.effect, body.prefix or None, body.agent):
            return 201, seen, f"{API_PREFIX}/governance/rules/{seen['id']}"
    return None


@_route("POST", "/governance/rules", 201, response_model=s.Rule, operation_id="addRule", tags=["governance"],
        summary="Add a fine rule", responses=_errors(413, 422), effect=Effect(find=_find_rule),
        description="An identical rule already stored is returned as it is.")
async def add_rule(response: Response, body: s.RuleIn, request: Request,
                   rt: Any = Depends(_runtime)) -> dict[str, Any]:
    rule = rt.governance.add_rule(body.tool, body.effect, prefix=body.prefix, agent=body.agent,
                                  by=acting(request, body.by))
    response.headers["Location"] = f"{API_PREFIX}/governance/rules/{rule.id}"
    return rule.to_dict()


@_route("DELETE", "/governance/rules/{rule_id}", 204, operation_id="removeRule", tags=["governance"],
        summary="Remove a fine rule", responses=_errors(404), response_class=Response)
async def remove_rule(rule_id: str, request: Request, rt: Any = Depends(_runtime)) -> Response:
    rt.governance.remove_rule(rule_id, by=acting(request, None))
    return Response(status_code=204)


@_route("GET", "/governance/consents", response_model=list[s.Consent], operation_id="listConsents",
        tags=["governance"], summary="Standing consents (one agent, one family)")
async def list_consents(rt: Any = Depends(_runtime)) -> list[dict[str, Any]]:
    return [c.to_dict() for c in rt.governance.consents()]


@_route("DELETE", "/governance/consents/{agent}/{family}", 204, operation_id="revokeConsent", tags=["governance"],
        summary="Revoke a standing consent", responses=_errors(404, 422), response_class=Response)
async def revoke_consent(
    agent: Annotated[str, FastPath(pattern=r"^[a-z0-9_-]+$", max_length=200, description="an agent name")],
    family: Annotated[s.FamilyName, FastPath(description="a family of action")],
    request: Request,
    rt: Any = Depends(_runtime),
) -> Response:
    rt.governance.revoke_consent(agent, family, by=acting(request, None))
    return Response(status_code=204)


@_route("GET", "/governance/developer-mode", response_model=s.DeveloperMode, operation_id="getDeveloperMode",
        tags=["governance"], summary="Developer mode")
async def get_developer_mode(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.developer_mode_state().to_dict()


@_route("PUT", "/governance/developer-mode", response_model=s.DeveloperMode, operation_id="setDeveloperMode",
        tags=["governance"], summary="Turn developer mode on or off", responses=_errors(413, 422))
async def set_developer_mode(body: s.DeveloperModeIn, request: Request,
                             rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.set_developer_mode(body.enabled, by=acting(request, body.by)).to_dict()


@_route("GET", "/governance/policy", response_model=s.Policy, operation_id="getPolicy", tags=["governance"],
        summary="The organisation policy's state", description="`none`, `accepted` (with its refusals and the "
        "key that verified it) or `refused` (governance then fails closed).")
async def get_policy(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    return rt.governance.policy_state().to_dict()


# audit

@_route("GET", "/audit/verify", storage=True, response_model=s.VerifyReport, operation_id="verifyJournal", tags=["audit"],
        summary="Verify the whole journal", description="Chain, hashes, every signature, sequence continuity "
        "and the stored checkpoints. A journal that does not verify is still a 200 with `ok: false`. "
        "`witnesses`: the state of each `[[journal.witnesses]]` entry (its newest cosigned size, whether the "
        "newest checkpoint is still pending, the last error), null when the home names none.")
async def verify_journal(rt: Any = Depends(_runtime)) -> dict[str, Any]:
    report = await anyio.to_thread.run_sync(rt.verify)
    return {**report.to_dict(), "witnesses": rt.witness_status()}


@_route("POST", "/audit/replay/{run_id}", response_model=s.ReplayResult, operation_id="replayRun", tags=["audit"],
        idempotent=False,
        summary="Replay a run offline from its trace", responses=_errors(404),
        description="`identical`, `diverged` (every divergence) or `incomplete`. Calls no model and runs no tool. "
                    "404 `UNKNOWN_RUN` when the journal holds no entry of that run.")
async def replay_run(run_id: str, rt: Any = Depends(_runtime)) -> dict[str, Any]:
    if not rt.journal.entries(run_id=run_id, limit=1):
        raise UnknownRun(f"the journal holds no entry of run {run_id!r}")
    return rt.replay(run_id).to_dict()


@_route("GET", "/audit/entries", storage=True, response_model=s.EntriesPage, operation_id="listEntries", tags=["audit"],
        summary="Journal entries in sequence order, a page at a time", responses=_errors(422))
async def list_entries(
    since_seq: int | None = Query(None, ge=0, le=2**62, description="only entries with a greater seq"),
    limit: int = Query(100, ge=1, le=1000, description="at most this many"),
    run_id: str | None = Query(None, max_length=200, description="only this run's entries"),
    rt: Any = Depends(_runtime),
) -> dict[str, Any]:
    entries = entry_page(rt.journal, run_id=run_id, since_seq=since_seq, limit=limit)
    data = [e.to_dict() for e in entries]
    return {"entries": data, "next_since_seq": data[-1]["seq"] if len(data) == limit else None}


# --- the app --------------------------------------------------------------------------------------



def create_app(
    runtime: Any = None,
    *,
    token: str,
    home: Any = None,
    cors_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    max_body_bytes: int = 1_000_000,
    runtime_options: dict[str, Any] | None = None,
) -> FastAPI:
    """The REST API over ``runtime`` (opened on the server's loop), or over a runtime of ``home``.

    With ``runtime`` the caller owns it; without, the app's lifespan opens
    ``Runtime.open(home, **runtime_options)`` and closes it on shutdown.
    ``app.state.closing`` is set when the server begins to shut down, which
    ends every event stream. Requests are served for loopback hosts and
    ``allowed_hosts``, and from browser pages of the server's own origin and
    ``cors_origins`` (``HostGuard``).
    """
    from apollia_nb.api import internal as _internal  # lazy: internal.py imports this module's _errors, _runtime

    _internal.require_owner(runtime)
    if not isinstance(token, str) or not token:
        raise BadInput("the API needs a non-empty token")
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise BadInput("max_body_bytes must be a positive integer")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.closing = anyio.Event()
        owned = None
        if app.state.runtime is None:
            owned = app.state.runtime = await Runtime.open(home, **{"tool_sources": open_sources, **(runtime_options or {})})
            if owned.mode == "client":  # the home is served already: a home has one server
                await owned.aclose()
                _internal.require_owner(owned)
        try:
            yield
        finally:
            app.state.closing.set()
            if owned is not None:
                await owned.aclose()
                app.state.runtime = None

    app = FastAPI(
        title="apollia-nb",
        version=__version__,
        summary="Drive governed agents headless: agents, tasks, chat, pending decisions, governance, audit.",
        description=(
            "Every route but `/health` needs `Authorization: Bearer <token>`. This document "
            "(`/api/v1/openapi.json`) and its browsable form (`/api/v1/docs`) are served without a token too, "
            "so a client generator can fetch them: they describe the API and hold none of its data. Every error "
            "is `{\"code\", \"message\"}` with a stable code. Every POST that changes something takes an "
            f"`{KEY_HEADER}` header, which makes a retry after a timeout safe."
        ),
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.token = token.encode("utf-8")
    app.state.idempotency = None
    app.state.idempotency_for = _idempotency_for
    _install_error_handlers(app)
    _with_event_schemas(app)
    app.include_router(public, prefix=API_PREFIX)
    app.include_router(router, prefix=API_PREFIX)
    app.include_router(batches.router, prefix=API_PREFIX)
    app.include_router(_internal.router, prefix=API_PREFIX)
    app.include_router(hooks.router, prefix=API_PREFIX)
    app.include_router(people.router, prefix=API_PREFIX)
    if cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_credentials=False,
                           allow_methods=["GET", "POST", "PUT", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", KEY_HEADER],
                           expose_headers=["Location", REPLAYED_HEADER])
    app.add_middleware(HotRoutes, routes=hot_routes())  # inside the host and size rules (``api/hot.py``)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(HostGuard, allowed_hosts=tuple(allowed_hosts), allowed_origins=tuple(cors_origins))
    return app
