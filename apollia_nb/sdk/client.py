"""``Client`` (sync) and ``AsyncClient``: the REST API as Python calls, over httpx.

    from apollia_nb.sdk import Client

    with Client.from_home() as api:                 # reads <home>/server.json
        api.register_agent(Path("clerk.toml").read_text())
        sub = api.submit("clerk", "Tidy the notes")  # unattended by default
        task = api.wait(sub.id)                      # finished, or waiting on a person
        for decision in api.pending():
            api.decide(decision.id, "once")

Every method is one route. Each request is described once (a ``_Req``: method,
path, body, and the model its answer parses into) and sent by either client, so
the two cannot drift. Results are the frozen models of
:mod:`apollia_nb.wire.schemas`. An error response raises the class of its code:
``UNKNOWN_TASK`` raises ``errors.UnknownTask`` (see :mod:`apollia_nb.sdk.errors`);
failures to reach the server stay httpx's ``httpx.TransportError``.

**Retries are safe.** Every POST that changes something is sent with an
``Idempotency-Key`` (a fresh UUID per call, or the caller's
``idempotency_key=``), so the client sends it again, with the same key, when
the answer is lost: a connection error, a read timeout, or a 502/503/504 from
something between; when the server's disk refused a write (``STORAGE_FULL``,
``STORAGE_ERROR``: nothing was done); when the request was carried out but not
all of it is recorded yet (``OUTCOME_UNKNOWN``: the same key gets its outcome);
or ``IDEMPOTENCY_IN_PROGRESS`` while the first attempt is still being processed.
The server answers a repeat with the first answer and does nothing twice. Reads
(GET) and ``PUT`` are retried the same way; a DELETE and an event stream are not.
``retries`` (default 3) bounds the attempts after the first, with ``backoff``
seconds doubled each time (0.25, 0.5, 1), and ``retry_for`` (default 60) the
seconds from the first attempt after which no retry starts; when either is spent
the last error is raised (a retried request that keeps meeting
``OUTCOME_UNKNOWN`` raises ``errors.OutcomeUnknown``: send it again later with
the same ``idempotency_key=``).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from apollia_nb.errors import NotFound, ServerNotRunning
from apollia_nb.home import resolve_home
from apollia_nb.sdk import errors as _errors  # noqa: F401 - registers the HTTP-only codes with error_for_code
from apollia_nb.sdk.batches import Routes as _BatchRoutes
from apollia_nb.sdk.batches import batch_request
from apollia_nb.serverinfo import read_server_json
from apollia_nb.wire import schemas as s
from apollia_nb.wire.http import Event, Session, SSEDecoder, person_token, raise_for_error
from apollia_nb.wire.http import Req as _Req
from apollia_nb.wire.http import Retry as _Retry
from apollia_nb.wire.http import Routes as _Routes
from apollia_nb.wire.http import api_base as _base
from apollia_nb.wire.http import stream_timeout as _stream_timeout

__all__ = ["Client", "AsyncClient", "Event", "SSEDecoder", "raise_for_error", "server_info"]

Answer = Literal["once", "always", "refuse"]
Until = Literal["settled", "finished"]


def server_info(home: str | Path | None = None, *, running: bool = False) -> tuple[str, str]:
    """``(url, token)`` from ``<home>/server.json`` (``--home``, else ``$APOLLIA_HOME``, else ``~/.apollia``).

    ``running``: first check that the advertised process lives and accepts a connection
    (``SERVER_NOT_RUNNING`` when it does not: the file is stale)."""
    path = resolve_home(home) / "server.json"
    info = read_server_json(path)
    if info is None:
        raise NotFound(f"no server is advertised in {path}: start one with `apollia-os serve`")
    if running:
        _check_running(path, info.url, info.pid)
    return info.url, info.token


def _check_running(server_json: Path, url: str, pid: int) -> None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ServerNotRunning.advertised(server_json, url, pid, "has stopped") from None
    except PermissionError:  # another user's process: it exists
        pass
    try:
        httpx.get(_base(url) + "/health", timeout=3.0)
    except httpx.ConnectError:
        raise ServerNotRunning.advertised(server_json, url, pid, "does not answer: it refuses connections") \
            from None
    except httpx.HTTPError:
        pass  # it accepts connections: what it answers is for the calls to tell


def _settled(task: s.Task, until: Until) -> bool:
    return task.finished if until == "finished" else task.finished or task.status == "waiting"


class Client(Session):
    """The REST API, synchronously. ``with Client(url, token) as api: api.tasks()``.

    Without ``token``: ``$APOLLIA_TOKEN``, else ``$JUPYTERHUB_API_TOKEN`` (in a JupyterHub user's server,
    so a home served with that hub sees the hub user)."""

    @classmethod
    def from_home(cls, home: str | Path | None = None, **kwargs: Any) -> "Client":
        """A client of the server advertised in the home's ``server.json``; ``SERVER_NOT_RUNNING`` when
        that server has stopped (the file is stale)."""
        url, token = server_info(home, running=True)
        return cls(url, token, **kwargs)

    _do = Session.request  # the one way every method below sends its request
    _events = Session.stream

    # health and agents
    def health(self) -> s.Health:
        return self._do(_Routes.health())

    def agents(self) -> list[s.Agent]:
        return self._do(_Routes.agents())

    def agent(self, name: str) -> s.Agent:
        return self._do(_Routes.agent(name))

    def register_agent(self, manifest: str | Path, *, keep_consents: bool | None = None,
                       idempotency_key: str | None = None) -> s.Agent:
        """Register from a manifest's TOML text (or a path to it); ``keep_consents`` answers
        ``CONSENTS_TO_REVIEW`` (re-registering with changed tools, workspace or model)."""
        return self._do(_Routes.register_agent(_manifest_text(manifest), keep_consents), idempotency_key)

    def start_agent(self, name: str, *, idempotency_key: str | None = None) -> s.Agent:
        return self._do(_Routes.start_agent(name), idempotency_key)

    def stop_agent(self, name: str, *, idempotency_key: str | None = None) -> s.Agent:
        return self._do(_Routes.stop_agent(name), idempotency_key)

    # tasks
    def submit(self, agent: str, goal: str, watched: bool = False, *, max_steps: int | None = None,
               grants: Sequence[str] = (), approve_plan: bool = False,
               idempotency_key: str | None = None) -> s.Submission:
        return self._do(_Routes.submit(agent, goal, watched, max_steps, grants, approve_plan), idempotency_key)

    def tasks(self, *, agent: str | None = None, status: str | None = None) -> list[s.Task]:
        return self._do(_Routes.tasks(agent, status))

    def task(self, task_id: str) -> s.Task:
        return self._do(_Routes.task(task_id))

    def wait(self, task_id: str, *, until: Until = "settled", timeout: float | None = None) -> s.Task:
        """Until the task is finished (``until="finished"``) or also waiting on a person (``"settled"``).

        Returns the task as it stands when ``timeout`` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 25.0 if deadline is None else max(0.0, min(25.0, deadline - time.monotonic()))
            task = self._do(_Routes.wait(task_id, until, left))
            if _settled(task, until) or (deadline is not None and time.monotonic() >= deadline):
                return task

    def cancel(self, task_id: str, *, idempotency_key: str | None = None) -> s.Task:
        return self._do(_Routes.cancel(task_id), idempotency_key)

    def approve_plan(self, task_id: str, steps: Sequence[str] | None = None, *,
                     idempotency_key: str | None = None) -> s.Task:
        return self._do(_Routes.approve_plan(task_id, steps), idempotency_key)

    def reject_plan(self, task_id: str, reason: str, *, idempotency_key: str | None = None) -> s.Task:
        return self._do(_Routes.reject_plan(task_id, reason), idempotency_key)

    def task_events(self, task_id: str) -> Iterator[Event]:
        """``Event("task", {...})`` now and at every change, until the task finishes."""
        return self._events(_Routes.task_events(task_id))

    # batches (the routes: api/batches.py)
    def batch(self, agent: str, items: Any, goal: str, *, concurrency: int = 4, max_steps: int | None = None,
              key: str | None = None, idempotency_key: str | None = None) -> Any:
        """Run ``agent`` over ``items`` (a list of dicts, or a DataFrame); returns the batch at once."""
        return self._do(batch_request(agent, items, goal, concurrency, max_steps, key), idempotency_key)

    def batches(self) -> list[Any]:
        return self._do(_BatchRoutes.batches())

    def get_batch(self, batch_id: str) -> Any:
        return self._do(_BatchRoutes.batch(batch_id))

    def batch_results(self, batch_id: str) -> list[Any]:
        """One row per item (``BatchRow``), in item order, as the items stand now."""
        return self._do(_BatchRoutes.results(batch_id))

    def cancel_batch(self, batch_id: str, *, idempotency_key: str | None = None) -> Any:
        return self._do(_BatchRoutes.cancel(batch_id), idempotency_key)

    def batch_events(self, batch_id: str) -> Iterator[Event]:
        """``Event("batch", {...})`` now and whenever its counts change, until it is completed or cancelled."""
        return self._events(_BatchRoutes.events(batch_id))

    # sessions
    def open_session(self, agent: str, *, plan_mode: bool = False, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.open_session(agent, plan_mode), idempotency_key)

    def sessions(self) -> list[s.Session]:
        return self._do(_Routes.sessions())

    def session(self, session_id: str) -> s.Session:
        return self._do(_Routes.session(session_id))

    def send_message(self, session_id: str, text: str) -> Iterator[Event]:
        """Send a message; iterate the exchange's events until ``end`` (or ``paused``)."""
        return self._events(_Routes.send_message(session_id, text))

    def session_events(self, session_id: str) -> Iterator[Event]:
        return self._events(_Routes.session_events(session_id))

    def pause(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.pause(session_id), idempotency_key)

    def inject(self, session_id: str, text: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.inject(session_id, text), idempotency_key)

    def resume(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.resume(session_id), idempotency_key)

    def fork(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.fork(session_id), idempotency_key)

    def close_session(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.close_session(session_id), idempotency_key)

    def approve_session_plan(self, session_id: str, steps: Sequence[str] | None = None, *,
                             idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.approve_session_plan(session_id, steps), idempotency_key)

    def reject_session_plan(self, session_id: str, reason: str, *, idempotency_key: str | None = None) -> s.Session:
        return self._do(_Routes.reject_session_plan(session_id, reason), idempotency_key)

    # pending decisions
    def pending(self) -> list[s.PendingDecision]:
        return self._do(_Routes.pending())

    def decide(self, decision_id: str, answer: Answer, reason: str | None = None, *,
               by: str | None = None, values: dict[str, Any] | None = None,
               idempotency_key: str | None = None, lasting: str | None = None, digest: str | None = None,
               expires_in: float | None = None, expires_at: str | None = None) -> s.PendingDecision:
        """Answer a waiting decision; ``lasting`` ("8h"): how long the standing consent of ``always`` lasts;
        ``digest``: the decision's as shown (another is ``STALE_APPROVAL``); ``expires_in``/``expires_at``:
        when the approval ends."""
        return self._do(_Routes.decide(decision_id, answer, reason, by, values, lasting,
                                       _terms(digest, expires_in, expires_at)), idempotency_key)

    # governance
    def rules(self) -> list[s.Rule]:
        return self._do(_Routes.rules())

    def add_rule(self, tool: str, effect: Literal["allow", "deny"], *, prefix: str | None = None,
                 agent: str = "*", by: str | None = None, idempotency_key: str | None = None) -> s.Rule:
        return self._do(_Routes.add_rule(tool, effect, prefix, agent, by), idempotency_key)

    def remove_rule(self, rule_id: str) -> None:
        self._do(_Routes.remove_rule(rule_id))

    def consents(self) -> list[s.Consent]:
        return self._do(_Routes.consents())

    def revoke_consent(self, agent: str, family: str) -> None:
        self._do(_Routes.revoke_consent(agent, family))

    def developer_mode(self) -> s.DeveloperMode:
        return self._do(_Routes.developer_mode())

    def set_developer_mode(self, enabled: bool, *, by: str | None = None) -> s.DeveloperMode:
        return self._do(_Routes.set_developer_mode(enabled, by))

    def policy(self) -> s.Policy:
        return self._do(_Routes.policy())

    # audit
    def verify(self) -> s.VerifyReport:
        return self._do(_Routes.verify())

    def replay(self, run_id: str) -> s.ReplayResult:
        return self._do(_Routes.replay(run_id))

    def entries(self, *, since_seq: int | None = None, limit: int | None = None,
                run_id: str | None = None) -> s.EntriesPage:
        return self._do(_Routes.entries(since_seq, limit, run_id))

    def iter_entries(self, *, since_seq: int | None = None, run_id: str | None = None,
                     page: int = 500) -> Iterator[s.JournalEntry]:
        """Every entry after ``since_seq``, a page at a time."""
        while True:
            result = self.entries(since_seq=since_seq, limit=page, run_id=run_id)
            yield from result.entries
            if result.next_since_seq is None:
                return
            since_seq = result.next_since_seq


class AsyncClient:
    """The REST API for asyncio code: the same methods as ``Client``, awaited; events with ``async for``."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float | None = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None, retries: int = 3, backoff: float = 0.25,
                 retry_for: float | None = 60.0) -> None:
        token = person_token(token)
        self.base_url = _base(base_url)
        self.timeout = timeout
        self._retry = _Retry(retries, backoff, retry_for)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"},
                                       timeout=timeout, transport=transport)

    @classmethod
    def from_home(cls, home: str | Path | None = None, **kwargs: Any) -> "AsyncClient":
        """As ``Client.from_home``."""
        url, token = server_info(home, running=True)
        return cls(url, token, **kwargs)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _do(self, req: _Req, idempotency_key: str | None = None) -> Any:
        import asyncio

        kwargs = req.kwargs(idempotency_key)  # one key for every attempt
        attempt, started = 0, time.monotonic()
        while True:
            try:
                response = await self._http.request(req.method, req.path, **kwargs)
            except httpx.TransportError:
                delay = self._retry.delay(req, attempt, None, time.monotonic() - started)
                if delay is None:
                    raise
            else:
                delay = self._retry.delay(req, attempt, response, time.monotonic() - started)
                if delay is None:
                    return req.parse(response)
            await asyncio.sleep(delay)
            attempt += 1

    async def _events(self, req: _Req) -> AsyncIterator[Event]:
        async with self._http.stream(req.method, req.path, timeout=_stream_timeout(self.timeout),
                                     **req.kwargs()) as r:
            if r.status_code >= 400:
                raise_for_error(r.status_code, await r.aread())
            decoder = SSEDecoder()
            async for line in r.aiter_lines():
                event = decoder.feed(line)
                if event is not None:
                    yield event

    async def health(self) -> s.Health:
        return await self._do(_Routes.health())

    async def agents(self) -> list[s.Agent]:
        return await self._do(_Routes.agents())

    async def agent(self, name: str) -> s.Agent:
        return await self._do(_Routes.agent(name))

    async def register_agent(self, manifest: str | Path, *, keep_consents: bool | None = None,
                             idempotency_key: str | None = None) -> s.Agent:
        return await self._do(_Routes.register_agent(_manifest_text(manifest), keep_consents), idempotency_key)

    async def start_agent(self, name: str, *, idempotency_key: str | None = None) -> s.Agent:
        return await self._do(_Routes.start_agent(name), idempotency_key)

    async def stop_agent(self, name: str, *, idempotency_key: str | None = None) -> s.Agent:
        return await self._do(_Routes.stop_agent(name), idempotency_key)

    async def submit(self, agent: str, goal: str, watched: bool = False, *, max_steps: int | None = None,
                     grants: Sequence[str] = (), approve_plan: bool = False,
                     idempotency_key: str | None = None) -> s.Submission:
        return await self._do(_Routes.submit(agent, goal, watched, max_steps, grants, approve_plan), idempotency_key)

    async def tasks(self, *, agent: str | None = None, status: str | None = None) -> list[s.Task]:
        return await self._do(_Routes.tasks(agent, status))

    async def task(self, task_id: str) -> s.Task:
        return await self._do(_Routes.task(task_id))

    async def wait(self, task_id: str, *, until: Until = "settled", timeout: float | None = None) -> s.Task:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 25.0 if deadline is None else max(0.0, min(25.0, deadline - time.monotonic()))
            task = await self._do(_Routes.wait(task_id, until, left))
            if _settled(task, until) or (deadline is not None and time.monotonic() >= deadline):
                return task

    async def cancel(self, task_id: str, *, idempotency_key: str | None = None) -> s.Task:
        return await self._do(_Routes.cancel(task_id), idempotency_key)

    async def approve_plan(self, task_id: str, steps: Sequence[str] | None = None, *,
                           idempotency_key: str | None = None) -> s.Task:
        return await self._do(_Routes.approve_plan(task_id, steps), idempotency_key)

    async def reject_plan(self, task_id: str, reason: str, *, idempotency_key: str | None = None) -> s.Task:
        return await self._do(_Routes.reject_plan(task_id, reason), idempotency_key)

    def task_events(self, task_id: str) -> AsyncIterator[Event]:
        return self._events(_Routes.task_events(task_id))

    # batches (the routes: api/batches.py)
    async def batch(self, agent: str, items: Any, goal: str, *, concurrency: int = 4, max_steps: int | None = None,
                    key: str | None = None, idempotency_key: str | None = None) -> Any:
        return await self._do(batch_request(agent, items, goal, concurrency, max_steps, key), idempotency_key)

    async def batches(self) -> list[Any]:
        return await self._do(_BatchRoutes.batches())

    async def get_batch(self, batch_id: str) -> Any:
        return await self._do(_BatchRoutes.batch(batch_id))

    async def batch_results(self, batch_id: str) -> list[Any]:
        return await self._do(_BatchRoutes.results(batch_id))

    async def cancel_batch(self, batch_id: str, *, idempotency_key: str | None = None) -> Any:
        return await self._do(_BatchRoutes.cancel(batch_id), idempotency_key)

    def batch_events(self, batch_id: str) -> AsyncIterator[Event]:
        return self._events(_BatchRoutes.events(batch_id))

    async def open_session(self, agent: str, *, plan_mode: bool = False,
                           idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.open_session(agent, plan_mode), idempotency_key)

    async def sessions(self) -> list[s.Session]:
        return await self._do(_Routes.sessions())

    async def session(self, session_id: str) -> s.Session:
        return await self._do(_Routes.session(session_id))

    def send_message(self, session_id: str, text: str) -> AsyncIterator[Event]:
        return self._events(_Routes.send_message(session_id, text))

    def session_events(self, session_id: str) -> AsyncIterator[Event]:
        return self._events(_Routes.session_events(session_id))

    async def pause(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.pause(session_id), idempotency_key)

    async def inject(self, session_id: str, text: str, *, idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.inject(session_id, text), idempotency_key)

    async def resume(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.resume(session_id), idempotency_key)

    async def fork(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.fork(session_id), idempotency_key)

    async def close_session(self, session_id: str, *, idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.close_session(session_id), idempotency_key)

    async def approve_session_plan(self, session_id: str, steps: Sequence[str] | None = None, *,
                                   idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.approve_session_plan(session_id, steps), idempotency_key)

    async def reject_session_plan(self, session_id: str, reason: str, *,
                                  idempotency_key: str | None = None) -> s.Session:
        return await self._do(_Routes.reject_session_plan(session_id, reason), idempotency_key)

    async def pending(self) -> list[s.PendingDecision]:
        return await self._do(_Routes.pending())

    async def decide(self, decision_id: str, answer: Answer, reason: str | None = None, *,
                     by: str | None = None, values: dict[str, Any] | None = None,
                     idempotency_key: str | None = None, lasting: str | None = None, digest: str | None = None,
                     expires_in: float | None = None, expires_at: str | None = None) -> s.PendingDecision:
        """Answer a waiting decision (as ``Client.decide``)."""
        return await self._do(_Routes.decide(decision_id, answer, reason, by, values, lasting,
                                             _terms(digest, expires_in, expires_at)), idempotency_key)

    async def rules(self) -> list[s.Rule]:
        return await self._do(_Routes.rules())

    async def add_rule(self, tool: str, effect: Literal["allow", "deny"], *, prefix: str | None = None,
                       agent: str = "*", by: str | None = None, idempotency_key: str | None = None) -> s.Rule:
        return await self._do(_Routes.add_rule(tool, effect, prefix, agent, by), idempotency_key)

    async def remove_rule(self, rule_id: str) -> None:
        await self._do(_Routes.remove_rule(rule_id))

    async def consents(self) -> list[s.Consent]:
        return await self._do(_Routes.consents())

    async def revoke_consent(self, agent: str, family: str) -> None:
        await self._do(_Routes.revoke_consent(agent, family))

    async def developer_mode(self) -> s.DeveloperMode:
        return await self._do(_Routes.developer_mode())

    async def set_developer_mode(self, enabled: bool, *, by: str | None = None) -> s.DeveloperMode:
        return await self._do(_Routes.set_developer_mode(enabled, by))

    async def policy(self) -> s.Policy:
        return await self._do(_Routes.policy())

    async def verify(self) -> s.VerifyReport:
        return await self._do(_Routes.verify())

    async def replay(self, run_id: str) -> s.ReplayResult:
        return await self._do(_Routes.replay(run_id))

    async def entries(self, *, since_seq: int | None = None, limit: int | None = None,
                      run_id: str | None = None) -> s.EntriesPage:
        return await self._do(_Routes.entries(since_seq, limit, run_id))

    async def iter_entries(self, *, since_seq: int | None = None, run_id: str | None = None,
                           page: int = 500) -> AsyncIterator[s.JournalEntry]:
        while True:
            result = await self.entries(since_seq=since_seq, limit=page, run_id=run_id)
            for entry in result.entries:
                yield entry
            if result.next_since_seq is None:
                return
            since_seq = result.next_since_seq


def _manifest_text(manifest: str | Path) -> str:
    return manifest.read_text() if isinstance(manifest, Path) else manifest


def _terms(digest: str | None, expires_in: float | None, expires_at: str | None) -> dict[str, Any]:
    """What binds an answer to what was shown, and until when (only what is given)."""
    return {k: v for k, v in (("digest", digest), ("expires_in", expires_in), ("expires_at", expires_at))
            if v is not None}
