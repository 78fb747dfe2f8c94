"""What the API's routers share: the token check, the runtime, the documented errors, JSON routes.

Each module of the API is a router (``APIRouter``) that ``create_app`` includes: ``app.py``
(the public routes), ``batches.py``, ``internal.py`` (the home's clients) and the worker
credentials of ``worker_tokens.py``. They take what they share from here, never from each other.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Header, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from apollia_nb.api.idempotency import (
    KEY_HEADER,
    KEY_PATTERN,
    REPLAYED_HEADER,
    Effect,
    IdempotentRoute,
)
from apollia_nb.errors import Forbidden, Unauthorized
from apollia_nb.wire import schemas as s

__all__ = [
    "API_PREFIX",
    "acting",
    "EVERY_ROUTE",
    "ITEM_SCHEMA",
    "STATUS_WORDS",
    "STORAGE_STATUSES",
    "TOKEN_REQUIRED",
    "authorize",
    "check_role",
    "identity_of",
    "bearer",
    "closing",
    "commit",
    "committed",
    "error_responses",
    "first",
    "idempotency_key",
    "json_route",
    "runtime_of",
    "stream_errors",
    "token_matches",
]

API_PREFIX = "/api/v1"

STATUS_WORDS = {
    401: "the bearer token is missing or wrong (`UNAUTHORIZED`)",
    403: "a browser's `Origin` is neither the server's own nor an allowed origin (`ORIGIN_NOT_ALLOWED`), or "
         "a person's token lacks the role the route needs (`FORBIDDEN`, naming the role)",
    421: "the `Host` is not a loopback name or an allowed host (`HOST_NOT_ALLOWED`)",
    404: "no such thing (`NOT_FOUND` or a specific `UNKNOWN_*` code)",
    409: "the thing is not in a state that allows this (`CONFLICT` or a specific code), or a request with "
         "this `Idempotency-Key` is still being processed (`IDEMPOTENCY_IN_PROGRESS`)",
    413: "the request body is over the server's limit (`PAYLOAD_TOO_LARGE`)",
    422: "the request is malformed (`BAD_INPUT`, or a specific code such as `MANIFEST_INVALID`, or "
         "`IDEMPOTENCY_KEY_REUSED` for an `Idempotency-Key` sent before with another body)",
    503: "the disk refused the write (`STORAGE_ERROR`: read-only, I/O error); nothing was recorded, retry later. "
         "Or `OUTCOME_UNKNOWN`: the request was carried out, or may have been, but not all of it is recorded; "
         "send it again with the same `Idempotency-Key` to get its outcome (it is never carried out twice)",
    507: "no space left on the home's disk (`STORAGE_FULL`); nothing was recorded, retry once space is freed",
}
#: Routes that write may meet a storage fault, and so may reads that wait for pending writes first
#: (the journal's, which copy its newest entries into journal.db; runtime.db's recorded tasks).
STORAGE_STATUSES = (503, 507)


EVERY_ROUTE = (403, 421)  # HostGuard answers before any route


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's documented error responses: ``statuses`` and those HostGuard gives every route."""
    return {code: {"model": s.Error, "description": STATUS_WORDS[code]} for code in (*statuses, *EVERY_ROUTE)}


#: Where an event stream's events are described. OpenAPI 3.1 has no keyword for the items of a
#: stream (3.2's ``itemSchema``), so the stream is a string and its events an extension.
ITEM_SCHEMA = "x-itemSchema"


def stream_errors(*statuses: int, events: dict[str, str]) -> dict[int | str, dict[str, Any]]:
    """An event-stream route's responses: its events (name → schema of the JSON ``data``), and JSON errors.

    Written out because a model here would take the route's media type.
    """
    items = [
        {"type": "object", "required": ["event", "data"], "properties": {
            "event": {"const": name},
            "data": {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"$ref": f"#/components/schemas/{schema}"}},
        }}
        for name, schema in events.items()
    ]
    names = ", ".join(f"`{name}` ({schema})" for name, schema in events.items())
    out: dict[int | str, dict[str, Any]] = {
        200: {"description": "a stream of server-sent events, each with JSON `data`",
              "content": {"text/event-stream": {
                  "schema": {"type": "string", "description": f"server-sent events: {names}"},
                  ITEM_SCHEMA: {"oneOf": items},
              }}},
    }
    error = {"schema": {"$ref": "#/components/schemas/Error"}}
    for code in (401, 422, *statuses, *EVERY_ROUTE):
        out[code] = {"description": STATUS_WORDS[code], "content": {"application/json": error}}
    return out


bearer = HTTPBearer(
    auto_error=False, scheme_name="bearerToken",
    description="The token `apollia-os serve` was started with (`--token`, `$APOLLIA_TOKEN`, or generated "
                "and written to `<home>/server.json`), a person's own token (`apollia-os people add`), or, on a "
                "home served with a JupyterHub (`--hub`), a hub user's token, which the hub vouches for (a hub "
                "that does not answer: 503 `HUB_UNREACHABLE` on any route). Not needed for `/api/v1/health`, "
                "`/api/v1/openapi.json` or `/api/v1/docs`.",
)


async def runtime_of(request: Request) -> Any:  # async: a plain def would run in a worker thread
    return request.app.state.runtime


def token_matches(request: Request, credentials: HTTPAuthorizationCredentials | None) -> bool:
    given = credentials.credentials.encode("utf-8", "surrogateescape") if credentials is not None else b""
    return credentials is not None and hmac.compare_digest(given, request.app.state.token)


#: What a 401 says: where the token is and how to send it (never the token, nor the home's path).
TOKEN_REQUIRED = (
    "a valid bearer token is required (Authorization: Bearer <token>); the token is the one "
    "`apollia-os serve` was started with (`--token`, else $APOLLIA_TOKEN, else generated): it is in "
    "`server.json` in the served home (\"token\", readable by its owner only), and "
    "`apollia-os serve --print-token` prints it when the server starts"
)


async def identity_of(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Any:
    """Who sends the request: the owner (the server's token), a person (their token, not revoked), or None.

    A person's token is looked up by its SHA-256 in ``governance.db`` on every request, so a revoked or
    rotated token stops working on the next one; a ``governance.db`` that cannot be read authenticates
    nobody but the owner. Any other token, on a home served with a JupyterHub (``app.state.hub``,
    :mod:`apollia_nb.api.hub`), is the hub user's who holds it, with the roles of the person of that name
    (none when there is no such person)."""
    from apollia_nb.errors import ApolliaError
    from apollia_nb.governance.people import OWNER, People

    if credentials is None:
        return None
    if token_matches(request, credentials):
        return OWNER
    rt = request.app.state.runtime
    store = getattr(rt, "governance", None)
    if store is None:
        return None
    try:
        person = await anyio.to_thread.run_sync(People(store).identify, credentials.credentials)
    except ApolliaError:
        return None
    hub = getattr(request.app.state, "hub", None)
    if person is not None or hub is None:
        return person
    user = await hub.identify(credentials.credentials)  # HUB_UNREACHABLE, or FORBIDDEN for a token not for us
    if user is None:
        return None
    try:  # the hub vouches for the name; the roles are the home's (none for a name that is no person here)
        return await anyio.to_thread.run_sync(People(store).by_name, user.name, "hub")
    except ApolliaError:
        return None


def check_role(request: Request, identity: Any) -> None:
    """403 ``FORBIDDEN`` naming the roles the request's route accepts, when ``identity`` holds none of them."""
    from apollia_nb.api.roles import roles_of, roles_text
    from apollia_nb.governance.acting import ACTING

    route = request.scope.get("route")
    template = getattr(route, "path", "").removeprefix(API_PREFIX)
    roles = roles_of(request.method, template)
    request.state.identity = identity
    ACTING.set((identity.name, identity.role, identity.via))
    if roles is not None and not any(identity.has(role) for role in roles):
        held = f"has {', '.join(sorted(identity.roles))}" if identity.roles else "has no role on this home"
        raise Forbidden(f"{request.method} {API_PREFIX}{template} needs the role {roles_text(roles)}; "
                        f"{identity.name} {held}")


def acting(request: Request, by: str | None, default: str = "api") -> str:
    """Who a change is journaled as: a person by their token is always themselves (a ``by`` in the body is
    ignored); the owner's token keeps the body's ``by`` (a client naming who acts through it), else ``default``."""
    identity = getattr(request.state, "identity", None)
    if identity is None or identity.via == "owner":
        return by or default
    return str(identity.name)


async def authorize(request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
    identity = await identity_of(request, credentials)
    if identity is None:
        raise Unauthorized(TOKEN_REQUIRED)
    check_role(request, identity)


async def idempotency_key(
    key: Annotated[str | None, Header(
        alias=KEY_HEADER, pattern=KEY_PATTERN,
        description="A unique string (a UUID) that makes a retry safe: the same key with the same body is "
                    f"answered with the first answer (`{REPLAYED_HEADER}: true`) and nothing is done twice. "
                    "Quoted (the IETF draft's structured string) or bare; remembered 24 hours, per route and "
                    "token. See the reference's section on retries.",
    )] = None,
) -> None:
    """Declares the header in the document; ``IdempotentRoute`` reads it."""


async def first(*events: anyio.Event) -> None:
    """Until any of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def closing(request: Request) -> anyio.Event:
    return request.app.state.closing


async def committed(request: Request) -> AsyncIterator[None]:
    """After a write route's work, before its answer is sent: wait until runtime.db holds what it wrote.

    Acknowledged means durable (a session opened, a message injected, a task cancelled): the
    answer is sent only once the rows are committed; a write that fails fails the request."""
    yield  # an error of the route itself goes on as it is
    await commit(request)


async def commit(request: Request) -> None:
    rt = request.app.state.runtime
    if rt is not None:
        await rt.committed()


def json_route(router: APIRouter, method: str, path: str, status: int = 200, *, storage: bool | None = None,
               records: bool = False, idempotent: bool | None = None, effect: Effect | None = None,
               **kw: Any) -> Any:
    """A JSON route of ``router`` (a decorator).

    ``storage`` (default: every method but GET) documents 503/507 storage faults; a POST (unless
    ``idempotent=False``) honours ``Idempotency-Key`` (``effect``: how a retry finds what a request
    whose answer was not recorded did). ``records``: the route changes rows of runtime.db without
    waiting for them (sessions, a cancel): it answers only once they are committed, and
    ``OUTCOME_UNKNOWN`` when they could not be (the change is made; its rows are written once the disk
    takes them). The other write routes commit what they change before they return (the journal,
    governance.db, a submitted task, an agent).
    """
    if storage if storage is not None else method != "GET":
        kw["responses"] = {**kw.get("responses", {}), **error_responses(*STORAGE_STATUSES)}
    extra: dict[str, Any] = {}
    if method == "POST" if idempotent is None else idempotent:
        extra["route_class_override"] = IdempotentRoute.using(effect, commit if records else None)
        kw["dependencies"] = [*kw.get("dependencies", ()), Depends(idempotency_key)]
        kw["responses"] = {**error_responses(409), **kw.get("responses", {})}
    elif records:
        kw["dependencies"] = [*kw.get("dependencies", ()), Depends(committed, scope="function")]

    def decorator(fn: Any) -> Any:
        router.add_api_route(path, fn, methods=[method], status_code=status, **kw, **extra)
        return fn

    return decorator
