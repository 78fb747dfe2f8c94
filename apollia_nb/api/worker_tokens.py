"""Worker credentials: what the items of a Dask batch carry instead of the server's token.

A batch on a Dask cluster (``runtime/dask_engine.py``) sends each item to a
worker process, which runs it in a client runtime of this server. Before the
batch is recorded, its driver asks for a worker credential
(``POST /internal/worker-tokens``, the server's token only); the items carry
that credential, never the server's token, and the driver revokes it when the
batch ends (``POST /internal/worker-tokens/revoke``). Credentials live in the
server's memory: a restart of the server ends them all.

A worker credential opens only what running one of the batch's items needs,
and only for the batch's agent and its tasks (:data:`WORKER_ROUTES`):

* the journal's head, the governance snapshot ``decide()`` reads, a checkpoint
  of the journal as it stands;
* a governed call of the batch's agent in a run it opened, decided by the server
  (``POST /internal/calls``; the entries it carries before the decision are checked as an append's);
* appending entries of the kinds a task's run writes (:data:`WORKER_KINDS`),
  each of the batch's agent: a run is opened (``run_open``) only for a task of
  the batch under a run id the journal has never seen (known from the server's own state,
  :class:`KnownRuns`: no copy into ``journal.db`` per opened run), and every other entry
  belongs to a run the credential opened (or, for ``packages_install``, to no run);
* reading the entries of the runs it opened, and how many they are;
* listing, reading and waiting for answers to the pending decisions of the
  batch's tasks, and listing a new one for them;
* the server's review of the agent's identity, for the batch's agent with the tools and model the
  driver gave when it asked for the credential (the workspace is each worker's own).

Anything else — every public route (answering, rules, consents, developer
mode, agents, tasks, batches, audit), the rest of ``/internal`` (granting or
revoking consents, removing rules, other runs' entries, verification) — answers
401 ``UNAUTHORIZED`` to a worker credential, as does a request of an allowed
route about another agent, task, run or decision.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from apollia_nb.api.deps import (
    API_PREFIX,
    bearer,
    check_role,
    identity_of,
    token_matches,
)
from apollia_nb.errors import BadInput, Unauthorized, UnknownDecision
from apollia_nb.governance.people import OWNER
from apollia_nb.runtime.dask_engine import item_task_prefix

__all__ = ["WORKER_KINDS", "WORKER_ROUTES", "KnownRuns", "WorkerScope", "WorkerTokens", "authorize_internal", "scope_of",
           "tokens_of"]

#: The kinds of entry a task's run appends through its client runtime.
WORKER_KINDS = frozenset({"run_open", "run_seal", "task_status", "plan", "verdict", "model_response", "decision",
                          "tool_call", "tool_result", "tool_progress", "packages_install"})
#: Of those, the kinds an entry with no run may have.
RUNLESS_KINDS = frozenset({"packages_install"})


_INDEX = re.compile(r"(?:0|[1-9][0-9]{0,8})")


@dataclass
class WorkerScope:
    """What one worker credential may act on: one batch's agent, its tasks, and the runs it opened."""

    agent: str
    batch_id: str
    tasks: int
    identity: dict[str, Any] | None = None  # the tools and model its workers may have reviewed
    runs: set[str] = field(default_factory=set)

    def owns_task(self, task_id: Any) -> bool:
        """Whether ``task_id`` is the task of one of the batch's items (``dask_engine.item_task_id``)."""
        prefix = item_task_prefix(self.batch_id)
        if not isinstance(task_id, str) or not task_id.startswith(prefix):
            return False
        index = task_id[len(prefix):]
        return bool(_INDEX.fullmatch(index)) and int(index) < self.tasks

    def to_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "batch_id": self.batch_id, "tasks": self.tasks}


class KnownRuns:
    """Whether the journal holds an entry of a run, without having its newest entries copied into
    ``journal.db`` for each question (what a read of the journal waits for).

    Made once (``journal.observe``, then a cursor of ``journal.db``, whose making waits for one copy):
    every entry committed before is in ``journal.db`` from then on, and the runs of every entry
    committed since are told to it as they are acknowledged (``recent``, each with its newest seq).
    A question reads ``journal.db`` (does it hold an entry of the run, and up to which seq it holds
    the journal: copies are consecutive prefixes), then drops from ``recent`` what that seq covers,
    then looks in ``recent``: an entry of the run is found in one or the other, whenever it was
    committed before the question. Questions are asked one at a time, so a run dropped from
    ``recent`` was in ``journal.db`` for the read. ``recent`` holds what is not yet known copied;
    past ``RECENT_MOST`` runs between two questions it is given up (``stale``) and the next question
    makes a new one."""

    RECENT_MOST = 100_000

    def __init__(self, journal: Any) -> None:
        self._lock = threading.Lock()  # recent (the journal's committing thread tells it)
        self._read_lock = threading.Lock()  # one question at a time
        self.recent: dict[str, int] = {}
        self.stale = False
        self._stop = journal.observe(self._told)
        try:
            self._cursor = journal.cursor()  # after observe: what it does not tell is in journal.db now
        except BaseException:
            self._stop()
            raise

    def _told(self, entries: list[Any]) -> None:
        with self._lock:
            if self.stale:
                return
            recent = self.recent
            for entry in entries:
                if entry.run_id is not None:
                    recent[entry.run_id] = entry.seq
            if len(recent) > self.RECENT_MOST:  # no question for long: given up, made again when asked
                self.stale = True
                recent.clear()

    def holds(self, run_id: str) -> bool:
        """Whether the journal holds an entry of ``run_id`` committed before the question. Blocking (a
        read of ``journal.db``); what the read raises is raised (the question is not answered)."""
        with self._read_lock:
            rows = self._cursor.execute(
                "SELECT coalesce(max(seq), 0), coalesce(bool_or(run_id = ?), false) FROM entries",
                [run_id]).fetchall()
            copied, found = int(rows[0][0]), bool(rows[0][1])
            with self._lock:
                if self.stale:
                    raise LookupError("the runs committed since the last question were given up")
                self.recent = {r: seq for r, seq in self.recent.items() if seq > copied}
                return found or run_id in self.recent

    def close(self) -> None:
        self._stop()
        with self._read_lock, contextlib.suppress(Exception):  # closed with the journal already
            self._cursor.close()


class WorkerTokens:
    """The server's worker credentials, by the digest of their token (in memory only), and, while any is
    live, what the journal's runs are (:class:`KnownRuns`: a run opened with one must be new)."""

    def __init__(self) -> None:
        self._scopes: dict[bytes, WorkerScope] = {}
        self._lock = threading.Lock()
        self._known: KnownRuns | None = None
        self._known_lock = threading.Lock()

    def holds_run(self, journal: Any, run_id: str) -> bool:
        """Whether ``journal`` holds an entry of ``run_id``. Blocking: in a worker thread. Made (or made
        again, after the journal's reads failed or the runs were given up) on the first question; given up
        after it when no credential is left (revoked meanwhile)."""
        with self._known_lock:
            try:
                known = self._known
                if known is not None:
                    try:
                        return known.holds(run_id)
                    except Exception:  # noqa: BLE001 - made again below; its read's error raised from there
                        known.close()
                        self._known = None
                known = self._known = KnownRuns(journal)
                return known.holds(run_id)
            finally:
                if not self._scopes and self._known is not None:
                    self._known.close()
                    self._known = None

    def _forget_runs(self) -> None:
        """No credential is left: stop watching the journal. Never waits for a question being answered (on
        the event loop): that question gives it up when it is done."""
        if not self._known_lock.acquire(blocking=False):
            return
        try:
            known, self._known = self._known, None
        finally:
            self._known_lock.release()
        if known is not None:
            known.close()

    @staticmethod
    def _key(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()

    def issue(self, agent: str, batch_id: str, tasks: int,
              identity: dict[str, Any] | None = None) -> tuple[str, WorkerScope]:
        token = "wk-" + secrets.token_urlsafe(32)
        scope = WorkerScope(agent=agent, batch_id=batch_id, tasks=tasks, identity=identity)
        with self._lock:
            self._scopes[self._key(token)] = scope
        return token, scope

    def revoke(self, token: str) -> bool:
        with self._lock:
            found = self._scopes.pop(self._key(token), None) is not None
            last = not self._scopes
        if last:  # no credential left to ask: the journal is not watched for them
            self._forget_runs()
        return found

    def scope(self, token: str) -> WorkerScope | None:
        with self._lock:
            return self._scopes.get(self._key(token))

    def __len__(self) -> int:
        return len(self._scopes)


def tokens_of(request: Request) -> WorkerTokens:
    state = request.app.state
    tokens = getattr(state, "worker_tokens", None)
    if tokens is None:
        tokens = state.worker_tokens = WorkerTokens()
    return tokens


def scope_of(request: Request) -> WorkerScope | None:
    """The worker credential's scope of this request; None for the server's token."""
    return getattr(request.state, "worker_scope", None)


# --- what each route open to a worker credential checks ------------------------------------------------------

def _refuse(scope: WorkerScope, what: str) -> Unauthorized:
    return Unauthorized(f"this is the worker credential of batch {scope.batch_id} (agent {scope.agent}): {what}")


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise BadInput("the body is not valid JSON") from None


def _runtime_of(request: Request) -> Any:
    return request.app.state.runtime


async def _run_is_new(request: Request, run_id: str) -> bool:
    """The journal holds no entry of the run (:class:`KnownRuns`). In a worker thread (a read of
    ``journal.db``): the server answers other requests meanwhile."""
    import anyio

    journal = _runtime_of(request).journal
    return not await anyio.to_thread.run_sync(tokens_of(request).holds_run, journal, run_id)


async def _append(scope: WorkerScope, request: Request) -> None:
    body = await _json_body(request)
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return  # the route refuses the body (422)
    await _check_drafts(scope, request, entries)


async def _check_drafts(scope: WorkerScope, request: Request, entries: list[Any]) -> None:
    opened: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict):
            return
        kind, run_id, payload = entry.get("kind"), entry.get("run_id"), entry.get("payload")
        payload = payload if isinstance(payload, dict) else {}
        if entry.get("agent") != scope.agent:
            raise _refuse(scope, f"it appends only entries of agent {scope.agent}")
        if kind not in WORKER_KINDS:
            raise _refuse(scope, f"it does not append {kind!r} entries")
        if "task_id" in payload and not scope.owns_task(payload["task_id"]):
            raise _refuse(scope, "it appends only for the batch's tasks")
        if run_id is None:
            if kind not in RUNLESS_KINDS:
                raise _refuse(scope, f"a {kind!r} entry belongs to a run")
        elif kind == "run_open":
            if payload.get("run_kind") != "task" or not scope.owns_task(payload.get("task_id")):
                raise _refuse(scope, "it opens runs only for the batch's tasks")
            if run_id not in scope.runs and (run_id in opened or not await _run_is_new(request, run_id)):
                raise _refuse(scope, f"run {run_id} exists already")
            opened.add(run_id)
        elif run_id not in scope.runs and run_id not in opened:
            raise _refuse(scope, f"run {run_id} is not one it opened")
    scope.runs |= opened


async def _call(scope: WorkerScope, request: Request) -> None:
    """A governed call: of the batch's agent, in a run the credential opened; its ``before`` entries as an
    append of the credential would be (the decision and what follows it are the server's own)."""
    body = await _json_body(request)
    if not isinstance(body, dict):
        return  # the route refuses the body (422)
    if body.get("agent") != scope.agent:
        raise _refuse(scope, f"it has only calls of agent {scope.agent} decided")
    if body.get("run_id") not in scope.runs:
        raise _refuse(scope, f"run {body.get('run_id')} is not one it opened")
    before = body.get("before")
    for entry in before if isinstance(before, list) else []:
        if isinstance(entry, dict) and entry.get("kind") in ("decision", "tool_call", "run_open"):
            raise _refuse(scope, f"a {entry.get('kind')!r} entry is not written before a call")
    await _check_drafts(scope, request, before if isinstance(before, list) else [])


async def _read_entries(scope: WorkerScope, request: Request) -> None:
    run_id = request.query_params.get("run_id")
    if run_id is None or run_id not in scope.runs:
        raise _refuse(scope, "it reads only the entries of the runs it opened")


async def _add_pending(scope: WorkerScope, request: Request) -> None:
    body = await _json_body(request)
    if not isinstance(body, dict):
        return
    if (body.get("agent") != scope.agent or not scope.owns_task(body.get("task_id"))
            or body.get("run_id") not in scope.runs):
        raise _refuse(scope, "it lists decisions only for the runs of the batch's tasks it opened")


def _check_decisions(scope: WorkerScope, request: Request, ids: list[str]) -> None:
    governance = _runtime_of(request).governance
    for decision_id in ids:
        try:
            decision = governance.get_pending(decision_id)
        except UnknownDecision:
            continue  # the route answers 404 for it
        if decision.agent != scope.agent or not scope.owns_task(decision.task_id):
            raise _refuse(scope, "it reads only the decisions of the batch's tasks")


async def _one_decision(scope: WorkerScope, request: Request) -> None:
    _check_decisions(scope, request, [request.path_params.get("decision_id", "")])


async def _answers(scope: WorkerScope, request: Request) -> None:
    _check_decisions(scope, request, request.query_params.getlist("ids"))


async def _identity(scope: WorkerScope, request: Request) -> None:
    body = await _json_body(request)
    if not isinstance(body, dict):
        return
    if body.get("agent") != scope.agent:
        raise _refuse(scope, f"it registers only agent {scope.agent}")
    identity = body.get("identity")
    pinned = scope.identity
    if (pinned is None or not isinstance(identity, dict) or identity.get("tools") != pinned["tools"]
            or identity.get("model") != pinned["model"]):
        raise _refuse(scope, "it has only the tools and model the batch was started with reviewed")


async def _nothing(scope: WorkerScope, request: Request) -> None:
    return None


Check = Callable[[WorkerScope, Request], Awaitable[None]]

#: The routes (method, path under ``/api/v1``) a worker credential opens, each with what it checks. The
#: list of pending decisions is open too: it answers only the batch's (``internal.list_pending``).
WORKER_ROUTES: dict[tuple[str, str], Check] = {
    ("GET", "/internal/journal/head"): _nothing,
    ("POST", "/internal/journal/entries"): _append,
    ("POST", "/internal/calls"): _call,
    ("GET", "/internal/journal/entries"): _read_entries,
    ("GET", "/internal/journal/run-size"): _read_entries,
    ("POST", "/internal/journal/checkpoint"): _nothing,
    ("GET", "/internal/governance/snapshot"): _nothing,
    ("POST", "/internal/pending-decisions"): _add_pending,
    ("GET", "/internal/pending-decisions"): _nothing,
    ("GET", "/internal/pending-decisions/{decision_id}"): _one_decision,
    ("GET", "/internal/answers"): _answers,
    ("POST", "/internal/agents/identity"): _identity,
}


async def authorize_internal(request: Request,
                             credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> None:
    """The internal routes' guard: the server's token opens them all; a worker credential opens the routes of
    :data:`WORKER_ROUTES` for its batch only; anything else is 401 ``UNAUTHORIZED``."""
    if token_matches(request, credentials):
        check_role(request, OWNER)
        return
    scope = tokens_of(request).scope(credentials.credentials) if credentials is not None else None
    if scope is None:
        person = await identity_of(request, credentials)  # a person: the route's role (``api.roles``)
        if person is None:
            raise Unauthorized("a valid bearer token is required (Authorization: Bearer <token>)")
        check_role(request, person)
        return
    route = request.scope.get("route")
    template = getattr(route, "path", "").removeprefix(API_PREFIX)
    check = WORKER_ROUTES.get((request.method, template))
    if check is None:
        raise _refuse(scope, f"it does not open {request.method} {template or request.url.path}")
    await check(scope, request)
    request.state.worker_scope = scope
