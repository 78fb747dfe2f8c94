"""One REST request of ``apollia-os serve``, described once and sent with retries: below every surface.

``Routes`` describes each route (method, path, body, the ``wire.schemas`` model its answer parses
into) and ``Session`` sends one, sending it again with the same ``Idempotency-Key`` where that is
safe (the SDK's module docstring tells when). The SDK's ``Client`` is a ``Session`` with a method
per route; a client runtime (``runtime/remote.py``) sends the same requests through a ``Session``.
An error answer raises the class of its code (``raise_for_error``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Self

import httpx
from pydantic import TypeAdapter

from apollia_nb.errors import ApolliaError, error_for_code
from apollia_nb.wire import schemas as s

__all__ = ["API_PREFIX", "KEY_HEADER", "Event", "Req", "Retry", "Routes", "SSEDecoder", "Session", "api_base",
           "client_token", "person_token", "post", "q", "raise_for_error", "stream_timeout"]

API_PREFIX = "/api/v1"
KEY_HEADER = "Idempotency-Key"
#: Codes of an answer that a retry may get past.
_TRANSIENT_CODES = frozenset({"STORAGE_ERROR", "STORAGE_FULL", "OUTCOME_UNKNOWN", "IDEMPOTENCY_IN_PROGRESS"})


@dataclass(frozen=True)
class Event:
    """One server-sent event: its name (``task``, ``text``, ``card``, ``end``, …) and its JSON data."""

    event: str
    data: Any
    id: str | None = None


class SSEDecoder:
    """The ``text/event-stream`` format, a line at a time (pure; comments such as pings are skipped)."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> Event | None:
        """Take one line (without its ending); returns an event at the blank line that ends it."""
        if line == "":
            if not self._data and self._event is None:
                return None
            text = "\n".join(self._data)
            data = json.loads(text) if text else None
            event = Event(self._event or "message", data, self._id)
            self._event, self._data = None, []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


@lru_cache(maxsize=None)
def _adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model)


def raise_for_error(status: int, body: bytes) -> None:
    """Raise the error class of a response's ``code`` (``ApolliaError`` for a body without one)."""
    if status < 400:
        return
    try:
        data = json.loads(body)
        code, message = data["code"], data["message"]
    except (ValueError, KeyError, TypeError):
        raise ApolliaError(f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}") from None
    raise error_for_code(str(code), str(message))


@dataclass(frozen=True)
class Req:
    method: str
    path: str
    body: Any = None
    params: dict[str, Any] | None = None
    model: Any = None  # None: no body expected
    sent: bool = False  # whether ``body`` is sent (an empty JSON body is still a body)
    keyed: bool = False  # sent with an Idempotency-Key: safe to send again

    @property
    def retryable(self) -> bool:
        return self.keyed or self.method in ("GET", "PUT")

    def kwargs(self, key: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.sent:
            out["json"] = self.body
        if self.params:
            out["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.keyed:
            out["headers"] = {KEY_HEADER: _sf_string(key if key is not None else str(uuid.uuid4()))}
        return out

    def parse(self, response: httpx.Response) -> Any:
        raise_for_error(response.status_code, response.content)
        if self.model is None:
            return None
        return _adapter(self.model).validate_python(response.json())


def post(path: str, body: Any = None, model: Any = None, *, sent: bool | None = None, keyed: bool = True) -> Req:
    return Req("POST", path, body, model=model, sent=body is not None if sent is None else sent, keyed=keyed)


def _sf_string(key: str) -> str:
    """A key as the header's structured-field string: in quotes, with ``"`` and ``\\`` escaped."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class Retry:
    """When to send a request again (pure: the answer or the failure in, seconds to wait or ``None`` out)."""

    retries: int = 3
    backoff: float = 0.25
    retry_for: float | None = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError("retries must be a non-negative integer")
        if not self.backoff >= 0:
            raise ValueError("backoff must be a non-negative number of seconds")
        if self.retry_for is not None and not self.retry_for >= 0:
            raise ValueError("retry_for must be a non-negative number of seconds, or None")

    def delay(self, req: Req, attempt: int, response: httpx.Response | None,
              elapsed: float = 0.0) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``; ``None``: keep this answer (or raise this failure).

        ``elapsed``: seconds since the first attempt; no retry starts after ``retry_for``."""
        if attempt >= self.retries or not req.retryable:
            return None
        if response is not None and not _transient(response):
            return None
        wait = self.backoff * 2 ** attempt
        if self.retry_for is not None and elapsed + wait > self.retry_for:
            return None
        return wait


def _transient(response: httpx.Response) -> bool:
    """An answer a retry may get past: a gateway's 502/503/504, or a stable code that says so."""
    status = response.status_code
    if status not in (409, 502, 503, 504, 507):
        return False
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        code = None
    return code in _TRANSIENT_CODES or (code is None and status != 409)


def q(value: str) -> str:
    """A path segment, percent-encoded."""
    from urllib.parse import quote

    return quote(value, safe="")


class Routes:
    """Each route, described once for both clients."""

    health = staticmethod(lambda: Req("GET", "/health", model=s.Health))
    agents = staticmethod(lambda: Req("GET", "/agents", model=list[s.Agent]))
    agent = staticmethod(lambda name: Req("GET", f"/agents/{q(name)}", model=s.Agent))
    register_agent = staticmethod(lambda manifest, keep_consents=None: post(
        "/agents", {"manifest": manifest, **({} if keep_consents is None else {"keep_consents": keep_consents})},
        s.Agent))
    start_agent = staticmethod(lambda name: post(f"/agents/{q(name)}/start", model=s.Agent))
    stop_agent = staticmethod(lambda name: post(f"/agents/{q(name)}/stop", model=s.Agent))

    @staticmethod
    def submit(agent: str, goal: str, watched: bool, max_steps: int | None, grants: Sequence[str],
               approve_plan: bool) -> Req:
        body: dict[str, Any] = {"agent": agent, "goal": goal, "watched": watched, "grants": list(grants),
                                "approve_plan": approve_plan}
        if max_steps is not None:
            body["max_steps"] = max_steps
        return post("/tasks", body, s.Submission)

    tasks = staticmethod(lambda agent, status: Req("GET", "/tasks", params={"agent": agent, "status": status},
                                                    model=list[s.Task]))
    task = staticmethod(lambda task_id: Req("GET", f"/tasks/{q(task_id)}", model=s.Task))
    wait = staticmethod(lambda task_id, until, timeout: Req(
        "GET", f"/tasks/{q(task_id)}/wait", params={"until": until, "timeout": timeout}, model=s.Task))
    cancel = staticmethod(lambda task_id: post(f"/tasks/{q(task_id)}/cancel", model=s.Task))
    approve_plan = staticmethod(lambda task_id, steps: post(
        f"/tasks/{q(task_id)}/plan/approve", {"steps": list(steps)} if steps is not None else None, s.Task))
    reject_plan = staticmethod(lambda task_id, reason: post(
        f"/tasks/{q(task_id)}/plan/reject", {"reason": reason}, s.Task))
    task_events = staticmethod(lambda task_id: Req("GET", f"/tasks/{q(task_id)}/events"))

    open_session = staticmethod(lambda agent, plan_mode: post(
        "/sessions", {"agent": agent, "plan_mode": plan_mode}, s.Session))
    sessions = staticmethod(lambda: Req("GET", "/sessions", model=list[s.Session]))
    session = staticmethod(lambda sid: Req("GET", f"/sessions/{q(sid)}", model=s.Session))
    send_message = staticmethod(lambda sid, text: post(f"/sessions/{q(sid)}/messages", {"text": text},
                                                        keyed=False))
    session_events = staticmethod(lambda sid: Req("GET", f"/sessions/{q(sid)}/events"))
    pause = staticmethod(lambda sid: post(f"/sessions/{q(sid)}/pause", model=s.Session))
    inject = staticmethod(lambda sid, text: post(f"/sessions/{q(sid)}/inject", {"text": text}, s.Session))
    resume = staticmethod(lambda sid: post(f"/sessions/{q(sid)}/resume", model=s.Session))
    fork = staticmethod(lambda sid: post(f"/sessions/{q(sid)}/fork", model=s.Session))
    close_session = staticmethod(lambda sid: post(f"/sessions/{q(sid)}/close", model=s.Session))
    approve_session_plan = staticmethod(lambda sid, steps: post(
        f"/sessions/{q(sid)}/plan/approve", {"steps": list(steps)} if steps is not None else None, s.Session))
    reject_session_plan = staticmethod(lambda sid, reason: post(
        f"/sessions/{q(sid)}/plan/reject", {"reason": reason}, s.Session))

    pending = staticmethod(lambda: Req("GET", "/pending-decisions", model=list[s.PendingDecision]))
    me = staticmethod(lambda: Req("GET", "/people/me", model=dict[str, Any]))

    @staticmethod
    def decide(decision_id: str, answer: str, reason: str | None, by: str | None,
               values: dict[str, Any] | None = None, lasting: str | None = None,
               terms: dict[str, Any] | None = None) -> Req:
        """``terms``: what binds the answer (``digest``, ``expires_in``, ``expires_at``), when given."""
        body: dict[str, Any] = {"id": decision_id, "answer": answer, **(terms or {})}
        if values is not None:
            body["values"] = values
        if lasting is not None:  # `always` for a while ("8h")
            body["for"] = lasting
        if reason is not None:
            body["reason"] = reason
        if by is not None:
            body["by"] = by
        return post("/pending-decisions/decide", body, s.PendingDecision)

    rules = staticmethod(lambda: Req("GET", "/governance/rules", model=list[s.Rule]))

    @staticmethod
    def add_rule(tool: str, effect: str, prefix: str | None, agent: str, by: str | None) -> Req:
        body: dict[str, Any] = {"tool": tool, "effect": effect, "agent": agent}
        if prefix is not None:
            body["prefix"] = prefix
        if by is not None:
            body["by"] = by
        return post("/governance/rules", body, s.Rule)

    remove_rule = staticmethod(lambda rule_id: Req("DELETE", f"/governance/rules/{q(rule_id)}"))
    consents = staticmethod(lambda: Req("GET", "/governance/consents", model=list[s.Consent]))
    revoke_consent = staticmethod(lambda agent, family: Req(
        "DELETE", f"/governance/consents/{q(agent)}/{q(family)}"))
    developer_mode = staticmethod(lambda: Req("GET", "/governance/developer-mode", model=s.DeveloperMode))
    set_developer_mode = staticmethod(lambda enabled, by: Req(
        "PUT", "/governance/developer-mode", {"enabled": enabled, **({"by": by} if by else {})},
        model=s.DeveloperMode, sent=True))
    policy = staticmethod(lambda: Req("GET", "/governance/policy", model=s.Policy))

    verify = staticmethod(lambda: Req("GET", "/audit/verify", model=s.VerifyReport))
    replay = staticmethod(lambda run_id: post(f"/audit/replay/{q(run_id)}", model=s.ReplayResult, keyed=False))
    entries = staticmethod(lambda since_seq, limit, run_id: Req(
        "GET", "/audit/entries", params={"since_seq": since_seq, "limit": limit, "run_id": run_id},
        model=s.EntriesPage))


def api_base(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base if base.endswith(API_PREFIX) else base + API_PREFIX


def stream_timeout(timeout: float | None) -> httpx.Timeout:
    # The server pings an idle stream every 15 s; a stream may stay quiet while a person thinks.
    return httpx.Timeout(timeout, read=None)


def client_token(advertised: str | None = None) -> str | None:
    """Who a client of a served home is, as the token it sends: ``$APOLLIA_TOKEN`` (a person's own), else
    ``$JUPYTERHUB_API_TOKEN`` (in a server, kernel or terminal a JupyterHub started: a home served with a
    hub asks the hub whose it is), else ``advertised`` (the owner's token in ``server.json``, which only the
    home's owner can read). The SDK, the CLI and a kernel's client runtime all send the one this gives."""
    import os

    return os.environ.get("APOLLIA_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN") or advertised or None


def person_token(token: str | None) -> str:
    """The token a client sends: ``token``, else what :func:`client_token` finds in the environment."""
    found = token or client_token()
    if not found:
        from apollia_nb.errors import BadInput

        raise BadInput("no token to send: pass one, set $APOLLIA_TOKEN, or use Client.from_home() on the "
                       "server's own machine")
    return found


class Session:
    """A connection to the server's REST API that sends described requests (``Routes``)."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float | None = 30.0,
                 transport: httpx.BaseTransport | None = None, retries: int = 3, backoff: float = 0.25,
                 retry_for: float | None = 60.0) -> None:
        token = person_token(token)
        self.base_url = api_base(base_url)
        self.timeout = timeout
        self._retry = Retry(retries, backoff, retry_for)
        self._http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def request(self, req: Req, idempotency_key: str | None = None) -> Any:
        """Send ``req`` (sent again where ``Retry`` allows) and parse its answer; an error answer raises its code's class."""
        kwargs = req.kwargs(idempotency_key)  # one key for every attempt
        attempt, started = 0, time.monotonic()
        while True:
            try:
                response = self._http.request(req.method, req.path, **kwargs)
            except httpx.TransportError:
                delay = self._retry.delay(req, attempt, None, time.monotonic() - started)
                if delay is None:
                    raise
            else:
                delay = self._retry.delay(req, attempt, response, time.monotonic() - started)
                if delay is None:
                    return req.parse(response)
            time.sleep(delay)
            attempt += 1

    def stream(self, req: Req) -> Iterator[Event]:
        """The server-sent events of ``req``, as they come."""
        with self._http.stream(req.method, req.path, timeout=stream_timeout(self.timeout), **req.kwargs()) as r:
            if r.status_code >= 400:
                raise_for_error(r.status_code, r.read())
            decoder = SSEDecoder()
            for line in r.iter_lines():
                event = decoder.feed(line)
                if event is not None:
                    yield event
