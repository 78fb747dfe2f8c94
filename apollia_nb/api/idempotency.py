"""``Idempotency-Key`` on the REST API's writing routes (the IETF httpapi draft's header).

A client that sends a POST and hears nothing back (a timeout, a dropped
connection, a server killed mid-answer) cannot know whether it was taken.
With an ``Idempotency-Key`` it may simply send the same request again:

* **Same key, same body** → the first answer again, status, body and
  ``Location``, marked ``Idempotent-Replayed: true``. Nothing is done twice.
* **Same key, another body** → 422 ``IDEMPOTENCY_KEY_REUSED``.
* **Same key while the first request is still being processed** → 409
  ``IDEMPOTENCY_IN_PROGRESS``; retry a moment later.
* **A bad key** (empty, over 255 characters, not printable ASCII, or sent
  twice) → 422 ``BAD_INPUT``.

Keys are scoped per route (method and path, path parameters included) and per
token. A key is the draft's structured-field string (``"…"``, in quotes), or
the bare text; both name the same key. Only a success (2xx) is remembered: after
an error the same request may be sent again with the same key and is then
processed anew.

**Durability.** A key is taken in ``runtime.db`` (committed) before its
request is processed, by the same ordered writer that records the tasks,
agents and sessions; a success becomes that row's answer, committed before it
is sent; a failure deletes the row. So an answered request survives a
``kill -9`` and a restart: retried with the same key it gets the first answer,
not a second task. A request cut off by a crash while it was processed (its
key taken, its answer not yet written), or cut off by anything but an error
with a stable code, may or may not have taken effect: a retry of it is refused
with 409 ``CONFLICT`` saying so, rather than done a second time; look, then
send it with a new key.

**Retention.** A key is remembered for 24 hours and the newest 10,000 keys
are kept; older ones are forgotten, and a request with a forgotten key is a new
request.

The parsing and the fingerprint are pure functions; ``Idempotency`` holds the
keys in flight and the index of remembered ones; ``IdempotentRoute`` is the
FastAPI route class that applies them around a route.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from apollia_nb.errors import ApolliaError, BadInput, Conflict, IdempotencyInProgress, IdempotencyKeyReused

__all__ = [
    "KEY_HEADER", "KEY_PATTERN", "REPLAYED_HEADER", "MAX_KEY_LENGTH", "RETENTION_SECONDS", "MAX_KEYS",
    "parse_key", "fingerprint", "scope_of", "Idempotency", "IdempotentRoute",
]

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
RETENTION_SECONDS = 24 * 3600
MAX_KEYS = 10_000
_KEPT_HEADERS = ("content-type", "location")
_TAKEN = 0  # the status of a key whose request is being processed
#: The header's syntax: bare printable ASCII without spaces or quotes, or a quoted structured-field
#: string (``\"`` and ``\\`` escaped); 1 to 255 characters either way, once unquoted.
KEY_PATTERN = (r'^(?:[!#-~]{1,%d}|"(?:[ !#-\[\]-~]|\\["\\]){1,%d}")$' % (MAX_KEY_LENGTH, MAX_KEY_LENGTH))


# --- pure parts -----------------------------------------------------------------------------------


def parse_key(values: list[str]) -> str | None:
    """The key of a request's ``Idempotency-Key`` header values (``None`` without one); ``BadInput`` if bad."""
    if not values:
        return None
    if len(values) > 1:
        raise BadInput(f"send one {KEY_HEADER} header, not {len(values)}")
    raw = values[0].strip(" \t")
    if len(raw) >= 2 and raw.startswith('"') and raw.endswith('"'):
        key = _sf_string(raw)
    else:
        key = raw
        if any(not (0x21 <= ord(c) <= 0x7E) for c in key) or '"' in key:
            raise BadInput(f"{KEY_HEADER} must be printable ASCII without spaces or quotes "
                           "(or a quoted structured-field string)")
    if not key:
        raise BadInput(f"{KEY_HEADER} must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise BadInput(f"{KEY_HEADER} is {len(key)} characters, over the limit of {MAX_KEY_LENGTH}")
    return key


def _sf_string(raw: str) -> str:
    """A structured-field string (RFC 8941 §3.3.3): printable ASCII in quotes, ``\\"`` and ``\\\\`` escaped."""
    out: list[str] = []
    chars = iter(raw[1:-1])
    for c in chars:
        if not 0x20 <= ord(c) <= 0x7E or c == '"':
            raise BadInput(f"{KEY_HEADER} must be printable ASCII")
        if c == "\\":
            nxt = next(chars, "")
            if nxt not in ('"', "\\"):
                raise BadInput(f"{KEY_HEADER} has a bad escape: only \\\" and \\\\ are allowed")
            c = nxt
        out.append(c)
    return "".join(out)


def fingerprint(query: str, body: bytes) -> str:
    """What "the same request" means: the same query and the same body (JSON compared as data)."""
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode() if body else b""
    except ValueError:
        canonical = b"raw:" + body
    return hashlib.sha256(query.encode() + b"\0" + canonical).hexdigest()


def scope_of(token: bytes, method: str, path: str) -> str:
    """A key's scope: the token (hashed; never stored) and the route as called."""
    return hashlib.sha256(b"\0".join((token, method.upper().encode(), path.encode()))).hexdigest()


# --- the keys -------------------------------------------------------------------------------------


class Idempotency:
    """The keys in flight (this process) and the remembered ones (``runtime.db``).

    A key is taken durably before its request is processed (a row with status
    0, committed first), and that row becomes the answer once it succeeds; a
    failure deletes it. A row still at status 0 when the index is read was
    left by a server that stopped while processing it: its request may or may
    not have taken effect, so a retry is refused rather than done twice.

    The index of remembered keys is read once; a replayed answer is read from
    ``runtime.db`` when asked for. ``clock`` gives seconds (``time.time``).
    """

    def __init__(self, records: Any, *, clock: Callable[[], float] = time.time,
                 retention: float = RETENTION_SECONDS, max_keys: int = MAX_KEYS) -> None:
        self.records = records
        self.clock = clock
        self.retention = retention
        self.max_keys = max_keys
        self._inflight: set[tuple[str, str]] = set()
        self._known: dict[tuple[str, str], tuple[str, float]] = {}
        self._interrupted: set[tuple[str, str]] = set()
        for scope, key, fp, status, at in records.remembered_keys():
            self._known[(scope, key)] = (fp, at)
            if status == _TAKEN:
                self._interrupted.add((scope, key))
        self._expire()

    async def begin(self, scope: str, key: str, fp: str) -> tuple[int, dict[str, Any]] | None:
        """The remembered ``(status, response)`` to replay, or ``None`` once the key is taken (committed)."""
        self._expire()
        slot = (scope, key)
        if slot in self._inflight:
            raise IdempotencyInProgress("a request with this Idempotency-Key is still being processed: "
                                        "retry once it has been answered")
        known = self._known.get(slot)
        if known is not None:
            if known[0] != fp:
                raise IdempotencyKeyReused("this Idempotency-Key was used for a request with another body: "
                                           "use a new key for a new request")
            if slot in self._interrupted:
                raise Conflict("the request first sent with this Idempotency-Key was being processed when the "
                               "server stopped, so whether it took effect is unknown: look (for instance at "
                               "GET /tasks) before sending it again with a new key")
            remembered = self.records.remembered_response(scope, key)
            if remembered is not None:
                return remembered
            del self._known[slot]  # forgotten meanwhile: a new request
        self._inflight.add(slot)
        try:
            taken = self.records.remember_response(scope, key, fp, _TAKEN, {}, self.clock(), new_row=True)
            with anyio.CancelScope(shield=True):  # taken before anything is done
                await asyncio.wrap_future(taken)
        except BaseException:  # not taken (a refused write leaves no row): nothing was done
            self._inflight.discard(slot)
            raise
        return None

    async def finish(self, scope: str, key: str, fp: str, status: int, response: dict[str, Any]) -> None:
        """Remember a success durably (committed when this returns), and release the key."""
        at = self.clock()
        slot = (scope, key)
        self._known[slot] = (fp, at)
        try:
            answered = self.records.remember_response(scope, key, fp, status, response, at)
            with anyio.CancelScope(shield=True):  # a client that hangs up does not make the row unknown
                await asyncio.wrap_future(answered)
        except BaseException:
            # Done, but its answer is not recorded: the key stays taken, and a retry is refused as one
            # whose outcome is unknown, never done again.
            self._interrupted.add(slot)
            raise
        finally:
            self._inflight.discard(slot)
        self._expire()

    def abandon(self, scope: str, key: str, fp: str) -> None:
        """The request was cut off: it may have taken effect, so its key stays taken and a retry is refused."""
        slot = (scope, key)
        self._inflight.discard(slot)
        self._known[slot] = (fp, self.clock())
        self._interrupted.add(slot)

    def release(self, scope: str, key: str) -> None:
        """The request failed: nothing to remember, the key may be used again."""
        self._inflight.discard((scope, key))
        self.records.forget_responses([(scope, key)])

    def _expire(self) -> None:
        """Forget keys older than the retention, and the oldest beyond ``max_keys``.

        ``_known`` is in the order keys were remembered (oldest first), so this
        looks only at the keys it forgets.
        """
        horizon = self.clock() - self.retention
        old: list[tuple[str, str]] = []
        for slot, (_, at) in self._known.items():
            if at >= horizon and len(self._known) - len(old) <= self.max_keys:
                break
            old.append(slot)
        if old:
            for slot in old:
                del self._known[slot]
                self._interrupted.discard(slot)
            self.records.forget_responses(old)


#: Errors that mean the request was refused and nothing was done: a stable code (the runtime refuses
#: before it acts, and a write the disk refuses leaves nothing), or the request did not parse.
_NOTHING_DONE = (ApolliaError, RequestValidationError, StarletteHTTPException)


def _stored(response: Response) -> dict[str, Any]:
    headers = {k: v for k, v in response.headers.items() if k in _KEPT_HEADERS}
    return {"headers": headers, "body": bytes(response.body).decode("utf-8")}


def _replayed(status: int, stored: dict[str, Any]) -> Response:
    headers = {**stored["headers"], REPLAYED_HEADER: "true"}
    headers.pop("content-length", None)
    return Response(stored["body"].encode("utf-8"), status_code=status, headers=headers)


class IdempotentRoute(APIRoute):
    """A route that honours ``Idempotency-Key``.

    ``request.app.state.idempotency_for(request)`` gives ``(Idempotency, token)``
    for a request with a valid token, or ``None`` (the route then runs as
    usual, and refuses the request itself).
    """

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            values = request.headers.getlist(KEY_HEADER)
            if not values:
                return await handler(request)
            found = request.app.state.idempotency_for(request)
            if found is None:  # no valid token: the route refuses it
                return await handler(request)
            keys, token = found
            key = parse_key(values)
            scope = scope_of(token, request.method, request.url.path)
            fp = fingerprint(request.url.query, await request.body())
            remembered = await keys.begin(scope, key, fp)
            if remembered is not None:
                return _replayed(*remembered)
            try:
                response = await handler(request)
            except _NOTHING_DONE:  # refused with a stable code, or before the route ran: the key is free
                keys.release(scope, key)
                raise
            except BaseException:  # cut off (cancelled, an internal error): what it did is unknown
                keys.abandon(scope, key, fp)
                raise
            if 200 <= response.status_code < 300 and hasattr(response, "body"):
                await keys.finish(scope, key, fp, response.status_code, _stored(response))
            else:
                keys.release(scope, key)
            return response

        return route
