"""Client mode: a runtime in a process that finds its home owned by ``apollia-os serve``.

A home has one owner process: DuckDB lets no second process open
``journal.db``, ``governance.db`` or ``runtime.db``. To share a home between
several kernels and the REST API, ``apollia-os serve`` owns it and advertises
itself in ``<home>/server.json``. A ``Runtime`` whose home is owned by that
server boots as its client (``rt.mode == "client"``):

* its agents, tasks and chat sessions run in this process, recorded in a
  process-local in-memory ``RuntimeRecords`` (they end with the process);
* ``rt.journal`` is a ``RemoteJournal``: every entry is appended by the
  server's single writer (one chain, group-committed with every other
  process's entries, durable when the append returns);
* ``rt.governance`` is a ``RemoteGovernance``: ``view()`` asks the server for
  the snapshot before every decision with a conditional request (``304``
  while nothing changed), so a consent or rule committed by any process applies
  here at once; when the server cannot be reached, the view fails closed;
* answers are recorded by the server (``Runtime.answer`` there: validated,
  journaled, stored, ``always`` applied) and a task owned by the runtime
  (``watch_answers``) long-polls the server for answers given elsewhere to
  this process's waiting cards, resolving them and resuming their runs.

``find_server`` decides between client mode and ``HOME_LOCKED``: the owner
lock's holder must be the server named in ``server.json``, alive, answering
``/health`` and serving this home's journal key. Nothing here writes a file of
the home. httpx is imported only here, only in client mode.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from apollia_nb.errors import (
    ApolliaError,
    BadInput,
    GovernanceUnreadable,
    HomeLocked,
    IntegrityError,
    ServerNotRunning,
    UnknownDecision,
)
from apollia_nb.home import Home

if TYPE_CHECKING:  # pragma: no cover
    import httpx

    from apollia_nb.governance.decision import GovernanceView
    from apollia_nb.governance.policy import PolicyState
    from apollia_nb.governance.store import ConsentRecord, DeveloperMode, PendingDecision, RuleRecord
    from apollia_nb.journal.entry import Entry
    from apollia_nb.runtime.capabilities import AnswerHost

__all__ = [
    "ServerAddress",
    "find_server",
    "ServerApi",
    "RemoteHome",
    "RemoteJournal",
    "RemoteGovernance",
    "ServedCalls",
    "watch_answers",
    "ANSWER_POLL_SECS",
]

API = "/api/v1"
#: How long one long poll for answers waits on the server before it is asked again.
ANSWER_POLL_SECS = 20.0
#: How long ``find_server`` waits for ``/health``.
HEALTH_TIMEOUT_SECS = 3.0
#: The most decisions one long poll names (the rest are asked for as these are answered).
MAX_WATCHED = 200
#: At close: how long cancelling this process's suspended runs may take.
CLOSE_SECS = 10.0
_PAGE = 10_000
#: How long a handed-over entry (``append_soon``) waits for a later append of its run to carry it
#: before it is sent alone.
SOON_SECS = 0.02
#: How many times a call request that got no answer is sent again (same call id: the server answers a
#: retry as it answered the first and journals nothing twice).
CALL_RETRIES = 2


# --- finding the server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerAddress:
    """What ``server.json`` advertises: ``{"url", "token", "pid"}``."""

    url: str
    token: str
    pid: int


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _holder_alive(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    return isinstance(pid, int) and _alive(pid)


def _holder_words(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process"
    return f"process {holder.get('pid')} ({holder.get('command', '?')}, since {holder.get('since', '?')})"


def find_server(home: Home, locked: HomeLocked) -> ServerAddress:
    """The ``apollia-os serve`` that owns ``home``, or raise ``HOME_LOCKED`` saying who holds it. Its token is
    the one this client sends: ``$APOLLIA_TOKEN``, else ``$JUPYTERHUB_API_TOKEN``, else the owner's from
    ``server.json`` (``wire.http.client_token``), so a kernel or a command acts as its person on the server.

    ``locked`` is the error the owner lock raised: raised as it is when no
    server is advertised. When ``server.json`` advertises a server that has
    stopped, does not own the home or does not answer ``/health``, the error
    is ``SERVER_NOT_RUNNING`` (a ``HOME_LOCKED``): start the server, or remove
    the stale file.
    """
    import httpx

    from apollia_nb.wire.http import client_token

    advertised = _read_json(home.server_json)
    if advertised is None:
        raise locked
    try:  # the token sent is the person's own when there is one, else the owner's (``client_token``)
        address = ServerAddress(url=str(advertised["url"]).rstrip("/"),
                                token=client_token(str(advertised["token"])) or "", pid=int(advertised["pid"]))
    except (KeyError, TypeError, ValueError):
        raise locked from None
    holder = _read_json(home.owner_lock_path)
    other = holder is not None and holder.get("pid") != address.pid  # the home's owner is not that server

    def not_running(why: str) -> ServerNotRunning:
        named = _holder_words(holder) if other and holder is not None and _holder_alive(holder) else None
        return ServerNotRunning.advertised(home.server_json, address.url, address.pid, why, named)

    if not _alive(address.pid):
        raise not_running("has stopped")
    if other:
        raise not_running("does not answer for it: that process does not own the home")
    try:
        health = httpx.get(address.url + API + "/health", timeout=HEALTH_TIMEOUT_SECS)
        ok = health.status_code == 200 and health.json().get("status") == "ok"
    except httpx.ConnectError:
        raise not_running("does not answer: it refuses connections") from None
    except (httpx.HTTPError, ValueError) as exc:
        raise not_running(f"does not answer ({type(exc).__name__})") from None
    if not ok:
        raise not_running(f"does not answer for it (HTTP {health.status_code} at /health)")
    return address


# --- the connection -------------------------------------------------------------------------------


def _error(response: "httpx.Response") -> ApolliaError:
    """The error an answer of the server stands for: its code's class, as the SDK raises it."""
    return _error_of(response.status_code, response.content)


def _error_of(status: int, content: bytes) -> ApolliaError:
    from apollia_nb.wire.http import raise_for_error

    try:
        raise_for_error(status, content)
    except ApolliaError as exc:
        return exc
    return ApolliaError(f"HTTP {status} from the server that owns the home")


def _unanswered(url: str, exc: Exception) -> str:
    return f"the server that owns the home ({url}) did not answer: {type(exc).__name__}: {exc}"


class NotSent(OSError):
    """The connection was refused: nothing of the request was sent (the server has stopped)."""


def _plain_http(url: str) -> tuple[str, int] | None:
    """The host and port of a plain ``http://HOST:PORT`` server URL (no path); None for any other."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None or parts.path not in ("", "/"):
        return None
    return parts.hostname, parts.port


class JsonPosts:
    """JSON POSTs to the server on keep-alive connections of the standard library's ``http.client``: what a
    governed call's request costs the client (httpx's client layers take several times its CPU a request).

    A connection serves one request at a time; idle ones are kept for the next. ``post`` answers the status
    and the body; it raises ``NotSent`` when the server refuses the connection, any other ``OSError`` or
    ``http.client.HTTPException`` when the request may have been sent and got no answer. A kept connection
    the server closed meanwhile is replaced by a new one once, silently (what it carried is sent again, as a
    retry would)."""

    def __init__(self, host: str, port: int, headers: dict[str, str], *, timeout: float, connect: float) -> None:
        self.host, self.port, self.timeout, self.connect = host, port, timeout, connect
        self.headers = {**headers, "Content-Type": "application/json", "Accept": "application/json"}
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def of(cls, url: str, headers: dict[str, str], *, timeout: float, connect: float) -> "JsonPosts | None":
        """For a plain ``http://`` server URL; None for any other (httpx carries those)."""
        where = _plain_http(url)
        return None if where is None else cls(*where, headers, timeout=timeout, connect=connect)

    def _open(self) -> Any:
        import http.client

        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect)
        try:
            conn.connect()
        except ConnectionRefusedError:
            conn.close()
            raise NotSent(f"{self.host}:{self.port} refuses connections") from None
        except BaseException:
            conn.close()
            raise
        conn.sock.settimeout(self.timeout)
        return conn

    def post(self, path: str, body: Any) -> tuple[int, bytes]:
        import http.client

        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        kept = conn is not None
        while True:
            if conn is None:
                conn = self._open()
            try:
                conn.request("POST", path, body=data, headers=self.headers)
                response = conn.getresponse()
                content = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                if kept:  # closed by the server while it was idle: once more on a new connection
                    conn, kept = None, False
                    continue
                raise
            break
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)
        return response.status, content

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class LoopPosts:
    """JSON POSTs to the server made on the caller's asyncio event loop, over kept-alive non-blocking sockets:
    a governed call's request without a hand-off to a worker thread and back (two thread switches a call)
    and without ``http.client``'s header parsing. The sockets belong to no loop (``loop.sock_*``), so any
    loop may use an idle one and ``close`` works from any thread.

    ``post`` answers the status and the body; it raises ``NotSent`` when the server refuses the connection,
    ``TimeoutError`` after ``timeout`` seconds without the whole answer, any other ``OSError`` or
    ``http.client.HTTPException`` when the request may have been sent and got no whole answer. As in
    ``JsonPosts``, a kept socket the server closed meanwhile is replaced by a new one once. The caller
    shields ``post`` from cancellation (a request sent is read to its answer)."""

    def __init__(self, host: str, port: int, headers: dict[str, str], *, timeout: float, connect: float) -> None:
        self.host, self.port, self.timeout, self.connect = host, port, timeout, connect
        fixed = {"Host": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}", **headers,
                 "Content-Type": "application/json", "Accept": "application/json"}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode("latin-1")
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def of(cls, url: str, headers: dict[str, str], *, timeout: float, connect: float) -> "LoopPosts | None":
        """For a plain ``http://`` server URL; None for any other."""
        where = _plain_http(url)
        return None if where is None else cls(*where, headers, timeout=timeout, connect=connect)

    async def _open(self, loop: Any) -> Any:
        import socket

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                async with _deadline(self.connect):
                    await loop.sock_connect(sock, (self.host, self.port))
            except ConnectionRefusedError:
                raise NotSent(f"{self.host}:{self.port} refuses connections") from None
        except BaseException:
            sock.close()
            raise
        return sock

    async def post(self, path: str, body: Any) -> tuple[int, bytes]:
        import asyncio

        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        request = b"".join((f"POST {path} HTTP/1.1\r\n".encode("ascii"), self._head,
                            b"Content-Length: %d\r\n\r\n" % len(data), data))
        loop = asyncio.get_running_loop()
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        kept = sock is not None
        while True:
            if sock is None:
                sock = await self._open(loop)
            try:
                async with _deadline(self.timeout):
                    await loop.sock_sendall(sock, request)
                    status, content, keep = await _read_answer(loop, sock)
            except BaseException as exc:
                sock.close()
                if kept and isinstance(exc, (OSError, _Unanswered)) and not isinstance(exc, TimeoutError):
                    sock, kept = None, False  # closed by the server while it was idle: once more on a new one
                    continue
                raise
            break
        with self._lock:
            if keep and not self._closed:
                self._idle.append(sock)
                sock = None
        if sock is not None:
            sock.close()
        return status, content

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _deadline(seconds: float) -> Any:
    import asyncio

    return asyncio.timeout(seconds)


class _Unanswered(OSError):
    """The connection ended, or carried something that is not an HTTP/1.1 answer, before the whole answer."""


_MAX_HEAD = 64 * 1024


async def _read_answer(loop: Any, sock: Any) -> tuple[int, bytes, bool]:
    """One HTTP/1.1 answer read from ``sock``: its status, its body (by ``Content-Length`` or chunked), and
    whether the connection may carry another request."""
    buf = bytearray()

    async def more() -> None:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise _Unanswered("the server closed the connection before its whole answer")
        buf.extend(chunk)

    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > _MAX_HEAD:
            raise _Unanswered("the answer's head is too long")
        await more()
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[:end + 4]
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise _Unanswered(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    status = int(code)
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    keep = fields.get("connection", "").lower() != "close" and version == "HTTP/1.1"
    if fields.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            while (eol := buf.find(b"\r\n")) < 0:
                await more()
            size_text = bytes(buf[:eol]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Unanswered("a chunk's size does not parse") from None
            del buf[:eol + 2]
            if size == 0:
                while (end := buf.find(b"\r\n")) != 0:  # trailers, then the last empty line
                    if end > 0:
                        del buf[:end + 2]
                    else:
                        await more()
                del buf[:2]
                return status, bytes(out), keep
            while len(buf) < size + 2:
                await more()
            out += buf[:size]
            del buf[:size + 2]
    length_text = fields.get("content-length")
    if length_text is None or not length_text.isdigit():
        raise _Unanswered("the answer gives no length")
    length = int(length_text)
    while len(buf) < length:
        await more()
    return status, bytes(buf[:length]), keep


_WIRE_TYPES = ("blob", "ts", "date", "time", "dec", "td", "uuid", "float", "map")


def wire_value(value: Any) -> Any:
    """``value`` (a DuckDB result value) as JSON: JSON's own types as they are, others tagged
    ``{"$": type, "v": text}`` so ``from_wire`` gives the same value back."""
    import base64
    import datetime as dt
    import decimal
    import math
    import uuid

    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$": "blob", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {"$": "ts", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$": "date", "v": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$": "time", "v": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$": "dec", "v": str(value)}
    if isinstance(value, dt.timedelta):
        return {"$": "td", "v": value.total_seconds()}
    if isinstance(value, uuid.UUID):
        return {"$": "uuid", "v": str(value)}
    if isinstance(value, (list, tuple)):
        return [wire_value(v) for v in value]
    if isinstance(value, dict):
        return {"$": "map", "v": [[wire_value(k), wire_value(v)] for k, v in value.items()]}
    return str(value)


def from_wire(value: Any) -> Any:
    """The value ``wire_value`` encoded."""
    import base64
    import datetime as dt
    import decimal
    import uuid

    if isinstance(value, list):
        return [from_wire(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind, text = value.get("$"), value.get("v")  # type: Any, Any
    if kind == "blob":
        return base64.b64decode(text, validate=True)
    if kind == "ts":
        return dt.datetime.fromisoformat(text)
    if kind == "date":
        return dt.date.fromisoformat(text)
    if kind == "time":
        return dt.time.fromisoformat(text)
    if kind == "dec":
        return decimal.Decimal(text)
    if kind == "td":
        return dt.timedelta(seconds=text)
    if kind == "uuid":
        return uuid.UUID(text)
    if kind == "float":
        return float(text)
    if kind == "map":
        return {from_wire(k): from_wire(v) for k, v in text}
    raise IntegrityError(f"the server sent a value of an unknown type: {value!r}"[:300])


def _when(value: str | None) -> _dt.datetime | None:
    if value is None:
        return None
    return _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


class RemoteHome:
    """One keep-alive HTTP connection to the server that owns the home, and the remote stores over it.

    ``journal.close()`` closes it (the runtime closes governance first, then the journal).
    """

    def __init__(self, home: Home, address: ServerAddress, *, timeout: float = 60.0) -> None:
        import httpx

        self.home = home
        self.address = address
        self.headers = {"Authorization": f"Bearer {address.token}"}
        self.http = httpx.Client(base_url=address.url + API, headers=self.headers,
                                 timeout=httpx.Timeout(timeout, connect=5.0))
        # a governed call's request (one per call) on the standard library's HTTP
        self.posts = JsonPosts.of(address.url, self.headers, timeout=timeout, connect=5.0)
        # ... and on the caller's event loop when it is free to go there (``decide_call_async``)
        self.loop_posts = LoopPosts.of(address.url, self.headers, timeout=timeout, connect=5.0)
        try:
            self.journal = RemoteJournal(self)
            self.governance = RemoteGovernance(self)
            self.journal.served_calls = ServedCalls(self.journal, self.governance)
        except BaseException:
            self.http.close()
            raise

    @property
    def url(self) -> str:
        return self.address.url

    def call(self, method: str, path: str, *, unreachable: type[ApolliaError], what: str,
             **kwargs: Any) -> "httpx.Response":
        """One request; an error answer raises its code's class, no answer raises ``unreachable``."""
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.ConnectError:  # nothing was sent: the server has stopped
            raise self.not_running(what) from None
        except httpx.HTTPError as exc:
            raise unreachable(f"{what}: {_unanswered(self.url, exc)}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response

    def not_running(self, what: str) -> ServerNotRunning:
        """``SERVER_NOT_RUNNING``: the server refused the connection, so ``what`` was not done."""
        return _refused(self.home, self.address, what)

    def close(self) -> None:
        if self.posts is not None:
            self.posts.close()
        if self.loop_posts is not None:
            self.loop_posts.close()
        self.http.close()


def _refused(home: Home, address: ServerAddress, what: str) -> ServerNotRunning:
    error = ServerNotRunning.advertised(home.server_json, address.url, address.pid,
                                        "does not answer: it refuses connections")
    return ServerNotRunning(f"{what} (nothing was sent): {error.message}")


class ServerApi:
    """The server's public REST API through the routes of ``wire/http.py``, answering the JSON the server sends
    (the dictionaries ``to_dict()`` gives in the owner process): ``api("task", task_id)``."""

    def __init__(self, address: ServerAddress, *, timeout: float = 60.0, home: Home | None = None) -> None:
        from apollia_nb.wire.http import Session

        self.url = address.url
        self.address, self.home = address, home
        self.sdk = Session(address.url, address.token, timeout=timeout)

    def __call__(self, route: str, *args: Any) -> Any:
        import dataclasses

        import httpx

        from apollia_nb.wire.http import Routes

        req = getattr(Routes, route)(*args)
        if req.model is not None:
            req = dataclasses.replace(req, model=Any)  # the JSON as sent
        try:
            return self.sdk.request(req)
        except httpx.ConnectError:
            if self.home is None:
                raise HomeLocked(f"the server at {self.url} refuses connections: it is not running") from None
            raise _refused(self.home, self.address, f"`{route}` could not be asked") from None
        except httpx.HTTPError as exc:
            raise HomeLocked(_unanswered(self.url, exc)) from None

    def close(self) -> None:
        self.sdk.close()


# --- the journal ----------------------------------------------------------------------------------


def _entry(row: dict[str, Any]) -> "Entry":
    from apollia_nb.journal.entry import Entry

    return Entry.from_row((  # a salted payload (format 2) read ``stored``: its fields are split from its salts
        int(row["seq"]), row["ts"], row["run_id"], row["agent"], row["kind"], row["payload"].encode("utf-8"),
        bytes.fromhex(row["prev_hash"]), bytes.fromhex(row["hash"]), bytes.fromhex(row["signature"]),
        row["key_id"],
    ))


def _draft(kind: str, payload: dict[str, Any], run_id: str | None, agent: str | None) -> dict[str, Any]:
    """Checked here as the local journal checks it, so bad input raises in the caller and nothing is sent."""
    from apollia_nb.journal.entry import canonical_payload, check_kind, check_text

    check_kind(kind)
    check_text("run_id", run_id, nullable=True)
    check_text("agent", agent, nullable=True)
    canonical_payload(payload)
    return {"kind": kind, "payload": payload, "run_id": run_id, "agent": agent}


class ServedCalls:
    """What ``governed_call`` asks of a served home (``rt.journal.served_calls``): the snapshot held here to
    draft a call's entries with, and the server's decision of the call, journaled in one request."""

    def __init__(self, journal: "RemoteJournal", governance: "RemoteGovernance") -> None:
        self._journal, self._governance = journal, governance

    def view(self) -> "GovernanceView":
        return self._governance.held_view()

    async def decide(self, call: Any, decided: tuple[str, dict[str, Any]],
                     prefix: Sequence[tuple[str, dict[str, Any]]], *, run_id: str, agent: str,
                     secrets: dict[str, str] | None = None) -> tuple[Any, tuple[str, dict[str, Any]]]:
        """``RemoteJournal.decide_call`` without blocking the event loop (``decide_call_async``)."""
        return await self._journal.decide_call_async(call, decided, prefix, run_id=run_id, agent=agent,
                                                     secrets=secrets, governance=self._governance)


def _call_of(body: list[dict[str, Any]]) -> Any:
    for d in body:
        if d["kind"] == "decision":
            return d["payload"].get("call_id")
    return None


class RemoteJournal:
    """``rt.journal`` in client mode: the server's journal, keeping ``JournalFace`` (``journal/contract.py``).

    Appends are committed by the server before they return. Nothing of the
    journal is copied here: SQL (``sql``, ``read_query``) runs on the server
    under the rules of ``%%apollia sql``; proofs are made by the server and
    verified here under the home's public key (read from the home, checked
    at connect to be the server's); ``verify_paged`` verifies here entries
    read a page at a time, ``verify_in_place`` has the server verify where
    the journal is stored, and ``entry_pages`` feeds an export page by page.
    """

    def __init__(self, remote: RemoteHome) -> None:
        from apollia_nb.journal.keys import key_id, load_public_key

        self._remote = remote
        self.path = remote.home.journal_db
        # Entries handed over (``append_soon``), by run, each with its future: carried by the run's next
        # request, or sent alone by the flusher after ``SOON_SECS``. A run's requests go one at a time
        # (``_run_lock``), so a handed-over entry is committed before anything later of its run.
        self._soon: dict[str | None, list[tuple[dict[str, Any], "Future[list[Entry]]"]]] = {}
        self._soon_lock = threading.Condition()
        self._run_locks: dict[str | None, threading.Lock] = {}
        self._failed: dict[str | None, BaseException] = {}
        self._flusher: threading.Thread | None = None
        self._flusher_idle = False  # the flusher waits for an entry to be handed over (only then woken for one)
        # What a call request committed beyond ``before``'s handed-over entries, by the drafts' identity:
        # the append of exactly those drafts that follows (``governed.py``) returns them, sending nothing.
        self._committed: dict[tuple[Any, ...], list["Entry"]] = {}
        self._committed_calls: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.served_calls: ServedCalls | None = None  # set by ``RemoteHome``
        self._public_key = load_public_key(remote.home)
        head = self._head()
        if bytes.fromhex(head["public_key"]) != self._public_key:
            raise HomeLocked(
                f"the server at {remote.url} signs its journal with another key than the home "
                f"{remote.home.path} holds: it does not serve this home's journal"
            )
        self._origin: str = head["origin"]
        self._key_id = key_id(self._public_key)
        self._closed = False
        self._appended = False

    def _call(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        self.flush_soon()  # a read, a checkpoint, a proof: after every entry handed over before it
        return self._remote.call(method, path, unreachable=IntegrityError, what=what, **kwargs).json()

    def _head(self) -> dict[str, Any]:
        return self._call("GET", "/internal/journal/head", what="the journal's head cannot be read")

    # identity ------------------------------------------------------------------------------------
    @property
    def origin(self) -> str:
        return self._origin

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def server_url(self) -> str:
        return self._remote.url

    def public_key(self) -> bytes:
        """The home's journal public key (``keys/journal.pub``), checked against the server's at connect."""
        return self._public_key

    def verifier(self) -> Any:
        from apollia_nb.journal.checkpoint import NoteVerifier

        return NoteVerifier(self._origin, self._public_key)

    # appending -----------------------------------------------------------------------------------
    def append_many(self, drafts: Iterable[Any]) -> list["Entry"]:
        """Append entries atomically (consecutive seqs, one transaction); committed on return.

        After the entries handed over before of their runs (in the same request). The drafts a call
        request committed already (``decide_call``) are returned as committed, and nothing is sent."""
        from apollia_nb.journal.store import Draft

        body = [_draft(*Draft(*d)) for d in drafts]
        if not body:
            return []
        done = self._already_committed(body)
        if done is not None:
            return done
        n = len(body)
        what = f"the journal could not record {n} entr{'y' if n == 1 else 'ies'} (they may or may not be recorded)"
        with self._runs_held({d["run_id"] for d in body}) as carried:
            entries = self._send(carried, lambda all_: [_entry(row) for row in self._remote.call(
                "POST", "/internal/journal/entries", json={"entries": all_}, unreachable=IntegrityError,
                what=what).json()["entries"]], body)
        return entries

    # one run's requests, one at a time, each carrying what the run handed over -----------------------
    def _runs_held(self, runs: set[str | None]) -> Any:
        import contextlib

        @contextlib.contextmanager
        def held() -> Iterator[list[tuple[dict[str, Any], "Future[list[Entry]]"]]]:
            order = sorted(runs, key=lambda r: (r is not None, r or ""))
            with self._soon_lock:
                locks = [self._run_locks.setdefault(r, threading.Lock()) for r in order]
            for lock in locks:
                lock.acquire()
            try:
                for run in order:
                    failed = self._failed.get(run)
                    if failed is not None:  # the run cannot go on with a hole in its trace
                        raise failed
                with self._soon_lock:
                    carried = [item for run in order for item in self._soon.pop(run, [])]
                yield carried
            finally:
                for lock in reversed(locks):
                    lock.release()

        return held()

    def _run_lock(self, run: str | None) -> threading.Lock:
        with self._soon_lock:
            return self._run_locks.setdefault(run, threading.Lock())

    def _send(self, carried: list[tuple[dict[str, Any], "Future[list[Entry]]"]], send: Any,
              body: list[dict[str, Any]]) -> Any:
        """``send(carried drafts + body)``, resolving the carried entries' futures from its answer."""
        self._appended = True
        try:
            result = send([d for d, _ in carried] + body)
        except BaseException as exc:
            self._carried_failed(carried, exc)
            raise
        return self._carried_done(carried, result)

    def _carried_failed(self, carried: list[tuple[dict[str, Any], "Future[list[Entry]]"]],
                        exc: BaseException) -> None:
        """The request that carried these handed-over entries failed: their runs cannot go on."""
        for draft, future in carried:
            self._failed.setdefault(draft["run_id"], exc)
            future.set_exception(exc)

    @staticmethod
    def _carried_done(carried: list[tuple[dict[str, Any], "Future[list[Entry]]"]], result: Any) -> Any:
        """The carried entries' futures resolved from ``result``; ``result`` without them."""
        entries = result if isinstance(result, list) else result[0]
        for (draft, future), entry in zip(carried, entries):
            future.set_result([entry])
        if isinstance(result, list):
            return result[len(carried):]
        return (result[0][len(carried):], *result[1:])

    def flush_soon(self, runs: Iterable[str | None] | None = None) -> None:
        """Commit now every entry handed over (of ``runs``): what a read of the journal must see."""
        with self._soon_lock:
            pending = [r for r in self._soon if runs is None or r in set(runs)]
        for run in pending:
            try:
                with self._runs_held({run}) as carried:
                    if carried:
                        self._send(carried, lambda all_: [_entry(row) for row in self._remote.call(
                            "POST", "/internal/journal/entries", json={"entries": all_},
                            unreachable=IntegrityError, what="the journal could not record the entries handed "
                                                             "over (they may or may not be recorded)").json()[
                            "entries"]], [])
            except ApolliaError:
                pass  # told through the entries' futures and to the run's next append

    def _flush_later(self) -> None:
        """The flusher: sends what no later append carried within ``SOON_SECS``; ends when the journal closes."""
        import time

        while True:
            with self._soon_lock:
                while not self._soon and not self._closed:
                    self._flusher_idle = True
                    self._soon_lock.wait()
                self._flusher_idle = False
                deadline = time.monotonic() + SOON_SECS
                while not self._closed and (left := deadline - time.monotonic()) > 0:
                    self._soon_lock.wait(left)
                if self._closed:
                    return  # the close sends what is left
            self.flush_soon()

    # a governed call, decided by the server -------------------------------------------------------
    def decide_call(self, call: Any, decided: tuple[str, dict[str, Any]],
                    prefix: Sequence[tuple[str, dict[str, Any]]], *, run_id: str, agent: str,
                    secrets: dict[str, str] | None = None, governance: "RemoteGovernance | None" = None,
                    ) -> tuple[Any, tuple[str, dict[str, Any]]]:
        """One request: the server decides ``call`` on its own current snapshot and commits ``prefix``,
        the ``decision`` (``decided``'s payload with the server's outcome, line, answers and reason) and
        — allowed — the ``tool_call``, or — refused — the refused ``tool_result``, after what the run
        handed over. Returns the server's decision and the ``decision`` entry as journaled; the append of
        those drafts that follows returns them as committed. A request that got no answer is sent
        again with the same call id (the server journals it once)."""
        import http.client

        import httpx

        body, prefix_drafts = self._call_request(call, decided, prefix, run_id=run_id, agent=agent,
                                                 secrets=secrets, governance=governance)

        def post(request: dict[str, Any]) -> tuple[int, bytes]:
            posts = self._remote.posts
            if posts is not None:
                try:
                    return posts.post(API + "/internal/calls", request)
                except NotSent as exc:
                    raise httpx.ConnectError(str(exc)) from None
                except (OSError, http.client.HTTPException) as exc:
                    raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
            response = self._remote.http.post("/internal/calls", json=request)
            return response.status_code, response.content

        def send(all_: list[dict[str, Any]]) -> tuple[list["Entry"], dict[str, Any]]:
            request = {**body, "before": all_}
            for attempt in range(CALL_RETRIES + 1):
                try:
                    status, content = post(request)
                except httpx.TransportError as exc:
                    if attempt < CALL_RETRIES:
                        continue  # no answer: the same call id again (the server journals it once)
                    raise self._call_unanswered(exc, isinstance(exc, httpx.ConnectError)) from None
                return self._call_answered(status, content)
            raise AssertionError("unreachable")  # pragma: no cover

        with self._runs_held({run_id}) as carried:
            entries, data = self._send(carried, send, prefix_drafts)
        return self._call_done(entries, data, prefix_drafts, run_id=run_id, call_id=body["call_id"],
                               governance=governance)

    async def decide_call_async(self, call: Any, decided: tuple[str, dict[str, Any]],
                                prefix: Sequence[tuple[str, dict[str, Any]]], *, run_id: str, agent: str,
                                secrets: dict[str, str] | None = None, governance: "RemoteGovernance | None" = None,
                                ) -> tuple[Any, tuple[str, dict[str, Any]]]:
        """``decide_call`` without blocking the event loop: on the loop itself, over ``LoopPosts``, when the
        run's requests are free (none of its requests is under way in another thread); else in a worker
        thread. Either way, cancelled once begun, it still completes (the request is read to its answer)."""
        posts = self._remote.loop_posts
        lock = self._run_lock(run_id)
        if posts is None or not lock.acquire(blocking=False):
            return await anyio.to_thread.run_sync(lambda: self.decide_call(
                call, decided, prefix, run_id=run_id, agent=agent, secrets=secrets, governance=governance))
        try:
            with anyio.CancelScope(shield=True):
                failed = self._failed.get(run_id)
                if failed is not None:  # the run cannot go on with a hole in its trace
                    raise failed
                body, prefix_drafts = self._call_request(call, decided, prefix, run_id=run_id, agent=agent,
                                                         secrets=secrets, governance=governance)
                with self._soon_lock:
                    carried = self._soon.pop(run_id, [])
                self._appended = True
                try:
                    request = {**body, "before": [d for d, _ in carried] + prefix_drafts}
                    for attempt in range(CALL_RETRIES + 1):
                        try:
                            status, content = await posts.post(API + "/internal/calls", request)
                        except OSError as exc:  # NotSent, a timeout, no whole answer
                            if attempt < CALL_RETRIES:
                                continue  # no answer: the same call id again (the server journals it once)
                            raise self._call_unanswered(exc, isinstance(exc, NotSent)) from None
                        result = self._call_answered(status, content)
                        break
                except BaseException as exc:
                    self._carried_failed(carried, exc)
                    raise
                entries, data = self._carried_done(carried, result)
        finally:
            lock.release()
        return self._call_done(entries, data, prefix_drafts, run_id=run_id, call_id=body["call_id"],
                               governance=governance)

    def _call_request(self, call: Any, decided: tuple[str, dict[str, Any]],
                      prefix: Sequence[tuple[str, dict[str, Any]]], *, run_id: str, agent: str,
                      secrets: dict[str, str] | None, governance: "RemoteGovernance | None",
                      ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A call request's body (without ``before``) and the drafts of ``prefix``."""
        kind, template = decided
        call_id = str(template["call_id"])
        text = json.dumps(call.arguments, ensure_ascii=False, default=str)
        places = call.code_places
        body: dict[str, Any] = {
            "call_id": call_id, "run_id": run_id, "agent": agent, "tool": call.tool,
            "family": call.family.value if call.family is not None else None,
            "arguments": dict(call.arguments), "connection": call.connection,
            "run_grants": sorted(getattr(f, "value", f) for f in call.run_grants),
            "paths": list(call.paths) if call.paths is not None else None, "shell": bool(call.shell),
            "aliases": list(call.aliases),
            "code_places": None if places is None else {
                "places": [[p.path, p.kind.value, p.why] for p in places.places], "unknown": places.unknown},
            "decision": template,
            # only the secrets the arguments hold: the reason quotes nothing else
            "secrets": [[t, w] for t, w in (secrets or {}).items() if t in text],
            "generation": governance.generation() if governance is not None else None,
        }
        return body, [_draft(k, p, run_id, agent) for k, p in prefix]

    def _call_unanswered(self, exc: Exception, refused: bool) -> ApolliaError:
        """A call request that got no answer after its retries: the server is not running (nothing was sent),
        or ``INTEGRITY`` (its entries may or may not be recorded)."""
        if refused:
            return self._remote.not_running("the call could not be decided")
        return IntegrityError(f"the call could not be decided: {_unanswered(self._remote.url, exc)} "
                              "(its entries may or may not be recorded)")

    @staticmethod
    def _call_answered(status: int, content: bytes) -> tuple[list["Entry"], dict[str, Any]]:
        if status >= 400:
            raise _error_of(status, content)
        data = json.loads(content)
        return [_entry(row) for row in data["entries"]], data

    def _call_done(self, entries: list["Entry"], data: dict[str, Any], prefix_drafts: list[dict[str, Any]], *,
                   run_id: str, call_id: str, governance: "RemoteGovernance | None",
                   ) -> tuple[Any, tuple[str, dict[str, Any]]]:
        """The server's decision and the journaled ``decision`` of an answered call request; its entries kept
        for the append of the same drafts that follows."""
        from apollia_nb.governance.decision import Answer, Decision, Outcome

        if governance is not None:
            governance.held_from(data["generation"], data.get("snapshot"))
        d = data["decision"]
        decision = Decision(Outcome(d["outcome"]), int(d["line"]), tuple(Answer(a) for a in d["answers"]),
                            d["reason"], d.get("rule_id"))
        journaled = ("decision", json.loads(entries[len(prefix_drafts)].payload))
        key = tuple((e.kind, e.payload, e.run_id, e.agent) for e in entries)
        with self._soon_lock:
            old = self._committed_calls.pop((run_id, call_id), None)
            if old is not None:
                self._committed.pop(old, None)
            self._committed[key] = entries
            self._committed_calls[(run_id, call_id)] = key
            while len(self._committed_calls) > 1024:  # never taken (the caller failed between): forgotten
                stale = next(iter(self._committed_calls))
                self._committed.pop(self._committed_calls.pop(stale), None)
        return decision, journaled

    def _already_committed(self, body: list[dict[str, Any]]) -> list["Entry"] | None:
        """The entries a call request committed for exactly these drafts (taken once), else None; drafts
        that name a decided call and differ from what was committed for it are ``INTEGRITY``."""
        from apollia_nb.journal.entry import canonical_payload

        if not self._committed_calls:
            return None
        key = tuple((d["kind"], canonical_payload(d["payload"]), d["run_id"], d["agent"]) for d in body)
        with self._soon_lock:
            entries = self._committed.pop(key, None)
            if entries is not None:
                self._committed_calls.pop((str(body[0]["run_id"]), str(_call_of(body))), None)
                return entries
            decided = [d for d in body if d["kind"] == "decision" and
                       (d["run_id"], d["payload"].get("call_id")) in self._committed_calls]
        if decided:
            raise IntegrityError(f"call {decided[0]['payload'].get('call_id')} was journaled by the server "
                                 "with other entries than are appended for it")
        return None

    def append(self, kind: str, payload: dict[str, Any], *, run_id: str | None = None,
               agent: str | None = None) -> "Entry":
        """Append one entry; it is committed when this returns."""
        return self.append_many([(kind, payload, run_id, agent)])[0]

    async def append_many_async(self, drafts: Iterable[Any]) -> list["Entry"]:
        """``append_many`` without blocking the event loop. Cancelled once sent, it still completes."""
        items = list(drafts)
        return await anyio.to_thread.run_sync(self.append_many, items)

    async def append_async(self, kind: str, payload: dict[str, Any], *, run_id: str | None = None,
                           agent: str | None = None) -> "Entry":
        return (await self.append_many_async([(kind, payload, run_id, agent)]))[0]

    # reading -------------------------------------------------------------------------------------
    def head(self) -> tuple[int, bytes]:
        head = self._head()
        return int(head["seq"]), bytes.fromhex(head["hash"])

    def _pages(self, params: dict[str, Any], limit: int | None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        while True:
            want = _PAGE if limit is None else min(_PAGE, limit - len(rows))
            # as stored, as ``Journal.entries`` gives them here: ``Entry.payload`` is the fields alone,
            # ``Entry.stored`` what replay needs to tell an erased field from a divergence
            page = self._call("GET", "/internal/journal/entries", params={**params, "limit": want, "stored": True},
                              what="the journal cannot be read")
            rows.extend(page["entries"])
            if page["next_since_seq"] is None or (limit is not None and len(rows) >= limit):
                return rows
            params = {**params, "since_seq": page["next_since_seq"]}

    def entries(self, run_id: str | None = None, since_seq: int | None = None,
                kinds: Iterable[str] | None = None, limit: int | None = None) -> list["Entry"]:
        """Committed entries in seq order, filtered by run, by ``seq > since_seq`` and by kind."""
        params: dict[str, Any] = {}
        if run_id is not None:
            params["run_id"] = run_id
        if since_seq is not None:
            params["since_seq"] = int(since_seq)
        if kinds is not None:
            kinds = list(kinds)
            if not kinds:
                return []
            params["kinds"] = kinds
        if limit is not None and limit <= 0:
            return []
        return [_entry(row) for row in self._pages(params, limit)]

    def get(self, seq: int) -> "Entry":
        from apollia_nb.errors import NotFound

        found = self.entries(since_seq=seq - 1, limit=1)
        if not found or found[0].seq != seq:
            raise NotFound(f"the journal has no entry {seq}")
        return found[0]

    def append_soon(self, kind: str, payload: dict[str, Any], *, run_id: str,
                    agent: str | None = None) -> "Future[list[Entry]]":
        """Hand an entry over: committed before anything later of its run — carried by the run's next
        request (a call, an append), or sent alone after ``SOON_SECS`` — and before any read."""
        draft = _draft(kind, payload, run_id, agent)
        future: Future[list[Entry]] = Future()
        with self._soon_lock:
            if self._closed:
                raise IntegrityError("the journal's connection is closed")
            self._soon.setdefault(run_id, []).append((draft, future))
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_later, name="apollia-remote-soon", daemon=True)
                self._flusher.start()
            elif self._flusher_idle:  # waiting for an entry; within its SOON_SECS it needs no wake per entry
                self._flusher_idle = False
                self._soon_lock.notify_all()
        return future

    def entry_pages(self, high: int, *, page: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of entries 1..``high`` as stored (``Entry.COLUMNS`` order), a page at a time: only one
        page is held here however long the journal is."""
        import gc

        since = 0
        while since < high:
            want = min(page or _PAGE, high - since)
            data = self._call("GET", "/internal/journal/entries", params={"since_seq": since, "limit": want,
                                                                          "stored": True},
                              what="the journal cannot be read")
            rows = [_entry(r).as_row() for r in data["entries"] if int(r["seq"]) <= high]
            del data
            # An httpx response and its stream refer to each other, so the answer (a page of text) is
            # freed by the cycle collector only, which runs less and less often as pages pass: without
            # this, a page's worth of memory stays behind for each page read.
            gc.collect()
            if not rows:
                return
            yield rows
            since = rows[-1][0]

    def verify_in_place(self, checkpoint: str | None = None) -> Any:
        """The server's verification of its journal where it is stored (and of ``checkpoint``, a note kept
        elsewhere), under the key checked at connect to be the home's: nothing of the journal is read here."""
        from apollia_nb.journal.verify import VerifyReport

        self.flush_soon()
        d = self._remote.call("POST", "/internal/journal/verify", json={"checkpoint": checkpoint},
                              unreachable=IntegrityError, what="the journal cannot be verified",
                              timeout=None).json()  # as long as the journal takes
        return VerifyReport(bool(d["ok"]), int(d["entries"]), d["first_bad_seq"], d["problem"],
                            int(d["checked_checkpoints"]), tuple(d.get("notes") or ()),
                            tuple(dict(loss) for loss in d.get("losses") or ()), int(d.get("erased") or 0),
                            d.get("format"))

    def run_size(self, run_id: str) -> int:
        """How many entries the run has (for a run not sealed yet), counted by the server's journal."""
        return int(self._call("GET", "/internal/journal/run-size", params={"run_id": run_id},
                              what="the run's entries cannot be counted")["entries"])

    async def checkpoint_async(self) -> str:
        return await anyio.to_thread.run_sync(self.checkpoint)

    async def seal_async(self, run_id: str, agent: str | None, before: Sequence[tuple[str, dict[str, Any]]],
                         seal: dict[str, Any]) -> tuple[list["Entry"], "Future[str]"]:
        """As ``Journal.seal_async``: the run's entries counted by the server, then what the run handed over,
        ``before`` and the seal counting them all in one append (the run's requests held meanwhile, so
        nothing of it is sent between the count and the seal), then a checkpoint: three requests. Bad input
        raises before anything is sent."""
        if not run_id:
            raise BadInput("seal_async needs the run it ends")
        if "entries" in seal:
            raise BadInput("the seal's entries are counted by the journal")
        body = [_draft(kind, payload, run_id, agent) for kind, payload in before]
        _draft("run_seal", {**seal, "entries": 0}, run_id, agent)

        def sealed() -> list["Entry"]:
            with self._runs_held({run_id}) as carried:
                try:
                    size = int(self._remote.call("GET", "/internal/journal/run-size", params={"run_id": run_id},
                                                 unreachable=IntegrityError,
                                                 what="the run's entries cannot be counted").json()["entries"])
                except BaseException as exc:  # what the run handed over is not sent: it cannot go on
                    for _, future in carried:
                        self._failed.setdefault(run_id, exc)
                        future.set_exception(exc)
                    raise
                last = _draft("run_seal", {**seal, "entries": size + len(carried) + len(body)}, run_id, agent)
                return self._send(carried, lambda all_: [_entry(row) for row in self._remote.call(
                    "POST", "/internal/journal/entries", json={"entries": all_}, unreachable=IntegrityError,
                    what="the run could not be sealed (its last entries may or may not be recorded)").json()[
                    "entries"]], [*body, last])

        written = await anyio.to_thread.run_sync(sealed)
        return written, await self.checkpoint_signed_async()

    async def checkpoint_signed_async(self) -> "Future[str]":
        """As ``Journal.checkpoint_signed_async``: the server stores the checkpoint before it answers."""
        stored: Future[str] = Future()
        try:
            stored.set_result(await self.checkpoint_async())
        except Exception as exc:  # noqa: BLE001 - told through the future, as a local store's failure is
            stored.set_exception(exc)
        return stored

    def checkpoint(self) -> str:
        """Have the server sign and store a checkpoint of every committed entry; returns the note."""
        return self._call("POST", "/internal/journal/checkpoint", what="no checkpoint could be written")["note"]

    def latest_checkpoint(self) -> str | None:
        return self._head()["checkpoint"]

    def checkpoints(self) -> list[tuple[int, bytes, str]]:
        return [(int(c["size"]), bytes.fromhex(c["root"]), c["note"]) for c in self._checkpoints_since(0)]

    def cosignatures(self) -> list[tuple[int, str, int, str]]:
        """The server's stored witness cosignatures, as ``Journal.cosignatures``."""
        rows = self._call("GET", "/internal/journal/cosignatures",
                          what="the journal's cosignatures cannot be read")["cosignatures"]
        return [(int(c["size"]), c["witness"], int(c["timestamp"]), c["signature"]) for c in rows]

    def _checkpoints_since(self, size: int) -> list[dict[str, Any]]:
        return self._call("GET", "/internal/journal/checkpoints", params={"since_size": size},
                          what="the journal's checkpoints cannot be read")["checkpoints"]

    def inclusion_proof(self, seq: int, checkpoint: str | None = None) -> Any:
        """As ``Journal.inclusion_proof``: made by the server where the journal is stored, verified here
        under the home's public key before return."""
        from apollia_nb.journal.store import InclusionProof

        d = self._call("POST", "/internal/journal/inclusion-proof", json={"seq": seq, "checkpoint": checkpoint},
                       what=f"entry {seq} cannot be proved")
        proof = InclusionProof(int(d["seq"]), int(d["tree_size"]), bytes.fromhex(d["entry_hash"]),
                               bytes.fromhex(d["leaf_hash"]), tuple(bytes.fromhex(h) for h in d["path"]),
                               bytes.fromhex(d["root"]), d["checkpoint"])
        if proof.seq != seq:
            raise IntegrityError(f"the server proved entry {proof.seq}, not entry {seq}")
        proof.verify(self.verifier())
        return proof

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> Any:
        """As ``Journal.consistency_proof``: made by the server, verified here before return."""
        from apollia_nb.journal.store import ConsistencyProof

        for size in (old_size, new_size):
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
                raise BadInput(f"need 0 < old_size <= new_size, got {old_size!r}, {new_size!r}")
        params = {"old_size": old_size, **({"new_size": new_size} if new_size is not None else {})}
        d = self._call("GET", "/internal/journal/consistency-proof", params=params,
                       what="the consistency proof cannot be made")
        proof = ConsistencyProof(int(d["old_size"]), int(d["new_size"]), bytes.fromhex(d["old_root"]),
                                 bytes.fromhex(d["new_root"]), tuple(bytes.fromhex(h) for h in d["path"]))
        if proof.old_size != old_size or (new_size is not None and proof.new_size != new_size):
            raise IntegrityError("the server proved other tree sizes than were asked for")
        proof.verify()
        return proof

    # verification, a page at a time --------------------------------------------------------------
    def verify_paged(self, checkpoint: str | None = None, *, page: int | None = None) -> Any:
        """Verify the journal here, under the home's public key, from entries read from the server a page
        at a time (only one page is held however long the journal is), with the stored checkpoints
        that cover them and ``checkpoint`` (a note kept elsewhere)."""
        from dataclasses import replace

        from apollia_nb.journal.verify import verify_rows

        head = self._head()
        high = int(head["seq"])
        stored = [c for c in self.checkpoints() if c[0] <= high]
        report = verify_rows(self.entry_pages(high, page=page), public_key=self._public_key, origin=self._origin,
                             checkpoints=stored, external=checkpoint, total=high)
        fmt = head.get("format")  # as the owner's verification says it: the journal's ``meta.format``
        return replace(report, format=fmt if isinstance(fmt, str) else None)

    # SQL, run where the journal is stored --------------------------------------------------------
    def read_query(self, query: str, params: Sequence[Any] | None = None,
                   timeout: float = 60.0) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Columns and rows of one read-only query, run by the server under the rules of ``%%apollia sql``."""
        d = self._call("POST", "/internal/journal/sql",
                       json={"query": query, "params": [wire_value(p) for p in params] if params else None,
                             "timeout": timeout},
                       what="the query cannot be run", timeout=timeout + 30)
        return list(d["columns"]), [tuple(from_wire(v) for v in row) for row in d["rows"]]

    def sql(self, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """A read query (e.g. over the views), run by the server where the journal is stored."""
        return self.read_query(query, params)[1]

    # closing -------------------------------------------------------------------------------------
    def close(self) -> None:
        """After appending: ask for a checkpoint of what is committed (when the server answers). Disconnect."""
        if self._closed:
            return
        with self._soon_lock:
            self._closed = True  # nothing more is handed over
            self._soon_lock.notify_all()
            flusher = self._flusher
        if flusher is not None:
            flusher.join()
        self.flush_soon()
        try:
            if self._appended:
                self.checkpoint()
        except ApolliaError:
            pass  # the server is gone: it wrote its own checkpoint when it closed
        finally:
            self._remote.close()


# --- governance -----------------------------------------------------------------------------------


def _rule_record(d: dict[str, Any]) -> "RuleRecord":
    from apollia_nb.governance.decision import Effect
    from apollia_nb.governance.store import RuleRecord

    return RuleRecord(tool=d["tool"], effect=Effect(d["effect"]), prefix=d["prefix"], agent=d["agent"], id=d["id"],
                      created_by=d.get("created_by") or "", created_at=_when(d.get("created_at")))


def _consent_record(d: dict[str, Any]) -> "ConsentRecord":
    from apollia_nb.governance.store import ConsentRecord

    return ConsentRecord.from_dict(d)  # its end, card and state too


def _pending(d: dict[str, Any]) -> "PendingDecision":
    from apollia_nb.governance.decision import Answer, Family
    from apollia_nb.governance.store import PendingDecision

    return PendingDecision(
        id=d["id"], run_id=d["run_id"], task_id=d["task_id"], agent=d["agent"], tool=d["tool"],
        family=Family(d["family"]) if d["family"] is not None else None, arguments=d["arguments"],
        answers=tuple(Answer(a) for a in d["answers"]), created_at=_when(d["created_at"]),  # type: ignore[arg-type]
        reason=d.get("reason", ""), line=int(d.get("line", 0)), call_id=d.get("call_id"),
        status=d.get("status", "pending"), answer=Answer(d["answer"]) if d.get("answer") else None,
        answered_by=d.get("answered_by"), answered_at=_when(d.get("answered_at")),
        answer_reason=d.get("answer_reason"),
    )


def _policy(document: dict[str, Any] | None) -> Any:
    from apollia_nb.governance.decision import Policy

    if document is None:
        return None
    refuse = document["refuse"]
    return Policy(refuse_tools=frozenset(refuse["tools"]), refuse_connections=frozenset(refuse["connections"]),
                  refuse_families=frozenset(refuse["families"]))


def _policy_state(d: dict[str, Any]) -> "PolicyState":
    from apollia_nb.governance.policy import PolicyState

    return PolicyState(status=d["status"], reason=d["reason"], policy=_policy(d["policy"]), key=d["key"],
                       digest=d["digest"])


def _snapshot_view(data: dict[str, Any]) -> "GovernanceView":
    from apollia_nb.governance.decision import Effect, Family, GovernanceView, Rule

    return GovernanceView(
        rules=tuple(Rule(tool=r["tool"], effect=Effect(r["effect"]), prefix=r["prefix"], agent=r["agent"], id=r["id"])
                    for r in data["rules"]),
        consents=frozenset((c["agent"], Family(c["family"])) for c in data["consents"]),
        developer_mode=bool(data["developer_mode"]), policy=_policy(data["refusals"]),
        readable=bool(data["readable"]), unreadable_reason=data["reason"],
    )


class RemoteGovernance:
    """``rt.governance`` in client mode: the server's store, keeping ``GovernanceFace`` (``governance/contract.py``).

    ``view()`` asks the server every time (``If-None-Match`` with the held
    generation: ``304`` while nothing changed), so it includes every change
    committed before the call, by any process. When the server cannot be
    reached or answers with an error, the view fails closed (deny rules known
    so far are kept; a failure never becomes a permission).
    """

    def __init__(self, remote: RemoteHome) -> None:
        self._remote = remote
        self._lock = threading.Lock()
        self._held: tuple[str, "GovernanceView", "PolicyState"] | None = None  # (etag, view, policy state)
        self._deny: tuple[Any, ...] = ()
        self._held_back: frozenset[str] = frozenset()  # agents whose consents do not apply in this process

    def _call(self, method: str, path: str, *, what: str, **kwargs: Any) -> Any:
        response = self._remote.call(method, path, unreachable=GovernanceUnreadable, what=what, **kwargs)
        return response.json() if response.content else None

    # the snapshot --------------------------------------------------------------------------------
    def view(self) -> "GovernanceView":
        """The current snapshot for ``decide()``: every change committed before this call."""
        from apollia_nb.governance.store import without_consents

        return without_consents(self._view(), self._held_back)

    def held_view(self) -> "GovernanceView":
        """The snapshot held here (as the last call's answer left it), asked for only when none is held:
        what a client guesses a call's decision with before its server decides it (``decide_call``)."""
        from apollia_nb.governance.store import without_consents

        held = self._held
        return without_consents(held[1] if held is not None else self._view(), self._held_back)

    def generation(self) -> str | None:
        """The generation of the snapshot held here (None: none)."""
        held = self._held
        return held[0].strip('"') if held is not None else None

    def held_from(self, generation: str, snapshot: dict[str, Any] | None) -> None:
        """Hold the snapshot a call's answer names: ``snapshot`` when sent (the held one changed)."""
        from apollia_nb.governance.decision import Effect

        if snapshot is None:
            return
        try:
            view, state = _snapshot_view(snapshot), _policy_state(snapshot["policy"])
        except (ValueError, KeyError, TypeError):
            with self._lock:
                self._held = None  # asked for again by the next view
            return
        with self._lock:
            self._held = (f'"{generation}"', view, state)
            self._deny = tuple(r for r in view.rules if r.effect is Effect.DENY)

    def hold_back_consents(self, agent: str, held: bool) -> None:
        """In this process, apply none of ``agent``'s standing consents (``held``), or apply them again."""
        with self._lock:
            self._held_back = self._held_back | {agent} if held else self._held_back - {agent}

    def bind_identity(self, agent: str, identity: dict[str, Any], *, keep: bool | None = None) -> dict[str, Any]:
        """The server's review of what ``agent``'s standing consents are given for (``Runtime.review_identity``)."""
        return self._call("POST", "/internal/agents/identity",
                          json={"agent": agent, "identity": identity, "keep_consents": keep},
                          what="the agent's registration cannot be reviewed")

    def _view(self) -> "GovernanceView":
        import httpx

        from apollia_nb.governance.decision import Effect

        held = self._held
        headers = {"If-None-Match": held[0]} if held is not None else {}
        try:
            response = self._remote.http.get("/internal/governance/snapshot", headers=headers)
        except httpx.HTTPError as exc:
            return self._closed(f"governance cannot be read: {_unanswered(self._remote.url, exc)}")
        if response.status_code == 304 and held is not None:
            return held[1]
        if response.status_code != 200:
            error = _error(response)
            return self._closed(f"governance cannot be read: {error.code}: {error.message}")
        try:
            data = response.json()
            view, state = _snapshot_view(data), _policy_state(data["policy"])
        except (ValueError, KeyError, TypeError) as exc:
            return self._closed(f"governance cannot be read: the server's snapshot is malformed: {exc!r}")
        with self._lock:
            self._held = (response.headers.get("ETag", ""), view, state)
            self._deny = tuple(r for r in view.rules if r.effect is Effect.DENY)
        return view

    def _closed(self, reason: str) -> "GovernanceView":
        from apollia_nb.governance.decision import GovernanceView

        with self._lock:
            self._held = None
            return GovernanceView(rules=self._deny, readable=False, unreadable_reason=reason)

    def policy_state(self) -> "PolicyState":
        """The organisation policy as the current ``view()`` sees it."""
        from apollia_nb.governance.policy import PolicyState

        view = self.view()
        held = self._held
        if held is None:  # why it could not be read (a token without the role: FORBIDDEN, naming it)
            return PolicyState(status="refused", reason=view.unreadable_reason
                               or "governance cannot be read from the server")
        return held[2]

    def developer_mode(self) -> bool:
        return self.view().developer_mode

    def developer_mode_state(self) -> "DeveloperMode":
        from apollia_nb.governance.store import DeveloperMode

        d = self._call("GET", "/governance/developer-mode", what="developer mode cannot be read")
        return DeveloperMode(bool(d["enabled"]), d.get("changed_by"), _when(d.get("changed_at")))

    def set_developer_mode(self, enabled: bool, *, by: str) -> "DeveloperMode":
        from apollia_nb.governance.store import DeveloperMode

        d = self._call("PUT", "/governance/developer-mode", json={"enabled": enabled, "by": by},
                       what="developer mode cannot be changed")
        return DeveloperMode(bool(d["enabled"]), d.get("changed_by"), _when(d.get("changed_at")))

    # rules and consents --------------------------------------------------------------------------
    def rules(self) -> list["RuleRecord"]:
        return [_rule_record(r) for r in self._call("GET", "/governance/rules", what="rules cannot be read")]

    def get_rule(self, rule_id: str) -> "RuleRecord":
        from apollia_nb.errors import UnknownRule

        for rule in self.rules():
            if rule.id == rule_id:
                return rule
        raise UnknownRule(f"no rule has the id {rule_id!r}")

    def add_rule(self, tool: str, effect: Any, prefix: str | None = None, agent: str = "*", *,
                 by: str) -> "RuleRecord":
        body: dict[str, Any] = {"tool": tool, "effect": getattr(effect, "value", effect), "agent": agent, "by": by}
        if prefix:
            body["prefix"] = prefix
        return _rule_record(self._call("POST", "/governance/rules", json=body, what="the rule cannot be added"))

    def remove_rule(self, rule_id: str, *, by: str) -> "RuleRecord":
        return _rule_record(self._call("POST", "/internal/governance/rules/remove", json={"id": rule_id, "by": by},
                                       what="the rule cannot be removed"))

    def consents(self) -> list["ConsentRecord"]:
        return [_consent_record(c) for c in self._call("GET", "/governance/consents",
                                                       what="standing consents cannot be read")]

    def grant_consent(self, agent: str, family: Any, *, by: str, until: Any = None,
                      card: str | None = None) -> "ConsentRecord":
        body = {"agent": agent, "family": getattr(family, "value", family), "by": by,
                **({"until": until.isoformat()} if until is not None else {}), **({"card": card} if card else {})}
        return _consent_record(self._call("POST", "/internal/governance/consents", json=body,
                                          what="the consent cannot be granted"))

    def revoke_consent(self, agent: str, family: Any, *, by: str) -> "ConsentRecord":
        body = {"agent": agent, "family": getattr(family, "value", family), "by": by}
        return _consent_record(self._call("POST", "/internal/governance/consents/revoke", json=body,
                                          what="the consent cannot be revoked"))

    # pending decisions ---------------------------------------------------------------------------
    def add_pending(self, run_id: str, task_id: str | None, agent: str, tool: str, family: Any,
                    arguments: Any, answers: Sequence[Any], reason: str = "", line: int = 0,
                    call_id: str | None = None) -> "PendingDecision":
        body = {"run_id": run_id, "task_id": task_id, "agent": agent, "tool": tool,
                "family": getattr(family, "value", family), "arguments": dict(arguments),
                "answers": [getattr(a, "value", a) for a in answers], "reason": reason, "line": int(line),
                "call_id": call_id}
        return _pending(self._call("POST", "/internal/pending-decisions", json=body,
                                   what="the decision cannot be listed"))

    def pending(self, status: str | None = "pending", *, run_id: str | None = None) -> list["PendingDecision"]:
        params: dict[str, Any] = {"status": status or "all"}
        if run_id is not None:
            params["run_id"] = run_id
        return [_pending(d) for d in self._call("GET", "/internal/pending-decisions", params=params,
                                                what="pending decisions cannot be read")]

    def get_pending(self, decision_id: str) -> "PendingDecision":
        from urllib.parse import quote

        return _pending(self._call("GET", f"/internal/pending-decisions/{quote(decision_id, safe='')}",
                                   what="the decision cannot be read"))

    def record_answer(self, decision_id: str, answer: str, *, by: str, reason: str | None,
                      **terms: Any) -> dict[str, Any]:
        """Answer through the server's ``Runtime.answer`` (validated, journaled, stored, ``always`` applied).
        ``terms``: ``digest``, ``expires_in``, ``expires_at`` (``governance/approvals.py``)."""
        body: dict[str, Any] = {"id": decision_id, "answer": answer, "by": by, **terms}
        if reason is not None:
            body["reason"] = reason
        return self._call("POST", "/pending-decisions/decide", json=body, what="the answer cannot be recorded")

    def close(self) -> None:
        """Nothing to release: the connection is the journal's (closed with it)."""


# --- answers given elsewhere ----------------------------------------------------------------------


async def watch_answers(rt: "AnswerHost", remote: RemoteHome, *, poll_secs: float = ANSWER_POLL_SECS) -> None:
    """Deliver answers given in other processes to this runtime's waiting cards; owned by the runtime.

    Long-polls the server for the decisions of this process's waiting cards
    and hands each answered one to ``rt.deliver_answer`` (the card resolves,
    a suspended run resumes). A card opened or answered here restarts the poll
    with the new set. When the server does not answer, it tries again, less
    often, until it does. At close, this process's suspended unattended runs
    are cancelled (their decisions refused ``by cancel``): nothing here could
    resume them after the process ends.
    """
    import httpx

    changed = anyio.Event()

    def listener(kind: str, obj: Any) -> None:
        if kind == "card":
            changed.set()

    unsubscribe = rt.subscribe(listener)
    ignored: set[str] = set()
    delay = 0.5
    try:
        async with httpx.AsyncClient(base_url=remote.url + API, headers=remote.headers,
                                     timeout=httpx.Timeout(poll_secs + 30.0, connect=5.0)) as http:
            while True:
                changed = anyio.Event()
                cards = sorted((c for c in rt.pending if c.id not in ignored),
                               key=lambda c: (c.created_at, c.id))
                waiting = [c.id for c in cards[:MAX_WATCHED]]
                if not waiting:
                    await changed.wait()
                    continue
                outcome: list[Any] = []

                async def poll(scope: anyio.CancelScope, ids: list[str]) -> None:
                    try:
                        response = await http.get("/internal/answers", params={"ids": ids, "timeout": poll_secs})
                        outcome.append(response)
                    except httpx.HTTPError as exc:
                        outcome.append(exc)
                    scope.cancel()

                async def interrupted(scope: anyio.CancelScope) -> None:
                    await changed.wait()
                    scope.cancel()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(poll, tg.cancel_scope, waiting)
                    tg.start_soon(interrupted, tg.cancel_scope)
                if not outcome:
                    continue  # the waiting cards changed: ask again with the new set
                result = outcome[0]
                try:
                    if isinstance(result, httpx.Response) and result.status_code == 200:
                        for answered in result.json():
                            rt.deliver_answer(answered)
                        delay = 0.5
                        continue
                    if isinstance(result, httpx.Response) and isinstance(_error(result), UnknownDecision):
                        ignored.update(await _unknown(http, waiting))
                        continue
                    problem = _error(result).message if isinstance(result, httpx.Response) else str(result)
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                rt.events.emit("warning", f"answers given elsewhere cannot be read from {remote.url}: {problem}")
                with anyio.move_on_after(delay):
                    await changed.wait()
                delay = min(delay * 2, 10.0)
    finally:
        unsubscribe()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_SECS):
            await _cancel_suspended(rt)


async def _unknown(http: "httpx.AsyncClient", ids: list[str]) -> set[str]:
    """The ids the server does not know (their cards can only be answered here)."""
    from urllib.parse import quote

    unknown = set()
    for decision_id in ids:
        response = await http.get(f"/internal/pending-decisions/{quote(decision_id, safe='')}")
        if response.status_code == 404:
            unknown.add(decision_id)
    return unknown


async def _cancel_suspended(rt: "AnswerHost") -> None:
    for run in rt.unfinished_runs():
        if run.status == "waiting" and not run._active and not run.done.is_set():
            try:
                await rt.cancel(run.id)
            except ApolliaError as exc:
                rt.events.emit("warning", f"task {run.id} could not be cancelled at close: {exc.message}")
