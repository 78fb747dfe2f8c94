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
a refusal (an error with a stable code: nothing was done) the same request may
be sent again with the same key and is then processed anew.

**A refusal means nothing happened; a success means it is durable.** A key is
taken in ``runtime.db`` (committed) before its request changes anything, by the
same ordered writer that records the tasks, agents and sessions, together with
the reference of what the request will create (the id a new task will have); a
success becomes that row's answer, committed before it is sent; a refusal
deletes the row. A submitted task and an answered decision do not wait for the
key's commit before they start: a task's row is queued behind the key (one
commit for both when they meet in the writer's group; refused when the key is
refused), and an answer waits for it only before it is journaled (while it
waits for the group of answers it joins), so a key that could not be taken
refuses the request, nothing done. A request that was carried out is never answered with a
refusal:

* its answer could not be recorded (the disk refused it) → the success is sent
  all the same (what it did is committed); this process keeps the answer, and
  a retry with the key gets it and records it;
* what it changed in runtime.db is not committed yet (the disk refused the
  rows; they are written once it takes them), or it was cut off by an internal
  error → 503 ``OUTCOME_UNKNOWN``: send it again with the same key, which
  answers with the first outcome once it is recorded;
* the server stopped (a crash, ``kill -9``) after the request took effect and
  before its answer was recorded → a retry with the key finds what it did (a
  task by the id its key holds, an agent by its manifest, a decision by its
  answer, a rule by its fields) and answers that, or, when it is not there,
  carries the request out under the same reference. Every writing route can
  look its effect up: a route that creates something names it before it is
  carried out (a task, a batch, a session or a fork by the id its key holds,
  an injected message by its id in the history), a change of state finds its
  target in the state it leaves it in (an agent started or stopped, a task or
  batch cancelled, a session paused, resumed or closed, a plan answered as
  its journal's ``plan`` entry says). A route that could not would answer
  such a retry 503 ``OUTCOME_UNKNOWN`` saying so, never 409 and never twice:
  look, then send it with a new key.

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
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException

from apollia_nb import faults
from apollia_nb.errors import (
    ApolliaError,
    BadInput,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    OutcomeUnknown,
)

__all__ = [
    "KEY_HEADER", "KEY_PATTERN", "REPLAYED_HEADER", "MAX_KEY_LENGTH", "RETENTION_SECONDS", "MAX_KEYS",
    "parse_key", "fingerprint", "scope_of", "Claim", "Effect", "effect_ref", "key_taken", "Idempotency",
    "IdempotentRoute",
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


@dataclass(frozen=True)
class Claim:
    """A key this request now holds (in flight until ``finish``, ``hold``, ``abandon`` or ``release``).

    ``ref`` names the request's effect before it is carried out (the id a new task will have), recorded
    with the key; ``left``: an earlier request with this key was carried out, or may have been, and its
    answer is not recorded; ``answer``: that request's ``(status, response, settled)`` when this process
    still holds it (``settled``: what it changed is committed); ``taken``: the commit of the key, when
    ``begin`` was asked not to wait for it (``early``)."""

    ref: dict[str, Any] | None = None
    left: bool = False
    answer: tuple[int, dict[str, Any], bool] | None = None
    taken: "Future[None] | None" = field(default=None, compare=False)


_UNREAD: dict[str, Any] = {}  # a left key's reference, not read from runtime.db yet


class Idempotency:
    """The keys in flight (this process) and the remembered ones (``runtime.db``).

    A key is taken durably before its request is processed (a row with status
    0 holding the reference of the request's effect, committed first), and that
    row becomes the answer once it succeeds; a refusal deletes it. A row still
    at status 0 is a *left* key: its request was carried out, or may have been,
    without its answer recorded (the server stopped, the disk refused the
    answer). A retry of a left key is handed to the route with the reference,
    so the route can look the effect up, answer it and complete the row, or
    carry the request out again under the same reference; an answer this
    process still holds is answered again from memory.

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
        self._left: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._held: dict[tuple[str, str], tuple[int, dict[str, Any], bool]] = {}
        for scope, key, fp, status, at in records.remembered_keys():
            self._known[(scope, key)] = (fp, at)
            if status == _TAKEN:
                self._left[(scope, key)] = _UNREAD
        self._expire()

    async def begin(self, scope: str, key: str, fp: str, ref: dict[str, Any] | None = None, *,
                    early: bool = False) -> tuple[int, dict[str, Any]] | Claim:
        """The remembered ``(status, response)`` to replay, or a ``Claim`` once the key is held (taken, committed).

        ``ref``: the reference of the effect a new request will have (recorded with the key). ``early``: the
        claim is returned as soon as the key is queued to be taken, with the commit as ``Claim.taken``, which
        the caller awaits before it changes anything (a refused commit is then its refusal)."""
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
            if slot in self._held or slot in self._left:
                left = self._left.get(slot)
                if left is _UNREAD:
                    remembered = self.records.remembered_response(scope, key)
                    left = (remembered[1].get("ref") if remembered is not None else None) or None
                    self._left[slot] = left
                self._inflight.add(slot)
                return Claim(ref=left, left=True, answer=self._held.get(slot))
            remembered = self.records.remembered_response(scope, key)
            if remembered is not None:
                return remembered
            del self._known[slot]  # forgotten meanwhile: a new request
        self._inflight.add(slot)
        try:
            taken = self.records.remember_response(scope, key, fp, _TAKEN, {"ref": ref} if ref else {},
                                                   self.clock(), new_row=True)
            if early:
                return Claim(ref=ref, taken=taken)
            with anyio.CancelScope(shield=True):  # taken before anything is done
                await asyncio.wrap_future(taken)
        except BaseException:  # not taken (a refused write leaves no row): nothing was done
            self._inflight.discard(slot)
            raise
        return Claim(ref=ref)

    async def finish(self, scope: str, key: str, fp: str, status: int, response: dict[str, Any]) -> bool:
        """Remember a success durably (committed when this returns ``True``), and release the key.

        When the disk refuses the answer (``False``) the key stays left and this process holds the
        answer: a retry with the key is answered from it, and records it then."""
        at = self.clock()
        slot = (scope, key)
        self._known[slot] = (fp, at)
        try:
            faults.point("idempotency.before_finish")
            answered = self.records.remember_response(scope, key, fp, status, response, at)
            with anyio.CancelScope(shield=True):  # a client that hangs up does not make the row unknown
                await asyncio.wrap_future(answered)
        except BaseException as exc:
            self._held[slot] = (status, response, True)
            self._left.setdefault(slot, None)
            self._inflight.discard(slot)
            if not isinstance(exc, Exception):
                raise
            return False
        self._inflight.discard(slot)
        self._held.pop(slot, None)
        self._left.pop(slot, None)
        self._expire()
        return True

    def hold(self, scope: str, key: str, fp: str, status: int, response: dict[str, Any],
             ref: dict[str, Any] | None = None) -> None:
        """The request was carried out, but what it changed is not committed yet: keep its answer here,
        unsettled, for a retry with the key to settle and answer."""
        slot = (scope, key)
        self._inflight.discard(slot)
        self._known[slot] = (fp, self.clock())
        self._held[slot] = (status, response, False)
        self._left.setdefault(slot, ref)

    def abandon(self, scope: str, key: str, fp: str, ref: dict[str, Any] | None = None) -> None:
        """The request was cut off: it may have taken effect, so its key stays taken (left, with ``ref``)."""
        slot = (scope, key)
        self._inflight.discard(slot)
        self._known[slot] = (fp, self.clock())
        if self._left.get(slot) is None:
            self._left[slot] = ref

    def release(self, scope: str, key: str) -> None:
        """The request was refused and nothing was done: nothing to remember, the key may be used again."""
        slot = (scope, key)
        self._inflight.discard(slot)
        self._known.pop(slot, None)
        self._left.pop(slot, None)
        self._held.pop(slot, None)
        self.records.forget_responses([slot])

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
                self._left.pop(slot, None)
                self._held.pop(slot, None)
            self.records.forget_responses(old)


#: Errors that mean the request was refused and nothing was done: a stable code (the runtime refuses
#: before it acts, and a write the disk refuses leaves nothing), or the request did not parse.
_NOTHING_DONE = (ApolliaError, RequestValidationError, StarletteHTTPException)

#: What a route's effect answers when it is found again: ``(status, JSON data, Location or None)``.
Found = tuple[int, Any, "str | None"]


@dataclass(frozen=True)
class Effect:
    """How a creating route's effect is named before it is carried out, and found again after.

    ``name()`` gives the reference recorded with the key before the request is
    carried out (the id the new thing will have); the route reads it with
    ``effect_ref(request)``. ``find(request, ref)`` answers the effect as it now
    stands, or ``None`` when it is not there. ``redo``: a request whose effect is
    not found is carried out again under the same reference (its effect is named
    by the reference, or the route is idempotent by itself); without it, a left
    key whose effect is not found is refused as unknown. ``early``: the route runs
    while its key is being taken, and awaits ``key_taken(request)`` itself before
    it changes anything, so the key's commit overlaps the route's own waiting (a
    decide's wait for the group of answers it joins); a key that could not be
    taken is then the route's refusal, nothing done.
    """

    find: Callable[[Request, dict[str, Any] | None], Awaitable[Found | None]] | None = None
    name: Callable[[], dict[str, Any]] | None = None
    redo: bool = True
    early: bool = False


def key_taken(request: Request) -> "Future[None] | None":
    """The commit of the request's key, still under way, for a route whose ``Effect`` is ``early``: the route
    waits for it (or hands it to what does: a write queued after it in ``runtime.db``, refused when it is)
    before it changes anything; ``None`` without a key."""
    return getattr(request.state, "key_taken", None)


def effect_ref(request: Request, name: str) -> Any:
    """The value ``name`` of the reference recorded with the request's key (``None`` without a key)."""
    ref = getattr(request.state, "effect_ref", None)
    return ref.get(name) if isinstance(ref, dict) else None


def _stored(response: Response) -> dict[str, Any]:
    headers = {k: v for k, v in response.headers.items() if k in _KEPT_HEADERS}
    return {"headers": headers, "body": bytes(response.body).decode("utf-8")}


def _replayed(status: int, stored: dict[str, Any]) -> Response:
    headers = {**stored["headers"], REPLAYED_HEADER: "true"}
    headers.pop("content-length", None)
    return Response(stored["body"].encode("utf-8"), status_code=status, headers=headers)


def _unknown(what: str) -> OutcomeUnknown:
    return OutcomeUnknown(f"{what}: send the request again with the same Idempotency-Key, which answers with "
                          "its outcome once it is recorded and never carries it out twice (without a key: "
                          "look before sending it again)")


class IdempotentRoute(APIRoute):
    """A route that honours ``Idempotency-Key``, and never refuses a request it carried out.

    ``await request.app.state.idempotency_for(request)`` gives ``(Idempotency, scope)``
    for a request from the owner or a person, or ``None`` (the route then runs as
    usual, and refuses the request itself). ``effect`` (an ``Effect``) lets a
    retry find what an unanswered request did; ``settle(request)`` is awaited
    after the route's work and before its answer (runtime.db's rows committed):
    when it fails the request is answered ``OUTCOME_UNKNOWN``, never as refused.
    Make a route class with both by ``IdempotentRoute.using(effect, settle)``.
    """

    effect: Effect | None = None
    settle: Callable[[Request], Awaitable[None]] | None = None

    @classmethod
    def using(cls, effect: Effect | None = None,
              settle: Callable[[Request], Awaitable[None]] | None = None) -> type["IdempotentRoute"]:
        return type(cls.__name__, (cls,), {"effect": effect, "settle": staticmethod(settle) if settle else None})

    async def _settled(self, request: Request) -> bool:
        """Whether what the route changed is committed (``settle``); ``False`` when that failed."""
        if self.settle is None:
            return True
        try:
            faults.point("route.before_settle")
            await self.settle(request)
        except Exception:
            return False
        return True

    async def _found(self, request: Request, ref: dict[str, Any] | None) -> Response | None:
        """The left request's effect, answered as the route answers it (``None``: not there)."""
        if self.effect is None or self.effect.find is None:
            return None
        found = await self.effect.find(request, ref)
        if found is None:
            return None
        status, data, location = found
        if self.response_model is not None:
            adapter: TypeAdapter[Any] = TypeAdapter(self.response_model)
            data = adapter.dump_python(adapter.validate_python(data), mode="json", by_alias=True)
        return JSONResponse(data, status_code=status, headers={"location": location} if location else None)

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def unkeyed(request: Request) -> Response:
            response = await handler(request)
            if 200 <= response.status_code < 300 and not await self._settled(request):
                raise _unknown("the request was carried out, but runtime.db has not recorded all of it yet")
            return response

        async def route(request: Request) -> Response:
            values = request.headers.getlist(KEY_HEADER)
            found = await request.app.state.idempotency_for(request) if values else None
            if found is None:  # no key, or no valid token (the route then refuses it)
                return await unkeyed(request)
            keys, token = found
            key = parse_key(values)
            scope = scope_of(token, request.method, request.url.path)
            fp = fingerprint(request.url.query, await request.body())
            effect = self.effect
            claim = await keys.begin(scope, key, fp, effect.name() if effect and effect.name else None,
                                     early=bool(effect and effect.early))
            if isinstance(claim, tuple):
                return _replayed(*claim)
            if claim.ref is not None:
                request.state.effect_ref = claim.ref
            if claim.taken is not None:
                request.state.key_taken = claim.taken
            response: Response | None = None
            settled = replayed = False
            if claim.answer is not None:  # carried out by this process; its answer not recorded yet
                status, stored, settled = claim.answer
                response, replayed = _replayed(status, stored), True
            elif claim.left:  # carried out before, or maybe: find what it did
                try:
                    response = await self._found(request, claim.ref)
                except BaseException:
                    keys.abandon(scope, key, fp, claim.ref)
                    raise
                if response is not None:
                    settled = replayed = True  # found in what is stored
                elif effect is None or not effect.redo:
                    keys.abandon(scope, key, fp, claim.ref)
                    raise OutcomeUnknown(
                        "the request first sent with this Idempotency-Key was being processed when the server "
                        "stopped (or was cut off), and this route cannot look up what it did, so whether it took "
                        "effect is unknown: look (GET the thing it changes) and, if it did not, send it again "
                        "with a new key; this key keeps answering OUTCOME_UNKNOWN, never a second effect")
            if response is None:
                try:
                    response = await handler(request)
                except OutcomeUnknown:
                    keys.abandon(scope, key, fp, claim.ref)
                    raise
                except _NOTHING_DONE:  # refused with a stable code, or before the route ran: the key is free
                    keys.release(scope, key)
                    raise
                except Exception as exc:  # cut off by an internal error: what it did is unknown
                    keys.abandon(scope, key, fp, claim.ref)
                    raise _unknown(f"the request was cut off by an internal error ({type(exc).__name__}), "
                                   "so whether it took effect is unknown") from exc
                except BaseException:  # cancelled
                    keys.abandon(scope, key, fp, claim.ref)
                    raise
            if not (200 <= response.status_code < 300 and hasattr(response, "body")):
                keys.release(scope, key)
                return response
            if claim.taken is not None:  # awaited by the route before its effect; here, for a route that did not
                try:
                    with anyio.CancelScope(shield=True):
                        await asyncio.wrap_future(claim.taken)
                except Exception as exc:
                    keys.abandon(scope, key, fp, claim.ref)
                    raise _unknown("the request was carried out, but its Idempotency-Key could not be recorded") from exc
            stored = claim.answer[1] if claim.answer is not None else _stored(response)
            status = response.status_code
            if not settled and not await self._settled(request):
                keys.hold(scope, key, fp, status, stored, claim.ref)
                raise _unknown("the request was carried out, but runtime.db has not recorded all of it yet")
            await keys.finish(scope, key, fp, status, stored)  # a refused answer is held, not an error
            return _replayed(status, stored) if replayed else response

        return route


# --- a governed call decided before a restart (``POST /internal/calls``) ---------------------------

#: The fields of a call's ``decision`` payload the server sets (the rest is the client's template).
_SERVER_FIELDS = frozenset({"call_id", "tool", "family", "connection", "outcome", "line", "answers", "reason"})


def journaled_calls(journal: Any, run_id: str) -> dict[str, int]:
    """``call_id → seq`` of every ``decision`` the journal holds for the run (one read of the run)."""
    found: dict[str, int] = {}
    for entry in journal.entries(run_id=run_id, kinds=["decision"]):
        try:
            call_id = json.loads(bytes(entry.payload)).get("call_id")
        except (ValueError, AttributeError):
            continue
        if isinstance(call_id, str):
            found.setdefault(call_id, entry.seq)
    return found


def journaled_call(journal: Any, seq: int, before: list[tuple[str, Any, str | None, str | None]],
                   call: dict[str, Any]) -> list[Any] | None:
    """The entries a call request committed as one group, read back from the journal: ``before``
    (``(kind, payload, run_id, agent)`` as the request sends them), its ``decision`` at ``seq``, then its
    ``tool_call`` (allowed) or refused ``tool_result`` (refused). ``None`` when what the journal holds there
    is not what this request would have committed (another request under the same call id)."""
    from apollia_nb.journal.entry import canonical_json

    first = seq - len(before)
    if first < 1:
        return None
    group = [e for e in journal.entries(since_seq=first - 1, limit=len(before) + 2)]
    if len(group) < len(before) + 1 or [e.seq for e in group[:len(before) + 1]] != list(range(first, seq + 1)):
        return None
    for (kind, payload, run_id, agent), entry in zip(before, group):
        if (entry.kind, bytes(entry.payload), entry.run_id, entry.agent) != (kind, canonical_json(payload),
                                                                              run_id, agent):
            return None
    decision = group[len(before)]
    stored = json.loads(bytes(decision.payload))
    asked = {**{k: v for k, v in call["decision"].items() if k not in _SERVER_FIELDS},
             "call_id": call["call_id"], "tool": call["tool"], "family": call["family"],
             "connection": call["connection"]}
    if any(stored.get(k) != v for k, v in asked.items()) or (decision.run_id, decision.agent) != (
            call["run_id"], call["agent"]):
        return None
    entries = group[:len(before) + 1]
    if stored.get("outcome") in ("allow", "refuse"):
        after = group[len(before) + 1] if len(group) > len(before) + 1 else None
        kind = "tool_call" if stored["outcome"] == "allow" else "tool_result"
        if after is None or after.kind != kind or json.loads(bytes(after.payload)).get("call_id") != call["call_id"]:
            return None
        entries.append(after)
    return entries
