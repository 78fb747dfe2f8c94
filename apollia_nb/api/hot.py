"""The hot routes answered without the framework's per-request machinery: a governed call of a home's client
(``POST /api/v1/internal/calls``) and another agent's hook (``POST /api/v1/hooks/{tool}``).

Every governed call of a kernel, a Dask worker or another agent is one of these requests, so what FastAPI
does around each (matching the path through every router, solving dependencies, running the middleware of
exceptions and exit stacks) is paid on every call. ``HotRoutes`` sits inside ``HostGuard`` and ``BodyLimit``
(so the host, origin and size rules apply unchanged) and answers a request of these routes itself, with the
very functions the routes use:

* the bearer token is read by the same ``HTTPBearer`` and checked by the route's own guard
  (``authorize_internal``: the server's token, a worker credential for its batch only, a person with the
  route's role; ``authorize`` for hooks), before anything is decided;
* the body is parsed as FastAPI parses it (``json.loads``, then the route's model) and the route's own
  endpoint answers (for a call: decided, journaled, the answer sent only after its commit);
* an error is answered by the app's own handler of its class (an unexpected one goes on to the app's
  last-resort handler, as from a route).

Anything the fast path does not take as it comes — another method, a body that is not ``application/json``,
JSON that does not parse, a body its model refuses — is handed, body and all, to the app, which answers it
as it always has (its 422 ``BAD_INPUT`` naming the field). A client that goes away before its body is whole
gets no answer and nothing is decided.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apollia_nb.api.deps import API_PREFIX, bearer
from apollia_nb.errors import ApolliaError

__all__ = ["HotRoute", "HotRoutes", "hot_routes"]


@dataclass(frozen=True)
class HotRoute:
    """One route the fast path answers: its FastAPI route (for the role and worker checks, which read its
    path), the guard its router depends on, the model of its body (None: the endpoint reads the body), and
    its endpoint called as ``endpoint(body or None, request, runtime, **path_params)``."""

    route: Any
    guard: Callable[[Request, Any], Awaitable[None]]
    model: Any
    call: Callable[..., Awaitable[Any]]
    params: dict[str, str]


def hot_routes() -> dict[str, HotRoute]:
    """The hot routes by their full path: the governed call, and the hook of each tool.

    Made with the app, which also imports here what their first request would (measured: 20 to 30 ms of
    a fresh server's first call went to importing the built-in tools' module)."""
    import apollia_nb.governance.code_places
    import apollia_nb.runtime.builtins
    import apollia_nb.runtime.outputs  # noqa: F401 - imported now, not at the first call
    from apollia_nb.api import hooks, internal
    from apollia_nb.api.deps import authorize
    from apollia_nb.api.worker_tokens import authorize_internal

    def route_of(router: Any, endpoint: Any) -> Any:
        return next(r for r in router.routes if getattr(r, "endpoint", None) is endpoint)

    out = {f"{API_PREFIX}/internal/calls": HotRoute(
        route_of(internal.router, internal.governed_call), authorize_internal, internal.CallIn,
        lambda body, request, rt: internal.governed_call(body, request, rt), {})}
    hook = route_of(hooks.router, hooks.answer_hook_route)
    for tool in ("claude-code", "codex", "cursor"):
        out[f"{API_PREFIX}/hooks/{tool}"] = HotRoute(
            hook, authorize, None,
            lambda body, request, rt, tool: hooks.answer_hook_route(tool, request, rt), {"tool": tool})
    return out


def _is_json(scope: Scope) -> bool:
    """The request says its body is ``application/json`` (parameters such as a charset allowed)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class HotRoutes:
    """ASGI middleware: answers the hot routes (``hot_routes``) itself; every other request goes to ``app``."""

    def __init__(self, app: ASGIApp, routes: dict[str, HotRoute] | None = None) -> None:
        self.app = app
        self.routes = routes if routes is not None else hot_routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if hot is None or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        try:
            raw = await _whole_body(receive)
        except StarletteHTTPException as exc:  # BodyLimit: over the limit as it arrived
            await self._answer_error(scope, receive, send, exc)
            return
        if raw is None:
            return  # the client went away before its body was whole: nothing was decided, nobody to answer
        body = None
        if hot.model is not None:
            try:
                body = hot.model.model_validate(json.loads(raw), from_attributes=True)
            except Exception:  # noqa: BLE001 - the app answers it as it always has (422 naming the field)
                await self.app(scope, _replay(raw, receive), send)
                return
        scope["route"] = hot.route  # what the role and worker checks read
        scope["path_params"] = dict(hot.params)
        request = Request(scope, _replay(raw, receive))
        try:
            await hot.guard(request, await bearer(request))
            response = await hot.call(body, request, request.app.state.runtime, **hot.params)
        except (ApolliaError, StarletteHTTPException) as exc:
            await self._answer_error(scope, receive, send, exc)
            return
        await response(scope, receive, send)

    async def _answer_error(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """``exc`` answered by the app's handler of its class, as the app answers it from a route."""
        handlers = scope["app"].exception_handlers
        handler = next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers and cls is not Exception),
                       None)
        if handler is None:
            raise exc
        response = await handler(Request(scope, receive), exc)
        await response(scope, receive, send)


async def _whole_body(receive: Receive) -> bytes | None:
    """The request's body, or None when the client disconnects before it is whole."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``raw`` as the whole body, then waits on the connection (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay
